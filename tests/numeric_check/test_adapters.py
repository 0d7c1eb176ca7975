"""Adapters: our logits and activations equal TransformerLens' and Hugging Face GPT-2's own forward passes."""

import math

import pytest
import torch

from numeric_check.conversion.adapters import from_transformer_lens
from numeric_check.conversion.hf import from_hf_gpt2
from numeric_check.errors import UnsupportedModel
from numeric_check.verification.verify import verify_logits, verify_qk

tl = pytest.importorskip("transformer_lens")
transformers = pytest.importorskip("transformers")

torch.set_num_threads(1)
pytestmark = [
    pytest.mark.slow,  # loads TransformerLens and transformers: left out by pytest -m "not slow"
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning"),
]

D_VOCAB, N_CTX = 11, 6


def randomise(model, seed=0, equal_ln1_gains=False):
    """Non-trivial biases and layer-norm weights (default inits are zeros and ones)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float64).to(param.dtype)
            is_gain = name.endswith((".w", "ln_1.weight", "ln_2.weight", "ln_f.weight"))
            if is_gain:
                param.copy_(1 + 0.3 * noise)
            elif name.endswith((".bias", "b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", "b_U", ".b")):
                param.copy_(0.2 * noise)
        if equal_ln1_gains and hasattr(model.blocks[0].ln1, "w"):
            for block in model.blocks[1:]:
                block.ln1.w.copy_(model.blocks[0].ln1.w)
    return model


def tl_model(seed=0, equal_ln1_gains=True, **overrides):
    kw = dict(n_layers=2, d_model=12, n_ctx=N_CTX, d_head=5, n_heads=3, d_vocab=D_VOCAB, act_fn="gelu_new",
              attn_only=False, d_mlp=20, normalization_type="LN", positional_embedding_type="standard",
              dtype=torch.float64, seed=None, device="cpu")
    kw.update(overrides)
    if kw["attn_only"]:
        kw["d_mlp"] = None
    return randomise(tl.HookedTransformer(tl.HookedTransformerConfig(**kw)), seed, equal_ln1_gains)


def gpt2_model(seed=0, dtype=torch.float64, **overrides):
    kw = dict(n_layer=2, n_embd=12, n_head=3, n_positions=N_CTX, vocab_size=D_VOCAB, bos_token_id=0,
              eos_token_id=0, attn_implementation="eager")
    kw.update(overrides)
    torch.manual_seed(seed)  # HF initialises from the global RNG
    return randomise(transformers.GPT2LMHeadModel(transformers.GPT2Config(**kw)).to(dtype).eval(), seed)


def tokens(batch=3, seed=1):
    return torch.randint(0, D_VOCAB, (batch, N_CTX), generator=torch.Generator().manual_seed(seed))


def rel_error(ours, theirs):
    return float((ours - theirs).abs().max() / theirs.abs().max())


@pytest.mark.parametrize("positional", ["standard", "shortformer"])
@pytest.mark.parametrize("norm", ["LN", "LNPre", None])
@pytest.mark.parametrize("attn_only", [True, False])
def test_transformer_lens_logits_and_activations_match(positional, norm, attn_only):
    source = tl_model(positional_embedding_type=positional, normalization_type=norm, attn_only=attn_only)
    model = from_transformer_lens(source, device="cpu")
    toks = tokens()
    theirs, their_cache = source.run_with_cache(toks)
    ours, our_cache = model.run_with_cache(toks)
    assert rel_error(ours, theirs) < 1e-9
    assert model.arch.positional == {"standard": "standard", "shortformer": "qk_only"}[positional]
    assert model.arch.layer_norm == (norm is not None) and model.arch.mlp == (not attn_only)
    assert model.arch.biases
    for layer in range(2):
        for name in (f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.attn.hook_attn_scores",
                     f"blocks.{layer}.attn.hook_z"):
            torch.testing.assert_close(our_cache[name], their_cache[name], rtol=1e-9, atol=1e-11)
        attn_out = their_cache[f"blocks.{layer}.hook_attn_out"]
        if norm is not None:  # we centred the writing weights
            attn_out = attn_out - attn_out.mean(-1, keepdim=True)
        torch.testing.assert_close(our_cache[f"blocks.{layer}.hook_attn_out"], attn_out, rtol=1e-9, atol=1e-11)
        if norm is not None:
            for ln in ("ln1", "ln2") if not attn_only else ("ln1",):
                name = f"blocks.{layer}.{ln}.hook_scale"
                torch.testing.assert_close(our_cache[name], their_cache[name], rtol=1e-9, atol=0)
    if norm is not None:
        torch.testing.assert_close(our_cache["ln_final.hook_scale"], their_cache["ln_final.hook_scale"], rtol=1e-9, atol=0)
        assert our_cache["blocks.1.hook_resid_pre"].mean(-1).abs().max() < 1e-12


@pytest.mark.parametrize("act_fn", ["gelu", "gelu_new", "relu", "gelu_pytorch_tanh"])
def test_transformer_lens_activations_and_attention_scale(act_fn):
    source = tl_model(act_fn=act_fn, attn_scale=1.7)
    model = from_transformer_lens(source, device="cpu")
    assert model.cfg.attn_scale == 1.7
    assert rel_error(model(tokens()), source(tokens())) < 1e-9
    unscaled = tl_model(use_attn_scale=False, normalization_type="LNPre", attn_only=True)
    assert from_transformer_lens(unscaled, device="cpu").cfg.attn_scale == 1.0
    assert rel_error(from_transformer_lens(unscaled, device="cpu")(tokens()), unscaled(tokens())) < 1e-9


def test_transformer_lens_float32_and_default_precision():
    source = tl_model(dtype=torch.float32)
    model = from_transformer_lens(source, dtype=torch.float32, device="cpu")
    assert model.dtype == torch.float32 and from_transformer_lens(source, device="cpu").dtype == torch.float64
    assert rel_error(model(tokens()), source(tokens())) < 1e-5


def test_transformer_lens_source_is_not_modified_and_no_aliasing():
    source = tl_model()
    before = {k: v.clone() for k, v in source.state_dict().items()}
    model = from_transformer_lens(source, device="cpu")
    for key, value in source.state_dict().items():
        assert torch.equal(value, before[key]), key
    with torch.no_grad():
        model.W_E.add_(1)
    assert torch.equal(source.embed.W_E, before["embed.W_E"])


def test_weight_shapes_follow_the_paper():
    source = tl_model(normalization_type=None)
    model = from_transformer_lens(source, device="cpu")
    attn = model.blocks[0].attn
    assert attn.W_Q.shape == (3, 5, 12) and attn.W_O.shape == (3, 12, 5)
    assert model.W_E.shape == (12, D_VOCAB) and model.W_pos.shape == (12, N_CTX) and model.W_U.shape == (D_VOCAB, 12)
    assert torch.equal(attn.W_Q, source.blocks[0].attn.W_Q.transpose(1, 2))
    assert torch.equal(model.W_E, source.W_E.T)
    assert torch.equal(model.blocks[1].mlp.W_in, source.blocks[1].mlp.W_in.T)


def test_biases_kept_only_when_nonzero_or_asked():
    plain = tl.HookedTransformer(tl.HookedTransformerConfig(
        n_layers=1, d_model=8, n_ctx=4, d_head=4, n_heads=2, d_vocab=10, attn_only=True, normalization_type=None,
        dtype=torch.float64, device="cpu"))
    assert not from_transformer_lens(plain, device="cpu").arch.biases
    forced = from_transformer_lens(plain, biases=True, device="cpu")
    assert forced.arch.biases and not forced.blocks[0].attn.b_Q.any()
    with pytest.raises(UnsupportedModel, match=r"biases=False but the model has non-zero \(folded\) biases: b_U"):
        from_transformer_lens(tl_model(), biases=False, device="cpu")


def test_shortformer_layer_norm_gains():
    one_layer = tl_model(n_layers=1, positional_embedding_type="shortformer", equal_ln1_gains=False)
    assert rel_error(from_transformer_lens(one_layer, device="cpu")(tokens()), one_layer(tokens())) < 1e-9
    unequal = tl_model(positional_embedding_type="shortformer", equal_ln1_gains=False)
    with pytest.raises(UnsupportedModel, match=r"shortformer positions with ln1 gains that differ between layers"):
        from_transformer_lens(unequal, device="cpu")


def _with(model, **attrs):
    for key, value in attrs.items():
        setattr(model.cfg, key, value)
    return model


@pytest.mark.parametrize(
    "build, feature",
    [
        (lambda: tl_model(act_fn="solu_ln"), "activation function 'solu_ln'"),
        (lambda: _with(tl_model(), use_local_attn=True), r"local attention without attn_types"),
        (lambda: _with(tl_model(), positional_embedding_type="relative_positional_bias"), "relative positional bias"),
        (lambda: _with(tl_model(), final_rms=True), r"RMSNorm \(final_rms\) after layer-norm blocks"),
        (lambda: _with(tl_model(), use_dynamic_ntk_rope=True), r"dynamic NTK rope scaling"),
        (lambda: _with(tl_model(), scale_attn_by_inverse_layer_idx=True), "attention scale that depends on the layer"),
        (lambda: _with(tl_model(), attention_dir="bidirectional"), "bidirectional"),
    ],
)
def test_transformer_lens_unsupported_features_are_named(build, feature):
    with pytest.raises(UnsupportedModel, match=feature):
        from_transformer_lens(build(), device="cpu")


@pytest.mark.parametrize("options", [
    dict(n_key_value_heads=1, gated_mlp=True, act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
         rotary_dim=4),
    dict(normalization_type="LN", positional_embedding_type="rotary", rotary_dim=2, rotary_adjacent_pairs=True,
         parallel_attn_mlp=True, rotary_base=500),
    dict(normalization_type="RMSPre", gated_mlp=True, act_fn="gelu"),
])
def test_transformer_lens_models_of_today_convert_and_verify(options):
    """Grouped-query attention, RMSNorm, gated MLPs (TransformerLens adds b_in after the gate's product:
    it moves into b_out), parallel blocks, rotary in both pairings."""
    source = tl_model(**{"n_heads": 2, "d_head": 6, **options})
    model = from_transformer_lens(source, device="cpu")
    with torch.no_grad():
        assert rel_error(model(tokens()), source(tokens())) < 1e-12
    assert verify_logits(model, tokens(1), max_order=1).passed
    assert verify_qk(model, tokens(1), 1, 1).passed


def test_to_transformer_lens_refuses_what_it_does_not_write():
    from derivations.architecture import Architecture
    from numeric_check.model.circuit_model import CircuitModel

    model = CircuitModel.random(Architecture(1, 2, norm="rms_norm", rotary=1.0), d_model=8, d_head=4, d_vocab=10, n_ctx=4, device="cpu")
    with pytest.raises(UnsupportedModel, match="^to_transformer_lens writes models without RMSNorm, rotary; this model has them$"):
        to_transformer_lens(model)


def test_unsupported_wording_is_pinned():
    with pytest.raises(UnsupportedModel) as info:
        from_transformer_lens(_with(tl_model(), positional_embedding_type="relative_positional_bias"), device="cpu")
    assert str(info.value) == "the TransformerLens model uses relative positional bias, which CircuitModel cannot express"
    with pytest.raises(UnsupportedModel, match=r"^from_transformer_lens expects a transformer_lens.HookedTransformer "
                                               r"\(TransformerLens 2 and 3\) or TransformerBridge \(TransformerLens 4\), "
                                               r"got GPT2LMHeadModel$"):
        from_transformer_lens(gpt2_model(), device="cpu")


# --- Hugging Face GPT-2 --------------------------------------------------------------------------
def test_gpt2_logits_match_float64():
    source = gpt2_model()
    model = from_hf_gpt2(source, device="cpu")
    assert model.arch.describe() == "2 layers x 3 heads, standard positions, layer norm, biases, MLPs"
    assert model.cfg.act_fn == "gelu_new" and model.cfg.d_head == 4 and model.cfg.d_mlp == 48
    with torch.no_grad():
        assert rel_error(model(tokens()), source(tokens()).logits) < 1e-9


def test_gpt2_float32_sdpa_and_options():
    source = gpt2_model(dtype=torch.float32, attn_implementation="sdpa", activation_function="relu", n_inner=20)
    model = from_hf_gpt2(source, dtype=torch.float32, device="cpu")
    assert model.cfg.act_fn == "relu" and model.cfg.d_mlp == 20
    with torch.no_grad():
        assert rel_error(model(tokens()), source(tokens()).logits) < 1e-5
    unscaled = gpt2_model(scale_attn_weights=False, activation_function="gelu")
    model = from_hf_gpt2(unscaled, device="cpu")
    assert model.cfg.attn_scale == 1.0
    with torch.no_grad():
        assert rel_error(model(tokens()), unscaled(tokens()).logits) < 1e-9


def test_gpt2_matches_transformer_lens_patterns():
    """The same GPT-2 weights through TL's own converter give the same patterns and ln scales as ours."""
    source = gpt2_model()
    hooked = tl.HookedTransformer(tl.HookedTransformerConfig(
        n_layers=2, d_model=12, n_ctx=N_CTX, d_head=4, n_heads=3, d_vocab=D_VOCAB, d_mlp=48, act_fn="gelu_new",
        normalization_type="LN", dtype=torch.float64, device="cpu"))
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    hooked.load_state_dict(convert_gpt2_weights(source, hooked.cfg), strict=False)
    _, theirs = hooked.run_with_cache(tokens())
    _, ours = from_hf_gpt2(source, device="cpu").run_with_cache(tokens())
    for name in ("blocks.1.attn.hook_pattern", "blocks.0.ln1.hook_scale", "blocks.1.ln2.hook_scale"):
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-9, atol=1e-12)


def test_gpt2_unsupported():
    with pytest.raises(UnsupportedModel, match=r"scale_attn_by_inverse_layer_idx"):
        from_hf_gpt2(gpt2_model(scale_attn_by_inverse_layer_idx=True), device="cpu")
    with pytest.raises(UnsupportedModel, match=r"activation function 'quick_gelu'"):
        from_hf_gpt2(gpt2_model(activation_function="quick_gelu"), device="cpu")
    with pytest.raises(UnsupportedModel, match=r"^from_hf reads Hugging Face models; HookedTransformer is a TransformerLens model: use from_transformer_lens$"):
        from_hf_gpt2(tl_model(), device="cpu")


# --- round trips over random architectures ---------------------------------------------------
from hypothesis import assume, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from numeric_check.conversion.adapters import to_transformer_lens  # noqa: E402
from tests.conftest import FAST  # noqa: E402
from tests.strategies import circuit_models, token_batches  # noqa: E402


@FAST
@given(st.data())
def test_property_round_trip_through_transformer_lens(data):
    model = data.draw(circuit_models(uniform=True))
    toks = data.draw(token_batches(model.cfg))
    try:
        hooked = to_transformer_lens(model)
    except UnsupportedModel as err:  # an activation the installed TransformerLens lacks (2.x: relu2)
        assert "this TransformerLens has no activation" in str(err)
        assume(False)
    ours = model(toks)
    torch.testing.assert_close(hooked(toks), ours, rtol=1e-9, atol=1e-9)
    back = from_transformer_lens(hooked, biases=model.arch.biases, device="cpu")
    summary = lambda a: (a.heads_per_layer, a.layer_norm, a.biases, a.mlp and a.n_layers > 0)
    assert summary(back.arch) == summary(model.arch)
    assert back.arch.positional == model.arch.positional or model.arch.positional == "none"
    torch.testing.assert_close(back(toks), ours, rtol=1e-9, atol=1e-9)
    for name, param in model.named_parameters():
        torch.testing.assert_close(back.get_parameter(name), param, rtol=1e-12, atol=1e-12)


def test_to_transformer_lens_needs_uniform_heads():
    from numeric_check.model.circuit_model import CircuitModel
    from derivations.architecture import Architecture

    model = CircuitModel.random(Architecture(2, (1, 3)), d_model=4, d_head=2, d_vocab=5, n_ctx=3, device="cpu")
    with pytest.raises(UnsupportedModel, match=r"same number of heads in every layer; this model has heads 1/3"):
        to_transformer_lens(model)


def test_from_tl_is_the_name_a_transformer_lens_user_types():
    import numeric_check as nc

    assert nc.from_tl is nc.from_transformer_lens and "from_tl" in nc.__all__
