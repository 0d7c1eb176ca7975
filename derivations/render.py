"""Documents from derivations: a complete LaTeX file, Markdown, plain text and JSON
(HTML pages with MathML: :mod:`derivations.html`, re-exported here as ``html_document``).

The tensoralg printer typesets every expression and formula; :mod:`derivations.layout`
arranges its summands into lines; this module writes the formats: the prose, each step's
justification, the lines of each chain. Every function takes ``index_from`` (0 numbers
layers as TransformerLens, 1 as the paper: ``H_1`` is the first layer).

Safety: every string a user can control (a title, a name, a token string) is escaped
before it enters a document (:func:`escape_latex`), and every piece of mathematics is
checked (:func:`check_math`), so no input can inject ``\\input`` or ``\\write18``.

>>> escape_latex(r"50% of {x}")
'50\\\\% of \\\\{x\\\\}'
"""

from __future__ import annotations

import json
import textwrap

from tensoralg import TensorSum
from tensoralg.escape import check_math, escape_text, html_safe_math

from derivations.html import html_document, html_fragment
from derivations.document import Math, Numbered, Piece, SumIndex, as_prose, math, prose, text_width
from derivations.layout import (
    Layout, chain_rows, check_layout, expr_pieces, justification, lhs, markdown_math, pack, prose_latex, prose_markdown, prose_text,
)

__all__ = ["Layout", "Math", "Numbered", "Piece", "SumIndex", "as_prose", "check_math", "escape_comment", "escape_latex",
           "escape_markdown", "expr_pieces", "html_document", "html_fragment", "latex_document", "latex_math", "markdown", "math", "pack", "prose",
           "prose_latex", "prose_markdown", "prose_text", "text", "text_width", "to_json"]

# -- safe text and mathematics: one escaper, one allow-list (tensoralg.escape) ---------------


def escape_latex(text: str) -> str:
    r"""User text as inert LaTeX body text (:func:`tensoralg.escape.escape_text`, ``"latex"``).

    >>> escape_latex(r"\input{/etc/passwd} for h ≠ k")
    '\\textbackslash{}input\\{/etc/passwd\\} for h $\\neq$ k'
    """
    return escape_text(text, "latex")


def escape_markdown(text: str) -> str:
    r"""User text as inert Markdown, HTML escaped (:func:`tensoralg.escape.escape_text`).

    >>> escape_markdown("a_b $x$ <b>")
    'a\\_b \\$x\\$ &lt;b&gt;'
    """
    return escape_text(text, "markdown")


def _lead(chain, i: int, index_from: int) -> str:
    if i > 0:
        return "&= "
    return f"{lhs(chain, index_from)[0]} &= " if chain.lhs is not None else r"&\hphantom{{}={}} "


# -- each line's numerical check ---------------------------------------------------------


class Marks:
    """Each line's numerical check (:meth:`~derivations.derivation.Derivation.verify`) as a mark for a document:
    ``verification`` a :class:`~derivations.numeric.Verification`, a string (the check could not run: why), or None
    (no check: no marks). :meth:`line` is the mark of line ``si`` of chain ``ci`` (none for a chain's first line,
    the reference); :meth:`summary` one sentence for the top of the document."""

    def __init__(self, verification=None):
        self.verification = verification
        self.errors = {} if verification is None or isinstance(verification, str) else {
            (ci, si): e for ci, si, e in verification.errors}

    def line(self, ci: int, si: int) -> tuple[bool, float] | None:
        """``(passed, relative error)`` of a line after the first, or None where no check ran."""
        if si == 0 or (ci, si) not in self.errors:
            return None
        error = self.errors[(ci, si)]
        return error <= self.verification.tol, error

    def summary(self, check: str = "✓", cross: str = "✗") -> str | None:
        v = self.verification
        if v is None:
            return None
        if isinstance(v, str):
            return f"Not checked numerically: {v}."
        verdict = f"every line equals the first ({check} beside each)" if v.ok else \
            f"SOME LINES DIFFER from the first ({cross} beside them)"
        return (f"Checked numerically on random bindings: {verdict}, to a relative tolerance of {v.tol:.0e}.")

    def text(self, ci: int, si: int) -> str:
        mark = self.line(ci, si)
        return "" if mark is None else (" ✓" if mark[0] else f" ✗ (relative error {mark[1]:.1e})")

    def latex(self, ci: int, si: int) -> str:
        mark = self.line(ci, si)
        return "" if mark is None else (r" \hfill $\checkmark$" if mark[0] else
                                        rf" \hfill $\times$ (relative error {mark[1]:.1e})")


def _latex_rows(rows: list[list[Piece]], lead: str) -> list[str]:
    return [(lead if k == 0 else r"&\quad ") + " ".join(p.latex for p in row) for k, row in enumerate(rows)]


# -- LaTeX ------------------------------------------------------------------------------

PREAMBLE = r"""\documentclass{article}
\usepackage[margin=2.5cm]{geometry}
\usepackage{amsmath}
\usepackage{amssymb}
\allowdisplaybreaks
\setlength{\parindent}{0pt}
\setlength{\parskip}{0.6em}
\sloppy
"""


def latex_body(derivation, layout: Layout, marks: Marks | None = None) -> list[str]:
    k = layout.index_from
    marks = marks or Marks()
    lines = []
    if derivation.summary:
        lines += [prose_latex(derivation.summary, k), ""]
    if marks.summary():
        said = escape_latex(marks.summary("CHECKMARK", "CROSSMARK"))
        lines += [r"\emph{" + said.replace("CHECKMARK", r"$\checkmark$").replace("CROSSMARK", r"$\times$") + "}", ""]
    if derivation.notes:
        lines += [r"\paragraph{Notation and assumptions.}", r"\begin{itemize}"]
        lines += [r"\item " + prose_latex(n, k) for n in derivation.notes]
        lines += [r"\end{itemize}", ""]
    for ci, chain in enumerate(derivation.chains):
        if chain.intro:
            lines += [prose_latex(chain.intro, k), ""]
        rows: list[str] = []
        for i, step, packed in chain_rows(chain, layout):
            if i == 0:
                why = justification(step, first=True)
                lines += [prose_latex(why, k)] if why else []
            else:
                rows.append(r"\intertext{" + prose_latex(justification(step), k) + marks.latex(ci, i) + "}")
            rows += _latex_rows(packed, _lead(chain, i, k))
        body = []
        for j, row in enumerate(rows):
            follows_text = j + 1 < len(rows) and rows[j + 1].startswith(r"\intertext")
            last = j + 1 == len(rows)
            body.append(row if last or row.startswith(r"\intertext") or follows_text else row + r" \\")
        lines += [r"\begin{align*}", *body, r"\end{align*}", ""]
    return lines


def latex_document(derivation, layout: Layout | None = None, verification=None, **options) -> str:
    """A complete LaTeX document (article class, geometry and amsmath) that compiles with pdflatex.

    Terms are never split, so the page is wide (2.5 cm margins) for the longest QK terms.

    ``max_terms`` (default 40; ``None`` for all) elides the middle of longer sums;
    ``width`` sets the characters per line before a sum breaks; ``index_from=1`` numbers
    layers as the paper does; ``verification`` (:class:`Marks`) marks each line's numerical check.
    """
    layout = check_layout(layout, options)
    head = [
        f"% {escape_comment(derivation.name)}: generated by tcircuits",
        PREAMBLE.rstrip("\n"),
        r"\title{" + prose_latex(derivation.title, layout.index_from) + "}",
        r"\author{}",
        r"\date{}",
        r"\begin{document}",
        r"\maketitle",
        "",
    ]
    return "\n".join(head + latex_body(derivation, layout, Marks(verification)) + [r"\end{document}", ""])


def escape_comment(text: str) -> str:
    """User text safe inside a ``%`` comment line: a newline cannot end the comment."""
    return escape_text(text, "latex-comment")


def latex_math(derivation, layout: Layout | None = None, **options) -> str:
    """All chains as one ``aligned`` display (what Jupyter shows for ``_repr_latex_``)."""
    layout = check_layout(layout, options)
    rows = []
    for chain in derivation.chains:
        for i, step, packed in chain_rows(chain, layout):
            step_rows_ = _latex_rows(packed, _lead(chain, i, layout.index_from))
            step_rows_[-1] += rf" \qquad \text{{[{escape_latex(step.rule.name)}]}}"
            rows += step_rows_
    return html_safe_math("$$\\begin{aligned}\n" + " \\\\\n".join(rows) + "\n\\end{aligned}$$")  # no tag for HTML


# -- Markdown ---------------------------------------------------------------------------


def markdown(derivation, layout: Layout | None = None, verification=None, **options) -> str:
    """Markdown with ``$$`` display math (renders with KaTeX or MathJax); ``verification`` (:class:`Marks`)
    marks each line's numerical check."""
    layout = check_layout(layout, options)
    marks = Marks(verification)
    k = layout.index_from
    out = [f"# {prose_markdown(derivation.title, k)}", ""]
    if derivation.summary:
        out += [prose_markdown(derivation.summary, k), ""]
    if marks.summary():
        out += [f"*{escape_markdown(marks.summary())}*", ""]
    if derivation.notes:
        out += ["**Notation and assumptions.**", ""]
        out += ["- " + prose_markdown(n, k) for n in derivation.notes]
        out.append("")
    for ci, chain in enumerate(derivation.chains):
        if chain.intro:
            out += [prose_markdown(chain.intro, k), ""]
        for i, step, packed in chain_rows(chain, layout):
            why = justification(step, first=i == 0)
            out += [prose_markdown(why, k) + escape_markdown(marks.text(ci, i)), ""] if why else []
            rows = _latex_rows(packed, _lead(chain, i, k))
            out += ["$$", r"\begin{aligned}", markdown_math(" \\\\\n".join(rows)), r"\end{aligned}", "$$", ""]
    return "\n".join(out)


# -- plain text -------------------------------------------------------------------------


def text(derivation, layout: Layout | None = None, verification=None, **options) -> str:
    """Plain Unicode text: prose wrapped at 78 columns, one line of the chain per row; ``verification``
    (:class:`Marks`) marks each line's numerical check."""
    if layout is None:
        options = {"width": 74, "measure": "chars", **options}
    layout = check_layout(layout, options)
    k = layout.index_from
    wrap = lambda s, indent="", first=None: textwrap.fill(
        s, 78, initial_indent=indent if first is None else first, subsequent_indent=indent, break_on_hyphens=False)
    marks = Marks(verification)
    title = prose_text(derivation.title, k)
    out = [title, "=" * len(title), ""]
    if derivation.summary:
        out += [wrap(prose_text(derivation.summary, k)), ""]
    if marks.summary():
        out += [wrap(marks.summary()), ""]
    if derivation.notes:
        out += ["Notation and assumptions:"] + [wrap(prose_text(n, k), "    ", "  - ") for n in derivation.notes] + [""]
    for ci, chain in enumerate(derivation.chains):
        if chain.intro:
            out += [wrap(prose_text(chain.intro, k)), ""]
        _, lhs_text = lhs(chain, k)
        pad = " " * max(len(lhs_text), 1)
        narrower = Layout(layout.sums, layout.max_terms, max(40, layout.width - len(pad) + 1), layout.measure, k)
        for i, step, packed in chain_rows(chain, narrower):
            why = justification(step, first=i == 0)
            if why:
                out.append(wrap(f"[{prose_text(why, k)}]{marks.text(ci, i)}", pad + "    ", pad + "   "))
            for j, row in enumerate(packed):
                body = " ".join(p.text for p in row)
                if j:
                    out.append(f"{pad}     {body}")
                elif i == 0:
                    out.append(f"{lhs_text} = {body}" if chain.lhs is not None else f"{pad}   {body}")
                else:
                    out.append(f"{pad} = {body}")
        out.append("")
    return "\n".join(out)


# -- JSON -------------------------------------------------------------------------------


def _expr_json(expr, sums, index_from: int) -> dict:
    pieces = expr_pieces(expr, Layout(sums=tuple(sums), max_terms=None, index_from=index_from))
    n_terms = len(expr) if isinstance(expr, TensorSum) else expr.count()
    return {
        "latex": " ".join(p.latex for p in pieces),
        "text": " ".join(p.text for p in pieces),
        "kind": type(expr).__name__,
        "n_terms": n_terms,
    }


def _prose_json(segments, index_from: int) -> dict:
    return {"latex": prose_latex(segments, index_from), "text": prose_text(segments, index_from)}


def to_json(derivation, indent: int | None = 2, index_from: int = 0) -> str:
    """Every chain and step: rule (key, name, statement), detail, and each expression's
    LaTeX and text in full (never elided), with its number of terms."""
    k = check_layout(None, {"index_from": index_from}).index_from
    chains = []
    for chain in derivation.chains:
        lhs_latex, lhs_text = lhs(chain, k)
        steps = []
        for step in chain.steps:
            r = step.rule
            steps.append({
                "rule": r.key,
                "rule_name": r.name,
                "statement": None if r.statement is None else {"latex": r.statement.latex, "text": r.statement.text},
                "detail": _prose_json(step.detail, k),
                "text": _prose_json(step.text, k),
                "expr": _expr_json(step.expr, chain.sums, k),
                "groups": [{"label": prose_text(label, k), **_expr_json(part, chain.sums, k)}
                           for label, part in step.groups],
            })
        chains.append({
            "lhs": None if chain.lhs is None else {"latex": lhs_latex, "text": lhs_text},
            "intro": _prose_json(chain.intro, k),
            "sums": [{"index": s.index, "over": {"latex": s.over.at(k).latex, "text": s.over.at(k).text}}
                     for s in chain.sums],
            "steps": steps,
        })
    document = {
        "name": derivation.name,
        "title": prose_text(derivation.title, k),
        "summary": prose_text(derivation.summary, k),
        "index_from": k,
        "params": {key: v for key, v in derivation.params},
        "notes": [_prose_json(n, k) for n in derivation.notes],
        "chains": chains,
    }
    return json.dumps(document, indent=indent, ensure_ascii=False, default=str)
