"""The companion's build time: ``tcircuits paper --out DIR`` (no PDF) on one thread, median of a few runs.

Each run is a fresh Python process (imports, the three shipped models analysed, 18 catalogue
derivations built and checked, the expansions verified on the models, 8 figures, 6 pages),
timed from start to exit, and CPU time (user + system) as reported for the child. The
target (issue 20) is under 60 s on one CPU core. Run: ``python benchmarks/bench_paper.py [--repeats 3] [--pdf]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

RUN = """
import argparse, sys
from numeric_check.cli.paper import register
parser = argparse.ArgumentParser()
register(parser.add_subparsers())
args = parser.parse_args(["paper", *sys.argv[1:]])
sys.exit(args.func(args))
"""

TARGET_S = 60.0


def one_run(pdf: bool) -> tuple[float, float]:
    """Wall and CPU seconds of one build in a fresh process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="bench-paper-") as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", RUN, "--out", out, "--quiet", *(["--pdf"] if pdf else [])],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pdf", action="store_true", help="also compile the PDF")
    args = parser.parse_args()
    runs = [one_run(args.pdf) for _ in range(args.repeats)]
    walls, cpus = [w for w, _ in runs], [c for _, c in runs]
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(f"tcircuits paper{' --pdf' if args.pdf else ''}, one thread, {args.repeats} runs: "
          f"wall {', '.join(f'{w:.1f}' for w in walls)} s (median {wall:.1f}); "
          f"CPU {', '.join(f'{c:.1f}' for c in cpus)} s (median {cpu:.1f}); target < {TARGET_S:.0f} s: "
          f"{'met' if wall < TARGET_S else 'NOT met'} (ratio {wall / TARGET_S:.2f} of the target)")


if __name__ == "__main__":
    main()
