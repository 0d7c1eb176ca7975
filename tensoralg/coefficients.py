"""Coefficients of tensor terms: SymPy scalars, one canonical form per value.

A term's coefficient is a SymPy scalar (``2``, ``-1/sqrt(d_head)``). These helpers
turn user input into one (:func:`as_coeff`), refuse what is not finite, multiply without
SymPy's work for the common factor 1, and bring each coefficient to one form per value
so that equal sums built in different orders compare and hash equal.

>>> as_coeff(2) * as_coeff(sp.Rational(1, 2))
1
>>> canonical_coeff(-(1 + sp.sqrt(2)) / sp.Symbol("d"))
-sqrt(2)/d - 1/d
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

from tensoralg.errors import TensorAlgError

ONE, ZERO = sp.S.One, sp.S.Zero


def mul(a: sp.Expr, b: sp.Expr) -> sp.Expr:
    """Multiply coefficients, skipping SymPy's work for the common factor 1."""
    if a is ONE:
        return b
    if b is ONE:
        return a
    return a * b


@lru_cache(maxsize=4096)
def _expanded(coeff: sp.Expr) -> sp.Expr:
    return sp.expand(coeff)


def canonical_coeff(coeff: sp.Expr) -> sp.Expr:
    """One form per value for the coefficients we meet: numbers and symbols as they are,
    anything else multiplied out (``-(1 + √2)/√d`` and ``-1/√d - √2/√d`` agree), so equal
    sums built in different orders compare and hash equal."""
    if coeff.is_Atom:
        return coeff
    return _expanded(coeff)


NON_FINITE = (sp.zoo, sp.oo, -sp.oo, sp.nan)


def check_finite(coeff: sp.Expr) -> sp.Expr:
    """Refuse a coefficient that is or contains ``zoo``, ``±oo`` or ``nan`` (a division by
    zero, ``0**-1``, an overflowed float): no term may carry a non-finite scale.

    >>> check_finite(sp.Rational(1, 2))
    1/2
    """
    if coeff.has(*NON_FINITE):
        raise TensorAlgError(f"a coefficient must be finite, got {coeff} (a division by zero or an overflow?)")
    return coeff


def as_coeff(value) -> sp.Expr:
    try:
        coeff = sp.sympify(value, strict=True)
    except (sp.SympifyError, TypeError):
        raise TensorAlgError(f"a coefficient must be a number or SymPy scalar, got {value!r}") from None
    if isinstance(coeff, sp.MatrixBase) or getattr(coeff, "is_Matrix", False):
        raise TensorAlgError(f"a coefficient must be a scalar, got the matrix {value!r}")
    return check_finite(coeff)


def nonzero_terms(terms: dict) -> dict:
    """The terms with canonical, non-zero coefficients (each distinct coefficient is
    canonicalised once: a big sum usually repeats a handful of them)."""
    out = {}
    canonical: dict = {}
    for w, c in terms.items():
        if c is not ONE:
            c2 = canonical.get(c)
            if c2 is None:
                c2 = canonical[c] = canonical_coeff(c)
                if c2 == 0:
                    c2 = canonical[c] = ZERO
            if c2 is ZERO:
                continue
            c = c2
        out[w] = c
    return out
