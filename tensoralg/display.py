r"""What a notebook shows: maths from the one printer, long sums elided, text escaped.

IPython asks an object for its rich forms (``_repr_html_``, ``_repr_latex_``,
``_repr_markdown_``, ``_repr_pretty_``). The helpers here produce them for every package, so an expression, a
derivation, a verification report and an analysis result all show the same thing for a long
sum: its first and last terms and the count of the terms left out — never 30,000 terms.
Mathematics comes only from :func:`tensoralg.latex.to_latex`; user text (names, labels,
token strings) only through :func:`tensoralg.escape.escape_text`.

>>> from tensoralg import atom, term
>>> s = sum(term(atom("A", f"h{i}"), atom("W_OV", f"h{i}")) for i in range(50))
>>> text_repr(s, max_terms=4)
'A^{h0} ⊗ W_OV^{h0} + A^{h1} ⊗ W_OV^{h1} + ⋯ (46 terms) + A^{h48} ⊗ W_OV^{h48} + A^{h49} ⊗ W_OV^{h49}'
>>> latex_repr(s, max_terms=4).count(r"\otimes"), r"46\ \mathrm{terms}" in latex_repr(s, max_terms=4)
(4, True)
"""

from __future__ import annotations

from functools import lru_cache
from collections.abc import Sequence

from tensoralg.errors import TensorAlgError
from tensoralg.escape import escape_text, html_safe_math, markdown_math
from tensoralg.latex import TensorLatexPrinter, to_latex
from tensoralg.mathml import to_mathml

#: How many terms of a sum a notebook shows (the first half and the last half; the rest counted).
REPR_MAX_TERMS = 16


def _check_max_terms(max_terms) -> None:
    if max_terms is not None and (isinstance(max_terms, bool) or not isinstance(max_terms, int) or max_terms < 2):
        raise TensorAlgError(f"max_terms must be None or an int >= 2, got {max_terms!r}")


def latex_repr(expr, max_terms: int | None = REPR_MAX_TERMS) -> str:
    r"""``$\displaystyle …$`` for an expression, the middle of a long sum elided with its count; ``<`` and
    ``>`` of names written as commands (:func:`~tensoralg.escape.html_safe_math`): a
    notebook that inserts ``text/latex`` as HTML reads no tag from an index such as ``<img onerror=…>``.

    >>> from tensoralg import atom, term
    >>> "<" in latex_repr(term(atom("A", "<img src=x onerror=alert(1)>")))
    False
    """
    _check_max_terms(max_terms)
    return "$\\displaystyle " + html_safe_math(to_latex(expr, max_terms=max_terms)) + "$"


def text_repr(expr, max_terms: int | None = REPR_MAX_TERMS) -> str:
    """The plain-text twin of :func:`latex_repr` (same terms, same elision)."""
    _check_max_terms(max_terms)
    return _printer(max_terms).text(expr)


@lru_cache(maxsize=8)
def _printer(max_terms: int | None) -> TensorLatexPrinter:
    """One printer per option (its atom and coefficient caches kept): ``str`` of a term is cheap."""
    return TensorLatexPrinter(max_terms=max_terms)


def html_repr(expr, max_terms: int | None = REPR_MAX_TERMS) -> str:
    """MathML for a notebook: a sum one summand a line (its first and last terms, the count of the
    rest between), a lazy product one factor a line; the maths is the printer's, as ``--format html``.

    >>> from tensoralg import atom, term
    >>> s = sum(term(atom("A", f"h{i}"), atom("W_OV", f"h{i}")) for i in range(50))
    >>> html = html_repr(s, max_terms=4)
    >>> html.count("<math"), "46" in html
    (5, True)
    """
    _check_max_terms(max_terms)
    printer = TensorLatexPrinter(max_terms=max_terms)
    if hasattr(expr, "factors"):
        x = printer.summand(expr, expr.bound)
        _, lead = printer.coefficient(expr.coeff)
        factors = [printer.bracketed(f, expr.bound)[0] for f in expr.factors]
        lines = [("-" if x.negative else "") + lead + factors[0]] + factors[1:]
    else:
        lines = [("-" if x.negative else "") + x.sum_latex + x.latex if i == 0 else
                 ("- " if x.negative else "+ ") + x.sum_latex + x.latex
                 for i, x in enumerate(printer.summands(expr))] or ["0"]
    rows = [f'<div style="{"" if i == 0 else "padding-left: 2em"}">{to_mathml(line)}</div>' for i, line in enumerate(lines)]
    return '<div class="tcircuits-expr">' + "".join(rows) + "</div>"


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """An HTML table; header cells are text (escaped here), row cells ready HTML (escape text with
    :func:`html_text`, maths with :func:`html_repr`)."""
    align = lambda i: ' style="text-align: right"' if i in right else ""  # noqa: E731
    head = "".join(f"<th{align(i)}>{html_text(h)}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{align(i)}>{c}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_text(text) -> str:
    """User text made safe in HTML."""
    return escape_text(str(text), "html")


def md_text(text) -> str:
    r"""User text made safe in Markdown (and the HTML it becomes).

    >>> md_text("<b>x_1</b>")
    '&lt;b&gt;x\\_1&lt;/b&gt;'
    """
    return escape_text(str(text), "markdown")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun, singular for one: ``1 term``, ``2,197 terms``.

    >>> counted(1, "term"), counted(2197, "term"), counted(1, "head", "heads")
    ('1 term', '2,197 terms', '1 head')
    """
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def md_math(expr, max_terms: int | None = REPR_MAX_TERMS) -> str:
    """An expression as inline Markdown maths, through the printer."""
    _check_max_terms(max_terms)
    return "$" + html_safe_math(to_latex(expr, max_terms=max_terms)) + "$"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A Markdown table; cells are written as given (escape text with :func:`md_text` first).

    >>> print(md_table(["a", "b"], [["1", "2"]], right=[1]))
    | a | b |
    |---|---:|
    | 1 | 2 |
    """
    rule = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def head_and_tail(rows: Sequence, limit: int | None) -> tuple[list, int, list]:
    """``(head, n_left_out, tail)``: all rows when they fit in ``limit``, else the first and last.

    >>> head_and_tail(list(range(10)), 4)
    ([0, 1], 6, [8, 9])
    """
    rows = rows if isinstance(rows, Sequence) else list(rows)  # a sequence is only sliced: rows made when read stay unmade
    if limit is None or len(rows) <= limit:
        return list(rows), 0, []
    head, tail = (limit + 1) // 2, limit // 2
    return list(rows[:head]), len(rows) - head - tail, list(rows[len(rows) - tail:]) if tail else []


def elided_table(header: Sequence[str], rows: Sequence[Sequence[str]], limit: int | None = REPR_MAX_TERMS,
                 right: Sequence[int] = (), what: str = "rows") -> str:
    """:func:`md_table` of the first and last rows, one row in between saying how many were left out."""
    head, n_out, tail = head_and_tail(rows, limit)
    gap = [[f"⋯ {n_out:,} {what} left out"] + [""] * (len(header) - 1)] if n_out else []
    return md_table(header, head + gap + tail, right)


def expansion_markdown(title: str, sums: dict, max_terms: int | None = REPR_MAX_TERMS) -> str:
    """A title, then each labelled sum as display maths (what an expansion shows in a notebook)."""
    parts = [md_text(title)]
    for label, s in sums.items():
        parts += [f"{md_text(label)}, {counted(len(s), 'term')}:", "$$" + markdown_math(to_latex(s, max_terms=max_terms)) + "$$"]
    return "\n\n".join(parts)
