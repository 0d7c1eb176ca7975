"""Composition scores: the paper's dense definitions (not a cyclic permutation), TransformerLens, the baseline."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from derivations.architecture import Architecture
from numeric_check.circuits.ov_qk import head_weights
from numeric_check.errors import AnalysisError
from numeric_check.circuits.composition import (
    composition_baseline, composition_scores, erratum_composition_scores, pair_composition_scores,
)
from numeric_check.model.circuit_model import CircuitModel
from tests.conftest import PROPERTY
from tests.strategies import circuit_models

torch.set_num_threads(1)

norm = torch.linalg.matrix_norm


def dense_matrices(model, kind, writer, reader):
    """``(M, W_OV^{h1})`` as full d_model × d_model matrices, M the reader's ``W_QKᵀ``, ``W_QK`` or ``W_OV``."""
    w1, w2 = head_weights(model, *writer), head_weights(model, *reader)
    QK2 = w2["W_Q"].T @ w2["W_K"]
    left = {"Q": QK2.T, "K": QK2, "V": w2["W_O"] @ w2["W_V"]}[kind]
    return left, w1["W_O"] @ w1["W_V"]


def dense_score(model, kind, writer, reader):
    """The paper's definition: ‖M W_OV^{h1}‖ / (‖M‖ ‖W_OV^{h1}‖)."""
    left, OV1 = dense_matrices(model, kind, writer, reader)
    return norm(left @ OV1) / (norm(left) * norm(OV1))


def cyclic_score(model, kind, writer, reader):
    """The erratum: the same two matrices multiplied in the cyclically permuted order."""
    left, OV1 = dense_matrices(model, kind, writer, reader)
    return norm(OV1 @ left) / (norm(left) * norm(OV1))


@PROPERTY
@given(circuit_models(max_layers=3), st.sampled_from("QKV"))
def test_scores_are_the_dense_definition(model, kind):
    scores = composition_scores(model, kind)
    n_heads = max(model.arch.heads_per_layer, default=0)
    assert scores.shape == (model.arch.n_layers, n_heads) * 2
    heads = set(model.arch.heads())
    for l1 in range(model.arch.n_layers):
        for h1 in range(n_heads):
            for l2 in range(model.arch.n_layers):
                for h2 in range(n_heads):
                    value = scores[l1, h1, l2, h2]
                    if (l1, h1) not in heads or (l2, h2) not in heads:
                        assert value.isnan()
                    elif l1 >= l2:
                        assert value == 0
                    else:
                        expected = dense_score(model, kind, (l1, h1), (l2, h2))
                        torch.testing.assert_close(value, expected, rtol=1e-9, atol=1e-12, equal_nan=True)


def test_a_cyclic_permutation_would_be_caught():
    """Guard for the paper's erratum: permuting the product cyclically changes the scores, and ours do not."""
    model = CircuitModel.random(Architecture(2, 2), d_model=10, d_head=3, d_vocab=12, n_ctx=4, seed=5, dtype=torch.float64, device="cpu")
    for kind in "QKV":
        scores = composition_scores(model, kind)
        for h1 in range(2):
            for h2 in range(2):
                ours = scores[0, h1, 1, h2]
                torch.testing.assert_close(ours, dense_score(model, kind, (0, h1), (1, h2)))
                assert abs(float(ours - cyclic_score(model, kind, (0, h1), (1, h2)))) > 1e-3


@pytest.mark.parametrize("kind", "QKV")
def test_the_erratum_scores_are_the_corrections_rotated_products(kind):
    """The paper's first figure, as its Correction describes it: K is ‖W_K² W_O¹ W_V¹ W_Q²ᵀ‖ over the norms of
    ‖W_K² W_Q²ᵀ‖ and ‖W_V¹ W_O¹‖ (each product's first factor moved to its end); Q and V alike, dense here."""
    model = CircuitModel.random(Architecture(2, 3), d_model=10, d_head=3, d_vocab=12, n_ctx=4, seed=7,
                                dtype=torch.float64, device="cpu")
    wrong = erratum_composition_scores(model, kind)
    for h1 in range(3):
        for h2 in range(3):
            w1, w2 = head_weights(model, 0, h1), head_weights(model, 1, h2)
            first, last = {"Q": (w2["W_Q"], w2["W_K"].T), "K": (w2["W_K"], w2["W_Q"].T), "V": (w2["W_V"], w2["W_O"])}[kind]
            expected = norm(first @ w1["W_O"] @ w1["W_V"] @ last) / (norm(first @ last) * norm(w1["W_V"] @ w1["W_O"]))
            torch.testing.assert_close(wrong[0, h1, 1, h2], expected, rtol=1e-9, atol=1e-12)
            assert abs(float(wrong[0, h1, 1, h2] - dense_score(model, kind, (0, h1), (1, h2)))) > 1e-3
    assert bool((wrong[1] == 0).all())  # laid out as composition_scores: later-to-earlier pairs are 0


@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")
@pytest.mark.parametrize("convert", ["adapter", "transpose"])
def test_agrees_with_transformer_lens(convert):
    pytest.importorskip("transformer_lens")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=3, n_heads=4, d_model=24, d_head=5, d_vocab=20, n_ctx=8, attn_only=True,
        normalization_type=None, dtype=torch.float64, seed=2, device="cpu"
    )
    tl = HookedTransformer(cfg)
    if convert == "adapter":
        from numeric_check.conversion.adapters import from_transformer_lens

        model = from_transformer_lens(tl, device="cpu")
    else:  # by hand: TransformerLens rows -> paper columns
        model = CircuitModel.random(Architecture(3, 4), d_model=24, d_head=5, d_vocab=20, n_ctx=8, dtype=torch.float64, device="cpu")
        with torch.no_grad():
            for ours, theirs in zip(model.blocks, tl.blocks):
                for name in ("W_Q", "W_K", "W_V", "W_O"):
                    getattr(ours.attn, name).copy_(getattr(theirs.attn, name).mT)
    with torch.no_grad():
        for kind in "QKV":
            theirs = tl.all_composition_scores(kind)
            torch.testing.assert_close(composition_scores(model, kind), theirs, rtol=0, atol=1e-6)
            assert float((composition_scores(model, kind) - theirs).abs().max()) < 1e-12


def test_baseline_is_seeded_and_matches_the_analytic_second_moment():
    """For rotation-invariant random weights E[score²] = 1/d_model exactly; the mean sits just below 1/sqrt(d_model)."""
    model = CircuitModel.random(Architecture(2, 2), d_model=32, d_head=4, d_vocab=12, n_ctx=4, dtype=torch.float64, device="cpu")
    for kind in "QKV":
        b = composition_baseline(model, kind, n_samples=400, seed=1)
        assert b == composition_baseline(model, kind, n_samples=400, seed=1)
        assert 0.9 < b * math.sqrt(32) < 1.04  # ~0.98 for these shapes, a sampling error of ~1%
    gen = torch.Generator().manual_seed(0)

    def heads(n):
        shapes = {"W_Q": (n, 4, 32), "W_K": (n, 4, 32), "W_V": (n, 4, 32), "W_O": (n, 32, 4)}
        return {k: torch.randn(s, generator=gen, dtype=torch.float64) for k, s in shapes.items()}

    second_moment = float((pair_composition_scores(heads(4000), heads(4000), "K") ** 2).mean())
    assert second_moment == pytest.approx(1 / 32, rel=0.03)


def test_baseline_subtraction_only_touches_earlier_to_later_pairs():
    model = CircuitModel.random(Architecture(3, (2, 1, 2)), d_model=16, d_head=4, d_vocab=12, n_ctx=4, dtype=torch.float64, device="cpu")
    raw = composition_scores(model, "V")
    shifted = composition_scores(model, "V", baseline=True, n_samples=32, seed=3)
    b = composition_baseline(model, "V", n_samples=32, seed=3)
    later = torch.zeros_like(raw, dtype=torch.bool)
    for l1, h1 in model.arch.heads():
        for l2, h2 in model.arch.heads():
            later[l1, h1, l2, h2] = l1 < l2
    torch.testing.assert_close(shifted[later], raw[later] - b)
    assert (shifted[~later & ~raw.isnan()] == 0).all()
    assert shifted.isnan().equal(raw.isnan())


def test_float32_model_with_float64_computation():
    model = CircuitModel.random(Architecture(2, 2), d_model=16, d_head=4, d_vocab=12, n_ctx=4, device="cpu")
    assert composition_scores(model, "K").dtype == torch.float32
    scores = composition_scores(model, "K", dtype=torch.float64)
    assert scores.dtype == torch.float64
    torch.testing.assert_close(scores.float(), composition_scores(model, "K"), rtol=1e-5, atol=1e-6)


def test_a_half_precision_model_is_scored_in_float32():
    """A checkpoint saved as float16 (``train-toy --save-dtype float16``): in its own precision the
    baseline's norms overflow and every score above the baseline read NaN."""
    model = CircuitModel.random(Architecture(2, 2), d_model=256, d_head=32, d_vocab=12, n_ctx=4, device="cpu",
                                init_std=0.1)
    half = model.to(dtype=torch.float16)
    scores = composition_scores(half, "K", baseline=True)
    assert scores.dtype == torch.float32 and not scores.isnan().any()
    torch.testing.assert_close(scores, composition_scores(half.float(), "K", baseline=True), rtol=1e-4, atol=1e-5)


def test_bad_kind_lists_the_valid_ones():
    model = CircuitModel.random(Architecture(2, 1), d_model=8, d_head=2, d_vocab=12, n_ctx=4, device="cpu")
    with pytest.raises(AnalysisError, match=r"unknown composition kind 'O'; expected one of 'Q', 'K', 'V'"):
        composition_scores(model, "O")
    with pytest.raises(AnalysisError, match="n_samples must be an int >= 1"):
        composition_scores(model, "K", baseline=True, n_samples=0)


def test_composition_scores_name_their_heads_and_stay_a_tensor():
    """Issue 46: the scores read by head name, print and show in Jupyter as a writer-by-reader table, and are still
    TransformerLens's tensor (any operation gives a plain one); a wrong name is one line saying what a name is."""
    from derivations import Architecture
    from numeric_check.circuits.composition import CompositionScores
    from numeric_check.errors import AnalysisError
    from numeric_check.model.circuit_model import CircuitModel

    model = CircuitModel.random(Architecture(3, (2, 3, 1)), d_model=8, d_head=2, d_vocab=10, n_ctx=4, seed=1)
    scores = composition_scores(model, "Q")
    assert isinstance(scores, CompositionScores) and isinstance(scores, torch.Tensor) and scores.shape == (3, 3, 3, 3)
    assert type(scores + 0) is torch.Tensor
    torch.testing.assert_close(scores + 0, scores.as_subclass(torch.Tensor), rtol=0, atol=0, equal_nan=True)
    assert scores.at("L0H1", "L2H0") == float(scores[0, 1, 2, 0])
    pairs = scores.pairs()
    assert len(pairs) == 2 * 3 + 2 * 1 + 3 * 1 and [p[2] for p in pairs] == sorted((p[2] for p in pairs), reverse=True)
    text = repr(scores)
    assert text.splitlines()[0] == "Q-composition scores, writer (row) into reader (column):"
    assert text.splitlines()[1].split() == ["L1H0", "L1H1", "L1H2", "L2H0"] and "L2H0" not in [l.split()[0] for l in text.splitlines()[2:]]
    page = scores._repr_html_()
    assert page.startswith("<table><caption>Q-composition") and page.count("<tr>") == 1 + 5  # a header and 5 writers
    for writer, reader, message in (("L1H0", "L0H0", "only with heads of later layers"), ("L0H2", "L1H0", "not a head"),
                                    ("head 3", "L1H0", "a label such as 'L0H1'")):
        with pytest.raises(AnalysisError, match=message):
            scores.at(writer, reader)
