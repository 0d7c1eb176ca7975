"""Conversion of canonical sums to SymPy matrix expressions (SymPy is the oracle in tests).

Works on any object with ``n_slots``, ``slot_shapes`` and an iteration of terms, so this
module imports nothing from :mod:`tensoralg.expr`.
"""

from __future__ import annotations

from typing import Mapping

import sympy as sp


def sympy_of_word(word, size) -> sp.MatrixExpr:
    if not word:
        return sp.Identity(size)
    if len(word) == 1:
        return word[0].to_sympy()
    return sp.MatMul(*[a.to_sympy() for a in word])


def sympy_of_sum(expr, dims: Mapping[int, object] | None = None):
    """``Σ c · KroneckerProduct(F_1, …, F_k)`` (a plain matrix product when ``k == 1``).

    ``dims`` gives the size of slots that hold only ``Id`` (slot index -> size); the
    default is a symbol ``n_<slot>``.
    """
    dims = dict(dims or {})
    sizes = []
    for i, shape in enumerate(expr.slot_shapes):
        sizes.append(shape[0] if shape is not None else sp.sympify(dims.get(i, sp.Symbol(f"n_{i}", positive=True, integer=True))))
    terms = []
    for t in expr:
        slots = [sympy_of_word(w, sizes[i]) for i, w in enumerate(t.words)]
        body = slots[0] if len(slots) == 1 else sp.KroneckerProduct(*slots)
        terms.append(body if t.coeff == 1 else sp.MatMul(t.coeff, body))
    if not terms:
        rows = cols = sp.Integer(1)
        for i, shape in enumerate(expr.slot_shapes):
            r, c = shape if shape is not None else (sizes[i], sizes[i])
            rows, cols = rows * r, cols * c
        return sp.ZeroMatrix(rows, cols)
    return terms[0] if len(terms) == 1 else sp.MatAdd(*terms)
