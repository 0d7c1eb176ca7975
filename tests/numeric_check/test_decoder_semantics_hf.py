"""The reference model's semantics of q/k norms, norms after a sublayer, windows, soft-caps and experts
pinned against Hugging Face's own Qwen3, OLMo 2, Gemma 2 and Mixtral (built from their configs, every parameter
perturbed): their weights, read by hand into SourceWeights (the fields the readers fill), build a
model whose logits equal theirs to Hugging Face's float32 rounding, and which verifies; the families' readers
(``from_hf``) build a model equal to the hand-read one to 1e-12."""

from __future__ import annotations

import math

import pytest
import torch

import numeric_check as nc
from numeric_check.conversion.build import LayerWeights, SourceWeights, build, f64
from numeric_check.conversion.readers.common import rope_parameters

T = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow
TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]])
COMMON = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=16)


def _perturb(model, seed: int = 1) -> None:
    """Every parameter off its default (gains of 1 and zero biases hide folding bugs)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=generator, dtype=torch.float64).to(param.dtype))


def _heads(linear, n: int, d_head: int) -> torch.Tensor:
    """A projection's weight ``[n * d_head, d_model]`` as TransformerLens' ``[n, d_model, d_head]``."""
    return f64(linear.weight).reshape(n, d_head, -1).transpose(1, 2)


def _mlp(mlp, d: int, m: int) -> dict[str, torch.Tensor]:
    """A gated MLP, or Mixtral's experts (router ``gate``, ``gate_up_proj [E, 2m, d]``, ``down_proj [E, d, m]``)
    stacked first as SourceWeights holds them."""
    if not hasattr(mlp, "experts"):
        return {"W_gate": f64(mlp.gate_proj.weight).T, "b_gate": torch.zeros(m, dtype=torch.float64),
                "W_in": f64(mlp.up_proj.weight).T, "b_in": torch.zeros(m, dtype=torch.float64),
                "W_out": f64(mlp.down_proj.weight).T, "b_out": torch.zeros(d, dtype=torch.float64)}
    gate_up, down = f64(mlp.experts.gate_up_proj), f64(mlp.experts.down_proj)
    E = gate_up.shape[0]
    return {"W_router": f64(mlp.gate.weight).T, "W_gate": gate_up[:, :m].transpose(1, 2), "W_in": gate_up[:, m:].transpose(1, 2),
            "W_out": down.transpose(1, 2), "b_gate": torch.zeros(E, m, dtype=torch.float64),
            "b_in": torch.zeros(E, m, dtype=torch.float64), "b_out": torch.zeros(E, d, dtype=torch.float64)}


def _read(model, gemma: bool = False, qk: str | None = None, qk_scope: str = "head", sub: str = "pre", window=None,
          caps=(None, None), scale: float | None = None, embed: float = 1.0) -> SourceWeights:
    """The fields a reader fills for these families (Gemma's RMSNorm gains are ``1 + w``)."""
    config = model.config
    d, h, g, m = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    e = getattr(config, "head_dim", None) or d // h
    zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
    norm = lambda module: (f64(module.weight) + gemma, zeros(module.weight.shape[0]))  # noqa: E731
    layers = []
    for block in model.model.layers:
        attn, mlp = block.self_attn, block.mlp
        layer = LayerWeights(
            _heads(attn.q_proj, h, e), _heads(attn.k_proj, g, e), _heads(attn.v_proj, g, e),
            f64(attn.o_proj.weight).T.reshape(h, e, d), zeros(h, e), zeros(g, e), zeros(g, e), zeros(d), mlp=_mlp(mlp, d, m))
        if sub != "post":  # Gemma 2 reads its MLP through pre_feedforward_layernorm
            layer.ln1 = norm(block.input_layernorm)
            layer.ln2 = norm(block.pre_feedforward_layernorm if gemma else block.post_attention_layernorm)
        if sub != "pre":
            layer.ln1_post, layer.ln2_post = norm(block.post_attention_layernorm)[0], norm(block.post_feedforward_layernorm)[0]
        if qk:
            layer.q_norm, layer.k_norm = norm(attn.q_norm), norm(attn.k_norm)
        layers.append(layer)
    act = config.hidden_activation if gemma else config.hidden_act
    # transformers 5 keeps Gemma's scale as a buffer made in the default dtype (sqrt(32) rounded to float32);
    # 4.57 computes it in the activations' dtype: the family computes with what the module holds
    held = getattr(model.model.embed_tokens, "embed_scale", None)
    return SourceWeights(
        W_E=f64(model.model.embed_tokens.weight) * (float(held) if gemma and held is not None else embed), W_pos=None, W_U=f64(model.lm_head.weight).T,
        b_U=zeros(config.vocab_size), layers=layers, ln_final=norm(model.model.norm), positional="none", layer_norm=False,
        norm="rms_norm", act_fn={"silu": "silu", "gelu_pytorch_tanh": "gelu_new"}[act], eps=float(config.rms_norm_eps),
        attn_scale=scale or math.sqrt(e), d_head=e, n_ctx=config.max_position_embeddings, d_mlp=m, rotary=1.0,
        rotary_base=float(rope_parameters(config)["rope_theta"]), qk_norm=qk, qk_norm_scope=qk_scope, sublayer_norm=sub,
        window=window, attn_softcap=caps[0], logit_softcap=caps[1],
        experts_top_k=getattr(config, "num_experts_per_tok", 1))


CASES = {
    "Qwen3": (lambda: T.Qwen3ForCausalLM(T.Qwen3Config(head_dim=8, **COMMON)), dict(qk="rms_norm")),
    "Mixtral": (lambda: T.MixtralForCausalLM(T.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **COMMON)), {}),
    "OLMo2": (lambda: T.Olmo2ForCausalLM(T.Olmo2Config(**COMMON)), dict(qk="rms_norm", qk_scope="all", sub="post")),
    "Gemma2": (lambda: T.Gemma2ForCausalLM(T.Gemma2Config(
        head_dim=8, query_pre_attn_scalar=6, sliding_window=3, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
        layer_types=["sliding_attention", "full_attention"], attn_implementation="eager", **COMMON)),
        dict(gemma=True, sub="both", window=(3, None), caps=(2.0, 3.0), scale=math.sqrt(6), embed=32 ** 0.5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_model_computes_what_the_family_computes(name):
    torch.set_num_threads(1)
    make, options = CASES[name]
    if name == "Mixtral" and int(T.__version__.split(".")[0]) < 5:
        pytest.skip("transformers 4 keeps one module per expert; this hand reading is transformers 5's layout "
                    "(test_hf_families converts Mixtral in both)")
    # Hugging Face's mixture-of-experts kernels refuse float64: Mixtral runs in float32 (so its tolerance)
    dtype, tolerance = (torch.float32, 1e-5) if name == "Mixtral" else (torch.float64, 1e-6)
    hf = make().to(dtype).eval()
    _perturb(hf)
    ours = build(_read(hf, **options), device="cpu")  # beside the Hugging Face model, on the CPU
    with torch.no_grad():
        theirs, mine = hf(TOKENS).logits.to(torch.float64), ours(TOKENS)
    assert float((mine - theirs).abs().max() / theirs.abs().max()) < tolerance  # its float32 internals
    assert nc.verify_logits(ours, TOKENS, max_order=2).passed
    assert nc.verify_qk(ours, TOKENS, 1, 3).passed
    # the family's reader reads what is read here by hand: from_hf's model computes the same logits
    with torch.no_grad():
        read = nc.from_hf(hf, device="cpu")(TOKENS)
        assert float((read - ours(TOKENS)).abs().max() / ours(TOKENS).abs().max()) < 1e-12
