"""The bilinear sandwich ``Lᵀ M R`` of two expanded residual streams.

Attention scores are a bilinear form of two residual streams. With the query-side
stream ``L = Σ P ⊗ W_p`` and the key-side stream ``R = Σ Q ⊗ W_q`` (2-slot sums acting
on the same input ``x``), the scores ``S = (L·x) M (R·x)ᵀ`` expand into 3-slot terms

    P ⊗ Q ⊗ (W_pᵀ M W_q),   acting as   S = P x (W_pᵀ M W_q) xᵀ Qᵀ.
"""

from __future__ import annotations

from tensoralg.atoms import Atom, format_shape, transpose_word
from tensoralg.errors import ShapeMismatch, SlotMismatch
from tensoralg.coefficients import mul
from tensoralg.expr import Expr, TensorSum, term
from tensoralg.slots import as_word, chain_shapes


def sandwich(left: Expr, middle, right: Expr) -> TensorSum:
    """``Σ_{P⊗W_p ∈ L} Σ_{Q⊗W_q ∈ R} P ⊗ Q ⊗ (W_pᵀ M W_q)``.

    ``middle`` is an atom, a word, or a 1-slot sum (e.g. ``W_QK``). Lazy sides are
    expanded first; to truncate by order, expand each side with ``max_order`` before
    (``derivations.expand_qk`` truncates by the summed orders of the two sides).

    >>> from tensoralg import atom, identity, term
    >>> x = identity(2) + term(atom("A", 1), atom("W_OV", 1))
    >>> stream = x @ term(None, atom("W_E"))
    >>> len(sandwich(stream, atom("W_QK", 2), stream))
    4
    """
    if isinstance(middle, Expr):
        mid = middle.expand()
    else:
        mid = term(as_word(middle) if not isinstance(middle, Atom) else middle)
    if mid.n_slots != 1:
        raise SlotMismatch(f"the middle of a sandwich is a matrix (1 slot), got {mid.n_slots} slots")
    lsum, rsum = left.expand(), right.expand()
    for name, side in (("left", lsum), ("right", rsum)):
        if side.n_slots != 2:
            raise SlotMismatch(f"the {name} side of a sandwich must have 2 slots (position ⊗ residual), got {side.n_slots}")
    # Shapes: W_pᵀ (cols_p x rows_p) · M · W_q must chain.
    lshape, rshape = lsum.slot_shapes[1], rsum.slot_shapes[1]
    lt = None if lshape is None else (lshape[1], lshape[0])
    try:
        chain_shapes(chain_shapes(lt, mid.slot_shapes[0], 0), rshape, 0)
    except ShapeMismatch:
        raise ShapeMismatch(
            "cannot sandwich: left residual side transposed is "
            f"{format_shape(lt)}, middle is {format_shape(mid.slot_shapes[0])}, right residual side is {format_shape(rshape)}"
        ) from None
    out: dict = {}
    mterms = [(t.words[0], t.coeff) for t in mid]
    rterms = [(t.words, t.coeff) for t in rsum]
    for lt_ in lsum:
        p, wp = lt_.words
        wpt = transpose_word(wp)
        for (q, wq), rc in rterms:
            c = mul(lt_.coeff, rc)
            for m, mc in mterms:
                key = (p, q, wpt + m + wq)
                value = mul(c, mc)
                prev = out.get(key)
                out[key] = value if prev is None else prev + value
    shape3 = chain_shapes(chain_shapes(lt, mid.slot_shapes[0], 2), rshape, 2)
    return TensorSum.from_canonical(out, 3, (lsum.slot_shapes[0], rsum.slot_shapes[0], shape3))
