"""The shape of the numeric_check package: rooms by purpose, imports that run one way.

The package is read as source (``ast``), not imported, so a cycle hidden behind an import
inside a function counts as much as one at the top of a module. Layers, from the bottom:

========================  ==========================================================
``errors``, ``files``,    the exception hierarchy; atomic output files; hypothesis
``strategies``             strategies for users' tests
``model``                  the reference model: config, layers, hook points, our checkpoints
``conversion``             other people's models read into the reference model (TransformerLens,
                           Hugging Face readers and loaders, options, the source check)
``verification``           hook paths, binding, evaluation, isolation, bounds, verification reports
``circuits``               factored matrices, OV/QK circuits and the paper's analyses
``training``               toy training and its configuration
``reports``                analysis reports, HTML, plots, the demo
``cli``                    the ``tcircuits`` subcommands
========================  ==========================================================

A module may import from its own layer and from layers below it, never from above. The package
root (``numeric_check/__init__.py``) sits above every layer: it names the public API.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.source_graph import find_cycle, import_graph as package_graph, modules_of

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

#: Subpackages from the bottom layer up; ``strategies`` draws random models for tests, so it
#: sits with the model. Each layer may import only from itself and the layers before it.
LAYERS = ("errors", "model", "conversion", "verification", "circuits", "training", "reports", "cli")
LAYER_OF_TOP_MODULE = {"errors": "errors", "files": "errors", "strategies": "model"}


def package_modules() -> dict[str, Path]:
    return modules_of("numeric_check")


def import_graph() -> dict[str, set[str]]:
    return package_graph("numeric_check")


def layer(module: str) -> int | None:
    """Index in :data:`LAYERS` of a numeric_check module; None for the package root."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    name = LAYER_OF_TOP_MODULE.get(parts[1], parts[1])
    return LAYERS.index(name)


def test_every_module_belongs_to_a_layer():
    unplaced = [m for m in package_modules() if m.count(".") and m.split(".")[1] not in LAYERS + tuple(LAYER_OF_TOP_MODULE)]
    assert not unplaced, f"modules outside the subpackages {LAYERS}: {unplaced}"


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_run_downhill():
    uphill = [
        f"{src} imports {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if layer(src) is not None and layer(dst) is not None and layer(dst) > layer(src)
    ]
    assert not uphill, "imports from a higher layer " + str(LAYERS) + ":\n" + "\n".join(sorted(uphill))


@pytest.mark.parametrize("package", ["numeric_check", "derivations", "tensoralg", "tests"])
def test_own_modules_are_imported_plainly(package):
    """``importorskip`` of a project module would turn a broken import into a silent skip."""
    skipping = [
        str(path.relative_to(ROOT))
        for path in sorted(TESTS.rglob("*.py"))
        if f'importorskip("{package}' in path.read_text() or f"importorskip('{package}" in path.read_text()
    ]
    assert not skipping, f"import {package} plainly instead of pytest.importorskip in: {skipping}"


def test_hook_names_are_built_by_block_hook():
    """``block_hook(layer, "attn.hook_z")``, not a hand-written ``f"blocks.{layer}.attn.hook_z"``
    (the adapters, build and the Hugging Face readers name the sources' own parameters, not our hooks)."""
    allowed = {"numeric_check.model.hooks", "numeric_check.conversion.adapters", "numeric_check.conversion.build"}
    hand_written = [name for name, path in package_modules().items()
                    if name not in allowed and not name.startswith("numeric_check.conversion.readers.")
                    and 'f"blocks.{' in path.read_text()]
    assert not hand_written, f"hook names written by hand in {hand_written}; use numeric_check.model.hooks.block_hook"


def test_exception_classes_live_in_errors_or_are_the_one_stop_signal():
    """Errors in ``errors.py``; the only other exception is the signal that ends a forward pass
    (``verification.hook_paths.StopForward``), so no module keeps a stop exception of its own."""
    found = {
        (name, node.name)
        for name, path in package_modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception", "Mismatch")) or b.id == "UnsupportedModel")
                for b in node.bases)
    }
    elsewhere = {pair for pair in found if pair[0] != "numeric_check.errors"}
    assert elsewhere == {("numeric_check.verification.hook_paths", "StopForward")}, sorted(elsewhere)
