"""What the Hugging Face readers share: the :class:`Family` record, shape checks, head splits,
norms, activations, the unembedding and rotary embeddings read as the model computes them.

A reader reads a model's modules (never its forward code) into
:class:`~numeric_check.model.build.SourceWeights`; whatever it does not read must be at its
default (:mod:`numeric_check.model.options`), and :func:`numeric_check.from_hf` checks the result
against the source (:mod:`numeric_check.model.source_check`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from numeric_check.errors import WeightError
from numeric_check.model.build import ACT_FN_ALIASES, SourceWeights, f64, unsupported

ROPE_TYPES = ("default",)

#: config keys every reader reads or that never change what a causal LM computes in eval mode
#: (see :data:`numeric_check.model.options.HARMLESS` for the rest)
SIZES = frozenset({"vocab_size", "max_position_embeddings"})


@dataclass(frozen=True)
class Family:
    """A Hugging Face family tcircuits reads: its name, the model classes it covers, its reader and
    the config options the reader understands (an allow-list: any other option set off its
    default is refused by name)."""

    name: str
    classes: tuple[str, ...]
    read: Callable[[Any], SourceWeights]
    options: frozenset[str]


def rotary(model: Any, rotary_emb: Any, d_head: int, source: str) -> tuple[float, float]:
    """``(fraction of each head rotated, base)`` as the model's rotary embedding computes them:
    its inverse frequencies say how many dimensions turn (Llama ignores a config's
    ``partial_rotary_factor``; GPT-NeoX honours it), and must be ``base^(-2f/d_rot)`` exactly
    as rope_theta gives them — any rope scaling is refused by name."""
    config = model.config
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise unsupported(f"rope scaling {rope_type!r} (rope_parameters)", source)
    if float(getattr(rotary_emb, "attention_scaling", 1.0)) != 1.0:
        raise unsupported("rotary embeddings scaled by attention_scaling", source)
    base = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    inv = rotary_emb.inv_freq.detach().to(torch.float64).cpu()
    rot_dims = 2 * inv.shape[0]
    expected = base ** (-torch.arange(0, rot_dims, 2, dtype=torch.float64) / rot_dims)
    if not torch.allclose(inv, expected, rtol=1e-6, atol=0):  # float32 buffers agree to ~1e-7
        raise unsupported("rotary inverse frequencies that are not rope_theta's (a scaled or modified rope)", source)
    if rot_dims < 2 or rot_dims > d_head:
        raise unsupported(f"rotary on {rot_dims} of {d_head} head dimensions", source)
    return rot_dims / d_head, base


def shape(t: Tensor, expected: tuple[int, ...], what: str, source: str) -> Tensor:
    if tuple(t.shape) != expected:
        raise WeightError(f"{source}: {what} has shape {tuple(t.shape)} but the config says {expected}; "
                          "the config's sizes disagree with the weights")
    return t


def split_heads(weight: Tensor, n: int, d_head: int, d_model: int, what: str, source: str) -> Tensor:
    """A ``[n * d_head, d_model]`` projection (``x @ weight.T``) as ``[n, d_model, d_head]``."""
    shape(weight, (n * d_head, d_model), what, source)
    return f64(weight).reshape(n, d_head, d_model).transpose(1, 2)


def bias(linear: Any, n: int, d_head: int, what: str, source: str) -> Tensor:
    if linear.bias is None:
        return torch.zeros(n, d_head, dtype=torch.float64)
    return shape(f64(linear.bias), (n * d_head,), what, source).reshape(n, d_head)


def norm(module: Any, kind: str) -> tuple[Tensor, Tensor] | None:
    """``(w, b)`` of a norm: LayerNorm ``(weight, bias)``, RMSNorm ``(weight, 0)``, Gemma's ``(1 + weight, 0)``."""
    w = f64(module.weight)
    if kind == "gemma":
        w = 1.0 + w
    b = f64(module.bias) if getattr(module, "bias", None) is not None else torch.zeros_like(w)
    return w, b


def act(name: str, source: str) -> str:
    act = ACT_FN_ALIASES.get(name)
    if act is None:
        raise unsupported(f"activation function {name!r} (supported: {', '.join(ACT_FN_ALIASES)})", source)
    return act


def unembed(model: Any, d_model: int, d_vocab: int, source: str) -> tuple[Tensor, Tensor]:
    head = model.lm_head
    W_U = shape(f64(head.weight), (d_vocab, d_model), "lm_head.weight", source).T
    b_U = f64(head.bias) if getattr(head, "bias", None) is not None else torch.zeros(d_vocab, dtype=torch.float64)
    return W_U, b_U


def refuse_windows(config: Any, source: str) -> None:
    """Sliding-window attention changes the mask: refused unless its window covers every position."""
    window = getattr(config, "sliding_window", None)
    used = getattr(config, "use_sliding_window", window is not None)
    layer_types = getattr(config, "layer_types", None) or ()
    if (used and window is not None and window < config.max_position_embeddings) or "sliding_attention" in layer_types:
        raise unsupported(f"sliding-window attention (window {window} < {config.max_position_embeddings} positions)", source)
