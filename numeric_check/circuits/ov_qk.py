"""The paper's circuits of a model as :class:`~numeric_check.circuits.factored.Factored` products, and their positivity.

Every circuit is a word of weights, never materialised (``d_vocab × d_vocab`` stays factored):

- OV circuit ``W_U W_OV^h W_E`` ``[d_vocab (out), d_vocab (source)]``;
- QK circuit ``W_Eᵀ W_QK^h W_E`` ``[d_vocab (query/destination), d_vocab (key/source)]``;
- positional QK circuit ``W_posᵀ W_QK^h W_pos`` ``[n_ctx (query), n_ctx (key)]``;
- virtual OV circuit ``W_U W_OV^{h_n} … W_OV^{h_1} W_E`` through heads of increasing layers;
- K-composition circuit ``W_Eᵀ W_QK^{h2} W_OV^{h1} W_E`` ``[query token, key token]``.

They are the paper's weight-only terms: biases are left out; with layer norm the weights are
used as stored (scales are per position and frozen, so they are not part of a circuit); the
attention scale ``1/sqrt(d_head)`` is not included (divide by ``model.cfg.scale`` to get scores).
``W_OV = W_O W_V`` and ``W_QK = W_Qᵀ W_K`` are kept as two factors each.

Results over all heads have shape ``[n_layers, n_heads]`` with ``n_heads`` the largest head
count of any layer; entries for heads a layer lacks are NaN.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from numeric_check.errors import AnalysisError
from numeric_check.circuits.factored import Factored


Head = tuple[int, int]


# --- weights ----------------------------------------------------------------------------------


def model_weight(model, name: str, dtype: torch.dtype | None = None) -> Tensor:
    """A model-level weight (``W_E``, ``W_pos``, ``W_U``) detached, in ``dtype``; an error if the model lacks it."""
    tensor = getattr(model, name)
    if tensor is None:
        raise AnalysisError(f"the model has no {name} (positional kind {model.arch.positional!r})")
    return tensor.detach().to(dtype or tensor.dtype)


def head_weights(model, layer: int, head: int, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """``W_Q, W_K, W_V [d_head, d_model]`` and ``W_O [d_model, d_head]`` of one head (checked to exist), with the
    gains of q/k norms and of a norm after attention folded in (the weights the algebra's atoms stand for)."""
    model.arch.check_head(layer, head)
    return {name: weight[head].detach().to(dtype or model.dtype) for name, weight in _layer_weights(model, layer).items()}


def _layer_weights(model, layer: int) -> dict[str, Tensor]:
    """One layer's ``W_Q, W_K, W_V, W_O`` per query head as the algebra binds them: a q/k norm's gain and
    centring folded into ``W_Q``/``W_K``, a norm after attention's gain into ``W_O``."""
    attn = model.blocks[layer].attn
    return {"W_Q": attn.folded("Q")[0], "W_K": attn.per_head(attn.folded("K")[0]), "W_V": attn.per_head(attn.W_V),
            "W_O": model.folded_W_O(layer)}


def stacked_head_weights(
    model, dtype: torch.dtype | None = None, names: Sequence[str] = ("W_Q", "W_K", "W_V", "W_O")
) -> dict[str, Tensor]:
    """``W_Q, W_K, W_V [n_layers, n_heads, d_head, d_model]``, ``W_O [n_layers, n_heads, d_model, d_head]``.

    ``n_heads`` is the largest head count of any layer; missing heads are zero matrices.
    ``names`` picks which weights to stack.
    """
    dtype = dtype or model.dtype
    n_layers, n_heads = model.arch.n_layers, max(model.arch.heads_per_layer, default=0)
    d_model, d_head = model.cfg.d_model, model.cfg.d_head
    out = {}
    for name in names:
        weights = [_layer_weights(model, layer)[name].detach() for layer in range(n_layers)]  # shared key/value heads repeated
        if model.arch.uniform and weights:
            out[name] = torch.stack(weights).to(dtype)
            continue
        shape = (d_model, d_head) if name == "W_O" else (d_head, d_model)
        stacked = torch.zeros((n_layers, n_heads) + shape, dtype=dtype, device=model.device)
        for layer, weight in enumerate(weights):
            stacked[layer, : weight.shape[0]] = weight
        out[name] = stacked
    return out


def head_mask(model) -> Tensor:
    """``[n_layers, n_heads]`` bool: True where the head exists (layers may have fewer heads)."""
    n_heads = max(model.arch.heads_per_layer, default=0)
    counts = torch.tensor(model.arch.heads_per_layer, dtype=torch.long).reshape(-1, 1)
    return (torch.arange(n_heads).reshape(1, -1) < counts).to(model.device)


# --- single circuits --------------------------------------------------------------------------


def ov_circuit(model, layer: int, head: int, *, dtype: torch.dtype | None = None) -> Factored:
    """``W_U W_O^h W_V^h W_E`` ``[d_vocab (out), d_vocab (source)]``: how a source token moves the logits.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(1, 2), d_model=8, d_head=2, d_vocab=10, n_ctx=4)
    >>> ov_circuit(model, 0, 1)
    Factored([10×8] @ [8×2] @ [2×8] @ [8×10], shape [10×10])
    """
    w = head_weights(model, layer, head, dtype)
    return Factored(model_weight(model, "W_U", dtype), w["W_O"], w["W_V"], model_weight(model, "W_E", dtype))


def qk_circuit(model, layer: int, head: int, *, dtype: torch.dtype | None = None) -> Factored:
    """``W_Eᵀ W_Q^{hT} W_K^h W_E`` ``[d_vocab (query), d_vocab (key)]``: token–token scores only.

    Positional terms (``W_pos``, with ``standard`` or ``qk_only`` positions) and cross terms
    between tokens and positions are not included; see :func:`positional_qk_circuit`. With
    rotary, the scores of a query and a key ``Δ`` positions apart read ``W_Q^{hT} R_Δ W_K^h``
    (:mod:`tensoralg.rotary`); this circuit is the one at ``Δ = 0`` (``R_0 = Id``).

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(1, 2), d_model=8, d_head=2, d_vocab=10, n_ctx=4)
    >>> qk_circuit(model, 0, 0).shape
    torch.Size([10, 10])
    """
    w = head_weights(model, layer, head, dtype)
    W_E = model_weight(model, "W_E", dtype)
    return Factored(W_E.T, w["W_Q"].T, w["W_K"], W_E)


def positional_qk_circuit(model, layer: int, head: int, *, dtype: torch.dtype | None = None) -> Factored:
    """``W_posᵀ W_QK^h W_pos`` ``[n_ctx (query), n_ctx (key)]``: position–position scores.

    Raises :class:`AnalysisError` when the model has no positional embedding.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> arch = Architecture(1, 1, positional="qk_only")
    >>> model = CircuitModel.random(arch, d_model=8, d_head=2, d_vocab=10, n_ctx=5)
    >>> positional_qk_circuit(model, 0, 0).shape
    torch.Size([5, 5])
    """
    w = head_weights(model, layer, head, dtype)
    W_pos = model_weight(model, "W_pos", dtype)
    return Factored(W_pos.T, w["W_Q"].T, w["W_K"], W_pos)


def virtual_ov_circuit(model, heads: Sequence[Head], *, dtype: torch.dtype | None = None) -> Factored:
    """``W_U W_OV^{h_n} … W_OV^{h_1} W_E`` for ``heads = [(l_1, h_1), …, (l_n, h_n)]``, first to last.

    Layers must strictly increase (a head reads what earlier layers wrote).

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=2, d_vocab=10, n_ctx=4)
    >>> virtual_ov_circuit(model, [(0, 1), (1, 0)]).dims
    [10, 8, 2, 8, 2, 8, 10]
    """
    heads = [tuple(h) for h in heads]
    if not heads:
        raise AnalysisError("virtual_ov_circuit needs at least one (layer, head), got none")
    for layer, head in heads:
        model.arch.check_head(layer, head)
    layers = [layer for layer, _ in heads]
    if any(a >= b for a, b in zip(layers, layers[1:])):
        raise AnalysisError(f"heads of a virtual head must be in strictly increasing layers, first to last; got {heads}")
    middle = []
    for layer, head in reversed(heads):
        w = head_weights(model, layer, head, dtype)
        middle += [w["W_O"], w["W_V"]]
    return Factored(model_weight(model, "W_U", dtype), *middle, model_weight(model, "W_E", dtype))


def k_composition_circuit(model, reader: Head, writer: Head, *, dtype: torch.dtype | None = None) -> Factored:
    """``W_Eᵀ W_QK^{h2} W_OV^{h1} W_E`` ``[d_vocab (query token), d_vocab (key's token)]``.

    ``reader = (l2, h2)`` attends with keys that ``writer = (l1, h1)`` (``l1 < l2``) wrote
    into: entry ``[a, b]`` scores a query token ``a`` against a key position whose
    ``h1``-source token was ``b``. Positive eigenvalues mean "attend where the same token
    was moved": same-matching, the induction-head mechanism.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=2, d_vocab=10, n_ctx=4)
    >>> k_composition_circuit(model, (1, 0), (0, 1)).shape
    torch.Size([10, 10])
    """
    (l2, h2), (l1, h1) = reader, writer
    w2, w1 = head_weights(model, l2, h2, dtype), head_weights(model, l1, h1, dtype)
    if l1 >= l2:
        raise AnalysisError(f"the writer head L{l1}H{h1} must be in an earlier layer than the reader L{l2}H{h2}")
    W_E = model_weight(model, "W_E", dtype)
    return Factored(W_E.T, w2["W_Q"].T, w2["W_K"], w1["W_O"], w1["W_V"], W_E)


# --- all heads at once ------------------------------------------------------------------------


def ov_circuits(model, *, dtype: torch.dtype | None = None) -> Factored:
    """Every head's OV circuit as one batched product ``[n_layers, n_heads, d_vocab, d_vocab]``.

    ``ov_circuits(model)[l, h]`` is :func:`ov_circuit` of ``L{l}H{h}`` (a zero circuit for a
    head the layer lacks). ``W_E W_U`` is shared by all heads when the product is evaluated.
    """
    w = stacked_head_weights(model, dtype, ("W_O", "W_V"))
    return Factored(model_weight(model, "W_U", dtype), w["W_O"], w["W_V"], model_weight(model, "W_E", dtype))


def ov_eigenvalues(model, *, dtype: torch.dtype | None = None) -> Tensor:
    """Eigenvalues of every ``W_OV^h = W_O^h W_V^h``, complex ``[n_layers, n_heads, d_head]``.

    The other ``d_model - d_head`` eigenvalues are 0; NaN for heads a layer lacks.
    """
    w = stacked_head_weights(model, dtype, ("W_O", "W_V"))
    values = Factored(w["W_O"], w["W_V"]).eigenvalues()
    return values.masked_fill(~head_mask(model)[..., None], complex("nan"))


def ov_circuit_eigenvalues(model, *, dtype: torch.dtype | None = None) -> Tensor:
    """Eigenvalues of every full OV circuit ``W_U W_OV^h W_E``, complex ``[n_layers, n_heads, r]``.

    ``r = min(d_head, d_model, d_vocab)``; the circuit's other eigenvalues are 0. NaN for
    heads a layer lacks.
    """
    values = ov_circuits(model, dtype=dtype).eigenvalues()
    return values.masked_fill(~head_mask(model)[..., None], complex("nan"))


def eigenvalue_positivity(circuit: Factored | Tensor) -> Tensor:
    """``Σ_i λ_i / Σ_i |λ_i|`` of a square circuit (or of given eigenvalues ``[..., r]``).

    As in the paper: 1 when every eigenvalue is positive (copying, same-matching), -1 when
    all are negative. For a real matrix the eigenvalues come in conjugate pairs, so ``Σλ``
    is real and the result is its real part over the sum of moduli; complex eigenvalues
    pull the score towards 0. NaN for a zero circuit (0/0).

    >>> eigenvalue_positivity(Factored(torch.eye(3)))
    tensor(1.)
    >>> eigenvalue_positivity(torch.tensor([1j, -1j]))
    tensor(0.)
    """
    values = circuit.eigenvalues() if isinstance(circuit, Factored) else circuit
    return values.sum(-1).real / values.abs().sum(-1)


def copying_scores(model, *, dtype: torch.dtype | None = None) -> Tensor:
    """OV-circuit eigenvalue positivity of every head, ``[n_layers, n_heads]`` (NaN for missing heads).

    Near 1: the head copies (a source token raises its own logit).

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(2, (2, 1)), d_model=8, d_head=2, d_vocab=10, n_ctx=4)
    >>> copying_scores(model).shape
    torch.Size([2, 2])
    >>> bool(copying_scores(model)[1, 1].isnan())
    True
    """
    return eigenvalue_positivity(ov_circuit_eigenvalues(model, dtype=dtype))


def same_matching_scores(model, *, dtype: torch.dtype | None = None) -> Tensor:
    """K-composition-circuit positivity ``[n_layers, n_heads, n_layers, n_heads]``.

    Entry ``[l1, h1, l2, h2]`` is :func:`eigenvalue_positivity` of
    :func:`k_composition_circuit` ``(model, (l2, h2), (l1, h1))``: near 1 when head
    ``(l2, h2)`` attends to keys where ``(l1, h1)`` moved the query's own token (an
    induction head reading a previous-token head). NaN unless ``l1 < l2`` and both heads
    exist. The non-zero eigenvalues of ``W_Eᵀ W_QK W_OV W_E`` are those of
    ``W_QK W_OV (W_E W_Eᵀ)``, so ``W_E W_Eᵀ`` is formed once.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=2, d_vocab=10, n_ctx=4)
    >>> scores = same_matching_scores(model)
    >>> scores.shape, bool(scores[1, 0, 0, 0].isnan())
    (torch.Size([2, 2, 2, 2]), True)
    """
    w = stacked_head_weights(model, dtype)
    W_E = model_weight(model, "W_E", dtype)
    first, second = layer_pairs(model)
    reader = [w["W_Q"][second].mT[:, None], w["W_K"][second][:, None]]  # [pairs, 1, H2, ...]
    writer = [w["W_O"][first][:, :, None], w["W_V"][first][:, :, None]]  # [pairs, H1, 1, ...]
    scores = eigenvalue_positivity(Factored(*reader, *writer, W_E @ W_E.T))  # [pairs, H1, H2]
    return scatter_pairs(model, scores, fill=float("nan"))


def layer_pairs(model) -> tuple[Tensor, Tensor]:
    """Every pair of layers ``l1 < l2`` as two index tensors ``(l1s, l2s)``."""
    pairs = [(l1, l2) for l2 in range(model.arch.n_layers) for l1 in range(l2)]
    first = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=model.device)
    second = torch.tensor([p[1] for p in pairs], dtype=torch.long, device=model.device)
    return first, second


def scatter_pairs(model, values: Tensor, fill: float) -> Tensor:
    """Per-pair results ``[pairs, H1, H2]`` (order of :func:`layer_pairs`) into ``[L, H, L, H]``.

    Entries outside ``l1 < l2`` hold ``fill``; entries of heads a layer lacks hold NaN.
    """
    n_layers, n_heads = model.arch.n_layers, max(model.arch.heads_per_layer, default=0)
    out = torch.full((n_layers, n_heads, n_layers, n_heads), fill, dtype=values.dtype, device=values.device)
    first, second = layer_pairs(model)
    out[first, :, second, :] = values
    exists = head_mask(model)
    return out.masked_fill(~(exists[:, :, None, None] & exists[None, None]), float("nan"))
