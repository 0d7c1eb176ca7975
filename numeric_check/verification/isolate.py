"""Paths isolated through the model itself: the paper's procedure, with hooks, not our evaluator.

With every attention pattern and layer-norm scale frozen at its value from a real forward
pass (and every MLP output replaced by its recorded value), the model is linear in its
sources, and one path's contribution is what the model computes when

- only the path's source is on: the token embedding, the positional embedding, one
  layer's biases (``b_V`` and ``b_O``, so that ``b_O^{Ll}`` arrives folded exactly as the
  model computes it), one layer's MLP output, or the unembedding bias ``b_U``;
- at each layer of the path only the path's head is on, and the residual connection of
  that layer is dropped: the stream that continues is the head's output (the module's own
  ``head_output`` of its ``hook_z``, what its ``hook_result`` holds);
- at every other layer no head is on and the residual stream passes unchanged.

Value biases are switched off through ``hook_v`` (``v - b_V``), a layer's attention output
(``hook_attn_out``: its heads and ``b_O``) for every copy but its own bias source. The passes
stop before the unembedding (:func:`isolate_final_streams`): what the model gives ``W_U`` is
compared, and ``b_U`` is on only for its own source. Paths that differ only in their last head
share one copy of the batch (every head's ``hook_z`` is read at that layer), a copy starts
where its prefix's copy left off (the head's output is its stream), and copies run batched,
in chunks that bound memory.
:func:`isolate_final_parts` hands over paths ending in heads one step earlier, as the model's
``hook_z`` of those heads, for a caller that applies the rest of the model (the head's ``W_O``,
norms with frozen scales: :func:`head_final_inputs`) once per head rather than once per path.

For QK scores (:func:`isolate_qk`) each side path's stream entering the layer is
isolated the same way; the model's own attention module then computes the head's
queries and keys from those streams (``hook_resid_pre`` replaced, layer-norm scales frozen,
``b_Q``/``b_K`` and ``qk_only`` positions on only for their own sources; read at
``hook_q``/``hook_k``), and the module's own ``scores`` (scale, causal mask,
``hook_attn_scores``) turns one query path's ``q`` and one key path's ``k`` into the term.

:func:`graded_logits` and :func:`graded_qk` compute the part of order above ``k`` (the
terms a truncated expansion omits) through the model the same way: copies of the batch
carry the stream of each order ``0..k``, and one copy everything of order ``> k``; each
layer's heads read the copy of order ``j`` and write to the copy of order ``j + 1``.

>>> from derivations.architecture import Architecture
>>> from derivations.paths import TOKEN, Path
>>> from numeric_check.verification.hook_paths import record
>>> from numeric_check.model.circuit_model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0, dtype=torch.float64)
>>> rec = record(model, torch.tensor([[1, 2, 3]]))
>>> parts = dict(isolate_logit_paths(model, rec, [Path(TOKEN, ((0, 1), (1, 0))), Path(TOKEN)]))
>>> parts[0].shape
torch.Size([1, 3, 10])
"""

from __future__ import annotations

from typing import Callable, Iterator, NamedTuple, Sequence

import torch
from torch import Tensor

from derivations.paths import Path
from derivations.sources import HEAD_SOURCES
from numeric_check.errors import NumericCheckError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.hook_paths import (
    Hook,
    Recording,
    StopForward,
    final_norm,
    frozen_hooks,
    keep,
    per_copy,
    run_blocks,
    run_frozen,
    unembedding_input,
)
from numeric_check.model.hooks import Constant, Zeros, block_hook

DEFAULT_CHUNK_BYTES = 1 << 28  # activations of the largest tensor of one batched pass (256 MiB)
# streams of one group of paths handed on together (head outputs, ln_final, the caller's differences):
# small enough to stay in a CPU's cache; larger tensors, allocated afresh each time, also cost page faults
GROUP_BYTES = 1 << 22
RAW_GROUP_BYTES = 1 << 19  # the z of many copies' paths that end in one layer, handed on together (32x on a GPU):
# order 3 of 6 x 8 heads, d_model 256: peak 1.35x order 2's with 4 MiB, 1.30x with 512 KiB, the same time


def _chunks(n_items: int, bytes_per_item: int, chunk_bytes: int) -> Iterator[range]:
    size = max(1, chunk_bytes // max(1, bytes_per_item))
    for start in range(0, n_items, size):
        yield range(start, min(n_items, start + size))


class SourceHooks:
    """The hooks of one pass over copies of the batch, from block ``start`` on: each copy
    carries one prefix path, with only its source on and none of its heads at these layers
    (they all come before ``start``: see :func:`isolate_final_streams`)."""

    def __init__(self, model: CircuitModel, rec: Recording, prefixes: Sequence[Path], start: int):
        if any(l >= start for q in prefixes for l, _ in q.heads):
            raise NumericCheckError(f"a copy passing through heads at or after block {start} cannot start there")
        self.model, self.rec, self.prefixes, self.start = model, rec, list(prefixes), start
        self.n_batch = rec.n_batch
        self.position_on = [float(q.source.kind == "position") for q in self.prefixes]

    def _on(self, kind: str, layer: int | None = None) -> list[float]:
        return [float(q.source.kind == kind and q.source.layer == layer) for q in self.prefixes]

    def hooks(self) -> list[Hook]:
        n_batch, hooks = self.n_batch, []
        if self.start == 0:
            token_on = self._on("token")
            hooks.append(("hook_embed", lambda x, hook: x * per_copy(token_on, n_batch, x, 3)))
            if self.model.W_pos is not None:
                hooks.append(("hook_pos_embed", lambda x, hook: x * per_copy(self.position_on, n_batch, x, 3)))
        for layer in range(self.start, self.model.arch.n_layers):
            hooks += self._layer_hooks(layer)
        return hooks

    def _layer_hooks(self, layer: int) -> list[Hook]:
        """No head on: the layer adds nothing to a copy, except all its heads and ``b_O`` (through
        the model's own attention output) to its own bias source, and its MLP output to its own."""
        block, n_batch = self.model.blocks[layer], self.n_batch
        bias_on, mlp_on = self._on("bias", layer), self._on("mlp", layer)
        hooks: list[Hook] = []
        if block.attn.b_V is not None:
            hooks.append((block_hook(layer, "attn.hook_v"), lambda v, hook: v - (1 - per_copy(bias_on, n_batch, v, 4)) * block.attn.per_head(block.attn.b_V)))
        shape = (n_batch * len(self.prefixes), self.rec.n_pos, self.model.cfg.d_model)
        zeros = Zeros(self.rec.final, shape)  # nothing to allocate, fill or add
        if block.mlp is not None:  # a Constant: the recorded output in its own source's copy, zeros elsewhere; not run
            if any(mlp_on):
                recorded = self.rec.tiled(block_hook(layer, "hook_mlp_out"), len(self.prefixes))
                hooks.append((block_hook(layer, "hook_mlp_out"), Constant(recorded * per_copy(mlp_on, n_batch, recorded, 3))))
            else:
                hooks.append((block_hook(layer, "hook_mlp_out"), zeros))
        if any(bias_on):
            return hooks + [(block_hook(layer, "hook_attn_out"), lambda x, hook: x * per_copy(bias_on, n_batch, x, 3))]
        return hooks + [(block_hook(layer, "hook_attn_out"), zeros)]


def isolate_final_streams(model: CircuitModel, rec: Recording, paths: Sequence[Path], *,
                          chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[tuple[int, Tensor, float]]:
    """``(i, x, bias)`` for every path: what the model gives its unembedding when only ``paths[i]``
    is on (``x = ln_final``'s output with its scale frozen, ``[batch, pos, d_model]``), and
    whether ``b_U`` is on (1.0 for the ``b_U`` source, else 0.0): the path's logits are
    ``x @ W_U.T + bias * b_U``.

    Paths that differ only in their last head share one copy of the batch (see
    :func:`_copies`): the copy isolates their common prefix, and the model's ``attn.hook_z``
    at a path's last layer gives, through the module's own ``head_output`` (what its
    ``hook_result`` holds), that path's stream there (its layer's residual is dropped, and
    every later layer passes it unchanged: no head, bias or MLP of the path is on). The
    model's own ``ln_final`` (scale frozen) then gives its unembedding input. A copy stops at
    the last ``hook_z`` it needs, or before the unembedding when the prefix is itself one of
    ``paths``. A copy whose prefix passes through heads starts after the prefix's last
    layer: the model's own blocks run from the stream its parent copy read there (the
    stream a full pass would carry into that layer), so every layer is computed once per
    prefix rather than once per path. Patterns and scales are frozen by
    :class:`~numeric_check.model.hooks.Constant` hooks, so queries and keys are never computed.

    ``model`` must be the model ``rec`` was recorded from. Copies run in batched chunks of
    about ``chunk_bytes`` of activations each; every path comes exactly once, chunk by
    chunk (copy by copy within a chunk), so use ``i`` to match them. :func:`isolate_final_groups`
    gives the same streams stacked, a group at a time.
    """
    for indices, x, bias in isolate_final_groups(model, rec, paths, chunk_bytes=chunk_bytes):
        yield from ((i, xi, bias) for i, xi in zip(indices, x.unbind(0)))


def isolate_final_groups(model: CircuitModel, rec: Recording, paths: Sequence[Path], *,
                         chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[tuple[list[int], Tensor, float]]:
    """:func:`isolate_final_streams` a group at a time: ``(indices, x, bias)`` with ``x[k]`` the
    unembedding input of ``paths[indices[k]]``, stacked ``[n, batch, pos, d_model]``, and ``bias``
    common to the group. A group is one copy's paths whose last heads are in one layer (their
    head outputs come from one product, ``ln_final`` runs on them at once), at most
    ``GROUP_BYTES`` of streams, so that every step works on tensors that stay in the CPU's cache;
    or a single path. Every path comes exactly once.

    >>> from derivations.architecture import Architecture
    >>> from derivations.paths import TOKEN, Path
    >>> from numeric_check.verification.hook_paths import record
    >>> model = CircuitModel.random(Architecture(1, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0, dtype=torch.float64)
    >>> rec = record(model, torch.tensor([[1, 2, 3]]))
    >>> [(i, tuple(x.shape)) for i, x, _ in isolate_final_groups(model, rec, [Path(TOKEN, ((0, 0),)), Path(TOKEN, ((0, 1),))])]
    [([0, 1], (2, 1, 3, 8))]
    """
    for indices, x, _ in _isolated(model, rec, paths, None, chunk_bytes):
        yield indices, x, float(paths[indices[0]].source.kind == "unembed_bias")


class HeadGroup(NamedTuple):
    """Paths of one copy of the batch whose last heads are ``heads`` of ``layer``, as the model's own
    ``attn.hook_z`` holds them in that copy: ``z`` ``[batch, pos, n, d_head]`` (``z[:, :, k]`` for
    ``paths[indices[k]]``). What each gives the unembedding is :func:`head_final_inputs` of it."""

    indices: list[int]
    z: Tensor
    layer: int
    heads: list[int]


def isolate_final_parts(model: CircuitModel, rec: Recording, paths: Sequence[Path], *,
                        chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[HeadGroup | tuple[list[int], Tensor, float]]:
    """:func:`isolate_final_groups`, except that a group of paths ending in heads comes as the model's
    ``z`` of those heads (a :class:`HeadGroup`), one step before its unembedding inputs: from there
    on a path's stream is a fixed linear map of its ``z`` (the head's ``W_O``, norms with frozen
    scales), which a caller may apply once per head (:class:`HeadMaps`) instead of once per path
    (:func:`head_final_inputs`). Other groups come as ``(indices, x, bias)``."""
    for indices, x, at in _isolated(model, rec, paths, None, chunk_bytes, raw=True):
        if at is None:
            yield indices, x, float(paths[indices[0]].source.kind == "unembed_bias")
        else:
            yield HeadGroup(indices, x, *at)


def head_final_inputs(model: CircuitModel, rec: Recording, layer: int, heads: list[int], z: Tensor) -> Tensor:
    """What heads ``heads`` of ``layer`` give the unembedding from their ``z`` ``[batch, pos, n, d_head]``
    (copies of the batch stacked along it): the module's own ``head_outputs``, its norm after
    attention and ``ln_final`` (scales frozen), ``[n, batch, pos, d_model]``."""
    x = model.head_streams(layer, z, heads, _post_scale(rec, layer))
    return final_norm(model, rec, x.flatten(0, 1)).view(x.shape)


def _isolated(model: CircuitModel, rec: Recording, paths: Sequence[Path], upto: int | None,
              chunk_bytes: int, raw: bool = False) -> Iterator[tuple[list[int], Tensor, tuple[int, list[int]] | None]]:
    """``(indices, streams, None)``: the paths' unembedding inputs (``upto=None``, see
    :func:`isolate_final_groups`) or their residual streams entering block ``upto`` (every head of every
    path before it), stacked; with ``raw``, paths ending in heads as ``(indices, z, (layer, heads))``
    (see :func:`isolate_final_parts`)."""
    b, p = rec.n_batch, rec.n_pos
    heads = model.arch.heads_per_layer
    cfg = model.cfg  # per copy: a few residual-sized tensors and the widest of a layer's z and pattern
    per_copy = 4 * b * p * max(cfg.d_model, max(heads, default=1) * max(cfg.d_head, p)) * rec.final.element_size()
    copies = _copies(paths)
    kids: dict[Path, list[Path]] = {}  # each prefix's children (prefixes one head longer)
    for q in copies:
        if q.heads:
            kids.setdefault(Path.trusted(q.source, q.heads[:-1]), []).append(q)
    entering: dict[Path, Tensor] = {}  # a prefix's stream leaving its last layer, read by its parent copy
    for depth in sorted({len(prefix.heads) for prefix in copies}):
        level = sorted((q for q in copies if len(q.heads) == depth), key=lambda q: q.heads[-1][0] if q.heads else -1)
        for chunk in _chunks(len(level), per_copy, chunk_bytes):
            prefixes = [level[j] for j in chunk]
            starts = {q.heads[-1][0] + 1 if q.heads else 0 for q in prefixes}
            for start in sorted(starts):  # one pass per starting layer
                group = [q for q in prefixes if (q.heads[-1][0] + 1 if q.heads else 0) == start]
                children = {q: parent for parent in group for q in kids.get(parent, ())}
                yield from _isolate_chunk(model, rec, paths, {q: copies[q] for q in group}, children, entering, start,
                                          upto, raw)
            for q in prefixes:
                entering.pop(q, None)


def _copies(paths: Sequence[Path]) -> dict[Path, list[int]]:
    """The indices of ``paths`` by the prefix path one copy of the batch isolates for them: a path
    through heads goes with its prefix one head shorter, a path through none with itself. Every
    prefix's own prefixes get a copy too (with no path of their own when none is asked for): each
    copy starts from the stream its parent's copy reads."""
    copies: dict[Path, list[int]] = {}
    for i, path in enumerate(paths):
        copies.setdefault(Path.trusted(path.source, path.heads[:-1]), []).append(i)
    for prefix in list(copies):
        while prefix.heads:
            prefix = Path.trusted(prefix.source, prefix.heads[:-1])
            copies.setdefault(prefix, [])
    return copies


def _isolate_chunk(model: CircuitModel, rec: Recording, paths: Sequence[Path], copies: dict[Path, list[int]],
                   children: dict[Path, Path], entering: dict[Path, Tensor], start: int,
                   upto: int | None, raw: bool = False) -> Iterator[tuple[list[int], Tensor, tuple | None]]:
    """One batched forward pass over one copy of the batch per prefix (see :func:`isolate_final_streams`),
    from the embeddings (``start == 0``, prefixes through no head) or from block ``start`` with each
    copy's stream ``entering[prefix]``; it stores in ``entering`` the streams the ``children`` (by their
    parent prefix) start from. ``upto``: streams entering that block instead of unembedding inputs."""
    b, n = rec.n_batch, len(copies)
    prefixes = list(copies)
    # a copy's paths are its prefix itself or the prefix and one head more: told apart by their length
    whole = any(len(paths[i].heads) == len(prefix.heads) for prefix in prefixes for i in copies[prefix])
    last = {paths[i].heads[-1][0] for prefix in prefixes for i in copies[prefix] if len(paths[i].heads) > len(prefix.heads)}
    last |= {child.heads[-1][0] for child in children}
    results: dict[int, Tensor] = {}

    def capture(layer: int) -> Callable:
        def hook(x: Tensor, _) -> None:
            results[layer] = x  # every head's z: the model's head_output gives each head's result from it
            if not whole and layer == max(last):
                raise StopForward
        return hook

    hooks = [(block_hook(layer, "attn.hook_z"), capture(layer)) for layer in sorted(last)]
    ph = SourceHooks(model, rec, prefixes, start)
    hooks += ph.hooks()
    final = None  # the unembedding input (or stream entering block upto), when a prefix through no head is a path
    if start == 0 and whole and upto is not None:
        seen: dict[str, Tensor] = {}
        run_frozen(model, rec, n, hooks + [(block_hook(upto, "hook_resid_pre"), keep(seen, "x", stop=True))])
        final = seen["x"]
    elif start == 0:
        tokens = rec.tokens.repeat(n, 1)
        final = unembedding_input(model, tokens, frozen_hooks(rec, n) + hooks) if whole else run_frozen(model, rec, n, hooks)
    else:
        run_blocks(model, rec, torch.cat([entering[q] for q in prefixes]), start, frozen_hooks(rec, n) + hooks, ph.position_on)
    where = {q: c for c, q in enumerate(prefixes)}

    def head_stream(c: int, layer: int, head: int) -> Tensor:
        """What head ``(layer, head)`` writes in copy ``c``: the path's stream from there on."""
        z = results[layer][c * b:(c + 1) * b, :, head]
        scale = _post_scale(rec, layer)  # a norm after attention (frozen) or none
        return model.blocks[layer].attn.head_output(z, head) if scale is None else model.head_streams(layer, z[..., None, :], [head], scale)[0]

    streams: dict[Path, Tensor] = {}
    merged: dict[int, list] = {}
    for child, parent in children.items():
        streams[child] = entering[child] = head_stream(where[parent], *child.heads[-1])
    for c, prefix in enumerate(prefixes):  # copy by copy
        own = [i for i in copies[prefix] if len(paths[i].heads) == len(prefix.heads)]
        if own:
            x = final[c * b:(c + 1) * b]
            yield own, x.expand(len(own), *x.shape), None
        ends = [i for i in copies[prefix] if len(paths[i].heads) > len(prefix.heads)]
        for indices, x, at in _head_streams(model, rec, results, c, b, [paths[i] for i in ends], ends, streams,
                                            raw and upto is None):
            if at is not None:  # raw: the copies' z of one layer go together (see _merged)
                merged.setdefault(at[0], []).append((indices, x, at[1]))
                continue
            if upto is None:  # the model's ln_final (scale frozen), on the group at once
                x = final_norm(model, rec, x.flatten(0, 1)).view(x.shape)
            yield indices, x, at
    for layer, parts in merged.items():
        yield from _merged(layer, parts, RAW_GROUP_BYTES if rec.final.device.type == "cpu" else 32 * RAW_GROUP_BYTES)


def _merged(layer: int, parts: list, limit: int) -> Iterator[tuple[list[int], Tensor, tuple[int, list[int]]]]:
    """The raw groups of one layer from many copies, ``(indices, z [b, pos, n, d_head], heads)``, as few
    groups as ``limit`` bytes of ``z`` allow (side by side along the heads' axis: the frozen scales after
    a head are the same in every copy), so that what follows runs once for many copies."""
    batch: list = []
    size = 0
    for part in parts + [None]:
        if part is None or (batch and size + part[1].numel() * part[1].element_size() > limit):
            if batch:
                z = batch[0][1] if len(batch) == 1 else torch.cat([z for _, z, _ in batch], 2)
                yield [i for ids, _, _ in batch for i in ids], z, (layer, [h for _, _, heads in batch for h in heads])
            batch, size = [], 0
        if part is not None:
            batch.append(part)
            size += part[1].numel() * part[1].element_size()


def _post_scale(rec: Recording, layer: int) -> Tensor | None:
    """The recorded scale of ``layer``'s ``ln1_post`` (``None`` when the block has no norm after attention)."""
    return rec.cache.get(block_hook(layer, "ln1_post.hook_scale"))


def _head_streams(model: CircuitModel, rec: Recording, results: dict[int, Tensor], c: int, b: int, ends: Sequence[Path],
                  indices: Sequence[int], streams: dict[Path, Tensor],
                  raw: bool = False) -> Iterator[tuple[list[int], Tensor, tuple[int, list[int]] | None]]:
    """``(indices, x, None)``: what the paths ``ends`` (numbered ``indices``) write with their last heads in
    copy ``c`` (their streams from there on), stacked ``[n, b, pos, d_model]``: the heads of one layer at
    once, at most ``GROUP_BYTES`` of them, by the module's own ``head_outputs`` of its ``hook_z``; a path
    whose stream is already made (``streams``, popped) alone. With ``raw``, a layer's heads come as
    ``(indices, z, (layer, heads))``, their ``z`` ``[b, pos, n, d_head]`` (all of them at once)."""
    by_layer: dict[int, list[tuple[int, int]]] = {}
    for i, path in zip(indices, ends):
        if path in streams:
            yield [i], streams.pop(path)[None], None
        else:
            by_layer.setdefault(path.heads[-1][0], []).append((i, path.heads[-1][1]))
    for layer, group in by_layer.items():
        z = results[layer][c * b:(c + 1) * b]  # [b, pos, n_heads, d_head]
        if raw:
            heads = [h for _, h in group]
            yield [i for i, _ in group], z if heads == list(range(z.shape[2])) else z[:, :, heads], (layer, heads)
            continue
        per_head = z[:, :, 0].numel() * model.cfg.d_model // model.cfg.d_head * z.element_size()
        size = max(1, GROUP_BYTES // max(1, per_head))
        n_parts = -(-len(group) // size)
        size = -(-len(group) // n_parts)  # parts of equal size
        for start in range(0, len(group), size):
            part = group[start:start + size]
            heads = [h for _, h in part]
            run = heads == list(range(heads[0], heads[0] + len(heads)))
            z_part = z[:, :, heads[0]:heads[0] + len(heads)] if run else z[:, :, heads]  # [b, pos, n, d_head]
            yield [i for i, _ in part], model.head_streams(layer, z_part, heads, _post_scale(rec, layer)), None  # [n, b, pos, d]


def isolate_logit_paths(model: CircuitModel, rec: Recording, paths: Sequence[Path], *,
                        chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[tuple[int, Tensor]]:
    """``(i, logits of paths[i])`` for every path, ``[batch, pos, d_vocab]``, computed by the model
    (:func:`isolate_final_streams`, then the model's unembedding ``x @ W_U.T`` plus ``b_U`` for its
    own source)."""
    for i, x, bias in isolate_final_streams(model, rec, paths, chunk_bytes=chunk_bytes):
        logits = x @ model.W_U.T
        yield i, logits if model.b_U is None or not bias else logits + model.b_U


def isolate_streams(model: CircuitModel, rec: Recording, paths: Sequence[Path], layer: int, *,
                    chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[Tensor]:
    """Each path's residual stream entering ``layer`` (``blocks.{layer}.hook_resid_pre``), ``[b, pos, d_model]``,
    isolated as in :func:`isolate_final_streams` (copies shared by prefix). Every head of a path
    must come before ``layer``. Sources ``query_bias``/``key_bias`` (and any source entering at
    or after ``layer``) give zeros.
    """
    late = [p.label for p in paths if any(l >= layer for l, _ in p.heads)]
    if late:
        raise NumericCheckError(f"paths {late[:3]} pass through heads at or after layer {layer}; they do not reach it")
    out: list[Tensor | None] = [None] * len(paths)
    for indices, x, _ in _isolated(model, rec, paths, layer, chunk_bytes):
        for i, xi in zip(indices, x.unbind(0)):
            out[i] = xi
    return out


def _queries_keys(model: CircuitModel, rec: Recording, layer: int, head: int, streams: list[Tensor],
                  on: dict[str, list[float]]) -> tuple[list[Tensor], list[Tensor]]:
    """The model's ``q`` and ``k`` of head ``(layer, head)`` for each stream entering ``layer``.

    ``on[kind]``, per copy: whether the ``qk_only`` positional embedding (``"position"``), ``b_Q``
    (``"query_bias"``), ``b_K`` (``"key_bias"``) and a q/k layer norm's biases (``"query_norm_bias"``,
    ``"key_norm_bias"``) are on. With a q/k norm (its scale frozen) ``q`` and ``k`` are read after
    it, at ``q_norm``/``k_norm``'s ``hook_normalized``, the projections' biases switched at ``hook_q``/``hook_k``.
    """
    b = rec.n_batch
    attn = model.blocks[layer].attn
    stacked = torch.cat(streams)
    copies = len(streams)
    seen: dict[str, Tensor] = {}

    def switch(bias: Tensor | None, kind: str, name: str | None = None, last: bool = False):
        def hook(x: Tensor, _) -> Tensor | None:
            if bias is not None:
                x = x - (1 - per_copy(on[kind], b, x, 4)) * bias
            if name is not None:
                seen[name] = x[:, :, head]  # [copies * b, pos, d_head]
            if last:
                raise StopForward
            return x
        return hook

    normed = attn.q_norm is not None
    hooks = [(block_hook(layer, "attn.hook_q"), switch(attn.b_Q, "query_bias", None if normed else "q")),
             (block_hook(layer, "attn.hook_k"), switch(attn.per_head(attn.b_K), "key_bias", None if normed else "k", not normed))]
    if normed:
        hooks += [(block_hook(layer, "attn.q_norm.hook_normalized"), switch(attn.q_norm.bias, "query_norm_bias", "q")),
                  (block_hook(layer, "attn.k_norm.hook_normalized"), switch(attn.per_head(attn.k_norm.bias), "key_norm_bias", "k", True))]
    run_blocks(model, rec, stacked, layer, frozen_hooks(rec, copies, live=layer) + hooks, on["position"])  # the block alone
    return list(seen["q"].split(b)), list(seen["k"].split(b))


def _scores(model: CircuitModel, rec: Recording, layer: int, head: int, pairs: Sequence[tuple[Tensor, Tensor]], *,
            chunk_bytes: int, bias_on: Sequence[float] | None = None) -> Iterator[Tensor]:
    """The head's scores ``[batch, q, k]`` for each pair ``(q, k)`` of its queries and keys
    ``[batch, pos, d_head]``, by the model's own :meth:`~numeric_check.model.circuit_model.Attention.scores`
    (scale, mask, and ALiBi's bias where ``bias_on[i]``; through ``hook_attn_scores``), pairs stacked in chunks."""
    b, p = rec.n_batch, rec.n_pos
    attn = model.blocks[layer].attn
    per_pair = b * p * max(p, model.cfg.d_head) * rec.final.element_size()
    for chunk in _chunks(len(pairs), per_pair, chunk_bytes):
        qs = torch.cat([pairs[i][0] for i in chunk])[:, :, None]  # [pairs * b, pos, 1, d_head]: the head alone
        ks = torch.cat([pairs[i][1] for i in chunk])[:, :, None]
        on = 0.0 if bias_on is None else per_copy([bias_on[i] for i in chunk], b, qs, 4)
        with torch.no_grad():
            yield from attn.scores(qs, ks, heads=[head], bias_on=on)[:, 0].split(b)


_SWITCHED = ("position", "query_bias", "key_bias", "query_norm_bias", "key_norm_bias")


def _side_inputs(paths: Sequence[Path], layer: int, head: int) -> dict[str, list[float]]:
    """Per copy, which of the head's own inputs (:data:`_SWITCHED`) are on: those of the copy's source."""
    for q in paths:
        if q.source.kind in HEAD_SOURCES and (q.source.layer, q.source.head) != (layer, head):
            raise NumericCheckError(f"source {q.source.label} belongs to another head than L{layer}H{head}")
    return {kind: [float(q.source.kind == kind) for q in paths] for kind in _SWITCHED}


def isolate_qk(model: CircuitModel, rec: Recording, layer: int, head: int, pairs: Sequence[tuple[Path, Path]], *,
               chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[tuple[int, Tensor]]:
    """``(i, scores)`` for each ``(query path, key path)`` pair: the model's pre-softmax scores
    ``[batch, q, k]`` of head ``(layer, head)`` when only those two paths feed its queries and
    keys (``-inf`` above the diagonal, as the model masks them).
    """
    side_paths = list(dict.fromkeys(path for pair in pairs for path in pair))
    where = {path: i for i, path in enumerate(side_paths)}
    q: list[Tensor] = []
    k: list[Tensor] = []
    per_path = rec.n_batch * rec.n_pos * model.cfg.d_model * rec.final.element_size()  # a stream entering the layer
    for chunk in _chunks(len(side_paths), per_path, chunk_bytes):  # only q and k (d_head wide) are kept
        paths = [side_paths[i] for i in chunk]
        streams = isolate_streams(model, rec, paths, layer, chunk_bytes=chunk_bytes)
        q_chunk, k_chunk = _queries_keys(model, rec, layer, head, streams, _side_inputs(paths, layer, head))
        q += q_chunk
        k += k_chunk
    qk = [(q[where[qp]], k[where[kp]]) for qp, kp in pairs]
    alibi = [float(qp.source.kind == "alibi") for qp, _ in pairs]  # ALiBi's own term: the head's bias alone
    yield from enumerate(_scores(model, rec, layer, head, qk, chunk_bytes=chunk_bytes, bias_on=alibi))


# --- the part of order above k, through the model ------------------------------------------


class _GradedHooks:
    """Copies ``0..k`` carry the stream of that order, copy ``k+1`` everything above ``k``, and
    copy ``k+2`` a zero stream with the biases on (it makes each layer's folded ``b_O``)."""

    def __init__(self, model: CircuitModel, rec: Recording, max_order: int):
        self.model, self.rec, self.k = model, rec, max_order
        self.copies = max_order + 3
        self.bias_copy = max_order + 2
        self.captured: dict[int, Tensor] = {}  # by layer: every head's hook_result

    def _only(self, index: int) -> list[float]:
        return [float(g == index) for g in range(self.copies)]

    def hooks(self) -> list[Hook]:
        b, arch = self.rec.n_batch, self.model.arch
        first = self._only(0)
        hooks: list[Hook] = [("hook_embed", lambda x, hook: x * per_copy(first, b, x, 3))]
        if self.model.W_pos is not None:
            hooks.append(("hook_pos_embed", lambda x, hook: x * per_copy(first, b, x, 3)))
        for layer in range(arch.n_layers):
            hooks += self._layer_hooks(layer)
        return hooks

    def _layer_hooks(self, layer: int) -> list[Hook]:
        b, k, block = self.rec.n_batch, self.k, self.model.blocks[layer]
        bias_only = self._only(self.bias_copy)

        def resid_pre(x: Tensor, hook) -> Tensor:
            return x * (1 - per_copy(bias_only, b, x, 3))

        hooks: list[Hook] = [(block_hook(layer, "hook_resid_pre"), resid_pre)]
        if block.attn.b_V is not None:
            hooks.append((block_hook(layer, "attn.hook_v"), lambda v, hook: v - (1 - per_copy(bias_only, b, v, 4)) * block.attn.per_head(block.attn.b_V)))

        def result(x: Tensor, hook) -> None:
            self.captured[layer] = x  # every head's result of this layer

        def attn_out(x: Tensor, hook) -> Tensor:
            heads = list(self.captured.pop(layer).sum(-2).split(b))  # per copy: Σ_h result
            if block.ln1_post is not None:  # normalised (scale frozen) before joining the stream
                heads = [block.ln1_post.frozen(h, _post_scale(self.rec, layer)) for h in heads]
            out = [x[self.bias_copy * b:(self.bias_copy + 1) * b]]  # the model's own Σ result + b_O there
            out += [heads[j - 1] for j in range(1, k + 1)]
            out += [heads[k] + heads[k + 1], torch.zeros_like(out[0])]
            return torch.cat(out)

        hooks.append((block_hook(layer, "attn.hook_result"), result))
        hooks.append((block_hook(layer, "hook_attn_out"), attn_out))
        if block.mlp is not None:
            recorded = self.rec.cache[block_hook(layer, "hook_mlp_out")]  # in copy 0 (order 0) only; the MLP is not run
            hooks.append((block_hook(layer, "hook_mlp_out"), Constant(torch.cat([recorded] + [torch.zeros_like(recorded)] * (self.copies - 1)))))
        return hooks


def graded_final(model: CircuitModel, rec: Recording, max_order: int) -> Tensor:
    """What the model gives its unembedding from every path through more than ``max_order`` heads,
    summed (``ln_final``'s output with its scale frozen, ``[batch, pos, d_model]``; no ``b_U``),
    computed in one forward pass over ``max_order + 3`` copies of the batch, stopped before the
    unembedding."""
    hooks = _GradedHooks(model, rec, max_order)
    final = unembedding_input(model, rec.tokens.repeat(hooks.copies, 1), frozen_hooks(rec, hooks.copies) + hooks.hooks())
    return final.split(rec.n_batch)[max_order + 1]


def graded_logits(model: CircuitModel, rec: Recording, max_order: int) -> Tensor:
    """The logits of every path through more than ``max_order`` heads, summed, ``[batch, pos, d_vocab]``
    (:func:`graded_final` through the model's ``W_U``)."""
    return graded_final(model, rec, max_order) @ model.W_U.T


def graded_qk(model: CircuitModel, rec: Recording, layer: int, head: int, max_order: int, *,
              chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Tensor:
    """The scores ``[batch, q, k]`` of head ``(layer, head)`` from every pair of query and key
    paths whose orders add up to more than ``max_order``, summed, computed by the model.
    Entries above the diagonal are meaningless (``nan``)."""
    hooks = _GradedHooks(model, rec, max_order)
    seen: dict[str, Tensor] = {}
    run_frozen(model, rec, hooks.copies, hooks.hooks() + [(block_hook(layer, "hook_resid_pre"), keep(seen, "x", stop=True))])
    streams = list(seen["x"].split(rec.n_batch))[: max_order + 2]  # orders 0..k and > k
    order0 = [1.0] + [0.0] * (max_order + 1)
    q, k = _queries_keys(model, rec, layer, head, streams, dict.fromkeys(_SWITCHED, order0))
    pairs = [(q[i], k[j]) for i in range(max_order + 2) for j in range(max_order + 2) if i + j > max_order]
    total = None
    for scores in _scores(model, rec, layer, head, pairs, chunk_bytes=chunk_bytes):
        scores = torch.nan_to_num(scores, neginf=float("nan"))
        total = scores if total is None else total + scores
    return total
