"""``tcircuits verify``: output, exit codes, and clear errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from derivations.architecture import Architecture
from derivations.cli import main
from numeric_check.model.checkpoint import save_checkpoint
from numeric_check.model.circuit_model import CircuitModel

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--layers", "2", "--heads", "2", "--d-model", "8", "--d-head", "4", "--d-vocab", "11", "--n-ctx", "6"]


def run(capsys, *args):
    try:
        code = main(["verify", *args])
    except SystemExit as exit:  # argparse refuses a bad flag value with exit status 2
        code = exit.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_teaches_what_is_checked(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["verify", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for phrase in ("sum", "isolation", "truncation", "--max-order", "--qk", "--checkpoint", "exits 0"):
        assert phrase in text


def test_random_model_table(capsys):
    code, out, _ = run(capsys, *SMALL, "--positional", "standard", "--layer-norm", "--biases", "--mlp", "--max-order", "1")
    assert code == 0
    assert "PASSED" in out and "3. model - kept terms = omitted terms" in out and "PASS" in out
    assert "tok→L1H1" in out and "b_U (direct)" in out and "mlp^L0 (direct)" in out


def test_json_output(capsys):
    code, out, _ = run(capsys, *SMALL, "--format", "json", "--tokens", "1,2,3;4,5,6")
    data = json.loads(out)
    assert code == 0 and data["passed"] and data["n_batch"] == 2 and data["n_pos"] == 3
    assert len(data["terms"]) == 9 and data["terms"][0]["label"] == "tok (direct)"


def test_qk_scores(capsys):
    code, out, _ = run(capsys, *SMALL, "--qk", "1", "0", "--max-terms", "3", "--no-isolation")
    assert code == 0 and "pre-softmax scores of L1H0" in out and "more terms" in out and "skipped" in out


def test_a_failing_check_exits_1(capsys):
    code, out, _ = run(capsys, *SMALL, "--dtype", "float32", "--rtol", "1e-15")
    assert code == 1 and "FAILED" in out


def test_checkpoint(tmp_path, capsys):
    model = CircuitModel.random(Architecture(1, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=9, n_ctx=5, seed=3, device="cpu")
    path = tmp_path / "model.safetensors"
    save_checkpoint(model, path)
    code, out, _ = run(capsys, "--checkpoint", str(path), "--seq-len", "5")
    assert code == 0 and "qk_only positions" in out
    code, _, err = run(capsys, "--checkpoint", str(path), "--layers", "3")
    assert code == 2 and "do not also give --layers" in err


@pytest.mark.parametrize("args, message", [
    (["--tokens", "1,x"], "comma-separated ids"),
    (["--tokens", "1,2;3"], "equal lengths"),
    (["--tokens", "1,11"], "outside the vocabulary 0..10"),
    (["--seq-len", "7"], "longer than the model's context n_ctx=6"),
    (["--batch-size", "0"], "expected an integer in 1.."),
    (["--heads", "two"], "--heads must be an int"),
    (["--qk", "2", "0"], "layer 2 does not exist"),
    (["--max-order", "5"], "an integer in 0..2 (the deepest term of the logits of a 2-layer model has order 2), got 5"),
    (["--dtype", "int8"], "invalid choice: 'int8'"),
    (["--device", "abacus"], "abacus"),
])
def test_bad_input_exits_2_with_a_message(capsys, args, message):
    code, _, err = run(capsys, *SMALL, *args)
    assert code == 2 and message in err and "Traceback" not in err


def test_missing_checkpoint(capsys, tmp_path):
    code, _, err = run(capsys, "--checkpoint", str(tmp_path / "none.safetensors"))
    assert code == 2 and "does not exist" in err


def test_heads_per_layer(capsys):
    code, out, _ = run(capsys, "--layers", "2", "--heads", "1,3", "--d-model", "8", "--d-head", "2", "--d-vocab", "7",
                       "--n-ctx", "4", "--quiet")
    assert code == 0 and "heads 1/3" in out and "tok→L0H0→L1H2" in out


# -- the report written a chunk of rows at a time ------------------------------------------------


def _reports():
    from numeric_check import verify_logits, verify_qk

    model = CircuitModel.random(Architecture(2, 3, layer_norm=True, biases=True), d_model=8, d_head=4, d_vocab=10, n_ctx=6,
                                seed=0, device="cpu")
    logits = verify_logits(model, [[1, 2, 3]], max_order=1, device="cpu")  # its terms a TermTable
    qk = verify_qk(model, [[1, 2, 3]], 1, 0, device="cpu")  # a list of TermResult, key sides too
    for report in (logits, qk):
        report.notes.append('a note with "terms": [], a line break\nand ⊗')
        report.timings["not measured"] = float("nan")  # written as null
    return logits, qk


@pytest.mark.parametrize("rows", [1, 2, 5, 4096])
def test_the_streamed_json_is_todays_document(monkeypatch, rows):
    """Written a few rows at a time, the JSON is the text json.dumps makes of the whole report, byte for byte
    (keys, their order, separators, indentation), compact or indented."""
    import numeric_check.verification.results as results

    monkeypatch.setattr(results, "ROWS_AT_ONCE", rows)
    for report in _reports():
        pieces = list(report.json_pieces())
        assert len(pieces) > len(report.terms) // rows  # at least a piece per chunk of rows
        for indent in (None, 0, 2, 4):
            whole = json.dumps(report.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False)
            assert report.to_json(indent) == whole
    empty = _reports()[0]
    empty.terms = []
    assert empty.to_json() == json.dumps(empty.to_dict(), indent=2, ensure_ascii=False, allow_nan=False)


@pytest.mark.parametrize("max_rows", [None, 1, 7, 1000])
def test_the_streamed_text_table_is_aligned_over_every_chunk(monkeypatch, max_rows):
    import numeric_check.verification.results as results

    for report in _reports():
        whole = report.to_text(max_rows)
        monkeypatch.setattr(results, "ROWS_AT_ONCE", 2)
        assert report.to_text(max_rows) == whole  # the widths come from every row, not the first chunk's
        monkeypatch.setattr(results, "ROWS_AT_ONCE", 4096)
        table = whole.split("\n\n")[-1].splitlines()
        rows = [line for line in table if not line.startswith("…")]
        assert len({len(line) for line in rows}) == 1 and len(rows) == 1 + min(len(report.terms), max_rows or 10**9)


def test_json_output_to_a_file(tmp_path, capsys):
    target = tmp_path / "report.json"
    code, out, _ = run(capsys, *SMALL, "--format", "json", "-o", str(target), "--quiet")
    data = json.loads(target.read_text())
    assert code == 0 and out == "" and data["passed"] and len(data["terms"]) == 9
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary file left


def _cli(shell: str, tmp_path) -> subprocess.CompletedProcess:
    command = f"{sys.executable} -m derivations.cli verify {' '.join(SMALL)} --seq-len 5 --format json --quiet"
    return subprocess.run(shell.format(cmd=command), shell=True, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_json_output_past_a_file_size_limit_leaves_no_file_and_one_line(tmp_path):
    (tmp_path / "old.json").write_text("old")
    done = _cli("ulimit -f 1 && {cmd} -o old.json", tmp_path)  # a report of 9 terms is over 1 KiB
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "tcircuits verify: error: cannot write 'old.json': File too large"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"] and (tmp_path / "old.json").read_text() == "old"


@pytest.mark.parametrize("shell", ["{cmd} > /dev/full", "{cmd} >&-"])
def test_a_json_report_on_a_full_or_closed_standard_output_is_one_line(tmp_path, shell):
    done = _cli(shell, tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "cannot write to standard output" in done.stderr
