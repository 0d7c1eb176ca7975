"""Decoders in fairseq's layout: OPT, BioGPT and XGLM.

Each layer has ``self_attn.{q,k,v,out}_proj``, ``self_attn_layer_norm`` before attention,
``final_layer_norm`` before ``fc1``/``fc2``; positions are a table stored from offset 2 (learned
for OPT and BioGPT, sinusoidal for XGLM), token embeddings may be scaled by ``sqrt(d_model)``
(``scale_embedding``, folded into ``W_E``). OPT: ReLU, ``project_in``/``project_out`` folded into
the embedding and the unembedding when ``word_embed_proj_dim`` differs. A block that normalises
the residual stream after adding its output (OPT's ``do_layer_norm_before=False``, and GPT-1,
whose blocks are all so) is refused by name.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from numeric_check.conversion.build import LayerWeights, SourceWeights, f64, unsupported
from numeric_check.conversion.readers.common import Family, act, heads_out, norm, plain_mlp, projections, shape

#: a block that normalises the residual stream after adding its output: every path through the
#: stream is rescaled per layer, which the residual-stream algebra (Id + A ⊗ W_OV) does not express
_POST_LN = "post-layer-norm blocks ({}: each block normalises the residual stream after adding its output)"
_PRE_LN_ADVICE = "study a pre-layer-norm model instead ({}; the guide's page of model families lists the rest)"
OFFSET = 2  # fairseq's position tables start after the padding rows


def _layers(decoder_layers: Any, h: int, d_model: int, d_mlp: int, source: str) -> tuple[list[LayerWeights], float]:
    """The blocks, and the layer norms' one ``eps`` (read from the modules: BioGPT's config value is unused)."""
    d_head, layers, eps = d_model // h, [], set()
    for i, layer in enumerate(decoder_layers):
        a, where = layer.self_attn, f"layers.{i}.self_attn."
        W_O, b_O = heads_out(a.out_proj, h, d_head, d_model, where + "out_proj", source)
        eps |= {layer.self_attn_layer_norm.eps, layer.final_layer_norm.eps}
        layers.append(LayerWeights(
            **projections(a.q_proj, a.k_proj, a.v_proj, h, h, d_head, d_model, where, source), W_O=W_O, b_O=b_O,
            ln1=norm(layer.self_attn_layer_norm, "layer"), ln2=norm(layer.final_layer_norm, "layer"),
            mlp=plain_mlp(layer.fc1, layer.fc2, d_mlp, d_model, f"layers.{i}.fc", source),
        ))
    if len(eps) > 1:
        raise unsupported(f"layer norms with different eps ({sorted(eps)})", source)
    return layers, eps.pop() if eps else 1e-5


def _positions(table: Tensor, n_ctx: int, d_model: int, source: str) -> Tensor:
    return shape(f64(table), (n_ctx + OFFSET, d_model), "embed_positions", source)[OFFSET:]


def _source(W_E: Tensor, W_pos: Tensor, W_U: Tensor, layers: list[LayerWeights], final: Any, act_fn: str, eps: float,
            d_head: int, d_mlp: int) -> SourceWeights:
    return SourceWeights(
        W_E=W_E, W_pos=W_pos, W_U=W_U, b_U=W_U.new_zeros(W_U.shape[1]), layers=layers, ln_final=final,
        positional="standard", layer_norm=True, act_fn=act_fn, eps=eps, attn_scale=math.sqrt(d_head), d_head=d_head,
        n_ctx=W_pos.shape[0], d_mlp=d_mlp,
    )


def read_opt(model: Any) -> SourceWeights:
    config, source, dec = model.config, "the OPT model", model.model.decoder
    if not config.do_layer_norm_before:
        error = unsupported(_POST_LN.format("do_layer_norm_before=False"), source)
        raise type(error)(f"{error}; {_PRE_LN_ADVICE.format('an OPT of another size: only opt-350m is post-layer-norm')}")
    d_model, h = config.hidden_size, config.num_attention_heads
    layers, eps = _layers(dec.layers, h, d_model, config.ffn_dim, source)
    W_E = f64(dec.embed_tokens.weight)  # [vocab, word_embed_proj_dim]
    if dec.project_in is not None:
        W_E = W_E @ f64(dec.project_in.weight).T
    W_U = f64(model.lm_head.weight).T  # [word_embed_proj_dim, vocab]
    if dec.project_out is not None:
        W_U = f64(dec.project_out.weight).T @ W_U
    if dec.final_layer_norm is None:  # _remove_final_layer_norm: the stream reaches the unembedding unnormalised
        raise unsupported("no final layer norm (_remove_final_layer_norm=True: the last residual stream reaches the "
                          "unembedding unnormalised, where CircuitModel's final norm is a frozen scale)", source)
    final = norm(dec.final_layer_norm, "layer")
    W_pos = _positions(dec.embed_positions.weight, config.max_position_embeddings, d_model, source)
    return _source(W_E, W_pos, W_U, layers, final, act(config.activation_function, source), eps, d_model // h,
                   config.ffn_dim)


def _scaled(model: Any, source: str, body: Any, head: Any, sizes: tuple[int, int, int], act_name: str,
            table: Tensor) -> SourceWeights:
    """BioGPT's and XGLM's layout: ``embed_tokens`` scaled by its ``embed_scale``, a position ``table``,
    the blocks, ``layer_norm``, the unembedding ``head``; ``sizes``: ``(d_model, heads, d_mlp)``."""
    d_model, h, d_mlp = sizes
    layers, eps = _layers(body.layers, h, d_model, d_mlp, source)
    W_E = f64(body.embed_tokens.weight) * float(body.embed_tokens.embed_scale)
    W_pos = _positions(table, model.config.max_position_embeddings, d_model, source)
    return _source(W_E, W_pos, f64(head.weight).T, layers, norm(body.layer_norm, "layer"), act(act_name, source), eps,
                   d_model // h, d_mlp)


def read_biogpt(model: Any) -> SourceWeights:
    c, body = model.config, model.biogpt
    return _scaled(model, "the BioGPT model", body, model.output_projection,
                   (c.hidden_size, c.num_attention_heads, c.intermediate_size), c.hidden_act, body.embed_positions.weight)


def read_xglm(model: Any) -> SourceWeights:
    c, body = model.config, model.model
    if getattr(c, "add_cross_attention", False):
        raise unsupported("cross-attention (add_cross_attention)", "the XGLM model")
    return _scaled(model, "the XGLM model", body, model.lm_head, (c.d_model, c.attention_heads, c.ffn_dim),
                   c.activation_function, body.embed_positions.weights)


def read_gpt1(model: Any) -> SourceWeights:
    error = unsupported(_POST_LN.format("ln_1(x + attn(x)), ln_2(n + mlp(n))"), "the GPT-1 model")
    raise type(error)(f"{error}; {_PRE_LN_ADVICE.format('GPT-2, its successor')}")


_FAIRSEQ = frozenset({"activation_function", "dropout", "activation_dropout", "layerdrop", "init_std", "scale_embedding"})

FAMILIES = (
    Family("OPT", ("OPTForCausalLM",), read_opt, _FAIRSEQ | {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "ffn_dim", "do_layer_norm_before",
        "_remove_final_layer_norm", "word_embed_proj_dim", "enable_bias", "layer_norm_elementwise_affine",
    }),
    Family("BioGPT", ("BioGptForCausalLM",), read_biogpt, _FAIRSEQ | {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
        "layer_norm_eps",  # unused by Hugging Face's BioGPT: its layer norms keep eps 1e-5, which is read instead
    }),
    Family("XGLM", ("XGLMForCausalLM",), read_xglm, _FAIRSEQ | {"d_model", "ffn_dim", "num_layers", "attention_heads"},
           default_dtype_float64=True),
    Family("GPT-1", ("OpenAIGPTLMHeadModel",), read_gpt1, frozenset({
        "n_positions", "n_embd", "n_layer", "n_head", "afn", "layer_norm_epsilon"}), converts=False),
)
