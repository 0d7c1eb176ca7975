"""Hypothesis strategies for transformer architectures, random models and tokens.

For testing code built on tcircuits (and for tcircuits' own tests): draw any
:class:`~derivations.architecture.Architecture`, a seeded random
:class:`~numeric_check.model.circuit_model.CircuitModel`, and token batches that fit it. Needs
``hypothesis`` (``pip install tcircuits[test]``).

The default ranges are those of the project's property tests: 0–3 layers, 1–4 heads per
layer, ``d_head`` 1–8, vocabularies of 2–30 tokens, contexts of 1–10 positions, every
positional kind, with or without layer norm, biases and MLPs.

>>> from hypothesis import given, settings
>>> from numeric_check.verification.verify import verify_logits
>>> @settings(max_examples=3, deadline=None)
... @given(models_and_tokens())
... def test_expansion_adds_up(pair):
...     model, tokens = pair
...     assert verify_logits(model, tokens).passed
>>> test_expansion_adds_up()
"""

from __future__ import annotations

try:
    from hypothesis import strategies as st
except ImportError as error:  # pragma: no cover - exercised only without hypothesis
    raise ImportError("numeric_check.strategies needs hypothesis: pip install 'tcircuits[test]'") from error

import torch

from derivations.architecture import POSITIONAL_KINDS, QK_NORM_SCOPES, QK_NORMS, SUBLAYER_NORMS, Architecture
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.config import ACT_FNS, ModelConfig

__all__ = ["architectures", "model_configs", "circuit_models", "token_batches", "models_and_tokens",
           "decoder_architectures", "decoder_models"]


def _flag(value: bool | None):
    return st.booleans() if value is None else st.just(value)


@st.composite
def architectures(draw, min_layers: int = 0, max_layers: int = 3, max_heads: int = 4, uniform: bool | None = None,
                  positional: str | None = None, layer_norm: bool | None = None, biases: bool | None = None,
                  mlp: bool | None = None) -> Architecture:
    """Any :class:`Architecture`; each option drawn unless fixed (``uniform=True``: equal head counts)."""
    n_layers = draw(st.integers(min_layers, max_layers))
    same = draw(_flag(uniform))
    heads = st.integers(1, max_heads)
    n_heads = draw(heads) if same else tuple(draw(st.lists(heads, min_size=n_layers, max_size=n_layers)))
    return Architecture(
        n_layers, n_heads,
        positional=draw(st.sampled_from(POSITIONAL_KINDS) if positional is None else st.just(positional)),
        layer_norm=draw(_flag(layer_norm)), biases=draw(_flag(biases)), mlp=draw(_flag(mlp)),
    )


@st.composite
def model_configs(draw, arch: Architecture | None = None, max_d_model: int = 16, max_d_head: int = 8,
                  max_vocab: int = 30, max_n_ctx: int = 10, **arch_options) -> ModelConfig:
    """A :class:`ModelConfig` for ``arch`` (or a drawn architecture; ``arch_options`` go to :func:`architectures`)."""
    arch = draw(architectures(**arch_options)) if arch is None else arch
    return ModelConfig(
        arch, d_model=draw(st.integers(1, max_d_model)), d_head=draw(st.integers(1, max_d_head)),
        d_vocab=draw(st.integers(2, max_vocab)), n_ctx=draw(st.integers(1, max_n_ctx)),
        d_mlp=draw(st.integers(1, max_d_model)) if arch.mlp else None,
        act_fn=draw(st.sampled_from(sorted(ACT_FNS))),
    )


@st.composite
def circuit_models(draw, dtype: torch.dtype = torch.float64, device: str = "cpu", **config_options) -> CircuitModel:
    """A :class:`CircuitModel` with seeded random weights on ``device`` (``config_options`` go to :func:`model_configs`)."""
    cfg = draw(model_configs(**config_options))
    return CircuitModel.random(
        cfg.arch, d_model=cfg.d_model, d_head=cfg.d_head, d_vocab=cfg.d_vocab, n_ctx=cfg.n_ctx, d_mlp=cfg.d_mlp,
        act_fn=cfg.act_fn, seed=draw(st.integers(0, 2**31 - 1)), dtype=dtype, device=device,
    )


@st.composite
def token_batches(draw, cfg: ModelConfig, max_batch: int = 3, max_pos: int | None = None) -> torch.Tensor:
    """Valid token ids ``[batch, pos]`` (long) for a model with config ``cfg``."""
    batch = draw(st.integers(1, max_batch))
    pos = draw(st.integers(1, cfg.n_ctx if max_pos is None else min(max_pos, cfg.n_ctx)))
    ids = draw(st.lists(st.integers(0, cfg.d_vocab - 1), min_size=batch * pos, max_size=batch * pos))
    return torch.tensor(ids, dtype=torch.long).reshape(batch, pos)


@st.composite
def models_and_tokens(draw, max_batch: int = 3, dtype: torch.dtype = torch.float64,
                      **config_options) -> tuple[CircuitModel, torch.Tensor]:
    """A random model and a token batch that fits it."""
    model = draw(circuit_models(dtype=dtype, **config_options))
    return model, draw(token_batches(model.cfg, max_batch=max_batch))


@st.composite
def decoder_architectures(draw, n_layers: int = 2) -> Architecture:
    """A 2-layer architecture with the options of today's decoders drawn together: norm, grouped-query
    heads, rotary, biases, MLPs (parallel or not), q/k normalisation (kind and scope), norms after
    the sublayers (RMSNorm: post only, or before and after), sliding windows (per layer), ALiBi,
    attention and final-logit soft-caps, MLPs of experts."""
    groups, per_group = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    mlp = draw(st.booleans())
    qk_norm = draw(st.sampled_from(QK_NORMS))
    norm = draw(st.sampled_from(["layer_norm", "rms_norm"]))
    sublayer = draw(st.sampled_from(SUBLAYER_NORMS)) if norm == "rms_norm" else "pre"
    return Architecture(
        n_layers, groups * per_group, n_kv_heads=groups, norm=norm, sublayer_norm=sublayer,
        positional=draw(st.sampled_from(POSITIONAL_KINDS)), biases=draw(st.booleans()), mlp=mlp,
        parallel=mlp and sublayer != "post" and draw(st.booleans()), rotary=draw(st.sampled_from([None, 0.5, 1.0])),
        rotary_style=draw(st.sampled_from(["neox", "gptj"])), qk_norm=qk_norm,
        qk_norm_scope=draw(st.sampled_from(QK_NORM_SCOPES)) if qk_norm else "head",
        window=draw(st.sampled_from([None, 2, 3]) | st.tuples(*[st.sampled_from([None, 2, 3])] * n_layers)),
        alibi=draw(st.booleans()), attn_softcap=draw(st.sampled_from([None, 0.5, 5.0])),
        logit_softcap=draw(st.sampled_from([None, 1.0])),
        **(dict(experts=4, experts_top_k=draw(st.integers(1, 2))) if mlp and draw(st.booleans()) else {}),
    )


@st.composite
def decoder_models(draw, dtype: torch.dtype = torch.float64) -> CircuitModel:
    """A random model of a :func:`decoder_architectures` architecture (``d_head`` 4, every parameter
    drawn off its default: gains around 1, biases non-zero; rope scaling's own inverse frequencies
    and attention factor half the time with rotary)."""
    arch = draw(decoder_architectures())
    gated = arch.mlp and draw(st.booleans())
    scaled = arch.rotary is not None and draw(st.booleans())  # rope scaling: its own frequencies and factor
    planes = int(4 * (arch.rotary or 0)) // 2
    inv_freq = tuple(draw(st.lists(st.floats(0.01, 2.0), min_size=planes, max_size=planes))) if scaled else None
    return CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, gated_mlp=gated,
                               act_fn="silu" if gated else "gelu", rotary_base=draw(st.sampled_from([100.0, 10000.0])),
                               rotary_inv_freq=inv_freq, rotary_factor=draw(st.floats(0.5, 2.0)) if scaled else 1.0,
                               seed=draw(st.integers(0, 1000)), dtype=dtype, device="cpu")
