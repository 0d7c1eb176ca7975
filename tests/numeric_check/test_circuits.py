"""Circuits: dense definitions, the model's own forward pass, positivity, TransformerLens, bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from derivations.architecture import Architecture
from derivations.errors import ArchitectureError
from numeric_check.circuits.ov_qk import (
    AnalysisError,
    copying_scores,
    eigenvalue_positivity,
    head_weights,
    k_composition_circuit,
    ov_circuit,
    ov_circuit_eigenvalues,
    ov_circuits,
    ov_eigenvalues,
    positional_qk_circuit,
    qk_circuit,
    same_matching_scores,
    virtual_ov_circuit,
)
from numeric_check.circuits.factored import Factored, eigenvalue_multiset_distance
from numeric_check.model.circuit_model import CircuitModel
from tests.conftest import FAST
from tests.strategies import circuit_models

torch.set_num_threads(1)

DIMS = dict(d_model=12, d_head=3, d_vocab=15, n_ctx=6)


def make(arch=Architecture(3, (2, 3, 1), positional="qk_only"), seed=0, **kw):
    return CircuitModel.random(arch, **{**DIMS, "device": "cpu", **kw}, seed=seed, dtype=torch.float64)


def dense_head(model, layer, head):
    w = head_weights(model, layer, head)
    return w["W_O"] @ w["W_V"], w["W_Q"].T @ w["W_K"]


# --- definitions ------------------------------------------------------------------------------------


def test_circuits_equal_their_dense_definitions():
    model = make()
    W_E, W_U, W_pos = model.W_E.detach(), model.W_U.detach(), model.W_pos.detach()
    for layer, head in model.arch.heads():
        OV, QK = dense_head(model, layer, head)
        torch.testing.assert_close(ov_circuit(model, layer, head).materialize(), W_U @ OV @ W_E)
        torch.testing.assert_close(qk_circuit(model, layer, head).materialize(), W_E.T @ QK @ W_E)
        torch.testing.assert_close(positional_qk_circuit(model, layer, head).materialize(), W_pos.T @ QK @ W_pos)
    OV0, _ = dense_head(model, 0, 1)
    OV1, QK1 = dense_head(model, 1, 2)
    OV2, QK2 = dense_head(model, 2, 0)
    torch.testing.assert_close(virtual_ov_circuit(model, [(0, 1), (1, 2), (2, 0)]).materialize(), W_U @ OV2 @ OV1 @ OV0 @ W_E)
    torch.testing.assert_close(k_composition_circuit(model, (2, 0), (0, 1)).materialize(), W_E.T @ QK2 @ OV0 @ W_E)
    stacked = ov_circuits(model)
    assert stacked.shape == (3, 3, 15, 15)
    torch.testing.assert_close(stacked[1, 2].materialize(), W_U @ OV1 @ W_E)


def test_ov_and_qk_circuits_through_the_model_forward_pass():
    """With position 1 made to attend only to position 0, logits[1] - direct path = OV column of token 0;
    the pre-softmax score [1, 0] is the QK circuit entry over the attention scale."""
    model = make(Architecture(1, 2))
    tokens = torch.tensor([[4, 9]])
    _, cache = model.run_with_cache(tokens)
    for head in range(2):
        score = cache["blocks.0.attn.hook_attn_scores"][0, head, 1, 0]
        torch.testing.assert_close(score * model.cfg.scale, qk_circuit(model, 0, head).row(9)[4])

        def attend_to_first(pattern, hook, head=head):
            pattern = torch.zeros_like(pattern)
            pattern[:, head, :, 0] = 1.0  # every query attends to position 0; other heads off
            return pattern

        logits = model.run_with_hooks(tokens, [("blocks.0.attn.hook_pattern", attend_to_first)])
        direct = model.W_U @ model.W_E[:, 9]
        torch.testing.assert_close(logits[0, 1] - direct, ov_circuit(model, 0, head).col(4))


@FAST
@given(circuit_models(max_layers=3))
def test_all_head_scores_match_single_head_circuits(model):
    copying, values, ov = copying_scores(model), ov_circuit_eigenvalues(model), ov_eigenvalues(model)
    same = same_matching_scores(model)
    n_heads = max(model.arch.heads_per_layer, default=0)
    assert copying.shape == (model.arch.n_layers, n_heads)
    assert same.shape == (model.arch.n_layers, n_heads) * 2
    exists = set(model.arch.heads())
    for layer in range(model.arch.n_layers):
        for head in range(n_heads):
            if (layer, head) not in exists:
                assert copying[layer, head].isnan() and values[layer, head].isnan().all()
                continue
            circuit = ov_circuit(model, layer, head)
            torch.testing.assert_close(copying[layer, head], eigenvalue_positivity(circuit), equal_nan=True)
            dense = torch.linalg.eigvals(circuit.materialize())
            assert eigenvalue_multiset_distance(values[layer, head], dense) < 1e-8 * (1 + float(dense.abs().max()))
            OV, _ = dense_head(model, layer, head)
            assert eigenvalue_multiset_distance(ov[layer, head], torch.linalg.eigvals(OV)) < 1e-8 * (1 + float(OV.abs().max()))
    for l1, h1 in exists:
        for l2, h2 in exists:
            if l1 < l2:
                expected = eigenvalue_positivity(k_composition_circuit(model, (l2, h2), (l1, h1)))
                torch.testing.assert_close(same[l1, h1, l2, h2], expected, equal_nan=True)
            else:
                assert same[l1, h1, l2, h2].isnan()


# --- positivity ---------------------------------------------------------------------------------------


def test_positivity_of_copying_and_anti_copying():
    assert float(eigenvalue_positivity(Factored(torch.eye(4)))) == 1.0
    assert float(eigenvalue_positivity(Factored(-2 * torch.eye(4)))) == -1.0
    rotation = torch.tensor([[0.0, -1.0], [1.0, 0.0]])  # eigenvalues ±i
    assert abs(float(eigenvalue_positivity(Factored(rotation)))) < 1e-7
    assert eigenvalue_positivity(Factored(torch.zeros(3, 3))).isnan()
    # batched: one value per product
    assert eigenvalue_positivity(Factored(torch.eye(3).expand(2, 5, 3, 3))).shape == (2, 5)


def test_a_copying_head_scores_one():
    model = make(Architecture(1, 2), d_model=15)
    with torch.no_grad():
        model.W_E.copy_(torch.eye(15))
        model.W_U.copy_(torch.eye(15))
        attn = model.blocks[0].attn
        attn.W_V[0] = torch.eye(15)[:3]  # the first 3 tokens pass through head 0
        attn.W_O[0] = 2 * torch.eye(15)[:, :3]
    scores = copying_scores(model)
    assert float(scores[0, 0]) == pytest.approx(1.0)
    assert abs(float(scores[0, 1])) < 1


def test_scores_of_a_model_without_layers():
    model = make(Architecture(0, 1))
    assert copying_scores(model).shape == (0, 0)
    assert same_matching_scores(model).shape == (0, 0, 0, 0)


# --- against TransformerLens -----------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")
def test_eigenvalues_match_transformer_lens():
    pytest.importorskip("transformer_lens")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from numeric_check.conversion.adapters import from_transformer_lens

    cfg = HookedTransformerConfig(
        n_layers=2, n_heads=3, d_model=16, d_head=4, d_vocab=20, n_ctx=8, attn_only=True,
        normalization_type=None, dtype=torch.float64, seed=1, device="cpu"
    )
    tl = HookedTransformer(cfg)
    model = from_transformer_lens(tl, device="cpu")
    with torch.no_grad():
        theirs_ov, theirs_full = tl.OV.eigenvalues, (tl.W_E @ tl.OV @ tl.W_U).eigenvalues
    ours_ov, ours_full = ov_eigenvalues(model), ov_circuit_eigenvalues(model)
    for layer, head in model.arch.heads():
        assert eigenvalue_multiset_distance(theirs_ov[layer, head], ours_ov[layer, head]) < 1e-10
        assert eigenvalue_multiset_distance(theirs_full[layer, head], ours_full[layer, head]) < 1e-10


# --- bad input -------------------------------------------------------------------------------------


def test_bad_heads_and_orders_are_clear_errors():
    model = make()
    with pytest.raises(ArchitectureError, match="head 1 does not exist in layer 2: it has heads 0..0"):
        ov_circuit(model, 2, 1)
    with pytest.raises(ArchitectureError, match="layer 3 does not exist"):
        qk_circuit(model, 3, 0)
    with pytest.raises(AnalysisError, match="strictly increasing layers"):
        virtual_ov_circuit(model, [(1, 0), (0, 0)])
    with pytest.raises(AnalysisError, match="at least one"):
        virtual_ov_circuit(model, [])
    with pytest.raises(AnalysisError, match="writer head L1H0 must be in an earlier layer than the reader L1H1"):
        k_composition_circuit(model, (1, 1), (1, 0))
    with pytest.raises(AnalysisError, match="no W_pos"):
        positional_qk_circuit(make(Architecture(1, 1)), 0, 0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_analyses_on_cuda_match_cpu():
    from numeric_check.circuits.composition import composition_scores
    from numeric_check.circuits.detect import detect_heads

    cpu = make()
    gpu = make().to("cuda")
    torch.testing.assert_close(copying_scores(gpu).cpu(), copying_scores(cpu), equal_nan=True)
    torch.testing.assert_close(same_matching_scores(gpu).cpu(), same_matching_scores(cpu), equal_nan=True)
    for kind in "QKV":
        torch.testing.assert_close(composition_scores(gpu, kind, baseline=True).cpu(), composition_scores(cpu, kind, baseline=True), equal_nan=True)
    torch.testing.assert_close(ov_circuit(gpu, 1, 2).topk_col(3, 4).values.cpu(), ov_circuit(cpu, 1, 2).topk_col(3, 4).values)
    report_gpu, report_cpu = detect_heads(gpu, batch=2), detect_heads(cpu, batch=2)
    torch.testing.assert_close(report_gpu.behaviour.induction, report_cpu.behaviour.induction, equal_nan=True)
    torch.testing.assert_close(report_gpu.weights.scores.induction, report_cpu.weights.scores.induction, equal_nan=True)
