"""MaxAbsProduct: the float32 screen returns the float64 product's maximum, for any magnitudes."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.conftest import THOROUGH

from numeric_check.verification.bounds import MaxAbsProduct

torch.set_num_threads(1)


def direct(x: torch.Tensor, blocks) -> float:
    F = torch.cat(blocks)
    return float((x.reshape(-1, F.shape[0]) @ F).abs().max()) if x.numel() else 0.0


@THOROUGH
@given(st.integers(0, 2**31 - 1), st.integers(1, 40), st.integers(1, 12), st.integers(1, 300),
       st.integers(-140, 140), st.integers(-140, 140), st.integers(1, 64))
def test_equals_the_float64_maximum(seed, rows, k, m, row_exp, col_exp, chunk):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen, dtype=torch.float64) * 2.0**row_exp
    x[0] *= 1e-30  # rows of very different sizes
    W = torch.randn(k - 1 if k > 1 else 1, m, generator=gen, dtype=torch.float64) * 2.0**col_exp
    blocks = [W, torch.randn(1, m, generator=gen, dtype=torch.float64)] if k > 1 else [W]
    got = MaxAbsProduct(blocks, chunk=chunk).max_abs([x, x[:1], x[:0]])
    assert math.isclose(got[0], direct(x, blocks), rel_tol=1e-13)
    assert math.isclose(got[1], direct(x[:1], blocks), rel_tol=1e-13)
    assert got[2] == 0.0


def test_near_ties_are_resolved_in_float64():
    # two rows whose maxima differ below float32 precision: the screen cannot tell them apart
    W = torch.randn(16, 500, dtype=torch.float64)
    x = torch.randn(1, 16, dtype=torch.float64)
    y = x * (1 + 1e-12)
    assert MaxAbsProduct([W]).max_abs([torch.cat([x, y])])[0] == direct(y, [W])


def test_bound_holds_and_nan_propagates():
    W = torch.randn(8, 100, dtype=torch.float64)
    x = torch.randn(5, 8, dtype=torch.float64)
    product = MaxAbsProduct([W])
    assert product.bound(x) >= direct(x, [W])
    x[2, 3] = float("nan")
    assert math.isnan(product.max_abs([x])[0])


def test_float32_inputs_are_computed_directly():
    W = torch.randn(8, 100)
    x = torch.randn(5, 8)
    assert MaxAbsProduct([W]).max_abs([x])[0] == float((x @ W).abs().max())
