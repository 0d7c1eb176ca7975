"""The tutorial notebooks under tutorials/ execute top to bottom (their exercise checks included),
and so do their solutions under tutorials/solutions/: the exercises start blank and their checks
say so; in the solutions every check passes.

Each runs in a fresh kernel from the notebook's own folder, on CPU; outputs are never
written back, and the committed notebooks must stay stripped of outputs. Without the test
extra (nbclient, nbformat, ipykernel) these tests skip.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need the test extra (nbformat, nbclient, ipykernel)")
nbclient = pytest.importorskip("nbclient", reason="the notebook tests need the test extra (nbformat, nbclient, ipykernel)")

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))
SOLUTIONS = sorted((TUTORIALS / "solutions").glob("*.ipynb"))


def test_the_three_tutorials_and_their_solutions_exist():
    names = ["01_tensor_product_notation.ipynb", "02_attention_only_models.ipynb", "03_induction_circuit.ipynb"]
    assert [p.name for p in NOTEBOOKS] == names and [p.name for p in SOLUTIONS] == names


@pytest.mark.parametrize("path", NOTEBOOKS + SOLUTIONS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_stripped_and_small(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    nbformat.validate(nbformat.from_dict(nb))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c["outputs"] and c["execution_count"] is None for c in code), "strip the outputs before committing"
    assert path.stat().st_size < 40_000
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


def _exercise_checks(nb, solved: bool) -> int:
    """Exercise answer cells ('# your answer'), blank (``= None``) unless ``solved``, each followed by a
    cell that checks the answer with the tool (``check_expression``/``check_value``); in the solutions
    the check is asserted."""
    cells = nb.cells
    return sum(1 for a, b in zip(cells, cells[1:])
               if a.cell_type == "code" and "# your answer" in a.source and ("= None" in a.source) != solved
               and b.cell_type == "code" and "check_" in b.source and ("assert feedback.ok" in b.source) == solved)


def test_the_exercises_start_blank_and_the_solutions_assert_their_checks():
    for exercises, solutions in zip(NOTEBOOKS, SOLUTIONS):
        ex, sol = nbformat.read(exercises, as_version=4), nbformat.read(solutions, as_version=4)
        blank = sum(1 for c in ex.cells if c.cell_type == "code" and "# your answer" in c.source)
        assert blank >= 2 and _exercise_checks(ex, solved=False) == blank == _exercise_checks(sol, solved=True)
        assert "A^2 A^1" not in json.dumps(ex) + json.dumps(sol)  # heads are not powers


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS + SOLUTIONS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_notebook_runs(path):
    """``python3`` is ipykernel's native kernel: the interpreter running the tests, so a fresh
    venv with the test extra needs no registered kernelspec. An exercise notebook runs with its
    answers blank (each check says "Not answered yet"); a solutions notebook asserts every check."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    rich = [o for o in outputs if o.output_type in ("execute_result", "display_data")]
    assert any("text/latex" in o.data or "text/markdown" in o.data for o in rich), "objects render as maths"
    if path.parent.name != "solutions":
        shown = [o.data.get("text/markdown", "") for o in rich]
        assert sum("Not answered yet" in s for s in shown) == _exercise_checks(nb, solved=False)
