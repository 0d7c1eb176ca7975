"""The tutorial notebooks under tutorials/ execute top to bottom (their exercise checks included).

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


def test_the_three_tutorials_exist():
    assert [p.name for p in NOTEBOOKS] == [
        "01_tensor_product_notation.ipynb", "02_attention_only_models.ipynb", "03_induction_circuit.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_stripped_and_small(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    nbformat.validate(nbformat.from_dict(nb))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c["outputs"] and c["execution_count"] is None for c in code), "strip the outputs before committing"
    assert path.stat().st_size < 40_000
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


def _exercise_checks(nb) -> int:
    """Exercise answer cells ('# your answer') each followed by a cell that asserts on the answer."""
    cells = nb.cells
    return sum(1 for a, b in zip(cells, cells[1:])
               if a.cell_type == "code" and "# your answer" in a.source and b.cell_type == "code" and "assert" in b.source)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path):
    """``python3`` is ipykernel's native kernel: the interpreter running the tests, so a fresh
    venv with the test extra needs no registered kernelspec."""
    nb = nbformat.read(path, as_version=4)
    assert _exercise_checks(nb) >= 2, "each tutorial checks its exercises"
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(TUTORIALS)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    rich = [o for o in outputs if o.output_type in ("execute_result", "display_data")]
    assert any("text/latex" in o.data or "text/markdown" in o.data for o in rich), "objects render as maths"
