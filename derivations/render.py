"""Documents from derivations: a complete LaTeX file, Markdown, plain text and JSON.

The algebra prints expressions (:func:`tensoralg.to_latex` and ``str``); this module lays
them out: sums over heads in the paper's Σ notation, long sums broken over lines (or
elided in the middle), each step's justification, and the prose around them.

Safety: every string a user can control (a title, a name, a token string) is escaped
before it enters a document (:func:`escape_latex`), and every piece of mathematics is
checked (:func:`check_math`), so no input can inject ``\\input`` or ``\\write18``.

>>> escape_latex(r"50% of {x}")
'50\\\\% of \\\\{x\\\\}'
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

import sympy as sp

from tensoralg import Add, Expr, Product, TensorSum, Term, to_latex
from tensoralg.escape import check_math, escape_text

from derivations.document import Math, Piece, SumIndex, as_prose, math, prose, text_width
from derivations.errors import DerivationError

__all__ = ["Math", "Piece", "SumIndex", "as_prose", "check_math", "escape_latex", "escape_markdown", "latex_document",
           "markdown", "math", "prose", "text", "text_width", "to_json"]

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


def _prose_math(segments: Sequence, escape) -> str:
    """Strings through ``escape``, mathematics between ``$`` (expressions checked)."""
    return "".join(
        escape(s) if isinstance(s, str)
        else f"${s.latex}$" if isinstance(s, Math)
        else f"${check_math(to_latex(s))}$"
        for s in segments
    )


def prose_latex(segments: Sequence) -> str:
    return _prose_math(segments, escape_latex)


def prose_markdown(segments: Sequence) -> str:
    return _prose_math(segments, escape_markdown)


def prose_text(segments: Sequence) -> str:
    return "".join(s if isinstance(s, str) else s.text if isinstance(s, Math) else str(s) for s in segments)


# -- expressions as pieces that lines may break between ---------------------------------


@dataclass(frozen=True)
class Layout:
    """Options for laying out expressions.

    ``sums``: indices shown as Σ (each chain brings its own); ``max_terms``: longer sums keep their first and last
    terms with ``⋯`` between (``None`` keeps all); ``width``: characters per line.
    """

    sums: tuple[SumIndex, ...] = ()
    max_terms: int | None = 40
    width: float = 50.0
    measure: str = "width"


def term_indices(term: Term, sums: Sequence[SumIndex]) -> list[SumIndex]:
    present = {a.index for w in term.words for a in w}
    return [s for s in sums if s.index in present]


@lru_cache(maxsize=1 << 16)
def term_strings(coeff, words: tuple) -> tuple[bool, str, str]:
    """``(negative, LaTeX, text)`` of one term with its sign pulled out (cached: long
    expansions repeat the same factors thousands of times)."""
    coeff = sp.sympify(coeff)
    negative = bool(coeff.could_extract_minus_sign())
    body = TensorSum([Term(-coeff if negative else coeff, words)])
    return negative, check_math(to_latex(body), "term"), str(body)


def term_pieces(term: Term, layout: Layout, first: bool) -> list[Piece]:
    """A term as pieces: usually one; a term wider than a line breaks after each ``⊗``."""
    negative, latex, text = term_strings(term.coeff, term.words)
    sums = term_indices(term, layout.sums)
    if sums:
        latex = " ".join(s.latex() for s in sums) + " " + latex
        text = " ".join(s.text() for s in sums) + " " + text
    whole = _signed(latex, text, negative, first)
    size = whole.width if layout.measure == "width" else len(whole.text)
    latex_parts, text_parts = whole.latex.split(r" \otimes "), whole.text.split(" ⊗ ")
    if size <= layout.width or len(latex_parts) != len(text_parts):
        return [whole]
    last = len(latex_parts) - 1
    return [Piece(lp + ("" if i == last else r" \otimes"), tp + ("" if i == last else " ⊗"))
            for i, (lp, tp) in enumerate(zip(latex_parts, text_parts))]


def _signed(latex: str, text: str, negative: bool, first: bool) -> Piece:
    if negative:
        return Piece("- " + latex, "- " + text) if not first else Piece("-" + latex, "-" + text)
    return Piece(latex, text) if first else Piece("+ " + latex, "+ " + text)


def _elide(items: list, layout: Layout) -> tuple[list, int]:
    """Keep the first and last items of a long sum; return them and how many were left out."""
    limit = layout.max_terms
    if limit is None or len(items) <= limit:
        return items, 0
    head = max(limit - 2, 1)
    return items[:head] + [None] + items[-1:], len(items) - head - 1


def _gap(left_out: int) -> Piece:
    return Piece(rf"+ \cdots \; \text{{({left_out} more terms)}}", f"+ ⋯ ({left_out} more terms)")


def sum_pieces(terms: Sequence[Term], layout: Layout, first: bool = True) -> list[Piece]:
    kept, left_out = _elide(list(terms), layout)
    pieces: list[Piece] = []
    for t in kept:
        pieces.extend([_gap(left_out)] if t is None else term_pieces(t, layout, first and not pieces))
    return pieces


def _factor_pieces(factor: TensorSum, layout: Layout) -> list[Piece]:
    terms = factor.terms
    if not terms:
        return [Piece("(0)", "(0)")]
    inner = sum_pieces(terms, layout)
    summed = any(term_indices(t, layout.sums) for t in terms)
    if len(inner) == 1 and not summed:
        return [Piece(f"({inner[0].latex})", f"({inner[0].text})")]
    lo, hi = (r"\Bigl(", r"\Bigr)") if summed else (r"\bigl(", r"\bigr)")
    inner[0] = Piece(lo + inner[0].latex, "(" + inner[0].text)
    inner[-1] = Piece(inner[-1].latex + hi, inner[-1].text + ")")
    return inner


def product_pieces(expr: Product, layout: Layout, first: bool = True) -> list[Piece]:
    pieces: list[Piece] = []
    for factor in expr.factors:
        fp = _factor_pieces(factor, layout)
        if pieces:
            fp[0] = Piece(fp[0].latex, "· " + fp[0].text)
        pieces.extend(fp)
    coeff = sp.sympify(expr.coeff)
    negative = coeff.could_extract_minus_sign()
    magnitude = -coeff if negative else coeff
    lead = "" if magnitude == 1 else sp.latex(magnitude) + " "
    lead_text = "" if magnitude == 1 else sp.sstr(magnitude) + "·"
    pieces[0] = _signed(lead + pieces[0].latex, lead_text + pieces[0].text, negative, first)
    return pieces


def expr_pieces(expr: Expr, layout: Layout) -> list[Piece]:
    """The expression as pieces: terms of a sum, factors of a product, parts of a lazy sum."""
    if isinstance(expr, TensorSum):
        return sum_pieces(expr.terms, layout) if len(expr) else [Piece("0", "0")]
    if isinstance(expr, Product):
        return product_pieces(expr, layout)
    if isinstance(expr, Add):
        kept, left_out = _elide(list(expr.parts), layout)
        pieces: list[Piece] = []
        for part in kept:
            if part is None:
                pieces.append(_gap(left_out))
            elif isinstance(part, Product):
                pieces.extend(product_pieces(part, layout, first=not pieces))
            else:
                pieces.extend(sum_pieces(part.expand().terms, layout, first=not pieces))
        return pieces
    raise DerivationError(f"cannot lay out {type(expr).__name__}; expected a TensorSum, Product or Add")


def pack(pieces: Sequence[Piece], width: float, first_width: float | None = None,
         measure: str = "width") -> list[list[Piece]]:
    """Greedy line filling: each line at most ``width`` (the first ``first_width``), measured
    by the printed width of the LaTeX (``"width"``) or the characters of the text (``"chars"``)."""
    lines: list[list[Piece]] = [[]]
    room = width if first_width is None else first_width
    used = 0.0
    for p in pieces:
        w = (p.width if measure == "width" else len(p.text)) + 1
        if lines[-1] and used + w > room:
            lines.append([])
            room, used = width, 0.0
        lines[-1].append(p)
        used += w
    return lines


# -- the lines of a step ----------------------------------------------------------------


def step_rows(step, layout: Layout, first_width: float) -> list[list[Piece]]:
    """The rows of one line of a chain: packed pieces, each group of terms on new rows."""
    if not step.groups:
        return pack(expr_pieces(step.expr, layout), layout.width, first_width, layout.measure)
    rows: list[list[Piece]] = []
    for k, (label, part) in enumerate(step.groups):
        pieces = sum_pieces(part.terms, layout, first=k == 0)
        pieces.append(Piece(rf"\qquad \text{{[{escape_latex(label)}]}}", f"   [{label}]"))
        rows += pack(pieces, layout.width, first_width if k == 0 else None, layout.measure)
    return rows


def justification(step, first: bool = False) -> tuple:
    """``Mixed-product rule: (A⊗B)(C⊗D) = (AC)⊗(BD).`` after the step's prose, with its
    detail; empty for a chain's first line when that is a bare definition."""
    r = step.rule
    if first and r.key in ("definition", "given") and not step.detail:
        return step.text
    parts: list = [r.name[:1].upper() + r.name[1:]]
    if r.statement is not None:
        parts += [": ", r.statement]
    if step.detail:
        parts += ["; " if r.statement is not None else ": ", *step.detail]
    return (*step.text, " " if step.text else "", *parts, ".")


def _lhs(chain) -> tuple[str, str]:
    if chain.lhs is None:
        return "", ""
    if isinstance(chain.lhs, Math):
        return chain.lhs.latex, chain.lhs.text
    return check_math(to_latex(chain.lhs), "left-hand side"), str(chain.lhs)


def chain_rows(chain, options: Layout) -> Iterable[tuple[int, object, list[list[Piece]]]]:
    """``(index, step, rows)`` for each step of a chain (its own Σ indices, ``options``' sizes)."""
    layout = Layout(sums=chain.sums, max_terms=options.max_terms, width=options.width, measure=options.measure)
    lhs_latex, lhs_text = _lhs(chain)
    first_width = layout.width - (text_width(lhs_text) if layout.measure == "width" else len(lhs_text)) - 3
    for i, step in enumerate(chain.steps):
        yield i, step, step_rows(step, layout, first_width if i == 0 else layout.width)


def _latex_rows(rows: list[list[Piece]], lead: str) -> list[str]:
    out = []
    for k, row in enumerate(rows):
        body = " ".join(p.latex for p in row)
        out.append((lead if k == 0 else r"&\quad ") + body)
    return out


def _lead(chain, i: int) -> str:
    lhs_latex, _ = _lhs(chain)
    if i > 0:
        return "&= "
    return f"{lhs_latex} &= " if chain.lhs is not None else r"&\hphantom{{}={}} "


def _check_layout(layout: Layout | None, options) -> Layout:
    if layout is not None and options:
        raise DerivationError("give either a Layout or layout options, not both")
    if layout is not None:
        return layout
    unknown = set(options) - {"max_terms", "width", "measure"}
    if unknown:
        raise DerivationError(f"unknown layout options {sorted(unknown)}; expected max_terms, width")
    max_terms = options.get("max_terms", 40)
    if max_terms is not None and (isinstance(max_terms, bool) or not isinstance(max_terms, int) or max_terms < 3):
        raise DerivationError(f"max_terms must be None or an int >= 3, got {max_terms!r}")
    return Layout(**options)


# -- LaTeX ------------------------------------------------------------------------------

PREAMBLE = r"""\documentclass{article}
\usepackage{amsmath}
\allowdisplaybreaks
\setlength{\parindent}{0pt}
\setlength{\parskip}{0.6em}
\sloppy
"""


def latex_body(derivation, layout: Layout) -> list[str]:
    lines = []
    if derivation.summary:
        lines += [escape_latex(derivation.summary), ""]
    if derivation.notes:
        lines += [r"\paragraph{Notation and assumptions.}", r"\begin{itemize}"]
        lines += [r"\item " + prose_latex(n) for n in derivation.notes]
        lines += [r"\end{itemize}", ""]
    for chain in derivation.chains:
        if chain.intro:
            lines += [prose_latex(chain.intro), ""]
        rows: list[str] = []
        for i, step, packed in chain_rows(chain, layout):
            if i == 0:
                why = justification(step, first=True)
                lines += [prose_latex(why)] if why else []
            else:
                rows.append(r"\intertext{" + prose_latex(justification(step)) + "}")
            rows += _latex_rows(packed, _lead(chain, i))
        body = []
        for k, row in enumerate(rows):
            follows_text = k + 1 < len(rows) and rows[k + 1].startswith(r"\intertext")
            last = k + 1 == len(rows)
            body.append(row if last or row.startswith(r"\intertext") or follows_text else row + r" \\")
        lines += [r"\begin{align*}", *body, r"\end{align*}", ""]
    return lines


def latex_document(derivation, layout: Layout | None = None, **options) -> str:
    """A complete LaTeX document (article class, amsmath only) that compiles with pdflatex.

    ``max_terms`` (default 40; ``None`` for all) elides the middle of longer sums;
    ``width`` sets the characters per line before a sum breaks.
    """
    layout = _check_layout(layout, options)
    head = [
        f"% {escape_comment(derivation.name)}: generated by tcircuits",
        PREAMBLE.rstrip("\n"),
        r"\title{" + escape_latex(derivation.title) + "}",
        r"\author{}",
        r"\date{}",
        r"\begin{document}",
        r"\maketitle",
        "",
    ]
    return "\n".join(head + latex_body(derivation, layout) + [r"\end{document}", ""])


def escape_comment(text: str) -> str:
    """User text safe inside a ``%`` comment line: a newline cannot end the comment."""
    return escape_text(text, "latex-comment")


def latex_math(derivation, layout: Layout | None = None, **options) -> str:
    """All chains as one ``aligned`` display (what Jupyter shows for ``_repr_latex_``)."""
    layout = _check_layout(layout, options)
    rows = []
    for chain in derivation.chains:
        for i, step, packed in chain_rows(chain, layout):
            step_rows_ = _latex_rows(packed, _lead(chain, i))
            step_rows_[-1] += rf" \qquad \text{{[{escape_latex(step.rule.name)}]}}"
            rows += step_rows_
    return "$$\\begin{aligned}\n" + " \\\\\n".join(rows) + "\n\\end{aligned}$$"


# -- Markdown ---------------------------------------------------------------------------


def markdown(derivation, layout: Layout | None = None, **options) -> str:
    """Markdown with ``$$`` display math (renders with KaTeX or MathJax)."""
    layout = _check_layout(layout, options)
    out = [f"# {escape_markdown(derivation.title)}", ""]
    if derivation.summary:
        out += [escape_markdown(derivation.summary), ""]
    if derivation.notes:
        out += ["**Notation and assumptions.**", ""]
        out += ["- " + prose_markdown(n) for n in derivation.notes]
        out.append("")
    for chain in derivation.chains:
        if chain.intro:
            out += [prose_markdown(chain.intro), ""]
        for i, step, packed in chain_rows(chain, layout):
            why = justification(step, first=i == 0)
            out += [prose_markdown(why), ""] if why else []
            rows = _latex_rows(packed, _lead(chain, i))
            out += ["$$", r"\begin{aligned}", " \\\\\n".join(rows), r"\end{aligned}", "$$", ""]
    return "\n".join(out)


# -- plain text -------------------------------------------------------------------------


def text(derivation, layout: Layout | None = None, **options) -> str:
    """Plain Unicode text: prose wrapped at 78 columns, one line of the chain per row."""
    if layout is None:
        options = {"width": 74, "measure": "chars", **options}
    layout = _check_layout(layout, options)
    wrap = lambda s, indent="", first=None: textwrap.fill(
        s, 78, initial_indent=indent if first is None else first, subsequent_indent=indent, break_on_hyphens=False)
    out = [derivation.title, "=" * len(derivation.title), ""]
    if derivation.summary:
        out += [wrap(derivation.summary), ""]
    if derivation.notes:
        out += ["Notation and assumptions:"] + [wrap(prose_text(n), "    ", "  - ") for n in derivation.notes] + [""]
    for chain in derivation.chains:
        if chain.intro:
            out += [wrap(prose_text(chain.intro)), ""]
        _, lhs_text = _lhs(chain)
        pad = " " * max(len(lhs_text), 1)
        narrower = Layout(layout.sums, layout.max_terms, max(40, layout.width - len(pad) + 1), layout.measure)
        for i, step, packed in chain_rows(chain, narrower):
            why = justification(step, first=i == 0)
            if why:
                out.append(wrap(f"[{prose_text(why)}]", pad + "    ", pad + "   "))
            for k, row in enumerate(packed):
                body = " ".join(p.text for p in row)
                if k:
                    out.append(f"{pad}     {body}")
                elif i == 0:
                    out.append(f"{lhs_text} = {body}" if chain.lhs is not None else f"{pad}   {body}")
                else:
                    out.append(f"{pad} = {body}")
        out.append("")
    return "\n".join(out)


# -- JSON -------------------------------------------------------------------------------


def _expr_json(expr, sums) -> dict:
    full = Layout(sums=tuple(sums), max_terms=None)
    pieces = expr_pieces(expr, full)
    n_terms = len(expr) if isinstance(expr, TensorSum) else expr.count()
    return {
        "latex": " ".join(p.latex for p in pieces),
        "text": " ".join(p.text for p in pieces),
        "kind": type(expr).__name__,
        "n_terms": n_terms,
    }


def _prose_json(segments) -> dict:
    return {"latex": prose_latex(segments), "text": prose_text(segments)}


def to_json(derivation, indent: int | None = 2) -> str:
    """Every chain and step: rule (key, name, statement), detail, and each expression's
    LaTeX and text in full (never elided), with its number of terms."""
    chains = []
    for chain in derivation.chains:
        lhs_latex, lhs_text = _lhs(chain)
        steps = []
        for step in chain.steps:
            r = step.rule
            steps.append({
                "rule": r.key,
                "rule_name": r.name,
                "statement": None if r.statement is None else {"latex": r.statement.latex, "text": r.statement.text},
                "detail": _prose_json(step.detail),
                "text": _prose_json(step.text),
                "expr": _expr_json(step.expr, chain.sums),
                "groups": [{"label": label, **_expr_json(part, chain.sums)} for label, part in step.groups],
            })
        chains.append({
            "lhs": None if chain.lhs is None else {"latex": lhs_latex, "text": lhs_text},
            "intro": _prose_json(chain.intro),
            "sums": [{"index": s.index, "over": {"latex": s.over.latex, "text": s.over.text}} for s in chain.sums],
            "steps": steps,
        })
    document = {
        "name": derivation.name,
        "title": derivation.title,
        "summary": derivation.summary,
        "params": {k: v for k, v in derivation.params},
        "notes": [_prose_json(n) for n in derivation.notes],
        "chains": chains,
    }
    return json.dumps(document, indent=indent, ensure_ascii=False, default=str)
