"""Previous-token and induction heads on a hand-built induction model: behaviour and weights agree."""

from __future__ import annotations

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.circuits.behaviour import repeat_sweep
from numeric_check.errors import AnalysisError
from numeric_check.circuits.detect import (
    HeadScores,
    behaviour_scores,
    classify_heads,
    detect_heads,
    previous_token_scores_by_weights,
    repeated_tokens,
    weight_scores,
)
from numeric_check.circuits.behaviour import random_tokens
from numeric_check.model.circuit_model import CircuitModel
from tests.helpers import NOISY_CONTEXT, NOISY_VOCAB, noisy_induction_model

torch.set_num_threads(1)

V, N = NOISY_VOCAB, NOISY_CONTEXT  # vocabulary, context


@pytest.fixture(scope="module")
def model():
    return noisy_induction_model()


def test_repeated_tokens_are_seeded_and_repeat():
    m = noisy_induction_model()
    tokens = repeated_tokens(m, 5, 3, seed=7)
    assert tokens.shape == (3, 10)
    assert torch.equal(tokens[:, :5], tokens[:, 5:])
    assert torch.equal(tokens, repeated_tokens(m, 5, 3, seed=7))
    assert not torch.equal(tokens, repeated_tokens(m, 5, 3, seed=8))
    pool = [3, V - 1, 0]  # drawn like the sweep: the same seeded draw from the same pool
    pooled = repeated_tokens(m, 5, 3, seed=7, tokens=pool)
    assert set(pooled.unique().tolist()) <= set(pool)
    assert torch.equal(pooled[:, :5], random_tokens((3, 5), V, 7, tokens=pool))
    assert torch.equal(tokens[:, :5], random_tokens((3, 5), V, 7))


def test_behaviour_finds_the_built_heads(model):
    scores = behaviour_scores(model, seg_len=8, batch=8)
    assert scores.previous_token[0, 0] > 0.95
    assert scores.induction[1, 0] > 0.6
    others = [(0, 1), (1, 1)]
    assert all(scores.previous_token[h] < 0.3 and scores.induction[h] < 0.3 for h in others)


def test_behaviour_scores_are_the_means_of_the_position_profiles():
    """The scores average the by-position profiles (read from the cached patterns in
    test_behaviour), and keep them, so the minimum over positions is at hand."""
    m = CircuitModel.random(Architecture(1, 2), d_model=8, d_head=4, d_vocab=20, n_ctx=12, dtype=torch.float64, device="cpu")
    tokens, _ = repeat_sweep(20, 12, 3, 4, seed=0)
    _, cache = m.run_with_cache(tokens)
    pattern = cache["blocks.0.attn.hook_pattern"]
    i = torch.arange(1, 12)
    expected_prev = pattern[:, :, i, i - 1].mean(0).mean(-1)
    scores = behaviour_scores(m, seg_len=3, batch=4, seed=0)
    torch.testing.assert_close(scores.previous_token[0], expected_prev)
    torch.testing.assert_close(scores.induction, scores.profile.induction.nanmean(-1))
    assert scores.profile.previous_token.shape == (1, 2, 12)
    torch.testing.assert_close(scores.minimum("previous_token")[0], pattern[:, :, i, i - 1].mean(0).amin(-1))


def test_detect_heads_reports_the_minimum_over_positions():
    """Regression (issue 12): a previous-token head working in half the context passes the
    averaged score, and the report now shows its minimum over positions beside it."""
    m = noisy_induction_model()
    with torch.no_grad():
        m.blocks[0].attn.W_Q[0, N // 2 : N] = 0.0  # no positional query from N/2 on
    report = detect_heads(m, seg_len=4, batch=16)
    assert report.by_behaviour.previous_token == ((0, 0),)  # the mean alone still passes
    low = report.behaviour.minimum("previous_token")[0, 0]
    assert float(low) < 0.2 and f"| {float(low):.3f} |" in report.to_markdown()


def test_weights_find_the_built_heads(model):
    evidence = weight_scores(model, n_positions=16)
    previous, induction = evidence.scores.previous_token, evidence.scores.induction
    assert previous[0, 0] > 0.95 and previous[0, 1] < 0.3
    assert induction[1, 0] > 0.9 and induction[1, 1] < 0.3 and (induction[0] == 0).all()
    assert evidence.partner[1][0] == (0, 0) and evidence.partner[0] == (None, None)
    assert evidence.copying[1, 0] > 0.9 and evidence.same_matching[1, 0] > 0.9 and evidence.k_composition[1, 0] > 0
    assert evidence.k_composition[0].isnan().all()
    assert evidence.notes == ()


@pytest.mark.parametrize("positional", ["qk_only", "standard"])
def test_detect_heads_agree(positional):
    report = detect_heads(noisy_induction_model(positional), seg_len=8, batch=8)
    assert report.by_behaviour.labels() == {"previous_token": ["L0H0"], "induction": ["L1H0"]}
    assert report.by_weights == report.by_behaviour
    assert report.agreement == {"previous_token": True, "induction": True} and report.agree
    md = report.to_markdown()
    assert "| L1H0 |" in md and "previous-token: agree; induction: agree" in md
    assert "| L0H0 | " in md and "| - | - | - |" in md  # layer 0: no partner


def test_model_without_positions_is_said_clearly():
    m = noisy_induction_model("none")
    with pytest.raises(AnalysisError, match="no positional embedding"):
        previous_token_scores_by_weights(m)
    report = detect_heads(m, seg_len=8, batch=4)
    assert report.weights.scores.previous_token.isnan().all()
    assert report.agreement["previous_token"] is None
    assert "no positional embedding" in report.notes[0] and "note: no positional embedding" in report.to_markdown()
    # without positions nothing can attend to i - 1, so behaviour finds no previous-token head
    assert report.by_behaviour.previous_token == ()


def test_one_layer_model_has_no_induction_heads():
    m = CircuitModel.random(Architecture(1, 3, positional="qk_only"), d_model=16, d_head=4, d_vocab=20, n_ctx=12, seed=1, device="cpu")
    report = detect_heads(m, batch=4)
    assert report.by_weights.induction == () and (report.weights.scores.induction == 0).all()


def test_ragged_heads_are_nan():
    m = CircuitModel.random(Architecture(2, (1, 3), positional="standard"), d_model=16, d_head=4, d_vocab=20, n_ctx=12, device="cpu")
    report = detect_heads(m, batch=2)
    for scores in (report.behaviour, report.weights.scores):
        assert scores.previous_token.shape == (2, 3)
        assert scores.previous_token[0, 1:].isnan().all() and scores.induction[0, 1:].isnan().all()
        assert not scores.previous_token[1].isnan().any()


def test_classify_heads_thresholds():
    scores = HeadScores(torch.tensor([[0.9, 0.5], [0.2, float("nan")]]), torch.tensor([[0.0, 0.1], [0.8, float("nan")]]))
    assert classify_heads(scores).labels() == {"previous_token": ["L0H0", "L0H1"], "induction": ["L1H0"]}
    strict = classify_heads(scores, previous_token_threshold=0.6, induction_threshold=0.9)
    assert strict.previous_token == ((0, 0),) and strict.induction == ()


def test_bad_options_are_clear_errors(model):
    with pytest.raises(AnalysisError, match=r"seg_len must be an int in 2..8 so that two copies fit 16 positions"):
        behaviour_scores(model, seg_len=9)
    with pytest.raises(AnalysisError, match="batch must be an int >= 1"):
        behaviour_scores(model, batch=0)
    with pytest.raises(AnalysisError, match=r"n_positions must be an int in 2..16"):
        previous_token_scores_by_weights(model, n_positions=17)
    tiny = CircuitModel.random(Architecture(1, 1), d_model=4, d_head=2, d_vocab=5, n_ctx=3, device="cpu")
    with pytest.raises(AnalysisError, match="need n_ctx >= 4"):
        behaviour_scores(tiny)
