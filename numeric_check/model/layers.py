"""The layers of the reference model: parameter-free norms, attention and MLPs (paper convention).

:class:`~numeric_check.model.circuit_model.CircuitModel` assembles them into blocks; see its
module for the forward pass and the hook points.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from numeric_check.model.config import ACT_FNS, ModelConfig
from numeric_check.model.rotary import rotate, tables_dtype
from numeric_check.model.hooks import HookPoint

class LayerNorm(nn.Module):
    """Parameter-free layer norm: centre, then divide by ``hook_scale = sqrt(mean(x²) + eps)``.

    ``centre=False`` is RMSNorm: the same frozen per-position scale, without the centring."""

    def __init__(self, eps: float, centre: bool = True):
        super().__init__()
        self.eps, self.centre = eps, centre
        self.hook_scale = HookPoint()  # [batch, pos, 1]

    def forward(self, x: Tensor) -> Tensor:
        if self.centre:
            x = x - x.mean(-1, keepdim=True)
        tiles = self.hook_scale.fixed_tiles((*x.shape[:-1], 1))
        if tiles is not None:  # one recorded scale for every copy of the batch: divided by it, not by its copies
            base, copies = tiles
            return (x.view(copies, *base.shape[:-1], x.shape[-1]) / base).view(x.shape)
        scale = self.hook_scale.fixed((*x.shape[:-1], 1))  # frozen by a Constant hook: no variance needed
        if scale is None:
            scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return x / scale


def make_norm(cfg: ModelConfig, reads_sublayer: bool = False) -> nn.Module:
    """The model's parameter-free norm: layer norm, RMSNorm (no centring) or none (``Identity``);
    ``reads_sublayer``: a norm before a sublayer (``ln1``, ``ln2``), none when the model normalises
    only after its sublayers (``sublayer_norm="post"``)."""
    if cfg.arch.norm == "none" or (reads_sublayer and not cfg.arch.pre_norm):
        return nn.Identity()
    return LayerNorm(cfg.ln_eps, centre=cfg.arch.norm == "layer_norm")


class QKNorm(nn.Module):
    """A norm of each head's queries (or keys): q/k normalisation (Qwen3, OLMo 2, Persimmon, StableLM, Cohere).

    Over each head's ``d_head`` entries (``scope="head"``) or over all heads' at once (``"all"``,
    OLMo 2): centre (layer norm only), divide by ``hook_scale = sqrt(mean(x²) + eps)`` (``[b, p,
    heads or 1, 1]``, frozen by a Constant hook like any norm's scale), multiply by ``gain`` and
    add ``bias`` (layer norm only), both ``[heads, d_head]`` (one row per head that owns the
    projection: query heads, or key/value heads, repeated like the keys); through ``hook_normalized``.
    In the algebra the scale is a diagonal position factor, and the gain and centring fold into
    ``W_Q``/``W_K`` and their biases (:meth:`fold`).
    """

    def __init__(self, kind: str, scope: str, eps: float, n_heads: int, d_head: int, **factory: Any):
        super().__init__()
        self.centre, self.over_heads, self.eps = kind == "layer_norm", scope == "all", eps
        self.gain = nn.Parameter(torch.ones(n_heads, d_head, **factory))
        self.bias = _optional_param(self.centre, n_heads, d_head, **factory)
        self.hook_scale = HookPoint()  # [batch, pos, heads or 1, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, heads, d_head]

    def forward(self, x: Tensor, per_head) -> Tensor:
        dims = (-2, -1) if self.over_heads else (-1,)
        if self.centre:
            x = x - x.mean(dims, keepdim=True)
        scale = self.hook_scale.fixed((*x.shape[:-2], 1 if self.over_heads else x.shape[-2], 1))
        if scale is None:
            scale = self.hook_scale((x.pow(2).mean(dims, keepdim=True) + self.eps).sqrt())
        out = x / scale * per_head(self.gain)
        return self.hook_normalized(out if self.bias is None else out + per_head(self.bias))

    def fold(self, W: Tensor, b: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``diag(gain) C W`` and ``diag(gain) C b`` for a projection ``W [heads, d_head, d_model]`` and its
        bias ``b [heads, d_head]`` (``C``: the layer norm's centring, over the head or over all heads;
        none for RMSNorm): what the queries (keys) are before the frozen scale divides them."""
        if self.centre:
            axes = (0, 1) if self.over_heads else (1,)
            W = W - W.mean(axes, keepdim=True)
            b = None if b is None else b - b.mean(axes, keepdim=True)
        return self.gain[..., None] * W, None if b is None else self.gain * b


class PostNorm(nn.Module):
    """An RMSNorm of a sublayer's output before it joins the stream (OLMo 2, Gemma 2's sandwich norms):
    divide by ``hook_scale = sqrt(mean(x²) + eps)`` (``[batch, pos, 1]``), multiply by ``gain``
    ``[d_model]``. In the algebra the scale is a diagonal position factor ``N^{Ll,post}`` and the
    gain folds into ``W_O`` and ``b_O`` (or is inside an MLP's opaque output)."""

    def __init__(self, eps: float, d_model: int, **factory: Any):
        super().__init__()
        self.eps = eps
        self.gain = nn.Parameter(torch.ones(d_model, **factory))
        self.hook_scale = HookPoint()  # [batch, pos, 1]

    def forward(self, x: Tensor) -> Tensor:
        scale = self.hook_scale.fixed((*x.shape[:-1], 1))
        if scale is None:
            scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.frozen(x, scale)

    def frozen(self, x: Tensor, scale: Tensor) -> Tensor:
        """The norm of ``x [..., pos, d_model]`` with its scale ``[..., pos, 1]`` given: ``gain ⊙ x / scale``."""
        return x / scale * self.gain


def alibi_slopes(n_heads: int, dtype=None, device=None) -> Tensor:
    """ALiBi's slope of each head (Press et al.; BLOOM, MPT, TransformerLens): ``2^(-8(h+1)/n)`` for
    ``n`` a power of two, else those of the power below, then every other one of twice that many."""
    def powers(n: int) -> list[float]:
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    below = 2 ** math.floor(math.log2(n_heads))
    slopes = powers(below) + powers(2 * below)[0::2][: n_heads - below]
    return torch.tensor(slopes, dtype=torch.float64, device=device).to(dtype=dtype)


def alibi_bias(slopes: Tensor, n_pos: int, rounding: str | None = None, divisor: float = 1.0) -> Tensor:
    """ALiBi's position-only bias ``m_h (j - i)`` ``[heads, q, k]``: query ``i``, key ``j`` (``<= 0`` where kept).
    ``rounding``: the bias of key ``j`` made as a family makes it, ``b_h(j) = (m_h · j) / divisor`` with ``m_h`` and
    the product rounded to that dtype (Falcon: bfloat16, whatever the model's), as ``b_h(j) − b_h(i)`` (the same
    pattern: a row's constant leaves the softmax unchanged).

    >>> alibi_bias(torch.tensor([0.5]), 3)[0]
    tensor([[ 0.0000, 0.5000, 1.0000],
            [-0.5000,  0.0000,  0.5000],
            [-1.0000, -0.5000,  0.0000]])
    """
    rounding = rounding or (None if tables_dtype() is None else str(tables_dtype()).removeprefix("torch."))
    if rounding is None:
        i = torch.arange(n_pos, dtype=slopes.dtype, device=slopes.device)
        return slopes[:, None, None] * (i[None, None, :] - i[None, :, None])
    key = slopes.to(getattr(torch, rounding))[:, None] * torch.arange(n_pos, device=slopes.device)  # as Falcon: in that dtype
    key = key.to(slopes.dtype) / divisor
    if tables_dtype() is not None:  # as the source adds it (BLOOM: b_h(j) alone, large far into the context, rounds so)
        return key[:, None, :].expand(-1, n_pos, -1)
    return key[:, None, :] - key[:, :, None]


def _param(*shape: int, **factory: Any) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape, **factory))


def _optional_param(present: bool, *shape: int, **factory: Any) -> nn.Parameter | None:
    return _param(*shape, **factory) if present else None


@contextmanager
def fused_attention(model: nn.Module, on: bool = True):
    """Within the block, ``model``'s attention layers use torch's fused causal kernel while nothing hooks their
    scores or patterns (``on``; :attr:`Attention.fused`), and afterwards what they used before: for forward
    passes that need only the output, such as losses over many long windows (4 to 6x faster at 512 positions)."""
    before = set_fused(model, on)
    try:
        yield model
    finally:
        for m, fused in before.items():
            m.fused = fused


def set_fused(model: nn.Module, on: bool) -> dict:
    """Set :attr:`Attention.fused` of every attention layer of ``model`` to ``on``; what each held before."""
    before = {}
    for m in model.modules():
        if isinstance(m, Attention):
            before[m], m.fused = m.fused, on
    return before


class Attention(nn.Module):
    """Causal multi-head attention in the paper's weight convention.

    Grouped-query attention: ``W_K``, ``W_V`` (and ``b_K``, ``b_V``) hold one matrix per
    key/value head, ``[n_kv_heads, d_head, d_model]``; query head ``h`` reads key/value head
    :attr:`kv_index` ``[h]`` (Hugging Face's ``repeat_kv``). ``hook_k`` and ``hook_v`` carry one
    entry per *query* head, ``[b, p, n_heads, d_head]``, the shared ones repeated, so every
    reader indexes them by query head. Rotary turns the queries and keys by position in
    :meth:`scores` (``hook_q``/``hook_k`` hold them unrotated). q/k normalisation (:class:`QKNorm`,
    ``q_norm`` and ``k_norm``) runs between ``hook_q``/``hook_k`` and the scores.
    """

    def __init__(self, n_heads: int, cfg: ModelConfig, n_kv_heads: int | None = None, layer: int = 0, **factory: Any):
        super().__init__()
        self.n_heads, self.scale = n_heads, cfg.scale
        self.window, self.softcap = cfg.arch.window_of(layer), cfg.arch.attn_softcap
        slopes = None
        if cfg.arch.alibi:
            slopes = alibi_slopes(n_heads, **factory) if cfg.alibi_slopes is None else torch.tensor(cfg.alibi_slopes, **factory)
        self.register_buffer("alibi_slopes", slopes, persistent=False)
        self.alibi_form = (cfg.alibi_rounding, cfg.alibi_divisor)  # how the bias is made from the slopes (alibi_bias)
        g = n_heads if n_kv_heads is None else n_kv_heads
        self.n_kv_heads = g
        h, e, d, bias = n_heads, cfg.d_head, cfg.d_model, cfg.arch.biases
        self.W_Q, self.W_K, self.W_V = _param(h, e, d, **factory), _param(g, e, d, **factory), _param(g, e, d, **factory)
        self.W_O = _param(h, d, e, **factory)
        self.b_Q = _optional_param(bias, h, e, **factory)
        self.b_K, self.b_V = (_optional_param(bias, g, e, **factory) for _ in range(2))
        self.b_O = _optional_param(bias, d, **factory)
        self.register_buffer("kv_index", torch.arange(h, device=factory.get("device")) // (h // g), persistent=False)
        self.rotary = cfg.rotary_args
        for name in ("q", "k", "v"):
            setattr(self, f"hook_{name}", HookPoint())
        qk_norm = cfg.arch.qk_norm
        self.q_norm = None if qk_norm is None else QKNorm(qk_norm, cfg.arch.qk_norm_scope, cfg.ln_eps, h, e, **factory)
        self.k_norm = None if qk_norm is None else QKNorm(qk_norm, cfg.arch.qk_norm_scope, cfg.ln_eps, g, e, **factory)
        for name in ("attn_scores", "pattern", "z", "result"):
            setattr(self, f"hook_{name}", HookPoint())
        #: Whether a forward pass with nothing hooked on the scores or the pattern may use torch's fused causal
        #: attention (``scaled_dot_product_attention``): set by training (``TrainConfig.attention_kernel``), off
        #: for every model that is analysed, so its pattern is always the einsum's (see :meth:`_fused_z`).
        self.fused = False

    def folded(self, side: str) -> tuple[Tensor, Tensor | None]:
        """``(W, b)`` of the queries (``side="Q"``) or keys (``"K"``) as the algebra binds ``W_Q``/``W_K``
        and ``b_Q``/``b_K``: the parameters themselves, or with a q/k norm its gain and centring folded
        in (:meth:`QKNorm.fold`), one row per head that owns them."""
        W, b = (self.W_Q, self.b_Q) if side == "Q" else (self.W_K, self.b_K)
        norm = self.q_norm if side == "Q" else self.k_norm
        return (W, b) if norm is None else norm.fold(W, b)

    @property
    def grouped(self) -> bool:
        return self.n_kv_heads != self.n_heads

    def per_head(self, t: Tensor | None) -> Tensor | None:
        """A parameter with one entry per query head: a key/value one (``W_K``, ``W_V``, ``b_K``,
        ``b_V``) with its shared entries repeated; a query-head one (``W_Q``, ``W_O``…) as it is."""
        return t if t is None or t.shape[0] == self.n_heads else t[self.kv_index]

    def _project(self, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        out = torch.einsum("bpd,hed->bphe", x, W)  # [batch, pos, heads of W, d_head]
        out = out if b is None else out + b
        return out[:, :, self.kv_index] if W.shape[0] != self.n_heads else out  # shared heads repeated

    def forward(self, qk_in: Tensor, v_in: Tensor, discarded: bool = False) -> Tensor | None:
        """The attention output ``[batch, pos, d_model]``; ``discarded``: the caller replaces it
        (a Constant on ``hook_attn_out``), so only what a hook on ``hook_z`` reads is computed
        (nothing, when none) and ``None`` is returned."""
        if discarded and not (self.hook_z.has_hooks or self.hook_result.has_hooks):
            return None
        n_batch, n_pos = v_in.shape[:2]
        shape = (n_batch, self.n_heads, n_pos, n_pos)
        tiles = self.hook_pattern.fixed_tiles(shape)
        if tiles is not None and tiles[0].shape[0] == 1:  # copies of one sequence: one pattern for all of them
            z = self.hook_z(self._tiled_z(tiles[0][0], self.hook_v(self._project(v_in, self.W_V, self.b_V))))
            return self._output(z, discarded)
        # a pattern frozen by a Constant hook (path isolation) needs no queries, keys or scores
        pattern = self.hook_pattern.fixed(shape)
        if pattern is None:
            q = self.hook_q(self._project(qk_in, self.W_Q, self.b_Q))
            k = self.hook_k(self._project(qk_in, self.W_K, self.b_K))
            if self.q_norm is not None:  # q/k normalisation: after the projections, before rotary
                q, k = self.q_norm(q, self.per_head), self.k_norm(k, self.per_head)
        v = self.hook_v(self._project(v_in, self.W_V, self.b_V))
        if pattern is None and self._fusable():
            return self._output(self.hook_z(self._fused_z(q, k, v)), discarded)
        if pattern is None:
            pattern = self.hook_pattern(self.pattern_of(self.scores(q, k)))
        return self._output(self.hook_z(torch.einsum("bhqk,bkhe->bqhe", pattern, v)), discarded)  # z: [batch, pos, n_heads, d_head]

    def _fusable(self) -> bool:
        """Whether :meth:`_fused_z` computes what the scores and the pattern would: :attr:`fused` set, plain causal
        attention (no rotary, ALiBi, window or soft-cap) and nothing hooked on the scores or the pattern."""
        return (self.fused and self.rotary is None and self.alibi_slopes is None and self.window is None
                and self.softcap is None and not (self.hook_attn_scores.has_hooks or self.hook_pattern.has_hooks))

    def _fused_z(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``z`` ``[batch, pos, n_heads, d_head]`` by torch's fused causal attention: the pattern is never formed
        (4 to 6x faster to train at 512 positions on a CPU; equal to the einsum's to float32 rounding)."""
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [batch, heads, pos, d_head]
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / self.scale)
        return z.transpose(1, 2)

    @staticmethod
    def _tiled_z(pattern: Tensor, v: Tensor) -> Tensor:
        """``z`` of copies of one sequence that share its ``pattern`` (``[heads, q, k]``): one product a head over
        every copy's values (``v`` ``[copies, k, heads, d_head]``), ``[copies, q, heads, d_head]`` (a view of it)."""
        copies, k, h, e = v.shape
        z = pattern @ v.permute(2, 1, 0, 3).reshape(h, k, copies * e)  # [heads, q, copies · d_head]
        return z.view(h, -1, copies, e).permute(2, 1, 0, 3)

    def _output(self, z: Tensor, discarded: bool) -> Tensor | None:
        """The attention output from ``z`` (see :meth:`forward`)."""
        if discarded and not self.hook_result.has_hooks:
            return None
        out = None
        if self.hook_result.has_hooks:  # each head's result, formed only when hooked (TL's use_attn_result)
            result = torch.einsum("bqhe,hde->bqhd", z, self.W_O)  # [batch, pos, n_heads, d_model]
            hooked = self.hook_result(result)
            out = None if hooked is result else hooked.sum(-2)  # hooks that only read change nothing, not even rounding
        if out is None:
            out = torch.einsum("bqhe,hde->bqd", z, self.W_O)
        return out if self.b_O is None else out + self.b_O

    def scores(self, q: Tensor, k: Tensor, heads: list[int] | None = None, bias_on: Tensor | float = 1.0) -> Tensor:
        """Pre-softmax scores ``[batch, heads, q, k]`` from queries and keys ``[batch, pos, heads, d_head]``
        (rotated by position first, with rotary): ``q·k / attn_scale``, plus ``bias_on`` times the ALiBi
        bias of ``heads`` (default: every head, in order), masked with ``-inf`` outside :meth:`mask`
        (causal, and the layer's sliding window); through ``hook_attn_scores``. A soft-cap acts
        after this (in :meth:`pattern_of`): the hook holds the scores before the cap."""
        if self.rotary is not None:
            q, k = (rotate(x, *self.rotary, pos_dim=1) for x in (q, k))
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / self.scale
        n_pos = scores.shape[-1]
        if self.alibi_slopes is not None:
            slopes = self.alibi_slopes if heads is None else self.alibi_slopes[heads]
            scores = scores + bias_on * alibi_bias(slopes.to(scores.dtype), n_pos, *self.alibi_form)
        return self.hook_attn_scores(scores.masked_fill(~self.mask(n_pos, scores.device), float("-inf")))

    def mask(self, n_pos: int, device=None) -> Tensor:
        """Which keys each query sees, ``[q, k]`` bool: ``j <= i``, and ``j > i - window`` in a sliding window."""
        i = torch.arange(n_pos, device=device)
        keep = i[None, :] <= i[:, None]
        return keep if self.window is None else keep & (i[None, :] > i[:, None] - self.window)

    def pattern_of(self, scores: Tensor) -> Tensor:
        """The softmax of (soft-capped, ``c·tanh(s/c)``, when the layer caps its scores) masked scores."""
        if self.softcap is not None:
            capped = self.softcap * torch.tanh(scores / self.softcap)
            scores = capped.masked_fill(~self.mask(scores.shape[-1], scores.device), float("-inf"))
        return scores.softmax(-1)

    def head_output(self, z: Tensor, head: int) -> Tensor:
        """One head's result ``z W_O^hᵀ`` ``[..., d_model]`` from its ``z`` ``[..., d_head]`` (no ``b_O``):
        what ``hook_result[..., head, :]`` holds."""
        return z @ self._W_O_transposed()[head]  # (a contiguous Wᵀ: 2x faster in float64 on a CPU)

    def head_outputs(self, z: Tensor, heads: list[int]) -> Tensor:
        """:meth:`head_output` of several heads at once: ``z [..., n, d_head]`` (head ``heads[i]`` at
        ``i``) gives ``[n, ..., d_model]``."""
        W = self._W_O_transposed()  # [n_heads, d_head, d_model]
        if list(heads) != list(range(len(W))):  # a subset: gathered (every head in order: no copy)
            W = W[heads]
        rows = z.movedim(-2, 0)  # [n, ..., d_head]
        return torch.bmm(rows.reshape(len(W), -1, rows.shape[-1]), W).view(*rows.shape[:-1], W.shape[-1])  # one product a head

    def _W_O_transposed(self) -> Tensor:
        """``W_O`` as ``[n_heads, d_head, d_model]``, contiguous, made once per version of ``W_O``."""
        key = (self.W_O.data_ptr(), self.W_O._version, self.W_O.dtype, self.W_O.device)
        cached = self.__dict__.get("_W_O_T")
        if cached is None or cached[0] != key:
            cached = (key, self.W_O.detach().transpose(1, 2).contiguous())
            self.__dict__["_W_O_T"] = cached
        return cached[1]


class MLP(nn.Module):
    """``W_out act(W_in x + b_in) + b_out``, with hooks before and after the activation.

    Gated (``cfg.gated_mlp``: SwiGLU, GeGLU): ``W_out (act(W_gate x + b_gate) * (W_in x + b_in)) + b_out``,
    with ``hook_pre`` the gate before its activation and ``hook_pre_linear`` the linear part
    (TransformerLens' names). Either way an opaque source to the algebra."""

    def __init__(self, cfg: ModelConfig, **factory: Any):
        super().__init__()
        m, d, bias = cfg.d_mlp, cfg.d_model, cfg.arch.biases
        self.act_fn = ACT_FNS[cfg.act_fn]
        self.W_in, self.W_out = _param(m, d, **factory), _param(d, m, **factory)
        self.b_in, self.b_out = _optional_param(bias, m, **factory), _optional_param(bias, d, **factory)
        self.W_gate = _optional_param(cfg.gated_mlp, m, d, **factory)
        self.b_gate = _optional_param(cfg.gated_mlp and bias, m, **factory)
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_pre_linear = HookPoint() if cfg.gated_mlp else None
        self.hook_post = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        pre = x @ self.W_in.T
        pre = pre if self.b_in is None else pre + self.b_in
        if self.W_gate is None:
            post = self.act_fn(self.hook_pre(pre))
        else:
            gate = x @ self.W_gate.T
            gate = self.hook_pre(gate if self.b_gate is None else gate + self.b_gate)
            post = self.act_fn(gate) * self.hook_pre_linear(pre)
        out = self.hook_post(post) @ self.W_out.T
        return out if self.b_out is None else out + self.b_out
