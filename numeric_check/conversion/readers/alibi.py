"""BLOOM and MPT: attention with ALiBi position biases (one more position-only term of each head's
scores, ``m_h (j − i)``) and no other positions.

BLOOM: fused query/key/value per head, layer norms with bias, the embedding's own layer norm
(``word_embeddings_layernorm``: a function of the token alone, so folded into ``W_E``), BLOOM's
slopes added to the scaled scores. MPT: fused ``Wqkv`` (all queries, then keys, then values),
layer norms without bias, no biases anywhere, ``softmax_scale``, the slopes of ``alibi_bias_max=8`` (Hugging
Face's ``MptModel`` passes no other).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from numeric_check.conversion.build import LayerWeights, SourceWeights, f64, unsupported
from numeric_check.model.layers import alibi_slopes
from numeric_check.conversion.readers.common import Family, built_eps, heads_out, linear, norm, plain_mlp, unembed


def _fold_embedding_norm(W_E: Tensor, module: Any) -> Tensor:
    """``LN(W_E[t])`` for every token ``t``: a layer norm of the embedding alone is a new embedding."""
    w, b = norm(module, "layer")
    return F.layer_norm(W_E, (W_E.shape[1],), w, b, eps=float(module.eps))


def read_bloom(model: Any) -> SourceWeights:
    config, source = model.config, "the BLOOM model"
    if config.apply_residual_connection_post_layernorm:
        raise unsupported("a residual stream that carries each layer norm's output "
                          "(apply_residual_connection_post_layernorm=True)", source)
    d_model, h = config.hidden_size, config.n_head
    d_head, body, layers = d_model // h, model.transformer, []
    for i, block in enumerate(body.h):
        a, where = block.self_attention, f"h.{i}.self_attention."
        # slow_but_exact with pretraining_tp > 1 (fixed on the modules at construction): dense and dense_4h_to_h run
        # slice by slice without their biases
        sliced = [getattr(m, "pretraining_tp", 1) > 1 and getattr(m, "slow_but_exact", False) for m in (a, block.mlp)]
        W, b = linear(a.query_key_value, 3 * d_model, where + "query_key_value", source, d_model)
        qkv, qkv_b = W.reshape(d_model, h, 3, d_head).permute(2, 1, 0, 3), b.reshape(h, 3, d_head).transpose(0, 1)
        W_O, b_O = heads_out(a.dense, h, d_head, d_model, where + "dense", source)
        mlp = plain_mlp(block.mlp.dense_h_to_4h, block.mlp.dense_4h_to_h, 4 * d_model, d_model, f"h.{i}.mlp.dense_",
                        source)
        layers.append(LayerWeights(
            W_Q=qkv[0], W_K=qkv[1], W_V=qkv[2], W_O=W_O, b_Q=qkv_b[0], b_K=qkv_b[1], b_V=qkv_b[2],
            b_O=torch.zeros_like(b_O) if sliced[0] else b_O,
            ln1=norm(block.input_layernorm, "layer"), ln2=norm(block.post_attention_layernorm, "layer"),
            mlp={**mlp, "b_out": torch.zeros_like(mlp["b_out"])} if sliced[1] else mlp,
        ))
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=_fold_embedding_norm(f64(body.word_embeddings.weight), body.word_embeddings_layernorm), W_pos=None,
        W_U=W_U, b_U=b_U, layers=layers, ln_final=norm(body.ln_f, "layer"), positional="none", layer_norm=True,
        act_fn="gelu_new", eps=built_eps(model, "layer_norm_epsilon", source), attn_scale=math.sqrt(d_head), d_head=d_head,
        n_ctx=getattr(config, "seq_length", None) or 2048, d_mlp=4 * d_model, alibi_slopes=alibi_slopes(h),
    )


def _mpt_slopes(n_heads: int, bias_max: float) -> Tensor:
    """MPT's slopes, ``2^-(k·bias_max/n')`` for ``n'`` the next power of two (odd ones first when ``n < n'``), in float32 as it makes them."""
    n2 = 2 ** math.ceil(math.log2(n_heads))
    slopes = 1.0 / torch.pow(2, torch.arange(1, n2 + 1, dtype=torch.int64).float() * (bias_max / n2))
    if n2 != n_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:n_heads]
    return slopes.to(torch.float64)


def read_mpt(model: Any) -> SourceWeights:
    config, source = model.config, "the MPT model"
    attn_config = config.attn_config
    if not attn_config.alibi:
        raise unsupported("attention without ALiBi (attn_config.alibi=False): tcircuits reads MPT only as far as its "
                          "ALiBi", source)
    if attn_config.clip_qkv:  # clamps queries, keys and values: not a linear map
        raise unsupported(f"clipped queries, keys and values (attn_config.clip_qkv={attn_config.clip_qkv})", source)
    d_model, h = config.d_model, config.n_heads
    d_head, body, layers = d_model // h, model.transformer, []
    d_mlp = body.blocks[0].ffn.up_proj.weight.shape[0]
    for i, block in enumerate(body.blocks):
        a, where = block.attn, f"blocks.{i}.attn."
        W, b = linear(a.Wqkv, 3 * d_model, where + "Wqkv", source, d_model)
        qkv, qkv_b = W.reshape(d_model, 3, h, d_head).permute(1, 2, 0, 3), b.reshape(3, h, d_head)
        W_O, b_O = heads_out(a.out_proj, h, d_head, d_model, where + "out_proj", source)
        layers.append(LayerWeights(
            W_Q=qkv[0], W_K=qkv[1], W_V=qkv[2], W_O=W_O, b_Q=qkv_b[0], b_K=qkv_b[1], b_V=qkv_b[2], b_O=b_O,
            ln1=norm(block.norm_1, "layer"), ln2=norm(block.norm_2, "layer"),
            mlp=plain_mlp(block.ffn.up_proj, block.ffn.down_proj, d_mlp, d_model, f"blocks.{i}.ffn.", source),
        ))
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    scale = attn_config.softmax_scale
    return SourceWeights(
        W_E=f64(body.wte.weight), W_pos=None, W_U=W_U, b_U=b_U, layers=layers, ln_final=norm(body.norm_f, "layer"),
        positional="none", layer_norm=True, act_fn="gelu", eps=built_eps(model, "layer_norm_epsilon", source),
        attn_scale=1.0 / scale if scale else math.sqrt(d_head), d_head=d_head, n_ctx=config.max_seq_len, d_mlp=d_mlp,
        alibi_slopes=_mpt_slopes(h, 8.0),  # Hugging Face's MptModel builds them with alibi_bias_max=8 whatever the config says
    )


_BLOOM = frozenset({"hidden_size", "n_layer", "n_head", "layer_norm_epsilon", "apply_residual_connection_post_layernorm",
                    "pretraining_tp", "slow_but_exact"})
_MPT = frozenset({"d_model", "n_heads", "n_layers", "expansion_ratio", "max_seq_len", "attn_config", "layer_norm_epsilon",
                  "learned_pos_emb", "no_bias", "norm_type", "emb_pdrop", "logit_scale", "embedding_fraction", "init_device"})

FAMILIES = (
    Family("BLOOM", ("BloomForCausalLM",), read_bloom, _BLOOM),
    Family("MPT", ("MptForCausalLM",), read_mpt, _MPT),
)
