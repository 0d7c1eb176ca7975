"""GPT-NeoX (Pythia): fused query/key/value, partial rotary, parallel or sequential blocks."""

from __future__ import annotations

import math
from typing import Any

import torch

from numeric_check.model.build import LayerWeights, SourceWeights, f64, unsupported
from numeric_check.model.readers.common import Family, act, norm, rotary, shape, unembed


def read_gpt_neox(model: Any) -> SourceWeights:
    config, source = model.config, "the GPT-NeoX model"
    d_model, n_heads = config.hidden_size, config.num_attention_heads
    d_head = d_model // n_heads
    fraction, theta = rotary(model, model.gpt_neox.rotary_emb, d_head, source)
    layers = []
    for i, layer in enumerate(model.gpt_neox.layers):
        attn = layer.attention
        qkv = shape(f64(attn.query_key_value.weight), (3 * d_model, d_model), f"layers.{i}.attention.query_key_value.weight", source)
        qkv = qkv.reshape(n_heads, 3, d_head, d_model).transpose(2, 3)  # [h, (q, k, v), d_model, d_head]
        bias = attn.query_key_value.bias
        qkv_b = f64(bias).reshape(n_heads, 3, d_head) if bias is not None else torch.zeros(n_heads, 3, d_head, dtype=torch.float64)
        dense = shape(f64(attn.dense.weight), (d_model, d_model), f"layers.{i}.attention.dense.weight", source)
        mlp = layer.mlp
        layers.append(LayerWeights(
            W_Q=qkv[:, 0], W_K=qkv[:, 1], W_V=qkv[:, 2], W_O=dense.T.reshape(n_heads, d_head, d_model),
            b_Q=qkv_b[:, 0], b_K=qkv_b[:, 1], b_V=qkv_b[:, 2],
            b_O=f64(attn.dense.bias) if attn.dense.bias is not None else torch.zeros(d_model, dtype=torch.float64),
            ln1=norm(layer.input_layernorm, "layer_norm"), ln2=norm(layer.post_attention_layernorm, "layer_norm"),
            mlp={"W_in": f64(mlp.dense_h_to_4h.weight).T, "b_in": f64(mlp.dense_h_to_4h.bias),
                 "W_out": f64(mlp.dense_4h_to_h.weight).T, "b_out": f64(mlp.dense_4h_to_h.bias)},
        ))
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=f64(model.gpt_neox.embed_in.weight), W_pos=None, W_U=W_U, b_U=b_U, layers=layers,
        ln_final=norm(model.gpt_neox.final_layer_norm, "layer_norm"), positional="none", layer_norm=True,
        act_fn=act(config.hidden_act, source), eps=float(config.layer_norm_eps), attn_scale=math.sqrt(d_head),
        d_head=d_head, n_ctx=config.max_position_embeddings, d_mlp=config.intermediate_size,
        parallel=bool(config.use_parallel_residual), rotary=fraction, rotary_base=theta,
    )


FAMILIES = (
    Family("GPT-NeoX", ("GPTNeoXForCausalLM",), read_gpt_neox, frozenset({
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act", "rope_parameters",
        "rotary_pct", "rotary_emb_base", "layer_norm_eps", "use_parallel_residual", "attention_bias",
    })),
)
