"""Benchmark: verifying the path expansion of a GPT-2-small-sized model, at orders 1 and 2.

The model: ``GPT2Config`` with 12 layers x 12 heads, d_model 768, d_head 64, MLPs, layer norm,
standard positions, d_vocab 50257 (n_positions 64), random weights from Hugging Face's own
initialisation (seed 0), converted by ``numeric_check.from_hf``; one sequence of 32 random
tokens. ``verify_logits`` at ``max_order`` 1 (1,094 terms) and 2 (51,782 terms), in float64 and
float32, on one thread, with every check on (sum over the kept terms, each term against its path
isolated through the model's hooks, the omitted part against the model's order-graded pass).

Printed per run: wall time (median of ``--repeats``), CPU time, the verification's own stages,
the number of terms and terms per second, whether every check passed and the worst relative error, and the peak
resident memory *above what the process held before the run* (sampled every 10 ms from
``/proc/self/statm``), so that order 1 and order 2 can be compared: the verification streams
its terms (depth first through the shared trie, isolation in bounded chunks), so its memory
must not grow with the number of terms. A progress bar (tqdm, on stderr) follows the terms.
Each (order, dtype) runs in a fresh process, so that one configuration's freed memory (kept by
the allocator) cannot hide the next one's peak; the peak is that of its first run.

Ratios are against the named baselines in ``BASELINES`` (figures measured on this machine
before the work they name, one thread): wall time and peak memory, baseline / now.

    python benchmarks/bench_scale.py [--orders 1 2 3] [--dtypes float64 float32] [--repeats N] [--device cpu|cuda]
                                     [--d-model D --d-vocab V]

``--d-model 96 --d-vocab 512`` keeps GPT-2 small's shape (12 x 12 heads, 1,667,462 terms at order 3) at a
width whose arithmetic a CPU thread does in moments: what is left is the engine's work per group and per
term, which is what a GPU waits on (its arithmetic at d_model 768 is milliseconds).

Order 3 (1,667,462 terms) is meant for a GPU (issue 26's target: <= 10 s float32 on one H100); on one
CPU thread it takes minutes. Issue 26's targets are printed beside each figure they concern.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from derivations.paths import LogitExpansion  # noqa: E402
from numeric_check import from_hf, verify_logits  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
SEQ = 32
# (order, dtype, d_model) -> (wall s, peak MB above start): medians of 3 on this machine (2 shared cores, one thread)
BASELINES = {
    # as filed in issue 14 (peak as reported there, not measured by this script)
    "issue 14 (before)": {(2, "float64", 768): (76.5, 4700.0), (1, "float64", 768): (4.4, None)},
    # commit 320cdd9 (from_hf, Constant hooks, plan caching), measured by this script in a clean tree
    "320cdd9": {(1, "float64", 768): (3.0, 655.0), (1, "float32", 768): (1.8, 895.0),
                (2, "float64", 768): (38.4, 1199.0), (2, "float32", 768): (24.1, 1254.0)},
    # commit aa9086f (grouped evaluation, check 2 still a value, a path and copies per term), d_model 96, vocab 512
    "aa9086f": {(2, "float32", 96): (1.1, None), (3, "float32", 96): (38.6, None)},
}


def resident_bytes() -> int:
    """The process's resident memory now (Linux ``/proc/self/statm``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except OSError:
        return 0


class PeakMemory:
    """The largest resident memory seen while the block runs, above what it started with."""

    def __enter__(self) -> "PeakMemory":
        self.start = self.peak = resident_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, resident_bytes())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, resident_bytes())

    @property
    def above_start(self) -> int:
        return self.peak - self.start


def progress_bar(label: str):
    """A ``progress(stage, done, total)`` callback drawing a tqdm bar on stderr."""
    from tqdm import tqdm

    bar = None

    def progress(stage: str, done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=f"{label} {stage}", unit="term", mininterval=0.5, file=sys.stderr, leave=False)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return progress


def gpt2_small(seed: int = 0, d_model: int = 768, vocab: int = 50257):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=12, n_head=12, n_embd=d_model, vocab_size=vocab, n_positions=64)
    return GPT2LMHeadModel(config).eval()


def run_one(order: int, dtype: str, repeats: int, device: str, d_model: int = 768, vocab: int = 50257) -> dict:
    """``repeats`` runs of one configuration in this process: median wall and CPU time, the first
    run's peak memory above its start, and the verdict of the last run."""
    model = from_hf(gpt2_small(d_model=d_model, vocab=vocab), dtype=torch.float64)
    tokens = torch.randint(0, vocab, (1, SEQ), generator=torch.Generator().manual_seed(0))
    walls, cpus, peaks = [], [], []
    limit = max(1_000_000, LogitExpansion(model.arch, order).n_terms)  # order 3: 1,667,462 terms, past the default
    for _ in range(repeats):
        with PeakMemory() as memory:
            t0, c0 = time.perf_counter(), time.process_time()
            report = verify_logits(model, tokens, max_order=order, dtype=dtype, device=device, limit=limit,
                                   progress=progress_bar(f"order {order} {dtype}"))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        peaks.append(memory.above_start / 2**20)
    out = {"model": str(model), "terms": len(report.terms), "wall": statistics.median(walls), "walls": walls, "cpus": cpus,
           "cpu": statistics.median(cpus), "peak": peaks[0], "passed": report.passed, "rel": report.rel_error,
           "stages": {k: round(v, 2) for k, v in report.timings.items()}}
    if device.startswith("cuda"):
        out["stages"]["cuda peak GB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


# targets, (order, dtype, device type, d_model) -> seconds: wall on one H100 for CUDA; CPU seconds on one CPU
# thread (the machine is shared: its wall time says more about the other jobs than about this one)
TARGETS = {(2, "float32", "cuda", 768): 0.3, (2, "float64", "cuda", 768): 0.6, (3, "float32", "cuda", 768): 10.0,
           (2, "float32", "cpu", 768): 6.0, (2, "float64", "cpu", 768): 10.0, (3, "float32", "cpu", 96): 13.0}


def ratios(order: int, dtype: str, wall: float, peak: float, device: str = "cpu", d_model: int = 768,
           cpu: float | None = None) -> str:
    """Baseline / now, for each named baseline that measured this configuration; the target, if any (on the
    CPU judged by ``cpu`` seconds when given)."""
    out = []
    kind = device.split(":")[0]
    target = TARGETS.get((order, dtype, kind, d_model))
    if target is not None:
        spent, what = (cpu, "CPU s") if kind == "cpu" and cpu is not None else (wall, "s")
        out.append(f"target <= {target:g} {what}: {'met' if spent <= target else 'NOT met'}")
    for name, figures in BASELINES.items():
        if (order, dtype, d_model) in figures and device == "cpu":
            base_wall, base_peak = figures[(order, dtype, d_model)]
            text = f"{base_wall / wall:.1f}x faster"
            if base_peak is not None and peak > 0:
                text += f", {base_peak / peak:.1f}x less memory"
            out.append(f"{text} than {name}")
    return "; ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    parser.add_argument("--repeats", type=int, default=1, help="runs per configuration (the median is printed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--d-model", type=int, default=768, help="the width (768: GPT-2 small; 96: its shape, narrow)")
    parser.add_argument("--d-vocab", dest="vocab", type=int, default=50257)
    parser.add_argument("--one", nargs=2, metavar=("ORDER", "DTYPE"), help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(run_one(int(args.one[0]), args.one[1], args.repeats, args.device, args.d_model, args.vocab)))
        return
    print(f"tokens: 1 x {SEQ}; threads: {args.threads}; device: {args.device}; repeats: {args.repeats}; "
          f"d_model {args.d_model}, vocab {args.vocab}")
    print(f"{'order':>5} {'dtype':>8} {'terms':>7} {'wall s':>8} {'cpu s':>8} {'terms/s':>8} {'peak MB':>8} {'passed':>6} "
          f"{'worst rel':>10}  stages (s); ratios")
    failed = []
    for order in args.orders:
        for dtype in args.dtypes:
            command = [sys.executable, __file__, "--one", str(order), dtype, "--repeats", str(args.repeats),
                       "--threads", str(args.threads), "--device", args.device, "--d-model", str(args.d_model),
                       "--d-vocab", str(args.vocab)]
            child = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
            r = json.loads(child.stdout.strip().splitlines()[-1])
            stages = ", ".join(f"{k} {v:.1f}" for k, v in r["stages"].items())
            print(f"{order:>5} {dtype:>8} {r['terms']:>7,} {r['wall']:>8.1f} {r['cpu']:>8.1f} {r['terms'] / r['wall']:>8,.0f} "
                  f"{r['peak']:>8.0f} {str(r['passed']):>6} {r['rel']:>10.2e}  {stages}; "
                  f"{ratios(order, dtype, r['wall'], r['peak'], args.device, args.d_model, r['cpu'])}"
                  + (f"; CPU s of each run: {', '.join(f'{c:.2f}' for c in r['cpus'])} (the first makes the model's "
                     "constants, kept for the next)" if len(r["cpus"]) > 1 else ""), flush=True)
            if not r["passed"]:
                failed.append((order, dtype))
    print(f"model: {r['model']}")
    if failed:
        raise SystemExit(f"verification failed for {failed}: the figures above are not of a correct run")



# --- path attribution (issue 17): one target, every order-2 term ranked, the top 50 isolated --------------

ATTRIBUTION_TARGET = 464  # one token id of the vocabulary (any: the cost does not depend on which)
ATTRIBUTION_TOP = 50


def bench_attribution(repeats: int, device: str, baseline: bool) -> None:
    """``numeric_check.attribute`` on the model above (converted in float32, the benchmark's dtype), the
    same 32-token prompt, one target at the last position, order 2 (51,782 terms ranked), the top 50
    isolated through the model, float32: wall time (median of ``repeats``), stages, verdict and errors.
    With ``baseline``, the same contributions taken from the verification's own evaluator (every entry of
    every term, then the target's column), once, for the ratio and to compare the figures."""
    from numeric_check import attribute

    model = from_hf(gpt2_small(), dtype=torch.float32)
    tokens = torch.randint(0, 50257, (1, SEQ), generator=torch.Generator().manual_seed(0))
    walls, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = attribute(model, tokens, target=ATTRIBUTION_TARGET, max_order=2, top=ATTRIBUTION_TOP,
                           dtype="float32", device=device)
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    stages = ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items())
    print(f"attribution, order 2, float32, {len(result.terms):,} terms, top {result.n_checked} isolated: "
          f"median {wall:.2f} s of {repeats} ({', '.join(f'{w:.2f}' for w in walls)}); target <= 5 s")
    print(f"  stages (last run, s): {stages}")
    print(f"  passed {result.passed}: |sum + remainder - logit| {result.sum_error:.2e} (tolerance {result.tolerance:.2e}), "
          f"isolation max |error| {result.isolation_error:.2e}; remainder {result.remainder:+.4g}")
    if baseline:
        t0 = time.perf_counter()
        entries = _evaluator_entries(model, tokens, device)
        base = time.perf_counter() - t0
        ours = {t.label: t.contribution for t in result.terms}
        worst = max(abs(ours[label] - value) for label, value in entries.items())
        print(f"  baseline: the verification's evaluator (every entry of every term) {base:.2f} s once, "
              f"{base / wall:.1f}x the attribution; the same contributions within {worst:.2e}")
    if not result.passed:
        raise SystemExit("attribution failed its checks: the figures above are not of a correct run")


def _evaluator_entries(model, tokens, device) -> dict[str, float]:
    """Every order-2 term's entry at the target, from LogitEvaluator's values (after the same set-up)."""
    from derivations.paths import expand_logits
    from numeric_check.verification.hook_paths import record
    from numeric_check.verification.bind import Binder
    from numeric_check.verification.evaluate import LogitEvaluator

    work = model.working_copy("float32", device)
    rec = record(work, tokens)
    terms = list(expand_logits(work.arch, 2))
    ev = LogitEvaluator(Binder(work, rec), terms)
    column = work.W_U[ATTRIBUTION_TARGET]
    out = {}
    for v in ev.values():
        y = ev.apply_left(v.y[:, -1:], v.left[:-1]) * v.coeff  # the last position, before W_U
        out[terms[v.index].label] = float(y[0, 0] @ column) if v.left[-1][0].name == "W_U" else float(y[0, 0, 0] * work.b_U[ATTRIBUTION_TARGET])
    return out


def attribution_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="path attribution at GPT-2-small size (issue 17)")
    parser.add_argument("--attribution", action="store_true", help="run this benchmark instead of the verification's")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--baseline", action="store_true", help="also time the verification's evaluator once")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"tokens: 1 x {SEQ}; threads: {args.threads}; device: {args.device}")
    bench_attribution(args.repeats, args.device, args.baseline)


if __name__ == "__main__":
    if "--attribution" in sys.argv[1:]:
        attribution_main(sys.argv[1:])
    else:
        main()
