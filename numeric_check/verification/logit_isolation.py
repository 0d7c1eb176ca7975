"""Check 2 of :func:`~numeric_check.verification.verify.verify_logits`: each term against its path
isolated through the model's own hooks, compared before the unembedding.

The model's isolated streams arrive a group at a time (one copy's paths whose last heads are in
one layer: :func:`~numeric_check.verification.isolate.isolate_final_groups`). Each term's error
``ours - x`` is formed before the unembedding, where it is exactly equivalent (the logits are
linear in what reaches ``W_U``): the subtraction fused into the term's last product, written into
one buffer for the group (:meth:`LogitSpace.differences`), so that nothing of the group is
allocated twice and every step works on tensors that stay in the CPU's cache. A term passes on
the rigorous bound of its logit-space error, ``max |e·w| ≤ max‖e‖ · max‖w‖``, when that is within
the tolerance; otherwise (or with ``exact``) its largest logit-space error is computed exactly,
for all such terms in one screened pass (:class:`~numeric_check.verification.bounds.MaxAbsProduct`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from torch import Tensor

from derivations.paths import Path
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.hook_paths import Recording
from numeric_check.verification.evaluate import LogitEvaluator, LogitTermValue
from numeric_check.verification.isolate import isolate_final_groups
from numeric_check.verification.logit_space import LogitSpace
from numeric_check.verification.results import TermResult


def check_isolated(model: CircuitModel, rec: Recording, ev: LogitEvaluator, space: LogitSpace,
                   values: Sequence[LogitTermValue], paths: Sequence[Path], results: list[TermResult],
                   tolerance: tuple[float, float, float], exact: bool, chunk_bytes: int) -> None:
    """Check 2 for a chunk of terms (``values``, ``paths[k]`` that of ``values[k]``): one batched isolation
    pass through the model; sets each term's ``error_bound``, ``passed`` and, when its bound does not
    settle it, ``max_abs_error``. ``tolerance``: ``(atol, rtol, scale)``, a term's tolerance being
    ``atol + rtol · max(scale, its own largest logit)``."""
    atol, rtol, scale = tolerance
    tol = atol + rtol * scale
    unsettled: list[tuple[TermResult, Tensor, Tensor]] = []

    def settle(v: LogitTermValue, error: Tensor, bound: float, ours: Callable[[], Tensor]) -> None:
        r = results[v.index]
        r.error_bound = bound
        if not exact and bound <= tol:
            r.passed = True  # certified: every entry of the error is at most the bound
        else:
            unsettled.append((r, space.widened(error), ours()))

    for indices, x, bias in isolate_final_groups(model, rec, paths, chunk_bytes=chunk_bytes):
        group = [values[j] for j in indices]
        if bias or not all(space.ends_in_W_U(v) for v in group):  # b_U on a side: augmented inputs
            for v, xi in zip(group, x.unbind(0)):
                mine = space.aug(ev.parts(v))
                error = mine - space.of(xi, bias)
                settle(v, error, space.product.bound(error), lambda mine=mine: mine)
            continue
        errors = space.differences(ev, group, x)  # [n, batch, pos, d_model]; b_U on neither side
        for v, error, bound in zip(group, errors.unbind(0), space.product.bounds(errors)):
            settle(v, error, bound, lambda v=v: space.aug(ev.parts(v)))
    if unsettled:
        maxima = space.product.max_abs([t for _, error, mine in unsettled for t in (error, mine)])
        for j, (r, _, _) in enumerate(unsettled):
            r.max_abs_error, own = maxima[2 * j], maxima[2 * j + 1]
            r.passed = r.max_abs_error <= atol + rtol * max(scale, own)
