"""MaxAbsProduct: the float32 and bfloat16 screens return the float64 product's maximum, for any magnitudes."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.conftest import THOROUGH

import numeric_check.verification.bounds as bounds
from numeric_check.verification.bounds import MaxAbsProduct, bf16_screen_available

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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rows_in_blocks_give_each_items_maximum(monkeypatch, dtype):
    """With rows taken a block at a time (a few rows here: the screen's and the direct product's blocks both cut
    inside items), each item's maximum is still its own product's."""
    monkeypatch.setattr(bounds, "ROW_BLOCK", 7 * 50)  # 7 rows a block against 50 columns
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(6, 50, generator=gen, dtype=torch.float64)
    xs = torch.randn(5, 9, 6, generator=gen, dtype=torch.float64) * torch.logspace(-3, 3, 5, dtype=torch.float64)[:, None, None]
    product = MaxAbsProduct([W.to(dtype)], chunk=16, bf16=False)
    got = product.max_abs_each(xs.to(dtype)).tolist()
    for item, value in zip(xs.to(dtype), got):
        assert math.isclose(value, direct(item.double(), [W.to(dtype).double()]), rel_tol=1e-13 if dtype == torch.float64 else 1e-5)
    if dtype == torch.float64:
        assert product.screens["float32"] == 1


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


needs_bf16 = pytest.mark.skipif(not bf16_screen_available(), reason="this CPU has no native bfloat16 products")


@needs_bf16
@THOROUGH
@given(st.integers(0, 2**31 - 1), st.integers(1, 40), st.integers(1, 12), st.integers(1, 300),
       st.integers(-140, 140), st.integers(-140, 140), st.integers(1, 64), st.booleans())
def test_the_bfloat16_screen_equals_the_float64_maximum(seed, rows, k, m, row_exp, col_exp, chunk, as_rows_of_W):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen, dtype=torch.float64) * 2.0**row_exp
    x[0] *= 1e-30  # rows of very different sizes
    W = torch.randn(k, m, generator=gen, dtype=torch.float64) * 2.0**col_exp
    W = W.T.contiguous().T if as_rows_of_W else W  # as the unembedding gives it (W_Uᵀ) or contiguous
    product = MaxAbsProduct([W[:-1], W[-1:]] if k > 1 else [W], chunk=chunk, bf16=True)
    got = product.max_abs([x, x[:1], x[:0]])
    assert got[0] == pytest.approx(direct(x, [W]), rel=1e-13) and got[1] == pytest.approx(direct(x[:1], [W]), rel=1e-13)
    assert got[2] == 0.0
    assert product.screens["bf16"] == 1


@needs_bf16
def test_the_bfloat16_screen_resolves_ties_below_its_precision_and_takes_float32_inputs():
    W = torch.randn(64, 5000, dtype=torch.float64)
    x = torch.randn(20, 64, dtype=torch.float64) / 4
    x[3] *= 4
    x[7] = x[3] * (1 + 1e-12)  # the two largest rows, their maxima apart far below bfloat16's precision
    product = MaxAbsProduct([W], bf16=True)
    assert product.max_abs([x])[0] == pytest.approx(direct(x[7:8], [W]), rel=1e-15)
    x32, W32 = x.float(), W.float()
    exact = float((x32.double() @ W32.double()).abs().max())  # float32 inputs: their product's float64 maximum
    assert MaxAbsProduct([W32], bf16=True).max_abs([x32])[0] == pytest.approx(exact, rel=1e-15)
    assert product.screens == {"bf16": 1, "float32": 0}


@needs_bf16
def test_too_many_entries_near_the_maximum_fall_back_to_the_float32_screen():
    W = torch.ones(16, 9000, dtype=torch.float64)  # every entry of a row equal: nothing to rule out
    x = torch.randn(30, 16, dtype=torch.float64)
    product = MaxAbsProduct([W], bf16=True)
    assert product.max_abs([x])[0] == pytest.approx(direct(x, [W]), rel=1e-15)
    assert product.screens == {"bf16": 1, "float32": 1}


def test_the_bfloat16_screen_is_used_only_where_the_cpu_has_it(monkeypatch):
    W = torch.randn(64, 5000, dtype=torch.float64)
    x = torch.randn(20, 64, dtype=torch.float64)
    monkeypatch.setattr(bounds, "_BF16", [False])  # as on a CPU whose probe failed (or that lacks it)
    product = MaxAbsProduct([W], bf16=True)
    assert product.max_abs([x])[0] == direct(x, [W]) or math.isclose(product.max_abs([x])[0], direct(x, [W]), rel_tol=1e-15)
    assert product.screens["bf16"] == 0
    assert MaxAbsProduct([W], bf16=False).max_abs([x]) and MaxAbsProduct([W]).screens["bf16"] == 0
