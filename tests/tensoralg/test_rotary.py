"""Rotary as one operator: the operator form against rotary applied to q and k directly
(Hugging Face's GPT-NeoX/Llama ``rotate_half`` and GPT-J's ``rotate_every_two``, written
here independently of tensoralg.rotary), the block rules against the arrays, bad input."""

from __future__ import annotations

from functools import reduce

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from tests.conftest import PROPERTY, THOROUGH

from tensoralg import TensorAlgError, atom, identity, sandwich, term
from tensoralg.atoms import d_head
from tensoralg.expr import TensorSum, Term
from tensoralg.rotary import (
    PASS_BLOCK,
    expand_rotary,
    feature_blocks,
    multiply_blocks,
    plane_block,
    relative_matrix,
    relative_rotation,
    rotary_atom,
    rotary_bindings,
    rotary_dims,
    rotary_scores,
    rotate,
    rotation,
    turn_block,
)

# -- the reference: rotary as Hugging Face applies it ----------------------------------


def hf_rotary(x: np.ndarray, positions: np.ndarray, rot: int, style: str, base: float = 10000.0) -> np.ndarray:
    """``apply_rotary_pos_emb`` of transformers, in numpy: GPT-NeoX (``rotate_half``, cos/sin
    of ``cat(freqs, freqs)``) or GPT-J (``rotate_every_two``, cos/sin repeated per pair),
    on the first ``rot`` dimensions; the rest passes through."""
    inv_freq = 1.0 / (base ** (np.arange(0, rot, 2, dtype=np.float64) / rot))
    freqs = np.outer(positions.astype(np.float64), inv_freq)  # [pos, rot/2]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    if style == "neox":
        emb = np.concatenate([freqs, freqs], axis=-1)
        x1, x2 = x_rot[..., : rot // 2], x_rot[..., rot // 2:]
        rotated_half = np.concatenate([-x2, x1], axis=-1)
        out = x_rot * np.cos(emb) + rotated_half * np.sin(emb)
    else:
        emb = np.repeat(freqs, 2, axis=-1)
        x1, x2 = x_rot[..., ::2], x_rot[..., 1::2]
        every_two = np.stack([-x2, x1], axis=-1).reshape(x_rot.shape)
        out = x_rot * np.cos(emb) + every_two * np.sin(emb)
    return np.concatenate([out, x_pass], axis=-1)


@st.composite
def rotary_cases(draw):
    """A head size, a rotary fraction that rotates an even number of its dimensions, a style,
    a base and distinct positions (an arbitrary offset, any order)."""
    half_dims = draw(st.integers(1, 6))
    d = 2 * half_dims + draw(st.integers(0, 5))
    rot_half = draw(st.integers(1, half_dims))
    fraction = (2 * rot_half) / d
    n = draw(st.integers(1, 6))
    positions = np.array(draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n, unique=True)))
    style = draw(st.sampled_from(["neox", "gptj"]))
    base = draw(st.sampled_from([10000.0, 500.0, 1e6]))
    seed = draw(st.integers(0, 2**32 - 1))
    return d, fraction, positions, style, base, np.random.default_rng(seed)


@THOROUGH
@given(rotary_cases())
def test_rotate_is_hugging_faces_rotary(case):
    d, fraction, positions, style, base, rng = case
    rot = rotary_dims(d, fraction)
    x = rng.standard_normal((2, len(positions), d))
    np.testing.assert_allclose(rotate(x, positions, rot, style, base), hf_rotary(x, positions, rot, style, base),
                               rtol=0, atol=1e-12)


def evaluate_scores(expr: TensorSum, bindings: dict, X: np.ndarray) -> np.ndarray:
    """``Σ c · P X M Xᵀ Qᵀ`` over the terms ``P ⊗ Q ⊗ M`` (the score semantics of the design)."""
    n = X.shape[0]

    def word(w, size):
        return reduce(np.matmul, [bindings[a.label].T if a.transposed else bindings[a.label] for a in w]) if w else np.eye(size)

    return sum(float(t.coeff) * word(t.words[0], n) @ X @ word(t.words[2], X.shape[1]) @ X.T @ word(t.words[1], n).T
               for t in expr)


@THOROUGH
@given(rotary_cases(), st.booleans())
def test_the_operator_form_equals_rotary_applied_to_queries_and_keys(case, transposed_weights):
    """``P ⊗ Q ⊗ (L R M)`` written out through ``R`` equals ``rotary(P X L) rotary(Q X Mᵀ)ᵀ``
    with ``P``, ``Q`` mixing positions (a path's patterns) and the rotation at each row's position."""
    d, fraction, positions, style, base, rng = case
    rot = rotary_dims(d, fraction)
    n, d_model = len(positions), 5
    P, Q = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    X = rng.standard_normal((n, d_model))
    W_Q, W_K = rng.standard_normal((d, d_model)), rng.standard_normal((d, d_model))
    R = rotary_atom("h")
    expr = term(atom("A", "q"), atom("A", "k"), (atom("W_Q", "h").T, R, atom("W_K", "h")))
    bindings = {"A^{q}": P, "A^{k}": Q, "W_Q^{h}": W_Q, "W_K^{h}": W_K,
                **rotary_bindings(positions, d, rot, style, base)}
    expanded = expand_rotary(expr, rot // 2, partial=rot < d)
    assert len(expanded) == 4 * (rot // 2) + (rot < d)
    q, k = P @ X @ W_Q.T, Q @ X @ W_K.T
    direct = hf_rotary(q, positions, rot, style, base) @ hf_rotary(k, positions, rot, style, base).T
    np.testing.assert_allclose(evaluate_scores(expanded, bindings, X), direct, rtol=0, atol=1e-9 * max(1, np.abs(direct).max()))
    np.testing.assert_allclose(rotary_scores(q, k, rot, style, base, positions, positions), direct, rtol=0, atol=1e-10 * max(1, np.abs(direct).max()))


@PROPERTY
@given(rotary_cases())
def test_relative_matrix_is_the_rotation_between_two_positions(case):
    d, fraction, positions, style, base, rng = case
    rot = rotary_dims(d, fraction)
    i, j = positions[0], positions[-1]
    eye = np.eye(d)
    R_i, R_j = (hf_rotary(eye, np.full(d, p), rot, style, base).T for p in (i, j))  # columns: R_p e_c
    np.testing.assert_allclose(relative_matrix(j - i, d, rot, style, base), R_i.T @ R_j, atol=1e-12)


@pytest.mark.parametrize("frequencies", [1, 2, 4])
@pytest.mark.parametrize("partial", [False, True])
def test_the_bilinear_form_of_two_rotated_streams_is_the_relative_operator(frequencies, partial):
    """``(ℛ q)ᵀ (ℛ k)`` multiplied out with the block rules is exactly the 3-slot ``R``:
    the ``(2F + 1)²`` products of blocks leave ``4F + 1`` terms."""
    R = rotation(frequencies, partial)
    products = sandwich(R, identity(1), R)
    assert len(products) == (2 * frequencies + partial) ** 2
    assert multiply_blocks(products) == relative_rotation(frequencies, partial)


BLOCKS = [plane_block(0), plane_block(1), turn_block(0), turn_block(1), turn_block(0).T, turn_block(1).T, PASS_BLOCK]


@THOROUGH
@given(st.lists(st.sampled_from(BLOCKS), min_size=1, max_size=5), st.booleans(), st.sampled_from(["neox", "gptj"]))
def test_block_rules_agree_with_the_arrays(word, other_atom, style):
    W = atom("W_K", "h")
    word = tuple(word) + ((W,) if other_atom else ())
    arrays = {**feature_blocks(5, 4, style), "W_K^{h}": np.random.default_rng(0).standard_normal((5, 5))}
    value = lambda w: reduce(np.matmul, [arrays[a.label].T if a.transposed else arrays[a.label] for a in w], np.eye(5))  # noqa: E731
    reduced = multiply_blocks(term(word))
    total = sum((float(t.coeff) * value(t.words[0]) for t in reduced), np.zeros((5, 5)))
    np.testing.assert_allclose(total, value(word), atol=1e-12)
    assert all(sum(a.name in ("C", "J", "P_pass") for a in t.words[0]) <= 1 for t in reduced)


def test_a_rotary_head_prints_one_operator():
    """The printed score term holds ``R^{h}`` once, whatever the head size."""
    from tensoralg import to_latex

    s = term(None, None, (atom("W_Q", "L1H0").T, rotary_atom("L1H0"), atom("W_K", "L1H0")), coeff=1 / sp.sqrt(d_head))
    assert to_latex(s).count("R^{") == 1
    assert "D_{cos}" not in to_latex(s)


def test_transposed_operator_transposes_its_blocks():
    s = term(None, None, rotary_atom("h").T)
    assert expand_rotary(s, 1) == TensorSum([Term(sign, (a, b, tuple(x.T for x in B)))
                                             for a, b, B, sign in [(t.words[0], t.words[1], t.words[2], t.coeff)
                                                                   for t in relative_rotation(1)]])


@pytest.mark.parametrize("d, fraction, message", [
    (6, 0.5, "rotates 3 dimensions"), (8, 0.1, "rotates 0 dimensions"), (8, 0.0, "in (0, 1]"),
    (8, 1.5, "in (0, 1]"), (0, 1.0, "d_head must be an int >= 1"),
])
def test_rotary_dims_refused_with_what_was_wrong(d, fraction, message):
    with pytest.raises(TensorAlgError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rotary_dims(d, fraction)


def test_bad_input_is_refused_clearly():
    with pytest.raises(TensorAlgError, match="3-slot score terms"):
        expand_rotary(term(None, rotary_atom("h")), 1)
    with pytest.raises(TensorAlgError, match="one rotary operator, got 2"):
        expand_rotary(term(None, None, (rotary_atom("h"), rotary_atom("h"))), 1)
    with pytest.raises(TensorAlgError, match="frequencies must be an int >= 1"):
        rotation(0)
    with pytest.raises(TensorAlgError, match="unknown rotary style 'llama'; expected one of 'neox', 'gptj'"):
        feature_blocks(4, 4, "llama")
    with pytest.raises(TensorAlgError, match="3 positions"):
        rotate(np.zeros((2, 4)), [0, 1, 2], 4)
