"""Llama's layout and the families that share it: ``model.model.layers[i]`` with
``self_attn.{q,k,v,o}_proj``, ``input_layernorm``, ``post_attention_layernorm`` and an MLP,
``model.model.norm``, ``model.model.rotary_emb``, ``lm_head``.

Read exactly: Llama, Qwen2, Mistral, Gemma (RMSNorm, grouped-query attention, rotary, gated
MLPs); StableLM (layer norm with bias, partial rotary, parallel or sequential); OLMo
(parameter-free layer norm); Starcoder2 (layer norm with bias, a plain MLP); Granite (its four
multipliers folded into the weights and the attention scale); Cohere (layer norm without bias,
parallel blocks, interleaved rotary pairs, ``logit_scale`` folded into the unembedding) and
Cohere 2 (when every layer is rotary); Ministral, Seed-OSS, SmolLM3 (unless some layers have no
rotary), Ernie 4.5 and Helium (interleaved rotary pairs), HyperCLOVA X (Granite's multipliers,
logits multiplied), GLM (packed gate/up, interleaved partial rotary), Arcee, Jais 2 and Nemotron
(up/down MLPs with squared ReLU; Nemotron's layer norm has ``1 + w`` gains).

With the decoder options of issue 18 (:mod:`~numeric_check.conversion.readers.decoder`): q/k norms
per head (Qwen3, Gemma 3, EXAONE 4's, StableLM's and Cohere's) or over all heads (OLMo 2 and 3,
OLMoE); norms after each sublayer only (OLMo 2 and 3, EXAONE 4) or before and after (Gemma 2/3,
GLM-4, HyperCLOVA X's ``use_post_norm``); sliding windows per layer; Gemma 2's and VaultGemma's
soft-caps; linear, llama3 and YaRN rope (CWM, Ministral 3); mixtures of experts with a softmax
router (Mixtral, OLMoE, Qwen2-MoE and Qwen3-MoE without a shared expert). Refused by name:
HunYuan dense (q/k norm after the rotation), PhiMoE (sparsemixer routing), a shared expert,
dense layers between expert layers, ropes that differ between layer types (Gemma 3's defaults),
dynamic and longrope scaling (their frequencies depend on the length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from numeric_check.errors import WeightError
from numeric_check.conversion.build import LayerWeights, SourceWeights, f64, unsupported
from numeric_check.conversion.readers import decoder
from numeric_check.conversion.readers.common import (
    Family, act, bias, built_eps, heads_out, norm, packed_gated_mlp, plain_mlp, rope_parameters, rotary, split_heads,
    unembed,
)


@dataclass(frozen=True)
class Layout:
    """How a family departs from Llama. ``norm``: ``"rms"``, ``"gemma"`` (RMSNorm with ``1 + w``
    gains) or ``"layer"`` (layer norm, with or without gain and bias); ``parallel``: the MLP reads
    ``input_layernorm``'s output; ``mlp``: ``"gated"`` (gate/up/down), ``"packed"`` (gate_up/down),
    ``"plain"`` (c_fc/c_proj) or ``"up_down"`` (up/down, no gate); ``layer_windows``: the sliding window
    applies to the layers ``layer_types`` names (else to every layer, :func:`decoder.windows`)."""

    norm: str = "rms"
    eps: str = "rms_norm_eps"
    act: str = "hidden_act"
    parallel: bool = False
    mlp: str = "gated"
    rotary_style: str = "neox"
    layer_windows: bool = True  # False: one sliding-window mask for every layer, layer_types ignored


@dataclass(frozen=True)
class Scales:
    """Multipliers folded into the weights: the embedding, every sublayer's output (Granite's
    ``residual_multiplier``), the logits; ``attn``: the divisor of ``q·k`` (None: ``sqrt(d_head)``)."""

    embed: float = 1.0
    residual: float = 1.0
    logits: float = 1.0
    attn: float | None = None


#: mixture-of-experts blocks whose router is a softmax over the experts, the top k kept (transformers 5: the
#: router's class; transformers 4: the block's, its router a plain ``nn.Linear``)
SOFTMAX_ROUTERS = ("MixtralTopKRouter", "OlmoeTopKRouter", "Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter")
SOFTMAX_BLOCKS_4X = ("MixtralSparseMoeBlock", "OlmoeSparseMoeBlock", "Qwen2MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock")


def mlp_of(layer: Any) -> Any:
    """A block's MLP: ``mlp``, or Mixtral's and PhiMoE's ``block_sparse_moe`` in transformers 4."""
    mlp = getattr(layer, "mlp", None)
    return mlp if mlp is not None else getattr(layer, "block_sparse_moe", None)


def experts(model: Any, source: str) -> tuple[int, bool] | None:
    """``(experts per token, renormalised)`` of a mixture-of-experts model (Mixtral, OLMoE, Qwen2/3-MoE: a
    softmax router, the top k experts' weights renormalised to sum to 1 or not); None without experts. Every
    layer must be one (no dense layers between), with a softmax router and no shared expert."""
    blocks = [mlp_of(block) for block in model.model.layers]
    moe = [hasattr(mlp, "experts") for mlp in blocks]
    if not any(moe):
        return None
    if not all(moe):
        dense = ", ".join(str(i) for i, m in enumerate(moe) if not m)
        raise unsupported(f"dense MLP layers among mixture-of-experts layers (layer {dense} of {len(moe)}: "
                          "mlp_only_layers, decoder_sparse_step)", source)
    mlp = blocks[0]
    if getattr(mlp, "shared_expert", None) is not None:
        raise unsupported("a shared expert beside the routed ones (shared_expert, shared_expert_gate: a sigmoid-gated "
                          "MLP every position goes through)", source)
    router = getattr(mlp, "gate", None)
    if type(router).__name__ in SOFTMAX_ROUTERS:
        return int(router.top_k), bool(getattr(router, "norm_topk_prob", True))
    if type(mlp).__name__ in SOFTMAX_BLOCKS_4X and type(router).__name__ == "Linear":  # Mixtral always renormalises
        return int(mlp.top_k), bool(getattr(mlp, "norm_topk_prob", True))
    named = router if type(router).__name__ != "Linear" else mlp
    raise unsupported(f"mixture-of-experts routing by {type(getattr(mlp, 'router', named)).__name__} (tcircuits reads a "
                      "softmax over the experts, the top k kept)", source)


def norm_names(layer: Any) -> tuple[str, str | None, str | None, str | None, str | None]:
    """``(sublayer_norm, ln1, ln2, ln1_post, ln2_post)``: the block's norm modules that read the stream
    before each sublayer and that normalise each sublayer's output (None: none). OLMo 2 and EXAONE 4
    normalise only the outputs; Gemma 2/3 both (the MLP reads ``pre_feedforward_layernorm``; their
    ``post_attention_layernorm`` follows attention), GLM-4 and HyperCLOVA X (``use_post_norm``) too."""
    def has(name: str) -> bool:
        return type(getattr(layer, name, None)).__name__ not in ("NoneType", "Identity")

    if has("attention_layernorm"):  # Apertus' names
        return "pre", "attention_layernorm", "feedforward_layernorm", None, None
    pre_mlp = next((n for n in ("pre_feedforward_layernorm", "post_attention_layernorm") if has(n)), None)  # parallel: none
    if has("post_feedforward_layernorm"):
        if not has("input_layernorm"):
            return "post", None, None, "post_attention_layernorm", "post_feedforward_layernorm"
        return "both", "input_layernorm", pre_mlp, "post_attention_layernorm", "post_feedforward_layernorm"
    for post1, post2 in (("post_self_attn_layernorm", "post_mlp_layernorm"), ("post_norm1", "post_norm2")):
        if has(post1):
            return "both", "input_layernorm", "post_attention_layernorm", post1, post2
    return "pre", "input_layernorm", pre_mlp, None, None


def read_llama_like(model: Any, source: str, layout: Layout = Layout(), scales: Scales = Scales()) -> SourceWeights:
    """A Llama-layout model as :class:`SourceWeights` (``layout``, ``scales``: how it departs from Llama);
    q/k norms, norms after a sublayer, sliding windows, soft-caps and scaled ropes read as the modules hold them."""
    config = model.config
    if getattr(config, "clip_qkv", None) is not None:  # clamps queries, keys and values: not a linear map
        raise unsupported(f"clipped queries, keys and values (clip_qkv={config.clip_qkv})", source)
    moe = experts(model, source)
    d_model, n_heads = config.hidden_size, config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    d_head = getattr(config, "head_dim", None) or d_model // n_heads
    if n_heads % n_kv:
        raise unsupported(f"{n_heads} query heads in {n_kv} key/value groups (not divisible)", source)
    built = getattr(model.model.layers[0].self_attn, "head_dim", None)
    if isinstance(built, int) and built != d_head:  # checked before the rotary, whose width follows the built size
        raise WeightError(f"{source}: its attention was built with head_dim={built} (q_proj.weight has shape "
                          f"{tuple(model.model.layers[0].self_attn.q_proj.weight.shape)}) but the config says "
                          f"head_dim={d_head}; the config's sizes disagree with the weights (was it edited after the "
                          "model was built?)")
    declared = getattr(model.model.layers[0].self_attn, "rotary_ndims", None)
    rope_of, rotary_emb = _one_rotary(model, source)
    fraction, theta = rotary(rope_of, rotary_emb, d_head, source, declared, scaled=True)
    dims = (d_model, n_heads, n_kv, d_head)
    layers = [_layer(layer, i, dims, config, layout, scales, source) for i, layer in enumerate(model.model.layers)]
    qk = decoder.qk_modules(model.model.layers[0].self_attn, source)
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    kind = "layer_norm" if layout.norm.startswith("layer") else "rms_norm"
    return SourceWeights(
        W_E=f64(model.model.embed_tokens.weight) * scales.embed, W_pos=None, W_U=W_U * scales.logits,
        b_U=b_U * scales.logits, layers=layers, ln_final=norm(model.model.norm, layout.norm), positional="none",
        layer_norm=kind == "layer_norm", norm=kind, act_fn=act(getattr(config, layout.act), source),
        eps=_eps(model, layout, source), attn_scale=_attn_scale(model, scales, d_head, source), d_head=d_head,
        n_ctx=config.max_position_embeddings, d_mlp=layers[0].mlp["W_out"].shape[-2], parallel=layout.parallel,
        rotary=fraction, rotary_style=layout.rotary_style, rotary_base=theta,
        experts_top_k=moe[0] if moe else 1, moe_renormalise=moe[1] if moe else True,
        qk_norm=decoder.qk_kind(qk[0]) if qk else None,
        qk_norm_scope=decoder.qk_scope(layers[0].q_norm[0], d_head) if qk else "head",
        sublayer_norm=norm_names(model.model.layers[0])[0],
        window=decoder.windows(config, len(layers), source, layout.layer_windows, model.model.layers),
        **decoder.softcaps(model), **decoder.rope_fields(rotary_emb),
    )


def _one_rotary(model: Any, source: str) -> tuple[Any, Any]:
    """``(what holds the config, the rotary embedding)`` for :func:`rotary`: the model's own, or, where each
    layer type has its own rope (Gemma 3, OLMo 3), the one every layer type used shares; ropes that differ
    between the layer types used are refused."""
    ropes = _ropes_by_layer_type(model)
    if ropes is None:
        return model, model.model.rotary_emb
    used = sorted(set(model.config.layer_types[:len(model.model.layers)]))
    first = ropes[used[0]][1]
    if any(not torch.equal(ropes[t][1].inv_freq, first.inv_freq) or ropes[t][1].attention_scaling != first.attention_scaling
           for t in used):
        ropes_of = ", ".join(f"{ropes[t][0]['rope_type']} rope_theta {ropes[t][0].get('rope_theta')} in {t}" for t in used)
        raise unsupported(f"rotary frequencies that differ between layer types ({ropes_of})", source)
    return SimpleNamespace(config=SimpleNamespace(rope_parameters=ropes[used[0]][0])), first


def _ropes_by_layer_type(model: Any) -> dict[str, tuple[dict, Any]] | None:
    """``{layer type: (its rope_parameters, its rotary embedding)}`` where each layer type has its own rope, None
    where one rope serves every layer. Transformers 5 keeps them in one module (``sliding_attention_inv_freq``, …);
    transformers 4 in two: OLMo 3's ``rotary_embs`` (the sliding layers' rope_theta's own frequencies), Gemma 3's
    ``rotary_emb`` and ``rotary_emb_local`` (``rope_local_base_freq``)."""
    body, config = model.model, model.config
    emb = getattr(body, "rotary_emb", None)
    if emb is not None and hasattr(emb, "inv_freq") and not hasattr(body, "rotary_emb_local"):
        return None
    if emb is not None and not hasattr(emb, "inv_freq"):  # transformers 5: one module, buffers per layer type
        return {t: (dict(config.rope_parameters[t]),
                    SimpleNamespace(inv_freq=getattr(emb, f"{t}_inv_freq"), rope_type=emb.rope_type[t],
                                    original_inv_freq=getattr(emb, f"{t}_original_inv_freq"),
                                    attention_scaling=getattr(emb, f"{t}_attention_scaling")))
                for t in config.rope_parameters if hasattr(emb, f"{t}_inv_freq")}
    full = rope_parameters(config)
    if hasattr(body, "rotary_embs"):  # OLMo 3 in transformers 4
        sliding = {"rope_type": "default", "rope_theta": full["rope_theta"]}
        return {"sliding_attention": (sliding, body.rotary_embs["sliding_attention"]),
                "full_attention": (full, body.rotary_embs["full_attention"])}
    sliding = {"rope_type": "default", "rope_theta": float(config.rope_local_base_freq)}  # Gemma 3 in transformers 4
    return {"sliding_attention": (sliding, body.rotary_emb_local), "full_attention": (full, emb)}


def _eps(model: Any, layout: Layout, source: str) -> float:
    """The norms' one eps as built (:func:`~numeric_check.conversion.readers.common.built_eps`)."""
    final = model.model.norm
    if layout.norm.startswith("layer") and not hasattr(final, "eps") and not hasattr(final, "variance_epsilon"):
        return 1e-5  # OLMo's parameter-free layer norm has eps 1e-5 fixed in its code
    return built_eps(model.model, layout.eps, source)


def _attn_scale(model: Any, scales: Scales, d_head: int, source: str) -> float:
    """The divisor of ``q·k`` as the attention modules were built with it (``scaling``, fixed at construction from
    the config's multipliers and head size), else from ``scales``; layers built with different ones are refused."""
    built = {float(layer.self_attn.scaling) for layer in model.model.layers
             if isinstance(getattr(layer.self_attn, "scaling", None), (int, float))}
    if len(built) > 1:
        listed = ", ".join(f"layers.{i}.self_attn.scaling = {layer.self_attn.scaling:g}"
                           for i, layer in enumerate(model.model.layers))
        raise unsupported(f"attention scales that differ between layers ({listed})", source)
    if built and next(iter(built)) > 0:
        return 1.0 / next(iter(built))
    return scales.attn or math.sqrt(d_head)


def _layer(layer: Any, i: int, dims: tuple[int, int, int, int], config: Any, layout: Layout, scales: Scales,
           source: str) -> LayerWeights:
    d_model, n_heads, n_kv, d_head = dims
    a, where = layer.self_attn, f"layers.{i}.self_attn."
    W_O, b_O = heads_out(a.o_proj, n_heads, d_head, d_model, where + "o_proj", source)
    mode, *names = norm_names(layer)
    ln1, ln2, post1, post2 = (norm(getattr(layer, n), layout.norm) if n else None for n in names)
    if layout.parallel:
        ln2 = ln1
    d_mlp = config.intermediate_size
    if hasattr(mlp_of(layer), "experts"):
        mlp = _experts(mlp_of(layer))
    elif layout.mlp == "gated":
        mlp = _gated_mlp(layer.mlp, d_mlp)
    elif layout.mlp == "packed":
        mlp = packed_gated_mlp(layer.mlp, d_mlp, d_model, f"layers.{i}.mlp.", source)
    elif layout.mlp == "up_down":
        mlp = plain_mlp(layer.mlp.up_proj, layer.mlp.down_proj, d_mlp, d_model, f"layers.{i}.mlp.", source)
    else:
        mlp = plain_mlp(layer.mlp.c_fc, layer.mlp.c_proj, d_mlp, d_model, f"layers.{i}.mlp.c_", source)
    # a sublayer's output is multiplied by residual_multiplier after its post norm (HyperCLOVA X): into the post
    # norm's gain then, since a norm's eps makes it not scale-invariant
    r, post_r = (1.0, scales.residual) if mode != "pre" else (scales.residual, 1.0)
    for what, post in (("ln1_post", post1), ("ln2_post", post2)):
        if post is not None and post[1].any():
            raise unsupported(f"a norm after a sublayer with a bias (layers.{i} {what})", source)
    qk = decoder.qk_modules(a, source)
    q_norm, k_norm = (decoder.qk_weights(m, d_head, layout.norm == "gemma") for m in qk) if qk else (None, None)
    return LayerWeights(
        W_Q=split_heads(a.q_proj.weight, n_heads, d_head, d_model, where + "q_proj.weight", source),
        W_K=split_heads(a.k_proj.weight, n_kv, d_head, d_model, where + "k_proj.weight", source),
        W_V=split_heads(a.v_proj.weight, n_kv, d_head, d_model, where + "v_proj.weight", source),
        W_O=W_O * r, b_O=b_O * r,
        b_Q=bias(a.q_proj, n_heads, d_head, where + "q_proj.bias", source),
        b_K=bias(a.k_proj, n_kv, d_head, where + "k_proj.bias", source),
        b_V=bias(a.v_proj, n_kv, d_head, where + "v_proj.bias", source),
        ln1=ln1, ln2=ln2, mlp={**mlp, "W_out": mlp["W_out"] * r, "b_out": mlp["b_out"] * r},
        q_norm=q_norm, k_norm=k_norm, ln1_post=None if post1 is None else post1[0] * post_r,
        ln2_post=None if post2 is None else post2[0] * post_r,
    )


def _gated_mlp(mlp: Any, d_mlp: int) -> dict[str, Tensor]:
    """``down(act(gate(x)) * up(x))`` in the row convention: ``W_gate``, ``W_in`` (up) ``[d_model, d_mlp]``."""
    def b(linear: Any, n: int) -> Tensor:
        return f64(linear.bias) if linear.bias is not None else torch.zeros(n, dtype=torch.float64)

    return {"W_gate": f64(mlp.gate_proj.weight).T, "b_gate": b(mlp.gate_proj, d_mlp),
            "W_in": f64(mlp.up_proj.weight).T, "b_in": b(mlp.up_proj, d_mlp),
            "W_out": f64(mlp.down_proj.weight).T, "b_out": b(mlp.down_proj, mlp.down_proj.weight.shape[0])}


def _experts(mlp: Any) -> dict[str, Tensor]:
    """A mixture of experts as SourceWeights holds it: ``W_router [d_model, E]`` (the router's ``x Wᵀ``) and every
    expert's gated MLP stacked first (``gate_up_proj [E, 2m, d]``: gate then up; ``down_proj [E, d, m]``), no biases.
    Transformers 4 keeps one module per expert (``gate_proj``/``up_proj``/``down_proj``; Mixtral's ``w1``/``w3``/``w2``)."""
    if isinstance(mlp.experts, torch.nn.ModuleList):
        parts = [(e.gate_proj, e.up_proj, e.down_proj) if hasattr(e, "gate_proj") else (e.w1, e.w3, e.w2)
                 for e in mlp.experts]
        gate_up = torch.stack([torch.cat([f64(g.weight), f64(u.weight)]) for g, u, _ in parts])
        down = torch.stack([f64(d.weight) for _, _, d in parts])
    else:
        gate_up, down = f64(mlp.experts.gate_up_proj), f64(mlp.experts.down_proj)
    (E, two_m, _), d = gate_up.shape, down.shape[1]
    m = two_m // 2
    zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
    return {"W_router": f64(mlp.gate.weight).T, "W_gate": gate_up[:, :m].transpose(1, 2),
            "W_in": gate_up[:, m:].transpose(1, 2), "W_out": down.transpose(1, 2),
            "b_gate": zeros(E, m), "b_in": zeros(E, m), "b_out": zeros(E, d)}


def embed_scale(model: Any) -> float:
    """Gemma's embedding scale as the module holds it: transformers 5 (and Gemma 3 in 4) keep ``sqrt(d_model)`` as
    the buffer ``embed_tokens.embed_scale``, rounded to the model's dtype with it (bfloat16: sqrt(72) -> 8.5) and so
    used; transformers 4's Gemma 1/2 make it at each pass in the activations' dtype (a float64 copy: exact)."""
    held = getattr(model.model.embed_tokens, "embed_scale", None)
    return float(held) if isinstance(held, Tensor) else model.config.hidden_size**0.5


def _read_gemma(model: Any, source: str = "the Gemma model") -> SourceWeights:
    # Gemma scales its embeddings by sqrt(d_model) (as the module holds it) and its RMSNorm gains are 1 + w; Gemma 1's
    # MLP applies hidden_act (its config's hidden_activation is a leftover no code reads), Gemma 2/3's hidden_activation
    config = model.config
    scalar = getattr(config, "query_pre_attn_scalar", None)
    act_attr = "hidden_act" if type(model).__name__ == "GemmaForCausalLM" else "hidden_activation"
    return read_llama_like(model, source, Layout(norm="gemma", act=act_attr),
                           Scales(embed=embed_scale(model), attn=math.sqrt(scalar) if scalar else None))


def _read_granite(model: Any, source: str = "the Granite model", logits_times: bool = False) -> SourceWeights:
    # embeddings x embedding_multiplier; each sublayer's output x residual_multiplier; scores x
    # attention_multiplier (instead of 1/sqrt(d_head)); logits / logits_scaling (HyperCLOVA X: x logits_scaling)
    c = model.config
    return read_llama_like(model, source, scales=Scales(
        embed=c.embedding_multiplier, residual=c.residual_multiplier,
        logits=c.logits_scaling if logits_times else 1.0 / c.logits_scaling,
        attn=1.0 / c.attention_multiplier))


def _read_stablelm(model: Any) -> SourceWeights:
    return read_llama_like(model, "the StableLM model", Layout(
        norm="layer", eps="layer_norm_eps", parallel=bool(model.config.use_parallel_residual)))


def _read_cohere(model: Any, source: str = "the Cohere model") -> SourceWeights:
    return read_llama_like(model, source, Layout(norm="layer", eps="layer_norm_eps", parallel=True,
                                                             rotary_style="gptj"), Scales(logits=model.config.logit_scale))


def _refuse_layers_without_rotary(model: Any, rotary_on: Any, what: str, source: str) -> None:
    plain = [i for i, layer in enumerate(model.model.layers) if not rotary_on(layer.self_attn)]
    if plain:
        raise unsupported(f"layers without rotary ({what}: layer {', '.join(map(str, plain))} of "
                          f"{len(model.model.layers)})", source)


def _read_smollm3(model: Any) -> SourceWeights:
    _refuse_layers_without_rotary(model, lambda a: a.use_rope, "no_rope_layers", "the SmolLM3 model")
    return read_llama_like(model, "the SmolLM3 model")


def _read_cohere2(model: Any) -> SourceWeights:
    # Cohere 2 turns queries and keys only in its sliding-window layers
    _refuse_layers_without_rotary(model, lambda a: a.sliding_window is not None, "full-attention layers",
                                  "the Cohere 2 model")
    return _read_cohere(model, "the Cohere 2 model")


def _read_exaone4(model: Any) -> SourceWeights:
    # with a sliding window configured, EXAONE 4 turns queries and keys only in its sliding-window layers
    _refuse_layers_without_rotary(model, lambda a: a.sliding_window is None or a.is_sliding, "full-attention layers",
                                  "the EXAONE 4 model")
    return read_llama_like(model, "the EXAONE 4 model")


def _read_olmo(model: Any) -> SourceWeights:
    if model.config.clip_qkv is not None:  # clamps queries, keys and values: not a linear map
        raise unsupported(f"clipped queries, keys and values (clip_qkv={model.config.clip_qkv})", "the OLMo model")
    return read_llama_like(model, "the OLMo model", Layout(norm="layer"))


#: what read_llama_like reads from a config (rope_parameters: checked against the model's own
#: inverse frequencies by :func:`~numeric_check.conversion.readers.common.rotary`)
_LLAMA = frozenset({
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "hidden_act", "rms_norm_eps", "rope_parameters", "attention_bias", "mlp_bias", "pretraining_tp",
})
_GRANITE = frozenset({"embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"})
_INTERLEAVED = Layout(rotary_style="gptj")  # rotary pairs (2f, 2f + 1): cos/sin repeated by interleaving
_GLM = Layout(mlp="packed", rotary_style="gptj")
_ONE_WINDOW = Layout(layer_windows=False)  # one mask from sliding_window for every layer
_WINDOWS = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})
#: mixture-of-experts options: read (sizes, top k, norm_topk_prob), refused by name by :func:`experts` (dense layers
#: between, a shared expert) or without effect in eval mode (jitter, router losses)
_MOE = frozenset({"num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                  "decoder_sparse_step", "mlp_only_layers", "shared_expert_intermediate_size", "output_router_logits",
                  "router_aux_loss_coef", "router_jitter_noise", "qkv_bias"})
_GEMMA2 = frozenset({"hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"})

def _family(name: str, cls: str, options: frozenset[str], layout: Layout = Layout(), converts: bool = True) -> Family:
    """A family read by :func:`read_llama_like` with ``layout`` and no multipliers."""
    return Family(name, (cls,), lambda m: read_llama_like(m, f"the {name} model", layout), options, converts)


def _read_gpt_oss(model: Any) -> SourceWeights:
    """GPT-OSS adds a learned logit per head to every softmax (attention sinks), which no algebra
    here expresses: refused by that name, with the rest it would need."""
    raise unsupported("attention sinks (a learned logit per head in every softmax), with mixture-of-experts MLPs "
                      "routed by GPT-OSS's own top-k and clamped SwiGLU experts", "the GPT-OSS model")


FAMILIES = (
    _family("Llama", "LlamaForCausalLM", _LLAMA),
    _family("Qwen2", "Qwen2ForCausalLM", _LLAMA | _WINDOWS),
    _family("Mistral", "MistralForCausalLM", _LLAMA | _WINDOWS, _ONE_WINDOW),
    Family("Gemma", ("GemmaForCausalLM",), _read_gemma, _LLAMA | {"hidden_activation"}),  # a leftover Gemma 1 ignores
    Family("StableLM", ("StableLmForCausalLM",), _read_stablelm,
           _LLAMA | {"layer_norm_eps", "use_qkv_bias", "qk_layernorm", "use_parallel_residual"}),
    Family("OLMo", ("OlmoForCausalLM",), _read_olmo, _LLAMA | {"clip_qkv"}),
    _family("Starcoder2", "Starcoder2ForCausalLM",
            _LLAMA | _WINDOWS | {"norm_epsilon", "use_bias", "residual_dropout", "embedding_dropout"},
            Layout(norm="layer", eps="norm_epsilon", mlp="plain", layer_windows=False)),
    Family("Granite", ("GraniteForCausalLM",), _read_granite, _LLAMA | _GRANITE),
    Family("Cohere", ("CohereForCausalLM",), _read_cohere, _LLAMA | {"layer_norm_eps", "logit_scale", "use_qk_norm"}),
    _family("Ministral", "MinistralForCausalLM", _LLAMA | _WINDOWS),
    _family("Seed-OSS", "SeedOssForCausalLM", _LLAMA | {"attention_out_bias", "residual_dropout"}),
    Family("SmolLM3", ("SmolLM3ForCausalLM",), _read_smollm3,
           _LLAMA | _WINDOWS | {"no_rope_layer_interval", "no_rope_layers"}),
    _family("Ernie 4.5", "Ernie4_5ForCausalLM", _LLAMA | {"use_bias"}, _INTERLEAVED),
    _family("Helium", "HeliumForCausalLM", _LLAMA, _INTERLEAVED),
    Family("HyperCLOVA X", ("HyperCLOVAXForCausalLM",), lambda m: _read_granite(m, "the HyperCLOVA X model", True),
           _LLAMA | _GRANITE | {"use_post_norm"}),
    _family("GLM", "GlmForCausalLM", _LLAMA, _GLM),
    _family("Arcee", "ArceeForCausalLM", _LLAMA, Layout(mlp="up_down")),
    _family("Jais 2", "Jais2ForCausalLM", _LLAMA | {"layer_norm_eps"},
            Layout(norm="layer", eps="layer_norm_eps", mlp="up_down")),
    _family("Nemotron", "NemotronForCausalLM", _LLAMA | {"norm_eps"},
            Layout(norm="layer_plus_one", eps="norm_eps", mlp="up_down")),
    Family("Cohere 2", ("Cohere2ForCausalLM",), _read_cohere2, _LLAMA | _WINDOWS | {"layer_norm_eps", "logit_scale"}),
    # every model of these uses a feature the algebra does not express yet: refused by its name
    Family("VaultGemma", ("VaultGemmaForCausalLM",), lambda m: _read_gemma(m, "the VaultGemma model"),
           _LLAMA | _WINDOWS | _GEMMA2),
    _family("OLMo 3", "Olmo3ForCausalLM", _LLAMA | _WINDOWS),
    Family("EXAONE 4", ("Exaone4ForCausalLM",), _read_exaone4, _LLAMA | _WINDOWS | {"sliding_window_pattern"}),
    _family("Apertus", "ApertusForCausalLM", _LLAMA, Layout(mlp="up_down")),
    _family("CWM", "CwmForCausalLM", _LLAMA | _WINDOWS),
    _family("Ministral 3", "Ministral3ForCausalLM", _LLAMA | _WINDOWS),
    _family("PhiMoE", "PhimoeForCausalLM", _LLAMA | _WINDOWS | _MOE | {"input_jitter_noise", "lm_head_bias"}, converts=False),
    _family("GLM-4", "Glm4ForCausalLM", _LLAMA, _GLM),
    _family("HunYuan dense", "HunYuanDenseV1ForCausalLM", _LLAMA | {"eod_token_id"}, converts=False),
    _family("Qwen3", "Qwen3ForCausalLM", _LLAMA | _WINDOWS),
    _family("OLMo 2", "Olmo2ForCausalLM", _LLAMA),
    Family("Gemma 2", ("Gemma2ForCausalLM",), lambda m: _read_gemma(m, "the Gemma 2 model"),
           _LLAMA | _WINDOWS | _GEMMA2),
    Family("Gemma 3", ("Gemma3ForCausalLM",), lambda m: _read_gemma(m, "the Gemma 3 model"),
           _LLAMA | _WINDOWS | _GEMMA2),
    _family("Mixtral", "MixtralForCausalLM", _LLAMA | _WINDOWS | _MOE, _ONE_WINDOW),
    _family("OLMoE", "OlmoeForCausalLM", _LLAMA | _MOE | {"clip_qkv"}),
    _family("Qwen2-MoE", "Qwen2MoeForCausalLM", _LLAMA | _WINDOWS | _MOE, converts=False),
    _family("Qwen3-MoE", "Qwen3MoeForCausalLM", _LLAMA | _WINDOWS | _MOE, _ONE_WINDOW),
    Family("GPT-OSS", ("GptOssForCausalLM",), _read_gpt_oss, _LLAMA | _WINDOWS | _MOE | {"swiglu_alpha", "swiglu_limit"},
           converts=False),
)
