"""An expression's parts read without expanding it: the indices and words its factors carry,
identity factors, a factor placed on some of a product's slots (the reader's helpers)."""

from __future__ import annotations

from typing import Iterable

from tensoralg.atoms import Word
from tensoralg.expr import Add, Expr, Product, TensorSum


def _in_slots(factor: TensorSum, offset: int, n_slots: int) -> TensorSum:
    """``factor`` placed at slots ``offset…`` of ``n_slots``, with ``Id`` in the others."""
    before, after = ((),) * offset, ((),) * (n_slots - offset - factor.n_slots)
    return TensorSum({before + t.words + after: t.coeff for t in factor}, n_slots)


def _indices(expr) -> set[str]:
    """The indices an expression's terms carry, read off its factors without expanding it."""
    if isinstance(expr, Product):
        return set().union(*(_indices(f) for f in expr.factors))
    if isinstance(expr, Add):
        return set().union(*(_indices(p) for p in expr.parts))
    return {a.index for t in expr for w in t.words for a in w}


def _words(expr) -> Iterable[Word]:
    """The words written in an expression (each factor's and part's), without expanding it."""
    if isinstance(expr, Product):
        return [w for f in expr.factors for w in _words(f)]
    if isinstance(expr, Add):
        return [w for p in expr.parts for w in _words(p)]
    return [w for t in expr for w in t.words]


def _is_bare_identity(factor: TensorSum) -> bool:
    """``Id`` itself (one term, coefficient 1): a factor that multiplies by nothing."""
    return len(factor) == 1 and factor.terms[0].is_identity and factor.terms[0].coeff == 1


def _is_identity(expr: Expr) -> bool:
    return isinstance(expr, TensorSum) and len(expr) > 0 and all(t.is_identity for t in expr)
