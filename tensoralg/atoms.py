"""Atoms: named matrices with symbolic shapes, and the words (products) made of them.

An :class:`Atom` is immutable and hashable; its transpose is another atom (or itself,
for symmetric atoms such as a layer-norm scale). A *word* is a tuple of atoms read as
their matrix product, left to right; the empty word ``()`` is the identity ``Id``.

>>> A = atom("A", "h1"); W = atom("W_OV", "h1")
>>> A.shape
(n_ctx, n_ctx)
>>> W.T.T == W
True
>>> word_shape((atom("W_U"), W, atom("W_E")))
(d_vocab, d_vocab)
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Mapping

import sympy as sp

from tensoralg.errors import ShapeMismatch, TensorAlgError, UnknownAtom
from tensoralg.escape import control_characters, terminal_safe

#: A product of atoms, left to right; the empty word is ``Id``.
Word = tuple["Atom", ...]

# Fixed axis names (STYLE.md): the symbolic dimensions every standard atom uses.
#: A symbolic dimension (positive integer) of the standard atoms' shapes: the context, the residual stream, a
#: head, the vocabulary, the MLP.
n_ctx, d_model, d_head, d_vocab, d_mlp = sp.symbols("n_ctx d_model d_head d_vocab d_mlp", positive=True, integer=True)
#: The symbolic dimensions by name (``"d_model"``: :data:`d_model`).
DIMS: dict[str, sp.Symbol] = {s.name: s for s in (n_ctx, d_model, d_head, d_vocab, d_mlp)}
ONE = sp.Integer(1)


class Atom:
    """A named matrix ``name^{index}`` of shape ``rows × cols``; ``transposed`` flips it.

    ``symmetric`` atoms (diagonal scales, for instance) are their own transpose.
    """

    __slots__ = ("name", "index", "rows", "cols", "transposed", "symmetric", "key", "_hash", "_T")

    def __init__(self, name: str, rows, cols, index: str = "", transposed: bool = False, symmetric: bool = False):
        if not isinstance(name, str) or not name:
            raise ValueError(f"an atom needs a non-empty name, got {name!r}")
        _check_label(name, str(index))
        rows, cols = sp.sympify(rows), sp.sympify(cols)
        if symmetric and rows != cols:
            raise ShapeMismatch(f"symmetric atom {name!r} must be square, got {rows} x {cols}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "index", str(index))
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "cols", cols)
        object.__setattr__(self, "transposed", bool(transposed) and not symmetric)
        object.__setattr__(self, "symmetric", bool(symmetric))
        object.__setattr__(self, "key", (name, self.index, self.transposed))
        object.__setattr__(self, "_hash", hash(self.key))
        object.__setattr__(self, "_T", None)  # the transpose, made once (an atom costs SymPy work)

    def __setattr__(self, name, value):
        raise AttributeError("Atom is immutable")

    @property
    def shape(self) -> tuple[sp.Expr, sp.Expr]:
        """``(rows, cols)`` of the matrix this atom stands for (after any transpose)."""
        return (self.cols, self.rows) if self.transposed else (self.rows, self.cols)

    @property
    def base(self) -> "Atom":
        """The untransposed atom."""
        return self.T if self.transposed else self

    @property
    def label(self) -> str:
        """The binding key of the untransposed atom: ``'W_OV^{h1}'``, or ``'W_E'``."""
        return f"{self.name}^{{{self.index}}}" if self.index else self.name

    @property
    def T(self) -> "Atom":
        """The transpose: ``(Wᵀ)ᵀ = W``; a symmetric atom is its own transpose."""
        if self.symmetric:
            return self
        if self._T is None:
            t = Atom(self.name, self.rows, self.cols, self.index, not self.transposed, False)
            object.__setattr__(t, "_T", self)
            object.__setattr__(self, "_T", t)
        return self._T

    def with_index(self, index: str) -> "Atom":
        return Atom(self.name, self.rows, self.cols, index, self.transposed, self.symmetric)

    def to_sympy(self) -> sp.MatrixExpr:
        symbol = sp.MatrixSymbol(self.label, self.rows, self.cols)
        return symbol.T if self.transposed else symbol

    def __eq__(self, other) -> bool:
        return isinstance(other, Atom) and self.key == other.key

    def __hash__(self) -> int:
        return self._hash

    def __lt__(self, other: "Atom") -> bool:
        return (self.name, natural_key(self.index), self.transposed) < (other.name, natural_key(other.index), other.transposed)

    def __repr__(self) -> str:
        return self.label + ("ᵀ" if self.transposed else "")

    def __reduce__(self):
        return (Atom, (self.name, self.rows, self.cols, self.index, self.transposed, self.symmetric))


def _check_label(name: str, index: str) -> None:
    """Refuse a name or index that would print what it does not say: control characters
    (escape sequences, bidirectional overrides, line breaks) or a digit run longer than
    :data:`MAX_INDEX_DIGITS` (printers renumber layers, and Python converts at most 4,300 digits)."""
    for what, text in (("name", name), ("index", index)):
        if controls := control_characters(text):
            raise TensorAlgError(f"an atom's {what} must be printable text; {terminal_safe(repr(text))} holds "
                                 f"the control character {controls[0]}")
    if _LONG_DIGITS.search(index):
        raise TensorAlgError(f"an atom's index has numbers of at most {MAX_INDEX_DIGITS} digits; "
                             f"{terminal_safe(repr(index[:20]))}… has a longer one")


MAX_INDEX_DIGITS = 100  # as a number literal (tensoralg.lexer.MAX_DIGITS)
_LONG_DIGITS = re.compile(f"[0-9]{{{MAX_INDEX_DIGITS + 1}}}")

# The paper's atoms and their shapes (column-vector convention).
STANDARD_SHAPES: dict[str, tuple[sp.Expr, sp.Expr, bool]] = {
    "A": (n_ctx, n_ctx, False),  # attention pattern: A[i, j] = query i attends to key j
    "N": (n_ctx, n_ctx, True),  # frozen layer-norm scale: diagonal, one entry per position
    "B_ALiBi": (n_ctx, n_ctx, False),  # a head's ALiBi bias m_h (j - i): a fixed position-only term of its scores
    "W_E": (d_model, d_vocab, False),
    "W_U": (d_vocab, d_model, False),
    "W_pos": (d_model, n_ctx, False),
    "W_Q": (d_head, d_model, False),
    "W_K": (d_head, d_model, False),
    "W_V": (d_head, d_model, False),
    "W_O": (d_model, d_head, False),
    "W_OV": (d_model, d_model, False),
    "W_QK": (d_model, d_model, False),
    "W_in": (d_mlp, d_model, False),
    "W_out": (d_model, d_mlp, False),
    "b_Q": (d_head, ONE, False),
    "b_K": (d_head, ONE, False),
    "b_Qn": (d_head, ONE, False),  # the bias of a q/k layer norm (Persimmon), added after its frozen scale
    "b_Kn": (d_head, ONE, False),
    "b_V": (d_head, ONE, False),
    "b_O": (d_model, ONE, False),
    "b_U": (d_vocab, ONE, False),
}


def atom(name: str, index: str | int = "", shapes: Mapping[str, tuple] | None = None) -> Atom:
    """A standard atom of the paper by name, e.g. ``atom("W_OV", "h1")``.

    ``shapes`` adds or overrides names: ``{"V": (d_model, k)}`` or
    ``{"D": (n_ctx, n_ctx, True)}`` (a third entry marks the atom symmetric).
    """
    table = STANDARD_SHAPES if shapes is None else {**STANDARD_SHAPES, **shapes}
    try:
        spec = table[name]
    except KeyError:
        known = ", ".join(sorted(table))
        raise UnknownAtom(f"unknown atom {name!r}; known atoms: {known}") from None
    rows, cols, *rest = spec
    return Atom(name, rows, cols, str(index), symmetric=bool(rest and rest[0]))


def word_shape(word: Word) -> tuple[sp.Expr, sp.Expr] | None:
    """The shape of a product of atoms; ``None`` for the empty word ``Id`` (any square size).

    Raises :class:`ShapeMismatch` naming both shapes when neighbours do not chain.
    """
    if not word:
        return None
    for left, right in zip(word, word[1:]):
        if left.shape[1] != right.shape[0]:
            raise ShapeMismatch(
                f"cannot multiply {left!r} ({_fmt(left.shape)}) by {right!r} ({_fmt(right.shape)}): "
                f"{left.shape[1]} columns against {right.shape[0]} rows",
                dims=[(left.shape[1], right.shape[0])],
            )
    return word[0].shape[0], word[-1].shape[1]


def transpose_word(word: Word) -> Word:
    """``(F_1 F_2 … F_n)ᵀ = F_nᵀ … F_2ᵀ F_1ᵀ``."""
    return tuple(a.T for a in reversed(word))


@lru_cache(maxsize=1 << 16)
def word_key(word: Word) -> str:
    """The sort key of a word: one string, so that sorting compares in C (and is cached,
    since canonical ordering sorts the same words often)."""
    return "\x01".join(f"{a.name}\x00{natural_key(a.index)}\x00{int(a.transposed)}" for a in word)


_DIGITS = re.compile(r"\d+", re.ASCII)


def natural_key(index: str) -> str:
    """A string that sorts indices as people count: ``h2`` before ``h10``, ``L0H2`` before ``L0H10``
    (digit runs zero-padded; the index itself breaks ties, so ``h02`` and ``h2`` stay distinct).

    >>> sorted(["L0H10", "L0H2", "L1H0"], key=natural_key)
    ['L0H2', 'L0H10', 'L1H0']
    """
    return _DIGITS.sub(lambda m: m.group().zfill(12), index) + "\x03" + index


def _fmt(shape) -> str:
    return "Id" if shape is None else f"{shape[0]} x {shape[1]}"


def format_shape(shape) -> str:
    """``'n_ctx x d_model'``, or ``'Id'`` for the identity's open shape."""
    return _fmt(shape)


def atoms_of(words: Iterable[Word]) -> set[Atom]:
    return {a.base for w in words for a in w}
