"""The text language: grammar, precedence, round trips and errors that point at the position."""

from __future__ import annotations

import pytest
import sympy as sp
from hypothesis import given

from tensoralg import (
    Add, Atom, ParseError, Product, ShapeMismatch, SlotMismatch, TensorAlgError, TensorSum, UnknownAtom, atom,
    d_head, d_model, identity, parse, tensor, term, to_text,
)
from tests.strategies import PROPERTY, any_expression, layouts, tensor_sums

A1, A2 = atom("A", "h1"), atom("A", "h2")
W1, W2 = atom("W_OV", "h1"), atom("W_OV", "h2")
W_E, W_U = atom("W_E"), atom("W_U")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("A^{h2} A^{h1} ⊗ W_OV^{h2} W_OV^{h1}", term((A2, A1), (W2, W1))),
        ("A^{h2}A^{h1}(x)W_OV^{h2}*W_OV^{h1}", term((A2, A1), (W2, W1))),
        ("A^{h1} ⊗ W_OV^{h1} + Id ⊗ Id", identity(2) + term(A1, W1)),
        ("Id ⊗ W_U W_E", term(None, (W_U, W_E))),
        ("Id Id A^{h1} Id", term(A1)),
        ("2·A^{h1} ⊗ W_OV^{h1}", term(A1, W1, coeff=2)),
        ("A^{h1} ⊗ 2 W_OV^{h1}", term(A1, W1, coeff=2)),
        ("A^{h1}/2 ⊗ W_OV^{h1}", term(A1, W1, coeff=sp.Rational(1, 2))),
        ("-A^{h1} ⊗ W_OV^{h1} - -Id ⊗ Id", identity(2) - term(A1, W1)),
        ("1/sqrt(d_head)·W_QK^{h1}", term(atom("W_QK", "h1"), coeff=1 / sp.sqrt(d_head))),
        ("d_head**(-1/2) W_QK^{h1}", term(atom("W_QK", "h1"), coeff=1 / sp.sqrt(d_head))),
        ("2*d_model/d_head·W_OV", term(atom("W_OV"), coeff=2 * d_model / d_head)),
        ("(1 + sqrt(2))·A", term(atom("A"), coeff=1 + sp.sqrt(2))),
        ("0.5·A", term(atom("A"), coeff=sp.Float("0.5"))),
        ("W_OV^{h1}^T", term(W1.T)),
        ("W_OV^{h1}ᵀ", term(W1.T)),
        ("W_OV^Tᵀ", term(atom("W_OV"))),
        ("A^{T}", term(atom("A", "T"))),
        ("(A^{h2} A^{h1})^T ⊗ (W_U W_OV^{h1})ᵀ", term((A1.T, A2.T), (W1.T, W_U.T))),
        ("N^{1}ᵀ", term(atom("N", "1"))),
        ("A^{L0H3} − A^{L0H3}", TensorSum([], n_slots=1)),
        ("A^{h1 h2}", term(atom("A", "h1 h2"))),
    ],
)
def test_golden_parses(text, expected):
    assert parse(text) == expected


def test_precedence_product_then_tensor_then_sum():
    assert parse("A^{h2} A^{h1} ⊗ W_OV^{h2} W_OV^{h1} + Id ⊗ Id") == identity(2) + term((A2, A1), (W2, W1))
    assert parse("(A^{h1} + A^{h2}) ⊗ W_OV^{h1}") == term(A1, W1) + term(A2, W1)


def test_a_product_with_parentheses_stays_lazy():
    p = parse("(A^{h1} ⊗ W_OV^{h1})(A^{h2} ⊗ W_OV^{h2})")
    assert isinstance(p, Product) and p == Product([term(A1, W1), term(A2, W2)])
    assert p.expand() == term((A1, A2), (W1, W2))
    layer = identity(2) + term(A1, W1)
    q = parse("(Id ⊗ W_U)(Id ⊗ Id + A^{h1} ⊗ W_OV^{h1})(Id ⊗ W_E)")
    assert q == Product([term(None, W_U), layer, term(None, W_E)])
    assert parse("-2 (A⊗W_U)(Id ⊗ W_E)") == -2 * Product([term(atom("A"), W_U), term(None, W_E)])


def test_a_sum_with_a_lazy_part_is_a_lazy_sum():
    e = parse("A ⊗ W_U W_E + (Id ⊗ W_U)(Id ⊗ W_E)")
    assert isinstance(e, Add) and e.parts == (term(atom("A"), (W_U, W_E)), Product([term(None, W_U), term(None, W_E)]))


def test_tensor_of_parenthesised_sums_distributes():
    assert parse("(A^{h1} + A^{h2}) (x) (Id + W_OV^{h1})") == tensor(term(A1) + term(A2), identity(1) + term(W1))


@PROPERTY
@given(any_expression())
def test_round_trip_through_text(e):
    assert parse(to_text(e)) == e


@PROPERTY
@given(layouts.flatmap(tensor_sums))
def test_parse_reads_what_str_prints(s):
    text = str(s) if len(s) else to_text(s)
    assert parse(text) == s


def test_to_text_of_lazy_expressions():
    p = Product([term(A1, W1), identity(2) + term(A2, W2)], coeff=-sp.Rational(1, 2))
    assert to_text(p) == "-1/2·(A^{h1} ⊗ W_OV^{h1})(Id ⊗ Id + A^{h2} ⊗ W_OV^{h2})"
    assert to_text(TensorSum([], n_slots=3)) == "0·Id ⊗ Id ⊗ Id"
    assert to_text(W1.T) == "W_OV^{h1}ᵀ"
    with pytest.raises(TensorAlgError, match="braces"):
        to_text(term(Atom("A", 1, 1, index="{x}")))
    with pytest.raises(TensorAlgError, match="got str"):
        to_text("A")


# -- declared atoms ----------------------------------------------------------------------


def test_declared_atoms_with_new_dimensions():
    e = parse("V^{1} V^{1}ᵀ + k·W_OV", atoms={"V": ("d_model", "k")})
    k = sp.Symbol("k", positive=True, integer=True)
    v = Atom("V", d_model, k, "1")
    assert e == term((v, v.T)) + term(atom("W_OV"), coeff=k)
    assert e.slot_shapes == ((d_model, d_model),)


def test_declared_atoms_as_atom_objects_and_symmetric():
    d = Atom("D", d_model, d_model, symmetric=True)
    assert parse("D^{2}ᵀ", atoms=[d]) == term(d.with_index("2"))
    assert parse("Dᵀ", atoms={"D": ("n_ctx", "n_ctx", True)}) == parse("D", atoms={"D": ("n_ctx", "n_ctx", True)})


@pytest.mark.parametrize("atoms", [{"Id": ("d_model", "d_model")}, {"d_head": (1, 1)}, {"2x": (1, 1)},
                                   {"V": ("d model", 1)}, {"V": (1,)}, ["V"]])
def test_bad_declarations_are_rejected(atoms):
    with pytest.raises(TensorAlgError):
        parse("W_E", atoms=atoms)


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, position, message",
    [
        ("", 0, "empty expression"),
        ("   ", 0, "empty expression"),
        ("A +", 3, "expected an atom, Id, a number or '('"),
        ("A ⊗ ⊗ W_E", 4, "found '⊗'"),
        ("A^{h", 1, "unclosed index"),
        ("A^{a{b}", 4, "may not contain '{'"),
        ("A^", 2, "expected an index ('^h', '^{h1}') or 'T'"),
        ("A^-1", 2, "expected an index ('^h', '^{h1}') or 'T'"),
        ("A^{}", 1, "empty index"),
        ("Σ_{h∈H_1}", 9, "expected the terms summed over h"),
        ("Σ h", 1, "expected '_{' after 'Σ'"),
        ("sum_{h of H} A^h", 5, "cannot read the range of the sum"),
        ("Σ_{h∈H_1} A^h + Σ_{h∈H_1} W_E", 26, "summed index h does not appear"),
        ("A Σ_{h∈H} A^h", 2, "starts a term"),
        ("(A", 2, "')' to close the '(' at position 0"),
        ("A)", 1, "unexpected ')'"),
        ("()", 1, "empty parentheses"),
        ("2", 0, "only the scalar 2"),
        ("A + 2", 4, "cannot add the scalar 2"),
        ("2 ⊗ A", 0, "⊗ needs tensor operands"),
        ("Id^{h}", 2, "Id takes no index"),
        ("A / A", 4, "divides by a scalar only"),
        ("A/0", 2, "division by zero"),
        ("A ** 2", 0, "raises a scalar"),
        ("2 ** A", 5, "exponent must be a scalar"),
        ("A^{h}ᵀ^{2}", 6, "must directly follow an atom name"),
        ("^{2}", 0, "must directly follow an atom name"),
        ("A @ W_E", 2, "unexpected character '@'"),
        ("2ᵀ A", 0, "not the scalar 2"),
        ("sqrt A", 5, "'(' after sqrt"),
        ("sqrt(A)", 5, "sqrt takes a scalar"),
    ],
)
def test_parse_errors_point_at_the_position(text, position, message):
    with pytest.raises(ParseError) as info:
        parse(text)
    assert info.value.position == position
    assert message in str(info.value)
    assert str(info.value).endswith("\n  " + text + "\n  " + " " * position + "^")


def test_unknown_atoms_list_the_known_ones():
    with pytest.raises(UnknownAtom) as info:
        parse("A ⊗ B", generic=False)
    text = str(info.value)
    assert "unknown atom 'B' at position 4" in text
    assert "W_OV" in text and "W_QK" in text and "Id" in text and "d_head" in text


def test_shape_mismatches_name_both_shapes_and_the_position():
    with pytest.raises(ShapeMismatch) as info:
        parse("Id ⊗ W_U W_U")
    assert "d_vocab x d_model" in str(info.value) and "at position 9" in str(info.value)
    with pytest.raises(ShapeMismatch, match="d_model x d_vocab"):
        parse("W_E + W_U")
    with pytest.raises(SlotMismatch, match="at position 3"):
        parse("(A)(A ⊗ A)")
    with pytest.raises(SlotMismatch):
        parse("A + A ⊗ A")


def test_parse_takes_text():
    with pytest.raises(TensorAlgError, match="takes a string"):
        parse(term(A1))
