"""Train small attention-only models on sequences with a repeated random segment.

The task is the one on which the paper's induction heads appear: in every sequence a
random segment occurs twice. The second copy starts at a *varying* offset after the
first (a fixed offset would let a positional head copy from ``i - offset`` without any
induction). On the second copy, every token but the first is predictable by looking
back to the token that followed the previous occurrence of the current token — exactly
what a previous-token head in layer 0 composed with an induction head in layer 1
computes; a 1-layer model cannot do this. Between and inside the repeats the tokens
follow a bigram table and hold planted skip-trigrams (:func:`data_tables`), so that the
zero-layer model has bigram statistics to learn and the one-layer model skip-trigrams,
as in the paper; a config without them draws tokens uniformly at random.

>>> config = TrainConfig(n_layers=1, steps=2, batch_size=4, d_vocab=16, n_ctx=16,
...                      seg_min=2, seg_max=6, d_model=8, d_head=4, n_heads=2)
>>> model, history = train_toy(config)
>>> len(history.loss)
2
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from numeric_check.errors import CheckpointError
from numeric_check.files import read_json, read_text_file
from numeric_check.model.checkpoint import stored_content_hash
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.layers import set_fused
from numeric_check.training.batch import RepeatBatch  # noqa: F401 - part of this module's API
from numeric_check.training.config import TrainConfig, TrainConfigError  # noqa: F401 - part of this module's API


def _segment_lengths(config: TrainConfig, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Lengths in ``seg_min..seg_max``, log-uniform: short repeats as common as long ones per octave."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    lo, hi = math.log(config.seg_min), math.log(config.seg_max + 1)
    return (lo + u * (hi - lo)).exp().floor().long().clamp(config.seg_min, config.seg_max)


#: Offset of the seed that draws the data's tables (:func:`data_tables`) from the run's ``seed``: the
#: batches' own generator is seeded by ``seed`` itself, so the two streams never coincide.
TABLE_SEED = 7919


class DataTables(NamedTuple):
    """The fixed structure of a run's data, drawn from its seed alone (:func:`data_tables`).

    ``successors`` ``[d_vocab, bigram_successors]``: each token's likely successors (column ``j`` a
    permutation of the vocabulary); ``trigrams`` ``[skip_trigrams, 2, 3]``: for each source A, its
    two planted skip-trigrams ``(A, B, C)`` — A earlier in the context, then B, makes C the next token.
    """

    successors: torch.Tensor
    trigrams: torch.Tensor


def data_tables(config: TrainConfig) -> DataTables:
    """The bigram successors and the planted skip-trigrams of ``config``'s data, from ``config.seed`` alone.

    The skip-trigrams' tokens are all different: sources, destinations and outs are five disjoint
    sets. Two skip-trigrams share each source with different destinations and outs, as the paper's
    "keep … in mind" and "keep … at bay" do.

    >>> t = data_tables(TrainConfig(d_vocab=32, bigram_successors=2, skip_trigrams=2))
    >>> t.successors.shape, t.trigrams.shape, bool((t.successors[:, 0].sort().values == torch.arange(32)).all())
    (torch.Size([32, 2]), torch.Size([2, 2, 3]), True)
    >>> a, b, c = t.trigrams[0].T  # one source, two destinations, two outs
    >>> bool(a[0] == a[1]) and len(set(t.trigrams.flatten().tolist())) == 10
    True
    """
    generator = torch.Generator().manual_seed(config.seed + TABLE_SEED)
    v, k, n = config.d_vocab, config.bigram_successors, config.skip_trigrams
    successors = torch.stack([torch.randperm(v, generator=generator) for _ in range(k)], dim=1) if k else \
        torch.zeros(v, 0, dtype=torch.long)
    tokens = torch.randperm(v, generator=generator)[:5 * n].view(5, n)  # A, B, B', C, C'
    source, dest, out = tokens[0], tokens[1:3].T, tokens[3:5].T  # [n], [n, 2], [n, 2]
    trigrams = torch.stack([source[:, None].expand(n, 2), dest, out], dim=-1)  # [n, 2, 3]
    return DataTables(successors, trigrams)


def repeated_segment_batch(config: TrainConfig, batch_size: int, generator: torch.Generator) -> RepeatBatch:
    """Sequences in which segments of ``seg_min..seg_max`` tokens recur, anywhere in the context.

    Up to ``config.max_repeats`` copies per sequence, each of a length drawn log-uniformly in
    ``seg_min..seg_max``. Half of the sequences (a coin per sequence) place their copies left
    to right: each starts after the previous copy and a gap of ``0..length`` fresh tokens,
    at least ``length`` tokens into the sequence; the other half place them right to left:
    each ends before the previous copy, less a gap of ``0..length``, starting from the end
    of the context — so that copies and their sources are as dense at the end of the
    context as at its start. A copy's source ends ``0 .. start - length`` tokens before the
    copy's start, that distance log-uniform (adjacent repeats are common); a source may lie
    in an earlier copy. A repeat that does not fit is skipped, and a shorter one may fit
    later; the first always fits (``2 * seg_max <= n_ctx``), so every sequence holds one
    repeat at least. The tokens outside the copies follow the bigram table of
    :func:`data_tables` and hold its planted skip-trigrams (see :class:`TrainConfig`), or are
    uniformly random where the config has neither. Deterministic given the generator's state.

    >>> g = torch.Generator().manual_seed(0)
    >>> b = repeated_segment_batch(TrainConfig(d_vocab=10, n_ctx=24, seg_min=2, seg_max=6), 3, g)
    >>> src, start, n = b.copies[0, 0].tolist()
    >>> bool((b.tokens[0, src:src + n] == b.tokens[0, start:start + n]).all())
    True
    """
    n_ctx, k = config.n_ctx, config.max_repeats
    uniform = not (config.bigram_successors or config.skip_trigrams)
    if uniform:  # the draws of the uniform data, in the same order as before the bigram table
        fresh = torch.randint(0, config.d_vocab, (batch_size, n_ctx), generator=generator)
    lengths = _segment_lengths(config, (k, batch_size), generator)
    u_gap, u_src = torch.rand((2, k, batch_size), generator=generator, dtype=torch.float64)
    from_right = torch.rand(batch_size, generator=generator) < 0.5
    copies = torch.full((batch_size, k, 3), -1, dtype=torch.long)
    free = torch.zeros(batch_size, dtype=torch.long)  # left to right: first position after the last copy
    bound = torch.full((batch_size,), n_ctx, dtype=torch.long)  # right to left: start of the last copy
    for i in range(k):
        length = lengths[i]
        earliest = torch.maximum(free, length)  # a copy needs its whole source before it
        latest = torch.where(from_right, bound, torch.full_like(bound, n_ctx)) - length
        room = latest - earliest  # the copy starts in earliest .. latest
        fits = room >= 0
        gap = (u_gap[i] * (torch.minimum(room.clamp(min=0), length) + 1)).floor().long()
        start = torch.where(from_right, latest - gap, earliest + gap)
        src = start - length - ((start - length + 1).clamp(min=1).double().pow(u_src[i]).floor().long() - 1)
        copies[:, i] = torch.where(fits[:, None], torch.stack([src, start, length], dim=1), copies[:, i])
        free = torch.where(fits & ~from_right, start + length, free)
        bound = torch.where(fits & from_right, start, bound)
    # in order of the copy's start, placed repeats first: every source is final when copied
    order = torch.where(copies[..., 1] < 0, n_ctx, copies[..., 1]).argsort(dim=1, stable=True)
    copies = copies.gather(1, order[..., None].expand(-1, -1, 3))
    pos = torch.arange(n_ctx).unsqueeze(0)  # [1, n_ctx]
    source = pos.expand(batch_size, n_ctx).clone()  # [batch, n_ctx]: the fresh position each token copies
    repeat_mask = torch.zeros(batch_size, n_ctx, dtype=torch.bool)
    for i in range(k):
        src, start, length = copies[:, i].unbind(-1)
        inside = (start[:, None] >= 0) & (pos >= start[:, None]) & (pos < (start + length)[:, None])  # [batch, n_ctx]
        shifted = source.gather(1, (pos - (start - src)[:, None]).clamp(min=0, max=n_ctx - 1))
        source = torch.where(inside, shifted, source)
        repeat_mask |= inside & (pos > start[:, None])
    if uniform:
        return RepeatBatch(fresh.gather(1, source), copies, repeat_mask)
    return RepeatBatch(_structured_tokens(config, source, generator), copies, repeat_mask)


def _structured_tokens(config: TrainConfig, source: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Tokens that copy ``source`` (``[batch, n_ctx]``, the earlier position each copied token repeats,
    its own position elsewhere) and elsewhere follow the bigram table with planted skip-trigrams."""
    batch_size, n_ctx = source.shape
    tables = data_tables(config)
    pos = torch.arange(n_ctx)
    free = source == pos  # [batch, n_ctx]: not in a copy
    plant = torch.full((batch_size, n_ctx), -1, dtype=torch.long)  # the planted token, -1 where none
    n = config.skip_trigrams
    for _ in range(config.trigrams_per_sequence if n else 0):
        which = torch.randint(0, 2 * n, (batch_size,), generator=generator)
        a, b, c = tables.trigrams.view(2 * n, 3)[which].unbind(-1)
        open_ = free & (plant < 0)
        # B at p and C at p + 1, both free, with a free position for A before p
        can_b = open_[:, 1:-1] & open_[:, 2:] & (open_.long().cumsum(1)[:, :-2] > 0)  # B at 1 .. n_ctx - 2
        score = torch.rand((batch_size, n_ctx - 2), generator=generator).masked_fill(~can_b, -1.0)
        best, at_b = score.max(1)
        at_b = at_b + 1
        can_a = open_ & (pos < at_b[:, None])
        at_a = torch.rand((batch_size, n_ctx), generator=generator).masked_fill(~can_a, -1.0).argmax(1)
        rows = torch.arange(batch_size)[best >= 0]  # sequences where one fits
        plant[rows, at_a[rows]] = a[rows]
        plant[rows, at_b[rows]] = b[rows]
        plant[rows, at_b[rows] + 1] = c[rows]
    follow = torch.rand((batch_size, n_ctx), generator=generator, dtype=torch.float64) < config.bigram_follow
    pick = torch.randint(0, max(config.bigram_successors, 1), (batch_size, n_ctx), generator=generator)
    anything = torch.randint(0, config.d_vocab, (batch_size, n_ctx), generator=generator)
    rows = torch.arange(batch_size)
    tokens = torch.empty(batch_size, n_ctx, dtype=torch.long)
    for p in range(n_ctx):  # left to right: a copy's source, always earlier, is final when copied
        token = anything[:, p]
        if p and config.bigram_successors:
            token = torch.where(follow[:, p], tables.successors[tokens[:, p - 1], pick[:, p]], token)
        token = torch.where(plant[:, p] >= 0, plant[:, p], token)
        tokens[:, p] = torch.where(free[:, p], token, tokens[rows, source[:, p]])
    return tokens


def next_token_losses(logits: torch.Tensor, batch: RepeatBatch) -> dict[str, torch.Tensor]:
    """Mean next-token loss overall, on the repeated part, and elsewhere (0-d tensors).

    ``logits[:, p]`` predicts ``tokens[:, p + 1]``; the last position predicts nothing, unless the
    batch holds one token more than the logits' positions (:func:`training_batch` with
    ``train_last_position``): that token is only a target, the last position's.
    ``repeat`` averages over targets in the second copy except its first token.
    """
    targets = batch.tokens[:, 1:logits.shape[1] + 1]  # [batch, n_ctx - 1], or [batch, n_ctx] with one token more
    per_token = F.cross_entropy(
        logits[:, :targets.shape[1]].flatten(0, 1).float(), targets.flatten(), reduction="none"
    ).view(batch.tokens.shape[0], -1)
    mask = batch.repeat_mask[:, 1:targets.shape[1] + 1]
    return {
        "loss": per_token.mean(),
        "repeat_loss": per_token[mask].mean(),
        "other_loss": per_token[~mask].mean(),
    }


@dataclass
class TrainHistory:
    """Per-step training losses and the final held-out evaluation."""

    loss: list[float] = field(default_factory=list)
    repeat_loss: list[float] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)
    #: The step the run stopped after when told to stop early (``train_toy``'s ``stop``), else None.
    stopped_at: int | None = None

    def smoothed(self, name: str = "repeat_loss", window: int = 100) -> list[float]:
        """Running mean of a loss over ``window`` steps (for plots and summaries)."""
        values = getattr(self, name)
        out, total, count = [], 0.0, 0
        for i, v in enumerate(values):  # a step with no such tokens (NaN: a batch of text without repeats) is skipped
            if not math.isnan(v):
                total, count = total + v, count + 1
            if i >= window and not math.isnan(values[i - window]):
                total, count = total - values[i - window], count - 1
            out.append(total / count if count else math.nan)
        return out

    def to_dict(self) -> dict:
        return {"loss": self.loss, "repeat_loss": self.repeat_loss, "final": self.final, "stopped_at": self.stopped_at}


ProgressFn = Callable[[int, dict[str, float]], None]


def build_model(config: TrainConfig, device: torch.device | str | None = None) -> CircuitModel:
    """A freshly initialised :class:`CircuitModel` for ``config`` (seeded by ``config.seed``; with ``pos_init``
    ``"sinusoidal"`` its positional embedding :func:`sinusoidal_positions`)."""
    model = CircuitModel.random(
        config.arch,
        d_model=config.d_model,
        d_head=config.d_head,
        d_vocab=config.d_vocab,
        n_ctx=config.n_ctx,
        seed=config.seed,
        dtype=torch.float32,
        device=device,
        init_std=config.init_std,
    )
    if config.pos_init == "sinusoidal":
        with torch.no_grad():
            model.W_pos.copy_(sinusoidal_positions(config.d_model, config.n_ctx, 10 * (config.init_std or 0.1)))
    return model


def sinusoidal_positions(d_model: int, n_ctx: int, rms: float) -> torch.Tensor:
    """``[d_model, n_ctx]`` (``W_pos``'s shape): position ``p``'s sines and cosines at ``d_model / 2`` wavelengths
    from 2π to 10⁴·2π (Vaswani et al., 2017), each entry of root-mean-square ``rms``. A fixed rotation maps every
    position's column to the next one's, so a head's ``W_Qᵀ W_K`` can attend one token back at every position
    at once: measured on text (a BPE of 300, 2 × 12 heads, batch 2 × 512), the layer-0 previous-token score
    reached 0.18 by step 1,500 from a sinusoidal start, against 0.04 from a normal one (which rose only after step
    3,000). ``train-toy --pos-init sinusoidal`` starts ``W_pos`` here at 10 × ``init_std`` (1.0 without one: the
    embeddings' own scale), above the token embeddings, so that positions steer the first layer's scores from the
    first steps.

    >>> table = sinusoidal_positions(4, 3, rms=1.0)
    >>> table.shape, round(float(table.pow(2).mean().sqrt()), 6)
    (torch.Size([4, 3]), 1.0)
    """
    position = torch.arange(n_ctx, dtype=torch.float64)
    rate = torch.exp(-math.log(10_000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angle = rate[:, None] * position[None, :]  # [d_model / 2 (rounded up), n_ctx]
    table = torch.stack([angle.sin(), angle.cos()], dim=1).reshape(-1, n_ctx)[:d_model]
    return (table * (rms / table.pow(2).mean().sqrt())).to(torch.float32)


def training_batch(config: TrainConfig, batch_size: int, generator: torch.Generator, data=None, *,
                   heldout: bool = False) -> RepeatBatch:
    """A batch for training ``config``'s model: :func:`repeated_segment_batch`, or with
    ``train_last_position`` sequences of ``n_ctx + 1`` tokens whose last token is only the target of
    position ``n_ctx - 1`` (the model reads the first ``n_ctx``). Without it the last position is never
    trained: nothing follows it, so its positional embedding keeps its random initial value, and the
    induction heads' queries there, which read it, attend elsewhere. A run on text cuts its
    sequences from ``data`` (a :class:`~numeric_check.training.text.TextData`), from its held-out part
    with ``heldout`` (:func:`~numeric_check.training.text.text_batch`).

    >>> config = TrainConfig(d_vocab=10, n_ctx=24, seg_min=2, seg_max=6, train_last_position=True)
    >>> training_batch(config, 3, torch.Generator().manual_seed(0)).tokens.shape
    torch.Size([3, 25])
    """
    if config.on_text:
        from numeric_check.training.text import text_batch

        if data is None:
            raise TrainConfigError("this run trains on text: give its TextData (tcircuits train-toy --text-file FILE)")
        return text_batch(data.heldout if heldout else data.train, config.n_ctx, batch_size, generator,
                          copy_share=config.copy_share, seg_min=config.seg_min, seg_max=config.seg_max)
    if config.train_last_position:
        config = dataclasses.replace(config, n_ctx=config.n_ctx + 1, train_last_position=False)
    return repeated_segment_batch(config, batch_size, generator)


def _inputs(config: TrainConfig, batch: RepeatBatch) -> torch.Tensor:
    """The tokens the model reads: all of them, or all but the last (a target only) with ``train_last_position``."""
    return batch.tokens[:, :config.n_ctx]


@torch.no_grad()
def evaluate(model: CircuitModel, config: TrainConfig, *, seed: int, n_batches: int | None = None,
             data=None) -> dict[str, float]:
    """Mean losses of ``model`` on ``n_batches`` fresh batches drawn with ``seed`` (from the held-out
    text of ``data`` for a run on text)."""
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    totals: dict[str, list[float]] = {}
    count = n_batches if n_batches is not None else config.eval_batches
    for _ in range(count):
        batch = _to(training_batch(config, config.batch_size, generator, data, heldout=True), device)
        for name, value in next_token_losses(model(_inputs(config, batch)), batch).items():
            totals.setdefault(name, []).append(float(value))
    # a batch with no repeated tokens has no repeat loss (NaN): the mean of the batches that have one, else NaN
    return {name: (sum(kept) / len(kept) if (kept := [v for v in values if not math.isnan(v)]) else math.nan)
            for name, values in totals.items()}


def train_toy(
    config: TrainConfig,
    progress: ProgressFn | None = None,
    *,
    device: torch.device | str | None = None,
    data=None,
    on_step: Callable[[int, CircuitModel], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> tuple[CircuitModel, TrainHistory]:
    """Train a model by ``config``; return it and its :class:`TrainHistory`.

    ``progress(step, {"loss": ..., "repeat_loss": ...})`` is called after every step
    (``step`` counts from 1). Data come from a generator seeded by ``config.seed``; the
    final evaluation uses a separate seed, so it is held out. A run on text (``config.on_text``)
    takes its sequences from ``data`` (:class:`~numeric_check.training.text.TextData`; evaluated on its
    held-out part). ``on_step(step, model)`` is called after every step, for what must see the model
    as training goes (:class:`~numeric_check.training.history.History` keeps snapshots); it must draw
    nothing from torch's random streams. ``stop()`` is asked after every step: once it says True the run ends
    there (``history.stopped_at``) and is evaluated as a finished one is (the command line's Ctrl-C). Thread count
    is the caller's choice (``torch.set_num_threads``).
    """
    model = build_model(config, device)
    device = next(model.parameters()).device
    fuse_attention(model, config.attention_kernel == "sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed)
    history = TrainHistory()
    model.train()
    for step in range(1, config.steps + 1):
        batch = _to(training_batch(config, config.batch_size, generator, data), device)
        losses = next_token_losses(model(_inputs(config, batch)), batch)
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        for group in optimizer.param_groups:
            group["lr"] = config.lr * config.lr_factor(step - 1)
        optimizer.step()
        record = {name: losses[name].item() for name in ("loss", "repeat_loss")}
        history.loss.append(record["loss"])
        history.repeat_loss.append(record["repeat_loss"])
        if on_step is not None:
            on_step(step, model)
        if progress is not None:
            progress(step, record)
        if stop is not None and step < config.steps and stop():
            history.stopped_at = step
            break
    model.eval()
    history.final = evaluate(model, config, seed=config.seed + 1_000_003, data=data)
    fuse_attention(model, False)  # what is returned is analysed: its patterns formed as always
    return model, history


def fuse_attention(model: CircuitModel, on: bool) -> None:
    """Let ``model``'s attention layers use torch's fused causal kernel while nothing hooks their scores or
    patterns (``on``), or form every pattern (``not on``, as every analysis needs); for good, unlike
    :func:`~numeric_check.model.layers.fused_attention`'s block."""
    set_fused(model, on)


def _to(batch: RepeatBatch, device: torch.device) -> RepeatBatch:
    return RepeatBatch(*(t.to(device) for t in batch))


def training_record(config: TrainConfig, history: TrainHistory, seconds: float) -> dict:
    """What the JSON beside a trained checkpoint records: config, final losses, a loss curve."""
    smooth = history.smoothed("loss", 100)
    smooth_repeat = history.smoothed("repeat_loss", 100)
    every = max(1, len(smooth) // 40)
    def number(value: float, digits: int | None = None):  # no such tokens (NaN): null in the record
        return None if math.isnan(value) else (value if digits is None else round(value, digits))

    stopped = {} if history.stopped_at is None else {"stopped": {"step": history.stopped_at, "of": config.steps}}
    return {
        "train_config": config.to_dict(),
        **stopped,  # told to stop early: the model is the one after that step (its learning rate where the schedule had it then)
        "final": {name: value if name == "loss" else number(value) for name, value in history.final.items()},
        "uniform_loss": math.log(config.d_vocab),
        "seconds": round(seconds, 1),
        "curve": [
            {"step": i + 1, "loss": round(smooth[i], 4), "repeat_loss": number(smooth_repeat[i], 4)}
            for i in range(every - 1, len(smooth), every)
        ],
    }


# --- the models shipped with the package -----------------------------------------------------

SHIPPED_LAYERS = (0, 1, 2)


def shipped_checkpoint(n_layers: int = 2) -> Path:
    """Path of the ``n_layers``-layer model trained by :func:`train_toy` and shipped in ``numeric_check/data``.

    The 2-layer model has a previous-token head in layer 0 and induction heads in layer 1;
    the 1-layer model is the control that cannot do induction; the 0-layer model is the
    direct path alone. A JSON record of each training run lies beside it.

    >>> shipped_checkpoint(2).name
    'induction_2l.safetensors'
    """
    if n_layers not in SHIPPED_LAYERS:
        raise TrainConfigError(
            f"no shipped model with {n_layers!r} layers; expected one of " + ", ".join(map(str, SHIPPED_LAYERS))
        )
    return Path(str(resources.files("numeric_check") / "data" / f"induction_{n_layers}l.safetensors"))


def training_record_for(checkpoint: Path | str, model: CircuitModel | None = None) -> dict | None:
    """The JSON training record written beside ``checkpoint`` by ``train-toy``, or None when
    there is none. A record that is there but malformed (not JSON, nested or sized beyond
    reason, fields of the wrong type) raises :class:`CheckpointError` naming it: analysing
    with data other than those it records would be silently wrong. So does a record of
    another model: with ``model`` (the checkpoint loaded), the record's architecture and
    sizes must be the model's, and the content hash it recorded the checkpoint's."""
    sidecar = Path(checkpoint).with_suffix(".json")
    if not sidecar.exists():
        return None
    where = f"the training record {str(sidecar)!r}"
    record = read_json(read_text_file(sidecar, "the training record", CheckpointError), where, CheckpointError)
    check_training_record(record, where)
    if model is not None:
        check_record_matches(record, model, stored_content_hash(checkpoint), where)
    return record


def check_record_matches(record: dict, model: CircuitModel, content_sha256: str | None, where: str) -> None:
    """Refuse a training record written for another model than ``model`` (a record copied or
    left beside the wrong checkpoint): its architecture, its sizes, or the content hash it
    recorded (``checkpoint_sha256``, written by ``train-toy``) differ from the checkpoint's."""
    config = TrainConfig.from_dict(record["train_config"])
    recorded = {"architecture": config.arch.describe(), "d_model": config.d_model, "d_head": config.d_head,
                "d_vocab": config.d_vocab, "n_ctx": config.n_ctx}
    actual = {"architecture": model.arch.describe(), "d_model": model.cfg.d_model, "d_head": model.cfg.d_head,
              "d_vocab": model.cfg.d_vocab, "n_ctx": model.cfg.n_ctx}
    differ = [f"{key} {recorded[key]!r} where the checkpoint has {actual[key]!r}" for key in recorded if recorded[key] != actual[key]]
    recorded_hash = record.get("checkpoint_sha256")
    if not differ and recorded_hash is not None and content_sha256 is not None and recorded_hash != content_sha256:
        differ = ["another content hash (it was written for another training run)"]
    if differ:
        raise CheckpointError(f"{where} belongs to another model: it records {'; '.join(differ)}; "
                              "move it away or delete it to analyse the checkpoint without it")


def check_training_record(record, where: str) -> None:
    """The shape of what :func:`training_record` writes: ``train_config`` (a valid
    :class:`TrainConfig`), and optionally ``final`` (losses by name), ``uniform_loss``,
    ``seconds``, ``curve`` (points with ``step``, ``loss``, ``repeat_loss``) and ``text`` (its SHA-256s)."""
    def fail(message: str):
        raise CheckpointError(f"{where} {message}; fix it or delete it to analyse without it")

    def is_number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if not isinstance(record, dict) or not isinstance(record.get("train_config"), dict):
        fail("must be an object with 'train_config' (as train-toy writes it)")
    try:
        TrainConfig.from_dict(record["train_config"])
    except (TrainConfigError, TypeError) as err:
        fail(f"has an unusable train_config: {err}")
    final = record.get("final", {})  # a loss over tokens a run never saw (repeats in a text without any) is null
    if not isinstance(final, dict) or not all(isinstance(k, str) and (is_number(v) or (v is None and k != "loss"))
                                              for k, v in final.items()):
        fail("has 'final' that is not an object of losses by name")
    for key in ("uniform_loss", "seconds"):
        if key in record and not is_number(record[key]):
            fail(f"has {key} {record[key]!r}, not a number")
    curve = record.get("curve", [])
    point = {"step", "loss", "repeat_loss"}
    if not isinstance(curve, list) or not all(
        isinstance(p, dict) and point <= set(p) and is_number(p["step"]) and is_number(p["loss"])
        and (is_number(p["repeat_loss"]) or p["repeat_loss"] is None) for p in curve
    ):
        fail("has a 'curve' that is not a list of points with step, loss and repeat_loss")
    stopped = record.get("stopped")
    if stopped is not None and not (isinstance(stopped, dict) and all(
            type(stopped.get(key)) is int for key in ("step", "of"))
            and 1 <= stopped["step"] < stopped["of"] == record["train_config"].get("steps")):
        fail(f"has stopped {stopped!r}, not the step a run stopped after ({{'step': N, 'of': its steps}}, N below them)")
    if "checkpoint_sha256" in record and not isinstance(record["checkpoint_sha256"], str):
        fail(f"has checkpoint_sha256 {record['checkpoint_sha256']!r}, not a string")
    text = record.get("text", {})  # the SHA-256s a text is known by (training or held-out)
    if not isinstance(text, dict) or not all(
            isinstance(text.get(key, "0" * 64), str) and re.fullmatch("[0-9a-f]{64}", text.get(key, "0" * 64))
            for key in ("sha256", "heldout_sha256")):
        fail("has a 'text' that is not an object with the SHA-256s of its text (sha256, heldout_sha256: 64 hex digits)")
