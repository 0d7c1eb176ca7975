"""Verifying an expansion against a real model: the logits, or one head's attention scores.

:func:`verify_logits` binds every term of :func:`derivations.paths.expand_logits` to the
model's weights and to the patterns, layer-norm scales and MLP outputs of a real forward
pass, and runs three checks:

1. **sum** — the sum of all terms equals the model's logits (relative error ≤ ``rtol``,
   1e-9 by default in float64);
2. **isolation** — each kept term equals the same path computed by the model itself with
   hooks (:mod:`numeric_check.isolate`: frozen patterns and scales, only the path's source
   and heads on, residual connections dropped at the path's layers) — not by our evaluator;
3. **truncation** — at ``max_order=k``, the model's logits minus the kept terms equal the
   omitted terms, computed by the model (an order-graded forward pass), not by the expansion.

:func:`verify_qk` does the same for one head's pre-softmax scores (compared on the causal
lower triangle). Both return a :class:`VerifyReport` (``passed``, ``max_abs_error``,
``rel_error``, ``terms``, ``checks``, ``to_json()``, ``to_markdown()``).

Tolerances: a check passes when its largest absolute error is at most
``atol + rtol · scale``, ``scale`` the largest absolute value of the reference (the
logits or scores; for a term, the larger of that and the term's own); ``atol=None`` is 0.

With layer norm the expansion treats each scale as a frozen diagonal factor, which is
exact when the residual stream is centred: the working copy's writing weights are
centred in the verification dtype (see :func:`working_copy`; this does not change what
the model computes).

>>> from derivations.architecture import Architecture
>>> from numeric_check.model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2, layer_norm=True), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0)
>>> report = verify_logits(model, torch.tensor([[1, 2, 3, 4]]))
>>> report.passed, len(report.terms), report.rel_error < 1e-12
(True, 9, True)
>>> report.terms[5].label, report.terms[5].heads
('tok→L0H0→L1H0', ((0, 0), (1, 0)))
"""

from __future__ import annotations

import json
import math
import time
from copy import deepcopy
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn

from derivations.errors import TooManyTerms
from derivations.paths import LogitExpansion, PathTerm, expand_logits
from derivations.qk import QKExpansion, QKTerm, expand_qk
from numeric_check.bind import Binder, Recording, record
from numeric_check.errors import NumericCheckError
from numeric_check.evaluate import LogitEvaluator, LogitSum, QKEvaluator
from numeric_check.hooks import HookPoint
from numeric_check.isolate import DEFAULT_CHUNK_BYTES, graded_logits, graded_qk, isolate_logit_paths, isolate_qk
from numeric_check.model import CircuitModel, resolve_device, resolve_dtype

Progress = Callable[[str, int, int], None]  # (stage, done, total)
FULL_LIMIT = 100_000  # the most terms evaluated for check 1 when a truncated expansion omits some


class VerifyError(NumericCheckError, ValueError):
    """Arguments of a verification that cannot be used (a tolerance, a model of another type)."""


class ExpansionMismatch(VerifyError):
    """An expansion built for another architecture (or head) than the model's."""


@dataclass
class TermResult:
    """One term of a verified expansion.

    ``norm``: Frobenius norm of the term's contribution over the batch (for scores, over
    the causal lower triangle); ``max_abs_error``: against the path isolated through the
    model (``None`` when isolation was skipped). For QK terms ``source``/``heads`` are the
    query side's and ``key_source``/``key_heads`` the key side's.
    """

    label: str
    source: str
    heads: tuple[tuple[int, int], ...]
    order: int
    norm: float = math.nan
    max_abs_error: float | None = None
    passed: bool | None = None
    composition: str | None = None
    key_source: str | None = None
    key_heads: tuple[tuple[int, int], ...] | None = None


@dataclass
class CheckResult:
    """One of the three checks. ``passed`` is ``None`` when it did not run (``detail`` says why)."""

    name: str
    passed: bool | None
    max_abs_error: float | None
    rel_error: float | None
    tolerance: float | None
    detail: str


@dataclass
class VerifyReport:
    """What :func:`verify_logits` or :func:`verify_qk` found; ``passed`` when every check that ran passed."""

    target: str
    model: str
    n_batch: int
    n_pos: int
    max_order: int | None
    dtype: str
    device: str
    passed: bool
    max_abs_error: float
    rel_error: float
    scale: float
    terms: list[TermResult]
    checks: list[CheckResult]
    n_omitted: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def check(self, name: str) -> CheckResult:
        """The check called ``name`` (``sum``, ``isolation`` or ``truncation``)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r}; checks: {[c.name for c in self.checks]}")

    def to_dict(self) -> dict:
        return _jsonable(asdict(self))

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON (non-finite numbers as ``null``)."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def summary_lines(self) -> list[str]:
        order = "all orders" if self.max_order is None else f"max_order={self.max_order} ({self.n_omitted:,} terms omitted)"
        lines = [
            f"verify {self.target} of {self.model}",
            f"batch {self.n_batch} x {self.n_pos} positions, {len(self.terms):,} terms, {order}, {self.dtype} on {self.device}",
        ]
        for c in self.checks:
            status = "skipped" if c.passed is None else ("PASS" if c.passed else "FAIL")
            err = "" if c.max_abs_error is None else f": max |error| {c.max_abs_error:.3g} (relative {c.rel_error:.3g}, tolerance {c.tolerance:.3g})"
            lines.append(f"  {_CHECK_TITLES[c.name]:<47} {status}{err}")
            if c.detail:
                lines.append(f"      {c.detail}")
        lines += [f"  note: {n}" for n in self.notes]
        lines.append("PASSED" if self.passed else "FAILED")
        return lines

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        out = []
        for t in self.terms:
            err = "—" if t.max_abs_error is None else f"{t.max_abs_error:.2e}"
            ok = "—" if t.passed is None else ("ok" if t.passed else "FAIL")
            out.append((t.label, str(t.order), f"{t.norm:.4g}", err, ok))
        return out

    def to_markdown(self, max_rows: int | None = None) -> str:
        """A summary and a Markdown table of the terms (the first ``max_rows``, or all)."""
        lines = ["```", *self.summary_lines(), "```", "", "| term | order | norm | max abs error | ok |", "|---|---:|---:|---:|---|"]
        rows = self.rows()
        for label, order, norm, err, ok in rows[:max_rows]:
            lines.append(f"| `{label}` | {order} | {norm} | {err} | {ok} |")
        if max_rows is not None and len(rows) > max_rows:
            lines.append(f"| … {len(rows) - max_rows:,} more | | | | |")
        return "\n".join(lines)

    def to_text(self, max_rows: int | None = None) -> str:
        """A summary and an aligned plain-text table of the terms."""
        rows = [("term", "order", "norm", "max abs error", "ok")] + self.rows()
        shown = rows if max_rows is None else rows[: max_rows + 1]
        widths = [max(len(r[i]) for r in shown) for i in range(5)]
        table = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))) for r in shown]
        if len(shown) < len(rows):
            table.append(f"… {len(rows) - len(shown):,} more terms")
        return "\n".join(self.summary_lines() + [""] + table)

    def __str__(self) -> str:
        return self.to_text()


_CHECK_TITLES = {
    "sum": "1. sum of all terms = model",
    "isolation": "2. each term = its path isolated in the model",
    "truncation": "3. model - kept terms = omitted terms",
}


def _jsonable(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# --- shared machinery ------------------------------------------------------------------------


@dataclass
class _Setup:
    model: CircuitModel  # the private working copy
    rec: Recording
    binder: Binder
    atol: float
    rtol: float
    timings: dict[str, float]
    notes: list[str]


def _check_tolerance(name: str, value, allow_none: bool) -> float:
    if value is None and allow_none:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise VerifyError(f"{name} must be a finite number >= 0{' or None' if allow_none else ''}, got {value!r}")
    return float(value)


def working_copy(model: CircuitModel, dtype, device) -> CircuitModel:
    """A copy of ``model`` in ``dtype`` on ``device`` (``None``: CUDA when available); the model is not touched.

    With layer norm, the copy's weights that write to the residual stream are centred over
    ``d_model`` in the new dtype. Every reader of the stream is then a layer norm, which
    removes the mean anyway, so the copy computes the same function; but its stream is
    centred to the precision of ``dtype`` (weights centred in float32 are centred only to
    about 1e-8 in float64), which makes each layer norm exactly a per-position scale, as
    the expansion treats it.

    Raises :class:`~numeric_check.errors.DeviceError` for a dtype or device that cannot be
    used and :class:`~numeric_check.errors.WeightError` for NaN/Inf weights.
    """
    if not isinstance(model, CircuitModel):
        raise VerifyError(
            f"expected a numeric_check.CircuitModel, got {type(model).__name__}; convert TransformerLens or "
            "Hugging Face models with numeric_check.from_transformer_lens / from_hf_gpt2"
        )
    dtype = resolve_dtype(dtype)
    device = resolve_device(device, prefer_cuda=True)
    with torch.no_grad():
        if not all(_finite(p) for p in model.parameters()):
            model.check_finite()  # names the parameter
        # new modules and hook points, the same weight tensors; the user's hook functions stay behind
        memo = {id(p): p for p in model.parameters()}
        memo.update({id(point._hooks): [] for point in model.modules() if isinstance(point, HookPoint)})
        copy = deepcopy(model, memo=memo)
        for module in copy.modules():
            for name, p in module._parameters.items():
                if p is not None:  # no copy when dtype and device already match: never modified in place
                    module._parameters[name] = nn.Parameter(p.detach().to(device=device, dtype=dtype), requires_grad=False)
        if model.arch.layer_norm:
            for module, name, axis in _residual_writers(copy):
                p = module._parameters[name]
                mean = p.mean(axis, keepdim=True)
                if _max_abs(mean) > 16 * torch.finfo(dtype).eps * _max_abs(p):  # not centred to this precision yet
                    module._parameters[name] = nn.Parameter(p - mean, requires_grad=False)
    return copy


def _finite(p: Tensor) -> bool:
    """Whether every entry is finite: ``aminmax`` propagates NaN and sees ±Inf (faster than ``isfinite``)."""
    low, high = torch.aminmax(p.detach())
    return bool(torch.isfinite(low) & torch.isfinite(high))


def _residual_writers(model: CircuitModel) -> list[tuple[nn.Module, str, int]]:
    """Every weight and bias that writes to the residual stream: ``(module, name, d_model axis)``."""
    writers = [(model, "W_E", 0)]
    if model.arch.positional == "standard":  # qk_only positions are added after the layer norm
        writers.append((model, "W_pos", 0))
    for block in model.blocks:
        writers += [(block.attn, "W_O", 1), (block.attn, "b_O", 0)]
        if block.mlp is not None:
            writers += [(block.mlp, "W_out", 0), (block.mlp, "b_out", 0)]
    return [(m, name, axis) for m, name, axis in writers if getattr(m, name) is not None]


def _setup(model, tokens, dtype, device, atol, rtol) -> _Setup:
    atol = _check_tolerance("atol", atol, True)
    rtol = _check_tolerance("rtol", rtol, False)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    work = working_copy(model, dtype, device)
    rec = record(work, tokens)
    timings["forward"] = time.perf_counter() - start
    return _Setup(work, rec, Binder(work, rec), atol, rtol, timings, _centring_notes(work, rec))


def _centring_notes(model: CircuitModel, rec: Recording) -> list[str]:
    """A note when layer norm meets a residual stream that is not centred (see the module docstring)."""
    if not model.arch.layer_norm:
        return []
    worst, where = 0.0, ""
    for name, x in rec.cache.items():
        if name.endswith(("hook_resid_pre", "hook_resid_post")):
            ratio = float((x.mean(-1).abs() / x.pow(2).mean(-1).sqrt().clamp_min(1e-300)).max())
            if ratio > worst:
                worst, where = ratio, name
    if worst <= max(1e-6, 100 * torch.finfo(model.dtype).eps):
        return []
    return [
        f"the residual stream is not centred (largest |mean|/rms over d_model is {worst:.2g}, at {where}): layer "
        "norm's centring is not part of the expansion, so the terms cannot add up to the model; centre the weights "
        "that write to the residual stream (CircuitModel.random and the adapters do)"
    ]


def _max_abs(x: Tensor) -> float:
    """``max |x|`` without a temporary ``|x|`` (nan when ``x`` holds a nan)."""
    if not x.numel():
        return 0.0
    low, high = torch.aminmax(x)
    return float(torch.maximum(low.abs(), high.abs()))


def _result(name: str, error: Tensor, scale: float, s: _Setup, detail: str = "") -> CheckResult:
    err = _max_abs(error)
    tol = s.atol + s.rtol * scale
    return CheckResult(name, bool(err <= tol), err, _relative(err, scale), tol, detail)


def _relative(err: float, scale: float) -> float:
    return err / scale if scale > 0 else (0.0 if err == 0 else math.inf)


def _report(target: str, s: _Setup, max_order, terms, checks, scale, n_omitted) -> VerifyReport:
    first = next((c for c in checks if c.passed is not None and c.name in ("sum", "truncation")), None)
    passed = all(c.passed for c in checks if c.passed is not None) and any(c.passed is not None for c in checks)
    return VerifyReport(
        target=target,
        model=s.model.arch.describe() + f"; d_model={s.model.cfg.d_model}, d_head={s.model.cfg.d_head}, d_vocab={s.model.cfg.d_vocab}",
        n_batch=s.rec.n_batch,
        n_pos=s.rec.n_pos,
        max_order=max_order,
        dtype=str(s.model.dtype).replace("torch.", ""),
        device=str(s.model.device),
        passed=passed,
        max_abs_error=first.max_abs_error if first else math.nan,
        rel_error=first.rel_error if first else math.nan,
        scale=scale,
        terms=terms,
        checks=checks,
        n_omitted=n_omitted,
        timings=s.timings,
        notes=s.notes,
    )


def _tick(progress: Progress | None, stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


def _resolve_expansion(expansion, kind, arch, max_order, build):
    """The expansion to verify: ``expansion`` checked against the model, or a fresh one."""
    if expansion is None:
        return build(max_order)
    if not isinstance(expansion, kind):
        raise VerifyError(f"expansion must be a {kind.__name__}, got {type(expansion).__name__}")
    if expansion.arch != arch:
        raise ExpansionMismatch(
            f"the expansion was built for {expansion.arch.describe()} but the model is {arch.describe()}; "
            "build it from model.arch"
        )
    if max_order is not None and max_order != expansion.max_order:
        raise ExpansionMismatch(f"max_order={max_order} but the expansion was built with max_order={expansion.max_order}")
    return expansion


def _full_terms(build, n_kept: int, n_full: int, notes: list[str]):
    """Every term of the untruncated expansion (for check 1), or ``None`` when too many."""
    if n_full == n_kept:
        return None
    if n_full > max(FULL_LIMIT, n_kept):
        notes.append(
            f"check 1 (sum) skipped: the untruncated expansion has {n_full:,} terms, more than {max(FULL_LIMIT, n_kept):,}; "
            "check 3 compares the kept terms with the model's omitted part instead"
        )
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
    rtol: float = 1e-9,
    *,
    isolation: bool = True,
    expansion: LogitExpansion | None = None,
    limit: int = 1_000_000,
    progress: Progress | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> VerifyReport:
    """Check the path expansion of the logits against ``model`` on ``tokens`` (see the module docstring).

    ``tokens``: ids ``[batch, pos]`` or ``[pos]``. ``max_order`` keeps paths through at most
    that many heads (check 3 then covers the rest). The model is copied to ``dtype`` and
    ``device`` (``None``: CUDA when available, else CPU); the original is never modified.
    ``isolation=False`` skips check 2 (one batched forward pass per chunk of terms, each
    with its own unembedding: the expensive check on large vocabularies); term norms then
    come from Gram matrices instead of each term's logits. ``expansion`` may be given
    (built for ``model.arch``); ``limit`` bounds the terms built. ``progress(stage, done,
    total)`` is called as terms are checked.

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
    if not isinstance(model, CircuitModel):
        working_copy(model, dtype, device)  # raises the type error
    expansion = _resolve_expansion(expansion, LogitExpansion, arch, max_order, build)
    max_order = expansion.max_order
    s = _setup(model, tokens, dtype, device, atol, rtol)
    with torch.no_grad():
        return _verify_logits(s, expansion, build, isolation, progress, chunk_bytes)


def _verify_logits(s: _Setup, expansion: LogitExpansion, build, isolation: bool, progress, chunk_bytes: int) -> VerifyReport:
    arch, rec = s.model.arch, s.rec
    kept: list[PathTerm] = list(expansion)
    n_omitted = len(LogitExpansion(arch)) - len(kept)
    full = _full_terms(build, len(kept), len(kept) + n_omitted, s.notes)
    omitted = [t for t in full if t.order > expansion.max_order] if full else []
    start = time.perf_counter()
    ev = LogitEvaluator(s.binder, kept + omitted)
    kept_sum, omitted_sum = LogitSum(ev), LogitSum(ev)
    results = [TermResult(t.label, t.source.label, t.heads, t.order) for t in kept]
    scale = _max_abs(rec.logits)
    pending: list = []
    spent = {"isolation": 0.0}

    def flush() -> None:  # check 2 for the pending terms: one batched isolation pass per chunk
        t0 = time.perf_counter()
        paths = [kept[v.index].path for v in pending]
        for (_, iso), v in zip(isolate_logit_paths(s.model, rec, paths, chunk_bytes=chunk_bytes), pending):
            ours = ev.logits(v)
            r = results[v.index]
            r.norm = float(ours.norm())
            r.max_abs_error = _max_abs(ours - iso)
            r.passed = r.max_abs_error <= s.atol + s.rtol * max(scale, _max_abs(ours))
        pending.clear()
        spent["isolation"] += time.perf_counter() - t0

    per_chunk = max(1, chunk_bytes // max(1, rec.logits.numel() * rec.logits.element_size()))
    done = 0
    for v in ev.values():  # depth first through the shared trie; only the current branch is held
        if v.index >= len(kept):
            omitted_sum.add(v)
            continue
        kept_sum.add(v)
        if isolation:
            pending.append(v)
            if len(pending) >= per_chunk:
                flush()
        else:
            results[v.index].norm = ev.norm(v)
        done += 1
        _tick(progress, "terms", done, len(kept))
    if pending:
        flush()
    kept_logits = kept_sum.logits()
    checks = [_sum_check(kept_logits, omitted_sum.logits() if omitted else None, full, rec.logits, scale, s)]
    s.timings["evaluate"] = time.perf_counter() - start - spent["isolation"]
    s.timings["isolation"] = spent["isolation"]
    checks.append(_isolation_check(results, isolation, scale, s))
    start = time.perf_counter()
    model_omitted = graded_logits(s.model, rec, expansion.max_order) if n_omitted else None
    checks.append(_truncation_check(lambda: rec.logits - kept_logits, model_omitted, n_omitted, scale, s))
    s.timings["truncation"] = time.perf_counter() - start
    return _report("logits", s, expansion.max_order, results, checks, scale, n_omitted)


def _sum_check(kept: Tensor, omitted: Tensor | None, full, reference: Tensor, scale: float, s: _Setup) -> CheckResult:
    """Check 1 (see :func:`_full_terms` for ``full``: ``None`` nothing omitted, ``False`` too many)."""
    if full is False:
        return CheckResult("sum", None, None, None, None, "too many terms in the untruncated expansion")
    if full is None:
        return _result("sum", kept - reference, scale, s)
    error = kept - reference if omitted is None else (kept + omitted).sub_(reference)
    return _result("sum", error, scale, s, f"over all {len(full):,} terms of the untruncated expansion")


def _truncation_check(rest: Callable[[], Tensor], model_omitted: Tensor | None, n_omitted: int, scale: float,
                      s: _Setup) -> CheckResult:
    """Check 3: ``rest()`` (the model minus the kept terms) against the omitted part computed by the model."""
    if model_omitted is None:
        return CheckResult("truncation", None, None, None, None, "no term omitted")
    return _result("truncation", rest().sub_(model_omitted), max(scale, _max_abs(model_omitted)), s,
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
    rtol: float = 1e-9,
    *,
    isolation: bool = True,
    expansion: QKExpansion | None = None,
    limit: int = 1_000_000,
    progress: Progress | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> VerifyReport:
    """Check the expansion of head ``(layer, head)``'s pre-softmax scores (:func:`derivations.qk.expand_qk`).

    The reference is the model's ``blocks.{layer}.attn.hook_attn_scores`` (scaled by the
    model's own ``1/attn_scale``, to which the terms' ``1/sqrt(d_head)`` is bound), compared
    on the causal lower triangle (the model holds ``-inf`` above it). Check 2 isolates both
    sides of each term through the model (:func:`numeric_check.isolate.isolate_qk`: the
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
    if not isinstance(model, CircuitModel):
        working_copy(model, dtype, device)  # raises the type error
    arch.check_head(layer, head)
    build = lambda k: expand_qk(arch, layer, head, k, limit=limit)  # noqa: E731
    expansion = _resolve_expansion(expansion, QKExpansion, arch, max_order, build)
    if (expansion.layer, expansion.head) != (layer, head):
        raise ExpansionMismatch(f"the expansion is of head L{expansion.layer}H{expansion.head}, not L{layer}H{head}")
    s = _setup(model, tokens, dtype, device, atol, rtol)
    with torch.no_grad():
        return _verify_qk(s, expansion, build, isolation, progress, chunk_bytes)


def _verify_qk(s: _Setup, expansion: QKExpansion, build, isolation: bool, progress, chunk_bytes: int) -> VerifyReport:
    arch, rec, layer, head = s.model.arch, s.rec, expansion.layer, expansion.head
    kept: list[QKTerm] = list(expansion)
    n_omitted = len(QKExpansion(arch, layer, head)) - len(kept)
    full = _full_terms(build, len(kept), len(kept) + n_omitted, s.notes)
    omitted = [t for t in full if t.order > expansion.max_order] if full else []
    start = time.perf_counter()
    ev = QKEvaluator(s.binder, kept + omitted)
    below = torch.ones(rec.n_pos, rec.n_pos, dtype=torch.bool, device=s.model.device).tril()  # causal lower triangle
    reference = rec.get(f"blocks.{layer}.attn.hook_attn_scores", "the scores")[:, head]  # [b, q, k]
    scale = _max_abs(reference[:, below])
    results = []
    kept_sum = torch.zeros_like(reference)
    for i, t in enumerate(kept):
        scores = ev.scores(i)
        kept_sum = kept_sum + scores
        results.append(TermResult(t.label, t.query.source.label, t.query.heads, t.order, float(scores[:, below].norm()),
                                  composition=t.composition, key_source=t.key.source.label, key_heads=t.key.heads))
        _tick(progress, "terms", i + 1, len(kept))
    omitted_sum = sum((ev.scores(len(kept) + i) for i in range(len(omitted))), torch.zeros_like(reference))
    s.timings["evaluate"] = time.perf_counter() - start
    start = time.perf_counter()
    if isolation:
        pairs = [(t.query, t.key) for t in kept]
        for i, iso in isolate_qk(s.model, rec, layer, head, pairs, chunk_bytes=chunk_bytes):
            ours = ev.scores(i)[:, below]
            r = results[i]
            r.max_abs_error = _max_abs(ours - iso[:, below])
            r.passed = r.max_abs_error <= s.atol + s.rtol * max(scale, _max_abs(ours))
            _tick(progress, "isolation", i + 1, len(kept))
    s.timings["isolation"] = time.perf_counter() - start
    checks = [_sum_check(kept_sum[:, below], omitted_sum[:, below] if omitted else None, full, reference[:, below], scale, s),
              _isolation_check(results, isolation, scale, s)]
    start = time.perf_counter()
    model_omitted = graded_qk(s.model, rec, layer, head, expansion.max_order, chunk_bytes=chunk_bytes) if n_omitted else None
    checks.append(_truncation_check(lambda: (reference - kept_sum)[:, below],
                                    None if model_omitted is None else model_omitted[:, below], n_omitted, scale, s))
    s.timings["truncation"] = time.perf_counter() - start
    target = f"the pre-softmax scores of L{layer}H{head}"
    return _report(target, s, expansion.max_order, results, checks, scale, n_omitted)


def _isolation_check(results: Sequence[TermResult], isolation: bool, scale: float, s: _Setup) -> CheckResult:
    if not isolation:
        return CheckResult("isolation", None, None, None, None, "skipped (isolation=False)")
    errors = [r.max_abs_error for r in results]
    worst = math.nan if any(math.isnan(e) for e in errors) else max(errors, default=0.0)
    failed = [r.label for r in results if not r.passed]
    detail = f"{len(results):,} terms, each against its path isolated by the model's own hooks"
    if failed:
        detail += f"; {len(failed):,} failed, e.g. {', '.join(failed[:3])}"
    return CheckResult("isolation", not failed, worst, _relative(worst, scale), s.atol + s.rtol * scale, detail)
