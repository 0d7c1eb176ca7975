"""Building the companion: measure once, derive and check, draw, write the site (and the PDF).

:func:`write_paper` checks every output path first (:func:`check_outputs`), then runs the steps
(:func:`step_count` of them, each reported to ``progress``) writing into a new folder beside
the output folder, and swaps it in whole at the end (:func:`~numeric_check.files.output_folder`):
a run that fails or is interrupted leaves the old folder exactly as it was, and a file in it
that tcircuits did not write is refused, by name, unless ``force``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from derivations.commands import compile_latex, pdflatex

from numeric_check.files import OutputFolder, output_folder, write_atomic
from numeric_check.reports.paper.claims import numbered_from
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


def output_names(pdf: bool = False) -> list[str]:
    """Every file the companion may write, relative to its folder."""
    formats = ("svg", "pdf") if pdf else ("svg",)
    return (page_names() + ([PDF_NAME, "paper.tex"] if pdf else [])
            + [f"figures/{name}.{fmt}" for name in CAPTIONS for fmt in formats])


def paper_folder(out_dir: Path | str, pdf: bool = False, force: bool = False) -> OutputFolder:
    """The companion's folder, checked before any work (nothing is created): the folder can be
    made or replaced whole, no folder or FIFO sits at a page, figure or PDF name, every file in it
    was written by tcircuits and is unchanged (or ``force``), and, for the PDF, pdflatex is installed."""
    if pdf:
        pdflatex()  # installed, or a LatexError now, before minutes of work
    return output_folder(out_dir, output_names(pdf), force=force, known=output_names(pdf=True)).check()


def check_outputs(out_dir: Path | str, pdf: bool = False, force: bool = False) -> Path:
    """:func:`paper_folder`'s checks; returns ``out_dir``."""
    return paper_folder(out_dir, pdf, force).path


def write_paper(out_dir: Path | str, *, pdf: bool = False, progress: Callable[[str], None] = lambda step: None,
                seed: int = 0, force: bool = False, device=None, language=None,
                index_from: int = 0) -> tuple[Paper, list[Path]]:
    """Build the companion into ``out_dir``, swapped in whole at the end, the models measured on ``device``
    (``None``: CUDA when present), layers numbered from ``index_from`` (0 as every command, 1 as the paper);
    return the paper and the files written (their paths in ``out_dir``).

    The language page measures the shipped language models on their held-out text, or ``language`` when given
    (:func:`~numeric_check.reports.paper.your_model.language_models`: a model of one's own and a text)."""
    folder = paper_folder(out_dir, pdf, force)
    with numbered_from(index_from):
        measurements = measure(progress, seed=seed, device=device, language=language)
        paper = build_paper(measurements, progress)
        with folder as staging:
            written = _write(paper, measurements, staging, pdf, progress)
    return paper, [folder.path / path.relative_to(staging) for path in written]


def _write(paper: Paper, measurements, out_dir: Path, pdf: bool, progress: Callable[[str], None]) -> list[Path]:
    """Draw and write every file into the new folder ``out_dir``."""
    (out_dir / "figures").mkdir()
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
        resources = {f"figures/{name}.pdf": out_dir / "figures" / f"{name}.pdf" for name in CAPTIONS
                     if (out_dir / "figures" / f"{name}.pdf").is_file()}  # a person's loss curve only with their model
        document, _ = compile_latex(source, files=resources)
        written.append(write_atomic(out_dir / PDF_NAME, document))
        progress("PDF")
    return written
