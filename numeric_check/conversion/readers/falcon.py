"""Falcon: one fused query/key/value projection in three layouts (multi-head, multi-query, and the
new decoder architecture's key/value groups), rotary, parallel or sequential blocks with one or
two layer norms; or ALiBi (``alibi=True``) instead of rotary, in its default (SDPA) attention, its bias made in bfloat16 as
Falcon makes it (:func:`_alibi`)."""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
from torch import Tensor

from numeric_check.conversion.build import LayerWeights, SourceWeights, f64, unsupported
from numeric_check.conversion.readers import decoder
from numeric_check.conversion.readers.common import Family, act, built_eps, heads_out, linear, norm, plain_mlp, rotary, unembed


def _split_qkv(W: Tensor, config: Any, n_kv: int, d_head: int) -> tuple[Tensor, Tensor, Tensor]:
    """``query_key_value`` (row convention ``[d_model, out]``) as ``W_Q [h, d_model, e]``, ``W_K``, ``W_V``
    ``[g, d_model, e]``, in the layout Hugging Face's ``FalconAttention._split_heads`` reads; biases ``[out]`` likewise (``d_model`` absent)."""
    lead, h = W.shape[:-1], config.num_attention_heads
    if config.new_decoder_architecture:  # per key/value group: its query heads, then its key, then its value
        qkv = W.reshape(*lead, n_kv, h // n_kv + 2, d_head)
        q, k, v = qkv[..., :-2, :].reshape(*lead, h, d_head), qkv[..., -2, :], qkv[..., -1, :]
    elif not config.multi_query:  # per head: query, key, value
        qkv = W.reshape(*lead, h, 3, d_head)
        q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
    else:  # every query head, then one key head and one value head
        qkv = W.reshape(*lead, h + 2, d_head)
        q, k, v = qkv[..., :h, :], qkv[..., h:h + 1, :], qkv[..., h + 1:, :]
    return tuple(t.movedim(-2, 0) for t in (q, k, v))  # heads first


def _norms(layer: Any, config: Any) -> tuple[Any, Any, bool]:
    """``(ln1, ln2, parallel)``: two layer norms before a parallel attention and MLP (new decoder
    architecture), one read by both (``parallel_attn``), or one before each (sequential)."""
    if hasattr(layer, "ln_attn"):
        return norm(layer.ln_attn, "layer"), norm(layer.ln_mlp, "layer"), True
    ln1 = norm(layer.input_layernorm, "layer")
    if config.parallel_attn or config.new_decoder_architecture:
        return ln1, ln1, True
    return ln1, norm(layer.post_attention_layernorm, "layer"), False


def read_falcon(model: Any) -> SourceWeights:
    config, source = model.config, "the Falcon model"
    d_model, h = config.hidden_size, config.num_attention_heads
    d_head = d_model // h
    if config.alibi and getattr(config, "_attn_implementation", None) == "eager":
        raise unsupported("ALiBi in eager attention (alibi=True, attn_implementation='eager': Hugging Face adds the "
                          "biases twice there, once before the scaling and once in the mask; load it with 'sdpa')", source)
    n_kv = config.num_kv_heads if config.new_decoder_architecture else 1 if config.multi_query else h
    if h % n_kv:
        raise unsupported(f"{h} query heads in {n_kv} key/value groups (not divisible)", source)
    # ALiBi replaces rotary; its biases (BLOOM's slopes times the key's position) reach the scores through the
    # mask, divided by sqrt(d_head) like the scores
    fraction, theta = (None, 10000.0) if config.alibi else rotary(model, model.transformer.rotary_emb, d_head, source,
                                                                                    scaled=True)
    layers, parallel = [], False
    for i, layer in enumerate(model.transformer.h):
        a, where = layer.self_attention, f"h.{i}.self_attention."
        W, b = linear(a.query_key_value, (h + 2 * n_kv) * d_head, where + "query_key_value", source, d_model)
        (W_Q, W_K, W_V), (b_Q, b_K, b_V) = _split_qkv(W, config, n_kv, d_head), _split_qkv(b, config, n_kv, d_head)
        W_O, b_O = heads_out(a.dense, h, d_head, d_model, where + "dense", source)
        ln1, ln2, parallel = _norms(layer, config)
        layers.append(LayerWeights(
            W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, b_Q=b_Q, b_K=b_K, b_V=b_V, b_O=b_O, ln1=ln1, ln2=ln2,
            mlp=plain_mlp(layer.mlp.dense_h_to_4h, layer.mlp.dense_4h_to_h, config.ffn_hidden_size, d_model,
                          f"h.{i}.mlp.dense_", source),
        ))
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=f64(model.transformer.word_embeddings.weight), W_pos=None, W_U=W_U, b_U=b_U, layers=layers,
        ln_final=norm(model.transformer.ln_f, "layer"), positional="none", layer_norm=True,
        act_fn=act(config.activation, source), eps=built_eps(model, "layer_norm_epsilon", source), attn_scale=math.sqrt(d_head),
        d_head=d_head, n_ctx=config.max_position_embeddings, d_mlp=config.ffn_hidden_size, parallel=parallel,
        rotary=fraction, rotary_base=theta, **(_alibi(model, h, d_head) if config.alibi else {}),
        **({} if config.alibi else decoder.rope_fields(model.transformer.rotary_emb)),
    )


def _alibi(model: Any, h: int, d_head: int) -> dict[str, Any]:
    """Falcon's ALiBi as it makes it: ``build_alibi_tensor`` rounds the slopes to bfloat16 and makes the bias of key
    ``j`` as ``slope · j`` in bfloat16, whatever the model's dtype; the mask then divides it by ``sqrt(d_head)``. The
    slopes as its own function gives them (the bias of key 1), the rest named for :func:`alibi_bias`."""
    make = getattr(sys.modules[type(model).__module__], "build_alibi_tensor")
    mask = torch.ones(1, 2, dtype=torch.long, device="cpu")
    slopes = make(mask, h, torch.float64)[:, 0, 1]  # [h]: b_h(1) = the slope rounded to bfloat16
    return {"alibi_slopes": f64(slopes), "alibi_rounding": "bfloat16", "alibi_divisor": math.sqrt(d_head)}


FAMILIES = (
    Family("Falcon", ("FalconForCausalLM",), read_falcon, frozenset({
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_kv_heads", "num_ln_in_parallel_attn",
        "layer_norm_epsilon", "alibi", "new_decoder_architecture", "multi_query", "parallel_attn", "bias",
        "rope_parameters", "ffn_hidden_size", "activation",
    })),
)
