"""Circuit analyses against TransformerLens on the same weights (single thread).

A 2-layer, 12-head attention-only model (d_model 768, d_head 64, d_vocab 50257) with
random weights is built as a TransformerLens ``HookedTransformer`` and converted with
:func:`numeric_check.conversion.adapters.from_transformer_lens`. Timed, median of a few repeats:

1. every head's ``W_OV`` eigenvalues (TL: ``model.OV.eigenvalues``);
2. every composition score, per mode (TL: ``all_composition_scores(mode)``);
3. every full OV circuit's eigenvalues ``W_U W_OV W_E`` (TL: ``(W_E @ OV @ W_U).eigenvalues``).

Printed: both times, the ratio (TL / ours: above 1 means we are faster), the largest
difference between the two results (eigenvalues compared as multisets; absolute, and
relative to the largest value), and each result's largest difference from a float64
computation of the same quantity. Run: ``python benchmarks/bench_circuits.py [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Callable

import torch

from numeric_check.conversion.adapters import from_transformer_lens
from numeric_check.circuits.ov_qk import ov_circuit_eigenvalues, ov_eigenvalues
from numeric_check.circuits.composition import composition_scores
from numeric_check.circuits.factored import eigenvalue_multiset_distance


def median_time(fn: Callable[[], object], repeats: int, min_seconds: float = 0.2) -> tuple[float, object]:
    """Median seconds per call over ``repeats`` samples, and the last result.

    One untimed warm-up call; a fast function is looped within each sample until a sample
    lasts about ``min_seconds``, so timer noise does not dominate.
    """
    start = time.perf_counter()
    result = fn()
    loops = max(1, int(min_seconds / max(time.perf_counter() - start, 1e-9)))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            result = fn()
        times.append((time.perf_counter() - start) / loops)
    return statistics.median(times), result


def eigen_difference(theirs: torch.Tensor, ours: torch.Tensor) -> tuple[float, float]:
    """Largest multiset distance over heads, absolute and relative to the largest modulus."""
    worst = max(
        eigenvalue_multiset_distance(theirs[l, h], ours[l, h]) for l in range(theirs.shape[0]) for h in range(theirs.shape[1])
    )
    return worst, worst / float(theirs.abs().max())


def build_models(seed: int):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2, n_heads=12, d_model=768, d_head=64, d_vocab=50257, n_ctx=1024,
        attn_only=True, normalization_type=None, seed=seed, device="cpu",
    )
    tl = HookedTransformer(cfg)
    tl.eval()
    return tl, from_transformer_lens(tl, dtype=torch.float32)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement (median reported)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    tl, ours = build_models(args.seed)
    print(f"model: {ours}")
    print(f"single thread, median of {args.repeats}; ratio = TL time / our time\n")
    rows = []

    def eigen_row(name, theirs_fn, ours_fn, reference_fn):
        t_tl, theirs = median_time(theirs_fn, args.repeats)
        t_us, ours = median_time(ours_fn, args.repeats)
        reference = reference_fn()
        rows.append((name, t_tl, t_us, *eigen_difference(theirs, ours),
                     eigen_difference(reference, theirs)[0], eigen_difference(reference, ours)[0]))

    eigen_row("W_OV eigenvalues, all heads", lambda: tl.OV.eigenvalues, lambda: ov_eigenvalues(ours),
              lambda: ov_eigenvalues(ours, dtype=torch.float64))
    for mode in "QKV":
        t_tl, theirs = median_time(lambda: tl.all_composition_scores(mode), args.repeats)
        t_us, got = median_time(lambda: composition_scores(ours, mode), args.repeats)
        reference = composition_scores(ours, mode, dtype=torch.float64)
        diff = float((theirs - got).abs().max())
        rows.append((f"composition scores {mode}", t_tl, t_us, diff, diff / float(theirs.abs().max()),
                     float((theirs - reference).abs().max()), float((got - reference).abs().max())))
    eigen_row("W_U W_OV W_E eigenvalues, all heads", lambda: (tl.W_E @ tl.OV @ tl.W_U).eigenvalues,
              lambda: ov_circuit_eigenvalues(ours), lambda: ov_circuit_eigenvalues(ours, dtype=torch.float64))

    print(f"{'measurement':38s} {'TL (s)':>8s} {'ours (s)':>8s} {'ratio':>7s} {'|TL-ours|':>10s} {'relative':>9s}"
          f" {'TL err':>9s} {'our err':>9s}")
    for name, t_tl, t_us, diff, rel, tl_err, our_err in rows:
        print(f"{name:38s} {t_tl:8.4f} {t_us:8.4f} {t_tl / t_us:6.2f}x {diff:10.2e} {rel:9.2e} {tl_err:9.2e} {our_err:9.2e}")
    print("\nTL err / our err: largest difference from the same quantity computed in float64 (both runs are float32).")

    # Agreement without float32 rounding: both libraries in float64 on the same weights.
    tl64 = copy.deepcopy(tl).to(torch.float64)
    checks = [
        ("W_OV eigenvalues", eigen_difference(tl64.OV.eigenvalues, ov_eigenvalues(ours, dtype=torch.float64))[0]),
        ("W_U W_OV W_E eigenvalues", eigen_difference((tl64.W_E @ tl64.OV @ tl64.W_U).eigenvalues,
                                                      ov_circuit_eigenvalues(ours, dtype=torch.float64))[0]),
    ]
    for mode in "QKV":
        diff = (tl64.all_composition_scores(mode) - composition_scores(ours, mode, dtype=torch.float64)).abs().max()
        checks.append((f"composition scores {mode}", float(diff)))
    print("\nagreement with TransformerLens, both in float64 (target 1e-5):")
    for name, diff in checks:
        print(f"  {name:38s} max |TL - ours| {diff:9.2e}  {'ok' if diff <= 1e-5 else 'OVER'}")


if __name__ == "__main__":
    main()
