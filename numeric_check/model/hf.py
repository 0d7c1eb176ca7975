"""``from_hf``: a Hugging Face causal language model as a :class:`CircuitModel`, by family.

One entry point recognises the model's family by its class (GPT-2, GPT-NeoX/Pythia, GPT-J,
Llama, Qwen2, Mistral, Gemma), reads its weights into :class:`~numeric_check.model.adapters.SourceWeights`
(TransformerLens' row convention, float64) and builds the model with the architecture's
options: RMSNorm, grouped-query attention, parallel attention and MLP, rotary (partial;
``neox`` pairs, or GPT-J's interleaved ``gptj`` pairs), gated MLPs. What a family's config asks for that the algebra cannot
express — ALiBi, sliding windows, rope scaling, soft-capping, a model class it does not
know — raises :class:`UnsupportedModel` naming that one feature; a config whose sizes
disagree with the weights raises :class:`WeightError` naming both.

Folding, as for GPT-2: norm gains fold into the weights that read the norm (RMSNorm has
no bias and no centring, so nothing is centred for it); Gemma's ``(1 + w)`` gains and its
embedding scale ``sqrt(d_model)`` fold into the weights too.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from numeric_check.errors import UnsupportedModel, WeightError
from numeric_check.model.adapters import (
    ACT_FN_ALIASES,
    LayerWeights,
    SourceWeights,
    _build,
    _f64,
    _read_hf_gpt2,
    _unsupported,
)
from numeric_check.model.circuit_model import CircuitModel

ROPE_TYPES = ("default",)


def from_hf(model: Any, dtype: str | torch.dtype = torch.float64, device: str | torch.device | None = None,
            biases: bool | None = None) -> CircuitModel:
    """A :class:`CircuitModel` computing the same logits as a Hugging Face causal LM.

    Recognised: ``GPT2LMHeadModel``, ``GPTNeoXForCausalLM`` (Pythia), ``GPTJForCausalLM``, ``LlamaForCausalLM``,
    ``Qwen2ForCausalLM``, ``MistralForCausalLM``, ``GemmaForCausalLM``. ``dtype`` of the
    result (folding is done in float64), ``device`` defaults to the source's; ``biases`` as
    for :func:`~numeric_check.model.adapters.from_hf_gpt2`.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> hf = LlamaForCausalLM(LlamaConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
    ...     num_attention_heads=4, num_key_value_heads=2, intermediate_size=12, max_position_embeddings=6))
    >>> from_hf(hf).arch.describe()
    '1 layer x 4 heads, none positions, RMSNorm, MLPs, 2 key/value heads (2 query heads each), rotary on all of the head dimensions (neox pairing)'
    """
    name = type(model).__name__
    reader = READERS.get(name)
    if reader is None:
        known = ", ".join(READERS)
        config = getattr(model, "config", None)
        feature = _feature_of(config) if config is not None else None
        if feature is not None:
            raise _unsupported(feature, f"the {name} model")
        model_type = getattr(config, "model_type", None)
        raise UnsupportedModel(
            f"from_hf does not know {name}" + (f" (model_type {model_type!r})" if model_type else "")
            + f"; it reads {known}"
        )
    weight = next(iter(model.parameters()), None)
    return _build(reader(model), dtype, device or (weight.device if weight is not None else "cpu"), biases)


# --- what every family shares -------------------------------------------------------------


def _feature_of(config: Any) -> str | None:
    """The feature that keeps an unknown family out, when its config names one the algebra cannot
    express (ALiBi, soft-capping, sliding windows), else ``None``."""
    attn_config = getattr(config, "attn_config", None)
    alibi = getattr(config, "alibi", False) or getattr(attn_config, "alibi", False) or (
        isinstance(attn_config, dict) and attn_config.get("alibi"))
    if getattr(config, "model_type", None) == "bloom" or alibi:
        return "ALiBi positional biases"
    if getattr(config, "attn_logit_softcapping", None) or getattr(config, "final_logit_softcapping", None):
        return "soft-capping of attention scores or logits"
    if getattr(config, "sliding_window", None) is not None:
        return f"sliding-window attention (window {config.sliding_window})"
    return None



def _rotary(model: Any, rotary_emb: Any, d_head: int, source: str) -> tuple[float, float]:
    """``(fraction of each head rotated, base)`` as the model's rotary embedding computes them:
    its inverse frequencies say how many dimensions turn (Llama ignores a config's
    ``partial_rotary_factor``; GPT-NeoX honours it), and must be ``base^(-2f/d_rot)`` exactly
    as rope_theta gives them — any rope scaling is refused by name."""
    config = model.config
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise _unsupported(f"rope scaling {rope_type!r} (rope_parameters)", source)
    if float(getattr(rotary_emb, "attention_scaling", 1.0)) != 1.0:
        raise _unsupported("rotary embeddings scaled by attention_scaling", source)
    base = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    inv = rotary_emb.inv_freq.detach().to(torch.float64).cpu()
    rot_dims = 2 * inv.shape[0]
    expected = base ** (-torch.arange(0, rot_dims, 2, dtype=torch.float64) / rot_dims)
    if not torch.allclose(inv, expected, rtol=1e-6, atol=0):  # float32 buffers agree to ~1e-7
        raise _unsupported("rotary inverse frequencies that are not rope_theta's (a scaled or modified rope)", source)
    if rot_dims < 2 or rot_dims > d_head:
        raise _unsupported(f"rotary on {rot_dims} of {d_head} head dimensions", source)
    return rot_dims / d_head, base


def _shape(t: Tensor, expected: tuple[int, ...], what: str, source: str) -> Tensor:
    if tuple(t.shape) != expected:
        raise WeightError(f"{source}: {what} has shape {tuple(t.shape)} but the config says {expected}; "
                          "the config's sizes disagree with the weights")
    return t


def _split_heads(weight: Tensor, n: int, d_head: int, d_model: int, what: str, source: str) -> Tensor:
    """A ``[n * d_head, d_model]`` projection (``x @ weight.T``) as ``[n, d_model, d_head]``."""
    _shape(weight, (n * d_head, d_model), what, source)
    return _f64(weight).reshape(n, d_head, d_model).transpose(1, 2)


def _bias(linear: Any, n: int, d_head: int, what: str, source: str) -> Tensor:
    if linear.bias is None:
        return torch.zeros(n, d_head, dtype=torch.float64)
    return _shape(_f64(linear.bias), (n * d_head,), what, source).reshape(n, d_head)


def _norm(module: Any, kind: str) -> tuple[Tensor, Tensor] | None:
    """``(w, b)`` of a norm: LayerNorm ``(weight, bias)``, RMSNorm ``(weight, 0)``, Gemma's ``(1 + weight, 0)``."""
    w = _f64(module.weight)
    if kind == "gemma":
        w = 1.0 + w
    b = _f64(module.bias) if getattr(module, "bias", None) is not None else torch.zeros_like(w)
    return w, b


def _act(name: str, source: str) -> str:
    act = ACT_FN_ALIASES.get(name)
    if act is None:
        raise _unsupported(f"activation function {name!r} (supported: {', '.join(ACT_FN_ALIASES)})", source)
    return act


def _unembed(model: Any, d_model: int, d_vocab: int, source: str) -> tuple[Tensor, Tensor]:
    head = model.lm_head
    W_U = _shape(_f64(head.weight), (d_vocab, d_model), "lm_head.weight", source).T
    b_U = _f64(head.bias) if getattr(head, "bias", None) is not None else torch.zeros(d_vocab, dtype=torch.float64)
    return W_U, b_U


# --- GPT-NeoX (Pythia) ----------------------------------------------------------------------


def _read_gpt_neox(model: Any) -> SourceWeights:
    config, source = model.config, "the GPT-NeoX model"
    d_model, n_heads = config.hidden_size, config.num_attention_heads
    d_head = d_model // n_heads
    fraction, theta = _rotary(model, model.gpt_neox.rotary_emb, d_head, source)
    layers = []
    for i, layer in enumerate(model.gpt_neox.layers):
        attn = layer.attention
        qkv = _shape(_f64(attn.query_key_value.weight), (3 * d_model, d_model), f"layers.{i}.attention.query_key_value.weight", source)
        qkv = qkv.reshape(n_heads, 3, d_head, d_model).transpose(2, 3)  # [h, (q, k, v), d_model, d_head]
        bias = attn.query_key_value.bias
        qkv_b = _f64(bias).reshape(n_heads, 3, d_head) if bias is not None else torch.zeros(n_heads, 3, d_head, dtype=torch.float64)
        dense = _shape(_f64(attn.dense.weight), (d_model, d_model), f"layers.{i}.attention.dense.weight", source)
        mlp = layer.mlp
        layers.append(LayerWeights(
            W_Q=qkv[:, 0], W_K=qkv[:, 1], W_V=qkv[:, 2], W_O=dense.T.reshape(n_heads, d_head, d_model),
            b_Q=qkv_b[:, 0], b_K=qkv_b[:, 1], b_V=qkv_b[:, 2],
            b_O=_f64(attn.dense.bias) if attn.dense.bias is not None else torch.zeros(d_model, dtype=torch.float64),
            ln1=_norm(layer.input_layernorm, "layer_norm"), ln2=_norm(layer.post_attention_layernorm, "layer_norm"),
            mlp={"W_in": _f64(mlp.dense_h_to_4h.weight).T, "b_in": _f64(mlp.dense_h_to_4h.bias),
                 "W_out": _f64(mlp.dense_4h_to_h.weight).T, "b_out": _f64(mlp.dense_4h_to_h.bias)},
        ))
    W_U, b_U = _unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=_f64(model.gpt_neox.embed_in.weight), W_pos=None, W_U=W_U, b_U=b_U, layers=layers,
        ln_final=_norm(model.gpt_neox.final_layer_norm, "layer_norm"), positional="none", layer_norm=True,
        act_fn=_act(config.hidden_act, source), eps=float(config.layer_norm_eps), attn_scale=math.sqrt(d_head),
        d_head=d_head, n_ctx=config.max_position_embeddings, d_mlp=config.intermediate_size,
        parallel=bool(config.use_parallel_residual), rotary=fraction, rotary_base=theta,
    )


# --- GPT-J: interleaved rotary pairs, one layer norm read by attention and MLP in parallel --------


def _read_gptj(model: Any) -> SourceWeights:
    config, source = model.config, "the GPT-J model"
    d_model, n_heads = config.n_embd, config.n_head
    d_head = d_model // n_heads
    if config.rotary_dim is None or not 2 <= config.rotary_dim <= d_head or config.rotary_dim % 2:
        raise _unsupported(f"rotary_dim={config.rotary_dim!r} (rotary on an even number of at most d_head={d_head} "
                           "dimensions is what GPT-J's attention can run)", source)
    layers = []
    for i, block in enumerate(model.transformer.h):
        a, where = block.attn, f"h.{i}.attn."
        ln = _norm(block.ln_1, "layer_norm")  # attention and MLP both read ln_1
        zeros = lambda n: torch.zeros(n, d_head, dtype=torch.float64)  # noqa: E731
        o = _shape(_f64(a.out_proj.weight), (d_model, d_model), where + "out_proj.weight", source)
        layers.append(LayerWeights(
            W_Q=_split_heads(a.q_proj.weight, n_heads, d_head, d_model, where + "q_proj.weight", source),
            W_K=_split_heads(a.k_proj.weight, n_heads, d_head, d_model, where + "k_proj.weight", source),
            W_V=_split_heads(a.v_proj.weight, n_heads, d_head, d_model, where + "v_proj.weight", source),
            W_O=o.T.reshape(n_heads, d_head, d_model), b_Q=zeros(n_heads), b_K=zeros(n_heads), b_V=zeros(n_heads),
            b_O=torch.zeros(d_model, dtype=torch.float64), ln1=ln, ln2=ln,
            mlp={"W_in": _f64(block.mlp.fc_in.weight).T, "b_in": _f64(block.mlp.fc_in.bias),
                 "W_out": _f64(block.mlp.fc_out.weight).T, "b_out": _f64(block.mlp.fc_out.bias)},
        ))
    W_U, b_U = _unembed(model, d_model, config.vocab_size, source)
    return SourceWeights(
        W_E=_f64(model.transformer.wte.weight), W_pos=None, W_U=W_U, b_U=b_U, layers=layers,
        ln_final=_norm(model.transformer.ln_f, "layer_norm"), positional="none", layer_norm=True,
        act_fn=_act(config.activation_function, source), eps=float(config.layer_norm_epsilon),
        attn_scale=math.sqrt(d_head), d_head=d_head, n_ctx=config.n_positions,
        d_mlp=config.n_inner if config.n_inner is not None else 4 * d_model, parallel=True,
        rotary=config.rotary_dim / d_head, rotary_style="gptj", rotary_base=10000.0,  # GPT-J's base is fixed
    )


# --- Llama, Qwen2, Mistral, Gemma: RMSNorm, grouped-query attention, rotary, gated MLPs ---------


def _refuse_windows(config: Any, source: str) -> None:
    """Sliding-window attention changes the mask: refused unless its window covers every position."""
    window = getattr(config, "sliding_window", None)
    used = getattr(config, "use_sliding_window", window is not None)
    layer_types = getattr(config, "layer_types", None) or ()
    if (used and window is not None and window < config.max_position_embeddings) or "sliding_attention" in layer_types:
        raise _unsupported(f"sliding-window attention (window {window} < {config.max_position_embeddings} positions)", source)


def _read_llama_like(model: Any, source: str, norm: str = "rms", act_attr: str = "hidden_act",
                     embed_scale: float = 1.0) -> SourceWeights:
    config = model.config
    _refuse_windows(config, source)
    for attr, feature in (("attn_logit_softcapping", "attention-score soft-capping"),
                          ("final_logit_softcapping", "output-logit soft-capping")):
        if getattr(config, attr, None):
            raise _unsupported(feature, source)
    d_model, n_heads = config.hidden_size, config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    d_head = getattr(config, "head_dim", None) or d_model // n_heads
    fraction, theta = _rotary(model, model.model.rotary_emb, d_head, source)
    if n_heads % n_kv:
        raise _unsupported(f"{n_heads} query heads in {n_kv} key/value groups (not divisible)", source)
    kind = "gemma" if norm == "gemma" else "rms"
    layers = []
    for i, layer in enumerate(model.model.layers):
        a, where = layer.self_attn, f"layers.{i}.self_attn."
        o = _shape(_f64(a.o_proj.weight), (d_model, n_heads * d_head), where + "o_proj.weight", source)
        mlp = layer.mlp
        layers.append(LayerWeights(
            W_Q=_split_heads(a.q_proj.weight, n_heads, d_head, d_model, where + "q_proj.weight", source),
            W_K=_split_heads(a.k_proj.weight, n_kv, d_head, d_model, where + "k_proj.weight", source),
            W_V=_split_heads(a.v_proj.weight, n_kv, d_head, d_model, where + "v_proj.weight", source),
            W_O=o.T.reshape(n_heads, d_head, d_model),
            b_Q=_bias(a.q_proj, n_heads, d_head, where + "q_proj.bias", source),
            b_K=_bias(a.k_proj, n_kv, d_head, where + "k_proj.bias", source),
            b_V=_bias(a.v_proj, n_kv, d_head, where + "v_proj.bias", source),
            b_O=_f64(a.o_proj.bias) if a.o_proj.bias is not None else torch.zeros(d_model, dtype=torch.float64),
            ln1=_norm(layer.input_layernorm, kind), ln2=_norm(layer.post_attention_layernorm, kind),
            mlp=_gated_mlp(mlp, config.intermediate_size),
        ))
    W_U, b_U = _unembed(model, d_model, config.vocab_size, source)
    W_E = _f64(model.model.embed_tokens.weight)
    return SourceWeights(
        W_E=W_E * embed_scale, W_pos=None, W_U=W_U, b_U=b_U, layers=layers, ln_final=_norm(model.model.norm, kind),
        positional="none", layer_norm=False, norm="rms_norm", act_fn=_act(getattr(config, act_attr), source),
        eps=float(config.rms_norm_eps), attn_scale=math.sqrt(d_head), d_head=d_head,
        n_ctx=config.max_position_embeddings, d_mlp=config.intermediate_size, rotary=fraction, rotary_base=theta,
    )


def _gated_mlp(mlp: Any, d_mlp: int) -> dict[str, Tensor]:
    """``down(act(gate(x)) * up(x))`` in the row convention: ``W_gate``, ``W_in`` (up) ``[d_model, d_mlp]``."""
    zeros = lambda n: torch.zeros(n, dtype=torch.float64)  # noqa: E731
    bias = lambda linear, n: _f64(linear.bias) if linear.bias is not None else zeros(n)  # noqa: E731
    return {"W_gate": _f64(mlp.gate_proj.weight).T, "b_gate": bias(mlp.gate_proj, d_mlp),
            "W_in": _f64(mlp.up_proj.weight).T, "b_in": bias(mlp.up_proj, d_mlp),
            "W_out": _f64(mlp.down_proj.weight).T, "b_out": bias(mlp.down_proj, mlp.down_proj.weight.shape[0])}


def _read_gemma(model: Any) -> SourceWeights:
    # Gemma scales its embeddings by sqrt(d_model) (in the model's dtype) and its RMSNorm gains are 1 + w
    return _read_llama_like(model, "the Gemma model", norm="gemma", embed_scale=model.config.hidden_size**0.5)


READERS: dict[str, Callable[[Any], SourceWeights]] = {
    "GPT2LMHeadModel": _read_hf_gpt2,
    "GPTNeoXForCausalLM": _read_gpt_neox,
    "GPTJForCausalLM": _read_gptj,
    "LlamaForCausalLM": lambda m: _read_llama_like(m, "the Llama model"),
    "Qwen2ForCausalLM": lambda m: _read_llama_like(m, "the Qwen2 model"),
    "MistralForCausalLM": lambda m: _read_llama_like(m, "the Mistral model"),
    "GemmaForCausalLM": _read_gemma,
}
