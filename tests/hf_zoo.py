"""Tiny Hugging Face models of every family ``from_hf`` reads or refuses, built offline from their
configs (2 layers, d_model 16, 4 heads, 13 tokens, 8 positions) with every parameter perturbed
off its default; shared by ``tests/numeric_check/test_hf_families.py`` and
``benchmarks/coverage.py`` (the guide's page on model families, docs/reference/model-families.md).

``exact_float64`` replaces the float32 round trips Hugging Face makes inside a float64 model
(RMSNorm, some layer norms, rotary tables) by float64, nothing else, so that a conversion can be
compared with its source to ~1e-15 instead of ~1e-7.
"""

from __future__ import annotations

import copy
import types
import unittest

import torch
import torch.nn.functional as F
import transformers

from numeric_check.conversion.readers.common import rope_parameters

#: transformers' major version: 4 spells the rope as rope_theta, rope_scaling, partial_rotary_factor (5: rope_parameters)
MAJOR = int(transformers.__version__.split(".")[0])

VOCAB, D_MODEL, N_LAYERS, N_HEADS, D_MLP, N_CTX = 13, 16, 2, 4, 24, 8

_LLAMA_SIZES = dict(vocab_size=VOCAB, hidden_size=D_MODEL, num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
                    intermediate_size=D_MLP, max_position_embeddings=N_CTX)
_GPT2_SIZES = dict(vocab_size=VOCAB, n_embd=D_MODEL, n_layer=N_LAYERS, n_head=N_HEADS, n_positions=N_CTX)
_TOKENS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=None)
_KV = dict(num_key_value_heads=2)

def _without(sizes: dict, *keys: str) -> dict:
    return {k: v for k, v in sizes.items() if k not in keys}


#: model type -> (config class, model class, the config's small sizes)
ZOO: dict[str, tuple[str, str, dict]] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", _GPT2_SIZES),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", _LLAMA_SIZES),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", {**_GPT2_SIZES, "n_inner": D_MLP, "rotary_dim": 2, **_TOKENS}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", _LLAMA_SIZES),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {**_LLAMA_SIZES, **_KV}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {**_LLAMA_SIZES, **_KV}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 8, **_TOKENS}),
    "phi": ("PhiConfig", "PhiForCausalLM", {**_LLAMA_SIZES, **_TOKENS}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**_LLAMA_SIZES, **_TOKENS}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {**_LLAMA_SIZES, **_KV, **_TOKENS, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", {**_LLAMA_SIZES, **_TOKENS}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {**_LLAMA_SIZES, "num_key_value_heads": 2, **_TOKENS}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {**_LLAMA_SIZES, **_TOKENS}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {**_LLAMA_SIZES, **_TOKENS}),
    "falcon": ("FalconConfig", "FalconForCausalLM", {**_without(_LLAMA_SIZES, "intermediate_size"), "ffn_hidden_size": D_MLP,
                                                     **_TOKENS}),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", {**_GPT2_SIZES, "n_inner": D_MLP, **_TOKENS}),
    "opt": ("OPTConfig", "OPTForCausalLM", {**_without(_LLAMA_SIZES, "intermediate_size"), "ffn_dim": D_MLP,
                                            "word_embed_proj_dim": D_MODEL, **_TOKENS}),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM", {
        "vocab_size": VOCAB, "hidden_size": D_MODEL, "num_layers": N_LAYERS, "num_heads": N_HEADS,
        "intermediate_size": D_MLP, "max_position_embeddings": N_CTX, "attention_types": [[["global", "local"], 1]],
        "window_size": N_CTX, **_TOKENS}),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM", {**_GPT2_SIZES, "n_ctx": N_CTX, "n_inner": D_MLP, "rotary_dim": 2,
                                                        **_TOKENS}),
    "gpt-sw3": ("GPT2Config", "GPT2LMHeadModel", _GPT2_SIZES),  # GPT-2's classes
    "exaone": ("ExaoneConfig", "LlamaForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4}),  # Llama's model class
    "internlm3": ("InternLM3Config", "LlamaForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4}),
    "iquestcoder": ("IQuestCoderConfig", "LlamaForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4}),
    "ministral": ("MinistralConfig", "MinistralForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4}),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {**_LLAMA_SIZES, **_KV, **_TOKENS}),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4, **_TOKENS}),
    "helium": ("HeliumConfig", "HeliumForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4, **_TOKENS}),
    "hyperclovax": ("HyperCLOVAXConfig", "HyperCLOVAXForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4,
                                                                   "use_post_norm": False, **_TOKENS}),
    "glm": ("GlmConfig", "GlmForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4, **_TOKENS}),
    "arcee": ("ArceeConfig", "ArceeForCausalLM", {**_LLAMA_SIZES, **_KV, **_TOKENS}),
    "jais2": ("Jais2Config", "Jais2ForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4, **_TOKENS}),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", {**_LLAMA_SIZES, **_KV, **_TOKENS}),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", {**_LLAMA_SIZES, "head_dim": 4, **_TOKENS}),
    "biogpt": ("BioGptConfig", "BioGptForCausalLM", {**_LLAMA_SIZES, **_TOKENS}),
    "xglm": ("XGLMConfig", "XGLMForCausalLM", {"vocab_size": VOCAB, "d_model": D_MODEL, "num_layers": N_LAYERS,
                                               "attention_heads": N_HEADS, "ffn_dim": D_MLP, "max_position_embeddings": N_CTX,
                                               **_TOKENS}),
    "ctrl": ("CTRLConfig", "CTRLLMHeadModel", {**_GPT2_SIZES, "dff": D_MLP}),
    # the decoder options of issue 18 (q/k norms, post norms, windows, soft-caps, scaled rope, ALiBi, experts); some refused
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4}),
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4, **_TOKENS}),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4, **_TOKENS}),
    "bloom": ("BloomConfig", "BloomForCausalLM", {"vocab_size": VOCAB, "hidden_size": D_MODEL, "n_layer": N_LAYERS,
                                                  "n_head": N_HEADS, **_TOKENS}),
    "mpt": ("MptConfig", "MptForCausalLM", {"vocab_size": VOCAB, "d_model": D_MODEL, "n_layers": N_LAYERS,
                                            "n_heads": N_HEADS, "max_seq_len": N_CTX}),
    "vaultgemma": ("VaultGemmaConfig", "VaultGemmaForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4, **_TOKENS}),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", {**_LLAMA_SIZES, **_KV, **_TOKENS}),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", {**_LLAMA_SIZES, **_KV, **_TOKENS}),
    "apertus": ("ApertusConfig", "ApertusForCausalLM", {**_LLAMA_SIZES, **_KV, **_TOKENS}),
    "cwm": ("CwmConfig", "CwmForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4, **_TOKENS}),
    "ministral3": ("Ministral3Config", "Ministral3ForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4, **_TOKENS}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", {**_LLAMA_SIZES, **_KV, "head_dim": 4, "num_local_experts": 4,
                                                     "num_experts_per_tok": 2, "sliding_window": 4, **_TOKENS}),
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", {**_LLAMA_SIZES, **_KV, "num_local_experts": 4, **_TOKENS}),
    "openai-gpt": ("OpenAIGPTConfig", "OpenAIGPTLMHeadModel", _GPT2_SIZES),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {**_LLAMA_SIZES, **_TOKENS}),
    "persimmon": ("PersimmonConfig", "PersimmonForCausalLM", {**_LLAMA_SIZES, **_TOKENS}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {**_LLAMA_SIZES, "head_dim": 4, "num_key_value_heads": 2, **_TOKENS}),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", {**_LLAMA_SIZES, "head_dim": 4, "num_key_value_heads": 2,
                                                             **_TOKENS}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {**_LLAMA_SIZES, "num_key_value_heads": 2, "num_local_experts": 4,
                                                       **_TOKENS}),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {**_LLAMA_SIZES, "num_experts": 4, "num_experts_per_tok": 2, **_TOKENS}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {**_LLAMA_SIZES, "num_experts": 4, "num_experts_per_tok": 2,
                                                           "moe_intermediate_size": 8, "shared_expert_intermediate_size": 8}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {**_LLAMA_SIZES, "num_experts": 4, "num_experts_per_tok": 2,
                                                           "moe_intermediate_size": 8}),
}


#: (model type, config options): every family read, in the settings it reads differently
CONVERTS = [
    ("phi", {}),
    ("phi3", {"num_key_value_heads": 2}),
    ("stablelm", {"use_parallel_residual": True, "use_qkv_bias": True}),
    ("stablelm", {}),
    ("olmo", {"attention_bias": True}),
    ("falcon", {}),
    ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 2, "bias": True}),
    ("falcon", {"parallel_attn": False, "multi_query": False}),
    ("gpt_bigcode", {}),
    ("gpt_bigcode", {"multi_query": False, "scale_attn_weights": False}),
    ("opt", {}),
    ("opt", {"word_embed_proj_dim": 8, "enable_bias": False}),
    ("starcoder2", {}),
    ("granite", {"embedding_multiplier": 3.0, "residual_multiplier": 0.4, "attention_multiplier": 0.2,
                 "logits_scaling": 5.0}),
    ("gpt_neo", {}),
    ("codegen", {}),
    ("cohere", {"logit_scale": 0.3, "attention_bias": True}),
    ("ministral", {}),
    ("seed_oss", {}),
    ("smollm3", {}),
    ("ernie4_5", {"use_bias": True}),
    ("helium", {}),
    ("hyperclovax", {"embedding_multiplier": 2.0, "logits_scaling": 3.0, "attention_multiplier": 0.3}),
    ("exaone", {}),
    ("internlm3", {}),
    ("iquestcoder", {}),
    ("gpt-sw3", {}),
    ("glm", {}),
    ("arcee", {}),  # squared ReLU
    ("jais2", {}),
    ("nemotron", {}),  # layer norm with 1 + w gains
    ("persimmon", {"qk_layernorm": False}),
    ("cohere2", {"logit_scale": 0.5}),
    ("biogpt", {"scale_embedding": False}),
    ("xglm", {}),  # its float64 model runs with torch's default dtype float64
    # the decoder options of issue 18: q/k norms, norms after a sublayer, windows, soft-caps, scaled ropes
    ("qwen3", {}),  # q/k RMSNorm per head
    ("qwen3", {"sliding_window": 3, "use_sliding_window": True, "max_window_layers": 1}),  # layer 1 windowed
    ("qwen2", {"sliding_window": 3, "use_sliding_window": True, "max_window_layers": 1}),
    ("mistral", {"sliding_window": 3}),
    ("mistral", {"sliding_window": 3, "layer_types": ["full_attention", "sliding_attention"]}),  # ignored: every layer
    ("starcoder2", {"sliding_window": 3, "layer_types": ["full_attention", "sliding_attention"]}),
    ("ministral", {"sliding_window": 4}),
    ("starcoder2", {"sliding_window": 3}),
    ("cohere2", {"sliding_window": 4}),
    ("phi3", {"sliding_window": 3, "num_key_value_heads": 2}),
    ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 4.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 2.0, "original_max_position_embeddings": 4}}),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0,
                                   "original_max_position_embeddings": 4}}),  # attention factor != 1
    ("cwm", {}),  # llama3 rope
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0,
                                   "original_max_position_embeddings": 4}}),  # dynamic NTK: constant within n_ctx
    ("stablelm", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 3.0, "partial_rotary_factor": 1.0}}),
    ("falcon", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 3.0}}),
    ("falcon", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}),
    ("gpt_neox", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0,
                                      "original_max_position_embeddings": 4, "partial_rotary_factor": 0.5}}),
    ("persimmon", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "partial_rotary_factor": 0.5}}),
    ("phi", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 4.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 2.0, "original_max_position_embeddings": 4, "partial_rotary_factor": 0.5}}),
    ("ministral3", {}),  # yarn rope
    ("olmo2", {}),  # q/k RMSNorm over all heads, norms after each sublayer only
    ("olmo3", {"sliding_window": 3, "layer_types": ["sliding_attention", "full_attention"]}),
    ("exaone4", {}),
    ("exaone4", {"sliding_window": 3, "layer_types": ["sliding_attention", "sliding_attention"]}),
    ("gemma2", {"sliding_window": 3, "layer_types": ["sliding_attention", "full_attention"]}),  # sandwich norms, caps
    ("gemma2", {"attn_logit_softcapping": None, "final_logit_softcapping": 2.0}),
    ("gemma3_text", {"sliding_window": 3}),  # q/k norm with 1 + w gains, both layers on the sliding rope
    ("vaultgemma", {}),
    ("glm4", {}),  # post_self_attn_layernorm, post_mlp_layernorm
    ("hyperclovax", {"use_post_norm": True, "residual_multiplier": 0.5}),  # the multiplier after the post norm
    ("persimmon", {}),  # q/k layer norm
    ("phi", {"qk_layernorm": True}),
    ("stablelm", {"qk_layernorm": True}),  # one layer norm per head
    ("cohere", {"use_qk_norm": True}),  # [heads, d_head] gains
    ("gpt_neo", {"window_size": 4}),  # local layers: windows
    ("falcon", {"alibi": True}),  # ALiBi slopes / sqrt(d_head), through the mask
    ("falcon", {"alibi": True, "new_decoder_architecture": True, "num_kv_heads": 2, "num_attention_heads": 2}),
    ("falcon", {"alibi": True, "hidden_size": 24, "num_attention_heads": 6}),  # slopes of a head count not a power of 2
    ("bloom", {}),  # BLOOM's slopes; the embedding's layer norm folded into W_E
    ("bloom", {"hidden_size": 24, "n_head": 6}),
    ("bloom", {"slow_but_exact": True, "pretraining_tp": 2}),  # dense and dense_4h_to_h run slice by slice, no biases
    ("mpt", {}),  # MPT's slopes (alibi_bias_max=8, as Hugging Face builds them)
    ("mpt", {"d_model": 24, "n_heads": 6, "attn_config": {"alibi": True, "softmax_scale": 0.3}}),
    # mixtures of experts, in float64 (the source check runs Hugging Face's eager experts: grouped_mm has no float64)
    ("mixtral", {}),  # top-2 weights renormalised
    ("olmoe", {}),  # not renormalised; q/k RMSNorm over all heads
    ("qwen3_moe", {}),
    ("qwen3_moe", {"norm_topk_prob": True, "sliding_window": 3, "use_sliding_window": True, "max_window_layers": 0}),
    ("gpt2", {"scale_attn_weights": False, "activation_function": "relu"}),
    ("gpt_neox", {"use_parallel_residual": False, "attention_bias": False}),
    ("gptj", {"rotary_dim": 4}),
    ("llama", {"num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}),
    ("qwen2", {"num_key_value_heads": 4}),
    ("mistral", {"sliding_window": None}),
    ("gemma", {"num_key_value_heads": 1}),
    ("gemma", {"hidden_activation": "gelu"}),  # a leftover Gemma 1's code never reads (it applies hidden_act)
    ("llama", {"sliding_window": None}),  # a stray null: unset
    ("gemma3_text", {"attn_logit_softcapping": 5.0, "sliding_window": 3}),  # a cap its attention never applies
    ("ctrl", {}),
]


def source_dtype(model_type: str) -> torch.dtype:
    """float64, except where Hugging Face's model cannot run in it: GPT-OSS's experts (refused anyway), and in
    transformers 4 MPT's attention, which fills its float32 mask with float64's minimum. (Mixtures of experts run
    in float64 through the eager experts, XGLM with torch's default dtype float64: the source check does both.)"""
    return torch.float32 if model_type == "gpt_oss" or (model_type == "mpt" and MAJOR < 5) else torch.float64


def config_kwargs(model_type: str, kwargs: dict) -> dict:
    """A config's keyword arguments as the installed transformers spells them: unchanged in 5; in 4,
    ``rope_parameters`` as ``rope_theta``, ``rope_scaling`` and ``partial_rotary_factor`` (GPT-NeoX's
    ``rotary_pct``), per layer type (OLMo 3, Gemma 3) the full-attention layers' rope and Gemma 3's sliding
    layers' ``rope_local_base_freq``."""
    params = kwargs.pop("rope_parameters", None) if MAJOR < 5 else None
    if not params:
        return kwargs
    if "full_attention" in params:
        if model_type == "gemma3_text" and "sliding_attention" in params:
            kwargs["rope_local_base_freq"] = params["sliding_attention"]["rope_theta"]
        params = params["full_attention"]
    params = dict(params)
    kwargs["rope_theta"] = params.pop("rope_theta", 10000.0)
    partial = params.pop("partial_rotary_factor", None)
    if partial is not None:
        kwargs["rotary_pct" if model_type == "gpt_neox" else "partial_rotary_factor"] = partial
    if params.get("rope_type", "default") != "default":
        # Phi-3 reads "type" (and nothing more), the others "rope_type"
        if model_type == "phi3":
            params["type"] = params.pop("rope_type")
        kwargs["rope_scaling"] = params
    return kwargs


def missing(model_type: str) -> str | None:
    """Why the installed transformers cannot build ``model_type`` (it lacks the config or model class), or None."""
    config_name, model_name, _ = ZOO[model_type]
    absent = [name for name in (config_name, model_name) if not hasattr(transformers, name)]
    return (f"transformers {transformers.__version__} has no {' or '.join(absent)} (model type {model_type!r} came "
            "later)") if absent else None


def build(model_type: str, seed: int = 0, exact: bool = True, dtype: torch.dtype = torch.float64, **options):
    """A tiny ``model_type`` model, every parameter random (seeded), in eval mode; ``options`` override the config
    (``rope_parameters`` as transformers 5 spells it, given to transformers 4 in its own keys). A model type the
    installed transformers lacks raises ``unittest.SkipTest`` with the reason (pytest skips the test)."""
    reason = missing(model_type)
    if reason:
        raise unittest.SkipTest(reason)
    config_name, model_name, sizes = ZOO[model_type]
    # a deep copy: configs write into the dicts they are given (rope_parameters), and tests reuse theirs
    kwargs = copy.deepcopy({**sizes, **options})
    kwargs = config_kwargs(model_type, kwargs)
    config = getattr(transformers, config_name)(**kwargs)
    torch.manual_seed(seed)
    try:
        model = getattr(transformers, model_name)(config)
    except Exception as err:  # noqa: BLE001 - the installed transformers' own code cannot build it
        raise unittest.SkipTest(f"transformers {transformers.__version__} cannot build {model_name} with {options} "
                                f"({type(err).__name__}: {err})") from None
    model = randomise(model.to(torch.float64).eval(), seed)
    if exact and dtype == torch.float64:
        exact_float64(model)
    return model.to(dtype)


def logits(hf, tokens: torch.Tensor) -> torch.Tensor:
    """``hf``'s logits on ``tokens`` in float64, run as its code allows in its dtype (float64 experts through the
    eager implementation, XGLM with torch's default dtype float64: as the source check runs it)."""
    from numeric_check.conversion.hf import as_it_runs_in_float64
    from numeric_check.conversion.readers import BY_CLASS

    with torch.no_grad(), as_it_runs_in_float64(hf, BY_CLASS.get(type(hf).__name__)):
        return hf(tokens).logits.to(torch.float64)


def randomise(hf, seed: int):
    """Every parameter random (norm gains and biases too, so that folding is exercised)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * (0.3 if p.ndim == 1 else 0.5))
    return hf


def exact_float64(hf):
    """Replace Hugging Face's float32 round trips in a float64 model (RMSNorm, OLMo's and Cohere's
    layer norms, rotary tables) by float64; nothing else changes."""
    config = hf.config
    bases = [rope_parameters(config).get("rope_theta", 10000.0), getattr(config, "rope_local_base_freq", None)]
    for module in hf.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm"):
            _rms_norm(module, gemma="Gemma" in name)  # Gemma's and VaultGemma's gains are 1 + w
        elif name == "OlmoLayerNorm":
            module.forward = types.MethodType(lambda self, x: F.layer_norm(x, self.normalized_shape, eps=1e-5), module)
        elif name in ("CohereLayerNorm", "Cohere2LayerNorm"):
            def cohere(self, x):
                centred = x - x.mean(-1, keepdim=True)
                return self.weight * centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            module.forward = types.MethodType(cohere, module)
        elif name in ("GPTJAttention", "CodeGenAttention") and isinstance(getattr(module, "embed_positions", None),
                                                                          torch.Tensor):  # transformers 4: the table there
            module.embed_positions = _sin_cos(module.rotary_dim or module.embed_dim, module.embed_positions.shape[0])
        elif name in ("GPTJRotaryEmbedding", "CodeGenRotaryEmbedding"):  # sin/cos tables made in float32
            dim = module.pos_embd_dim
            inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            angles = torch.arange(module.max_positions, dtype=torch.float64)[:, None] * inv
            module.embed_positions = torch.cat((angles.sin(), angles.cos()), dim=1)
        elif name.endswith("RotaryEmbedding") and hasattr(module, "inv_freq"):
            _rotary(module, _base_of(module, bases), interleave=name.startswith("Cohere"))
    return hf


def _sin_cos(dim: int, n_positions: int) -> torch.Tensor:
    """GPT-J's and CodeGen's ``[sin | cos]`` table of rope_theta 10000 on ``dim`` dimensions, in float64."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.arange(n_positions, dtype=torch.float64)[:, None] * inv
    return torch.cat((angles.sin(), angles.cos()), dim=1)


def _base_of(module, bases: list) -> float:
    """The rope_theta among ``bases`` whose frequencies the rotary module holds (Gemma 3's local rope in
    transformers 4 has its own), else the first."""
    dim = 2 * module.inv_freq.shape[0]
    for base in (b for b in bases if b is not None):
        inv = 1.0 / (float(base) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        if torch.allclose(module.inv_freq.to(torch.float64), inv, rtol=1e-5):
            return float(base)
    return float(bases[0])


def _rms_norm(module, gemma: bool) -> None:
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))

    def norm(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y * ((1.0 + self.weight) if gemma else self.weight)

    module.forward = types.MethodType(norm, module)


def _rotary(module, base: float, interleave: bool) -> None:
    """rope_theta's frequencies in float64; a scaled rope keeps its own frequencies (the buffer's, made in
    float32) and attention factor, with the angles and their cosines made in float64."""
    dim = 2 * module.inv_freq.shape[0]
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    factor = 1.0
    if getattr(module, "rope_type", "default") != "default":
        inv, factor = module.inv_freq.to(torch.float64).clone(), float(module.attention_scaling)

    def rotary(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv
        emb = torch.repeat_interleave(freqs, 2, dim=-1) if interleave else torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * factor).to(x.dtype), (emb.sin() * factor).to(x.dtype)

    module.forward = types.MethodType(rotary, module)
