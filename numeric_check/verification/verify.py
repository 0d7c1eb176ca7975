"""Verifying an expansion against a real model: the logits, or one head's attention scores.

:func:`verify_logits` binds every term of :func:`derivations.paths.expand_logits` to the
model's weights and to the patterns, layer-norm scales and MLP outputs of a real forward
pass, and runs three checks:

1. **sum** — the sum of all terms equals the model's logits (relative error ≤ ``rtol``,
   by default 1e-9 in float64, 1e-4 in float32: :func:`default_rtol`);
2. **isolation** — each kept term equals the same path computed by the model itself with
   hooks (:mod:`numeric_check.verification.isolate`: frozen patterns and scales, only the path's source
   and heads on, residual connections dropped at the path's layers) — not by our evaluator;
3. **truncation** — at ``max_order=k``, the model's logits minus the kept terms equal the
   omitted terms, computed by the model (an order-graded forward pass), not by the expansion.

:func:`verify_qk` does the same for one head's pre-softmax scores (compared on the causal
lower triangle). Both return a :class:`VerifyReport` (``passed``, ``max_abs_error``,
``rel_error``, ``terms``, ``checks``, ``to_json()``, ``to_markdown()``).

Tolerances: a check passes when its largest absolute error is at most
``atol + rtol · scale``, ``scale`` the largest absolute value of the reference (the
logits or scores; for a term, the larger of that and the term's own); ``atol=None`` is 0.
When the terms are more than ``CANCELLING`` (64) times larger than the reference (for
logits by a rigorous bound on their entries), they cancel, and their sum is rounded at
their scale: check 1 (for logits check 3 too) is then relative to the largest term, and says so.

With layer norm the expansion treats each scale as a frozen diagonal factor, which is
exact when the residual stream is centred: the working copy's writing weights are
centred in the verification dtype (see :meth:`~numeric_check.model.circuit_model.CircuitModel.working_copy`; this does not change what
the model computes).

>>> from derivations.architecture import Architecture
>>> from numeric_check.model.circuit_model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2, layer_norm=True), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0)
>>> report = verify_logits(model, torch.tensor([[1, 2, 3, 4]]))
>>> report.passed, len(report.terms), report.rel_error < 1e-12
(True, 9, True)
>>> report.terms[5].label, report.terms[5].heads
('tok→L0H0→L1H0', ((0, 0), (1, 0)))
"""

from __future__ import annotations

import logging
import math
import time
from itertools import groupby
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from derivations.paths import LogitExpansion, PathTerm, expand_logits
from derivations.qk import QKExpansion, QKTerm, expand_qk
from numeric_check.errors import ExpansionMismatch, VerifyError
from numeric_check.model.circuit_model import CircuitModel, max_abs, norm_of, widened
from numeric_check.verification.hook_paths import Recording
from numeric_check.model.hooks import block_hook
from numeric_check.verification.evaluate import LogitEvaluator, LogitSum
from numeric_check.verification.evaluate_qk import QKEvaluator
from numeric_check.verification.grouped import GroupEvaluator, GroupSum, PathGroup, plan_groups, plan_paths
from numeric_check.verification.budget import PathChoice, choose_path
from numeric_check.verification.grouped_isolation import GroupedIsolation, PrefixPasses
from numeric_check.verification.logit_space import LogitSpace
from numeric_check.verification.isolate import graded_final, graded_qk, isolate_qk
from numeric_check.verification.distributed import Shard, qk_prefix
from numeric_check.verification.logit_isolation import HeadMaps, Settlement, check_isolated
from numeric_check.verification.results import CheckResult, TermResult, TermTable, VerifyReport
from numeric_check.verification.shared import (  # noqa: F401 - chunk_for, default_rtol, MIN_CHUNK_BYTES: public here too
    Progress, _checked, check_no_overflow, check_terms_finite, _cyclic_gc_paused, _relative, _report,
    _resolve_expansion, _result, _Setup, _setup, _shrinking, _tick, chunk_for, default_rtol, MIN_CHUNK_BYTES, widen,
)

LOG = logging.getLogger(__name__)
FULL_LIMIT = 100_000  # the most terms evaluated for check 1 when a truncated expansion omits some
CANCELLING = 64  # terms this many times larger than the logits or scores: their sum cancels
HELD_FRACTION = 4  # a flush when the pending terms' values hold this fraction of the chunk
COPY_FACTOR = 6  # or when their isolation copies (a stream per layer each) would hold 1/COPY_FACTOR of it (order 3 of
# 6 x 8 heads, d_model 256: peak RSS 0.99 GB with 1, 0.75 with 2, 0.64 with 4, 0.56 with 8, order 2 0.50; GPT-2
# small order 2 float64: 13 flushes with none, 39 with 4, 85 with 8, +3% and +11% CPU time)
PASS_FRACTION = 16  # a pass of check 2 over a prefix group's copies holds at most this fraction of the chunk (order 3 of
# 6 x 8 heads, d_model 256, float64: peak RSS 0.55 GB with 1/2, 0.47 with 1/16, 0.43 with 1/32; CPU time 1.83, 1.85, 1.90 s)
EXACT_LIMIT = 2**31  # terms x batch x pos x d_vocab x d_model up to which errors are computed exactly by default


def _full_terms(build, n_kept: int, n_full: int, notes: list[str]):
    """Every term of the untruncated expansion (for check 1), or ``None`` when too many."""
    if n_full == n_kept:
        return None
    if n_full > max(FULL_LIMIT, n_kept):
        notes.append(f"check 1 (sum) skipped: the untruncated expansion has {n_full:,} terms, more than "
                     f"{max(FULL_LIMIT, n_kept):,}; check 3 compares the kept terms with the model's omitted part instead")
        return False
    return build(None)


# --- logits ---------------------------------------------------------------------------------


def verify_logits(
    model: CircuitModel,
    tokens: Tensor | Iterable,
    max_order: int | None = None,
    dtype: str | torch.dtype = torch.float64,
    device: str | torch.device | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    *,
    isolation: bool = True,
    expansion: LogitExpansion | None = None,
    limit: int = 1_000_000,
    progress: Progress | None = None,
    chunk_bytes: int | None = None,
    exact_errors: bool | None = None,
    distributed: bool | None = None,
) -> VerifyReport:
    """Check the path expansion of the logits against ``model`` on ``tokens`` (see the module docstring).

    ``tokens``: ids ``[batch, pos]`` or ``[pos]``. ``max_order`` keeps paths through at most
    that many heads (check 3 then covers the rest). The model is copied to ``dtype`` and
    ``device`` (``None``: CUDA when available, else CPU); the original is never modified.
    Every comparison is made before the unembedding, where it is exactly equivalent (the
    logits are ``x W_Uᵀ + c b_U``, linear in what reaches ``W_U``): the model's forward passes
    stop at ``ln_final``'s output, and only the differences are unembedded, for their largest
    entries (:class:`~numeric_check.verification.bounds.MaxAbsProduct`: float64 figures from a bfloat16 or
    float32 screen). Term norms come from the Gram matrix ``W_Uᵀ W_U`` (in ``dtype``); it and the screen's
    ``W_U`` are kept with ``model`` for its next verification while ``W_U`` and ``b_U`` are unchanged
    (:mod:`~numeric_check.verification.constants`). Terms through heads are evaluated by groups or through the
    shared prefix trie, whichever :func:`~numeric_check.verification.budget.choose_path` finds cheaper (logged).

    ``isolation=False`` skips check 2 (a batched forward pass of the model per chunk of
    terms, patterns frozen so that queries and keys are never computed). ``chunk_bytes``: the
    activations of one such pass (``None``: :func:`chunk_for` the device, sized to a GPU's free
    memory); when the device runs out of memory in the middle, the verification starts again with a
    chunk a quarter the size (the report's notes say so), and below 1 MiB stops with a
    :class:`~numeric_check.errors.VerifyError` naming the chunk and the CPU. A logit-space
    error ``e W_Uᵀ`` is certified by the rigorous bound ``max |e·w| ≤ max‖e‖ · max‖w‖`` when
    that is within the tolerance: for a term of check 2 it is reported as ``error_bound``
    (``max_abs_error`` left ``None``), for checks 1 and 3 as ``max_abs_error`` with
    ``bounded=True`` (shown as "≤"). Otherwise, or when ``exact_errors``, the error is
    computed exactly (one screened unembedding per term). ``exact_errors=None`` computes
    exactly when cheap (``terms·batch·pos·d_vocab·d_model ≤ EXACT_LIMIT``, about a second of
    products). Pass/fail is the same either way. ``rtol=None`` is :func:`default_rtol` of
    ``dtype``. ``expansion`` may be given (built for ``model.arch``); ``limit`` bounds the
    terms built. ``progress(stage, done, total)`` is called as terms are checked (this rank's).

    ``distributed``: shard the terms over the ``torch.distributed`` ranks (``None``: when it is
    initialised with more than one rank, as under ``torchrun``): every rank must call this with the
    same arguments; each evaluates and isolates a disjoint share of the terms' prefixes, the sums and
    largest terms are reduced, and every rank returns the whole report
    (:mod:`~numeric_check.verification.distributed`; a rank that stops: a one-line :class:`VerifyError`).

    Raises :class:`~numeric_check.errors.ModelInputError` (tokens),
    :class:`~numeric_check.errors.WeightError` (NaN/Inf weights),
    :class:`~numeric_check.errors.DeviceError`, :class:`ExpansionMismatch`,
    :class:`~derivations.errors.TooManyTerms` (suggesting a ``max_order``).

    >>> from derivations.architecture import Architecture
    >>> model = CircuitModel.random(Architecture(2, 2, biases=True), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=1)
    >>> r = verify_logits(model, [[1, 2, 3]], max_order=1)
    >>> [(c.name, c.passed) for c in r.checks]
    [('sum', True), ('isolation', True), ('truncation', True)]
    """
    arch = getattr(model, "arch", None)
    build = lambda k: expand_logits(model.arch, k, limit=limit)  # noqa: E731
    _checked(model)
    expansion = _resolve_expansion(expansion, LogitExpansion, arch, max_order, build)
    max_order, shard, s = expansion.max_order, Shard.current(distributed), _setup(model, tokens, dtype, device, atol, rtol)
    if s.model.arch.logit_softcap is not None:
        s.notes.append(f"the logits are expanded and checked before the final soft-cap c·tanh(x/c), c = {s.model.arch.logit_softcap:g}: "
                       "the cap is not linear, so the expansion stops at the quantity it acts on (the model's output is the capped value)")
    with torch.no_grad(), _cyclic_gc_paused():
        return _shrinking(lambda chunk: _verify_logits(s, expansion, build, isolation, progress, chunk, exact_errors, shard),
                          chunk_bytes, s)


def _exact_by_default(rec: Recording, model: CircuitModel, n_terms: int) -> bool:
    """Whether every term's logit-space error is cheap enough to compute exactly: each costs about
    one float64 unembedding of the batch (an error of rounding size leaves the float32 screen
    nothing to rule out)."""
    return max(1, n_terms) * rec.n_batch * rec.n_pos * model.cfg.d_vocab * model.cfg.d_model <= EXACT_LIMIT


def _verify_logits(s: _Setup, expansion: LogitExpansion, build, isolation: bool, progress, chunk_bytes: int,
                   exact_errors: bool | None, shard: Shard | None = None) -> VerifyReport:
    arch, rec = s.model.arch, s.rec
    # terms through heads a group at a time, batched (grouped), their paths made without their terms; a model whose
    # atoms are not of that form, or whose work the trie does cheaper, evaluates every term through the shared trie
    plan = plan_groups(s.binder, expansion)
    if plan is None:
        choice = PathChoice("trie", "the model's atoms are not of the grouped form")
    else:  # the cheaper path by the work (see budget.choose_path)
        cfg, n = s.model.cfg, sum(g.n_terms for g in plan.groups) + len(plan.singles)
        passes = PrefixPasses(s.model, rec, chunk_bytes // PASS_FRACTION).count(plan.groups) if isolation else None
        choice = choose_path(n, passes, rec.n_batch * rec.n_pos * cfg.d_model * cfg.d_head)
        plan = plan if choice.path == "grouped" else None
    LOG.debug("logits expansion evaluated by the %s path: %s", choice.path, choice.reason)
    if plan is None:
        all_kept: list[PathTerm] = list(expansion)
        paths = [t.path for t in all_kept]
    else:
        direct = expansion.direct_terms()
        paths = plan_paths(plan, direct)
    n_kept = len(paths)
    n_omitted = LogitExpansion(arch).n_terms - n_kept  # an int past 2**63 too
    full = _full_terms(build, n_kept, n_kept + n_omitted, s.notes)
    if plan is not None:
        omitted_plan = plan_groups(s.binder, full, range(expansion.max_order + 1, arch.n_layers + 1)) if full else None
        all_omitted: list[PathTerm] = []
        kept: list[PathTerm] = []
    else:
        all_omitted = [t for t in full if t.order > expansion.max_order] if full else []
        mine = range(n_kept) if shard is None else shard.select(all_kept)  # this rank's share (see distributed)
        kept = [all_kept[i] for i in mine] if shard is not None else all_kept
        paths = [t.path for t in kept] if shard is not None else paths
    omitted = [all_omitted[i] for i in shard.select(all_omitted)] if shard is not None and plan is None else all_omitted
    start = time.perf_counter()
    ev = LogitEvaluator(s.binder, kept + omitted if plan is None else direct, s.constants)
    kept_sum, omitted_sum = LogitSum(ev), LogitSum(ev)
    results = TermTable(paths)  # columns, filled a chunk at a time; a TermResult is made for a row when asked for
    space = LogitSpace(s.model, rec, s.constants)
    (scale,) = space.product.max_abs([space.model])
    check_no_overflow(s.model, rec, scale)  # the logits too: finite streams, an unembedding past the dtype
    widen(s, space=space)  # half precision: the tolerances follow the measured rounding
    if shard is not None:
        shard.agree(n_kept + n_omitted, rec, scale)
    exact = _exact_by_default(rec, s.model, n_kept) if exact_errors is None else bool(exact_errors)
    pending: list = []  # terms to add (norms, sum) and check (the trie's, or the grouped engine's through no head)
    maps = HeadMaps(s.model, rec, s.weights)  # the model's map after each head's z, measured once per layer when needed
    spent = {"isolation": 0.0, "largest": 0.0}  # largest: the largest row of any term before the unembedding

    def flush() -> None:  # the pending terms: norms and sum by groups, then check 2
        spent["largest"] = max(spent["largest"], _add_terms(ev, pending, kept_sum, results))
        if isolation:
            t0 = time.perf_counter()
            check_isolated(s.model, s.rec, ev, space, pending, [paths[v.index] for v in pending], results,
                           (s.atol, s.rtol, scale), exact, chunk_bytes, maps)
            spent["isolation"] += time.perf_counter() - t0
        pending.clear()

    # a flush: terms holding a quarter of chunk_bytes (their values at their narrowest, often d_head wide;
    # check 2 holds no stream of them, only groups as they arrive), at most about four chunk_bytes of
    # streams, and at most the copies of the batch that check 2's pass holds in a chunk (one per prefix
    # of the pending paths, a stream at each layer): each flush runs its sources' first copies again,
    # so the fewer flushes the better, but at order 3 a flush of many prefixes set the memory
    stream = rec.final.numel() * rec.final.element_size()
    most = max(1, 4 * chunk_bytes // max(1, stream))
    most_copies = max(1, chunk_bytes // max(1, COPY_FACTOR * stream * (arch.n_layers + 1)))
    done = held = 0
    copies: set = set()

    def arrived(v) -> None:
        """A term joins the pending ones (a flush when they hold enough)."""
        nonlocal done, held
        pending.append(v)
        held += v.y.numel() * v.y.element_size()
        path = paths[v.index]
        copies.add((path.source, path.heads[:-1]))
        if HELD_FRACTION * held >= chunk_bytes or len(pending) >= most or len(copies) >= most_copies:
            flush()
            held = 0
            copies.clear()
        done += 1
        _tick(progress, "terms", done, total)

    total = len(paths)
    if plan is None:
        for v in ev.values():  # depth first through the shared trie; only the current branch and a chunk are held
            if v.index >= len(paths):
                omitted_sum.add(v)
            else:
                arrived(v)
    else:
        grouped = GroupEvaluator(s.binder, chunk_bytes // (4 * rec.final.element_size()), s.weights)
        kept_rows, omitted_rows = GroupSum(grouped), GroupSum(grouped)
        settlement = Settlement(ev, space, results, (s.atol, s.rtol, scale), exact)
        checker = GroupedIsolation(grouped, maps, settlement, chunk_bytes // PASS_FRACTION) if isolation else None
        units, singles, omitted_groups = _grouped_share(plan, omitted_plan, checker, shard)
        # the largest term matters only when its sum may cancel (see _logit_checks): below half of that, a bound will do
        enough = CANCELLING * scale / (2 * space.product.column_norm) if space.product.column_norm > 0 else 0.0
        mine = np.concatenate([np.arange(g.start + c.start * g.counts[-1], g.start + c.stop * g.counts[-1])
                               for family, c in units for g in family] + [np.array(sorted(singles), dtype=np.int64)])
        total = len(mine)
        for v in ev.values():
            if plan.singles[v.index] in singles:
                arrived(v._replace(index=plan.singles[v.index]))
        for family, copies in units:
            for group in family:  # the groups of one prefix group, a pass of its copies at a time: each runs once
                for first, y in grouped.blocks(group, copies):
                    largest, norms = _add_rows(ev, grouped, group, first, y, kept_rows, results, enough)
                    spent["largest"] = max(spent["largest"], largest)
                    if checker is not None:  # check 2 of the chunk's rows, against the pass's copies
                        t0 = time.perf_counter()
                        checker.check(group, first, y, norms)
                        spent["isolation"] += time.perf_counter() - t0
                    done += y.shape[0] * y.shape[3]
                    _tick(progress, "terms", done, total)
        if checker is not None:  # the rows no bound settled: their exact errors, in one pass where they fit
            spent["isolation"] += checker.finish()
        for group in omitted_groups:
            for first, y in grouped.blocks(group):
                _add_rows(ev, grouped, group, first, y, omitted_rows, None)
        kept_rows.into(kept_sum)
        omitted_rows.into(omitted_sum)
    if pending:
        flush()
    largest = spent["largest"]
    kept_aug = space.aug(kept_sum.parts())
    omitted_aug = space.aug(omitted_sum.parts()) if full and n_omitted else None
    if shard is not None:  # the ranks meet: sums added, the largest term taken, every rank's results gathered
        largest = shard.max(largest, "taking the largest term", kept_aug)
        kept_aug = shard.sum_(kept_aug, "adding the kept terms")
        if omitted_aug is not None:
            omitted_aug = shard.sum_(omitted_aug, "adding the omitted terms")
        results = shard.gathered(mine, results, n_kept) if plan is None else shard.gathered_table(results, mine)
        s.notes.append(f"the terms were evaluated by {shard.world} ranks (torch.distributed), each a share of their "
                       "prefixes; the timings are rank 0's")
    check_terms_finite(s.model, results, kept_aug, omitted_aug)
    s.timings["evaluate"] = time.perf_counter() - start - spent["isolation"]
    s.timings["isolation"] = spent["isolation"]
    start = time.perf_counter()
    model_omitted = space.of(graded_final(s.model, rec, expansion.max_order), 0.0) if n_omitted else None
    s.timings["truncation"] = time.perf_counter() - start
    start = time.perf_counter()
    term_scale = largest * space.product.column_norm  # bounds every entry of every kept term's logits
    checks = _logit_checks(space, ev, kept_aug, omitted_aug, model_omitted, full, n_omitted, scale, s, exact, term_scale)
    s.timings["unembed"] = time.perf_counter() - start
    checks.insert(1, _isolation_check(results, isolation, scale, s))
    return _report("logits", s, expansion.max_order, results, checks, scale, n_omitted)


def _families(groups: list[PathGroup], checker: GroupedIsolation | None) -> Iterator[tuple[list[PathGroup], range]]:
    """The groups that share their prefixes (one source, every layer but the last: consecutive in the
    expansion), each with a range of those prefixes: as many as one pass of check 2 takes, or all of them."""
    for _, family in groupby(groups, key=lambda g: (g.source, g.layers[:-1])):
        family = list(family)
        first = family[0]
        n = first.n_terms // first.counts[-1]
        step = n if checker is None else checker.passes.copies_per_pass(first.entry, first.layers[:-1])
        for c in range(0, n, step):
            yield family, range(c, min(n, c + step))


def _grouped_share(plan, omitted_plan, checker: GroupedIsolation | None, shard: Shard | None):
    """What this process evaluates of a grouped expansion: its units (:func:`_families`), its terms through no
    head (expansion indices) and its omitted groups (for check 1's sum) — everything, or, under
    ``torch.distributed``, a disjoint share: units and direct terms by their terms, largest first to the
    least loaded rank (:meth:`Shard.assign`), omitted groups in turn."""
    units = list(_families(plan.groups, checker))
    omitted = omitted_plan.groups if omitted_plan else []
    if shard is None:
        return units, set(plan.singles), omitted
    taken = shard.assign([len(c) * sum(g.counts[-1] for g in family) for family, c in units] + [1] * len(plan.singles))
    return ([units[k] for k in taken if k < len(units)], {plan.singles[k - len(units)] for k in taken if k >= len(units)},
            omitted[shard.rank::shard.world])


def _add_terms(ev: LogitEvaluator, values: list, total: LogitSum, results: TermTable) -> float:
    """Add ``values`` to ``total`` and give their results their norms, grouped by their last
    multipliers (one product per group); returns the largest row of any of them before the
    unembedding."""
    largest = 0.0
    for batch in ev.batches(values):
        total.add_batch(batch)
        for v, norm in zip(batch.values, ev.batch_norms(batch)):
            results.norm[v.index] = norm
        largest = max(largest, ev.batch_max_row_norm(batch))
    return largest


def _add_rows(ev: LogitEvaluator, grouped: GroupEvaluator, group: PathGroup, first: int, y: Tensor,
              total: GroupSum, results: TermTable | None, enough: float = math.inf) -> tuple[float, Tensor | None]:
    """Rows of a group, head-major (:meth:`GroupEvaluator.blocks`, ``[H, b, pos, R, e]``), added to ``total``,
    their norms given to ``results`` (when given), ``‖y C_h‖`` with ``C_h C_hᵀ`` their last head's kernel.
    Returns the largest row of any of them before the unembedding, or a bound on it when that bound is at most
    ``enough`` (each row's norm times its head's ``‖W_O‖``: the exact figure matters only when it is large),
    and the norm of every row at every position, ``‖y‖`` ``[H, b, pos, R]`` (check 2 bounds with them too)."""
    root, inner, top = grouped.kernels(group.layers[-1], ev)  # [H, e, e], [H, e, e], [H]
    total.add(group.layers[-1], y.sum(3))  # each head's rows summed: W_O once per layer at the end
    if results is None:
        return 0.0, None
    H, b, p, R, e = y.shape
    by_head = y.reshape(H, b * p * R, e)
    term_norms = widened(lambda x, k: torch.bmm(x.to(k.dtype), k).square_().view(H, b * p, R * e).sum(1).view(H, R, e).sum(-1),
                         by_head, root).sqrt_()  # [H, R] (reductions over one axis: fast; float64 where squares overflow)
    results.norm[first:first + R * H] = term_norms.T.flatten().double().cpu().numpy()
    norms = torch.linalg.vector_norm(y, dim=-1)  # [H, b, pos, R]
    bound = float((norms.view(H, -1).amax(1).double().pow(2) * top.double()).max()) ** 0.5
    if bound <= enough:
        return bound, norms
    return max(float(widened(lambda x, k: ((x.to(k.dtype) @ k) * x).sum(-1).max(), by_head, inner)), 0.0) ** 0.5, norms


def _logit_checks(space: LogitSpace, ev: LogitEvaluator, kept: Tensor, omitted: Tensor | None, model_omitted: Tensor | None,
                  full, n_omitted: int, scale: float, s: _Setup, exact: bool, term_scale: float = 0.0) -> list[CheckResult]:
    """Checks 1 and 3 on augmented inputs (see :class:`LogitSpace`): the differences are formed
    before the unembedding. Each passes on its rigorous bound when that is within the tolerance
    (unless ``exact``); otherwise one pass finds every largest logit-space entry exactly.

    When the terms are far larger than the logits (``term_scale``, a bound on their entries,
    above ``CANCELLING`` times the logits' scale) they cancel, and the sum is rounded at their
    scale, not the logits': check 1 is then relative to ``term_scale`` (its detail says so)."""
    cancels = term_scale > CANCELLING * scale
    if cancels:
        scale = term_scale
    tol = s.atol + s.rtol * scale  # for check 3 a lower tolerance than its own: certifying with it is safe
    errors: dict[str, Tensor] = {}
    if full is not False:
        errors["sum"] = kept - space.model if omitted is None else (kept + omitted).sub_(space.model)
    if model_omitted is not None:
        errors["truncation"] = (space.model - kept).sub_(model_omitted)
    bounds = {name: space.product.bound(e) for name, e in errors.items()}
    exact_names = [name for name in errors if exact or not bounds[name] <= tol]
    rows = [errors[name] for name in exact_names] + ([model_omitted] if "truncation" in exact_names else [])
    maxima = dict(zip(exact_names + ["own"], space.product.max_abs(rows))) if rows else {}

    def result(name: str, detail: str) -> CheckResult:
        if name not in maxima:
            return CheckResult(name, True, bounds[name], _relative(bounds[name], scale), tol, detail, bounded=True)
        own = maxima.get("own", 0.0) if name == "truncation" else 0.0
        return _result_of(name, maxima[name], max(scale, own), s, detail)

    if full is False:
        checks = [CheckResult("sum", None, None, None, None, "too many terms in the untruncated expansion")]
    else:
        detail = [] if full is None else [f"over all {len(full):,} terms of the untruncated expansion"]
        if cancels:
            detail.append(f"relative to a bound on the largest term ({term_scale:.3g}), far above the logits: the terms cancel")
        checks = [result("sum", "; ".join(detail))]
    if model_omitted is None:
        checks.append(CheckResult("truncation", None, None, None, None, "no term omitted"))
    else:
        norm = space.norm(ev, model_omitted[..., : space.rec.final.shape[-1]])
        checks.append(result("truncation", f"{n_omitted:,} omitted terms, computed by the model (order-graded forward "
                                           f"pass); their norm is {norm:.4g}"))
    return checks


def _result_of(name: str, err: float, scale: float, s: _Setup, detail: str = "") -> CheckResult:
    tol = s.atol + s.rtol * scale
    return CheckResult(name, bool(err <= tol), err, _relative(err, scale), tol, detail)


def _sum_check(kept: Tensor, omitted: Tensor | None, full, reference: Tensor, scale: float, s: _Setup) -> CheckResult:
    """Check 1 (see :func:`_full_terms` for ``full``: ``None`` nothing omitted, ``False`` too many)."""
    if full is False:
        return CheckResult("sum", None, None, None, None, "too many terms in the untruncated expansion")
    error = kept - reference if omitted is None else (kept + omitted).sub_(reference)
    return _result("sum", error, scale, s, "" if full is None else f"over all {len(full):,} terms of the untruncated expansion")


def _truncation_check(rest: Callable[[], Tensor], model_omitted: Tensor | None, n_omitted: int, scale: float,
                      s: _Setup) -> CheckResult:
    """Check 3: ``rest()`` (the model minus the kept terms) against the omitted part computed by the model."""
    if model_omitted is None:
        return CheckResult("truncation", None, None, None, None, "no term omitted")
    return _result("truncation", rest().sub_(model_omitted), max(scale, max_abs(model_omitted)), s,
                   f"{n_omitted:,} omitted terms, computed by the model (order-graded forward pass); "
                   f"their norm is {float(model_omitted.norm()):.4g}")


# --- QK scores ------------------------------------------------------------------------------


def verify_qk(
    model: CircuitModel,
    tokens: Tensor | Iterable,
    layer: int,
    head: int,
    max_order: int | None = None,
    dtype: str | torch.dtype = torch.float64,
    device: str | torch.device | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    *,
    isolation: bool = True,
    expansion: QKExpansion | None = None,
    limit: int = 1_000_000,
    progress: Progress | None = None,
    chunk_bytes: int | None = None,
    distributed: bool | None = None,
) -> VerifyReport:
    """Check the expansion of head ``(layer, head)``'s pre-softmax scores (:func:`derivations.qk.expand_qk`).

    The reference is the model's ``blocks.{layer}.attn.hook_attn_scores`` (scaled by the
    model's own ``1/attn_scale``, to which the terms' ``1/sqrt(d_head)`` is bound), compared
    on the causal lower triangle (the model holds ``-inf`` above it). Check 2 isolates both
    sides of each term through the model (:func:`numeric_check.verification.isolate.isolate_qk`: the
    model's attention module computes ``q`` and ``k`` from the isolated streams, and its
    ``hook_attn_scores`` gives the term); check 3 uses the order-graded forward pass, with
    a term's order the heads on both sides together. Other arguments and errors as for
    :func:`verify_logits`.

    >>> from derivations.architecture import Architecture
    >>> model = CircuitModel.random(Architecture(2, 2, positional="standard"), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0)
    >>> r = verify_qk(model, [[1, 2, 3, 1, 2]], layer=1, head=0)
    >>> r.passed, len(r.terms), sorted({t.composition for t in r.terms})
    (True, 36, ['K', 'Q', 'QK', 'direct'])
    """
    arch = getattr(model, "arch", None)
    _checked(model)
    arch.check_head(layer, head)
    build = lambda k: expand_qk(arch, layer, head, k, limit=limit)  # noqa: E731
    expansion = _resolve_expansion(expansion, QKExpansion, arch, max_order, build)
    if (expansion.layer, expansion.head) != (layer, head):
        raise ExpansionMismatch(f"the expansion is of head L{expansion.layer}H{expansion.head}, not L{layer}H{head}")
    shard = Shard.current(distributed)
    s = _setup(model, tokens, dtype, device, atol, rtol)
    if s.model.arch.attn_softcap is not None:
        s.notes.append(f"the scores are expanded and checked before the attention soft-cap c·tanh(s/c), c = {s.model.arch.attn_softcap:g}, "
                       "which acts on them before the softmax (hook_attn_scores holds them before the cap)")
    with torch.no_grad(), _cyclic_gc_paused():
        return _shrinking(lambda chunk: _verify_qk(s, expansion, build, isolation, progress, chunk, shard), chunk_bytes, s)


def _verify_qk(s: _Setup, expansion: QKExpansion, build, isolation: bool, progress, chunk_bytes: int,
               shard: Shard | None = None) -> VerifyReport:
    arch, rec, layer, head = s.model.arch, s.rec, expansion.layer, expansion.head
    all_kept: list[QKTerm] = list(expansion)
    n_omitted = QKExpansion(arch, layer, head).n_terms - len(all_kept)
    full = _full_terms(build, len(all_kept), len(all_kept) + n_omitted, s.notes)
    all_omitted = [t for t in full if t.order > expansion.max_order] if full else []
    mine = range(len(all_kept)) if shard is None else shard.select(all_kept, qk_prefix)  # see distributed
    kept = [all_kept[i] for i in mine] if shard is not None else all_kept
    omitted = [all_omitted[i] for i in shard.select(all_omitted, qk_prefix)] if shard is not None else all_omitted
    start = time.perf_counter()
    ev = QKEvaluator(s.binder, kept + omitted)
    below = s.model.blocks[layer].attn.mask(rec.n_pos, s.model.device)  # the keys the head sees (causal, window)
    reference = rec.get(block_hook(layer, "attn.hook_attn_scores"), "the scores")[:, head]  # [b, q, k]
    scale = max_abs(reference[:, below])
    widen(s, scores=(layer, head, below))  # half precision: the tolerances follow the measured rounding
    if shard is not None:
        shard.agree(len(all_kept) + len(all_omitted), rec, scale)
    results = []
    # half precision: the terms added in float32 (36 added in bfloat16 erred 4 % of the scores, 5x the model's rounding)
    kept_sum = torch.zeros_like(reference, dtype=torch.promote_types(reference.dtype, torch.float32))
    largest = 0.0  # the largest entry of any term: sums that cancel are rounded at that scale
    for i, t in enumerate(kept):
        scores = ev.scores(i)
        kept_sum = kept_sum + scores
        largest = max(largest, max_abs(scores[:, below]))
        results.append(TermResult(t.label, t.query.source.label, t.query.heads, t.order, norm_of(scores[:, below]),
                                  composition=t.composition, key_source=t.key.source.label, key_heads=t.key.heads))
        _tick(progress, "terms", i + 1, len(kept))
    omitted_sum = sum((ev.scores(len(kept) + i) for i in range(len(omitted))), torch.zeros_like(kept_sum))
    s.timings["evaluate"] = time.perf_counter() - start
    start = time.perf_counter()
    if isolation:
        pairs = [(t.query, t.key) for t in kept]
        for i, iso in isolate_qk(s.model, rec, layer, head, pairs, chunk_bytes=chunk_bytes):
            ours = ev.scores(i)[:, below]
            r = results[i]
            r.max_abs_error = max_abs(ours - iso[:, below])
            r.passed = r.max_abs_error <= s.atol + s.rtol * max(scale, max_abs(ours))
            _tick(progress, "isolation", i + 1, len(kept))
    if shard is not None:  # the ranks meet (as for logits)
        largest = shard.max(largest, "taking the largest term", reference)
        kept_sum = shard.sum_(kept_sum.contiguous(), "adding the kept terms")
        if all_omitted:
            omitted_sum = shard.sum_(omitted_sum.contiguous(), "adding the omitted terms")
        results = shard.gathered(mine, results, len(all_kept))
        s.notes.append(f"the terms were evaluated by {shard.world} ranks (torch.distributed), each a share of their "
                       "prefixes; the timings are rank 0's")
    s.timings["isolation"] = time.perf_counter() - start
    check_terms_finite(s.model, results, kept_sum, omitted_sum)
    cancels = largest > CANCELLING * scale  # as for logits: then the sum is rounded at the terms' scale
    sum_scale = largest if cancels else scale
    checks = [_sum_check(kept_sum[:, below], omitted_sum[:, below] if all_omitted else None, full, reference[:, below], sum_scale, s),
              _isolation_check(results, isolation, scale, s)]
    if cancels and checks[0].passed is not None:
        checks[0].detail = "; ".join(filter(None, [checks[0].detail, f"relative to the largest term ({largest:.3g}), "
                                                   f"far above the scores ({scale:.3g}): the terms cancel"]))
    start = time.perf_counter()
    model_omitted = graded_qk(s.model, rec, layer, head, expansion.max_order, chunk_bytes=chunk_bytes) if n_omitted else None
    checks.append(_truncation_check(lambda: (reference - kept_sum)[:, below],
                                    None if model_omitted is None else model_omitted[:, below], n_omitted, scale, s))
    s.timings["truncation"] = time.perf_counter() - start
    target = f"the pre-softmax scores of L{layer}H{head}"
    return _report(target, s, expansion.max_order, results, checks, scale, n_omitted)


def _isolation_check(results: Sequence[TermResult], isolation: bool, scale: float, s: _Setup) -> CheckResult:
    """Check 2 over the terms; a term certified by its bound counts with its bound."""
    if not isolation:
        return CheckResult("isolation", None, None, None, None, "skipped (isolation=False)")
    if isinstance(results, TermTable):
        worst, bounded, n_failed, first_failed = results.summary()
        failed = [results.paths[i].label for i in first_failed]
    else:
        errors = [r.error_bound if r.max_abs_error is None else r.max_abs_error for r in results]
        worst = math.nan if any(e is None or math.isnan(e) for e in errors) else max(errors, default=0.0)
        failed = [r.label for r in results if not r.passed]
        bounded, n_failed = sum(r.max_abs_error is None for r in results), len(failed)
    detail = f"{len(results):,} terms, each against its path isolated by the model's own hooks"
    if bounded:
        detail += (f"; {bounded:,} certified by a rigorous bound on their logit-space error (max |e·w| ≤ ‖e‖‖w‖, "
                   "errors formed before the unembedding), shown as ≤ bound; the rest computed exactly")
    if n_failed:
        detail += f"; {n_failed:,} failed, e.g. {', '.join(failed[:3])}"
    return CheckResult("isolation", not n_failed, worst, _relative(worst, scale), s.atol + s.rtol * scale, detail)
