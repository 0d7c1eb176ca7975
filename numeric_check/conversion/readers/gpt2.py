"""GPT-2: ``Conv1D`` weights (``x @ W + b``), one fused query/key/value projection, learned positions."""

from __future__ import annotations

from typing import Any

import torch

from numeric_check.conversion.build import LayerWeights, SourceWeights, f64, unsupported
from numeric_check.conversion.readers.common import Family, act, built_eps, shape


def read_gpt2(model: Any) -> SourceWeights:
    config, source = model.config, "the GPT-2 model"
    if getattr(config, "add_cross_attention", False):
        raise unsupported("cross-attention (add_cross_attention)", source)
    scale = _scale(model, config, source)
    act_fn = act(config.activation_function, source)
    d_model, n_heads = config.n_embd, config.n_head
    d_head = d_model // n_heads
    split = lambda w: w.reshape(d_model, n_heads, d_head).permute(1, 0, 2)  # [d_model, h*e] -> [h, d_model, e]
    layers = []
    for i, block in enumerate(model.transformer.h):
        where = f"h.{i}.attn."
        W_q, W_k, W_v = shape(f64(block.attn.c_attn.weight), (d_model, 3 * d_model), where + "c_attn.weight", source).split(d_model, dim=1)  # Conv1D: x @ W + b
        b_q, b_k, b_v = shape(f64(block.attn.c_attn.bias), (3 * d_model,), where + "c_attn.bias", source).split(d_model)
        layers.append(LayerWeights(
            W_Q=split(W_q), W_K=split(W_k), W_V=split(W_v),
            W_O=shape(f64(block.attn.c_proj.weight), (d_model, d_model), where + "c_proj.weight", source).reshape(n_heads, d_head, d_model),
            b_Q=b_q.reshape(n_heads, d_head), b_K=b_k.reshape(n_heads, d_head), b_V=b_v.reshape(n_heads, d_head),
            b_O=f64(block.attn.c_proj.bias),
            ln1=(f64(block.ln_1.weight), f64(block.ln_1.bias)),
            ln2=(f64(block.ln_2.weight), f64(block.ln_2.bias)),
            mlp={"W_in": f64(block.mlp.c_fc.weight), "b_in": f64(block.mlp.c_fc.bias),
                 "W_out": f64(block.mlp.c_proj.weight), "b_out": f64(block.mlp.c_proj.bias)},
        ))
    lm_head = model.lm_head
    return SourceWeights(
        W_E=f64(model.transformer.wte.weight),
        W_pos=f64(model.transformer.wpe.weight),
        W_U=f64(lm_head.weight).T,
        b_U=f64(lm_head.bias) if lm_head.bias is not None else torch.zeros(config.vocab_size, dtype=torch.float64),
        layers=layers,
        ln_final=(f64(model.transformer.ln_f.weight), f64(model.transformer.ln_f.bias)),
        positional="standard",
        layer_norm=True,
        act_fn=act_fn,
        eps=built_eps(model, "layer_norm_epsilon", source),
        attn_scale=scale,
        d_head=d_head,
        n_ctx=config.n_positions,
        d_mlp=config.n_inner if config.n_inner is not None else 4 * d_model,
    )


def _scale(model: Any, config: Any, source: str) -> float:
    """The divisor of the scores as the attention modules apply it: transformers 5 fixes each layer's
    ``scaling`` at construction (read from the module); transformers 4's eager attention reads
    ``scale_attn_weights`` and ``scale_attn_by_inverse_layer_idx`` from the module, its other attentions (SDPA,
    the default) pass no scale, so the scores are divided by ``sqrt(d_head)`` whatever those say."""
    attns = [block.attn for block in model.transformer.h]
    d_head = attns[0].head_dim
    if all(hasattr(a, "scaling") for a in attns):
        scales = {float(a.scaling) for a in attns}
    elif getattr(config, "_attn_implementation", "eager") == "eager":
        scales = {(d_head ** -0.5 if a.scale_attn_weights else 1.0) / (a.layer_idx + 1 if a.scale_attn_by_inverse_layer_idx
                                                                       else 1) for a in attns}
    else:
        scales = {d_head ** -0.5}
    if len(scales) > 1:
        raise unsupported("attention scale that depends on the layer (scale_attn_by_inverse_layer_idx)", source)
    scale = scales.pop()
    if scale <= 0:
        raise unsupported(f"attention scale {scale!r} (the scores are multiplied by it; expected > 0)", source)
    return 1.0 / scale


FAMILIES = (
    Family("GPT-2", ("GPT2LMHeadModel",), read_gpt2, frozenset({
        "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner", "activation_function", "layer_norm_epsilon",
        "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",  # upcasting to float32 changes no value of a float64 model
    })),
)
