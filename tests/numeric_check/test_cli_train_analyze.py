"""Tests for the ``train-toy`` and ``analyze`` subcommands (run in-process through the real CLI)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from derivations.cli import build_parser, main
from numeric_check.model.checkpoint import load_checkpoint, save_checkpoint

pytestmark = pytest.mark.slow  # training and analysing through the CLI: left out by pytest -m "not slow"

torch.set_num_threads(1)

TINY = ["--d-vocab", "12", "--n-ctx", "16", "--seg-min", "2", "--seg-max", "6", "--d-model", "16", "--d-head", "8", "--heads", "2"]


def _subparser_help(name: str) -> str:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices[name].format_help()


def test_train_toy_help_teaches_the_task():
    text = " ".join(_subparser_help("train-toy").split())  # phrases across the help's line breaks
    for phrase in ("On your text", "is held out", "Nothing is planted unless --copy-share", "Ctrl-C", "tcircuits dynamics",
                   "Without text, the data is planted", "anywhere in the context", "varying distance", "--max-repeats", "previous-token head", "induction head", "--layers", "examples:"):
        assert phrase in text


def test_train_toy_writes_checkpoint_and_record(tmp_path, capsys):
    out = tmp_path / "sub" / "tiny.safetensors"
    code = main(["train-toy", "--layers", "1", "--steps", "5", "--quiet", "--max-repeats", "2", "--out", str(out), *TINY])
    assert code == 0
    stdout = capsys.readouterr().out
    assert "trained 1 layer x 2 heads" in stdout and "on repeated tokens" in stdout and str(out) in stdout
    model = load_checkpoint(out)
    assert model.arch.n_layers == 1 and model.cfg.d_vocab == 12
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["train_config"]["steps"] == 5 and record["train_config"]["max_repeats"] == 2
    assert set(record["final"]) == {"loss", "repeat_loss", "other_loss"}
    assert record["curve"][-1]["step"] == 5
    # where it was trained, and with what kernel: the record reproduces the run
    assert record["trained_on"]["device"] == "cpu" and record["trained_on"]["torch"] == torch.__version__
    assert record["trained_on"]["name"] and record["train_config"]["attention_kernel"] == "sdpa"


def test_train_toy_records_the_data_structure_it_trained_on(tmp_path):
    """Issue 27: the bigram table and the planted skip-trigrams are options, recorded beside the weights."""
    out = tmp_path / "data.safetensors"
    assert main(["train-toy", "--layers", "0", "--steps", "2", "--quiet", "--out", str(out), *TINY]) == 0
    config = json.loads(out.with_suffix(".json").read_text())["train_config"]
    assert (config["bigram_successors"], config["bigram_follow"], config["skip_trigrams"]) == (3, 0.75, 0)  # vocab 12
    flat = tmp_path / "flat.safetensors"
    assert main(["train-toy", "--layers", "0", "--steps", "2", "--quiet", "--out", str(flat), "--d-vocab", "40",
                 "--bigram-successors", "0", "--skip-trigrams", "2", "--trigrams-per-sequence", "1",
                 *TINY[2:]]) == 0
    config = json.loads(flat.with_suffix(".json").read_text())["train_config"]
    assert (config["bigram_successors"], config["skip_trigrams"], config["trigrams_per_sequence"]) == (0, 2, 1)
    assert config["pos_init"] == "normal"
    sines = tmp_path / "sines.safetensors"
    assert main(["train-toy", "--layers", "1", "--steps", "2", "--quiet", "--pos-init", "sinusoidal", "--out", str(sines), *TINY]) == 0
    assert json.loads(sines.with_suffix(".json").read_text())["train_config"]["pos_init"] == "sinusoidal"


def test_train_toy_shows_a_progress_bar_on_stderr(tmp_path, capsys):
    main(["train-toy", "--layers", "0", "--steps", "3", "--out", str(tmp_path / "m.safetensors"), *TINY])
    assert "3/3" in capsys.readouterr().err


def test_train_toy_can_save_float16(tmp_path):
    out = tmp_path / "half.safetensors"
    assert main(["train-toy", "--layers", "1", "--steps", "1", "--quiet", "--save-dtype", "float16", "--out", str(out), *TINY]) == 0
    from safetensors import safe_open

    with safe_open(str(out), framework="pt") as f:
        assert f.get_tensor("W_E").dtype == torch.float16  # stored in half precision
    loaded = load_checkpoint(out)
    assert loaded.dtype == torch.float32  # computed in float32 unless asked: the half is a size, not arithmetic
    assert torch.equal(loaded.W_E, load_checkpoint(out, dtype="float16").W_E.float())
    assert load_checkpoint(out, dtype="float16").dtype == torch.float16


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n-ctx", "32"], "seg_max=32 tokens need 64 positions, but n_ctx=32"),
        (["--steps", "0"], "steps must be an int >= 1"),
        (["--threads", "0"], "argument --threads: expected an integer in 1.."),
        (["--bigram-follow", "2"], "bigram_follow must be a probability in [0, 1], got 2.0"),
        (["--d-vocab", "32", "--skip-trigrams", "7"], "skip_trigrams=7 need 5 distinct tokens each"),
        (["--pos-init", "sinusoidal", "--positional", "none"], "positional is 'none'; use positional 'qk_only' or 'standard'"),
        (["--pos-init", "rotary"], "argument --pos-init: invalid choice: 'rotary'"),
    ],
)
def test_train_toy_bad_config_is_a_clear_error(tmp_path, capsys, argv, message):
    try:
        code = main(["train-toy", "--out", str(tmp_path / "m.safetensors"), *argv])
    except SystemExit as exit_:  # refused by argparse
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_train_toy_bad_output_path(tmp_path, capsys):
    assert main(["train-toy", "--steps", "1", "--out", str(tmp_path / "m.pt")]) == 2
    assert "should end in '.safetensors'" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["train-toy", "--steps", "1", "--out", str(blocker / "m.safetensors")]) == 2
    assert "cannot write to" in capsys.readouterr().err


# --- analyze ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def handmade_checkpoints(tmp_path_factory):
    from tests.helpers import copying_model, exact_induction_model

    folder = tmp_path_factory.mktemp("models")
    paths = folder / "induction.safetensors", folder / "control.safetensors"
    for model, path in zip((exact_induction_model(d_vocab=32, n_ctx=16), copying_model(d_vocab=32, n_ctx=16)), paths):
        save_checkpoint(model, path)
    return paths


def test_analyze_help_teaches_what_is_measured():
    text = _subparser_help("analyze")
    for phrase in ("copying", "K-composition", "previous-token and induction heads", "term importance", "--control", "examples:"):
        assert phrase in text


def test_analyze_writes_the_report(tmp_path, capsys, handmade_checkpoints):
    model, control = handmade_checkpoints
    out = tmp_path / "report"
    code = main(["analyze", "--checkpoint", str(model), "--control", str(control), "--out", str(out), "--sequences", "8", "--figure-formats", "svg"])
    assert code == 0
    stdout = capsys.readouterr().out
    assert "[x] layer 0 has a previous-token head (by behaviour)" in stdout
    assert re.search(r"\[x\] at every query position \d+–\d+, a previous-token head attends to i-1", stdout)
    assert "[x] the 2-layer model does induction at every length and offset" in stdout
    assert (out / "figures" / "profiles.svg").exists()
    assert "findings hold" in stdout
    assert (out / "report.md").exists() and (out / "tables.tex").exists() and (out / "analysis.json").exists()
    assert (out / "figures" / "positivity.svg").exists() and not (out / "figures" / "positivity.png").exists()


def test_analyze_uses_the_training_record_beside_the_checkpoint(tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    main(["train-toy", "--layers", "1", "--steps", "3", "--quiet", "--out", str(out), *TINY])
    assert main(["analyze", "--checkpoint", str(out), "--out", str(tmp_path / "report"), "--sequences", "4", "--figure-formats", "png"]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Trained by `tcircuits train-toy`: steps=3" in report
    assert (tmp_path / "report" / "figures" / "training.png").exists()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing.safetensors", "missing.safetensors"),
        (lambda d: (d / "bad.safetensors").write_bytes(b"not a checkpoint") and d / "bad.safetensors", "bad.safetensors"),
    ],
    ids=["missing", "corrupt"],
)
def test_analyze_bad_checkpoint_is_a_clear_error(tmp_path, capsys, make, message):
    path = make(tmp_path)
    assert main(["analyze", "--checkpoint", str(path), "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert "tcircuits analyze: error:" in err and message in err and "Traceback" not in err


def test_analyze_unwritable_out_and_bad_options(tmp_path, capsys, handmade_checkpoints):
    model, _ = handmade_checkpoints
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["analyze", "--checkpoint", str(model), "--out", str(blocker / "report")]) == 2
    assert "cannot write to" in capsys.readouterr().err
    assert main(["analyze", "--checkpoint", str(model), "--out", str(tmp_path / "r"), "--figure-formats", "png,jpg"]) == 2
    assert "unknown figure format(s) ['jpg']" in capsys.readouterr().err
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("a\nb\n")
    assert main(["analyze", "--checkpoint", str(model), "--out", str(tmp_path / "r"), "--vocab-file", str(vocab)]) == 2
    assert "vocab has 2 entries but the model's d_vocab is 32" in capsys.readouterr().err
    assert main(["analyze", "--checkpoint", str(model), "--out", str(tmp_path / "r"), "--control", str(model)]) == 2
    assert "the control must be a 1-layer model" in capsys.readouterr().err
