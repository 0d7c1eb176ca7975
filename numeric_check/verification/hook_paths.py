"""Paths run through the model's own hooks: one recorded forward pass, then passes with values frozen.

The paper isolates a path by running the model itself with its attention patterns and
layer-norm scales frozen at their values from a real forward pass, only some sources and
heads switched on, and the pass ended once the wanted activation is read. Verification
(:mod:`numeric_check.verification.isolate`) and term importance
(:mod:`numeric_check.circuits.importance`) both do this, with these pieces:

- :func:`record` runs the model up to its unembedding and keeps a :class:`Recording`: the
  tokens, the unembedding's input, and every hook value a later pass freezes or starts from;
- :func:`frozen_hooks` replaces every pattern and scale by its recorded value (tiled over
  copies of the batch, so that one pass carries many paths); :func:`per_copy` switches a
  source or head on or off copy by copy;
- :func:`run_frozen` runs the whole model, :func:`run_blocks` its blocks from one block on
  over given streams; a hook made by :func:`keep` reads an activation and may end the pass
  with :class:`StopForward`;
- :func:`unembedding_input`, :func:`final_norm` and :func:`unembed` finish a stream the way
  the model does.

>>> from derivations.architecture import Architecture
>>> model = CircuitModel.random(Architecture(2, 1), d_model=4, d_head=2, d_vocab=6, n_ctx=4, seed=0)
>>> rec = record(model, torch.tensor([[0, 1, 2]]))
>>> seen = {}
>>> run_frozen(model, rec, 2, [(block_hook(1, "hook_resid_pre"), keep(seen, stop=True))]) is None  # ended early
True
>>> seen[block_hook(1, "hook_resid_pre")].shape  # two copies of a batch of one
torch.Size([2, 3, 4])
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, partial
from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor

from numeric_check.errors import AtomBindingError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.hooks import Constant, HookFn, TiledConstant, block_hook

Hook = tuple[str, Callable]


class StopForward(Exception):
    """Raised inside a hook to end a forward pass once the wanted activation is read.

    Not an error: the functions here catch it and return what the hooks kept (see :func:`keep`).
    """


def keep(seen: dict[str, Tensor], key: str | None = None, *, stop: bool = False) -> HookFn:
    """A hook that keeps what passes through it in ``seen[key]`` (``key``: the hook's name by default)
    and leaves it unchanged, or ends the pass there when ``stop``."""

    def hook(x: Tensor, name) -> None:
        seen[str(name) if key is None else key] = x
        if stop:
            raise StopForward

    return hook


# --- the recorded forward pass ------------------------------------------------------------


def _recorded_hook(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return leaf in ("hook_pattern", "hook_scale", "hook_mlp_out", "hook_attn_scores", "hook_resid_pre", "hook_expert_weights",
                    "hook_expert_indices") or name in (
        "hook_embed",
        "hook_pos_embed",
    ) or name.endswith("hook_resid_post")


TILED_COUNTS = 3  # copy counts whose tiled recordings are kept (a verification uses a few at a time)


@dataclass(frozen=True)
class Recording:
    """One real forward pass: the tokens, the unembedding's input, and the hook values that get frozen.

    ``final`` is what the model multiplies by ``W_Uᵀ``: ``ln_final``'s output ``[batch, pos,
    d_model]`` (the final residual stream without layer norm). The forward pass stops there;
    :attr:`logits` finishes it on demand (``final @ W_U.T + b_U``, the model's own expression,
    so the values are the model's logits bit for bit). ``cache`` holds (by hook name) every
    attention pattern and score, layer-norm scale, MLP output, embedding and residual stream
    entering or leaving a block.
    """

    tokens: Tensor  # [batch, pos], long
    final: Tensor  # [batch, pos, d_model]
    cache: dict[str, Tensor]
    W_U: Tensor  # [d_vocab, d_model]
    b_U: Tensor | None  # [d_vocab]

    @property
    def n_batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def n_pos(self) -> int:
        return self.tokens.shape[1]

    def tiled(self, name: str, copies: int) -> Tensor:
        """``cache[name]`` repeated along the batch for ``copies`` stacked copies of the batch
        (kept for the last ``TILED_COUNTS`` copy counts asked for, every name of each: a pass tiles every
        pattern and scale, and re-tiling costs more than the memory)."""
        if copies == 1:
            return self.cache[name]
        tiles = self.__dict__.setdefault("_tiles", {})  # by copy count, the most recently used last
        per = tiles.pop(copies, None)
        tiles[copies] = per = {} if per is None else per
        while len(tiles) > TILED_COUNTS:
            del tiles[next(iter(tiles))]
        if name not in per:
            value = self.cache[name]
            per[name] = value.repeat(copies, *([1] * (value.ndim - 1)))
        return per[name]

    @cached_property
    def logits(self) -> Tensor:
        """The model's logits ``[batch, pos, d_vocab]`` (an unembedding: computed once, when first asked for)."""
        logits = self.final @ self.W_U.T
        return logits if self.b_U is None else logits + self.b_U

    def get(self, name: str, why: str) -> Tensor:
        """The recorded value of hook ``name``; :class:`AtomBindingError` saying ``why`` it was needed."""
        try:
            return self.cache[name]
        except KeyError:
            raise AtomBindingError(
                f"{why} needs hook {name!r}, which the model's forward pass did not record; "
                "the expansion and the model disagree about the architecture"
            ) from None


def unembedding_input(model: CircuitModel, tokens: Tensor, fwd_hooks: Iterable = ()) -> Tensor | None:
    """The model's forward pass with ``fwd_hooks`` (as :meth:`CircuitModel.run_with_hooks`), stopped
    before the unembedding: ``ln_final``'s output ``[batch, pos, d_model]``, so that the logits
    are ``unembedding_input(...) @ W_U.T + b_U``. ``None`` when a hook ended the pass earlier
    by raising an exception, which propagates.

    >>> from derivations.architecture import Architecture
    >>> model = CircuitModel.random(Architecture(1, 1, layer_norm=True), d_model=4, d_head=2, d_vocab=6, n_ctx=4)
    >>> x = unembedding_input(model, torch.tensor([[0, 1, 2]]))
    >>> torch.equal(x @ model.W_U.T, model(torch.tensor([[0, 1, 2]])))
    True
    """
    seen: dict[str, Tensor] = {}

    def stop(module, args, output: Tensor) -> None:
        seen["final"] = output
        raise StopForward

    handle = model.ln_final.register_forward_hook(stop)
    try:
        with torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks)
    except StopForward:
        pass
    finally:
        handle.remove()
    return seen.get("final")


def record(model: CircuitModel, tokens: Tensor | Iterable) -> Recording:
    """Run ``model`` on ``tokens`` (``[batch, pos]`` or ``[pos]``) up to its unembedding and keep
    what verification freezes.

    Raises :class:`~numeric_check.errors.ModelInputError` for bad tokens (the model's
    :meth:`~numeric_check.model.circuit_model.CircuitModel.check_tokens`).

    >>> from derivations.architecture import Architecture
    >>> model = CircuitModel.random(Architecture(1, 1), d_model=4, d_head=2, d_vocab=6, n_ctx=4, seed=0)
    >>> rec = record(model, [0, 1, 2])
    >>> rec.tokens.shape, rec.final.shape, rec.logits.shape
    (torch.Size([1, 3]), torch.Size([1, 3, 4]), torch.Size([1, 3, 6]))
    """
    tokens = model.check_tokens(tokens)
    tokens = tokens if tokens.ndim == 2 else tokens[None]  # [batch, pos]
    cache: dict[str, Tensor] = {}

    def save(x: Tensor, hook: str) -> None:
        cache[str(hook)] = x.detach()

    final = unembedding_input(model, tokens, [(_recorded_hook, save)])
    b_U = None if model.b_U is None else model.b_U.detach()
    return Recording(tokens, final.detach(), cache, model.W_U.detach(), b_U)


# --- passes with values frozen -------------------------------------------------------------


def per_copy(values: Sequence[float], n_batch: int, like: Tensor, ndim: int) -> Tensor:
    """A switch per copy of the batch: ``values[c]`` for every row of copy ``c`` (``n_batch`` rows each),
    shaped ``[copies * n_batch, 1, ...]`` to broadcast over a tensor of ``ndim`` dims like ``like``."""
    column = torch.tensor(values, dtype=like.dtype, device=like.device).repeat_interleave(n_batch)
    return column.reshape(-1, *([1] * (ndim - 1)))


def frozen_hooks(rec: Recording, copies: int, live: int | None = None, start: int = 0) -> list[Hook]:
    """Hooks replacing every attention pattern and layer-norm scale (and a mixture of experts' routing) by its recorded value, tiled over
    ``copies`` copies of the batch (:class:`~numeric_check.model.hooks.Constant`: the model skips
    queries, keys and scores), except the pattern of layer ``live``, whose queries, keys or scores
    are read; those of blocks before ``start`` are left out (a pass that starts at block ``start``)."""
    live_pattern = None if live is None else block_hook(live, "attn.hook_pattern")
    hooks: list[Hook] = []
    for name in rec.cache:
        if name.endswith(("hook_pattern", "hook_scale", "hook_expert_weights", "hook_expert_indices")) and name != live_pattern:
            if start and name.startswith("blocks.") and int(name.split(".", 2)[1]) < start:
                continue
            hooks.append((name, Constant(rec.cache[name]) if copies == 1 else
                          TiledConstant(rec.cache[name], copies, partial(rec.tiled, name, copies))))
    return hooks


def run_frozen(model: CircuitModel, rec: Recording, copies: int, hooks: list[Hook], live: int | None = None) -> Tensor | None:
    """One forward pass over ``copies`` copies of the batch with ``hooks``, patterns and scales frozen
    (but the pattern of layer ``live``); the logits, or ``None`` when a hook stopped the pass."""
    tokens = rec.tokens.repeat(copies, 1)
    try:
        with torch.no_grad():
            return model.run_with_hooks(tokens, frozen_hooks(rec, copies, live) + hooks)
    except StopForward:
        return None


def run_blocks(model: CircuitModel, rec: Recording, x: Tensor, start: int, hooks: list[Hook],
               position_on: Sequence[float] | None = None) -> None:
    """The model's blocks from ``start`` on, over the stacked streams ``x`` entering it (copies of the
    batch), with ``hooks``, until a hook stops them (read what you need with :func:`keep`).

    Queries and keys of ``qk_only`` models read the recorded ``hook_pos_embed``, switched on per
    copy by ``position_on``; ``None`` for passes whose patterns are all frozen (no query or key is
    computed, so positions are never read).
    """
    qk_pos = None
    if model.arch.positional == "qk_only" and position_on is not None:
        pos = rec.tiled("hook_pos_embed", len(position_on))
        qk_pos = pos * per_copy(position_on, rec.n_batch, pos, 3)
    try:
        with torch.no_grad(), model.hooks(hooks):
            for block in model.blocks[start:]:
                x = block(x, qk_pos)
    except StopForward:
        return


def final_norm(model: CircuitModel, rec: Recording, stream: Tensor) -> Tensor:
    """The model's ``ln_final`` on final residual streams (copies of the batch), its scale frozen."""
    name = "ln_final.hook_scale"
    if name not in rec.cache:
        return model.ln_final(stream)
    copies = stream.shape[0] // rec.n_batch
    with torch.no_grad(), model.hooks([(name, Constant(rec.tiled(name, copies)))]):
        return model.ln_final(stream)


def unembed(model: CircuitModel, rec: Recording, stream: Tensor) -> Tensor:
    """The model's logits of final residual streams, ``ln_final``'s scale frozen:
    ``final_norm(stream) @ W_U.T + b_U``, the model's own expression."""
    with torch.no_grad():
        logits = final_norm(model, rec, stream) @ model.W_U.T
        return logits if model.b_U is None else logits + model.b_U
