"""tensoralg.check: an identity decided by canonical expansion, confirmed numerically, with a
counterexample when it fails."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given

from tensoralg import ParseError, TensorAlgError, TensorSum, check, parse, to_text
from tests.strategies import PROPERTY, any_expression, seeds


@pytest.mark.parametrize("identity", [
    "(A ⊗ B)(C ⊗ D) = (AC) ⊗ (BD)",                        # the rule as every page prints it
    r"(A \otimes B)(C \otimes D) = (A C) \otimes (B D)",    # the paper's LaTeX
    "W_QK^h = W_Q^{hT} W_K^h",                              # a definition, unfolded to compare
    "W_OV^{h} = W_O^{h} W_V^{h}",
    "(XY)^T = Y^T X^T",
    "(Id ⊗ W_U)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id ⊗ W_E) = Id ⊗ W_U W_E + Σ_{h∈H_1} A^h ⊗ W_U W_OV^h W_E",
    "(A ⊗ W_O W_V) x = A x W_V^T W_O^T",                     # an operator applied to an activation
    "A - A = 0",
    "2·(A ⊗ B) = A ⊗ B + A ⊗ B",
    "Σ_{h∈H_1} A^h ⊗ W_OV^h = Σ_{k∈H_1} A^k ⊗ W_OV^k",  # a summed index is a dummy
    "Σ_{h∈H_1} Σ_{g∈H_1} A^h A^g ⊗ W_OV^h W_OV^g = Σ_{k∈H_1} Σ_{j∈H_1} A^j A^k ⊗ W_OV^j W_OV^k",
])
def test_true_identities_hold_symbolically_and_numerically(identity):
    r = check(identity)
    assert r.holds and bool(r) and r.difference.is_zero, str(r)
    assert r.numeric_error < 1e-12 and r.counterexample is None
    assert "The identity holds" in str(r)


@pytest.mark.parametrize("identity, difference", [
    ("(XY)^T = X^T Y^T", "-Xᵀ Yᵀ + Yᵀ Xᵀ"),
    ("(A + B) ⊗ W_OV = A ⊗ W_OV", "B ⊗ W_OV"),
    ("(Id + A^1 ⊗ W_OV^1)(Id + A^0 ⊗ W_OV^0) = Id + A^1 ⊗ W_OV^1 + A^0 ⊗ W_OV^0",
     "A^{1} A^{0} ⊗ W_OV^{1} W_OV^{0}"),
    ("(A ⊗ B)(C ⊗ D) = (CA) ⊗ (BD)", "A C ⊗ B D - C A ⊗ B D"),
    ("Σ_{h∈H_1} A^h ⊗ W_OV^h = Σ_{k∈H_2} A^k ⊗ W_OV^k",
     "Σ_{h1∈H_1} A^{h1} ⊗ W_OV^{h1} - Σ_{h2∈H_2} A^{h2} ⊗ W_OV^{h2}"),
    ("Σ_{h∈H_1} A^h ⊗ W_OV^h = A^{h1} ⊗ W_OV^{h1}",  # one head h1 is not the sum over the layer
     "Σ_{h1∈H_1} A^{h1} ⊗ W_OV^{h1} - A^{h1 (free)} ⊗ W_OV^{h1 (free)}"),
])
def test_false_identities_show_the_terms_that_differ_and_a_counterexample(identity, difference):
    r = check(identity)
    assert not r.holds and str(r.difference) == difference
    assert r.numeric_error > 1e-6
    c = r.counterexample
    assert c is not None and c.size == 2 and not np.allclose(c.lhs, c.rhs)
    assert all(set(np.unique(v)) <= {-2, -1, -0.5, 0, 0.5, 1, 2} for v in c.bindings.values())  # small integers
    assert "LHS - RHS = " + difference in str(r) and "counterexample, every dimension 2" in str(r)


@PROPERTY
@given(any_expression(), seeds())
@example(TensorSum([], n_slots=2), 0)  # found by the fuzz run: the empty sum prints as 0
@example(parse("0·Id"), 0)  # found by a fresh-clone run: a term with coefficient 0 prints as 0·Id
def test_an_expression_equals_its_printed_expansion(e, seed):
    lhs, rhs = to_text(e), to_text(e.expand()) if len(e.expand()) else "0"
    if rhs == "0":  # the expression is 0: it holds, or, with no atom to give the slots (0, 0·Id), is refused by name
        try:
            result = check(lhs, rhs, seed=seed)
        except TensorAlgError as error:
            assert "both sides are 0" in str(error)
            return
        assert result.holds
        return
    assert check(lhs, rhs, seed=seed).holds


def test_sides_may_be_expressions():
    assert check(parse("(A ⊗ B)(C ⊗ D)"), parse("A C ⊗ B D")).holds


@pytest.mark.parametrize("text, message", [
    ("A ⊗ B", "one '='"),
    ("A = B = C", "one '='"),
    ("W_OV := W_O W_V", "defines a name"),
    ("A ⊗ B = C", "slots"),
    ("0 = 0", "both sides are 0"),
])
def test_malformed_identities_are_refused_with_what_was_expected(text, message):
    with pytest.raises((ParseError, TensorAlgError), match=message):
        check(text)


# -- issue 27: opaque functions are unknowns of their argument; the slides' forms ---------------

def test_an_opaque_function_is_an_unknown_of_its_name_and_argument():
    read = lambda text: parse(text, opaque=True)  # noqa: E731
    with pytest.warns(Warning):
        assert read("softmax(A)") != read("softmax(B)")
        assert read("exp(A)") != read("exp(-A)") and read("LN(A)") != read("LN(B)")
        assert read("softmax(A)") != read("exp(A)")
        assert read("softmax(A + B)") == read("softmax(B + A)") == read("softmax(2·A + B - A)")
        assert str(read("softmax(A+B)")) == "softmax(A + B)"
        assert read("softmax(x W_QK^{h1} xᵀ)").slot_shapes == read("x W_QK^{h1} xᵀ").slot_shapes  # the argument's shape
    assert check("softmax(A) = softmax(B)", opaque=True).holds is False
    assert check("softmax(A) + softmax(A) = 2·softmax(A)", opaque=True).holds


def test_postfix_transpose_binds_to_the_atom_before_it():
    assert check("(A ⊗ W)x = AxW^T").holds
    assert not check("(A ⊗ W)x = (AxW)^T").holds  # the control: the whole product transposed is another matrix


def test_decimals_a_person_types_are_exact():
    r = check("0.1 A + 0.2 A = 0.3 A")
    assert r.holds and r.numeric_error == 0
    assert not check("0.1 A + 0.2 A = 0.30000000000000004 A").holds  # exact: a different number


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, "1", True])
def test_a_bad_seed_is_refused(seed):
    with pytest.raises(TensorAlgError, match="seed of the random bindings is an integer from 0 to 2\\*\\*32 - 1"):
        check("A = A", seed=seed)


@pytest.mark.parametrize("identity", ["W_E = 0", "0 = X", "A ⊗ B = 0", "(A ⊗ B) x = 0"])
def test_a_zero_side_against_a_rectangular_side(identity):
    r = check(identity)
    assert not r.holds and r.counterexample is not None and r.numeric_error > 0


def test_the_terms_are_counted_before_anything_is_expanded():
    from tensoralg.check import count_terms
    from tensoralg.errors import ExpansionTooLarge

    product = "".join(f"(A^{{a{i}}}+A^{{b{i}}})" for i in range(30))
    with pytest.raises(ExpansionTooLarge, match="the left side expands to 1,073,741,824 terms, more than the 5,000"):
        check(f"{product} = A^{{a0}}")
    with pytest.raises(ExpansionTooLarge, match="the right side expands to 16 terms, more than the 10"):
        check("A = (A + B)(A + B)(A + B)(A + B)", max_terms=10)
    assert count_terms(parse("(A + B)(A + B)(A + B)(A + B)"), "a side", max_terms=16) == 16


def test_the_column_of_ones_of_the_folding_entries_in_an_identity():
    """``1 ⊗ b_O`` on a side: the shapes the reader infers for 1 are shared by both sides (declaring
    '1' failed as 'a name is a letter …'), and the folding step's identity holds."""
    assert check("(A^h ⊗ W_O^h)(1 ⊗ b_V^h) = A^h 1 ⊗ W_O^h b_V^h").holds
    assert not check("1 ⊗ b_O = 0").holds
    with pytest.warns(Warning, match="column of ones"):
        assert parse("A 1", atoms={"1": ("n_ctx", 1)}).slot_shapes == parse("A^h 1 ⊗ b_O").slot_shapes[:1]
    with pytest.raises(TensorAlgError, match="the column of ones '1' has one column"):
        parse("A 1", atoms={"1": ("n_ctx", 2)})
