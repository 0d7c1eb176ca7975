"""Every Hugging Face family ``from_hf`` reads (issue 18): a tiny model of each, built offline from
its config with every parameter perturbed (``tests/hf_zoo.py``), converts to logits equal to the
source's, its path expansion verifies to order 2 and a layer-1 head's QK expansion verifies;
options that combine are drawn by hypothesis; what the algebra does not express is refused by
its true name."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numeric_check import SourceMismatch, UnsupportedModel, from_hf, verify_logits, verify_qk
from tests.helpers import refused

transformers = pytest.importorskip("transformers")
from tests.hf_zoo import CONVERTS, MAJOR, build, logits, source_dtype  # noqa: E402  (needs transformers)

pytestmark = pytest.mark.slow

TOKENS = torch.tensor([[1, 5, 2, 7, 3, 1, 4, 0]])
SOME = settings(max_examples=5, deadline=None)



#: sources that run part of a float64 pass in float32 beyond exact_float64's reach: Gemma 2's, Gemma 3's and
#: VaultGemma's eager softmax, OLMo 3's and Gemma 3's rotary tables (one per layer type); the source check's tolerance holds
FLOAT32_INSIDE = {"gemma2", "gemma3_text", "vaultgemma", "olmo3"}


def relative(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


def converted(model_type: str, seed: int = 0, **options):
    hf = build(model_type, seed, dtype=source_dtype(model_type), **options)
    model = from_hf(hf, device="cpu")
    with torch.no_grad():
        rel = relative(model(TOKENS), logits(hf, TOKENS))
    assert rel <= model.source_check.tolerance, (model_type, options, rel)
    return model, rel


@pytest.mark.parametrize("model_type, options", CONVERTS)
def test_converts_equal_to_the_source_and_verifies(model_type, options):
    torch.set_num_threads(1)
    model, rel = converted(model_type, 1, **options)
    if source_dtype(model_type) == torch.float64 and model_type not in FLOAT32_INSIDE:
        assert rel < 1e-7  # float64 throughout but GPT-Neo's attention, Cohere's and Ernie's rotary (float32)
    report = verify_logits(model, TOKENS, max_order=2)
    assert report.passed, report
    qk = verify_qk(model, TOKENS, 1, model.arch.heads_per_layer[1] - 1)
    assert qk.passed, qk


@SOME
@given(st.booleans(), st.booleans(), st.sampled_from([(False, 1), (True, 1), (True, 2), (True, 4)]), st.integers(0, 99))
def test_falcon_layouts_combine(multi_query, parallel, new_decoder, seed):
    new, n_kv = new_decoder
    options = {"multi_query": multi_query, "parallel_attn": parallel or new, "bias": parallel}
    if new:
        options.update(new_decoder_architecture=True, num_kv_heads=n_kv)
    model, _ = converted("falcon", seed, **options)
    assert verify_qk(model, TOKENS, 1, 3).passed


@SOME
@given(st.booleans(), st.booleans(), st.sampled_from([0.5, 1.0]), st.integers(0, 99))
def test_stablelm_options_combine(parallel, qkv_bias, rotary, seed):
    converted("stablelm", seed, use_parallel_residual=parallel, use_qkv_bias=qkv_bias,
              rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": rotary})


@SOME
@given(st.sampled_from([8, 12, 16]), st.booleans(), st.booleans(), st.integers(0, 99))
def test_opt_options_combine(proj_dim, bias, affine, seed):
    converted("opt", seed, word_embed_proj_dim=proj_dim, enable_bias=bias, layer_norm_elementwise_affine=affine)


@SOME
@given(st.lists(st.floats(0.125, 8.0), min_size=4, max_size=4), st.integers(0, 99))
def test_granite_multipliers_fold(m, seed):
    options = dict(zip(("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"), m))
    converted("granite", seed, **options)
    converted("hyperclovax", seed, **options)


@SOME
@given(st.sampled_from([2, 3, 8]), st.lists(st.sampled_from(["sliding_attention", "full_attention"]), min_size=2,
                                                   max_size=2),
       st.sampled_from([None, 2.0, 50.0]), st.sampled_from([None, 3.0]), st.integers(0, 99))
def test_gemma2_windows_and_caps_combine(window, layer_types, attn_cap, logit_cap, seed):
    # (no window at all: Hugging Face's Gemma 2 itself cannot run)
    model, _ = converted("gemma2", seed, sliding_window=window, layer_types=layer_types,
                         attn_logit_softcapping=attn_cap, final_logit_softcapping=logit_cap)
    assert verify_qk(model, TOKENS, 1, 3).passed


@SOME
@given(st.sampled_from(["qwen3", "olmo2", "olmo3", "exaone4", "gemma3_text", "glm4"]), st.sampled_from([None, 2, 5]),
       st.sampled_from([{"rope_type": "default", "rope_theta": 100.0},
                        {"rope_type": "linear", "rope_theta": 1e4, "factor": 3.0},
                        {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0, "original_max_position_embeddings": 4}]),
       st.integers(0, 99))
def test_qk_and_post_norms_combine_with_windows_and_scaled_rope(model_type, window, rope, seed):
    options = {"rope_parameters": dict(rope)}  # a copy: configs write into it
    if model_type in ("olmo3", "gemma3_text"):  # one rope per layer type
        options["rope_parameters"] = {t: dict(rope) for t in ("sliding_attention", "full_attention")}
    if model_type in ("qwen3", "olmo3", "gemma3_text") and window:  # OLMo 2 and GLM-4 have no windows
        options.update(sliding_window=window, layer_types=["sliding_attention", "full_attention"])
        if model_type == "qwen3":  # its config drops the window without use_sliding_window
            options["use_sliding_window"] = True
    try:
        hf = build(model_type, seed, dtype=source_dtype(model_type), **options)
    except Exception:  # noqa: BLE001 - a config transformers itself rejects
        return
    try:
        model = from_hf(hf, device="cpu")
    except UnsupportedModel as err:  # transformers 4's OLMo 3 and Gemma 3 scale the rope of full layers only
        assert MAJOR < 5 and model_type in ("olmo3", "gemma3_text") and "differ between layer types" in str(err), err
        return
    with torch.no_grad():
        assert relative(model(TOKENS), logits(hf, TOKENS)) <= model.source_check.tolerance
    assert verify_qk(model, TOKENS, 1, model.arch.heads_per_layer[1] - 1).passed


REFUSED = [
    ("falcon", {"alibi": True, "attn_implementation": "eager"}, r"ALiBi in eager attention \(alibi=True, "
     r"attn_implementation='eager': Hugging Face adds the biases twice"),
    ("opt", {"do_layer_norm_before": False}, r"post-layer-norm blocks \(do_layer_norm_before=False.*; study a "
     r"pre-layer-norm model instead \(an OPT of another size"),
    ("opt", {"word_embed_proj_dim": 8, "do_layer_norm_before": False}, r"post-layer-norm blocks"),
    ("opt", {"_remove_final_layer_norm": True}, r"^the OPT model uses no final layer norm \(_remove_final_layer_norm=True"),
    # a stray key the config class does not define, but that code Falcon runs names (the masks read sliding_window)
    ("falcon", {"sliding_window": 3}, r"^the Falcon model sets sliding_window=3 \(default not set\), an option"),
    ("openai-gpt", {}, r"^the GPT-1 model uses post-layer-norm blocks .*; study a pre-layer-norm model instead \(GPT-2"),
    ("olmo", {"clip_qkv": 8.0}, r"clipped queries, keys and values \(clip_qkv=8.0\)"),
    ("stablelm", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}},
     r"rotary on an odd number of dimensions \(1 of d_head=4\)"),
    ("gptj", {"rotary_dim": 3}, r"rotary on an odd number of dimensions \(rotary_dim=3, 3 of d_head=4\)"),
    ("codegen", {"rotary_dim": 3}, r"rotary on an odd number of dimensions \(rotary_dim=3, 3 of d_head=4\)"),
    ("smollm3", {"no_rope_layer_interval": 2}, r"layers without rotary \(no_rope_layers: layer 1 of 2\)"),
    ("llama", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0, "short_factor": [1.0, 1.0],
                                   "long_factor": [2.0, 2.0], "original_max_position_embeddings": 4}},
     r"rope scaling \('longrope'"),  # the long factors from original_max_position_embeddings on, within the context
    ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0, 1.0],
                                  "long_factor": [2.0, 2.0]}}, r"rope scaling \('longrope'"),
    ("cohere2", {"layer_types": ["sliding_attention", "full_attention"]},
     r"layers without rotary \(full-attention layers: layer 1 of 2\)"),
    ("gemma3_text", {"layer_types": ["sliding_attention", "full_attention"]},
     r"rotary frequencies that differ between layer types \(default rope_theta 1000000.0 in full_attention, default "
     r"rope_theta 10000.0 in sliding_attention\)"),
    ("olmo3", {"rope_parameters": {"sliding_attention": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
                                   "full_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
               "sliding_window": 3, "layer_types": ["sliding_attention", "full_attention"]},
     r"differ between layer types \(linear rope_theta 10000.0 in full_attention, (dynamic|default) rope_theta 10000.0 "
     r"in sliding_attention\)"),  # transformers 4's OLMo 3 gives its sliding layers rope_theta's own rope
    ("apertus", {}, r"activation function 'xielu'"),
    ("exaone4", {"sliding_window": 3, "layer_types": ["sliding_attention", "full_attention"]},
     r"layers without rotary \(full-attention layers: layer 1 of 2\)"),
    ("hunyuan_v1_dense", {}, r"q/k normalisation after the rotary rotation \(query_layernorm, key_layernorm\)"),
    ("phimoe", {}, r"mixture-of-experts routing by Phimoe(TopKRouter|SparseMoeBlock) \(tcircuits reads a softmax over "
     r"the experts"),  # transformers 5's router, 4's block
    ("bloom", {"apply_residual_connection_post_layernorm": True}, r"a residual stream that carries each layer norm's "
     r"output \(apply_residual_connection_post_layernorm=True\)"),
    ("mpt", {"attn_config": {"alibi": False}}, r"attention without ALiBi \(attn_config.alibi=False\)"),
    ("mpt", {"attn_config": {"alibi": True, "clip_qkv": 2.0}}, r"clipped queries, keys and values \(attn_config.clip_qkv=2.0\)"),
    ("olmoe", {"clip_qkv": 3.0}, r"clipped queries, keys and values \(clip_qkv=3.0\)"),
    ("qwen2_moe", {}, r"a shared expert beside the routed ones \(shared_expert, shared_expert_gate"),
    ("qwen3_moe", {"mlp_only_layers": [1]}, r"dense MLP layers among mixture-of-experts layers \(layer 1 of 2"),
    ("gpt_oss", {}, r"^the GPT-OSS model uses attention sinks \(a learned logit per head in every softmax\)"),
]


@pytest.mark.parametrize("model_type, options, message", REFUSED)
def test_what_the_algebra_cannot_express_is_refused_by_its_name(model_type, options, message):
    with pytest.raises(UnsupportedModel, match=message):
        from_hf(build(model_type, dtype=source_dtype(model_type), **options))


@pytest.mark.parametrize("model_type, options", [
    ("starcoder2", {"sliding_window": 8}),  # a window that covers the context
    ("ministral", {"sliding_window": 4, "layer_types": ["full_attention", "full_attention"]}),  # no layer uses it
    ("gpt_neo", {"window_size": 8}),
    ("olmo", {"clip_qkv": None}),
    ("falcon", {"intermediate_size": 99}),  # a stray key (FalconConfig defines none) that no code of Falcon's reads
])
def test_harmless_settings_are_not_refused(model_type, options):
    converted(model_type, **options)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("model_type", ["llama", "phi", "stablelm"])
def test_half_precision_rotary_buffers_are_compared_in_their_precision(model_type, dtype):
    # the cast rounds inv_freq (bfloat16: ~1e-3); the frequencies are recomputed from the config and
    # compared in the buffer's precision, and the source check measures the half-precision rounding
    hf = build(model_type, dtype=dtype)
    model = from_hf(hf, device="cpu")
    assert model.source_check.rel_diff <= model.source_check.tolerance


def test_gpt_neo_windows_are_read_as_the_layers_were_built():
    hf = build("gpt_neo", window_size=3)  # layer 0 global, layer 1 local
    hf.config.window_size, hf.config.attention_layers = 6, ["local", "local"]  # edited after: the masks stay
    model = from_hf(hf, device="cpu")
    assert model.arch.window == (None, 3)
    with torch.no_grad():
        assert relative(model(TOKENS), logits(hf, TOKENS)) < 1e-6


@pytest.mark.parametrize("model_type, options", [
    ("qwen3", {"sliding_window": 3, "use_sliding_window": True, "max_window_layers": 1}),
    ("gemma2", {"sliding_window": 3, "layer_types": ["sliding_attention", "full_attention"]}),
])
def test_layer_types_edited_after_construction_are_read_as_the_source_uses_them(model_type, options):
    # transformers 4 fixes each decoder layer's attention_type at construction, 5 reads layer_types at each pass
    hf = build(model_type, **options)
    hf.config.layer_types = ["full_attention", "full_attention"]
    model = from_hf(hf, device="cpu")
    assert model.arch.window == (None if MAJOR >= 5 else {"qwen3": (None, 3), "gemma2": (3, None)}[model_type])
    with torch.no_grad():
        assert relative(model(TOKENS), logits(hf, TOKENS)) <= model.source_check.tolerance


@pytest.mark.parametrize("model_type", sorted({t for t, _ in CONVERTS if source_dtype(t) == torch.float64}))
def test_every_family_in_bfloat16_is_held_to_its_float64_copy(model_type):
    """Its own rounding (bf16 weights, a rounded inv_freq, GPT-J's rounded sin/cos tables made again) stated apart."""
    torch.set_num_threads(1)
    hf = build(model_type, 1, dtype=torch.bfloat16)
    try:
        check = from_hf(hf, device="cpu").source_check
    except SourceMismatch as err:  # Hugging Face's own model cannot run so (transformers 4's CTRL in bfloat16)
        assert "fails to run" in str(err), err
        return
    assert check.source.endswith("(Hugging Face, bfloat16, run as a float64 copy)")
    assert check.rel_diff <= check.tolerance < 1e-4 < check.source_rounding


def test_families_registered_only_to_be_refused_are_not_listed_as_read():
    from numeric_check.conversion.readers import FAMILIES, family_names

    listed = family_names()
    assert "Llama (LlamaForCausalLM)" in listed and "Falcon (FalconForCausalLM)" in listed
    for family in FAMILIES:
        assert (f"{family.name} (" in listed) == family.converts, family.name


#: options a user's checkpoint may set, each of which some family reads and others do not know
_DRAWN = st.fixed_dictionaries({}, optional={
    "tie_word_embeddings": st.booleans(),
    "attention_bias": st.booleans(),
    "mlp_bias": st.booleans(),
    "hidden_act": st.sampled_from(["gelu", "silu", "relu2", "gelu_new"]),
    "sliding_window": st.sampled_from([None, 3, 8]),
    "logit_scale": st.floats(0.1, 2.0),
    "use_parallel_residual": st.booleans(),
    "rope_parameters": st.sampled_from([{"rope_type": "default", "rope_theta": 100.0},
                                        {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}]),
})
@settings(max_examples=10, deadline=None)
@given(st.sampled_from(CONVERTS), _DRAWN, st.integers(0, 99))
def test_drawn_options_convert_equal_to_the_source_or_are_refused_by_name(case, drawn, seed):
    torch.set_num_threads(1)
    model_type, options = case[0], {**case[1], **drawn}
    try:
        hf = build(model_type, seed, dtype=source_dtype(model_type), **options)
    except Exception:  # noqa: BLE001 - a config transformers itself rejects or cannot build
        return
    try:
        model = from_hf(hf, device="cpu")
    except UnsupportedModel as err:  # refused: naming an option it was given, or a feature it uses, or because
        # Hugging Face's own model cannot run the drawn config (Gemma 2 or a windowed layer type without a window)
        message = str(err)
        assert " uses " in message or "fails to run" in message or any(f"sets {k}=" in message for k in options), message
        return
    with torch.no_grad():
        assert relative(model(TOKENS), logits(hf, TOKENS)) <= model.source_check.tolerance


@pytest.mark.parametrize("model_type", ["mixtral", "olmoe", "qwen3_moe", "xglm"])
def test_a_float64_source_runs_as_its_code_allows_and_is_left_as_it_was(model_type):
    """transformers 5's default expert kernel (grouped_mm) has no float64: the check runs the experts eagerly (the
    same sums) and puts the setting back; XGLM's mask floor needs torch's default dtype float64, put back too."""
    hf = build(model_type, 2)
    implementation = getattr(hf.config, "_experts_implementation", None)
    model = from_hf(hf, device="cpu")
    assert model.source_check.rel_diff <= model.source_check.tolerance < 1e-5
    assert getattr(hf.config, "_experts_implementation", None) == implementation
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("model_type", ["gemma", "gemma2", "gemma3_text", "vaultgemma"])
def test_gemma_in_half_precision_is_read_with_the_embedding_scale_it_holds(model_type, dtype, monkeypatch):
    """d_model 24: sqrt(24) rounded to the model's dtype where transformers keeps it as a buffer."""
    from numeric_check.conversion.readers import llama

    hf = build(model_type, 1, dtype=dtype, hidden_size=24)
    check = from_hf(hf, device="cpu").source_check
    assert check.rel_diff <= check.tolerance < 1e-4
    held = getattr(hf.model.embed_tokens, "embed_scale", None)
    if held is not None and float(held) != 24**0.5:  # the control: the exact scale is another model
        monkeypatch.setattr(llama, "embed_scale", lambda model: model.config.hidden_size**0.5)
        with refused(SourceMismatch, "differ already after the embedding"):
            from_hf(hf, device="cpu")


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_falcon_alibi_is_read_with_its_bias_made_in_bfloat16(dtype, monkeypatch):
    """16 heads (slopes 2^-0.5 ... not exact in bfloat16) over 300 positions (keys beyond 256 rounded): Falcon makes
    the bias in bfloat16 whatever the model's dtype; read so, the conversion is exact, and exact slopes are not."""
    from numeric_check.conversion.readers import falcon

    hf = build("falcon", 1, dtype=dtype, alibi=True, hidden_size=64, num_attention_heads=16, max_position_embeddings=300)
    check = from_hf(hf, device="cpu").source_check
    assert check.rel_diff < 1e-12 and check.n_tokens == 2 * 64 + 300
    made = falcon._alibi
    monkeypatch.setattr(falcon, "_alibi", lambda *a: {**made(*a), "alibi_rounding": None})  # the control
    with pytest.raises(SourceMismatch):
        from_hf(hf, device="cpu")


def test_a_score_cap_the_source_does_not_apply_is_named_on_the_source_line():
    hf = build("gemma3_text", 1, attn_logit_softcapping=5.0, sliding_window=3)
    model = from_hf(hf, device="cpu")
    assert model.arch.attn_softcap is None
    assert ("(the config's score cap attn_logit_softcapping=5 is not applied by Gemma 3's attention under transformers "
            f"{transformers.__version__}: converted without it)") in model.source_check.describe()
    if MAJOR < 5:  # transformers 4 runs Gemma 2 in SDPA too, which has no cap
        hf = build("gemma2", 1, attn_implementation="sdpa", sliding_window=3)
        assert "is not applied by SDPA under transformers 4." in from_hf(hf, device="cpu").source_check.describe()


def test_a_4096_position_context_is_held_to_the_rounding_at_its_own_length():
    """Granite at its default multipliers over 4096 positions: each probe's tolerance is the float32 rounding measured
    at that probe's length, so the exact conversion passes and one 1 % off is refused."""
    hf = build("granite", 1, max_position_embeddings=4096)
    tokens = torch.randint(0, 13, (1, 4096), generator=torch.Generator().manual_seed(0))
    check = from_hf(hf, device="cpu", check_tokens=tokens).source_check
    assert check.n_tokens == 2 * 64 + 4096 + 4096 and check.rel_diff <= check.tolerance < 1e-4  # the probe: every position
    hf.model.layers[0].mlp.register_forward_hook(lambda module, inputs, output: output * 1.01)
    with pytest.raises(SourceMismatch):
        from_hf(hf, device="cpu", check_tokens=tokens)


def test_an_option_a_newer_transformers_derives_is_read_at_its_derived_value_and_refused_otherwise():
    """transformers 5.25's FalconConfig writes num_key_value_heads, a mirror of num_kv_heads: at the value the
    options the reader understands give it, it converts; set to another value, it is refused by name (on 4.x too,
    where the config has no such option but the modeling code names the word: read by allow-list, it is refused)."""
    hf = build("falcon", 0, new_decoder_architecture=True, num_kv_heads=2, parallel_attn=True)
    mirrored = "num_key_value_heads" in type(hf.config)().to_dict()
    assert not mirrored or hf.config.num_key_value_heads == 2
    from_hf(hf, device="cpu")
    hf.config.num_key_value_heads = 3
    default = "2" if mirrored else "not set"
    with pytest.raises(UnsupportedModel, match=rf"sets num_key_value_heads=3 \(default {default}\), an option tcircuits does not read"):
        from_hf(hf, device="cpu")
