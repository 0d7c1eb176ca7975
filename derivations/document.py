r"""The data a derivation's documents are made of: formulae, prose, summed indices, pieces.

- :func:`math` — the normal way to write a formula in prose: slide notation, printed to
  LaTeX *and* text by the tensoralg printer (:func:`tensoralg.formula.formula`), so the
  two cannot disagree; layer numbers follow the document's ``index_from``.
  Signature: ``math(source: str) -> Math``.
- :class:`Math` — a formula as ``(latex, text)``; ``Math(latex, text)`` by hand only for what
  the notation cannot say (a ``bmatrix``).
- :func:`prose` — a paragraph: strings (user text, escaped on output), :class:`Math`,
  expressions and :class:`Numbered` (prose that depends on the layer numbering).
- :class:`SumIndex` — a head index summed over, ``Σ_{h∈H_1}``.
- :class:`Piece` — a fragment of a laid-out expression; lines break between pieces.

>>> m = math("e_hᵀ e_k ≠ 0")
>>> m.latex, m.text
('e_{h}^{\\top} e_{k} \\neq 0', 'e_hᵀ e_k ≠ 0')
>>> math("Σ_{h∈H_0} A^h").at(1).text
'Σ_{h∈H_1} A^h'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tensoralg import Expr
from tensoralg.formula import formula
from tensoralg.latex import TensorLatexPrinter

from derivations.errors import DerivationError


@dataclass(frozen=True)
class Math:
    """A formula: LaTeX (math mode, no delimiters) and Unicode text.

    Made by :func:`math` (then ``source`` holds the slide notation it came from, and
    :meth:`at` re-prints it with another layer numbering) or by hand for the rare case the
    notation cannot express.

    >>> Math(r"W_{OV}^{h}", "W_OV^h").text
    'W_OV^h'
    """

    latex: str
    text: str
    source: str | None = None
    from1: "Math | None" = None  # hand-built Math that names a layer: the same formula numbered from 1

    def __post_init__(self) -> None:
        if not isinstance(self.latex, str) or not isinstance(self.text, str):
            raise DerivationError(f"Math takes two strings (latex, text), got {self.latex!r}, {self.text!r}")

    def at(self, index_from: int = 0) -> "Math":
        """This formula with layers numbered from ``index_from`` (hand-built Math is unchanged
        unless it carries its ``from1`` form)."""
        if not index_from:
            return self
        if self.from1 is not None:
            return self.from1
        if self.source is None:
            return self
        f = formula(self.source, index_from)
        return Math(f.latex, f.text, self.source)


def math(source: str, fixed: bool = False) -> Math:
    r"""A formula in the slides' notation (see :mod:`tensoralg.formula`), as :class:`Math`.

    Its layer numbers follow the document's ``index_from``; ``fixed=True`` keeps them as
    written (for prose about the numbering itself).

    >>> math("W_OV^h := W_O^h W_V^h").latex
    'W_{OV}^{h} := W_{O}^{h} W_{V}^{h}'
    >>> math("H_0", fixed=True).at(1).text
    'H_0'
    """
    f = formula(source)
    return Math(f.latex, f.text, None if fixed else source)


@dataclass(frozen=True)
class Numbered:
    """Prose that depends on the layer numbering: ``from0`` for documents numbered from 0
    (TransformerLens), ``from1`` for the paper's numbering (``index_from=1``).

    >>> Numbered("layer 0 is the first", "layer 1 is the first").at(1)
    ('layer 1 is the first',)
    """

    from0: tuple
    from1: tuple

    def __post_init__(self) -> None:
        object.__setattr__(self, "from0", as_prose(self.from0))
        object.__setattr__(self, "from1", as_prose(self.from1))

    def at(self, index_from: int = 0) -> tuple:
        return self.from1 if index_from else self.from0


def resolve(segments, index_from: int = 0) -> tuple:
    """A paragraph with its :class:`Numbered` parts chosen for ``index_from``.

    >>> resolve(("a ", Numbered("b", "c")), 1)
    ('a ', 'c')
    """
    out: list = []
    for s in as_prose(segments):
        out.extend(s.at(index_from) if isinstance(s, Numbered) else (s,))
    return tuple(out)


def prose(*segments) -> tuple:
    """A paragraph: plain strings (escaped on output), :class:`Math`, expressions and
    :class:`Numbered` alternatives.

    >>> len(prose("the term ", math("A^h"), " of head 0"))
    3
    """
    for s in segments:
        if not isinstance(s, (str, Math, Expr, Numbered)):
            raise DerivationError(f"prose is made of strings, Math, expressions and Numbered, got {s!r}")
    return tuple(s for s in segments if s != "")


def as_prose(value) -> tuple:
    """A paragraph from a string, a :class:`Math`, an expression, or a sequence of them.

    >>> as_prose("plain words")
    ('plain words',)
    """
    if value is None or value == ():
        return ()
    if isinstance(value, (str, Math, Expr, Numbered)):
        return prose(value)
    return prose(*value)


@dataclass(frozen=True)
class SumIndex:
    r"""A head index summed over, as in the paper's ``Σ_{h ∈ H_1}``.

    Atoms carrying ``index`` stand for every head of a layer; a term that contains them is
    summed over those heads (within that term). ``over`` names the set of heads (a
    :class:`Math`, or slide notation such as ``"H_0"``).

    >>> SumIndex("h0", "H_0").latex(index_from=1)
    '\\sum_{h_1 \\in H_{1}}'
    """

    index: str
    over: Math

    def __post_init__(self) -> None:
        if isinstance(self.over, str) or (isinstance(self.over, Math) and self.over.source is None
                                          and re.fullmatch(r"H_\{?\d+\}?", self.over.text)):
            object.__setattr__(self, "over", math(getattr(self.over, "text", self.over)))  # H_l follows index_from
        if not isinstance(self.over, Math):
            raise DerivationError(f"a SumIndex is over a Math or a formula string, got {self.over!r}")

    def latex(self, index_from: int = 0) -> str:
        printer = TensorLatexPrinter(index_from=index_from)
        return rf"\sum_{{{printer.index(self.index)} \in {self.over.at(index_from).latex}}}"

    def text(self, index_from: int = 0) -> str:
        printer = TensorLatexPrinter(index_from=index_from)
        return f"Σ_{{{printer.index_text(self.index)}∈{self.over.at(index_from).text}}}"


@dataclass(frozen=True)
class Piece:
    """A fragment of a laid-out expression; a line may break before any piece.

    ``starts``: the piece begins a summand (a long sum puts each summand on its own line);
    otherwise it continues one (the next factor of a product).
    """

    latex: str
    text: str
    starts: bool = True

    @property
    def width(self) -> float:
        return text_width(self.text)


def text_width(text: str) -> float:
    """Rough printed width in characters: scripts count 0.6, braces and markers nothing.

    >>> text_width("W_OV^h")
    3.2
    """
    width, script, depth = 0.0, 0, 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "^_" and i + 1 < len(text):
            script += 1
            if text[i + 1] == "{":
                depth = script
                i += 2
                continue
            width += 0.6
            script -= 1
            i += 2
            continue
        if ch == "}" and depth and script:
            script -= 1
            depth = script
        elif ch not in "{}":
            width += (0.6 if script else 1.0) * (0.5 if ch == " " else 1.0)
        i += 1
    return width
