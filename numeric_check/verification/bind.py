"""Binding the atoms of an expansion to tensors: weights, and values frozen from a real forward pass.

An expansion (:func:`derivations.paths.expand_logits`, :func:`derivations.qk.expand_qk`)
is symbolic: words of atoms such as ``A^{L1H0}``, ``W_OV^{L1H0}``, ``N^{final}``, ``W_E``.
A :class:`Binder` gives each atom its numbers for one model and one batch of tokens:

==================  =================================================================  ==========================
atom                bound to                                                           kind
==================  =================================================================  ==========================
``A^{LlHh}``        ``blocks.l.attn.hook_pattern[:, h]`` (frozen)                      position ``[b, q, k]``
``N^{Ll}``          ``1 / blocks.l.ln1.hook_scale`` (frozen)                           diagonal ``[b, pos]``
``N^{Ll,qk}``       ``1 / blocks.l.ln1_qk.hook_scale`` (qk_only + layer norm)          diagonal ``[b, pos]``
``N^{final}``       ``1 / ln_final.hook_scale``                                        diagonal ``[b, pos]``
``N^{LlHh,q}``      ``1 / blocks.l.attn.q_norm.hook_scale[:, :, h]`` (q/k norm)        diagonal ``[b, pos]``
``N^{LlKVg,k}``     ``1 / blocks.l.attn.k_norm.hook_scale`` (``N^{Ll,k}``: all heads)  diagonal ``[b, pos]``
``N^{Ll,post}``     ``1 / blocks.l.ln1_post.hook_scale`` (norm after attention)        diagonal ``[b, pos]``
``W_E``, ``W_U``…   the model's weights (paper convention)                             factors
``W_OV^{LlHh}``     ``(W_O^h, W_V^h)``, kept factored                                  factors
``W_QK^{LlHh}``     ``(W_Q^hᵀ, W_K^g)``, kept factored                                 factors
``W_K^{LlKVg}``…    key/value head ``g``'s own (grouped-query attention)               factors
``W_Q``, ``b_Q``…   a q/k norm's gain and centring folded in (``attn.folded``)         factors
``W_O``, ``W_OV``   a norm after attention's gain folded in (``folded_W_O``)           factors
``b_O^{Ll}``        ``model.folded_b_O(l)`` (``b_V`` folded in)                        factors ``[d_model, 1]``
``b_Qn``, ``b_Kn``  a q/k layer norm's bias, ``attn.q_norm.bias[h]``                   factors ``[d_head, 1]``
``B_ALiBi^{LlHh}``  ``m_h (j - i)`` (the head's ALiBi slope)                           factors ``[n_ctx, n_ctx]``
==================  =================================================================  ==========================

Residual-side atoms are bound to a tuple of *factors* whose product is the atom's
matrix, so that ``W_OV = W_O W_V`` is applied as two thin products (``d_head`` wide) and a
``vocab × vocab`` matrix is never formed. Coefficients are bound too: ``1/sqrt(d_head)``
becomes the model's own ``1/attn_scale`` (``d_head`` is replaced by ``attn_scale²``).

>>> from derivations.architecture import Architecture
>>> from numeric_check.model.circuit_model import CircuitModel
>>> from numeric_check.verification.hook_paths import record
>>> from tensoralg import atom
>>> model = CircuitModel.random(Architecture(1, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0)
>>> binder = Binder(model, record(model, torch.tensor([[1, 2, 3]])))
>>> [tuple(f.shape) for f in binder.factors(atom("W_OV", "L0H1"))]
[(8, 4), (4, 8)]
>>> tuple(binder.position(atom("A", "L0H1")).value.shape)
(1, 3, 3)
"""

from __future__ import annotations

import re
from typing import NamedTuple

import sympy as sp
import torch
from torch import Tensor

from derivations.paths import Source
from numeric_check.errors import AtomBindingError
from numeric_check.model.circuit_model import CircuitModel, token_columns
from numeric_check.verification.hook_paths import Recording
from numeric_check.model.hooks import block_hook
from numeric_check.model.layers import alibi_bias
from tensoralg.atoms import Atom


_INDEX = re.compile(r"^L(?P<layer>\d+)(?:H(?P<head>\d+)|KV(?P<group>\d+))?(?:,(?P<tag>qk|q|k|post))?$", re.ASCII)
_HEAD_WEIGHTS = ("W_Q", "W_K", "W_V", "W_O", "W_OV", "W_QK", "b_Q", "b_K", "b_V", "b_Qn", "b_Kn")
_KV_WEIGHTS = ("W_K", "W_V", "b_K", "b_V", "b_Kn")  # one per key/value head: indexed by group when grouped


# --- bound values ---------------------------------------------------------------------------


class PositionValue(NamedTuple):
    """A position-side atom for this batch: ``diagonal`` means ``value`` is ``[b, pos]`` (a
    diagonal matrix per sequence), otherwise ``value`` is ``[b, pos, pos]``."""

    value: Tensor
    diagonal: bool


class SourceInput:
    """The input ``X`` of a source (one row per position), applied lazily: ``X Fᵀ`` for a
    token source gathers columns of ``F`` instead of multiplying by one-hots.

    ``kind``: ``token`` (one-hots ``[pos, d_vocab]``), ``position`` (identity rows
    ``[pos, n_ctx]``), ``ones`` (``[pos, 1]``, every bias) or ``dense`` (``[b, pos, d]``:
    an MLP's recorded output).
    """

    def __init__(self, kind: str, n_batch: int, n_pos: int, *, tokens: Tensor | None = None,
                 dense: Tensor | None = None, width: int = 1, dtype=None, device=None):
        self.kind, self.n_batch, self.n_pos = kind, n_batch, n_pos
        self.tokens, self.dense, self.width = tokens, dense, width
        self.dtype, self.device = dtype, device

    def times_transpose(self, F: Tensor) -> Tensor:
        """``X Fᵀ`` as ``[b, pos, rows of F]``."""
        b, p = self.n_batch, self.n_pos
        if self.kind == "token":
            return token_columns(F, self.tokens)  # [b, pos, r]: columns of F picked by token id
        if self.kind == "position":
            return F[:, :p].T.expand(b, p, F.shape[0])
        if self.kind == "ones":
            return F[:, 0].expand(b, p, F.shape[0])
        return self.dense @ F.T

    def as_dense(self) -> Tensor:
        """``X`` itself, ``[b, pos, width]`` (one-hots and identity rows materialised)."""
        b, p = self.n_batch, self.n_pos
        if self.kind == "dense":
            return self.dense
        if self.kind == "ones":
            return torch.ones(b, p, 1, dtype=self.dtype, device=self.device)
        eye = torch.eye(self.width, dtype=self.dtype, device=self.device)
        if self.kind == "token":
            return eye[self.tokens]
        return eye[:p].expand(b, p, self.width)


# --- the binder -----------------------------------------------------------------------------


class Binder:
    """Tensors for the atoms, coefficients and sources of expansions of ``model`` on one batch.

    The model must already be in the dtype and on the device wanted; every value is taken
    from it (or from ``recording``, a forward pass of that same model). Values are cached.
    """

    def __init__(self, model: CircuitModel, recording: Recording):
        self.model = model
        self.recording = recording
        self.cfg = model.cfg
        self._factors: dict[tuple, tuple[Tensor, ...]] = {}
        self._positions: dict[tuple, PositionValue] = {}
        self._coeffs: dict[sp.Expr, float] = {}
        self._dims = {
            "d_model": self.cfg.d_model,
            "d_vocab": self.cfg.d_vocab,
            "n_ctx": self.cfg.n_ctx,
            "d_mlp": self.cfg.d_mlp,
            # sqrt(d_head) stands for the model's attention scale, whatever it is
            "d_head": self.cfg.scale**2,
        }

    # -- parsing ---------------------------------------------------------------
    def _layer_head(self, a: Atom, need_head: bool) -> tuple[int, int | None, str | None]:
        match = _INDEX.match(a.index)
        if match is not None and match["group"] is not None and need_head:
            return self._layer_group(a, match)
        if match is None or (need_head and match["head"] is None) or (
            not need_head and (match["head"] is not None or match["group"] is not None)
        ):
            want = "L{layer}H{head}" if need_head else "L{layer}"
            raise AtomBindingError(f"atom {a.label!r} has index {a.index!r}; expected {want} (e.g. {want.format(layer=0, head=1)})")
        layer = int(match["layer"])
        head = None if match["head"] is None else int(match["head"])
        arch = self.model.arch
        if layer >= arch.n_layers or (head is not None and head >= arch.heads_per_layer[layer]):
            raise AtomBindingError(
                f"atom {a.label!r} refers to a head or layer this model does not have ({arch.describe()}); "
                "the expansion was built for another architecture"
            )
        return layer, head, match["tag"]

    def _layer_group(self, a: Atom, match) -> tuple[int, int, bool]:
        """``(layer, group, False)`` for a key/value atom of a grouped layer, ``W_K^{L0KV1}``."""
        layer, group = int(match["layer"]), int(match["group"])
        arch = self.model.arch
        if a.name not in _KV_WEIGHTS:
            raise AtomBindingError(f"atom {a.label!r} has a key/value index, but only {', '.join(_KV_WEIGHTS)} are shared by a group")
        if layer >= arch.n_layers or group >= arch.kv_heads_per_layer[layer]:
            raise AtomBindingError(
                f"atom {a.label!r} refers to a key/value head this model does not have ({arch.describe()}); "
                "the expansion was built for another architecture"
            )
        return layer, group, False

    # -- position side ----------------------------------------------------------
    def position(self, a: Atom) -> PositionValue:
        """The value of a position-side atom (``A`` or ``N``) for this batch, transposed if ``a`` is."""
        key = a.key
        if key not in self._positions:
            value = self._position(a.base)
            if a.transposed and not value.diagonal:
                value = PositionValue(value.value.transpose(-1, -2), False)
            self._positions[key] = value
        return self._positions[key]

    def _position(self, a: Atom) -> PositionValue:
        rec = self.recording
        if a.name == "A":
            layer, head, _ = self._layer_head(a, need_head=True)
            pattern = rec.get(block_hook(layer, "attn.hook_pattern"), f"atom {a.label}")
            return PositionValue(pattern[:, head], False)  # [b, q, k]
        if a.name == "N":
            match = _INDEX.match(a.index)
            if match is not None and match["tag"] in ("q", "k"):
                return self._qk_norm_scale(a, match)
            if a.index == "final":
                name = "ln_final.hook_scale"
            else:
                layer, _, tag = self._layer_head(a, need_head=False)
                name = block_hook(layer, {"qk": "ln1_qk", "post": "ln1_post"}.get(tag, "ln1") + ".hook_scale")
            if not self.model.arch.normalised:
                raise AtomBindingError(f"atom {a.label!r} is a norm's scale but the model has no layer norm or RMSNorm")
            scale = rec.get(name, f"atom {a.label}")
            return PositionValue(1.0 / scale[..., 0], True)  # [b, pos]
        raise AtomBindingError(f"unknown position-side atom {a.label!r}; expected A^{{L<l>H<h>}} or N^{{...}}")

    def _qk_norm_scale(self, a: Atom, match) -> PositionValue:
        """``N^{L1H0,q}``, ``N^{L1KV0,k}`` (``N^{L1H0,k}`` ungrouped) or ``N^{L1,q}`` (a norm over all heads):
        ``1 / attn.q_norm.hook_scale`` (``k_norm``) of that head (its key/value group's first query head)."""
        layer = int(match["layer"])
        arch = self.model.arch
        if layer >= arch.n_layers or arch.qk_norm is None:
            raise AtomBindingError(f"atom {a.label!r} is a q/k norm's scale, but the model has none in layer {layer} ({arch.describe()})")
        if (match["head"] is None and match["group"] is None) != (arch.qk_norm_scope == "all"):
            raise AtomBindingError(f"atom {a.label!r}: the model's q/k norm runs over {'all heads' if arch.qk_norm_scope == 'all' else 'each head'}; "
                                   "the expansion was built for another architecture")
        attn = self.model.blocks[layer].attn
        if match["group"] is not None:
            owners = (attn.kv_index == int(match["group"])).nonzero()
            column = int(owners[0]) if len(owners) else attn.n_heads
        else:
            column = 0 if match["head"] is None else int(match["head"])
        if column >= attn.n_heads:
            raise AtomBindingError(f"atom {a.label!r} refers to a head this model does not have ({arch.describe()})")
        scale = self.recording.get(block_hook(layer, f"attn.{match['tag']}_norm.hook_scale"), f"atom {a.label}")
        return PositionValue(1.0 / scale[:, :, column, 0], True)  # [b, pos]

    # -- residual side ----------------------------------------------------------
    def factors(self, a: Atom) -> tuple[Tensor, ...]:
        """Matrices whose product is ``a`` (transposed if ``a`` is), 2-D, on the model's device."""
        key = a.key
        if key not in self._factors:
            base = tuple(f.detach() for f in self._base_factors(a.base))
            self._factors[key] = tuple(f.T for f in reversed(base)) if a.transposed else base
        return self._factors[key]

    def _base_factors(self, a: Atom) -> tuple[Tensor, ...]:
        model, name = self.model, a.name
        if name in ("W_E", "W_U", "W_pos", "b_U"):
            value = getattr(model, name)
            if value is None:
                raise AtomBindingError(f"atom {a.label!r} is not part of this model ({model.arch.describe()})")
            return (value if value.ndim == 2 else value[:, None],)
        if name in _HEAD_WEIGHTS:
            layer, head, _ = self._layer_head(a, need_head=True)
            attn = model.blocks[layer].attn
            if name == "W_OV":
                return (model.folded_W_O(layer)[head], attn.W_V[int(attn.kv_index[head])])
            if name == "W_O":
                return (model.folded_W_O(layer)[head],)
            if name == "W_QK":
                return (attn.folded("Q")[0][head].T, attn.folded("K")[0][int(attn.kv_index[head])])
            if name in ("b_Qn", "b_Kn"):
                norm = attn.q_norm if name == "b_Qn" else attn.k_norm
                if norm is None or norm.bias is None:
                    raise AtomBindingError(f"atom {a.label!r} is a q/k layer norm's bias, but the model has none")
                return (norm.bias[head][:, None],)
            if name in _KV_WEIGHTS and attn.grouped and "KV" not in a.index:
                raise AtomBindingError(f"atom {a.label!r}: layer {layer} shares its keys and values between heads; "
                                       f"name them by group, {a.name}^{{L{layer}KV{int(attn.kv_index[head])}}}")
            value = attn.folded(name[-1])[name.startswith("b_")] if name[-1] in "QK" else getattr(attn, name)
            if value is None:
                raise AtomBindingError(f"atom {a.label!r} is a bias but the model has no biases")
            return (value[head] if name.startswith("W_") else value[head][:, None],)
        if name == "B_ALiBi":
            layer, head, _ = self._layer_head(a, need_head=True)
            slopes = model.blocks[layer].attn.alibi_slopes
            if slopes is None:
                raise AtomBindingError(f"atom {a.label!r} is an ALiBi bias but the model has no ALiBi ({model.arch.describe()})")
            return (alibi_bias(slopes[head:head + 1].to(model.dtype), self.cfg.n_ctx, *model.blocks[layer].attn.alibi_form)[0],)  # [n_ctx, n_ctx]: query i, key j
        if name == "b_O":
            layer, _, _ = self._layer_head(a, need_head=False)
            if not model.arch.biases:
                raise AtomBindingError(f"atom {a.label!r} is a bias but the model has no biases")
            return (model.folded_b_O(layer)[:, None],)
        if name in ("W_in", "W_out"):
            layer, _, _ = self._layer_head(a, need_head=False)
            mlp = model.blocks[layer].mlp
            if mlp is None:
                raise AtomBindingError(f"atom {a.label!r} is an MLP weight but the model has no MLPs")
            if getattr(mlp, name).ndim != 2:
                raise AtomBindingError(f"atom {a.label!r}: layer {layer}'s MLP is a mixture of experts, with one {name} per expert")
            return (getattr(mlp, name),)
        raise AtomBindingError(
            f"no binding for atom {a.label!r}; bindable atoms: A, N, W_E, W_pos, W_U, b_U, "
            + ", ".join(_HEAD_WEIGHTS) + ", b_O, W_in, W_out"
        )

    # -- coefficients and sources ------------------------------------------------
    def coeff(self, c) -> float:
        """A term's coefficient as a float, with the model's sizes (``sqrt(d_head)`` → attention scale)."""
        if c is sp.S.One:  # nearly every logits term: no SymPy hashing
            return 1.0
        c = sp.sympify(c)
        if c not in self._coeffs:
            subs = {s: self._dims[s.name] for s in c.free_symbols if self._dims.get(s.name) is not None}
            value = c.subs(subs)
            if not value.is_number:
                raise AtomBindingError(f"coefficient {c} has symbols this model cannot bind: {sorted(map(str, value.free_symbols))}")
            self._coeffs[c] = float(value)
        return self._coeffs[c]

    def input_width(self, source: Source) -> int:
        """The columns of ``source``'s input ``X`` (``d_vocab``, ``n_ctx``, ``d_model`` or 1), cached by input."""
        cache = self.__dict__.setdefault("_widths", {})
        key = source.input_key
        if key not in cache:
            cache[key] = self.source_input(source).width
        return cache[key]

    def source_input(self, source: Source) -> SourceInput:
        """The input ``X`` of ``source`` for this batch (see :mod:`derivations.paths`)."""
        rec, model = self.recording, self.model
        b, p = rec.n_batch, rec.n_pos
        common = {"dtype": model.dtype, "device": model.device}
        if source.kind == "token":
            return SourceInput("token", b, p, tokens=rec.tokens, width=self.cfg.d_vocab, **common)
        if source.kind in ("position", "alibi"):  # ALiBi's term reads the identity of positions on both sides
            return SourceInput("position", b, p, width=self.cfg.n_ctx, **common)
        if source.kind == "mlp":
            if source.layer >= model.arch.n_layers:
                raise AtomBindingError(f"source {source.label} refers to layer {source.layer}, but the model has {model.arch.n_layers} layers")
            dense = rec.get(block_hook(source.layer, "hook_mlp_out"), f"source {source.label}")
            return SourceInput("dense", b, p, dense=dense, width=self.cfg.d_model, **common)
        return SourceInput("ones", b, p, **common)
