"""How long a verification would take, said before it starts: terms counted symbolically, times a cost.

The terms of an expansion are counted without building one (:class:`~derivations.paths.LogitExpansion`
and :class:`~derivations.qk.QKExpansion` count by order), so a run of hours is refused in a moment,
with its estimate and the largest ``max_order`` that fits. The cost of a term is a per-term overhead
(the engine's work per group and per pass of check 2, shared by a group's terms: a group of order ``k``
has ``H^k`` of them, so it falls with the order, here as ``(2 / k)²``) plus its arithmetic (a
``batch·pos × d_model × d_head`` product) at a device's rate. The constants were measured by
``benchmarks/bench_scale.py`` and ``benchmarks/bench_order3.py`` (one CPU thread, 2026-11-28; GPT-2 small's
figures again on 2026-11-29):

- GPT-2-small size at order 2 (51,782 terms, 32 tokens): 4.1 s in float32 and 7.8 s in float64
  (79 and 151 µs a term; the model gives 94 and 174: an overestimate, on the safe side);
- the 6-layer x 8-head model of d_model 256 at order 3 (31,584 terms), float64: 1.6 s (51 µs a term;
  the model gives 55);
- GPT-2 small's shape at d_model 96, order 3 (1,667,462 terms), float32: 7.6 s (4.6 µs a term; the
  model gives 25: narrow models at high orders are overestimated, on the safe side);
- CUDA (one H100, before the batched evaluation): GPT-2-small size at order 2, 6.0 s in float32 and
  6.1 s in float64, 116 µs a term, nearly all overhead (kept until the next GPU check measures the
  batched one: an overestimate).

It is an estimate, good to a factor of about two (or over, as above): enough to tell seconds from hours.

>>> round(estimate_seconds(51_782, 1, 32, 768, 64, "float32", "cpu", threads=1), 1)
4.9
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from derivations.architecture import Architecture
from derivations.paths import LogitExpansion
from derivations.qk import QKExpansion
from numeric_check.errors import VerifyError
from numeric_check.model.config import resolve_dtype

# the choice of evaluation (choose_path), fitted to benchmarks/bench_paths.py (float64, every check, one CPU thread,
# 2026-11-29, load 5-6): trie / grouped CPU time 1.27 wide and shallow at order 2 (338 terms, 26 passes, 6.3 M a
# term), 6.1 narrow and deep at order 3, 2.1 with 32 heads at order 2; 0.55 with 2 heads a layer at every order
# (162 terms, 16 passes), 0.25 with one head a layer (512 terms, 256 passes): a term per pass costs the trie about
# as much as 1/32 of the grouped path's pass, and a term's product of 1 M entries as much again; measured again
# after the grouped path's rows were held head-major and its passes shared one sequence's patterns (load 1.0):
# 1.49, 10.7, 1.80, 0.78, 0.39, the same picks
TRIE_TERMS_PER_PASS = 32
TRIE_WORK_SCALE = 1 << 20

# device type -> (overhead s per term at order 2, float32; the same in float64; product flop/s float32; float64)
COSTS = {"cpu": (55e-6, 95e-6, 80e9, 40e9), "cuda": (110e-6, 110e-6, 20e12, 10e12)}


def estimate_seconds(n_terms: int, batch: int, pos: int, d_model: int, d_head: int, dtype, device, *,
                     order: int = 2, ranks: int = 1, threads: int | None = None) -> float:
    """The seconds ``n_terms`` terms of ``order`` heads would take on ``device`` (its type: ``cpu``,
    ``cuda``; others as the CPU), shared by ``ranks`` processes; on the CPU the arithmetic over
    ``threads`` (``None``: torch's now)."""
    kind = torch.device(device).type
    over32, over64, rate32, rate64 = COSTS.get(kind, COSTS["cpu"])
    wide = resolve_dtype(dtype) == torch.float64
    overhead = (over64 if wide else over32) * (2 / max(1, order)) ** 2  # a group's work, shared by more terms
    rate = (rate64 if wide else rate32) * (max(1, threads or torch.get_num_threads()) if kind != "cuda" else 1)
    per_term = overhead + 2 * batch * pos * d_model * d_head / rate
    return n_terms * per_term / max(1, ranks)


class PathChoice(NamedTuple):
    """How :func:`~numeric_check.verification.verify.verify_logits` evaluates a logits expansion: ``"grouped"``
    (:mod:`~numeric_check.verification.grouped`, check 2 by passes over prefix groups) or ``"trie"`` (the shared
    prefix trie, check 2 by batched isolation passes), and why."""

    path: str
    reason: str


def choose_path(n_terms: int, passes: int | None, work: int) -> PathChoice:
    """The cheaper evaluation of ``n_terms`` terms: ``passes``, the model passes check 2 of the grouped path
    makes over prefix groups (``None``: no check 2, whose passes are what the grouped path pays for), ``work``
    a term's narrowest product (positions x d_model x d_head). The grouped path costs about a pass's overhead
    per pass, the trie about a term's (more as a term's product grows): the trie when
    ``n_terms · (1 + work / TRIE_WORK_SCALE) < TRIE_TERMS_PER_PASS · passes`` (see :data:`TRIE_TERMS_PER_PASS`).

    >>> choose_path(512, 256, 131_072).path, choose_path(338, 26, 6_291_456).path
    ('trie', 'grouped')
    """
    if not passes:
        return PathChoice("grouped", "no pass of check 2 to pay for")
    weight = n_terms * (1 + work / TRIE_WORK_SCALE) / passes
    if weight < TRIE_TERMS_PER_PASS:
        return PathChoice("trie", f"{n_terms:,} terms over {passes:,} passes of check 2 weigh {weight:.1f} a pass, "
                                  f"under {TRIE_TERMS_PER_PASS}: the shared trie is cheaper")
    return PathChoice("grouped", f"{n_terms:,} terms over {passes:,} passes of check 2 weigh {weight:.1f} a pass, "
                                 f"at least {TRIE_TERMS_PER_PASS}: the grouped passes are cheaper")


def counts_by_order(arch: Architecture, max_order: int | None, qk: tuple[int, int] | None = None) -> dict[int, int]:
    """How many terms of each order the expansion has (of the logits, or of head ``qk``'s scores), counted
    without building it."""
    expansion = LogitExpansion(arch, max_order) if qk is None else QKExpansion(arch, qk[0], qk[1], max_order)
    return expansion.count_by_order()


def refuse_long(arch: Architecture, max_order: int | None, qk: tuple[int, int] | None, *, batch: int, pos: int,
                d_model: int, d_head: int, dtype, device, max_hours: float, ranks: int = 1) -> float:
    """The estimated seconds of the verification; a one-line :class:`VerifyError` before it starts
    when that is above ``max_hours``, with the count, the estimate and the largest order that fits."""
    def seconds(counts: dict[int, int]) -> float:
        return sum(estimate_seconds(n, batch, pos, d_model, d_head, dtype, device, order=k, ranks=ranks)
                   for k, n in counts.items())

    counts = counts_by_order(arch, max_order, qk)
    total = seconds(counts)
    if total <= max_hours * 3600:
        return total
    fits = [k for k in sorted(counts) if seconds({j: n for j, n in counts.items() if j <= k}) <= max_hours * 3600]
    advice = (f"max_order={fits[-1]} keeps {sum(n for j, n in counts.items() if j <= fits[-1]):,} terms "
              f"(about {duration(seconds({j: n for j, n in counts.items() if j <= fits[-1]}))})" if fits
              else "even the direct terms are too many")
    kind = torch.device(device).type
    where = f"{ranks} processes on {kind}" if ranks > 1 else kind
    more = "on more GPUs with torchrun" if kind == "cuda" else "on a GPU, or on several with torchrun"
    raise VerifyError(f"{sum(counts.values()):,} terms would take about {duration(total)} on {where} (an estimate, within "
                      f"about 2x), more than {max_hours:g} hours; {advice}; or run {more}, or raise max_hours (--max-hours)")


def duration(seconds: float) -> str:
    """``seconds`` in the unit a person reads: 40 s, 12 minutes, 3.4 hours, 9 days.

    >>> duration(42.0), duration(720.0), duration(12_240.0), duration(777_600.0)
    ('42 s', '12 minutes', '3.4 hours', '9 days')
    """
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} minutes"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.0f} days"
