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
# Bounds checked before anything per layer or per head is built (GPT-3 has 96 layers of 96 heads).
MAX_LAYERS = 1024
MAX_HEADS = 1024  # in one layer
MAX_HEADS_TOTAL = 16384  # in all layers together


def head_label(layer: int, head: int) -> str:
    """The label of a head, as in TransformerLens: ``head_label(1, 3) == 'L1H3'``."""
    return f"L{layer}H{head}"


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
    ``mlp``: an MLP after each attention layer, an opaque source in the expansion.
    """

    n_layers: int
    n_heads: int | tuple[int, ...]
    positional: str = "none"
    layer_norm: bool = False
    biases: bool = False
    mlp: bool = False
    heads_per_layer: tuple[int, ...] = field(init=False, repr=False)

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
            heads = f"{self.heads_per_layer[0]} heads"
        else:
            heads = "heads " + "/".join(map(str, self.heads_per_layer)) if self.n_layers else "no heads"
        extras = [f"{self.positional} positions"]
        extras += [name for name, on in (("layer norm", self.layer_norm), ("biases", self.biases), ("MLPs", self.mlp)) if on]
        return f"{self.n_layers} layers x {heads}, " + ", ".join(extras)


def _check_heads(layer: int, count) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ArchitectureError(f"layer {layer} must have at least one head (an int >= 1), got {count!r}")
    if count > MAX_HEADS:
        raise ArchitectureError(f"layer {layer} has {count} heads; at most {MAX_HEADS} heads per layer are supported")


def _check_total(total: int) -> None:
    if total > MAX_HEADS_TOTAL:
        raise ArchitectureError(f"the model has {total:,} heads in all; at most {MAX_HEADS_TOTAL:,} are supported")
