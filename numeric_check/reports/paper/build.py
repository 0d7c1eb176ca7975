"""Building the companion: measure once, derive and check, draw, write the site (and the PDF).

:func:`write_paper` checks every output path first, then runs the steps (:func:`step_count`
of them, each reported to ``progress``), and writes files atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from derivations.commands import compile_latex, pdflatex

from numeric_check.files import writable_dir, writable_file, write_atomic
from numeric_check.reports.paper.content import SECTIONS, Paper, build_paper
from numeric_check.reports.paper.figures import CAPTIONS, figures
from numeric_check.reports.paper.latex import paper_latex
from numeric_check.reports.paper.measure import STEPS, measure
from numeric_check.reports.paper.site import site_pages
from numeric_check.reports.plots import save_figure

PDF_NAME = "paper.pdf"


def step_count(pdf: bool = False) -> int:
    """How many times :func:`write_paper` calls ``progress``."""
    return STEPS + len(SECTIONS) + 1 + 1 + (1 if pdf else 0)


def page_names() -> list[str]:
    return ["index.html"] + [f"{s.slug}.html" for s in SECTIONS]


def check_outputs(out_dir: Path | str, pdf: bool = False) -> Path:
    """``out_dir`` made and checked before any work: every page, figure and the PDF can be written
    (and, for the PDF, pdflatex is installed)."""
    if pdf:
        pdflatex()  # installed, or a LatexError now, before minutes of work
    out_dir = writable_dir(out_dir)
    figures_dir = writable_dir(out_dir / "figures")
    for name in page_names() + ([PDF_NAME, "paper.tex"] if pdf else []):
        writable_file(out_dir / name)
    for name in CAPTIONS:
        writable_file(figures_dir / f"{name}.svg")
    return out_dir


def write_paper(out_dir: Path | str, *, pdf: bool = False, progress: Callable[[str], None] = lambda step: None,
                seed: int = 0) -> tuple[Paper, list[Path]]:
    """Build the companion into ``out_dir``; return the paper and the files written."""
    out_dir = check_outputs(out_dir, pdf)
    measurements = measure(progress, seed=seed)
    paper = build_paper(measurements, progress)
    written: list[Path] = []
    formats = ("svg", "pdf") if pdf else ("svg",)
    for name, figure in figures(measurements).items():
        written += save_figure(figure, out_dir / "figures", name, formats)
    progress("figures")
    for name, html in site_pages(paper).items():
        written.append(write_atomic(out_dir / name, html))
    progress("pages")
    if pdf:
        source = paper_latex(paper)
        written.append(write_atomic(out_dir / "paper.tex", source))
        resources = {f"figures/{name}.pdf": out_dir / "figures" / f"{name}.pdf" for name in CAPTIONS}
        document, _ = compile_latex(source, files=resources)
        written.append(write_atomic(out_dir / PDF_NAME, document))
        progress("PDF")
    return paper, written
