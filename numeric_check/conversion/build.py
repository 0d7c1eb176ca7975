"""The public layer every reader builds on: a source's weights as :class:`SourceWeights`
(TransformerLens' row convention, float64), folded and transposed into a :class:`CircuitModel`
in the paper's convention by :func:`build`.

A reader (TransformerLens in :mod:`numeric_check.conversion.adapters`, each Hugging Face family in
:mod:`numeric_check.conversion.readers`) fills in a :class:`SourceWeights`; :func:`build` then

- folds each norm's gain ``w`` and bias ``b`` into the weights that read it, as
  TransformerLens' ``fold_layer_norm`` does: ``(n(x) w + b) W + c = n(x) (diag(w) W) + (b W + c)``
  (:func:`fold_norm`); our norm is then parameter-free (centre and scale, or scale only);
- with layer norm, centres every weight that writes to the residual stream over ``d_model``
  (``W_E``, ``W_pos`` when added to the stream, ``W_O``, ``b_O``, ``W_out``, ``b_out``); exact
  because every reader of the stream is a centring layer norm;
- keeps value biases as ``b_V`` (:meth:`CircuitModel.folded_b_O` folds them when wanted);
- turns shortformer positions (added to the query and key inputs after ``ln1``, un-normed)
  into ``qk_only``, dividing out a shared ``ln1`` gain (:func:`fold_positions`).

Nothing here reads a source model, and the source is never modified.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from derivations.architecture import Architecture
from numeric_check.errors import DeviceError, UnsupportedModel, WeightError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.config import ModelConfig, resolve_device, resolve_dtype

# source activation names -> ours; gelu_pytorch_tanh is gelu_new's formula, gelu_fast the same
# formula with sqrt(2/pi) rounded to 10 digits (relative difference ~1e-12)
ACT_FN_ALIASES = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu", "gelu_pytorch_tanh": "gelu_new", "gelu_fast": "gelu_new",
                  "silu": "silu", "swish": "silu", "relu2": "relu2"}

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
    # q/k normalisation (SourceWeights.qk_norm): (gain, bias) of the norm of the queries / keys, each
    # [d_head] (one norm shared by the heads), [heads, d_head] or [heads * d_head] (heads: query heads for
    # q_norm, key/value heads for k_norm); bias zeros for RMSNorm
    q_norm: LayerNormWeights = None
    k_norm: LayerNormWeights = None
    # norms after a sublayer (SourceWeights.sublayer_norm "post" or "both"): the RMSNorm gain [d_model]
    # of the attention output (ln1_post) and of the MLP output (ln2_post), as the source applies it
    ln1_post: Tensor | None = None
    ln2_post: Tensor | None = None


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
    # the decoder options of issue 18 (see derivations.Architecture for each)
    qk_norm: str | None = None  # "rms_norm" or "layer_norm": LayerWeights.q_norm / k_norm are read
    qk_norm_scope: str = "head"  # "head" (over d_head) or "all" (over all heads at once, OLMo 2)
    sublayer_norm: str = "pre"  # "pre", "post" (OLMo 2: ln1/ln2 None) or "both" (Gemma 2): ln1_post / ln2_post read
    window: int | tuple[int | None, ...] | None = None  # a sliding window for every layer, or one per layer (None: global)
    attn_softcap: float | None = None  # c of c·tanh(s/c) on the scaled scores (Gemma 2: 50)
    logit_softcap: float | None = None  # c of c·tanh(x/c) on the logits (Gemma 2: 30)
    alibi_slopes: Tensor | None = None  # ALiBi: one slope per head (scores + m_h (j - i)); None: no ALiBi
    alibi_rounding: str | None = None  # the dtype the bias is made in, then divided by alibi_divisor (Falcon's)
    alibi_divisor: float = 1.0
    # rope scaling (linear, llama3, YaRN, dynamic NTK at the length converted): the rotary embedding's own
    # inverse frequencies [rot_dims / 2] (None: rotary_base's) and attention factor (Hugging Face's attention_scaling)
    rotary_inv_freq: Tensor | None = None
    rotary_factor: float = 1.0
    # mixture-of-experts MLPs (LayerWeights.mlp holds W_router and the experts stacked first): the experts
    # each position goes to, and whether their routing weights are renormalised to sum to 1 (Mixtral) or not (OLMoE)
    experts_top_k: int = 1
    moe_renormalise: bool = True

    def __post_init__(self) -> None:
        if self.norm is None:
            self.norm = "layer_norm" if self.layer_norm else "none"
        self.layer_norm = self.norm == "layer_norm"


def f64(t: Tensor) -> Tensor:
    """A float64 copy of ``t`` on the CPU, detached (the source's tensor is never touched): conversion
    reads the source, wherever it lives, into CPU float64, folds there, and moves the result once."""
    return t.detach().to(device="cpu", dtype=torch.float64, copy=True)


def on_one_device(model: Any, source: str) -> None:
    """Refuse a source whose parameters are spread over several devices without a device map to run
    it (Hugging Face's ``hf_device_map``): it could not be run beside its conversion."""
    devices = sorted({str(p.device) for p in model.parameters()})
    if len(devices) > 1 and not getattr(model, "hf_device_map", None):
        raise DeviceError(f"{source} is split across {' and '.join(devices)} without a device map to run it; put it "
                          "on one device first (model.to('cuda') or model.to('cpu')); tcircuits reads it into the CPU "
                          "and moves the result to --device either way")


def on_cpu(src: SourceWeights) -> SourceWeights:
    """``src`` with every tensor in CPU float64, whatever device a reader read it from (a reader that
    forgot :func:`f64`, a buffer such as ALiBi's slopes): :func:`build` folds on the CPU only."""
    def conv(value: Any) -> Any:
        if isinstance(value, Tensor):
            return value if value.device.type == "cpu" and value.dtype == torch.float64 else f64(value)
        if isinstance(value, (list, tuple)):
            return type(value)(conv(v) for v in value)
        if isinstance(value, dict):
            return {k: conv(v) for k, v in value.items()}
        if isinstance(value, LayerWeights):
            return LayerWeights(**{f.name: conv(getattr(value, f.name)) for f in fields(value)})
        return value
    return SourceWeights(**{f.name: conv(getattr(src, f.name)) for f in fields(src)})


def unsupported(feature: str, source: str) -> UnsupportedModel:
    """The error for a feature the algebra cannot express: ``"{source} uses {feature}, which ..."``."""
    return UnsupportedModel(f"{source} uses {feature}, which CircuitModel cannot express")


def fold_norm(norm: LayerNormWeights, W: Tensor, b: Tensor, axis: int) -> tuple[Tensor, Tensor]:
    """``(n w + nb) W + b = n (diag(w) W) + (nb W + b)``; ``axis`` of ``W`` is the d_model (input) axis."""
    if norm is None:
        return W, b
    w, nb = norm
    shape = [1] * W.ndim
    shape[axis] = -1
    return W * w.reshape(shape), b + torch.tensordot(nb, W, dims=([0], [axis]))


def centre(t: Tensor, axis: int) -> Tensor:
    return t - t.mean(axis, keepdim=True)


def fold_positions(src: SourceWeights) -> Tensor | None:
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


def check_shapes(src: SourceWeights) -> None:
    """Every tensor of ``src`` has the shape its sizes say (``d_vocab``, ``d_model`` from ``W_E``;
    ``d_head``, ``n_ctx``, ``d_mlp`` from the config), or a :class:`WeightError` names the first
    that does not — a config edited after the model was built describes other weights."""
    d_vocab, d_model = src.W_E.shape if src.W_E.ndim == 2 else (None, None)
    if d_vocab is None:
        raise WeightError(f"the token embedding has shape {tuple(src.W_E.shape)}; expected [d_vocab, d_model]")
    expected: list[tuple[str, Tensor | None, tuple[int, ...]]] = [
        ("W_U", src.W_U, (d_model, d_vocab)), ("b_U", src.b_U, (d_vocab,)), ("W_pos", src.W_pos, (src.n_ctx, d_model))]
    if src.ln_final is not None:
        expected += [("ln_final.w", src.ln_final[0], (d_model,)), ("ln_final.b", src.ln_final[1], (d_model,))]
    for i, layer in enumerate(src.layers):
        h, g, e = layer.W_Q.shape[0], layer.W_K.shape[0], src.d_head
        if g == 0 or h % g:
            raise WeightError(f"layer {i} has {h} query heads and {g} key/value heads; expected a divisor of {h}")
        p = f"layer {i} "
        expected += [(p + "W_Q", layer.W_Q, (h, d_model, e)), (p + "W_K", layer.W_K, (g, d_model, e)),
                     (p + "W_V", layer.W_V, (g, d_model, e)), (p + "W_O", layer.W_O, (h, e, d_model)),
                     (p + "b_Q", layer.b_Q, (h, e)), (p + "b_K", layer.b_K, (g, e)), (p + "b_V", layer.b_V, (g, e)),
                     (p + "b_O", layer.b_O, (d_model,))]
        for name, norm in (("ln1", layer.ln1), ("ln2", layer.ln2)):
            if norm is not None:
                expected += [(p + name + ".w", norm[0], (d_model,)), (p + name + ".b", norm[1], (d_model,))]
        if layer.mlp is not None:
            m = src.d_mlp
            shapes = {"W_in": (d_model, m), "b_in": (m,), "W_gate": (d_model, m), "b_gate": (m,),
                      "W_out": (m, d_model), "b_out": (d_model,)}
            if "W_router" in layer.mlp:  # a mixture of experts: each expert's weights stacked first
                E = layer.mlp["W_router"].shape[-1]
                shapes = {"W_router": (d_model, E), **{k: (E, *v) for k, v in shapes.items()}}
            expected += [(p + "mlp." + k, v, shapes[k]) for k, v in layer.mlp.items()]
        expected += [(p + name, gain, (d_model,)) for name, gain in (("ln1_post", layer.ln1_post), ("ln2_post", layer.ln2_post))]
        for name, norm, heads in (("q_norm", layer.q_norm, h), ("k_norm", layer.k_norm, g)):
            for part in norm or ():
                if part.numel() not in (e, heads * e):
                    raise WeightError(f"{p}{name} has shape {tuple(part.shape)}; expected {e} entries (one norm shared by "
                                      f"the heads) or {heads} x {e} (one per head)")
    for what, tensor, shape in expected:
        if tensor is not None and tuple(tensor.shape) != shape:
            raise WeightError(f"{what} has shape {tuple(tensor.shape)} but the config says {shape}; the config's sizes "
                              "disagree with the weights (was it edited after the model was built?)")


def build(src: SourceWeights, dtype: Any = torch.float64, device: Any = None, biases: bool | None = None) -> CircuitModel:
    """The :class:`CircuitModel` of ``src``, folded into the paper's convention (see the module's docstring),
    in ``dtype`` on ``device`` (``None``: CUDA when present; folding is done in float64 on the CPU, and the
    result moved once). ``biases``: ``None`` keeps biases only when some folded bias is non-zero; ``True``
    always keeps them; ``False`` requires them all to be zero."""
    dtype, device = resolve_dtype(dtype), resolve_device(device)
    src = on_cpu(src)
    check_shapes(src)
    centred = centre if src.layer_norm else (lambda t, axis: t)
    W_pos = fold_positions(src)
    if src.positional == "standard":
        W_pos = centred(W_pos, 1)
    W_U, b_U = fold_norm(src.ln_final, src.W_U, src.b_U, 0)
    paper: dict[str, Tensor] = {"W_E": centred(src.W_E, 1).T, "W_U": W_U.T, "b_U": b_U}
    if W_pos is not None and src.positional != "none":
        paper["W_pos"] = W_pos.T
    for i, layer in enumerate(src.layers):
        p = f"blocks.{i}."
        for name in ("Q", "K", "V"):
            W, b = fold_norm(layer.ln1, getattr(layer, f"W_{name}"), getattr(layer, f"b_{name}"), 1)
            paper[f"{p}attn.W_{name}"], paper[f"{p}attn.b_{name}"] = W.transpose(1, 2), b  # [h, d_head, d_model]
        paper[p + "attn.W_O"] = centred(layer.W_O, 2).transpose(1, 2)  # [h, d_model, d_head]
        paper[p + "attn.b_O"] = centred(layer.b_O, 0)
        if layer.mlp is not None and "W_router" in layer.mlp:
            paper.update(_experts(layer, p, centred))
        elif layer.mlp is not None:
            W_in, b_in = fold_norm(layer.ln2, layer.mlp["W_in"], layer.mlp["b_in"], 0)
            paper[p + "mlp.W_in"], paper[p + "mlp.b_in"] = W_in.T, b_in  # [d_mlp, d_model]
            if "W_gate" in layer.mlp:
                W_gate, b_gate = fold_norm(layer.ln2, layer.mlp["W_gate"], layer.mlp["b_gate"], 0)
                paper[p + "mlp.W_gate"], paper[p + "mlp.b_gate"] = W_gate.T, b_gate
            paper[p + "mlp.W_out"] = centred(layer.mlp["W_out"], 1).T  # [d_model, d_mlp]
            paper[p + "mlp.b_out"] = centred(layer.mlp["b_out"], 0)
        paper.update(_decoder_norms(src, layer, p))
    has_biases = decide_biases(paper, biases)
    if not has_biases:
        paper = {k: v for k, v in paper.items() if not k.rsplit(".", 1)[-1].startswith("b_")}
    d_vocab, d_model = paper["W_U"].shape
    heads = tuple(layer.W_Q.shape[0] for layer in src.layers)
    kv_heads = tuple(layer.W_K.shape[0] for layer in src.layers)
    mlp = bool(src.layers) and src.layers[0].mlp is not None
    experts = src.layers[0].mlp["W_router"].shape[1] if mlp and "W_router" in src.layers[0].mlp else None
    arch = Architecture(len(src.layers), heads[0] if len(set(heads)) == 1 else heads or 1,
                        positional=src.positional, norm=src.norm, biases=has_biases, mlp=mlp,
                        n_kv_heads=None if kv_heads == heads else (kv_heads[0] if len(set(kv_heads)) == 1 else kv_heads),
                        parallel=src.parallel and mlp, rotary=src.rotary, rotary_style=src.rotary_style,
                        qk_norm=src.qk_norm, qk_norm_scope=src.qk_norm_scope, sublayer_norm=src.sublayer_norm,
                        window=src.window, attn_softcap=src.attn_softcap, logit_softcap=src.logit_softcap,
                        alibi=src.alibi_slopes is not None, experts=experts,
                        experts_top_k=src.experts_top_k if experts else 1)
    scale = None if math.isclose(src.attn_scale, math.sqrt(src.d_head), rel_tol=1e-12) else src.attn_scale
    cfg = ModelConfig(arch, d_model=d_model, d_head=src.d_head, d_vocab=d_vocab, n_ctx=src.n_ctx,
                      d_mlp=src.d_mlp if arch.mlp else None, act_fn=src.act_fn, ln_eps=src.eps, attn_scale=scale,
                      gated_mlp=mlp and "W_gate" in src.layers[0].mlp, rotary_base=src.rotary_base,
                      alibi_slopes=None if src.alibi_slopes is None else tuple(src.alibi_slopes.tolist()),
                      alibi_rounding=src.alibi_rounding, alibi_divisor=src.alibi_divisor,
                      rotary_inv_freq=None if src.rotary_inv_freq is None else tuple(src.rotary_inv_freq.tolist()),
                      rotary_factor=src.rotary_factor, moe_renormalise=src.moe_renormalise)
    model = CircuitModel(cfg, dtype=torch.float64, device="cpu")
    missing = model.load_state_dict(paper, strict=False)
    if missing.missing_keys or missing.unexpected_keys:  # a bug here, not the user's
        raise WeightError(f"adapter produced mismatched weights: missing {missing.missing_keys}, unexpected {missing.unexpected_keys}")
    return model.to(device=device, dtype=dtype)


def _experts(layer: LayerWeights, prefix: str, centred) -> dict[str, Tensor]:
    """A mixture of experts' parameters in the paper's convention: ``mlp`` holds ``W_router [d_model,
    n_experts]`` and each expert's weights stacked first (``W_in [n_experts, d_model, d_mlp]``, ``b_in
    [n_experts, d_mlp]``, ``W_out [n_experts, d_mlp, d_model]``, ``b_out [n_experts, d_model]``, and
    ``W_gate``, ``b_gate``); ``ln2`` folds into the router and every expert."""
    mlp, out, p = layer.mlp, {}, prefix + "mlp."
    W_router, router_bias = fold_norm(layer.ln2, mlp["W_router"], torch.zeros(mlp["W_router"].shape[1], dtype=torch.float64, device="cpu"), 0)
    if router_bias.any():
        raise UnsupportedModel(f"{prefix}ln2's bias reaches the router as a bias, which a mixture of experts here has not")
    out[p + "W_router"] = W_router.T  # [n_experts, d_model]
    for name in ("in", "gate"):
        if f"W_{name}" in mlp:
            W, b = fold_norm(layer.ln2, mlp[f"W_{name}"], mlp[f"b_{name}"], 1)
            out[f"{p}W_{name}"], out[f"{p}b_{name}"] = W.transpose(1, 2), b  # [n_experts, d_mlp, d_model]
    out[p + "W_out"] = centred(mlp["W_out"], 2).transpose(1, 2)  # [n_experts, d_model, d_mlp]
    out[p + "b_out"] = centred(mlp["b_out"], 1)
    return out


def _decoder_norms(src: SourceWeights, layer: LayerWeights, prefix: str) -> dict[str, Tensor]:
    """The parameters of a block's q/k norms (``attn.q_norm``, ``attn.k_norm``: gain and, for a layer norm,
    bias, ``[heads, d_head]``) and of its norms after the sublayers (``ln1_post``, ``ln2_post``: gain)."""
    out: dict[str, Tensor] = {}
    if src.qk_norm is not None:
        for side, norm, heads in (("q", layer.q_norm, layer.W_Q.shape[0]), ("k", layer.k_norm, layer.W_K.shape[0])):
            if norm is None:
                raise WeightError(f"qk_norm={src.qk_norm!r} but {prefix}{side}_norm has no weights")
            for name, t in zip(("gain", "bias"), norm):
                t = t.reshape(-1, src.d_head).expand(heads, src.d_head).clone()  # one shared norm, or one per head
                if name == "gain" or src.qk_norm == "layer_norm":
                    out[f"{prefix}attn.{side}_norm.{name}"] = t
                elif t.any():
                    raise UnsupportedModel(f"{prefix}{side}_norm has a bias, but an RMSNorm has none (qk_norm={src.qk_norm!r})")
    if src.sublayer_norm != "pre":
        for name, gain in (("ln1_post", layer.ln1_post), ("ln2_post", layer.ln2_post if layer.mlp is not None else 0)):
            if gain is None:
                raise WeightError(f"sublayer_norm={src.sublayer_norm!r} but {prefix}{name} has no gain")
            if name == "ln1_post" or layer.mlp is not None:
                out[f"{prefix}{name}.gain"] = gain
    return out


def decide_biases(paper: dict[str, Tensor], biases: bool | None) -> bool:
    nonzero = [k for k, v in paper.items() if k.rsplit(".", 1)[-1].startswith("b_") and bool(v.any())]
    if biases is None:
        return bool(nonzero)
    if biases is False and nonzero:
        raise UnsupportedModel(f"biases=False but the model has non-zero (folded) biases: {', '.join(nonzero[:5])}")
    return bool(biases)
