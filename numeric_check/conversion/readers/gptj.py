"""GPT-J and CodeGen: interleaved rotary pairs on ``rotary_dim``, one layer norm read by attention
and MLP in parallel; CodeGen packs its queries, values and keys in one ``qkv_proj`` in ``mp_num``
blocks."""

from __future__ import annotations

import math
from typing import Any

import torch

from numeric_check.conversion.build import LayerWeights, SourceWeights, f64, unsupported
from numeric_check.conversion.readers.common import (
    Family, act, built_eps, heads_out, norm, plain_mlp, rotated_dims, shape, split_heads, unembed,
)


def read_gptj(model: Any) -> SourceWeights:
    config, source = model.config, "the GPT-J model"
    d_model, n_heads = config.n_embd, config.n_head
    d_head = d_model // n_heads
    if config.rotary_dim is None:  # Hugging Face's GPT-J then builds a table of n_embd / 2 frequencies
        raise unsupported("rotary_dim=None (GPT-J's attention runs with an even rotary_dim of at most d_head)", source)
    rotated_dims(config.rotary_dim, d_head, source, "rotary_dim")
    layers = []
    for i, block in enumerate(model.transformer.h):
        a, where = block.attn, f"h.{i}.attn."
        ln = norm(block.ln_1, "layer_norm")  # attention and MLP both read ln_1
        zeros = lambda n: torch.zeros(n, d_head, dtype=torch.float64)  # noqa: E731
        o = shape(f64(a.out_proj.weight), (d_model, d_model), where + "out_proj.weight", source)
        layers.append(LayerWeights(
            W_Q=split_heads(a.q_proj.weight, n_heads, d_head, d_model, where + "q_proj.weight", source),
            W_K=split_heads(a.k_proj.weight, n_heads, d_head, d_model, where + "k_proj.weight", source),
            W_V=split_heads(a.v_proj.weight, n_heads, d_head, d_model, where + "v_proj.weight", source),
            W_O=o.T.reshape(n_heads, d_head, d_model), b_Q=zeros(n_heads), b_K=zeros(n_heads), b_V=zeros(n_heads),
            b_O=torch.zeros(d_model, dtype=torch.float64), ln1=ln, ln2=ln,
            mlp={"W_in": f64(block.mlp.fc_in.weight).T, "b_in": f64(block.mlp.fc_in.bias),
                 "W_out": f64(block.mlp.fc_out.weight).T, "b_out": f64(block.mlp.fc_out.bias)},
        ))
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=f64(model.transformer.wte.weight), W_pos=None, W_U=W_U, b_U=b_U, layers=layers,
        ln_final=norm(model.transformer.ln_f, "layer_norm"), positional="none", layer_norm=True,
        act_fn=act(config.activation_function, source), eps=built_eps(model, "layer_norm_epsilon", source),
        attn_scale=math.sqrt(d_head), d_head=d_head, n_ctx=config.n_positions,
        d_mlp=config.n_inner if config.n_inner is not None else 4 * d_model, parallel=True,
        rotary=config.rotary_dim / d_head, rotary_style="gptj", rotary_base=10000.0,  # GPT-J's base is fixed
    )


def _codegen_qkv(qkv_proj: Any, mp_num: int, n_heads: int, d_head: int, d_model: int, where: str, source: str):
    """CodeGen's ``qkv_proj [3 d_model, d_model]``: ``mp_num`` blocks, each (queries, values, keys) of
    ``d_model / mp_num`` rows; the heads run across the blocks. Returns ``W_Q, W_K, W_V [h, d_model, e]``."""
    W = shape(f64(qkv_proj.weight), (3 * d_model, d_model), where + "qkv_proj.weight", source)
    blocks = W.reshape(mp_num, 3, d_model // mp_num, d_model)  # [block, (q, v, k), local, d_model]
    q, v, k = (blocks[:, j].reshape(n_heads, d_head, d_model).transpose(1, 2) for j in range(3))
    return q, k, v


def read_codegen(model: Any) -> SourceWeights:
    config, source = model.config, "the CodeGen model"
    d_model, n_heads = config.n_embd, config.n_head
    # mp_num: 4 in CodeGen's code (transformers 4 a constant of its forward, 5.x an attribute set at construction)
    d_head, mp_num = d_model // n_heads, getattr(model.transformer.h[0].attn, "mp_num", 4)
    rotary_dim = rotated_dims(config.rotary_dim or d_head, d_head, source, "rotary_dim")
    if d_model % mp_num:
        raise unsupported(f"d_model={d_model} in {mp_num} blocks of queries, values and keys (not divisible)", source)
    d_mlp, layers = config.n_inner if config.n_inner is not None else 4 * d_model, []
    for i, block in enumerate(model.transformer.h):
        a, where = block.attn, f"h.{i}.attn."
        W_Q, W_K, W_V = _codegen_qkv(a.qkv_proj, mp_num, n_heads, d_head, d_model, where, source)
        W_O, b_O = heads_out(a.out_proj, n_heads, d_head, d_model, where + "out_proj", source)
        ln = norm(block.ln_1, "layer_norm")
        zeros = torch.zeros(n_heads, d_head, dtype=torch.float64)
        layers.append(LayerWeights(W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, b_Q=zeros, b_K=zeros, b_V=zeros, b_O=b_O,
                                   ln1=ln, ln2=ln, mlp=plain_mlp(block.mlp.fc_in, block.mlp.fc_out, d_mlp, d_model,
                                                                 f"h.{i}.mlp.fc_", source)))
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=f64(model.transformer.wte.weight), W_pos=None, W_U=W_U, b_U=b_U, layers=layers,
        ln_final=norm(model.transformer.ln_f, "layer_norm"), positional="none", layer_norm=True,
        act_fn=act(config.activation_function, source), eps=built_eps(model, "layer_norm_epsilon", source),
        attn_scale=math.sqrt(d_head), d_head=d_head, n_ctx=config.n_positions, d_mlp=d_mlp, parallel=True,
        rotary=rotary_dim / d_head, rotary_style="gptj", rotary_base=10000.0,  # CodeGen's base is fixed
    )


_GPTJ_OPTIONS = frozenset({"n_positions", "n_embd", "n_layer", "n_head", "rotary_dim", "n_inner", "activation_function",
                           "layer_norm_epsilon"})

FAMILIES = (
    Family("GPT-J", ("GPTJForCausalLM",), read_gptj, _GPTJ_OPTIONS),
    Family("CodeGen", ("CodeGenForCausalLM",), read_codegen, _GPTJ_OPTIONS | {"n_ctx"}),
)
