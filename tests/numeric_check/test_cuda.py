"""Verification on a CUDA device (skipped without one)."""

from __future__ import annotations

import math

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.verify import verify_logits, verify_qk

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ARCH = Architecture(2, (2, 3), positional="standard", layer_norm=True, biases=True, mlp=True)


def model_and_tokens():
    model = CircuitModel.random(ARCH, d_model=16, d_head=4, d_vocab=40, n_ctx=10, seed=0)
    tokens = torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(1))
    return model, tokens


def test_default_device_is_cuda_and_verification_follows_the_model():
    model, tokens = model_and_tokens()
    assert model.device.type == "cuda"  # auto: CUDA when present
    report = verify_logits(model, tokens)
    assert report.device.startswith("cuda") and report.passed, report.to_text()
    on_cpu = verify_logits(model.to("cpu"), tokens)
    assert on_cpu.device == "cpu" and on_cpu.passed


@pytest.mark.parametrize("max_order", [None, 0, 1])
def test_logits_on_cuda_match_cpu(max_order):
    model, tokens = model_and_tokens()
    gpu = verify_logits(model, tokens, max_order=max_order, device="cuda")
    cpu = verify_logits(model, tokens, max_order=max_order, device="cpu")
    assert gpu.passed and cpu.passed, gpu.to_text()
    assert [t.label for t in gpu.terms] == [t.label for t in cpu.terms]
    for a, b in zip(gpu.terms, cpu.terms):
        assert math.isclose(a.norm, b.norm, rel_tol=1e-9, abs_tol=1e-12)


def test_qk_on_cuda():
    model, tokens = model_and_tokens()
    report = verify_qk(model, tokens.cuda(), 1, 2, max_order=1, device="cuda")
    assert report.passed, report.to_text()


def test_float32_on_cuda():
    model, tokens = model_and_tokens()
    report = verify_logits(model, tokens, dtype=torch.float32, device="cuda", rtol=1e-4)
    assert report.dtype == "float32" and report.passed, report.to_text()


def test_cuda_model_input():
    model, tokens = model_and_tokens()
    report = verify_logits(model.cuda(), tokens, device="cpu")
    assert report.device == "cpu" and report.passed
