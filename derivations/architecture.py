"""Architectures as data: which layers, heads and extras a transformer has.

Layers and heads are 0-indexed, as in TransformerLens: head ``h`` of layer ``l`` is
labelled ``L{l}H{h}``. The paper numbers layers from 1 (``H_1``, ``H_2``); documents
state that mapping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from derivations.errors import ArchitectureError

POSITIONAL_KINDS = ("none", "standard", "qk_only")
NORMS = ("none", "layer_norm", "rms_norm")
ROTARY_STYLES = ("neox", "gptj")
QK_NORMS = (None, "rms_norm", "layer_norm")
QK_NORM_SCOPES = ("head", "all")
SUBLAYER_NORMS = ("pre", "post", "both")
# Bounds checked before anything per layer or per head is built (GPT-3 has 96 layers of 96 heads).
MAX_LAYERS = 1024
MAX_HEADS = 1024  # in one layer
MAX_HEADS_TOTAL = 16384  # in all layers together


def head_label(layer: int, head: int) -> str:
    """The label of a head, as in TransformerLens: ``head_label(1, 3) == 'L1H3'``."""
    return f"L{layer}H{head}"


def kv_group_label(layer: int, group: int) -> str:
    """The label of a key/value head shared by a group of query heads: ``'L1KV0'``."""
    return f"L{layer}KV{group}"


@dataclass(frozen=True)
class Architecture:
    """An attention-only (optionally MLP) transformer, as the algebra sees it.

    >>> Architecture(2, 4).heads_per_layer
    (4, 4)
    >>> Architecture(2, (1, 3), positional="qk_only").n_heads_total
    4

    ``positional``: ``"none"``; ``"standard"`` (``W_pos`` added to the residual stream);
    ``"qk_only"`` (added just before ``W_Q`` and ``W_K``, as in the paper's models).
    ``layer_norm``: a parameter-free layer norm before every attention layer, MLP and the
    unembedding; its per-position scale is frozen (a diagonal position-side factor) and
    its gain and centring are folded into the weights.
    ``biases``: ``b_Q, b_K, b_V, b_O`` per layer and ``b_U``; ``b_V`` folds into ``b_O``.
    ``mlp``: an MLP after each attention layer, an opaque source in the expansion. A gated
    MLP (SwiGLU, GeGLU) is an opaque source too: its output enters the stream as one source
    and its input is where paths end, whatever it computes in between.

    The options of the models studied today (GPT-NeoX/Pythia, GPT-J, Llama, Qwen2, Mistral):

    ``norm``: ``"none"``, ``"layer_norm"`` or ``"rms_norm"``. Either norm is a frozen
    per-position scale ``N`` (diagonal, position side); layer norm also centres, RMSNorm
    does not; gains fold into the weights. ``layer_norm=True`` is ``norm="layer_norm"``.
    ``n_kv_heads``: key/value heads per layer (an int or one per layer; default: one per
    query head). Grouped-query attention: query head ``h`` of a layer with ``n`` query and
    ``g`` key/value heads reads key/value head ``h // (n // g)``, so ``W_K``, ``W_V`` (and
    ``b_K``, ``b_V``) are named once per group (``W_K^{L0KV1}``) and shared by the
    ``W_QK^{h} = W_Q^{h}ᵀ W_K^{g}`` and ``W_OV^{h} = W_O^{h} W_V^{g}`` of its heads.
    ``parallel``: attention and MLP read the same stream (GPT-NeoX, GPT-J); needs MLPs.
    The logits' path expansion is the same (an MLP is an opaque source either way); the
    MLP's input loses the paths through its own layer's heads (:func:`derivations.paths.expand_mlp_input`).
    ``rotary``: the fraction of the head dimensions rotated by position (``None``: no
    rotary); ``rotary_style``: ``"neox"`` (rotate-half pairs ``(i, i + d/2)``, GPT-NeoX
    and Llama) or ``"gptj"`` (interleaved pairs ``(2i, 2i + 1)``). Rotary enters the QK
    expansion as one operator per head (:mod:`tensoralg.rotary`); the logits' path
    expansion is unchanged (patterns are frozen).

    >>> Architecture(2, 8, norm="rms_norm", n_kv_heads=2, rotary=0.25, mlp=True, parallel=True).describe()
    '2 layers x 8 heads, no positional embedding, RMSNorm, MLPs, 2 key/value heads (4 query heads each), parallel attention and MLP, rotary on 25% of the head dimensions (neox pairing)'
    """

    n_layers: int
    n_heads: int | tuple[int, ...]
    positional: str = "none"
    layer_norm: bool = False
    biases: bool = False
    mlp: bool = False
    norm: str | None = None
    n_kv_heads: int | tuple[int, ...] | None = None
    parallel: bool = False
    rotary: float | None = None
    rotary_style: str = "neox"
    qk_norm: str | None = None
    qk_norm_scope: str = "head"
    sublayer_norm: str = "pre"
    window: int | tuple[int | None, ...] | None = None
    attn_softcap: float | None = None
    logit_softcap: float | None = None
    alibi: bool = False
    experts: int | None = None
    experts_top_k: int = 1
    heads_per_layer: tuple[int, ...] = field(init=False, repr=False)
    kv_heads_per_layer: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.n_layers, bool) or not isinstance(self.n_layers, int):
            raise ArchitectureError(f"n_layers must be an int >= 0, got {self.n_layers!r}")
        if self.n_layers < 0:
            raise ArchitectureError(f"n_layers must be >= 0, got {self.n_layers}")
        if self.n_layers > MAX_LAYERS:
            raise ArchitectureError(f"n_layers must be at most {MAX_LAYERS}, got {self.n_layers}")
        heads = self.n_heads
        if isinstance(heads, bool):
            raise ArchitectureError(f"n_heads must be an int or one int per layer, got {heads!r}")
        if isinstance(heads, int):
            _check_heads(0, heads)
            _check_total(heads * self.n_layers)
            per_layer = (heads,) * self.n_layers
        else:
            try:
                per_layer = tuple(heads)
            except TypeError:
                raise ArchitectureError(
                    f"n_heads must be an int or one int per layer, got {heads!r}"
                ) from None
            if len(per_layer) != self.n_layers:
                raise ArchitectureError(
                    f"n_heads gives {len(per_layer)} head counts for {self.n_layers} layers; "
                    "give one per layer or a single int"
                )
        for layer, count in enumerate(per_layer):
            _check_heads(layer, count)
        _check_total(sum(per_layer))
        if self.positional not in POSITIONAL_KINDS:
            raise ArchitectureError(
                f"unknown positional kind {self.positional!r}; expected one of "
                + ", ".join(repr(k) for k in POSITIONAL_KINDS)
            )
        for flag in ("layer_norm", "biases", "mlp"):
            if not isinstance(getattr(self, flag), bool):
                raise ArchitectureError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        object.__setattr__(self, "n_heads", heads if isinstance(heads, int) else per_layer)
        object.__setattr__(self, "heads_per_layer", per_layer)
        self._check_norm()
        self._check_kv_heads()
        if not isinstance(self.parallel, bool):
            raise ArchitectureError(f"parallel must be True or False, got {self.parallel!r}")
        if self.parallel and not self.mlp:
            raise ArchitectureError(
                "parallel=True means attention and MLP read the same stream, but the model has no MLPs; "
                "pass mlp=True, or parallel=False"
            )
        self._check_rotary()
        self._check_decoder_norms()
        self._check_decoder_attention()

    def _check_decoder_attention(self) -> None:
        """Sliding windows, soft-caps and ALiBi (GPT-Neo, Mistral, Gemma 2, BLOOM, MPT...)."""
        window = self.window
        if window is not None:
            per_layer = (window,) * self.n_layers if isinstance(window, int) and not isinstance(window, bool) else window
            try:
                per_layer = tuple(per_layer)
            except TypeError:
                raise ArchitectureError(f"window must be an int >= 1, one int or None per layer, or None; got {window!r}") from None
            if len(per_layer) != self.n_layers:
                raise ArchitectureError(f"window gives {len(per_layer)} windows for {self.n_layers} layers; give one per "
                                        "layer (None: global attention) or a single int")
            for layer, w in enumerate(per_layer):
                if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
                    raise ArchitectureError(f"layer {layer}'s window must be an int >= 1 (keys within the last w "
                                            f"positions) or None (global), got {w!r}")
            object.__setattr__(self, "window", window if isinstance(window, int) else per_layer)
        for name in ("attn_softcap", "logit_softcap"):
            cap = getattr(self, name)
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < float("inf")):
                raise ArchitectureError(f"{name} must be a finite number > 0 (the cap c of c·tanh(x/c)) or None, got {cap!r}")
        if not isinstance(self.alibi, bool):
            raise ArchitectureError(f"alibi must be True or False, got {self.alibi!r}")
        self._check_experts()

    def _check_experts(self) -> None:
        """Mixture-of-experts MLPs: opaque sources like any MLP; the routing is taken from the forward pass."""
        experts, k = self.experts, self.experts_top_k
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ArchitectureError(f"experts_top_k must be an int >= 1, got {k!r}")
        if experts is None:
            if k != 1:
                raise ArchitectureError(f"experts_top_k={k} but experts is None; pass experts= (the number of experts)")
            return
        if isinstance(experts, bool) or not isinstance(experts, int) or experts < 1:
            raise ArchitectureError(f"experts must be an int >= 1 (experts per MLP) or None, got {experts!r}")
        if not self.mlp:
            raise ArchitectureError(f"experts={experts} makes each MLP a mixture of experts, but the model has no MLPs; pass mlp=True")
        if k > experts:
            raise ArchitectureError(f"experts_top_k={k} picks more experts than the {experts} there are")

    def window_of(self, layer: int) -> int | None:
        """The sliding window of ``layer``'s attention (a query sees the keys of its last ``w`` positions,
        itself included), or ``None`` for global attention.

        >>> Architecture(2, 1, window=(4, None)).window_of(0)
        4
        """
        if self.window is None:
            return None
        return self.window if isinstance(self.window, int) else self.window[layer]

    def _check_decoder_norms(self) -> None:
        """q/k normalisation and norms after a sublayer (the options of Qwen3, OLMo 2, Gemma 2...)."""
        if self.qk_norm not in QK_NORMS:
            raise ArchitectureError(f"unknown qk_norm {self.qk_norm!r}; expected one of " + ", ".join(map(repr, QK_NORMS)))
        if self.qk_norm_scope not in QK_NORM_SCOPES:
            raise ArchitectureError(f"unknown qk_norm_scope {self.qk_norm_scope!r}; expected one of "
                                    + ", ".join(map(repr, QK_NORM_SCOPES)))
        if self.qk_norm is None and self.qk_norm_scope != "head":
            raise ArchitectureError(f"qk_norm_scope={self.qk_norm_scope!r} but qk_norm is None; pass qk_norm "
                                    "('rms_norm' or 'layer_norm') or leave qk_norm_scope at 'head'")
        if self.sublayer_norm not in SUBLAYER_NORMS:
            raise ArchitectureError(f"unknown sublayer_norm {self.sublayer_norm!r}; expected one of "
                                    + ", ".join(map(repr, SUBLAYER_NORMS)))
        if self.sublayer_norm != "pre" and self.norm == "none":
            raise ArchitectureError(f"sublayer_norm={self.sublayer_norm!r} puts a norm after each sublayer, but norm "
                                    "is 'none'; pass norm='rms_norm' or 'layer_norm'")
        if self.sublayer_norm != "pre" and self.norm == "layer_norm":
            raise ArchitectureError(f"sublayer_norm={self.sublayer_norm!r} with a layer norm: a norm after a sublayer "
                                    "is an RMSNorm in the families that have one (OLMo 2, Gemma 2); a centring norm "
                                    "after a sublayer is not supported, pass norm='rms_norm'")
        if self.sublayer_norm == "post" and self.parallel:
            raise ArchitectureError("sublayer_norm='post' leaves the sublayers' input unnormalised, which a parallel "
                                    "block's shared norm cannot express; pass sublayer_norm='both' or parallel=False")

    @property
    def pre_norm(self) -> bool:
        """True when a norm reads the stream before each attention layer and MLP (``ln1``, ``ln2``)."""
        return self.normalised and self.sublayer_norm != "post"

    @property
    def post_norm(self) -> bool:
        """True when a norm scales each sublayer's output before it joins the stream (``ln1_post``, ``ln2_post``)."""
        return self.sublayer_norm != "pre"

    def _check_norm(self) -> None:
        norm = self.norm
        if norm is None:
            norm = "layer_norm" if self.layer_norm else "none"
        elif norm not in NORMS:
            raise ArchitectureError(f"unknown norm {norm!r}; expected one of " + ", ".join(map(repr, NORMS)))
        elif self.layer_norm and norm != "layer_norm":
            raise ArchitectureError(
                f"layer_norm=True contradicts norm={norm!r}; pass norm alone (one of "
                + ", ".join(map(repr, NORMS)) + ")"
            )
        object.__setattr__(self, "norm", norm)
        object.__setattr__(self, "layer_norm", norm == "layer_norm")

    def _check_kv_heads(self) -> None:
        kv = self.n_kv_heads
        if kv is None:
            object.__setattr__(self, "kv_heads_per_layer", self.heads_per_layer)
            return
        if isinstance(kv, bool):
            raise ArchitectureError(f"n_kv_heads must be an int or one int per layer, got {kv!r}")
        if isinstance(kv, int):
            per_layer = (kv,) * self.n_layers
        else:
            try:
                per_layer = tuple(kv)
            except TypeError:
                raise ArchitectureError(f"n_kv_heads must be an int or one int per layer, got {kv!r}") from None
            if len(per_layer) != self.n_layers:
                raise ArchitectureError(
                    f"n_kv_heads gives {len(per_layer)} counts for {self.n_layers} layers; give one per layer or a single int"
                )
        for layer, (groups, heads) in enumerate(zip(per_layer, self.heads_per_layer)):
            if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
                raise ArchitectureError(f"layer {layer} must have at least one key/value head (an int >= 1), got {groups!r}")
            if heads % groups:
                raise ArchitectureError(
                    f"layer {layer} has {heads} query heads and {groups} key/value heads; grouped-query attention needs "
                    f"the query heads to split evenly into the groups (n_heads divisible by n_kv_heads)"
                )
        object.__setattr__(self, "n_kv_heads", kv if isinstance(kv, int) else per_layer)
        object.__setattr__(self, "kv_heads_per_layer", per_layer)

    def _check_rotary(self) -> None:
        fraction = self.rotary
        if fraction is not None:
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
                raise ArchitectureError(
                    f"rotary is the fraction of the head dimensions rotated by position, a number in (0, 1] "
                    f"(or None for no rotary), got {fraction!r}"
                )
        if self.rotary_style not in ROTARY_STYLES:
            raise ArchitectureError(
                f"unknown rotary_style {self.rotary_style!r}; expected one of " + ", ".join(map(repr, ROTARY_STYLES))
            )

    @property
    def normalised(self) -> bool:
        """True with a layer norm or an RMSNorm: either puts a frozen scale ``N`` on the position side."""
        return self.norm != "none"

    @property
    def grouped(self) -> bool:
        """True when some layer has fewer key/value heads than query heads (grouped-query attention)."""
        return self.kv_heads_per_layer != self.heads_per_layer

    def kv_head(self, layer: int, head: int) -> int:
        """The key/value head that query head ``head`` of ``layer`` reads.

        >>> Architecture(1, 8, n_kv_heads=2).kv_head(0, 5)
        1
        """
        self.check_head(layer, head)
        return head // (self.heads_per_layer[layer] // self.kv_heads_per_layer[layer])

    def kv_label(self, layer: int, head: int) -> str:
        """The index of the key/value factors query head ``head`` reads: its own label
        (``L0H5``) without grouping, its group's (``L0KV1``) with it."""
        if self.kv_heads_per_layer[layer] == self.heads_per_layer[layer]:
            self.check_head(layer, head)
            return head_label(layer, head)
        return kv_group_label(layer, self.kv_head(layer, head))

    @property
    def n_heads_total(self) -> int:
        return sum(self.heads_per_layer)

    @property
    def uniform(self) -> bool:
        """True when every layer has the same number of heads."""
        return len(set(self.heads_per_layer)) <= 1

    def heads(self) -> Iterator[tuple[int, int]]:
        """Every ``(layer, head)`` pair, layer by layer."""
        for layer, count in enumerate(self.heads_per_layer):
            for head in range(count):
                yield layer, head

    def check_head(self, layer: int, head: int) -> None:
        """Raise :class:`ArchitectureError` unless ``(layer, head)`` exists."""
        if not (isinstance(layer, int) and 0 <= layer < self.n_layers):
            raise ArchitectureError(
                f"layer {layer!r} does not exist: the model has layers 0..{self.n_layers - 1}"
                if self.n_layers
                else f"layer {layer!r} does not exist: the model has no layers"
            )
        count = self.heads_per_layer[layer]
        if not (isinstance(head, int) and 0 <= head < count):
            raise ArchitectureError(
                f"head {head!r} does not exist in layer {layer}: it has heads 0..{count - 1}"
            )

    def describe(self) -> str:
        """One line for humans: ``2 layers x 4 heads, qk_only positions, layer norm``."""
        if self.uniform and self.n_layers:
            n = self.heads_per_layer[0]
            heads = f"{n} head" + ("" if n == 1 else "s")
        else:
            heads = "heads " + "/".join(map(str, self.heads_per_layer)) if self.n_layers else "no heads"
        extras = ["no positional embedding" if self.positional == "none" else f"{self.positional} positions"]
        norm = {"layer_norm": "layer norm", "rms_norm": "RMSNorm"}.get(self.norm)
        extras += [name for name, on in ((norm, norm), ("biases", self.biases), ("MLPs", self.mlp)) if on]
        if self.grouped:
            kv = self.kv_heads_per_layer
            if len(set(kv)) == 1 and self.uniform:
                extras.append(f"{kv[0]} key/value heads ({self.heads_per_layer[0] // kv[0]} query heads each)")
            else:
                extras.append("key/value heads " + "/".join(map(str, kv)))
        if self.parallel:
            extras.append("parallel attention and MLP")
        if self.rotary is not None:
            share = "all" if self.rotary == 1 else f"{self.rotary:.0%}"
            extras.append(f"rotary on {share} of the head dimensions ({self.rotary_style} pairing)")
        extras += self._describe_decoder()
        layers = f"{self.n_layers} layer" + ("" if self.n_layers == 1 else "s")
        return f"{layers} x {heads}, " + ", ".join(extras)


    def _describe_decoder(self) -> list[str]:
        out = []
        if self.qk_norm is not None:
            kind = {"rms_norm": "RMSNorm", "layer_norm": "layer norm"}[self.qk_norm]
            out.append(f"q/k {kind} " + ("per head" if self.qk_norm_scope == "head" else "over all heads"))
        if self.sublayer_norm != "pre":
            out.append({"post": "norms after each sublayer (not before)", "both": "norms before and after each sublayer"}[self.sublayer_norm])
        if self.window is not None:
            windows = [self.window_of(l) for l in range(self.n_layers)]
            out.append(f"sliding window {self.window}" if isinstance(self.window, int) else
                       "windows " + "/".join("global" if w is None else str(w) for w in windows))
        if self.alibi:
            out.append("ALiBi")
        if self.experts is not None:
            out.append(f"MLPs of {self.experts} experts (top {self.experts_top_k} per position)")
        if self.attn_softcap is not None:
            out.append(f"attention scores soft-capped at {self.attn_softcap:g} (expanded before the cap)")
        if self.logit_softcap is not None:
            out.append(f"logits soft-capped at {self.logit_softcap:g} (expanded before the cap)")
        return out


def _check_heads(layer: int, count) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ArchitectureError(f"layer {layer} must have at least one head (an int >= 1), got {count!r}")
    if count > MAX_HEADS:
        raise ArchitectureError(f"layer {layer} has {count} heads; at most {MAX_HEADS} heads per layer are supported")


def _check_total(total: int) -> None:
    if total > MAX_HEADS_TOTAL:
        raise ArchitectureError(f"the model has {total:,} heads in all; at most {MAX_HEADS_TOTAL:,} are supported")
