"""The largest entry of a product ``|X F|``, exactly, without forming the product in float64.

Verification reports logit-space errors: ``max |D W_Uᵀ|`` for a difference ``D`` of
residual streams, and the scale ``max |logits|``. With a large vocabulary the product is
``[rows, d_vocab]`` and costs as much as an unembedding. :class:`MaxAbsProduct` gets the same
float64 figure with one float32 pass (about 1.9x faster on a CPU) and a few float64 rows:

1. **screen** — every row's largest ``|entry|`` of the float32 product, vocabulary chunk by
   chunk (the product is never held whole). Each row of ``X`` is first scaled by a power of
   two (exact) so that float32 neither overflows nor underflows;
2. **bound** — whatever the order of summation, a float32 dot product of length ``k`` of
   rounded inputs is within ``δ = γ_{k+2} Σ|x_i||f_i| ≤ γ_{k+2} ‖x‖ ‖f‖`` of the exact one
   (``γ_n = n u / (1 - n u)``, ``u = 2⁻²⁴``; doubled here for safety, plus underflow);
3. **refine** — only rows whose screened maximum is within ``2δ`` of the best lower bound can
   hold the true maximum; those rows are recomputed in float64 and their maximum returned.

The result is the float64 product's maximum (up to float64 summation order), not an
estimate. Inputs that are not float64 or not finite are computed directly, chunk by chunk.

>>> W = torch.randn(1000, 16, dtype=torch.float64)
>>> x = torch.randn(3, 5, 16, dtype=torch.float64)
>>> exact = float((x @ W.T).abs().max())
>>> abs(MaxAbsProduct([W.T]).max_abs([x])[0] - exact) <= 1e-15 * exact  # equal up to summation order
True
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from numeric_check.model.circuit_model import max_abs

if TYPE_CHECKING:
    from numeric_check.verification.constants import UnembedConstants

_U32 = 2.0**-24
_TINY32 = 2.0**-126  # smallest normal float32


class MaxAbsProduct:
    """``max |X F|`` for many ``X`` and one wide ``F``, given as row blocks ``F = [F_1; F_2; …]``.

    ``blocks``: matrices ``[k_i, m]`` (e.g. ``W_Uᵀ`` and ``b_U[None]``); an ``X`` is
    ``[..., Σ k_i]`` and ``X F = Σ_i X[..., block i] F_i``. ``chunk``: columns of ``F`` per
    step of the float32 screen. ``constants``: where the screen's float32 copy of ``F`` and its column
    norm are kept between verifications of one model (``F`` must then be that model's unembedding).
    """

    def __init__(self, blocks: Sequence[Tensor], chunk: int = 4096, constants: "UnembedConstants | None" = None):
        self.blocks = [b.detach() for b in blocks]
        m = {b.shape[1] for b in self.blocks}
        if len(m) != 1:
            raise ValueError(f"blocks must have the same number of columns, got shapes {[tuple(b.shape) for b in self.blocks]}")
        self.m = m.pop()
        self.widths = [b.shape[0] for b in self.blocks]
        self.k = sum(self.widths)
        self.chunk = max(1, chunk)
        self.dtype = self.blocks[0].dtype
        self._screen: tuple[Tensor, float, float] | None = None  # (Fᵀ scaled, in float32; its scale; max column norm)
        self._col_norm: float | None = None
        self._blocks_finite: bool | None = None
        self.constants = constants

    # -- the float64 product, chunk by chunk ------------------------------------------------
    def _product(self, x: Tensor, start: int, stop: int) -> Tensor:
        out, at = None, 0
        for b, w in zip(self.blocks, self.widths):
            part = x[:, at:at + w] @ b[:, start:stop]
            out = part if out is None else out + part
            at += w
        return out

    def _direct(self, x: Tensor) -> float:
        best = 0.0
        for start in range(0, self.m, self.chunk):
            p = self._product(x, start, min(self.m, start + self.chunk))
            if p.numel():
                low, high = torch.aminmax(p)
                value = float(torch.maximum(low.abs(), high.abs()))
                if math.isnan(value):
                    return math.nan
                best = max(best, value)
        return best

    @property
    def column_norm(self) -> float:
        """``max_j ‖F[:, j]‖`` (float64): ``|x · F[:, j]| ≤ ‖x‖ · column_norm`` for every row ``x``."""
        if self._col_norm is None:
            def make() -> float:
                squares = sum(torch.linalg.vector_norm(b, dim=0).pow(2) for b in self.blocks)
                return float(squares.max().sqrt()) if self.m else 0.0
            self._col_norm = make() if self.constants is None else self.constants.get("column_norm", make)
        return self._col_norm

    def bound(self, x: Tensor) -> float:
        """A rigorous upper bound on ``max |x F|`` (Cauchy-Schwarz per entry, rounding allowed for)."""
        return self.bounds(x.reshape(1, -1, self.k))[0]

    def bounds(self, xs: Tensor) -> list[float]:
        """:meth:`bound` of each ``xs[i]`` (``xs``: ``[n, ..., w]``) in one pass. ``w`` may be less than
        ``k``: the missing last columns are zeros (a residual-stream difference whose ``b_U``
        coefficient is 0), which leave every row norm unchanged.

        >>> product = MaxAbsProduct([torch.eye(3, dtype=torch.float64)])
        >>> [round(b, 9) for b in product.bounds(torch.tensor([[[3.0, 4.0, 0.0]], [[0.0, 0.0, 1.0]]], dtype=torch.float64))]
        [5.0, 1.0]
        """
        if xs.shape[-1] > self.k:
            raise ValueError(f"rows of width at most {self.k} expected, got shape {tuple(xs.shape)}")
        rows = xs.reshape(xs.shape[0], -1, xs.shape[-1])
        if not rows.numel():
            return [0.0] * xs.shape[0]
        norms = torch.linalg.vector_norm(rows, dim=2).amax(1).tolist()
        factor = self.bound_factor if rows.dtype == self.dtype else self._factor(rows.dtype)
        return [norm * factor for norm in norms]

    @property
    def bound_factor(self) -> float:
        """``f`` with ``max |x F| ≤ f · max‖x‖`` over the rows of ``x`` (the column norm, rounding allowed for)."""
        return self._factor(self.dtype)

    def _factor(self, dtype: torch.dtype) -> float:
        eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
        return self.column_norm * (1 + 4 * (self.k + 2) * eps)

    # -- the screen --------------------------------------------------------------------------
    def _screen_factor(self) -> tuple[Tensor, float, float]:
        """``Fᵀ`` scaled by a power of two into [-1, 1], in float32, ``[m, k]`` padded to a multiple of 8;
        that power of two; the column norm times it. Made once (kept in ``constants`` when given)."""
        if self._screen is None:
            self._screen = (self._make_screen_factor() if self.constants is None
                            else self.constants.get("screen", self._make_screen_factor))
        return self._screen

    def _make_screen_factor(self) -> tuple[Tensor, float, float]:
        top = max((max_abs(b) for b in self.blocks), default=0.0)
        scale = 2.0 ** -math.frexp(top)[1] if top > 0 else 1.0
        safe = 2.0**-60 <= top <= 2.0**60  # scaling after the conversion to float32 is exact
        Ft = torch.empty(self.m, -(-self.k // 8) * 8, dtype=torch.float32, device=self.blocks[0].device)
        Ft[:, self.k:] = 0
        at = 0
        for b, w in zip(self.blocks, self.widths):
            Ft[:, at:at + w] = b.T if safe else b.T * scale  # no float32 overflow or underflow
            at += w
        if safe:
            Ft.mul_(scale)
        return Ft, scale, self.column_norm * scale

    def max_abs(self, xs: Sequence[Tensor]) -> list[float]:
        """``max |x F|`` for each ``x`` in ``xs`` (0 when ``x`` is empty, nan when it holds nan)."""
        rows = [x.detach().reshape(-1, self.k) for x in xs]
        if not rows:
            return []
        usable = self.dtype == torch.float64 and all(r.dtype == torch.float64 for r in rows)
        if not usable or not self._finite(rows):
            return [self._direct(r) if r.numel() else 0.0 for r in rows]
        X = torch.cat(rows)
        if not X.numel():
            return [0.0] * len(rows)
        estimate, slack = self._screened(X)
        out, at = [], 0
        for r in rows:
            n = r.shape[0]
            out.append(self._refine(r, estimate[at:at + n], slack[at:at + n]) if n else 0.0)
            at += n
        return out

    def _finite(self, rows: list[Tensor]) -> bool:
        if self._blocks_finite is None:
            self._blocks_finite = all(math.isfinite(max_abs(b)) for b in self.blocks)
        return self._blocks_finite and all(math.isfinite(max_abs(r)) for r in rows)

    def _screened(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Per row: the screened maximum and a bound on its error, both in true units."""
        Ft, f_scale, f_norm = self._screen_factor()
        row_top = X.abs().amax(1)
        _, exponent = torch.frexp(row_top)
        row_scale = torch.where(row_top > 0, torch.ldexp(torch.ones_like(row_top), -exponent), torch.ones_like(row_top))
        X32 = torch.zeros(X.shape[0], Ft.shape[1], dtype=torch.float32, device=X.device)
        X32[:, :self.k] = X * row_scale[:, None]  # entries below 1 in magnitude
        best = torch.zeros(X.shape[0], dtype=torch.float32, device=X.device)
        for start in range(0, self.m, self.chunk):
            part = X32 @ Ft[start:start + self.chunk].T
            best = torch.maximum(best, torch.maximum(part.amax(1), part.amin(1).neg_()))  # (amax, amin: faster than aminmax(dim))
        unscale = 1.0 / (row_scale * f_scale)
        norms = torch.linalg.vector_norm(X * row_scale[:, None], dim=1)
        gamma = 2 * (self.k + 2) * _U32 / (1 - (self.k + 2) * _U32)
        slack = 2 * (gamma * norms * f_norm + (self.k + 4) * _TINY32)
        return best.double() * unscale, slack * unscale

    def _refine(self, r: Tensor, estimate: Tensor, slack: Tensor) -> float:
        """The float64 maximum over the rows that can hold it."""
        floor = float((estimate - slack).max())
        candidates = torch.nonzero(estimate + slack >= floor).flatten()
        if not candidates.numel():  # cannot happen with finite bounds; never trust an empty screen
            return self._direct(r)
        return self._direct(r[candidates])
