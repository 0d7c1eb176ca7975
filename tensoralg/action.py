"""An operator on the residual stream applied to an activation: ``(P ⊗ W)·x = P x Wᵀ``.

The paper's operators ``P ⊗ W`` act on an activation ``x`` that holds one token per row
(shape ``n_ctx × d``): ``P`` mixes the rows (positions) and ``W`` maps each row's vector,
which for row vectors is a right product by ``Wᵀ``. The result is a one-slot expression,
a plain matrix product.

>>> from tensoralg import Atom, atom, d_model, n_ctx, term
>>> x = Atom("x", n_ctx, d_model)
>>> act(term(atom("A", "h"), (atom("W_O", "h"), atom("W_V", "h"))), term(x))
TensorSum(A^{h} x W_V^{h}ᵀ W_O^{h}ᵀ)
"""

from __future__ import annotations

from tensoralg.atoms import format_shape, transpose_word, word_shape
from tensoralg.errors import ShapeMismatch, SlotMismatch
from tensoralg.coefficients import mul
from tensoralg.expr import Expr, TensorSum

__all__ = ["act", "transposed_products"]


def act(operator: Expr, activation: Expr) -> TensorSum:
    """``(P ⊗ W)·X = P X Wᵀ`` term by term, for a 2-slot ``operator`` and a 1-slot ``activation``.

    Raises :class:`SlotMismatch` for other slot counts and :class:`ShapeMismatch` (naming
    both shapes) when ``P`` or ``W`` does not fit the activation's rows or columns.
    """
    if operator.n_slots != 2:
        raise SlotMismatch(
            f"an operator applied to an activation has 2 slots (positions ⊗ residual), got {operator.n_slots}")
    if activation.n_slots != 1:
        raise SlotMismatch(f"an activation is a 1-slot matrix (one token per row), got {activation.n_slots} slots")
    op, x = operator.expand(), activation.expand()
    position, residual = op.slot_shapes
    (shape,) = x.slot_shapes
    if shape is not None:
        _fits(position, shape[0], "positions", "rows", shape)
        _fits(residual, shape[1], "residual", "columns", shape)
    out: dict = {}
    for t in op:
        p, w = t.words
        for u in x:
            words = (p + u.words[0] + transpose_word(w),)
            word_shape(words[0])
            out[words] = out.get(words, 0) + mul(t.coeff, u.coeff)
    return TensorSum(out, n_slots=1)


def _fits(slot_shape, dim, slot: str, side: str, shape) -> None:
    if slot_shape is not None and slot_shape[1] != dim:
        raise ShapeMismatch(
            f"the operator's {slot} slot ({format_shape(slot_shape)}) cannot act on an activation with "
            f"{dim} {side} ({format_shape(shape)}): (P ⊗ W)·x = P x Wᵀ needs P's columns = x's rows "
            "and W's columns = x's columns",
            dims=[(slot_shape[1], dim)],
        )


def transposed_products(operator: Expr) -> list[tuple]:
    """The words of more than one atom that :func:`act` transposes (``(W_O W_V)ᵀ = W_Vᵀ W_Oᵀ``).

    >>> from tensoralg import atom, term
    >>> transposed_products(term(atom("A"), (atom("W_O"), atom("W_V"))))
    [(W_O, W_V)]
    """
    words = []
    for t in operator.expand():
        if len(t.words[1]) > 1 and t.words[1] not in words:
            words.append(t.words[1])
    return words
