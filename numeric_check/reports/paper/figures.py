"""The companion's figures: the analysis report's (:func:`~numeric_check.reports.report.make_figures`,
with the paper's layer numbers), three of its own (the bigram table, the skip-trigram bugs, the loss on repeats by length),
and the language model's training run (:func:`~numeric_check.reports.paper.formation.formation_figures`).

Figures are Matplotlib :class:`~matplotlib.figure.Figure` objects drawn without ``pyplot``;
:func:`figures` returns them by name with their captions, :mod:`numeric_check.reports.plots`
saves them.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.figure import Figure

from derivations.document import math as formula, prose

from numeric_check.reports.paper.claims import index_from
from numeric_check.reports.paper.formation_text import CAPTIONS as FORMATION_CAPTIONS, formation_figures
from numeric_check.reports.report import make_figures
from numeric_check.reports.paper.measure import Measurements
from numeric_check.reports import plots
from numeric_check.reports.plots import mathtext, plain_title

#: Captions by figure name: prose (text, and formulae for the one printer).
CAPTIONS = {
    "bigrams": prose("The zero-layer model's next-token log-probabilities (the log-softmax of each column of ",
                     formula("W_U W_E"), ") against the data's bigram log-probabilities, for every pair of tokens the "
                     "data hold; the red line is the uniform ", formula("log(1/d_vocab)"), "."),
    "positivity-1l": "One-layer model: each head's OV eigenvalue positivity (copying, x) against its QK positivity (y).",
    "bugs": "The skip-trigrams planted in the one-layer model's data, by source A (each with two, A … B1 → C1 and "
            "A … B2 → C2): the rise of an out's logit after a destination when A is earlier in the context, for the "
            "planted out (blue), the other pair's out, which the data never put there (red: the bug), and outs drawn "
            "at random (grey); means over both destinations.",
    "profiles": "Two-layer model: attention by query position of the previous-token head (left) and the induction "
                "heads (right); the dashed line is the bar of 0.4.",
    "composition": ("Two-layer model: Q-, K- and V-composition scores minus their random baseline, writer head by reader "
                    "head, as the paper defines them (its first figure, withdrawn in its Correction, used rotated products)."),
    "positivity-2l": "Two-layer model: OV positivity (copying, x) against QK positivity (y; second layer: the "
                     "K-composition circuit with the previous-token head, same-matching).",
    "repeat-loss": "Loss on the second copy of a repeated random segment (its first token excluded) by segment length: "
                   "mean over offsets of the first copy, and the range over offsets.",
    "importance": "Two-layer model, loss on repeated tokens: marginal loss by path order, of each head, and of the "
                  "largest virtual heads (patterns frozen).",
    "training-loss": "Your model's training: the loss on the training batches (blue) and on their repeated spans (red) "
                     "by step, as train-toy recorded them beside the checkpoint (its training record's curve).",
    **FORMATION_CAPTIONS,
}


def bigram_figure(m: Measurements) -> Figure:
    """The zero-layer model's next-token log-probabilities against the data's, entry by entry."""
    model = m.analysis(0).model
    with torch.no_grad():
        logq = torch.log_softmax(model.W_U.double() @ model.W_E.double(), dim=0).T.cpu()  # [current, next]
    fig = Figure(figsize=(5.2, 3.4), layout="constrained")
    ax = fig.add_subplot()
    uniform = -math.log(model.cfg.d_vocab)
    if m.bigram is not None and m.bigram.table is not None:
        table = m.bigram.table
        seen = table > 0
        ax.scatter(table[seen].log().numpy(), logq[seen].numpy(), s=3, alpha=0.35, color="#1f77b4", lw=0,
                   label="entries the data hold")
        lo = float(min(table[seen].log().min(), logq.min()))
        ax.plot([lo, 0], [lo, 0], color="0.3", lw=0.8, ls="--", label="equal")
        ax.set(xlabel="the data's log p(next | current)   (nats)", ylabel="the model's log p(next | current)")
        ax.legend(frameon=False, fontsize=8, loc="upper left")
    else:
        ax.hist((logq - uniform).flatten().numpy(), bins=60, color="0.45")
        ax.set(xlabel=mathtext(prose("log p(next | current) − ", formula("log(1/d_vocab)"), "   (nats)")), ylabel="entries")
    ax.axhline(uniform, color="#d62728", lw=0.8)
    plain_title(ax, prose(m.analysis(0).name, ": ", formula("W_U W_E"), " against the data's bigrams"))
    return fig


def bugs_figure(m: Measurements) -> Figure:
    fig = Figure(figsize=(5.6, 3.2), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(m.bugs))
    kinds = (("planted: A … B1 → C1", lambda b: b.diagonal, "#1f77b4"),
             ("swapped (the bug): A … B1 → C2", lambda b: b.off_diagonal, "#d62728"),
             ("random outs", lambda b: float(b.control.mean()), "0.6"))
    for k, (label, value, colour) in enumerate(kinds):
        ax.bar(x + (k - 1) * 0.27, [value(b) for b in m.bugs], width=0.27, label=label, color=colour)
    ax.set_xticks(x, [f"#{b.source}" for b in m.bugs])
    ax.axhline(0, color="k", lw=0.6)
    top = max([float(b.rise.max()) for b in m.bugs] + [0.1])
    ax.set(xlabel="planted source A", ylabel="mean logit rise (nats)", ylim=(min(0.0, ax.get_ylim()[0]), 1.6 * top))
    ax.legend(frameon=False, fontsize=7.5, ncol=2, loc="upper center")
    if m.bugs:
        plain_title(ax, f"{m.analysis(1).name}: planted skip-trigrams, swapped pairs")
    return fig


def repeat_loss_figure(m: Measurements) -> Figure:
    fig = Figure(figsize=(5.2, 3.4), layout="constrained")
    ax = fig.add_subplot()
    for n_layers, colour in ((2, "#1f77b4"), (1, "#d62728")):
        grid = m.analysis(n_layers).grid
        loss = grid.loss.double().cpu().numpy()
        lengths = np.array(grid.lengths)
        ax.plot(lengths, np.nanmean(loss, 1), marker="o", color=colour, label=f"{n_layers}-layer model")
        ax.fill_between(lengths, np.nanmin(loss, 1), np.nanmax(loss, 1), color=colour, alpha=0.15)
    ax.axhline(m.analysis(2).grid.uniform, color="0.6", ls="--", lw=0.8, label="uniform")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(m.analysis(2).grid.lengths), [str(n) for n in m.analysis(2).grid.lengths])
    ax.set(xlabel="length of the repeated segment (tokens)", ylabel="loss on the second copy (nats)", ylim=(0, None))
    ax.legend(frameon=False, fontsize=8)
    return fig


def training_loss_figure(curve: list[dict]) -> Figure:
    """A person's run's loss by step, from its training record's ``curve`` (points with step, loss, repeat_loss)."""
    fig = Figure(figsize=(5.2, 3.2), layout="constrained")
    ax = fig.add_subplot()
    steps = [p["step"] for p in curve]
    ax.plot(steps, [p["loss"] for p in curve], marker="o", ms=3, color="#1f77b4", label="training loss")
    ax.plot(steps, [p["repeat_loss"] for p in curve], marker="o", ms=3, color="#d62728", label="loss on repeated spans")
    top = max([p["loss"] for p in curve] + [p["repeat_loss"] for p in curve])
    ax.set(xlabel="step", ylabel="loss (nats)", ylim=(0, 1.1 * top))  # room above the first steps' loss
    ax.legend(frameon=False, fontsize=8, loc="lower left")
    return fig


def figures(m: Measurements) -> dict[str, Figure]:
    """Every figure of the companion by name (keys of :data:`CAPTIONS`), layers numbered as the paper does."""
    one, two = make_figures(m.analysis(1), index_from()), make_figures(m.analysis(2), index_from())
    out = {
        "bigrams": bigram_figure(m),
        "positivity-1l": one["positivity"],
        "bugs": bugs_figure(m),
        "profiles": two["profiles"],
        "composition": two["composition"],
        "positivity-2l": two["positivity"],
        "repeat-loss": repeat_loss_figure(m),
        "importance": plots.importance_bars(m.analysis(2).importance_repeat or m.analysis(2).importance,
                                            index_from=index_from()),
    }
    if m.formation is not None:
        out.update(formation_figures(m.formation))
    if m.training_curve:
        out["training-loss"] = training_loss_figure(m.training_curve)
    return {name: out[name] for name in CAPTIONS if name in out}
