"""Tests for the ``train-toy`` and ``analyze`` subcommands (run in-process through the real CLI)."""

from __future__ import annotations

import json

import pytest
import torch

from derivations.cli import build_parser, main
from numeric_check.checkpoint import load_checkpoint

torch.set_num_threads(1)

TINY = ["--vocab", "12", "--n-ctx", "16", "--seg-min", "2", "--seg-max", "6", "--d-model", "16", "--d-head", "8", "--heads", "2"]


def _subparser_help(name: str) -> str:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices[name].format_help()


def test_train_toy_help_teaches_the_task():
    text = _subparser_help("train-toy")
    for phrase in ("repeated random", "varying offset", "previous-token head", "induction head", "--layers", "examples:"):
        assert phrase in text


def test_train_toy_writes_checkpoint_and_record(tmp_path, capsys):
    out = tmp_path / "sub" / "tiny.safetensors"
    code = main(["train-toy", "--layers", "1", "--steps", "5", "--quiet", "--out", str(out), *TINY])
    assert code == 0
    stdout = capsys.readouterr().out
    assert "trained 1 layers x 2 heads" in stdout and "on repeated tokens" in stdout and str(out) in stdout
    model = load_checkpoint(out)
    assert model.arch.n_layers == 1 and model.cfg.d_vocab == 12
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["train_config"]["steps"] == 5
    assert set(record["final"]) == {"loss", "repeat_loss", "other_loss"}
    assert record["curve"][-1]["step"] == 5


def test_train_toy_shows_a_progress_bar_on_stderr(tmp_path, capsys):
    main(["train-toy", "--layers", "0", "--steps", "3", "--out", str(tmp_path / "m.safetensors"), *TINY])
    assert "3/3" in capsys.readouterr().err


def test_train_toy_can_save_float16(tmp_path):
    out = tmp_path / "half.safetensors"
    assert main(["train-toy", "--layers", "1", "--steps", "1", "--quiet", "--save-dtype", "float16", "--out", str(out), *TINY]) == 0
    assert load_checkpoint(out).dtype == torch.float16


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n-ctx", "32"], "seg_max=24 tokens need 48 positions, but n_ctx=32"),
        (["--steps", "0"], "steps must be an int >= 1"),
        (["--threads", "0"], "--threads must be >= 1"),
    ],
)
def test_train_toy_bad_config_is_a_clear_error(tmp_path, capsys, argv, message):
    assert main(["train-toy", "--out", str(tmp_path / "m.safetensors"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_train_toy_bad_output_path(tmp_path, capsys):
    assert main(["train-toy", "--steps", "1", "--out", str(tmp_path / "m.pt")]) == 2
    assert "should end in '.safetensors'" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["train-toy", "--steps", "1", "--out", str(blocker / "m.safetensors")]) == 2
    assert "cannot write to" in capsys.readouterr().err
