"""The marginal loss by path order: the logits split into the direct path, individual heads and
virtual heads, and the change in loss as each order is added (negative: the loss goes down).

>>> rows = marginal_losses([np.zeros((2, 4)), np.array([[2.0, 0, 0, 0], [0, 2.0, 0, 0]])], [0, 1])
>>> [round(change, 3) for _, change in rows]
[0.0, -1.046]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tensoralg import Product, atom, term

from derivations.catalogue.common import INDEXING, NOTATION, SUMS, architecture, by_order, stream_product, sum_index
from derivations.catalogue.registry import entry
from derivations.derivation import Chain, Derivation
from derivations.errors import DerivationError
from derivations.document import Math, math, prose

ORDER_NAMES = ("direct path", "individual heads", "virtual heads")
PAPER = (-1.8, -5.2, -0.3)  # the paper's two-layer attention-only model, nats, by order


def cross_entropy(logits: np.ndarray, targets: Sequence[int]) -> float:
    """Mean of ``-log softmax(logits[i])[targets[i]]`` over positions (nats).

    >>> round(cross_entropy(np.zeros((3, 8)), [0, 1, 2]), 4)  # uniform: log 8
    2.0794
    """
    logits = np.asarray(logits, dtype=float)
    targets = np.asarray(targets)
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise DerivationError(f"logits [pos, d_vocab] and one target per position expected, got shapes "
                              f"{logits.shape} and {targets.shape}")
    if targets.size and (targets.min() < 0 or targets.max() >= logits.shape[1]):
        raise DerivationError(f"targets must lie in 0..{logits.shape[1] - 1}, got {targets.tolist()}")
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(targets)), targets].mean())


def marginal_losses(parts: Sequence[np.ndarray], targets: Sequence[int]) -> list[tuple[float, float]]:
    """``[(L_k, ΔL_k), …]`` for the logits ``parts[k]`` of order ``k`` (each ``[pos, d_vocab]``):
    ``L_k`` is the loss of ``parts[0] + … + parts[k]`` and ``ΔL_k = L_k - L_{k-1}``, starting
    from the uniform prediction ``L_{-1} = log d_vocab``. Negative: adding order ``k`` lowers
    the loss. The changes add up to ``L(all parts) - log d_vocab``."""
    if not parts:
        raise DerivationError("marginal losses need the logits of at least one order")
    before = float(np.log(np.asarray(parts[0]).shape[1]))
    total = np.zeros_like(np.asarray(parts[0], dtype=float))
    rows = []
    for part in parts:
        total = total + np.asarray(part, dtype=float)
        loss = cross_entropy(total, targets)
        rows.append((loss, loss - before))
        before = loss
    return rows


def loss_table(changes: Sequence[float]) -> Math:
    """The marginal loss table: order, the terms it adds, ``ΔL_k`` in nats (hand-built: an array).

    >>> print(loss_table((-1.8, -5.2)).text)
    k | terms added | ΔL_k (nats): 0 | direct path | -1.8; 1 | individual heads | -5.2
    """
    names = list(ORDER_NAMES) + [f"paths through {k} heads" for k in range(3, len(changes))]
    rows = [(k, names[k], value) for k, value in enumerate(changes)]
    latex = (r"\begin{array}{clr} k & \text{terms added} & \Delta L_k\ (\text{nats}) \\ \hline "
             + r" \\ ".join(rf"{k} & \text{{{name}}} & {value:.1f}" for k, name, value in rows) + r" \end{array}")
    text = "k | terms added | ΔL_k (nats): " + "; ".join(f"{k} | {name} | {value:.1f}" for k, name, value in rows)
    return Math(latex, text)


@entry("marginal-loss", "the logits by path order and the marginal loss of each order (negative: loss goes down)")
def marginal_loss() -> Derivation:
    arch = architecture(2, 2, "none", False, False, False)
    product = Product([term(None, atom("W_U")), stream_product(arch, 0, 2, (atom("W_E"),), False)])
    sums = [sum_index(1), sum_index(0)]
    full = Chain.start(math("T"), product, detail="two layers of heads on the embedded tokens", sums=sums,
                       intro="The logits of a two-layer attention-only model, split by the number of heads on "
                             "each path:").expand()
    full = full.regroup(by_order(full.last), detail="by the number of heads on the path")
    partial = [
        Chain.start(Math(rf"T_{{\le {k}}}", f"T_≤{k}"), product, detail="the same product",
                    sums=sums, intro=intro).expand(max_order=k)
        for k, intro in ((0, "Keeping only the direct path:"), (1, "Keeping the paths through at most one head:"))
    ]
    return Derivation(
        "marginal-loss", "The marginal loss of each path order",
        "The logits are the sum of the direct path, the individual heads and the virtual heads; adding the orders "
        "one at a time and measuring the loss after each gives the marginal loss of each order.",
        (full, *partial),
        notes=(
            prose("The loss of logits ", math("T"), " is the mean over positions of ",
                  Math(r"-\log \mathrm{softmax}(T_i)_{t_{i+1}}", "-log softmax(T_i)_(t_{i+1})"),
                  ". The marginal loss of order k is the change ",
                  Math(r"\Delta L_k = L(T_{\le k}) - L(T_{\le k-1})", "ΔL_k = L(T_≤k) - L(T_≤k-1)"),
                  ", starting from the uniform prediction ", Math(r"L(T_{\le -1}) = \log d_{vocab}",
                                                                   "L(T_≤-1) = log d_vocab"),
                  ": negative when adding the order lowers the loss. The changes add up to ",
                  Math(r"L(T) - \log d_{vocab}", "L(T) - log d_vocab"), "."),
            prose("Order 0 is the direct path, order 1 the individual heads, order 2 the virtual heads; the patterns ",
                  math("A^h"), " are those of the full model's forward pass, frozen, so each truncation is "
                  "a sum of terms of the expansion above."),
            prose("The paper's figures for its two-layer attention-only model, as changes in loss in this sign "
                  "convention (the individual heads matter most, the virtual heads add little): ",
                  loss_table(PAPER)),
            NOTATION, INDEXING, SUMS,
        ),
    )
