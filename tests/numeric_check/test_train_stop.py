"""A training run told to stop (Ctrl-C, SIGTERM, SIGHUP) ends where a step ends and keeps its work: the model of
that step, its record saying so, and its history so far; a second signal abandons it, nothing written."""

from __future__ import annotations

import copy
import json
import os
import signal

import pytest
import torch

from derivations.cli import main
from numeric_check.errors import CheckpointError
from numeric_check.model.checkpoint import load_checkpoint
from numeric_check.training import toy
from numeric_check.training.toy import TrainConfig, check_training_record, train_toy, training_record

torch.set_num_threads(1)

TEXT = "\n".join(f"line {i % 97} of a text in which the words {i % 13} and {i % 7} come back" for i in range(2500))
SMALL = ["--d-vocab", "300", "--n-ctx", "32", "--seg-min", "2", "--seg-max", "8", "--d-model", "16", "--d-head", "8",
         "--heads", "2", "--batch-size", "4", "--threads", "1", "--quiet", "--layers", "2", "--steps", "40"]
CONFIG = TrainConfig(d_vocab=16, n_ctx=12, seg_min=2, seg_max=4, d_model=16, d_head=8, n_heads=2, batch_size=4,
                     steps=30, eval_batches=1)


def test_a_run_stopped_after_a_step_is_the_whole_run_at_that_step():
    seen = {}

    def keep(step, model):
        seen[step] = copy.deepcopy(model.state_dict())

    _, whole = train_toy(CONFIG, on_step=keep)
    done = []
    model, stopped = train_toy(CONFIG, on_step=lambda step, _: done.append(step), stop=lambda: len(done) >= 7)
    assert stopped.stopped_at == 7 and whole.stopped_at is None
    assert stopped.loss == whole.loss[:7]
    assert all(torch.equal(value, seen[7][name]) for name, value in model.state_dict().items())
    record = training_record(CONFIG, stopped, seconds=1.0)
    assert record["stopped"] == {"step": 7, "of": 30} and "stopped" not in training_record(CONFIG, whole, 1.0)
    check_training_record(record, "the record")


def test_a_stop_asked_at_once_keeps_one_step_and_at_the_last_step_is_a_finished_run():
    assert train_toy(CONFIG, stop=lambda: True)[1].stopped_at == 1
    done = []
    _, history = train_toy(CONFIG, on_step=lambda step, _: done.append(step), stop=lambda: len(done) >= CONFIG.steps)
    assert history.stopped_at is None and len(history.loss) == CONFIG.steps


@pytest.mark.parametrize("stopped", [{"step": 0, "of": 30}, {"step": 30, "of": 30}, {"step": 5, "of": 31},
                                     {"step": "5", "of": 30}, {"step": 5}, [5, 30], {"step": True, "of": 30}])
def test_a_malformed_stop_in_a_record_is_refused(stopped):
    record = {"train_config": CONFIG.to_dict(), "stopped": stopped}
    with pytest.raises(CheckpointError, match="has stopped .* not the step a run stopped after"):
        check_training_record(record, "the record")


def _signalled_at(monkeypatch, step: int, signals: list[int]):
    """train-toy's training, with ``signals`` sent to this process after step ``step``."""
    def train(config, progress=None, *, on_step=None, **kwargs):
        def step_then_signal(at, model):
            if on_step is not None:
                on_step(at, model)
            if at == step:
                for signum in signals:
                    os.kill(os.getpid(), signum)

        return original(config, progress, on_step=step_then_signal, **kwargs)

    original = toy.train_toy
    monkeypatch.setattr(toy, "train_toy", train)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_training_keeps_the_run_so_far(tmp_path, monkeypatch, capsys, signum):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    out = tmp_path / "m.safetensors"
    _signalled_at(monkeypatch, 20, [signum])
    assert main(["train-toy", "--text-file", str(text), *SMALL, "--snapshots", "4", "--out", str(out)]) == 128 + signum
    said = capsys.readouterr().out
    name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert f"stopped by {name} after step 20 of 40: saving the model of that step" in said
    assert "for 20 steps (of 40, stopped early)" in said
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["stopped"] == {"step": 20, "of": 40, "signal": signal.Signals(signum).name}
    assert record["train_config"]["steps"] == 40 and record["history"]["snapshots"] == 3
    index = json.loads((tmp_path / "m.history" / "history.json").read_text())
    assert [s["step"] for s in index["snapshots"]] == [10, 16, 20]  # the planned ones so far, then the step it stopped at
    assert len(index["training_loss"]) == 20 and index["checkpoint_sha256"] == record["checkpoint_sha256"]
    last = load_checkpoint(tmp_path / "m.history" / "step-000020.safetensors")
    model = load_checkpoint(out)
    assert all(torch.equal(a, b) for a, b in zip(last.state_dict().values(), model.state_dict().values()))
    assert main(["dynamics", "--checkpoint", str(out), "-o", str(tmp_path / "dyn"), "--quiet"]) == 0
    assert main(["analyze", "--checkpoint", str(out), "-o", str(tmp_path / "report"), "--quiet", "--figure-formats",
                 "png"]) == 0
    report = " ".join((tmp_path / "report" / "report.md").read_text().split())
    assert "Stopped early, after step 20 of 40: the model is the one of that step" in report
    said = "The run was stopped after step 20 of 40 (its learning rate where the schedule had it then); its last snapshot is that step."
    assert said in (tmp_path / "dyn" / "dynamics.md").read_text() and said in (tmp_path / "dyn" / "index.html").read_text()


def test_a_second_signal_abandons_the_run_and_writes_nothing(tmp_path, monkeypatch, capsys):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    out = tmp_path / "m.safetensors"
    _signalled_at(monkeypatch, 9, [signal.SIGINT, signal.SIGINT])
    assert main(["train-toy", "--text-file", str(text), *SMALL, "--snapshots", "4", "--out", str(out)]) == 130
    assert "tcircuits: interrupted" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]
