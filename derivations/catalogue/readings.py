"""Teaching: the three readings of a tensor product A ⊗ W."""

from __future__ import annotations

from tensoralg import Product, atom, term

from derivations.catalogue.registry import entry
from derivations.derivation import Chain, Derivation
from derivations.render import Math, prose


@entry("tensor-product-readings", "teaching: three equivalent readings of A ⊗ W (left-right multiply, Kronecker, 4-D tensor)")
def tensor_product_readings() -> Derivation:
    A, W = atom("A", "h"), atom("W_OV", "h")
    mix_then_map = Chain.start(None, Product([term(A, None), term(None, W)]), detail="mix positions, then map vectors",
                               intro="Mixing positions and mapping each position's vector are independent, "
                                     "so they commute and combine into one tensor product:").expand()
    map_then_mix = Chain.start(None, Product([term(None, W), term(A, None)]),
                               detail="map vectors, then mix positions").expand()
    return Derivation(
        "tensor-product-readings", "Three readings of A ⊗ W",
        "The tensor product of a pattern A (positions) and a matrix W (residual stream) can be read three "
        "equivalent ways.",
        (mix_then_map, map_then_mix),
        notes=(
            prose("Left-right multiplication: with x holding one row per position, ",
                  Math(r"(A \otimes W)\cdot x = A\, x\, W^{\top}", "(A ⊗ W)·x = A x Wᵀ"),
                  " (in the paper's column convention, ", Math(r"W x A^{\top}", "W x Aᵀ"), ")."),
            prose("Kronecker product: on the row-major vectorisation, ",
                  Math(r"\mathrm{vec}(A\, x\, W^{\top}) = (A \otimes_K W)\, \mathrm{vec}(x)",
                       "vec(A x Wᵀ) = kron(A, W) vec(x)"),
                  ", a matrix of size (n_ctx d_model) x (n_ctx d_model)."),
            prose("A 4-D tensor: ", Math(r"T_{i a j b} = A_{ij} W_{ab}", "T[i,a,j,b] = A[i,j] W[a,b]"), " and ",
                  Math(r"y_{ia} = \sum_{j,b} T_{iajb}\, x_{jb}", "y[i,a] = Σ_{j,b} T[i,a,j,b] x[j,b]"),
                  ": position i of the output takes from every position j, through W."),
        ),
    )
