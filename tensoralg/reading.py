"""What reading a text finds besides its expression: bound indices, an applied operator.

:func:`tensoralg.parse.read` returns a :class:`Reading`; the derivation of ``tcircuits
expand`` turns its bound indices into ``Σ`` and its applied operator into a step.

>>> from tensoralg.parse import read
>>> read("Σ_{h∈H_1} A^h ⊗ W_OV^h").bound
(Bound(index='h1', var='h', over='H_1', layer=1),)
"""

from __future__ import annotations

from typing import NamedTuple

import sympy as sp

from tensoralg.action import act
from tensoralg.bound import Bound
from tensoralg.expr import Add, Expr, Product, TensorSum


class Applied(NamedTuple):
    """``coeff · operator · activation`` as typed: ``(A ⊗ W_OV) x``; ``typed`` is the text
    of ``coeff · operator`` (``"(A ⊗ W_OV)"``)."""

    operator: Expr
    activation: Expr
    coeff: sp.Expr
    typed: str = ""

    def result(self) -> TensorSum:
        return act(self.operator, self.activation).scale(self.coeff)


class Reading(NamedTuple):
    """What :func:`read` found: the expression, the indices its sums bind, and the
    rewrites made while reading: ``("transpose", word)``; ``("collect", n)`` for like terms
    typed at the top level, kept apart; ``("collected", n)`` for those collected inside a
    factor while reading; ``("tensor", k)`` for a tensor product of ``k`` operands with a
    lazy group among them, rewritten as a product of factors on their own slots."""

    expr: Expr
    bound: tuple[Bound, ...]
    rewrites: tuple[tuple, ...]
    applied: Applied | None
    shapes: dict


def reindex(expr: Expr, mapping: dict) -> Expr:
    """``expr`` with atom indices renamed by ``mapping`` (lazy products and sums kept lazy).

    >>> from tensoralg.parse import parse
    >>> reindex(parse("A^{h0} ⊗ W_OV^{h0}"), {"h0": "h0'"})
    TensorSum(A^{h0'} ⊗ W_OV^{h0'})
    """
    if isinstance(expr, Product):
        return Product([reindex(f, mapping) for f in expr.factors], expr.coeff)
    if isinstance(expr, Add):
        return Add([reindex(p, mapping) for p in expr.parts])
    words = {tuple(tuple(a.with_index(mapping.get(a.index, a.index)) for a in w) for w in t.words): t.coeff
             for t in expr}
    return TensorSum(words, n_slots=expr.n_slots)
