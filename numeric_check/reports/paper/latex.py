"""The companion as one LaTeX document (compiled to PDF by ``tcircuits paper --pdf``).

The same content as the site, in the same order: each derivation through
:func:`derivations.render.latex_body` (the one printer), its numerical checks beside it,
each finding with its measured value, control, verdict and figure (PDF figures beside the
document). Every string that is not the printer's goes through ``escape_text(…, "latex")``.
"""

from __future__ import annotations

from derivations.derivation import RULES
from derivations.layout import Layout, prose_latex
from derivations.render import latex_body
from tensoralg.escape import escape_text

from numeric_check.reports.paper.claims import PaperFinding, analysis_checks, label, verdict_of
from numeric_check.reports.paper.content import INDEX_FROM, Equation, Paper
from numeric_check.reports.paper.figures import CAPTIONS
from numeric_check.reports.paper.site import TITLE, TRIGRAM_HEADER, control_text, model_check_text, trigram_rows

PREAMBLE = r"""\documentclass[10pt]{article}
\usepackage[margin=2cm]{geometry}
\usepackage{amsmath}
\usepackage{graphicx}
\allowdisplaybreaks
\setlength{\parindent}{0pt}
\setlength{\parskip}{0.5em}
\sloppy
\makeatletter  % a figure at its natural size (fonts as drawn), narrowed only to fit the line
\def\maxwidth{\ifdim\Gin@nat@width>\linewidth\linewidth\else\Gin@nat@width\fi}
\makeatother
"""


def _t(text) -> str:
    return escape_text(text, "latex")


def finding_latex(f: PaperFinding) -> list[str]:
    if f.parts:
        rows = [(k, v) for k, v in (("where", f.where), ("note", f.note)) if v]
    else:
        rows = [("measured", f.measured), ("control", f.control)] + [(k, v) for k, v in (("where", f.where), ("note", f.note)) if v]
    lines = [r"\begin{quote}\itshape " + prose_latex(f.claim, INDEX_FROM) + r"\end{quote}"]
    for i, p in enumerate(f.parts, start=1):
        label = f"Part {i} of {len(f.parts)}: " if len(f.parts) > 1 else "Rule: "
        lines += [r"\textbf{" + _t(label) + "}" + _t(p.text), r"\begin{description}\setlength{\itemsep}{0pt}",
                  rf"\item[measured] {_t(p.measured)}", rf"\item[control] {_t(control_text(p))}"]
        if len(f.parts) > 1 or p.why:  # one part: its verdict is the finding's, given once below
            lines.append(rf"\item[verdict] \textbf{{{_t(p.verdict)}}}")  # why: in the control's line
        lines.append(r"\end{description}")
    lines.append(r"\begin{description}\setlength{\itemsep}{0pt}")
    lines += [rf"\item[{_t(k)}] {_t(v)}" for k, v in rows]
    lines += [rf"\item[verdict] \textbf{{{_t(f.verdict)}}}", r"\end{description}"]
    if f.figure:  # in place, not floating: the figure stays with its finding
        lines += [r"\begin{center}", rf"\includegraphics[width=\maxwidth]{{figures/{f.figure}.pdf}}\\",
                  rf"{{\small {prose_latex(CAPTIONS[f.figure], INDEX_FROM)}}}", r"\end{center}"]
    return lines + [r"\medskip"]


def equation_latex(e: Equation) -> list[str]:
    layout = Layout(index_from=INDEX_FROM)
    lines = [r"\subsection{" + prose_latex(e.derivation.title, INDEX_FROM) + "}"]
    v = e.verification
    if isinstance(v, str):
        lines.append(r"\textbf{Not verified:} " + _t(v))
    else:
        lines.append(r"\textbf{Numeric check} (every line against the first, on random matrices): " + _t(
            f"{'verified' if v.ok else 'FAILED'}; worst relative error {v.worst:.1e}, tolerance {v.tol:.0e}, "
            f"{len(v.errors)} lines."))
    if e.model_check is not None:
        lines.append("")
        lines.append(r"\textbf{On the model:} " + _t(("verified. " if e.model_check.passed else "FAILED. ")
                                                     + model_check_text(e.model_check)))
    return lines + [""] + latex_body(e.derivation, layout)


def trigrams_latex(paper: Paper) -> list[str]:
    lines = []
    for t in paper.measurements.tables:
        lines += [r"\begin{center}", _t(f"{label(t.layer, t.head)}, source #{t.source_token}") + r"\\[2pt]",
                  r"\begin{tabular}{rlrlr}", r"\hline " + " & ".join(map(_t, TRIGRAM_HEADER)) + r" \\ \hline"]
        lines += [" & ".join(map(_t, row)) + r" \\" for row in trigram_rows(t)]
        lines += [r"\hline", r"\end{tabular}", r"\end{center}"]
    return lines


def analysis_checks_latex(paper: Paper) -> list[str]:
    m = paper.measurements
    lines = [r"\subsection*{" + _t(f"Every check of tcircuits analyze on {m.analysis(2).name} "
                                    f"(control {m.analysis(1).name})") + "}",
             r"\begin{tabular}{p{0.3\linewidth}p{0.52\linewidth}l}", r"\hline check & measured & verdict \\ \hline"]
    lines += [rf"{_t(f.claim)} & {_t(f.measured)} & {_t(verdict_of(f.holds))} \\" for f in analysis_checks(paper)]
    return lines + [r"\hline", r"\end{tabular}", ""]


def rules_latex() -> list[str]:
    lines = [r"\subsection*{The algebra's rules}", r"\begin{tabular}{ll}", r"\hline rule & identity \\ \hline"]
    lines += [rf"{_t(r.name)} & ${r.statement.latex}$ \\" for r in RULES.values() if r.statement is not None]
    return lines + [r"\hline", r"\end{tabular}", ""]


def paper_latex(paper: Paper) -> str:
    """The whole companion as a LaTeX document that compiles with pdflatex (figures under ``figures/``)."""
    lines = ["% tcircuits paper: generated", PREAMBLE.rstrip("\n"), r"\title{" + _t(TITLE) + "}", r"\author{}", r"\date{}",
             r"\begin{document}", r"\maketitle", ""]
    lines += [r"\section*{Findings}", r"\begin{tabular}{p{0.78\linewidth}l}", r"\hline claim & verdict \\ \hline"]
    lines += [rf"{prose_latex(f.claim, INDEX_FROM)} & {_t(f.verdict)} \\" for f in paper.findings]
    lines += [r"\hline", r"\end{tabular}", ""]
    for section in paper.sections:
        lines += [r"\section{" + _t(section.title) + "}"]
        lines += [prose_latex(p, INDEX_FROM) + "\n" for p in section.spec.paragraphs]
        if section.findings:
            lines.append(r"\subsection*{What the shipped models show}")
            for f in section.findings:
                lines += finding_latex(f)
                if f.key == "skip-trigrams":
                    lines += trigrams_latex(paper)
            if section.slug == "two-layers":
                lines += analysis_checks_latex(paper)
        if section.slug == "appendix":
            lines += rules_latex()
        for e in section.equations:
            lines += equation_latex(e)
        lines.append(r"\clearpage")
    return "\n".join(lines + [r"\end{document}", ""])
