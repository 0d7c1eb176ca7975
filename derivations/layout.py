r"""Arranging the printer's output: prose, summands on lines, the rows of a chain.

The tensoralg printer (:class:`tensoralg.latex.TensorLatexPrinter`) typesets every
expression — signs, coefficients, brackets by precedence, the elided middle of long sums —
as LaTeX and as text. This module only arranges its summands into lines:

- a line breaks only between summands, or between the factors of a product; a term that
  fits on a line is never split (one wider than a whole line — a concrete term of a deep
  model — continues after a ``⊗`` on the next line, its only break points);
- a sum that does not fit on one line puts each summand on its own line;
- a product of sums (a distributivity step) keeps each bracketed factor whole, as many per
  line as fit (a factor wider than a whole line breaks between its own summands);
- summed head indices of a chain show as ``Σ_{h∈H_l}`` before the terms that carry them.

>>> from tensoralg import atom, identity, term
>>> pieces = expr_pieces(identity(2) + term(atom("A", "h0"), atom("W_OV", "h0")), Layout(index_from=1))
>>> [p.text for p in pieces]
['Id ⊗ Id', '+ A^{h1} ⊗ W_OV^{h1}']
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterable, Sequence

from tensoralg import Expr, Product, TensorSum, Term
from tensoralg.escape import check_math, escape_text, markdown_math  # noqa: F401 (markdown_math: re-exported for render)
from tensoralg.latex import Summand, TensorLatexPrinter

from derivations.document import Math, Piece, SumIndex, resolve, text_width
from derivations.errors import DerivationError


@dataclass(frozen=True)
class Layout:
    """Options for laying out expressions.

    ``sums``: indices shown as Σ (each chain brings its own); ``max_terms``: longer sums keep
    their first and last terms with the count of the rest between (``None`` keeps all);
    ``width``: characters per line; ``measure``: ``"width"`` (printed width) or ``"chars"``;
    ``index_from``: 0 numbers layers as TransformerLens, 1 as the paper (``H_1`` first).
    """

    sums: tuple[SumIndex, ...] = ()
    max_terms: int | None = 40
    width: float = 64.0
    measure: str = "width"
    index_from: int = 0


@lru_cache(maxsize=64)
def printer(max_terms: int | None, index_from: int) -> TensorLatexPrinter:
    """The (cached) printer for these options."""
    return TensorLatexPrinter(max_terms=max_terms, index_from=index_from)


def check_layout(layout: Layout | None, options) -> Layout:
    """A :class:`Layout` from either a layout or keyword options, each checked."""
    if layout is not None and options:
        raise DerivationError("give either a Layout or layout options, not both")
    if layout is not None:
        return layout
    known = {"max_terms", "width", "measure", "index_from"}
    unknown = set(options) - known
    if unknown:
        raise DerivationError(f"unknown layout options {sorted(unknown)}; expected {', '.join(sorted(known))}")
    max_terms = options.get("max_terms", 40)
    if max_terms is not None and (isinstance(max_terms, bool) or not isinstance(max_terms, int) or max_terms < 3):
        raise DerivationError(f"max_terms must be None or an int >= 3, got {max_terms!r}")
    index_from = options.get("index_from", 0)
    if index_from not in (0, 1) or isinstance(index_from, bool):
        raise DerivationError(f"index_from must be 0 (TransformerLens) or 1 (the paper's layer numbers), got {index_from!r}")
    return Layout(**options)


# -- prose -----------------------------------------------------------------------------------


def _prose(segments, index_from: int, escape: str) -> str:
    """Strings escaped, formulae between ``$``; formulae side by side share one ``$…$`` (``$a$$b$``
    would open display maths in TeX's and Pandoc's reading)."""
    out: list[str] = []
    after_math = False
    for s in resolve(segments, index_from):
        if isinstance(s, str):
            out.append(escape_text(s, escape))
            after_math = False
            continue
        latex = s.at(index_from).latex if isinstance(s, Math) else check_math(printer(None, index_from).doprint(s))
        latex = markdown_math(latex) if escape == "markdown" else latex
        if after_math:
            out[-1] = out[-1][:-1] + " " + latex + "$"
        else:
            out.append("$" + latex + "$")
        after_math = True
    return "".join(out)


def prose_latex(segments, index_from: int = 0) -> str:
    r"""A paragraph as LaTeX body text: strings escaped, formulae between ``$``.

    >>> from derivations.document import math
    >>> prose_latex(("for ", math("h ≠ k"), ", 50% of σ"))
    'for $h \\neq k$, 50\\% of $\\sigma$'
    >>> prose_latex((math("a"), math("b")))  # side by side: one formula
    '$a b$'
    """
    return _prose(segments, index_from, "latex")


def prose_markdown(segments, index_from: int = 0) -> str:
    """A paragraph as Markdown: strings escaped (HTML too), formulae between ``$``."""
    return _prose(segments, index_from, "markdown")


def prose_text(segments, index_from: int = 0) -> str:
    """A paragraph as plain text: formulae in their text form, control characters escaped."""
    out = []
    for s in resolve(segments, index_from):
        if isinstance(s, str):
            out.append(escape_text(s, "text"))
        elif isinstance(s, Math):
            out.append(s.at(index_from).text)
        else:
            out.append(printer(None, index_from).text(s))
    return "".join(out)


# -- expressions as pieces -------------------------------------------------------------------


def term_indices(term: Term, sums: Sequence[SumIndex]) -> list[SumIndex]:
    present = {a.index for w in term.words for a in w}
    return [s for s in sums if s.index in present]


def _signed(latex: str, text: str, negative: bool, first: bool, starts: bool = True) -> Piece:
    if negative:
        return Piece(("-" if first else "- ") + latex, ("-" if first else "- ") + text, starts)
    return Piece(latex, text, starts) if first else Piece("+ " + latex, "+ " + text, starts)


def summand_pieces(x: Summand, layout: Layout, first: bool) -> list[Piece]:
    """A summand as pieces: a term (with its Σ) or an elision marker whole; a product by factors."""
    if x.product is not None:
        return product_pieces(x, layout, first)
    latex, text = x.latex, x.text
    if x.term is not None:
        sums = term_indices(x.term, layout.sums)
        if sums:
            latex = " ".join(s.latex(layout.index_from) for s in sums) + " " + latex
            text = " ".join(s.text(layout.index_from) for s in sums) + " " + text
        check_math(latex, "term")
    whole = _signed(latex, text, x.negative, first)
    if x.term is None or _measure(whole, layout) <= layout.width:
        return [whole]
    latex_parts, text_parts = whole.latex.split(r" \otimes "), whole.text.split(" ⊗ ")
    last = len(latex_parts) - 1
    return [Piece(lp + ("" if i == last else r" \otimes"), tp + ("" if i == last else " ⊗"), i == 0)
            for i, (lp, tp) in enumerate(zip(latex_parts, text_parts))]


def _summed(factor: TensorSum, layout: Layout) -> bool:
    return any(term_indices(t, layout.sums) for t in factor)


def factor_pieces(factor: TensorSum, layout: Layout) -> list[Piece]:
    """A factor of a product, bracketed where precedence needs it: one piece if it fits a line."""
    p = printer(layout.max_terms, layout.index_from)
    inner: list[Piece] = []
    for x in p.summands(factor) if len(factor) else []:
        inner += summand_pieces(x, layout, first=not inner)
    if not inner:
        inner = [Piece("0", "0")]
    if not p.needs_brackets(factor):
        return [replace(q, starts=False) for q in inner]
    latex, text = " ".join(q.latex for q in inner), " ".join(q.text for q in inner)
    whole = Piece(r"\left(" + latex + r"\right)", "(" + text + ")", False)
    if _measure(whole, layout) <= layout.width:
        return [whole]
    lo, hi = (r"\Bigl(", r"\Bigr)") if _summed(factor, layout) else (r"\bigl(", r"\bigr)")
    inner[0] = Piece(lo + inner[0].latex, "(" + inner[0].text)
    inner[-1] = Piece(inner[-1].latex + hi, inner[-1].text + ")")
    return [replace(q, starts=False) for q in inner]


def product_pieces(x: Summand, layout: Layout, first: bool) -> list[Piece]:
    p = printer(layout.max_terms, layout.index_from)
    pieces: list[Piece] = []
    for factor in x.product.factors:
        pieces += factor_pieces(factor, layout)
    _, lead = p.coefficient(x.product.coeff)
    _, lead_text = p.coefficient_text(x.product.coeff)
    pieces[0] = _signed(lead + pieces[0].latex, lead_text + pieces[0].text, x.negative, first)
    return pieces


def expr_pieces(expr: Expr, layout: Layout) -> list[Piece]:
    """The expression as pieces: each summand (a term whole), a product's factors."""
    p = printer(layout.max_terms, layout.index_from)
    if isinstance(expr, TensorSum) and not len(expr):
        return [Piece("0", "0")]
    if isinstance(expr, Product):
        summands = [p.summand(expr)]
    elif isinstance(expr, Expr):
        summands = p.summands(expr)
    else:
        raise DerivationError(f"cannot lay out {type(expr).__name__}; expected a TensorSum, Product or Add")
    pieces: list[Piece] = []
    for x in summands:
        pieces += summand_pieces(x, layout, first=not pieces)
    return pieces


def _measure(piece: Piece, layout: Layout) -> float:
    return piece.width if layout.measure == "width" else len(piece.text)


def pack(pieces: Sequence[Piece], width: float, first_width: float | None = None,
         measure: str = "width") -> list[list[Piece]]:
    """Lines of pieces: all on one line if they fit; otherwise each summand starts a line and
    the factors of a product fill lines of at most ``width`` (the first ``first_width``)."""
    size = (lambda p: p.width) if measure == "width" else (lambda p: len(p.text))
    room = width if first_width is None else first_width
    if sum(size(p) + 1 for p in pieces) <= room:
        return [list(pieces)]
    lines: list[list[Piece]] = [[]]
    used = 0.0
    for p in pieces:
        w = size(p) + 1
        if lines[-1] and (p.starts or used + w > room):
            lines.append([])
            room, used = width, 0.0
        lines[-1].append(p)
        used += w
    return lines


# -- the rows of a chain ------------------------------------------------------------------------


def step_rows(step, layout: Layout, first_width: float) -> list[list[Piece]]:
    """The rows of one line of a chain; each labelled group of terms on rows of its own."""
    if not step.groups:
        return pack(expr_pieces(step.expr, layout), layout.width, first_width, layout.measure)
    rows: list[list[Piece]] = []
    for k, (label, part) in enumerate(step.groups):
        pieces = expr_pieces(part, layout)
        if k and pieces:
            first = pieces[0]
            negative = first.text.startswith("-")
            pieces[0] = _signed(first.latex.lstrip("-"), first.text.lstrip("-"), negative, False)
        label_latex = prose_latex(label, layout.index_from)
        tag = Piece(rf"\qquad \text{{[{label_latex}]}}", f"   [{prose_text(label, layout.index_from)}]", False)
        packed = pack(pieces, layout.width, first_width if k == 0 else None, layout.measure)
        # the label stays beside its terms unless the last line is already full
        fits = sum(_measure(p, layout) + 1 for p in packed[-1]) + _measure(tag, layout) <= layout.width
        rows += packed[:-1] + ([packed[-1] + [tag]] if fits else [packed[-1], [tag]])
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


def lhs(chain, index_from: int = 0) -> tuple[str, str]:
    """``(latex, text)`` of a chain's left-hand side (empty when it has none)."""
    if chain.lhs is None:
        return "", ""
    if isinstance(chain.lhs, Math):
        m = chain.lhs.at(index_from)
        return m.latex, m.text
    p = printer(None, index_from)
    return check_math(p.doprint(chain.lhs), "left-hand side"), p.text(chain.lhs)


def chain_rows(chain, options: Layout) -> Iterable[tuple[int, object, list[list[Piece]]]]:
    """``(index, step, rows)`` for each step of a chain (its own Σ indices, ``options``' sizes)."""
    layout = replace(options, sums=chain.sums)
    _, lhs_text = lhs(chain, layout.index_from)
    first_width = layout.width - (text_width(lhs_text) if layout.measure == "width" else len(lhs_text)) - 3
    for i, step in enumerate(chain.steps):
        yield i, step, step_rows(step, layout, first_width if i == 0 else layout.width)
