"""The atoms a text may name, and shape inference for the names it does not declare.

A name that is neither a paper atom (``STANDARD_SHAPES``) nor declared with ``atoms=``
gets a fresh symbolic shape ``rows_B × cols_B``. Each :class:`ShapeMismatch` that involves
a fresh dimension becomes an equation, solved by substitution (a small unification over
symbolic dimensions); a mismatch between two fixed dimensions is a real error.

>>> u = Shapes()
>>> u.shape("B")
(rows_B, cols_B)
>>> u.unify([(DIMS["d_model"], u.shape("B")[0])])
True
>>> u.shape("B")
(d_model, cols_B)
"""

from __future__ import annotations

import numbers
import re
from typing import Mapping

import sympy as sp

from tensoralg.atoms import DIMS, STANDARD_SHAPES, Atom
from tensoralg.errors import TensorAlgError

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
RESERVED = ("Id", "sqrt", "sum")


def declared_table(atoms) -> dict[str, tuple]:
    """``atoms=`` as ``{name: (rows, cols, symmetric)}``; shapes may be strings like ``"d_model"``."""
    if atoms is None:
        return {}
    if isinstance(atoms, Mapping):
        items = list(atoms.items())
    else:
        items = [(a.name, a) for a in atoms] if all(isinstance(a, Atom) for a in atoms) else None
        if items is None:
            raise TensorAlgError("atoms= takes a mapping {name: (rows, cols) or Atom} or a list of Atom objects")
    table = {}
    for name, spec in items:
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in RESERVED or name in DIMS:
            raise TensorAlgError(
                f"cannot declare an atom named {name!r}: a name is a letter then letters, digits or '_', "
                f"and not one of {', '.join(RESERVED + tuple(DIMS))}"
            )
        if isinstance(spec, Atom):
            base = spec.base
            table[name] = (dimension(base.rows), dimension(base.cols), base.symmetric)
        elif isinstance(spec, (tuple, list)) and len(spec) in (2, 3):
            table[name] = (dimension(spec[0]), dimension(spec[1]), bool(spec[2]) if len(spec) == 3 else False)
        else:
            raise TensorAlgError(f"atom {name!r}: expected (rows, cols), (rows, cols, symmetric) or an Atom, got {spec!r}")
        paper = STANDARD_SHAPES.get(name)
        if paper is not None and table[name] != paper:  # the same shape again is harmless
            rows, cols, _ = paper
            raise TensorAlgError(
                f"cannot redeclare the paper's atom {name!r} ({rows} × {cols}) as "
                f"{table[name][0]} × {table[name][1]}; declare the new matrix under another name"
            )
    return table


def dimension(value) -> sp.Expr:
    """A declared dimension: a standard name maps to the standard symbol (with its assumptions);
    a number must be a positive integer (``-1``, ``1.5``, NaN and ∞ are refused).

    >>> dimension("d_model"), dimension("3"), dimension(4)
    (d_model, 3, 4)
    """
    if isinstance(value, str):
        if value in DIMS:
            return DIMS[value]
        if value.isascii() and value.isdigit():
            return positive_size(int(value), value)
        if not NAME.fullmatch(value):
            raise TensorAlgError(f"a dimension is a name like 'd_model' or a positive integer, got {value!r}")
        return sp.Symbol(value, positive=True, integer=True)
    if isinstance(value, sp.Symbol) and value.name in DIMS:  # Atom("V", "n_ctx", …) means the paper's n_ctx
        return DIMS[value.name]
    if isinstance(value, sp.Basic) and value.free_symbols:  # a symbolic size: its value is bound later
        return value
    return positive_size(value, value)


def positive_size(value, shown) -> sp.Integer:
    """``value`` as a positive integer size, or a :class:`TensorAlgError` naming ``shown``."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, sp.Integer)) or int(value) < 1:
        raise TensorAlgError(f"a dimension must be a positive integer or a name like 'd_model', got {shown!r}")
    return sp.Integer(int(value))


class Shapes:
    """Fresh shapes for undeclared names, and the substitutions found so far."""

    def __init__(self):
        self.fresh: dict[str, tuple[sp.Symbol, sp.Symbol]] = {}
        self.subst: dict[sp.Symbol, sp.Expr] = {}

    def shape(self, name: str) -> tuple[sp.Expr, sp.Expr]:
        """The current shape of the undeclared name ``name`` (fresh on first use)."""
        if name not in self.fresh:
            self.fresh[name] = (sp.Symbol(f"rows_{name}", positive=True, integer=True),
                                sp.Symbol(f"cols_{name}", positive=True, integer=True))
        rows, cols = self.fresh[name]
        return self.resolve(rows), self.resolve(cols)

    def resolve(self, dim) -> sp.Expr:
        return sp.sympify(dim).xreplace(self.subst)

    def is_fresh(self, dim) -> bool:
        return any(dim in pair for pair in self.fresh.values())

    def unify(self, pairs) -> bool:
        """Solve the first pair that has a fresh dimension on one side; False when none has."""
        for pair in pairs:
            if len(pair) != 2:
                continue
            left, right = (self.resolve(d) for d in pair)
            if left == right:
                continue
            for var, value in ((left, right), (right, left)):
                if isinstance(var, sp.Symbol) and self.is_fresh(var):
                    self.subst = {k: v.xreplace({var: value}) for k, v in self.subst.items()}
                    self.subst[var] = value
                    return True
        return False
