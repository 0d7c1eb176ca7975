"""Rotary position embeddings on tensors: what :class:`~numeric_check.model.circuit_model.Attention`
applies to its queries and keys, and what the QK evaluator applies to a rotary term's two sides.

The same rotation as :func:`tensoralg.rotary.rotate` (numpy, the algebra's reference), in
torch: plane ``f`` of the first ``rot_dims`` dimensions of each head, the pair ``(f, f + rot_dims/2)``
(``"neox"``, Hugging Face's ``rotate_half``) or ``(2f, 2f + 1)`` (``"gptj"``), turns by
``p · θ_f`` at position ``p`` (``θ_f = base^(-2f/rot_dims)``); the other dimensions pass through.
Angles are computed in float64 whatever the dtype, then cast.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotary_angles(n_pos: int, rot_dims: int, base: float, device=None, inv_freq=None) -> Tensor:
    """``p · θ_f`` as ``[pos, rot_dims/2]``, float64; ``inv_freq``: the ``θ_f`` themselves (rope scaling), else
    ``base^(-2f/rot_dims)``."""
    if inv_freq is None:
        inv_freq = base ** (-torch.arange(0, rot_dims, 2, dtype=torch.float64, device=device) / rot_dims)
    else:
        inv_freq = torch.as_tensor(inv_freq, dtype=torch.float64, device=device)
    return torch.arange(n_pos, dtype=torch.float64, device=device)[:, None] * inv_freq


def _pairs(rot_dims: int, style: str, device=None) -> tuple[Tensor, Tensor]:
    half = rot_dims // 2
    f = torch.arange(half, device=device)
    return (f, f + half) if style == "neox" else (2 * f, 2 * f + 1)


def rotate(x: Tensor, rot_dims: int, style: str, base: float, inv_freq=None, factor: float = 1.0, *,
           pos_dim: int = -2) -> Tensor:
    """``x`` rotated position by position: positions along ``pos_dim``, features along the
    last axis (``[batch, pos, heads, d_head]`` with ``pos_dim=1``, ``[batch, pos, d_head]`` with -2).

    Rope scaling (linear, llama3, YaRN, dynamic NTK) gives its own inverse frequencies
    ``inv_freq`` (``[rot_dims/2]``) and YaRN an attention ``factor`` that multiplies the rotated
    dimensions (Hugging Face's ``attention_scaling``, on ``cos`` and ``sin``)."""
    n_pos = x.shape[pos_dim]
    angles = rotary_angles(n_pos, rot_dims, base, x.device, inv_freq)
    shape = [1] * x.ndim
    shape[pos_dim] = n_pos
    shape[-1] = rot_dims // 2
    cos = (angles.cos() * factor).to(x.dtype).reshape(shape)
    sin = (angles.sin() * factor).to(x.dtype).reshape(shape)
    a, b = _pairs(rot_dims, style, x.device)
    xa, xb = x[..., a], x[..., b]
    out = x.clone()
    out[..., a] = xa * cos - xb * sin
    out[..., b] = xb * cos + xa * sin
    return out
