"""Hostile input, round 3 (issue 21): vocabularies, training records and checkpoints that
would give a wrong answer. A vocabulary reads back token for token (lines end at ``\\n`` or
``\\r\\n`` only; a byte-order mark is not a token's; ``[PAD]`` first is no JSON; a JSON object
maps tokens to ids); a training record beside the wrong checkpoint is refused by name; odd
``.pt`` files and configs are one of our errors, never a traceback."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from derivations.architecture import Architecture
from numeric_check.cli.train_analyze import _read_vocab
from numeric_check.errors import CheckpointError, ConfigError, InputFileError
from numeric_check.model.checkpoint import load_checkpoint, save_checkpoint
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.config import ModelConfig
from numeric_check.training.config import TrainConfig
from numeric_check.training.toy import build_model, training_record_for
from tests.conftest import FAST, THOROUGH
from tests.helpers import folder_state, quickly
from tests.strategies import vocab_files


# -- vocabulary files ------------------------------------------------------------------------------


@THOROUGH
@given(vocab_files())
def test_a_vocabulary_file_reads_back_token_for_token(tmp_path_factory, drawn):
    tokens, data = drawn
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_bytes(data)
    before = folder_state(path.parent)
    with quickly(5):
        try:
            got = _read_vocab(path)
        except InputFileError:  # a first line that reads as JSON and is not: one of our errors
            assert tokens[0].lstrip()[:1] in ("[", "{", "\ufeff") or tokens[0][:1].isspace()
            return
    assert got == tokens or (tokens[0][:1] in "[{" and len(got) != len(tokens))
    assert folder_state(path.parent) == before


@pytest.mark.parametrize("separator", ["\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x0b"])
def test_a_token_holding_a_line_break_of_unicode_stays_one_token(tmp_path, separator):
    path = tmp_path / "vocab.txt"
    path.write_text(f"a\nb{separator}c\nd\n", encoding="utf-8")
    assert _read_vocab(path) == ["a", f"b{separator}c", "d"]


def test_a_bert_vocab_txt_reads_and_a_bom_is_not_a_token(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("\ufeff[PAD]\r\n[UNK]\r\n[CLS]\r\nthe\r\n".encode())
    assert _read_vocab(path) == ["[PAD]", "[UNK]", "[CLS]", "the"]


def test_a_json_object_of_ids_is_read_in_id_order(tmp_path):
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps({"b": 1, "a": 0, "c": 2}))
    assert _read_vocab(path) == ["a", "b", "c"]
    path.write_text(json.dumps({"b": 1, "a": 1}))
    with pytest.raises(InputFileError, match="the ids 0..1 once each"):
        _read_vocab(path)


# -- training records ------------------------------------------------------------------------------

SMALL = dict(d_model=8, d_head=4, d_vocab=12, n_ctx=16, seg_min=2, seg_max=6, steps=1, batch_size=2)


@FAST
@given(st.integers(0, 2), st.integers(1, 2), st.integers(0, 2), st.integers(1, 2), st.sampled_from([8, 16]))
def test_a_training_record_is_read_only_beside_its_own_model(tmp_path_factory, layers, heads, other_layers, other_heads,
                                                              d_model):
    folder = tmp_path_factory.mktemp("record")
    model = build_model(TrainConfig(n_layers=layers, n_heads=heads, **SMALL))
    checkpoint = folder / "m.safetensors"
    save_checkpoint(model, checkpoint)
    other = TrainConfig(n_layers=other_layers, n_heads=other_heads, **{**SMALL, "d_model": d_model})
    (folder / "m.json").write_text(json.dumps({"train_config": other.to_dict()}))
    before = folder_state(folder)
    loaded = load_checkpoint(checkpoint, device="cpu")
    same = (layers, heads if layers else None, 8) == (other_layers, other_heads if other_layers else None, d_model)
    if same or (layers == other_layers == 0 and d_model == 8):
        assert training_record_for(checkpoint, loaded)["train_config"] == other.to_dict()
    else:
        with pytest.raises(CheckpointError, match="belongs to another model"):
            training_record_for(checkpoint, loaded)
    assert folder_state(folder) == before


def test_a_record_of_another_training_run_is_refused_by_its_hash(tmp_path):
    config = TrainConfig(n_layers=1, **SMALL)
    checkpoint = tmp_path / "m.safetensors"
    save_checkpoint(build_model(config), checkpoint)
    record = {"train_config": config.to_dict(), "checkpoint_sha256": "0" * 64}
    (tmp_path / "m.json").write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="another content hash"):
        training_record_for(checkpoint, load_checkpoint(checkpoint, device="cpu"))


def test_the_shipped_records_match_their_models():
    from numeric_check.training.toy import shipped_checkpoint

    for layers in (0, 1, 2):
        path = shipped_checkpoint(layers)
        assert training_record_for(path, load_checkpoint(path, device="cpu")) is not None


# -- torch files and configs ----------------------------------------------------------------------

MODEL = CircuitModel.random(Architecture(1, 2), d_model=4, d_head=2, d_vocab=5, n_ctx=3, seed=0, device="cpu")


@pytest.mark.parametrize("mangle", [
    lambda sd, cfg: {"config": cfg, "state_dict": {**sd, 1: torch.zeros(1), "extra": torch.zeros(1)}},
    lambda sd, cfg: {"config": {**cfg, 1: 2, "z": 3}, "state_dict": sd},
    lambda sd, cfg: {"config": {**cfg, "attn_scale": 1e300}, "state_dict": sd},
    lambda sd, cfg: {"config": {**cfg, "attn_scale": 1e-300}, "state_dict": sd},
])
def test_odd_torch_files_are_checkpoint_errors(tmp_path, mangle):
    path = tmp_path / "m.pt"
    torch.save(mangle(dict(MODEL.state_dict()), MODEL.cfg.to_dict()), path)
    with pytest.raises(CheckpointError):
        load_checkpoint(path, device="cpu")


@THOROUGH
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_any_attn_scale_gives_a_usable_config_or_a_config_error(scale):
    try:
        cfg = ModelConfig(Architecture(1, 1), d_model=4, d_head=2, d_vocab=5, n_ctx=3, attn_scale=scale)
    except ConfigError:
        return
    assert 0 < cfg.scale**2 < float("inf") and 0 < 1 / cfg.scale**2 < float("inf")


def test_a_pickled_payload_names_the_refused_global(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"x": Payload()}, path)
    with pytest.raises(CheckpointError, match=r"holds the Python object posix\.system"):
        load_checkpoint(path, device="cpu")


def test_a_file_name_that_is_not_utf8_is_said_to_be_one(tmp_path):
    path = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_checkpoint(MODEL, path)
    with pytest.raises(CheckpointError, match="file name is not UTF-8"):
        load_checkpoint(path, device="cpu")
