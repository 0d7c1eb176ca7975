"""Hostile and extreme text for the parser (issue 11): every input gives a result or a
:class:`TensorAlgError`, quickly; no silent non-finite or misread arithmetic."""

from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from tensoralg import parse, term, to_numpy
from tensoralg.atoms import Atom, atom
from tensoralg.errors import BindingError, ParseError, TensorAlgError
from tensoralg.lexer import MAX_DIGITS
from tensoralg.grammar import MAX_NESTING
from tests.conftest import FUZZ
from tests.helpers import quickly
from tests.strategies import hostile_text


@pytest.mark.parametrize("text", ["A/0.0 ⊗ W_OV", "A/0. ⊗ W_OV", "A/.0 ⊗ W_OV", "A/0e5 ⊗ W_OV", "0**-1·A ⊗ W_OV",
                                  "A/(1-1.0) ⊗ W_OV", "(0.0)**(-2)·A"])
def test_non_finite_coefficients_are_refused(text):
    with pytest.raises(ParseError) as err:
        parse(text)
    assert "division by zero" in str(err.value) or "finite" in str(err.value)


def test_a_non_finite_coefficient_is_refused_where_it_is_made():
    a = term(atom("A"))
    for bad in (sp.zoo, sp.oo, sp.nan, float("inf"), float("nan")):
        with pytest.raises(TensorAlgError, match="finite"):
            term(atom("A"), coeff=bad)
        with pytest.raises(TensorAlgError, match="finite"):
            a.scale(bad)
        with pytest.raises(TensorAlgError, match="finite"):
            (a @ a).scale(bad)


@pytest.mark.parametrize("text", ["A ⊗ W_OV · 1.5.5", "1..5·A", "2e3.1·A", "1.5.·A"])
def test_a_number_with_two_points_is_a_lexing_error(text):
    with pytest.raises(ParseError, match="malformed number"):
        parse(text)


def test_decimals_still_read():
    assert parse("1.5·A") == parse("3/2·A").scale(sp.Float(1.5) / sp.Rational(3, 2))
    assert parse(".5·A ⊗ W_OV").terms[0].coeff == sp.Float(0.5)
    assert parse("2.·A").terms[0].coeff == sp.Float(2)


@pytest.mark.parametrize("text", ["2**2**2**2**2·A", "10**100000·A", "9**9**9·A", "1" * 5000 + "·A", "1e999·A",
                                  "2**1000·A", "(10**200)*(10**200)·A", "d_head**100000·A"])
def test_huge_numbers_are_refused_quickly(text):
    with quickly(2), pytest.raises(ParseError):
        parse(text)


def test_large_but_reasonable_numbers_still_read():
    assert parse("2**900·A").terms[0].coeff == 2**900
    assert parse("1e-200·A").terms[0].coeff == sp.Float("1e-200")
    assert parse("1" * MAX_DIGITS + "·A").terms[0].coeff == int("1" * MAX_DIGITS)


@pytest.mark.parametrize("text", ["(" * 170 + "A" + ")" * 170, "sqrt(" * 150 + "2" + ")" * 150 + "·A",
                                  "2" + "**2" * 1000 + "·A", "Σ_{h∈H_0} " * 200 + "A^h"])
def test_deep_nesting_is_a_clear_error_not_a_recursion_error(text):
    with pytest.raises(ParseError, match=f"nested more than {MAX_NESTING} deep"):
        parse(text)


def test_nesting_at_the_limit_reads_even_on_a_deep_stack():
    def deep(n):  # the parser must fit below the default recursion limit from a deep caller
        if n:
            return deep(n - 1)
        return parse("(" * MAX_NESTING + "A" + ")" * MAX_NESTING)

    assert deep(sys.getrecursionlimit() // 4) == parse("A")
    assert parse("sqrt(" * (MAX_NESTING - 1) + "1" + ")" * (MAX_NESTING - 1) + "·A") == parse("A")


def test_a_sum_of_a_scalar_is_refused():
    with pytest.raises(ParseError, match="sums tensor terms"):
        parse("Σ_{h∈H_0} 0")


def test_a_long_flat_product_reads():
    assert len(parse("·".join(["A"] * 990)).terms[0].words[0]) == 990


@FUZZ
@given(st.one_of(hostile_text(), st.text(max_size=30)))
def test_random_text_gives_a_result_or_our_error_within_seconds(text):
    with quickly(5), contextlib.suppress(TensorAlgError):
        parse(text)


# -- numbers bound to atoms and declared sizes ------------------------------------------


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint8, np.bool_, np.float16, np.float32])
def test_to_numpy_computes_small_dtypes_in_float64(dtype):
    value = np.full((2, 2), 100 if dtype is not np.bool_ else 1, dtype=dtype)
    expected = value.astype(np.float64) @ value.astype(np.float64)
    np.testing.assert_array_equal(to_numpy(parse("A A"), {"A": value}), expected)  # int8: 20000, not 64


def test_to_numpy_refuses_arrays_that_are_not_numbers():
    with pytest.raises(BindingError, match="dtype <U1"):
        to_numpy(parse("A"), {"A": np.array([["a", "b"], ["c", "d"]])})


@pytest.mark.parametrize("size", [-1, 0, 1.5, float("nan"), float("inf"), True, "3"])
def test_sizes_given_to_to_numpy_are_positive_integers(size):
    A = np.eye(2)
    with pytest.raises(BindingError, match="must be a positive integer"):
        to_numpy(parse("A"), {"A": A}, dims={"n_ctx": size})
    with pytest.raises(BindingError, match="must be a positive integer"):
        to_numpy(parse("Id ⊗ A"), {"A": A}, slot_sizes={0: size})


@pytest.mark.parametrize("size", [-1, 0, 1.5, float("nan"), float("inf"), sp.nan, sp.oo, "0", "-1", "٣"])
def test_declared_dimensions_are_positive_integers_or_names(size):
    with pytest.raises(TensorAlgError, match="positive integer"):
        parse("V", atoms={"V": (size, "d_model")})
    if not isinstance(size, str):
        with pytest.raises(TensorAlgError, match="positive integer"):
            parse("V", atoms=[Atom("V", size, "d_model")])


def test_declared_dimensions_that_make_sense_still_read():
    k = sp.Symbol("k", positive=True, integer=True)
    assert parse("V", atoms={"V": (np.int64(3), 2 * k)}).slot_shapes == ((3, 2 * k),)
    assert parse("A V", atoms=[Atom("V", "n_ctx", "d_model")]).slot_shapes[0][0] == parse("A").slot_shapes[0][0]


def test_the_papers_atoms_cannot_be_redeclared_with_another_shape():
    with pytest.raises(TensorAlgError, match=r"cannot redeclare the paper's atom 'A' \(n_ctx × n_ctx\) as 2 × 3"):
        parse("A ⊗ W_E", atoms={"A": (2, 3)})
    assert parse("A", atoms={"A": ("n_ctx", "n_ctx")}) == parse("A")  # the same shape again is harmless
    assert parse("N", atoms=[atom("N")]) == parse("N")
