"""Tests for numeric_check.circuits.importance: the frozen-pattern split of logits by order, and term importance."""

from __future__ import annotations

import math

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.errors import ModelInputError, NumericCheckError
from numeric_check.circuits.importance import count_paths, logits_by_order, path_label, term_importance
from tensoralg.errors import InvalidOrder
from numeric_check.model.circuit_model import CircuitModel

torch.set_num_threads(1)

ARCHS = [
    Architecture(0, 1),
    Architecture(0, 1, positional="standard"),
    Architecture(1, 3, positional="qk_only"),
    Architecture(2, 2, positional="qk_only"),
    Architecture(3, 2, positional="standard", layer_norm=True, biases=True),
    Architecture(2, (1, 3), layer_norm=True, biases=True, mlp=True),
]


def _model(arch, dtype=torch.float64, seed=0):
    return CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=11, n_ctx=7, seed=seed, dtype=dtype, device="cpu")


def _tokens(batch=3, pos=7, seed=0):
    return torch.randint(0, 11, (batch, pos), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.describe())
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-9)])
def test_sum_of_all_orders_equals_the_logits(arch, dtype, tol):
    model = _model(arch, dtype)
    parts = logits_by_order(model, _tokens())
    assert len(parts.by_path) == math.prod(1 + h for h in arch.heads_per_layer)
    assert torch.allclose(parts.total(), parts.logits, atol=tol, rtol=0)
    assert float(parts.remainder.abs().max()) == 0.0


@pytest.mark.parametrize("max_order", [0, 1, 2])
def test_truncation_keeps_an_exact_remainder(max_order):
    model = _model(Architecture(3, 2, positional="standard", layer_norm=True, biases=True))
    full = logits_by_order(model, _tokens())
    cut = logits_by_order(model, _tokens(), max_order=max_order)
    assert all(len(p) <= max_order for p in cut.by_path)
    for path, term in cut.by_path.items():
        assert torch.allclose(term, full.by_path[path], atol=1e-10)
    omitted = sum(term for path, term in full.by_path.items() if len(path) > max_order)
    assert torch.allclose(cut.remainder, omitted, atol=1e-10)
    assert torch.allclose(cut.total(), cut.logits, atol=1e-10)


def test_terms_match_the_paper_formulas_for_an_attention_only_model():
    """Order 1: W_U W_OV^h W_E through A^h; order 2: W_U W_OV^{h2} W_OV^{h1} W_E through A^{h2} A^{h1}."""
    model = _model(Architecture(2, 2, positional="qk_only"))
    tokens = _tokens(batch=2)
    parts = logits_by_order(model, tokens)
    _, cache = model.run_with_cache(tokens)
    x0 = model.W_E.T[tokens]  # [batch, pos, d_model]

    def ov(layer, head):
        attn = model.blocks[layer].attn
        return attn.W_O[head] @ attn.W_V[head]  # [d_model, d_model]

    def pattern(layer, head):
        return cache[f"blocks.{layer}.attn.hook_pattern"][:, head]  # [batch, q, k]

    assert torch.allclose(parts.by_path[()], x0 @ model.W_U.T, atol=1e-10)
    for layer, head in model.arch.heads():
        expected = pattern(layer, head) @ x0 @ ov(layer, head).T @ model.W_U.T
        assert torch.allclose(parts.by_path[((layer, head),)], expected, atol=1e-10)
    h1, h2 = (0, 1), (1, 0)
    expected = pattern(*h2) @ pattern(*h1) @ x0 @ ov(*h1).T @ ov(*h2).T @ model.W_U.T
    assert torch.allclose(parts.by_path[(h1, h2)], expected, atol=1e-10)


def test_importance_report_losses_and_marginals():
    model = _model(Architecture(2, 2, positional="qk_only"))
    tokens = _tokens()
    report = term_importance(model, tokens)
    assert len(report.loss_by_order) == 3
    assert report.loss_by_order[-1] == pytest.approx(report.model_loss, abs=1e-9)
    assert report.uniform_loss == pytest.approx(math.log(11))
    # the paper's sign: the change in loss when each order is added, so they sum to model - uniform
    assert sum(report.marginal_by_order) == pytest.approx(report.model_loss - report.uniform_loss)
    assert report.marginal_by_order[0] == pytest.approx(report.loss_by_order[0] - report.uniform_loss)
    assert set(report.head_marginal) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert set(report.virtual_marginal) == {((0, a), (1, b)) for a in range(2) for b in range(2)}
    # a head's marginal loss is the change in loss when its individual term is added to the others
    parts = logits_by_order(model, tokens)
    without = parts.up_to(1) - parts.by_path[((1, 0),)]
    ce = torch.nn.functional.cross_entropy(without[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    assert report.head_marginal[(1, 0)] == pytest.approx(report.loss_by_order[1] - float(ce))


def test_marginal_losses_have_the_papers_sign():
    """Regression: "marginal loss reduction: heads +1.00" had the opposite sign to the paper's
    table (-1.8 / -5.2 / -0.3 nats); a term that lowers the loss has a negative marginal loss."""
    from numeric_check.circuits.importance import ImportanceReport

    report = ImportanceReport(loss_by_order=[3.0, 1.0, 1.2], model_loss=1.2, uniform_loss=4.0, head_marginal={(0, 0): -0.5})
    assert report.marginal_by_order == pytest.approx([-1.0, -2.0, 0.2])
    md = report.to_markdown()
    assert "| individual heads (order 1) | 1.0000 | -2.0000 |" in md and "reduction" not in md


def test_markdown_and_dict():
    report = term_importance(_model(Architecture(2, 2)), _tokens())
    text = report.to_markdown()
    assert "| direct path (order 0) |" in text and "| virtual heads (order 2) |" in text
    assert "L0H1→L1H0" in text
    data = report.to_dict()
    assert set(data["head_marginal"]) == {"L0H0", "L0H1", "L1H0", "L1H1"}
    assert len(data["marginal_by_order"]) == 3


def test_target_mask_restricts_the_loss():
    model = _model(Architecture(1, 2))
    tokens = _tokens()
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, -1] = True
    report = term_importance(model, tokens, target_mask=mask)
    with torch.no_grad():
        logits = model(tokens)
    expected = torch.nn.functional.cross_entropy(logits[:, -2], tokens[:, -1])
    assert report.model_loss == pytest.approx(float(expected))
    with pytest.raises(ModelInputError, match="target_mask has shape \\(3, 6\\); expected the tokens' shape \\(3, 7\\)"):
        term_importance(model, tokens, target_mask=mask[:, 1:])
    with pytest.raises(ModelInputError, match="selects no target token"):
        term_importance(model, tokens, target_mask=torch.zeros_like(mask))


def test_bad_max_order_and_tokens_are_rejected():
    model = _model(Architecture(1, 2))
    with pytest.raises(InvalidOrder, match=r"max_order must be None \(every term\) or an integer >= 0, got -1"):
        logits_by_order(model, _tokens(), max_order=-1)
    with pytest.raises(ModelInputError):
        logits_by_order(model, torch.tensor([[11, 0]]))


def test_path_counts_and_the_memory_guard():
    assert count_paths((2, 3, 4), 3) == 3 * 4 * 5
    assert count_paths((2, 3, 4), 1) == 1 + 9
    assert count_paths((), 2) == 1
    model = _model(Architecture(2, 2))
    with pytest.raises(NumericCheckError, match="9 paths of order <= 2 on 21 tokens with d_vocab=11 would hold 2,310 logits \\(limit 1,000\\)"):
        logits_by_order(model, _tokens(), max_elements=1000)


def test_default_importance_stops_at_virtual_heads():
    report = term_importance(_model(Architecture(3, 2, positional="standard")), _tokens())
    assert report.truncated and len(report.loss_by_order) == 4  # orders 0, 1, 2 and the remainder
    assert report.loss_by_order[-1] == pytest.approx(report.model_loss, abs=1e-9)
    assert "| orders above 2 (remainder) |" in report.to_markdown()


def test_path_labels():
    assert path_label(()) == "direct"
    assert path_label(((0, 1), (1, 3))) == "L0H1→L1H3"
