"""Factored products: every method against the dense computation, plus TransformerLens's FactoredMatrix."""

from __future__ import annotations

import math
from functools import reduce

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from numeric_check.circuits.factored import (
    Factored,
    chain_cost,
    chain_product,
    eigenvalue_multiset_distance,
)
from numeric_check.errors import FactoredError, FactoredShapeError, NumericCheckError
from tensoralg.errors import TCircuitsError, TensorAlgError
from tests.conftest import PROPERTY
from tests.strategies import factor_chain_pairs, factor_chains

torch.set_num_threads(1)


def dense(factors):
    return reduce(torch.matmul, factors)


def scale(factors) -> float:
    """Product of the factors' norms: bounds |entries| of the product, a scale for tolerances."""
    return math.prod(float(torch.linalg.matrix_norm(f).max()) for f in factors) + 1.0


def batch_items(tensor: torch.Tensor, n_trailing: int) -> torch.Tensor:
    """``tensor`` with its batch dimensions flattened into one (the last ``n_trailing`` kept)."""
    return tensor.reshape((-1,) + tensor.shape[tensor.ndim - n_trailing :])


# --- properties against the dense product ----------------------------------------------------


@PROPERTY
@given(factor_chains(batched=True))
def test_materialize_shape_and_transpose(factors):
    F, M = Factored(*factors), dense(factors)
    assert F.shape == M.shape
    assert F.rank_bound == min(F.dims)
    torch.testing.assert_close(F.materialize(), M)
    torch.testing.assert_close(F.T.materialize(), M.mT)


@PROPERTY
@given(factor_chains(square=True, batched=True))
def test_eigenvalues_are_the_dense_multiset_with_zeros(factors):
    F, M = Factored(*factors), dense(factors)
    values = F.eigenvalues()
    assert values.shape == F.batch_shape + (F.rank_bound,)
    values = values.expand(M.shape[:-2] + values.shape[-1:])
    for ours, full in zip(batch_items(values, 1), batch_items(M, 2)):
        # the full set is ours plus (n - r) zeros
        assert eigenvalue_multiset_distance(ours, torch.linalg.eigvals(full)) <= 1e-6 * scale(factors)


@PROPERTY
@given(factor_chains(square=True, batched=True))
def test_trace_and_diag(factors):
    F, M = Factored(*factors), dense(factors)
    torch.testing.assert_close(F.diag(), M.diagonal(dim1=-2, dim2=-1))
    torch.testing.assert_close(F.trace(), M.diagonal(dim1=-2, dim2=-1).sum(-1))


@PROPERTY
@given(factor_chains(batched=True))
def test_frobenius_norm_through_grams(factors):
    F, M = Factored(*factors), dense(factors)
    ours, theirs = F.frobenius_norm(), torch.linalg.matrix_norm(M)
    assert ours.shape == theirs.shape
    # squared norms agree to rounding of the Gram products (cancellation-safe bound)
    assert float((ours**2 - theirs**2).abs().max()) <= 1e-10 * scale(factors) ** 2


@PROPERTY
@given(factor_chains(batched=True))
def test_svd_singular_values_and_reconstruction(factors):
    F, M = Factored(*factors), dense(factors)
    U, S, V = F.svd()
    r = F.rank_bound
    assert S.shape[-1] == r and U.shape[-1] == r and V.shape[-1] == r
    full = torch.linalg.svdvals(M)
    tol = 1e-9 * scale(factors)
    assert float((S - full[..., :r]).abs().max()) <= tol
    assert full[..., r:].numel() == 0 or float(full[..., r:].abs().max()) <= tol  # the rest are zero
    torch.testing.assert_close(U @ torch.diag_embed(S) @ V.mT, M.expand(U.shape[:-2] + M.shape[-2:]), atol=tol, rtol=0)
    eye = torch.eye(r, dtype=U.dtype)
    torch.testing.assert_close(U.mT @ U, eye.expand(U.shape[:-2] + (r, r)), atol=1e-9, rtol=0)
    torch.testing.assert_close(V.mT @ V, eye.expand(V.shape[:-2] + (r, r)), atol=1e-9, rtol=0)


@PROPERTY
@given(factor_chains(batched=True), st.data())
def test_rows_columns_and_topk(factors, data):
    F, M = Factored(*factors), dense(factors)
    i = data.draw(st.integers(-M.shape[-2], M.shape[-2] - 1))
    j = data.draw(st.integers(-M.shape[-1], M.shape[-1] - 1))
    torch.testing.assert_close(F.row(i), M[..., i, :])
    torch.testing.assert_close(F.col(j), M[..., :, j])
    k = data.draw(st.integers(1, M.shape[-1]))
    largest = data.draw(st.booleans())
    top = F.topk_row(i, k, largest=largest)
    torch.testing.assert_close(top.values, torch.topk(M[..., i, :], k, largest=largest).values)
    torch.testing.assert_close(torch.gather(M[..., i, :], -1, top.indices), top.values)
    k = data.draw(st.integers(1, M.shape[-2]))
    torch.testing.assert_close(F.topk_col(j, k).values, torch.topk(M[..., :, j], k).values)


@PROPERTY
@given(factor_chain_pairs())
def test_sums_stack_factors(pair):
    first, second = pair
    P, Q = Factored(*first), Factored(*second)
    total = P + Q
    assert len(total.factors) == max(len(first), len(second))
    torch.testing.assert_close(total.materialize(), dense(first) + dense(second))
    torch.testing.assert_close((P - Q).materialize(), dense(first) - dense(second))
    torch.testing.assert_close((2.5 * P).materialize(), 2.5 * dense(first))
    torch.testing.assert_close((-Q).materialize(), -dense(second))


@PROPERTY
@given(factor_chains(max_factors=3), factor_chains(max_factors=2), st.integers(0, 2**31 - 1))
def test_matmul_keeps_products_factored(left, right, seed):
    gen = torch.Generator().manual_seed(seed)
    right = [torch.randn(left[-1].shape[-1], right[0].shape[-2], generator=gen, dtype=torch.float64)] + right
    F, G = Factored(*left), Factored(*right)
    product = F @ G
    assert isinstance(product, Factored) and len(product.factors) == len(left) + len(right)
    torch.testing.assert_close(product.materialize(), dense(left) @ dense(right))
    torch.testing.assert_close((F @ right[0]).materialize(), dense(left) @ right[0])
    torch.testing.assert_close((left[0] @ Factored(*left[1:])).materialize() if len(left) > 1 else F.materialize(), dense(left))
    v = torch.randn(F.shape[-1], generator=gen, dtype=torch.float64)
    u = torch.randn(F.shape[-2], generator=gen, dtype=torch.float64)
    torch.testing.assert_close(F @ v, dense(left) @ v)
    torch.testing.assert_close(u @ F, u @ dense(left))


@PROPERTY
@given(factor_chains(min_factors=2, max_factors=6, max_dim=30, batched=True))
def test_chain_product_is_optimal_order_and_exact(factors):
    torch.testing.assert_close(chain_product(factors), dense(factors))
    # the plan is never worse than left-to-right evaluation
    left_to_right, batch, rows = 0, factors[0].shape[:-2], factors[0].shape[-2]
    for f in factors[1:]:
        batch = torch.broadcast_shapes(batch, f.shape[:-2])
        left_to_right += math.prod(batch) * rows * f.shape[-2] * f.shape[-1]
    assert chain_cost(factors) <= left_to_right


# --- specific behaviour ---------------------------------------------------------------------------


def test_shared_unbatched_product_is_formed_once():
    """An OV circuit of 6 heads: the plan multiplies W_E W_U once, not V W_E per head."""
    d_vocab, d_model, d_head, heads = 1000, 16, 2, 6
    W_U, W_E = torch.randn(d_vocab, d_model), torch.randn(d_model, d_vocab)
    O, V = torch.randn(heads, d_model, d_head), torch.randn(heads, d_head, d_model)
    rotated = [V, W_E, W_U, O]
    shared = d_model * d_vocab * d_model + heads * (d_head * d_model * d_model + d_head * d_model * d_head)
    assert chain_cost(rotated) == shared


def test_eigenvalues_of_a_large_low_rank_product_without_materialising():
    gen = torch.Generator().manual_seed(0)
    A, B = torch.randn(20000, 3, generator=gen, dtype=torch.float64), torch.randn(3, 20000, generator=gen, dtype=torch.float64)
    values = Factored(A, B).eigenvalues()
    assert eigenvalue_multiset_distance(values, torch.linalg.eigvals(B @ A)) < 1e-9
    torch.testing.assert_close(Factored(A, B).frobenius_norm() ** 2, torch.trace((A.T @ A) @ (B @ B.T)))


def test_dtype_option_and_to():
    A, B = torch.randn(4, 2), torch.randn(2, 4)
    assert Factored(A, B).dtype == torch.float32
    assert Factored(A, B, dtype=torch.float64).dtype == torch.float64
    assert Factored(A, B.double()).dtype == torch.float64  # promoted
    assert Factored(A, B).to(torch.float64).materialize().dtype == torch.float64
    assert Factored(A.half(), B.half()).eigenvalues().dtype == torch.complex64


def test_batch_indexing_selects_one_product():
    W_U, W_E = torch.randn(7, 4), torch.randn(4, 7)
    O, V = torch.randn(2, 3, 4, 2), torch.randn(2, 3, 2, 4)
    F = Factored(W_U, O, V, W_E)
    one = F[1, 2]
    assert one.shape == (7, 7)
    torch.testing.assert_close(one.materialize(), W_U @ O[1, 2] @ V[1, 2] @ W_E)
    assert F[1].shape == (3, 7, 7) and F[:, 1].shape == (2, 7, 7)
    assert repr(one) == "Factored([7×4] @ [4×2] @ [2×4] @ [4×7], shape [7×7])"


def test_eigenvalue_multiset_distance_ignores_order_and_pads_zeros():
    assert eigenvalue_multiset_distance(torch.tensor([1 + 1j, 1 - 1j, 0]), torch.tensor([1 - 1j, 1 + 1j])) == 0.0
    assert eigenvalue_multiset_distance(torch.tensor([1.0, 2.0]), torch.tensor([2.0, 1.5])) == pytest.approx(0.5)


def test_matches_transformer_lens_factored_matrix():
    FactoredMatrix = pytest.importorskip("transformer_lens.FactoredMatrix").FactoredMatrix
    gen = torch.Generator().manual_seed(3)
    A, B = torch.randn(12, 3, 30, 4, generator=gen, dtype=torch.float64), torch.randn(12, 3, 4, 30, generator=gen, dtype=torch.float64)
    C = torch.randn(30, 25, generator=gen, dtype=torch.float64)
    ours, theirs = Factored(A, B), FactoredMatrix(A, B)
    torch.testing.assert_close(ours.frobenius_norm(), theirs.norm())
    torch.testing.assert_close(ours.svd().S, theirs.S)
    U, S, V = ours.svd()
    torch.testing.assert_close(U @ torch.diag_embed(S) @ V.mT, theirs.U @ torch.diag_embed(theirs.S) @ theirs.V.mT)
    for a, b in zip(ours.eigenvalues().reshape(-1, 4), theirs.eigenvalues.reshape(-1, 4)):
        assert eigenvalue_multiset_distance(a, b) < 1e-10
    torch.testing.assert_close((ours @ C).materialize(), (theirs @ C).AB)
    torch.testing.assert_close((ours @ C).svd().S, (theirs @ C).S)


# --- bad input ----------------------------------------------------------------------------------


def test_errors_say_what_was_wrong():
    with pytest.raises(FactoredError, match="at least one factor"):
        Factored()
    with pytest.raises(FactoredShapeError, match=r"factors 0 \[3×4\] and 1 \[5×2\] do not chain"):
        Factored(torch.zeros(3, 4), torch.zeros(5, 2))
    with pytest.raises(FactoredShapeError, match="at least 2 dimensions"):
        Factored(torch.zeros(3))
    with pytest.raises(FactoredError, match="must be a torch.Tensor"):
        Factored([[1.0]], torch.zeros(1, 1))
    with pytest.raises(FactoredShapeError, match="do not broadcast"):
        Factored(torch.zeros(2, 3, 4), torch.zeros(3, 4, 3))
    F = Factored(torch.zeros(3, 2), torch.zeros(2, 4))
    with pytest.raises(FactoredError, match=r"eigenvalues\(\) needs a square product, got shape \[3×4\]"):
        F.eigenvalues()
    with pytest.raises(FactoredError, match="row index 3 is out of range"):
        F.row(3)
    with pytest.raises(FactoredError, match=r"k must be an int in 1..4"):
        F.topk_row(0, 5)
    with pytest.raises(FactoredShapeError, match=r"cannot add products of shapes \[3×4\] and \[4×3\]"):
        F + F.T
    with pytest.raises(FactoredError, match="takes at most 0 int or slice indices"):
        F[0]
    with pytest.raises(FactoredError, match="needs a scalar"):
        F * torch.ones(2)
    # one tree: catchable as the package's errors and the project's, never as the algebra's
    assert issubclass(FactoredShapeError, FactoredError) and issubclass(FactoredError, NumericCheckError)
    assert issubclass(FactoredError, TCircuitsError) and issubclass(FactoredError, ValueError)
    assert not issubclass(FactoredShapeError, TensorAlgError)
