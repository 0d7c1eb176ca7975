"""Teaching: the three readings of a tensor product ``A ⊗ W``, worked on small matrices.

The same operator is (1) ``A x Wᵀ`` on an activation ``x`` with one row per token, as the
paper writes it; (2) the Kronecker matrix ``kron(A, W)`` on the row-major ``vec(x)``; (3) the
4-D tensor ``T[i, a, j, b] = A[i, j] W[a, b]`` contracted with ``x[j, b]``.
:func:`readings_example` computes all three exactly, and the entry prints them.

>>> ex = readings_example()
>>> ex.operator == ex.kronecker == ex.tensor
True
>>> ex.operator
((Fraction(5, 1), Fraction(2, 1)), (Fraction(3, 1), Fraction(1, 1)))
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from tensoralg import Atom, Product, atom, d_model, term

from derivations.catalogue.registry import entry
from derivations.derivation import Chain, Derivation, Numeric
from derivations.document import Math, math, prose

Matrix = tuple[tuple[Fraction, ...], ...]

HALF = Fraction(1, 2)
PATTERN: Matrix = ((Fraction(1), Fraction(0)), (HALF, HALF))  # position 1 attends half to 0, half to itself
MAP: Matrix = ((Fraction(1), Fraction(1)), (Fraction(0), Fraction(1)))  # W on the residual stream (d = 2)
ACTIVATION: Matrix = ((Fraction(3), Fraction(2)), (Fraction(1), Fraction(0)))  # x: one row per token


@dataclass(frozen=True)
class ReadingsExample:
    """``A``, ``W``, ``x`` and ``(A ⊗ W)·x`` computed by each reading (exact fractions)."""

    A: Matrix
    W: Matrix
    x: Matrix
    operator: Matrix  # A x Wᵀ
    kronecker: Matrix  # kron(A, W) vec(x), reshaped to rows
    tensor: Matrix  # Σ_{j,b} T[i,a,j,b] x[j,b]
    kron_matrix: Matrix


def _matmul(P: Matrix, Q: Matrix) -> Matrix:
    return tuple(tuple(sum((P[i][k] * Q[k][j] for k in range(len(Q))), Fraction(0)) for j in range(len(Q[0])))
                 for i in range(len(P)))


def _transpose(P: Matrix) -> Matrix:
    return tuple(zip(*P))


def kron(P: Matrix, Q: Matrix) -> Matrix:
    """The Kronecker product: entry ``[(i, a), (j, b)] = P[i][j] Q[a][b]``, row-major pairs."""
    return tuple(tuple(P[i][j] * Q[a][b] for j in range(len(P[0])) for b in range(len(Q[0])))
                 for i in range(len(P)) for a in range(len(Q)))


def readings_example(A: Matrix = PATTERN, W: Matrix = MAP, x: Matrix = ACTIVATION) -> ReadingsExample:
    """``(A ⊗ W)·x`` three ways: ``A x Wᵀ``; ``kron(A, W) vec(x)``; ``Σ_{j,b} A[i,j] W[a,b] x[j,b]``."""
    n, d = len(A), len(W)
    operator = _matmul(_matmul(A, x), _transpose(W))
    K = kron(A, W)
    vec = [x[j][b] for j in range(n) for b in range(d)]
    flat = [sum((K[r][c] * vec[c] for c in range(n * d)), Fraction(0)) for r in range(n * d)]
    kronecker = tuple(tuple(flat[i * d + a] for a in range(d)) for i in range(n))
    T = {(i, a, j, b): A[i][j] * W[a][b] for i in range(n) for a in range(d) for j in range(n) for b in range(d)}
    tensor = tuple(tuple(sum((T[i, a, j, b] * x[j][b] for j in range(n) for b in range(d)), Fraction(0))
                         for a in range(d)) for i in range(n))
    return ReadingsExample(A, W, x, operator, kronecker, tensor, K)


def _number(q: Fraction) -> str:
    if q.denominator == 1:
        return str(q.numerator)
    sign = "-" if q < 0 else ""
    return rf"{sign}\tfrac{{{abs(q.numerator)}}}{{{q.denominator}}}"


def bmatrix(M: Matrix) -> str:
    """A matrix of fractions as a LaTeX ``bmatrix``."""
    return r"\begin{bmatrix}" + r" \\ ".join(" & ".join(_number(q) for q in row) for row in M) + r"\end{bmatrix}"


def _text(M: Matrix) -> str:
    return "[" + "; ".join(" ".join(str(q) for q in row) for row in M) + "]"


def matrix_math(name_latex: str, name_text: str, M: Matrix) -> Math:
    """``name = [[…]]`` as hand-built Math (a bmatrix is beyond the slide notation)."""
    return Math(f"{name_latex} = {bmatrix(M)}", f"{name_text} = {_text(M)}")


def _bound(M: Matrix):
    return lambda a, shape, rng: np.array(M, dtype=float)


@entry("tensor-product-readings", "teaching: three readings of A ⊗ W (operator on x, Kronecker matrix, 4-D tensor)")
def tensor_product_readings() -> Derivation:
    A, W = atom("A", "h"), Atom("W", d_model, d_model)
    ex = readings_example()
    mix_then_map = Chain.start(None, Product([term(A, None), term(None, W)]), detail="mix positions, then map vectors",
                               intro="Mixing positions and mapping each position's vector are independent, "
                                     "so they commute and combine into one tensor product:").expand()
    map_then_mix = Chain.start(None, Product([term(None, W), term(A, None)]),
                               detail="map vectors, then mix positions").expand()
    y_latex, y_text = r"(A \otimes W)\cdot x", "(A ⊗ W)·x"
    return Derivation(
        "tensor-product-readings", "Three readings of a tensor product",
        "The tensor product of a pattern over positions and a matrix on the residual stream is one operator, "
        "read three equivalent ways; each is worked below on the same small example.",
        (mix_then_map, map_then_mix),
        notes=(
            prose("The example: two positions and a two-dimensional residual stream, ",
                  matrix_math("A", "A", ex.A), ", ", matrix_math("W", "W", ex.W), " and the activation ",
                  matrix_math("x", "x", ex.x), " (one row per token). The chains below are checked numerically on these matrices."),
            prose("Reading 1, an operator on ", math("x"), " with one row per token, as the paper writes it: ",
                  Math(rf"{y_latex} = A\, x\, W^{{\top}} = {bmatrix(ex.operator)}", f"{y_text} = A x Wᵀ = {_text(ex.operator)}"),
                  ". Row i of the result is the mix of the tokens' rows by row i of ", math("A"),
                  ", each mapped by ", math("W"), "."),
            prose("Reading 2, a Kronecker matrix on the row-major vectorisation ",
                  math("vec(x) = (x_00, x_01, x_10, x_11)"), ": ",
                  matrix_math(r"A \otimes_K W", "kron(A, W)", ex.kron_matrix), " and ",
                  Math(r"\mathrm{vec}\bigl((A \otimes W)\cdot x\bigr) = (A \otimes_K W)\, \mathrm{vec}(x)",
                       "vec((A ⊗ W)·x) = kron(A, W) vec(x)"),
                  ", an ", math("(n_ctx d_model) × (n_ctx d_model)"),
                  " matrix whose row (i, a) and column (j, b) hold ", math("A_ij W_ab"), "."),
            prose("Reading 3, a 4-D tensor ", Math(r"T_{iajb} = A_{ij} W_{ab}", "T[i,a,j,b] = A[i,j] W[a,b]"),
                  " (in numpy ", Math(r"\mathrm{einsum}(ij, ab \to iajb)", "einsum('ij,ab->iajb')"),
                  ", which is also the Kronecker matrix reshaped to 2 x 2 x 2 x 2), contracted as ",
                  Math(r"y_{ia} = \sum_{j,b} T_{iajb}\, x_{jb}", "y[i,a] = Σ_{j,b} T[i,a,j,b] x[j,b]"),
                  ": output position i takes from every position j, through ", math("W"), ". All three give ",
                  matrix_math("y", "y", ex.tensor), "."),
        ),
        numeric=Numeric(dims={"n_ctx": 2, "d_model": 2}, special={"A": _bound(ex.A), "W": _bound(ex.W)}),
    )
