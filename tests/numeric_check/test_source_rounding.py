"""What is called "the source's own rounding" is of that size (issue 54, items 1 and 2).

A half-precision source is compared as a float64 copy of itself; how far the source as held is from that copy is its
own rounding, measured on every probe and every position and bounded by the rounding of the conversion itself run in
the source's dtype on the same tokens. Rotary tables held by a TransformerLens model are checked against its config
to a bound per plane and position, from the rounding of ``p · θ_f`` and of sin/cos in the tables' dtype.

Each tamper below was accepted before (as "its own rounding", measured on the first probe only, or within the single
allowance ``8·eps·(1+p)``); each untampered twin is accepted."""

from __future__ import annotations

import re

import pytest
import torch

from numeric_check import SourceMismatch, UnsupportedModel, from_hf, from_transformer_lens
from numeric_check.conversion.own_rounding import OWN_MARGIN
from tests.helpers import refused
from tests.numeric_check.test_source_check import hooked, llama

pytest.importorskip("transformers")
pytest.importorskip("transformer_lens")
pytestmark = pytest.mark.slow


def only_in_bf16(factor=3.0, start=0):
    """A forward hook that multiplies a module's output by ``factor`` at positions ``>= start``, only in bfloat16."""
    def hook(module, inputs, output):
        if output.dtype != torch.bfloat16:
            return output
        output = output.clone()
        output[:, start:] *= factor
        return output
    return hook


def half_llama(seed=0):
    """A bfloat16 Llama of 128 positions, every parameter perturbed off its defaults."""
    return llama(seed, max_position_embeddings=128).to(torch.bfloat16)


@pytest.mark.parametrize("start", [0, 64])
def test_a_tamper_that_acts_only_in_half_precision_is_refused(start):
    """Issue 54: the MLP output ×3 only in bfloat16 was accepted as "its own rounding" (0.27 of the largest logit);
    from position 64 on it was not even measured (the first probe has 64 positions). The source's own rounding is
    measured on every probe now, and bounded by the conversion's own rounding in bfloat16."""
    hf = half_llama()
    hf.model.layers[1].mlp.register_forward_hook(only_in_bf16(3.0, start))
    with pytest.raises(SourceMismatch) as info:
        from_hf(hf, device="cpu")
    line = str(info.value)
    assert "\n" not in line and len(f"tcircuits verify: error: {line}") <= 200, line
    shape = "2 x 64" if start == 0 else "1 x 128"
    assert re.fullmatch(rf"from_hf: held in bfloat16, LlamaForCausalLM is \S+ of the largest logit off its float64 "
                        rf"copy on {shape} tokens, \S+ times this model's bfloat16 rounding \(bound {OWN_MARGIN}\); "
                        r"refused", line), line
    assert "a forward hook on model.layers.1.mlp (only_in_bf16.<locals>.hook" in info.value.detail


def test_its_untampered_twin_is_accepted_with_its_own_rounding_bounded():
    check = from_hf(half_llama(), device="cpu").source_check
    assert check.rel_diff <= check.tolerance < 1e-4
    assert 1e-4 < check.source_rounding and check.own_ratio <= OWN_MARGIN
    assert (f"the source as held in bfloat16 differs from its float64 copy by {check.source_rounding:.2g} on every "
            f"probe and position (its own rounding: at most {check.own_ratio:.2g} times the rounding of the conversion "
            f"itself run in bfloat16 on the same tokens, bound {OWN_MARGIN})") in check.describe()
    # the same hook, a no-op, is named and accepted
    hf = half_llama()
    hf.model.layers[1].mlp.register_forward_hook(only_in_bf16(1.0))
    assert from_hf(hf, device="cpu").source_check.own_ratio <= OWN_MARGIN


def test_a_tamper_in_half_precision_only_without_the_probes_flags_is_refused():
    """The source as held is called as a person calls it too (``model(input_ids)``, no ``output_hidden_states``)."""
    def hook(module, args, kwargs, out):
        if not kwargs.get("output_hidden_states") and out.logits.dtype == torch.bfloat16:
            out.logits = out.logits * 1.5
        return out

    hf = half_llama()
    hf.register_forward_hook(hook, with_kwargs=True)
    with refused(SourceMismatch, r"^from_hf: held in bfloat16, LlamaForCausalLM is \S+ of the largest logit"):
        from_hf(hf, device="cpu")


@pytest.mark.parametrize("tampered", [False, True])
def test_a_transformer_lens_tamper_only_in_half_precision_is_refused(tampered):
    model = hooked(positional_embedding_type="rotary", rotary_dim=4, normalization_type="RMS", n_ctx=96).to(torch.bfloat16)
    if not tampered:
        check = from_transformer_lens(model, device="cpu").source_check
        assert check.rel_diff <= check.tolerance and check.own_ratio <= OWN_MARGIN
        return
    model.blocks[1].mlp.register_forward_hook(only_in_bf16(3.0, 64))
    with refused(SourceMismatch, r"^from_transformer_lens: held in bfloat16, HookedTransformer is \S+ of the largest "
                                 r"logit off its float64 copy on 1 x 96 tokens"):
        from_transformer_lens(model, device="cpu")


# --- rotary tables: a bound per plane and position ------------------------------------------------------------------


def _replaced_from(model, start, base=20000.0):
    """Every layer's rotary tables from position ``start`` on replaced by those of another base, in the tables' dtype."""
    for block in model.blocks:
        attn = block.attn
        sin, cos = attn.calculate_sin_cos_rotary(model.cfg.rotary_dim, attn.rotary_sin.shape[0], base=base,
                                                 dtype=torch.float64)
        attn.rotary_sin[start:] = sin[start:].to(attn.rotary_sin.dtype)
        attn.rotary_cos[start:] = cos[start:].to(attn.rotary_cos.dtype)
    return model


@pytest.mark.parametrize("tampered", [False, True])
def test_half_precision_transformer_lens_tables_replaced_from_position_64_are_refused(tampered):
    """Issue 54: the allowance 8·eps·(1+p) passed 1 from p ≈ 16 in bfloat16, and the float64 copy's tables were made
    again, so tables replaced from position 64 on were never compared; they are held to their config per plane now."""
    model = hooked(positional_embedding_type="rotary", rotary_dim=4, normalization_type="RMS", n_ctx=96,
                   rotary_base=10000).to(torch.bfloat16)
    if not tampered:
        check = from_transformer_lens(model, device="cpu").source_check
        assert check.rel_diff <= check.tolerance and check.own_ratio <= OWN_MARGIN
        return
    with refused(UnsupportedModel, r"rotary tables that are not its config's \(blocks.0.attn.rotary_sin/rotary_cos "
                                   r"differ from the tables rotary_base, rotary_dim and its scaling give, by \S+ times "
                                   r"their rounding at position \d+, plane \d\)"):
        from_transformer_lens(_replaced_from(model, 64), device="cpu")


@pytest.mark.parametrize("nudge", [0.0, 6.0])
def test_float32_transformer_lens_tables_nudged_by_six_ulps_per_position_are_refused(nudge):
    """Issue 54: tables nudged by 6·eps·(1+p) at 2,048 positions were accepted (8.7e-4 off on fresh tokens): low
    frequency planes round far less than 8·eps·p. The untampered twin is accepted."""
    model = hooked(positional_embedding_type="rotary", rotary_dim=4, normalization_type="RMS", n_ctx=2048,
                   dtype=torch.float32, n_layers=1)
    eps = torch.finfo(torch.float32).eps
    with torch.no_grad():
        for block in model.blocks:
            step = nudge * eps * (1 + torch.arange(block.attn.rotary_sin.shape[0], dtype=torch.float32))[:, None]
            block.attn.rotary_sin += step
            block.attn.rotary_cos -= step
    if not nudge:
        check = from_transformer_lens(model, device="cpu").source_check
        assert check.rel_diff <= check.tolerance
        return
    with refused(UnsupportedModel, r"rotary tables that are not its config's"):
        from_transformer_lens(model, device="cpu")


@pytest.mark.parametrize("tampered", [False, True])
def test_a_half_precision_gptj_whose_sin_cos_table_is_replaced_from_position_64_is_refused(tampered):
    """GPT-J keeps one sin/cos table per position (``embed_positions``), which the float64 copy makes again: a table
    replaced from position 64 on in bfloat16 showed only in the source as held, 0.026 of the largest logit there (3
    times bfloat16's rounding, within the bound); the table as held is held to the one its code makes, per plane."""
    from tests.hf_zoo import build

    hf = build("gptj", 0, dtype=torch.bfloat16, n_positions=96, rotary_dim=4)
    if tampered:  # transformers 4 keeps a table in each attention, transformers 5 one in transformer.rotary_emb
        for module in hf.modules():
            table = getattr(module, "embed_positions", None)
            if isinstance(table, torch.Tensor):
                module.embed_positions = torch.cat([table[:64], table[64:].flip(0)])
        with refused(UnsupportedModel, r"^from_hf: its sin/cos table \S+embed_positions is not the one its code makes: "
                                       r"\S+ times its rounding in bfloat16 at position (6[4-9]|[7-9]\d), plane \d$"):
            from_hf(hf, device="cpu")
        return
    check = from_hf(hf, device="cpu").source_check
    assert check.rel_diff <= check.tolerance and check.own_ratio <= OWN_MARGIN
