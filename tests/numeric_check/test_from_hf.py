"""``from_hf``: each family built offline from its config with random weights (float64, tiny,
one thread) converts to a CircuitModel whose logits equal Hugging Face's, whose path expansion
verifies to order 2 and whose rotary heads' QK expansion verifies; bad input names its feature."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.conftest import HEAVY

from numeric_check import UnsupportedModel, from_hf, from_hf_gpt2, verify_logits, verify_qk
from numeric_check.errors import SourceMismatch, WeightError

transformers = pytest.importorskip("transformers")
from tests.hf_zoo import MAJOR, config_kwargs, exact_float64, randomise  # noqa: E402  (needs transformers)

pytestmark = pytest.mark.slow

TOKENS = torch.tensor([[1, 5, 2, 7, 3, 1]])

SMALL = dict(vocab_size=13, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
             max_position_embeddings=8)


def build(family: str, seed: int = 0, **options):
    torch.manual_seed(seed)
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=4, n_positions=8, vocab_size=13, **options)
        model = transformers.GPT2LMHeadModel(config)
    elif family == "gptj":
        config = transformers.GPTJConfig(n_layer=2, n_embd=16, n_head=4, n_positions=8, vocab_size=13, n_inner=24,
                                         bos_token_id=0, eos_token_id=0, **options)
        model = transformers.GPTJForCausalLM(config)
    else:
        config_class, model_class = FAMILIES[family]
        model = model_class(config_class(**config_kwargs(family, {**SMALL, **options})))
    return exact_float64(randomise(model.double().eval(), seed))


FAMILIES = {
    "gpt_neox": (transformers.GPTNeoXConfig, transformers.GPTNeoXForCausalLM),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
}
CASES = [
    ("gpt2", {}),
    ("gpt_neox", {"use_parallel_residual": True, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}),
    ("gpt_neox", {"use_parallel_residual": False, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                                                                      "partial_rotary_factor": 1.0}}),
    ("gptj", {"rotary_dim": 2}),
    ("llama", {"num_key_value_heads": 2}),
    ("llama", {"num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}),
    ("qwen2", {"num_key_value_heads": 2}),
    ("mistral", {"num_key_value_heads": 2, "sliding_window": None, "head_dim": 8}),
    ("gemma", {"num_key_value_heads": 1, "head_dim": 8}),
]


def relative(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("family, options", CASES)
def test_logits_equal_hugging_faces(family, options):
    torch.set_num_threads(1)
    hf = build(family, **options)
    ours = from_hf(hf, dtype=torch.float64, device="cpu")
    # GPT-J's eager attention (its only one before transformers 5.2x) computes the scores in float32 whatever the dtype
    float32_scores = family == "gptj" and hf.config._attn_implementation == "eager"
    with torch.no_grad():
        assert relative(ours(TOKENS), hf(TOKENS).logits) < (1e-6 if float32_scores else 1e-12)
    if family == "gpt2":
        assert ours.arch == from_hf_gpt2(hf, device="cpu").arch


@pytest.mark.parametrize("family, options", CASES)
def test_paths_and_rotary_scores_verify(family, options):
    torch.set_num_threads(1)
    model = from_hf(build(family, seed=1, **options), dtype=torch.float64)
    report = verify_logits(model, TOKENS, max_order=2)
    assert report.passed, report
    qk = verify_qk(model, TOKENS, 1, model.arch.heads_per_layer[1] - 1)
    assert qk.passed, qk


@st.composite
def llama_options(draw):
    kv = draw(st.sampled_from([1, 2, 4]))
    return {"num_key_value_heads": kv, "attention_bias": draw(st.booleans()),
            "tie_word_embeddings": draw(st.booleans()),
            "rope_parameters": {"rope_type": "default", "rope_theta": draw(st.sampled_from([100.0, 10000.0])),
                                "partial_rotary_factor": draw(st.sampled_from([0.5, 1.0]))}}


@HEAVY
@given(llama_options(), st.integers(0, 1000))
def test_drawn_options_convert_and_verify(options, seed):
    torch.set_num_threads(1)
    hf = build("llama", seed, **options)
    try:
        model = from_hf(hf, dtype=torch.float64, device="cpu")
    except SourceMismatch as err:  # transformers 4's Llama turns partial_rotary_factor dimensions, then fails to run
        assert MAJOR < 5 and "fails to run" in str(err), err
        return
    with torch.no_grad():
        assert relative(model(TOKENS), hf(TOKENS).logits) < 1e-12
    assert verify_qk(model, TOKENS, 1, 3).passed


def test_unsupported_features_are_named():
    with pytest.raises(UnsupportedModel, match=r"rope scaling \('longrope'"):  # its frequencies change within the context
        from_hf(build("llama", rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "factor": 2.0, "short_factor": [1.0, 1.0], "long_factor": [2.0, 2.0],
                                                "original_max_position_embeddings": 4}), device="cpu")
    rwkv = transformers.RwkvForCausalLM(transformers.RwkvConfig(vocab_size=13, hidden_size=16, num_hidden_layers=2,
                                                                attention_hidden_size=16, intermediate_size=32))
    with pytest.raises(UnsupportedModel, match=r"^RwkvForCausalLM \(model_type 'rwkv'\) is not a family tcircuits reads; "
                                               r"the guide's model families page \(docs/reference/model-families.md\) lists those it reads$"):
        from_hf(rwkv, device="cpu")
    with pytest.raises(UnsupportedModel, match="^Linear is not a family tcircuits reads"):
        from_hf(torch.nn.Linear(2, 2), device="cpu")


def not_decoders() -> dict:
    """A tiny model of each kind that is not a decoder-only language model: an encoder, an encoder-decoder, two
    vision-language models."""
    T = transformers
    lm = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    vision = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, image_size=8, patch_size=4)
    return {
        "BertForMaskedLM": lambda: T.BertForMaskedLM(T.BertConfig(vocab_size=13, **lm)),
        "T5ForConditionalGeneration": lambda: T.T5ForConditionalGeneration(T.T5Config(
            vocab_size=13, d_model=16, d_kv=8, d_ff=8, num_layers=1, num_heads=2)),
        "LlavaForConditionalGeneration": lambda: T.LlavaForConditionalGeneration(T.LlavaConfig(
            text_config=T.LlamaConfig(vocab_size=40, **lm), vision_config=T.CLIPVisionConfig(**vision), image_token_index=30)),
        "Gemma3ForConditionalGeneration": lambda: T.Gemma3ForConditionalGeneration(T.Gemma3Config(
            text_config=dict(vocab_size=300, num_key_value_heads=1, head_dim=8, **lm), vision_config=vision,
            mm_tokens_per_image=4, image_token_index=200, boi_token_index=201, eoi_token_index=202)),
    }


#: what each is said to be, and what to do
NOT_A_DECODER = {
    "BertForMaskedLM": "is an encoder (it sees the whole input at once); tcircuits reads decoder-only language models: "
                       "give a causal LM",
    "T5ForConditionalGeneration": "is an encoder-decoder model; tcircuits reads decoder-only language models: give a "
                                  "causal LM",
    "LlavaForConditionalGeneration": "is a vision-language model; tcircuits reads its language model alone: pass "
                                     "LlamaForCausalLM built from config.text_config",
    "Gemma3ForConditionalGeneration": "is a vision-language model; tcircuits reads its language model alone: pass "
                                      "Gemma3ForCausalLM built from config.text_config",
}


@pytest.mark.parametrize("name", sorted(NOT_A_DECODER))
def test_a_model_that_is_not_a_decoder_is_refused_in_one_short_line(name):
    model = not_decoders()[name]()
    with pytest.raises(UnsupportedModel) as error:
        from_hf(model, device="cpu")
    assert str(error.value) == f"{name} {NOT_A_DECODER[name]}" and len(str(error.value)) <= 170


def test_a_config_that_disagrees_with_its_weights_is_refused():
    hf = build("llama", num_key_value_heads=2)
    hf.config.num_key_value_heads = 1
    with pytest.raises(WeightError, match=r"k_proj.weight has shape \(8, 16\) but the config says \(4, 16\)"):
        from_hf(hf, device="cpu")
