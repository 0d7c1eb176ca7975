"""Checking a derivation numerically: every line evaluated on random bindings of its atoms.

Each atom gets a random matrix of its shape (:class:`RandomBindings`: attention patterns
causal and row-stochastic, symmetric atoms positive diagonal, derived atoms such as
``W_OV`` computed from their definitions); a lazy product is evaluated as the matrix
product of its factors' operators, so the mixed-product rule itself is checked, not
assumed. :func:`derivations.derivation.verify` uses them to compare every line of a chain with its
first line (or with the last truncation, which drops terms on purpose).

These random matrices stand in for nothing: checking against a real model's weights and
attention patterns is :mod:`numeric_check`'s work (its ``Binder`` binds atoms to a model).

>>> from tensoralg import atom, term
>>> bindings = RandomBindings(Numeric(), np.random.default_rng(0))
>>> bindings.operator(term(atom("A", "h"), atom("W_OV", "h")), {0: 4, 1: 5}).shape   # n_ctx·d_model
(20, 20)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import sympy as sp

from tensoralg import Add, Atom, Expr, Product, TensorSum, Term, to_numpy
from tensoralg.definitions import STANDARD_DEFINITIONS
from tensoralg.display import elided_table
from tensoralg.errors import NumericTooLarge
from tensoralg.numeric import check_entries

from derivations.document import SumIndex
from derivations.errors import DerivationError

@dataclass(frozen=True)
class Numeric:
    """How to bind atoms for a numeric check.

    ``dims``: sizes of symbolic dimensions (defaults for the standard ones); ``special``:
    per atom name, ``f(atom, shape, rng) -> array`` (e.g. orthonormal columns);
    ``derived``: per atom name, ``f(atom) -> 1-slot expression`` that defines it (the
    standard ``W_OV``/``W_QK`` are included). ``count``: how many heads each summed
    index (:class:`SumIndex`) stands for; ``missing``: what the reader is told to do when a
    size has no value (a command-line user is told about ``--atom``, not this class).
    """

    dims: Mapping[str, int] = field(default_factory=dict)
    special: Mapping[str, Callable] = field(default_factory=dict)
    derived: Mapping[str, Callable] = field(default_factory=dict)
    count: int = 2
    missing: str = "give its sizes in Numeric(dims=...)"  # how to give a size that has no value (the CLI says --atom)



DEFAULT_DIMS = {"n_ctx": 4, "d_model": 5, "d_head": 3, "d_vocab": 6, "d_mlp": 7}


@dataclass(frozen=True)
class Verification:
    """Per step ``(chain, step, error)``: the largest difference from the chain's first line
    (or from the last truncation, which drops terms on purpose), relative to its largest entry."""

    errors: tuple[tuple[int, int, float], ...]
    tol: float

    @property
    def ok(self) -> bool:
        return all(e <= self.tol for _, _, e in self.errors)

    @property
    def worst(self) -> float:
        return max((e for _, _, e in self.errors), default=0.0)

    def _repr_markdown_(self) -> str:
        """What a notebook shows: the verdict, worst error and tolerance, and each line's error."""
        verdict = "every line agrees" if self.ok else "**some lines disagree**"
        head = (f"Checked numerically on random bindings: {verdict} (worst relative error {self.worst:.3g}, "
                f"tolerance {self.tol:.3g}).")
        rows = [[str(c + 1), str(i + 1), f"{e:.3g}", "ok" if e <= self.tol else "**FAIL**"] for c, i, e in self.errors]
        return head + "\n\n" + elided_table(["chain", "line", "relative error", "ok"], rows, right=[0, 1, 2], what="lines")


def instantiate(expr: Expr, sums: Sequence[SumIndex], count: int) -> Expr:
    """Replace each summed index by ``count`` concrete heads (``h_0`` → ``h_0=0``, ``h_0=1``…)
    within each term that carries it, so a Σ-form can be evaluated numerically.

    >>> from tensoralg import atom, term
    >>> from derivations.document import math
    >>> s = instantiate(term(atom("A", "h"), atom("W_OV", "h")), [SumIndex("h", math("H"))], 2)
    >>> len(s)
    2
    """
    names = [s.index for s in sums]
    if isinstance(expr, Product):
        return Product([instantiate(f, sums, count) for f in expr.factors], expr.coeff)
    if isinstance(expr, Add):
        return Add([instantiate(p, sums, count) for p in expr.parts])
    out: dict = {}
    for t in expr.expand():
        present = [n for n in names if any(a.index == n for w in t.words for a in w)]
        for values in itertools.product(range(count), repeat=len(present)):
            rename = {n: f"{n}={v}" for n, v in zip(present, values)}
            words = tuple(tuple(a.with_index(rename[a.index]) if a.index in rename else a for a in w) for w in t.words)
            out[words] = out.get(words, 0) + t.coeff
    return TensorSum(out, n_slots=expr.n_slots)


def atoms_in(expr: Expr) -> Iterator[Atom]:
    if isinstance(expr, Product):
        for f in expr.factors:
            yield from atoms_in(f)
    elif isinstance(expr, Add):
        for p in expr.parts:
            yield from atoms_in(p)
    else:
        for t in expr.expand():
            for w in t.words:
                yield from (a.base for a in w)


class RandomBindings:
    """Random arrays for atoms, made on first use and kept: patterns are causal and
    row-stochastic, symmetric atoms positive diagonal, derived atoms computed from their
    definitions (so ``W_OV^{h} = W_O^{h} W_V^{h}`` holds numerically)."""

    def __init__(self, numeric: Numeric, rng: np.random.Generator, sums: Sequence[SumIndex] = ()):
        self.numeric = numeric
        self.sums = tuple(sums)
        self.rng = rng
        self.dims = {**DEFAULT_DIMS, **numeric.dims}
        self._fresh = 0  # sizes given to fresh shapes (rows_B) so far
        self.values: dict[Atom, np.ndarray] = {}
        self.numbers: dict[sp.Expr, complex] = {}
        self.derived = {name: (lambda a, d=d: TensorSum([Term(1, (d.word(a.index),))]))
                        for name, d in STANDARD_DEFINITIONS.items()}
        self.derived.update(numeric.derived)

    def number(self, value) -> complex:
        """A symbolic size or coefficient with the sizes substituted (each once: a line of thousands of
        terms asks for the same few sizes and coefficients again and again)."""
        value = sp.sympify(value)
        known = self.numbers.get(value)
        if known is None:
            number = value.subs({s: self.dims[s.name] for s in value.free_symbols if s.name in self.dims})
            if not number.is_number:
                raise DerivationError(f"no numeric value for {number}; {self.numeric.missing}")
            known = self.numbers[value] = complex(number)
        return known

    def size(self, dim) -> int:
        """A dimension's size: the given or standard one, else (a fresh shape such as ``rows_B``, whose only
        constraint is that the products chain, which the algebra checked) a small size of its own, 2 to 4,
        fixed on first use, as :func:`tensoralg.check.check` sizes them."""
        dim = sp.sympify(dim)
        for s in sorted(dim.free_symbols, key=str):
            if s.name not in self.dims:
                self.dims[s.name] = 2 + self._fresh % 3
                self._fresh += 1
        return self.dims[dim.name] if dim.is_Symbol else int(dim) if dim.is_Integer else int(self.number(dim).real)

    def bind(self, a: Atom) -> np.ndarray:
        a = a.base
        if a in self.values:
            return self.values[a]
        shape = (self.size(a.rows), self.size(a.cols))
        check_entries(*shape, f"the random matrix for {a.label}")  # sized before it is made
        if a.name in self.derived:
            value = self.operator(instantiate(self.derived[a.name](a), self.sums, self.numeric.count), {0: shape[0]})
        elif a.name in self.numeric.special:
            value = np.asarray(self.numeric.special[a.name](a, shape, self.rng), dtype=float)
        elif a.name == "A":
            value = causal_pattern(shape[0], self.rng)
        elif a.symmetric:
            value = np.diag(self.rng.uniform(0.5, 1.5, shape[0]))
        else:
            value = self.rng.standard_normal(shape) / np.sqrt(shape[1])
        if value.shape != shape:
            raise DerivationError(f"the value bound to {a.label} has shape {value.shape}, expected {shape}")
        self.values[a] = value
        return value

    def operator(self, expr: Expr, rows: Mapping[int, int]) -> np.ndarray:
        """The dense operator of ``expr``; a product is the matrix product of its factors'
        operators (so the mixed-product rule itself is checked, not assumed)."""
        if isinstance(expr, Add):
            return sum(self.operator(p, rows) for p in expr.parts)
        if isinstance(expr, Product):
            total, current = None, dict(rows)
            for f in expr.factors:
                m = self.operator(f, current)
                if total is not None:
                    check_entries(total.shape[0], m.shape[1], "a product of the operators")  # before it is made
                total = m if total is None else total @ m
                current = {i: self.size(s[1]) if s is not None else current[i] for i, s in enumerate(f.slot_shapes)}
            return complex_to_real(self.number(expr.coeff)) * total
        s = expr.expand()
        bindings = {a: self.bind(a) for a in atoms_in(s)}
        sizes = {i: rows[i] for i in range(s.n_slots)}
        return to_numpy(s, bindings, dims=self.dims, slot_sizes=sizes)


def finite_operator(bindings: RandomBindings, expr: Expr, rows: Mapping[int, int], where: str) -> np.ndarray:
    """The operator of ``expr``, computed without numpy warnings; a :class:`DerivationError`
    when it leaves float64 (``d_head**1000`` with ``d_head = 3`` is 1e477): such a line
    cannot be checked numerically, and saying so beats a comparison of NaNs."""
    try:
        with np.errstate(all="ignore"):
            value = bindings.operator(expr, rows)
    except OverflowError:  # a coefficient too large even for complex()
        value = np.array([np.inf])
    except NumericTooLarge as err:  # sized before it was made: the line is not checked, and the page says so
        raise DerivationError(f"{where} is not checked numerically: {err}") from None
    if not np.isfinite(value).all():
        sizes = ", ".join(f"{name} = {size}" for name, size in bindings.dims.items())
        raise DerivationError(f"{where} leaves float64 at the check's sizes ({sizes}): its coefficients are too "
                              "large (or small) to check numerically")
    return value


def complex_to_real(c: complex):
    return c.real if c.imag == 0 else c


def causal_pattern(n: int, rng: np.random.Generator) -> np.ndarray:
    """A random attention pattern: lower-triangular, rows summing to 1."""
    scores = rng.standard_normal((n, n))
    scores[np.triu_indices(n, 1)] = -np.inf
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
