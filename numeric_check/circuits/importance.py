"""Term importance by order: the paper's frozen-pattern decomposition of the logits.

With attention patterns and layer-norm scales frozen at their values from a real
forward pass, an attention-only transformer is linear in its input, and its logits
split exactly into a sum over *paths*: the direct path (order 0: embeddings, plus
biases and MLP outputs, which are opaque sources), each head applied to the direct
path (order 1: individual heads), each head applied to an earlier head's output
(order 2: virtual heads), and so on. The split is computed through the model's own
hooks: each head is fed an order-(k-1) stream in place of its real input, with its
pattern (and scales) frozen, and its output is read back — so nothing here
re-implements the forward pass, and the sum over all paths equals the model's logits.

Importance is measured as in the paper: the loss with terms up to order ``k``, the
marginal change of each order, and the marginal effect of each individual-head and
virtual-head term (the change in loss when that one term is added to the other terms of
its order and below: negative when it helps).

>>> from derivations.architecture import Architecture
>>> from numeric_check.model.circuit_model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0)
>>> report = term_importance(model, torch.tensor([[1, 2, 3, 1, 2, 3]]))
>>> len(report.loss_by_order)   # orders 0, 1, 2
3
>>> abs(report.loss_by_order[-1] - report.model_loss) < 1e-4
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from derivations.architecture import head_label
from tensoralg.display import md_table
from numeric_check.errors import ModelInputError, NumericCheckError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.hook_paths import Recording, frozen_hooks, keep, record, run_blocks, unembed
from numeric_check.model.hooks import block_hook
from tensoralg.expr import check_order

Head = tuple[int, int]
Path = tuple[Head, ...]  # heads in the order the signal passes through them; () is the direct path

# Streams per chunk of a hooked forward pass: bounds memory at about
# CHUNK * batch * pos * n_heads * d_model floats.
_CHUNK = 16


def path_label(path: Path) -> str:
    """``'direct'`` for the empty path, else the heads joined by ``→``: ``'L0H1→L1H2'``."""
    return "→".join(head_label(*h) for h in path) if path else "direct"


@dataclass
class OrderDecomposition:
    """Logits split by path. ``by_path[path]`` is ``[batch, pos, d_vocab]``.

    ``remainder`` holds the terms of order above ``max_order`` when the expansion was
    truncated (zeros otherwise); ``logits`` are the model's own logits.
    """

    by_path: dict[Path, Tensor]
    remainder: Tensor
    logits: Tensor
    max_order: int
    n_layers: int

    def up_to(self, order: int) -> Tensor:
        """Sum of the terms of order ``<= order`` (the remainder counts as order ``max_order + 1``)."""
        total = torch.zeros_like(self.logits)
        for path, term in self.by_path.items():
            if len(path) <= order:
                total = total + term
        if order > self.max_order:
            total = total + self.remainder
        return total

    def total(self) -> Tensor:
        """Sum of every term; equals :attr:`logits` up to rounding."""
        return self.up_to(self.max_order + 1)


# Path logits held at once (float elements): about 1 GiB in float32.
MAX_ELEMENTS = 2**28


def count_paths(heads_per_layer: tuple[int, ...], max_order: int) -> int:
    """Paths of order ``<= max_order``: products of head counts over sets of at most that many layers.

    >>> count_paths((4, 4), 2)   # direct + 8 heads + 16 virtual heads
    25
    """
    by_order = [1] + [0] * max_order  # by_order[k]: paths through k heads so far
    for heads in heads_per_layer:
        for k in range(max_order, 0, -1):
            by_order[k] += by_order[k - 1] * heads
    return sum(by_order)


def logits_by_order(
    model: CircuitModel, tokens: Tensor, max_order: int | None = None, *, max_elements: int = MAX_ELEMENTS
) -> OrderDecomposition:
    """Split ``model``'s logits on ``tokens`` into path terms, patterns and scales frozen.

    ``max_order`` (default: every path) bounds the paths expanded one by one; the rest
    is kept as one exact remainder. Every path's logits are held at once, so a model with
    many heads or a large vocabulary needs few tokens or a low ``max_order``: more than
    ``max_elements`` numbers is an error that says how many.

    >>> from derivations.architecture import Architecture
    >>> model = CircuitModel.random(Architecture(1, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0)
    >>> parts = logits_by_order(model, torch.tensor([[1, 2, 3]]))
    >>> sorted(path_label(p) for p in parts.by_path)
    ['L0H0', 'L0H1', 'direct']
    >>> torch.allclose(parts.total(), parts.logits, atol=1e-5)
    True
    """
    n_layers = model.arch.n_layers
    max_order = n_layers if max_order is None else max_order
    check_order(max_order)
    max_order = min(max_order, n_layers)
    tokens = model.check_tokens(tokens)
    tokens = tokens if tokens.ndim == 2 else tokens[None]  # [batch, pos]
    n_paths = count_paths(model.arch.heads_per_layer, max_order)
    elements = (n_paths + 1) * tokens.numel() * model.cfg.d_vocab
    if elements > max_elements:
        raise NumericCheckError(
            f"{n_paths} paths of order <= {max_order} on {tokens.numel()} tokens with d_vocab={model.cfg.d_vocab} "
            f"would hold {elements:,} logits (limit {max_elements:,}); give fewer tokens or a lower max_order"
        )
    with torch.no_grad():
        rec = record(model, tokens)
        logits, cache = rec.logits, rec.cache
        streams: dict[Path, Tensor] = {(): cache[block_hook(0, "hook_resid_pre")] if n_layers else _embedded(model, cache)}
        for layer in range(n_layers):
            growing = [path for path in streams if len(path) < max_order]
            results, const = _heads_on(model, rec, layer, [streams[p] for p in growing])
            streams[()] = streams[()] + const
            if block_hook(layer, "hook_mlp_out") in cache:
                streams[()] = streams[()] + cache[block_hook(layer, "hook_mlp_out")]
            for path, result in zip(growing, results):
                for head in range(result.shape[-2]):
                    streams[path + ((layer, head),)] = result[..., head, :]
        final = cache[block_hook(n_layers - 1, "hook_resid_post")] if n_layers else streams[()]
        rest = final - sum(streams.values())
        paths = list(streams)
        outputs, const = _unembed(model, rec, [streams[p] for p in paths] + [rest])
        by_path = {path: out for path, out in zip(paths, outputs)}
        by_path[()] = by_path[()] + const
        remainder = outputs[-1] if max_order < n_layers else torch.zeros_like(logits)
    return OrderDecomposition(by_path, remainder, logits, max_order, n_layers)


def _embedded(model: CircuitModel, cache: dict[str, Tensor]) -> Tensor:
    """The residual stream of a 0-layer model: embeddings (plus positions when standard)."""
    x = cache["hook_embed"]
    return x + cache["hook_pos_embed"] if model.arch.positional == "standard" else x


def _heads_on(model: CircuitModel, rec: Recording, layer: int, inputs: list[Tensor]):
    """Each head of ``layer`` applied linearly to each input stream (patterns, scales frozen).

    The model's own block ``layer`` runs over the input streams stacked as copies of the batch
    (:func:`~numeric_check.verification.hook_paths.run_blocks`), and each head's ``hook_result`` is read.
    Returns per-input results ``[batch, pos, n_heads, d_model]`` with the constant part
    (value biases) removed, and the layer's constant output (``attn_out`` on a zero input).
    """
    zero = torch.zeros_like(rec.cache[block_hook(layer, "hook_resid_pre")])
    stacked = inputs + [zero]
    results, outs = [], []
    result, attn_out = block_hook(layer, "attn.hook_result"), block_hook(layer, "hook_attn_out")
    for start in range(0, len(stacked), _CHUNK):
        chunk = torch.cat(stacked[start : start + _CHUNK])  # [n * batch, pos, d_model]
        copies = chunk.shape[0] // rec.n_batch
        seen: dict[str, Tensor] = {}
        hooks = frozen_hooks(rec, copies) + [(result, keep(seen)), (attn_out, keep(seen, stop=True))]
        run_blocks(model, rec, chunk, layer, hooks)
        results += seen[result].chunk(copies)
        outs += seen[attn_out].chunk(copies)
    const_heads = results[-1]
    return [r - const_heads for r in results[:-1]], outs[-1]


def _unembed(model: CircuitModel, rec: Recording, inputs: list[Tensor]):
    """The unembedding (final layer norm scale frozen) applied linearly to each stream.

    Returns per-input logits without the constant part, and the constant (``b_U``).
    """
    stacked = inputs + [torch.zeros_like(inputs[0])]
    outputs = []
    for start in range(0, len(stacked), _CHUNK):
        chunk = torch.cat(stacked[start : start + _CHUNK])
        outputs += unembed(model, rec, chunk).chunk(chunk.shape[0] // rec.n_batch)
    const = outputs[-1]
    return [out - const for out in outputs[:-1]], const


def _loss(logits: Tensor, tokens: Tensor, target_mask: Tensor | None) -> float:
    """Mean next-token cross-entropy; ``target_mask[b, p]`` selects which tokens count as targets."""
    per_token = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    if target_mask is None:
        return float(per_token.mean())
    return float(per_token[target_mask[:, 1:].flatten()].mean())


@dataclass
class ImportanceReport:
    """Losses with terms up to each order and the marginal loss of each term (in nats).

    Signs as in the paper's table (−1.8 / −5.2 / −0.3 nats): a marginal loss is the *change*
    in loss when a term is added, so a term that helps has a negative marginal loss.

    ``loss_by_order[k]``: loss using the terms of order ``<= k``; ``marginal_by_order[k]``:
    ``loss_by_order[k] - loss_by_order[k-1]``, the change when order ``k`` is added (order 0
    from the uniform prediction, ``log d_vocab``). ``head_marginal[(l, h)]``: the change in
    loss when the individual-head term of ``L{l}H{h}`` is added to the other terms of order
    ``<= 1``; ``virtual_marginal[(h1, h2)]``: likewise for a virtual head, within order ``<= 2``.
    """

    loss_by_order: list[float]
    model_loss: float
    uniform_loss: float
    head_marginal: dict[Head, float]
    virtual_marginal: dict[tuple[Head, Head], float] = field(default_factory=dict)
    n_layers: int = 0
    truncated: bool = False

    @property
    def marginal_by_order(self) -> list[float]:
        """The change in loss as each order is added (negative: the loss falls), as in the paper."""
        previous = [self.uniform_loss] + self.loss_by_order[:-1]
        return [after - before for before, after in zip(previous, self.loss_by_order)]

    def order_rows(self) -> list[tuple[str, float, float]]:
        """``(terms, loss up to this order, marginal loss)`` per order (negative: the loss falls)."""
        names = ["direct path (order 0)", "individual heads (order 1)", "virtual heads (order 2)"]
        names += [f"order {k} paths" for k in range(3, len(self.loss_by_order))]
        if self.truncated:
            names[len(self.loss_by_order) - 1] = f"orders above {len(self.loss_by_order) - 2} (remainder)"
        return list(zip(names, self.loss_by_order, self.marginal_by_order))

    def top_virtual(self, k: int = 10) -> list[tuple[tuple[Head, Head], float]]:
        return sorted(self.virtual_marginal.items(), key=lambda item: -abs(item[1]))[:k]

    def to_markdown(self, top_virtual: int = 10) -> str:
        """Markdown tables: by order, individual heads by layer, the largest virtual heads."""
        lines = [
            f"Model loss {self.model_loss:.4f} nats; uniform prediction {self.uniform_loss:.4f} nats.",
            "",
            md_table(["terms", "loss with terms up to this order", "marginal loss (change when added)"],
                     [[name, f"{loss:.4f}", f"{gain:+.4f}"] for name, loss, gain in self.order_rows()], right=(1, 2)),
        ]
        if self.head_marginal:
            heads = sorted({h for _, h in self.head_marginal})
            rows = [[str(layer)] + [f"{self.head_marginal[(layer, h)]:+.4f}" if (layer, h) in self.head_marginal else ""
                                    for h in heads] for layer in sorted({l for l, _ in self.head_marginal})]
            lines += ["", "Marginal loss of each individual-head term (change in loss when added; negative: it helps):", "",
                      md_table(["layer", *(f"H{h}" for h in heads)], rows, right=range(1, len(heads) + 1))]
        if self.virtual_marginal:
            lines += ["", f"Largest virtual-head terms (of {len(self.virtual_marginal)}):", "",
                      md_table(["virtual head", "marginal loss"],
                               [[path_label(pair), f"{value:+.4f}"] for pair, value in self.top_virtual(top_virtual)], right=(1,))]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "loss_by_order": self.loss_by_order,
            "marginal_by_order": self.marginal_by_order,
            "model_loss": self.model_loss,
            "uniform_loss": self.uniform_loss,
            "head_marginal": {head_label(*h): v for h, v in self.head_marginal.items()},
            "virtual_marginal": {path_label(p): v for p, v in self.virtual_marginal.items()},
            "truncated": self.truncated,
        }


def term_importance(
    model: CircuitModel,
    tokens: Tensor,
    *,
    target_mask: Tensor | None = None,
    max_order: int | None = 2,
    max_elements: int = MAX_ELEMENTS,
) -> ImportanceReport:
    """The paper's term-importance table for ``model`` on ``tokens`` ``[batch, pos]``.

    ``target_mask`` (bool ``[batch, pos]``, optional) restricts the loss to some target
    tokens — e.g. :attr:`numeric_check.training.toy.RepeatBatch.repeat_mask` for the loss on
    repeated segments. ``max_order`` bounds the orders expanded one by one (default 2,
    as the paper's table: direct path, individual heads, virtual heads; higher orders
    form one remainder row). ``max_elements``: see :func:`logits_by_order`.
    """
    parts = logits_by_order(model, tokens, max_order, max_elements=max_elements)
    tokens = model.check_tokens(tokens)
    tokens = tokens if tokens.ndim == 2 else tokens[None]
    if target_mask is not None:
        target_mask = torch.as_tensor(target_mask, dtype=torch.bool, device=tokens.device)
        if target_mask.shape != tokens.shape:
            raise ModelInputError(
                f"target_mask has shape {tuple(target_mask.shape)}; expected the tokens' shape {tuple(tokens.shape)}"
            )
        if not target_mask[:, 1:].any():
            raise ModelInputError("target_mask selects no target token (position 0 is never a target)")

    def loss(logits: Tensor) -> float:
        return _loss(logits, tokens, target_mask)

    cumulative = [parts.up_to(k) for k in range(parts.max_order + 1)]
    loss_by_order = [loss(c) for c in cumulative]
    truncated = parts.max_order < parts.n_layers
    if truncated:
        loss_by_order.append(loss(parts.total()))
    report = ImportanceReport(
        loss_by_order=loss_by_order,
        model_loss=loss(parts.logits),
        uniform_loss=math.log(model.cfg.d_vocab),
        head_marginal={},
        n_layers=parts.n_layers,
        truncated=truncated,
    )
    for path, term in parts.by_path.items():
        if len(path) == 1 and parts.max_order >= 1:
            report.head_marginal[path[0]] = loss_by_order[1] - loss(cumulative[1] - term)
        elif len(path) == 2 and parts.max_order >= 2:
            report.virtual_marginal[path] = loss_by_order[2] - loss(cumulative[2] - term)
    return report
