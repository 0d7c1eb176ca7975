"""Rewrite rules: each numerically exact, idempotent, and together equal to ``expand``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sympy as sp

from tensoralg import Add, Atom, Product, TensorSum, atom, d_model, identity, term
from tensoralg.errors import EmptySum, SlotMismatch
from tensoralg.definitions import W_OV, W_QK, fold, unfold
from tensoralg.rules import (
    collect, distribute, expand_steps, fold_sum, fold_word, mixed_product, rewrite_words, substitute, transpose,
)
from tests.helpers import assert_numerically_equal, numeric, random_bindings, transformer_product
from tests.strategies import PROPERTY, any_expression, layouts, products, seeds

A1, A2 = atom("A", "1"), atom("A", "2")
W1, W2 = atom("W_OV", "1"), atom("W_OV", "2")


@PROPERTY
@given(any_expression(), seeds())
def test_every_rule_keeps_the_numbers(e, seed):
    bindings = random_bindings(e, seed=seed)
    before = numeric(e, bindings)
    for rule in (distribute, lambda x: mixed_product(distribute(x)), collect):
        np.testing.assert_allclose(numeric(rule(e), bindings), before, atol=1e-9)
    np.testing.assert_allclose(numeric(transpose(e), bindings), before.T, atol=1e-9)


@PROPERTY
@given(any_expression(), seeds())
def test_each_expand_step_keeps_the_numbers_and_ends_at_expand(e, seed):
    steps = expand_steps(e)
    assert [name for name, _ in steps] == [n for n in ("distributivity", "mixed_product", "collect") if n in dict(steps)]
    previous = e
    for _, after in steps:
        assert_numerically_equal(previous, after, seed=seed)
        previous = after
    assert previous.expand() == e.expand()


@PROPERTY
@given(layouts.flatmap(products), st.integers(0, 3))
def test_truncated_steps_end_at_truncated_expand(p, order):
    steps = expand_steps(p, max_order=order)
    assert steps[-1][1] == p.expand(max_order=order)
    assert ("truncation" in dict(steps)) == (p.count(order) < p.count())


@PROPERTY
@given(any_expression())
def test_rules_are_idempotent(e):
    d = distribute(e)
    assert distribute(d) == d
    m = mixed_product(d)
    assert mixed_product(m) == m
    c = collect(m)
    assert collect(c) is c and c == e.expand()


def test_distribute_keeps_products_unmultiplied():
    p = (identity(2) + term(A1, W1)) @ term(A2, W2)
    d = distribute(p)
    assert isinstance(d, Add) and all(isinstance(q, Product) and all(len(f) == 1 for f in q.factors) for q in d.parts)
    assert len(d.parts) == 2


def test_distribute_with_truncation_keeps_order_zero_products():
    p = term(A1, W1) @ term(A2, W2)  # factors without an identity term add no order
    assert distribute(p, max_order=0) == p
    layer = identity(2) + term(A1, W1)
    q = (term(A1, W1) + term(A2, W2)) @ layer
    assert len(distribute(q, max_order=0).parts) == 2


def test_distribute_of_a_product_with_a_zero_factor_is_zero():
    p = Product([TensorSum([], n_slots=2), identity(2) + term(A1, W1)])
    assert distribute(p).is_zero and distribute(p).n_slots == 2


def test_mixed_product_leaves_products_of_sums_alone():
    p = (identity(2) + term(A1, W1)) @ term(A2, W2)
    assert mixed_product(p) == p


def test_mixed_product_is_slot_by_slot():
    p = term(A1, W1, coeff=2) @ term(A2, W2, coeff=3)
    assert mixed_product(p) == term((A1, A2), (W1, W2), coeff=6)


def test_collect_adds_like_terms():
    e = Add([term(A1, W1) @ identity(2), term(A1, W1)])
    assert collect(e) == 2 * term(A1, W1)


def test_expand_steps_of_a_canonical_sum_is_empty():
    assert expand_steps(term(A1, W1)) == []


def test_expand_steps_of_the_transformer_product():
    p = transformer_product(2, 2)
    names = [(name, len(e)) for name, e in expand_steps(p)]
    assert names == [("distributivity", 9), ("mixed_product", 9), ("collect", 9)]
    assert [(name, len(e)) for name, e in expand_steps(p, max_order=1)] == [
        ("truncation", 5), ("mixed_product", 5), ("collect", 5)
    ]


# -- definitions: fold and unfold -------------------------------------------------------


@PROPERTY
@given(any_expression(), seeds())
def test_fold_and_unfold_round_trip_and_keep_the_numbers(e, seed):
    for d in (W_OV, W_QK):
        folded, unfolded = fold(e, d), unfold(e, d)
        assert unfold(folded, d) == unfolded
        assert fold(unfolded, d) == folded
        assert not any(a.name == d.name for t in unfolded for w in t.words for a in w)
        bindings = random_bindings(e, folded, unfolded, seed=seed)
        assert_numerically_equal(e, folded, bindings=bindings)
        assert_numerically_equal(e, unfolded, bindings=bindings)


def test_fold_recognises_transposed_definitions():
    wo, wv = atom("W_O", "h"), atom("W_V", "h")
    assert fold(term((wv.T, wo.T)), W_OV) == term(atom("W_OV", "h").T)
    assert fold(term((atom("W_Q", "h").T, atom("W_K", "h"))), W_QK) == term(atom("W_QK", "h"))
    assert fold(term((wo, atom("W_V", "other"))), W_OV) == term((wo, atom("W_V", "other")))  # indices differ


@pytest.mark.parametrize("rule", [distribute, mixed_product, collect, transpose, substitute, rewrite_words, fold_word, fold_sum])
def test_rules_have_a_docstring_with_an_example(rule):
    assert rule.__doc__ and ">>>" in rule.__doc__


def test_transpose_of_a_canonical_sum_is_a_canonical_sum():
    s = term((A2, A1), (W2, W1))
    assert isinstance(transpose(s), TensorSum) and transpose(transpose(s)) == s


def test_fold_adds_terms_that_fold_to_the_same_words():
    e = term(atom("W_OV", "1")) + term((atom("W_O", "1"), atom("W_V", "1")))
    assert fold(e, W_OV) == 2 * term(atom("W_OV", "1"))


# -- word rewrites: substitution, word identities, folds -------------------------------------

A0, W0 = atom("A", "h0"), atom("W_OV", "h0")


def test_substitute_replaces_an_atom_and_its_transpose_and_distributes():
    X, Y, M = (Atom(n, d_model, d_model) for n in "XYM")
    expr = term((X.T, M, X))
    out = substitute(expr, X, term(X) + term(Y))
    assert len(out) == 4
    values = random_bindings(expr, out)
    replaced = {**values, "X": values["X"] + values["Y"]}  # X bound to the replacement's value
    np.testing.assert_allclose(numeric(expr, replaced), numeric(out, values), atol=1e-12)


def test_substitute_keeps_products_lazy_and_rejects_multi_slot_replacements():
    p = term(None, atom("W_U")) @ term(A0, W0)
    out = substitute(p, A0, identity(1))
    assert isinstance(out, Product) and out.expand() == term(None, (atom("W_U"), W0))
    with pytest.raises(SlotMismatch, match="replaces an atom by a matrix \\(1 slot\\), got 2 slots"):
        substitute(p, A0, identity(2))


def test_rewrite_words_applies_identities_and_drops_vanishing_terms():
    V = Atom("V", d_model, sp.Symbol("k"))
    e = [Atom("e", 2, 1, str(i)) for i in range(2)]
    rules = {(e[i].T, e[j]): (() if i == j else None) for i in range(2) for j in range(2)}
    s = sum((term((e[i].T, e[j]), atom("W_O", i)) for i in range(2) for j in range(2)), start=0)
    assert rewrite_words(s, rules) == term(None, atom("W_O", 0)) + term(None, atom("W_O", 1))
    assert rewrite_words(term((V.T, V, V.T, V)), {(V.T, V): ()}) == identity(1)


def test_fold_word_folds_a_product_and_its_transpose():
    G = Atom("G", d_model, d_model, symmetric=True)
    new = Atom("W_OV'", d_model, d_model, "h0")
    expr = term(A0, (W0, G)) + term(A0, (G, W0.T))
    assert fold_word(expr, (W0, G), new) == term(A0, new) + term(A0, new.T)


def test_fold_sum_folds_only_complete_multiples_of_the_definition():
    b, c, s = Atom("b", 3, 1), Atom("c", 3, 1), Atom("s", 3, 1)
    definition = term(b) + term(c)
    assert fold_sum(2 * term(A0, b) + 2 * term(A0, c), s, definition, 1) == 2 * term(A0, s)
    partial = term(A0, b) + 2 * term(A0, c)
    assert fold_sum(partial, s, definition, 1) == partial


def test_fold_sum_refuses_an_empty_or_multi_slot_definition():
    b, s = Atom("b", 3, 1), Atom("s", 3, 1)
    with pytest.raises(EmptySum, match="cannot fold s := 0"):
        fold_sum(term(A0, b), s, TensorSum([], n_slots=1), 1)
    with pytest.raises(SlotMismatch, match="a folded definition is a matrix \\(1 slot\\), got 2 slots"):
        fold_sum(term(A0, b), s, term(None, b), 1)



def test_distribute_leaves_identity_factors_out_of_products():
    from tensoralg.parse import parse
    from tensoralg.rules import distribute
    given_ = parse("(Id ⊗ W_U)(Id ⊗ Id + A^{h} ⊗ W_OV^{h})(Id ⊗ W_E)")
    two_slot = distribute(given_)
    assert [len(p.factors) for p in two_slot.parts] == [2, 3]  # (Id ⊗ W_U)(Id ⊗ W_E), not three factors
    assert collect(two_slot) == given_.expand()
    only_identities = distribute(parse("(Id + A ⊗ W)(Id + B ⊗ V)"))
    assert [len(p.factors) for p in only_identities.parts] == [1, 1, 1, 2]  # Id ⊗ Id alone is kept once
    assert collect(only_identities) == parse("(Id + A ⊗ W)(Id + B ⊗ V)").expand()
