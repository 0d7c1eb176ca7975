"""The shape of the three packages: short modules, one concept each, imports that run one way.

The sources are read as text (:mod:`tests.source_graph`), not imported, so an import inside
a function counts as much as one at the top of a module. numeric_check's layers are checked
in ``tests/numeric_check/test_layout.py``; here are the rules every package keeps.
"""

from __future__ import annotations

import importlib

import pytest

from tests.source_graph import find_cycle, import_graph, imported_modules, modules_of, strongly_connected

PACKAGES = ("tensoralg", "derivations", "numeric_check")
MAX_LINES = 600


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_the_line_limit(package):
    long = {name: n for name, path in modules_of(package).items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def test_strongly_connected_finds_every_circle():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"e"}, "f": {"a"}}
    assert strongly_connected(graph) == [["a", "b"], ["c", "d"], ["e"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_an_import_for_type_checkers_counts(tmp_path):
    """Issue 20: ``if TYPE_CHECKING:`` hid reports/analysis <-> findings and derivation <-> numeric."""
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.other import Thing\n")
    assert imported_modules(source, {"pkg.other"}) == {"pkg.other"}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    circles = strongly_connected(import_graph(package))
    assert not circles, "import circles (TYPE_CHECKING imports count): " + "; ".join(" <-> ".join(c) for c in circles)


#: Names that moved to their own modules when expr.py, parse.py and paths.py were split
#: (issue 13), each still importable from where users and the other packages found it.
STILL_IMPORTABLE = {
    "tensoralg.expr": ["Term", "TensorSum", "Product", "Add", "check_order", "as_word", "chain_shapes", "mul",
                       "join_words", "sum_tensor_sums"],
    "tensoralg.parse": ["parse", "read", "to_text", "Applied", "Bound", "Reading"],
    "derivations.paths": ["Source", "Path", "PathTerm", "TOKEN", "POSITION", "UNEMBED_BIAS", "LogitExpansion",
                          "expand_logits", "stream_entries"],
}


@pytest.mark.parametrize("module", sorted(STILL_IMPORTABLE))
def test_moved_names_are_importable_from_their_old_module(module):
    imported = importlib.import_module(module)
    missing = [name for name in STILL_IMPORTABLE[module] if not hasattr(imported, name)]
    assert not missing, f"{module} no longer offers {missing}"


#: Modules still owed a move to ``md_table`` (none: every Markdown table goes through it, issue 20).
HAND_WRITTEN_TABLES_OWED: set[str] = set()


@pytest.mark.parametrize("package", PACKAGES)
def test_every_markdown_table_goes_through_md_table(package):
    """Issue 20: one table writer (``tensoralg.display.md_table``); eight tables were written by hand."""
    import re

    rule = re.compile(r"""["']\|?(-{3}:?\|)+""")  # a table's rule row, "|---|---:|", in a string
    by_hand = [name for name, path in modules_of(package).items()
               if name != "tensoralg.display" and name not in HAND_WRITTEN_TABLES_OWED
               and rule.search(path.read_text(encoding="utf-8"))]
    assert not by_hand, f"Markdown tables written by hand (use tensoralg.display.md_table) in {by_hand}"
