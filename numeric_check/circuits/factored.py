"""Factored matrices: a product ``F_1 F_2 … F_n`` kept as its factors.

Like TransformerLens's ``FactoredMatrix``, but for any number of factors (any word of
the algebra bound to tensors) and closed under sums. A ``vocab × vocab`` circuit such as
``W_U W_O W_V W_E`` is never materialised unless :meth:`Factored.materialize` is asked for:

- eigenvalues through ``λ(AB) = λ(BA)``: the product is rotated cyclically so that it
  starts and ends at its smallest dimension ``r``; the ``r`` eigenvalues of that small
  product are returned, and every other eigenvalue of the full product is 0;
- Frobenius norms through small Gram matrices: cut ``M = X Y`` where it is cheapest,
  ``‖M‖² = Σ (XᵀX) ∘ (YYᵀ)`` (never ``n × n`` for a large ``n``);
- SVD through the small middle matrix: cut the product at its smallest inner dimension
  ``k``, ``M = X Y``, QR both sides, SVD the ``k × k`` middle;
- rows, columns, top-k entries and the diagonal without forming the product.

Factors may carry leading batch dimensions that broadcast as in :func:`torch.matmul`
(``W_O`` of every head, ``[n_layers, n_heads, d_model, d_head]``, next to an unbatched
``W_E``). Every product is evaluated in the cheapest order a matrix-chain search finds,
counting batch sizes, so an unbatched ``W_E W_U`` is formed once and shared by all heads.
``@`` therefore only appends factors; the absorption happens when a method needs numbers.

>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> A, B = torch.randn(50, 3, generator=g), torch.randn(3, 50, generator=g)
>>> M = Factored(A, B)
>>> M.shape
torch.Size([50, 50])
>>> M.eigenvalues().shape          # 3 eigenvalues; the other 47 are zero
torch.Size([3])
>>> bool(torch.allclose(M.frobenius_norm(), torch.linalg.matrix_norm(A @ B)))
True
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

import torch
from torch import Tensor

from numeric_check.errors import FactoredError, FactoredShapeError


class TopK(NamedTuple):
    """The ``k`` largest (or smallest) entries of a row or column and their indices."""

    values: Tensor
    indices: Tensor


def _fmt(shape: Sequence[int]) -> str:
    return "[" + "×".join(str(s) for s in shape) + "]"


# --- matrix-chain planning ----------------------------------------------------------------


class ChainPlan:
    """The cheapest parenthesisation of ``F_0 … F_{n-1}``, for the whole chain and every sub-chain.

    The cost of one product counts multiply-adds times the number of batch elements it runs
    over, so unbatched sub-products are preferred: they are computed once for all heads.
    ``cost(i, j)`` and ``product(i, j)`` concern ``F_i … F_{j-1}`` (``j`` exclusive).
    """

    def __init__(self, factors: Sequence[Tensor]):
        self.factors = list(factors)
        n = len(self.factors)
        dims = _dims(self.factors)
        batches = [f.shape[:-2] for f in self.factors]
        numel = [[0] * n for _ in range(n)]
        for i in range(n):
            shape = batches[i]
            for j in range(i, n):
                shape = torch.broadcast_shapes(shape, batches[j])
                numel[i][j] = math.prod(shape)
        self.numel = numel
        cost = [[0] * n for _ in range(n)]
        split = [[i] * n for i in range(n)]
        for length in range(2, n + 1):
            for i in range(n - length + 1):
                j = i + length - 1
                cost[i][j], split[i][j] = min(
                    (cost[i][k] + cost[k + 1][j] + numel[i][j] * dims[i] * dims[k + 1] * dims[j + 1], k) for k in range(i, j)
                )
        self._cost, self._split = cost, split

    def cost(self, i: int = 0, j: int | None = None) -> int:
        return self._cost[i][(len(self.factors) if j is None else j) - 1]

    def batch_numel(self, i: int = 0, j: int | None = None) -> int:
        return self.numel[i][(len(self.factors) if j is None else j) - 1]

    def product(self, i: int = 0, j: int | None = None) -> Tensor:
        j = len(self.factors) if j is None else j
        if j - i == 1:
            return self.factors[i]
        k = self._split[i][j - 1] + 1
        return self.product(i, k) @ self.product(k, j)


def _dims(factors: Sequence[Tensor]) -> list[int]:
    return [factors[0].shape[-2]] + [f.shape[-1] for f in factors]


def chain_cost(factors: Sequence[Tensor]) -> int:
    """Multiply-adds (times batch elements) of the cheapest evaluation of ``F_1 … F_n``."""
    return ChainPlan(factors).cost()


def chain_product(factors: Sequence[Tensor]) -> Tensor:
    """``F_1 … F_n`` evaluated in the cheapest order (batch dimensions broadcast).

    >>> a, b, c = torch.ones(2, 100), torch.ones(100, 100), torch.ones(100, 2)
    >>> chain_product([a, b, c]).shape
    torch.Size([2, 2])
    """
    return ChainPlan(factors).product()


def _best_rotation(cycle: Sequence[Tensor]) -> ChainPlan:
    """The plan of the cyclic rotation of a square word that starts at its smallest dimension, cheapest first."""
    dims = [f.shape[-2] for f in cycle]
    smallest = min(dims)
    plans = [ChainPlan(list(cycle[k:]) + list(cycle[:k])) for k, d in enumerate(dims) if d == smallest]
    return min(plans, key=lambda plan: plan.cost())


def _gram_plan(factors: Sequence[Tensor]) -> tuple[Callable[[], Tensor], Callable[[], Tensor]]:
    """Gram matrices ``XᵀX`` and ``YYᵀ`` at the cheapest cut ``F_1…F_n = X Y`` (an empty side is ``I``).

    ``YYᵀ`` for ``Y = F_i … F_n`` is planned from the inside out: either ``Y`` is formed and
    multiplied by its transpose, or ``Y = P Z`` with ``P = F_i … F_{j-1}`` formed and
    ``YYᵀ = P (ZZᵀ) Pᵀ`` built on the Gram matrix of the suffix ``Z`` (memoised).
    ``XᵀX`` is the same plan on the reversed, transposed chain.
    """
    n = len(factors)
    dims = _dims(factors)
    dtype, device = factors[0].dtype, factors[0].device

    def planner(chain: Sequence[Tensor]):
        plan = ChainPlan(chain)
        chain_dims = _dims(chain)
        m = len(chain)
        memo: dict[int, tuple[int, Callable[[], Tensor]]] = {}

        def gram(i: int) -> tuple[int, Callable[[], Tensor]]:  # plan for the suffix chain[i:]
            if i in memo:
                return memo[i]
            best = None
            for j in range(i + 1, m + 1):
                if j == m:
                    cost = plan.cost(i, j) + plan.batch_numel(i, j) * chain_dims[i] ** 2 * chain_dims[m]

                    def evaluate(i=i, j=j) -> Tensor:
                        P = plan.product(i, j)
                        return P @ P.mT
                else:
                    inner_cost, inner = gram(j)
                    d_out, d_in = chain_dims[i], chain_dims[j]
                    cost = plan.cost(i, j) + inner_cost + plan.batch_numel(i, m) * (d_out * d_in**2 + d_out**2 * d_in)

                    def evaluate(i=i, j=j, inner=inner) -> Tensor:
                        P = plan.product(i, j)
                        return (P @ inner()) @ P.mT
                if best is None or cost < best[0]:
                    best = (cost, evaluate)
            memo[i] = best
            return best

        return gram

    right = planner(factors)
    left = planner([f.mT for f in reversed(factors)])  # suffix n - k of this chain is X^T for X = F_1..F_k
    options = []
    for k in range(n + 1):
        identity = (dims[k] ** 2, lambda k=k: torch.eye(dims[k], dtype=dtype, device=device))
        l_cost, l_eval = left(n - k) if k > 0 else identity
        r_cost, r_eval = right(k) if k < n else identity
        options.append((l_cost + r_cost, l_eval, r_eval))
    _, left_gram, right_gram = min(options, key=lambda option: option[0])
    return left_gram, right_gram


# --- the class ------------------------------------------------------------------------------


class Factored:
    """An immutable product ``F_1 F_2 … F_n`` of matrices, never formed unless asked.

    ``Factored(*factors, dtype=None)``: each factor is a tensor ``[..., rows, cols]``;
    consecutive factors must chain (``cols`` of one = ``rows`` of the next) and leading
    batch dimensions broadcast. ``dtype`` converts every factor (``torch.float64`` for
    verification); by default all factors are promoted to a common dtype.

    >>> g = torch.Generator().manual_seed(0)
    >>> W_U, W_O = torch.randn(40, 8, generator=g), torch.randn(8, 2, generator=g)
    >>> W_V, W_E = torch.randn(2, 8, generator=g), torch.randn(8, 40, generator=g)
    >>> ov = Factored(W_U, W_O, W_V, W_E)
    >>> ov
    Factored([40×8] @ [8×2] @ [2×8] @ [8×40], shape [40×40])
    >>> ov.svd().S.shape
    torch.Size([2])
    >>> bool(torch.allclose(ov.row(3), ov.materialize()[3], atol=1e-4))
    True
    """

    __slots__ = ("factors",)

    def __init__(self, *factors: Tensor, dtype: torch.dtype | None = None):
        if len(factors) == 1 and isinstance(factors[0], (list, tuple)):
            factors = tuple(factors[0])
        if not factors:
            raise FactoredError("Factored needs at least one factor (a tensor [..., rows, cols]), got none")
        for i, f in enumerate(factors):
            if not isinstance(f, Tensor):
                raise FactoredError(f"factor {i} must be a torch.Tensor [..., rows, cols], got {type(f).__name__}")
            if f.ndim < 2:
                raise FactoredShapeError(f"factor {i} must have at least 2 dimensions [..., rows, cols], got shape {_fmt(f.shape)}")
        for i, (left, right) in enumerate(zip(factors, factors[1:])):
            if left.shape[-1] != right.shape[-2]:
                raise FactoredShapeError(
                    f"factors {i} {_fmt(left.shape)} and {i + 1} {_fmt(right.shape)} do not chain: "
                    f"{left.shape[-1]} columns against {right.shape[-2]} rows"
                )
        try:
            torch.broadcast_shapes(*(f.shape[:-2] for f in factors))
        except RuntimeError:
            shapes = ", ".join(_fmt(f.shape) for f in factors)
            raise FactoredShapeError(f"batch dimensions of the factors do not broadcast: {shapes}") from None
        devices = {f.device for f in factors}
        if len(devices) > 1:
            raise FactoredError(f"factors are on different devices {sorted(map(str, devices))}; move them to one")
        if dtype is None:
            dtype = factors[0].dtype
            for f in factors[1:]:
                dtype = torch.promote_types(dtype, f.dtype)
        self.factors: tuple[Tensor, ...] = tuple(f.to(dtype) for f in factors)

    # --- description ------------------------------------------------------------------
    @property
    def batch_shape(self) -> torch.Size:
        """The broadcast leading dimensions of the factors (``torch.Size([])`` when there are none)."""
        return torch.broadcast_shapes(*(f.shape[:-2] for f in self.factors))

    @property
    def shape(self) -> torch.Size:
        """``batch_shape + (rows, cols)`` of the product."""
        return self.batch_shape + (self.factors[0].shape[-2], self.factors[-1].shape[-1])

    @property
    def dims(self) -> list[int]:
        """The chain of dimensions ``[rows, inner_1, …, cols]``."""
        return _dims(self.factors)

    @property
    def rank_bound(self) -> int:
        """The smallest dimension of the chain: an upper bound on the rank of the product."""
        return min(self.dims)

    @property
    def dtype(self) -> torch.dtype:
        return self.factors[0].dtype

    @property
    def device(self) -> torch.device:
        return self.factors[0].device

    def __repr__(self) -> str:
        return "Factored(" + " @ ".join(_fmt(f.shape) for f in self.factors) + f", shape {_fmt(self.shape)})"

    def to(self, dtype: torch.dtype | None = None, device: str | torch.device | None = None) -> "Factored":
        """The same product with every factor converted (``Factored.to(torch.float64)``)."""
        return Factored(*(f.to(device=device, dtype=dtype) for f in self.factors))

    # --- algebra ----------------------------------------------------------------------
    @property
    def T(self) -> "Factored":
        """The transpose: factors reversed, each transposed."""
        return Factored(*(f.mT for f in reversed(self.factors)))

    def __matmul__(self, other: "Factored | Tensor") -> "Factored | Tensor":
        """``self @ other``: a longer product (nothing is computed); a vector gives a vector."""
        if isinstance(other, Factored):
            return Factored(*self.factors, *other.factors)
        if isinstance(other, Tensor) and other.ndim == 1:
            return self._apply_right(other)
        return Factored(*self.factors, other)

    def __rmatmul__(self, other: Tensor) -> "Factored | Tensor":
        if isinstance(other, Tensor) and other.ndim == 1:
            return self._apply_left(other)
        return Factored(other, *self.factors)

    def __mul__(self, scalar: float | Tensor) -> "Factored":
        """Scalar multiple: the smallest factor absorbs the scalar."""
        if isinstance(scalar, Tensor) and scalar.numel() != 1:
            raise FactoredError(f"Factored * x needs a scalar x, got a tensor of shape {_fmt(scalar.shape)}; use @ for products")
        if not isinstance(scalar, (int, float, Tensor)) or isinstance(scalar, bool):
            return NotImplemented
        i = min(range(len(self.factors)), key=lambda k: self.factors[k].numel())
        factors = list(self.factors)
        factors[i] = factors[i] * scalar
        return Factored(*factors)

    __rmul__ = __mul__

    def __neg__(self) -> "Factored":
        return self * -1.0

    def __add__(self, other: "Factored") -> "Factored":
        """A sum as one product: ``AB + CD = [A C] [B; D]``; longer words use block-diagonal middles.

        Both products are first given the same number of factors by inserting identities
        at the smallest dimension of the shorter one.
        """
        if not isinstance(other, Factored):
            return NotImplemented
        if self.shape[-2:] != other.shape[-2:]:
            raise FactoredShapeError(f"cannot add products of shapes {_fmt(self.shape)} and {_fmt(other.shape)}")
        dtype = torch.promote_types(self.dtype, other.dtype)
        left, right = _pad_length(self.factors, len(other.factors)), _pad_length(other.factors, len(self.factors))
        left, right = [f.to(dtype) for f in left], [f.to(dtype) for f in right]
        if len(left) == 1:
            return Factored(left[0] + right[0])
        middle = [_block_diag(a, b) for a, b in zip(left[1:-1], right[1:-1])]
        first = torch.cat(_broadcast_pair(left[0], right[0]), dim=-1)
        last = torch.cat(_broadcast_pair(left[-1], right[-1]), dim=-2)
        return Factored(first, *middle, last)

    def __sub__(self, other: "Factored") -> "Factored":
        if not isinstance(other, Factored):
            return NotImplemented
        return self + (-other)

    def __getitem__(self, index: int | slice | tuple) -> "Factored":
        """Index the batch dimensions only (ints and slices): ``ov_circuits[l, h]`` is one head."""
        index = index if isinstance(index, tuple) else (index,)
        batch = self.batch_shape
        if len(index) > len(batch) or not all(isinstance(i, (int, slice)) for i in index):
            raise FactoredError(
                f"a Factored of shape {_fmt(self.shape)} takes at most {len(batch)} int or slice indices "
                f"over its batch dimensions {_fmt(batch)}, got {index!r}; use row(), col() or topk_row() for entries"
            )
        for axis, i in enumerate(index):
            if isinstance(i, int) and not -batch[axis] <= i < batch[axis]:
                raise FactoredError(f"index {i} is out of range for batch dimension {axis} of size {batch[axis]}")
        return Factored(*(_index_batch(f, index, len(batch)) for f in self.factors))

    # --- numbers ----------------------------------------------------------------------
    def materialize(self) -> Tensor:
        """The full product ``[..., rows, cols]`` (the one method that forms it)."""
        return chain_product(self.factors)

    def _require_square(self, what: str) -> None:
        rows, cols = self.shape[-2:]
        if rows != cols:
            raise FactoredError(f"{what} needs a square product, got shape {_fmt(self.shape)}")

    def eigenvalues(self) -> Tensor:
        """The ``r`` possibly non-zero eigenvalues, ``r = rank_bound`` (complex, ``[..., r]``).

        ``λ(AB) = λ(BA)`` up to zeros, so the product is rotated cyclically to start at its
        smallest dimension ``r`` and the eigenvalues of that ``r × r`` matrix are returned;
        the remaining ``rows - r`` eigenvalues of the full product are exactly 0. Order is
        whatever :func:`torch.linalg.eigvals` gives.
        """
        self._require_square("eigenvalues()")
        small = _best_rotation(self.factors).product()
        if small.dtype in (torch.float16, torch.bfloat16):
            small = small.float()
        return torch.linalg.eigvals(small)

    def trace(self) -> Tensor:
        """``tr(F_1 … F_n)`` through the cheapest cyclic rotation, ``[...]``."""
        self._require_square("trace()")
        return _best_rotation(self.factors).product().diagonal(dim1=-2, dim2=-1).sum(-1)

    def frobenius_norm(self) -> Tensor:
        """``‖F_1 … F_n‖_F`` through small Gram matrices, ``[...]``.

        Cut the product at the cheapest point ``k``, ``M = X Y``:
        ``‖M‖² = Σ (XᵀX) ∘ (YYᵀ)``, both ``d_k × d_k``. Each Gram matrix is built from the
        inside out, ``YYᵀ = P (ZZᵀ) Pᵀ`` with ``Y = P Z``, so a shared factor such as
        ``W_K W_O`` is formed once rather than twice (see :func:`_gram_plan`).
        """
        if len(self.factors) == 1:
            return torch.linalg.matrix_norm(self.factors[0])
        left_gram, right_gram = _gram_plan(self.factors)
        return (left_gram() * right_gram()).sum(dim=(-2, -1)).clamp(min=0).sqrt()

    def svd(self) -> "SVD":
        """``(U, S, V)`` with ``M = U diag(S) Vᵀ`` (V, not Vᴴ, as TransformerLens), ``r = rank_bound`` values.

        The product is cut at its smallest dimension ``k``: ``M = X Y`` with ``X = U_x R_x``
        and ``Yᵀ = U_y R_y`` (reduced QR); the SVD of the ``k × k`` middle ``R_x R_yᵀ`` gives
        ``S``, and ``U = U_x U_m``, ``V = U_y V_m``.
        """
        dims = self.dims
        k = min(range(len(dims)), key=lambda i: dims[i])
        if k in (0, len(dims) - 1):  # the product itself is thin: form it
            U, S, Vh = torch.linalg.svd(self.materialize(), full_matrices=False)
            return SVD(U, S, Vh.mT)
        X, Y = chain_product(self.factors[:k]), chain_product(self.factors[k:])
        Ux, Rx = torch.linalg.qr(X)
        Uy, Ry = torch.linalg.qr(Y.mT)
        Um, S, Vmh = torch.linalg.svd(Rx @ Ry.mT, full_matrices=False)
        return SVD(Ux @ Um, S, Uy @ Vmh.mT)

    def singular_values(self) -> Tensor:
        """The ``rank_bound`` singular values, largest first, ``[..., r]``."""
        return self.svd().S

    def row(self, i: int) -> Tensor:
        """Row ``i`` of the product, ``[..., cols]``, by vector–matrix products left to right."""
        self._check_index(i, -2, "row")
        return self._apply_left_rows(self.factors[0][..., i, :])

    def col(self, j: int) -> Tensor:
        """Column ``j`` of the product, ``[..., rows]``, by matrix–vector products right to left."""
        self._check_index(j, -1, "column")
        return self._apply_right_cols(self.factors[-1][..., :, j])

    def topk_row(self, i: int, k: int, largest: bool = True) -> TopK:
        """The ``k`` largest (``largest=False``: smallest) entries of row ``i`` and their column indices."""
        return _topk(self.row(i), k, largest, f"row {i}")

    def topk_col(self, j: int, k: int, largest: bool = True) -> TopK:
        """The ``k`` largest (``largest=False``: smallest) entries of column ``j`` and their row indices."""
        return _topk(self.col(j), k, largest, f"column {j}")

    def diag(self) -> Tensor:
        """The diagonal ``[..., n]`` of a square product: ``diag(XY) = Σ_k X[:, k] Y[k, :]`` at the cheapest cut."""
        self._require_square("diag()")
        if len(self.factors) == 1:
            return self.factors[0].diagonal(dim1=-2, dim2=-1)
        n = self.shape[-1]

        def cost(k: int) -> int:
            return chain_cost(self.factors[:k]) + chain_cost(self.factors[k:]) + n * self.dims[k]

        k = min(range(1, len(self.factors)), key=cost)
        X, Y = chain_product(self.factors[:k]), chain_product(self.factors[k:])
        return (X * Y.mT).sum(-1)

    # --- helpers ----------------------------------------------------------------------
    def _check_index(self, i: int, axis: int, what: str) -> None:
        size = self.shape[axis]
        if isinstance(i, bool) or not isinstance(i, int) or not -size <= i < size:
            raise FactoredError(f"{what} index {i!r} is out of range for a product of shape {_fmt(self.shape)}")

    def _apply_left_rows(self, v: Tensor) -> Tensor:
        for f in self.factors[1:]:
            v = (v.unsqueeze(-2) @ f).squeeze(-2)
        return v

    def _apply_right_cols(self, v: Tensor) -> Tensor:
        for f in reversed(self.factors[:-1]):
            v = (f @ v.unsqueeze(-1)).squeeze(-1)
        return v

    def _apply_left(self, v: Tensor) -> Tensor:
        """``v @ M`` for a vector ``v`` [rows]."""
        return self._apply_left_rows((v.to(self.dtype).unsqueeze(-2) @ self.factors[0]).squeeze(-2))

    def _apply_right(self, v: Tensor) -> Tensor:
        """``M @ v`` for a vector ``v`` [cols]."""
        return self._apply_right_cols((self.factors[-1] @ v.to(self.dtype).unsqueeze(-1)).squeeze(-1))


class SVD(NamedTuple):
    """``M = U diag(S) Vᵀ``: ``U [..., rows, r]``, ``S [..., r]`` (descending), ``V [..., cols, r]``."""

    U: Tensor
    S: Tensor
    V: Tensor


def _topk(values: Tensor, k: int, largest: bool, where: str) -> TopK:
    n = values.shape[-1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise FactoredError(f"k must be an int in 1..{n} for {where} of length {n}, got {k!r}")
    top = torch.topk(values, k, dim=-1, largest=largest)
    return TopK(top.values, top.indices)


def _pad_length(factors: Sequence[Tensor], length: int) -> list[Tensor]:
    """The same product with identities inserted at its smallest dimension, up to ``length`` factors."""
    factors = list(factors)
    missing = length - len(factors)
    if missing <= 0:
        return factors
    dims = _dims(factors)
    k = min(range(len(dims)), key=lambda i: dims[i])
    eye = torch.eye(dims[k], dtype=factors[0].dtype, device=factors[0].device)
    return factors[:k] + [eye] * missing + factors[k:]


def _broadcast_pair(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.expand(batch + a.shape[-2:]), b.expand(batch + b.shape[-2:])


def _block_diag(a: Tensor, b: Tensor) -> Tensor:
    """``[[a, 0], [0, b]]`` over broadcast batch dimensions."""
    a, b = _broadcast_pair(a, b)
    (ra, ca), (rb, cb) = a.shape[-2:], b.shape[-2:]
    out = a.new_zeros(a.shape[:-2] + (ra + rb, ca + cb))
    out[..., :ra, :ca] = a
    out[..., ra:, ca:] = b
    return out


def _index_batch(f: Tensor, index: tuple, n_batch: int) -> Tensor:
    """Apply a batch index to one factor whose own batch dimensions may be fewer or of size 1."""
    f = f.reshape((1,) * (n_batch - (f.ndim - 2)) + f.shape)  # align batch dimensions on the right
    parts = []
    for axis, i in enumerate(index):
        if f.shape[axis] == 1:  # broadcast dimension: every index sees the same matrix
            parts.append(0 if isinstance(i, int) else slice(None))
        else:
            parts.append(i)
    return f[tuple(parts)]


def eigenvalue_multiset_distance(a: Tensor, b: Tensor) -> float:
    """Largest distance between matched eigenvalues of two multisets (1-D, same length or zero-padded).

    Each value of ``a`` (largest modulus first) is matched to the nearest unmatched value of
    ``b``; the shorter set is padded with zeros (the eigenvalues ``eigenvalues()`` leaves out).
    A small distance means equal multisets up to rounding; order does not matter.

    >>> eigenvalue_multiset_distance(torch.tensor([1.0, 2.0, 0.0]), torch.tensor([2.0, 1.0]))
    0.0
    """
    a, b = a.detach().flatten().cpu().to(torch.complex128), b.detach().flatten().cpu().to(torch.complex128)
    n = max(a.numel(), b.numel())
    a = torch.cat([a, a.new_zeros(n - a.numel())])
    b = torch.cat([b, b.new_zeros(n - b.numel())])
    distance = (a[:, None] - b[None, :]).abs()
    used = torch.zeros(n, dtype=torch.bool)
    worst = 0.0
    for i in torch.argsort(a.abs(), descending=True).tolist():
        row = distance[i].masked_fill(used, float("inf"))
        j = int(row.argmin())
        used[j] = True
        worst = max(worst, float(row[j]))
    return worst

