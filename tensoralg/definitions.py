"""Derived names that a derivation step can fold or unfold.

``W_OV := W_O W_V`` and ``W_QK := W_Qᵀ W_K`` hold for every head: a definition matches
atoms that share an index (``W_O^{h1} W_V^{h1}`` folds to ``W_OV^{h1}``), and transposes
fold too (``W_Vᵀ W_Oᵀ`` folds to ``W_OVᵀ``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tensoralg.atoms import Atom, Word, atom, transpose_word, word_shape
from tensoralg.expr import Expr, TensorSum, Term


@dataclass(frozen=True)
class Definition:
    """``name := part_1 part_2 …`` for any shared index; a part is ``(atom name, transposed)``.

    >>> W_OV.word("h")
    (W_O^{h}, W_V^{h})
    """

    name: str
    parts: tuple[tuple[str, bool], ...]
    shapes: tuple = ()

    def word(self, index: str = "") -> Word:
        """The right-hand side for one index, e.g. ``(W_Qᵀ, W_K)``."""
        table = dict(self.shapes) if self.shapes else None
        return tuple(atom(n, index, table).T if t else atom(n, index, table) for n, t in self.parts)

    def atom(self, index: str = "") -> Atom:
        """The left-hand side for one index, with the shape of its right-hand side."""
        rows, cols = word_shape(self.word(index))
        return Atom(self.name, rows, cols, index)

    @property
    def text(self) -> str:
        rhs = " ".join(n + ("ᵀ" if t else "") for n, t in self.parts)
        return f"{self.name} := {rhs}"


#: The OV circuit of a head, ``W_OV := W_O W_V``.
W_OV = Definition("W_OV", (("W_O", False), ("W_V", False)))
#: The QK circuit of a head, ``W_QK := W_Qᵀ W_K``.
W_QK = Definition("W_QK", (("W_Q", True), ("W_K", False)))
#: The paper's two definitions by name, what :func:`fold` and :func:`unfold` use by default.
STANDARD_DEFINITIONS = {d.name: d for d in (W_OV, W_QK)}


def _fold_word(word: Word, d: Definition) -> Word:
    names = [n for n, _ in d.parts]
    k = len(names)
    out: list[Atom] = []
    i = 0
    while i < len(word):
        window = word[i : i + k]
        if len(window) == k and len({a.index for a in window}) == 1:
            index = window[0].index
            if window == d.word(index):
                out.append(d.atom(index))
                i += k
                continue
            if window == transpose_word(d.word(index)):
                out.append(d.atom(index).T)
                i += k
                continue
        out.append(word[i])
        i += 1
    return tuple(out)


def _unfold_word(word: Word, d: Definition) -> Word:
    out: list[Atom] = []
    for a in word:
        if a.name == d.name:
            rhs = d.word(a.index)
            out.extend(transpose_word(rhs) if a.transposed else rhs)
        else:
            out.append(a)
    return tuple(out)


def _map_words(expr: Expr, fn) -> TensorSum:
    s = expr.expand()
    # a list, not a dict: two terms that fold to the same words must add up
    return TensorSum([Term(t.coeff, tuple(fn(w) for w in t.words)) for t in s], n_slots=s.n_slots)


def fold(expr: Expr, definition: Definition) -> TensorSum:
    """Replace every occurrence of the definition's right-hand side by its name.

    >>> from tensoralg import term
    >>> fold(term((atom("W_U"), atom("W_O", 1), atom("W_V", 1))), W_OV)
    TensorSum(W_U W_OV^{1})
    """
    return _map_words(expr, lambda w: _fold_word(w, definition))


def unfold(expr: Expr, definition: Definition) -> TensorSum:
    """Replace every atom named by the definition with its right-hand side.

    >>> from tensoralg import term
    >>> unfold(term(atom("W_QK", 1)), W_QK)
    TensorSum(W_Q^{1}ᵀ W_K^{1})
    """
    return _map_words(expr, lambda w: _unfold_word(w, definition))
