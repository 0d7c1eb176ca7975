r"""Derivations as one self-contained HTML page, the mathematics as MathML.

The page needs no network (no scripts, no web fonts, the CSS inline) and current browsers
render its MathML natively. The tensoralg printer writes every piece of mathematics as
LaTeX (through :func:`tensoralg.escape.check_math`, the allow-list), :mod:`derivations.layout`
arranges it into lines, and ``latex2mathml`` converts each line to MathML. latex2mathml is
chosen because it is pure Python (no Node.js, unlike KaTeX or MathJax on the server side),
maintained, small, and covers every construct the printer emits; a test converts every
catalogue entry. The converter (:func:`tensoralg.mathml.to_mathml`) lives beside the printer,
so a notebook's ``_repr_html_`` shows the same MathML as these pages.

User text (titles, names, token strings) goes through ``escape_text(…, "html")``.
Each step shows its rule and its numerical check; long steps fold into ``<details>``.

>>> print(mathml(r"A^{h} \otimes W_{OV}^{h}"))  # doctest: +ELLIPSIS
<math display="inline"><mrow><msup><mi>A</mi><mrow><mi>h</mi></mrow></msup><mo lspace="0.2222em" rspace="0.2222em">&#8855;</mo>...</math>
"""

from __future__ import annotations

from tensoralg import TensorSum
from tensoralg.errors import MathMLError
from tensoralg.escape import escape_text
from tensoralg.mathml import to_mathml
from tensoralg.display import counted

from derivations.document import Math, Piece, resolve
from derivations.errors import DerivationError, HtmlError
from derivations.layout import Layout, chain_rows, check_layout, justification, lhs, printer, prose_text

__all__ = ["FOLD_ROWS", "HtmlError", "html_body", "html_document", "html_fragment", "mathml", "page", "prose_html"]

#: A step with more lines than this shows its first and last lines and folds the rest.
FOLD_ROWS = 10
_HEAD_ROWS, _TAIL_ROWS = 4, 2


# -- MathML ----------------------------------------------------------------------------------


def mathml(latex: str, display: str = "inline", check: bool = True) -> str:
    r"""The printer's LaTeX as a ``<math>`` element: :func:`tensoralg.mathml.to_mathml` (the one
    converter, also behind the notebooks' ``_repr_html_``), its failures as :class:`HtmlError`.

    >>> mathml(r"\text{<b>}")
    '<math display="inline"><mrow><mtext>&#60;b&#62;</mtext></mrow></math>'
    """
    try:
        return to_mathml(latex, display, check)
    except MathMLError as error:
        raise HtmlError(str(error)) from None


def prose_html(segments, index_from: int = 0) -> str:
    """A paragraph as HTML: strings escaped, formulae as inline MathML.

    >>> from derivations.document import math
    >>> prose_html(("x <b> ", math("h ≠ k")))  # doctest: +ELLIPSIS
    'x &lt;b&gt; <math display="inline"><mrow><mi>h</mi><mo>&#8800;</mo>...'
    """
    out = []
    for s in resolve(segments, index_from):
        if isinstance(s, str):
            out.append(escape_text(s, "html"))
        elif isinstance(s, Math):
            out.append(mathml(s.at(index_from).latex, check=False))
        else:
            out.append(mathml(printer(None, index_from).doprint(s)))
    return "".join(out)


# -- the page --------------------------------------------------------------------------------

CSS = """
:root { color-scheme: light; --ink: #1d1d1f; --muted: #5f6368; --rule: #d7dbe0; --ok: #1e7b34; --bad: #b3261e; }
body { margin: 0; background: #fbfbfa; color: var(--ink);
       font: 17px/1.55 "Latin Modern Roman", "STIX Two Text", "Cambria", "Georgia", serif; }
main { max-width: 68rem; margin: 0 auto; padding: 2rem 2.5rem 4rem; }
h1 { font-size: 1.8rem; line-height: 1.25; margin: 0 0 1rem; }
h2 { font-size: 1.25rem; margin: 2rem 0 0.6rem; }
math { font-family: "Latin Modern Math", "STIX Two Math", "Cambria Math", math; font-size: 1.05em; }
.badge { display: inline-block; white-space: nowrap; font: 600 0.82rem/1.4 system-ui, sans-serif; padding: 0.1rem 0.55rem;
         border-radius: 1rem; color: #fff; background: var(--ok); }
.badge.bad { background: var(--bad); }
.badge.none { background: var(--muted); }
.verification { border-left: 4px solid var(--ok); background: #eef6f0; padding: 0.6rem 1rem; margin: 1rem 0; }
.verification.bad { border-color: var(--bad); background: #fbeceb; }
.verification.none { border-color: var(--muted); background: #f1f1f1; }
.chain { margin: 1.6rem 0; padding-top: 0.4rem; border-top: 1px solid var(--rule); }
/* a line too wide scrolls sideways; the maths' few pixels of depth below the grid gave every block a
   vertical scrollbar, so the block pads for them and never scrolls up and down */
.lines { display: grid; grid-template-columns: max-content minmax(0, 1fr); column-gap: 0.6em; row-gap: 0.25rem;
         align-items: baseline; overflow-x: auto; overflow-y: hidden; padding: 0.2rem 0 0.4rem; }
.lines > .why { grid-column: 1 / -1; margin: 0.9rem 0 0.2rem; color: var(--ink); }
.why .rule { font-weight: 600; }
.why .check { font: 0.8rem system-ui, sans-serif; color: var(--ok); margin-left: 0.5em; white-space: nowrap; }
.why .check.bad { color: var(--bad); }
.lead { text-align: right; white-space: nowrap; }
.rhs { white-space: nowrap; }
.lines math[display="block"] { display: inline math; }
.rhs.more { padding-left: 1.6em; }
.group { font-style: italic; color: var(--muted); margin-left: 1.5em; font-size: 0.92em; }
details.fold { grid-column: 1 / -1; display: grid; grid-template-columns: subgrid; row-gap: 0.25rem; }
details.fold > summary { grid-column: 2; cursor: pointer; color: var(--muted); font: 0.9rem system-ui, sans-serif;
                         padding-left: 1.6em; }
ul.notes li { margin: 0.2rem 0; }
table { border-collapse: collapse; margin: 0.8rem 0; font-size: 0.95rem; }
th, td { border-bottom: 1px solid var(--rule); padding: 0.3rem 0.7rem; text-align: left; vertical-align: baseline; }
th { background: #f0f1f3; }
caption { caption-side: top; text-align: left; font-weight: 600; padding: 0.3rem 0; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1rem 0; }
figure img, figure svg { width: 100%; max-width: 48rem; height: auto; }
figcaption { color: var(--muted); font-size: 0.9rem; }
footer { margin-top: 3rem; color: var(--muted); font: 0.85rem system-ui, sans-serif; }
"""


def page(title: str, body: str, css: str = CSS) -> str:
    """A complete HTML5 page: ``title`` is plain text (escaped here), ``body`` ready HTML.

    >>> page("a <b>", "<p>x</p>").count("&lt;b&gt;")
    1
    """
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="tcircuits">',
        f"<title>{escape_text(title, 'html')}</title>",
        f"<style>{css}</style>",
        "</head>",
        "<body>",
        "<main>",
        body,
        "</main>",
        "</body>",
        "</html>",
        "",
    ])


def _verification_html(verification, steps: int) -> str:
    if verification is None:
        return '<p class="verification none"><span class="badge none">not checked</span> no numerical check was run.</p>'
    if isinstance(verification, str):
        return ('<p class="verification bad"><span class="badge bad">not verified</span> '
                f"{escape_text(verification, 'html')}</p>")
    ok = verification.ok
    label = "verified" if ok else "FAILED"
    return (f'<p class="verification{"" if ok else " bad"}"><span class="badge{"" if ok else " bad"}">{label}</span> '
            f"every line evaluated on random matrices and compared with the chain's first line: "
            f"worst relative error {verification.worst:.1e}, tolerance {verification.tol:.0e} "
            f"({len(verification.errors)} of {steps} lines checked).</p>")


def _math_row(lead: str, row: list[Piece], labels: list[str], more: bool) -> str:
    parts, label = [], ""
    for piece in row:
        if _is_label(piece) and labels:
            label = f' <span class="group">[{labels.pop(0)}]</span>'
        else:
            parts.append(piece.latex)
    body = mathml(" ".join(parts), "block") if parts else ""
    return (f'<div class="lead">{mathml(lead, "block") if lead else ""}</div>'
            f'<div class="rhs{" more" if more else ""}">{body}{label}</div>')


def _is_label(piece: Piece) -> bool:
    return piece.latex.startswith(r"\qquad \text{[")


def _step_rows(rows: list[list[Piece]], lead: str, labels: list[str], n_terms: int | None) -> list[str]:
    # a page is wider than the layout's line: a group's label goes beside its last line
    merged: list[list[Piece]] = []
    for row in rows:
        if merged and all(_is_label(p) for p in row):
            merged[-1] = merged[-1] + row
        else:
            merged.append(row)
    rows = merged
    html = [_math_row(lead if k == 0 else "", row, labels, k > 0) for k, row in enumerate(rows)]
    if len(rows) <= FOLD_ROWS:
        return html
    hidden = html[_HEAD_ROWS:-_TAIL_ROWS]
    terms = f", {counted(n_terms, 'term')} in all" if n_terms else ""
    summary = f"<summary>show {counted(len(hidden), 'more line', 'more lines')}{terms}</summary>"
    return [*html[:_HEAD_ROWS], f'<details class="fold">{summary}{"".join(hidden)}</details>', *html[-_TAIL_ROWS:]]


def _check_html(errors: dict, key, tol: float | None) -> str:
    if key not in errors:
        return ""
    error = errors[key]
    ok = tol is None or error <= tol
    return f' <span class="check{"" if ok else " bad"}">{"✓" if ok else "✗"} error {error:.1e}</span>'


def _chain_html(ci: int, chain, layout: Layout, errors: dict, tol) -> str:
    k = layout.index_from
    lhs_latex, _ = lhs(chain, k)
    out = [f'<section class="chain">']
    if chain.intro:
        out.append(f"<p>{prose_html(chain.intro, k)}</p>")
    out.append('<div class="lines">')
    for i, step, rows in chain_rows(chain, layout):
        why = justification(step, first=i == 0)
        check = _check_html(errors, (ci, i), tol) if i else ""  # the first line is the reference
        if not why and i == 0:
            why = (step.rule.name[:1].upper() + step.rule.name[1:] + ".",)
        if why or check:
            rule = step.rule.name[:1].upper() + step.rule.name[1:]
            text = prose_html(why, k)
            text = text.replace(escape_text(rule, "html"), f'<span class="rule">{escape_text(rule, "html")}</span>', 1)
            out.append(f'<p class="why">{text}{check}</p>')
        lead = (lhs_latex + " =" if lhs_latex else "") if i == 0 else "="
        labels = [prose_html(label, k) for label, _ in step.groups]
        n_terms = len(step.expr) if isinstance(step.expr, TensorSum) else None
        out += _step_rows(rows, lead, labels, n_terms)
    out.append("</div>")
    out.append("</section>")
    return "\n".join(out)


def html_document(derivation, layout: Layout | None = None, verification="run", **options) -> str:
    """A self-contained HTML page of the derivation (options as :func:`derivations.render.markdown`).

    ``verification``: ``"run"`` (the default) evaluates every line with
    :meth:`~derivations.derivation.Derivation.verify` and shows the worst error and the
    tolerance; a :class:`~derivations.numeric.Verification` is shown as given; ``None``
    shows that no check ran.

    >>> from derivations import catalogue
    >>> page_ = html_document(catalogue.get("zero-layer"))
    >>> "<math" in page_ and "worst relative error" in page_ and "<script" not in page_
    True
    """
    layout = check_layout(layout, options)
    body = html_body(derivation, layout, verification)
    numbering = "from 1, as the paper" if layout.index_from else "from 0, as TransformerLens"
    body += (f"\n<footer>{escape_text(derivation.name, 'html')} · generated by tcircuits · "
             f"layers numbered {numbering}</footer>")
    return page(prose_text(derivation.title, layout.index_from), body)


def html_fragment(derivation, layout: Layout | None = None, verification=None, **options) -> str:
    """The derivation as a ``<div>`` for a notebook (``_repr_html_``): the page's body, MathML from
    the same printer, with the page's styles scoped to the fragment; no numerical check unless asked."""
    layout = check_layout(layout, options)
    css = "\n".join(f".tcircuits-derivation {rule}" for rule in FRAGMENT_CSS)
    return (f'<div class="tcircuits-derivation"><style>{css}</style>'
            f"{html_body(derivation, layout, verification)}</div>")


#: The page's rules that a notebook needs, scoped to the fragment (nothing leaks into the notebook).
FRAGMENT_CSS = (
    ".lines { display: grid; grid-template-columns: max-content minmax(0, 1fr); column-gap: 0.6em; "
    "row-gap: 0.25rem; align-items: baseline; }",
    ".lines > .why { grid-column: 1 / -1; margin: 0.7rem 0 0.2rem; }", ".why .rule { font-weight: 600; }",
    ".lead { text-align: right; white-space: nowrap; }", ".rhs.more { padding-left: 1.6em; }",
    '.lines math[display="block"] { display: inline math; }',
    "details.fold { grid-column: 1 / -1; display: grid; grid-template-columns: subgrid; }",
    "details.fold > summary { grid-column: 2; cursor: pointer; padding-left: 1.6em; }",
)


def html_body(derivation, layout: Layout, verification="run", heading: str = "h1") -> str:
    """The derivation as HTML for a page's body (:func:`html_document` without the page shell):
    its title as ``heading``, summary, numerical check, notes and chains; ``verification`` as in
    :func:`html_document`.

    >>> from derivations import catalogue
    >>> html_body(catalogue.get("zero-layer"), Layout(), heading="h3").startswith("<h3>")
    True
    """
    if heading not in ("h1", "h2", "h3", "h4"):
        raise HtmlError(f"heading must be one of h1, h2, h3, h4, got {heading!r}")
    k = layout.index_from
    if isinstance(verification, str) and verification == "run":
        try:
            verification = derivation.verify()
        except DerivationError as error:
            verification = f"the numerical check could not run: {error}"
    errors = {} if verification is None or isinstance(verification, str) else {
        (ci, si): e for ci, si, e in verification.errors}
    tol = getattr(verification, "tol", None)
    body = [f"<{heading}>{prose_html(derivation.title, k)}</{heading}>"]
    if derivation.summary:
        body.append(f'<p class="summary">{prose_html(derivation.summary, k)}</p>')
    body.append(_verification_html(verification, len(derivation.steps)))
    if derivation.notes:
        sub = f"h{int(heading[1]) + 1}"
        body.append(f"<{sub}>Notation and assumptions</{sub}>")
        body.append('<ul class="notes">' + "".join(f"<li>{prose_html(n, k)}</li>" for n in derivation.notes) + "</ul>")
    body += [_chain_html(ci, chain, layout, errors, tol) for ci, chain in enumerate(derivation.chains)]
    return "\n".join(body)
