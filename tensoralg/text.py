"""Expressions as text that :func:`tensoralg.parse.parse` reads back to an equal expression."""

from __future__ import annotations

import sympy as sp

from tensoralg.atoms import Atom
from tensoralg.errors import TensorAlgError
from tensoralg.expr import Add, Product, TensorSum


def to_text(expr) -> str:
    """Text that :func:`parse` reads back to an equal expression.

    Canonical sums print as ``str`` does; lazy products as ``c·(F_1)(F_2)…``; lazy sums
    with their parts, multi-term parts in parentheses. A zero k-slot sum prints as
    ``0·Id ⊗ … ⊗ Id``. Atoms must have names the parser knows and indices without braces.

    >>> from tensoralg.parse import parse
    >>> to_text(parse("(A^{1} ⊗ Id)(Id ⊗ W_E)"))
    '(A^{1} ⊗ Id)(Id ⊗ W_E)'
    """
    kind = type(expr).__name__
    if isinstance(expr, Atom):
        return repr(expr)
    if isinstance(expr, TensorSum):
        _check_indices(expr)
        return str(expr) if len(expr) else "0·" + " ⊗ ".join(["Id"] * expr.n_slots)
    if isinstance(expr, Product):
        return _coeff_prefix(expr.coeff) + "".join(f"({to_text(f)})" for f in expr.factors)
    if isinstance(expr, Add):
        return " + ".join(
            f"({to_text(p)})" if isinstance(p, TensorSum) and len(p) != 1 else to_text(p) for p in expr.parts
        )
    raise TensorAlgError(f"to_text() takes an atom or an expression (TensorSum, Product, Add), got {kind}")


def _coeff_prefix(coeff: sp.Expr) -> str:
    if coeff == 1:
        return ""
    if coeff == -1:
        return "-"
    text = sp.sstr(coeff)
    return f"({text})·" if isinstance(coeff, sp.Add) else f"{text}·"


def _check_indices(expr: TensorSum) -> None:
    for t in expr:
        for w in t.words:
            for a in w:
                if "{" in a.index or "}" in a.index:
                    raise TensorAlgError(f"atom {a!r}: an index with braces cannot be written as text")
