"""Binder: each atom of an expansion bound to the right tensor of the model or the recorded pass."""

from __future__ import annotations

import math

import pytest
import sympy as sp
import torch

from derivations.architecture import Architecture
from derivations.paths import Source
from numeric_check.errors import AtomBindingError
from numeric_check.verification.bind import Binder
from numeric_check.verification.hook_paths import record
from numeric_check.errors import ModelInputError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.config import ModelConfig
from tensoralg import atom
from tensoralg.atoms import d_head, d_model

torch.set_num_threads(1)
ARCH = Architecture(2, (2, 3), positional="standard", layer_norm=True, biases=True, mlp=True)
TOKENS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0]])


@pytest.fixture(scope="module")
def model():
    return CircuitModel.random(ARCH, d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0, dtype=torch.float64, device="cpu")


@pytest.fixture(scope="module")
def binder(model):
    return Binder(model, record(model, TOKENS))


def product(factors):
    out = factors[0]
    for f in factors[1:]:
        out = out @ f
    return out


def test_weights_in_paper_convention(model, binder):
    attn = model.blocks[1].attn
    # a product is the same matrix, to the last bit only where the same kernel computes it (another CPU's may not)
    close = dict(rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(product(binder.factors(atom("W_OV", "L1H2"))), attn.W_O[2] @ attn.W_V[2], **close)
    torch.testing.assert_close(product(binder.factors(atom("W_QK", "L1H2"))), attn.W_Q[2].T @ attn.W_K[2], **close)
    torch.testing.assert_close(product(binder.factors(atom("W_OV", "L1H2").T)), (attn.W_O[2] @ attn.W_V[2]).T, **close)
    assert [tuple(f.shape) for f in binder.factors(atom("W_OV", "L1H2"))] == [(8, 4), (4, 8)]  # kept factored
    for name, value in (("W_E", model.W_E), ("W_U", model.W_U), ("W_pos", model.W_pos)):
        assert torch.equal(binder.factors(atom(name))[0], value)
    assert torch.equal(binder.factors(atom("W_Q", "L0H1"))[0], model.blocks[0].attn.W_Q[1])
    assert binder.factors(atom("b_U"))[0].shape == (10, 1)
    assert binder.factors(atom("b_Q", "L1H0"))[0].shape == (4, 1)
    assert not any(f.requires_grad for f in binder.factors(atom("W_E")))


def test_output_bias_has_value_bias_folded(model, binder):
    (b_O,) = binder.factors(atom("b_O", "L1"))
    attn = model.blocks[1].attn
    expected = attn.b_O + sum(attn.W_O[h] @ attn.b_V[h] for h in range(3))
    assert torch.allclose(b_O[:, 0], expected, atol=1e-14)


def test_frozen_values_from_the_forward_pass(model, binder):
    _, cache = model.run_with_cache(TOKENS)
    A = binder.position(atom("A", "L1H2"))
    assert not A.diagonal and torch.equal(A.value, cache["blocks.1.attn.hook_pattern"][:, 2])
    assert torch.equal(binder.position(atom("A", "L1H2").T).value, A.value.transpose(-1, -2))
    N = binder.position(atom("N", "L0"))
    assert N.diagonal and torch.allclose(N.value, 1 / cache["blocks.0.ln1.hook_scale"][..., 0])
    assert torch.allclose(binder.position(atom("N", "final")).value, 1 / cache["ln_final.hook_scale"][..., 0])


def test_coefficients_use_the_models_attention_scale(model):
    cfg = ModelConfig(ARCH, d_model=8, d_head=4, d_vocab=10, n_ctx=6, d_mlp=32, attn_scale=5.0)
    odd = CircuitModel(cfg, dtype=torch.float64, device="cpu")
    odd.load_state_dict(model.state_dict())
    b = Binder(odd, record(odd, TOKENS))
    assert math.isclose(b.coeff(1 / sp.sqrt(d_head)), 1 / 5.0)
    assert math.isclose(Binder(model, record(model, TOKENS)).coeff(1 / sp.sqrt(d_head)), 0.5)
    assert b.coeff(2 * d_model) == 16.0
    with pytest.raises(AtomBindingError, match="cannot bind"):
        b.coeff(sp.Symbol("mystery"))


def test_source_inputs(model, binder):
    W = torch.arange(30.0, dtype=torch.float64).reshape(3, 10)
    tok = binder.source_input(Source("token"))
    assert torch.equal(tok.times_transpose(W), tok.as_dense() @ W.T)
    P = torch.arange(18.0, dtype=torch.float64).reshape(3, 6)
    pos = binder.source_input(Source("position"))
    assert torch.equal(pos.times_transpose(P), pos.as_dense() @ P.T)
    ones = binder.source_input(Source("bias", 0))
    assert ones.as_dense().shape == (2, 4, 1)
    mlp = binder.source_input(Source("mlp", 1))
    assert torch.equal(mlp.as_dense(), record(model, TOKENS).cache["blocks.1.hook_mlp_out"])


@pytest.mark.parametrize("bad, match", [
    (atom("W_OV", "L2H0"), "another architecture"),
    (atom("W_OV", "L1H3"), "another architecture"),
    (atom("W_OV", "L1"), "expected L{layer}H{head}"),
    (atom("b_O", "L0H1"), "expected L{layer}"),
    (atom("W_in", "x"), "expected L{layer}"),
])
def test_atoms_that_do_not_fit(binder, bad, match):
    with pytest.raises(AtomBindingError, match=match):
        binder.factors(bad)


def test_unknown_atoms_and_missing_parts():
    plain = CircuitModel.random(Architecture(1, 1), d_model=4, d_head=2, d_vocab=5, n_ctx=3, seed=0, device="cpu")
    b = Binder(plain, record(plain, [[0, 1]]))
    with pytest.raises(AtomBindingError, match="no layer norm"):
        b.position(atom("N", "L0"))
    with pytest.raises(AtomBindingError, match="no biases"):
        b.factors(atom("b_O", "L0"))
    with pytest.raises(AtomBindingError, match="not part of this model"):
        b.factors(atom("W_pos"))
    with pytest.raises(AtomBindingError, match="no MLPs"):
        b.factors(atom("W_in", "L0"))
    with pytest.raises(AtomBindingError, match="no binding for atom 'Z'"):
        b.factors(atom("Z", shapes={"Z": (d_model, d_model)}))
    with pytest.raises(AtomBindingError, match="did not record"):
        b.recording.get("blocks.0.ln1_qk.hook_scale", "atom N^{L0,qk}")


def test_record_rejects_bad_tokens(model):
    with pytest.raises(ModelInputError, match="out of range"):
        record(model, [[1, 10]])
    with pytest.raises(ModelInputError, match="n_ctx=6"):
        record(model, torch.zeros(1, 7, dtype=torch.long))
    rec = record(model, [3, 4, 5])
    assert rec.tokens.shape == (1, 3) and rec.n_batch == 1 and rec.n_pos == 3


@pytest.mark.parametrize("arch", [ARCH, Architecture(0, 1, positional="standard", biases=True), Architecture(1, 2)])
def test_record_stops_before_the_unembedding(arch):
    m = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=1, dtype=torch.float64, device="cpu")
    rec = record(m, TOKENS)
    assert rec.final.shape == (2, 4, 8) and "logits" not in rec.__dict__  # no unembedding yet
    assert torch.equal(rec.logits, m(TOKENS))  # the model's own expression, bit for bit
    if arch.layer_norm:
        x = rec.cache[f"blocks.{arch.n_layers - 1}.hook_resid_post"]
        assert torch.allclose(rec.final, (x - x.mean(-1, keepdim=True)) / rec.cache["ln_final.hook_scale"], rtol=0, atol=1e-14)
