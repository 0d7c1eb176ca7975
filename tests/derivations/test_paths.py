"""The logits' path expansion: counts and paths against brute force, the tensoralg product,
shapes, numbers against a numpy forward pass, and bad input."""

from __future__ import annotations

from itertools import combinations
from math import comb

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensoralg import InvalidOrder, Product, atom, identity, term
from tensoralg.atoms import d_vocab, n_ctx, word_shape

from derivations.architecture import Architecture
from derivations.errors import ArchitectureError, DerivationError, TooManyTerms
from derivations.paths import (
    POSITION,
    TOKEN,
    UNEMBED_BIAS,
    LogitExpansion,
    Path,
    Source,
    estimate_logit_terms,
    expand_logits,
)
from tests.conftest import FAST, PROPERTY, THOROUGH
from tests.derivations.numpy_model import NumpyModel
from tests.strategies import architectures


def brute_force_paths(arch: Architecture, upto: int, max_order: int | None) -> set[tuple[Source, tuple]]:
    """Every (source, heads) of the stream entering ``upto``: subsets of heads with distinct,
    increasing layers after the source's entry, by itertools over all heads."""
    sources = [(TOKEN, 0)] + ([(POSITION, 0)] if arch.positional == "standard" else [])
    for m in range(upto):
        sources += [(Source("bias", m), m + 1)] * arch.biases + [(Source("mlp", m), m + 1)] * arch.mlp
    heads = [h for h in arch.heads() if h[0] < upto]
    out = set()
    for source, first in sources:
        for k in range(len(heads) + 1):
            if max_order is not None and k > max_order:
                break
            for chosen in combinations(heads, k):
                layers = [layer for layer, _ in chosen]
                if len(set(layers)) == k and all(layer >= first for layer in layers):
                    out.add((source, chosen))
    return out


@st.composite
def arch_and_order(draw):
    arch = draw(architectures())
    return arch, draw(st.none() | st.integers(0, arch.n_layers))


@THOROUGH
@given(arch_and_order())
def test_paths_and_counts_match_brute_force(case):
    arch, max_order = case
    expansion = expand_logits(arch, max_order)
    terms = list(expansion)
    found = [(t.source, t.heads) for t in terms if t.source != UNEMBED_BIAS]
    assert len(found) == len(set(found))
    assert set(found) == brute_force_paths(arch, arch.n_layers, max_order)
    assert len(terms) == len(expansion) == estimate_logit_terms(arch, max_order)
    assert sum(t.source == UNEMBED_BIAS for t in terms) == arch.biases
    by_source = expansion.count_by_source()
    assert by_source == {s: len(v) for s, v in expansion.by_source().items()}
    assert {k: len(v) for k, v in expansion.by_order().items()} == expansion.count_by_order()
    assert all(t.order <= (arch.n_layers if max_order is None else max_order) for t in terms)
    # terms are distinct: the sums (one per input) collect nothing
    assert sum(len(s) for s in expansion.to_tensor_sums().values()) == len(terms)


@pytest.mark.parametrize("layers,heads", [(1, 1), (2, 3), (3, 12), (4, 2)])
def test_uniform_counts_follow_the_closed_forms(layers, heads):
    arch = Architecture(layers, heads)
    assert estimate_logit_terms(arch) == (1 + heads) ** layers
    for k in range(layers + 1):
        assert estimate_logit_terms(arch, k) == sum(comb(layers, j) * heads**j for j in range(k + 1))
    standard = Architecture(layers, heads, positional="standard")
    assert estimate_logit_terms(standard) == 2 * (1 + heads) ** layers


@PROPERTY
@given(architectures())
def test_every_term_has_consistent_shapes(arch):
    for t in expand_logits(arch):
        position, residual = t.term.words
        assert word_shape(position) in (None, (n_ctx, n_ctx))
        assert word_shape(residual) == (d_vocab, t.source.input_dim)
        assert t.term.coeff == 1


def test_labels_order_and_words():
    terms = list(expand_logits(Architecture(2, 2)))
    assert [t.label for t in terms][:4] == ["tok (direct)", "tok→L0H0", "tok→L0H1", "tok→L1H0"]
    last = terms[-1]
    assert last.label == "tok→L0H1→L1H1" and last.order == 2 and last.heads == ((0, 1), (1, 1))
    assert last.term.words == (
        (atom("A", "L1H1"), atom("A", "L0H1")),
        (atom("W_U"), atom("W_OV", "L1H1"), atom("W_OV", "L0H1"), atom("W_E")),
    )


def test_extras_words_follow_the_atom_conventions():
    arch = Architecture(2, 1, positional="standard", layer_norm=True, biases=True, mlp=True)
    by_label = {t.label: t.term.words for t in expand_logits(arch)}
    N = lambda i: atom("N", i)  # noqa: E731
    assert by_label["tok→L0H0→L1H0"] == (
        (N("final"), atom("A", "L1H0"), N("L1"), atom("A", "L0H0"), N("L0")),
        (atom("W_U"), atom("W_OV", "L1H0"), atom("W_OV", "L0H0"), atom("W_E")),
    )
    assert by_label["pos (direct)"] == ((N("final"),), (atom("W_U"), atom("W_pos")))
    assert by_label["b_O^L0→L1H0"] == ((N("final"), atom("A", "L1H0"), N("L1")), (atom("W_U"), atom("W_OV", "L1H0"), atom("b_O", "L0")))
    assert by_label["mlp^L0→L1H0"] == ((N("final"), atom("A", "L1H0"), N("L1")), (atom("W_U"), atom("W_OV", "L1H0")))
    assert by_label["mlp^L1 (direct)"] == ((N("final"),), (atom("W_U"),))
    assert by_label["b_U (direct)"] == ((), (atom("b_U"),))
    assert "b_O^L1→L1H0" not in by_label and "mlp^L1→L1H0" not in by_label


def layer_factor(arch: Architecture, layer: int):
    heads = [
        term((atom("A", f"L{layer}H{h}"),) + ((atom("N", f"L{layer}"),) if arch.layer_norm else ()), atom("W_OV", f"L{layer}H{h}"))
        for h in range(arch.heads_per_layer[layer])
    ]
    return identity(2) + sum(heads[1:], heads[0])


@PROPERTY
@given(arch_and_order())
def test_token_terms_equal_the_product_expansion(case):
    """Σ token terms = (N⊗W_U) · Π_l (Id + Σ_h (A N)⊗W_OV) · (Id⊗W_E), expanded by tensoralg."""
    arch, max_order = case
    unembed = term(atom("N", "final") if arch.layer_norm else None, atom("W_U"))
    factors = [unembed] + [layer_factor(arch, l) for l in reversed(range(arch.n_layers))] + [term(None, atom("W_E"))]
    expected = Product(factors).expand(max_order)
    assert expand_logits(arch, max_order).to_tensor_sum("tok") == expected


@FAST
@given(architectures(max_layers=3, max_heads=2), st.integers(0, 2**16))
def test_sum_of_terms_equals_the_numpy_forward_pass(arch, seed):
    model = NumpyModel(arch, seed)
    total = np.zeros_like(model.logits())
    for t in expand_logits(arch):
        position, residual = t.term.words
        X = model.input(t.source)
        total += model.coeff(t.term.coeff) * model.word(position, model.n_ctx) @ X @ model.word(residual, 0).T
    np.testing.assert_allclose(total, model.logits(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("max_order", [0, 1])
def test_truncation_error_is_the_omitted_terms(max_order):
    arch = Architecture(2, 2, layer_norm=True)
    model = NumpyModel(arch, 3)
    value = lambda terms: sum(model.word(t.term.words[0], 4) @ model.tokens @ model.word(t.term.words[1], 0).T for t in terms)  # noqa: E731
    kept = list(expand_logits(arch, max_order))
    omitted = [t for t in expand_logits(arch) if t.order > max_order]
    np.testing.assert_allclose(value(kept) + value(omitted), model.logits(), atol=1e-9)


# -- sums, sources, paths --------------------------------------------------------------


def test_to_tensor_sum_keeps_inputs_apart():
    arch = Architecture(1, 1, positional="standard", biases=True, mlp=True)
    expansion = expand_logits(arch)
    with pytest.raises(DerivationError, match=r"act on different inputs \(constant, mlp\^L0, position, token\)"):
        expansion.to_tensor_sum()
    sums = expansion.to_tensor_sums()
    assert list(sums) == ["token", "position", "constant", "mlp^L0"]
    assert len(sums["constant"]) == 2  # b_O^L0 direct and b_U
    assert expansion.to_tensor_sum("constant") == sums["constant"]
    assert expansion.to_tensor_sum(Source("bias", 0)) == term(None, (atom("W_U"), atom("b_O", "L0")))
    assert expansion.to_tensor_sum("pos") == sums["position"]
    with pytest.raises(DerivationError, match="unknown source 'W_E'; expected a Source, one of the labels 'tok'"):
        expansion.to_tensor_sum("W_E")
    with pytest.raises(DerivationError, match="source b_O\\^L3 is not in this expansion"):
        expansion.to_tensor_sum(Source("bias", 3))


def test_source_and_path_validation():
    assert [Source(k, *a).label for k, a in [("token", ()), ("position", ()), ("bias", (1,)), ("mlp", (0,)), ("unembed_bias", ()), ("key_bias", (2, 1))]] == [
        "tok", "pos", "b_O^L1", "mlp^L0", "b_U", "b_K^L2H1"]
    assert Source("mlp", 2).input_dim.name == "d_model" and Source("bias", 0).input_dim == 1
    with pytest.raises(DerivationError, match="unknown source kind 'embed'; expected one of 'token'"):
        Source("embed")
    with pytest.raises(DerivationError, match="a 'bias' source needs a layer"):
        Source("bias")
    with pytest.raises(DerivationError, match="a 'token' source has no layer"):
        Source("token", 0)
    with pytest.raises(DerivationError, match="strictly increasing layers"):
        Path(TOKEN, ((1, 0), (1, 1)))
    with pytest.raises(DerivationError, match="strictly increasing layers"):
        Path(Source("bias", 1), ((1, 0),))
    assert Path(TOKEN, [[0, 1], [2, 0]]).heads == ((0, 1), (2, 0))


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_bad_max_order(bad):
    with pytest.raises(InvalidOrder, match="max_order must be"):
        expand_logits(Architecture(2, 2), bad)


def test_max_order_beyond_the_deepest_term():
    with pytest.raises(InvalidOrder, match=r"max_order must be None \(every term\) or an integer in 0\.\.2 \(the deepest "
                                           r"term of the logits of a 2-layer model has order 2\), got 3"):
        estimate_logit_terms(Architecture(2, 2), 3)


def test_oversize_suggests_a_max_order():
    arch = Architecture(12, 12)
    with pytest.raises(TooManyTerms) as info:
        expand_logits(arch)
    assert str(info.value) == (
        "the logits of 12 layers x 12 heads, no positional embedding has 23,298,085,122,481 terms, more than limit=1,000,000; "
        "pass max_order=3 (keeps 389,809 terms) or raise limit"
    )
    assert len(expand_logits(arch, 3)) == 389_809
    with pytest.raises(TooManyTerms, match="even max_order=0 gives 2 terms: raise limit"):
        expand_logits(Architecture(1, 1, positional="standard"), limit=1)
    with pytest.raises(TooManyTerms, match="pass max_order=1"):
        expand_logits(arch, 2, limit=200)


@pytest.mark.parametrize("bad", [0, -5, 2.0, None])
def test_bad_limit(bad):
    with pytest.raises(DerivationError, match="limit must be an int >= 1"):
        expand_logits(Architecture(1, 1), limit=bad)


def test_not_an_architecture():
    with pytest.raises(ArchitectureError, match="expected a derivations.Architecture, got tuple"):
        expand_logits((2, 2))


def test_zero_layers_and_repr():
    expansion = expand_logits(Architecture(0, 1))
    assert [t.label for t in expansion] == ["tok (direct)"]
    assert isinstance(expansion, LogitExpansion)
    assert repr(expand_logits(Architecture(3, 12), 1)) == "LogitExpansion(3 layers x 12 heads, no positional embedding, max_order=1: 37 terms)"
