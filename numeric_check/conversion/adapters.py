"""TransformerLens: a ``HookedTransformer`` as a :class:`CircuitModel` (checked against it), and back.

The model is read into :class:`~numeric_check.conversion.build.SourceWeights` (TransformerLens' row
convention, float64) and built by :func:`~numeric_check.conversion.build.build`, which folds norms
and centres the writing weights. Shortformer positions (TransformerLens adds ``W_pos`` to the
query and key inputs *after* ``ln1``, un-normed) become ``qk_only``. TransformerLens' RMSNorm
(``RMS``/``RMSPre``), grouped-query attention (``_W_K``, ``_W_V`` per group), parallel blocks,
rotary (``rotary_adjacent_pairs``: GPT-J's pairing) and gated MLPs are read as such; its gated
MLP adds ``b_in`` after the gate's product, so ``b_in W_out`` moves into ``b_out``. Hugging Face
models: :func:`numeric_check.conversion.hf.from_hf`.

Config fields are read by allow-list (:data:`TL_OPTIONS`; :mod:`numeric_check.conversion.options`):
a field the adapter does not understand, set off its default, is refused by name; features
the algebra cannot express are refused with their names. The converted model is run beside the
source before it is returned (:mod:`numeric_check.conversion.source_check`). The source model is
never modified.
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from numeric_check.errors import SourceMismatch, UnsupportedModel, WeightError
from numeric_check.conversion.build import (
    ACT_FN_ALIASES, LayerNormWeights, LayerWeights, SourceWeights, build, f64, on_one_device, unsupported,
)
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.config import resolve_dtype
from numeric_check.model.rotary import table_excess, tables_given, tables_rounded_to
from numeric_check.conversion.options import check_tl_options
from numeric_check.conversion.hf import check_hf, read_hf
from numeric_check.conversion.own_rounding import HeldSource
from numeric_check.conversion.source_calls import AsCalled, Call, additions, plain_calls
from numeric_check.conversion.source_check import (
    changed_modules, check_against_source, fresh_on_meta, half_precision_reference, in_dtype, in_eval_mode, lowest_precision,
    probe_batches, unchecked, user_tokens,
)


def from_transformer_lens(model: Any, dtype: str | torch.dtype = torch.float64, device: str | torch.device | None = None,
                          biases: bool | None = None, *, check: bool = True, check_tokens: Tensor | None = None,
                          accept_source_precision: bool = False) -> CircuitModel:
    """A :class:`CircuitModel` computing the same logits as a TransformerLens ``HookedTransformer``, checked against it.

    ``dtype`` of the result (folding is done in float64 on the CPU); ``device`` where it goes (``None`` or
    ``"auto"``: CUDA when present, else the CPU; the source may be anywhere).
    ``biases``: ``None`` keeps biases only when some folded bias is non-zero; ``True`` always
    keeps them; ``False`` requires them all to be zero. ``check``, ``check_tokens``, ``accept_source_precision``: as
    for :func:`~numeric_check.conversion.hf.from_hf` (the measurement is kept as ``model.source_check``).

    >>> from transformer_lens import HookedTransformer, HookedTransformerConfig
    >>> tl = HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_head=4,
    ...     n_heads=2, d_vocab=10, attn_only=True, normalization_type=None))
    >>> model = from_transformer_lens(tl)
    >>> model.arch
    Architecture(n_layers=1, n_heads=2, positional='standard', layer_norm=False, biases=False, mlp=False...)
    >>> model.source_check.describe()
    'converted from HookedTransformer (TransformerLens, float32): logits equal to the source within ...'
    """
    if _is_instance(model, "transformer_lens.model_bridge", "TransformerBridge"):
        return from_bridge(model, dtype, device, biases, check=check, check_tokens=check_tokens,
                           accept_source_precision=accept_source_precision)
    if not _is_instance(model, "transformer_lens", "HookedTransformer"):
        raise UnsupportedModel(f"from_transformer_lens expects a transformer_lens.HookedTransformer (TransformerLens 2 "
                               f"and 3) or TransformerBridge (TransformerLens 4), got {type(model).__name__}")
    on_one_device(model, "the TransformerLens model")
    ours = build(_read_transformer_lens(model), torch.float64, device, biases)
    ours.source_check = (check_transformer_lens(model, ours, check_tokens, accept_source_precision=accept_source_precision)
                         if check else unchecked("HookedTransformer (TransformerLens)"))
    return in_dtype(ours, dtype)


def from_bridge(bridge: Any, dtype: str | torch.dtype = torch.float64, device: str | torch.device | None = None,
                biases: bool | None = None, *, check: bool = True, check_tokens: Tensor | None = None,
                accept_source_precision: bool = False) -> CircuitModel:
    """TransformerLens 4's ``TransformerBridge``: the Hugging Face model it wraps (``bridge.original_model``, its weights
    as the bridge holds them: processed in place by ``enable_compatibility_mode``) read as :func:`from_hf` reads it,
    and checked against that model and against the bridge's own forward ``bridge(tokens)``, which runs its hooks: a
    bridge that computes otherwise than the model it wraps is refused by name."""
    hf = getattr(bridge, "original_model", None)
    if not isinstance(hf, torch.nn.Module) or getattr(hf, "config", None) is None:
        raise UnsupportedModel(f"from_transformer_lens: this {type(bridge).__name__} wraps no Hugging Face model "
                               "(original_model); boot it with TransformerBridge.boot_transformers")
    ours = read_hf(hf, device, biases)
    name = f"{type(hf).__name__} (TransformerLens {_version()} TransformerBridge over Hugging Face)"
    if not check:
        ours.source_check = unchecked(name)
        return in_dtype(ours, dtype)
    where = next(iter(hf.parameters())).device
    through = Call("bridge(tokens), the TransformerBridge's own forward", lambda tokens: bridge(tokens.to(where)))
    try:
        ours.source_check = check_hf(hf, ours, check_tokens, accept_source_precision=accept_source_precision,
                                     also=(through,), who="from_transformer_lens", library=name.partition(" (")[2][:-1])
    except SourceMismatch as error:
        if not getattr(bridge, "compatibility_mode", False):
            raise
        raise SourceMismatch(  # its weights processed in place for its own components (GPT-2's folded layer norms)
            f"from_transformer_lens: a TransformerBridge after enable_compatibility_mode() is not read as it computes "
            f"(logits {str(error).partition(' by ')[2].partition(' of ')[0]} off); convert one booted afresh, before that call",
            error.detail) from None
    return in_dtype(ours, dtype)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("transformer-lens")
    except metadata.PackageNotFoundError:
        return "4"


def check_transformer_lens(model: Any, ours: CircuitModel, tokens: Tensor | None = None, *,
                           accept_source_precision: bool = False):
    """Run ``ours`` beside the ``HookedTransformer`` (:func:`~numeric_check.conversion.source_check.check_against_source`);
    a half-precision one as a float64, else float32, copy of itself, its rotary tables made again in that precision
    (:func:`~numeric_check.conversion.source_check.half_precision_reference`; ``accept_source_precision``: as there)."""
    cfg = ours.cfg
    batches = probe_batches(cfg.d_vocab, cfg.n_ctx, max(ours.arch.heads_per_layer, default=1))
    batches += [user_tokens(tokens, cfg.d_vocab, cfg.n_ctx)] if tokens is not None else []
    n_layers = model.cfg.n_layers

    def run(tokens: Tensor):
        logits, cache = model.run_with_cache(tokens.to(model.W_E.device), names_filter=lambda n: n.endswith("hook_resid_pre"))
        return logits, [cache[f"blocks.{i}.hook_resid_pre"] for i in range(n_layers)]

    def suspects() -> list[str]:
        cfg = copy.copy(model.cfg)
        cfg.device, cfg.init_weights = "meta", False  # TransformerLens moves its modules to cfg.device
        fresh = fresh_on_meta(lambda: type(model)(cfg))
        return [] if fresh is None else changed_modules(model, fresh)

    def as_held(source: Any, tokens: Tensor, first: bool) -> list[Tensor]:  # as a person calls it, and as checked
        tokens = tokens.to(source.W_E.device)
        return in_eval_mode(source, lambda: [source(tokens)] + ([source.run_with_cache(tokens)[0]] if first else []))

    dtype = model.W_E.dtype
    held = str(dtype).removeprefix("torch.")
    added, training, own, label, accepted = additions(model), model.training, None, "", None
    if dtype.itemsize == 2:  # half precision: a float64 (else float32) copy is the reference, its own rounding apart
        probe, source = batches[0].to(model.W_E.device), model
        ref = in_eval_mode(model, lambda: half_precision_reference(
            model, lambda source: source(probe), "from_transformer_lens", accept_source_precision, _exact_rotary_tables))
        accepted = held if ref.copied_in is None else None
        own = None if ref.copied_in is None else HeldSource(lambda t, first: as_held(source, t, first), dtype, ref.copied_in)
        model, dtype, label = ref.model, ref.precision, ref.label
    name = f"HookedTransformer (TransformerLens, {held}{label})"
    if model.cfg.positional_embedding_type == "alibi" or model.cfg.num_experts:
        dtype = lowest_precision(dtype, torch.float32)  # its ALiBi bias and its routing softmax are float32 whatever its dtype
    calls, notes = plain_calls(model, lambda tokens: model(tokens.to(model.W_E.device)), "model(tokens)", training)
    as_called = AsCalled(calls, notes, added, "in run_with_cache")
    check = in_eval_mode(model, lambda: check_against_source(ours, run, name, dtype, batches, suspects, "from_transformer_lens",
                                                             own, lambda: _its_rotary_tables(model), as_called))
    return replace(check, accepted_at=accepted)


def _its_rotary_tables(model: Any):
    """A context in which the conversion rotates by the ``HookedTransformer``'s own tables (its first layer's ``cos``
    and ``sin`` buffers, one column per rotated plane: every layer's are the same, as the conversion checked), made
    by its own code in its own precision; where it has none, Hugging Face's float32 angles."""
    if model.cfg.positional_embedding_type != "rotary":
        return tables_rounded_to(torch.float32)
    attn, half = model.blocks[0].attn, model.cfg.rotary_dim // 2
    planes = torch.arange(half, device=attn.rotary_cos.device) * (2 if model.cfg.rotary_adjacent_pairs else 1)
    return tables_given(f64(attn.rotary_cos[:, planes]), f64(attn.rotary_sin[:, planes]))


def _exact_rotary_tables(copied: Any) -> Any | None:
    """A float64 (or float32) copy of a half-precision ``HookedTransformer`` with its rotary sin/cos tables made again
    in float64 by its own attention modules and held in the copy's precision (the half-precision tables are its
    rounding, per position: no frequency gives them); None when they cannot be made again."""
    if copied is None or copied.cfg.positional_embedding_type != "rotary":
        return copied
    try:
        for block in copied.blocks:
            attn = block.attn
            sin, cos = _tables_in_float64(attn, copied.cfg, attn.rotary_sin.shape[0])
            attn.rotary_sin = sin.to(attn.rotary_sin.device, attn.rotary_sin.dtype)
            attn.rotary_cos = cos.to(attn.rotary_cos.device, attn.rotary_cos.dtype)
    except Exception:  # noqa: BLE001 - a TransformerLens whose tables are made otherwise: compared as it is
        return None
    return copied


def _tables_in_float64(attn: Any, cfg: Any, n_pos: int) -> tuple[Tensor, Tensor]:
    """An attention module's rotary ``(sin, cos)`` tables ``[n_pos, rotary_dim]`` made by its own code from its config
    (``rotary_base`` or the local layers' base, ``rotary_dim``, NTK-by-parts, YaRN, scaling factor) in float64."""
    base = attn._rotary_base() if hasattr(attn, "_rotary_base") else (
        cfg.rotary_base_local if getattr(cfg, "rotary_base_local", None) is not None
        and attn.attn_type == "local" else cfg.rotary_base)
    return attn.calculate_sin_cos_rotary(cfg.rotary_dim, n_pos, base=base, dtype=torch.float64)


#: The name a TransformerLens user types, as the command line's ``--tl``: :func:`from_transformer_lens` itself.
from_tl = from_transformer_lens


def to_transformer_lens(model: CircuitModel, dtype: str | torch.dtype | None = None) -> Any:
    """A TransformerLens ``HookedTransformer`` with ``model``'s weights and the same logits.

    For benchmarks and cross-checks. Layer norm becomes ``LNPre``, ``qk_only`` positions
    ``shortformer``, ``none`` positions a zero ``W_pos``; absent biases are zeros. Needs the
    same number of heads in every layer. ``dtype`` defaults to the model's.

    >>> from derivations.architecture import Architecture
    >>> ours = CircuitModel.random(Architecture(1, 2, layer_norm=True), d_model=8, d_head=4, d_vocab=10, n_ctx=4)
    >>> theirs = to_transformer_lens(ours)
    >>> tokens = torch.tensor([[1, 2, 3]])
    >>> torch.allclose(theirs(tokens), ours(tokens), atol=1e-5)
    True
    """
    from numeric_check.conversion.tl_folder import tl_class  # TransformerLens: an optional dependency (tcircuits[tl])

    HookedTransformer = tl_class("HookedTransformer", "to_transformer_lens builds")
    HookedTransformerConfig = tl_class("HookedTransformerConfig", "to_transformer_lens builds")
    from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

    arch, cfg = model.arch, model.cfg
    if arch.mlp and cfg.act_fn not in SUPPORTED_ACTIVATIONS:  # TransformerLens 2 has no relu2
        raise UnsupportedModel(f"this TransformerLens has no activation {cfg.act_fn!r} (it has "
                               f"{', '.join(sorted(SUPPORTED_ACTIVATIONS))})")
    features = [name for name, on in (("RMSNorm", arch.norm == "rms_norm"), ("grouped-query attention", arch.grouped),
                                      ("parallel attention and MLP", arch.parallel), ("rotary", arch.rotary is not None),
                                      ("a gated MLP", cfg.gated_mlp), ("q/k normalisation", arch.qk_norm is not None),
                                      ("norms after a sublayer", arch.post_norm), ("sliding windows", arch.window is not None),
                                      ("soft-caps", arch.attn_softcap is not None or arch.logit_softcap is not None),
                                      ("ALiBi", arch.alibi), ("experts", arch.experts is not None)) if on]
    if features:
        raise UnsupportedModel(f"to_transformer_lens writes models without {', '.join(features)}; this model has them")
    if not arch.uniform:
        raise UnsupportedModel(
            f"TransformerLens needs the same number of heads in every layer; this model has heads "
            f"{'/'.join(map(str, arch.heads_per_layer))}"
        )
    tl_cfg = HookedTransformerConfig(
        n_layers=arch.n_layers, d_model=cfg.d_model, d_head=cfg.d_head, n_heads=arch.heads_per_layer[0] if arch.n_layers else 1,
        d_vocab=cfg.d_vocab, n_ctx=cfg.n_ctx, d_mlp=cfg.d_mlp, act_fn=cfg.act_fn, attn_only=not arch.mlp,
        normalization_type="LNPre" if arch.layer_norm else None, eps=cfg.ln_eps,
        positional_embedding_type="shortformer" if arch.positional == "qk_only" else "standard",
        use_attn_scale=True, attn_scale=cfg.scale, dtype=resolve_dtype(dtype or model.dtype),
        device=str(model.device), init_weights=False, seed=None,
    )
    source = HookedTransformer(tl_cfg)
    state = _tl_state_dict(model)
    params = dict(source.named_parameters())
    if set(params) - set(state):  # a bug here, not the user's
        raise WeightError(f"to_transformer_lens left parameters unset: {sorted(set(params) - set(state))}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state[name])
    return source


def _tl_state_dict(model: CircuitModel) -> dict[str, Tensor]:
    """``model``'s weights under TransformerLens' names and row convention; absent ones as zeros."""
    zeros = lambda *shape: torch.zeros(*shape, dtype=model.dtype, device=model.device)
    or_zeros = lambda t, *shape: zeros(*shape) if t is None else t
    cfg = model.cfg
    state = {
        "embed.W_E": model.W_E.T,
        "pos_embed.W_pos": or_zeros(model.W_pos, cfg.d_model, cfg.n_ctx).T,
        "unembed.W_U": model.W_U.T,
        "unembed.b_U": or_zeros(model.b_U, cfg.d_vocab),
    }
    for i, block in enumerate(model.blocks):
        attn, p, h = block.attn, f"blocks.{i}.", block.attn.n_heads
        for name in ("Q", "K", "V"):
            state[f"{p}attn.W_{name}"] = getattr(attn, f"W_{name}").transpose(1, 2)  # [h, d_model, d_head]
            state[f"{p}attn.b_{name}"] = or_zeros(getattr(attn, f"b_{name}"), h, cfg.d_head)
        state[p + "attn.W_O"] = attn.W_O.transpose(1, 2)  # [h, d_head, d_model]
        state[p + "attn.b_O"] = or_zeros(attn.b_O, cfg.d_model)
        if block.mlp is not None:
            mlp = block.mlp
            state[p + "mlp.W_in"], state[p + "mlp.W_out"] = mlp.W_in.T, mlp.W_out.T
            state[p + "mlp.b_in"] = or_zeros(mlp.b_in, cfg.d_mlp)
            state[p + "mlp.b_out"] = or_zeros(mlp.b_out, cfg.d_model)
    return state


def _is_instance(obj: Any, module: str, name: str) -> bool:
    """isinstance against an optional dependency's class, without importing it."""
    mod = sys.modules.get(module)
    try:
        cls = getattr(mod, name, None) if mod is not None else None
    except ImportError:  # TransformerLens 4 raises ImportError for the names it removed (HookedTransformer)
        return False
    return isinstance(cls, type) and isinstance(obj, cls)


# --- TransformerLens -------------------------------------------------------------------------
_on = lambda v, c: bool(v)
_TL_FLAGS = [  # (config attribute, is-set test on (value, cfg), feature name)
    ("use_local_attn", lambda v, c: v and (c.attn_types is None or len(c.attn_types) != c.n_layers or not isinstance(c.window_size, int)),
     "local attention without attn_types for each layer and an int window_size"),
    ("final_rms", lambda v, c: v and c.normalization_type not in ("RMS", "RMSPre"), "RMSNorm (final_rms) after layer-norm blocks"),
    ("use_dynamic_ntk_rope", _on, "dynamic NTK rope scaling, whose frequencies change with the sequence length"),
    ("clip_qkv", lambda v, c: v is not None, "Q/K/V clipping (clip_qkv)"),
    ("use_logn_attn", _on, "log-n attention scaling"),
    ("use_attention_sinks", _on, "attention sinks"),
    ("scale_attn_by_inverse_layer_idx", _on, "attention scale that depends on the layer (scale_attn_by_inverse_layer_idx)"),
    ("attention_dir", lambda v, c: v != "causal", "bidirectional (non-causal) attention"),
    ("post_embedding_ln", _on, "layer norm after the embedding (post_embedding_ln)"),
    ("load_in_4bit", _on, "4-bit quantized weights"),
    ("original_architecture", lambda v, c: v not in _TL_GENERIC_ARCHITECTURES,
     "an original_architecture for which TransformerLens changes its computation (q/k norms, post-norm blocks, "
     "its own mixture of experts)"),
    ("d_vocab_out", lambda v, c: v not in (-1, c.d_vocab), "an output vocabulary of a different size (d_vocab_out != d_vocab)"),
]
#: original_architecture values for which TransformerLens 3.x runs its generic blocks (the
#: behaviour it changes for others — OLMo's q/k norms, post-norm blocks, GPT-OSS experts — is not read)
_TL_GENERIC_ARCHITECTURES = frozenset({
    None, "GPT2LMHeadModel", "GPTNeoXForCausalLM", "GPTJForCausalLM", "GPTNeoForCausalLM", "OPTForCausalLM",
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "GemmaForCausalLM", "PhiForCausalLM",
    "Phi3ForCausalLM", "StableLmForCausalLM", "BloomForCausalLM", "neel", "neel-solu-old", "mingpt",
})
#: config fields the adapter reads (or checks above); any other field off its default is refused
TL_OPTIONS = frozenset({
    "d_model", "d_head", "n_layers", "n_ctx", "n_heads", "d_mlp", "d_vocab", "d_vocab_out", "n_key_value_heads",
    "attn_only", "gated_mlp", "eps", "act_fn", "normalization_type", "positional_embedding_type", "use_attn_scale",
    "attn_scale", "rotary_dim", "rotary_base", "rotary_adjacent_pairs", "parallel_attn_mlp", "final_rms",
    "original_architecture", "use_qk_norm", "use_normalization_before_and_after", "use_local_attn", "window_size",
    "attn_types", "attn_scores_soft_cap", "output_logits_soft_cap", "num_experts", "experts_per_token", "norm_topk_prob",
    # rope scaling: the frequencies and the factor are read from the rotary embedding the model computes
    "use_NTK_by_parts_rope", "NTK_by_parts_factor", "NTK_by_parts_low_freq_factor", "NTK_by_parts_high_freq_factor",
    "NTK_original_ctx_len", "use_yarn_rope", "yarn_factor", "yarn_attention_factor", "yarn_beta_fast", "yarn_beta_slow",
    "yarn_original_max_position_embeddings", "yarn_truncate", "yarn_global_attn_only", "rotary_scaling_factor",
})
_TL_POSITIONAL = {"standard": "standard", "shortformer": "qk_only", "rotary": "none", "alibi": "none"}
_TL_POSITIONAL_NAMES = {"relative_positional_bias": "relative positional bias"}
_TL_NORMS = {"LN": "layer_norm", "LNPre": "layer_norm", "RMS": "rms_norm", "RMSPre": "rms_norm", None: "none"}


def _read_transformer_lens(model: Any) -> SourceWeights:
    cfg, source = model.cfg, "the TransformerLens model"
    for attr, is_set, feature in _TL_FLAGS:
        if is_set(getattr(cfg, attr, None), cfg):
            raise unsupported(feature, source)
    check_tl_options(cfg, TL_OPTIONS, source)
    kind = cfg.positional_embedding_type
    if kind not in _TL_POSITIONAL:
        raise unsupported(_TL_POSITIONAL_NAMES.get(kind, f"positional_embedding_type={kind!r}"), source)
    if cfg.normalization_type not in _TL_NORMS:
        raise unsupported(f"normalization_type {cfg.normalization_type!r}", source)
    if not cfg.attn_only and ACT_FN_ALIASES.get(cfg.act_fn) is None:
        raise unsupported(f"activation function {cfg.act_fn!r} (supported: {', '.join(ACT_FN_ALIASES)})", source)
    scales = {float(block.attn.attn_scale) for block in model.blocks}
    if len(scales) > 1:
        raise unsupported(f"attention scales that differ between layers ({sorted(scales)})", source)
    norms = [_tl_norm(block.ln1, f"blocks.{i}.ln1") for i, block in enumerate(model.blocks)]
    layers = []
    for i, block in enumerate(model.blocks):
        attn = block.attn
        # grouped-query attention keeps one key/value matrix per group in _W_K, _W_V, _b_K, _b_V
        names = [n if n[2] not in "KV" or not hasattr(attn, "_" + n) else "_" + n
                 for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")]
        layer = LayerWeights(*(f64(getattr(attn, n)) for n in names), ln1=norms[i])
        if cfg.use_qk_norm:  # one RMSNorm over d_head, shared by the heads, after hook_q / hook_k
            layer.q_norm, layer.k_norm = _tl_norm(attn.q_norm, f"blocks.{i}.attn.q_norm"), _tl_norm(attn.k_norm, f"blocks.{i}.attn.k_norm")
        if cfg.use_normalization_before_and_after:  # TransformerLens makes these RMSNorms (its LayerNorm case fails)
            layer.ln1_post = _tl_norm(block.ln1_post, f"blocks.{i}.ln1_post")[0]
            layer.ln2_post = None if cfg.attn_only else _tl_norm(block.ln2_post, f"blocks.{i}.ln2_post")[0]
        if not cfg.attn_only and cfg.num_experts:
            layer.ln2 = _tl_norm(block.ln2, f"blocks.{i}.ln2")
            layer.mlp = _tl_experts(block.mlp, cfg)
        elif not cfg.attn_only:
            layer.ln2 = _tl_norm(block.ln2, f"blocks.{i}.ln2")
            layer.mlp = {n: f64(getattr(block.mlp, n)) for n in ("W_in", "b_in", "W_out", "b_out")}
            if cfg.gated_mlp:  # TL: (act(x W_gate) * x W_in + b_in) W_out + b_out: b_in moves into b_out
                mlp = layer.mlp
                mlp["b_out"] = mlp["b_out"] + mlp["b_in"] @ mlp["W_out"]
                mlp["W_gate"], mlp["b_gate"], mlp["b_in"] = f64(block.mlp.W_gate), 0 * mlp["b_in"], 0 * mlp["b_in"]
        layers.append(layer)
    norm = _TL_NORMS[cfg.normalization_type]
    rotary = kind == "rotary"
    return SourceWeights(
        W_E=f64(model.embed.W_E),
        W_pos=f64(model.pos_embed.W_pos) if hasattr(model, "pos_embed") else None,  # none with rotary
        W_U=f64(model.unembed.W_U),
        b_U=f64(model.unembed.b_U),
        layers=layers,
        ln_final=_tl_norm(model.ln_final, "ln_final") if norm != "none" else None,
        positional=_TL_POSITIONAL[kind],
        layer_norm=norm == "layer_norm",
        norm=norm,
        parallel=bool(cfg.parallel_attn_mlp),
        rotary=cfg.rotary_dim / cfg.d_head if rotary else None,
        rotary_style="gptj" if rotary and cfg.rotary_adjacent_pairs else "neox",
        rotary_base=float(cfg.rotary_base) if rotary else 10000.0,
        act_fn=ACT_FN_ALIASES.get(cfg.act_fn, "gelu") if not cfg.attn_only else "gelu",
        eps=float(cfg.eps),
        attn_scale=scales.pop() if scales else math.sqrt(cfg.d_head),
        d_head=cfg.d_head,
        n_ctx=cfg.n_ctx,
        d_mlp=None if cfg.attn_only else cfg.d_mlp,
        **_tl_decoder_options(cfg, kind, model),
        **(_tl_rope_scaling(model, cfg) if rotary else {}),
    )


def _tl_rope_scaling(model: Any, cfg: Any) -> dict[str, Any]:
    """``rotary_inv_freq`` and ``rotary_factor`` as the model's config gives them (``rotary_base``, ``rotary_dim``,
    NTK-by-parts, YaRN, a scaling factor: its tables made again in float64 by its own code, each ``θ_f`` the angle
    at position 1, below π, the factor ``cos`` at position 0), or nothing when they are ``rotary_base``'s. Each
    layer's tables as held (half precision too) are checked against them, every position and plane, to the tables' own
    rounding there (:func:`~numeric_check.model.rotary.table_allowance`: that of the angle ``p·θ_f`` and of the sine
    in float32, and of the cast to the tables' dtype); tables that are not the config's, or frequencies that differ
    between layers, are refused."""
    half, rot = cfg.rotary_dim // 2, cfg.rotary_dim
    first = torch.arange(half, device="cpu") * 2 if cfg.rotary_adjacent_pairs else torch.arange(half, device="cpu")  # one column per plane
    found = set()
    for i, block in enumerate(model.blocks):
        held_sin, held_cos = f64(block.attn.rotary_sin), f64(block.attn.rotary_cos)
        sin, cos = (f64(t) for t in _tables_in_float64(block.attn, cfg, held_sin.shape[0]))
        theta = torch.atan2(sin[1], cos[1]).abs()  # θ_f of each column, the angle at position 1
        angles = torch.arange(held_sin.shape[0], dtype=torch.float64, device="cpu")[:, None] * theta
        scale, dtype = float(cos[0].abs().max().clamp(min=1.0)), block.attn.rotary_sin.dtype
        worst, position, column = max(table_excess(held, exact, angles, dtype, scale)
                                      for held, exact in ((held_sin, sin), (held_cos, cos)))
        if worst > 1:
            plane = column // 2 if cfg.rotary_adjacent_pairs else column % half
            raise unsupported(f"rotary tables that are not its config's (blocks.{i}.attn.rotary_sin/rotary_cos differ from "
                              f"the tables rotary_base, rotary_dim and its scaling give, by {worst:.2g} times "
                              f"their rounding at position {position}, plane {plane})", "the TransformerLens model")
        found.add((tuple(torch.atan2(sin[1, first], cos[1, first]).tolist()), float(cos[0, first].mean())))
    if len(found) > 1:
        raise unsupported("rotary frequencies that differ between layers (rope scaling on some layers only)",
                          "the TransformerLens model")
    (inv_freq, factor), = found
    plain = float(cfg.rotary_base) ** (-torch.arange(0, rot, 2, dtype=torch.float64, device="cpu") / rot)
    inv_freq = torch.tensor(inv_freq, dtype=torch.float64, device="cpu")
    if abs(factor - 1.0) < 1e-12 and torch.allclose(inv_freq, plain, rtol=1e-12, atol=0):
        return {}
    return {"rotary_inv_freq": inv_freq, "rotary_factor": factor}


def _tl_experts(moe: Any, cfg: Any) -> dict[str, Tensor]:
    """A TransformerLens ``MoE``: its router (``W_gate``, a Linear) and its gated experts (Linears, no biases),
    stacked first in the row convention (see :class:`~numeric_check.conversion.build.SourceWeights`)."""
    stack = lambda name: torch.stack([f64(getattr(e, name).weight).T for e in moe.experts])  # noqa: E731
    zeros = lambda n: torch.zeros(cfg.num_experts, n, dtype=torch.float64, device="cpu")  # noqa: E731
    return {"W_router": f64(moe.W_gate.weight).T, "W_in": stack("W_in"), "b_in": zeros(cfg.d_mlp),
            "W_gate": stack("W_gate"), "b_gate": zeros(cfg.d_mlp), "W_out": stack("W_out"), "b_out": zeros(cfg.d_model)}


def _tl_decoder_options(cfg: Any, kind: str, model: Any) -> dict[str, Any]:
    """The SourceWeights fields of TransformerLens' options of today's decoders: q/k norm, norms before
    and after each sublayer, local attention (each layer's ``attn_type`` as its module was built, not
    ``cfg.attn_types``), soft-caps, ALiBi (its slopes, ``2^(-8/n)`` to the power h+1)."""
    window = None
    if cfg.use_local_attn:
        window = tuple(_tl_window(block.attn, cfg) for block in model.blocks)
        window = window if any(window) else None
    cap = lambda c: float(c) if c is not None and c > 0 else None  # noqa: E731 - TransformerLens: off at <= 0
    slopes = None
    if kind == "alibi":  # TransformerLens' own slopes, 2^(-8/n) to the power h + 1 (in float32, as it uses them)
        from transformer_lens.components.abstract_attention import AbstractAttention  # optional dependency (tcircuits[tl])

        slopes = f64(AbstractAttention.create_alibi_multipliers(cfg.n_heads))
    return {"qk_norm": "rms_norm" if cfg.use_qk_norm else None,
            "sublayer_norm": "both" if cfg.use_normalization_before_and_after else "pre", "window": window,
            "attn_softcap": cap(cfg.attn_scores_soft_cap), "logit_softcap": cap(cfg.output_logits_soft_cap),
            "alibi_slopes": slopes, "experts_top_k": cfg.experts_per_token if cfg.num_experts else 1,
            "moe_renormalise": bool(getattr(cfg, "norm_topk_prob", True))}  # TransformerLens 2: always


def _tl_window(attn: Any, cfg: Any) -> int | None:
    """A layer's window as its attention computes it: None for a global layer (``attn_type``, fixed at construction);
    a local one keeps ``i − j < w``: TransformerLens 2's banded ``mask`` buffer (built from the window then),
    TransformerLens 3's ``cfg.window_size`` (read at each forward)."""
    if getattr(attn, "attn_type", "global") != "local":
        return None
    mask = getattr(attn, "mask", None)
    if isinstance(mask, Tensor) and mask.ndim == 2 and mask.numel():
        return int(mask[-1].sum())
    return cfg.window_size


def _tl_norm(module: Any, where: str) -> LayerNormWeights:
    """(w, b) of a TL ``LayerNorm`` or ``RMSNorm`` (b zero); None for ``LayerNormPre``, ``RMSNormPre`` or no norm."""
    name = type(module).__name__
    if name == "LayerNorm":
        return f64(module.w), f64(module.b)
    if name == "RMSNorm":
        return f64(module.w), torch.zeros_like(f64(module.w))
    if name in ("LayerNormPre", "RMSNormPre", "Identity"):
        return None
    raise unsupported(f"a {name} at {where}", "the TransformerLens model")
