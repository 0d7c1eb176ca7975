"""Old import paths of modules that moved to a room of their own still work, and give the very
same module object as the new path (so patching through either name patches both)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import numeric_check
from tests.source_graph import ROOT, modules_of

OLD_NAMES = sorted(numeric_check.MOVED) + [
    "numeric_check.model.readers.common", "numeric_check.model.readers.llama", "numeric_check.model.readers.pending",
]


@pytest.mark.parametrize("old", OLD_NAMES)
def test_old_name_is_the_new_module(old):
    new = numeric_check.moved_to(old)
    assert new in modules_of("numeric_check"), f"{old} points at {new}, which is no module of the package"
    assert importlib.import_module(old) is importlib.import_module(new)
    assert sys.modules[old] is sys.modules[new]


def test_old_names_in_every_import_form():
    """In a fresh interpreter, the old names imported first: ``import a.b``, ``from a.b import x``,
    ``from a import b`` and a submodule of a moved package all give the new modules, loaded once."""
    code = """
import sys
import numeric_check.model.hf
from numeric_check.model.load import model_folder
from numeric_check.model.readers import llama
from numeric_check.model import hook_paths
import numeric_check.model.readers.gpt2 as old_gpt2
from numeric_check.conversion import hf, load, readers
from numeric_check.conversion.readers import gpt2
from numeric_check.verification import hook_paths as new_hook_paths
assert numeric_check.model.hf is hf and model_folder is load.model_folder and llama is readers.llama
assert hook_paths is new_hook_paths and old_gpt2 is gpt2
assert hf.__name__ == "numeric_check.conversion.hf" and hf.__spec__.name == "numeric_check.conversion.hf"
loaded = {id(m): m.__file__ for name, m in list(sys.modules.items()) if name.startswith("numeric_check.")}
assert len(loaded) == len(set(loaded.values())), "a module loaded twice under two names"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_patching_through_the_old_name_reaches_the_new(monkeypatch):
    from numeric_check.conversion import load

    monkeypatch.setattr("numeric_check.model.load.one_line", lambda text: "patched")
    assert load.one_line("anything") == "patched"

