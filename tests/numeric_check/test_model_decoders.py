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
from numeric_check.verification.hook_paths import record
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
    _verified(CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=3, dtype=torch.float64, device="cpu"))


def test_qk_norm_gains_fold_into_the_bound_weights():
    """W_Q is bound with the gain (and a layer norm's centring) folded in: the plain weight would fail."""
    arch = Architecture(1, 2, qk_norm="layer_norm")
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=0, dtype=torch.float64, device="cpu")
    attn = model.blocks[0].attn
    assert not torch.allclose(attn.q_norm.gain, torch.ones_like(attn.q_norm.gain))
    binder = Binder(model, record(model, TOKENS))
    W_Q, = binder.factors(atom("W_Q", "L0H1"))
    expected = attn.q_norm.gain[1][:, None] * (attn.W_Q[1] - attn.W_Q[1].mean(0, keepdim=True))
    assert torch.allclose(W_Q, expected) and not torch.allclose(W_Q, attn.W_Q[1])
    scale = binder.position(atom("N", "L0H1,q"))
    assert scale.diagonal and scale.value.shape == (1, 6)


def test_a_qk_norm_scale_of_another_scope_is_refused():
    from numeric_check.errors import AtomBindingError

    model = CircuitModel.random(Architecture(1, 2, qk_norm="rms_norm"), d_model=8, d_head=4, d_vocab=9, n_ctx=6, device="cpu")
    with pytest.raises(AtomBindingError, match="each head"):
        Binder(model, record(model, TOKENS)).position(atom("N", "L0,q"))


@pytest.mark.parametrize("sublayer", ["post", "both"])
def test_norms_after_sublayers_verify(sublayer):
    arch = Architecture(2, 2, norm="rms_norm", sublayer_norm=sublayer, mlp=True, biases=True, qk_norm="rms_norm")
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=2, dtype=torch.float64, device="cpu")
    block = model.blocks[0]
    assert block.ln1_post is not None and block.ln2_post is not None
    assert (block.ln1.__class__.__name__ == "Identity") == (sublayer == "post")
    _verified(model)
    binder = Binder(model, record(model, TOKENS))
    W_O, W_V = binder.factors(atom("W_OV", "L1H0"))
    assert torch.allclose(W_O, model.blocks[1].ln1_post.gain[:, None] * model.blocks[1].attn.W_O[0])


def test_windows_soft_caps_and_alibi_verify():
    arch = Architecture(2, 3, norm="rms_norm", window=(2, None), alibi=True, attn_softcap=0.5, logit_softcap=1.0,
                        biases=True, mlp=True)
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=4, dtype=torch.float64, device="cpu")
    logits, cache = model.run_with_cache(TOKENS)
    pattern = cache["blocks.0.attn.hook_pattern"][0, 0]
    assert pattern[5, :4].abs().max() == 0 and pattern[5, 4] > 0  # a window of 2 keeps keys 4 and 5 only
    assert logits.abs().max() <= 1.0  # the final soft-cap
    report = verify_logits(model, TOKENS, max_order=2)
    assert report.passed and any("before the final soft-cap" in n for n in report.notes)
    qk = verify_qk(model, TOKENS, 1, 2)
    assert qk.passed and any("before the attention soft-cap" in n for n in qk.notes)
    _verified(CircuitModel.random(Architecture(2, 2, window=(None, 2), rotary=1.0), d_model=8, d_head=4, d_vocab=9,
                                  n_ctx=6, seed=5, dtype=torch.float64, device="cpu"))


def test_the_alibi_term_is_the_heads_bias():
    from derivations.qk import expand_qk
    from numeric_check.verification.evaluate_qk import QKEvaluator
    from numeric_check.model.layers import alibi_slopes

    model = CircuitModel.random(Architecture(2, 4, alibi=True), d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=0,
                                dtype=torch.float64, device="cpu")
    terms = list(expand_qk(model.arch, 1, 3))
    index = next(i for i, t in enumerate(terms) if t.query.source.kind == "alibi")
    assert repr(terms[index].term) == "Term(Id ⊗ Id ⊗ B_ALiBi^{L1H3})"
    scores = QKEvaluator(Binder(model, record(model, TOKENS)), terms).scores(index)[0]
    i = torch.arange(6, dtype=torch.float64)
    assert torch.allclose(scores, 2 ** -8.0 * (i[None, :] - i[:, None]))  # m_3 = 2^(-8·4/4)
    assert torch.allclose(alibi_slopes(8), 2 ** (-torch.arange(1, 9, dtype=torch.float64)))
    # not a power of two (BLOOM's rule): those of 4 heads, then every other one of 8
    assert alibi_slopes(6).tolist() == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]


def test_decoder_models_round_trip_through_checkpoints(tmp_path):
    from numeric_check import load_checkpoint, save_checkpoint

    arch = Architecture(2, 3, norm="rms_norm", sublayer_norm="both", qk_norm="layer_norm", qk_norm_scope="all",
                        window=(2, None), alibi=True, attn_softcap=5.0, logit_softcap=3.0, mlp=True, biases=True)
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=6, dtype=torch.float64, device="cpu")
    cfg = ModelConfig(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, d_mlp=model.cfg.d_mlp, alibi_slopes=(0.5, 0.25, 0.1))
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    path = tmp_path / "decoder.safetensors"
    save_checkpoint(model, path)
    loaded = load_checkpoint(path, dtype=torch.float64, device="cpu")
    assert loaded.cfg == model.cfg and torch.equal(loaded(TOKENS), model(TOKENS))
    assert torch.equal(loaded.blocks[1].attn.q_norm.gain, model.blocks[1].attn.q_norm.gain)


@pytest.mark.parametrize("rope_type, spec", [
    ("linear", {"factor": 4.0}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
    ("yarn", {"factor": 2.0, "original_max_position_embeddings": 16}),
    ("dynamic", {"factor": 2.0}),
])
def test_rope_scaling_is_frequencies_and_a_factor(rope_type, spec):
    """Hugging Face's scaled rotary (its own inverse frequencies and attention_scaling, dynamic NTK at the
    length used) is the model's rotation with those frequencies and that factor; the expansion verifies."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    from numeric_check.model.rotary import rotate

    config = transformers.LlamaConfig(hidden_size=16, num_attention_heads=4, max_position_embeddings=16,
                                      rope_parameters={"rope_type": rope_type, "rope_theta": 1000.0, **spec})
    extra = {"seq_len": 40} if rope_type == "dynamic" else {}
    inv, factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", **extra)
    inv = inv.to(torch.float64)
    x = torch.randn(1, 4, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # [b, heads, pos, d]
    angles = torch.arange(6, dtype=torch.float64)[None, :, None] * inv
    cos, sin = (torch.cat((f, f), -1) * factor for f in (angles.cos(), angles.sin()))
    theirs, _ = apply_rotary_pos_emb(x, x, cos, sin)
    ours = rotate(x.transpose(1, 2), 4, "neox", 1000.0, tuple(inv.tolist()), factor, pos_dim=1).transpose(1, 2)
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-14)
    model = CircuitModel.random(Architecture(2, 2, norm="rms_norm", rotary=1.0), d_model=8, d_head=4, d_vocab=9, n_ctx=6,
                                rotary_inv_freq=tuple(inv.tolist()), rotary_factor=factor, seed=1, dtype=torch.float64, device="cpu")
    _verified(model)
    assert ModelConfig.from_dict(model.cfg.to_dict()) == model.cfg


@pytest.mark.parametrize("renormalise", [True, False])
def test_mixture_of_experts_mlps_are_opaque_sources_with_their_routing_recorded(renormalise):
    from numeric_check.verification.hook_paths import record

    arch = Architecture(2, 2, norm="rms_norm", mlp=True, experts=4, experts_top_k=2, biases=True)
    assert "MLPs of 4 experts (top 2 per position)" in arch.describe()
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=7, dtype=torch.float64,
                                gated_mlp=True, act_fn="silu", device="cpu")
    if not renormalise:
        model.cfg = ModelConfig(**{**model.cfg.__dict__, "moe_renormalise": False})
        model.blocks[0].mlp.renormalise = model.blocks[1].mlp.renormalise = False
    rec = record(model, TOKENS)
    weights, indices = rec.cache["blocks.0.mlp.hook_expert_weights"], rec.cache["blocks.0.mlp.hook_expert_indices"]
    assert weights.shape == indices.shape == (1, 6, 2)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 6, dtype=torch.float64)) == renormalise
    # the output is the routed experts' weighted sum: expert by expert, as a reader would compute it
    mlp, x = model.blocks[0].mlp, torch.randn(1, 6, 8, dtype=torch.float64)
    w, i = mlp.route(x)
    by_hand = torch.zeros_like(x)
    for p in range(6):
        for slot in range(2):
            e = int(i[0, p, slot])
            h = torch.nn.functional.silu(mlp.W_gate[e] @ x[0, p] + mlp.b_gate[e]) * (mlp.W_in[e] @ x[0, p] + mlp.b_in[e])
            by_hand[0, p] += w[0, p, slot] * (mlp.W_out[e] @ h + mlp.b_out[e])
    assert torch.allclose(mlp(x), by_hand)
    _verified(model)


def _source_weights(model: CircuitModel):
    """``model``'s weights as a reader would hand them to build(): TransformerLens' row convention, every
    decoder option's field filled (norms parameter-free: their gains are already folded)."""
    from numeric_check.conversion.build import LayerWeights, SourceWeights

    arch, cfg = model.arch, model.cfg
    layers = []
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        zero = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
        bias = lambda t, *shape: zero(*shape) if t is None else t.detach().clone()  # noqa: E731
        layer = LayerWeights(*(getattr(attn, n).transpose(1, 2).detach().clone() for n in ("W_Q", "W_K", "W_V")),
                             attn.W_O.transpose(1, 2).detach().clone(), bias(attn.b_Q, attn.n_heads, cfg.d_head),
                             bias(attn.b_K, attn.n_kv_heads, cfg.d_head), bias(attn.b_V, attn.n_kv_heads, cfg.d_head),
                             bias(attn.b_O, cfg.d_model))
        if attn.q_norm is not None:
            layer.q_norm = (attn.q_norm.gain.detach().clone(), bias(attn.q_norm.bias, attn.n_heads, cfg.d_head))
            layer.k_norm = (attn.k_norm.gain.detach().clone(), bias(attn.k_norm.bias, attn.n_kv_heads, cfg.d_head))
        if block.ln1_post is not None:
            layer.ln1_post = block.ln1_post.gain.detach().clone()
            layer.ln2_post = None if block.ln2_post is None else block.ln2_post.gain.detach().clone()
        if mlp is not None:
            E = arch.experts
            layer.mlp = {"W_router": mlp.W_router.T.detach().clone(), "W_in": mlp.W_in.transpose(1, 2).detach().clone(),
                         "b_in": bias(mlp.b_in, E, cfg.d_mlp), "W_out": mlp.W_out.transpose(1, 2).detach().clone(),
                         "b_out": bias(mlp.b_out, E, cfg.d_model)}
            if mlp.W_gate is not None:
                layer.mlp.update(W_gate=mlp.W_gate.transpose(1, 2).detach().clone(), b_gate=bias(mlp.b_gate, E, cfg.d_mlp))
        layers.append(layer)
    return SourceWeights(
        W_E=model.W_E.T.detach().clone(), W_pos=None, W_U=model.W_U.T.detach().clone(),
        b_U=torch.zeros(cfg.d_vocab, dtype=torch.float64) if model.b_U is None else model.b_U.detach().clone(),
        layers=layers, ln_final=None, positional="none", layer_norm=False, norm=arch.norm, act_fn=cfg.act_fn,
        eps=cfg.ln_eps, attn_scale=cfg.scale, d_head=cfg.d_head, n_ctx=cfg.n_ctx, d_mlp=cfg.d_mlp,
        rotary=arch.rotary, rotary_base=cfg.rotary_base, qk_norm=arch.qk_norm, qk_norm_scope=arch.qk_norm_scope,
        sublayer_norm=arch.sublayer_norm, window=arch.window, attn_softcap=arch.attn_softcap,
        logit_softcap=arch.logit_softcap, alibi_slopes=None if model.blocks[0].attn.alibi_slopes is None else
        model.blocks[0].attn.alibi_slopes.detach().clone(),
        rotary_inv_freq=None if cfg.rotary_inv_freq is None else torch.tensor(cfg.rotary_inv_freq, dtype=torch.float64),
        rotary_factor=cfg.rotary_factor, experts_top_k=arch.experts_top_k, moe_renormalise=cfg.moe_renormalise)


def test_build_reads_every_decoder_field_of_source_weights():
    """What a reader fills in (SourceWeights) builds the same model: every option of issue 18 at once."""
    from numeric_check.conversion.build import build

    arch = Architecture(2, 4, n_kv_heads=2, norm="rms_norm", sublayer_norm="both", qk_norm="layer_norm", window=(3, None),
                        alibi=True, attn_softcap=5.0, logit_softcap=3.0, mlp=True, experts=3, experts_top_k=2,
                        rotary=0.5, biases=True)
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=8, dtype=torch.float64, gated_mlp=True,
                                act_fn="silu", rotary_inv_freq=(0.3,), rotary_factor=1.2, device="cpu")
    built = build(_source_weights(model), device="cpu", biases=True)
    assert built.cfg.to_dict() == {**model.cfg.to_dict(), "alibi_slopes": [0.25, 0.0625, 0.015625, 0.00390625]}
    assert torch.allclose(built(TOKENS), model(TOKENS), rtol=0, atol=1e-13)
    _verified(built)


def test_circuits_read_the_folded_weights_and_to_transformer_lens_refuses_what_it_cannot_write():
    from numeric_check.circuits.ov_qk import ov_circuit, qk_circuit
    from numeric_check.errors import UnsupportedModel
    from numeric_check.conversion.adapters import to_transformer_lens

    arch = Architecture(1, 2, norm="rms_norm", sublayer_norm="both", qk_norm="rms_norm")
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=9, dtype=torch.float64, device="cpu")
    attn, gain = model.blocks[0].attn, model.blocks[0].ln1_post.gain
    ov = model.W_U @ (gain[:, None] * attn.W_O[1]) @ attn.W_V[1] @ model.W_E
    assert torch.allclose(ov_circuit(model, 0, 1).materialize(), ov)
    qk = model.W_E.T @ (attn.q_norm.gain[0][:, None] * attn.W_Q[0]).T @ (attn.k_norm.gain[0][:, None] * attn.W_K[0]) @ model.W_E
    assert torch.allclose(qk_circuit(model, 0, 0).materialize(), qk)
    with pytest.raises(UnsupportedModel, match="q/k normalisation, norms after a sublayer"):
        to_transformer_lens(model)


def test_every_option_at_once_verifies_truncated_expansions_too():
    """Check 3 (the omitted terms equal what the model computes of order above k) with every option on."""
    arch = Architecture(3, 2, norm="rms_norm", sublayer_norm="both", qk_norm="layer_norm", window=(2, None, 3), alibi=True,
                        attn_softcap=1.0, logit_softcap=2.0, biases=True, mlp=True, experts=3, experts_top_k=2, rotary=1.0)
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, seed=3, dtype=torch.float64,
                                rotary_inv_freq=(0.7, 0.05), rotary_factor=1.1, device="cpu")
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]])
    for k in (0, 1):
        qk, logits = verify_qk(model, tokens, 2, 1, max_order=k), verify_logits(model, tokens, max_order=k)
        assert qk.passed and logits.passed
        assert all(c.passed for c in qk.checks + logits.checks if c.name == "truncation")
