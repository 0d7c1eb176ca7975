"""An expression's parts read without expanding it: the indices and words its factors carry,
identity factors, a factor placed on some of a product's slots, and a tensor product of lazy
groups kept lazy (the reader's helpers)."""

from __future__ import annotations

import itertools
from typing import Iterable

import sympy as sp

from tensoralg.atoms import Word
from tensoralg.errors import TensorAlgError
from tensoralg.expr import Add, Expr, Product, TensorSum, identity


def lazy_tensor(exprs: list, limit: int) -> Expr:
    """``X_1 ⊗ … ⊗ X_k`` without expanding a lazy operand, by the mixed-product rule
    read backwards: ``(F G) ⊗ (H K) = (F ⊗ Id)(G ⊗ Id)(Id ⊗ H)(Id ⊗ K)`` and
    ``(P + Q) ⊗ R = P ⊗ R + Q ⊗ R``. Every factor keeps its identity term, so
    ``max_order`` truncates inside the groups as it does in a flat product, and the
    size of the result is counted (at most ``limit`` sums of products) before anything is multiplied.

    >>> from tensoralg.parse import parse
    >>> parse("((Id + A^{0})(Id + A^{1})) ⊗ Id").expand(max_order=1)
    TensorSum(Id ⊗ Id + A^{0} ⊗ Id + A^{1} ⊗ Id)
    """
    choices = [e.parts if isinstance(e, Add) else (e,) for e in exprs]
    combinations = 1
    for parts in choices:
        combinations *= len(parts)
    if combinations > limit:
        raise TensorAlgError(f"the tensor product here distributes over {combinations:,} sums of products, "
                             f"more than {limit:,}; expand fewer groups at once")
    n = sum(e.n_slots for e in exprs)
    summands = []
    for picked in itertools.product(*choices):
        coeff, factors, offset = sp.S.One, [], 0
        for part in picked:
            part_factors = part.factors if isinstance(part, Product) else (part.expand(),)
            coeff = coeff * part.coeff if isinstance(part, Product) else coeff
            factors += [_in_slots(f, offset, n) for f in part_factors if not _is_bare_identity(f)]
            offset += part.n_slots
        summands.append(Product(factors or [_in_slots(identity(1), 0, n)], coeff))
    return summands[0] if len(summands) == 1 else Add(summands)


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
