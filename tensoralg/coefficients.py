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

import math
from functools import lru_cache

import sympy as sp

from tensoralg.errors import ExpansionTooLarge, TensorAlgError

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
    terms = expanded_size(coeff)  # counted before SymPy multiplies it out
    if terms > MAX_COEFFICIENT_TERMS:
        raise ExpansionTooLarge(f"a coefficient here multiplies out to {terms:,} terms, more than the "
                                f"{MAX_COEFFICIENT_TERMS:,} a coefficient may have: {_short(coeff)}")
    return sp.expand(coeff)


def _short(coeff: sp.Expr, limit: int = 80) -> str:
    text = str(coeff)
    return text if len(text) <= limit else text[:limit] + "…"


def canonical_coeff(coeff: sp.Expr) -> sp.Expr:
    """One form per value for the coefficients we meet: numbers and symbols as they are,
    anything else multiplied out (``-(1 + √2)/√d`` and ``-1/√d - √2/√d`` agree), so equal
    sums built in different orders compare and hash equal."""
    if coeff.is_Atom:
        return coeff
    return _expanded(coeff)


NON_FINITE = (sp.zoo, sp.oo, -sp.oo, sp.nan)

#: Terms a coefficient may multiply out to (:func:`expanded_size`; SymPy takes 2–4 ms a term of a large
#: power, and printing its digits as much again): ``(d_model + d_head)**299`` has 300 (0.7 s to expand and
#: print), ``(2 + d_vocab)**-871`` 872 (3.3 s; over 30 s on a busy machine) and
#: ``(d_model + d_head + d_vocab + d_mlp + n_ctx)**40`` 135,751: both refused before SymPy expands them.
MAX_COEFFICIENT_TERMS = 300


def expanded_size(coeff: sp.Expr) -> int:
    """The terms ``sp.expand(coeff)`` may make, counted on the expression without expanding it: a sum
    adds its parts' counts, a product multiplies them, a power of something of k terms to an integer
    n makes C(|n| + k - 1, k - 1) (a negative power expands its denominator as much).

    >>> d = sp.symbols("a b c d e")
    >>> expanded_size(sum(d) ** 40), expanded_size((d[0] + d[1]) * (d[2] + d[3]))
    (135751, 4)
    """
    if coeff.is_Atom:
        return 1
    if coeff.is_Add:
        return sum(expanded_size(a) for a in coeff.args)
    if coeff.is_Pow:
        base, exponent = coeff.args
        k = expanded_size(base)
        if k > 1 and exponent.is_Integer:
            return math.comb(abs(int(exponent)) + k - 1, k - 1)
        return k
    size = 1
    for a in coeff.args:  # a product (or a function of its arguments)
        size *= expanded_size(a)
    return size


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
