"""The decoder options of issue 18 as Hugging Face's modules hold them, read into
:class:`~numeric_check.conversion.build.SourceWeights`' fields: q/k norms (which module, which norm,
over one head or over all heads), norms after a sublayer (which of a block's norms read the
stream and which normalise a sublayer's output), sliding windows per layer, soft-caps and the
frequencies of a scaled rope. Shared by the readers whose families use them."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from numeric_check.conversion.build import f64, unsupported
from numeric_check.conversion.readers.common import norm, rounded_frequencies

#: the q/k norm modules' names in the attention module: (queries, keys)
QK_NAMES = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"))


def qk_modules(attn: Any, source: str) -> tuple[Any, Any] | None:
    """The attention's q/k norm modules (before the rotation), or None; a norm after the rotation is refused."""
    if getattr(attn, "query_layernorm", None) is not None:  # HunYuan: normalises the rotated queries and keys
        raise unsupported("q/k normalisation after the rotary rotation (query_layernorm, key_layernorm)", source)
    for q, k in QK_NAMES:
        if getattr(attn, q, None) is not None:
            return getattr(attn, q), getattr(attn, k)
    return None


def qk_kind(module: Any) -> str:
    """``"rms_norm"`` (every ``*RMSNorm``) or ``"layer_norm"`` (``nn.LayerNorm``, Cohere's, StableLM's per head)."""
    return "rms_norm" if type(module).__name__.endswith("RMSNorm") else "layer_norm"


def qk_weights(module: Any, d_head: int, gemma: bool = False) -> tuple[Tensor, Tensor]:
    """``(gain, bias)`` of a q/k norm: ``[d_head]`` shared, ``[heads, d_head]`` (StableLM's one norm per
    head, Cohere's) or ``[heads * d_head]`` (OLMo 2's over all heads); Gemma's gains are ``1 + w``."""
    if hasattr(module, "norms"):  # StableLM: one nn.LayerNorm per head
        parts = [qk_weights(m, d_head) for m in module.norms]
        return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    read = norm(module, "gemma" if gemma else "rms")
    if read is None:  # a norm without parameters
        return torch.ones(d_head, dtype=torch.float64), torch.zeros(d_head, dtype=torch.float64)
    return read


def qk_scope(gain: Tensor, d_head: int) -> str:
    """``"all"`` when one gain vector spans every head (the norm is over all heads at once), else ``"head"``."""
    return "all" if gain.ndim == 1 and gain.numel() != d_head else "head"


def windows(config: Any, n_layers: int, source: str, per_layer: bool = True,
            layers: Any = None) -> int | tuple[int | None, ...] | None:
    """The sliding window of each layer (``i − j < window`` kept), as the layers say which of them use it (each decoder
    layer's ``attention_type``, fixed at construction: a ``layer_types`` edited afterwards changes nothing), else the
    config (``layer_types``; else every layer unless ``use_sliding_window=False``); None where the window covers the
    context. The window's size is the config's: the masks are made from it at every forward pass.
    ``per_layer=False``: the family masks every layer whenever ``sliding_window`` is set (Mistral, Starcoder2,
    Mixtral, Qwen3-MoE build one mask from it and ignore ``layer_types``)."""
    w = getattr(config, "sliding_window", None)
    if w is None or w >= config.max_position_embeddings:
        return None
    if not per_layer:
        return w
    built = [getattr(layer, "attention_type", None) for layer in layers] if layers is not None else []
    types = built if built and all(isinstance(t, str) for t in built) else getattr(config, "layer_types", None)
    if not types:
        return w if getattr(config, "use_sliding_window", True) else None
    other = sorted(set(types) - {"sliding_attention", "full_attention"})
    if other:
        raise unsupported(f"attention of layer type {', '.join(map(repr, other))} (layer_types)", source)
    per = tuple(w if t == "sliding_attention" else None for t in types[:n_layers])
    return None if all(p is None for p in per) else per


def softcaps(model: Any) -> dict[str, float | None]:
    """Gemma 2's caps: ``c·tanh(s/c)`` on the scaled scores and on the logits (None: no cap), the scores' cap only where
    the source's attention applies it (:func:`dropped_score_cap`)."""
    config = model.config
    return {"attn_softcap": None if dropped_score_cap(model) else getattr(config, "attn_logit_softcapping", None) or None,
            "logit_softcap": getattr(config, "final_logit_softcapping", None) or None}


def dropped_score_cap(model: Any) -> str | None:
    """Where the config names a score cap that the source's attention does not apply, in words (the source computes
    uncapped scores, and they are read so): Gemma 3's attention never passes its cap on, and SDPA has none
    (transformers 4 lets Gemma 2 and VaultGemma run in it; 5 refuses). None when the cap is applied or not set."""
    import transformers

    config = getattr(model, "config", None)
    cap = getattr(config, "attn_logit_softcapping", None)
    if not cap:
        return None
    where = ("Gemma 3's attention" if type(model).__name__ == "Gemma3ForCausalLM"
             else "SDPA" if getattr(config, "_attn_implementation", None) == "sdpa" else None)
    return None if where is None else (f"the config's score cap attn_logit_softcapping={cap:g} is not applied by {where} "
                                       f"under transformers {transformers.__version__}: converted without it")


def rope_fields(rotary_emb: Any) -> dict[str, Any]:
    """A scaled rope's SourceWeights fields: the rotary embedding's own inverse frequencies and its
    attention factor (``cos`` and ``sin`` are multiplied by it); empty for rope_theta's own. Dynamic NTK: the
    frequencies it starts from and returns to (``original_inv_freq``), which it keeps for every length up to
    ``max_position_embeddings`` (a longer input, which n_ctx refuses, would grow them). rope_theta's own
    frequencies held in half precision: the rounded values the source computes with (:func:`rounded_frequencies`)."""
    rope_type = getattr(rotary_emb, "rope_type", "default")
    if rope_type == "default":
        return rounded_frequencies(rotary_emb)
    inv = rotary_emb.original_inv_freq if rope_type == "dynamic" else rotary_emb.inv_freq
    return {"rotary_inv_freq": f64(inv), "rotary_factor": float(rotary_emb.attention_scaling)}
