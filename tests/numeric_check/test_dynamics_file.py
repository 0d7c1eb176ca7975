"""A run's measured dynamics read back from the file ``tcircuits dynamics`` writes (``Dynamics.from_dict``,
``read_dynamics``), and the shipped measurements of the language models' run (issue 45)."""

from __future__ import annotations

import copy
import json
import math

import pytest

from numeric_check.errors import CheckpointError
from numeric_check.model.checkpoint import stored_content_hash
from numeric_check.reports.dynamics import _finite, markdown
from numeric_check.reports.paper.formation import dynamics_path
from numeric_check.reports.paper.language import language_checkpoint
from numeric_check.training.dynamics import Dynamics, SnapshotMeasures, read_dynamics


def _run(n_layers: int = 2) -> Dynamics:
    snaps = [SnapshotMeasures(step, f"{step:064x}", 5.0 - i, -0.1 * i, [5.0 - i, 4.0 - i, 3.5 - i],
                              [[0.1, math.nan]] * n_layers, [[0.05, 0.2 * i]] * n_layers, [[0.5, -0.25]] * n_layers,
                              math.nan if n_layers < 2 else 0.3, 1.5, i % 2 == 0)
             for i, step in enumerate((10, 100, 1000))]
    return Dynamics("run.safetensors", n_layers, 2, 3, (n_layers - 1, 1) if n_layers > 1 else None,
                    (0, 0) if n_layers > 1 else None, snaps, record={"train_config": {"seed": 0, "lr": 0.003}})


@pytest.mark.parametrize("n_layers", [1, 2])
def test_a_dynamics_record_reads_back_as_written(n_layers):
    run = _run(n_layers)
    back = Dynamics.from_dict(run.to_dict())
    assert json.dumps(back.to_dict()) == json.dumps(run.to_dict())  # NaN scores included
    assert back.induction_head == run.induction_head and back.steps == [10, 100, 1000]
    # as tcircuits dynamics writes it: strict JSON, a score a head lacks as null
    again = Dynamics.from_dict(json.loads(json.dumps(_finite(run.to_dict()), allow_nan=False)))
    assert json.dumps(again.to_dict()) == json.dumps(run.to_dict())


def test_the_ids_random_tokens_were_drawn_from_read_back_and_older_files_draw_every_id():
    run = _run()
    run.random_tokens = [3, 9, 40]
    assert Dynamics.from_dict(json.loads(json.dumps(run.to_dict()))).random_tokens == [3, 9, 40]
    older = run.to_dict()
    del older["random_tokens"]  # written before the pool was kept
    assert Dynamics.from_dict(older).random_tokens is None


def test_a_headroom_reads_back_and_files_written_before_it_read_as_not_measured():
    run = _run()
    run.snapshots[1].induction_headroom = 0.0125
    back = Dynamics.from_dict(json.loads(json.dumps(_finite(run.to_dict()), allow_nan=False)))
    assert back.snapshots[1].induction_headroom == 0.0125 and math.isnan(back.snapshots[0].induction_headroom)
    older = run.to_dict()
    for s in older["snapshots"]:
        del s["induction_headroom"]
    assert all(math.isnan(s.induction_headroom) for s in Dynamics.from_dict(older).snapshots)
    assert markdown(Dynamics.from_dict(older), []).count("| — |") == 3  # shown as not measured


def _broken(edit):
    data = copy.deepcopy(_run().to_dict())
    edit(data)
    return data


MALFORMED = {
    "a list": [],
    "another format": _broken(lambda d: d.update(format="tcircuits.history")),
    "no snapshots": _broken(lambda d: d.update(snapshots=[])),
    "a missing key": _broken(lambda d: d["snapshots"][1].pop("icl_score")),
    "a score grid of the wrong shape": _broken(lambda d: d["snapshots"][0]["copying"].pop()),
    "a loss that is text": _broken(lambda d: d["snapshots"][2].update(heldout_loss="3.2")),
    "a headroom that is text": _broken(lambda d: d["snapshots"][2].update(induction_headroom="0.01")),
    "too few position losses": _broken(lambda d: d["snapshots"][0]["position_loss"].pop()),
    "a head beyond the model": _broken(lambda d: d.update(induction_head="L7H1")),
    "a head label that is not one": _broken(lambda d: d.update(writer_head="head 0")),
    "steps out of order": _broken(lambda d: d["snapshots"].reverse()),
    "a step of 0": _broken(lambda d: d["snapshots"][0].update(step=0)),
    "a verified flag that is a number": _broken(lambda d: d["snapshots"][0].update(k_term_verified=1)),
    "random tokens of one id": _broken(lambda d: d.update(random_tokens=[4])),
    "random tokens unsorted": _broken(lambda d: d.update(random_tokens=[9, 4])),
    "random tokens repeated": _broken(lambda d: d.update(random_tokens=[4, 4, 9])),
    "random tokens that are text": _broken(lambda d: d.update(random_tokens=["4", "9"])),
    "random tokens that are not a list": _broken(lambda d: d.update(random_tokens=12)),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_dynamics_file_is_one_line(tmp_path, name):
    path = tmp_path / "dynamics.json"
    path.write_text(json.dumps({"run": _finite(MALFORMED[name]), "control": None}))
    with pytest.raises(CheckpointError) as error:
        read_dynamics(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_a_dynamics_file_that_is_not_json_or_has_no_run_is_one_line(tmp_path):
    for text in ("{not json", json.dumps({"control": None}), "[1, 2]"):
        path = tmp_path / "dynamics.json"
        path.write_text(text)
        with pytest.raises(CheckpointError) as error:
            read_dynamics(path)
        assert "\n" not in str(error.value)


def test_the_shipped_dynamics_are_the_shipped_models_runs():
    run, control = read_dynamics(dynamics_path())
    assert (run.checkpoint, control.checkpoint) == ("kjv_2l.safetensors", "kjv_1l.safetensors")
    assert len(run.snapshots) == len(control.snapshots) == 32 and run.steps == control.steps
    assert run.snapshots[-1].sha256 == stored_content_hash(language_checkpoint(2))
    assert control.snapshots[-1].sha256 == stored_content_hash(language_checkpoint(1))
    shipped = json.loads(dynamics_path().read_text(encoding="utf-8"))
    assert set(shipped) == {"source", "run", "control"} and "scripts/ship_dynamics.py" in shipped["source"]
