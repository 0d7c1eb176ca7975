"""Numeric meaning: the three readings of ``A ⊗ W``, the sandwich, bindings and their errors."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from tensoralg import BindingError, SlotMismatch, ShapeMismatch, atom, d_head, identity, sandwich, term, to_numpy
from tests.helpers import SIZES, numeric, random_bindings
from tests.strategies import PROPERTY, seeds, streams, words

A, W_U, W_OV = atom("A", "h"), atom("W_U"), atom("W_OV", "h")


@PROPERTY
@given(seeds(), st.sampled_from(["W_U", "W_OV", "W_E", "W_Q"]))
def test_three_readings_of_a_tensor_w_agree(seed, w_name):
    """``(A ⊗ W)·x`` as ``A x Wᵀ``, as ``kron(A, W)`` on row-major vec(x), and as a 4-D tensor."""
    w_atom = atom(w_name, "h")
    bindings = random_bindings(term(A, w_atom), seed=seed)
    a, w = bindings["A^{h}"], bindings[w_atom.label]
    x = np.random.default_rng(seed).normal(size=(a.shape[1], w.shape[1]))  # one row per position
    matrix = a @ x @ w.T
    kron = to_numpy(term(A, w_atom), bindings)
    np.testing.assert_allclose(kron, np.kron(a, w))
    np.testing.assert_allclose((kron @ x.reshape(-1)).reshape(matrix.shape), matrix, atol=1e-12)
    four = a[:, :, None, None] * w[None, None, :, :]  # [i, j, k, l] = A[i, j] W[k, l]
    np.testing.assert_allclose(np.einsum("ijkl,jl->ik", four, x), matrix, atol=1e-12)


@PROPERTY
@given(streams(), streams(), st.one_of(st.just((atom("W_QK", "2"),)), words("d_model")), seeds())
def test_sandwich_equals_the_bilinear_form_of_the_streams(left, right, middle, seed):
    """``S = (L x) M (R x)ᵀ`` equals ``Σ P x (W_pᵀ M W_q) xᵀ Qᵀ`` over the 3-slot terms."""
    s = sandwich(left, middle, right)
    bindings = random_bindings(left, right, middle, seed=seed)
    n, v, d = SIZES["n_ctx"], SIZES["d_vocab"], SIZES["d_model"]
    x = np.random.default_rng(seed).normal(size=(n, v))
    sizes = {0: n, 1: d}
    lx = (numeric(left, bindings, slot_sizes=sizes) @ x.reshape(-1)).reshape(n, d)
    rx = (numeric(right, bindings, slot_sizes=sizes) @ x.reshape(-1)).reshape(n, d)
    m = numeric(term(middle), bindings, slot_sizes={0: d})
    expected = lx @ m @ rx.T

    def value(word, size):
        return numeric(term(word), bindings, slot_sizes={0: size})

    total = np.zeros((n, n))
    for t in s:
        p, q, mid = t.words
        c = float(t.coeff.subs(d_head, SIZES["d_head"]))
        total += c * value(p, n) @ x @ value(mid, v) @ x.T @ value(q, n).T
    np.testing.assert_allclose(total, expected, atol=1e-9)


def test_sandwich_errors():
    stream = term(None, atom("W_E"))
    with pytest.raises(ShapeMismatch, match="d_vocab x d_model"):
        sandwich(stream, atom("W_E"), stream)
    with pytest.raises(SlotMismatch):
        sandwich(identity(3), atom("W_QK"), stream)


def test_coefficients_with_dimension_symbols_use_the_given_sizes():
    e = term(A, coeff=1 / sp.sqrt(d_head))
    a = np.eye(3)
    np.testing.assert_allclose(to_numpy(e, {"A^{h}": a}, dims={"d_head": 4}), a / 2)


def test_binding_errors_say_what_is_missing_or_wrong():
    with pytest.raises(BindingError, match="A\\^\\{h\\}"):
        to_numpy(term(A, W_OV), {"W_OV^{h}": np.eye(4)})
    with pytest.raises(BindingError, match="2-D"):
        to_numpy(term(A), {"A^{h}": np.ones(3)})
    with pytest.raises(BindingError, match="n_ctx"):
        to_numpy(term((A, atom("A", "g"))), {"A^{h}": np.eye(3), "A^{g}": np.eye(2)})
    with pytest.raises(BindingError, match="slot_sizes"):
        to_numpy(identity(2) + term(None, W_OV), {"W_OV^{h}": np.eye(4)})
