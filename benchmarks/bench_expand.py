"""Benchmark the expansion of ``T = (Id⊗W_U) · Π_{l<L} (Id + Σ_{h<H} A^{l,h}⊗W_OV^{l,h}) · (Id⊗W_E)``.

Times, medians over repeats (``time.perf_counter``; a SymPy baseline that takes over a
second runs once; SymPy's cache is cleared before each run):

- full expansion for (L, H) = (2,12), (3,12), (4,12): tensoralg ``Product.expand`` against
  ``sympy.physics.quantum.TensorProduct`` with ``expand(tensorproduct=True)`` and against
  ``KroneckerProduct`` products combined term by term with ``combine_kronecker``
  (a baseline whose estimate for a size is over ``--limit`` seconds is skipped, with the
  estimate printed);
- 12 layers x 12 heads truncated at order 2 (9,649 terms);
- ``to_latex`` of the 2,197-term sum against ``sympy.latex(expr.to_sympy())``;
- ``str`` of that sum (the one text printer) and ``parse`` of the text back.

Targets (issue 2): (3,12) at least 25x faster than TensorProduct and 200x faster than
KroneckerProduct; 12x12 at order 2 under 0.3 s; the LaTeX under 0.3 s.

    python benchmarks/bench_expand.py [--repeat 7] [--limit 60]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Callable

import sympy as sp
from sympy.core.cache import clear_cache
from sympy.matrices.expressions.kronecker import combine_kronecker
from sympy.physics.quantum import TensorProduct

from tensoralg import parse, to_latex

SIZES = [(2, 12), (3, 12), (4, 12)]
TARGET_TP, TARGET_KP, TARGET_TRUNCATED_S, TARGET_LATEX_S = 25, 200, 0.3, 0.3


def label(layer: int, h: int) -> str:
    return f"L{layer}H{h}"


def transformer_text(n_layers: int, n_heads: int) -> str:
    """The product in the text language, last layer leftmost."""
    layers = [
        "(Id ⊗ Id + " + " + ".join(f"A^{{{label(l, h)}}} ⊗ W_OV^{{{label(l, h)}}}" for h in range(n_heads)) + ")"
        for l in reversed(range(n_layers))
    ]
    return "(Id ⊗ W_U)" + "".join(layers) + "(Id ⊗ W_E)"


def tensor_product_baseline(n_layers: int, n_heads: int) -> Callable[[], int]:
    """``TP(Id, W_U) Π_l (1 + Σ_h TP(A, W)) TP(Id, W_E)`` expanded; returns the term count.

    The identity term of a layer is the scalar 1 (``TP(Id, Id)`` twice in a row makes
    SymPy 1.14 fail on ``TP(Id, Id)**2``).
    """
    nc = lambda name: sp.Symbol(name, commutative=False)  # noqa: E731
    expr = TensorProduct(nc("Id"), nc("W_U"))
    for l in reversed(range(n_layers)):
        heads = [TensorProduct(nc(f"A_{label(l, h)}"), nc(f"W_OV_{label(l, h)}")) for h in range(n_heads)]
        expr = expr * (1 + sp.Add(*heads))
    expr = expr * TensorProduct(nc("Id"), nc("W_E"))
    return lambda: len(sp.Add.make_args(expr.expand(tensorproduct=True)))


def kronecker_baseline(n_layers: int, n_heads: int) -> Callable[[], int]:
    """Every product of ``KroneckerProduct`` factors, each combined by ``combine_kronecker``
    (term by term: SymPy 1.14 returns a wrong term when given an expanded sum), then summed."""
    n, d, v = sp.symbols("n_ctx d_model d_vocab", positive=True, integer=True)
    kp = sp.KroneckerProduct
    factors = [[kp(sp.Identity(n), sp.MatrixSymbol("W_U", v, d))]]
    for l in reversed(range(n_layers)):
        heads = [kp(sp.MatrixSymbol(f"A^{label(l, h)}", n, n), sp.MatrixSymbol(f"W_OV^{label(l, h)}", d, d))
                 for h in range(n_heads)]
        factors.append([kp(sp.Identity(n), sp.Identity(d))] + heads)
    factors.append([kp(sp.Identity(n), sp.MatrixSymbol("W_E", d, v))])

    def run() -> int:
        terms = [combine_kronecker(sp.MatMul(*choice)) for choice in itertools.product(*factors)]
        return len(sp.MatAdd(*terms).args)

    return run


def timed(fn: Callable[[], object], repeat: int, slow_s: float = 1.0) -> tuple[float, object]:
    """Median seconds over ``repeat`` runs (one run if the first takes over ``slow_s``)."""
    times, result = [], None
    for i in range(repeat):
        clear_cache()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        if i == 0 and times[0] > slow_s:
            break
    return statistics.median(times), result


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f} ms" if seconds < 1 else f"{seconds:8.2f} s "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7, help="runs per timing (median); default 7")
    parser.add_argument("--limit", type=float, default=60.0, help="skip a baseline estimated over this many seconds")
    args = parser.parse_args(argv)

    print("Full expansion of (Id⊗W_U) · Π_l (Id + Σ_h A⊗W_OV) · (Id⊗W_E)   (median times)")
    print(f"{'(L,H)':>7} {'terms':>6} {'tensoralg':>11} {'TensorProduct':>13} {'ratio':>7} {'KroneckerProduct':>16} {'ratio':>7}")
    per_term: dict[str, float] = {}
    ratios: dict[tuple, dict[str, float]] = {}
    notes: list[str] = []
    for n_layers, n_heads in SIZES:
        product = parse(transformer_text(n_layers, n_heads))
        ours, expanded = timed(product.expand, args.repeat)
        terms = len(expanded)
        if terms != (1 + n_heads) ** n_layers:
            raise RuntimeError(f"tensoralg gave {terms} terms for ({n_layers},{n_heads})")
        row = [f"{f'({n_layers},{n_heads})':>7} {terms:>6} {fmt(ours):>11}"]
        for name, make in (("TensorProduct", tensor_product_baseline), ("KroneckerProduct", kronecker_baseline)):
            width = 13 if name == "TensorProduct" else 16
            estimate = per_term.get(name, 0.0) * terms
            if estimate > args.limit:
                row.append(f"{'skipped':>{width}} {'':>7}")
                notes.append(f"{name} skipped at ({n_layers},{n_heads}): estimated {estimate:.0f} s "
                             f"(its time per term at the smaller size) > --limit {args.limit:.0f} s")
                continue
            theirs, count = timed(make(n_layers, n_heads), args.repeat)
            if count != terms:
                raise RuntimeError(f"{name} gave {count} terms for ({n_layers},{n_heads}), tensoralg {terms}")
            per_term[name] = theirs / terms
            ratios.setdefault((n_layers, n_heads), {})[name] = theirs / ours
            row.append(f"{fmt(theirs):>{width}} {theirs / ours:6.0f}x")
        print(" ".join(row))
    for note in notes:
        print("  " + note)

    truncated = parse(transformer_text(12, 12))
    seconds, expanded = timed(lambda: truncated.expand(max_order=2), args.repeat)
    print(f"\n12 layers x 12 heads at max_order=2: {len(expanded)} terms in {fmt(seconds).strip()}")

    s = parse(transformer_text(3, 12)).expand()
    ours, text = timed(lambda: to_latex(s), args.repeat)
    start = time.perf_counter()
    sympy_expr = s.to_sympy()
    conversion = time.perf_counter() - start
    theirs, _ = timed(lambda: sp.latex(sympy_expr), args.repeat)
    print(f"to_latex of the {len(s)}-term sum: {fmt(ours).strip()} ({len(text)} characters); "
          f"sympy.latex(expr.to_sympy()): {fmt(theirs).strip()} (+ {fmt(conversion).strip()} to convert), "
          f"{theirs / ours:.0f}x")
    printed, text = timed(lambda: str(s), args.repeat)  # the one text printer (issue 19)
    back, _ = timed(lambda: parse(text), max(1, args.repeat // 3))
    print(f"str of the {len(s)}-term sum: {fmt(printed).strip()} ({len(text)} characters); "
          f"parse of that text back: {fmt(back).strip()}")

    print("\nTargets:")
    checks = [
        ("(3,12) vs TensorProduct", ratios.get((3, 12), {}).get("TensorProduct"), f">= {TARGET_TP}x", TARGET_TP),
        ("(3,12) vs KroneckerProduct", ratios.get((3, 12), {}).get("KroneckerProduct"), f">= {TARGET_KP}x", TARGET_KP),
    ]
    for what, ratio, target, needed in checks:
        verdict = "not measured" if ratio is None else ("met" if ratio >= needed else "MISSED")
        print(f"  {what:<32} {'-' if ratio is None else f'{ratio:.0f}x':>8}  target {target:<8} {verdict}")
    for what, value, limit in (("12x12 at order 2", seconds, TARGET_TRUNCATED_S), ("LaTeX of 2,197 terms", ours, TARGET_LATEX_S)):
        verdict = "met" if value < limit else "MISSED"
        print(f"  {what:<32} {fmt(value).strip():>8}  target < {limit} s {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
