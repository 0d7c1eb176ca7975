"""The source is the reference: a converted model is run beside the model it came from, on probe
tokens, before it is returned.

Every derived term is checked against :class:`~numeric_check.model.circuit_model.CircuitModel`;
this module checks that the ``CircuitModel`` computes what the user's model computes. The source
(a Hugging Face model or a TransformerLens ``HookedTransformer``) and the conversion run on the
same tokens — fixed-seed probe sequences of up to :data:`PROBE_LENGTH` positions, one more as long as the
whole context (every position compared at least once; cut to what :data:`PROBE_BYTES` allows only where the
context's attention patterns would pass it, which the check then records), and the user's own tokens when
given — and their logits must agree to
:func:`tolerance`: ``max |ours − source| ≤ tolerance · max |source|``.

The conversion is compared in float64 whatever dtype it is wanted in (a result wanted in bfloat16 is
the float64 conversion cast: :func:`in_dtype` casts it and measures that rounding, stated apart, never
added to the tolerance), so a model 1 % off is refused at every dtype. The tolerance is measured, not
guessed, probe by probe: ten times the rounding that the lowest precision the source computes in causes
on this very model at this probe's length and magnitude (the conversion run in that precision against
itself in float64, on the same tokens), and 1e-9 when everything is float64. A 4096-position context
rounds more than a 64-position one, and its tolerance follows. Hugging Face computes RMSNorm, rotary
angles, eager softmax and some scales in float32 even in a float64 model, so its models count as float32:
measured on its families with random weights and every parameter perturbed, that costs 9e-9 (GPT-NeoX)
to 4e-6 (Gemma, 3 layers) of the largest logit, where the float32 rounding of the same models is 2e-7 to
1e-6 — while the wrong conversions this check exists for differ by 1e-3 to 1.

A source held in half precision is compared as a copy of itself in float64, else in float32
(:func:`half_precision_reference`), with that copy's tolerance and its own rounding stated apart, measured on
every probe and position and bounded by the conversion's own rounding in that dtype
(:mod:`numeric_check.conversion.own_rounding`); one that runs as neither is refused
(:class:`~numeric_check.errors.SourcePrecisionError`) unless the caller accepts its precision
(``accept_source_precision=True``), which its source line then names.

When they disagree, :class:`~numeric_check.errors.SourceMismatch` says in one line by how much, against
what tolerance, and the first block that differs; its ``detail`` (``--explain`` on the command line) says
where the residual streams part (compared block by block), and what the model may use that the conversion
does not read: a module replaced or patched after the model was built (found by comparing its
modules with a fresh one built from its config on the meta device), or an option of its config.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from numeric_check.errors import ModelInputError, SourceMismatch, SourcePrecisionError
from numeric_check.model.hooks import block_hook
from numeric_check.model.rotary import tables_rounded_to
from numeric_check.conversion.own_rounding import HeldSource, OwnRounding, bounded, relative
from numeric_check.conversion.source_calls import AsCalled

PROBE_LENGTH = 64  # positions of each probe sequence at most (the source's context caps it)
#: one more probe sequence runs through the whole context, so that what acts only at later positions (a patch on
#: positions >= 1100, a window, a scaled rope) is compared too; it is cut short only where one layer's attention
#: scores at that length (float64, :data:`PATTERN_COPIES` of them alive at once) would pass this many bytes
PROBE_BYTES = 4 * 2**30
PATTERN_COPIES = 4  # scores, mask, softmax and pattern of one layer, in the source or in ours
PROBE_BATCH = 2
PROBE_SEED = 0
MARGIN = 10  # the tolerance: this many times the rounding of the lowest precision involved
FLOAT64_TOLERANCE = 1e-9  # when everything is computed in float64
HALF_TOLERANCE = 5e-2  # when a half-precision rounding cannot be measured on this device
MEASURE_BYTES = 4 * 2**30  # a half-precision source whose copy would pass this is not copied in that precision
#: a half-precision source is compared as a copy of itself in the first of these that runs
COPY_PRECISIONS = (torch.float64, torch.float32)
OPT_IN = "accept_source_precision=True (verify --accept-source-precision)"
UNMEASURED_TOLERANCE = {torch.float32: 1e-3}  # where a precision cannot run here (half: HALF_TOLERANCE)


def lowest_precision(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype of least precision among ``dtypes`` (by machine epsilon).

    >>> lowest_precision(torch.float64, torch.float32)
    torch.float32
    """
    return max(dtypes, key=lambda d: torch.finfo(d).eps)


def measured_tolerance(ours: Any, tokens: Tensor, precision: torch.dtype) -> float:
    """The relative tolerance of comparing ``ours`` with a source whose lowest precision is ``precision``, on
    ``tokens`` (:class:`Tolerance`)."""
    with torch.no_grad():
        exact = ours(tokens.to(ours.device)) if ours.dtype == torch.float64 else None
    return Tolerance(ours, precision)(tokens, exact)


class Tolerance:
    """The tolerance of each probe: :data:`MARGIN` times the rounding ``precision`` causes on this model at that probe
    (``ours`` run in ``precision`` against ``ours`` in float64 on the probe's own tokens, on ``ours``' device: its
    length and magnitude set it), or :data:`FLOAT64_TOLERANCE` when ``precision`` is float64; where ``precision``
    cannot run on the device, :data:`UNMEASURED_TOLERANCE` for it."""

    def __init__(self, ours: Any, precision: torch.dtype):
        self.ours, self.precision, self._copies = ours, precision, {}

    def _copy(self, dtype: torch.dtype) -> Any:
        if dtype == self.ours.dtype:
            return self.ours
        if dtype not in self._copies:
            self._copies[dtype] = self.ours.working_copy(dtype, self.ours.device)
        return self._copies[dtype]

    def __call__(self, tokens: Tensor, exact: Tensor | None = None) -> float:
        """The tolerance on ``tokens``; ``exact``: ``ours``' logits on them when ``ours`` is float64 (not run again)."""
        if self.precision == torch.float64:
            return FLOAT64_TOLERANCE
        rounding = self.rounding(tokens, exact, self.precision)
        if rounding is None:
            return UNMEASURED_TOLERANCE.get(self.precision, HALF_TOLERANCE)
        return max(FLOAT64_TOLERANCE, MARGIN * rounding) if rounding == rounding else HALF_TOLERANCE

    def rounding(self, tokens: Tensor, exact: Tensor | None, dtype: torch.dtype) -> float | None:
        """``ours`` run in ``dtype`` against ``ours`` in float64 on ``tokens`` (``exact``: its float64 logits there when
        ``ours`` is float64), relative to the largest logit; ``None`` where ``dtype`` cannot run on the device."""
        try:
            with torch.no_grad():
                tokens = tokens.to(self.ours.device)
                exact = exact if exact is not None and self.ours.dtype == torch.float64 else self._copy(torch.float64)(tokens)
                return relative(self._copy(dtype)(tokens), exact)
        except (RuntimeError, NotImplementedError):  # a half-precision kernel missing on this device
            return None


def _as_made(tolerance: Tolerance, source_tables: Callable[[], Any] | None) -> Callable[..., float | None]:
    """The conversion's own rounding in a dtype on tokens (:meth:`Tolerance.rounding`), the larger of it with exact
    position tables and with tables made as the source makes them (``source_tables``, where it has tables: BLOOM adds
    ALiBi's bias of key ``j``, large far into the context, in the model's dtype)."""
    def rounding(tokens: Tensor, exact: Tensor, dtype: torch.dtype) -> float | None:
        plain = tolerance.rounding(tokens, exact, dtype)
        if source_tables is None or plain is None:
            return plain
        with source_tables():
            made = tolerance.rounding(tokens, exact, dtype)
        return plain if made is None else max(plain, made)
    return rounding


def has_tables(ours: Any) -> bool:
    """Whether ``ours`` makes position tables (rotary angles, an ALiBi bias), which a source may make in float32."""
    return ours.arch.rotary is not None or bool(ours.arch.alibi)


def _gap(logits: Tensor, theirs: Tensor) -> tuple[float, float]:
    """``max |ours − theirs|`` and that over ``max |theirs|``."""
    diff = float((logits.detach().to("cpu", torch.float64) - theirs).abs().max())
    return diff, diff / max(float(theirs.abs().max()), 1e-300)


@dataclass(frozen=True)
class SourceCheck:
    """How closely a converted model computes its source's logits, as measured when it was converted.

    ``rel_diff``: ``max |ours − source| / max |source|`` over every probe (and the user's tokens
    when given); ``tokens``: how many token positions were compared, in how many sequences.
    """

    source: str  # "LlamaForCausalLM (Hugging Face, float64)"
    max_abs_diff: float
    rel_diff: float
    tolerance: float
    n_sequences: int
    n_tokens: int
    #: a source held in half precision is compared as a float64 (else float32) copy of itself; this is how far the
    #: source as held (bfloat16, float16) is from that copy, the largest over every probe and position: its own
    #: rounding, stated apart and bounded (:mod:`~numeric_check.conversion.own_rounding`)
    source_rounding: float | None = None
    held_in: str | None = None  # the source's own precision then ("bfloat16")
    #: the conversion is checked in float64; wanted in another dtype, it is the float64 conversion cast, and this is
    #: how far that cast is from it (:func:`in_dtype`): the chosen dtype's rounding, measured, never a tolerance
    rounding: float | None = None
    dtype: str | None = None  # the conversion's dtype then ("bfloat16")
    #: where the source's attention drops a setting its config names (Gemma 2's score cap under SDPA), in words
    note: str | None = None
    copied_in: str | None = None  # the precision of the copy ``source_rounding`` is measured against ("float64")
    #: the longest sequence compared, and the context: every position is compared when they are equal
    positions: int | None = None
    n_ctx: int | None = None
    #: a source that makes its position tables in float32 (rotary angles ``p · θ``, ALiBi's bias) is compared with the
    #: conversion run on such tables; this is how far those tables take the logits from exact ones, stated apart
    tables_rounding: float | None = None
    #: what was added to the source after it was built and runs in it (a hook, a replaced ``forward``), named whether
    #: the check passes or not (:func:`~numeric_check.conversion.source_calls.additions`)
    added: tuple[str, ...] = ()
    called: str | None = None  # how a plain call of the source was not compared, in words (dropout in training mode)
    #: a half-precision source compared at its own precision, as the caller accepted (``accept_source_precision``)
    accepted_at: str | None = None
    #: the source's own rounding over the conversion's own rounding in its dtype, the largest over the probes (at most
    #: :data:`~numeric_check.conversion.own_rounding.OWN_MARGIN`); None where that cannot be measured here
    own_ratio: float | None = None

    def describe(self) -> str:
        """``converted from LlamaForCausalLM (Hugging Face, float64): logits equal to the source within 3e-16 …``"""
        if self.n_tokens == 0:
            return f"converted from {self.source}; not checked against the source (check=False)"
        own = ""
        if self.source_rounding is not None:
            own = (f"; the source as held in {self.held_in} differs from its {self.copied_in or 'float64'} copy by "
                   f"{self.source_rounding:.2g} {bounded(self.held_in, self.own_ratio)}")
        if self.tables_rounding is not None:
            own += (f"; compared on position tables made in float32 as the source makes them, which take the logits "
                    f"{self.tables_rounding:.2g} from exact ones (the source's rounding, not the conversion's)")
        if self.rounding is not None:
            own += (f"; checked in float64, the conversion run in {self.dtype} differs from it by {self.rounding:.2g} "
                    f"({self.dtype}'s rounding, not a difference from the source)")
        if self.accepted_at:
            own += (f"; compared at {self.accepted_at} as accepted: a conversion off by up to the tolerance "
                    f"{self.tolerance:.2g} of the largest logit would pass too, a tamper of that size included")
        if self.called:
            own += f"; {self.called}"
        if self.added:
            shown = "; ".join(self.added[:4]) + (f"; and {len(self.added) - 4} more" if len(self.added) > 4 else "")
            own += (f"; what was added to the source after it was built runs in it, compared as it runs (the conversion "
                    f"reads its weights, not these): {shown}")
        note = f" ({self.note})" if self.note else ""
        return (f"converted from {self.source}{note}: logits equal to the source within {self.rel_diff:.2g} of their "
                f"largest entry (tolerance {self.tolerance:.2g}) on {self.n_sequences} sequences, {self.n_tokens} "
                f"tokens{self._reach()}{own}")

    def _reach(self) -> str:
        """`` (every position of the 2,048-position context)``, or how far into it the longest probe reached."""
        if self.positions is None or self.n_ctx is None:
            return ""
        if self.positions >= self.n_ctx:
            return f" (every position of the {self.n_ctx:,}-position context)"
        return (f" (positions 0 to {self.positions - 1:,} of the {self.n_ctx:,}-position context: a longer probe's "
                f"attention would pass {PROBE_BYTES / 2**30:.3g} GiB; pass check_tokens to reach further)")

    def __str__(self) -> str:
        return self.describe()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def unchecked(name: str) -> SourceCheck:
    """What a conversion made with ``check=False`` records: its source, and that it was not compared."""
    return SourceCheck(name, math.nan, math.nan, math.nan, 0, 0)


def probe_tokens(d_vocab: int, n_ctx: int, length: int | None = None) -> Tensor:
    """:data:`PROBE_BATCH` sequences of ``min(length or PROBE_LENGTH, n_ctx)`` random token ids (fixed seed)."""
    gen = torch.Generator().manual_seed(PROBE_SEED)
    n_pos = max(1, min(length or PROBE_LENGTH, n_ctx))
    return torch.randint(0, d_vocab, (PROBE_BATCH, n_pos), generator=gen, device="cpu")


def probe_batches(d_vocab: int, n_ctx: int, n_heads: int = 1) -> list[Tensor]:
    """The probes a conversion is checked on: :func:`probe_tokens`, and where the context is longer than
    :data:`PROBE_LENGTH`, one sequence through the whole context (a different draw), cut to
    :func:`long_probe_length` for a model of ``n_heads`` heads.

    >>> [tuple(b.shape) for b in probe_batches(50, 8)], [tuple(b.shape) for b in probe_batches(50, 2048, 12)]
    ([(2, 8)], [(2, 64), (1, 2048)])
    """
    batches = [probe_tokens(d_vocab, n_ctx)]
    if n_ctx > PROBE_LENGTH:
        gen = torch.Generator().manual_seed(PROBE_SEED + 1)
        batches.append(torch.randint(0, d_vocab, (1, long_probe_length(n_ctx, n_heads)), generator=gen, device="cpu"))
    return batches


def long_probe_length(n_ctx: int, n_heads: int) -> int:
    """``n_ctx``, or the longest sequence whose attention scores in one layer (``n_heads × pos²`` float64 entries,
    :data:`PATTERN_COPIES` of them) fit :data:`PROBE_BYTES`, when the whole context would not.

    >>> long_probe_length(2048, 4), long_probe_length(131072, 32)
    (2048, 2048)
    """
    fits = math.isqrt(PROBE_BYTES // (8 * PATTERN_COPIES * max(1, n_heads)))
    return max(1, min(n_ctx, max(PROBE_LENGTH, fits)))


def user_tokens(tokens: Any, d_vocab: int, n_ctx: int) -> Tensor:
    """``tokens`` as a ``[batch, pos]`` id tensor on the CPU, refused when outside the vocabulary or the context."""
    tokens = torch.as_tensor(tokens, device="cpu")
    tokens = tokens if tokens.ndim == 2 else tokens.reshape(1, -1)
    if tokens.dtype.is_floating_point or tokens.numel() == 0 or int(tokens.min()) < 0 or int(tokens.max()) >= d_vocab:
        raise ModelInputError(f"check_tokens must be token ids in 0..{d_vocab - 1}, got {tokens.tolist()!r:.80}")
    if tokens.shape[-1] > n_ctx:
        raise ModelInputError(f"check_tokens has {tokens.shape[-1]} positions, more than the context n_ctx={n_ctx}")
    return tokens.cpu()


#: runs the source on tokens: its logits and the residual stream at the input of each block
#: (``None`` where the source cannot give them)
RunSource = Callable[[Tensor], tuple[Tensor, list[Tensor] | None]]


def check_against_source(ours: Any, run_source: RunSource, name: str, precision: torch.dtype,
                         token_batches: list[Tensor], suspects: Callable[[], list[str]], who: str,
                         held: HeldSource | None = None,
                         source_tables: Callable[[], Any] = lambda: tables_rounded_to(torch.float32),
                         as_called: AsCalled | None = None) -> SourceCheck:
    """Run ``ours`` and the source on each batch of ``token_batches``; a :class:`SourceCheck` when
    their logits agree to :func:`measured_tolerance` at ``precision`` (the lowest precision the
    source computes in), else :class:`SourceMismatch` (``who`` names the conversion in its one line;
    ``suspects`` lists, in its ``detail``, what the model may use that it does not read).
    ``held``: the source as held in half precision, where the source run here is a copy of it
    (:func:`half_precision_reference`): its own rounding is measured on every probe and bounded
    (:class:`~numeric_check.conversion.own_rounding.OwnRounding`), recorded apart. ``source_tables``: a context in
    which ``ours`` makes its position tables as the source does (Hugging Face's float32 angles by default), tried
    where the exact comparison fails. ``as_called``:
    the other ways a person calls the source (:mod:`numeric_check.conversion.source_calls`), each held to the same
    tolerance, and what was added to it, named in the result whether it passes or not."""
    tolerance = Tolerance(ours, lowest_precision(precision, ours.dtype))
    own = None if held is None else OwnRounding(held, _as_made(tolerance, source_tables if has_tables(ours) else None))
    worst_abs, worst_rel, worst_tol, n_seq, n_tok, tables = 0.0, 0.0, 0.0, 0, 0, None
    for index, tokens in enumerate(token_batches):
        with torch.no_grad():
            try:
                theirs, streams = run_source(tokens)
            except Exception as error:  # noqa: BLE001 - the source's own code failed: nothing to compare with
                raise SourceMismatch(
                    f"{who}: the source ({name}) fails to run on {tokens.shape[0]} x {tokens.shape[1]} probe tokens "
                    f"({type(error).__name__}: {' '.join(str(error).split())[:200]}), so the conversion cannot be "
                    "checked against it and is refused"
                ) from None
            logits, cache = ours.run_with_cache(tokens.to(ours.device), names_filter=lambda n: n.endswith("hook_resid_pre"))
        theirs = theirs.detach().to("cpu", torch.float64)
        tol = tolerance(tokens, logits)
        diff, rel = _gap(logits, theirs)
        if not rel <= tol and has_tables(ours):  # the source may make its position tables in float32, as HF does:
            with torch.no_grad(), source_tables():  # their rounding grows with the position
                rounded = ours(tokens.to(ours.device))
            if _gap(rounded, theirs)[1] <= tol:
                diff, rel = _gap(rounded, theirs)
                tables = max(tables or 0.0, relative(rounded, logits))
                logits = rounded
        if not rel <= tol:  # NaN fails too
            first, where = _parting(cache, streams, ours, tol)
            raise SourceMismatch(
                f"{who}: the logits differ from {name.partition(' (')[0]}'s by {rel:.2g} of the largest, over the "
                f"tolerance {tol:.2g}{first}; --explain says why",
                f"the converted model's logits differ from the source's ({name}) by {rel:.2g} of their largest entry, "
                f"over the tolerance {tol:.2g} (max |difference| {diff:.2g}), on {tokens.shape[0]} x {tokens.shape[1]} "
                f"tokens\n{where}\n{_listed(suspects())}" + (f"\nwhat runs in it: {'; '.join(as_called.added)}"
                                                               if as_called is not None and as_called.added else ""))
        if as_called is not None:
            rel = max(rel, as_called.compare(tokens, index == 0, logits, tol, who, name))
        if own is not None:
            own.measure(tokens, index == 0, theirs, logits, who, name, as_called.added if as_called else [])
        worst_abs, worst_rel, worst_tol = max(worst_abs, diff), max(worst_rel, rel), max(worst_tol, tol)
        n_seq, n_tok = n_seq + tokens.shape[0], n_tok + tokens.numel()
    rounding, held_in, copied_in = (None, None, None) if own is None else (own.worst, _name(held.held), _name(held.copied_in))
    return SourceCheck(name, worst_abs, worst_rel, worst_tol, n_seq, n_tok, rounding, held_in, copied_in=copied_in,
                       own_ratio=None if own is None else own.ratio,
                       positions=max(t.shape[-1] for t in token_batches), n_ctx=ours.cfg.n_ctx, tables_rounding=tables,
                       added=tuple(as_called.added) if as_called else (),
                       called="; ".join(dict.fromkeys(as_called.notes)) or None if as_called else None)


def in_dtype(exact: Any, dtype: Any) -> Any:
    """The float64 conversion ``exact`` (checked against its source) cast to ``dtype`` in place (no copy), its
    ``source_check`` kept with the cast's own rounding added: ``max |cast − exact| / max |exact|`` on the first
    probe, measured before and after the cast (None when the dtype cannot run here)."""
    from dataclasses import replace

    from numeric_check.model.config import resolve_dtype

    dtype = resolve_dtype(dtype)
    if dtype == exact.dtype:
        return exact
    probe = probe_tokens(exact.cfg.d_vocab, exact.cfg.n_ctx).to(exact.device)
    with torch.no_grad():
        before = exact(probe)
        cast = exact.to(dtype)
        try:
            rounding = relative(cast(probe), before)
        except (RuntimeError, NotImplementedError):  # a half-precision kernel missing on this device
            rounding = None
    check = cast.source_check
    if check is not None and check.n_tokens:
        cast.source_check = replace(check, rounding=rounding, dtype=str(dtype).removeprefix("torch."))
    return cast


@dataclass(frozen=True)
class Reference:
    """What the conversion of a half-precision source is compared with: ``model`` (a copy of the source, or the
    source as held), the ``precision`` it computes in, whether it is a copy (``None`` when it is the source itself,
    else its precision: the source's own rounding is measured against it), and what the source's name adds
    (``", run as a float64 copy"``)."""

    model: Any
    precision: torch.dtype
    copied_in: torch.dtype | None
    label: str


def half_precision_reference(model: Any, run: Callable[[Any], Tensor], who: str, accept: bool = False,
                             prepare: Callable[[Any], Any | None] = lambda copied: copied) -> Reference:
    """The copy of a half-precision torch ``model`` that its conversion is compared with: in the first of
    :data:`COPY_PRECISIONS` that can be made (:func:`precision_copy`, then ``prepare``: tables made again, or
    ``None``) and runs (``run(copy)``: its logits on a probe, beside ``run(model)``), so the tolerance is that
    precision's and the source's own rounding is measured apart. At the source's own precision a conversion a few
    per cent off passes, so where no copy runs it is refused (:class:`SourcePrecisionError`, ``who`` names the
    conversion) unless ``accept``: then the source itself, its precision named on its source line."""
    held = next(iter(model.parameters())).dtype
    held_name = _name(held)
    failed: dict[torch.dtype, str] = {}
    for dtype in COPY_PRECISIONS:
        copied, failed[dtype] = precision_copy(model, dtype)
        if copied is not None and (copied := prepare(copied)) is None:
            failed[dtype] = "cannot make its tables again"
        if copied is None:
            continue
        copied.eval()
        try:
            with torch.no_grad():
                run(copied)
        except Exception as error:  # noqa: BLE001 - a hook or kernel that holds or wants the source's dtype
            failed[dtype] = f"fails to run ({type(error).__name__})"
            continue
        try:  # the source runs as it is held too (its own rounding is measured on every probe, and bounded)
            with torch.no_grad():
                run(model)
        except Exception as error:  # noqa: BLE001 - the model itself cannot run as it is held (transformers 4's CTRL
            raise SourceMismatch(  # in bfloat16: a float32 table beside bfloat16 weights), though its copy does
                f"{who}: the source ({type(model).__name__}, {held_name}) fails to run on the probe tokens "
                f"({type(error).__name__}: {' '.join(str(error).split())[:120]}), so the conversion cannot be checked "
                "against it and is refused") from None
        return Reference(copied, dtype, dtype, f", run as a {_name(dtype)} copy")
    why = _why_not_copied(failed)
    if accept:
        return Reference(model, held, None, f", compared at its own precision {held_name}, as accepted: {why}")
    raise SourcePrecisionError(
        f"{who}: {type(model).__name__} is held in {held_name} and {why}; at {held_name} a conversion a few per cent "
        f"off would pass. Load it in float32 (its hooks and replaced forwards too), or pass {OPT_IN} to compare at "
        f"{held_name}")


def precision_copy(model: Any, dtype: torch.dtype) -> tuple[Any | None, str]:
    """A copy of a torch ``model`` held in lower precision, in ``dtype`` (parameters and buffers, on its device, hooks
    and patched forwards kept), so that the source can be run free of its own rounding; or ``None`` and why: its copy
    would pass :data:`MEASURE_BYTES`, or cannot be made. Buffers keep the values the model holds (a ``bfloat16``
    ``inv_freq`` stays rounded, as the model uses it)."""
    if _too_large(model, dtype):
        return None, f"would pass {MEASURE_BYTES / 2**30:.3g} GiB"
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # TransformerLens prints a change of dtype
            return copy.deepcopy(model).to(dtype), ""
    except Exception as error:  # noqa: BLE001 - a model that cannot be copied (or converted)
        return None, f"cannot be made ({type(error).__name__})"


def _why_not_copied(failed: dict[torch.dtype, str]) -> str:
    """``its float64 and float32 copies fail to run (RuntimeError)``, or each copy with its own reason.

    >>> _why_not_copied({torch.float64: "would pass 4 GiB", torch.float32: "fails to run (RuntimeError)"})
    'its float64 copy would pass 4 GiB and its float32 copy fails to run (RuntimeError)'
    """
    reasons = {why for why in failed.values()}
    if len(reasons) == 1:
        copies = " and ".join(_name(d) for d in failed)
        why = reasons.pop()
        return f"its {copies} copies {why.replace('fails', 'fail').replace('cannot make its', 'cannot make their')}"
    return " and ".join(f"its {_name(d)} copy {why}" for d, why in failed.items())


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _too_large(model: Any, dtype: torch.dtype = torch.float64) -> bool:
    """Whether ``model``'s copy in ``dtype`` (parameters and buffers) would pass :data:`MEASURE_BYTES`."""
    n = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    return n * dtype.itemsize > MEASURE_BYTES


def _parting(cache: dict[str, Tensor], streams: list[Tensor] | None, ours: Any, tol: float) -> tuple[str, str]:
    """Where the residual streams of the two models first differ, in a few words for a refusal's line
    (``"; block 0 differs first"``, ``""`` when not known) and in a sentence for its detail."""
    if not streams:
        return "", "the source does not give its residual streams, so the block where they part is not known"
    centre = ours.arch.norm == "layer_norm"  # our writers are centred: compare centred streams
    for i, theirs in enumerate(streams[: len(ours.blocks)]):
        mine = cache[block_hook(i, "hook_resid_pre")].to("cpu", torch.float64)
        theirs = theirs.detach().to("cpu", torch.float64)
        if centre:
            mine, theirs = mine - mine.mean(-1, keepdim=True), theirs - theirs.mean(-1, keepdim=True)
        rel = float((mine - theirs).abs().max()) / max(float(theirs.abs().max()), 1e-300)
        if not rel <= tol:
            if i == 0:
                return ("; the embedding differs",
                        f"the residual streams differ already after the embedding ({rel:.2g} of their largest entry)")
            return (f"; block {i - 1} differs first",
                    f"the residual streams agree at the input of block {i - 1} and part at the input of block {i} "
                    f"({rel:.2g} of their largest entry): block {i - 1} computes something else")
    return (f"; block {len(ours.blocks) - 1} or later differs",
            "the residual streams agree at the input of every block: the last block, the final norm or the unembedding "
            "differs")


def _listed(suspects: list[str]) -> str:
    """What changed in the model since it was built, in words; where nothing is found, where to read what else may
    differ (an option its config sets that tcircuits takes to be harmless, its family's code computing otherwise)."""
    if not suspects:
        return ("no module changed since it was built (what else may differ, and what to do: the guide, 'The source is "
                "the reference')")
    shown = "; ".join(suspects[:6])
    return "changed since it was built: " + shown + (f"; and {len(suspects) - 6} more" if len(suspects) > 6 else "")


def changed_modules(model: Any, fresh: Any) -> list[str]:
    """What differs between ``model``'s modules and ``fresh`` (the same class built from the same
    config now, on the meta device): a submodule of another class, added or removed, a ``forward``
    replaced on an instance, a plain attribute (a number, flag or string) set to another value. Which
    side changed is said: an attribute that differs alike on every module that has it (each of several
    norms holds the eps it was built with, a fresh one the config's new value) is the config, edited after
    the model was built; one that differs on some modules only is those modules, changed after."""
    out: list[str] = []
    twins = dict(fresh.named_modules())
    names, attrs = set(), {}
    for name, module in model.named_modules():
        names.add(name)
        where = name or type(model).__name__
        twin = twins.get(name)
        if twin is None:
            out.append(f"{where} (a {type(module).__name__} that a fresh {type(model).__name__} does not have)")
            continue
        if type(module) is not type(twin):
            out.append(f"{where} is a {type(module).__name__} where a fresh model has a {type(twin).__name__}")
        if "forward" in vars(module) and not _library_wrapper(vars(module)["forward"]):
            out.append(f"{where}.forward was replaced on the instance")
        for attr, value in vars(module).items():
            if attr.startswith("_") or attr == "training" or not isinstance(value, (bool, int, float, str, type(None))):
                continue
            built = getattr(twin, attr, _ABSENT)
            attrs.setdefault((type(module).__name__, attr), []).append((where, value, built))
    for (kind, attr), seen in attrs.items():
        changed = [(where, value, built) for where, value, built in seen if built is _ABSENT or built != value]
        if not changed:
            continue
        values = {repr(value) for _, value, _ in changed} | {repr(built) for _, _, built in changed}
        if len(changed) == len(seen) > 1 and len(values) == 2 and changed[0][2] is not _ABSENT:
            where, value, built = changed[0]
            out.append(f"{attr} = {value!r} on all {len(seen)} {kind} modules, as the model was built, where its config "
                       f"now builds {built!r}: the config was edited after the model was built")
            continue
        for where, value, built in changed:
            out.append(f"{where}.{attr} = {value!r}, set after the model was built" if built is _ABSENT else
                       f"{where}.{attr} = {value!r}, changed after the model was built (its config builds {built!r})")
    out += [f"{name} (removed)" for name in twins if name not in names]
    return out


_ABSENT = object()


def _library_wrapper(forward: Any) -> bool:
    """Whether an instance's ``forward`` is one Hugging Face installs itself (transformers 4 wraps each layer's forward
    to record its outputs when ``output_hidden_states`` is asked for): a function whose code is in transformers."""
    code = getattr(getattr(forward, "__func__", forward), "__code__", None)
    return code is not None and f"{os.sep}transformers{os.sep}" in code.co_filename


def fresh_on_meta(build: Callable[[], Any]) -> Any | None:
    """``build()`` on the meta device (no memory for weights), or ``None`` when it cannot be built there."""
    try:
        with torch.device("meta"):
            return build()
    except Exception:  # noqa: BLE001 - a diagnosis only: a model that cannot be built on meta is not compared
        return None


def in_eval_mode(model: Any, fn: Callable[[], Any]) -> Any:
    """``fn()`` with ``model`` in eval mode (no dropout), its mode restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        return fn()
    finally:
        model.train(was_training)
