"""What :func:`~numeric_check.verification.verify.verify_logits` and :func:`~numeric_check.verification.verify.verify_qk`
share: the working copy and recording (:class:`_Setup`), tolerances, the checks' results and the report, the chunk a
device can hold and the retry with a smaller one when CUDA runs out of memory, progress and expansions.
"""

from __future__ import annotations

import gc
import math
import time
from contextlib import contextmanager
from copy import deepcopy
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from numeric_check.errors import ExpansionMismatch, VerifyError
from numeric_check.model.circuit_model import CircuitModel, first_overflow, max_abs
from numeric_check.model.config import resolve_dtype
from numeric_check.verification.bind import Binder
from numeric_check.model.hooks import block_hook, hooks_set_aside
from numeric_check.verification.hook_paths import Recording, frozen_hooks, keep, record, run_frozen, unembedding_input
from numeric_check.verification.isolate import DEFAULT_CHUNK_BYTES
from numeric_check.verification.constants import ModelConstants, UnembedConstants
from numeric_check.verification.results import CheckResult, TermResult, TermTable, VerifyReport


Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class _Setup:
    model: CircuitModel  # the private working copy
    rec: Recording
    binder: Binder
    atol: float
    rtol: float
    timings: dict[str, float]
    notes: list[str]
    source: str | None = None  # how the model was converted and how closely it computes its source
    constants: UnembedConstants | None = None  # what the unembedding alone gives, kept with the user's model
    measure: bool = False  # half precision at the default tolerance: widened by the measured rounding (see widen)
    weights: ModelConstants | None = None  # what the weights alone give (kernels, head maps), kept with the user's model


def _check_tolerance(name: str, value, allow_none: bool) -> float:
    if value is None and allow_none:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise VerifyError(f"{name} must be a finite number >= 0{' or None' if allow_none else ''}, got {value!r}")
    return float(value)


def default_rtol(dtype: str | torch.dtype) -> float:
    """The relative tolerance used when none is given: 1e-9 in float64, 1e-4 in float32, 1e-2 below — except in a
    verification at half precision, whose tolerances come from the rounding it measures (:func:`widen`).

    >>> default_rtol("float32")
    0.0001
    """
    return {torch.float64: 1e-9, torch.float32: 1e-4}.get(resolve_dtype(dtype), 1e-2)


HALF = (torch.bfloat16, torch.float16)
ROUNDING_MARGIN = 3  # half precision: exact models erred at most eps x scale + 1.3x the rounding widen measures


def widen(s: _Setup, space=None, scores: tuple[int, int, Tensor] | None = None) -> None:
    """At half precision with the default tolerance (``rtol=None``: then the dtype's epsilon, bfloat16 2**-7,
    float16 2**-10): ``s.atol`` widened by :data:`ROUNDING_MARGIN` times the rounding of the model's own forward
    pass in its dtype, measured on the same tokens (once per setup).

    The rounding is the largest difference between the working copy's recorded output and the same copy
    run in float32 with the recorded patterns, scales and routing frozen (what every check freezes too):
    the logits (through ``space``, a :class:`~numeric_check.verification.logit_space.LogitSpace`, formed
    before the unembedding as the checks form theirs), or ``scores``: ``(layer, head, below)``, that head's
    scores on the keys it sees (``below``, ``[query, key]``).
    A check compares two computations in the dtype, each rounded about as much as the forward pass; sums of
    terms that cancel are rounded at the terms' scale (the verification's ``CANCELLING`` rule). A fixed
    ``rtol`` is not what half precision guarantees: an exact OPT at bfloat16 erred 0.0598 with 1e-2 of its
    logits at 0.0584."""
    if not s.measure:
        return
    s.measure = False
    work = s.model
    with torch.no_grad(), hooks_set_aside(work):
        copy = deepcopy(work)  # its weights in float32 (buffers as they are: their users cast them)
        for param in copy.parameters():
            param.data = param.data.float()
    cache = {name: x.float() if x.is_floating_point() else x for name, x in s.rec.cache.items()}
    rec = Recording(s.rec.tokens, s.rec.final.float(), cache, s.rec.W_U.float(),
                    None if s.rec.b_U is None else s.rec.b_U.float())
    dtype = str(work.dtype).removeprefix("torch.")
    if scores is None:
        final = unembedding_input(copy, rec.tokens, frozen_hooks(rec, 1))
        rounding = space.product.max_abs([space.of((s.rec.final.float() - final).to(work.dtype), 0.0)])[0]
        what = "logits"
    else:
        layer, head, below = scores
        name, seen = block_hook(layer, "attn.hook_attn_scores"), {}
        run_frozen(copy, rec, 1, [(name, keep(seen, stop=True))], live=layer)
        rounding = max_abs(s.rec.cache[name][:, head][:, below].float() - seen[name][:, head][:, below])
        what = "scores"
    if not math.isfinite(rounding):
        return
    s.atol += ROUNDING_MARGIN * rounding
    s.notes.append(f"{dtype}: the tolerances are {s.rtol:.2g} of the scale plus {ROUNDING_MARGIN} times the rounding of the "
                   f"model's {what} in {dtype}, measured against float32 on these tokens ({rounding:.2g})")


def _checked(model) -> CircuitModel:
    """``model`` itself when it is a :class:`CircuitModel`; otherwise a :class:`VerifyError` that says how to get one."""
    if not isinstance(model, CircuitModel):
        raise VerifyError(
            f"expected a numeric_check.CircuitModel, got {type(model).__name__}; convert TransformerLens or "
            "Hugging Face models with numeric_check.from_transformer_lens / from_hf_gpt2"
        )
    return model


def _setup(model, tokens, dtype, device, atol, rtol) -> _Setup:
    atol = _check_tolerance("atol", atol, True)
    measure = rtol is None and resolve_dtype(dtype) in HALF  # then its epsilon, and widen adds the measured rounding
    rtol = (torch.finfo(resolve_dtype(dtype)).eps if measure else default_rtol(dtype)) if rtol is None else \
        _check_tolerance("rtol", rtol, False)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    try:
        work = _checked(model).working_copy(dtype, device)
        rec = record(work, tokens)
    except torch.cuda.OutOfMemoryError as error:
        raise VerifyError(f"CUDA ran out of memory while copying the model to the device and recording its forward pass "
                          f"({_first_line(error)}); free memory on the card, use fewer tokens, or run with --device cpu "
                          "(device='cpu')") from None
    timings["forward"] = time.perf_counter() - start
    check_no_overflow(work, rec)
    check = model.source_check
    constants = UnembedConstants(model.W_U, model.b_U, work.dtype, work.device)
    return _Setup(work, rec, Binder(work, rec), atol, rtol, timings, _centring_notes(work, rec),
                  None if check is None else check.describe(), constants, measure, ModelConstants(model, work.dtype, work.device))


def check_no_overflow(model: CircuitModel, rec: Recording, scale: float = 0.0, error: type = VerifyError) -> None:
    """Refuse a forward pass that overflows at the working dtype (finite float32 weights near 1e37, a float16
    copy of weights beyond 65,504): its patterns, its layer norms' scales or its residual stream hold NaN or Inf
    (or ``scale``, the largest logit, is infinite). Every check would fail on numbers that are not the model's,
    or pass on them: a layer norm whose variance overflows divides by Inf, and the logits are then b_U alone.
    ``error``: the class raised (the caller's own, e.g. AttributionError)."""
    where = None if math.isfinite(scale) else "the logits"
    where = where or first_overflow(rec.cache) or first_overflow({"the final residual stream": rec.final}, ("",))
    if where is not None:
        raise error(overflow_message(model, "the model's forward pass", where))


def check_terms_finite(model: CircuitModel, results: Sequence[TermResult] | TermTable, *sums: Tensor | None) -> None:
    """Refuse terms that overflow at the working dtype where the model's own pass did not (a path's product of
    weights past 3.4e38 while the layer norms keep the stream finite): a term whose norm is NaN or Inf, or ``sums``
    (what the checks compare) that are not finite. Every check would otherwise compare NaN."""
    norms = results.norm if isinstance(results, TermTable) else np.array([r.norm for r in results], dtype=float)
    bad = np.flatnonzero(~np.isfinite(norms))
    where = None
    if bad.size:
        where = f"the term {results[int(bad[0])].label}" + (f" and {bad.size - 1:,} more" if bad.size > 1 else "")
    elif not all(bool(torch.isfinite(x).all()) for x in sums if x is not None):
        where = "the sum of the terms"
    if where is not None:
        raise VerifyError(overflow_message(model, "the expansion", where))


def overflow_message(model: CircuitModel, what: str, where: str) -> str:
    """The one line that refuses ``what`` (the forward pass, the expansion) overflowing at ``where``."""
    dtype = str(model.dtype).removeprefix("torch.")
    largest = max((max_abs(p) for p in model.parameters()), default=0.0)
    return (f"{what} overflows in {dtype}: NaN or Inf in {where} (largest weight magnitude {largest:.3g} in {dtype}); "
            "nothing was checked. Run it in float64 (--dtype float64) or with smaller weights")


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


def _result(name: str, error: Tensor, scale: float, s: _Setup, detail: str = "") -> CheckResult:
    err = max_abs(error)
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
        source=s.source,
    )


@contextmanager
def _cyclic_gc_paused():
    """Python's cyclic garbage collector paused for the block, then restored as it was. A
    verification makes tens of thousands of small objects that live to its end (terms, their
    plans, trie nodes, results); each batch of them would otherwise start a collection that
    walks all of them again (planning 51,782 order-2 terms of a GPT-2-small-sized model: 2.3 s of
    CPU, 0.9 s paused). Reference counting still frees every tensor as soon as it is unused;
    reference cycles wait for the next collection after the block."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def chunk_for(device: torch.device, chunk_bytes: int | None = None) -> int:
    """The chunk of a verification (the activations of one batched pass, in bytes): ``chunk_bytes``
    when given; otherwise :data:`~numeric_check.verification.isolate.DEFAULT_CHUNK_BYTES` on the CPU and,
    on a CUDA device, a sixteenth of its free memory now (at least 16 MiB, at most 16 times the CPU's).

    >>> chunk_for(torch.device("cpu")) == DEFAULT_CHUNK_BYTES
    True
    """
    if chunk_bytes is not None:
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise VerifyError(f"chunk_bytes must be an int >= 1 (bytes of one batched pass) or None, got {chunk_bytes!r}")
        return chunk_bytes
    if device.type != "cuda":
        return DEFAULT_CHUNK_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return int(min(max(free // 16, MIN_CHUNK_BYTES << 4), DEFAULT_CHUNK_BYTES << 4))


MIN_CHUNK_BYTES = 1 << 20  # out of memory with chunks this small: the verification stops (see _shrinking)


def _shrinking(run: Callable[[int], VerifyReport], chunk_bytes: int | None, s: _Setup) -> VerifyReport:
    """``run(chunk)``, and when the device runs out of memory in the middle of it, ``run`` again with a
    chunk a quarter the size (the report says so), down to :data:`MIN_CHUNK_BYTES`; then a one-line
    :class:`VerifyError` naming the chunk and the CPU."""
    first = chunk = chunk_for(s.model.device, chunk_bytes)
    notes = list(s.notes)
    while True:
        try:
            report = run(chunk)
        except torch.cuda.OutOfMemoryError as error:
            failure = _first_line(error)
        else:
            if chunk != first:
                report.notes.append(f"{s.model.device} ran out of memory with chunks of {_mib(first)}: verified with chunks "
                                    f"of {_mib(chunk)}")
            return report
        if s.model.device.type == "cuda":  # (the failed attempt's tensors went with its traceback)
            torch.cuda.empty_cache()
        if chunk <= MIN_CHUNK_BYTES:
            raise VerifyError(f"{s.model.device} ran out of memory in the middle of the verification even with chunks of "
                              f"{_mib(chunk)} (from {_mib(first)}; {failure}); free memory on the device, use fewer tokens "
                              "or a lower max_order, or run with --device cpu (device='cpu')")
        chunk = max(MIN_CHUNK_BYTES, chunk // 4)
        s.notes[:] = notes


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


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
