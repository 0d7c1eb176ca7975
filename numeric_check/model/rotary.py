"""Rotary position embeddings on tensors: what :class:`~numeric_check.model.circuit_model.Attention`
applies to its queries and keys, and what the QK evaluator applies to a rotary term's two sides.

The same rotation as :func:`tensoralg.rotary.rotate` (numpy, the algebra's reference), in
torch: plane ``f`` of the first ``rot_dims`` dimensions of each head, the pair ``(f, f + rot_dims/2)``
(``"neox"``, Hugging Face's ``rotate_half``) or ``(2f, 2f + 1)`` (``"gptj"``), turns by
``p · θ_f`` at position ``p`` (``θ_f = base^(-2f/rot_dims)``); the other dimensions pass through.
Angles are computed in float64 whatever the dtype, then cast.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

#: Within :func:`tables_rounded_to`: the dtype position tables are made in, as a source makes them; within
#: :func:`tables_given`: a source's own rotary ``(cos, sin)`` tables; None: exact tables, made in float64.
_TABLES_IN: ContextVar[torch.dtype | tuple[Tensor, Tensor] | None] = ContextVar("tables_in", default=None)


@contextmanager
def tables_rounded_to(dtype: torch.dtype):
    """Make position tables (rotary angles and their cosines and sines, ALiBi's bias) in ``dtype`` within the block,
    as Hugging Face makes them (``inv_freq`` and ``p · θ`` in float32, whatever the model's dtype): what the source
    check runs to measure how far a source's own tables take it from exact ones, at every position it compares."""
    token = _TABLES_IN.set(dtype)
    try:
        yield
    finally:
        _TABLES_IN.reset(token)


@contextmanager
def tables_given(cos: Tensor, sin: Tensor):
    """Rotate by a source's own tables within the block: ``cos`` and ``sin`` ``[n_ctx, rot_dims/2]``, one column per
    rotated plane (TransformerLens keeps them as buffers, made by its own code in its own precision)."""
    token = _TABLES_IN.set((cos, sin))
    try:
        yield
    finally:
        _TABLES_IN.reset(token)


def tables_dtype() -> torch.dtype | None:
    """The dtype position tables are being made in (:func:`tables_rounded_to`), or None: float64, exact."""
    found = _TABLES_IN.get()
    return found if isinstance(found, torch.dtype) else None


def rotary_angles(n_pos: int, rot_dims: int, base: float, device=None, inv_freq=None) -> Tensor:
    """``p · θ_f`` as ``[pos, rot_dims/2]``, float64; ``inv_freq``: the ``θ_f`` themselves (rope scaling), else
    ``base^(-2f/rot_dims)``."""
    if inv_freq is None:
        inv_freq = base ** (-torch.arange(0, rot_dims, 2, dtype=torch.float64, device=device) / rot_dims)
    else:
        inv_freq = torch.as_tensor(inv_freq, dtype=torch.float64, device=device)
    return torch.arange(n_pos, dtype=torch.float64, device=device)[:, None] * inv_freq


def source_frequencies(rot_dims: int, base: float, dtype: torch.dtype, device=None, inv_freq=None) -> Tensor:
    """``θ_f`` as a source computes them in ``dtype``: Hugging Face's ``1 / base^(2f/rot_dims)`` step by step in
    float32 (within an ulp of the exact values, and that ulp times a position of thousands is the size of the
    tables' own rounding), or the scaled frequencies ``inv_freq`` rounded to ``dtype``."""
    if inv_freq is not None:
        return torch.as_tensor(inv_freq, dtype=torch.float64, device=device).to(dtype)
    exponents = torch.arange(0, rot_dims, 2, dtype=torch.int64, device=device).to(dtype) / rot_dims
    return 1.0 / (base ** exponents)


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
    rounded, given = tables_dtype(), _TABLES_IN.get()
    if rounded is not None:  # as the source makes them: θ_f and p · θ_f in that dtype, then cos and sin
        angles = torch.arange(n_pos, dtype=rounded, device=x.device)[:, None] * source_frequencies(
            rot_dims, base, rounded, x.device, inv_freq)
    cos, sin = (t[:n_pos].to(x.device, torch.float64) for t in given) if isinstance(given, tuple) else (angles.cos(), angles.sin())
    shape = [1] * x.ndim
    shape[pos_dim] = n_pos
    shape[-1] = rot_dims // 2
    cos = (cos * factor).to(x.dtype).reshape(shape)
    sin = (sin * factor).to(x.dtype).reshape(shape)
    a, b = _pairs(rot_dims, style, x.device)
    xa, xb = x[..., a], x[..., b]
    out = x.clone()
    out[..., a] = xa * cos - xb * sin
    out[..., b] = xb * cos + xa * sin
    return out


#: how many units in the last place, of the angle ``p · θ_f`` and of the sine, a rotary table's entry may be off its exact
#: value before the cast to the table's dtype: TransformerLens and Hugging Face make ``θ_f`` and ``p · θ_f`` in float32
#: (float64 for a float64 table) with two or three roundings, then sin/cos there; measured on TransformerLens' tables
#: (plain, adjacent pairs, NTK-by-parts, YaRN, linear scaling; 4 to 64 rotary dimensions, 4,096 positions, float32,
#: bfloat16 and float16) the most is 1.34, so this is three times that
TABLE_ULPS = 4


def table_allowance(angles: Tensor, exact: Tensor, dtype: torch.dtype, scale: float = 1.0) -> Tensor:
    """How far each entry of a rotary table held in ``dtype`` may be from its exact value ``exact`` (the sine or cosine
    of ``angles``, ``p · θ_f`` per position and plane, times ``scale``) by its own rounding: :data:`TABLE_ULPS` units of
    the precision it is computed in (float32, or float64 for a float64 table) of the angle and of the sine, times
    ``scale``, and the cast to ``dtype`` (``eps`` of ``dtype`` times the value, twice half an ulp).

    >>> allowed = table_allowance(torch.tensor([[0.0], [1000.0]]), torch.tensor([[1.0], [0.56]]), torch.float32)
    >>> [f"{a:.2g}" for a in allowed[:, 0].tolist()]
    ['6e-07', '0.00048']
    """
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    return TABLE_ULPS * torch.finfo(compute).eps * scale * (1 + angles.abs()) + torch.finfo(dtype).eps * exact.abs()


def table_excess(held: Tensor, exact: Tensor, angles: Tensor, dtype: torch.dtype, scale: float = 1.0) -> tuple[float, int, int]:
    """How far a rotary table ``held`` (in ``dtype``, read into float64) is from ``exact`` in units of its own rounding
    (:func:`table_allowance`, ``angles`` per entry): the largest ratio, and the position and column where it is.

    >>> exact = torch.tensor([[0.0, 1.0], [0.84, 0.54]], dtype=torch.float64)
    >>> table_excess(exact + torch.tensor([[0.0, 0.0], [0.0, 0.01]]), exact, torch.tensor([[0.0], [1.0]]).expand(2, 2),
    ...              torch.bfloat16)
    (2.3..., 1, 1)
    """
    off = (held - exact).abs() / table_allowance(angles, exact, dtype, scale)
    position, column = divmod(int(off.argmax()), off.shape[1])
    return float(off.max()), position, column
