"""Evaluating the terms of a logits expansion a group at a time, batched on the term axis.

The terms of :func:`derivations.paths.expand_logits` that pass through heads come in *groups*: one
source and one set of layers ``l_1 < … < l_k``, every choice of one head per layer. In a group every
term has the same shape, and the group is a contiguous run of the expansion's order (heads in
``itertools.product`` order, the first layer's slowest). Its terms are evaluated together, as a few
batched products whatever the number of heads:

- the source's stream ``S`` (``X W_srcᵀ``, ``[batch, pos, d_model]``) is read by every head of layer
  ``l_1`` at once: ``A^{h} N (S W_V^{h}ᵀ)`` for all ``h``, ``[H_1, batch, pos, d_head]``;
- each further layer reads every row: ``Z_i = A^{h_i} N (Z_{i-1} (W_O^{h_{i-1}}ᵀ W_V^{h_i}ᵀ))``, the
  ``d_head × d_head`` products made once per pair of heads; the rows are held head-major
  (:class:`_Block`), so a layer is one product per head of the layer before and one per head and
  sequence for the patterns, whatever the number of rows;
- the last layer's ``N^{final}`` (folded into its patterns); a term is then ``y W_O^{h_k}ᵀ W_Uᵀ``, ``y``
  ``d_head`` wide, which is where :class:`~numeric_check.verification.evaluate.LogitEvaluator` leaves
  its terms too, so the rest of the verification (norms, the sum, check 2) takes either.

Rows are made in chunks of at most ``chunk_bytes``, so memory is bounded by the chunk, not by the
number of terms. Position-side atoms are applied on the narrow side (after ``W_V``); they act on
positions and the factors on features, so the order changes nothing but rounding.

:func:`plan_groups` returns ``None`` where an architecture's atoms are not of this form (a head's
``W_OV`` bound to other than two factors, a norm that is not diagonal); the caller then evaluates
every term through :class:`~numeric_check.verification.evaluate.LogitEvaluator`.

>>> from derivations.architecture import Architecture
>>> from derivations.paths import expand_logits
>>> from numeric_check.model.circuit_model import CircuitModel
>>> from numeric_check.verification.hook_paths import record
>>> from numeric_check.verification.bind import Binder
>>> model = CircuitModel.random(Architecture(2, 3, layer_norm=True), d_model=8, d_head=4, d_vocab=10, n_ctx=6,
...                             seed=0, dtype=torch.float64)
>>> binder = Binder(model, record(model, torch.tensor([[1, 2, 3, 4]])))
>>> groups = plan_groups(binder, expand_logits(model.arch, 2))
>>> [(g.source.label, g.layers, g.start, g.n_terms) for g in groups.groups], groups.singles
([('tok', (0,), 1, 3), ('tok', (1,), 4, 3), ('tok', (0, 1), 7, 9)], [0])
>>> sum(g.n_terms for g in groups.groups) + len(groups.singles) == len(expand_logits(model.arch, 2))
True
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_right
from itertools import combinations
from typing import Iterator, NamedTuple, Sequence

import torch
from torch import Tensor

from derivations.paths import LogitExpansion, StreamEntry, head_atom, layer_atom, ln_scale, post_scale, stream_entries
from derivations.sources import Path, PathTerm
from numeric_check.verification.bind import Binder
from numeric_check.verification.constants import ModelConstants
from numeric_check.verification.evaluate import FactorRef, LogitSum, LogitTermValue, flip, right_multiplier, word_factors

#: entries of one chunk of rows up to which a group is evaluated at once (float64: 32 MiB)
DEFAULT_ROW_ENTRIES = 1 << 22


class PathGroup(NamedTuple):
    """The terms of one source through one head in each of ``layers``: expansion indices
    ``start .. start + n_terms - 1``, heads in product order (the first layer's slowest)."""

    entry: StreamEntry
    layers: tuple[int, ...]
    start: int
    n_terms: int
    counts: tuple[int, ...]  # heads per layer of ``layers``

    @property
    def source(self):
        return self.entry.source


class GroupPlan(NamedTuple):
    """An expansion split into :class:`PathGroup` (``groups``) and the expansion indices of the terms
    through no head (``singles``: each source alone, ``b_U``), which are evaluated one by one."""

    groups: list[PathGroup]
    singles: list[int]


def plan_groups(binder: Binder, expansion: LogitExpansion, orders: range | None = None) -> GroupPlan | None:
    """The groups of ``expansion`` (those of an order in ``orders`` when given; other terms are in
    neither list), or ``None`` when the model's atoms are not of the form evaluated here."""
    arch = expansion.arch
    if not _grouped_form(binder):
        return None
    L, heads = arch.n_layers, arch.heads_per_layer
    groups: list[PathGroup] = []
    singles: list[int] = []
    index = 0
    for entry in stream_entries(arch, L):
        top = L - entry.first_layer if expansion.max_order is None else min(L - entry.first_layer, expansion.max_order)
        for k in range(top + 1):
            for layers in combinations(range(entry.first_layer, L), k):
                n = math.prod(heads[j] for j in layers)
                if orders is None or k in orders:
                    if k == 0:
                        singles.append(index)
                    elif n:
                        groups.append(PathGroup(entry, layers, index, n, tuple(heads[j] for j in layers)))
                index += n
    if arch.biases and (orders is None or 0 in orders):
        singles.append(index)  # b_U, the last term
    return GroupPlan(groups, singles)


def _grouped_form(binder: Binder) -> bool:
    """Whether every head's ``W_OV`` is two factors ``W_O [d_model, e]``, ``W_V [e, d_model]`` and every
    norm's frozen scale is diagonal (then a group's terms are the products evaluated here)."""
    arch, d = binder.model.arch, binder.model.cfg.d_model
    for layer, n in enumerate(arch.heads_per_layer):
        for head in range(n):
            factors = binder.factors(head_atom("W_OV", layer, head))
            if len(factors) != 2 or factors[0].shape[0] != d or factors[1].shape[1] != d \
                    or factors[0].shape[1] != factors[1].shape[0]:
                return False
        scales = ([ln_scale(layer)] if arch.pre_norm and n else []) + ([post_scale(layer)] if arch.post_norm and n else [])
        if not all(binder.position(a).diagonal for a in scales):
            return False
    return not arch.normalised or binder.position(layer_atom("N", "final")).diagonal


class _Layer(NamedTuple):
    """One layer's heads, stacked: ``W_V [H, e, d]``, ``W_O [H, d, e]``, patterns ``A [H, b, pos, pos]`` with
    the diagonal scales before (``N``) and after (``post``) attention folded in (``post · A · N``), and each
    head's remaining factor reference (``W_O^{h}ᵀ``: a term's ``left`` begins with it)."""

    W_V: Tensor
    W_O: Tensor
    W_O_rows: Tensor  # W_O^{h}ᵀ of every head, stacked as rows: [H · e, d]
    A: Tensor
    refs: list[FactorRef]


class _Block(NamedTuple):
    """Rows ``row0 …`` of a group at one depth, head-major: ``data`` ``[n, batch, pos, R, e]``, row
    ``row0 + r·n + j`` at ``data[j, :, :, r]``. Either every head of the depth's last layer (``n`` of them,
    ``row0`` a multiple of ``n``: ``R`` whole prefixes) or a run of one prefix's heads (``R = 1``, the first
    ``row0 % H``). A layer's products then take every row of a head at once, whatever their number."""

    row0: int
    data: Tensor

    def within(self, lo: int, hi: int) -> list["_Block"]:
        """Its rows ``lo … hi - 1``, as blocks of the same form (at most three: a run, whole prefixes, a run)."""
        n, R = self.data.shape[0], self.data.shape[3]
        a, b = max(lo, self.row0) - self.row0, min(hi, self.row0 + n * R) - self.row0
        if a >= b:
            return []
        if (a, b) == (0, n * R):
            return [self]
        if R == 1 or a // n == (b - 1) // n:  # within one prefix
            r = a // n
            return [_Block(self.row0 + a, self.data[a - r * n:b - r * n, :, :, r:r + 1])]
        r_a, r_b = -(-a // n), b // n  # the whole prefixes r_a … r_b - 1
        out = [_Block(self.row0 + a, self.data[a - (r_a - 1) * n:, :, :, r_a - 1:r_a])] if a < r_a * n else []
        if r_b > r_a:
            out.append(_Block(self.row0 + r_a * n, self.data[:, :, :, r_a:r_b]))
        if b > r_b * n:
            out.append(_Block(self.row0 + r_b * n, self.data[:b - r_b * n, :, :, r_b:r_b + 1]))
        return out

    def chunks(self, rows: int) -> Iterator["_Block"]:
        """Blocks of at most ``rows`` rows (at least one) that make this one, in order."""
        n, R = self.data.shape[0], self.data.shape[3]
        if n * R <= rows:
            yield self
        elif R == 1:
            for j in range(0, n, rows):
                yield _Block(self.row0 + j, self.data[j:j + rows])
        elif rows < n:  # not even one prefix's heads: each prefix in runs
            for r in range(R):
                yield from _Block(self.row0 + r * n, self.data[:, :, :, r:r + 1]).chunks(rows)
        else:
            per = rows // n
            for r in range(0, R, per):
                yield _Block(self.row0 + r * n, self.data[:, :, :, r:r + per])

    def through(self, M: Tensor, A: Tensor, n_prev: int) -> "_Block":
        """The rows one layer on: each row's ``y`` times its head's fused products ``M`` (``[n_prev, e, G · e]``,
        :meth:`GroupEvaluator.fused`: every head ``g`` of the next layer side by side), a product per head, then
        ``A`` (``[G, batch, pos, pos]``, the scales folded in), a product per head ``g`` and sequence."""
        n, b, p, R, e = self.data.shape
        G, h0 = A.shape[0], self.row0 % n_prev
        x = torch.bmm(self.data.reshape(n, b * p * R, e), M[h0:h0 + n])  # [n, b·p·R, G·e]
        x = x.view(n, b, p, R, G, e).permute(4, 1, 2, 3, 0, 5).reshape(G * b, p, R * n * e)  # rows (r, j)
        return _Block(self.row0 * G, (A.reshape(G * b, p, p) @ x).view(G, b, p, R * n, e))


def rows_of(data: Tensor) -> Tensor:
    """Head-major rows (:meth:`GroupEvaluator.blocks`, ``[H, batch, pos, R, e]``) in their order, ``[R·H, batch, pos, e]``."""
    H, b, p, R, e = data.shape
    return data.permute(3, 0, 1, 2, 4).reshape(R * H, b, p, e)


class GroupEvaluator:
    """Evaluates :class:`PathGroup` of one binder's model and batch (see the module docstring).

    :meth:`values` yields ``(first index, y)``: ``y`` ``[n, batch, pos, d_head]`` the rows of a group from
    ``first`` on, each a term's value at its narrowest point (coefficient 1). Rows come in whole runs of
    the last layer's heads, ``0 … H-1`` (so ``y`` views as ``[n / H, H, …]``, and row ``k``'s last head is
    ``k % H``); :meth:`left` gives a term's remaining multipliers from its last head.
    """

    def __init__(self, binder: Binder, row_entries: int = DEFAULT_ROW_ENTRIES, constants: ModelConstants | None = None):
        self.binder, self.constants = binder, constants  # constants: where kernels are kept between verifications
        self.row_entries = max(1, row_entries)
        self._layers: dict[int, _Layer] = {}
        self._fused: dict[tuple[int, int], Tensor] = {}
        self._streams: dict = {}
        self._kernels: dict[int, tuple[Tensor, Tensor]] = {}
        self._last: dict[int, Tensor] = {}
        self._first: tuple[object, dict[int, Tensor]] | None = None
        arch = binder.model.arch
        self._final = binder.position(layer_atom("N", "final")).value if arch.normalised else None
        self.W_U_refs = tuple(flip(f.ref) for f in reversed(word_factors(binder, (layer_atom("W_U", ""),))))

    def layer(self, layer: int) -> _Layer:
        if layer not in self._layers:
            b, arch = self.binder, self.binder.model.arch
            heads = range(arch.heads_per_layer[layer])
            atoms = [head_atom("W_OV", layer, h) for h in heads]
            W_O = torch.stack([b.factors(a)[0] for a in atoms])
            W_V = torch.stack([b.factors(a)[1] for a in atoms])
            A = torch.stack([b.position(head_atom("A", layer, h)).value for h in heads])
            N = b.position(ln_scale(layer)).value if arch.pre_norm else None
            post = b.position(post_scale(layer)).value if arch.post_norm else None
            if N is not None:  # the diagonal scales folded into the patterns: post · A · N, one product a row
                A = A * N[None, :, None, :]
            if post is not None:
                A = post[None, :, :, None] * A
            W_O_rows = W_O.transpose(1, 2).reshape(-1, W_O.shape[1]).contiguous()
            self._layers[layer] = _Layer(W_V, W_O, W_O_rows, A, [(a, 0, True) for a in atoms])
        return self._layers[layer]

    def left(self, layer: int, head: int) -> tuple[FactorRef, ...]:
        """The multipliers left to a term whose last head is ``(layer, head)``: ``W_O^{h}ᵀ`` then ``W_Uᵀ``."""
        return (self.layer(layer).refs[head],) + self.W_U_refs

    def fused(self, first: int, second: int) -> Tensor:
        """``W_O^{h}ᵀ W_V^{g}ᵀ`` for every head ``h`` of layer ``first`` and ``g`` of ``second``, laid out
        ``[H, e, G · e]`` (row ``h`` times it gives every ``g`` side by side): one product per pair of layers."""
        key = (first, second)
        if key not in self._fused:
            a, b = self.layer(first), self.layer(second)
            H, e = a.W_O.shape[0], a.W_O.shape[2]
            self._fused[key] = (a.W_O_rows @ b.W_V.reshape(-1, b.W_V.shape[2]).T).view(H, e, -1)
        return self._fused[key]

    def source_stream(self, entry: StreamEntry) -> Tensor:
        """What ``entry``'s source writes to the residual stream, ``X W_srcᵀ`` with its position word
        applied: ``[batch, pos, d_model]`` (made once per source)."""
        key = entry.source  # (not its input: every bias source reads the same ones)
        if key not in self._streams:
            b = self.binder
            x = b.source_input(entry.source)
            factors = word_factors(b, entry.word)
            if factors:  # X F_mᵀ … F_1ᵀ: the last factor gathered (tokens) or multiplied, then the others
                y = x.times_transpose(right_multiplier(b, factors[-1].ref))
                for f in reversed(factors[:-1]):
                    y = y @ right_multiplier(b, flip(f.ref))
            else:
                y = x.as_dense()
            for a in reversed(entry.position):
                pos = b.position(a)
                y = pos.value[..., None] * y if pos.diagonal else pos.value @ y
            self._streams[key] = y
        return self._streams[key]

    def values(self, group: PathGroup, copies: range | None = None) -> Iterator[tuple[int, Tensor]]:
        """The group's rows, a chunk at a time (see the class docstring); with ``copies``, only those of the
        prefixes in it (a prefix: a choice of heads at every layer but the last, numbered in product order;
        prefix ``c``'s rows are ``c · H … c · H + H - 1``), and only the rows before them that lead there."""
        for first, data in self.blocks(group, copies):
            yield first, rows_of(data)

    def blocks(self, group: PathGroup, copies: range | None = None) -> Iterator[tuple[int, Tensor]]:
        """:meth:`values` head-major, as the engine makes them: ``(first, data)``, ``data`` ``[H, batch, pos, R,
        d_head]`` the rows ``first … first + R·H - 1``, row ``first + r·H + h`` at ``data[h, :, :, r]`` (``H``: the
        last layer's heads; :func:`rows_of` gives them in order)."""
        for block in self._deeper(group, 1, _Block(0, self._first_rows(group).unsqueeze(3)), copies):
            data = block.data  # N^{final} is folded into the last layer's patterns, unless that is the first
            if self._final is not None and len(group.layers) == 1:
                data = data * self._final[None, :, :, None, None]
            yield group.start + block.row0, data

    def _first_rows(self, group: PathGroup) -> Tensor:
        """The rows at the group's first layer, ``[H, batch, pos, e]`` (kept, at each layer, for the latest
        source: its groups and their passes ask for them in turn)."""
        if self._first is None or self._first[0] != group.source:
            self._first = (group.source, {})  # the previous source's freed before the next are made
        kept, layer = self._first[1], group.layers[0]
        if layer not in kept:
            S = self.source_stream(group.entry)
            first = self.layer(layer)
            b, p, d = S.shape
            H, e = first.W_V.shape[:2]
            y = (S.reshape(b * p, d) @ first.W_V.reshape(H * e, d).T).view(b, p, H, e).permute(2, 0, 1, 3)
            kept[layer] = first.A @ y  # post · A^{h} · N (folded into A) for every head at once
        return kept[layer]

    def _deeper(self, group: PathGroup, depth: int, block: "_Block", copies: range | None) -> Iterator["_Block"]:
        layers = group.layers
        if depth == len(layers):
            yield block
            return
        pieces = [block]
        if copies is not None:  # the rows at this depth above the prefixes asked for
            below = math.prod(group.counts[depth:len(layers) - 1])  # prefixes under each row here
            pieces = block.within(copies.start // below, (copies.stop - 1) // below + 1)
        previous, here = layers[depth - 1], self.layer(layers[depth])
        M = self.fused(previous, layers[depth])  # [H_prev, e, G · e]
        A = here.A if depth + 1 < len(layers) else self.last_patterns(layers[depth])
        n_prev, n_here = self.binder.model.arch.heads_per_layer[previous], here.A.shape[0]
        for piece in pieces:
            per_row = n_here * piece.data[0, ..., 0, :].numel()
            for part in piece.chunks(max(1, self.row_entries // max(1, per_row))):
                yield from self._deeper(group, depth + 1, part.through(M, A, n_prev), copies)

    def last_patterns(self, layer: int) -> Tensor:
        """The patterns of ``layer`` (:meth:`layer`) as a group's last: with ``N^{final}`` folded in too."""
        if self._final is None:
            return self.layer(layer).A
        if layer not in self._last:
            self._last[layer] = self._final[None, :, :, None] * self.layer(layer).A
        return self._last[layer]

    # -- what the verification needs of each chunk ------------------------------------------------
    def kernels(self, layer: int, ev) -> tuple[Tensor, Tensor, Tensor]:
        """For the heads of ``layer``: a square root ``C_h`` (``C_h C_hᵀ = K_h``) of each term's Gram matrix of its
        remaining multipliers ``K_h = W_O^{h}ᵀ (W_Uᵀ W_U) W_O^{h}`` (a term's norm is then ``‖y C_h‖``), the Gram
        matrix of the part before ``W_U``, ``W_O^{h}ᵀ W_O^{h}``, ``[H, e, e]`` each (through ``ev``'s
        :meth:`~LogitEvaluator.gram`, which keeps them), and an upper bound on the largest eigenvalue of the
        second, ``[H]`` (``y W_O^{h}ᵀ W_O^{h} yᵀ ≤ top_h ‖y‖²``)."""
        if layer not in self._kernels:
            make = lambda: self._make_kernels(layer, ev)  # noqa: E731
            self._kernels[layer] = make() if self.constants is None else self.constants.get(("kernels", layer), make)
        return self._kernels[layer]

    def _make_kernels(self, layer: int, ev) -> tuple[Tensor, Tensor, Tensor]:
        n, dtype = self.binder.model.arch.heads_per_layer[layer], self.binder.model.dtype

        def grams(k: int | None) -> Tensor:  # in float64, made so where the working dtype's overflow
            kept = torch.stack([ev.gram(self.left(layer, h)[:k]) for h in range(n)])  # (float32 weights near 1e4)
            return kept.double() if bool(torch.isfinite(kept).all()) else \
                torch.stack([ev.gram(self.left(layer, h)[:k], wide=True) for h in range(n)])

        full, wide = grams(None), grams(1)
        values, vectors = torch.linalg.eigh(full)  # K = V Λ Vᵀ, Λ ≥ 0 but for rounding
        root = vectors * values.clamp_min(0).sqrt()[:, None, :]
        slack = 4 * wide.shape[-1] * torch.finfo(dtype).eps * torch.linalg.matrix_norm(wide)
        top = (torch.linalg.eigvalsh(wide)[:, -1].clamp_min(0) + slack).to(dtype)
        fits = lambda x: x.to(dtype) if bool(torch.isfinite(x.to(dtype)).all()) else x  # noqa: E731 (else float64)
        return fits(root), fits(wide), top

    def unembedding_input(self, layer: int, by_head: Tensor) -> Tensor:
        """``Σ_h y_h W_O^{h}ᵀ`` for ``by_head`` ``[H, batch, pos, e]`` (the rows of each head of ``layer``
        summed): their contribution to what reaches ``W_U``, ``[batch, pos, d_model]``."""
        here = self.layer(layer)
        n, d, e = here.W_O.shape
        b, p = by_head.shape[1:3]
        return (by_head.permute(1, 2, 0, 3).reshape(b * p, n * e) @ here.W_O_rows).view(b, p, d)


class PlanPaths(Sequence[Path]):
    """The path of every term of the expansion a :class:`GroupPlan` was made from, in its order (``direct``:
    its terms through no head, :meth:`~derivations.paths.LogitExpansion.direct_terms`), each made when asked
    for, without building the terms (a group's paths are every choice of its heads, in product order).

    >>> from derivations.architecture import Architecture
    >>> from derivations.paths import TOKEN, expand_logits
    >>> expansion = expand_logits(Architecture(2, 3), 2)
    >>> singles, groups = [0], [PathGroup(StreamEntry(TOKEN, 0, ()), (0, 1), 7, 9, (3, 3))]
    >>> PlanPaths(GroupPlan(groups, singles), expansion.direct_terms())[15].label
    'tok→L0H2→L1H2'
    """

    def __init__(self, plan: GroupPlan, direct: Sequence[PathTerm]):
        parts: list[tuple[int, object]] = [(i, t.path) for i, t in zip(plan.singles, direct)]
        parts += [(g.start, g) for g in plan.groups]
        parts.sort(key=lambda part: part[0])
        self._starts = [start for start, _ in parts]
        self._parts = [part for _, part in parts]
        self._n = max((start + (1 if isinstance(part, Path) else part.n_terms) for start, part in parts), default=0)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        i = operator.index(i)
        i = i + self._n if i < 0 else i
        if not 0 <= i < self._n:
            raise IndexError(f"term {i} of {self._n:,}")
        k = bisect_right(self._starts, i) - 1
        part = self._parts[k]
        if isinstance(part, Path):
            return part
        offset, heads = i - self._starts[k], []
        for count in reversed(part.counts):  # the last layer's head varies fastest
            offset, head = divmod(offset, count)
            heads.append(head)
        return Path.trusted(part.source, tuple(zip(part.layers, reversed(heads))))


def plan_paths(plan: GroupPlan, direct: Sequence[PathTerm]) -> PlanPaths:
    """:class:`PlanPaths` of ``plan`` (see there)."""
    return PlanPaths(plan, direct)


def group_values(ev: GroupEvaluator, group: PathGroup, first: int, y: Tensor) -> list[LogitTermValue]:
    """The rows ``y`` of ``group`` from expansion index ``first`` on as :class:`LogitTermValue` (for check 2)."""
    layer = group.layers[-1]
    lefts = [ev.left(layer, h) for h in range(ev.binder.model.arch.heads_per_layer[layer])]
    return [LogitTermValue(first + k, 1.0, row, lefts[k % len(lefts)]) for k, row in enumerate(y.unbind(0))]


class GroupSum:
    """The sum of grouped rows, kept per last layer and head (``[H, batch, pos, d_head]``) so that each
    layer's ``W_O`` is applied once, at :meth:`into`."""

    def __init__(self, grouped: GroupEvaluator):
        self.grouped = grouped
        self.by_layer: dict[int, Tensor] = {}

    def add(self, layer: int, by_head: Tensor) -> None:
        self.by_layer[layer] = by_head if layer not in self.by_layer else self.by_layer[layer] + by_head

    def into(self, total: LogitSum) -> None:
        """Add the sum, through each layer's ``W_O``, to ``total``'s part before ``W_U``."""
        key = self.grouped.W_U_refs
        for layer, by_head in self.by_layer.items():
            part = self.grouped.unembedding_input(layer, by_head)
            total.groups[key] = part if key not in total.groups else total.groups[key] + part
        self.by_layer.clear()
