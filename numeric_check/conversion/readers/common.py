"""What the Hugging Face readers share: the :class:`Family` record, shape checks, head splits,
norms, activations, the unembedding and rotary embeddings read as the model computes them.

A reader reads a model's modules (never its forward code) into
:class:`~numeric_check.conversion.build.SourceWeights`; whatever it does not read must be at its
default (:mod:`numeric_check.conversion.options`), and :func:`numeric_check.from_hf` checks the result
against the source (:mod:`numeric_check.conversion.source_check`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from numeric_check.errors import UnsupportedModel, WeightError
from numeric_check.conversion.build import ACT_FN_ALIASES, SourceWeights, f64, unsupported
from numeric_check.conversion.readers import pending

ROPE_TYPES = ("default",)
#: rope types whose frequencies do not change within the context (dynamic NTK changes them only beyond
#: max_position_embeddings, which CircuitModel's n_ctx refuses): a reader that passes ``scaled=True`` to
#: :func:`rotary` reads them (:func:`~numeric_check.conversion.readers.decoder.rope_fields`)
SCALED_ROPE = ("linear", "llama3", "yarn", "dynamic")

#: config keys every reader reads or that never change what a causal LM computes in eval mode
#: (see :data:`numeric_check.conversion.options.HARMLESS` for the rest)
SIZES = frozenset({"vocab_size", "max_position_embeddings"})


@dataclass(frozen=True)
class Family:
    """A Hugging Face family tcircuits reads: its name, the model classes it covers, its reader and
    the config options the reader understands (an allow-list: any other option set off its
    default is refused by name). ``converts=False``: every model of the family uses something the
    algebra does not express (HunYuan's q/k norm after the rotation, PhiMoE's routing, Qwen2-MoE's
    shared expert), so it is registered only to be refused by that feature's name."""

    name: str
    classes: tuple[str, ...]
    read: Callable[[Any], SourceWeights]
    options: frozenset[str]
    converts: bool = True
    #: its code makes a tensor in torch's default dtype where it needs the model's (XGLM's attention takes the
    #: maximum with ``torch.full((), finfo(float64).min)``, which overflows float32): its float64 model runs only
    #: with the default dtype float64, so the source check runs it so
    default_dtype_float64: bool = False


def rope_parameters(config: Any) -> dict[str, Any]:
    """The config's rope as transformers 5 spells it (``rope_parameters``: ``rope_type``, ``rope_theta``,
    ``partial_rotary_factor`` and the scaling's own keys), also from transformers 4's separate ``rope_theta``,
    ``rope_scaling`` (``type`` or ``rope_type``), ``partial_rotary_factor`` and GPT-NeoX's ``rotary_emb_base``.

    >>> from types import SimpleNamespace as C
    >>> rope_parameters(C(rope_theta=500.0, rope_scaling={"type": "linear", "factor": 2.0}))
    {'rope_type': 'linear', 'factor': 2.0, 'rope_theta': 500.0}
    """
    params = getattr(config, "rope_parameters", None)
    if params and not hasattr(config, "rope_theta"):  # transformers 5 (in 4, a rope_parameters key is a stray one)
        return dict(params)
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    out = {"rope_type": scaling.pop("rope_type", scaling.pop("type", "default")), **scaling}
    theta = getattr(config, "rope_theta", None)
    out["rope_theta"] = float(theta if theta is not None else getattr(config, "rotary_emb_base", 10000.0))
    partial = getattr(config, "partial_rotary_factor", getattr(config, "rotary_pct", None))
    if partial is not None:
        out["partial_rotary_factor"] = partial
    return out


def rotary(model: Any, rotary_emb: Any, d_head: int, source: str, declared: int | None = None,
           scaled: bool = False) -> tuple[float, float]:
    """``(fraction of each head rotated, base)`` as the model's rotary embedding computes them:
    its inverse frequencies say how many dimensions turn (Llama ignores a config's
    ``partial_rotary_factor``; GPT-NeoX honours it), and must be ``base^(-2f/d_rot)`` as
    rope_theta gives them, compared in the buffer's own precision (a half-precision model's cast
    rounds them: :func:`rotary_fields` reads them as rounded). Frequencies the module was built with
    from another rope_theta than its config's now (a config edited after the model was built) are
    refused by that name; any other rope scaling is refused by name. ``declared``: the rotated
    dimensions the attention slices (``rotary_ndims``), refused when odd. ``scaled``: the reader reads
    the rope scalings of :data:`SCALED_ROPE` (frequencies and attention factor: the rotary embedding's own)."""
    params = rope_parameters(model.config)
    rope_type = params.get("rope_type", "default")
    built_type = getattr(rotary_emb, "rope_type", rope_type)
    if isinstance(built_type, str) and built_type != rope_type:
        raise UnsupportedModel(f"{source}: its rotary embedding was built as {built_type!r} rope but its config now "
                               f"says {rope_type!r}: the config was edited after the model was built, so it no longer "
                               "describes the model; rebuild the model from its config")
    if rope_type not in ROPE_TYPES + (SCALED_ROPE if scaled else ()):
        pending.refuse(source, ("rope_scaling", f"{rope_type!r} in rope_parameters"))
    if rope_type in ROPE_TYPES and float(getattr(rotary_emb, "attention_scaling", 1.0)) != 1.0:
        pending.refuse(source, ("rope_scaling", "attention_scaling"))
    if declared is not None:
        rotated_dims(declared, d_head, source)
    base = float(params.get("rope_theta", 10000.0))
    inv = rotary_emb.inv_freq.detach().cpu()
    rot_dims = 2 * inv.shape[0]
    if rot_dims < 2 or rot_dims > d_head or (declared is not None and declared != rot_dims):
        raise unsupported(f"rotary on {declared or rot_dims} of {d_head} head dimensions", source)
    expected = base ** (-torch.arange(0, rot_dims, 2, dtype=torch.float64) / rot_dims)
    rtol = max(1e-6, 4 * torch.finfo(inv.dtype).eps)  # float32 buffers agree to ~1e-7, half ones to a few ulps
    if rope_type in ROPE_TYPES and not torch.allclose(inv.to(torch.float64), expected.to(inv.dtype).to(torch.float64),
                                                      rtol=rtol, atol=0):
        built = _built_base(inv)
        if built is not None:
            raise UnsupportedModel(f"{source}: its rotary embedding was built with rope_theta {built:.6g} but its config "
                                   f"now says rope_theta={base:g}: the config was edited after the model was built (or "
                                   "the buffer replaced), so it no longer describes the model; rebuild the model from "
                                   "its config")
        pending.refuse(source, ("rope_scaling", "inverse frequencies that are not rope_theta's"))
    return rot_dims / d_head, base


def _built_base(inv: Tensor) -> float | None:
    """The base ``b`` when ``inv`` are ``b^(-2f/d)`` (to the buffer's precision), else None."""
    if inv.numel() < 2 or not bool((inv > 0).all()):
        return None
    inv64 = inv.to(torch.float64)
    d = 2 * inv.numel()
    base = float(inv64[1]) ** (-d / 2)
    again = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rtol = max(1e-5, 16 * torch.finfo(inv.dtype).eps)
    return base if torch.allclose(inv64, again, rtol=rtol, atol=0) else None


def rounded_frequencies(rotary_emb: Any) -> dict[str, Tensor]:
    """``{"rotary_inv_freq": …}`` when the rotary embedding holds its frequencies in half precision (a model cast
    with ``model.to(torch.bfloat16)`` rounds the buffer, and the source computes its angles from the rounded
    values): the frequencies as the source has them; empty otherwise (rope_theta's, exact)."""
    inv = rotary_emb.inv_freq
    if getattr(rotary_emb, "rope_type", "default") not in ROPE_TYPES or torch.finfo(inv.dtype).bits > 16:
        return {}
    return {"rotary_inv_freq": f64(inv)}


def built_eps(model: Any, key: str, source: str) -> float:
    """The norms' one eps as the modules were built with it (``eps`` or ``variance_epsilon`` of every ``*Norm``
    module: a config edited after the model was built changes nothing); the config's ``key`` where no module holds
    one; norms built with different ones are refused, naming them and the config's value."""
    found: dict[float, str] = {}
    for name, module in model.named_modules():
        value = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        if "Norm" in type(module).__name__ and isinstance(value, (int, float)) and not isinstance(value, bool):
            found.setdefault(float(value), name)
    if len(found) > 1:
        listed = ", ".join(f"{where} {eps:g}" for eps, where in sorted(found.items(), key=lambda kv: kv[1]))
        raise unsupported(f"norms built with different eps ({listed}; its config says {key}="
                          f"{getattr(model.config, key, None)})", source)
    return next(iter(found)) if found else float(getattr(model.config, key))


def rotated_dims(n: int, d_head: int, source: str, what: str = "") -> int:
    """``n`` when it is an even number of at most ``d_head`` rotated dimensions; else refused, an odd number by that name."""
    named = f"{what}={n}, " if what else ""
    if n % 2:
        raise unsupported(f"rotary on an odd number of dimensions ({named}{n} of d_head={d_head})", source)
    if not 2 <= n <= d_head:
        raise unsupported(f"rotary on {n} of {d_head} head dimensions ({named}at least 2 and at most d_head)", source)
    return n


def shape(t: Tensor, expected: tuple[int, ...], what: str, source: str) -> Tensor:
    if tuple(t.shape) != expected:
        raise WeightError(f"{source}: {what} has shape {tuple(t.shape)} but the config says {expected}; "
                          "the config's sizes disagree with the weights")
    return t


def split_heads(weight: Tensor, n: int, d_head: int, d_model: int, what: str, source: str) -> Tensor:
    """A ``[n * d_head, d_model]`` projection (``x @ weight.T``) as ``[n, d_model, d_head]``."""
    shape(weight, (n * d_head, d_model), what, source)
    return f64(weight).reshape(n, d_head, d_model).transpose(1, 2)


def bias(linear: Any, n: int, d_head: int, what: str, source: str) -> Tensor:
    if linear.bias is None:
        return torch.zeros(n, d_head, dtype=torch.float64)
    return shape(f64(linear.bias), (n * d_head,), what, source).reshape(n, d_head)


def norm(module: Any, kind: str) -> tuple[Tensor, Tensor] | None:
    """``(w, b)`` of a norm: LayerNorm ``(weight, bias)``, RMSNorm ``(weight, 0)``, Gemma's ``(1 + weight, 0)``,
    Nemotron's ``layer_plus_one`` ``(1 + weight, bias)``;
    ``None`` for a norm without parameters (OLMo's, OPT's ``elementwise_affine=False``)."""
    if getattr(module, "weight", None) is None:
        return None
    w = f64(module.weight)
    if kind in ("gemma", "layer_plus_one"):
        w = 1.0 + w
    b = f64(module.bias) if getattr(module, "bias", None) is not None else torch.zeros_like(w)
    return w, b


def act(name: str, source: str) -> str:
    act = ACT_FN_ALIASES.get(name)
    if act is None:
        raise unsupported(f"activation function {name!r} (supported: {', '.join(ACT_FN_ALIASES)})", source)
    return act


def unembed(model: Any, d_model: int, d_vocab: int, source: str) -> tuple[Tensor, Tensor]:
    """The output embedding (``lm_head``; GPT-NeoX's ``embed_out`` in transformers 4) as ``W_U [d_model, d_vocab]``, ``b_U``."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else model.lm_head
    W_U = shape(f64(head.weight), (d_vocab, d_model), "the output embedding's weight", source).T
    b_U = f64(head.bias) if getattr(head, "bias", None) is not None else torch.zeros(d_vocab, dtype=torch.float64)
    return W_U, b_U


def linear(module: Any, n_out: int, what: str, source: str, n_in: int | None = None) -> tuple[Tensor, Tensor]:
    """``nn.Linear`` ``y = x Wᵀ + b`` in the row convention: ``(Wᵀ [n_in, n_out], b [n_out])`` (zeros without bias)."""
    W = f64(module.weight)
    shape(W, (n_out, n_in if n_in is not None else W.shape[1]), what + ".weight", source)
    b = f64(module.bias) if getattr(module, "bias", None) is not None else torch.zeros(n_out, dtype=torch.float64)
    return W.T, b


def plain_mlp(fc_in: Any, fc_out: Any, d_mlp: int, d_model: int, where: str, source: str) -> dict[str, Tensor]:
    """``fc_out(act(fc_in(x)))`` from two ``nn.Linear``: ``W_in [d_model, d_mlp]``, ``W_out [d_mlp, d_model]``."""
    W_in, b_in = linear(fc_in, d_mlp, where + "in", source, d_model)
    W_out, b_out = linear(fc_out, d_model, where + "out", source, d_mlp)
    return {"W_in": W_in, "b_in": b_in, "W_out": W_out, "b_out": b_out}


def packed_gated_mlp(mlp: Any, d_mlp: int, d_model: int, where: str, source: str) -> dict[str, Tensor]:
    """``down(up * act(gate))`` with gate and up packed in one ``gate_up_proj`` (gate first: Phi-3, GLM)."""
    gate_up, b_gate_up = linear(mlp.gate_up_proj, 2 * d_mlp, where + "gate_up_proj", source, d_model)
    W_out, b_out = linear(mlp.down_proj, d_model, where + "down_proj", source, d_mlp)
    return {"W_gate": gate_up[:, :d_mlp], "b_gate": b_gate_up[:d_mlp], "W_in": gate_up[:, d_mlp:],
            "b_in": b_gate_up[d_mlp:], "W_out": W_out, "b_out": b_out}


def projections(q: Any, k: Any, v: Any, n: int, n_kv: int, d_head: int, d_model: int, where: str,
                source: str) -> dict[str, Tensor]:
    """Three ``nn.Linear`` projections (biases or not) as ``W_Q [n, d_model, d_head]``, ``b_Q [n, d_head]``, and
    ``W_K``, ``b_K``, ``W_V``, ``b_V`` with ``n_kv`` heads."""
    out = {}
    for name, module, heads in (("Q", q, n), ("K", k, n_kv), ("V", v, n_kv)):
        W, b = linear(module, heads * d_head, f"{where}{name.lower()}_proj", source, d_model)
        out[f"W_{name}"] = W.reshape(d_model, heads, d_head).transpose(0, 1)
        out[f"b_{name}"] = b.reshape(heads, d_head)
    return out


def heads_out(o_proj: Any, n_heads: int, d_head: int, d_model: int, what: str, source: str) -> tuple[Tensor, Tensor]:
    """An output projection ``[d_model, n_heads * d_head]`` as ``W_O [n_heads, d_head, d_model]`` and ``b_O``."""
    W, b = linear(o_proj, d_model, what, source, n_heads * d_head)
    return W.reshape(n_heads, d_head, d_model), b
