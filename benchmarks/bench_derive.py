"""Benchmark the path expansions: 12 layers x 12 heads at max_order=2, rendered to LaTeX.

Targets (issue 3): ``expand_logits`` and ``expand_qk`` of layer 11, each including
``tensoralg.to_latex(expansion.to_tensor_sum())``, under 0.5 s each.

    python benchmarks/bench_derive.py [--layers 12] [--heads 12] [--max-order 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from tensoralg import to_latex

from derivations.architecture import Architecture
from derivations.paths import expand_logits
from derivations.qk import expand_qk

TARGET_S = 0.5


def best_of(repeat: int, fn) -> tuple[float, float, object]:
    """``(best total seconds, expansion-only seconds of that run, result)`` over ``repeat`` runs."""
    best = None
    for _ in range(repeat):
        start = time.perf_counter()
        expansion, tensor_sum = fn()
        built = time.perf_counter()
        latex = to_latex(tensor_sum)
        done = time.perf_counter()
        run = (done - start, built - start, (expansion, tensor_sum, latex))
        if best is None or run[0] < best[0]:
            best = run
    return best


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
        "expand_logits": lambda: _built(expand_logits(arch, args.max_order)),
        f"expand_qk L{last}H0": lambda: _built(expand_qk(arch, last, 0, args.max_order)),
    }
    print(f"{arch.describe()}, max_order={args.max_order}, best of {args.repeat}")
    failed = False
    for name, fn in cases.items():
        total, build, (expansion, tensor_sum, latex) = best_of(args.repeat, fn)
        ok = total < TARGET_S
        failed |= not ok
        print(
            f"  {name:<18} {len(expansion):>7,} terms  expand+sum {build:6.3f} s  "
            f"+ LaTeX {total - build:6.3f} s  = {total:6.3f} s  ({len(latex):,} chars)  "
            f"{'ok' if ok else 'OVER'} (target {TARGET_S} s)"
        )
    return 1 if failed else 0


def _built(expansion):
    return expansion, expansion.to_tensor_sum()


if __name__ == "__main__":
    raise SystemExit(main())
