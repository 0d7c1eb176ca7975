"""One home for a model's report: its analysis, its findings computed once, and every writer.

A :class:`Report` holds a :class:`~numeric_check.reports.analysis.ModelAnalysis` (and
optionally a 1-layer control's), the paper's findings measured on them — computed once, in
:meth:`Report.of` — and writes them in every format from those same findings: Markdown
(:mod:`~numeric_check.reports.markdown`), LaTeX tables (:mod:`~numeric_check.reports.latex`),
JSON (:meth:`Report.to_dict`) and HTML (:mod:`~numeric_check.reports.html`), with figures.
:meth:`Report.write` writes every file of :data:`REPORT_FILES` and ``figures/``.
``tcircuits analyze`` builds one and writes it whole (:func:`report_output`: into a new folder
beside ``--out``, swapped in at the end); a companion that gathers several models' reports into
one site reuses the same object and writers.

>>> from derivations.architecture import Architecture
>>> from numeric_check.model.circuit_model import CircuitModel
>>> from numeric_check.reports.analysis import analyze_model
>>> model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=12, n_ctx=16)
>>> report = Report.of(analyze_model(model, name="random", n_sequences=4))
>>> report.findings[0].claim
'layer 0 has a previous-token head (by behaviour)'
>>> report.markdown().startswith("# Circuit analysis: random")
True
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from numeric_check.circuits.behaviour import ACROSS_CONTEXT
from numeric_check.circuits.importance import path_label
from numeric_check.errors import AnalysisError
from numeric_check.files import OutputFolder, output_folder, writable_dir, write_atomic
from numeric_check.reports.analysis import ModelAnalysis, composition_pairs, composition_with
from derivations.vocabulary import renumber
from numeric_check.reports.findings import Finding, findings
from numeric_check.reports.html import html_page
from numeric_check.reports.latex import latex_tables
from numeric_check.reports.markdown import markdown_report
from numeric_check.verification.results import strict_json

#: The files :meth:`Report.write` writes into its folder, besides ``figures/``.
REPORT_FILES = ("report.md", "tables.tex", "analysis.json", "index.html")
#: The figures :func:`make_figures` may draw, each written as ``figures/NAME.FORMAT``.
FIGURE_NAMES = ("training", "positivity", "profiles", "composition", "importance")
FIGURE_FORMATS = ("png", "svg", "pdf")  # what --formats takes (numeric_check.reports.plots.ALLOWED_FORMATS)


@dataclass(frozen=True)
class Report:
    """A model's analysis, an optional 1-layer control's, and their findings (see :meth:`of`)."""

    analysis: ModelAnalysis
    control: ModelAnalysis | None = None
    findings: tuple[Finding, ...] = ()
    #: layers numbered from 0 (TransformerLens) or 1 (the paper) in the pages and figures; ``analysis.json``
    #: keeps TransformerLens's numbering, as every JSON output does
    index_from: int = 0

    @classmethod
    def of(cls, analysis: ModelAnalysis, control: ModelAnalysis | None = None, *, index_from: int = 0) -> "Report":
        """The report of ``analysis`` (and ``control``), its findings computed here, once."""
        if not isinstance(analysis, ModelAnalysis) or not (control is None or isinstance(control, ModelAnalysis)):
            raise AnalysisError(f"a Report is made of ModelAnalysis values (analyze_model), got {type(analysis).__name__}"
                                + ("" if control is None else f" and {type(control).__name__}"))
        return cls(analysis, control, tuple(findings(analysis, control)), index_from)

    @property
    def verdict(self) -> str:
        """``"18/18 findings hold"``, or why there are none."""
        if not self.findings:
            return f"no findings apply to a {self.analysis.n_layers}-layer model"
        return f"{sum(f.holds for f in self.findings)}/{len(self.findings)} findings hold"

    def markdown(self, figures: dict[str, str] | None = None) -> str:
        """``report.md``; ``figures`` maps figure names to paths relative to the report."""
        return renumber(markdown_report(self.analysis, self.findings, self.control, figures), self.index_from)

    def latex(self) -> str:
        """``tables.tex``: plain LaTeX tables, to ``\\input``."""
        return renumber(latex_tables(self.analysis, self.findings, self.control), self.index_from)

    def html(self, figures: dict[str, str] | None = None) -> str:
        """``index.html``: one page with MathML and the figures."""
        return renumber(html_page(self.analysis, self.findings, self.control, figures), self.index_from)

    def to_dict(self) -> dict:
        """``analysis.json``: the measured numbers and the findings as plain JSON data."""
        return _json_data(self.analysis, self.findings)

    def _repr_markdown_(self) -> str:
        """What a notebook shows: :meth:`markdown` without figures."""
        return self.markdown()

    def write(self, out_dir: Path | str, formats: Sequence[str] = ("png", "svg")) -> list[Path]:
        """Write every file of :data:`REPORT_FILES` and the figures into ``out_dir``; return the paths."""
        from numeric_check.reports.plots import save_figure  # matplotlib is slow to import: only when drawing

        out_dir = Path(out_dir)
        writable_dir(out_dir / "figures")
        written, links, page_links = [], {}, {}
        for name, figure in make_figures(self.analysis, self.index_from).items():
            paths = save_figure(figure, out_dir / "figures", name, formats)
            written += paths
            links[name] = paths[0].relative_to(out_dir).as_posix()  # the first format asked for
            shown = next((p for p in paths if p.suffix == ".svg"), paths[0])  # the page prefers SVG
            page_links[name] = shown.relative_to(out_dir).as_posix()
        texts = {
            "report.md": self.markdown(links),
            "tables.tex": self.latex(),
            "analysis.json": json.dumps(strict_json(self.to_dict()), indent=2, allow_nan=False) + "\n",
            "index.html": self.html(page_links),
        }
        return written + [write_atomic(out_dir / name, texts[name]) for name in REPORT_FILES]


def write_report(report: Report | ModelAnalysis, out_dir: Path | str, *, control: ModelAnalysis | None = None,
                 formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """:meth:`Report.write` of ``report`` (a :class:`ModelAnalysis` becomes ``Report.of(report, control)``)."""
    if isinstance(report, ModelAnalysis):
        report = Report.of(report, control)
    elif control is not None:
        raise AnalysisError("a Report already holds its control: pass control to Report.of, not to write_report")
    return report.write(out_dir, formats)


def report_output(out_dir: Path | str, inputs: Sequence[Path | str] = (), *, force: bool = False,
                  formats: Sequence[str] = FIGURE_FORMATS) -> OutputFolder:
    """The report's folder, checked before any analysis (nothing is created): it can be made or
    replaced whole; no folder, FIFO or device sits at a report file or figure name (a directory
    named ``report.md`` is found now, not after minutes of work); none of ``inputs`` (a checkpoint,
    its training record, a vocabulary: a report never replaces what it reads) is at one of those
    names; and every file in it was written by tcircuits and is unchanged, unless ``force``.
    Enter it to write into a new folder that is swapped in whole at the end."""
    names = list(REPORT_FILES) + [f"figures/{name}.{fmt}" for name in FIGURE_NAMES for fmt in formats]
    known = list(REPORT_FILES) + [f"figures/{name}.{fmt}" for name in FIGURE_NAMES for fmt in FIGURE_FORMATS]
    return output_folder(out_dir, names, force=force, inputs=inputs, known=known).check()


def report_folder(out_dir: Path | str, inputs: Sequence[Path | str] = (), *, force: bool = False) -> Path:
    """:func:`report_output`'s checks; returns ``out_dir``."""
    return report_output(out_dir, inputs, force=force).path


def _json_data(a: ModelAnalysis, rows: Sequence[Finding]) -> dict:
    def tensor(t: Tensor) -> list:
        return [[None if math.isnan(v) else v for v in row] for row in t.tolist()]

    data = {
        "name": a.name,
        "architecture": a.model.arch.describe(),
        "source": a.model.source_check.to_dict() if a.model.source_check else None,
        "losses": a.losses,
        "copying": tensor(a.copying),
        "qk_positivity": tensor(a.qk_positivity),
        "composition": {k: {path_label(p): composition_with(a, k, *p) for p in composition_pairs(a)} for k in a.composition},
        "composition_baseline": a.baseline,
        "importance": a.importance.to_dict() if a.importance else None,
        "importance_repeated": a.importance_repeat.to_dict() if a.importance_repeat else None,
        "findings": [vars(f) for f in rows],
        "repeat_loss_grid": a.grid.to_dict() if a.grid else None,
        "notes": a.notes,
    }
    if a.heads is not None:
        data["heads"] = {"by_behaviour": a.heads.by_behaviour.labels(), "by_weights": a.heads.by_weights.labels(),
                         "agreement": a.heads.agreement,
                         "minimum_over_positions": {kind: tensor(a.heads.behaviour.minimum(kind))
                                                    for kind in ("previous_token", "induction")}}
    return data


def make_figures(a: ModelAnalysis, index_from: int = 0) -> dict[str, object]:
    """The report's figures by name (Matplotlib figures, not yet written); layers numbered from ``index_from``."""
    from numeric_check.reports import plots  # imported when figures are drawn: matplotlib is slow to import

    figures = {}
    if a.training and a.training.get("curve"):
        figures["training"] = plots.training_curve(a.training["curve"], uniform_loss=a.losses["uniform_loss"],
                                                   title=f"Training of {a.name}")
    if a.n_layers:
        ylabel = (f"QK positivity (layer {index_from}: token QK;\nlater: K-composition with partner)" if a.n_layers > 1
                  else "QK circuit eigenvalue positivity")
        induction = a.heads.by_behaviour.induction + a.heads.by_behaviour.previous_token if a.heads else ()
        figures["positivity"] = plots.positivity_scatter(a.copying, a.scatter_y, ylabel=ylabel,
                                                         title=f"{a.name}: copying vs matching", highlight=induction,
                                                         index_from=index_from)
    if a.heads is not None and a.heads.behaviour.profile is not None:
        profile, found = a.heads.behaviour.profile, a.heads.by_behaviour
        figures["profiles"] = plots.position_profiles_figure(
            profile.previous_token, profile.induction, previous_heads=found.previous_token,
            induction_heads=found.induction, threshold=ACROSS_CONTEXT, title=f"{a.name}: attention by query position",
            index_from=index_from)
    if a.composition:
        baseline = {k: torch.full_like(v, a.baseline[k]) for k, v in a.composition.items()}
        figures["composition"] = plots.composition_heatmaps(a.composition, baseline=baseline,
                                                            title=f"{a.name}: composition scores minus random baseline",
                                                            index_from=index_from)
    if a.importance is not None and a.n_layers:
        figures["importance"] = plots.importance_bars(a.importance, index_from=index_from)
    return figures
