"""Verification sharded over torch.distributed ranks: two gloo ranks on the CPU give the report of one process."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from derivations.architecture import Architecture
from derivations.paths import expand_logits
from derivations.qk import expand_qk
from numeric_check.errors import VerifyError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.distributed import Shard, qk_prefix
from numeric_check.verification.hook_paths import record
from numeric_check.verification import verify as verify_module
from numeric_check.verification.bind import Binder
from numeric_check.verification.grouped import plan_groups
from numeric_check.verification.verify import verify_logits, verify_qk

ARCH = Architecture(2, 3, layer_norm=True, mlp=True, biases=True, positional="standard")
TOKENS = [[1, 5, 2, 7, 3, 1], [4, 4, 0, 9, 2, 8]]


def _model() -> CircuitModel:
    return CircuitModel.random(ARCH, d_model=12, d_head=4, d_vocab=11, n_ctx=8, seed=3, dtype=torch.float64, device="cpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, out: str, dies: bool, other_tokens: bool = False) -> None:
    """One rank: join the gloo group, verify (logits at order 1 and one head's scores), write what it got."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        if dies and rank == 1:
            os._exit(3)  # a rank that dies before the others meet it
        model = _model()
        try:
            tokens = [row[::-1] for row in TOKENS] if other_tokens and rank == 1 else TOKENS
            logits = verify_logits(model, tokens, max_order=1, device="cpu")
            qk = verify_qk(model, TOKENS, 1, 2, max_order=1, device="cpu")
            whole = verify_logits(model, tokens, device="cpu")  # every order: prefixes through a head too
        except VerifyError as error:
            Path(out, f"{rank}.err").write_text(str(error))
            return
        Path(out, f"{rank}.json").write_text(json.dumps([json.loads(r.to_json()) for r in (logits, qk, whole)]))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _run_ranks(tmp_path: Path, dies: bool = False, other_tokens: bool = False) -> list[int]:
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, str(tmp_path), dies, other_tokens)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in procs]


def _same(a: dict, b: dict) -> None:
    """Two reports equal term by term: labels, heads, verdicts exactly; figures to rounding."""
    scale = a["scale"]
    assert [t["label"] for t in a["terms"]] == [t["label"] for t in b["terms"]]
    for x, y in zip(a["terms"], b["terms"]):
        assert (x["heads"], x["order"], x["passed"], x["source"]) == (y["heads"], y["order"], y["passed"], y["source"])
        assert math.isclose(x["norm"], y["norm"], rel_tol=1e-12, abs_tol=1e-14 * scale), x["label"]
        for key in ("max_abs_error", "error_bound"):
            assert (x[key] is None) == (y[key] is None), (x["label"], key)
            if x[key] is not None:
                assert abs(x[key] - y[key]) <= 1e-12 * scale, (x["label"], key)
    assert [(c["name"], c["passed"]) for c in a["checks"]] == [(c["name"], c["passed"]) for c in b["checks"]]
    for x, y in zip(a["checks"], b["checks"]):
        if x["max_abs_error"] is not None:
            assert abs(x["max_abs_error"] - y["max_abs_error"]) <= 1e-12 * scale, x["name"]
    assert a["passed"] and b["passed"]


def test_two_gloo_ranks_give_the_report_of_one_process(tmp_path):
    codes = _run_ranks(tmp_path)
    assert codes == [0, 0], [p.read_text() for p in tmp_path.glob("*.err")]
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    model = _model()
    alone = [json.loads(verify_logits(model, TOKENS, max_order=1, device="cpu").to_json()),
             json.loads(verify_qk(model, TOKENS, 1, 2, max_order=1, device="cpu").to_json()),
             json.loads(verify_logits(model, TOKENS, device="cpu").to_json())]
    for got in ranks:
        for report, expected in zip(got, alone):
            _same(report, expected)
            assert any("2 ranks" in note for note in report["notes"])
    assert alone[0]["n_omitted"] > 0 and alone[0]["checks"][2]["passed"]  # check 3 ran, over sharded terms


def test_a_rank_that_dies_stops_the_other_with_one_line(tmp_path):
    codes = _run_ranks(tmp_path, dies=True)
    assert codes[1] == 3
    assert not list(tmp_path.glob("*.json"))  # no report
    message = (tmp_path / "0.err").read_text()
    assert "\n" not in message and message.startswith("rank 0 of 2: another rank stopped") and "no report written" in message


def test_ranks_given_different_tokens_stop_before_splitting_the_work(tmp_path):
    assert _run_ranks(tmp_path, other_tokens=True) == [0, 0]
    assert not list(tmp_path.glob("*.json"))
    for rank in range(2):
        message = (tmp_path / f"{rank}.err").read_text()
        assert "\n" not in message and message.startswith("the 2 ranks were not given the same verification (their tokens differ)")


@pytest.mark.parametrize("world", [2, 3, 5])
def test_shares_are_disjoint_whole_prefixes_and_cover_every_term(world):
    terms = list(expand_logits(Architecture(3, 4, mlp=True), 2))
    shares = [Shard(r, world).select(terms) for r in range(world)]
    assert sorted(i for share in shares for i in share) == list(range(len(terms)))
    depth = 1 if world == 2 else 2  # (3 x 4 heads: too few one-head prefixes for 5 ranks, never for 2)
    owner = {}
    for r, share in enumerate(shares):
        for i in share:
            key = (terms[i].source.input_key, terms[i].heads[:depth])
            assert owner.setdefault(key, r) == r  # a prefix stays on one rank
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= max(len(terms) // (4 * world), 60)  # balanced by terms


@pytest.mark.parametrize("world", [2, 3, 5])
def test_grouped_shares_are_disjoint_and_cover_every_term(world):
    """The grouped engine's shares: whole groups of prefixes (a pass of check 2's copies) and direct terms,
    balanced by terms, disjoint, every term of the expansion in one; the omitted groups likewise."""
    model = CircuitModel.random(Architecture(3, 4, mlp=True, biases=True), d_model=8, d_head=4, d_vocab=11, n_ctx=8, seed=0)
    binder = Binder(model, record(model, torch.tensor([TOKENS[0]])))
    expansion, full = expand_logits(model.arch, 2), expand_logits(model.arch)
    plan, omitted_plan = plan_groups(binder, expansion), plan_groups(binder, full, range(3, 4))
    rows, omitted, loads = [], [], []
    for rank in range(world):
        units, singles, late = verify_module._grouped_share(plan, omitted_plan, None, Shard(rank, world))
        mine = [i for family, c in units for g in family
                for i in range(g.start + c.start * g.counts[-1], g.start + c.stop * g.counts[-1])] + sorted(singles)
        rows += mine
        omitted += [g.start for g in late]
        loads.append(len(mine))
    assert sorted(rows) == list(range(len(expansion)))
    assert sorted(omitted) == [g.start for g in omitted_plan.groups]
    assert max(loads) <= 2 * len(expansion) / world  # balanced by terms


def test_qk_shares_cover_every_term():
    terms = list(expand_qk(Architecture(2, 3), 1, 0))
    shares = [Shard(r, 2).select(terms, qk_prefix) for r in range(2)]
    assert sorted(shares[0] + shares[1]) == list(range(len(terms))) and not set(shares[0]) & set(shares[1])


def test_distributed_true_without_a_process_group_is_refused():
    with pytest.raises(VerifyError, match="torch.distributed initialised"):
        verify_logits(_model(), TOKENS, max_order=0, device="cpu", distributed=True)


@pytest.mark.slow
def test_torchrun_cli_prints_one_report_equal_to_one_process(tmp_path):
    """The user's path: ``torchrun --nproc-per-node 2 tcircuits verify … --json``: one report on stdout (rank 0's),
    equal term by term to the same command in one process."""
    import subprocess
    import sys

    tcircuits = Path(sys.executable).with_name("tcircuits")
    torchrun = Path(sys.executable).with_name("torchrun")
    if not tcircuits.exists() or not torchrun.exists():
        pytest.skip("tcircuits or torchrun is not installed beside this Python")
    flags = ["verify", "--layers", "2", "--heads", "3", "--layer-norm", "--mlp", "--max-order", "1", "--device", "cpu",
             "--format", "json", "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ranks = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                            str(_free_port()), str(tcircuits), *flags], capture_output=True, text=True, env=env, timeout=300)
    alone = subprocess.run([str(tcircuits), *flags], capture_output=True, text=True, env=env, timeout=300)
    assert ranks.returncode == 0 and alone.returncode == 0, ranks.stderr[-2000:]
    got = json.loads(ranks.stdout)  # one JSON document: rank 1 printed nothing
    _same(got, json.loads(alone.stdout))
    assert any("2 ranks" in note for note in got["notes"])


def test_more_ranks_than_gpus_is_one_line_before_anything_starts(monkeypatch):
    from numeric_check.verification.distributed import init_from_environment
    from tests.fake_cuda import fake_cuda

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with fake_cuda(), pytest.raises(VerifyError) as info:
        init_from_environment(torch.device("cuda", 0))
    assert str(info.value) == ("rank 1 of 2 would use cuda:1, but this machine has 1 CUDA devices; start at most that many "
                               "ranks per machine (torchrun --nproc-per-node), or use --device cpu")
    assert not torch.distributed.is_initialized()


def test_outside_torchrun_nothing_is_initialised_and_a_bad_timeout_is_refused(monkeypatch):
    from numeric_check.verification.distributed import init_from_environment

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_from_environment(torch.device("cpu")) == torch.device("cpu") and not torch.distributed.is_initialized()
    with pytest.raises(VerifyError, match="timeout must be a number of seconds > 0, got 0"):
        init_from_environment(torch.device("cpu"), 0)
