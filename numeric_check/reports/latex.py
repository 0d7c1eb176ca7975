"""The report's tables as LaTeX (``tables.tex``, plain LaTeX that needs no package).

Cells go through the one text escaper (``escape_text(…, "latex")``); the writer reads an
analysis and the findings already computed for it
(:class:`numeric_check.reports.report.Report` computes them once for every format).
"""

from __future__ import annotations

from typing import Sequence

from derivations.architecture import head_label
from tensoralg.escape import escape_text

from numeric_check.reports.analysis import ModelAnalysis, composition_rows, head_rows, number
from numeric_check.reports.findings import Finding


def latex_escape(text: str) -> str:
    r"""Text safe inside a LaTeX table cell (the one text escaper, :func:`tensoralg.escape_text`).

    >>> latex_escape("a_b & 50% {x} → $ ≠ σ")
    'a\\_b \\& 50\\% \\{x\\} $\\to$ \\$ $\\neq$ $\\sigma$'
    """
    return escape_text(text, "latex")


def _latex_table(caption: str, label: str, header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """A ``table`` with a ruled ``tabular`` (plain LaTeX, no packages); cells must already be escaped."""
    lines = [r"\begin{table}[ht]", r"\centering", rf"\caption{{{latex_escape(caption)}}}", rf"\label{{tab:{label}}}",
             rf"\begin{{tabular}}{{{align}}}", r"\hline", " & ".join(header) + r" \\", r"\hline"]
    lines += [" & ".join(row) + r" \\" for row in rows]
    lines += [r"\hline", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def _token_tex(token: int, text: str | None) -> str:
    return rf"\#{token}" if text is None else rf"\texttt{{{latex_escape(text)}}} ({token})"


def latex_tables(a: ModelAnalysis, rows: Sequence[Finding], control: ModelAnalysis | None = None) -> str:
    """LaTeX tables (plain LaTeX, no packages) of ``a`` and its findings ``rows``: findings, heads,
    composition, term importance, skip-trigrams, the control's heads."""
    parts = [f"% Tables of the circuit analysis of {escape_text(a.name, 'latex-comment')} (\\input this file; no packages needed).", ""]
    if rows:
        parts.append(_latex_table(f"Findings for {a.name}", "findings",
                                  ["claim", "measured", "holds"],
                                  [[latex_escape(f.claim), latex_escape(f.measured), "yes" if f.holds else "no"] for f in rows],
                                  "p{0.3\\linewidth}p{0.55\\linewidth}c"))
    header = ["head", "copying", "QK positivity", "prev-token", "induction"]
    parts.append(_latex_table(f"Heads of {a.name}: eigenvalue positivity and behaviour", "heads", header,
                              [[latex_escape(c) for c in row] for row in head_rows(a)], "lrrrr"))
    if a.composition:
        parts.append(_latex_table(
            f"Composition scores of {a.name} (baselines " + ", ".join(f"{k} {v:.3f}" for k, v in a.baseline.items()) + ")",
            "composition", ["writer $\\to$ reader", "Q", "K", "V"],
            [[latex_escape(c) for c in row] for row in composition_rows(a)], "lrrr"))
    for report, tag, what in ((a.importance, "importance", "all tokens"), (a.importance_repeat, "importance-repeat", "repeated tokens")):
        if report is not None:
            rows_ = [[latex_escape(n), number(loss), f"{gain:+.3f}"] for n, loss, gain in report.order_rows()]
            rows_ += [[latex_escape(head_label(*h)), "", f"{v:+.3f}"] for h, v in sorted(report.head_marginal.items())]
            parts.append(_latex_table(f"Term importance of {a.name}, loss on {what} (nats)", tag,
                                      ["terms", "loss up to order", "marginal"], rows_, "lrr"))
    for i, table in enumerate(a.skip_trigrams):
        rows_ = [[str(r), _token_tex(d.token, d.text), number(d.score), _token_tex(o.token, o.text), number(o.score)]
                 for r, (d, o) in enumerate(zip(table.destinations, table.outputs), start=1)]
        parts.append(_latex_table(
            f"Skip-trigrams of {head_label(table.layer, table.head)}, source token "
            + (f"#{table.source_token}" if table.source_text is None else f"{table.source_text!r} ({table.source_token})"),
            f"skip-trigrams-{i}", ["rank", "destination (QK)", "score", "out (OV)", "logit"], rows_, "rlrlr"))
    if control is not None:
        parts.append(_latex_table(f"Heads of the control {control.name}", "control-heads", header,
                                  [[latex_escape(c) for c in row] for row in head_rows(control)], "lrrrr"))
    return "\n".join(parts)
