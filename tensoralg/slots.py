"""The slots of a tensor term: their words, shapes and text.

A term ``c · F_1 ⊗ … ⊗ F_k`` has one word (a product of atoms; ``()`` is ``Id``) per
slot. Here are the word-level pieces the sums are built from: reading a slot as a word,
the canonical order of terms, the slot-by-slot word join of a product, the one shape
check of terms added or multiplied together. (Their text is the printer's:
:meth:`tensoralg.latex.TensorLatexPrinter.text`.)

>>> from tensoralg.atoms import atom
>>> as_word(atom("A", 1)), as_word(None)
((A^{1},), ())
"""

from __future__ import annotations

from typing import Iterable, Sequence, Union


from tensoralg.atoms import Atom, Word, format_shape, word_key
from tensoralg.errors import ShapeMismatch, TensorAlgError

Slot = Union[Atom, Word, None]
Shape = Union[tuple, None]


def as_word(slot: Slot) -> Word:
    """An atom, a sequence of atoms, or ``None``/``()`` (identity) as a word."""
    if slot is None:
        return ()
    if isinstance(slot, Atom):
        return (slot,)
    word = tuple(slot)
    for a in word:
        if not isinstance(a, Atom):
            raise TensorAlgError(f"a word is a sequence of atoms; got {a!r} in {slot!r}")
    return word


def sort_key(words: tuple[Word, ...]) -> str:
    """Canonical order: fewer atoms first, then by atom names, indices and transposes.

    One string per term (the atom count zero-padded, then the words' keys), so that
    sorting tens of thousands of terms compares in C.
    """
    return f"{sum(map(len, words)):06d}\x02" + "\x02".join([word_key(w) for w in words])


def join_words(left: tuple[Word, ...], right: tuple[Word, ...]) -> tuple[Word, ...]:
    """The words of ``(A⊗B)(C⊗D) = (AC)⊗(BD)``: slot by slot, the left word then the right.

    >>> from tensoralg.atoms import atom
    >>> join_words(((atom("A", 1),), ()), ((atom("A", 2),), (atom("W_E"),)))
    ((A^{1}, A^{2}), (W_E,))
    """
    return tuple([a + b for a, b in zip(left, right)])


def unify_shape(slot: int, known: Shape, shape: Shape) -> Shape:
    """The shape of slot ``slot`` of a sum whose terms so far have the shape ``known`` once a
    term of shape ``shape`` joins them (``None``: no term with a fixed shape yet, or ``Id``).

    Raises :class:`ShapeMismatch` naming both shapes when they differ:

    >>> from tensoralg.atoms import d_model, d_vocab
    >>> unify_shape(0, None, (d_model, d_vocab))
    (d_model, d_vocab)
    >>> unify_shape(1, (d_vocab, d_model), (d_model, d_vocab))
    Traceback (most recent call last):
    ...
    tensoralg.errors.ShapeMismatch: slot 1: cannot add d_model x d_vocab terms to d_vocab x d_model terms
    """
    if shape is None or shape == known:
        return known
    if known is None:
        return shape
    raise ShapeMismatch(
        f"slot {slot}: cannot add {format_shape(shape)} terms to {format_shape(known)} terms",
        dims=list(zip(shape, known)),
    )


def unify_slot_shapes(known: Sequence[Shape], shapes: Sequence[Shape]) -> tuple[Shape, ...]:
    """The slot shapes of a sum of two parts with slot shapes ``known`` and ``shapes``
    (:func:`unify_shape` slot by slot): the one check that terms added together agree. A
    mismatch names the first slot that disagrees and carries the pairs of every slot, so that
    shape inference solves them all at once."""
    unified, errors = [], []
    for i, (k, s) in enumerate(zip(known, shapes)):
        try:
            unified.append(unify_shape(i, k, s))
        except ShapeMismatch as err:
            errors.append(err)
    if errors:
        raise ShapeMismatch(str(errors[0]), dims=[pair for err in errors for pair in err.dims])
    return tuple(unified)


def check_identity_slots(shapes: Sequence[Shape], words_list: Iterable[tuple[Word, ...]]) -> None:
    """``Id`` is square: it cannot share a slot with rectangular terms."""
    rectangular = [i for i, s in enumerate(shapes) if s is not None and s[0] != s[1]]
    if not rectangular:
        return
    for words in words_list:
        for i in rectangular:
            if not words[i]:
                raise ShapeMismatch(f"slot {i}: Id (square) cannot be added to {format_shape(shapes[i])} terms",
                                    dims=[shapes[i]])


def chain_shapes(left: Shape, right: Shape, slot: int) -> Shape:
    """The shape of a slot of ``left · right``; ``None`` (Id) passes the other through."""
    if left is None:
        return right
    if right is None:
        return left
    if left[1] != right[0]:
        raise ShapeMismatch(
            f"slot {slot}: cannot multiply {format_shape(left)} by {format_shape(right)}: "
            f"{left[1]} columns against {right[0]} rows",
            dims=[(left[1], right[0])],
        )
    return (left[0], right[1])
