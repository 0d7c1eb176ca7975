"""Sources and paths of the residual stream: where a term of the logits starts and which heads it passes.

The residual stream entering a layer is a sum over *sources* (token one-hots, position
one-hots, each layer's output bias, each layer's MLP output; the unembedding bias and
the QK biases for the logits and the attention scores) and, for each source, over
*paths* through at most one head per later layer. A :class:`Source` says what a term
acts on (its input ``X``), a :class:`Path` which heads it passed, and a
:class:`PathTerm` pairs a path with its 2-slot term ``P ⊗ W``. The expansions that
produce them are :mod:`derivations.paths` (the logits, an MLP's input) and
:mod:`derivations.qk` (the attention scores).

>>> str(Path(Source("bias", 0), ((1, 2),)))
'b_O^L0→L1H2'
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from tensoralg.atoms import d_model, d_vocab, n_ctx
from tensoralg.expr import Term

from derivations.architecture import head_label
from derivations.errors import DerivationError

SOURCE_KINDS = ("token", "position", "bias", "mlp", "unembed_bias", "query_bias", "key_bias", "query_norm_bias",
                "key_norm_bias", "alibi")
# one head's own input: a constant query or key side, or ALiBi's position-only bias (both sides at once)
HEAD_SOURCES = ("query_bias", "key_bias", "query_norm_bias", "key_norm_bias", "alibi")
_LAYERED = ("bias", "mlp") + HEAD_SOURCES
_INPUT_DIMS = {"token": d_vocab, "position": n_ctx, "mlp": d_model, "alibi": n_ctx}


@dataclass(frozen=True)
class Source:
    """Where a term of the residual stream starts, and so what it acts on.

    ``layer`` is set for ``bias`` (``b_O`` of that layer, ``b_V`` folded in), ``mlp`` (the
    output of that layer's MLP) and the QK biases ``query_bias``/``key_bias`` (``b_Q``/``b_K``
    of head ``head`` of that layer, the constant query or key side of a QK term), and for
    ``query_norm_bias``/``key_norm_bias`` (the bias of a q/k layer norm, ``b_Qn``/``b_Kn``,
    added after the norm's frozen scale), and for ``alibi`` (the head's ALiBi bias ``B_ALiBi^h``, a
    position-only term of its scores whose two sides read the identity of positions); it is
    ``None`` for the others.

    >>> Source("bias", 1).label, Source("token").label, Source("query_bias", 1, 0).label
    ('b_O^L1', 'tok', 'b_Q^L1H0')
    >>> Source("mlp", 0).input_key, Source("bias", 0).input_key
    ('mlp^L0', 'constant')
    """

    kind: str
    layer: int | None = None
    head: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise DerivationError(
                f"unknown source kind {self.kind!r}; expected one of " + ", ".join(map(repr, SOURCE_KINDS))
            )
        if self.kind in _LAYERED:
            if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
                raise DerivationError(f"a {self.kind!r} source needs a layer (an int >= 0), got {self.layer!r}")
        elif self.layer is not None:
            raise DerivationError(f"a {self.kind!r} source has no layer, got layer={self.layer!r}")
        if self.kind in HEAD_SOURCES:
            if isinstance(self.head, bool) or not isinstance(self.head, int) or self.head < 0:
                raise DerivationError(f"a {self.kind!r} source needs a head (an int >= 0), got {self.head!r}")
        elif self.head is not None:
            raise DerivationError(f"a {self.kind!r} source has no head, got head={self.head!r}")

    @property
    def label(self) -> str:
        """``tok``, ``pos``, ``b_O^L1``, ``mlp^L0``, ``b_U``, ``b_Q^L1H0``, ``b_K^L1H0``."""
        kind = self.kind
        if kind == "token":
            return "tok"
        if kind == "position":
            return "pos"
        if kind == "unembed_bias":
            return "b_U"
        if kind == "bias":
            return f"b_O^L{self.layer}"
        if kind == "mlp":
            return f"mlp^L{self.layer}"
        if kind == "alibi":
            return f"ALiBi^{head_label(self.layer, self.head)}"
        name = {"query_bias": "b_Q", "key_bias": "b_K", "query_norm_bias": "b_Qn", "key_norm_bias": "b_Kn"}[kind]
        return f"{name}^{head_label(self.layer, self.head)}"

    @property
    def input_key(self) -> str:
        """Which input ``X`` the source's terms act on: ``token``, ``position``,
        ``constant`` (ones ``[pos, 1]``: every bias) or ``mlp^L{l}``. Terms with the same
        key act on the same ``X`` and may be added into one :class:`TensorSum`."""
        if self.kind in ("token", "position"):
            return self.kind
        if self.kind == "alibi":
            return "position"  # the identity of positions, on both sides
        if self.kind == "mlp":
            return self.label
        return "constant"

    @property
    def input_dim(self) -> sp.Expr:
        """Columns of the input ``X``: ``d_vocab``, ``n_ctx``, ``d_model`` (MLP) or ``1`` (biases)."""
        return _INPUT_DIMS.get(self.kind, sp.S.One)

    def __str__(self) -> str:
        return self.label


TOKEN = Source("token")
POSITION = Source("position")
UNEMBED_BIAS = Source("unembed_bias")


@dataclass(frozen=True)
class Path:
    """A source and the heads ``(layer, head)`` it passes through, first to last.

    >>> Path(TOKEN, ((0, 1), (1, 3))).label
    'tok→L0H1→L1H3'
    >>> Path(Source("bias", 0)).label, Path(TOKEN).order
    ('b_O^L0 (direct)', 0)
    """

    source: Source
    heads: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.source, Source):
            raise DerivationError(f"a path's source must be a Source, got {self.source!r}")
        heads = tuple(tuple(h) for h in self.heads)
        object.__setattr__(self, "heads", heads)
        after = -1 if self.source.layer is None else self.source.layer
        if heads and self.source.kind in ("unembed_bias",) + HEAD_SOURCES:
            raise DerivationError(f"a {self.source.kind!r} source passes through no heads, got {heads!r}")
        for layer, head in heads:
            if not (isinstance(layer, int) and isinstance(head, int) and head >= 0 and layer > after):
                raise DerivationError(
                    f"path heads must be (layer, head) pairs in strictly increasing layers after the source's "
                    f"entry; got {heads!r} for source {self.source.label}"
                )
            after = layer

    @classmethod
    def trusted(cls, source: Source, heads: tuple[tuple[int, int], ...]) -> "Path":
        """A path from already-valid parts, skipping the checks (expansions build many)."""
        path = object.__new__(cls)
        object.__setattr__(path, "source", source)
        object.__setattr__(path, "heads", heads)
        return path

    @property
    def order(self) -> int:
        """The number of heads the path passes through."""
        return len(self.heads)

    @property
    def label(self) -> str:
        if not self.heads:
            return f"{self.source.label} (direct)"
        return "→".join([self.source.label] + [head_label(l, h) for l, h in self.heads])

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class PathTerm:
    """One term of the logits: ``coeff · P ⊗ W``, contributing ``coeff · P X Wᵀ``.

    ``term.words`` is ``(position word P, residual word W)``; ``X`` is the input of
    ``path.source`` (see the module docstring).
    """

    path: Path
    term: Term

    @property
    def source(self) -> Source:
        return self.path.source

    @property
    def heads(self) -> tuple[tuple[int, int], ...]:
        return self.path.heads

    @property
    def order(self) -> int:
        return len(self.path.heads)

    @property
    def label(self) -> str:
        return self.path.label

    def __str__(self) -> str:
        return f"{self.label}: {self.term}"
