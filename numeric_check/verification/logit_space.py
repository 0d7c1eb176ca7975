"""Logits seen from before the unembedding, where verification compares them.

The logits are linear in what reaches the unembedding, ``x W_Uᵀ + c b_Uᵀ``: a difference of
logits is the unembedding of a difference of its inputs, so every check of
:func:`~numeric_check.verification.verify.verify_logits` forms its differences on these
``[batch, pos, d_model (+1)]`` inputs, and unembeds only what it reports (largest entries, exactly,
by :class:`~numeric_check.verification.bounds.MaxAbsProduct`), never a ``[terms, pos, d_vocab]`` block.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from numeric_check.errors import VerifyError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.hook_paths import Recording
from numeric_check.verification.bounds import MaxAbsProduct
from numeric_check.verification.constants import UnembedConstants
from numeric_check.verification.evaluate import LogitEvaluator, LogitTermValue, right_multiplier


STACKS_LIMIT = 1 << 23  # entries of stacked factors kept (a set per layer: 11 x 12 x 64 x 768 fit, GPT-2 small)


class LogitSpace:
    """Logits seen from before the unembedding: ``[x, c] ↦ x W_Uᵀ + c b_Uᵀ``.

    A contribution to the logits is kept as its *augmented* input ``[batch, pos, d_model (+1)]``:
    what it gives ``W_Uᵀ``, and its coefficient of ``b_U`` when the model has one. Every check
    compares these (exactly equivalent, by linearity) and unembeds only what it reports:
    largest absolute entries, by :class:`~numeric_check.verification.bounds.MaxAbsProduct` (exact float64).
    ``constants``: the model's :class:`~numeric_check.verification.constants.UnembedConstants` (kept between
    verifications of one model).
    """

    def __init__(self, model: CircuitModel, rec: Recording, constants: UnembedConstants | None = None):
        self.names = ["W_U"] + (["b_U"] if model.b_U is not None else [])
        blocks = [model.W_U.detach().T] + ([model.b_U.detach()[None]] if model.b_U is not None else [])
        self.product = MaxAbsProduct(blocks, constants=constants)
        self.rec = rec
        self.model = self.of(rec.final, 1.0)  # the model's own logits
        self._stacks: dict[tuple, Tensor] = {}  # right factors stacked, by the terms' factors (see differences)

    def of(self, x: Tensor, bias: float) -> Tensor:
        """The augmented input of ``x @ W_U.T + bias * b_U``."""
        if len(self.names) == 1:
            return x
        return torch.cat([x, torch.full_like(x[..., :1], bias)], -1)

    def aug(self, parts: dict) -> Tensor:
        """The augmented input of ``Σ y @ R`` for ``{R: y}`` (:meth:`~numeric_check.verification.evaluate.LogitSum.parts`)."""
        pieces = {ref[0].name: y for ref, y in parts.items()}
        unknown = sorted(set(pieces) - set(self.names))
        if unknown:
            raise VerifyError(f"terms end in {unknown}, which the model does not unembed with; expected {self.names}")
        shape = self.model.shape[:-1]
        out = []
        for name, width in zip(self.names, [self.rec.final.shape[-1], 1]):
            piece = pieces.get(name)
            out.append(self.model.new_zeros(*shape, width) if piece is None else piece.expand(*shape, width))
        return out[0] if len(out) == 1 else torch.cat(out, -1)

    def norm(self, ev: LogitEvaluator, x: Tensor) -> float:
        """``‖x W_Uᵀ‖_F`` for ``x`` before the unembedding, from the evaluator's Gram matrix."""
        ref = ev.last_factor_named("W_U")
        if ref is None:
            return float((x @ self.product.blocks[0]).norm())
        return max(float(ev.squares(x, (ref,), torch.sum)), 0.0) ** 0.5

    def ends_in_W_U(self, value: LogitTermValue) -> bool:
        """Whether the term's last multiplier is ``W_Uᵀ`` (so its ``b_U`` coefficient is 0)."""
        return value.left[-1][0].name == "W_U"

    def widened(self, x: Tensor) -> Tensor:
        """``x`` as an augmented input: a ``b_U`` coefficient of 0 appended when the model has ``b_U``
        and ``x`` lacks it."""
        return x if x.shape[-1] == self.product.k else self.of(x, 0.0)

    def differences(self, ev: LogitEvaluator, values: Sequence[LogitTermValue], x: Tensor,
                    stacked: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """``ours - x`` before the unembedding for terms that end in ``W_Uᵀ`` (:meth:`ends_in_W_U`), ``ours``
        each term's input to it (its part, :meth:`~LogitEvaluator.parts`): ``x`` is ``[n, batch, pos,
        d_model]`` with ``x[k]`` for ``values[k]``. Each subtraction is fused into the term's last product
        (``c·y R - x`` as one ``addmm``), or is a subtraction when nothing is left to apply; terms with one
        product left of the same shape (a copy's paths through the heads of one layer, each ending in its
        ``W_O^hᵀ``) in one batched product, their factors stacked once per set of factors. ``stacked``: the
        terms' ``y`` and last factors already stacked, ``([n, ..., e], [n, e, d_model])``, coefficients all 1."""
        if stacked is not None or self._batched(values):
            return self._batched_differences(ev, values, x, stacked)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        width = x.shape[-1]
        for k, v in enumerate(values):
            y, inner = v.y, v.left[:-1]
            if not inner:
                torch.sub(x[k], y, alpha=v.coeff, out=out[k]).neg_()
                continue
            for ref in inner[:-1]:
                y = y @ right_multiplier(ev.binder, ref)
            R = right_multiplier(ev.binder, inner[-1])
            y = y.expand(*x.shape[1:-1], y.shape[-1])
            torch.addmm(x[k].reshape(-1, width), y.reshape(-1, R.shape[0]), R, beta=-1, alpha=v.coeff,
                        out=out[k].view(-1, width))
        return out

    def _batched(self, values: Sequence[LogitTermValue]) -> bool:
        """Whether the terms have one product left each, of one shape (one batched product serves them)."""
        lefts = {v.left[:-1] for v in values}
        return len(values) > 1 and all(len(inner) == 1 for inner in lefts) and len({v.y.shape for v in values}) == 1

    def _stacked(self, ev: LogitEvaluator, values: Sequence[LogitTermValue]) -> Tensor:
        """The terms' last factors before ``W_Uᵀ``, stacked ``[n, e, d_model]`` (once per set of factors)."""
        refs = tuple(v.left[0] for v in values)
        stacked = self._stacks.get(refs)
        if stacked is None:
            stacked = torch.stack([right_multiplier(ev.binder, ref) for ref in refs])
            if sum(t.numel() for t in self._stacks.values()) + stacked.numel() > STACKS_LIMIT:
                self._stacks.clear()  # (a model with more layers than fit: stacked again when met again)
            self._stacks[refs] = stacked
        return stacked

    def _stacked_y(self, ev: LogitEvaluator, values: Sequence[LogitTermValue], shape,
                   stacked: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, float]:
        """The terms' ``y`` ``[n, batch·pos, e]`` (expanded to ``shape``'s positions), their last factors (:meth:`_stacked`)
        and their one coefficient (1.0 when they differ: then each ``y`` is scaled by its own); ``stacked``: the first two
        given (see :meth:`differences`)."""
        n = len(values)
        if stacked is not None:
            y, R = stacked
            return y.expand(n, *shape[:-1], y.shape[-1]).reshape(n, -1, y.shape[-1]), R, 1.0
        y = torch.stack([v.y.expand(*shape[:-1], v.y.shape[-1]) for v in values]).view(n, -1, values[0].y.shape[-1])
        coeffs = {v.coeff for v in values}
        R = self._stacked(ev, values)
        if len(coeffs) > 1:
            return y * y.new_tensor([v.coeff for v in values]).view(n, 1, 1), R, 1.0
        return y, R, coeffs.pop()

    def _batched_differences(self, ev: LogitEvaluator, values: Sequence[LogitTermValue], x: Tensor,
                             stacked: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """:meth:`differences` of terms with one product left each, ``c_k y_k R_k - x_k``, as one ``baddbmm``."""
        n, width = len(values), x.shape[-1]
        y, R, alpha = self._stacked_y(ev, values, x.shape[1:], stacked)
        return torch.baddbmm(x.reshape(n, -1, width), y, R, beta=-1, alpha=alpha).view(x.shape)

    def products(self, ev: LogitEvaluator, values: Sequence[LogitTermValue], shape,
                 stacked: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Each term's input to ``W_Uᵀ`` (its part, :meth:`~LogitEvaluator.parts`), ``[n, *shape]`` (``shape``:
        ``[batch, pos, d_model]``), for terms that end in ``W_Uᵀ``; as one ``bmm`` where :meth:`differences` batches
        (``stacked``: as there)."""
        if stacked is not None or self._batched(values):
            y, R, alpha = self._stacked_y(ev, values, shape, stacked)
            out = torch.bmm(y, R)
            return (out if alpha == 1 else out.mul_(alpha)).view(len(values), *shape)
        return torch.stack([ev.parts(v)[v.left[-1]].expand(*shape) for v in values])
