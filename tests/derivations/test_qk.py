"""One head's QK expansion: terms and composition tags against brute force, the paper's
four sums, the tensoralg sandwich, shapes, numbers against a numpy forward pass, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from tensoralg import InvalidOrder, Product, atom, d_head, sandwich, term
from tensoralg.atoms import n_ctx, word_shape

from derivations.architecture import Architecture
from derivations.errors import ArchitectureError, DerivationError, TooManyTerms
from derivations.paths import POSITION, Source
from derivations.qk import QKExpansion, estimate_qk_terms, expand_qk
from tests.conftest import PROPERTY, THOROUGH
from tests.derivations.numpy_model import NumpyModel
from tests.strategies import architectures_with_head
from tests.derivations.test_paths import brute_force_paths, layer_factor

SCALE = 1 / sp.sqrt(d_head)
TAGS = {(False, False): "direct", (True, False): "Q", (False, True): "K", (True, True): "QK"}


def brute_force_sides(arch: Architecture, layer: int, head: int, query: bool) -> set:
    side = brute_force_paths(arch, layer, None)
    if arch.positional == "qk_only":
        side.add((POSITION, ()))
    if arch.biases:
        side.add((Source("query_bias" if query else "key_bias", layer, head), ()))
    return side


@st.composite
def head_and_order(draw):
    arch, layer, head = draw(architectures_with_head())
    return arch, layer, head, draw(st.none() | st.integers(0, 2 * layer))


@THOROUGH
@given(head_and_order())
def test_terms_and_tags_match_brute_force(case):
    arch, layer, head, max_order = case
    expansion = expand_qk(arch, layer, head, max_order)
    found = [(t.query.source, t.query.heads, t.key.source, t.key.heads, t.composition) for t in expansion]
    expected = {
        (qs, qh, ks, kh, TAGS[bool(qh), bool(kh)])
        for qs, qh in brute_force_sides(arch, layer, head, True)
        for ks, kh in brute_force_sides(arch, layer, head, False)
        if max_order is None or len(qh) + len(kh) <= max_order
    }
    assert len(found) == len(set(found))
    assert set(found) == expected
    assert len(found) == len(expansion) == estimate_qk_terms(arch, layer, head, max_order)
    assert {k: len(v) for k, v in expansion.by_order().items()} == expansion.count_by_order()
    groups = expansion.by_composition()
    assert sum(map(len, groups.values())) == len(found)
    assert list(groups) == [c for c in ("direct", "Q", "K", "QK") if c in groups]
    # terms are distinct: the sums (one per pair of inputs) collect nothing
    assert sum(len(s) for s in expansion.to_tensor_sums().values()) == len(found)


@PROPERTY
@given(architectures_with_head())
def test_every_term_has_consistent_shapes_and_the_scale(case):
    arch, layer, head = case
    for t in expand_qk(arch, layer, head):
        P, Q, M = t.term.words
        assert word_shape(P) in (None, (n_ctx, n_ctx)) and word_shape(Q) in (None, (n_ctx, n_ctx))
        assert word_shape(M) == (t.query.source.input_dim, t.key.source.input_dim)
        assert t.term.coeff == SCALE
        assert t.order == len(t.query.heads) + len(t.key.heads)


def test_two_layers_give_the_papers_four_sums():
    """Id⊗Id⊗(W_EᵀW_QK W_E) + Σ A^{hq}⊗Id⊗(W_EᵀW_OV^{hq T}W_QK W_E)
    + Σ Id⊗A^{hk}⊗(W_EᵀW_QK W_OV^{hk}W_E) + ΣΣ A^{hq}⊗A^{hk}⊗(W_EᵀW_OV^{hq T}W_QK W_OV^{hk}W_E)."""
    E, QK = atom("W_E"), atom("W_QK", "L1H2")
    A, OV = (lambda h: atom("A", f"L0H{h}")), (lambda h: atom("W_OV", f"L0H{h}"))
    heads = range(3)
    sums = {
        "direct": term(None, None, (E.T, QK, E), coeff=SCALE),
        "Q": sum((term(A(q), None, (E.T, OV(q).T, QK, E), coeff=SCALE) for q in heads), 0),
        "K": sum((term(None, A(k), (E.T, QK, OV(k), E), coeff=SCALE) for k in heads), 0),
        "QK": sum((term(A(q), A(k), (E.T, OV(q).T, QK, OV(k), E), coeff=SCALE) for q in heads for k in heads), 0),
    }
    expansion = expand_qk(Architecture(2, 3), 1, 2)
    assert expansion.to_tensor_sum() == sums["direct"] + sums["Q"] + sums["K"] + sums["QK"]
    for tag, terms in expansion.by_composition().items():
        assert sum((term(*t.term.words, coeff=t.term.coeff) for t in terms), 0) == sums[tag]
    induction = [t for t in expansion if t.composition == "K" and t.key.heads == ((0, 1),)]
    assert [t.label for t in induction] == ["q: tok (direct) | k: tok→L0H1"]


def stream(arch: Architecture, layer: int, source_atom: str):
    """The stream of one source entering ``layer``, expanded by tensoralg's product rule."""
    factors = [layer_factor(arch, l) for l in reversed(range(layer))] + [term(None, atom(source_atom))]
    return Product(factors).expand()


@PROPERTY
@given(architectures_with_head(extras=False))
def test_equals_the_sandwich_of_expanded_streams(case):
    arch, layer, head = case
    streams = {"token": stream(arch, layer, "W_E")}
    if arch.positional == "standard":
        streams["position"] = stream(arch, layer, "W_pos")
    if arch.positional == "qk_only":
        streams["position"] = term(None, atom("W_pos"))
    W_QK = atom("W_QK", f"L{layer}H{head}")
    sums = expand_qk(arch, layer, head).to_tensor_sums()
    assert set(sums) == {(q, k) for q in streams for k in streams}
    for (q, k), s in sums.items():
        assert s == sandwich(streams[q], W_QK, streams[k]).scale(SCALE)


@PROPERTY
@given(architectures_with_head(max_layers=2, max_heads=2), st.integers(0, 2**16))
def test_sum_of_terms_equals_the_numpy_scores(case, seed):
    arch, layer, head = case
    model = NumpyModel(arch, seed)
    total = np.zeros((model.n_ctx, model.n_ctx))
    for t in expand_qk(arch, layer, head):
        P, Q, M = t.term.words
        Xq, Xk = model.input(t.query.source), model.input(t.key.source)
        total += model.coeff(t.term.coeff) * model.word(P, model.n_ctx) @ Xq @ model.word(M, 0) @ Xk.T @ model.word(Q, model.n_ctx).T
    np.testing.assert_allclose(total, model.scores(layer, head), rtol=1e-9, atol=1e-9)


def test_extras_words_follow_the_atom_conventions():
    arch = Architecture(2, 1, positional="qk_only", layer_norm=True, biases=True)
    by_label = {t.label: (t.composition, t.term.words) for t in expand_qk(arch, 1, 0)}
    N1, A0, N0 = atom("N", "L1"), atom("A", "L0H0"), atom("N", "L0")
    W_Q, W_K, QK = atom("W_Q", "L1H0"), atom("W_K", "L1H0"), atom("W_QK", "L1H0")
    bQ, bK = atom("b_Q", "L1H0"), atom("b_K", "L1H0")
    assert by_label["q: pos (direct) | k: tok→L0H0"] == ("K", ((), (N1, A0, N0), (atom("W_pos").T, QK, atom("W_OV", "L0H0"), atom("W_E"))))
    assert by_label["q: b_Q^L1H0 (direct) | k: b_O^L0 (direct)"] == ("direct", ((), (N1,), (bQ.T, W_K, atom("b_O", "L0"))))
    assert by_label["q: tok (direct) | k: b_K^L1H0 (direct)"] == ("direct", ((N1,), (), (atom("W_E").T, W_Q.T, bK)))
    assert by_label["q: b_Q^L1H0 (direct) | k: b_K^L1H0 (direct)"] == ("direct", ((), (), (bQ.T, bK)))
    assert not any("pos→" in label for label in by_label)  # qk_only positions pass through no heads


def test_to_tensor_sum_selects_sources():
    expansion = expand_qk(Architecture(1, 2, positional="qk_only"), 0, 1)
    with pytest.raises(DerivationError, match=r"act on different inputs \(query side: position, token; key side: position, token\)"):
        expansion.to_tensor_sum()
    assert list(expansion.to_tensor_sums()) == [("token", "token"), ("token", "position"), ("position", "token"), ("position", "position")]
    pos_pos = expansion.to_tensor_sum(query="pos", key=POSITION)
    assert pos_pos == term(None, None, (atom("W_pos").T, atom("W_QK", "L0H1"), atom("W_pos")), coeff=SCALE)
    with pytest.raises(DerivationError, match=r"no key-side source matches 'b_K'; the key side has the sources tok, pos \(input keys position, token\)"):
        expansion.to_tensor_sum(key="b_K")
    with pytest.raises(DerivationError, match="select a query source by a Source, a label or an input key, got 3"):
        expansion.to_tensor_sum(query=3)


# -- bad input --------------------------------------------------------------------------


def test_heads_that_do_not_exist():
    arch = Architecture(2, (1, 3))
    with pytest.raises(ArchitectureError, match=r"layer 2 does not exist: the model has layers 0\.\.1"):
        expand_qk(arch, 2, 0)
    with pytest.raises(ArchitectureError, match=r"head 1 does not exist in layer 0: it has heads 0\.\.0"):
        estimate_qk_terms(arch, 0, 1)
    with pytest.raises(ArchitectureError, match="layer -1 does not exist"):
        expand_qk(arch, -1, 0)


@pytest.mark.parametrize("bad,message", [(-1, r"integer in 0\.\.2 .*, got -1"), (3, r"the deepest term of the scores of a layer-1 head .* has order 2\), got 3"), ("1", "max_order must be None \\(every term\\) or an integer")])
def test_bad_max_order(bad, message):
    with pytest.raises(InvalidOrder, match=message):
        expand_qk(Architecture(2, 2), 1, 0, bad)


def test_oversize_suggests_a_max_order():
    arch = Architecture(12, 12)
    with pytest.raises(TooManyTerms) as info:
        expand_qk(arch, 11, 0)
    assert str(info.value) == (
        # 13**22: (1 + 12)^11 paths on each side
        "the scores of L11H0 in 12 layers x 12 heads, no positional embedding has 3,211,838,877,954,855,105,157,369 terms, "
        "more than limit=1,000,000; pass max_order=2 (keeps 33,529 terms) or raise limit"
    )
    assert len(expand_qk(arch, 11, 0, 2)) == 33_529


def test_layer_zero_and_repr():
    expansion = expand_qk(Architecture(1, 2), 0, 1)
    assert isinstance(expansion, QKExpansion) and len(expansion) == 1
    assert repr(expansion) == "QKExpansion(L0H1 of 1 layer x 2 heads, no positional embedding: 1 term)"
    assert expansion.to_tensor_sum() == term(None, None, (atom("W_E").T, atom("W_QK", "L0H1"), atom("W_E")), coeff=SCALE)
