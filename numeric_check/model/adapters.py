"""Adapters: a TransformerLens ``HookedTransformer`` or a Hugging Face ``GPT2LMHeadModel`` as a :class:`CircuitModel`.

Both sources are first read into :class:`SourceWeights` (TransformerLens' row convention,
float64), then folded and transposed into the paper's convention:

- Layer-norm gain ``w`` and bias ``b`` fold into the weights that read the norm, as
  TransformerLens' ``fold_layer_norm`` does: ``(n(x) w + b) W + c = n(x) (diag(w) W) + (b W + c)``.
  Our layer norm is then parameter-free (centre and scale only).
- With layer norm, every weight writing to the residual stream is centred over ``d_model``
  (``W_E``, ``W_pos`` when added to the stream, ``W_O``, ``b_O``, ``W_out``, ``b_out``);
  exact because every reader of the stream is a centring layer norm.
- Value biases stay as ``b_V`` (:meth:`CircuitModel.folded_b_O` folds them when wanted).
- Shortformer positions (TransformerLens adds ``W_pos`` to the query and key inputs *after*
  ``ln1``, un-normed) become ``qk_only``. A gain ``w`` of ``ln1`` then folds into ``W_pos``
  as ``W_pos / w``; possible only when every layer's ``ln1`` gain is the same and non-zero.

- TransformerLens' RMSNorm (``RMS``/``RMSPre``), grouped-query attention (``_W_K``, ``_W_V`` per
  group), parallel blocks, rotary (``rotary_adjacent_pairs``: GPT-J's pairing) and gated MLPs
  are read as such; its gated MLP adds ``b_in`` after the gate's product, so ``b_in W_out``
  moves into ``b_out``. Other Hugging Face families: :func:`numeric_check.model.hf.from_hf`.

Features the algebra cannot express raise :class:`UnsupportedModel` naming them.
The source model is never modified.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from derivations.architecture import Architecture
from numeric_check.errors import UnsupportedModel, WeightError
from numeric_check.model.circuit_model import CircuitModel

# source activation names -> ours; gelu_pytorch_tanh is gelu_new's formula, gelu_fast the same
from numeric_check.model.config import ModelConfig, resolve_device, resolve_dtype
# formula with sqrt(2/pi) rounded to 10 digits (relative difference ~1e-12)
ACT_FN_ALIASES = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu", "gelu_pytorch_tanh": "gelu_new", "gelu_fast": "gelu_new",
                  "silu": "silu", "swish": "silu"}

LayerNormWeights = tuple[Tensor, Tensor] | None  # (w, b); None for a parameter-free norm


@dataclass
class LayerWeights:
    """One block in TransformerLens' convention: ``W_Q [h, d_model, d_head]``, ``W_O [h, d_head, d_model]``;
    ``W_K``, ``W_V`` ``[g, d_model, d_head]`` with ``g`` key/value heads (``g = h`` without grouping)."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    b_Q: Tensor
    b_K: Tensor
    b_V: Tensor
    b_O: Tensor
    ln1: LayerNormWeights = None
    ln2: LayerNormWeights = None
    mlp: dict[str, Tensor] | None = None  # W_in [d_model, d_mlp], b_in, W_out [d_mlp, d_model], b_out (+ W_gate, b_gate)


@dataclass
class SourceWeights:
    """A source model's weights in TransformerLens' row convention, before folding."""

    W_E: Tensor  # [d_vocab, d_model]
    W_pos: Tensor | None  # [n_ctx, d_model]
    W_U: Tensor  # [d_model, d_vocab]
    b_U: Tensor  # [d_vocab]
    layers: list[LayerWeights]
    ln_final: LayerNormWeights
    positional: str  # "none", "standard", "qk_only"
    layer_norm: bool
    act_fn: str
    eps: float
    attn_scale: float
    d_head: int
    n_ctx: int
    d_mlp: int | None = None
    norm: str | None = None  # "layer_norm", "rms_norm" or "none"; None: from layer_norm
    parallel: bool = False  # attention and MLP read the same stream
    rotary: float | None = None  # the fraction of each head rotated by position
    rotary_style: str = "neox"
    rotary_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.norm is None:
            self.norm = "layer_norm" if self.layer_norm else "none"
        self.layer_norm = self.norm == "layer_norm"


def from_transformer_lens(model: Any, dtype: str | torch.dtype = torch.float64, device: str | torch.device | None = None, biases: bool | None = None) -> CircuitModel:
    """A :class:`CircuitModel` computing the same logits as a TransformerLens ``HookedTransformer``.

    ``dtype`` of the result (folding is done in float64); ``device`` defaults to the source's.
    ``biases``: ``None`` keeps biases only when some folded bias is non-zero; ``True`` always
    keeps them; ``False`` requires them all to be zero.

    >>> from transformer_lens import HookedTransformer, HookedTransformerConfig
    >>> tl = HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_head=4,
    ...     n_heads=2, d_vocab=10, attn_only=True, normalization_type=None))
    >>> from_transformer_lens(tl).arch
    Architecture(n_layers=1, n_heads=2, positional='standard', layer_norm=False, biases=False, mlp=False...)
    """
    if not _is_instance(model, "transformer_lens", "HookedTransformer"):
        raise UnsupportedModel(
            f"from_transformer_lens expects a transformer_lens.HookedTransformer, got {type(model).__name__}"
        )
    return _build(_read_transformer_lens(model), dtype, device or model.W_E.device, biases)


def from_hf_gpt2(model: Any, dtype: str | torch.dtype = torch.float64, device: str | torch.device | None = None, biases: bool | None = None) -> CircuitModel:
    """A :class:`CircuitModel` computing the same logits as a Hugging Face ``GPT2LMHeadModel``.

    Arguments as for :func:`from_transformer_lens`.

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> hf = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=4, vocab_size=10,
    ...     bos_token_id=0, eos_token_id=0))
    >>> from_hf_gpt2(hf).arch.describe()  # freshly initialised: all biases zero, so none kept
    '1 layer x 2 heads, standard positions, layer norm, MLPs'
    """
    if not _is_instance(model, "transformers", "GPT2LMHeadModel"):
        raise UnsupportedModel(f"from_hf_gpt2 expects a transformers.GPT2LMHeadModel, got {type(model).__name__}")
    return _build(_read_hf_gpt2(model), dtype, device or model.lm_head.weight.device, biases)


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
    from transformer_lens import HookedTransformer, HookedTransformerConfig  # optional dependency (tcircuits[tl])

    arch, cfg = model.arch, model.cfg
    features = [name for name, on in (("RMSNorm", arch.norm == "rms_norm"), ("grouped-query attention", arch.grouped),
                                      ("parallel attention and MLP", arch.parallel), ("rotary", arch.rotary is not None),
                                      ("a gated MLP", cfg.gated_mlp)) if on]
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
    cls = getattr(mod, name, None) if mod is not None else None
    return cls is not None and isinstance(obj, cls)


def _f64(t: Tensor) -> Tensor:
    return t.detach().to(torch.float64, copy=True)


# --- TransformerLens -------------------------------------------------------------------------
_on = lambda v, c: bool(v)
_TL_FLAGS = [  # (config attribute, is-set test on (value, cfg), feature name)
    ("use_local_attn", _on, "local (windowed) attention"),
    ("final_rms", lambda v, c: v and c.normalization_type not in ("RMS", "RMSPre"), "RMSNorm (final_rms) after layer-norm blocks"),
    ("use_NTK_by_parts_rope", _on, "rope scaling (use_NTK_by_parts_rope)"),
    ("num_experts", lambda v, c: v is not None, "mixture-of-experts MLP"),
    ("use_qk_norm", _on, "QK normalization"),
    ("clip_qkv", lambda v, c: v is not None, "Q/K/V clipping (clip_qkv)"),
    ("use_logn_attn", _on, "log-n attention scaling"),
    ("use_attention_sinks", _on, "attention sinks"),
    ("scale_attn_by_inverse_layer_idx", _on, "attention scale that depends on the layer (scale_attn_by_inverse_layer_idx)"),
    ("attention_dir", lambda v, c: v != "causal", "bidirectional (non-causal) attention"),
    ("post_embedding_ln", _on, "layer norm after the embedding (post_embedding_ln)"),
    ("use_normalization_before_and_after", _on, "normalization after attention/MLP outputs (use_normalization_before_and_after)"),
    ("attn_scores_soft_cap", lambda v, c: v is not None and v > 0, "attention-score soft-capping"),
    ("output_logits_soft_cap", lambda v, c: v is not None and v > 0, "output-logit soft-capping"),
    ("load_in_4bit", _on, "4-bit quantized weights"),
    ("original_architecture", lambda v, c: v in ("Olmo2ForCausalLM", "Olmo3ForCausalLM"), "post-norm blocks"),
    ("d_vocab_out", lambda v, c: v not in (-1, c.d_vocab), "an output vocabulary of a different size (d_vocab_out != d_vocab)"),
]
_TL_POSITIONAL = {"standard": "standard", "shortformer": "qk_only", "rotary": "none"}
_TL_POSITIONAL_NAMES = {"alibi": "ALiBi positional biases", "relative_positional_bias": "relative positional bias"}
_TL_NORMS = {"LN": "layer_norm", "LNPre": "layer_norm", "RMS": "rms_norm", "RMSPre": "rms_norm", None: "none"}


def _unsupported(feature: str, source: str) -> UnsupportedModel:
    return UnsupportedModel(f"{source} uses {feature}, which CircuitModel cannot express")


def _read_transformer_lens(model: Any) -> SourceWeights:
    cfg, source = model.cfg, "the TransformerLens model"
    for attr, is_set, feature in _TL_FLAGS:
        if is_set(getattr(cfg, attr, None), cfg):
            raise _unsupported(feature, source)
    kind = cfg.positional_embedding_type
    if kind not in _TL_POSITIONAL:
        raise _unsupported(_TL_POSITIONAL_NAMES.get(kind, f"positional_embedding_type={kind!r}"), source)
    if cfg.normalization_type not in _TL_NORMS:
        raise _unsupported(f"normalization_type {cfg.normalization_type!r}", source)
    if not cfg.attn_only and ACT_FN_ALIASES.get(cfg.act_fn) is None:
        raise _unsupported(f"activation function {cfg.act_fn!r} (supported: {', '.join(ACT_FN_ALIASES)})", source)
    scales = {float(block.attn.attn_scale) for block in model.blocks}
    if len(scales) > 1:
        raise _unsupported(f"attention scales that differ between layers ({sorted(scales)})", source)
    norms = [_tl_norm(block.ln1, f"blocks.{i}.ln1") for i, block in enumerate(model.blocks)]
    layers = []
    for i, block in enumerate(model.blocks):
        attn = block.attn
        # grouped-query attention keeps one key/value matrix per group in _W_K, _W_V, _b_K, _b_V
        names = [n if n[2] not in "KV" or not hasattr(attn, "_" + n) else "_" + n
                 for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")]
        layer = LayerWeights(*(_f64(getattr(attn, n)) for n in names), ln1=norms[i])
        if not cfg.attn_only:
            layer.ln2 = _tl_norm(block.ln2, f"blocks.{i}.ln2")
            layer.mlp = {n: _f64(getattr(block.mlp, n)) for n in ("W_in", "b_in", "W_out", "b_out")}
            if cfg.gated_mlp:  # TL: (act(x W_gate) * x W_in + b_in) W_out + b_out: b_in moves into b_out
                mlp = layer.mlp
                mlp["b_out"] = mlp["b_out"] + mlp["b_in"] @ mlp["W_out"]
                mlp["W_gate"], mlp["b_gate"], mlp["b_in"] = _f64(block.mlp.W_gate), 0 * mlp["b_in"], 0 * mlp["b_in"]
        layers.append(layer)
    norm = _TL_NORMS[cfg.normalization_type]
    rotary = kind == "rotary"
    return SourceWeights(
        W_E=_f64(model.embed.W_E),
        W_pos=_f64(model.pos_embed.W_pos) if hasattr(model, "pos_embed") else None,  # none with rotary
        W_U=_f64(model.unembed.W_U),
        b_U=_f64(model.unembed.b_U),
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
    )


def _tl_norm(module: Any, where: str) -> LayerNormWeights:
    """(w, b) of a TL ``LayerNorm`` or ``RMSNorm`` (b zero); None for ``LayerNormPre``, ``RMSNormPre`` or no norm."""
    name = type(module).__name__
    if name == "LayerNorm":
        return _f64(module.w), _f64(module.b)
    if name == "RMSNorm":
        return _f64(module.w), torch.zeros_like(_f64(module.w))
    if name in ("LayerNormPre", "RMSNormPre", "Identity"):
        return None
    raise _unsupported(f"a {name} at {where}", "the TransformerLens model")


# --- Hugging Face GPT-2 ----------------------------------------------------------------------
def _read_hf_gpt2(model: Any) -> SourceWeights:
    config, source = model.config, "the GPT-2 model"
    if getattr(config, "add_cross_attention", False):
        raise _unsupported("cross-attention (add_cross_attention)", source)
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise _unsupported("attention scale that depends on the layer (scale_attn_by_inverse_layer_idx)", source)
    act_fn = ACT_FN_ALIASES.get(config.activation_function)
    if act_fn is None:
        raise _unsupported(f"activation function {config.activation_function!r} (supported: {', '.join(ACT_FN_ALIASES)})", source)
    d_model, n_heads = config.n_embd, config.n_head
    d_head = d_model // n_heads
    split = lambda w: w.reshape(d_model, n_heads, d_head).permute(1, 0, 2)  # [d_model, h*e] -> [h, d_model, e]
    layers = []
    for block in model.transformer.h:
        W_q, W_k, W_v = _f64(block.attn.c_attn.weight).split(d_model, dim=1)  # Conv1D: x @ W + b
        b_q, b_k, b_v = _f64(block.attn.c_attn.bias).split(d_model)
        layers.append(LayerWeights(
            W_Q=split(W_q), W_K=split(W_k), W_V=split(W_v),
            W_O=_f64(block.attn.c_proj.weight).reshape(n_heads, d_head, d_model),
            b_Q=b_q.reshape(n_heads, d_head), b_K=b_k.reshape(n_heads, d_head), b_V=b_v.reshape(n_heads, d_head),
            b_O=_f64(block.attn.c_proj.bias),
            ln1=(_f64(block.ln_1.weight), _f64(block.ln_1.bias)),
            ln2=(_f64(block.ln_2.weight), _f64(block.ln_2.bias)),
            mlp={"W_in": _f64(block.mlp.c_fc.weight), "b_in": _f64(block.mlp.c_fc.bias),
                 "W_out": _f64(block.mlp.c_proj.weight), "b_out": _f64(block.mlp.c_proj.bias)},
        ))
    lm_head = model.lm_head
    return SourceWeights(
        W_E=_f64(model.transformer.wte.weight),
        W_pos=_f64(model.transformer.wpe.weight),
        W_U=_f64(lm_head.weight).T,
        b_U=_f64(lm_head.bias) if lm_head.bias is not None else torch.zeros(config.vocab_size, dtype=torch.float64),
        layers=layers,
        ln_final=(_f64(model.transformer.ln_f.weight), _f64(model.transformer.ln_f.bias)),
        positional="standard",
        layer_norm=True,
        act_fn=act_fn,
        eps=float(config.layer_norm_epsilon),
        attn_scale=math.sqrt(d_head) if config.scale_attn_weights else 1.0,
        d_head=d_head,
        n_ctx=config.n_positions,
        d_mlp=config.n_inner if config.n_inner is not None else 4 * d_model,
    )


# --- folding and building --------------------------------------------------------------------
def _fold_norm(norm: LayerNormWeights, W: Tensor, b: Tensor, axis: int) -> tuple[Tensor, Tensor]:
    """``(n w + nb) W + b = n (diag(w) W) + (nb W + b)``; ``axis`` of ``W`` is the d_model (input) axis."""
    if norm is None:
        return W, b
    w, nb = norm
    shape = [1] * W.ndim
    shape[axis] = -1
    return W * w.reshape(shape), b + torch.tensordot(nb, W, dims=([0], [axis]))


def _centre(t: Tensor, axis: int) -> Tensor:
    return t - t.mean(axis, keepdim=True)


def _fold_positions(src: SourceWeights) -> Tensor | None:
    """W_pos [n_ctx, d_model] with the shortformer ln1 gain divided out (see module docstring)."""
    if src.positional != "qk_only" or not src.layer_norm or not src.layers or src.layers[0].ln1 is None:
        return src.W_pos
    gains = [layer.ln1[0] if layer.ln1 is not None else None for layer in src.layers]
    if any(g is None or not torch.equal(g, gains[0]) for g in gains) or (gains[0] == 0).any():
        raise UnsupportedModel(
            "shortformer positions with ln1 gains that differ between layers (or are zero): TransformerLens "
            "adds W_pos after the gain, so the gains cannot be folded into a shared W_pos; use LNPre or equal gains"
        )
    return src.W_pos / gains[0]


def _build(src: SourceWeights, dtype: Any, device: Any, biases: bool | None) -> CircuitModel:
    dtype = resolve_dtype(dtype)
    centre = _centre if src.layer_norm else (lambda t, axis: t)
    W_pos = _fold_positions(src)
    if src.positional == "standard":
        W_pos = centre(W_pos, 1)
    W_U, b_U = _fold_norm(src.ln_final, src.W_U, src.b_U, 0)
    paper: dict[str, Tensor] = {"W_E": centre(src.W_E, 1).T, "W_U": W_U.T, "b_U": b_U}
    if W_pos is not None and src.positional != "none":
        paper["W_pos"] = W_pos.T
    for i, layer in enumerate(src.layers):
        p = f"blocks.{i}."
        for name in ("Q", "K", "V"):
            W, b = _fold_norm(layer.ln1, getattr(layer, f"W_{name}"), getattr(layer, f"b_{name}"), 1)
            paper[f"{p}attn.W_{name}"], paper[f"{p}attn.b_{name}"] = W.transpose(1, 2), b  # [h, d_head, d_model]
        paper[p + "attn.W_O"] = centre(layer.W_O, 2).transpose(1, 2)  # [h, d_model, d_head]
        paper[p + "attn.b_O"] = centre(layer.b_O, 0)
        if layer.mlp is not None:
            W_in, b_in = _fold_norm(layer.ln2, layer.mlp["W_in"], layer.mlp["b_in"], 0)
            paper[p + "mlp.W_in"], paper[p + "mlp.b_in"] = W_in.T, b_in  # [d_mlp, d_model]
            if "W_gate" in layer.mlp:
                W_gate, b_gate = _fold_norm(layer.ln2, layer.mlp["W_gate"], layer.mlp["b_gate"], 0)
                paper[p + "mlp.W_gate"], paper[p + "mlp.b_gate"] = W_gate.T, b_gate
            paper[p + "mlp.W_out"] = centre(layer.mlp["W_out"], 1).T  # [d_model, d_mlp]
            paper[p + "mlp.b_out"] = centre(layer.mlp["b_out"], 0)
    has_biases = _decide_biases(paper, biases)
    if not has_biases:
        paper = {k: v for k, v in paper.items() if not k.rsplit(".", 1)[-1].startswith("b_")}
    d_vocab, d_model = paper["W_U"].shape
    heads = tuple(layer.W_Q.shape[0] for layer in src.layers)
    kv_heads = tuple(layer.W_K.shape[0] for layer in src.layers)
    mlp = bool(src.layers) and src.layers[0].mlp is not None
    arch = Architecture(len(src.layers), heads[0] if len(set(heads)) == 1 else heads or 1,
                        positional=src.positional, norm=src.norm, biases=has_biases, mlp=mlp,
                        n_kv_heads=None if kv_heads == heads else (kv_heads[0] if len(set(kv_heads)) == 1 else kv_heads),
                        parallel=src.parallel and mlp, rotary=src.rotary, rotary_style=src.rotary_style)
    scale = None if math.isclose(src.attn_scale, math.sqrt(src.d_head), rel_tol=1e-12) else src.attn_scale
    cfg = ModelConfig(arch, d_model=d_model, d_head=src.d_head, d_vocab=d_vocab, n_ctx=src.n_ctx,
                      d_mlp=src.d_mlp if arch.mlp else None, act_fn=src.act_fn, ln_eps=src.eps, attn_scale=scale,
                      gated_mlp=mlp and "W_gate" in src.layers[0].mlp, rotary_base=src.rotary_base)
    model = CircuitModel(cfg, dtype=torch.float64, device="cpu")
    missing = model.load_state_dict({k: v.cpu() for k, v in paper.items()}, strict=False)
    if missing.missing_keys or missing.unexpected_keys:  # a bug here, not the user's
        raise WeightError(f"adapter produced mismatched weights: missing {missing.missing_keys}, unexpected {missing.unexpected_keys}")
    return model.to(device=resolve_device(device), dtype=dtype)


def _decide_biases(paper: dict[str, Tensor], biases: bool | None) -> bool:
    nonzero = [k for k, v in paper.items() if k.rsplit(".", 1)[-1].startswith("b_") and bool(v.any())]
    if biases is None:
        return bool(nonzero)
    if biases is False and nonzero:
        raise UnsupportedModel(f"biases=False but the model has non-zero (folded) biases: {', '.join(nonzero[:5])}")
    return bool(biases)
