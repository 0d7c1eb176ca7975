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
ATOM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*'*")  # primes end a folded weight's name: W_OV', b_O'
RESERVED = ("Id", "sqrt", "sum")
MAX_SIZE_DIGITS = 18  # a declared size fits an int64


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
        if name == "1":  # the column of ones (tensoralg.grammar reads 1 after a matrix or beside ⊗ as it)
            if not isinstance(spec, Atom) and not (isinstance(spec, (tuple, list)) and len(spec) in (2, 3)
                                                   and str(spec[1]) == "1"):
                raise TensorAlgError(f"the column of ones '1' has one column: declare it as (rows, 1), got {spec!r}")
        elif not isinstance(name, str) or not ATOM_NAME.fullmatch(name) or name in RESERVED or name in DIMS:
            raise TensorAlgError(
                f"cannot declare an atom named {name!r}: a name is a letter then letters, digits or '_' "
                f"(primes at the end, as W_OV'), and not one of {', '.join(RESERVED + tuple(DIMS))}"
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
    clash = sorted({str(d) for rows, cols, _ in table.values() for d in (rows, cols)
                    if str(d) in table and not getattr(d, "is_Integer", False)})  # a size 1 is no name
    if clash:
        raise TensorAlgError(f"{clash[0]!r} is declared both as a matrix and as a dimension; a dimension "
                             "named like a matrix would turn the matrix into a scalar: rename one")
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
            if len(value.lstrip("0")) > MAX_SIZE_DIGITS:
                raise TensorAlgError(f"a dimension has at most {MAX_SIZE_DIGITS} digits, got one of {len(value):,}")
            return positive_size(int(value), value)
        if not NAME.fullmatch(value):
            raise TensorAlgError(f"a dimension is a name like 'd_model' or a positive integer, got {value!r}")
        if value in STANDARD_SHAPES or value in RESERVED:  # V=A,k would make the matrix A a scalar
            raise TensorAlgError(f"a dimension cannot be named {value!r}, which names a matrix (or Id, sqrt, sum); "
                                 "choose another name, such as 'k'")
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


#: Shape inference reads the text again after each equation it solves; the characters read
#: again, summed over those rereads, are bounded (a few seconds), beyond which the undeclared
#: names must be declared. 800 undeclared names in one product took 30 s before the bound.
MAX_INFERENCE_WORK = 300_000


class Shapes:
    """Fresh shapes for undeclared names, and the equations between them solved so far: a
    union-find over the fresh dimensions (each class's root bound to a fixed dimension or to
    itself), so resolving a dimension costs a few steps however many equations came before.

    ``text_length`` (of the text being read) bounds the rereads: more than
    :data:`MAX_INFERENCE_WORK` characters read again is a :class:`TensorAlgError` that says
    how many names were undeclared and how to declare them."""

    def __init__(self, text_length: int = 1):
        self.fresh: dict[str, tuple[sp.Symbol, sp.Symbol]] = {}
        self.parent: dict[sp.Symbol, sp.Symbol] = {}  # fresh dimension -> another of its class
        self.value: dict[sp.Symbol, sp.Expr] = {}  # a class's root -> the fixed dimension it equals
        self.text_length = text_length
        self.max_equations = max(2, MAX_INFERENCE_WORK // max(text_length, 1))
        self.equations = 0

    @property
    def subst(self) -> dict[sp.Symbol, sp.Expr]:
        """Every fresh dimension that equals something else, with what it equals."""
        resolved = {var: self.resolve(var) for var in self.parent}
        return {var: value for var, value in resolved.items() if value != var}

    def shape(self, name: str) -> tuple[sp.Expr, sp.Expr]:
        """The current shape of the undeclared name ``name`` (fresh on first use)."""
        if name not in self.fresh:
            pair = (sp.Symbol(f"rows_{name}", positive=True, integer=True),
                    sp.Symbol(f"cols_{name}", positive=True, integer=True))
            self.fresh[name] = pair
            self.parent.update({pair[0]: pair[0], pair[1]: pair[1]})
        rows, cols = self.fresh[name]
        return self.resolve(rows), self.resolve(cols)

    def find(self, var: sp.Symbol) -> sp.Symbol:
        """The root of ``var``'s class (with path halving)."""
        while self.parent[var] != var:
            self.parent[var] = self.parent[self.parent[var]]
            var = self.parent[var]
        return var

    def resolve(self, dim) -> sp.Expr:
        dim = sp.sympify(dim)
        if dim in self.parent:
            root = self.find(dim)
            return self.value.get(root, root)
        fresh = [s for s in dim.free_symbols if s in self.parent]
        return dim.xreplace({s: self.resolve(s) for s in fresh}) if fresh else dim

    def is_fresh(self, dim) -> bool:
        return dim in self.parent

    def unify(self, pairs) -> bool:
        """Solve every pair that has a fresh dimension on one side; False when none has."""
        solved = False
        for pair in pairs:
            if len(pair) != 2:
                continue
            left, right = (self.resolve(d) for d in pair)
            if left == right:
                continue
            if self.is_fresh(left) and self.is_fresh(right):
                self.parent[left] = right
            elif self.is_fresh(left) or self.is_fresh(right):
                var, value = (left, right) if self.is_fresh(left) else (right, left)
                self.value[var] = value
            else:
                continue
            solved = True
        if solved:
            self._count()
        return solved

    def _count(self) -> None:
        self.equations += 1
        if self.equations > self.max_equations:
            names = sorted(self.fresh)
            shown = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
            raise TensorAlgError(
                f"inferring the shapes of undeclared names ({shown}) needs more than {self.max_equations:,} "
                f"passes over this {self.text_length:,}-character text; declare their shapes (--atom NAME=ROWS,COLS, "
                "or atoms= in Python), or use the paper's atoms"
            ) from None
