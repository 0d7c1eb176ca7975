"""Derivations as values: rules, steps, chains, numeric verification."""

import dataclasses

import numpy as np
import pytest
import sympy as sp
from hypothesis import given

from tensoralg import W_OV, Atom, Product, TensorSum, atom, d_model, identity, term, to_numpy
from tensoralg.parse import parse

from derivations.derivation import RULES, Chain, Derivation, Rule, Step, rule
from derivations.derivation import verify
from derivations.numeric import Numeric, RandomBindings, causal_pattern, instantiate
from derivations.errors import DerivationError
from derivations.render import Math, SumIndex

from tests.conftest import PROPERTY
from tests.strategies import layouts, products

A0, W0 = atom("A", "h0"), atom("W_OV", "h0")
H0 = SumIndex("h0", Math("H_0", "H_0"))


def one_layer_product():
    return term(None, atom("W_U")) @ (identity(2) + term(A0, W0)) @ term(None, atom("W_E"))


def test_rules_are_looked_up_by_any_spelling_and_unknown_names_get_a_rule():
    assert rule("mixed_product") is RULES["mixed-product"]
    assert rule("Mixed Product") is RULES["mixed-product"]
    assert rule("commutation") == Rule("commutation", "commutation")
    with pytest.raises(DerivationError, match="known: definition"):
        rule("  ")


def test_chain_methods_return_new_chains_and_values_are_frozen():
    start = Chain.start(Math("T", "T"), one_layer_product())
    expanded = start.expand()
    assert len(start.steps) == 1 and len(expanded.steps) > 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        expanded.lhs = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        expanded.steps[0].expr = term(A0, W0)


def test_expand_records_each_rule_and_merges_a_collect_that_combines_nothing():
    chain = Chain.start(None, one_layer_product()).expand()
    assert [s.rule.key for s in chain.steps] == ["definition", "distributivity", "mixed-product"]
    assert chain.last == one_layer_product().expand()
    assert isinstance(chain.last, TensorSum)


def test_expand_keeps_a_collect_that_combines_like_terms():
    layer = identity(2) + term(A0, None)
    chain = Chain.start(None, layer @ layer).expand()
    assert [s.rule.key for s in chain.steps][-1] == "collect"
    assert chain.last.coeff(A0, None) == 2


def test_expand_with_max_order_records_a_truncation():
    layer = lambda i: identity(2) + term(atom("A", i), atom("W_OV", i))
    chain = Chain.start(None, layer(1) @ layer(0)).expand(max_order=1)
    assert chain.steps[1].rule.key == "truncation"
    assert len(chain.last) == 3
    assert verify(Derivation("t", "t", "", (chain,))).ok


def test_fold_and_unfold_state_the_definition():
    chain = Chain.start(None, term(A0, (atom("W_O", "h0"), atom("W_V", "h0")))).fold(W_OV)
    assert chain.last == term(A0, W0)
    assert chain.steps[-1].rule.key == "fold"
    assert any(isinstance(s, TensorSum) for s in chain.steps[-1].detail)
    assert chain.unfold(W_OV).last == chain.first


def test_steps_reject_non_expressions_and_groups_that_do_not_add_up():
    with pytest.raises(DerivationError, match="tensoralg expression"):
        Step("A ⊗ W", "definition")
    s = term(A0, W0) + identity(2)
    with pytest.raises(DerivationError, match="do not add up"):
        Step(s, "regroup", groups=(("heads", term(A0, W0)),))
    assert Step(s, "regroup", groups=(("id", identity(2)), ("heads", term(A0, W0)))).groups[0][0] == "id"


def test_derivations_validate_their_fields():
    chain = Chain.start(None, term(A0, W0))
    with pytest.raises(DerivationError, match="title must be a string"):
        Derivation("x", 3, "", (chain,))
    with pytest.raises(DerivationError, match="at least one Chain"):
        Derivation("x", "x", "", ())
    with pytest.raises(DerivationError, match="left-hand side"):
        Chain.start("T", term(A0, W0))
    d = Derivation("x", "x", "", [chain], notes=["a note", ("with ", Math("A", "A"))], params={"heads": 2})
    assert d.params == (("heads", 2),) and d.notes[0] == ("a note",)


def test_verify_passes_correct_chains_and_catches_a_wrong_line():
    good = Chain.start(Math("T", "T"), one_layer_product(), sums=[H0]).expand()
    assert verify(Derivation("g", "g", "", (good,))).ok
    wrong = Chain(good.lhs, good.steps + (Step(term(A0, (atom("W_U"), W0, atom("W_E"))), "collect"),), (), good.sums)
    report = verify(Derivation("w", "w", "", (wrong,)))
    assert not report.ok and report.worst > 1e-3
    assert [e for _, i, e in report.errors if e > 1e-3] and report.errors[-1][1] == len(wrong.steps) - 1


def test_verify_checks_the_mixed_product_rule_itself_not_its_expansion():
    # a product is evaluated as the matrix product of its factors' operators
    bindings = RandomBindings(Numeric(), np.random.default_rng(1))
    p = term(A0, None) @ term(atom("A", "h1"), W0)
    dense = bindings.operator(p, {0: 4, 1: 5})
    A, B, W = (bindings.values[a] for a in (A0, atom("A", "h1"), W0))
    np.testing.assert_allclose(dense, np.kron(A @ B, W))


def test_sum_indices_are_instantiated_within_each_term():
    expr = (identity(2) + term(atom("A", "h1"), atom("W_OV", "h1"))) @ (identity(2) + term(A0, W0))
    sums = [SumIndex("h1", Math("H_1", "H_1")), H0]
    full = instantiate(expr, sums, 3).expand()
    assert len(full) == 16  # (1 + 3)^2 paths
    assert len(instantiate(term((atom("A", "h1"), A0), W0), sums, 3)) == 9


def test_derived_atoms_are_bound_consistently_with_their_definitions():
    bindings = RandomBindings(Numeric(), np.random.default_rng(0))
    W = bindings.bind(W0)
    np.testing.assert_allclose(W, bindings.bind(atom("W_O", "h0")) @ bindings.bind(atom("W_V", "h0")))
    pattern = bindings.bind(A0)
    np.testing.assert_allclose(pattern.sum(axis=1), 1)
    assert np.allclose(np.triu(pattern, 1), 0)
    n = bindings.bind(atom("N", "L0"))
    assert np.allclose(n, np.diag(np.diag(n)))


def test_causal_pattern_rows_sum_to_one():
    a = causal_pattern(5, np.random.default_rng(2))
    np.testing.assert_allclose(a.sum(axis=1), 1)
    assert a[0, 1:].sum() == 0


def test_verify_sizes_a_fresh_shape_and_reports_a_coefficient_without_a_value():
    """Issue 56: a shape with no given size (q_dim, rows_B) gets a small one, 2 to 4, as tensoralg's check gives
    it (``check`` printed "they differ by 0" and then "no numeric value for rows_B"); a given size is kept; a
    coefficient with no value is still refused, with the hint."""
    k = sp.Symbol("q_dim", positive=True, integer=True)
    V = Atom("V", d_model, k)
    d = Derivation("x", "x", "", (Chain.start(None, term(None, V)),))
    assert d.verify().ok
    bindings = RandomBindings(Numeric(dims={"q_dim": 7}), np.random.default_rng(0))
    assert bindings.size(k) == 7 and 2 <= RandomBindings(Numeric(), np.random.default_rng(0)).size(k) <= 4
    with pytest.raises(DerivationError, match=r"no numeric value for 2\*c; give its sizes in Numeric\(dims"):
        bindings.number(sp.Symbol("c") * 2)


def test_repr_methods_for_jupyter():
    d = Derivation("x", "A title", "", (Chain.start(Math("T", "T"), one_layer_product(), sums=[H0]).expand(),))
    latex = d._repr_latex_()
    assert latex.startswith("$$\\begin{aligned}") and latex.endswith("\\end{aligned}$$")
    assert r"\sum_{h_0 \in H_{0}}" in latex and "[mixed-product rule]" in latex
    assert d._repr_markdown_() == d.to_markdown()


def test_parsed_expressions_make_chains():
    chain = Chain.start(None, parse("(A^{1} ⊗ W_OV^{1})(A^{0} ⊗ W_OV^{0})"), "given").expand()
    assert str(chain.last) == "A^{1} A^{0} ⊗ W_OV^{1} W_OV^{0}"


def test_group_labels_may_be_prose_with_formulae():
    from derivations.document import math

    chain = Chain.start(None, term(A0, W0) + term(None, W0))
    labelled = chain.regroup([(("through ", math("A^h")), term(A0, W0)), ("direct", term(None, W0))])
    (first, _), (second, _) = labelled.steps[-1].groups
    assert first == ("through ", math("A^h")) and second == "direct"
    assert "[through $A^{h}$]" in Derivation("x", "t", "", (labelled,)).to_latex()


@PROPERTY
@given(layouts.flatmap(products))
def test_expansion_names_associativity_for_one_slot_and_the_mixed_product_for_more(expr):
    from derivations.derivation import product_rule

    chain = Chain.start(None, expr, "given").expand()
    named = [s.rule.key for s in chain.steps if s.rule.key in ("associativity", "scalars", "mixed-product")]
    assert named == [product_rule(expr)] * len(named)
    assert (named == ["mixed-product"] * len(named)) == (expr.n_slots > 1 or not named)
    assert chain.last == expr.expand()
