"""The core algebra: canonical sums, lazy products, transposes, counts, shapes and errors."""

from __future__ import annotations

import re
from math import comb

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from tensoralg import (
    Add, EmptySum, InvalidOrder, Product, ShapeMismatch, SlotMismatch, TensorSum, add, atom, identity,
    d_head, d_model, d_vocab, tensor, term, to_latex,
)
from tensoralg.atoms import transpose_word
from tensoralg.expr import Term, sum_tensor_sums
from tensoralg.rules import collect, distribute, expand_steps
from tests.helpers import assert_numerically_equal, numeric, random_bindings, slot_sizes_of, transformer_product
from tests.strategies import (
    PROPERTY, any_expression, atoms, expressions, layouts, numeric_bindings, products, seeds, tensor_sums, terms,
)

A1, A2 = atom("A", "h1"), atom("A", "h2")
W1, W2 = atom("W_OV", "h1"), atom("W_OV", "h2")
W_E, W_U = atom("W_E"), atom("W_U")


# -- canonical form -------------------------------------------------------------


def test_like_terms_collect_and_zero_terms_vanish():
    s = term(A1, W1) + identity(2) + 2 * term(A1, W1) - identity(2)
    assert s == 3 * term(A1, W1)
    assert len(s) == 1 and s.coeff(A1, W1) == 3
    assert (term(A1, W1) - term(A1, W1)).is_zero


def test_canonical_order_is_fewer_atoms_first_then_names():
    s = term((A2, A1), (W2, W1)) + term(A1, W1) + identity(2)
    assert str(s) == "Id ⊗ Id + A^{h1} ⊗ W_OV^{h1} + A^{h2} A^{h1} ⊗ W_OV^{h2} W_OV^{h1}"


@PROPERTY
@given(layouts.flatmap(lambda lay: st.lists(terms(lay), min_size=1, max_size=6)), st.randoms(use_true_random=False))
def test_canonical_form_is_independent_of_input_order(ts, rnd):
    """Confluence: shuffled terms, split into groups summed in any order, give one normal form."""
    s = TensorSum(ts)
    shuffled = ts[:]
    rnd.shuffle(shuffled)
    cut = rnd.randint(1, len(shuffled))
    groups = [TensorSum(shuffled[:cut], n_slots=s.n_slots), TensorSum(shuffled[cut:], n_slots=s.n_slots)]
    rebuilt = [TensorSum(shuffled), sum_tensor_sums(groups[::-1]), add(*groups), TensorSum(dict(reversed(list(s.as_dict().items()))), n_slots=s.n_slots)]
    for r in rebuilt:
        assert r == s
        assert hash(r) == hash(s)
        assert repr(r) == repr(s) and str(r) == str(s)
        assert to_latex(r) == to_latex(s)
        assert list(r) == list(s)


@PROPERTY
@given(any_expression())
def test_canonical_form_is_idempotent(e):
    s = e.expand()
    assert s.expand() is s
    assert TensorSum(list(s), n_slots=s.n_slots) == s
    assert collect(s) == s
    assert collect(e) == s


@PROPERTY
@given(layouts.flatmap(lambda lay: st.tuples(products(lay, max_factors=2), products(lay, max_factors=2))), st.data())
def test_confluence_of_rewrite_orders(pair, data):
    """Expanding inner products first, distributing first, or all at once: one normal form, one number."""
    p, q = pair
    whole = (p @ q).expand()
    assert (p.expand() @ q).expand() == whole
    assert (p @ q.expand()).expand() == whole
    assert collect(distribute(p @ q)) == whole
    assert expand_steps(p @ q)[-1][1] == whole
    assert_numerically_equal(p @ q, whole, seed=data.draw(seeds()))


@PROPERTY
@given(any_expression())
def test_from_canonical_rebuilds_a_checked_sum_without_checking_it_again(e):
    s = e.expand()
    rebuilt = TensorSum.from_canonical(s.as_dict(), s.n_slots, s.slot_shapes)
    assert rebuilt == s and hash(rebuilt) == hash(s) and rebuilt.slot_shapes == s.slot_shapes
    assert list(rebuilt) == list(s)  # the same canonical order


def test_from_canonical_drops_zeros_and_brings_coefficients_to_canonical_form():
    x = sp.Symbol("x")
    terms = {((A1,), (W1,)): x * (x + 1) - x**2, ((A2,), (W2,)): x - x}
    s = TensorSum.from_canonical(terms, 2, (A1.shape, W1.shape))
    assert s == TensorSum(terms) == term(A1, W1, coeff=x)
    with pytest.raises(SlotMismatch, match="a 2-slot sum needs 2 slot shapes, got 1"):
        TensorSum.from_canonical(terms, 2, (A1.shape,))


# -- transpose ------------------------------------------------------------------


def test_transpose_of_atoms_words_and_identity():
    assert W1.T.T == W1 and W1.T != W1
    assert W1.T.T is W1 and W1.T is W1.T  # an atom's transpose is made once
    assert transpose_word((W_U, W1, W_E)) == (W_E.T, W1.T, W_U.T) and transpose_word(()) == ()
    assert atom("N", 1).T == atom("N", 1)  # symmetric
    assert identity(2).T == identity(2)
    assert term((A2, A1), (W_U, W1)).T == term((A1.T, A2.T), (W1.T, W_U.T))
    assert term(W_E).T.slot_shapes == ((d_vocab, d_model),)


@PROPERTY
@given(atoms())
def test_atom_transpose_is_an_involution_that_swaps_the_shape(a):
    assert a.T.T == a and a.T.shape == a.shape[::-1]
    assert (a.T == a) == a.symmetric


@PROPERTY
@given(any_expression().flatmap(lambda e: st.tuples(st.just(e), numeric_bindings(e))))
def test_transpose_is_an_involution_and_transposes_the_operator(pair):
    e, bindings = pair
    assert e.T.T == e
    np.testing.assert_allclose(numeric(e.T, bindings), numeric(e, bindings).T, atol=1e-9)


# -- products, orders and counts ------------------------------------------------


@pytest.mark.parametrize("n_layers, n_heads", [(1, 1), (1, 3), (2, 2), (2, 12), (3, 4), (3, 12)])
def test_transformer_product_term_counts(n_layers, n_heads):
    """``(Id⊗W_U) Π_l (Id + Σ_h A⊗W) (Id⊗W_E)``: (1+H)^L terms, Σ_{j≤k} C(L,j) H^j at order k."""
    p = transformer_product(n_layers, n_heads)
    assert len(p.expand()) == p.count() == len(p) == (1 + n_heads) ** n_layers
    for k in range(n_layers + 2):
        expected = sum(comb(n_layers, j) * n_heads**j for j in range(min(k, n_layers) + 1))
        assert len(p.expand(max_order=k)) == p.count(max_order=k) == expected


def test_twelve_layers_truncated_at_order_two():
    p = transformer_product(12, 12)
    assert p.count(max_order=2) == len(p.expand(max_order=2)) == 9649


def test_iter_terms_gives_each_product_with_its_provenance():
    p = transformer_product(2, 2)
    choices = list(p.iter_terms(max_order=1))
    assert len(choices) == p.count(max_order=1) == 5
    assert all(c.order <= 1 for c in choices)
    assert TensorSum([c.term for c in choices]) == p.expand(max_order=1)
    first_order = [c for c in choices if c.order == 1]
    assert {c.indices for c in first_order} == {(0, 0, 1, 0), (0, 0, 2, 0), (0, 1, 0, 0), (0, 2, 0, 0)}


def test_product_of_sums_stays_lazy_until_expanded():
    p = (identity(2) + term(A1, W1)) @ (identity(2) + term(A2, W2))
    assert isinstance(p, Product) and len(p.factors) == 2
    assert p.expand() == identity(2) + term(A1, W1) + term(A2, W2) + term((A1, A2), (W1, W2))


@PROPERTY
@given(layouts.flatmap(lambda lay: st.lists(tensor_sums(lay, max_terms=3), min_size=2, max_size=3)), seeds())
def test_product_is_the_matrix_product_of_the_operators(factors, seed):
    p = Product(factors)
    bindings = random_bindings(*factors, seed=seed)
    sizes = slot_sizes_of(*factors)
    expected = np.linalg.multi_dot([numeric(f, bindings, slot_sizes=sizes) for f in factors])
    np.testing.assert_allclose(numeric(p, bindings, slot_sizes=sizes), expected, atol=1e-9)


@PROPERTY
@given(st.sampled_from([("n_ctx",), ("n_ctx", "d_model")]).flatmap(tensor_sums), tensor_sums(("d_model",)), seeds())
def test_tensor_product_is_kron_of_the_operators(a, b, seed):
    bindings = random_bindings(a, b, seed=seed)
    sa, sb = slot_sizes_of(a), slot_sizes_of(b)
    both = {**sa, **{a.n_slots + i: n for i, n in sb.items()}}
    np.testing.assert_allclose(
        numeric(tensor(a, b), bindings, slot_sizes=both),
        np.kron(numeric(a, bindings, slot_sizes=sa), numeric(b, bindings, slot_sizes=sb)), atol=1e-9,
    )


# -- shapes ---------------------------------------------------------------------


def test_word_shape_mismatch_message_is_pinned():
    with pytest.raises(ShapeMismatch) as info:
        term((A1, W_E))
    assert str(info.value) == (
        "cannot multiply A^{h1} (n_ctx x n_ctx) by W_E (d_model x d_vocab): n_ctx columns against d_model rows"
    )


@pytest.mark.parametrize(
    "build, shapes",
    [
        (lambda: term(None, W_E) @ term(None, W_E), ("d_model x d_vocab", "d_model x d_vocab")),
        (lambda: term(W_E) + term(W_U), ("d_vocab x d_model", "d_model x d_vocab")),
        (lambda: term(W_E) + identity(1), ("Id", "d_model x d_vocab")),
        (lambda: TensorSum([Term(1, ((),)), Term(1, ((W_E,),))]), ("Id", "d_model x d_vocab")),
        (lambda: term(A1, W1) + term(W1, A1), ("d_model x d_model", "n_ctx x n_ctx")),
    ],
)
def test_shape_mismatches_name_both_shapes(build, shapes):
    with pytest.raises(ShapeMismatch) as info:
        build()
    for shape in shapes:
        assert shape in str(info.value)


ADDING_D_VOCAB_TO_D_MODEL = "slot 1: cannot add d_model x d_model terms to d_vocab x d_vocab terms"


@pytest.mark.parametrize("build", [
    lambda: TensorSum([Term(1, ((), (W_U, W_E))), Term(1, ((A1,), (W1,)))]),
    lambda: term(None, (W_U, W_E)) + term(A1, W1),
    lambda: sum_tensor_sums([term(None, (W_U, W_E)), term(A1, W1)]),
    lambda: add(term(None, W_U) @ term(None, W_E), term(A1, W1)),
    lambda: Add([term(None, W_U) @ term(None, W_E), term(A1, W1)]),
    lambda: Add([term(None, (W_U, W_E)), term(A1, None) @ term(None, W1)]),
], ids=["TensorSum", "+", "sum_tensor_sums", "add", "Add of a product", "Add of a sum"])
def test_adding_different_shapes_has_one_wording_naming_both(build):
    with pytest.raises(ShapeMismatch) as info:
        build()
    assert str(info.value) == ADDING_D_VOCAB_TO_D_MODEL
    assert set(info.value.dims) == {(d_model, d_vocab)}  # the disagreeing dimensions, for shape inference


def test_a_lazy_sum_checks_its_shapes_when_it_is_made():
    # regression: Add used to accept parts of different shapes and fail only when its
    # slot_shapes were read (or never, if nothing read them)
    with pytest.raises(ShapeMismatch, match="slot 1: cannot add"):
        Add([term(None, W_U) @ term(None, W_E), term(A1, W1)])
    lazy = Add([term(None, W_U) @ (identity(2) + term(A1, W1)), term(A2, W_U)])
    assert lazy.slot_shapes == lazy.expand().slot_shapes


@PROPERTY
@given(layouts.flatmap(lambda lay: st.lists(expressions(lay), min_size=1, max_size=3)))
def test_a_lazy_sums_shapes_are_those_of_its_expansion(parts):
    lazy = Add(parts)
    expanded = lazy.expand()
    for known, after in zip(lazy.slot_shapes, expanded.slot_shapes):
        assert after is None or known == after


def test_slot_mismatch():
    with pytest.raises(SlotMismatch, match=re.escape("[2, 3]")):
        identity(2) + identity(3)
    with pytest.raises(SlotMismatch):
        identity(2) @ term(atom("W_E"))


def test_bare_identity_widens_to_the_other_operands_slots():
    """``Id = Id ⊗ Id``: the paper's ``Id + A ⊗ W`` is ``Id ⊗ Id + A ⊗ W``."""
    A, W = atom("A", "h"), atom("W_OV", "h")
    assert identity(1) + term(A, W) == identity(2) + term(A, W)
    assert (term(A, W) @ (2 * identity(1))).expand() == term(A, W, coeff=2)
    assert (identity(1) @ term(None, atom("W_E"))).expand() == term(None, atom("W_E"))


# -- bad orders and empty sums ----------------------------------------------------


BAD_ORDERS = [-1, -5, 1.5, 2.0, True, False, "2"]


@pytest.mark.parametrize("order", BAD_ORDERS)
def test_bad_orders_are_rejected_everywhere(order):
    p = transformer_product(2, 2)
    calls = [
        lambda: p.expand(max_order=order), lambda: p.count(max_order=order), lambda: list(p.iter_terms(order)),
        lambda: p.expand().expand(order), lambda: Add([p, identity(2)]).expand(order),
        lambda: distribute(p, order), lambda: expand_steps(p, order),
    ]
    for call in calls:
        with pytest.raises(InvalidOrder, match=re.escape(repr(order))):
            call()


def test_numpy_integer_orders_are_accepted():
    assert transformer_product(2, 2).count(max_order=np.int64(1)) == 5


def test_empty_sums_raise_empty_sum():
    for build in (add, lambda: TensorSum([]), lambda: Product([]), lambda: Add([]), lambda: sum_tensor_sums([])):
        with pytest.raises(EmptySum):
            build()
    assert TensorSum([], n_slots=2).is_zero  # an empty sum with a known slot count is the zero


# -- expressions drawn at random are well formed ------------------------------------


@PROPERTY
@given(layouts.flatmap(expressions))
def test_slot_shapes_survive_expansion(e):
    s = e.expand()
    for known, after in zip(e.slot_shapes, s.slot_shapes):
        assert after is None or known is None or known == after


def test_scalar_coefficients_stay_symbolic():
    s = term(A1, W1, coeff=1 / sp.sqrt(d_head))
    assert str(s) == "1/sqrt(d_head)·A^{h1} ⊗ W_OV^{h1}"
    assert str(term(A1, coeff=1 + sp.sqrt(2))) == "(1 + sqrt(2))·A^{h1}"


def test_expand_collects_products_reached_by_different_choices():
    a = term(atom("A", "1"))
    layer = identity(1) + a
    assert (layer @ layer).expand() == identity(1) + 2 * a + term((atom("A", "1"),) * 2)
    scaled = (2 * identity(1) + a) @ (identity(1) - a)  # an identity term with a coefficient
    assert scaled.expand() == 2 * identity(1) - a - term((atom("A", "1"),) * 2)
    assert scaled.expand(max_order=1) == 2 * identity(1) - a


def test_heads_sort_as_people_count_them():
    """Issue 19: L0H10 sorted before L0H2 (string order of the index) in every printed sum."""
    from derivations import Architecture, expand_logits

    text = str(expand_logits(Architecture(1, 12)).to_tensor_sum())
    positions = [text.index(f"A^{{L0H{h}}}") for h in range(12)]
    assert positions == sorted(positions)
    a = [atom("A", f"h{i}") for i in (10, 2, 1)]
    assert [x.index for x in sorted(a)] == ["h1", "h2", "h10"]
    # distinct indices that count alike stay distinct and ordered the same whatever the input order
    s1 = term(atom("A", "h02")) + term(atom("A", "h2"))
    s2 = term(atom("A", "h2")) + term(atom("A", "h02"))
    assert str(s1) == str(s2) and len(s1) == 2
