"""CircuitModel with the options of today's models — RMSNorm, grouped-query attention, parallel
blocks, rotary (partial, both pairings), gated MLPs — drawn by hypothesis: the path expansion
and a rotary head's QK expansion verify against the model's own hooks; the rotation equals the
algebra's numpy reference; passes that discard an output do not compute it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.conftest import FAST, HEAVY, PROPERTY

from derivations.architecture import Architecture
from numeric_check import CircuitModel, ConfigError, verify_logits, verify_qk
from numeric_check.model.hooks import Constant, block_hook
from numeric_check.model.rotary import rotate
from tensoralg import rotary as reference

pytestmark = pytest.mark.slow
TOKENS = torch.tensor([[3, 1, 4, 1, 5]])


@st.composite
def variant_models(draw):
    groups, per_group = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    d_head = draw(st.sampled_from([4, 6]))
    mlp = draw(st.booleans())
    arch = Architecture(
        2, groups * per_group, n_kv_heads=groups, norm=draw(st.sampled_from(["none", "layer_norm", "rms_norm"])),
        positional=draw(st.sampled_from(["none", "standard", "qk_only"])), biases=draw(st.booleans()), mlp=mlp,
        parallel=mlp and draw(st.booleans()),
        rotary=draw(st.none() | st.sampled_from([f for f in (1 / 3, 0.5, 1.0) if int(d_head * f) % 2 == 0 and int(d_head * f) >= 2])),
        rotary_style=draw(st.sampled_from(["neox", "gptj"])),
    )
    gated = mlp and draw(st.booleans())
    return CircuitModel.random(arch, d_model=8, d_head=d_head, d_vocab=9, n_ctx=6, gated_mlp=gated,
                               act_fn="silu" if gated else "gelu", rotary_base=draw(st.sampled_from([100.0, 10000.0])),
                               seed=draw(st.integers(0, 1000)), dtype=torch.float64, device="cpu")


@HEAVY
@given(variant_models())
def test_paths_and_scores_verify_through_the_models_hooks(model):
    torch.set_num_threads(1)
    logits = verify_logits(model, TOKENS, max_order=1)
    assert logits.passed, logits.summary_lines()
    qk = verify_qk(model, TOKENS, 1, model.arch.heads_per_layer[1] - 1)
    assert qk.passed, qk.summary_lines()


@FAST
@given(variant_models())
def test_configs_round_trip_through_json(model):
    """What a checkpoint stores: every new option comes back."""
    from numeric_check import ModelConfig

    assert ModelConfig.from_dict(model.cfg.to_dict()) == model.cfg


@PROPERTY
@given(st.sampled_from([4, 6, 8]), st.sampled_from(["neox", "gptj"]), st.integers(0, 1000), st.data())
def test_the_models_rotation_is_the_algebras(d_head, style, seed, data):
    rot = data.draw(st.sampled_from([r for r in range(2, d_head + 1, 2)]))
    x = torch.randn(2, 5, 3, d_head, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ours = rotate(x, rot, style, 500.0, pos_dim=1)
    numpy = reference.rotate(x.numpy().transpose(0, 2, 1, 3), np.arange(5), rot, style, 500.0).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(ours.numpy(), numpy, rtol=0, atol=1e-12)


def test_shared_key_value_heads_are_stored_once():
    model = CircuitModel.random(Architecture(1, 8, n_kv_heads=2), d_model=8, d_head=4, d_vocab=9, n_ctx=6, device="cpu")
    attn = model.blocks[0].attn
    assert attn.W_K.shape == (2, 4, 8) and attn.W_Q.shape == (8, 4, 8)
    assert attn.kv_index.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert torch.equal(attn.per_head(attn.W_V)[5], attn.W_V[1]) and attn.per_head(attn.W_O) is attn.W_O
    _, cache = model.run_with_cache(TOKENS)
    assert cache[block_hook(0, "attn.hook_k")].shape == (1, 5, 8, 4)


def test_a_discarded_output_is_not_computed():
    """Path isolation replaces attention and MLP outputs by constants: the modules then skip them."""
    model = CircuitModel.random(Architecture(1, 2, mlp=True), d_model=8, d_head=4, d_vocab=9, n_ctx=6, device="cpu")
    fired = []
    zeros = torch.zeros(1, 5, 8)
    hooks = [(block_hook(0, "hook_attn_out"), Constant(zeros)), (block_hook(0, "hook_mlp_out"), Constant(zeros)),
             (block_hook(0, "attn.hook_v"), lambda x, hook: fired.append("v")),
             (block_hook(0, "mlp.hook_pre"), lambda x, hook: fired.append("mlp"))]
    model.run_with_hooks(TOKENS, hooks)
    assert fired == []
    model.run_with_hooks(TOKENS, hooks + [(block_hook(0, "attn.hook_z"), lambda x, hook: None)])
    assert fired == ["v"]  # z is read: the values are computed, the output projection and the MLP are not


def test_head_outputs_of_a_layer_at_once_equal_each_heads():
    model = CircuitModel.random(Architecture(1, 3), d_model=8, d_head=4, d_vocab=9, n_ctx=6, dtype=torch.float64, device="cpu")
    attn = model.blocks[0].attn
    z = torch.randn(2, 5, 3, 4, dtype=torch.float64)
    for heads in ([0, 1, 2], [2, 0]):
        together = attn.head_outputs(z[:, :, heads], heads)
        for i, h in enumerate(heads):
            torch.testing.assert_close(together[i], attn.head_output(z[:, :, heads[i]], h), rtol=0, atol=1e-14)


@pytest.mark.parametrize("options, message", [
    ({"arch": Architecture(1, 2, rotary=0.25)}, r"bad rotary for d_head=4: rotary on 0.25 of d_head=4 rotates 1 dimensions"),
    ({"gated_mlp": True}, "gated_mlp=True but the architecture has no MLPs"),
    ({"rotary_base": 1.0}, "rotary_base must be a finite number > 1, got 1.0"),
])
def test_bad_options_say_what_was_wrong(options, message):
    kwargs = {"arch": Architecture(1, 2), **options}
    arch = kwargs.pop("arch")
    with pytest.raises(ConfigError, match=message):
        CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=9, n_ctx=6, **kwargs)
