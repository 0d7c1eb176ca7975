"""Verification at scale: chunks sized to the device, out of memory in the middle, runs too long to start."""

from __future__ import annotations

import pytest
import torch

import numeric_check.verification.verify as verify_module
from derivations.architecture import Architecture
from derivations.paths import expand_logits
from numeric_check.errors import VerifyError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.budget import PathChoice, estimate_seconds, refuse_long
from numeric_check.verification.isolate import DEFAULT_CHUNK_BYTES
from numeric_check.verification.verify import MIN_CHUNK_BYTES, chunk_for, verify_logits, verify_qk
from tests.fake_cuda import fake_cuda

ARCH = Architecture(2, 2, positional="standard", layer_norm=True, biases=True, mlp=True)
TOKENS = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 0]]


def _model() -> CircuitModel:
    return CircuitModel.random(ARCH, d_model=8, d_head=4, d_vocab=12, n_ctx=6, seed=0, device="cpu")


def _out_of_memory_above(monkeypatch, name: str, limit: int) -> list[int]:
    """``verify_module.<name>`` raising CUDA's out-of-memory error whenever its chunk is above ``limit``."""
    seen: list[int] = []
    real = getattr(verify_module, name)

    def patched(*args, **kwargs):
        chunk = kwargs["chunk_bytes"] if "chunk_bytes" in kwargs else args[9]
        seen.append(chunk)
        if chunk > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(verify_module, name, patched)
    return seen


def test_out_of_memory_in_the_middle_shrinks_the_chunk_and_goes_on(monkeypatch):
    expected = verify_logits(_model(), TOKENS, max_order=1)
    seen = _out_of_memory_above(monkeypatch, "check_isolated", 1 << 22)
    report = verify_logits(_model(), TOKENS, max_order=1, chunk_bytes=1 << 26)
    assert report.passed and {c for c in seen} == {1 << 26, 1 << 24, 1 << 22}
    assert [t.label for t in report.terms] == [t.label for t in expected.terms]
    assert [t.norm for t in report.terms] == pytest.approx([t.norm for t in expected.terms], rel=1e-12)
    assert report.notes[-1].endswith("ran out of memory with chunks of 64 MiB: verified with chunks of 4 MiB")
    assert len(report.notes) == len(expected.notes) + 1  # the failed attempts' notes are not repeated


def test_out_of_memory_in_a_pass_of_grouped_check_2_shrinks_the_chunk_and_goes_on(monkeypatch):
    from numeric_check.verification import grouped_isolation

    monkeypatch.setattr(verify_module, "choose_path", lambda *a: PathChoice("grouped", "forced"))  # (a small model)
    expected = verify_logits(_model(), TOKENS, max_order=2)
    run, budgets = grouped_isolation.PrefixPasses._run, []

    def tight(self, *args):
        budgets.append(self.budget)
        if self.budget > (1 << 22) // verify_module.PASS_FRACTION:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return run(self, *args)

    monkeypatch.setattr(grouped_isolation.PrefixPasses, "_run", tight)
    report = verify_logits(_model(), TOKENS, max_order=2, chunk_bytes=1 << 26)
    assert report.passed and report.notes[-1].endswith("verified with chunks of 4 MiB")
    assert sorted(set(budgets), reverse=True) == [(1 << k) // verify_module.PASS_FRACTION for k in (26, 24, 22)]
    assert [t.norm for t in report.terms] == pytest.approx([t.norm for t in expected.terms], rel=1e-12)
    assert [t.passed for t in report.terms] == [t.passed for t in expected.terms]


def test_out_of_memory_even_with_the_smallest_chunk_is_one_line_naming_it_and_the_cpu(monkeypatch):
    _out_of_memory_above(monkeypatch, "check_isolated", 0)
    with pytest.raises(VerifyError) as info:
        verify_logits(_model(), TOKENS, max_order=1, chunk_bytes=1 << 23)
    message = str(info.value)
    assert "\n" not in message and "even with chunks of 1 MiB (from 8 MiB" in message and "--device cpu" in message


def test_out_of_memory_in_qk_isolation_shrinks_the_chunk(monkeypatch):
    real, seen = verify_module.isolate_qk, []

    def patched(*args, chunk_bytes, **kwargs):
        seen.append(chunk_bytes)
        if chunk_bytes > MIN_CHUNK_BYTES:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        return real(*args, chunk_bytes=chunk_bytes, **kwargs)

    monkeypatch.setattr(verify_module, "isolate_qk", patched)
    report = verify_qk(_model(), TOKENS, 1, 0, chunk_bytes=1 << 22)
    assert report.passed and seen == [1 << 22, 1 << 20]


def test_chunk_follows_the_device():
    assert chunk_for(torch.device("cpu")) == DEFAULT_CHUNK_BYTES
    assert chunk_for(torch.device("cpu"), 12345) == 12345
    with fake_cuda():  # 8 GiB free: a sixteenth
        assert chunk_for(torch.device("cuda", 0)) == 8 * 2**30 // 16
    with pytest.raises(VerifyError, match="chunk_bytes must be an int >= 1"):
        chunk_for(torch.device("cpu"), 0)


def test_verification_on_cuda_with_the_chunk_of_its_free_memory_and_a_shrunk_one(monkeypatch):
    with fake_cuda():
        seen = _out_of_memory_above(monkeypatch, "check_isolated", 2**29 - 1)  # the first (512 MiB) fails
        report = verify_logits(_model(), TOKENS, max_order=1, device="cuda")
    assert report.passed and report.device == "cuda:0" and seen[0] == 2**29 and seen[-1] == 2**27
    assert "verified with chunks of 128 MiB" in report.notes[-1]


# --- how long a run would take, said before it starts -------------------------------------------


def test_the_estimate_grows_with_the_terms_and_the_width_and_shrinks_with_ranks_and_the_order():
    small = estimate_seconds(10_000, batch=1, pos=32, d_model=256, d_head=32, dtype="float64", device="cpu", threads=1)
    assert 0.3 < small < 3  # 31,584 such terms of order 3 took 1.9 s on one thread
    assert estimate_seconds(20_000, 1, 32, 256, 32, "float64", "cpu", threads=1) == pytest.approx(2 * small)
    assert estimate_seconds(10_000, 1, 32, 256, 32, "float64", "cpu", threads=1, order=3) < small  # groups shared more widely
    assert estimate_seconds(10_000, 1, 32, 2048, 128, "float64", "cpu", threads=1) > 3 * small
    assert estimate_seconds(10_000, 1, 32, 256, 32, "float64", "cpu", threads=1, ranks=4) == pytest.approx(small / 4)


def test_a_run_of_hours_is_refused_before_it_starts_with_the_estimate():
    big = Architecture(32, 32, layer_norm=True, mlp=True)
    with pytest.raises(VerifyError) as info:
        refuse_long(big, 3, None, batch=1, pos=32, d_model=4096, d_head=128, dtype="float32", device="cpu", max_hours=1)
    message = str(info.value)
    assert "\n" not in message and "hours" in message and "terms" in message and "max_order=" in message
    refuse_long(Architecture(2, 2), 2, None, batch=1, pos=8, d_model=16, d_head=4, dtype="float64", device="cpu", max_hours=1)


def test_the_cli_refuses_a_run_longer_than_max_hours_before_it_starts(capsys):
    from derivations.cli import main

    code = main(["verify", "--layers", "6", "--heads", "8", "--max-order", "3", "--max-hours", "0.0001", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith("tcircuits verify: error: 11,249 terms") and "terms would take about" in err and "max_order=2 keeps 1,009 terms" in err and "--max-hours" in err


def test_check_2_passes_hold_at_most_the_copies_their_chunk_allows(monkeypatch):
    """Memory follows the chunk, not the term count: each pass of check 2 gets at most the copies of the
    batch (one per prefix) that its share of the chunk holds, and each deepest prefix still runs once (a prefix
    group's groups are evaluated a pass of its copies at a time); the report is the same."""
    from numeric_check.verification import grouped_isolation

    model = CircuitModel.random(Architecture(3, 3, layer_norm=True, mlp=True), d_model=8, d_head=4, d_vocab=12, n_ctx=6, seed=1)
    made = []
    init = grouped_isolation.PrefixPasses.__init__

    def keep(self, *args):
        init(self, *args)
        made.append(self)

    monkeypatch.setattr(grouped_isolation.PrefixPasses, "__init__", keep)
    monkeypatch.setattr(verify_module, "choose_path", lambda *a: PathChoice("grouped", "forced"))  # (a small model)
    expected = verify_logits(model, TOKENS, max_order=3)
    deepest = {(t.path.source, t.path.heads[:-1]) for t in expand_logits(model.arch, 3) if t.order == 3}
    assert sum(n for depth, n in made[-1].sizes if depth == 2) == len(deepest) == 9
    chunk = verify_module.PASS_FRACTION * 2 * made[-1]._per_copy(2)  # passes of two copies
    report = verify_logits(model, TOKENS, max_order=3, chunk_bytes=chunk)
    sizes = made[-1].sizes
    assert report.passed and max(n for _, n in sizes) == 2 and sum(n for depth, n in sizes if depth == 2) == 9  # still once
    assert [t.norm for t in report.terms] == pytest.approx([t.norm for t in expected.terms], rel=1e-12)
    assert [t.passed for t in report.terms] == [t.passed for t in expected.terms]