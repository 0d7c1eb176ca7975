"""Phi and Phi-3.

Phi: one layer norm (with bias) read by attention and MLP in parallel, partial rotary on the
first ``rotary_ndims`` dimensions of each head, biased projections and a biased ``lm_head``;
its optional q/k layer norm (``qk_layernorm``: over each head, before the rotation). Phi-3: Llama with the
queries, keys and values packed in one ``qkv_proj`` and the gate and up projections in one
``gate_up_proj``, sliding windows read per layer.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from numeric_check.conversion.build import LayerWeights, SourceWeights, f64, unsupported
from numeric_check.conversion.readers import decoder
from numeric_check.conversion.readers.common import (
    Family, act, bias, built_eps, heads_out, norm, packed_gated_mlp, plain_mlp, rotary, shape, split_heads, unembed,
)


def _zeros(*shape: int):
    return torch.zeros(*shape, dtype=torch.float64)


def _dims(config: Any, source: str) -> tuple[int, int, int, int]:
    d_model, n_heads = config.hidden_size, config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    if n_heads % n_kv:
        raise unsupported(f"{n_heads} query heads in {n_kv} key/value groups (not divisible)", source)
    return d_model, n_heads, n_kv, getattr(config, "head_dim", None) or d_model // n_heads


def read_phi(model: Any) -> SourceWeights:
    config, source = model.config, "the Phi model"
    d_model, n_heads, n_kv, d_head = _dims(config, source)
    attn0 = model.model.layers[0].self_attn
    fraction, theta = rotary(model, model.model.rotary_emb, d_head, source, attn0.rotary_ndims, scaled=True)
    layers = []
    for i, layer in enumerate(model.model.layers):
        a, where = layer.self_attn, f"layers.{i}.self_attn."
        W_O, b_O = heads_out(a.dense, n_heads, d_head, d_model, where + "dense", source)
        ln = norm(layer.input_layernorm, "layer")  # attention and MLP both read it
        layers.append(LayerWeights(
            W_Q=split_heads(a.q_proj.weight, n_heads, d_head, d_model, where + "q_proj.weight", source),
            W_K=split_heads(a.k_proj.weight, n_kv, d_head, d_model, where + "k_proj.weight", source),
            W_V=split_heads(a.v_proj.weight, n_kv, d_head, d_model, where + "v_proj.weight", source),
            W_O=W_O, b_O=b_O, b_Q=bias(a.q_proj, n_heads, d_head, where + "q_proj.bias", source),
            b_K=bias(a.k_proj, n_kv, d_head, where + "k_proj.bias", source),
            b_V=bias(a.v_proj, n_kv, d_head, where + "v_proj.bias", source), ln1=ln, ln2=ln,
            mlp=plain_mlp(layer.mlp.fc1, layer.mlp.fc2, config.intermediate_size, d_model, f"layers.{i}.mlp.fc", source),
        ))
        qk = decoder.qk_modules(a, source)  # qk_layernorm: a layer norm over each head's d_head, before the rotation
        if qk:
            layers[-1].q_norm, layers[-1].k_norm = (decoder.qk_weights(m, d_head) for m in qk)
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=f64(model.model.embed_tokens.weight), W_pos=None, W_U=W_U, b_U=b_U, layers=layers,
        ln_final=norm(model.model.final_layernorm, "layer"), positional="none", layer_norm=True,
        act_fn=act(config.hidden_act, source), eps=built_eps(model, "layer_norm_eps", source), attn_scale=math.sqrt(d_head),
        d_head=d_head, n_ctx=config.max_position_embeddings, d_mlp=config.intermediate_size, parallel=True,
        rotary=fraction, rotary_base=theta, qk_norm="layer_norm" if layers[0].q_norm is not None else None,
        **decoder.rope_fields(model.model.rotary_emb),
    )


def read_phi3(model: Any) -> SourceWeights:
    config, source = model.config, "the Phi-3 model"
    d_model, n_heads, n_kv, d_head = _dims(config, source)
    fraction, theta = rotary(model, model.model.rotary_emb, d_head, source, scaled=True)
    d_mlp, layers = config.intermediate_size, []
    for i, layer in enumerate(model.model.layers):
        a, where = layer.self_attn, f"layers.{i}."
        qkv = shape(f64(a.qkv_proj.weight), ((n_heads + 2 * n_kv) * d_head, d_model), where + "self_attn.qkv_proj.weight",
                    source)
        q, k, v = qkv.split([n_heads * d_head, n_kv * d_head, n_kv * d_head])
        heads = lambda w, n: w.reshape(n, d_head, d_model).transpose(1, 2)  # noqa: E731
        W_O, b_O = heads_out(a.o_proj, n_heads, d_head, d_model, where + "self_attn.o_proj", source)
        layers.append(LayerWeights(
            W_Q=heads(q, n_heads), W_K=heads(k, n_kv), W_V=heads(v, n_kv), W_O=W_O, b_O=b_O,
            b_Q=_zeros(n_heads, d_head), b_K=_zeros(n_kv, d_head), b_V=_zeros(n_kv, d_head),  # no biases
            ln1=norm(layer.input_layernorm, "rms"), ln2=norm(layer.post_attention_layernorm, "rms"),
            mlp=packed_gated_mlp(layer.mlp, d_mlp, d_model, where + "mlp.", source),
        ))
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=f64(model.model.embed_tokens.weight), W_pos=None, W_U=W_U, b_U=b_U, layers=layers,
        ln_final=norm(model.model.norm, "rms"), positional="none", layer_norm=False, norm="rms_norm",
        act_fn=act(config.hidden_act, source), eps=built_eps(model, "rms_norm_eps", source), attn_scale=math.sqrt(d_head),
        d_head=d_head, n_ctx=config.max_position_embeddings, d_mlp=d_mlp, rotary=fraction, rotary_base=theta,
        window=decoder.windows(config, len(layers), source, layers=model.model.layers),
        **decoder.rope_fields(model.model.rotary_emb),
    )


_COMMON = frozenset({"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "hidden_act", "rope_parameters"})

FAMILIES = (
    Family("Phi", ("PhiForCausalLM",), read_phi, _COMMON | {"layer_norm_eps", "qk_layernorm"}),
    Family("Phi-3", ("Phi3ForCausalLM",), read_phi3, _COMMON | {
        "rms_norm_eps", "sliding_window",
        "original_max_position_embeddings",  # read only by longrope scaling, refused by name
    }),
)
