"""What a name in a text may stand for besides one matrix: juxtaposed atoms, or a nonlinear function.

The slides write products without spaces, ``(AC) ⊗ (BD)``; an undeclared name that is the
names of atoms of the same expression run together is read as their product, and the reader
says so (a note in :class:`tensoralg.reading.Reading`, a :class:`ReadingNote` warning from
:func:`tensoralg.parse.parse`). A nonlinear function applied to an operator (``softmax(…)``,
``exp(…)``, ``LN(…)``) has no place in the algebra of tensor products: it is refused, unless
the caller asks for it as an opaque matrix.

>>> split_name("AC", {"A", "B", "C", "D"})
('A', 'C')
>>> split_name("W_UW_E", {"W_U", "W_E"}), split_name("AX", {"A"})
(('W_U', 'W_E'), None)
"""

from __future__ import annotations

from functools import lru_cache

from tensoralg.errors import ReadingNote  # noqa: F401 (the warning the notes are given with)

MAX_SPLIT = 64  # characters of a name that may be read as atoms run together
NONLINEAR = frozenset(
    "softmax softmax_ exp log ln LN LayerNorm layernorm layer_norm RMSNorm rmsnorm ReLU relu GELU gelu sigmoid tanh "
    "max min argmax sin cos".split()
)
NONLINEAR_HINT = ("is not linear, so it is no operator of the algebra: write the attention pattern as A^h "
                  "(an atom), or read it as an opaque matrix (parse(..., opaque=True); tcircuits expand or check --opaque)")


def split_name(name: str, known) -> tuple[str, ...] | None:
    """``name`` as two or more names of ``known`` run together (the fewest pieces), or ``None``;
    names longer than :data:`MAX_SPLIT` are not split (the search recurses once per character).
    Each prefix is looked up in ``known`` (a set), so a sum of thousands of names splits fast."""
    if len(name) > MAX_SPLIT:
        return None
    known = known if isinstance(known, (set, frozenset)) else frozenset(known)

    @lru_cache(maxsize=None)
    def best(start: int) -> tuple[str, ...] | None:
        if start == len(name):
            return ()
        options = []
        for end in range(start + 1, len(name) + 1):
            k = name[start:end]
            if k != name and k in known and (rest := best(end)) is not None:
                options.append((k,) + rest)
        return min(options, key=len) if options else None

    pieces = best(0)
    return pieces if pieces and len(pieces) > 1 else None


def juxtaposed_note(name: str, pieces: tuple[str, ...]) -> str:
    """What the reader says when it reads ``AC`` as ``A C``."""
    return (f"{name} is read as the product {' '.join(pieces)} (its letters are atoms of the expression); "
            f"declare {name} to mean one matrix")
