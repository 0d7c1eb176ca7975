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

Where the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX: about 5x the float32 rate), a large
product (:data:`BF16_MIN_WORK`) is screened in bfloat16 instead, entry by entry: inputs rounded to
bfloat16 (``u = 2⁻⁸``), products accumulated in float32 and rounded to bfloat16 are within
``δ = 2 (3u + 4u² + 3γ_{k+2}) ‖x‖ ‖f‖`` (plus underflow) of the exact ones; the rows that can hold
the maximum are multiplied again (in the chunks of columns that can hold it) and only their entries
within ``2δ`` of the best lower bound are computed in float64, one dot product each (which gives float32
inputs their product's float64 maximum too). Where that leaves too many entries
(:data:`BF16_ENTRY_SHARE`), the float32 screen runs as above.

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
_U16 = 2.0**-8  # bfloat16's unit roundoff
_TINY32 = 2.0**-126  # smallest normal float32 (and bfloat16)
BF16_MIN_WORK = 1 << 24  # rows x k x m from which a product is screened in bfloat16 (where the CPU has it)
ROW_BLOCK = 1 << 20  # entries of a product computed at once (rows x columns; 8 MiB in float64)
BF16_ENTRY_SHARE = 64  # at most rows x m / this many entries left by the bfloat16 screen, else the float32 screen


class MaxAbsProduct:
    """``max |X F|`` for many ``X`` and one wide ``F``, given as row blocks ``F = [F_1; F_2; …]``.

    ``blocks``: matrices ``[k_i, m]`` (e.g. ``W_Uᵀ`` and ``b_U[None]``); an ``X`` is
    ``[..., Σ k_i]`` and ``X F = Σ_i X[..., block i] F_i``. ``chunk``: columns of ``F`` per
    step of a screen. ``constants``: where the screens' float32 and bfloat16 copies of ``F`` and its column
    norm are kept between verifications of one model (``F`` must then be that model's unembedding).
    """

    def __init__(self, blocks: Sequence[Tensor], chunk: int = 4096, constants: "UnembedConstants | None" = None,
                 bf16: bool | None = None):
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
        self._screen16: tuple[Tensor, float, float] | None = None  # the same in bfloat16
        self._col_norm: float | None = None
        self._blocks_finite: bool | None = None
        self.constants = constants
        self.bf16 = bf16
        self.screens = {"bf16": 0, "float32": 0}  # which screen ran, how many times (for tests and benchmarks)

    # -- the float64 product, chunk by chunk ------------------------------------------------
    def _product(self, x: Tensor, start: int, stop: int) -> Tensor:
        out, at = None, 0
        for b, w in zip(self.blocks, self.widths):
            part = x[:, at:at + w] @ b[:, start:stop]
            out = part if out is None else out + part
            at += w
        return out

    def _direct_rows(self, X: Tensor, segment: Tensor | None, n: int) -> Tensor:
        """``[n]`` float64: the largest ``|X F|`` over the rows of each segment (``segment[i]``: row ``i``'s; ``None``:
        one segment), in ``X``'s dtype, a block of rows and columns at a time; 0 for an empty segment, nan where a row
        holds nan. Read nothing back: the caller reads the verdicts once."""
        if not X.shape[0] or not self.m:
            return torch.zeros(n, dtype=torch.float64, device=X.device)
        step, blocks = max(1, ROW_BLOCK // min(self.m, self.chunk)), []
        for top in range(0, X.shape[0], step):
            x, best = X[top:top + step], None
            for start in range(0, self.m, self.chunk):
                p = self._product(x, start, min(self.m, start + self.chunk))
                top_abs = torch.maximum(p.amax(1), p.amin(1).neg_())  # amax, amin, maximum carry a nan; no |p| made
                best = top_abs if best is None else torch.maximum(best, top_abs)
            blocks.append(best)
        best = (blocks[0] if len(blocks) == 1 else torch.cat(blocks)).double()
        if segment is None:
            return best.amax().view(1)  # (amax carries a nan through)
        out = best.new_zeros(n).scatter_reduce_(0, segment, best, "amax")
        nan = best.new_zeros(n).index_add_(0, segment, best.isnan().double()) > 0
        return out.masked_fill_(nan, math.nan)

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
        return self.bound_each(xs).tolist()

    def bound_each(self, xs: Tensor) -> Tensor:
        """:meth:`bounds` as a float64 tensor ``[n]`` on ``xs``'s device (nothing read back)."""
        if xs.shape[-1] > self.k:
            raise ValueError(f"rows of width at most {self.k} expected, got shape {tuple(xs.shape)}")
        rows = xs.reshape(xs.shape[0], -1, xs.shape[-1])
        if not rows.numel():
            return torch.zeros(xs.shape[0], dtype=torch.float64, device=xs.device)
        factor = self.bound_factor if rows.dtype == self.dtype else self._factor(rows.dtype)
        return torch.linalg.vector_norm(rows, dim=2).amax(1).double() * factor

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

    def _make_screen_factor(self, dtype: torch.dtype = torch.float32) -> tuple[Tensor, float, float]:
        top = max((max_abs(b) for b in self.blocks), default=0.0)
        scale = 2.0 ** -math.frexp(top)[1] if top > 0 else 1.0
        safe = 2.0**-60 <= top <= 2.0**60  # scaling after the conversion to float32 (or bfloat16) is exact
        Ft = torch.empty(self.m, -(-self.k // 8) * 8, dtype=dtype, device=self.blocks[0].device)
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
        return self._maxima(torch.cat(rows), [r.shape[0] for r in rows]).tolist()

    def max_abs_each(self, xs: Tensor) -> Tensor:
        """:meth:`max_abs` of each ``xs[i]`` (``xs``: ``[n, ..., k]``), as a float64 tensor ``[n]`` on ``xs``'s device:
        every item in one pass, nothing read back."""
        n = xs.shape[0]
        X = xs.detach().reshape(n, -1, self.k)
        return self._maxima(X.reshape(-1, self.k), [X.shape[1]] * n)

    def _maxima(self, X: Tensor, sizes: list[int]) -> Tensor:
        """``[len(sizes)]`` float64: ``max |X_s F|`` of each run of ``sizes`` rows of ``X``."""
        n = len(sizes)
        if not X.numel():
            return torch.zeros(n, dtype=torch.float64, device=X.device)
        one = n == 1  # one item: no segments to reduce by
        segment = None if one else \
            torch.arange(n, device=X.device).repeat_interleave(torch.tensor(sizes, device=X.device), output_size=X.shape[0])
        bf16, screen = self._use_bf16(X), self.dtype == torch.float64 and X.dtype == torch.float64
        finite = (bf16 or screen) and self._finite(X)  # (read only where a screen could run)
        if bf16 and finite:
            found = self._bf16_maxima(X, sizes, torch.zeros(X.shape[0], dtype=torch.long, device=X.device) if one else segment)
            if found is not None:
                return found
        if not (screen and finite):
            return self._direct_rows(X, segment, n)
        self.screens["float32"] += 1
        estimate, slack = self._screened(X)
        # refine: only rows whose screened maximum is within 2δ of their run's best lower bound, in float64
        if one:
            candidate = estimate + slack >= (estimate - slack).amax()
            candidate |= ~candidate.any()  # cannot happen with finite bounds; never trust an empty screen
            return self._direct_rows(X[candidate], None, 1)
        floors = estimate.new_full((n,), -math.inf).scatter_reduce_(0, segment, estimate - slack, "amax")
        candidate = estimate + slack >= floors[segment]
        found = candidate.new_zeros(n, dtype=torch.long).index_add_(0, segment, candidate.long())
        candidate |= (found == 0)[segment]  # (as above)
        rows = torch.nonzero(candidate).flatten()
        return self._direct_rows(X[rows], segment[rows], n)

    def _finite(self, X: Tensor) -> bool:
        if self._blocks_finite is None:
            make = lambda: all(math.isfinite(max_abs(b)) for b in self.blocks)  # noqa: E731
            self._blocks_finite = make() if self.constants is None else self.constants.get("finite", make)
        return self._blocks_finite and bool(torch.isfinite(X).all())

    def _screened(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Per row: the screened maximum and a bound on its error, both in true units."""
        Ft, f_scale, f_norm = self._screen_factor()
        row_top = X.abs().amax(1)
        _, exponent = torch.frexp(row_top)
        row_scale = torch.where(row_top > 0, torch.ldexp(torch.ones_like(row_top), -exponent), torch.ones_like(row_top))
        scaled = X * row_scale[:, None]  # entries below 1 in magnitude (exact: powers of two)
        X32 = torch.zeros(X.shape[0], Ft.shape[1], dtype=torch.float32, device=X.device)
        X32[:, :self.k] = scaled
        # on a CPU a block of rows at a time, so that the product stays in cache (10,816 x 128 rows against 1,000
        # columns: 45 against 73 ms of products); a GPU takes them all at once
        step, blocks = max(1, ROW_BLOCK // min(self.m, self.chunk) if X.device.type == "cpu" else X.shape[0]), []
        for top in range(0, X.shape[0], step):
            x, best = X32[top:top + step], None
            for start in range(0, self.m, self.chunk):
                part = x @ Ft[start:start + self.chunk].T
                found = torch.maximum(part.amax(1), part.amin(1).neg_())  # (amax, amin: faster than aminmax(dim))
                best = found if best is None else torch.maximum(best, found)
            blocks.append(best)
        best = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
        unscale = 1.0 / (row_scale * f_scale)
        norms = torch.linalg.vector_norm(scaled, dim=1)
        gamma = 2 * (self.k + 2) * _U32 / (1 - (self.k + 2) * _U32)
        slack = 2 * (gamma * norms * f_norm + (self.k + 4) * _TINY32)
        return best.double() * unscale, slack * unscale

    # -- the bfloat16 screen -----------------------------------------------------------------
    def _use_bf16(self, X: Tensor) -> bool:
        if self.bf16 is False or X.device.type != "cpu" or not X.dtype.is_floating_point or not bf16_screen_available():
            return False
        return bool(self.bf16) or X.shape[0] * self.k * self.m >= BF16_MIN_WORK

    def _bf16_factor(self) -> tuple[Tensor, float, float]:
        """:meth:`_screen_factor` in bfloat16 (kept in ``constants`` when given)."""
        if self._screen16 is None:
            make = lambda: self._make_screen_factor(torch.bfloat16)  # noqa: E731
            self._screen16 = make() if self.constants is None else self.constants.get("screen16", make)
        return self._screen16

    def _bf16_maxima(self, X: Tensor, sizes: list[int], segment: Tensor) -> Tensor | None:
        """``max |X_s F|`` of each run of ``sizes`` rows of ``X`` (finite) by the bfloat16 screen (see the module),
        or ``None`` when it leaves more than ``rows · m / BF16_ENTRY_SHARE`` entries to compute."""
        self.screens["bf16"] += 1
        Ft, f_scale, f_norm = self._bf16_factor()
        n = X.shape[0]
        row_top = X.abs().amax(1)
        _, exponent = torch.frexp(row_top)
        row_scale = torch.where(row_top > 0, torch.ldexp(torch.ones_like(row_top), -exponent), torch.ones_like(row_top))
        scaled = X * row_scale[:, None]  # exact: entries below 1 in magnitude
        X16 = torch.zeros(n, Ft.shape[1], dtype=torch.bfloat16, device=X.device)
        X16[:, :self.k] = scaled
        tops = []  # each chunk's largest |screened| entry of each row, [n] each
        for start in range(0, self.m, self.chunk):
            part = X16 @ Ft[start:start + self.chunk].T
            tops.append(torch.maximum(part.amax(1), part.amin(1).neg_()))
        best = torch.stack(tops).amax(0)
        norms = torch.linalg.vector_norm(scaled.double(), dim=1)
        gamma = (self.k + 2) * _U32 / (1 - (self.k + 2) * _U32)
        delta = 2 * ((3 * _U16 + 4 * _U16**2 + 3 * gamma) * norms * f_norm + 4 * (self.k + 4) * _TINY32)
        units = row_scale.double() * f_scale  # screened units per true unit, per row
        low, high = (best.double() - delta) / units, (best.double() + delta) / units
        floors = torch.full((len(sizes),), -math.inf, dtype=torch.float64, device=X.device)
        floors.scatter_reduce_(0, segment, low, "amax")
        # an entry can hold its run's maximum when |screened| ≥ (floor - δ) in its row's units: the threshold
        # lowered past bfloat16's rounding; a row that cannot hold it (or is zero) gets an infinite one
        tau = floors[segment] * units - delta
        tau = torch.where((high >= floors[segment]) & (norms > 0), tau - tau.abs() * 2.0**-7, math.inf).to(torch.bfloat16)
        limit = max(4096, n * self.m // BF16_ENTRY_SHARE)
        found, count = [], 0
        for top, start in zip(tops, range(0, self.m, self.chunk)):  # again, only the rows whose chunk can hold one
            rows = torch.nonzero(top >= tau).flatten()
            if not rows.numel():
                continue
            part = X16[rows] @ Ft[start:start + self.chunk].T
            at = torch.nonzero(part.abs_() >= tau[rows, None])
            count += at.shape[0]
            if count > limit:
                return None
            found.append((rows[at[:, 0]], at[:, 1] + start))
        maxima = torch.zeros(len(sizes), dtype=torch.float64, device=X.device)
        if found:
            i, j = torch.cat([f[0] for f in found]), torch.cat([f[1] for f in found])
            for c in range(0, i.shape[0], 4096):
                ic, jc = i[c:c + 4096], j[c:c + 4096]
                maxima.scatter_reduce_(0, segment[ic], self._entries(X, ic, jc).abs(), "amax")
        return maxima

    def _entries(self, X: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """``(X F)[i[t], j[t]]`` for each ``t``, each a dot product in float64."""
        x = X[i].double()
        out, at = None, 0
        for b, w in zip(self.blocks, self.widths):
            part = (x[:, at:at + w] * b.T[j].double()).sum(1)  # (b: often W_Uᵀ, whose columns are W_U's rows)
            out = part if out is None else out + part
            at += w
        return out


_BF16: list[bool] = []  # whether this CPU's bfloat16 products accumulate in float32 (probed once)


def bf16_screen_available() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX, through oneDNN) with float32
    accumulation, as the bfloat16 screen's bound assumes: a probe whose sum bfloat16 accumulation would lose."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    if not _BF16:
        native = any(getattr(torch.cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
        ok = False
        if native:
            k = 776  # 1 + 775 · 2⁻⁹: each 2⁻⁹ is lost to a bfloat16 sum near 1, kept by a float32 one
            a = torch.full((16, k), 2.0**-9, dtype=torch.bfloat16, device="cpu")  # a probe of the CPU itself
            a[:, 0] = 1
            got = (a @ torch.ones(4096, k, dtype=torch.bfloat16, device="cpu").T).double()
            exact = 1 + (k - 1) * 2.0**-9
            ok = bool(((got - exact).abs() <= 3 * _U16 * exact).all())
        _BF16.append(ok)
    return _BF16[0]
