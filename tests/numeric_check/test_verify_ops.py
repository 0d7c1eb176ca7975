"""The operations verify_logits dispatches (issue 55): pinned as counts, which no machine's speed changes.

The model: attention-only, 2 layers x 12 heads, d_model 128, d_head 32, d_vocab 1000, 32 tokens (338 terms);
TransformerLens's ``run_with_cache`` dispatches 283 operations on it. Before issue 55, verify_logits dispatched
21,978 on this model with errors computed exactly in float64 (its default at this size), 10,770 in float32, and
2,047 with errors bounded (float64); then 2,185, 2,179 and 2,050; now 1,948, 1,769 and 1,575 (each term's own largest
logit unembedded only where its error needs it; the weights' kernels and head maps kept with the model between
calls). A count past its pin (about 3% above) means something went back to a call per term, per row or per head.
"""

from __future__ import annotations

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification import bounds
from numeric_check.verification.op_count import count_ops
from numeric_check.verification.verify import verify_logits

RUN_WITH_CACHE = 283  # TransformerLens 2.x on this model (test_within_ten_run_with_cache measures it)
PINNED = {(torch.float64, True): 2_010, (torch.float64, False): 1_625, (torch.float32, True): 1_825}


@pytest.fixture(scope="module")
def model_and_tokens():
    arch = Architecture(2, 12, positional="standard", layer_norm=True)
    model = CircuitModel.random(arch, d_model=128, d_head=32, d_vocab=1000, n_ctx=64, seed=0)
    tokens = torch.randint(0, 1000, (1, 32), generator=torch.Generator().manual_seed(0))
    return model, tokens


def _verify_ops(model, tokens, dtype, exact, monkeypatch) -> int:
    monkeypatch.setattr(bounds, "bf16_screen_available", lambda: False)  # one screen on every CPU: one count
    run = lambda: verify_logits(model, tokens, dtype=dtype, device="cpu", exact_errors=exact)  # noqa: E731
    assert run().passed  # the first call makes the model's unembedding constants; the second is counted
    report, n = count_ops(run)
    assert report.passed and len(report.terms) == 338
    return n


@pytest.mark.parametrize("dtype, exact", list(PINNED))
def test_operations_pinned(model_and_tokens, dtype, exact, monkeypatch):
    n = _verify_ops(*model_and_tokens, dtype, exact, monkeypatch)
    assert n <= PINNED[dtype, exact], f"verify_logits dispatched {n:,} ATen operations, pinned at {PINNED[dtype, exact]:,}"
    assert PINNED[dtype, exact] <= 10 * RUN_WITH_CACHE


def test_within_ten_run_with_cache(monkeypatch):
    tl = pytest.importorskip("transformer_lens")
    from numeric_check.conversion.adapters import from_transformer_lens

    cfg = tl.HookedTransformerConfig(attn_only=True, seed=0, device="cpu", n_layers=2, n_heads=12, d_model=128,
                                     d_head=32, d_vocab=1000, n_ctx=64)
    source = tl.HookedTransformer(cfg)
    tokens = torch.randint(0, 1000, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        source.run_with_cache(tokens)
        _, reference = count_ops(lambda: source.run_with_cache(tokens))
    n = _verify_ops(from_transformer_lens(source, dtype=torch.float64, device="cpu"), tokens, torch.float64, None, monkeypatch)
    assert n <= 10 * reference, f"verify_logits: {n:,} operations, run_with_cache {reference:,}"
