"""Sphinx configuration of the tcircuits guide (``make docs`` builds it into build/docs/).

The site is built offline: its maths is MathML from the project's own printer
(:func:`tensoralg.mathml.to_mathml`), not MathJax from a network; the CLI reference is read from
``derivations.cli.build_parser()`` by ``_ext/tcircuits_docs.py`` (its subcommands included, registered through entry points); the
API reference from the packages' docstrings; the tutorials are the worked notebooks under
``tutorials/solutions/``, executed during the build (a few seconds each, on the CPU).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

project = "tcircuits"
author = "the tcircuits authors"
copyright = "2026, the tcircuits authors"

extensions = [
    "myst_nb",  # Markdown pages (myst-parser) and the tutorial notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "tcircuits_docs",  # MathML maths, the generated tables
]

root_doc = "index"
exclude_patterns = ["_build", "README.md", "_ext", "_generated"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# the notebooks run at build time (they hold no outputs in git); a failing cell fails the build
nb_execution_mode = "force"
nb_execution_timeout = 300
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
nb_render_markdown_format = "myst"  # notebooks' Markdown outputs (the tables of reports) as MyST, tables included

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
intersphinx_mapping: dict = {}  # offline: no inventories fetched

html_theme = "furo"
html_title = "tcircuits"
html_static_path = ["_static"]
html_extra_path = ["_generated/html"]  # the pages the commands write (attention, attribution), framed by the how-tos
# Sphinx checks html_extra_path when the configuration is read, before any hook of ours runs (the pictures are made at
# builder-inited): in a fresh clone the folder (ignored by git) must exist by then, or the first `make docs` fails
for _extra in html_extra_path:
    (DOCS / _extra).mkdir(parents=True, exist_ok=True)
del _extra
html_css_files = ["tcircuits.css"]
html_show_sourcelink = False
html_math_renderer = "mathml"

nitpicky = False
smartquotes = False  # "--help" stays two hyphens, quotes stay as typed
suppress_warnings = ["myst.header"]


def _copy_tutorials(app) -> None:
    """The worked tutorial notebooks, copied beside the pages that list them (the source stays in
    ``tutorials/solutions/``; ``docs/tutorials/_notebooks/`` is ignored by git)."""
    out = DOCS / "tutorials" / "_notebooks"
    out.mkdir(parents=True, exist_ok=True)
    for notebook in sorted((ROOT / "tutorials" / "solutions").glob("*.ipynb")):
        target = out / notebook.name
        if not target.exists() or target.read_bytes() != notebook.read_bytes():
            shutil.copyfile(notebook, target)


def _make_pictures(app) -> None:
    """The how-to pages' pictures, made by the commands the pages show (``_ext/pictures.py``)."""
    import pictures

    pictures.make()


def setup(app):
    app.connect("builder-inited", _copy_tutorials, priority=100)
    app.connect("builder-inited", _make_pictures, priority=100)
