"""Llama, Qwen2, Mistral, Gemma: RMSNorm, grouped-query attention, rotary, gated MLPs."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from numeric_check.model.build import LayerWeights, SourceWeights, f64, unsupported
from numeric_check.model.readers.common import Family, act, bias, norm, refuse_windows, rotary, shape, split_heads, unembed


def read_llama_like(model: Any, source: str, norm_kind: str = "rms", act_attr: str = "hidden_act",
                    embed_scale: float = 1.0) -> SourceWeights:
    """Llama's layout (``model.model.layers[i].self_attn.q_proj`` …, ``mlp.gate_proj/up_proj/down_proj``),
    shared by the families below; ``norm_kind`` ``"gemma"`` reads RMSNorm gains as ``1 + w``."""
    config = model.config
    refuse_windows(config, source)
    for attr, feature in (("attn_logit_softcapping", "attention-score soft-capping"),
                          ("final_logit_softcapping", "output-logit soft-capping")):
        if getattr(config, attr, None):
            raise unsupported(feature, source)
    d_model, n_heads = config.hidden_size, config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    d_head = getattr(config, "head_dim", None) or d_model // n_heads
    fraction, theta = rotary(model, model.model.rotary_emb, d_head, source)
    if n_heads % n_kv:
        raise unsupported(f"{n_heads} query heads in {n_kv} key/value groups (not divisible)", source)
    kind = "gemma" if norm_kind == "gemma" else "rms"
    layers = []
    for i, layer in enumerate(model.model.layers):
        a, where = layer.self_attn, f"layers.{i}.self_attn."
        o = shape(f64(a.o_proj.weight), (d_model, n_heads * d_head), where + "o_proj.weight", source)
        mlp = layer.mlp
        layers.append(LayerWeights(
            W_Q=split_heads(a.q_proj.weight, n_heads, d_head, d_model, where + "q_proj.weight", source),
            W_K=split_heads(a.k_proj.weight, n_kv, d_head, d_model, where + "k_proj.weight", source),
            W_V=split_heads(a.v_proj.weight, n_kv, d_head, d_model, where + "v_proj.weight", source),
            W_O=o.T.reshape(n_heads, d_head, d_model),
            b_Q=bias(a.q_proj, n_heads, d_head, where + "q_proj.bias", source),
            b_K=bias(a.k_proj, n_kv, d_head, where + "k_proj.bias", source),
            b_V=bias(a.v_proj, n_kv, d_head, where + "v_proj.bias", source),
            b_O=f64(a.o_proj.bias) if a.o_proj.bias is not None else torch.zeros(d_model, dtype=torch.float64),
            ln1=norm(layer.input_layernorm, kind), ln2=norm(layer.post_attention_layernorm, kind),
            mlp=_gated_mlp(mlp, config.intermediate_size),
        ))
    W_U, b_U = unembed(model, d_model, config.vocab_size, source)
    W_E = f64(model.model.embed_tokens.weight)
    return SourceWeights(
        W_E=W_E * embed_scale, W_pos=None, W_U=W_U, b_U=b_U, layers=layers, ln_final=norm(model.model.norm, kind),
        positional="none", layer_norm=False, norm="rms_norm", act_fn=act(getattr(config, act_attr), source),
        eps=float(config.rms_norm_eps), attn_scale=math.sqrt(d_head), d_head=d_head,
        n_ctx=config.max_position_embeddings, d_mlp=config.intermediate_size, rotary=fraction, rotary_base=theta,
    )


def _gated_mlp(mlp: Any, d_mlp: int) -> dict[str, Tensor]:
    """``down(act(gate(x)) * up(x))`` in the row convention: ``W_gate``, ``W_in`` (up) ``[d_model, d_mlp]``."""
    def b(linear: Any, n: int) -> Tensor:
        return f64(linear.bias) if linear.bias is not None else torch.zeros(n, dtype=torch.float64)

    return {"W_gate": f64(mlp.gate_proj.weight).T, "b_gate": b(mlp.gate_proj, d_mlp),
            "W_in": f64(mlp.up_proj.weight).T, "b_in": b(mlp.up_proj, d_mlp),
            "W_out": f64(mlp.down_proj.weight).T, "b_out": b(mlp.down_proj, mlp.down_proj.weight.shape[0])}


def _read_gemma(model: Any) -> SourceWeights:
    # Gemma scales its embeddings by sqrt(d_model) (in the model's dtype) and its RMSNorm gains are 1 + w
    return read_llama_like(model, "the Gemma model", norm_kind="gemma", embed_scale=model.config.hidden_size**0.5)


#: what read_llama_like reads from a config (rope_parameters: checked against the model's own
#: inverse frequencies by :func:`~numeric_check.model.readers.common.rotary`)
_LLAMA_OPTIONS = frozenset({
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "hidden_act", "rms_norm_eps", "rope_parameters", "attention_bias", "mlp_bias", "pretraining_tp",
})
_WINDOWS = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})

FAMILIES = (
    Family("Llama", ("LlamaForCausalLM",), lambda m: read_llama_like(m, "the Llama model"), _LLAMA_OPTIONS),
    Family("Qwen2", ("Qwen2ForCausalLM",), lambda m: read_llama_like(m, "the Qwen2 model"), _LLAMA_OPTIONS | _WINDOWS),
    Family("Mistral", ("MistralForCausalLM",), lambda m: read_llama_like(m, "the Mistral model"), _LLAMA_OPTIONS | _WINDOWS),
    Family("Gemma", ("GemmaForCausalLM",), _read_gemma, _LLAMA_OPTIONS),
)
