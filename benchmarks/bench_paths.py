"""Benchmark: the two evaluations of a logits expansion side by side, on shapes that favour each.

``verify_logits`` evaluates the terms through heads either by groups (one source, one set of layers,
every choice of heads, batched on the term axis: :mod:`numeric_check.verification.grouped`) or through
the shared prefix trie (:mod:`numeric_check.verification.evaluate`, check 2 by batched isolation passes).
It picks one by the work (:func:`numeric_check.verification.budget.choose_path`, whose constants come from here); this prints, for each
shape, the CPU seconds of both (medians of ``--repeats`` calls after a first one, one thread, every check
on), their ratio, which one the engine picks and why, and whether that pick was the faster one (or within
``--slack`` of it: the machine is shared, so near ties are noise).

Shapes: wide and shallow at order 2 (bench_verify's shape with a smaller vocabulary), narrow and deep at
order 3, few heads at every order, many heads at order 2, one head a layer at every order.

    python benchmarks/bench_paths.py [--repeats N] [--only NAME ...] [--slack 0.15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from derivations.architecture import Architecture  # noqa: E402
from numeric_check.model.circuit_model import CircuitModel  # noqa: E402
import numeric_check.verification.verify as verify_module  # noqa: E402
from numeric_check.verification.budget import PathChoice  # noqa: E402
from numeric_check.verification.verify import verify_logits  # noqa: E402

# name -> (architecture, d_model, d_head, d_vocab, batch, pos, max_order)
SHAPES = {
    "wide, shallow, order 2": (Architecture(2, 12, layer_norm=True, positional="standard"), 768, 64, 5000, 2, 64, 2),
    "narrow, deep, order 3": (Architecture(6, 4, layer_norm=True, positional="standard"), 64, 16, 500, 1, 32, 3),
    "few heads, every order": (Architecture(4, 2, layer_norm=True, positional="standard"), 256, 32, 1000, 1, 32, None),
    "many heads, order 2": (Architecture(2, 32, layer_norm=True, positional="standard"), 512, 16, 2000, 1, 32, 2),
    "one head a layer, every order": (Architecture(8, 1, layer_norm=True, positional="standard"), 128, 32, 500, 1, 32, None),
}


def cpu_median(fn, repeats: int) -> tuple[object, float]:
    """``(result, median CPU seconds)`` of ``repeats`` calls after a first one (not timed)."""
    result = fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        result = fn()
        times.append(time.process_time() - start)
    return result, statistics.median(times)


def measure(name: str, repeats: int) -> dict:
    arch, d_model, d_head, d_vocab, batch, pos, order = SHAPES[name]
    model = CircuitModel.random(arch, d_model=d_model, d_head=d_head, d_vocab=d_vocab, n_ctx=pos, seed=0,
                                dtype=torch.float64, device="cpu")
    tokens = torch.randint(0, d_vocab, (batch, pos), generator=torch.Generator().manual_seed(0))
    run = lambda: verify_logits(model, tokens, max_order=order, device="cpu")  # noqa: E731
    picked, choose = [], verify_module.choose_path
    with mock.patch.object(verify_module, "choose_path", lambda *a: picked.append(choose(*a)) or picked[-1]):
        run()  # the engine's own pick
    with mock.patch.object(verify_module, "choose_path", lambda *a: PathChoice("grouped", "forced")):
        grouped, g_cpu = cpu_median(run, repeats)
    with mock.patch.object(verify_module, "choose_path", lambda *a: PathChoice("trie", "forced")):
        trie, t_cpu = cpu_median(run, repeats)
    assert [t.label for t in grouped.terms] == [t.label for t in trie.terms] and grouped.passed and trie.passed
    return dict(name=name, terms=len(grouped.terms), grouped=g_cpu, trie=t_cpu, picked=picked[0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=sorted(SHAPES), help="these shapes alone")
    parser.add_argument("--slack", type=float, default=0.15, help="a pick within this share of the faster counts as right")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"verify_logits, float64, every check, one thread; CPU seconds, medians of {args.repeats} after a first call; "
          f"load average {os.getloadavg()[0]:.1f} at the start ({os.cpu_count()} cores)")
    print(f"{'shape':32s} {'terms':>7s} {'grouped':>8s} {'trie':>8s} {'trie/grouped':>12s}  picked (why)")
    wrong = 0
    for name in args.only or SHAPES:
        r = measure(name, args.repeats)
        best = min(r["grouped"], r["trie"])
        ok = r[r["picked"].path] <= best * (1 + args.slack)
        wrong += not ok
        print(f"{name:32s} {r['terms']:7,d} {r['grouped']:8.3f} {r['trie']:8.3f} {r['trie'] / r['grouped']:12.2f}  "
              f"{r['picked'].path} ({r['picked'].reason}){'' if ok else '   <- the slower'}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end; {'every pick the faster (within the slack)' if not wrong else f'{wrong} picks the slower'}")
    return 0 if not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
