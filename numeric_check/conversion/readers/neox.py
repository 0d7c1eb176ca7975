"""GPT-NeoX (Pythia) and Persimmon: fused query/key/value (per head: query, key, value), partial
rotary; GPT-NeoX's blocks parallel or sequential; Persimmon's q/k layer norm (``qk_layernorm``: one
layer norm over each head's queries and keys, before the rotation)."""

from __future__ import annotations

import math
from typing import Any

import torch

from numeric_check.conversion.build import LayerWeights, SourceWeights, f64
from numeric_check.conversion.readers import decoder
from numeric_check.conversion.readers.common import Family, act, built_eps, heads_out, norm, plain_mlp, rotary, shape, unembed


def read_gpt_neox(model: Any) -> SourceWeights:
    config, source = model.config, "the GPT-NeoX model"
    d_model, n_heads = config.hidden_size, config.num_attention_heads
    d_head = d_model // n_heads
    fraction, theta = rotary(model, model.gpt_neox.rotary_emb, d_head, source, scaled=True)
    layers = [_layer(layer, layer.attention, i, n_heads, d_head, d_model, source)
              for i, layer in enumerate(model.gpt_neox.layers)]
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=f64(model.gpt_neox.embed_in.weight), W_pos=None, W_U=W_U, b_U=b_U, layers=layers,
        ln_final=norm(model.gpt_neox.final_layer_norm, "layer_norm"), positional="none", layer_norm=True,
        act_fn=act(config.hidden_act, source), eps=built_eps(model, "layer_norm_eps", source), attn_scale=math.sqrt(d_head),
        d_head=d_head, n_ctx=config.max_position_embeddings, d_mlp=config.intermediate_size,
        parallel=bool(config.use_parallel_residual), rotary=fraction, rotary_base=theta,
        **decoder.rope_fields(model.gpt_neox.rotary_emb),
    )


def _layer(layer: Any, attn: Any, i: int, n_heads: int, d_head: int, d_model: int, source: str) -> LayerWeights:
    """A block with a fused ``query_key_value`` (per head: query, key, value), ``dense``,
    ``input_layernorm``, ``post_attention_layernorm`` and ``mlp.dense_h_to_4h``/``dense_4h_to_h``."""
    where = f"layers.{i}."
    qkv = shape(f64(attn.query_key_value.weight), (3 * d_model, d_model), where + "query_key_value.weight", source)
    qkv = qkv.reshape(n_heads, 3, d_head, d_model).transpose(2, 3)  # [h, (q, k, v), d_model, d_head]
    bias = attn.query_key_value.bias
    qkv_b = f64(bias).reshape(n_heads, 3, d_head) if bias is not None else torch.zeros(n_heads, 3, d_head, dtype=torch.float64)
    W_O, b_O = heads_out(attn.dense, n_heads, d_head, d_model, where + "dense", source)
    return LayerWeights(
        W_Q=qkv[:, 0], W_K=qkv[:, 1], W_V=qkv[:, 2], W_O=W_O, b_Q=qkv_b[:, 0], b_K=qkv_b[:, 1], b_V=qkv_b[:, 2], b_O=b_O,
        ln1=norm(layer.input_layernorm, "layer_norm"), ln2=norm(layer.post_attention_layernorm, "layer_norm"),
        mlp=plain_mlp(layer.mlp.dense_h_to_4h, layer.mlp.dense_4h_to_h, layer.mlp.dense_h_to_4h.weight.shape[0], d_model,
                      where + "mlp.dense_", source),
    )


def read_persimmon(model: Any) -> SourceWeights:
    config, source = model.config, "the Persimmon model"
    act_fn = act(config.hidden_act, source)
    d_model, n_heads = config.hidden_size, config.num_attention_heads
    d_head = d_model // n_heads
    attn0 = model.model.layers[0].self_attn
    fraction, theta = rotary(model, model.model.rotary_emb, d_head, source, attn0.rotary_ndims, scaled=True)
    layers = [_layer(layer, layer.self_attn, i, n_heads, d_head, d_model, source) for i, layer in enumerate(model.model.layers)]
    for layer, block in zip(layers, model.model.layers):  # qk_layernorm: a layer norm over each head's d_head
        qk = decoder.qk_modules(block.self_attn, source)
        if qk:
            layer.q_norm, layer.k_norm = (decoder.qk_weights(m, d_head) for m in qk)
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=f64(model.model.embed_tokens.weight), W_pos=None, W_U=W_U, b_U=b_U, layers=layers,
        ln_final=norm(model.model.final_layernorm, "layer_norm"), positional="none", layer_norm=True, act_fn=act_fn,
        eps=built_eps(model, "layer_norm_eps", source), attn_scale=math.sqrt(d_head), d_head=d_head,
        n_ctx=config.max_position_embeddings, d_mlp=config.intermediate_size, rotary=fraction, rotary_base=theta,
        qk_norm="layer_norm" if layers[0].q_norm is not None else None, **decoder.rope_fields(model.model.rotary_emb),
    )


FAMILIES = (
    Family("GPT-NeoX", ("GPTNeoXForCausalLM",), read_gpt_neox, frozenset({
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act", "rope_parameters",
        "rotary_pct", "rotary_emb_base", "layer_norm_eps", "use_parallel_residual", "attention_bias",
    })),
    Family("Persimmon", ("PersimmonForCausalLM",), read_persimmon, frozenset({
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act", "rope_parameters",
        "layer_norm_eps", "qk_layernorm", "hidden_dropout",
    })),
)
