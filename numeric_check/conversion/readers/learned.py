"""Families with absolute positions, read like GPT-2 but laid out otherwise.

GPTBigCode (StarCoder, SantaCoder): ``nn.Linear`` weights, a fused projection with one shared
key/value head (multi-query) or one per head. GPT-Neo (the TinyStories models): no ``1/sqrt(d)``
scaling of the scores; its local-attention layers are sliding windows of ``window_size`` positions.
CTRL: fixed sinusoidal positions, token embeddings scaled by ``sqrt(d_model)``. (OPT, BioGPT and
XGLM: :mod:`~numeric_check.conversion.readers.fairseq`.)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from numeric_check.conversion.build import LayerWeights, SourceWeights, f64, unsupported
from numeric_check.conversion.readers.common import (
    Family, act, built_eps, heads_out, linear, norm, plain_mlp, projections, unembed,
)

_GPT2_SIZES = frozenset({"n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
                         "layer_norm_epsilon"})


def _heads(W: Tensor, n: int, d_head: int) -> Tensor:
    """``[d_model, n * d_head]`` (row convention) or a bias ``[n * d_head]`` as ``[n, d_model, d_head]`` / ``[n, d_head]``."""
    return W.reshape(*W.shape[:-1], n, d_head).movedim(-2, 0)


def _attention(W_Q: Tensor, b_Q: Tensor, W_K: Tensor, b_K: Tensor, W_V: Tensor, b_V: Tensor, n: int, n_kv: int,
               d_head: int) -> dict[str, Tensor]:
    return {"W_Q": _heads(W_Q, n, d_head), "b_Q": _heads(b_Q, n, d_head), "W_K": _heads(W_K, n_kv, d_head),
            "b_K": _heads(b_K, n_kv, d_head), "W_V": _heads(W_V, n_kv, d_head), "b_V": _heads(b_V, n_kv, d_head)}


def read_gpt_bigcode(model: Any) -> SourceWeights:
    config, source = model.config, "the GPTBigCode model"
    if getattr(config, "add_cross_attention", False):
        raise unsupported("cross-attention (add_cross_attention)", source)
    d_model, h = config.n_embd, config.n_head
    d_head, n_kv = d_model // h, 1 if config.multi_query else h
    d_mlp, layers = config.n_inner if config.n_inner is not None else 4 * d_model, []
    for i, block in enumerate(model.transformer.h):
        W, b = linear(block.attn.c_attn, d_model + 2 * n_kv * d_head, f"h.{i}.attn.c_attn", source, d_model)
        if config.multi_query:  # every query head, then the key head, then the value head
            parts = [t.split([d_model, d_head, d_head], dim=-1) for t in (W, b)]
        else:  # per head: query, key, value
            parts = [t.reshape(*t.shape[:-1], h, 3, d_head).unbind(-2) for t in (W, b)]
            parts = [[p.reshape(*p.shape[:-2], d_model) for p in ps] for ps in parts]
        (W_q, W_k, W_v), (b_q, b_k, b_v) = parts
        W_O, b_O = heads_out(block.attn.c_proj, h, d_head, d_model, f"h.{i}.attn.c_proj", source)
        layers.append(LayerWeights(
            **_attention(W_q, b_q, W_k, b_k, W_v, b_v, h, n_kv, d_head), W_O=W_O, b_O=b_O,
            ln1=norm(block.ln_1, "layer"), ln2=norm(block.ln_2, "layer"),
            mlp=plain_mlp(block.mlp.c_fc, block.mlp.c_proj, d_mlp, d_model, f"h.{i}.mlp.c_", source),
        ))
    return _learned(model, model.transformer, layers, d_head, d_mlp, config.n_positions,
                    math.sqrt(d_head) if config.scale_attn_weights else 1.0, source)


def _learned(model: Any, body: Any, layers: list[LayerWeights], d_head: int, d_mlp: int, n_ctx: int, scale: float,
             source: str) -> SourceWeights:
    """GPT-2's layout around the blocks: ``wte``, ``wpe``, ``ln_f``, ``lm_head``."""
    config = model.config
    d_model = body.wte.weight.shape[1]
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=f64(body.wte.weight), W_pos=f64(body.wpe.weight)[:n_ctx], W_U=W_U, b_U=b_U, layers=layers,
        ln_final=norm(body.ln_f, "layer"), positional="standard", layer_norm=True,
        act_fn=act(config.activation_function, source), eps=built_eps(model, "layer_norm_epsilon", source), attn_scale=scale,
        d_head=d_head, n_ctx=n_ctx, d_mlp=d_mlp,
    )


def read_gpt_neo(model: Any) -> SourceWeights:
    config, source = model.config, "the GPT-Neo model"
    d_model, h = config.hidden_size, config.num_heads
    d_head = d_model // h
    d_mlp, layers = config.intermediate_size or 4 * d_model, []
    for i, block in enumerate(model.transformer.h):
        a, where = block.attn.attention, f"h.{i}.attn.attention."
        W_O, b_O = heads_out(a.out_proj, h, d_head, d_model, where + "out_proj", source)
        layers.append(LayerWeights(
            **projections(a.q_proj, a.k_proj, a.v_proj, h, h, d_head, d_model, where, source), W_O=W_O, b_O=b_O,
            ln1=norm(block.ln_1, "layer"), ln2=norm(block.ln_2, "layer"),
            mlp=plain_mlp(block.mlp.c_fc, block.mlp.c_proj, d_mlp, d_model, f"h.{i}.mlp.c_", source),
        ))
    src = _learned(model, model.transformer, layers, d_head, d_mlp, config.max_position_embeddings, 1.0, source)
    windows = tuple(_neo_window(block.attn.attention, i, source) for i, block in enumerate(model.transformer.h))
    src.window = windows if any(windows) else None
    return src


def _neo_window(attention: Any, i: int, source: str) -> int | None:
    """A GPT-Neo layer's window as its attention module was built (its ``bias`` mask, fixed at construction
    from ``window_size`` and ``attention_layers``: a config edited afterwards changes nothing): local layers keep
    ``i − j < w``, global ones every ``j ≤ i`` (None; so does a window that covers the context)."""
    mask = attention.bias.detach().cpu().reshape(attention.bias.shape[-2:]).bool()
    n = mask.shape[-1]
    w = int(mask[-1].sum())
    pos = torch.arange(n)
    expected = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < w)
    if w < 1 or not torch.equal(mask, expected):
        raise unsupported(f"an attention mask in layer {i} that is neither causal nor a causal window (h.{i}.attn."
                          "attention.bias)", source)
    return w if w < n else None


def read_ctrl(model: Any) -> SourceWeights:
    config, source, body = model.config, "the CTRL model", model.transformer
    d_model, h = config.n_embd, config.n_head
    d_head, layers = d_model // h, []
    eps = {config.layer_norm_epsilon} | {ln.eps for block in body.h for ln in (block.layernorm1, block.layernorm2)}
    if len(eps) > 1:
        raise unsupported(f"layer norms with different eps ({sorted(eps)})", source)
    for i, block in enumerate(body.h):
        a, where = block.multi_head_attention, f"h.{i}.multi_head_attention."
        W_O, b_O = heads_out(a.dense, h, d_head, d_model, where + "dense", source)
        layers.append(LayerWeights(
            **projections(a.Wq, a.Wk, a.Wv, h, h, d_head, d_model, where + "W", source), W_O=W_O, b_O=b_O,
            ln1=norm(block.layernorm1, "layer"), ln2=norm(block.layernorm2, "layer"),
            mlp=plain_mlp(block.ffn[0], block.ffn[2], config.dff, d_model, f"h.{i}.ffn.", source),
        ))
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    n_ctx = config.n_positions
    return SourceWeights(  # token embeddings scaled by sqrt(d_model), fixed sinusoidal positions
        W_E=f64(body.w.weight) * math.sqrt(d_model), W_pos=f64(body.pos_encoding)[:n_ctx], W_U=W_U, b_U=b_U,
        layers=layers, ln_final=norm(body.layernorm, "layer"), positional="standard", layer_norm=True, act_fn="relu",
        eps=eps.pop(), attn_scale=math.sqrt(d_head), d_head=d_head, n_ctx=n_ctx, d_mlp=config.dff,
    )


FAMILIES = (
    Family("GPTBigCode", ("GPTBigCodeForCausalLM",), read_gpt_bigcode, _GPT2_SIZES | {
        "scale_attn_weights", "multi_query", "num_key_value_heads",
        "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32",  # rounding only: float32 softmax
    }),
    Family("CTRL", ("CTRLLMHeadModel",), read_ctrl, frozenset({"n_positions", "n_embd", "n_layer", "n_head", "dff",
                                                                "layer_norm_epsilon", "resid_pdrop", "embd_pdrop"})),
    Family("GPT-Neo", ("GPTNeoForCausalLM",), read_gpt_neo, frozenset({
        "hidden_size", "num_layers", "num_heads", "intermediate_size", "activation_function", "layer_norm_epsilon",
        "attention_types", "attention_layers", "window_size", "resid_dropout", "embed_dropout",
    })),
)
