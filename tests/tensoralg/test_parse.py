"""The text language: grammar, precedence, round trips and errors that point at the position."""

from __future__ import annotations

import pytest
import sympy as sp
from hypothesis import given

import numpy as np

from tensoralg import (
    Add, Atom, ParseError, Product, ShapeMismatch, SlotMismatch, TensorAlgError, TensorSum, UnknownAtom, atom,
    d_head, d_model, identity, n_ctx, parse, tensor, term, to_numpy, to_text,
)
from tensoralg.action import act
from tensoralg.parse import Bound, read
from tests.helpers import SIZES, assert_numerically_equal, numeric, random_bindings
from tests.strategies import PROPERTY, any_expression, layouts, slide_notations, tensor_sums

SLIDES = slide_notations()

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
        ("A^{T}", term(atom("A").T)),  # ^{T} transposes, as ^T (it read as a head named T)
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


# the round trip of everything the printers emit: tests/tensoralg/test_round_trip.py


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
    with pytest.raises(SlotMismatch) as info:
        parse("A + A ⊗ A")
    assert "Id" not in str(info.value)  # the hint below is for I alone


def test_an_I_typed_for_the_identity_is_told_to_write_Id():
    """The slides' I is a matrix named I here: a slot mismatch involving it says how the identity is written."""
    for text in ("I + A^h ⊗ W_OV^h", r"(I \otimes W_U)(I + A^{h} \otimes W_{OV}^{h})"):
        with pytest.raises(SlotMismatch, match=r"the identity of every slot is written Id"):
            parse(text)
    assert str(parse(r"(\mathrm{Id} \otimes W_U)(\mathrm{Id} + A^{h} \otimes W_{OV}^{h})").expand()) == \
        "Id ⊗ W_U + A^{h} ⊗ W_U W_OV^{h}"


def test_parse_takes_text():
    with pytest.raises(TensorAlgError, match="takes a string"):
        parse(term(A1))


# -- the slides' notation ---------------------------------------------------------------------


@pytest.mark.parametrize("new, old", [
    ("A^h ⊗ W_OV^h", "A^{h} ⊗ W_OV^{h}"),
    ("W_O^{h} W_V^h1", "W_O^{h} W_V^{h1}"),
    ("A^2 A^1 ⊗ W_OV^2ᵀ", "A^{2} A^{1} ⊗ W_OV^{2}ᵀ"),
    ("W_OV^h^T", "W_OV^{h}ᵀ"),
    ("A^T", "Aᵀ"),
    ("A^{h^T}", "A^{h}ᵀ"),
    ("A^{h^\\top}", "A^{h}ᵀ"),
])
def test_bare_superscripts_read_as_braced_ones(new, old):
    assert parse(new) == parse(old)


@pytest.mark.parametrize("text", ["A^Th", "A^{Th}", "W_QK^{T h1}", "W_QK^{\\top h}", "A^{h^2}"])
def test_a_superscript_neither_a_head_nor_a_transpose_is_refused_never_a_head(text):
    """``W_QK^{Th}`` made a head named Th (issue 27): the transpose goes after the head."""
    with pytest.raises(ParseError, match="neither a head nor a transpose") as info:
        parse(text)
    assert "^{hT}" in str(info.value) or "^{h1T}" in str(info.value)


def test_undeclared_names_get_shapes_that_the_products_fix():
    e = parse("(A ⊗ B)(C ⊗ D)")
    assert e.expand() == parse("A C ⊗ B D", atoms={"B": ("k", "m"), "C": ("n_ctx", "p"), "D": ("m", "q")})
    assert e.slot_shapes[0][0] == sp.Symbol("n_ctx", positive=True, integer=True)
    assert parse("B W_E ⊗ W_U C").slot_shapes == ((sp.Symbol("rows_B", positive=True, integer=True),
                                                   sp.Symbol("d_vocab", positive=True, integer=True)),
                                                  (sp.Symbol("d_vocab", positive=True, integer=True),
                                                   sp.Symbol("cols_C", positive=True, integer=True)))
    d_vocab = sp.Symbol("d_vocab", positive=True, integer=True)
    assert parse("(B ⊗ C)(W_E ⊗ W_E)").slot_shapes == ((sp.Symbol("rows_B", positive=True, integer=True), d_vocab),
                                                       (sp.Symbol("rows_C", positive=True, integer=True), d_vocab))


def test_declared_and_paper_atoms_keep_their_shapes():
    with pytest.raises(ShapeMismatch) as info:
        parse("A W_E")  # the paper's A is n_ctx x n_ctx
    assert "n_ctx x n_ctx" in str(info.value) and "d_model x d_vocab" in str(info.value)
    with pytest.raises(ShapeMismatch, match="d_model x k"):
        parse("V W_U", atoms={"V": ("d_model", "k")})


def test_a_real_mismatch_between_inferred_shapes_names_both():
    with pytest.raises(ShapeMismatch) as info:
        parse("B W_E ⊗ B W_U")  # B's columns would be d_model and d_vocab at once
    text = str(info.value)
    assert "B (rows_B x d_model)" in text and "W_U (d_vocab x d_model)" in text and "at position 10" in text


def test_an_indexed_sum_binds_its_index_per_term():
    r = read("(Id ⊗ W_U)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id ⊗ W_E)")
    assert r.bound == (Bound("h1", "h", "H_1", 1),)
    assert r.expr.expand() == parse("(Id ⊗ W_U)(Id ⊗ Id + A^{h1} ⊗ W_OV^{h1})(Id ⊗ W_E)").expand()
    ascii_sum = read("(Id ⊗ W_U)(Id + sum_{k in H_{2}} A^k (x) W_OV^k)(Id ⊗ W_E)", index_from=1)
    assert ascii_sum.bound == (Bound("k1", "k", "H_2", 1),)


def test_index_from_says_which_layer_h_l_is():
    assert read("Σ_{h∈H_1} A^h ⊗ W_OV^h").bound[0].index == "h1"
    assert read("Σ_{h∈H_1} A^h ⊗ W_OV^h", index_from=1).bound[0].index == "h0"
    with pytest.raises(ParseError, match="H_0 is not a layer when layers are numbered from 1"):
        parse("Σ_{h∈H_0} A^h ⊗ W_OV^h", index_from=1)
    with pytest.raises(TensorAlgError, match="index_from is 0"):
        parse("A", index_from=2)


def test_sums_over_the_same_heads_are_renamed_apart_in_a_product():
    r = read("(Σ_{h∈H_0} A^h ⊗ W_OV^h)(Σ_{h∈H_0} A^h ⊗ W_OV^h)")
    assert {b.index for b in r.bound} == {"h0", "h0'"}
    assert r.expr.expand() == parse("A^{h0} A^{h0'} ⊗ W_OV^{h0} W_OV^{h0'}")
    with pytest.raises(ParseError, match="summed index h does not appear"):
        parse("Σ_{h∈H} Σ_{h∈H} A^h ⊗ W_OV^h")  # the inner sum binds h; the outer one sums nothing


def test_sums_over_other_sets_keep_the_letter():
    r = read("Σ_{j∈J} W_O^j W_V^j")
    assert r.bound == (Bound("j", "j", "J", None),) and r.expr == parse("W_O^{j} W_V^{j}")


def test_a_free_index_may_not_reuse_a_bound_one():
    with pytest.raises(ParseError, match="the index h1 is free here"):
        parse("Σ_{h∈H_1} A^h ⊗ W_OV^h + A^{h1} ⊗ W_OV")


def test_an_operator_applied_to_an_activation():
    assert parse("(A ⊗ W_OV) x") == parse("A x W_OVᵀ", atoms={"x": ("n_ctx", "d_model")})
    assert parse("(A^h ⊗ W_O^h W_V^h)·x") == parse("A^h x W_V^hᵀ W_O^hᵀ", atoms={"x": ("n_ctx", "d_model")})
    r = read("2·(Id + A ⊗ W_OV) x")
    assert r.applied is not None and r.applied.coeff == 2 and r.expr.n_slots == 2
    assert r.applied.result() == parse("2·x + 2·A x W_OVᵀ", atoms={"x": ("n_ctx", "d_model")})
    assert parse("(A ⊗ W_OV) x + A x") == parse("A x W_OVᵀ + A x", atoms={"x": ("n_ctx", "d_model")})
    with pytest.raises(ShapeMismatch, match="W's columns = x's columns"):
        parse("(A ⊗ W_OV) x", atoms={"x": ("n_ctx", "d_vocab")})


def test_reading_records_the_rewrites_it_makes():
    assert read("(W_O W_V)^T ⊗ A").rewrites == (("transpose", (atom("W_O"), atom("W_V"))),)
    r = read("A ⊗ W_E + A ⊗ W_E")
    assert r.rewrites == (("collect", 1),) and isinstance(r.expr, Add)
    assert parse("A ⊗ W_E + A ⊗ W_E") == term(atom("A"), W_E, coeff=2)  # parse() collects at once
    assert read("(A ⊗ W_E + A ⊗ W_E)(Id ⊗ Id)").rewrites == (("collected", 1),)


@given(SLIDES)
@PROPERTY
def test_the_slides_notation_expands_as_the_old_syntax(case):
    """Bare superscripts, Σ, implicit products, generic names and applied operators expand to
    the same operator as the braced, declared syntax: the same canonical sum, the same numbers."""
    old = parse(case.old, atoms=case.atoms).expand()
    if not case.applied:
        new = parse(case.new, index_from=case.index_from).expand()
        assert new == old
        assert_numerically_equal(new, old)
        return
    new = parse(case.new, index_from=case.index_from)
    x = Atom("x", n_ctx, d_model)
    assert new == act(old, term(x))
    bindings = random_bindings(old, x)
    op = numeric(old, bindings, slot_sizes={0: SIZES["n_ctx"], 1: SIZES["d_model"]})  # acts on x row by row
    value = to_numpy(new, bindings, dims=dict(SIZES))
    np.testing.assert_allclose(value.reshape(-1), op @ bindings["x"].reshape(-1), rtol=1e-9, atol=1e-9)


def test_inferred_shapes_evaluate_with_any_bound_sizes():
    rng = np.random.default_rng(0)
    values = {"A": rng.normal(size=(3, 3)), "B": rng.normal(size=(2, 4)), "C": rng.normal(size=(3, 5)),
              "D": rng.normal(size=(4, 2))}
    dense = to_numpy(parse("(A ⊗ B)(C ⊗ D)"), values, dims={"n_ctx": 3})
    np.testing.assert_allclose(dense, np.kron(values["A"], values["B"]) @ np.kron(values["C"], values["D"]))


def test_a_long_sum_of_undeclared_names_is_inferred_in_one_reread():
    """The terms of a sum are equated slot by slot at once: 300 terms B_i ⊗ C_i took 26 s (one reread
    of the whole text per name), 3,000 names in a check minutes."""
    import time

    start = time.perf_counter()
    e = parse(" + ".join(f"B{i} ⊗ C{i}" for i in range(300)) + " + A ⊗ W_E")
    assert time.perf_counter() - start < 8
    assert e.slot_shapes == parse("A ⊗ W_E").slot_shapes


# -- a sum over the heads of several layers, as the paper writes Σ_{h∈H_1∪H_2} -----------------

@pytest.mark.parametrize("union", ["Σ_{h∈H_1∪H_2}", "sum_{h in H_1 cup H_2}", r"\sum_{h \in H_1 \cup H_2}",
                                   r"\sum_{h \in H_{1} \cup H_{2}}", "Σ_{h∈H_2∪H_1}"])
def test_a_sum_over_a_union_of_layers_is_the_sum_over_each(union):
    one_by_one = parse("Σ_{h∈H_1} A^h ⊗ W_OV^h + Σ_{h∈H_2} A^h ⊗ W_OV^h", index_from=1)
    assert parse(f"{union} A^h ⊗ W_OV^h", index_from=1).expand() == one_by_one.expand()
    assert {(b.index, b.over) for b in read(f"{union} A^h ⊗ W_OV^h", index_from=1).bound} == {("h0", "H_1"), ("h1", "H_2")}


def test_a_union_prints_as_one_sum_per_layer_and_reads_back():
    e = parse("Σ_{h∈H_1∪H_2} (A^h ⊗ W_OV^h)(Id ⊗ W_E)", index_from=1)  # a lazy body, copied per layer
    text = to_text(e.expand(), index_from=1)
    assert text == "Σ_{h1∈H_1} A^{h1} ⊗ W_OV^{h1} W_E + Σ_{h2∈H_2} A^{h2} ⊗ W_OV^{h2} W_E"
    assert parse(text, index_from=1).expand() == e.expand()


def test_nested_unions_give_every_pair_of_layers():
    e = parse("Σ_{h∈H_1∪H_2} Σ_{g∈H_1∪H_2} A^h A^g ⊗ W_OV^h W_OV^g", index_from=1).expand()
    assert len(e) == 4 and {tuple(a.index for a in t.words[0]) for t in e} == {
        ("h0", "g0"), ("h0", "g1"), ("h1", "g0"), ("h1", "g1")}


@pytest.mark.parametrize("text, fragment", [
    ("Σ_{h∈H_1∪J} A^h", "'J' is not a layer's heads H_l"),
    ("Σ_{h∈H_1∪H_01} A^h", "a layer appears twice in the union"),
    ("Σ_{h∈H_1∪H_2∪} A^h", "'' is not a layer's heads"),
    ("Σ_{h∈H_1 | H_2} A^h", "a union of layers' heads Σ_{h∈H_1∪H_2}"),
    ("Σ_{h2∈H_1∪H_2} A^h2", "the index h2 names another layer than H_1"),
    ("Σ_{h∈H_1∪H_" + "9" * 5000 + "} A^h", "at most 18 digits"),
])
def test_a_union_that_is_not_one_of_layers_heads_is_refused_with_what_to_write(text, fragment):
    with pytest.raises(ParseError, match=None) as err:
        parse(text, index_from=1)
    assert fragment in str(err.value)


def test_a_union_is_bounded_in_terms_and_in_time():
    import time
    layers = "∪".join(f"H_{l}" for l in range(1, 3001))
    start = time.perf_counter()
    with pytest.raises(ParseError, match="more than the 20,000 the reader multiplies out"):
        parse(f"Σ_{{h∈{layers}}} (A^h + B^h + C^h + D^h + E^h + F^h + G^h) ⊗ W_OV^h", index_from=1)
    with pytest.raises(ParseError):  # a long run of spaces before a bad union: read once, not once per space
        parse("Σ_{h∈H_1" + " " * 200_000 + "∪ J} A^h", index_from=1)
    assert time.perf_counter() - start < 10
