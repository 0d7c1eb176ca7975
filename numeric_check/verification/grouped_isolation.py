"""Check 2 for the grouped terms (:mod:`~numeric_check.verification.grouped`): a group's rows against the
model's own ``z`` of their paths, isolated a group of prefixes at a time.

A group's paths (one source, layers ``l_1 < … < l_k``, every choice of one head per layer) have as
prefixes every choice of heads at ``l_1 … l_{k-1}``, in the same product order: a *prefix group*.
One batched pass of the model over one copy of the batch per prefix (:class:`PrefixPasses`) gives,
at every later layer ``l``, the model's ``attn.hook_z`` of each of its heads in each copy: the paths
of the group ``l_1 … l_{k-1}, l`` in the order of that group's rows, one run of heads per copy. As in
:func:`~numeric_check.verification.isolate.isolate_final_streams`, a copy carries only the prefix's
stream: its last head's output by the module's own ``head_outputs`` of the parent copy's ``z`` (its
layer's residual dropped), then the model's own blocks with patterns and scales frozen and no
source, head, bias or MLP on (every later layer passes the stream on unchanged); a copy of a prefix
through no head is the source alone, from the embeddings. The groups of one prefix group come one
after another in the expansion's order, so one pass per depth is kept while they come: each copy runs
once, in chunks of copies that hold at most the pass's budget.

From ``z`` on, the model is a fixed linear map at each position (:class:`HeadMaps`), and each row is
certified by :meth:`HeadMaps.row_bounds` over the whole chunk at once; a row that bound does not
settle (every row, with ``exact``) is compared in full through the model's own modules
(:meth:`Settlement.compare`).
"""

from __future__ import annotations

import math
import time
from typing import Iterator, NamedTuple

import torch
from torch import Tensor

from derivations.paths import StreamEntry
from derivations.sources import Path
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.hook_paths import Recording, StopForward, frozen_hooks, run_blocks, run_frozen
from numeric_check.model.hooks import block_hook
from numeric_check.verification.evaluate import LogitTermValue, right_multiplier
from numeric_check.verification.grouped import GroupEvaluator, PathGroup
from numeric_check.verification.isolate import GROUP_BYTES, SourceHooks, head_final_inputs
from numeric_check.verification.logit_isolation import HeadMaps, Settlement


class _Pass(NamedTuple):
    """One pass over copies ``first .. first + n - 1`` of the prefix group ``key`` (source, layers): the
    model's ``z`` at each later layer, ``[n · batch, pos, n_heads, d_head]``."""

    key: tuple
    first: int
    n: int
    z: dict[int, Tensor]


class PrefixPasses:
    """The model's ``z`` of a group's paths, from batched passes over a prefix group's copies (see the
    module docstring). ``budget``: the bytes one pass may hold (its activations and the ``z`` it keeps);
    a prefix group that needs more is passed in chunks of copies. ``sizes`` lists each pass's depth (heads of its
    prefixes) and copies."""

    def __init__(self, model: CircuitModel, rec: Recording, budget: int):
        self.model, self.rec, self.budget = model, rec, max(1, budget)
        self._kept: dict[int, _Pass] = {}  # by depth: the latest pass
        self.sizes: list[tuple[int, int]] = []

    def z(self, entry: StreamEntry, layers: tuple[int, ...], counts: tuple[int, ...], c0: int, c1: int) \
            -> Iterator[tuple[int, Tensor]]:
        """``(c, z)``: the model's ``z`` at ``layers[-1]`` in copies ``c0 .. c1 - 1`` of the prefix group
        ``entry``'s source through ``layers[:-1]`` (``counts``: heads per layer of ``layers``), from copy ``c``
        on, ``[n · batch, pos, n_heads, d_head]``, in as many pieces as the passes' chunks cut them."""
        b, c = self.rec.n_batch, c0
        while c < c1:
            done = self._pass(entry, layers[:-1], counts[:-1], c)
            stop = min(c1, done.first + done.n)
            yield c, done.z[layers[-1]][(c - done.first) * b:(stop - done.first) * b]
            c = stop

    def _pass(self, entry: StreamEntry, prefix: tuple[int, ...], counts: tuple[int, ...], c: int) -> _Pass:
        depth, key = len(prefix), (entry.source, prefix)
        kept = self._kept.get(depth)
        if kept is not None and kept.key == key and kept.first <= c < kept.first + kept.n:
            return kept
        self._kept.pop(depth, None)  # freed before the next is made
        later = self._later(entry, prefix)
        n = min(math.prod(counts) - c, self.copies_per_pass(entry, prefix))
        x = self._entering(entry, prefix, counts, c, n) if prefix else None
        kept = self._kept[depth] = _Pass(key, c, n, self._run(entry.source, prefix[-1] + 1 if prefix else 0, later, n, x))
        self.sizes.append((depth, n))
        return kept

    def copies_per_pass(self, entry: StreamEntry, prefix: tuple[int, ...]) -> int:
        """How many copies of the prefix group ``entry``'s source through ``prefix`` one pass takes (a pass
        starts at a multiple of it): those its budget holds, whole runs of the last prefix layer's heads when it
        holds one (then a pass's rows are whole prefixes at every depth: one block each, see ``grouped``)."""
        n = max(1, self.budget // self._per_copy(len(self._later(entry, prefix))))
        run = self.model.arch.heads_per_layer[prefix[-1]] if prefix else 1
        return n - n % run if n >= run else n

    def count(self, groups) -> int:
        """How many passes check 2 makes at the last depth of ``groups`` (:class:`PathGroup`): each prefix group
        once, in chunks of :meth:`copies_per_pass` copies."""
        passes: dict[tuple, int] = {}
        for g in groups:
            key = (g.source, g.layers[:-1])
            if key not in passes:
                passes[key] = -(-math.prod(g.counts[:-1]) // self.copies_per_pass(g.entry, g.layers[:-1]))
        return sum(passes.values())

    def _later(self, entry: StreamEntry, prefix: tuple[int, ...]) -> list[int]:
        """The layers with heads after ``prefix`` (after the source's entry when it is empty): where a pass reads ``z``."""
        arch = self.model.arch
        start = prefix[-1] + 1 if prefix else entry.first_layer
        return [l for l in range(start, arch.n_layers) if arch.heads_per_layer[l]]

    def _per_copy(self, n_later: int) -> int:
        """Bytes a copy of the batch holds in a pass: a few residual-sized tensors and the widest of a layer's
        ``z`` and pattern, and at each of ``n_later`` layers its frozen pattern and the ``z`` kept (of one sequence
        the pattern is not copied: :class:`~numeric_check.model.hooks.TiledConstant`)."""
        rec, cfg, arch = self.rec, self.model.cfg, self.model.arch
        widest = max(arch.heads_per_layer, default=1)
        pattern = rec.n_pos if rec.n_batch > 1 else 0
        per_position = 4 * max(cfg.d_model, widest * max(cfg.d_head, pattern)) + n_later * widest * (pattern + cfg.d_head)
        return rec.n_batch * rec.n_pos * per_position * rec.final.element_size()

    def _entering(self, entry: StreamEntry, prefix: tuple[int, ...], counts: tuple[int, ...], c: int, n: int) -> Tensor:
        """The streams copies ``c .. c + n - 1`` start from: each prefix's last head's output, by the model's own
        ``head_outputs`` (and norm after attention) of its parent copy's ``z``, ``[n · batch, pos, d_model]``."""
        layer, H, b = prefix[-1], counts[-1], self.rec.n_batch
        p0, p1 = c // H, (c + n - 1) // H + 1
        z = torch.cat([z for _, z in self.z(entry, prefix, counts, p0, p1)])  # [m · b, pos, H, e]
        m = p1 - p0
        scale = self.rec.cache.get(block_hook(layer, "ln1_post.hook_scale"))  # [b, pos, 1]
        if n < H:  # fewer copies than heads (a pass holds a few): only their heads' outputs, not all of each parent's
            copies = torch.arange(c, c + n, device=z.device)
            z = z.view(m, b, *z.shape[1:])[copies // H - p0, :, :, copies % H]  # [n, b, pos, e]
            out = self.model.head_streams(layer, z.movedim(0, -2), (copies % H).tolist(), scale)  # [n, b, pos, d]
            return out.reshape(n * b, *out.shape[2:])
        scale = None if scale is None else self.rec.tiled(block_hook(layer, "ln1_post.hook_scale"), m)
        out = self.model.head_streams(layer, z, list(range(H)), scale)  # [H, m · b, pos, d]: every head of each parent
        out = out.view(H, m, b, *out.shape[2:]).transpose(0, 1).reshape(m * H * b, *out.shape[2:])
        return out[(c - p0 * H) * b:(c - p0 * H + n) * b]

    def _run(self, source, start: int, later: list[int], n: int, x: Tensor | None) -> dict[int, Tensor]:
        """One pass of ``n`` copies carrying ``source`` (from the embeddings when ``x`` is ``None``, else from
        the streams ``x`` entering block ``start``), stopped at the last of ``later``, whose ``z`` it returns."""
        z: dict[int, Tensor] = {}

        def capture(layer: int):
            def hook(t: Tensor, _) -> None:
                z[layer] = t
                if layer == later[-1]:
                    raise StopForward
            return hook

        hooks = [(block_hook(l, "attn.hook_z"), capture(l)) for l in later]
        copies = SourceHooks(self.model, self.rec, [Path.trusted(source, ())] * n, start)
        if x is None:
            run_frozen(self.model, self.rec, n, hooks + copies.hooks())
        else:
            run_blocks(self.model, self.rec, x, start, frozen_hooks(self.rec, n, start=start) + copies.hooks() + hooks, copies.position_on)
        return z


class GroupedIsolation:
    """Check 2 for grouped rows: :meth:`check` certifies each row of a chunk against the model's ``z`` of its
    path (:class:`PrefixPasses`) or hands it to ``settlement`` for the full comparison."""

    def __init__(self, grouped: GroupEvaluator, maps: HeadMaps, settlement: Settlement, budget: int):
        binder = grouped.binder
        self.model, self.rec = binder.model, maps.rec
        self.grouped, self.maps, self.settlement = grouped, maps, settlement
        self.passes = PrefixPasses(self.model, self.rec, budget)
        self._gaps: dict[int, Tensor | None] = {}
        self._stacks: dict[int, Tensor] = {}  # each layer's last factors before W_Uᵀ, stacked by head

    def check(self, group: PathGroup, first: int, y: Tensor, norms: Tensor | None = None) -> None:
        """Rows of ``group`` from expansion index ``first`` on, head-major (:meth:`GroupEvaluator.blocks`:
        ``y`` ``[H, batch, pos, R, d_head]``, the rows of ``R`` prefixes); ``norms``: ``‖y‖`` at every position
        (``[H, batch, pos, R]``), when the caller has them."""
        H = group.counts[-1]
        c0 = (first - group.start) // H
        b, p = self.rec.n_batch, self.rec.n_pos
        norms = torch.linalg.vector_norm(y, dim=-1) if norms is None else norms
        for c, z in self.passes.z(group.entry, group.layers, group.counts, c0, c0 + y.shape[3]):
            n, k = z.shape[0] // b, c - c0
            z = z.view(n, b, p, H, -1).permute(3, 1, 2, 0, 4)  # head-major too (of one sequence: as its pass holds it)
            self._rows(group.layers[-1], first + k * H, z, y[:, :, :, k:k + n], norms[..., k:k + n])

    def _rows(self, layer: int, first: int, z: Tensor, y: Tensor, norms: Tensor) -> None:
        """The model's ``z`` against our rows ``y``, both head-major (``[H, b, pos, n, e]``), with the rows' norms
        ``‖y‖`` (``[H, b, pos, n]``)."""
        results, settlement = self.settlement.results, self.settlement
        H, n = y.shape[0], y.shape[3]
        gaps = None if settlement.exact else self._layer_gaps(layer)
        if gaps is None:
            open_ = list(range(n * H))
        else:
            bounds = self.maps.head_major_bounds(layer, z, y, norms, gaps).flatten() * settlement.space.product.bound_factor
            open_ = (~(bounds <= settlement.tol)).nonzero().flatten().tolist()  # a NaN bound is open; rows in order
            rows = slice(first, first + n * H)
            results.set_bound(rows, bounds.double().cpu().numpy())
            results.passed[rows] = 1  # certified (those left open are settled below)
        if not open_:
            return
        results.passed[[first + k for k in open_]] = -1
        x_bytes = self.rec.final.numel() * self.rec.final.element_size()  # a row's unembedding input
        size = max(1, GROUP_BYTES // max(1, x_bytes))
        for start in range(0, len(open_), size):  # in full, a few rows at a time: each one's unembedding input
            ks = open_[start:start + size]
            r, h = (torch.tensor(part, device=y.device) for part in zip(*(divmod(k, H) for k in ks)))
            x = head_final_inputs(self.model, self.rec, layer, h.tolist(), z[h, :, :, r].permute(1, 2, 0, 3))
            rows = y[h, :, :, r]  # [m, b, pos, e]
            values = [LogitTermValue(first + k, 1.0, row, self.grouped.left(layer, k % H)) for k, row in zip(ks, rows.unbind(0))]
            settlement.compare(values, x, 0.0, self._factors(layer, values, rows, h))
            settlement.finish_when_full()  # (the caller finishes: see verify_logits)

    def finish(self) -> float:
        """The rows no bound settled, their exact errors (:meth:`Settlement.finish`); the seconds it took."""
        start = time.perf_counter()
        self.settlement.finish()
        return time.perf_counter() - start

    def _factors(self, layer: int, values: list, rows: Tensor, heads: Tensor) -> tuple[Tensor, Tensor] | None:
        """``(rows, R)``: the rows and each one's last factor before ``W_Uᵀ`` (its head's ``W_O^{h}ᵀ``), stacked from
        the layer's factors stacked once (``None`` where the rows are not of that form: compared term by term)."""
        if not all(len(v.left) == 2 for v in values):
            return None
        if layer not in self._stacks:
            lefts = [self.grouped.left(layer, h)[0] for h in range(self.model.arch.heads_per_layer[layer])]
            self._stacks[layer] = torch.stack([right_multiplier(self.grouped.binder, ref) for ref in lefts])
        return rows, self._stacks[layer][heads]

    def _layer_gaps(self, layer: int) -> Tensor | None:
        """``‖M_h - R_h‖`` per head of ``layer`` (``R_h``: its terms' last factor, ``W_O^{h}ᵀ``), or ``None`` when
        the layer's map or its terms are not of the form :meth:`HeadMaps.row_bounds` bounds."""
        if layer not in self._gaps:
            H = self.model.arch.heads_per_layer[layer]
            lefts = [self.grouped.left(layer, h) for h in range(H)]
            bounded = self.maps.layer(layer) is not None and all(len(l) == 2 and l[-1][0].name == "W_U" for l in lefts)
            self._gaps[layer] = self.maps.gaps(self.settlement.ev, layer, range(H), [l[0] for l in lefts]) if bounded else None
        return self._gaps[layer]

