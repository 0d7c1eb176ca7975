"""Benchmark: verifying the path expansion of a GPT-2-small-sized model, at orders 1 and 2.

The model: ``GPT2Config`` with 12 layers x 12 heads, d_model 768, d_head 64, MLPs, layer norm,
standard positions, d_vocab 50257 (n_positions 64), random weights from Hugging Face's own
initialisation (seed 0), converted by ``numeric_check.from_hf``; one sequence of 32 random
tokens. ``verify_logits`` at ``max_order`` 1 (1,094 terms) and 2 (51,782 terms), in float64 and
float32, on one thread, with every check on (sum over the kept terms, each term against its path
isolated through the model's hooks, the omitted part against the model's order-graded pass).

Printed per run: wall time (median of ``--repeats``), CPU time, the verification's own stages,
the number of terms, whether every check passed and the worst relative error, and the peak
resident memory *above what the process held before the run* (sampled every 10 ms from
``/proc/self/statm``), so that order 1 and order 2 can be compared: the verification streams
its terms (depth first through the shared trie, isolation in bounded chunks), so its memory
must not grow with the number of terms. A progress bar (tqdm, on stderr) follows the terms.

    python benchmarks/bench_scale.py [--orders 1 2] [--dtypes float64 float32] [--repeats N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numeric_check import from_hf, verify_logits  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
SEQ = 32


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


def gpt2_small(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=64)
    return GPT2LMHeadModel(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    parser.add_argument("--repeats", type=int, default=1, help="runs per configuration (the median is printed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = from_hf(gpt2_small(), dtype=torch.float64)
    tokens = torch.randint(0, 50257, (1, SEQ), generator=torch.Generator().manual_seed(0))
    print(f"model: {model}")
    print(f"tokens: 1 x {SEQ}; threads: {args.threads}; device: {args.device}")
    print(f"{'order':>5} {'dtype':>8} {'terms':>7} {'wall s':>8} {'cpu s':>8} {'peak MB':>8} {'passed':>6} {'worst rel':>10}  stages (s)")
    for order in args.orders:
        for dtype in args.dtypes:
            walls, cpus, peaks = [], [], []
            for _ in range(args.repeats):
                with PeakMemory() as memory:
                    t0, c0 = time.perf_counter(), time.process_time()
                    report = verify_logits(model, tokens, max_order=order, dtype=dtype, device=args.device,
                                           progress=progress_bar(f"order {order} {dtype}"))
                    walls.append(time.perf_counter() - t0)
                    cpus.append(time.process_time() - c0)
                peaks.append(memory.above_start / 2**20)
            worst = report.rel_error
            stages = ", ".join(f"{k} {v:.1f}" for k, v in report.timings.items())
            print(f"{order:>5} {dtype:>8} {len(report.terms):>7,} {statistics.median(walls):>8.1f} "
                  f"{statistics.median(cpus):>8.1f} {statistics.median(peaks):>8.0f} {str(report.passed):>6} "
                  f"{worst:>10.2e}  {stages}", flush=True)


if __name__ == "__main__":
    main()
