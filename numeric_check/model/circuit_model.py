"""The reference transformer: weights in the paper's convention, a plain forward pass with hook points.

Shapes (paper convention, DESIGN.md): ``W_E [d_model, d_vocab]``, ``W_pos [d_model, n_ctx]``,
``W_U [d_vocab, d_model]``, per layer ``W_Q, W_K, W_V [n_heads, d_head, d_model]`` and
``W_O [n_heads, d_model, d_head]``. Activations have one row per position:
``[batch, pos, d_model]``; a weight ``W`` acts as ``x @ W.T``.

The forward pass (every named tensor passes through a :class:`~numeric_check.model.hooks.HookPoint`):

- ``x_0 = W_E t (+ W_pos)``; hooks ``hook_embed``, ``hook_pos_embed``.
- Per block ``l``: ``hook_resid_pre``; a parameter-free layer norm ``ln1`` (centre, then
  divide by ``ln1.hook_scale = sqrt(mean(centred²) + eps)``); queries and keys read
  ``ln1(x) + pos_embed`` for ``qk_only`` positions (as TransformerLens' shortformer does:
  the positional embedding is added *after* the layer norm), ``ln1(x)`` otherwise;
  values read ``ln1(x)``. Attention hooks ``attn.hook_q/k/v [b,p,h,d_head]``, then with
  q/k normalisation ``attn.q_norm/k_norm.hook_scale`` and ``.hook_normalized``,
  ``attn.hook_attn_scores [b,h,q,k]`` (plus ALiBi's bias; causal and the layer's sliding
  window, masked entries ``-inf``; *before* an attention soft-cap, which acts on the way to the
  pattern), ``attn.hook_pattern``, ``attn.hook_z``, ``attn.hook_result [b,p,h,d_model]`` (no
  ``b_O``; formed only when a hook reads it, as TransformerLens' ``use_attn_result``);
  ``hook_attn_out = Σ_h result + b_O`` (through ``ln1_post`` with norms after the sublayers);
  ``hook_resid_mid``; then, with MLPs, ``ln2.hook_scale``, ``mlp.hook_pre``, ``mlp.hook_post``
  (a mixture of experts: ``mlp.hook_router_logits``, ``mlp.hook_expert_weights``,
  ``mlp.hook_expert_indices``), ``hook_mlp_out`` (through ``ln2_post``); ``hook_resid_post``.
- ``ln_final.hook_scale``; ``logits = ln_final(x) @ W_U.T + b_U``, then ``c·tanh(logits/c)`` with a
  final soft-cap (Gemma 2): the expansion and verification are of the logits before the cap.

The layer-norm scale and the attention pattern used downstream are the hooks' outputs,
so a hook that replaces them freezes them (the paper's path-isolation procedure). When that
hook is a :class:`~numeric_check.model.hooks.Constant`, the model skips what it would discard:
queries, keys and scores (``hook_q``, ``hook_k``, ``hook_attn_scores`` then do not fire), or
the variance of a layer norm.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from copy import deepcopy
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import Tensor, nn

from derivations.architecture import Architecture
from numeric_check.errors import ConfigError, ModelInputError, WeightError
from numeric_check.model.config import ModelConfig, resolve_device, resolve_dtype
from numeric_check.model.moe import MixtureOfExperts
from numeric_check.model.layers import MLP, Attention, LayerNorm, PostNorm, _optional_param, _param, make_norm  # noqa: F401 (importable here)
from numeric_check.model.hooks import (
    HookFn,
    HookPoint,
    NameFilter,
    hooks_set_aside,
    name_hook_points,
    names_filter_to_predicate,
    select_hook_points,
)


class Block(nn.Module):
    """One residual block: attention, then (optionally) an MLP, each reading a layer norm (``ln1``, ``ln2``)
    and, with norms after the sublayers, each output normalised before it joins the stream
    (``ln1_post``, ``ln2_post``, before ``hook_attn_out``/``hook_mlp_out``, as TransformerLens)."""

    def __init__(self, n_heads: int, cfg: ModelConfig, n_kv_heads: int | None = None, layer: int = 0, **factory: Any):
        super().__init__()
        self.parallel = cfg.arch.parallel
        # registered in forward order, so hook_names lists them that way
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.ln1 = make_norm(cfg, reads_sublayer=True)
        self.attn = Attention(n_heads, cfg, n_kv_heads, layer=layer, **factory)
        post = cfg.arch.post_norm
        self.ln1_post = PostNorm(cfg.ln_eps, cfg.d_model, **factory) if post else None  # TransformerLens' names
        self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint()
        # a parallel block's MLP reads ln1's output: a parameter-free norm of the same stream
        self.ln2 = make_norm(cfg, reads_sublayer=True) if cfg.arch.mlp and not self.parallel else None
        self.mlp = None if not cfg.arch.mlp else MLP(cfg, **factory) if cfg.arch.experts is None else MixtureOfExperts(cfg, **factory)
        self.ln2_post = PostNorm(cfg.ln_eps, cfg.d_model, **factory) if post and cfg.arch.mlp else None
        self.hook_mlp_out = HookPoint() if cfg.arch.mlp else None
        self.hook_resid_post = HookPoint()

    def forward(self, resid_pre: Tensor, qk_pos: Tensor | None = None) -> Tensor:
        resid_pre = self.hook_resid_pre(resid_pre)
        normed = self.ln1(resid_pre)
        qk_in = normed if qk_pos is None else normed + qk_pos
        attn_out = self.hook_attn_out.fixed(resid_pre.shape)  # a Constant (path isolation): computed only if read
        if attn_out is None:
            attn_out = self.attn(qk_in, normed)
            attn_out = self.hook_attn_out(attn_out if self.ln1_post is None else self.ln1_post(attn_out))
        else:
            self.attn(qk_in, normed, discarded=True)
        resid_mid = self.hook_resid_mid(resid_pre if self.hook_attn_out.fixed_zero() else resid_pre + attn_out)
        if self.mlp is None:
            return self.hook_resid_post(resid_mid)
        mlp_out = self.hook_mlp_out.fixed(resid_mid.shape)  # a Constant (a recorded output): the MLP is not run
        if mlp_out is None:
            mlp_out = self.mlp(normed if self.parallel else self.ln2(resid_mid))
            mlp_out = self.hook_mlp_out(mlp_out if self.ln2_post is None else self.ln2_post(mlp_out))
        return self.hook_resid_post(resid_mid if self.hook_mlp_out.fixed_zero() else resid_mid + mlp_out)


class CircuitModel(nn.Module):
    """A transformer for any :class:`~derivations.architecture.Architecture`, paper-convention weights.

    ``CircuitModel(cfg)`` has zero weights; :meth:`random` draws them from a seed.

    >>> arch = Architecture(2, 2, positional="standard", layer_norm=True)
    >>> model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0)
    >>> model(torch.tensor([[1, 2, 3]])).shape
    torch.Size([1, 3, 10])
    >>> logits, cache = model.run_with_cache(torch.tensor([1, 2, 3]))
    >>> cache["blocks.1.attn.hook_pattern"].shape
    torch.Size([1, 2, 3, 3])
    """

    #: how closely this model computes the model it was converted from
    #: (:class:`~numeric_check.conversion.source_check.SourceCheck`); ``None`` when it was not converted
    source_check = None

    def __init__(self, cfg: ModelConfig, dtype: str | torch.dtype = torch.float32, device: str | torch.device | None = None):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise ConfigError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        arch = cfg.arch
        factory = {"dtype": resolve_dtype(dtype), "device": resolve_device(device)}
        self.W_E = _param(cfg.d_model, cfg.d_vocab, **factory)
        self.W_pos = _optional_param(arch.positional != "none", cfg.d_model, cfg.n_ctx, **factory)
        self.W_U = _param(cfg.d_vocab, cfg.d_model, **factory)
        self.b_U = _optional_param(arch.biases, cfg.d_vocab, **factory)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_pos_embed = HookPoint() if self.W_pos is not None else None  # [batch, pos, d_model]
        self.blocks = nn.ModuleList(Block(n, cfg, g, layer=l, **factory)
                                    for l, (n, g) in enumerate(zip(arch.heads_per_layer, arch.kv_heads_per_layer)))
        self.ln_final = make_norm(cfg)
        self._hook_points = name_hook_points(self)

    # --- properties ---------------------------------------------------------------------
    @property
    def arch(self) -> Architecture:
        return self.cfg.arch

    @property
    def dtype(self) -> torch.dtype:
        return self.W_E.dtype

    @property
    def device(self) -> torch.device:
        return self.W_E.device

    @property
    def hook_names(self) -> list[str]:
        """Every hook point name, in forward order."""
        return list(self._hook_points)

    def __repr__(self) -> str:
        cfg = self.cfg
        mlp = f", d_mlp={cfg.d_mlp}, act_fn={cfg.act_fn!r}{', gated' if cfg.gated_mlp else ''}" if cfg.arch.mlp else ""
        scale = "" if cfg.attn_scale is None else f", attn_scale={cfg.attn_scale}"
        if cfg.rotary_inv_freq is not None or cfg.rotary_factor != 1.0:
            scale += f", rope scaled ({'own frequencies, ' if cfg.rotary_inv_freq is not None else ''}factor {cfg.rotary_factor:g})"
        if cfg.arch.experts is not None and not cfg.moe_renormalise:
            scale += ", expert weights not renormalised"
        return (
            f"CircuitModel({cfg.arch.describe()}; d_model={cfg.d_model}, d_head={cfg.d_head}, "
            f"d_vocab={cfg.d_vocab}, n_ctx={cfg.n_ctx}{mlp}{scale}, dtype={self.dtype}, device={self.device})"
        )

    def _repr_html_(self) -> str:
        """In Jupyter: the architecture, the sizes, the dtype and device, the heads by layer as every report names
        them, and, for a converted model, how closely it computes its source."""
        from derivations.architecture import head_label
        from tensoralg.escape import escape_text

        cfg = self.cfg
        rows = [("architecture", cfg.arch.describe()), ("d_model, d_head", f"{cfg.d_model}, {cfg.d_head}"),
                ("d_vocab, n_ctx", f"{cfg.d_vocab:,}, {cfg.n_ctx:,}"), ("dtype, device", f"{self.dtype}, {self.device}")]
        if cfg.arch.mlp:
            rows.append(("MLP", f"d_mlp={cfg.d_mlp}, {cfg.act_fn}{', gated' if cfg.gated_mlp else ''}"))
        for layer, n in enumerate(cfg.arch.heads_per_layer):
            shown = [head_label(layer, h) for h in range(min(n, 8))]
            rows.append((f"layer {layer}", " ".join(shown) + (f" … {head_label(layer, n - 1)}" if n > 8 else "")))
        check = getattr(self, "source_check", None)
        if check is not None:
            rows.append(("source", check.describe()))
        cells = "".join(f"<tr><th style='text-align:left'>{escape_text(k, 'html')}</th><td style='text-align:left'>"
                        f"{escape_text(v, 'html')}</td></tr>" for k, v in rows)
        return f"<table><caption style='text-align:left'><b>CircuitModel</b></caption>{cells}</table>"

    # --- construction -------------------------------------------------------------------
    @classmethod
    def random(
        cls,
        arch: Architecture,
        *,
        d_model: int,
        d_head: int,
        d_vocab: int,
        n_ctx: int,
        d_mlp: int | None = None,
        act_fn: str = "gelu",
        gated_mlp: bool = False,
        rotary_base: float = 10000.0,
        rotary_inv_freq: tuple[float, ...] | None = None,
        rotary_factor: float = 1.0,
        seed: int = 0,
        dtype: str | torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        init_std: float | None = None,
    ) -> "CircuitModel":
        """A model with seeded random weights (drawn in float64 on CPU, so equal across devices).

        Weights are ``N(0, 1/fan_in)`` (embeddings ``N(0, 1)``), or ``N(0, init_std²)`` when
        given; biases are small and non-zero. With layer norm, every weight that writes to
        the residual stream is centred over ``d_model``, so the stream is mean-zero and each
        layer norm is exactly a per-position scale.

        >>> a = CircuitModel.random(Architecture(1, 1), d_model=4, d_head=2, d_vocab=5, n_ctx=3, seed=1)
        >>> b = CircuitModel.random(Architecture(1, 1), d_model=4, d_head=2, d_vocab=5, n_ctx=3, seed=1)
        >>> torch.equal(a.W_E, b.W_E)
        True
        """
        cfg = ModelConfig(arch, d_model=d_model, d_head=d_head, d_vocab=d_vocab, n_ctx=n_ctx, d_mlp=d_mlp, act_fn=act_fn,
                          gated_mlp=gated_mlp, rotary_base=rotary_base, rotary_inv_freq=rotary_inv_freq,
                          rotary_factor=rotary_factor)
        if init_std is not None and not (isinstance(init_std, (int, float)) and math.isfinite(init_std) and init_std > 0):
            raise ConfigError(f"init_std must be None or a finite number > 0, got {init_std!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed must be an int, got {seed!r}")
        model = cls(cfg, dtype=torch.float64, device="cpu")
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(_random_init(name, param, gen, init_std))
            if arch.layer_norm:
                model._centre_writing_weights()
        return model.to(device=resolve_device(device), dtype=resolve_dtype(dtype))

    @torch.no_grad()
    def _centre_writing_weights(self) -> None:
        """Subtract the mean over ``d_model`` from every weight and bias that writes to the residual stream."""
        for module, name, axis in self.residual_writers():
            tensor = getattr(module, name)
            tensor.sub_(tensor.mean(axis, keepdim=True))

    def residual_writers(self) -> list[tuple[nn.Module, str, int]]:
        """Every weight and bias that writes to the residual stream: ``(module, name, d_model axis)``.

        ``W_E``, ``W_pos`` for ``standard`` positions (``qk_only`` positions are added after the
        layer norm, to the queries' and keys' input only), and per block ``W_O``, ``b_O`` and the
        MLP's ``W_out``, ``b_out``; absent ones are left out.

        >>> m = CircuitModel.random(Architecture(1, 1, positional="qk_only", biases=True), d_model=4, d_head=2, d_vocab=5, n_ctx=3)
        >>> [name for _, name, _ in m.residual_writers()]
        ['W_E', 'W_O', 'b_O']
        """
        writers: list[tuple[nn.Module, str, int]] = [(self, "W_E", 0)]
        if self.arch.positional == "standard":
            writers.append((self, "W_pos", 0))
        for block in self.blocks:
            writers += [(block.attn, "W_O", 1), (block.attn, "b_O", 0)]
            if block.mlp is not None:
                axis = int(isinstance(block.mlp, MixtureOfExperts))  # experts stacked first: [n_experts, d_model, ...]
                writers += [(block.mlp, "W_out", axis), (block.mlp, "b_out", axis)]
        return [(module, name, axis) for module, name, axis in writers if getattr(module, name) is not None]

    def working_copy(self, dtype: str | torch.dtype = torch.float64, device: str | torch.device | None = None) -> "CircuitModel":
        """A copy in ``dtype`` on ``device`` (``None``: this model's device) for verification; ``self`` is not touched.

        The copy has its own modules and hook points (the hook functions registered here stay
        behind), frozen parameters, and its buffers on ``device`` too. With layer norm, its weights that write to the residual
        stream (:meth:`residual_writers`) are centred over ``d_model`` in the new dtype. Every
        reader of the stream is then a layer norm, which removes the mean anyway, so the copy
        computes the same function; but its stream is centred to the precision of ``dtype``
        (weights centred in float32 are centred only to about 1e-8 in float64), which makes
        each layer norm exactly a per-position scale, as the expansion treats it.

        Raises :class:`~numeric_check.errors.DeviceError` for a dtype or device that cannot be
        used and :class:`~numeric_check.errors.WeightError` for NaN/Inf weights.

        >>> m = CircuitModel.random(Architecture(1, 1, layer_norm=True), d_model=4, d_head=2, d_vocab=5, n_ctx=3)
        >>> w = m.working_copy(torch.float64, "cpu")
        >>> w.W_E.dtype, w.W_E.requires_grad, bool(w.W_E.mean(0).abs().max() < 1e-15)
        (torch.float64, False, True)
        """
        dtype = resolve_dtype(dtype)
        device = self.device if device is None else resolve_device(device)
        self.check_finite()
        with torch.no_grad(), hooks_set_aside(self):
            copy = deepcopy(self, memo={id(p): p for p in self.parameters()})  # new modules, the same weight tensors
        with torch.no_grad():
            for module in copy.modules():
                for name, p in list(module.named_parameters(recurse=False)):
                    # no copy when dtype and device already match: never modified in place
                    setattr(module, name, nn.Parameter(p.detach().to(device=device, dtype=dtype), requires_grad=False))
                for name, b in list(module.named_buffers(recurse=False)):
                    if b is not None:  # their users cast them to the dtype they meet
                        module._buffers[name] = b.to(device=device)
            if self.arch.layer_norm:  # centred once per weight, dtype and device (kept while the weight is unchanged)
                for (module, name, axis), (own, _, _) in zip(copy.residual_writers(), self.residual_writers()):
                    p = getattr(module, name)
                    centred = kept(getattr(own, name), ("centred", dtype, str(device)), lambda: _centred(p, axis))
                    if centred is not p:
                        setattr(module, name, nn.Parameter(centred, requires_grad=False))
        return copy

    # --- weights ------------------------------------------------------------------------
    def head_streams(self, layer: int, z: Tensor, heads: list[int], scale: Tensor | None) -> Tensor:
        """What heads ``heads`` of ``layer`` write to the stream from their ``z`` ``[..., n, d_head]``:
        ``attn.head_outputs`` ``[n, ..., d_model]``, through ``ln1_post`` with its frozen ``scale``
        (``[..., pos, 1]``) when the block normalises its attention output."""
        block = self.blocks[layer]
        out = block.attn.head_outputs(z, heads)
        return out if block.ln1_post is None else block.ln1_post.frozen(out, scale)

    def folded_b_O(self, layer: int) -> Tensor:
        """``b_O + Σ_h W_O^h b_V^h`` [d_model]: value biases move into ``b_O`` since pattern rows sum to 1;
        times ``ln1_post``'s gain when the block normalises its attention output (what the algebra's
        ``b_O^{Ll}`` stands for, behind the frozen scale ``N^{Ll,post}``).

        Zeros when the model has no biases.
        """
        self.arch.check_head(layer, 0)
        attn = self.blocks[layer].attn
        if attn.b_O is None:
            return torch.zeros(self.cfg.d_model, dtype=self.dtype, device=self.device)
        b = attn.b_O + torch.einsum("hde,he->d", attn.W_O, attn.per_head(attn.b_V))
        post = self.blocks[layer].ln1_post
        return b if post is None else post.gain * b

    def folded_W_O(self, layer: int) -> Tensor:
        """``W_O`` ``[n_heads, d_model, d_head]`` as the algebra binds it: times ``ln1_post``'s gain
        (a diagonal on the ``d_model`` side) when the block normalises its attention output."""
        self.arch.check_head(layer, 0)
        W_O, post = self.blocks[layer].attn.W_O, self.blocks[layer].ln1_post
        return W_O if post is None else post.gain[:, None] * W_O

    def check_finite(self) -> None:
        """Raise :class:`WeightError` naming the first parameter with NaN or Inf entries.

        A fast pre-check per parameter (:func:`weight_max_abs`: ``aminmax`` propagates NaN and sees ±Inf,
        without the boolean temporary of ``isfinite``; remembered while the parameter is unchanged); the
        exact scan runs only on a parameter that fails it.
        """
        for name, param in self.named_parameters():
            if not param.numel() or math.isfinite(weight_max_abs(param)):
                continue
            bad = ~torch.isfinite(param)
            if bad.any():
                first = tuple(int(i) for i in bad.nonzero()[0])
                n_nan, n_inf = int(torch.isnan(param).sum()), int(torch.isinf(param).sum())
                raise WeightError(
                    f"parameter {name} {tuple(param.shape)} has {n_nan} NaN and {n_inf} Inf entries "
                    f"(first at index {first}); weights must be finite"
                )

    # --- forward ------------------------------------------------------------------------
    def check_tokens(self, tokens: Tensor | Iterable) -> Tensor:
        """Validated tokens as a LongTensor on the model's device (shape unchanged).

        Raises :class:`ModelInputError` for a non-integer dtype, ``ndim`` other than 1 or 2,
        no positions or more than ``n_ctx``, or an id outside ``[0, d_vocab)``.
        """
        if not isinstance(tokens, Tensor):
            try:
                tokens = torch.as_tensor(tokens, device="cpu")  # a list or array: moved to the model below
            except (TypeError, ValueError, RuntimeError) as err:
                raise ModelInputError(f"tokens must be a tensor of integer ids, got {type(tokens).__name__}") from err
        if tokens.dtype == torch.bool or tokens.dtype.is_floating_point or tokens.dtype.is_complex:
            raise ModelInputError(f"tokens must have an integer dtype, got {tokens.dtype}")
        if tokens.ndim not in (1, 2):
            raise ModelInputError(f"tokens must have shape [pos] or [batch, pos], got shape {tuple(tokens.shape)}")
        n_pos, n_ctx, d_vocab = tokens.shape[-1], self.cfg.n_ctx, self.cfg.d_vocab
        if not 1 <= n_pos <= n_ctx:
            raise ModelInputError(f"sequence of {n_pos} tokens does not fit n_ctx={n_ctx}: give 1 to {n_ctx} positions")
        if tokens.numel() == 0:
            raise ModelInputError(f"tokens must hold at least one sequence, got shape {tuple(tokens.shape)}")
        bad = (tokens < 0) | (tokens >= d_vocab)
        if bad.any():
            index = tuple(int(i) for i in bad.nonzero()[0])
            raise ModelInputError(
                f"token id {int(tokens[index])} at index {index} is out of range: ids must be in [0, {d_vocab}) (d_vocab={d_vocab})"
            )
        return tokens.to(device=self.device, dtype=torch.long)

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits ``[batch, pos, d_vocab]`` for tokens ``[batch, pos]`` or ``[pos]`` (batch 1)."""
        tokens = self.check_tokens(tokens)
        tokens = tokens if tokens.ndim == 2 else tokens[None]  # [batch, pos]
        n_batch, n_pos = tokens.shape
        x = self.hook_embed(token_columns(self.W_E, tokens))  # [batch, pos, d_model]
        pos = None
        if self.W_pos is not None:
            pos = self.hook_pos_embed(self.W_pos[:, :n_pos].T.expand(n_batch, n_pos, -1))  # [batch, pos, d_model]
        if self.arch.positional == "standard":
            x = x + pos
        qk_pos = pos if self.arch.positional == "qk_only" else None
        for block in self.blocks:
            x = block(x, qk_pos)
        logits = self.ln_final(x) @ self.W_U.T  # [batch, pos, d_vocab]
        logits = logits if self.b_U is None else logits + self.b_U
        cap = self.arch.logit_softcap  # after the expanded quantity: the expansion is of the logits before it
        return logits if cap is None else cap * torch.tanh(logits / cap)

    # --- hooks --------------------------------------------------------------------------
    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple[NameFilter, HookFn]]) -> Iterator["CircuitModel"]:
        """Context manager: hooks added on entry and removed on exit (even on error); nests."""
        added: list[tuple[HookPoint, HookFn]] = []
        try:
            for name, fn in fwd_hooks:
                for point in select_hook_points(self._hook_points, name):
                    point.add_hook(fn)
                    added.append((point, fn))
            yield self
        finally:
            for point, fn in reversed(added):
                point.remove_hook(fn)

    def reset_hooks(self) -> None:
        """Remove every hook function from every hook point."""
        for point in self._hook_points.values():
            point.remove_hooks()

    def run_with_hooks(self, tokens: Tensor, fwd_hooks: Iterable[tuple[NameFilter, HookFn]] = ()) -> Tensor:
        """Logits with hooks applied: ``fwd_hooks`` is a list of ``(name or predicate, fn)``.

        ``fn(tensor, hook)`` returns a replacement tensor or ``None`` (keep the value), as in
        TransformerLens; ``hook`` is the hook point's name (a ``str`` with ``.name``).
        """
        with self.hooks(fwd_hooks):
            return self(tokens)

    def run_with_cache(self, tokens: Tensor, names_filter: None | str | Iterable[str] | Callable[[str], bool] = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Logits and a dict of detached activations, by hook name (all, or those ``names_filter`` picks)."""
        if isinstance(names_filter, str):
            select_hook_points(self._hook_points, names_filter)  # unknown names are errors
        elif names_filter is not None and not callable(names_filter):
            names_filter = list(names_filter)
            for name in names_filter:
                select_hook_points(self._hook_points, name)
        keep = names_filter_to_predicate(names_filter)
        cache: dict[str, Tensor] = {}

        def save(x: Tensor, hook: str) -> None:
            cache[str(hook)] = x.detach()

        logits = self.run_with_hooks(tokens, [(name, save) for name in self._hook_points if keep(name)])
        return logits, cache


def _random_init(name: str, param: Tensor, gen: torch.Generator, init_std: float | None) -> Tensor:
    """Seeded draw for one parameter: weights N(0, 1/fan_in), embeddings N(0, 1), biases N(0, 0.1²)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "gain":  # a norm's gain (q/k norms, norms after a sublayer): around 1, never exactly 1
        return 1 + 0.2 * torch.randn(param.shape, generator=gen, dtype=torch.float64, device="cpu")
    if leaf.startswith("b_") or leaf == "bias":
        std = 0.1 if init_std is None else 0.1 * init_std
    elif leaf in ("W_E", "W_pos"):
        std = 1.0 if init_std is None else init_std
    elif leaf == "W_O":  # [n_heads, d_model, d_head]: fan-in is n_heads * d_head
        std = init_std or 1 / math.sqrt(param.shape[0] * param.shape[2])
    else:  # [out, in]
        std = init_std or 1 / math.sqrt(param.shape[-1])
    return torch.randn(param.shape, generator=gen, dtype=torch.float64, device="cpu") * std


def _centred(p: Tensor, axis: int) -> Tensor:
    """``p`` centred over ``axis`` unless it already is to its dtype's precision (then ``p`` itself)."""
    mean = p.mean(axis, keepdim=True)
    return p - mean if max_abs(mean) > 16 * torch.finfo(p.dtype).eps * max_abs(p) else p


# id(weight) -> (a weak reference to it, its storage and version counter when derived, {what: value})
_KEPT: dict[int, tuple[weakref.ref, tuple, dict]] = {}
KEEP_BYTES = 1 << 28  # a derived tensor larger than this (256 MiB) is made each time rather than held


def kept(t: Tensor, what, make: Callable[[], Any]):
    """``make()``, a value derived from the weight ``t`` alone (a model's own parameter object), remembered
    while ``t`` is unchanged (the same storage and version counter: an in-place write or a new tensor makes it
    again) and alive (the value goes with it), unless it is a tensor over :data:`KEEP_BYTES`. ``what`` names
    the value among those of ``t``. Verifying a model prompt after prompt derives each once, not once per call."""
    stamp = (t.data_ptr(), t._version, tuple(t.shape), t.dtype, str(t.device))
    key = id(t)  # the object itself: a tensor compares by value, not identity
    entry = _KEPT.get(key)
    if entry is None or entry[0]() is not t or entry[1] != stamp:
        entry = _KEPT[key] = (weakref.ref(t, lambda _, key=key: _KEPT.pop(key, None)), stamp, {})
    if what not in entry[2]:
        value = make()
        if not isinstance(value, Tensor) or value.numel() * value.element_size() <= KEEP_BYTES:
            entry[2][what] = value
        return value
    return entry[2][what]


def weight_max_abs(t: Tensor) -> float:
    """:func:`max_abs` of a weight, remembered while it is unchanged (:func:`kept`).

    >>> w = nn.Parameter(torch.tensor([1.0, -3.0]))
    >>> weight_max_abs(w), weight_max_abs(w)
    (3.0, 3.0)
    >>> with torch.no_grad():
    ...     _ = w.mul_(2)
    >>> weight_max_abs(w)
    6.0
    """
    def measure() -> float:
        with torch.no_grad():
            return max_abs(t.detach())

    return kept(t, "max_abs", measure)


def token_columns(F: Tensor, tokens: Tensor) -> Tensor:
    """``F.T[tokens]``, ``[*tokens.shape, rows of F]``: the columns of ``F`` (e.g. ``W_E`` ``[d_model, d_vocab]``)
    picked by token id, read a row of ``F`` at a time (``index_select`` along its columns: at GPT-2's vocabulary,
    4 x 128 tokens take 5 ms against 10 for ``F.T[tokens]``, whose reads jump a row of ``F`` at every entry).

    >>> F = torch.arange(6.0).view(2, 3)
    >>> torch.equal(token_columns(F, torch.tensor([[2, 0]])), F.T[torch.tensor([[2, 0]])])
    True
    """
    picked = F.index_select(1, tokens.reshape(-1))  # [rows, n]
    return picked.T.contiguous().view(*tokens.shape, F.shape[0])


def max_abs(t: Tensor) -> float:
    """``max |t|`` (0 when empty; nan when ``t`` holds a nan) without a temporary ``|t|``.

    Reads ``t`` in memory order, so a transposed view is as fast as a contiguous tensor.

    >>> max_abs(torch.tensor([[1.0, -3.0], [2.0, 0.5]]).T)
    3.0
    """
    if not t.numel():
        return 0.0
    low, high = torch.aminmax(t.T if t.ndim == 2 and t.T.is_contiguous() else t)
    return float(torch.maximum(low.abs(), high.abs()))


def widened(compute, *operands: Tensor) -> Tensor:
    """``compute(*operands)``, again in float64 where it overflowed at a narrower dtype: squares of finite float32
    entries past 1.8e19 (a norm, a Gram product) overflow to Inf, or to NaN where Inf meets a cancelling sum.

    >>> y = torch.full((4,), 2.0 ** 64)  # squares past float32's 3.4e38
    >>> float(widened(lambda v: v.square().sum().sqrt(), y)) == 2.0 ** 65
    True
    """
    out = compute(*operands)
    if out.dtype != torch.float64 and not bool(torch.isfinite(out).all()):
        out = compute(*(x.double() for x in operands))
    return out


def norm_of(t: Tensor) -> float:
    """The Frobenius norm of ``t``, accumulated in float64 (float32's squares overflow past 1.8e19).

    >>> norm_of(torch.full((4,), 2.0 ** 64)) == 2.0 ** 65
    True
    """
    return float(torch.linalg.vector_norm(t, dtype=torch.float64))


def first_overflow(cache: dict[str, Tensor], suffixes: tuple[str, ...] = ("hook_pattern", "hook_scale")) -> str | None:
    """The first hook of ``cache`` named with one of ``suffixes`` that holds NaN or Inf (None when none does). A layer
    norm's scale overflows first: float32 weights near 1e10 make its variance Inf, the stream it divides becomes 0,
    and everything after it is finite and wrong (the logits are b_U alone)."""
    return next((name for name, x in cache.items() if name.endswith(suffixes) and not bool(torch.isfinite(x).all())),
                None)
