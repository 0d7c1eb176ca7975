"""Benchmark the path expansions: 12 layers x 12 heads at max_order=2, rendered to LaTeX.

Targets (issue 3): ``expand_logits``, and ``expand_qk`` for a head of the last layer,
each including ``tensoralg.to_latex(expansion.to_tensor_sum())``, under 0.5 s.

Each case is timed as a user meets it (garbage collector on) and, as ``timeit`` does
by default, with the collector off; the verdict uses the first figure. Best of
``--repeat`` runs, each on a fresh expansion.

    python benchmarks/bench_derive.py [--layers 12] [--heads 12] [--max-order 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import time

from tensoralg import to_latex

from derivations.architecture import Architecture
from derivations.paths import expand_logits
from derivations.qk import expand_qk

TARGET_S = 0.5


def run_once(make) -> tuple[float, float, int, int]:
    """``(total s, expansion and sum s, terms, LaTeX characters)`` for one fresh expansion."""
    start = time.perf_counter()
    expansion = make()
    tensor_sum = expansion.to_tensor_sum()
    built = time.perf_counter()
    latex = to_latex(tensor_sum)
    return time.perf_counter() - start, built - start, len(expansion), len(latex)


def best_of(repeat: int, make, collect: bool) -> tuple[float, float, int, int]:
    was_enabled = gc.isenabled()
    runs = []
    try:
        for _ in range(repeat):
            gc.collect()
            (gc.enable if collect else gc.disable)()
            runs.append(run_once(make))
    finally:
        (gc.enable if was_enabled else gc.disable)()
    return min(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--max-order", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    arch = Architecture(args.layers, args.heads)
    last = args.layers - 1
    cases = {
        "expand_logits": lambda: expand_logits(arch, args.max_order),
        f"expand_qk L{last}H0": lambda: expand_qk(arch, last, 0, args.max_order),
    }
    print(f"{arch.describe()}, max_order={args.max_order}, best of {args.repeat}")
    for name, make in cases.items():
        total, build, n_terms, n_chars = best_of(args.repeat, make, collect=True)
        total_off, build_off, _, _ = best_of(args.repeat, make, collect=False)
        verdict = "ok" if total < TARGET_S else "OVER"
        print(
            f"  {name:<16} {n_terms:>7,} terms, {n_chars:>9,} LaTeX chars | "
            f"gc on: expand+sum {build:.3f} s + LaTeX {total - build:.3f} s = {total:.3f} s | "
            f"gc off: {build_off:.3f} + {total_off - build_off:.3f} = {total_off:.3f} s | "
            f"target {TARGET_S} s: {verdict}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
