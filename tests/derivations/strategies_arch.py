"""Hypothesis strategies for architectures (to be merged into ``tests/strategies.py``)."""

from __future__ import annotations

from hypothesis import strategies as st

from derivations.architecture import POSITIONAL_KINDS, Architecture


@st.composite
def architectures(draw, min_layers: int = 0, max_layers: int = 3, max_heads: int = 3, extras: bool = True):
    """Small architectures: uniform (an int) or per-layer head counts, every positional
    kind, and (with ``extras``) layer norm, biases and MLPs switched on or off."""
    n_layers = draw(st.integers(min_layers, max_layers))
    per_layer = draw(st.lists(st.integers(1, max_heads), min_size=n_layers, max_size=n_layers))
    uniform = draw(st.booleans()) and len(set(per_layer)) <= 1
    n_heads = (per_layer[0] if per_layer else draw(st.integers(1, max_heads))) if uniform else tuple(per_layer)
    flags = {name: draw(st.booleans()) if extras else False for name in ("layer_norm", "biases", "mlp")}
    return Architecture(n_layers, n_heads, positional=draw(st.sampled_from(POSITIONAL_KINDS)), **flags)


@st.composite
def architectures_with_head(draw, max_layers: int = 3, max_heads: int = 3, extras: bool = True):
    """``(arch, layer, head)`` for an existing head of a small architecture."""
    arch = draw(architectures(min_layers=1, max_layers=max_layers, max_heads=max_heads, extras=extras))
    layer = draw(st.integers(0, arch.n_layers - 1))
    head = draw(st.integers(0, arch.heads_per_layer[layer] - 1))
    return arch, layer, head


def max_orders(largest: int):
    """``None`` or an order in ``0..largest``."""
    return st.none() | st.integers(0, largest)
