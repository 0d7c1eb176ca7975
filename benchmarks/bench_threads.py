"""Threads on a busy machine: the thread policy against torch's default and against one thread.

The work: ``tcircuits verify`` of a 6-layer x 8-head model (d_model 256, d_head 32, layer norm,
MLPs, 32 tokens) at order 2 (3,424 terms, every check), the case where torch's default threads
collapsed 7x beside two busy processes (issue 25). Each run is a fresh process:

- ``torch default``: the same verification through the Python API with torch's default threads
  (one per core) and its default wait policy (threads spin before they sleep);
- ``policy``: ``tcircuits verify`` as a person runs it (the thread policy of numeric_check.model.threads);
- ``1 thread``: ``tcircuits verify --threads 1``.

Each is timed quiet and beside ``--busy`` processes that spin on a core each (default: as many as
there are cores), which are stopped when the benchmark ends. Medians of ``--repeats`` runs; the
ratio that matters is policy / 1 thread under load (at most 1.5).

    python benchmarks/bench_threads.py [--repeats 3] [--busy N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--layers", "6", "--heads", "8", "--d-model", "256", "--d-head", "32", "--d-vocab", "512", "--n-ctx", "32",
         "--layer-norm", "--mlp", "--max-order", "2", "--batch-size", "1", "--seq-len", "32", "--quiet", "--format", "json"]
CLI = [sys.executable, "-c", "from derivations.cli import main; raise SystemExit(main())", "verify", *FLAGS]
TORCH_DEFAULT = [sys.executable, "-c", """
import torch
from derivations.architecture import Architecture
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.verify import verify_logits
arch = Architecture(6, 8, positional="none", layer_norm=True, mlp=True)
model = CircuitModel.random(arch, d_model=256, d_head=32, d_vocab=512, n_ctx=32, seed=0, device="cpu")
tokens = torch.randint(0, 512, (1, 32), generator=torch.Generator().manual_seed(0))
assert verify_logits(model, tokens, max_order=2).passed
"""]
SPIN = [sys.executable, "-c", "import time\nend = time.time() + 900\nwhile time.time() < end: pass"]


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy processes beside the runs (default: one per core)")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")}
    runs = {"torch default": TORCH_DEFAULT, "policy": CLI, "1 thread": CLI + ["--threads", "1"]}
    results: dict[tuple[str, str], float] = {}
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} before; {args.repeats} runs each, medians")
    for state in ("quiet", "busy"):
        spinners = [subprocess.Popen(SPIN) for _ in range(args.busy if state == "busy" else 0)]
        try:
            if spinners:
                time.sleep(5)  # the load average starts to see them
            for name, command in runs.items():
                times = [timed(command, env) for _ in range(args.repeats)]
                results[state, name] = statistics.median(times)
                print(f"  {state:5} {name:13} {results[state, name]:6.2f} s  (runs: {', '.join(f'{t:.2f}' for t in times)})",
                      flush=True)
        finally:
            for p in spinners:
                p.kill()
                p.wait()
    busy, quiet = (lambda n: results["busy", n]), (lambda n: results["quiet", n])
    print(f"busy / quiet: torch default {busy('torch default') / quiet('torch default'):.1f}x, "
          f"policy {busy('policy') / quiet('policy'):.1f}x, 1 thread {busy('1 thread') / quiet('1 thread'):.1f}x")
    ratio = busy("policy") / busy("1 thread")
    print(f"under load: policy / 1 thread = {ratio:.2f} (target <= 1.5); torch default / policy = "
          f"{busy('torch default') / busy('policy'):.1f}x")
    return 0 if ratio <= 1.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
