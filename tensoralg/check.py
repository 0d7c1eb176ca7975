"""Check an identity ``LHS = RHS``: by canonical expansion, then numerically.

Both sides are read together (so that one undeclared name has one shape on both sides),
expanded by the rules of the algebra — distributivity, the mixed-product rule, collecting
like terms — with the definitions ``W_OV := W_O W_V`` and ``W_QK := W_Qᵀ W_K`` unfolded, and
compared term by term. The verdict is then confirmed on random numbers (every atom bound to
a random matrix, every dimension a small size); when the sides differ, the terms of
``LHS - RHS`` are the difference, and a small integer counterexample shows it.

>>> r = check("(A ⊗ B)(C ⊗ D) = (AC) ⊗ (BD)")
>>> r.holds, r.numeric_error < 1e-12
(True, True)
>>> r = check("(A + B) ⊗ W_OV = A ⊗ W_OV")
>>> r.holds, str(r.difference)
(False, 'B ⊗ W_OV')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import sympy as sp

from tensoralg.bound import Bound
from tensoralg.definitions import STANDARD_DEFINITIONS, fold, unfold
from tensoralg.errors import (BindingError, ExpansionTooLarge, NumericTooLarge, NumericUnchecked, ParseError,
                              ShapeMismatch, SlotMismatch, TensorAlgError)
from tensoralg.display import html_repr, html_text
from tensoralg.expr import Add, Expr, Product, TensorSum
from tensoralg.lexer import tokenize
from tensoralg.numeric import check_entries, to_numpy
from tensoralg.parse import notes, parse, read
from tensoralg.rules import expand_steps

ZERO_TEXTS = ("0", "0·Id")
MAX_TERMS = 5000  # terms a side may expand to (as tcircuits expand: derivations.catalogue.DOCUMENT_LIMIT)
RULE_NAMES = {"mixed_product": "mixed-product rule", "collect": "collecting like terms"}


@dataclass(frozen=True)
class Counterexample:
    """Small integer matrices for the atoms, every dimension of size ``size``, and the two sides' values."""

    size: int
    bindings: dict
    lhs: np.ndarray
    rhs: np.ndarray

    def lines(self) -> list[str]:
        """``A = [[1 -1] [0 2]]`` for each atom, then both sides' values."""
        out = [f"{label} = {_matrix(v)}" for label, v in self.bindings.items()]
        return out + [f"LHS = {_matrix(self.lhs)}", f"RHS = {_matrix(self.rhs)}"]


@dataclass(frozen=True)
class IdentityCheck:
    """The verdict on ``LHS = RHS``: ``holds`` (by canonical expansion), each side as read, its
    expansion steps (``[(rule, expression), …]``) and canonical sum, ``difference`` (``LHS - RHS``,
    definitions unfolded), the largest numeric difference on random bindings relative to the sides'
    size (``None`` when the numbers could not be compared: ``unchecked`` says why — the values
    overflow float64, or the arrays would be too large to make), a :class:`Counterexample` when the
    identity fails, and how the text was read (``notes``)."""

    lhs_text: str
    rhs_text: str
    lhs: Expr
    rhs: Expr
    lhs_steps: tuple
    rhs_steps: tuple
    difference: TensorSum
    numeric_error: float | None
    counterexample: Counterexample | None = None
    notes: tuple[str, ...] = field(default=())
    unchecked: str | None = None

    @property
    def holds(self) -> bool:
        return self.difference.is_zero

    def __bool__(self) -> bool:
        return self.holds

    def summary(self) -> str:
        """One sentence: the verdict, how it was decided, and the numbers (or why none were compared)."""
        numbers = f"not checked numerically: {self.unchecked}" if self.numeric_error is None else None
        if self.holds:
            n = len(_unfolded(self.lhs))
            return (f"The identity holds: both sides expand to the same canonical sum ({n} term"
                    f"{'s' if n != 1 else ''}), " + (f"and on random bindings they differ by {self.numeric_error:.1e} "
                    "(relative to their largest entry)." if numbers is None else f"{numbers}."))
        agree = f" ({numbers})" if numbers is not None else \
            " (numerically they agree on random bindings: an identity the rules do not know)" \
            if self.numeric_error < 1e-9 else ""
        return (f"The identity does not hold: LHS - RHS has {len(self.difference)} "
                f"term{'s' if len(self.difference) != 1 else ''}{agree}.")

    def _repr_html_(self) -> str:
        """A notebook shows the verdict, and when it fails the terms of LHS - RHS (MathML)."""
        html = f"<p>{html_text(self.summary())}</p>"
        if not self.holds:
            html += "<p>LHS - RHS =</p>" + html_repr(self.difference)
        if self.counterexample is not None:
            html += (f"<p>counterexample, every dimension {self.counterexample.size}:</p><ul>"
                     + "".join(f"<li><code>{html_text(line)}</code></li>" for line in self.counterexample.lines()) + "</ul>")
        return html + "".join(f"<p>note: {html_text(n)}</p>" for n in self.notes)

    def __str__(self) -> str:
        lines = [self.summary(), f"LHS = {self.lhs_text}"]
        lines += [f"    = {e}    [{RULE_NAMES.get(rule, rule)}]" for rule, e in self.lhs_steps]
        lines += [f"RHS = {self.rhs_text}"] + [f"    = {e}    [{RULE_NAMES.get(rule, rule)}]" for rule, e in self.rhs_steps]
        if not self.holds:
            lines.append(f"LHS - RHS = {self.difference}")
            if self.counterexample is not None:
                lines += [f"counterexample, every dimension {self.counterexample.size}:"]
                lines += ["  " + line for line in self.counterexample.lines()]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def split_equation(text: str) -> tuple[str, str]:
    """``"LHS = RHS"`` as its two sides; one ``=`` exactly (``:=`` is a definition, not an identity)."""
    if not isinstance(text, str):
        raise TensorAlgError(f"check() takes 'LHS = RHS' or two sides, got {type(text).__name__}")
    if ":=" in text:
        raise ParseError("':=' defines a name; an identity to check is written LHS = RHS", text, text.index(":="))
    count = text.count("=")
    if count != 1:
        pos = text.index("=", text.index("=") + 1) if count > 1 else len(text)
        raise ParseError(f"an identity is LHS = RHS with one '=', found {count}", text, pos)
    lhs, rhs = text.split("=")
    return lhs.strip(), rhs.strip()


def check(lhs, rhs=None, atoms: Mapping | None = None, *, index_from: int = 0, seed: int = 0,
          opaque: bool = False, max_terms: int = MAX_TERMS) -> IdentityCheck:
    """Decide ``lhs = rhs`` (strings in the text language, or expressions); ``check("L = R")``
    takes both sides in one string. See the module docstring for how.

    Decimals typed are the exact rationals they write (``0.1 A + 0.2 A = 0.3 A`` holds). A side
    whose expansion counts more than ``max_terms`` terms is refused before anything is expanded.
    ``seed`` is an integer in ``0 .. 2**32 - 1``."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise TensorAlgError(f"the seed of the random bindings is an integer from 0 to 2**32 - 1, got {seed!r}")
    if rhs is None:
        lhs, rhs = split_equation(lhs)
    sides, texts, found = read_sides(lhs, rhs, atoms, index_from, opaque)
    for name, side in zip(("the left side", "the right side"), sides):
        count_terms(side, name, max_terms)
    canonical = _apart([_unfolded(s) for s in sides])
    difference = _folded(_minus(canonical[0], canonical[1]))
    try:
        error, unchecked = numeric_difference(canonical, seed), None
    except NumericUnchecked as why:
        error, unchecked = None, str(why)
    counter = None
    if not difference.is_zero and unchecked is None:
        counter = counterexample(canonical, seed)
    return IdentityCheck(texts[0], texts[1], sides[0], sides[1], tuple(expand_steps(sides[0])),
                         tuple(expand_steps(sides[1])), difference, error, counter, found, unchecked)


def count_terms(side: Expr, name: str, max_terms: int = MAX_TERMS) -> int:
    """The terms ``side`` expands to, counted without expanding (products of sums multiply their
    counts); more than ``max_terms`` is an :class:`ExpansionTooLarge` error at once.

    >>> count_terms(parse("(A + B)(C + D)"), "the left side")
    4
    """
    n = side.count() if isinstance(side, (Product, Add)) else len(side)
    if n > max_terms:
        raise ExpansionTooLarge(f"{name} expands to {n:,} terms, more than the {max_terms:,} a check expands; "
                           "check a smaller identity (fewer factors, or sums with fewer terms)")
    return n


def read_sides(lhs, rhs, atoms, index_from: int, opaque: bool) -> tuple[list, list, tuple]:
    """Both sides as expressions (a side ``0`` is the zero of the other's slots), their texts and
    the reader's notes. Text sides are read together first, so names share their shapes."""
    texts = [s if isinstance(s, str) else str(s) for s in (lhs, rhs)]
    for s in (lhs, rhs):
        if not isinstance(s, (str, Expr)):
            raise TensorAlgError(f"a side of an identity is text or an expression, got {type(s).__name__}")
    typed = [s for s in (lhs, rhs) if isinstance(s, str) and s.strip() not in ZERO_TEXTS]
    declared = dict(atoms or {})
    found: list[str] = []
    names: frozenset = frozenset()
    readings = [read(s, declared or None, index_from=index_from, opaque=opaque, exact=True)
                for s in typed]  # errors point here
    alone = [_value(r) for r in readings]
    if len({e.n_slots for e in alone}) > 1:
        raise SlotMismatch(f"the sides have different numbers of tensor slots: "
                           f"{' against '.join(f'{t!r} has {e.n_slots}' for t, e in zip(typed, alone))}; "
                           f"{_slots_hint(alone)}")
    if typed:
        try:
            both = read(" - ".join(f"({s})" for s in typed), declared or None, index_from=index_from, opaque=opaque,
                        exact=True)
        except ShapeMismatch as err:
            raise ShapeMismatch(f"the sides have different shapes, so they cannot be equal: "
                                f"{str(err).splitlines()[0].split(' at position')[0]}", dims=err.dims) from None
        except ParseError:  # only together (a free index named as the other side's summed one): each its own
            both = None
        for r in [both] if both is not None else readings:
            declared.update(r.shapes)
            found += notes(r)
        names = frozenset(t.text for t in tokenize(" ".join(typed)) if t.kind == "NAME")
    sides = []
    for s in (lhs, rhs):
        if isinstance(s, str) and s.strip() not in ZERO_TEXTS:
            sides.append(_value(read(s, declared or None, index_from=index_from, visible=False, opaque=opaque,
                                     names=names, exact=True)))
        else:
            sides.append(s)
    exprs = [s for s in sides if isinstance(s, Expr)]
    if not exprs:
        raise TensorAlgError("both sides are 0; give at least one side with an atom")
    zero = TensorSum([], n_slots=exprs[0].n_slots)
    return [s if isinstance(s, Expr) else zero for s in sides], texts, tuple(dict.fromkeys(found))


def _slots_hint(sides) -> str:
    """What to write when the sides' slots differ: the identity of as many slots as the wider side."""
    k = max(e.n_slots for e in sides)
    return (f"write each side with {k} slots (the identity on {k} slots is {' ⊗ '.join(['Id'] * k)}; "
            f"a bare Id widens only inside a sum or a product with {k}-slot terms)")


def _value(r) -> Expr:
    """What a reading stands for: its expression, or an operator applied to its activation."""
    return r.applied.result().with_bound(r.bound) if r.applied else r.expr


def _unfolded(expr: Expr) -> TensorSum:
    s = expr.expand()
    for d in STANDARD_DEFINITIONS.values():
        s = unfold(s, d)
    return _renamed_dummies(s, expr.bound)


def _renamed_dummies(s: TensorSum, bound) -> TensorSum:
    """``s`` with the indices its sums bind renamed, term by term, in the order they appear: a sum
    over a layer's heads binds ``h1``, ``h1'``, …, whatever letter was typed (``Σ_{k∈H_1} A^k`` is
    ``Σ_{h∈H_1} A^h``); a sum over another set binds its set's name."""
    sets = {b.index: (f"h{b.layer}" if b.layer is not None else b.over) for b in bound}
    if not sets:
        return s
    terms, used = {}, {}
    for t in s:
        order = list(dict.fromkeys(a.index for w in t.words for a in w if a.index in sets))
        mapping, seen = {}, {}
        for index in order:
            base = sets[index]
            mapping[index] = base + "'" * seen.get(base, 0)
            seen[base] = seen.get(base, 0) + 1
            used[mapping[index]] = base
        words = tuple(tuple(a.with_index(mapping.get(a.index, a.index)) for a in w) for w in t.words)
        terms[words] = terms.get(words, 0) + t.coeff
    layers = {b.over_text(): b for b in bound}
    new = tuple(Bound(i, i, layers[base].over if base in layers else base, _layer(base)) for i, base in used.items())
    return TensorSum(terms, n_slots=s.n_slots).with_bound(new)


def _apart(sides: list) -> list:
    """A free index named like an index that a side sums over is another matrix: ``A^{h1}`` (one
    head) is not ``Σ_{h1∈H_1} A^{h1}``, so it becomes ``h1 (free)`` before the sides are compared."""
    summed = {b.index for s in sides for b in s.bound}
    out = []
    for s in sides:
        own = {b.index for b in s.bound}
        clash = {a.index for t in s for w in t.words for a in w if a.index in summed - own}
        if clash:
            words = {tuple(tuple(a.with_index(a.index + " (free)" if a.index in clash else a.index) for a in w)
                           for w in t.words): t.coeff for t in s}
            s = TensorSum(words, n_slots=s.n_slots).with_bound(s.bound)
        out.append(s)
    return out


def _layer(base: str) -> int | None:
    return int(base[1:]) if base.startswith("h") and base[1:].isdigit() else None


def _folded(expr: TensorSum) -> TensorSum:
    folded = expr
    for d in STANDARD_DEFINITIONS.values():
        folded = fold(folded, d)
    return folded.with_bound(expr.bound)


def _minus(a: TensorSum, b: TensorSum) -> TensorSum:
    if a.n_slots != b.n_slots:
        raise TensorAlgError(f"the sides have different numbers of tensor slots: {a.n_slots} against {b.n_slots}")
    return (a - b).expand()


def _sizes(sides, size: int | None, rng) -> dict:
    symbols = {d for s in sides for shape in s.slot_shapes if shape for x in shape for d in sp.sympify(x).free_symbols}
    symbols |= {d for s in sides for t in s for w in t.words for a in w for d in sp.sympify(a.rows).free_symbols
                | sp.sympify(a.cols).free_symbols}
    symbols |= {d for s in sides for t in s for d in sp.sympify(t.coeff).free_symbols}
    return {d: size or int(rng.integers(2, 5)) for d in sorted(symbols, key=str)}


def _values(sides, dims: dict, rng, integers: bool) -> dict:
    atoms = sorted({a.base for s in sides for t in s for w in t.words for a in w}, key=lambda a: a.key)
    shapes = {a: tuple(int(sp.sympify(x).subs(dims)) for x in (a.rows, a.cols)) for a in atoms}
    for a, (rows, cols) in shapes.items():  # every array sized before any is made
        check_entries(rows, cols, f"the random matrix for {a.label}")
    values = {}
    for a in atoms:
        rows, cols = shapes[a]
        v = rng.integers(-2, 3, size=(rows, cols)).astype(float) if integers else rng.normal(size=(rows, cols))
        values[a.label] = (v + v.T) / 2 if a.symmetric else v
    return values


def _evaluate(sides, dims: dict, values: dict) -> list[np.ndarray]:
    """Both sides as dense arrays; a zero side (``W_E = 0``) as zeros of the other's shape."""
    n = sides[0].n_slots
    known = [next((s.slot_shapes[i] for s in sides if s.slot_shapes[i] is not None), None) for i in range(n)]
    slot_sizes = {i: 2 if shape is None else int(sp.sympify(shape[0]).subs(dims)) for i, shape in enumerate(known)}
    out = [None if s.is_zero else to_numpy(s, values, dims={str(d): n for d, n in dims.items()}, slot_sizes=slot_sizes)
           for s in sides]
    like = next((v for v in out if v is not None), None)
    if like is None:
        side = int(np.prod([slot_sizes[i] for i in range(n)], dtype=object))
        check_entries(side, side, "each side")
        like = np.zeros((side, side))
    out = [np.zeros_like(like) if v is None else v for v in out]
    if out[0].shape != out[1].shape:
        raise ShapeMismatch(f"the sides have different shapes on random sizes, {out[0].shape} against {out[1].shape}, "
                            "so they cannot be equal")
    return out


def numeric_difference(sides, seed: int = 0, trials: int = 3) -> float:
    """The largest ``|LHS - RHS|`` over a few random bindings and sizes, relative to the sides' size;
    :class:`NumericUnchecked` when the values leave float64 (an overflow is never "they agree") or an
    array would be larger than :data:`~tensoralg.numeric.MAX_ENTRIES` (sized before it is made)."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(trials):
        dims = _sizes(sides, None, rng)
        try:
            with np.errstate(all="ignore"):
                left, right = _evaluate(sides, dims, _values(sides, dims, rng, integers=False))
                scale = max(float(np.abs(left).max(initial=0)), float(np.abs(right).max(initial=0)), 1.0)
                error = float(np.abs(left - right).max(initial=0)) / scale
        except NumericUnchecked:  # an array too large to make: said, not compared
            raise
        except OverflowError:  # a coefficient beyond even complex()
            raise NumericUnchecked("the values overflow float64") from None
        except (BindingError, TypeError, ValueError) as err:
            raise TensorAlgError(f"the sides cannot be evaluated numerically: {err}") from None
        if not (np.isfinite(left).all() and np.isfinite(right).all()) or not np.isfinite(error):
            raise NumericUnchecked("the values overflow float64")
        worst = max(worst, error)
    return worst


def counterexample(sides, seed: int = 0, size: int = 2, tries: int = 20) -> Counterexample | None:
    """Small integer matrices (entries -2..2, every dimension ``size``) on which the sides differ
    (finite values only: an overflow shows nothing)."""
    rng = np.random.default_rng(seed)
    dims = _sizes(sides, size, rng)
    for _ in range(tries):
        try:
            with np.errstate(all="ignore"):
                values = _values(sides, dims, rng, integers=True)
                left, right = _evaluate(sides, dims, values)
        except (NumericTooLarge, OverflowError):
            return None
        if not (np.isfinite(left).all() and np.isfinite(right).all()):
            return None
        if not np.allclose(left, right):
            return Counterexample(size, values, left, right)
    return None


def _matrix(value: np.ndarray) -> str:
    with np.errstate(all="ignore"):  # rounding 1e302 to 6 places would overflow: large entries as they are
        rounded = np.where(np.abs(value) < 1e12, np.round(value, 6), value)
    return np.array2string(rounded + 0.0, separator=" ", max_line_width=10_000).replace("\n", "").replace(".]", "]") \
        .replace(". ", " ")


__all__ = ["IdentityCheck", "Counterexample", "MAX_TERMS", "check", "count_terms", "split_equation"]
