"""Check 2 of :func:`~numeric_check.verification.verify.verify_logits`: each term against its path
isolated through the model's own hooks, compared before the unembedding.

The model's isolated paths arrive a group at a time (one copy's paths whose last heads are in one
layer: :func:`~numeric_check.verification.isolate.isolate_final_parts`). Each term's error
``e = ours - x`` is taken before the unembedding, where it is exactly equivalent (the logits are
linear in what reaches ``W_U``), and a term passes on a rigorous bound of its logit-space error,
``max |e·w| ≤ max‖e‖ · max‖w‖``, when that is within the tolerance.

A path ending in a head arrives as the model's own ``z`` of that head (its ``hook_z`` in the
path's copy): from there the model is a fixed linear map at each position, ``x[p] = σ_p z[p] M_h``
(the head's ``W_O``, its norm after attention and ``ln_final``, their scales ``σ_p`` frozen).
:class:`HeadMaps` takes ``M_h`` from the model's own modules (on a basis, once per head) and
``σ_p`` from the same modules on a random probe, which also measures how far the modules are from
that form (their rounding). Our term is ``c y R`` with ``y`` ``d_head`` wide, so at each position

    ‖e[p]‖ ≤ ‖σ_p z[p] - c y[p]‖ ‖M_h‖₂ + |c| ‖y[p]‖ ‖M_h - R‖₂ + κ |σ_p| ‖z[p]‖ ‖M_h‖₂

(``κ`` four times that measured rounding): every quantity ``d_head`` wide, none ``d_model`` wide.
A term this does not settle (or every term, with ``exact``) is compared in full: the model's own
modules give its unembedding input (:func:`~numeric_check.verification.isolate.head_final_inputs`)
and the subtraction is fused into our term's last product (:meth:`LogitSpace.differences`); it
passes on that difference's bound, or else its largest logit-space error is computed exactly, for
all such terms in one screened pass (:class:`~numeric_check.verification.bounds.MaxAbsProduct`).
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from derivations.paths import Path
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.hook_paths import Recording
from numeric_check.verification.constants import ModelConstants
from numeric_check.model.hooks import Constant, block_hook
from numeric_check.verification.evaluate import LogitEvaluator, LogitTermValue, right_multiplier
from numeric_check.verification.isolate import GROUP_BYTES, HeadGroup, head_final_inputs, isolate_final_parts
from numeric_check.verification.logit_space import LogitSpace
from numeric_check.verification.results import TermTable


SETTLE_BYTES = 1 << 26  # the terms' errors and inputs held for one exact pass (:meth:`Settlement.finish_when_full`)


class Settlement:
    """Where check 2's terms get their verdicts: a term whose bound is within the tolerance passes on it;
    the others (every term, with ``exact``) wait for :meth:`finish`, which computes their largest
    logit-space errors exactly, in one screened pass. ``tolerance``: ``(atol, rtol, scale)``, a term's
    tolerance being ``atol + rtol · max(scale, its own largest logit)``."""

    def __init__(self, ev: LogitEvaluator, space: LogitSpace, results: TermTable,
                 tolerance: tuple[float, float, float], exact: bool):
        self.ev, self.space, self.results, self.exact = ev, space, results, exact
        self.atol, self.rtol, self.scale = tolerance
        self.tol = self.atol + self.rtol * self.scale
        self.unsettled: list[tuple[np.ndarray, Tensor, Callable[[], Tensor]]] = []  # (indices, errors, ours), a batch each
        self.held = 0  # their bytes

    def settle(self, indices: Sequence[int], errors: Tensor, bounds: Tensor, ours: Callable[[Tensor], Tensor]) -> None:
        """Terms ``indices`` with their errors ``[n, batch, pos, w]`` and error bounds ``[n]``: those whose bound is
        within the tolerance pass on it (certified: every entry of the error is at most the bound); the others wait
        for :meth:`finish`, with ``ours(k)`` (``k``: a ``[m]`` tensor of their places in ``indices``), their own inputs
        (made only for a term whose error exceeds the tolerance at ``scale``: see :meth:`finish`)."""
        indices = np.asarray(indices, dtype=np.int64)
        bound = bounds.double().cpu().numpy()
        self.results.set_bound(indices, bound)
        open_ = np.ones(len(indices), bool) if self.exact else ~(bound <= self.tol)  # a NaN bound stays open
        self.results.passed[indices[~open_]] = 1
        if open_.any():
            every = bool(open_.all())
            k = torch.as_tensor(np.flatnonzero(open_), device=errors.device)
            self.unsettled.append((indices[open_], self.space.widened(errors if every else errors[k]), lambda: ours(k)))
            self.held += 2 * self.unsettled[-1][1].numel() * errors.element_size()

    def finish_when_full(self) -> None:
        """:meth:`finish` once the waiting terms hold ``SETTLE_BYTES`` (their exact errors in as few passes as memory
        allows); the caller calls :meth:`finish` at the end."""
        if self.held >= SETTLE_BYTES:
            self.finish()

    def compare(self, group: list[LogitTermValue], x: Tensor, bias: float, stacked: tuple[Tensor, Tensor] | None = None) -> None:
        """Each term of ``group`` against its unembedding input ``x[k]`` (``bias``: ``b_U``'s coefficient), in
        full: the difference formed before the unembedding, settled on its bound. ``stacked``: the terms' ``y`` and
        last factors before ``W_Uᵀ``, already stacked (:meth:`LogitSpace.differences`)."""
        ev, space = self.ev, self.space
        indices = [v.index for v in group]
        if bias or not all(space.ends_in_W_U(v) for v in group):  # b_U on a side: augmented inputs
            mine = torch.stack([space.aug(ev.parts(v)) for v in group])
            errors = mine - space.of(x, bias)
            self.settle(indices, errors, space.product.bound_each(errors), lambda k: mine[k])
            return
        errors = space.differences(ev, group, x, stacked)  # [n, batch, pos, d_model]; b_U on neither side
        shape = x.shape[1:]  # (the closure holds no x while its terms wait)

        def ours(k: Tensor) -> Tensor:
            some = None if stacked is None else (stacked[0][k], stacked[1][k])
            return space.widened(space.products(ev, [group[i] for i in k.tolist()], shape, some))
        self.settle(indices, errors, space.product.bound_each(errors), ours)

    def finish(self) -> None:
        """The exact largest errors of the terms no bound settled, and their verdicts: one screened pass for all of
        them, read once. A term's own largest logit matters only when its error exceeds the tolerance at the logits'
        scale (``atol + rtol · max(scale, own)`` is at least that): only those terms' own inputs are made and unembedded,
        in a second pass (none when every error is within it)."""
        if not self.unsettled:
            return
        indices = np.concatenate([i for i, _, _ in self.unsettled])
        error = self.space.product.max_abs_each(torch.cat([e for _, e, _ in self.unsettled])).cpu().numpy()
        passed = error <= self.tol  # a NaN error is not
        if not passed.all():
            at, own = 0, []
            for i, _, ours in self.unsettled:  # each batch's terms over the tolerance: their own inputs
                k = np.flatnonzero(~passed[at:at + len(i)])
                at += len(i)
                if len(k):
                    mine = ours()
                    own.append((k + at - len(i), self.space.widened(mine[torch.as_tensor(k, device=mine.device)])))
            where = np.concatenate([k for k, _ in own])
            top = self.space.product.max_abs_each(torch.cat([m for _, m in own])).cpu().numpy()
            passed[where] = error[where] <= self.atol + self.rtol * np.fmax(top, self.scale)  # (a nan own: the scale)
        self.results.set_error(indices, error)
        self.results.passed[indices] = passed
        self.unsettled.clear()
        self.held = 0


def check_isolated(model: CircuitModel, rec: Recording, ev: LogitEvaluator, space: LogitSpace,
                   values: Sequence[LogitTermValue], paths: Sequence[Path], results: TermTable,
                   tolerance: tuple[float, float, float], exact: bool, chunk_bytes: int,
                   maps: "HeadMaps | None" = None) -> None:
    """Check 2 for a chunk of terms (``values``, ``paths[k]`` that of ``values[k]``): one batched isolation
    pass through the model; sets each term's ``error_bound``, ``passed`` and, when its bound does not
    settle it, ``max_abs_error`` (see :class:`Settlement`; ``tolerance`` is its). ``maps``: the model's
    :class:`HeadMaps` (made once for a verification's chunks; made here when not given)."""
    settlement = Settlement(ev, space, results, tolerance, exact)
    maps = HeadMaps(model, rec) if maps is None else maps
    for part in isolate_final_parts(model, rec, paths, chunk_bytes=chunk_bytes):
        groups = [part] if not isinstance(part, HeadGroup) else \
            _unsettled_heads(model, rec, ev, maps, space, part, values, results, settlement.tol, exact)
        for indices, x, bias in groups:
            settlement.compare([values[j] for j in indices], x, bias)
    settlement.finish()


def _unsettled_heads(model: CircuitModel, rec: Recording, ev: LogitEvaluator, maps: "HeadMaps", space: LogitSpace,
                     part: HeadGroup, values: Sequence[LogitTermValue], results: TermTable, tol: float,
                     exact: bool) -> Iterator[tuple[list[int], Tensor, float]]:
    """Certify the terms of ``part`` that :meth:`HeadMaps.bounds` settles (``passed``, ``error_bound``);
    yield the others as ``(indices, x, 0.0)``, their unembedding inputs by the model's own modules, at
    most ``GROUP_BYTES`` of them at a time."""
    keep = list(range(len(part.indices)))
    if not exact:
        bounds = maps.bounds(ev, part, [values[j] for j in part.indices])
        if bounds is not None:
            factor = space.product.bound_factor
            keep = []
            for k, (j, bound) in enumerate(zip(part.indices, bounds)):
                bound *= factor
                if bound <= tol:
                    results.set_bound(values[j].index, bound)
                    results.passed[values[j].index] = 1
                else:
                    keep.append(k)
    per_head = rec.final.numel() * rec.final.element_size()
    size = max(1, GROUP_BYTES // max(1, per_head))
    for start in range(0, len(keep), size):
        ks = keep[start:start + size]
        x = head_final_inputs(model, rec, part.layer, [part.heads[k] for k in ks], part.z[:, :, ks])
        yield [part.indices[k] for k in ks], x, 0.0


class HeadMaps:
    """What the model does after a head's ``z``, as a linear map at each position: ``x[p] = σ_p z[p] M_h``.

    Per layer, made when first needed: ``M`` ``[n_heads, d_head, d_model]``, the model's own
    ``head_outputs``, norm after attention and ``ln_final`` applied to a basis with their scales set
    to 1; ``sigma`` ``[batch, pos]``, the frozen scales' product, read off the same modules (recorded
    scales) on a random probe ``g`` of one head; ``kappa``, four times the largest ``‖F(g)[p] - σ_p g[p]
    M‖ / ‖σ_p g[p] M‖`` over the probe (the modules' rounding, or how far they are from this form);
    ``None`` for a layer whose map is not of this form (no bound is given then).
    """

    def __init__(self, model: CircuitModel, rec: Recording, constants: ModelConstants | None = None):
        self.model, self.rec = model, rec
        self._layers: dict[int, tuple[Tensor, Tensor, Tensor, float] | None] = {}
        self._gaps: dict[tuple, float] = {} if constants is None else constants.get("head map gaps", dict)
        self.constants = constants  # where M, its norms and the gaps are kept between verifications (the weights' alone)

    def layer(self, layer: int) -> tuple[Tensor, Tensor, Tensor, float] | None:
        """``(M, norms of M (spectral), sigma, kappa)`` of ``layer``, or ``None``."""
        if layer not in self._layers:
            self._layers[layer] = self._measure(layer)
        return self._layers[layer]

    @torch.no_grad()
    def _measure(self, layer: int):
        model, rec = self.model, self.rec
        e, like = model.cfg.d_head, rec.final
        make = lambda: self._map(layer)  # noqa: E731
        M, norms = make() if self.constants is None else self.constants.get(("head map", layer), make)
        # sigma: the recorded scales, on a random probe of one head (the head of largest M) at every
        # position: the scales are per position, the same for every head of the layer
        head = int(torch.linalg.matrix_norm(M).argmax())
        gen = torch.Generator(device=like.device).manual_seed(0)
        g = torch.randn(rec.n_batch, rec.n_pos, 1, e, generator=gen, dtype=like.dtype, device=like.device)
        actual = head_final_inputs(model, rec, layer, [head], g)[0]  # [b, pos, d_model]
        pred = g[:, :, 0] @ M[head]
        weight = pred.pow(2).sum(-1)
        if not bool((weight > 0).all()):
            return None
        sigma = (actual * pred).sum(-1) / weight  # [b, pos]
        scaled = sigma[..., None] * pred
        miss = torch.linalg.vector_norm(actual - scaled, dim=-1) / torch.linalg.vector_norm(scaled, dim=-1)
        kappa = 4 * max(float(miss.max()), torch.finfo(like.dtype).eps)
        if not kappa < 1e-2 or not bool(torch.isfinite(sigma).all()):
            return None
        return M, norms, sigma, kappa

    def _map(self, layer: int) -> tuple[Tensor, Tensor]:
        """``M`` of ``layer`` (the model's own modules on a basis, every scale 1) and its spectral norms: the weights' alone."""
        model, rec = self.model, self.rec
        n, e = model.arch.heads_per_layer[layer], model.cfg.d_head
        like = rec.final
        # M: the basis e_i at "position" i of one sequence, every scale 1
        basis = torch.eye(e, dtype=like.dtype, device=like.device)[None, :, None, :].expand(1, e, n, e)
        post = None if rec.cache.get(block_hook(layer, "ln1_post.hook_scale")) is None else like.new_ones(1, e, 1)
        unit = model.head_streams(layer, basis, list(range(n)), post).flatten(0, 1)  # [n, e, d_model]
        if "ln_final.hook_scale" in rec.cache:
            with model.hooks([("ln_final.hook_scale", Constant(like.new_ones(n, e, 1)))]):
                unit = model.ln_final(unit)
        else:
            unit = model.ln_final(unit)
        M = unit.view(n, e, -1)
        return M, _spectral_norms(M)

    def gaps(self, ev: LogitEvaluator, layer: int, heads: Sequence[int], refs: Sequence) -> Tensor:
        """``‖M_h - R‖`` for each head ``heads[k]`` of ``layer`` and its term's last factor ``R`` (``refs[k]``;
        Frobenius, at least the spectral norm), ``[n]``; each once per head and factor."""
        M = self.layer(layer)[0]
        values = []
        for h, ref in zip(heads, refs):
            key = (layer, h, ref)
            gap = self._gaps.get(key)
            if gap is None:
                R = right_multiplier(ev.binder, ref)
                gap = self._gaps[key] = float(torch.linalg.vector_norm(M[h] - R)) if M[h].shape == R.shape else float("inf")
            values.append(gap)
        return M.new_tensor(values)

    @torch.no_grad()
    def bounds(self, ev: LogitEvaluator, part: HeadGroup, group: Sequence[LogitTermValue]) -> list[float] | None:
        """A bound on ``max_p ‖e[p]‖`` for each term of ``part`` (see the module), or ``None`` when its
        terms or its layer are not of the form it bounds."""
        measured = self.layer(part.layer)
        if measured is None or not all(len(v.left) == 2 and v.left[-1][0].name == "W_U" for v in group):
            return None
        z = part.z.movedim(2, 0)  # [n, b, pos, e]
        if any(v.y.shape[-1] != z.shape[-1] for v in group):
            return None
        shape = z.shape[1:]  # a term's value has the batch's shape, but where it was broadcast: expanded then
        y = torch.stack([v.y if v.y.shape == shape else v.y.expand(shape) for v in group])  # [n, b, pos, e]
        coeffs = z.new_tensor([v.coeff for v in group])
        heads = part.heads
        gaps = self.gaps(ev, part.layer, heads, tuple(v.left[0] for v in group))
        return self.row_bounds(part.layer, z, y, z.new_tensor(heads, dtype=torch.long), gaps, coeffs).tolist()

    @torch.no_grad()
    def row_bounds(self, layer: int, z: Tensor, y: Tensor, heads: Tensor, gaps: Tensor, coeffs: Tensor | None = None) -> Tensor:
        """The bound on ``max_p ‖e[p]‖`` (see the module) of each row: the model's ``z`` and our ``y``
        ``[n, b, pos, d_head]``, the row's head of ``layer`` (``heads``, ``[n]``), the gap of its last
        factor (``gaps`` ``[n]``, :meth:`gaps`) and its coefficient (``coeffs`` ``[n]``; 1 when ``None``);
        ``[n]``. The layer must have a map (:meth:`layer` not ``None``)."""
        M, m_norm, sigma, kappa = self.layer(layer)
        m = m_norm[heads].view(-1, 1, 1)
        c = 1.0 if coeffs is None else coeffs.view(-1, 1, 1, 1)
        cy = c * y
        rows = lambda t: torch.linalg.vector_norm(t, dim=-1)  # noqa: E731
        bound = _bound(rows(sigma[None, ..., None] * z - cy), rows(cy), m, gaps.view(-1, 1, 1), kappa)
        return bound.flatten(1).amax(1)

    @torch.no_grad()
    def head_major_bounds(self, layer: int, z: Tensor, y: Tensor, own: Tensor, gaps: Tensor) -> Tensor:
        """:meth:`row_bounds` of rows held head-major: ``z`` and ``y`` ``[H, b, pos, R, d_head]`` (every head of
        ``layer``, ``R`` rows each), ``own`` ``‖y‖`` (``[H, b, pos, R]``), ``gaps`` ``[H]``; ``[R, H]``."""
        M, m_norm, sigma, kappa = self.layer(layer)
        err = torch.linalg.vector_norm(sigma[None, :, :, None, None] * z - y, dim=-1)
        column = (-1, 1, 1, 1)
        return _bound(err, own, m_norm.view(column), gaps.view(column), kappa).amax((1, 2)).T


def _bound(err: Tensor, own: Tensor, m: Tensor, gaps: Tensor, kappa: float) -> Tensor:
    """``(‖σz - y‖ + κ ‖σz‖) m + ‖y‖ gap`` at each position from ``err = ‖σz - y‖`` and ``own = ‖y‖``, with
    ``‖σz‖ ≤ ‖σz - y‖ + ‖y‖`` (two norms, not three)."""
    return (err * (1 + kappa) + kappa * own) * m + own * gaps


def _spectral_norms(M: Tensor) -> Tensor:
    """Upper bounds on ``‖M_h‖₂`` of a stack ``[n, r, c]``: ``sqrt(λ_max(M_h M_hᵀ))`` in float64 (the
    ``r × r`` Gram matrix: far cheaper than an SVD when ``r`` is ``d_head``), widened for its rounding."""
    A = M.double()
    gram = A @ A.transpose(1, 2) if A.shape[1] <= A.shape[2] else A.transpose(1, 2) @ A
    top = torch.linalg.eigvalsh(gram)[:, -1].clamp(min=0)
    slack = 4 * max(A.shape[1:]) * torch.finfo(torch.float64).eps * torch.linalg.matrix_norm(gram, ord="fro")
    return (top + slack).sqrt().to(M.dtype)
