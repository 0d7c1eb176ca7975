"""The public layer every reader builds on: a source's weights as :class:`SourceWeights`
(TransformerLens' row convention, float64), folded and transposed into a :class:`CircuitModel`
in the paper's convention by :func:`build`.

A reader (TransformerLens in :mod:`numeric_check.model.adapters`, each Hugging Face family in
:mod:`numeric_check.model.readers`) fills in a :class:`SourceWeights`; :func:`build` then

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
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from derivations.architecture import Architecture
from numeric_check.errors import UnsupportedModel, WeightError
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


def f64(t: Tensor) -> Tensor:
    """A float64 copy of ``t``, detached (the source's tensor is never touched)."""
    return t.detach().to(torch.float64, copy=True)


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


def build(src: SourceWeights, dtype: Any = torch.float64, device: Any = None, biases: bool | None = None) -> CircuitModel:
    """The :class:`CircuitModel` of ``src``, folded into the paper's convention (see the module's docstring),
    in ``dtype`` on ``device`` (folding is done in float64 on the CPU). ``biases``: ``None`` keeps biases only
    when some folded bias is non-zero; ``True`` always keeps them; ``False`` requires them all to be zero."""
    dtype = resolve_dtype(dtype)
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
        if layer.mlp is not None:
            W_in, b_in = fold_norm(layer.ln2, layer.mlp["W_in"], layer.mlp["b_in"], 0)
            paper[p + "mlp.W_in"], paper[p + "mlp.b_in"] = W_in.T, b_in  # [d_mlp, d_model]
            if "W_gate" in layer.mlp:
                W_gate, b_gate = fold_norm(layer.ln2, layer.mlp["W_gate"], layer.mlp["b_gate"], 0)
                paper[p + "mlp.W_gate"], paper[p + "mlp.b_gate"] = W_gate.T, b_gate
            paper[p + "mlp.W_out"] = centred(layer.mlp["W_out"], 1).T  # [d_model, d_mlp]
            paper[p + "mlp.b_out"] = centred(layer.mlp["b_out"], 0)
    has_biases = decide_biases(paper, biases)
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


def decide_biases(paper: dict[str, Tensor], biases: bool | None) -> bool:
    nonzero = [k for k, v in paper.items() if k.rsplit(".", 1)[-1].startswith("b_") and bool(v.any())]
    if biases is None:
        return bool(nonzero)
    if biases is False and nonzero:
        raise UnsupportedModel(f"biases=False but the model has non-zero (folded) biases: {', '.join(nonzero[:5])}")
    return bool(biases)
