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


def _exercises(nb):
    """``(question, answer cell, check cell)`` of each exercise: the answer cell's markdown question is the
    nearest markdown cell before it."""
    cells, out = nb.cells, []
    for i, cell in enumerate(cells):
        if cell.cell_type == "code" and "# your answer" in cell.source:
            question = next(c.source for c in reversed(cells[:i]) if c.cell_type == "markdown")
            out.append((question, cell.source, cells[i + 1].source))
    return out


def _calls(source: str, name: str) -> list:
    import ast

    return [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == name]


def test_each_exercise_asks_its_question_and_its_check_holds_no_answer():
    """Issue 27.5: a question per exercise; the check compares a digest, or an expression with the question
    in an asked form, and never computes the answer from the model or the tool."""
    import re

    for exercises, solutions in zip(NOTEBOOKS, SOLUTIONS):
        ex, sol = nbformat.read(exercises, as_version=4), nbformat.read(solutions, as_version=4)
        for n, ((question, _, check), (_, solved, _)) in enumerate(zip(_exercises(ex), _exercises(sol)), start=1):
            where = f"{exercises.name} exercise {n}"
            assert re.search(rf"\*\*{n}\.\*\*\s+\S.{{20,}}", question, re.S), where  # the question, stated
            assert _calls(check, "check_digest") or _calls(check, "check_expression"), where
            assert not _calls(check, "check_value"), where  # a value is compared by digest, never computed
            for computes in (".expand(", "len(", ".composition", "shift_matrix(", "copying", ".terms"):
                assert computes not in check, (where, computes)
            answer = solved.split("=", 1)[1].split("#")[0].strip()
            assert not re.search(rf"(?<![\w.]){re.escape(answer)}(?![\w.])", check), (where, answer)  # not in its check
            for call in _calls(check, "check_expression"):  # the question pasted back is refused: a form is asked
                from derivations.exercises import check_expression

                question_text = call.args[1].value
                form = next(k.value.value for k in call.keywords if k.arg == "form")
                assert check_expression(question_text, question_text, form=form).ok is False, where


def test_an_expression_check_never_shows_the_answer():
    from derivations.exercises import check_expression

    question = "(A ⊗ B)(Id ⊗ D)(C ⊗ Id)"
    for wrong in ("0", "Id ⊗ Id", "A ⊗ B", "X ⊗ Y"):
        message = check_expression(wrong, question, form="expanded").message
        assert "A C" not in message and "B D" not in message, (wrong, message)
    assert check_expression("A C ⊗ B D", question, form="expanded").ok
    assert check_expression("(A C) ⊗ (B D)", question, form="expanded").ok  # brackets around a word are no product
    transposed = "(A^{h2} A^{h1} ⊗ W_U W_E)ᵀ"
    assert check_expression("A^{h1}ᵀ A^{h2}ᵀ ⊗ W_Eᵀ W_Uᵀ", transposed, form="transposes on atoms").ok
    assert check_expression("(A^{h2} A^{h1})ᵀ ⊗ (W_U W_E)^T", transposed, form="transposes on atoms").ok is False


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


def test_notebook_3_works_k_composition_out_from_the_weights_and_the_model_agrees():
    """The induction notebook builds the K-composition term from the weights (the induction head's QK circuit
    with the previous-token head's OV folded into its key side), and it equals the path the model isolates
    with hooks and points at the induction target: the notebook's own cells, run here up to that point."""
    import matplotlib
    import torch

    matplotlib.use("Agg")
    nb = nbformat.read(TUTORIALS / "03_induction_circuit.ipynb", as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    last = next(i for i, c in enumerate(cells) if "def hits(" in c.source)
    assert any("head_weights" in c.source and "k_composition_circuit" in c.source for c in cells[:last])
    namespace: dict = {}
    for cell in cells[: last + 1]:
        source = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))
        exec(compile(source, "03_induction_circuit.ipynb", "exec"), namespace)  # noqa: S102 (the project's notebook)
    S_K, path, causal = namespace["S_K"], namespace["path"], namespace["causal"]
    assert path.passed and abs(path.norm - float(S_K[:, causal].norm())) <= 1e-4 * path.norm
    assert S_K.dtype == torch.float64 and namespace["hits"](S_K) > 4 * namespace["chance"]
