"""Hypothesis strategies for models: architectures, configs, random CircuitModels and tokens.

Ranges follow issue 4: 0-3 layers, 1-4 heads, d_head 1-8, vocab 2-30, n_ctx 1-10, every
positional / layer-norm / bias / MLP option. (To be merged into tests/strategies.py.)
"""

import torch
from hypothesis import strategies as st

from derivations.architecture import POSITIONAL_KINDS, Architecture
from numeric_check.model import ACT_FNS, CircuitModel, ModelConfig


@st.composite
def architectures(draw, max_layers=3, max_heads=4, uniform=None):
    """Any :class:`Architecture`; ``uniform=True`` gives the same head count in every layer."""
    n_layers = draw(st.integers(0, max_layers))
    same = draw(st.booleans()) if uniform is None else uniform
    heads = st.integers(1, max_heads)
    n_heads = draw(heads) if same else tuple(draw(st.lists(heads, min_size=n_layers, max_size=n_layers)))
    return Architecture(
        n_layers, n_heads, positional=draw(st.sampled_from(POSITIONAL_KINDS)),
        layer_norm=draw(st.booleans()), biases=draw(st.booleans()), mlp=draw(st.booleans()),
    )


@st.composite
def model_configs(draw, arch=None, **arch_kwargs):
    arch = draw(architectures(**arch_kwargs)) if arch is None else arch
    return ModelConfig(
        arch, d_model=draw(st.integers(1, 16)), d_head=draw(st.integers(1, 8)), d_vocab=draw(st.integers(2, 30)),
        n_ctx=draw(st.integers(1, 10)), d_mlp=draw(st.integers(1, 16)) if arch.mlp else None,
        act_fn=draw(st.sampled_from(sorted(ACT_FNS))),
    )


@st.composite
def circuit_models(draw, dtype=torch.float64, **config_kwargs):
    """A seeded random :class:`CircuitModel` (float64 by default)."""
    cfg = draw(model_configs(**config_kwargs))
    return CircuitModel.random(
        cfg.arch, d_model=cfg.d_model, d_head=cfg.d_head, d_vocab=cfg.d_vocab, n_ctx=cfg.n_ctx, d_mlp=cfg.d_mlp,
        act_fn=cfg.act_fn, seed=draw(st.integers(0, 2**31 - 1)), dtype=dtype,
    )


@st.composite
def token_batches(draw, cfg, max_batch=3):
    """A LongTensor ``[batch, pos]`` of valid ids for ``cfg``."""
    batch, pos = draw(st.integers(1, max_batch)), draw(st.integers(1, cfg.n_ctx))
    ids = draw(st.lists(st.integers(0, cfg.d_vocab - 1), min_size=batch * pos, max_size=batch * pos))
    return torch.tensor(ids, dtype=torch.long).reshape(batch, pos)
