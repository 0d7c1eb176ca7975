"""Behaviour across the whole context: per-position attention profiles and a grid of repeat losses.

A head that works for only part of the context can pass an average: a previous-token
head that attends to ``i - 1`` for queries 1–32 and nowhere else averages 0.5. So
behaviour is measured position by position:

- :func:`repeat_sweep` draws random sequences, each holding one segment of ``seg_len``
  tokens twice in a row, the second copies tiling the context (every query position lies in
  a second copy equally often, the last ones too);
- :func:`position_profiles` runs the model on them and returns, per head and query
  position, the mean attention to ``i - 1`` (previous token) and to the tokens that
  followed earlier occurrences of the current token (induction), with their minimum
  over positions;
- :func:`repeat_loss_grid` measures the model's loss on the second copy of a segment
  (its first token excluded) for every (length, offset) pair of a grid.

>>> from derivations import Architecture
>>> from numeric_check.model.circuit_model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=20, n_ctx=16)
>>> profile = position_profiles(model, seg_len=4, batch=8)
>>> profile.previous_token.shape
torch.Size([2, 2, 16])
>>> grid = repeat_loss_grid(model, lengths=(2, 4), offsets=(0, 8), batch=4)
>>> grid.loss.shape
torch.Size([2, 2])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from derivations.architecture import head_label
from tensoralg.display import md_table
from numeric_check.errors import AnalysisError
from numeric_check.model.hooks import block_hook


# Sequences longer than this are cut for behaviour measurements, so large models stay quick.
PROFILE_N_CTX = 128
# The shortest repeat the context-wide measures ask for (the loss grid's shortest length).
MIN_REPEAT = 4
# A circuit "works across the context" when, at every query position, one of its heads puts
# at least this much attention where it should (the heads' classification threshold).
ACROSS_CONTEXT = 0.4


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AnalysisError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def profile_length(model, n_positions: int | None = None) -> int:
    """Sequence length of the behaviour data: ``n_positions`` or ``min(n_ctx, PROFILE_N_CTX)``."""
    n_ctx = model.cfg.n_ctx
    n = min(n_ctx, PROFILE_N_CTX) if n_positions is None else n_positions
    if isinstance(n, bool) or not isinstance(n, int) or not 4 <= n <= n_ctx:
        raise AnalysisError(
            f"n_positions must be an int in 4..{n_ctx} (n_ctx), got {n_positions!r}"
            if n_ctx >= 4
            else f"repeated sequences need n_ctx >= 4 (two copies of at least 2 tokens); the model has n_ctx={n_ctx}"
        )
    return n


def repeat_sweep(d_vocab: int, n_positions: int, seg_len: int, batch: int, seed: int = 0, *,
                 tokens: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``batch`` random sequences ``[batch, n_positions]``, each with a segment of ``seg_len`` tokens twice in a row.

    The tokens are drawn uniformly from the ``d_vocab`` ids, or from the ids ``tokens`` lists (:func:`token_pool`:
    those a text holds, so that a small vocabulary's bytes the text never holds are not drawn); the pool of all
    ``d_vocab`` ids draws the same sequences as none.

    The second copies tile the positions ``seg_len .. n_positions - 1``: they start at ``seg_len``,
    ``2 seg_len``, … and, when those do not reach the end, at ``n_positions - seg_len``; sequence
    ``b`` takes tile ``b mod tiles``. So every query position from ``seg_len`` on is in the second
    copy of ``batch // tiles`` sequences at least — the last positions as often as the middle
    ones (offsets swept evenly from start to end left the last position in one sequence of 64).
    Returns the tokens and the first copies' starts ``[batch]`` (CPU, seeded).

    >>> tokens, starts = repeat_sweep(10, 12, 3, 4, seed=0)
    >>> starts.tolist()
    [0, 3, 6, 0]
    >>> bool((tokens[1, 2:5] == tokens[1, 5:8]).all())
    True
    """
    _positive_int("seg_len", seg_len, 2)
    _positive_int("batch", batch)
    if 2 * seg_len > n_positions:
        raise AnalysisError(
            f"two copies of seg_len={seg_len} tokens need {2 * seg_len} positions, but the sequences have "
            f"{n_positions}; use seg_len <= {n_positions // 2}"
        )
    drawn = random_tokens((batch, n_positions), d_vocab, seed, tokens=tokens)
    tiles = list(range(0, n_positions - 2 * seg_len + 1, seg_len))  # first copies' starts
    if tiles[-1] != n_positions - 2 * seg_len:
        tiles.append(n_positions - 2 * seg_len)  # the last second copy ends at the last position
    starts = torch.tensor([tiles[b % len(tiles)] for b in range(batch)], dtype=torch.long)
    pos = torch.arange(n_positions)
    second = (pos >= (starts + seg_len)[:, None]) & (pos < (starts + 2 * seg_len)[:, None])  # [batch, pos]
    source = torch.where(second, pos - seg_len, pos)
    return drawn.gather(1, source), starts


def random_tokens(shape: tuple[int, ...], d_vocab: int, seed: int = 0, *, tokens=None) -> Tensor:
    """Token ids of ``shape`` (CPU, from a generator seeded by ``seed``), drawn uniformly from the ``d_vocab`` ids or
    from the ids ``tokens`` lists (:func:`token_pool`); the pool of all ``d_vocab`` ids draws what none draws.

    >>> bool((random_tokens((2, 5), 10, seed=1) == random_tokens((2, 5), 10, seed=1, tokens=range(10))).all())
    True
    >>> sorted(set(random_tokens((40,), 10, tokens=[2, 7]).tolist()))
    [2, 7]
    """
    pool = token_pool(tokens, d_vocab)
    gen = torch.Generator().manual_seed(seed)
    drawn = torch.randint(0, d_vocab if pool is None else len(pool), shape, generator=gen)
    return drawn if pool is None else pool[drawn]


def token_pool(tokens, d_vocab: int) -> Tensor | None:
    """``tokens`` (token ids to draw random tokens from: a tensor or a list) checked against a vocabulary of
    ``d_vocab`` ids, as a sorted CPU tensor of distinct ids; None stays None (draw from every id). Fewer than two
    ids, or an id outside ``0 .. d_vocab - 1``, is an :class:`AnalysisError`.

    >>> token_pool([7, 3, 3], 10).tolist()
    [3, 7]
    """
    if tokens is None:
        return None
    pool = torch.as_tensor(tokens).flatten().cpu()
    if pool.numel() and (pool.dtype.is_floating_point or pool.dtype == torch.bool):
        raise AnalysisError(f"random tokens are drawn from token ids (integers), got a {pool.dtype} tensor")
    pool = pool.long().unique()
    if len(pool) < 2 or int(pool[0]) < 0 or int(pool[-1]) >= d_vocab:
        raise AnalysisError(f"random tokens need at least 2 distinct token ids from 0 to {d_vocab - 1} (the model's "
                            f"vocabulary) to draw from, got {len(pool)}" + (f" from {int(pool[0])} to {int(pool[-1])}"
                                                                            if len(pool) else ""))
    return pool


def occurring_tokens(ids: Tensor, d_vocab: int) -> Tensor:
    """The distinct ids of ``d_vocab`` that occur in ``ids`` (a text's tokens), sorted: what random tokens are drawn
    from for a model trained on text (:func:`repeat_sweep`), checked by :func:`token_pool`.

    >>> occurring_tokens(torch.tensor([[4, 1], [4, 9]]), 10).tolist()
    [1, 4, 9]
    """
    return token_pool(ids.detach().flatten().cpu().long().unique(), d_vocab)


def induction_targets(tokens: Tensor) -> Tensor:
    """``[batch, query, key]``: True where key ``j`` follows an earlier occurrence of the query's token.

    That is ``1 <= j <= i`` and ``tokens[j - 1] == tokens[i]`` — where an induction head at
    query ``i`` attends. Queries whose token has not occurred before have no target.

    >>> induction_targets(torch.tensor([[5, 6, 5]]))[0, 2].tolist()
    [False, True, False]
    """
    n = tokens.shape[-1]
    before = torch.zeros_like(tokens)  # the token before each key; key 0 has none
    before[..., 1:] = tokens[..., :-1]
    match = tokens[..., :, None] == before[..., None, :]  # [batch, query, key]
    pos = torch.arange(n, device=tokens.device)
    allowed = (pos[None, :] >= 1) & (pos[None, :] <= pos[:, None])  # key 1..query
    return match & allowed


@dataclass(frozen=True)
class PositionProfile:
    """Per head and query position, ``[n_layers, n_heads, n_positions]``; NaN where not measured.

    ``previous_token[l, h, i]``: mean attention from query ``i`` to ``i - 1`` (NaN at 0).
    ``induction[l, h, i]``: mean total attention from query ``i`` to the tokens after earlier
    occurrences of its token, over the sequences where ``i`` lies in the second copy of the
    repeated segment (NaN where it never does: positions before ``seg_len``).
    ``seg_len``: the repeated segment's length in the measuring sequences.
    """

    previous_token: Tensor
    induction: Tensor
    seg_len: int

    def mean(self, kind: str) -> Tensor:
        """Mean over measured positions, ``[n_layers, n_heads]``."""
        return self._values(kind).nanmean(-1)

    def minimum(self, kind: str) -> Tensor:
        """Minimum over measured positions, ``[n_layers, n_heads]`` (NaN for heads a layer lacks)."""
        values = self._values(kind)
        low = values.nan_to_num(math.inf).amin(-1)
        return low.masked_fill(low.isinf(), math.nan)

    def argmin(self, kind: str) -> Tensor:
        """The query position of :meth:`minimum`, ``[n_layers, n_heads]`` (-1 where nothing was measured)."""
        values = self._values(kind).nan_to_num(math.inf)
        where = values.argmin(-1)
        return where.masked_fill(values.amin(-1).isinf(), -1)

    def measured(self, kind: str) -> tuple[int, int]:
        """First and last query position with a measurement."""
        rows = (~self._values(kind).isnan()).flatten(0, -2).any(0).nonzero().flatten()
        return (int(rows[0]), int(rows[-1])) if len(rows) else (-1, -1)

    def _values(self, kind: str) -> Tensor:
        if kind not in ("previous_token", "induction"):
            raise AnalysisError(f"unknown profile kind {kind!r}; expected 'previous_token' or 'induction'")
        return getattr(self, kind)

    def summary(self, kind: str, head: tuple[int, int]) -> str:
        """``"mean 0.93, min 0.81 at 40 (positions 1–63)"`` for one head."""
        first, last = self.measured(kind)
        return (f"mean {float(self.mean(kind)[head]):.2f}, min {float(self.minimum(kind)[head]):.2f} "
                f"at {int(self.argmin(kind)[head])} (positions {first}–{last})")


def position_profiles(
    model, *, seg_len: int | None = None, batch: int = 64, seed: int = 0, n_positions: int | None = None,
    tokens: Tensor | None = None,
) -> PositionProfile:
    """Previous-token and induction attention of every head at every query position.

    Measured on :func:`repeat_sweep` sequences of ``n_positions`` tokens (default
    ``min(n_ctx, PROFILE_N_CTX)``) with segments of ``seg_len`` tokens (default
    ``max(2, min(8, n_positions // 4))``), so that second copies cover every position from
    ``seg_len`` on; their tokens drawn from every id, or from ``tokens`` (:func:`repeat_sweep`). See
    :class:`PositionProfile`.
    """
    n = profile_length(model, n_positions)
    seg_len = max(2, min(8, n // 4)) if seg_len is None else seg_len
    if isinstance(seg_len, bool) or not isinstance(seg_len, int) or not 2 <= seg_len <= n // 2:
        raise AnalysisError(f"seg_len must be an int in 2..{n // 2} so that two copies fit {n} positions, got {seg_len!r}")
    tokens, starts = repeat_sweep(model.cfg.d_vocab, n, seg_len, batch, seed, tokens=tokens)
    names = [block_hook(layer, "attn.hook_pattern") for layer in range(model.arch.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens.to(model.device), names_filter=names)
    n_heads = max(model.arch.heads_per_layer, default=0)
    previous = torch.full((model.arch.n_layers, n_heads, n), math.nan, dtype=torch.float64)
    induction = previous.clone()
    targets = induction_targets(tokens).to(torch.float64)  # [batch, query, key]
    pos = torch.arange(n)
    second = (pos >= (starts + seg_len)[:, None]) & (pos < (starts + 2 * seg_len)[:, None])  # [batch, query]
    has_target = second & targets.bool().any(-1)  # queries in a second copy (chance repeats elsewhere are too rare to average)
    counts = has_target.sum(0)  # [query]
    queries = torch.arange(1, n)
    for layer, name in enumerate(names):
        pattern = cache[name].to(device="cpu", dtype=torch.float64)  # [batch, heads, query, key]
        count = pattern.shape[1]
        previous[layer, :count, 1:] = pattern[:, :, queries, queries - 1].mean(0)
        on_targets = (pattern * targets[:, None]).sum(-1)  # [batch, heads, query]
        mean = (on_targets * has_target[:, None]).sum(0) / counts.clamp(min=1)
        induction[layer, :count] = mean.masked_fill(counts == 0, math.nan)
    return PositionProfile(previous, induction, seg_len)


@dataclass(frozen=True)
class LossGrid:
    """Mean loss on the second copy of a repeated segment (first token excluded), ``[lengths, offsets]``.

    ``offsets`` are the first copy's starts; the second copy follows it directly. NaN where
    the two copies do not fit the context.
    """

    lengths: tuple[int, ...]
    offsets: tuple[int, ...]
    loss: Tensor
    uniform: float

    @property
    def worst(self) -> tuple[int, int, float]:
        """``(length, offset, loss)`` of the highest-loss cell."""
        return self._cell(self.loss.nan_to_num(-math.inf).argmax())

    @property
    def best(self) -> tuple[int, int, float]:
        """``(length, offset, loss)`` of the lowest-loss cell."""
        return self._cell(self.loss.nan_to_num(math.inf).argmin())

    def _cell(self, flat: Tensor) -> tuple[int, int, float]:
        i, j = divmod(int(flat), len(self.offsets))
        return self.lengths[i], self.offsets[j], float(self.loss[i, j])

    def describe(self) -> str:
        """``"worst 0.93 nats (length 4, offset 56), best 0.12 (length 32, offset 0)"``."""
        (wl, wo, w), (bl, bo, b) = self.worst, self.best
        return f"worst {w:.2f} nats (length {wl}, offset {wo}), best {b:.2f} (length {bl}, offset {bo})"

    def to_dict(self) -> dict:
        return {"lengths": list(self.lengths), "offsets": list(self.offsets), "uniform": self.uniform,
                "loss": [[None if math.isnan(v) else v for v in row] for row in self.loss.tolist()]}

    def to_markdown(self) -> str:
        """A table: one row per length, one column per offset (nats)."""
        rows = [[str(length)] + ["-" if math.isnan(v) else f"{v:.2f}" for v in self.loss[i].tolist()]
                for i, length in enumerate(self.lengths)]
        return md_table(["length \\ offset", *map(str, self.offsets)], rows, right=range(1, len(self.offsets) + 1))


def default_grid(n_ctx: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Lengths 4, 8, … up to ``n_ctx // 2`` and offsets every ``n_ctx // 8`` positions.

    >>> default_grid(64)
    ((4, 8, 16, 32), (0, 8, 16, 24, 32, 40, 48, 56))
    """
    lengths, length = [], MIN_REPEAT
    while length <= n_ctx // 2:
        lengths.append(length)
        length *= 2
    step = max(1, n_ctx // 8)
    return tuple(lengths or [2]), tuple(range(0, n_ctx - 3, step))


def repeat_loss_grid(
    model,
    *,
    lengths: Sequence[int] | None = None,
    offsets: Sequence[int] | None = None,
    batch: int = 64,
    seed: int = 0,
) -> LossGrid:
    """The model's loss on repeats of every length at every offset (see :class:`LossGrid`).

    Each cell: ``batch`` sequences of ``n_ctx`` random tokens (seeded per cell) with the
    segment at ``offset`` repeated right after it; the loss of predicting the second copy's
    tokens after its first. Defaults: :func:`default_grid`. All cells of one length run as
    one batch. The sequences are ``min(n_ctx, PROFILE_N_CTX)`` tokens long, so a model with a
    long context (Pythia's 2,048) is measured on its first positions in bounded memory,
    never ``batch × heads × n_ctx²`` scores at once.
    """
    n_ctx = min(model.cfg.n_ctx, PROFILE_N_CTX)
    default_lengths, default_offsets = default_grid(n_ctx)
    lengths = tuple(default_lengths if lengths is None else lengths)
    offsets = tuple(default_offsets if offsets is None else offsets)
    _positive_int("batch", batch)
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or not 2 <= length <= n_ctx // 2:
            raise AnalysisError(f"lengths must be ints in 2..{n_ctx // 2} (two copies in n_ctx={n_ctx}), got {length!r}")
    for offset in offsets:
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < n_ctx:
            raise AnalysisError(f"offsets must be ints in 0..{n_ctx - 1}, got {offset!r}")
    loss = torch.full((len(lengths), len(offsets)), math.nan, dtype=torch.float64)
    for i, length in enumerate(lengths):
        fitting = [j for j, o in enumerate(offsets) if o + 2 * length <= n_ctx]
        if not fitting:
            continue
        gen = torch.Generator().manual_seed(seed * 1_000_003 + length)
        tokens = torch.randint(0, model.cfg.d_vocab, (len(fitting), batch, n_ctx), generator=gen)
        for k, j in enumerate(fitting):
            o = offsets[j]
            tokens[k, :, o + length : o + 2 * length] = tokens[k, :, o : o + length]
        with torch.no_grad():
            logits = model(tokens.flatten(0, 1).to(model.device)).to(device="cpu", dtype=torch.float32)
        logits = logits.view(len(fitting), batch, n_ctx, -1)
        for k, j in enumerate(fitting):
            targets = torch.arange(offsets[j] + length + 1, offsets[j] + 2 * length)
            loss[i, j] = float(F.cross_entropy(logits[k][:, targets - 1].flatten(0, 1), tokens[k][:, targets].flatten()))
    return LossGrid(lengths, offsets, loss, math.log(model.cfg.d_vocab))


def profile_rows(profile: PositionProfile, heads: Sequence[tuple[int, int]]) -> list[str]:
    """One line per head: its previous-token and induction profile summaries."""
    return [f"{head_label(*h)}: previous token {profile.summary('previous_token', h)}; "
            f"induction {profile.summary('induction', h)}" for h in heads]


def usable_positions(kind: str, n_positions: int, min_repeat: int = MIN_REPEAT) -> range:
    """Query positions at which a head of ``kind`` can serve induction on repeats of ``min_repeat``+ tokens.

    A previous-token head's output at query ``j`` is only ever read as a *key*: by a query in
    a later copy, ``d >= min_repeat`` positions on, predicting the token after it, so
    ``j + min_repeat <= n - 1``. Its work past that can serve only shorter repeats (none at
    the last two positions). Induction heads serve every query.

    >>> usable_positions("previous_token", 64), usable_positions("induction", 64)
    (range(1, 60), range(0, 64))
    """
    return range(1, max(1, n_positions - min_repeat)) if kind == "previous_token" else range(0, n_positions)


def best_head_floor(profile: PositionProfile, kind: str, heads: Sequence[tuple[int, int]]) -> tuple[float, int]:
    """The lowest score over :func:`usable_positions` of the best of ``heads`` at each position, and where.

    A circuit whose heads share the context between them (one head early, another late)
    still passes; NaN and -1 without heads or measurements.

    >>> nan = math.nan
    >>> p = PositionProfile(torch.tensor([[[nan, 0.9, 0.25, 1.0, 0, 0, 0, 0], [nan, 0.5, 0.75, 0.0, 0, 0, 0, 0]]]),
    ...                     torch.zeros(1, 2, 8), 1)
    >>> best_head_floor(p, "previous_token", [(0, 0), (0, 1)])  # queries 1-3 (8 - MIN_REPEAT)
    (0.75, 2)
    """
    values = profile._values(kind)
    if not heads:
        return math.nan, -1
    rows = torch.stack([values[h] for h in heads]).nan_to_num(-math.inf).amax(0)  # [n_positions]
    measured = torch.zeros_like(rows, dtype=torch.bool)
    measured[list(usable_positions(kind, len(rows)))] = True
    measured &= ~rows.isinf()
    if not measured.any():
        return math.nan, -1
    where = int(rows.masked_fill(~measured, math.inf).argmin())
    return float(rows[where]), where
