"""tensoralg.action: (P ⊗ W)·x = P x Wᵀ, against the Kronecker operator on row-major vec(x)."""

from __future__ import annotations

import numpy as np
import pytest

from tensoralg import Atom, ShapeMismatch, SlotMismatch, atom, d_model, d_vocab, n_ctx, parse, term, to_numpy
from tensoralg.action import act, transposed_products
from tests.helpers import SIZES, numeric, random_bindings

X = Atom("x", n_ctx, d_model)


@pytest.mark.parametrize("operator", ["A^1 ⊗ W_OV^1", "Id ⊗ W_O W_V", "(Id + A^1 ⊗ W_OV^1)(Id + 2·A^0 ⊗ W_OV^0)",
                                      "A^1ᵀ ⊗ W_OV^1ᵀ - 1/2·Id ⊗ Id"])
def test_the_action_is_the_kronecker_operator_on_the_rows(operator):
    op = parse(operator).expand()
    result = act(op, term(X))
    values = random_bindings(op, X, seed=3)
    dense = numeric(op, values, slot_sizes={0: SIZES["n_ctx"], 1: SIZES["d_model"]})
    got = to_numpy(result, values, dims=dict(SIZES))
    np.testing.assert_allclose(got.reshape(-1), dense @ values["x"].reshape(-1), rtol=1e-12, atol=1e-12)


def test_slots_and_shapes_are_checked():
    with pytest.raises(SlotMismatch, match="has 2 slots"):
        act(term(atom("A"), atom("A"), atom("W_OV")), term(X))
    with pytest.raises(SlotMismatch, match="1-slot matrix"):
        act(term(atom("A"), atom("W_OV")), term(X, X.T))
    with pytest.raises(ShapeMismatch, match=r"residual slot \(d_model x d_model\)") as info:
        act(term(atom("A"), atom("W_OV")), term(Atom("t", n_ctx, d_vocab)))
    assert info.value.dims == ((d_model, d_vocab),)


def test_transposed_products_lists_each_word_once():
    op = parse("A ⊗ W_O W_V + Id ⊗ W_O W_V + A ⊗ W_OV").expand()
    assert transposed_products(op) == [(atom("W_O"), atom("W_V"))]
