"""A mixture-of-experts MLP (Mixtral, OLMoE, Qwen-MoE): a router picks ``top_k`` experts per position.

To the algebra an MLP is an opaque source, experts or not: its output enters the stream as one
source and its input is where paths end. The routing of a forward pass is recorded like any
frozen value (``hook_expert_weights``, ``hook_expert_indices``), so a path isolated through the
model reuses it (the recorded output is what the source is anyway).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from numeric_check.model.config import ACT_FNS, ModelConfig
from numeric_check.model.hooks import HookPoint


def _zeros(present: bool, *shape: int, **factory: Any) -> nn.Parameter | None:
    return nn.Parameter(torch.zeros(*shape, **factory)) if present else None


class MixtureOfExperts(nn.Module):
    """``Σ_e w_e(x) · expert_e(x)`` over the ``top_k`` experts the router picks at each position.

    Router: ``softmax(x W_routerᵀ)`` over ``n_experts``, the ``top_k`` largest kept (renormalised to
    sum to 1 when ``cfg.moe_renormalise``, as Mixtral; not, as OLMoE). Each expert is an MLP (gated
    or not) with ``W_in``, ``W_out`` (and ``W_gate``) stacked ``[n_experts, ...]``. Hooks:
    ``hook_router_logits [b, p, n_experts]``, ``hook_expert_weights [b, p, top_k]``,
    ``hook_expert_indices [b, p, top_k]`` (long); a Constant on the last two replays a routing.
    """

    def __init__(self, cfg: ModelConfig, **factory: Any):
        super().__init__()
        E, m, d, bias = cfg.arch.experts, cfg.d_mlp, cfg.d_model, cfg.arch.biases
        self.top_k, self.renormalise = cfg.arch.experts_top_k, cfg.moe_renormalise
        self.act_fn = ACT_FNS[cfg.act_fn]
        self.W_router = nn.Parameter(torch.zeros(E, d, **factory))
        self.W_in, self.W_out = nn.Parameter(torch.zeros(E, m, d, **factory)), nn.Parameter(torch.zeros(E, d, m, **factory))
        self.b_in, self.b_out = _zeros(bias, E, m, **factory), _zeros(bias, E, d, **factory)
        self.W_gate = _zeros(cfg.gated_mlp, E, m, d, **factory)
        self.b_gate = _zeros(cfg.gated_mlp and bias, E, m, **factory)
        for name in ("router_logits", "expert_weights", "expert_indices"):
            setattr(self, f"hook_{name}", HookPoint())

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(weights, indices)`` ``[b, p, top_k]`` of the experts each position goes to."""
        shape = (*x.shape[:-1], self.top_k)
        weights, indices = self.hook_expert_weights.fixed(shape), self.hook_expert_indices.fixed(shape)
        if weights is not None and indices is not None:  # a recorded routing, replayed
            return weights, indices
        probs = self.hook_router_logits(x @ self.W_router.T).softmax(-1)
        weights, indices = probs.topk(self.top_k, dim=-1)
        if self.renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        return self.hook_expert_weights(weights), self.hook_expert_indices(indices)

    def forward(self, x: Tensor) -> Tensor:
        weights, indices = self.route(x)
        # each position's weight on every expert (zero where not picked) [b, p, n_experts]
        dense = torch.zeros(*x.shape[:-1], self.W_in.shape[0], dtype=x.dtype, device=x.device)
        dense = dense.scatter_add(-1, indices, weights.to(x.dtype))
        pre = torch.einsum("bpd,emd->bpem", x, self.W_in)  # every expert on every position (small models)
        pre = pre if self.b_in is None else pre + self.b_in
        if self.W_gate is None:
            post = self.act_fn(pre)
        else:
            gate = torch.einsum("bpd,emd->bpem", x, self.W_gate)
            post = self.act_fn(gate if self.b_gate is None else gate + self.b_gate) * pre
        out = torch.einsum("bpem,edm->bped", post, self.W_out)
        out = out if self.b_out is None else out + self.b_out
        return torch.einsum("bpe,bped->bpd", dense, out)
