"""CircuitModel with the options of today's decoders (issue 18) — q/k normalisation, norms after a
sublayer, local attention, soft-caps, ALiBi, rope scaling — drawn together by hypothesis: the
path expansion (order 2) and a layer-1 head's QK expansion verify against the model's own hooks
in float64."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from derivations.architecture import Architecture
from numeric_check import CircuitModel, ModelConfig, verify_logits, verify_qk
from numeric_check.strategies import decoder_models
from numeric_check.verification.bind import Binder
from numeric_check.model.hook_paths import record
from tensoralg import atom

TOKENS = torch.tensor([[3, 1, 4, 1, 5, 2]])


def _verified(model: CircuitModel) -> None:
    logits = verify_logits(model, TOKENS, max_order=2)
    assert logits.passed, logits.summary_lines()
    qk = verify_qk(model, TOKENS, 1, model.arch.heads_per_layer[1] - 1)
    assert qk.passed, qk.summary_lines()


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(decoder_models())
def test_decoder_models_verify_through_their_hooks(model):
    torch.set_num_threads(1)
    _verified(model)
    assert ModelConfig.from_dict(model.cfg.to_dict()) == model.cfg


@pytest.mark.parametrize("kind", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("scope", ["head", "all"])
def test_qk_norm_verifies_with_grouped_heads_and_rotary(kind, scope):
    arch = Architecture(2, 4, n_kv_heads=2, norm="rms_norm", qk_norm=kind, qk_norm_scope=scope, rotary=1.0, biases=True)
    _verified(CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=3, dtype=torch.float64))


def test_qk_norm_gains_fold_into_the_bound_weights():
    """W_Q is bound with the gain (and a layer norm's centring) folded in: the plain weight would fail."""
    arch = Architecture(1, 2, qk_norm="layer_norm")
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=0, dtype=torch.float64)
    attn = model.blocks[0].attn
    assert not torch.allclose(attn.q_ln.gain, torch.ones_like(attn.q_ln.gain))
    binder = Binder(model, record(model, TOKENS))
    W_Q, = binder.factors(atom("W_Q", "L0H1"))
    expected = attn.q_ln.gain[1][:, None] * (attn.W_Q[1] - attn.W_Q[1].mean(0, keepdim=True))
    assert torch.allclose(W_Q, expected) and not torch.allclose(W_Q, attn.W_Q[1])
    scale = binder.position(atom("N", "L0H1,q"))
    assert scale.diagonal and scale.value.shape == (1, 6)


def test_a_qk_norm_scale_of_another_scope_is_refused():
    from numeric_check.errors import AtomBindingError

    model = CircuitModel.random(Architecture(1, 2, qk_norm="rms_norm"), d_model=8, d_head=4, d_vocab=9, n_ctx=6)
    with pytest.raises(AtomBindingError, match="each head"):
        Binder(model, record(model, TOKENS)).position(atom("N", "L0,q"))


@pytest.mark.parametrize("sublayer", ["post", "both"])
def test_norms_after_sublayers_verify(sublayer):
    arch = Architecture(2, 2, norm="rms_norm", sublayer_norm=sublayer, mlp=True, biases=True, qk_norm="rms_norm")
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=2, dtype=torch.float64)
    block = model.blocks[0]
    assert block.ln1_post is not None and block.ln2_post is not None
    assert (block.ln1.__class__.__name__ == "Identity") == (sublayer == "post")
    _verified(model)
    binder = Binder(model, record(model, TOKENS))
    W_O, W_V = binder.factors(atom("W_OV", "L1H0"))
    assert torch.allclose(W_O, model.blocks[1].ln1_post.gain[:, None] * model.blocks[1].attn.W_O[0])
