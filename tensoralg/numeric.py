"""Small numeric bindings: the dense operator of an expression, for tests and teaching.

``to_numpy(A ⊗ W) == np.kron(A, W)``: the operator on the row-major ``vec(x)`` of an
activation with one row per position, since ``vec(A x Wᵀ) = (A ⊗ W) vec(x)``.
"""

from __future__ import annotations

import numbers
from functools import lru_cache, reduce
from typing import Mapping

import numpy as np
import sympy as sp

from tensoralg.atoms import Atom
from tensoralg.errors import BindingError, NumericTooLarge

#: The most entries an array made for a numeric check may hold (128 MiB of float64): every array is
#: sized before it is made, and a larger one is :class:`~tensoralg.errors.NumericTooLarge`.
MAX_ENTRIES = 1 << 24


def check_entries(rows: int, cols: int, what: str, limit: int | None = None) -> None:
    """Refuse, before it is made, a ``rows × cols`` array of more than ``limit`` entries
    (:data:`MAX_ENTRIES` unless given).

    >>> check_entries(65536, 65536, "the left side")
    Traceback (most recent call last):
    ...
    tensoralg.errors.NumericTooLarge: the left side would be a 65,536 × 65,536 array (4,294,967,296 entries), more than the 16,777,216 a numeric check makes
    """
    limit = MAX_ENTRIES if limit is None else limit
    if rows * cols > limit:
        raise NumericTooLarge(f"{what} would be a {rows:,} × {cols:,} array ({rows * cols:,} entries), more than the "
                              f"{limit:,} a numeric check makes")


def _bound(bindings: Mapping, a: Atom) -> np.ndarray:
    base = a.base
    for key in (base, base.label):
        if key in bindings:
            value = np.asarray(bindings[key])
            break
    else:
        raise BindingError(f"no value bound to atom {base.label!r}; bound: {sorted(str(k) for k in bindings)}")
    if value.ndim != 2:
        raise BindingError(f"atom {base.label!r} must be bound to a 2-D array, got shape {value.shape}")
    return as_float(value, base.label).T if a.transposed else as_float(value, base.label)


def as_float(value: np.ndarray, label: str) -> np.ndarray:
    """A bound array in a dtype that products cannot overflow silently: integers and booleans
    become float64 (int8 ``100 · 100`` is ``10000.0``, not ``16``); complex stays complex;
    anything else (strings, objects) is refused.

    >>> as_float(np.array([[100]], dtype=np.int8), "A") @ as_float(np.array([[100]], dtype=np.int8), "A")
    array([[10000.]])
    """
    kind = value.dtype.kind
    if kind in "biu":
        return value.astype(np.float64)
    if kind == "f":
        return value if value.dtype.itemsize >= 8 else value.astype(np.float64)
    if kind == "c":
        return value if value.dtype.itemsize >= 16 else value.astype(np.complex128)
    raise BindingError(f"atom {label!r} must be bound to numbers, got an array of dtype {value.dtype}")


def _positive_int(value, what: str) -> int:
    """A size given by the caller (``dims=``, ``slot_sizes=``): a positive integer, else refused."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, sp.Integer)) or int(value) < 1:
        raise BindingError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def infer_dims(expr, bindings: Mapping, dims: Mapping | None = None) -> dict:
    """Sizes of the symbolic dimensions, read off the bound arrays (and ``dims``)."""
    sizes: dict = {}
    for name, value in (dims or {}).items():
        symbol = sp.Symbol(name) if isinstance(name, str) else name
        sizes[sp.sympify(symbol)] = _positive_int(value, f"dims[{str(name)!r}]")
    by_name = {_name(k): v for k, v in sizes.items()}
    bases = {a.base for t in expr for w in t.words for a in w}  # each atom checked once
    for base in sorted(bases, key=lambda a: a.key):
        value = _bound(bindings, base)
        for dim, n in zip((base.rows, base.cols), value.shape):
            if dim.is_number:
                if int(dim) != n:
                    raise BindingError(f"atom {base.label!r} has {dim} as a dimension, bound array has {n}")
                continue
            seen = sizes.get(dim)
            if seen is None:
                seen = by_name.get(dim.name if dim.is_Symbol else str(dim))
            if seen is not None and seen != n:
                raise BindingError(f"dimension {dim} is {seen} elsewhere but {n} in the array bound to {base.label!r}")
            sizes[dim] = n
    return sizes


def _name(dim) -> str:
    """A dimension's name without SymPy's printer (which was most of the time of a sum's check)."""
    return dim.name if getattr(dim, "is_Symbol", False) else str(dim)


def _subs_sizes(value, by_name: dict):
    """Substitute known sizes, matching symbols by name (a ``dims={"d_head": 4}`` entry
    names a plain symbol, the atoms' ``d_head`` carries assumptions); ``by_name``: the sizes
    keyed by their symbols' names, made once per operator."""
    value = sp.sympify(value)
    if not value.free_symbols:
        return value
    return _substituted(value, tuple(sorted((s.name, by_name[s.name]) for s in value.free_symbols if s.name in by_name)))


@lru_cache(maxsize=4096)
def _substituted(value: sp.Expr, sizes: tuple) -> sp.Expr:
    """``value`` with the named sizes put in; kept, since every term of a sum asks again for its slots' sizes."""
    by_name = dict(sizes)
    return value.subs({s: by_name[s.name] for s in value.free_symbols if s.name in by_name})


def _size(dim, by_name: dict) -> int:
    dim = sp.sympify(dim)
    value = _subs_sizes(dim, by_name)
    if not value.is_number:
        raise BindingError(f"the size of {dim} is unknown; bind an atom that has it or pass dims={{'{dim}': ...}}")
    return int(value)


def to_numpy(expr, bindings: Mapping, dims: Mapping | None = None, slot_sizes: Mapping[int, int] | None = None) -> np.ndarray:
    """The dense operator ``Σ c · kron(F_1, …, F_k)`` for small numeric ``bindings``.

    ``bindings`` maps atoms (or their labels, like ``"W_OV^{h1}"``) to 2-D arrays;
    transposed atoms use the transpose. ``dims`` fixes symbolic sizes (``{"n_ctx": 5}``);
    ``slot_sizes`` the size of a slot that holds only ``Id``.

    >>> from tensoralg import atom, term
    >>> A, W = np.arange(4.).reshape(2, 2), np.ones((3, 3))
    >>> bool((to_numpy(term(atom("A", 1), atom("W_OV", 1)), {"A^{1}": A, "W_OV^{1}": W}) == np.kron(A, W)).all())
    True
    """
    expr = expr.expand()
    sizes = infer_dims(expr, bindings, dims)
    by_name = {_name(k): v for k, v in sizes.items()}
    slot_dims = []
    for i, shape in enumerate(expr.slot_shapes):
        if shape is None:
            if not slot_sizes or i not in slot_sizes:
                raise BindingError(f"slot {i} holds only Id; give its size with slot_sizes={{{i}: n}}")
            n = _positive_int(slot_sizes[i], f"slot_sizes[{i}]")
            slot_dims.append((n, n))
        else:
            slot_dims.append((_size(shape[0], by_name), _size(shape[1], by_name)))
    cache: dict = {}

    def word_value(w, i):
        if not w:
            return np.eye(slot_dims[i][0])
        if w not in cache:
            values = [_bound(bindings, a) for a in w]
            for v in values[1:]:  # each partial product sized before it is made (a column times a row)
                check_entries(values[0].shape[0], v.shape[1], "a product of the word's matrices")
            cache[w] = reduce(np.matmul, values)
        return cache[w]

    rows = reduce(lambda a, b: a * b, [r for r, _ in slot_dims], 1)
    cols = reduce(lambda a, b: a * b, [c for _, c in slot_dims], 1)
    check_entries(rows, cols, "the operator")  # sized before it is made (Python ints: no overflow)
    total = np.zeros((rows, cols))
    numbers: dict = {}  # a coefficient's value, once (most terms share a few: 1, 1/sqrt(d_head))
    for t in expr:
        c = numbers.get(t.coeff)
        if c is None:
            coeff = _subs_sizes(t.coeff, by_name)
            if not coeff.is_number:
                raise BindingError(f"coefficient {t.coeff} has unbound symbols {sorted(map(str, coeff.free_symbols))}")
            c = complex(coeff)
            c = numbers[t.coeff] = c.real if c.imag == 0 else c
        if np.iscomplexobj(c) and not np.iscomplexobj(total):
            total = total.astype(complex)
        total = total + c * reduce(np.kron, [word_value(w, i) for i, w in enumerate(t.words)])
    return total
