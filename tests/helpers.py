"""Helpers shared by the tests: numeric bindings, numeric equality, standard expressions."""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import sympy as sp

from tensoralg import Add, Atom, Expr, Product, TensorSum, add, atom, identity, term, to_numpy

# Small numeric sizes of the symbolic dimensions; all different, so a transposed or
# misplaced factor fails loudly in numpy as well.
SIZES = {"n_ctx": 3, "d_model": 4, "d_head": 2, "d_vocab": 5, "d_mlp": 6}
DEFAULT_SIZE = 3  # for a dimension not in SIZES (declared atoms)

# Derived atoms bound consistently with their definitions: name -> (left, right, transpose left)
_DERIVED = {"W_OV": ("W_O", "W_V", False), "W_QK": ("W_Q", "W_K", True)}


def base_atoms(*exprs: Expr | Atom | Iterable) -> set[Atom]:
    """The untransposed atoms of expressions (without expanding lazy products)."""
    found: set[Atom] = set()
    for e in exprs:
        if isinstance(e, Atom):
            found.add(e.base)
        elif isinstance(e, Product):
            found |= base_atoms(*e.factors)
        elif isinstance(e, Add):
            found |= base_atoms(*e.parts)
        elif isinstance(e, TensorSum):
            found |= {a.base for t in e for w in t.words for a in w}
        else:  # a word
            found |= {a.base for a in e}
    return found


def size_of(dim, sizes: Mapping[str, int] = SIZES) -> int:
    """The numeric size of a symbolic dimension (``d_model`` -> 4)."""
    dim = sp.sympify(dim)
    value = dim.subs({s: sizes.get(s.name, DEFAULT_SIZE) for s in dim.free_symbols})
    return int(value)


def random_bindings(*exprs, seed: int = 0, sizes: Mapping[str, int] = SIZES) -> dict[str, np.ndarray]:
    """Random arrays for every atom of ``exprs``, keyed by label (``"W_OV^{h1}"``).

    Entries are normal with variance ``1/cols`` (long words stay of order one); symmetric
    atoms are symmetric; ``W_OV^{i} = W_O^{i} W_V^{i}`` and ``W_QK^{i} = W_Q^{i}ᵀ W_K^{i}``
    hold for every index, so folding and unfolding definitions keep the numbers.
    """
    rng = np.random.default_rng(seed)
    wanted = base_atoms(*exprs)
    for a in list(wanted):
        if a.name in _DERIVED:
            left, right, _ = _DERIVED[a.name]
            wanted |= {atom(left, a.index), atom(right, a.index)}
    values: dict[str, np.ndarray] = {}
    for a in sorted(wanted, key=lambda a: a.key):
        if a.name in _DERIVED:
            continue
        rows, cols = size_of(a.rows, sizes), size_of(a.cols, sizes)
        value = rng.normal(size=(rows, cols)) / np.sqrt(cols)
        values[a.label] = (value + value.T) / 2 if a.symmetric else value
    for a in wanted:
        if a.name in _DERIVED:
            left, right, transpose_left = _DERIVED[a.name]
            lv = values[atom(left, a.index).label]
            values[a.label] = (lv.T if transpose_left else lv) @ values[atom(right, a.index).label]
    return values


def slot_sizes_of(*exprs: Expr, sizes: Mapping[str, int] = SIZES, default: int = 2) -> dict[int, int]:
    """Slot sizes for slots that hold only ``Id``, read from whichever expression knows the slot."""
    n = exprs[0].n_slots
    out = {}
    for i in range(n):
        shapes = [e.slot_shapes[i] for e in exprs if e.slot_shapes[i] is not None]
        out[i] = size_of(shapes[0][0], sizes) if shapes else default
    return out


def numeric(expr: Expr, bindings: Mapping, sizes: Mapping[str, int] = SIZES, slot_sizes=None) -> np.ndarray:
    """The dense operator of ``expr`` with the test sizes."""
    return to_numpy(expr, bindings, dims=dict(sizes), slot_sizes=slot_sizes or slot_sizes_of(expr, sizes=sizes))


def assert_numerically_equal(expr1: Expr, expr2: Expr, seed: int = 0, bindings: Mapping | None = None,
                             sizes: Mapping[str, int] = SIZES, rtol: float = 1e-9, atol: float = 1e-9) -> None:
    """Both expressions give the same dense operator on random bindings of their atoms."""
    bindings = bindings if bindings is not None else random_bindings(expr1, expr2, seed=seed, sizes=sizes)
    slots = slot_sizes_of(expr1, expr2, sizes=sizes)
    left = to_numpy(expr1, bindings, dims=dict(sizes), slot_sizes=slots)
    right = to_numpy(expr2, bindings, dims=dict(sizes), slot_sizes=slots)
    np.testing.assert_allclose(left, right, rtol=rtol, atol=atol, err_msg=f"\n{expr1!r}\n!=\n{expr2!r}")


def head(layer: int, h: int) -> str:
    """The head label used everywhere: ``L{l}H{h}``."""
    return f"L{layer}H{h}"


def transformer_product(n_layers: int, n_heads: int) -> Product:
    """``(Id⊗W_U) · Π_{l<L} (Id + Σ_{h<H} A^{l,h} ⊗ W_OV^{l,h}) · (Id⊗W_E)``, last layer leftmost."""
    layers = [
        identity(2) + add(*[term(atom("A", head(l, h)), atom("W_OV", head(l, h))) for h in range(n_heads)])
        for l in range(n_layers)
    ]
    return Product([term(None, atom("W_U")), *reversed(layers), term(None, atom("W_E"))])
