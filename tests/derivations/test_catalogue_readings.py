"""The three readings of A ⊗ W, worked on concrete matrices, checked with numpy."""

import numpy as np
from hypothesis import given, strategies as st

from derivations import catalogue
from derivations.catalogue.readings import readings_example

from tests.conftest import PROPERTY
from tests.strategies import fraction_matrices


def as_array(M):
    return np.array(M, dtype=float)


def test_each_reading_of_the_printed_example_agrees_with_numpy():
    ex = readings_example()
    A, W, x = as_array(ex.A), as_array(ex.W), as_array(ex.x)
    n, d = x.shape
    operator = A @ x @ W.T  # the paper: one token per row, (A ⊗ W)·x = A x Wᵀ
    kronecker = (np.kron(A, W) @ x.reshape(-1)).reshape(n, d)  # row-major vec(x)
    T = np.einsum("ij,ab->iajb", A, W)
    tensor = np.einsum("iajb,jb->ia", T, x)
    for reading in (operator, kronecker, tensor):
        np.testing.assert_array_equal(reading, as_array(ex.operator))
    np.testing.assert_array_equal(as_array(ex.kronecker), operator)
    np.testing.assert_array_equal(as_array(ex.tensor), operator)
    np.testing.assert_array_equal(as_array(ex.kron_matrix), np.kron(A, W))
    np.testing.assert_array_equal(np.kron(A, W).reshape(n, d, n, d), T)


def test_the_broadcast_of_the_old_text_is_the_other_index_order():
    """``A[:, :, None, None] * W[None, None]`` is T[i,j,a,b], not T[i,a,j,b] (the defect of the issue)."""
    ex = readings_example()
    A, W = as_array(ex.A), as_array(ex.W)
    broadcast = A[:, :, None, None] * W[None, None, :, :]
    T = np.einsum("ij,ab->iajb", A, W)
    np.testing.assert_array_equal(broadcast, T.transpose(0, 2, 1, 3))
    assert not np.array_equal(broadcast, T)


@PROPERTY
@given(st.integers(1, 3).flatmap(lambda n: st.integers(1, 3).flatmap(lambda d: st.tuples(
    fraction_matrices(n, n), fraction_matrices(d, d), fraction_matrices(n, d)))))
def test_the_three_readings_agree_exactly_on_any_matrices(mats):
    A, W, x = mats
    ex = readings_example(A, W, x)
    assert ex.operator == ex.kronecker == ex.tensor
    np.testing.assert_allclose(as_array(ex.operator), as_array(A) @ as_array(x) @ as_array(W).T, atol=1e-12)


def test_the_document_prints_the_worked_example_and_the_paper_convention():
    d = catalogue.get("tensor-product-readings")
    latex = d.to_latex()
    ex = readings_example()
    assert latex.count(r"\begin{bmatrix}") >= 6
    assert r"A\, x\, W^{\top}" in latex and "T_{iajb} = A_{ij} W_{ab}" in latex
    text = " ".join(d.to_text().split())
    assert "A x Wᵀ = [5 2; 3 1]" in text and "column convention" not in text
    assert "T[i,a,j,b]" in text and "T[i,j,a,b]" not in text
    assert d.verify().ok and d.numeric.dims == {"n_ctx": 2, "d_model": 2}
    assert ex.operator == ((5, 2), (3, 1))
