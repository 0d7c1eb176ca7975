"""Tests for numeric_check.training.toy: the repeated-segment data, the config, a tiny training run."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.conftest import PROPERTY

from numeric_check.errors import CheckpointError
from numeric_check.model.checkpoint import load_checkpoint, save_checkpoint
from numeric_check.training.toy import (
    TrainConfig,
    TrainConfigError,
    data_tables,
    evaluate,
    next_token_losses,
    repeated_segment_batch,
    shipped_checkpoint,
    train_toy,
    training_record,
    training_record_for,
)

pytestmark = pytest.mark.slow  # toy training: left out by pytest -m "not slow"

torch.set_num_threads(1)

TINY = dict(n_layers=1, n_heads=2, d_model=16, d_head=8, d_vocab=12, n_ctx=16, seg_min=2, seg_max=6, batch_size=16)


def _batch(config: TrainConfig, batch_size: int = 256, seed: int = 0):
    return repeated_segment_batch(config, batch_size, torch.Generator().manual_seed(seed))


def _check_batch(config: TrainConfig, batch) -> None:
    n = config.n_ctx
    rows = batch.tokens.shape[0]
    assert batch.tokens.shape == batch.repeat_mask.shape == (rows, n)
    assert batch.copies.shape == (rows, config.max_repeats, 3)
    assert batch.tokens.dtype == torch.long
    assert int(batch.tokens.min()) >= 0 and int(batch.tokens.max()) < config.d_vocab
    for row in range(rows):
        expected = torch.zeros(n, dtype=torch.bool)
        placed = [c for c in batch.copies[row].tolist() if c[1] >= 0]
        assert placed, "every sequence holds one repeat at least"
        assert all(c == [-1, -1, -1] for c in batch.copies[row].tolist()[len(placed):])
        end = 0
        for src, start, length in placed:
            assert config.seg_min <= length <= config.seg_max
            assert 0 <= src and src + length <= start and start + length <= n  # source wholly before its copy
            assert start >= end  # copies in order, never overlapping
            assert torch.equal(batch.tokens[row, src : src + length], batch.tokens[row, start : start + length])
            expected[start + 1 : start + length] = True  # each copy without its first token
            end = start + length
        assert torch.equal(batch.repeat_mask[row], expected)


def test_segments_are_repeated_and_mask_marks_the_copies():
    config = TrainConfig()
    _check_batch(config, _batch(config))


@PROPERTY
@given(
    n_ctx=st.integers(4, 80),
    seg_min=st.integers(2, 40),
    extra=st.integers(0, 10),
    d_vocab=st.integers(2, 50),
    max_repeats=st.integers(1, 8),
    seed=st.integers(0, 2**31),
)
def test_batches_are_valid_for_every_fitting_config(n_ctx, seg_min, extra, d_vocab, max_repeats, seed):
    seg_max = seg_min + extra
    if 2 * seg_max > n_ctx:
        with pytest.raises(TrainConfigError):
            TrainConfig(n_ctx=n_ctx, seg_min=seg_min, seg_max=seg_max, d_vocab=d_vocab)
        return
    config = TrainConfig(n_ctx=n_ctx, seg_min=seg_min, seg_max=seg_max, d_vocab=d_vocab, max_repeats=max_repeats)
    _check_batch(config, _batch(config, batch_size=8, seed=seed))


def test_repeats_cover_the_whole_context():
    """Regression (issue 12): copies of every length sit at every offset, several per sequence,
    so induction pays at every position; before, one 16-32-token repeat per sequence and no
    second copy before position 16 or short repeat anywhere."""
    config = TrainConfig()
    batch = _batch(config, batch_size=2048)
    placed = batch.copies[..., 1] >= 0
    assert (placed.sum(1) >= 2).float().mean() > 0.7
    lengths = batch.copies[..., 2][placed]
    assert set(lengths.tolist()) == set(range(config.seg_min, config.seg_max + 1))
    assert (lengths <= 8).float().mean() > 0.3  # short repeats are common
    sources, starts = batch.copies[..., 0][placed], batch.copies[..., 1][placed]
    assert set(range(0, config.n_ctx - 2 * config.seg_min - 4)) <= set(sources.tolist())  # first copies at every offset
    assert set(starts.tolist()) == set(range(config.seg_min, config.n_ctx - config.seg_min + 1))
    coverage = batch.repeat_mask.float().mean(0)  # [n_ctx]: how often each position is a predictable repeat
    assert coverage[2 * config.seg_min :].min() > 0.05
    assert len(set((starts - sources).tolist())) > 40, "a fixed offset would let a positional head solve the task"
    # sources (the keys an induction head must find) reach the end of the context too: half the
    # sequences place their copies from the right, so repeats there are common
    last_end = (batch.copies[..., 1] + batch.copies[..., 2]).amax(1)
    assert (last_end >= config.n_ctx - 2).float().mean() > 0.3
    keys = torch.zeros(config.n_ctx)
    for src, length in zip(sources.tolist(), batch.copies[..., 2][placed].tolist()):
        keys[src + 1 : src + length] += 1  # positions an induction head reads as keys
    assert keys[1 : config.n_ctx - 6].min() > 0 and keys[config.n_ctx - 10] / len(batch.tokens) > 0.03


def test_seeded_determinism():
    config = TrainConfig()
    a, b, c = _batch(config, seed=5), _batch(config, seed=5), _batch(config, seed=6)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a.tokens, c.tokens)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_ctx=32, seg_max=24), "seg_max=24 tokens need 48 positions, but n_ctx=32"),
        (dict(seg_min=10, seg_max=9), "seg_min=10 is larger than seg_max=9"),
        (dict(seg_min=1), "seg_min must be an int >= 2, got 1"),
        (dict(max_repeats=0), "max_repeats must be an int >= 1, got 0"),
        (dict(n_layers=-1), "n_layers must be an int >= 0, got -1"),
        (dict(d_vocab=1), "d_vocab must be an int >= 2"),
        (dict(steps=0), "steps must be an int >= 1"),
        (dict(batch_size=2.5), "batch_size must be an int >= 1, got 2.5"),
        (dict(positional="rotary"), "unknown positional kind 'rotary'; expected one of 'none', 'standard', 'qk_only'"),
        (dict(lr=0.0), "lr must be > 0"),
        (dict(lr=float("nan")), "lr must be a finite number"),
        (dict(init_std=0.0), "init_std must be None or a finite number > 0, got 0.0"),
        (dict(warmup_steps=-1), "warmup_steps must be an int >= 0, got -1"),
        (dict(steps=10, warmup_steps=6, decay_steps=5), "warmup_steps=6 and decay_steps=5 add up to more than steps=10"),
        (dict(attention_kernel="flash"), "unknown attention_kernel 'flash'; expected one of 'sdpa', 'einsum'"),
        (dict(pos_init="rotary"), "unknown pos_init 'rotary'; expected one of 'normal', 'sinusoidal'"),
        (dict(pos_init="sinusoidal", positional="none"), "positional is 'none'; use positional 'qk_only' or 'standard'"),
    ],
)
def test_bad_configs_are_rejected_with_the_numbers(kwargs, message):
    with pytest.raises(TrainConfigError) as info:
        TrainConfig(**kwargs)
    assert message in str(info.value)


def test_config_round_trips_through_a_dict():
    config = TrainConfig(**TINY)
    assert TrainConfig.from_dict(config.to_dict()) == config
    with pytest.raises(TrainConfigError, match="unknown TrainConfig fields \\['colour'\\]"):
        TrainConfig.from_dict({**config.to_dict(), "colour": "red"})


def test_records_from_before_the_schedule_read_as_a_constant_rate():
    old = {k: v for k, v in TrainConfig(**TINY).to_dict().items() if k not in ("warmup_steps", "decay_steps")}
    config = TrainConfig.from_dict(old)
    assert (config.warmup_steps, config.decay_steps) == (0, 0)
    assert {config.lr_factor(i) for i in range(config.steps)} == {1.0}


def test_records_from_before_the_fused_kernel_train_with_the_einsum():
    old = {k: v for k, v in TrainConfig(**TINY).to_dict().items() if k != "attention_kernel"}
    assert TrainConfig.from_dict(old).attention_kernel == "einsum"
    assert TrainConfig(**TINY).attention_kernel == "sdpa"


def test_records_from_before_pos_init_started_positions_normal():
    old = {k: v for k, v in TrainConfig(**TINY).to_dict().items() if k != "pos_init"}
    assert TrainConfig.from_dict(old).pos_init == "normal"


def test_a_sinusoidal_start_is_one_rotation_from_each_position_to_the_next_and_is_learnt():
    """``W_pos`` from ``sinusoidal_positions``: of the asked size, the same rotation R maps every position's column to
    the next one's (what lets one W_QK attend one token back everywhere), and training moves it like any weight."""
    from numeric_check.training.toy import build_model, sinusoidal_positions

    table = sinusoidal_positions(10, 40, rms=0.2).double()
    assert table.shape == (10, 40) and abs(float(table.pow(2).mean().sqrt()) - 0.2) < 1e-6
    earlier, later = table[:, :-1], table[:, 1:]
    rotation = later @ torch.linalg.pinv(earlier)
    torch.testing.assert_close(rotation @ earlier, later, atol=1e-6, rtol=0)  # the table is float32
    assert float((table[:, :, None] - table[:, None, :]).abs().amax(0).fill_diagonal_(1).min()) > 1e-3  # all distinct

    config = TrainConfig(**{**TINY, "pos_init": "sinusoidal", "steps": 5})
    start = build_model(config).W_pos.detach().clone()
    torch.testing.assert_close(start, sinusoidal_positions(config.d_model, config.n_ctx, 10 * config.init_std))
    assert not torch.equal(build_model(TrainConfig(**TINY)).W_pos, start)
    trained, _ = train_toy(config)
    assert not torch.equal(trained.W_pos.detach(), start)


def test_the_fused_kernel_trains_as_the_einsum_does_and_is_off_in_what_is_returned():
    """The fused kernel computes what the scores and pattern do (to float32 rounding), is used only while nothing
    hooks them, and the trained model forms its patterns as every analysis needs."""
    from numeric_check.training.toy import build_model, fuse_attention

    config = TrainConfig(**{**TINY, "n_layers": 2, "steps": 30})
    model = build_model(config)
    tokens = torch.randint(0, config.d_vocab, (3, config.n_ctx), generator=torch.Generator().manual_seed(1))
    formed = model(tokens)
    fuse_attention(model, True)
    fused_layers = [m for m in model.modules() if getattr(m, "fused", False)]
    assert len(fused_layers) == 2 and all(m._fusable() for m in fused_layers)
    torch.testing.assert_close(model(tokens), formed, rtol=1e-5, atol=1e-6)
    _, cache = model.run_with_cache(tokens)  # a hook on the pattern: the pattern is formed, not fused
    assert cache["blocks.1.attn.hook_pattern"].shape == (3, 2, config.n_ctx, config.n_ctx)

    (fused, _), (einsum, _) = (train_toy(TrainConfig(**{**TINY, "steps": 30, "attention_kernel": k}))
                               for k in ("sdpa", "einsum"))
    for a, b in zip(fused.parameters(), einsum.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    assert not any(getattr(m, "fused", False) for m in fused.modules())


def test_losses_over_windows_use_the_fused_kernel_for_their_block_only():
    from numeric_check.model.layers import fused_attention
    from numeric_check.training.history import window_losses
    from numeric_check.training.toy import build_model

    model = build_model(TrainConfig(**{**TINY, "n_layers": 2})).double()
    windows = torch.randint(0, TINY["d_vocab"], (5, TINY["n_ctx"] + 1), generator=torch.Generator().manual_seed(2))
    logits = model(windows[:, :-1])
    formed = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten(), reduction="none")
    torch.testing.assert_close(window_losses(model, windows), formed.view(5, -1), rtol=0, atol=1e-12)
    layers = [m for m in model.modules() if hasattr(m, "fused")]
    with fused_attention(model):
        assert all(m.fused for m in layers)
    assert not any(m.fused for m in layers)  # restored, also after window_losses


def test_the_default_schedule_fits_any_number_of_steps():
    assert (TrainConfig().warmup_steps, TrainConfig().decay_steps) == (100, 4500)  # the shipped model's
    assert (TrainConfig(steps=1000).warmup_steps, TrainConfig(steps=1000).decay_steps) == (100, 300)
    assert (TrainConfig(steps=3).warmup_steps, TrainConfig(steps=3).decay_steps) == (0, 1)
    assert TrainConfig(steps=3, decay_steps=0).decay_steps == 0  # given: kept


def test_the_learning_rate_follows_the_schedule_in_training(monkeypatch):
    """The optimiser's rate at each step is lr x lr_factor: up over warmup_steps, down to its last
    step over decay_steps (never 0: every step learns)."""
    config = TrainConfig(**{**TINY, "steps": 8}, warmup_steps=2, decay_steps=3, lr=0.01)
    seen = []
    real_step = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    train_toy(config)
    assert seen == pytest.approx([0.005, 0.01, 0.01, 0.01, 0.01, 0.0075, 0.005, 0.0025])


def test_losses_split_repeated_part_from_the_rest():
    config = TrainConfig(**TINY)
    batch = _batch(config, batch_size=4)
    logits = torch.zeros(4, config.n_ctx, config.d_vocab)  # uniform prediction
    losses = next_token_losses(logits, batch)
    for name in ("loss", "repeat_loss", "other_loss"):
        assert float(losses[name]) == pytest.approx(math.log(config.d_vocab), rel=1e-6)
    # a perfect prediction of the repeated tokens only lowers the repeat loss
    perfect = logits.clone()
    targets = batch.tokens[:, 1:]
    mask = batch.repeat_mask[:, 1:]
    rows, cols = mask.nonzero(as_tuple=True)
    perfect[rows, cols, targets[rows, cols]] = 100.0
    better = next_token_losses(perfect, batch)
    assert float(better["repeat_loss"]) < 1e-6
    assert float(better["other_loss"]) == pytest.approx(math.log(config.d_vocab), rel=1e-6)


def test_tiny_training_run_decreases_loss_and_reports_progress():
    config = TrainConfig(**TINY, steps=40, lr=1e-2, init_std=None)  # N(0, 1) embeddings: a loss well above log(vocab) to come down from
    calls = []
    model, history = train_toy(config, progress=lambda step, record: calls.append((step, record)))
    assert [step for step, _ in calls] == list(range(1, 41))
    assert len(history.loss) == len(history.repeat_loss) == 40
    assert sum(history.loss[-5:]) / 5 < sum(history.loss[:5]) / 5
    assert set(history.final) == {"loss", "repeat_loss", "other_loss"}
    assert history.smoothed("loss", window=5)[-1] == pytest.approx(sum(history.loss[-5:]) / 5)
    # the held-out evaluation is reproducible
    assert evaluate(model, config, seed=1_000_003) == pytest.approx(history.final)


def test_the_last_position_is_trained_only_when_asked():
    """Issue 27: without a token after it, the last position is never trained (its positional embedding
    keeps its random initial value, and induction fails there); ``train_last_position`` draws one token more."""
    from numeric_check.training.toy import build_model, training_batch

    config = TrainConfig(**TINY, steps=3, weight_decay=0.0, train_last_position=True)
    batch = training_batch(config, 4, torch.Generator().manual_seed(0))
    assert batch.tokens.shape == (4, config.n_ctx + 1)
    logits = torch.zeros(4, config.n_ctx, config.d_vocab)
    last = logits.clone()
    last[torch.arange(4), -1, batch.tokens[:, -1]] = 100.0  # only the last position's prediction is right
    assert float(next_token_losses(last, batch)["loss"]) < float(next_token_losses(logits, batch)["loss"]) - 0.1
    off = TrainConfig(**TINY, steps=3, weight_decay=0.0)
    plain = training_batch(off, 4, torch.Generator().manual_seed(0))
    assert torch.equal(plain.tokens, _batch(off, batch_size=4).tokens)  # the data of the runs before it, unchanged
    flat = next_token_losses(last, plain)  # the last position predicts nothing
    assert float(flat["loss"]) == pytest.approx(math.log(config.d_vocab), rel=1e-6)
    trained = {}
    for c in (off, config):
        model, _ = train_toy(c)
        trained[c.train_last_position] = model.W_pos[:, -1].detach().clone()
    initial = build_model(off).W_pos[:, -1].detach()
    assert torch.equal(trained[False], initial)  # no gradient ever reaches it
    assert not torch.allclose(trained[True], initial, atol=1e-4)
    old = {k: v for k, v in config.to_dict().items() if k != "train_last_position"}
    assert TrainConfig.from_dict(old).train_last_position is False  # a record from before it
    with pytest.raises(TrainConfigError, match="train_last_position must be True or False, got 1"):
        TrainConfig(train_last_position=1)


def test_training_is_deterministic_given_the_seed():
    config = TrainConfig(**TINY, steps=3)
    (m1, h1), (m2, h2) = train_toy(config), train_toy(config)
    assert h1.loss == h2.loss
    for (n1, p1), (n2, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)


@pytest.mark.parametrize("n_layers", [0, 2])
def test_zero_and_two_layer_models_train(n_layers):
    config = TrainConfig(**{**TINY, "n_layers": n_layers}, steps=2)
    model, history = train_toy(config)
    assert len(history.loss) == 2 and all(math.isfinite(v) for v in history.loss)


def test_checkpoint_round_trip(tmp_path):
    config = TrainConfig(**TINY, steps=3)
    model, _ = train_toy(config)
    path = tmp_path / "tiny.safetensors"
    save_checkpoint(model, path)
    loaded = load_checkpoint(path)
    tokens = _batch(config, batch_size=2).tokens
    with torch.no_grad():
        assert torch.equal(model(tokens), loaded(tokens))


def test_training_record_and_its_file(tmp_path):
    config = TrainConfig(**TINY, steps=3)
    _, history = train_toy(config)
    record = training_record(config, history, seconds=1.25)
    assert record["train_config"] == config.to_dict()
    assert record["uniform_loss"] == pytest.approx(math.log(12))
    assert [p["step"] for p in record["curve"]] == [1, 2, 3]
    checkpoint = tmp_path / "m.safetensors"
    assert training_record_for(checkpoint) is None  # no file beside it
    checkpoint.with_suffix(".json").write_text("{not json")
    with pytest.raises(CheckpointError, match="m.json' is not usable JSON"):  # not silently the default data
        training_record_for(checkpoint)
    checkpoint.with_suffix(".json").write_text(json.dumps(record))
    assert training_record_for(checkpoint) == record


def test_shipped_checkpoint_paths():
    assert shipped_checkpoint().name == "induction_2l.safetensors"
    assert shipped_checkpoint(1).parent.name == "data"
    with pytest.raises(TrainConfigError, match="no shipped model with 3 layers; expected one of 0, 1, 2"):
        shipped_checkpoint(3)


# --- the data's bigram table and planted skip-trigrams (issue 27) ------------------------------------------


def _transitions(tokens: torch.Tensor, v: int) -> torch.Tensor:
    counts = torch.zeros(v * v, dtype=torch.float64)
    counts.index_add_(0, (tokens[:, :-1] * v + tokens[:, 1:]).flatten(), torch.ones(tokens[:, 1:].numel(), dtype=torch.float64))
    return counts.view(v, v)


def test_the_data_follow_a_bigram_table_drawn_from_the_seed():
    config = TrainConfig()
    tables = data_tables(config)
    assert tables.successors.shape == (128, 4) and (config.bigram_successors, config.skip_trigrams) == (4, 8)
    for column in tables.successors.T:  # each column a permutation: every token as common as any other
        assert torch.equal(column.sort().values, torch.arange(128))
    assert all(torch.equal(x, y) for x, y in zip(tables, data_tables(TrainConfig(n_layers=0, steps=5))))  # the seed alone
    assert not torch.equal(tables.successors, data_tables(TrainConfig(seed=1)).successors)
    batch = _batch(config, 1024)
    _check_batch(config, type(batch)(*(t[:64] for t in batch)))  # the repeats are intact
    counts = _transitions(batch.tokens, 128)
    to_successors = counts.gather(1, tables.successors).sum() / counts.sum()
    assert 0.4 < float(to_successors) < 0.8  # 0.46 measured: 0.75 outside the copies, none into a copy or a plant
    p = counts / counts.sum(1, keepdim=True)
    entropy = float(-(counts.sum(1) / counts.sum() * (p * p.clamp(min=1e-30).log()).sum(1)).sum())
    assert entropy < math.log(128) - 1.4  # far below the flat table's ln 128
    # the data before issue 27: a record without the new fields reads as uniformly random tokens
    old = {k: v for k, v in config.to_dict().items() if k not in ("bigram_successors", "skip_trigrams")}
    legacy = TrainConfig.from_dict(old)
    assert (legacy.bigram_successors, legacy.skip_trigrams) == (0, 0)
    flat = _transitions(_batch(legacy, 1024).tokens, 128)
    assert float(flat.gather(1, tables.successors).sum() / flat.sum()) < 0.1  # 4/128 by chance, repeats aside


def test_the_data_plant_skip_trigrams_and_no_swapped_ones():
    from numeric_check.reports.paper.measure import data_trigram_favour

    config = TrainConfig()
    trigrams = data_tables(config).trigrams
    assert trigrams.shape == (8, 2, 3) and len(set(trigrams.flatten().tolist())) == 40
    assert torch.equal(trigrams[:, 0, 0], trigrams[:, 1, 0])  # two skip-trigrams per source
    favour = data_trigram_favour(config, trigrams, n_sequences=1024)
    for a, b, c in trigrams.view(-1, 3).tolist():
        assert favour[(a, b)][c] > 50  # C after B when A came earlier: far above chance
        assert all(v < 5 for o, v in favour[(a, b)].items() if o != c)  # the other pair's out: near chance
    none = TrainConfig(skip_trigrams=0)
    assert data_tables(none).trigrams.shape == (0, 2, 3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_vocab=32, skip_trigrams=7), "skip_trigrams=7 need 5 distinct tokens each"),
    (dict(d_vocab=32, bigram_successors=32), "bigram_successors=32 must be below d_vocab=32"),
    (dict(bigram_follow=1.5), "bigram_follow must be a probability in [0, 1], got 1.5"),
    (dict(trigrams_per_sequence=-1), "trigrams_per_sequence must be an int >= 0, got -1"),
])
def test_bad_data_structure_is_refused_with_the_numbers(kwargs, message):
    with pytest.raises(TrainConfigError) as info:
        TrainConfig(**kwargs)
    assert message in str(info.value)


def test_a_loss_over_no_tokens_is_no_value_not_a_divergence():
    """Text at copy share 0 in windows too short to repeat a pair of tokens: a batch without repeated tokens has no
    repeat loss (NaN), which the running mean skips, the evaluation leaves out, and the record writes as null."""
    from numeric_check.training.toy import TrainHistory

    history = TrainHistory(loss=[3.0, 2.0, 1.0], repeat_loss=[math.nan, 2.0, math.nan])
    assert history.smoothed("repeat_loss", 2)[0] != history.smoothed("repeat_loss", 2)[0]  # NaN: none yet
    assert history.smoothed("repeat_loss", 2)[1:] == [2.0, 2.0]
    history.final = {"loss": 1.5, "repeat_loss": math.nan, "other_loss": 1.5}
    record = training_record(TrainConfig(**{**TINY, "steps": 3}), history, 1.0)
    assert record["final"]["repeat_loss"] is None and record["curve"][0]["repeat_loss"] is None
    json.dumps(record, allow_nan=False)  # strict JSON
    history.loss[0] = math.nan  # a real divergence stays one: its loss is not a number
    with pytest.raises(ValueError):
        json.dumps(training_record(TrainConfig(**{**TINY, "steps": 3}), history, 1.0), allow_nan=False)
