"""``tcircuits attribute``: output in each format, files written atomically, exit codes, one-line errors."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint

import pytest
import torch

import derivations.cli as cli
from derivations.architecture import Architecture
from derivations.paths import expand_logits
from numeric_check.model.checkpoint import save_checkpoint
from numeric_check.model.circuit_model import CircuitModel

torch.set_num_threads(1)
SMALL = ["--layers", "2", "--heads", "2", "--d-model", "8", "--d-head", "4", "--d-vocab", "11", "--n-ctx", "6",
         "--positional", "standard", "--layer-norm", "--biases", "--mlp"]


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    """The ``attribute`` entry point, as pyproject.toml declares it, whether or not the installed
    metadata has it yet."""
    found = list(cli.entry_points(group="tcircuits.commands"))
    if not any(e.name == "attribute" for e in found):
        found.append(EntryPoint("attribute", "numeric_check.cli.attribute:register", "tcircuits.commands"))
    monkeypatch.setattr(cli, "entry_points", lambda group: found)


def run(capsys, *args):
    try:
        code = cli.main(["attribute", *args])
    except SystemExit as exit_:  # argparse refuses a bad flag value with exit status 2
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_says_what_is_checked(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for phrase in ("--target", "--logit-diff", "--max-order", "--max-terms", "isolation", "remainder", "tok→L0H1→L1H2"):
        assert phrase in out


def test_text_table_of_ranked_terms(capsys):
    code, out, err = run(capsys, *SMALL, "--tokens", "1,2,3,4,5", "--target", "7", "--max-order", "1", "--max-terms", "5")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "attribution of logit[7] at position 4 (token 5)"
    assert "remainder: " in out and "PASS" in out and lines[-1] == "PASSED"
    assert sum(line.strip().startswith(("1 ", "2 ", "3 ", "4 ", "5 ")) for line in lines) == 5


def test_logit_diff_json_lists_every_term(capsys):
    code, out, _ = run(capsys, *SMALL, "--tokens", "1,2,3,4", "--logit-diff", "3", "4", "--position", "2", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["target_label"] == "logit[3] - logit[4]" and data["position"] == 2
    arch = Architecture(2, 2, positional="standard", layer_norm=True, biases=True, mlp=True)
    assert len(data["terms"]) == expand_logits(arch, 2).n_terms == 27
    assert data["passed"]


def test_html_and_markdown_files(capsys, tmp_path):
    path = tmp_path / "a.html"
    code, out, _ = run(capsys, *SMALL, "--seq-len", "5", "--target", "2", "--format", "html", "-o", str(path))
    assert code == 0 and out == "" and "<svg" in path.read_text() and path.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["a.html"]  # no temporary file left
    md = tmp_path / "a.md"
    assert run(capsys, *SMALL, "--target", "2", "--format", "markdown", "-o", str(md))[0] == 0
    assert "| rank | term |" in md.read_text()


def test_checkpoint_model(capsys, tmp_path):
    model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=11, n_ctx=6, seed=3, device="cpu")
    path = tmp_path / "m.safetensors"
    save_checkpoint(model, path)
    code, out, err = run(capsys, "--checkpoint", str(path), "--tokens", "1,2,1,2", "--target", "1")
    assert code == 0 and "tok→L0H" in out, err


@pytest.mark.parametrize("args, words", [
    (["--target", "11"], "target 11 is outside the vocabulary 0..10"),
    (["--target", " Paris"], "no tokenizer"),
    (["--target", "1", "--position", "9"], "position must be an int in -5..4"),
    (["--target", "1", "--max-order", "3"], "--max-order must be 1 or 2, got 3"),
    (["--target", "1", "--format", "html", "-o", "x.txt"], "should end in '.html'"),
    (["--target", "1", "--tokens", "1,2;3,4"], "one prompt"),
])
def test_bad_input_one_line_error(capsys, args, words):
    extra = [] if "--tokens" in args else ["--tokens", "1,2,3,4,5"]
    code, out, err = run(capsys, *SMALL, *extra, *args)
    assert code == 2 and out == ""
    assert err.startswith("tcircuits attribute: error: ") and words in err and err.count("\n") == 1


def test_target_and_logit_diff_exclusive(capsys):
    code, _, err = run(capsys, *SMALL, "--target", "1", "--logit-diff", "1", "2")
    assert code == 2 and "not allowed with" in err
