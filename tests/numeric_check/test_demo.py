"""The main job: ``tcircuits demo`` on the shipped model tells the whole story and passes."""

from __future__ import annotations

import pytest

from derivations import Architecture
from derivations.cli import main
from numeric_check.model.checkpoint import save_checkpoint
from numeric_check.model.circuit_model import CircuitModel

pytestmark = pytest.mark.slow  # the demo's full analysis: left out by pytest -m "not slow"


def test_demo_on_the_shipped_model_verifies_every_term_and_finds_the_induction_circuit(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for section in ("1. The model", "2. Its logits as a sum over paths", "3. Every term against the model",
                    "4. An induction head's attention scores", "5. The induction circuit"):
        assert section in out
    assert "25 terms" in out  # (1 + 4)^2 paths from the tokens
    assert "FAIL" not in out
    assert "previous-token L0H1" in out
    assert "every term verified: yes; induction circuit found by weights and behaviour: yes" in out
    assert "6. Across the context" in out and "working at every position: yes" in out


def test_demo_fails_a_circuit_that_works_in_half_the_context(tmp_path, capsys):
    """Regression (issue 12): a previous-token head that works for the first half of the
    context only passed the averaged score, and the demo exited 0."""
    from tests.helpers import half_working_induction_model

    path = tmp_path / "half.safetensors"
    save_checkpoint(half_working_induction_model(), path)
    assert main(["demo", "--checkpoint", str(path)]) == 1
    out = capsys.readouterr().out
    assert "every term verified: yes; induction circuit found by weights and behaviour: no; working at every position: no" in out


def test_demo_on_a_random_model_verifies_but_finds_no_circuit(tmp_path, capsys):
    model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=16, d_head=4, d_vocab=20, n_ctx=12, seed=1, device="cpu")
    path = tmp_path / "random.safetensors"
    save_checkpoint(model, path)
    assert main(["demo", "--checkpoint", str(path)]) == 1
    out = capsys.readouterr().out
    assert "every term verified: yes; induction circuit found by weights and behaviour: no" in out


def test_demo_rejects_a_bad_batch_and_a_missing_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse: one line, status 2
        main(["demo", "--batch-size", "0"])
    assert exit_.value.code == 2 and "argument --batch-size: expected an integer in 1..1024, got '0'" in capsys.readouterr().err
    assert main(["demo", "--checkpoint", str(tmp_path / "nope.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "nope.safetensors" in err and "Traceback" not in err


def test_demo_help_teaches(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--help"])
    assert exit_.value.code == 0
    assert "induction" in capsys.readouterr().out
