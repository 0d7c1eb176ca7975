"""The detectors against a known truth: hand-built heads, planted skip-trigrams, and the decoys that must not pass."""

from __future__ import annotations

import pytest
import torch

from numeric_check.circuits.detect import detect_heads
from numeric_check.circuits.known_heads import (
    ROLES, detector_recall, planted_heads_model, random_roles, skip_trigram_recall, triple_scores,
)
from numeric_check.errors import AnalysisError

torch.set_num_threads(1)


def test_each_planted_role_does_what_it_is_built_for():
    """Read off the attention: the previous-token head looks at i − 1, the current head at i, the induction head at
    the token after the earlier copy of the current one, the duplicate-token head at the earlier copy itself."""
    model = planted_heads_model([["previous-token", "current", "random"], ["induction", "duplicate", "random"]],
                                d_vocab=16, n_ctx=16)
    tokens = torch.tensor([[15, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 8]])
    patterns = {}

    def keep(layer):
        def hook(tensor, hook=None):
            patterns[layer] = tensor.detach()
        return hook
    with model.hooks([(f"blocks.{layer}.attn.hook_pattern", keep(layer)) for layer in (0, 1)]):
        model(tokens)
    first, second = patterns[0][0], patterns[1][0]  # [head, query, key]
    assert first[0, 5].argmax() == 4 and first[0, 5, 4] > 0.99  # previous token
    assert first[1, 5].argmax() == 5 and first[1, 5, 5] > 0.99  # itself
    # query 9 holds token 2 (second copy); its first copy is at 2, the token after it at 3
    assert second[0, 9].argmax() == 3 and second[0, 9, 3] > 0.9  # induction
    assert second[1, 9].argmax() in (2, 9) and second[1, 9, 3] < 0.01  # duplicate: the copies of token 2, not 3


def test_roles_are_checked():
    with pytest.raises(AnalysisError, match="layer 0 cannot hold a 'induction' head"):
        planted_heads_model([["induction"], ["random"]])
    with pytest.raises(AnalysisError, match="two lists of the same length"):
        planted_heads_model([["random", "random"], ["random"]])
    with pytest.raises(AnalysisError, match="at least 4"):
        random_roles(3, torch.Generator())
    roles = random_roles(5, torch.Generator().manual_seed(3))
    assert all(name in ROLES[layer] for layer, names in enumerate(roles) for name in names)
    assert "previous-token" in roles[0] and "induction" in roles[1] and "duplicate" in roles[1]


def test_a_duplicate_token_head_reading_a_self_attending_head_is_not_induction_by_weights():
    """The weight view's partner must be a previous-token head: K-composition with a head that attends to itself
    (the duplicate-token head reads the token that head rewrites) made the duplicate a perfect 'induction head'."""
    model = planted_heads_model([["previous-token", "current"], ["induction", "duplicate"]])
    report = detect_heads(model, batch=16)
    assert report.by_weights.induction == ((1, 0),) and report.by_behaviour.induction == ((1, 0),)
    assert report.weights.partner[1][1] == (0, 1)  # the head it K-composes with: the one that attends to itself
    assert float(report.weights.same_matching[1, 1]) > 0.99 and float(report.weights.copying[1, 1]) > 0.99
    assert float(report.weights.scores.induction[1, 1]) < 0.01


def test_detectors_find_the_planted_heads_and_no_decoy():
    rows = detector_recall(n_models=3, noise=(0.0, 1.0))
    assert len(rows) == 8
    for r in rows:
        assert r.planted and r.found == r.planted == r.claimed or (r.noise == 1.0 and r.found >= r.planted - 1), r
        assert 0.6 < r.score <= 1.0
    control = detector_recall(n_models=3, noise=(0.0,), replace={"previous-token": "current", "induction": "duplicate"})
    assert all(r.found == 0 and r.claimed == 0 for r in control), control


def test_skip_trigram_recall_finds_planted_triples_in_a_model_that_carries_them():
    """A one-layer model whose head carries A … B → C by construction: B attends to A, A's OV raises C."""
    from derivations import Architecture
    from numeric_check.model.circuit_model import CircuitModel

    d = 12
    model = CircuitModel.random(Architecture(1, 1, positional="none"), d_model=d, d_head=d, d_vocab=d, n_ctx=8,
                                dtype=torch.float64, device="cpu")
    planted = torch.tensor([[2, 5, 9], [3, 7, 4]])
    with torch.no_grad():
        model.W_E.copy_(torch.eye(d, dtype=torch.float64))
        model.W_U.copy_(torch.eye(d, dtype=torch.float64))
        attn = model.blocks[0].attn
        for w in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O):
            w.zero_()
        attn.W_K[0] = torch.eye(d, dtype=torch.float64)
        attn.W_V[0] = torch.eye(d, dtype=torch.float64)
        for a, b, c in planted.tolist():
            attn.W_Q[0, a, b] = 20.0  # destination b's query matches source a's key
            attn.W_O[0, c, a] = 5.0  # source a raises c
    scores = triple_scores(model, 2)
    assert divmod(int(scores.argmax()), d) == (5, 9)
    found = skip_trigram_recall(model, planted)
    assert (found.found, found.planted, found.k, found.swapped) == (2, 2, 1, 0) and found.median_rank == 1
    wrong = planted.clone()
    wrong[:, 2] = torch.tensor([4, 9])  # the outs swapped between sources: not what the head carries
    assert skip_trigram_recall(model, wrong).found == 0
