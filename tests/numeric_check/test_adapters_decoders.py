"""TransformerLens options of today's decoders (issue 18) read as the architecture's: use_qk_norm,
use_normalization_before_and_after, local attention, soft-caps, ALiBi — each converted equal to the
source (every parameter perturbed off its default) and verified at order 2 and on a layer-1 head."""

from __future__ import annotations

import pytest
import torch

import numeric_check as nc

pytest.importorskip("transformer_lens")
pytestmark = pytest.mark.slow
TOKENS = torch.tensor([[3, 1, 4, 1, 5, 2, 6, 7]])

CASES = {
    "qk_norm": dict(use_qk_norm=True, normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=4),
    "sandwich": dict(use_normalization_before_and_after=True, normalization_type="RMS"),
    "local": dict(use_local_attn=True, window_size=3, attn_types=["global", "local"], normalization_type="RMS"),
    "soft_caps": dict(attn_scores_soft_cap=2.0, output_logits_soft_cap=3.0, normalization_type="RMS"),
    "alibi": dict(positional_embedding_type="alibi", normalization_type="LN", n_heads=3),
    # TransformerLens' experts are Linears of the default dtype: its mixture of experts runs in float32 only
    "experts": dict(dtype=torch.float32, num_experts=4, experts_per_token=2, gated_mlp=True, act_fn="silu", normalization_type="RMS",
                    positional_embedding_type="rotary", rotary_dim=4),
    "experts_renormalised": dict(dtype=torch.float32, num_experts=3, experts_per_token=2, norm_topk_prob=True, gated_mlp=True, act_fn="silu",
                                 normalization_type="RMS"),
    "rope_llama3": dict(positional_embedding_type="rotary", rotary_dim=4, normalization_type="RMS", use_NTK_by_parts_rope=True,
                        NTK_by_parts_factor=8.0, NTK_original_ctx_len=4),
    "rope_yarn": dict(positional_embedding_type="rotary", rotary_dim=4, normalization_type="RMS", use_yarn_rope=True,
                      yarn_factor=4.0, yarn_attention_factor=1.3, yarn_original_max_position_embeddings=4),
    "rope_scaling_factor": dict(positional_embedding_type="rotary", rotary_dim=4, normalization_type="RMS",
                                rotary_scaling_factor=2.0),
    "gemma2_like": dict(use_normalization_before_and_after=True, normalization_type="RMS", attn_scores_soft_cap=5.0,
                        output_logits_soft_cap=3.0, use_local_attn=True, window_size=3, attn_types=["local", "global"],
                        positional_embedding_type="rotary", rotary_dim=4, gated_mlp=True, act_fn="gelu_pytorch_tanh"),
}
DESCRIBED = {"qk_norm": "q/k RMSNorm per head", "sandwich": "norms before and after each sublayer",
             "local": "windows global/3", "soft_caps": "logits soft-capped at 3", "alibi": "ALiBi",
             "gemma2_like": "attention scores soft-capped at 5", "experts": "MLPs of 4 experts (top 2 per position)",
             "experts_renormalised": "MLPs of 3 experts", "rope_llama3": "rotary", "rope_yarn": "rotary",
             "rope_scaling_factor": "rotary"}


def _skip_without(config_class, options: dict) -> None:
    """Skip where the installed TransformerLens lacks an option (2.x has none of 3's rope scalings, norm_topk_prob)."""
    import dataclasses

    missing = sorted(set(options) - {f.name for f in dataclasses.fields(config_class)})
    if missing:
        pytest.skip(f"this TransformerLens has no {', '.join(missing)}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_transformer_lens_decoder_options_convert_and_verify(name):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.set_num_threads(1)
    _skip_without(HookedTransformerConfig, CASES[name])
    options = dict(n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=4, d_vocab=20, d_mlp=32, act_fn="gelu",
                   dtype=torch.float64, seed=0, device="cpu")
    tl = HookedTransformer(HookedTransformerConfig(**{**options, **CASES[name]}))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in tl.parameters():  # every parameter off its default (gains of 1 hide folding bugs)
            param.add_(0.2 * torch.randn(param.shape, generator=generator, dtype=torch.float64).to(param.dtype))
    model = nc.from_transformer_lens(tl)
    assert DESCRIBED[name] in model.arch.describe()
    assert nc.verify_logits(model, TOKENS, max_order=2).passed
    assert nc.verify_qk(model, TOKENS, 1, model.arch.heads_per_layer[1] - 1).passed


def test_transformer_lens_rope_scaling_is_read_from_its_rotary_embedding():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    _skip_without(HookedTransformerConfig, {"use_yarn_rope": True})
    options = dict(n_layers=1, d_model=16, n_ctx=8, d_head=4, n_heads=4, d_vocab=20, attn_only=True, dtype=torch.float64,
                   positional_embedding_type="rotary", rotary_dim=4, normalization_type="RMS", device="cpu")
    plain = nc.from_transformer_lens(HookedTransformer(HookedTransformerConfig(**options)))
    assert plain.cfg.rotary_inv_freq is None and plain.cfg.rotary_factor == 1.0
    yarn = nc.from_transformer_lens(HookedTransformer(HookedTransformerConfig(
        **options, use_yarn_rope=True, yarn_factor=4.0, yarn_attention_factor=1.3, yarn_original_max_position_embeddings=4)))
    assert yarn.cfg.rotary_factor == pytest.approx(1.3) and yarn.cfg.rotary_inv_freq[1] < 0.01  # base 10000: θ = (1, 0.01), the slow plane interpolated
