"""Hypothesis strategies for factored products: chains of small random float64 matrices.

Values come from a seeded torch generator (hypothesis draws the dimensions, the batch
shapes and the seed), so examples are cheap and shrink to small dimensions.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st


def _fill(shapes: list[tuple[int, ...]], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in shapes]


@st.composite
def factor_chains(
    draw,
    min_factors: int = 1,
    max_factors: int = 4,
    max_dim: int = 6,
    square: bool = False,
    batched: bool = False,
) -> list[torch.Tensor]:
    """Tensors ``F_1 … F_n`` that chain (``[d_0, d_1], [d_1, d_2], …``); ``square``: ``d_n = d_0``.

    ``batched``: each factor may carry its own leading dimensions, broadcastable against the
    others (absent, of size 1, or of the drawn size), as per-head weights next to shared ones.
    """
    n = draw(st.integers(min_factors, max_factors))
    dims = draw(st.lists(st.integers(1, max_dim), min_size=n + 1, max_size=n + 1))
    if square:
        dims[-1] = dims[0]
    batch = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)) if batched else []
    shapes = []
    for i in range(n):
        own = [draw(st.sampled_from([1, size])) for size in batch] if batch and draw(st.booleans()) else []
        shapes.append(tuple(own) + (dims[i], dims[i + 1]))
    return _fill(shapes, draw(st.integers(0, 2**31 - 1)))


@st.composite
def factor_chain_pairs(draw, max_factors: int = 4, max_dim: int = 5) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Two chains of (possibly different) lengths with the same outer shape, for sums."""
    rows, cols = draw(st.integers(1, max_dim)), draw(st.integers(1, max_dim))

    def chain() -> list[tuple[int, int]]:
        n = draw(st.integers(1, max_factors))
        inner = draw(st.lists(st.integers(1, max_dim), min_size=n - 1, max_size=n - 1))
        dims = [rows, *inner, cols]
        return [(dims[i], dims[i + 1]) for i in range(n)]

    first, second = chain(), chain()
    tensors = _fill(first + second, draw(st.integers(0, 2**31 - 1)))
    return tensors[: len(first)], tensors[len(first) :]
