"""Figures of the paper's analyses, drawn with Matplotlib without a display.

Figures are built on :class:`matplotlib.figure.Figure` directly (never ``pyplot``),
so no backend or global state is touched; :func:`save_figure` writes PNG and SVG.
Every function takes plain numbers (tensors or arrays) and returns the figure.

>>> import torch
>>> fig = positivity_scatter(torch.tensor([[0.9, -0.2]]), torch.tensor([[0.8, 0.1]]))
>>> fig.axes[0].get_xlabel()
'OV circuit eigenvalue positivity (copying)'
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.mathtext import MathTextParser
from matplotlib.ticker import MaxNLocator

from derivations.architecture import head_label
from derivations.document import Math, as_prose
from tensoralg.escape import escape_text
from numeric_check.files import atomic_path
from numeric_check.errors import PlotError

LAYER_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
FORMATS = ("png", "svg")
ALLOWED_FORMATS = ("png", "svg", "pdf")


def _array(values, name: str, ndim: int) -> np.ndarray:
    try:
        array = np.asarray(values.detach().cpu() if hasattr(values, "detach") else values, dtype=float)
    except (TypeError, ValueError) as error:
        raise PlotError(f"{name} must be numbers, got {type(values).__name__}: {error}") from None
    if array.ndim != ndim:
        raise PlotError(f"{name} must have {ndim} dimensions, got shape {array.shape}")
    return array


def _colour(layer: int) -> str:
    return LAYER_COLOURS[layer % len(LAYER_COLOURS)]


def _label(layer: int, head: int, index_from: int = 0) -> str:
    """A head's label with layers numbered from ``index_from`` (0: TransformerLens, 1: the paper)."""
    return head_label(layer + index_from, head)


#: Points closer than this (in positivity units, both axes) share one label, so labels never overlap.
NEAR = (0.3, 0.1)


def label_groups(points: Sequence[tuple[float, float]], near: tuple[float, float] = NEAR) -> list[list[int]]:
    """Indices of ``points`` grouped so that each point lies within ``near`` of another of its group
    (single linkage); each group is labelled once.

    >>> label_groups([(0.9, 0.9), (0.95, 0.92), (-0.5, 0.1)])
    [[0, 1], [2]]
    """
    groups: list[list[int]] = []
    for i, (x, y) in enumerate(points):
        joined = [g for g in groups if any(abs(x - points[j][0]) < near[0] and abs(y - points[j][1]) < near[1] for j in g)]
        merged = [i] + [j for g in joined for j in g]
        groups = [g for g in groups if g not in joined] + [sorted(merged)]
    return sorted(groups)


def positivity_scatter(
    ov_positivity,
    qk_positivity,
    *,
    xlabel: str = "OV circuit eigenvalue positivity (copying)",
    ylabel: str = "QK circuit eigenvalue positivity (same-matching)",
    title: str = "Heads by eigenvalue positivity",
    highlight: Sequence[tuple[int, int]] = (),
    index_from: int = 0,
) -> Figure:
    """Each head as a point (OV positivity, QK positivity), coloured by layer, as in the paper.

    Inputs are ``[n_layers, n_heads]``; NaN entries (a head without the score) are left
    out. Points near (1, 1) copy what they attend to and attend to matching tokens.
    ``highlight`` heads get their label (every head when there are 16 or fewer); heads whose points
    lie close together share one label (:func:`label_groups`), so no two labels overlap. Layers
    are numbered from ``index_from`` in labels and legend.
    """
    x = _array(ov_positivity, "ov_positivity", 2)
    y = _array(qk_positivity, "qk_positivity", 2)
    if x.shape != y.shape:
        raise PlotError(f"ov_positivity has shape {x.shape} but qk_positivity has {y.shape}; expected equal [n_layers, n_heads]")
    fig = Figure(figsize=(5.2, 4.8), layout="constrained")
    ax = fig.add_subplot()
    ax.axhline(0, color="0.8", lw=0.8, zorder=0)
    ax.axvline(0, color="0.8", lw=0.8, zorder=0)
    labelled: list[tuple[tuple[float, float], str]] = []
    for layer in range(x.shape[0]):
        keep = ~(np.isnan(x[layer]) | np.isnan(y[layer]))
        if keep.any():
            ax.scatter(x[layer][keep], y[layer][keep], s=40, color=_colour(layer), label=f"layer {layer + index_from}",
                       edgecolor="k", lw=0.4)
        for head in np.nonzero(keep)[0]:
            if (layer, int(head)) in set(highlight) or x.size <= 16:
                labelled.append(((float(x[layer, head]), float(y[layer, head])), _label(layer, int(head), index_from)))
    for group in label_groups([p for p, _ in labelled]):
        xs, ys = [labelled[i][0][0] for i in group], [labelled[i][0][1] for i in group]
        right = min(xs) < 0.3  # labels to the right of points on the left, else to the left
        low = max(ys) > 0.8  # below points near the top (the title is above), else above
        anchor = (min(xs) if right else max(xs), min(ys) if low else max(ys))
        ax.annotate(", ".join(labelled[i][1] for i in group), anchor, xytext=(6 if right else -6, -6 if low else 6),
                    textcoords="offset points", fontsize=8, ha="left" if right else "right", va="top" if low else "bottom",
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.set(xlim=(-1.05, 1.05), ylim=(-1.05, 1.05), xlabel=xlabel, ylabel=ylabel)
    plain_title(ax, title)
    ax.legend(loc="best", fontsize=8, frameon=True, framealpha=0.8)
    return fig


def _pair_axes(n_heads: Sequence[int]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Rows: heads of layers >= 1 (the later head); columns: heads of layers < last."""
    heads = [(l, h) for l, count in enumerate(n_heads) for h in range(count)]
    last = len(n_heads) - 1
    return [x for x in heads if x[0] >= 1], [x for x in heads if x[0] < last]


def composition_heatmaps(scores: dict[str, object], *, baseline: dict[str, object] | None = None, title: str | None = None,
                         index_from: int = 0) -> Figure:
    """Q-, K- and V-composition scores as heatmaps: later head (rows) by earlier head (columns).

    ``scores[kind]`` is ``[n_layers, n_heads, n_layers, n_heads]`` indexed
    ``[l1, h1, l2, h2]`` (earlier head first); pairs without ``l1 < l2`` are blank. With
    ``baseline`` (the same shapes), the colour shows score minus baseline, centred at 0.
    """
    if not scores:
        raise PlotError("no composition scores given; expected a dict with some of 'Q', 'K', 'V'")
    arrays = {kind: _array(value, f"scores[{kind!r}]", 4) for kind, value in scores.items()}
    shape = next(iter(arrays.values())).shape
    if any(a.shape != shape for a in arrays.values()):
        raise PlotError(f"composition scores differ in shape: {({k: a.shape for k, a in arrays.items()})}")
    if shape[0] < 2:
        raise PlotError(f"composition needs at least 2 layers; scores have shape {shape}")
    rows, cols = _pair_axes([shape[1]] * shape[0])
    grids = {}
    for kind, array in arrays.items():
        grid = np.full((len(rows), len(cols)), np.nan)
        base = None if baseline is None else _array(baseline[kind], f"baseline[{kind!r}]", 4)
        for i, (l2, h2) in enumerate(rows):
            for j, (l1, h1) in enumerate(cols):
                if l1 < l2:
                    grid[i, j] = array[l1, h1, l2, h2] - (0.0 if base is None else base[l1, h1, l2, h2])
        grids[kind] = grid
    # one colour scale for every panel, so Q, K and V compare at a glance
    bound = max(max(np.nanmax(np.abs(g)) for g in grids.values()), 1e-9)
    fig = Figure(figsize=(2.6 * len(arrays) + 1.0, 0.4 * len(rows) + 2.0), layout="constrained")
    axes = fig.subplots(1, len(arrays), squeeze=False)[0]
    for ax, (kind, grid) in zip(axes, grids.items()):
        if baseline is None:
            image = ax.imshow(grid, cmap="Blues", vmin=0, vmax=bound)
        else:
            image = ax.imshow(grid, cmap="RdBu_r", norm=TwoSlopeNorm(0, -bound, bound))
        if grid.size <= 144:
            for i, j in zip(*np.nonzero(~np.isnan(grid))):
                light = abs(grid[i, j]) > 0.6 * bound  # white on the darkest cells
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8 if grid.size <= 36 else 6,
                        color="white" if light else "black")
        ax.set_xticks(range(len(cols)), [_label(*c, index_from) for c in cols], rotation=90, fontsize=8)
        ax.set_yticks(range(len(rows)), [_label(*r, index_from) for r in rows], fontsize=8)
        ax.set_xlabel("earlier head (writes)")
        ax.set_ylabel("later head (reads)")
        ax.set_title(f"{kind}-composition")  # "minus baseline" once, in the figure's title
    fig.colorbar(image, ax=list(axes), shrink=0.8)
    if title:
        plain_title(fig, title)
    return fig


def importance_bars(report, *, top_virtual: int = 8, index_from: int = 0) -> Figure:
    """Term importance (an :class:`~numeric_check.circuits.importance.ImportanceReport`) as bars.

    Left: marginal loss by order (direct path, individual heads, virtual
    heads). Middle: each individual head's marginal loss, coloured by layer. Right: the
    largest virtual-head terms.
    """
    panels = 2 + bool(report.virtual_marginal)
    fig = Figure(figsize=(2.9 * panels, 3.4), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    names = ["direct", "heads", "virtual"] + [f"order {k}" for k in range(3, len(report.loss_by_order))]
    if report.truncated:
        names[len(report.loss_by_order) - 1] = "rest"
    marginal = report.marginal_by_order
    axes[0].bar(names[: len(marginal)], marginal, color="0.45")
    axes[0].set(title="Marginal loss by order\n(change when added)", ylabel="nats")
    heads = sorted(report.head_marginal)
    axes[1].bar(range(len(heads)), [report.head_marginal[h] for h in heads], color=[_colour(l) for l, _ in heads])
    axes[1].set_xticks(range(len(heads)), [_label(*h, index_from) for h in heads], rotation=90, fontsize=8)
    axes[1].set(title="Individual heads\n(change in loss when added)", ylabel="nats")
    if report.virtual_marginal:
        top = report.top_virtual(top_virtual)
        axes[2].barh(range(len(top)), [value for _, value in top], color="0.6")
        axes[2].set_yticks(range(len(top)), ["→".join(_label(*h, index_from) for h in pair) for pair, _ in top], fontsize=8)
        axes[2].invert_yaxis()
        axes[2].set(title="Largest virtual heads", xlabel="nats")
        axes[2].xaxis.set_major_locator(MaxNLocator(4, symmetric=True))  # small values: long tick labels that collide
        axes[2].ticklabel_format(axis="x", style="sci", scilimits=(-2, 3))
    axes[0].axhline(0, color="k", lw=0.6)
    axes[1].axhline(0, color="k", lw=0.6)
    if report.virtual_marginal:
        axes[2].axvline(0, color="k", lw=0.6)
    return fig


def position_profiles_figure(
    previous_token,
    induction,
    *,
    previous_heads: Sequence[tuple[int, int]],
    induction_heads: Sequence[tuple[int, int]],
    threshold: float | None = None,
    title: str | None = None,
    index_from: int = 0,
) -> Figure:
    """Attention by query position: to ``i - 1`` for ``previous_heads`` (left), inductive for ``induction_heads`` (right).

    ``previous_token`` and ``induction`` are ``[n_layers, n_heads, n_positions]`` profiles
    (NaN where not measured, as in :class:`~numeric_check.circuits.behaviour.PositionProfile`); a
    head that works in only part of the context shows as a curve that falls away.
    ``threshold`` draws the classification bar.
    """
    panels = {"attention to i-1": (_array(previous_token, "previous_token", 3), previous_heads),
              "attention after an earlier occurrence": (_array(induction, "induction", 3), induction_heads)}
    fig = Figure(figsize=(8.4, 3.4), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, (label, (values, heads)) in zip(axes, panels.items()):
        for layer, head in heads:
            if not (0 <= layer < values.shape[0] and 0 <= head < values.shape[1]):
                raise PlotError(f"head {head_label(layer, head)} is outside profiles of shape {values.shape}")
            curve = values[layer, head]
            ax.plot(np.arange(len(curve)), curve, lw=1.2, label=_label(layer, head, index_from),
                    color=_colour(layer) if len(heads) == 1 else None)
        if threshold is not None:
            ax.axhline(threshold, color="0.6", ls="--", lw=0.8)
        ax.set(xlabel="query position i", ylim=(-0.02, 1.02), title=label)
        if heads:
            ax.legend(frameon=False, fontsize=8, ncol=2)
        else:
            ax.text(0.5, 0.5, "no such head", ha="center", va="center", transform=ax.transAxes, color="0.5")
    axes[0].set_ylabel("mean attention")
    if title:
        plain_title(fig, title)
    return fig


def training_curve(curve: Sequence[dict], *, uniform_loss: float | None = None, title: str = "Training loss") -> Figure:
    """Loss and loss on repeated tokens against step, from a training record's ``curve``."""
    if not curve:
        raise PlotError("the training curve is empty; expected a list of {'step', 'loss', 'repeat_loss'}")
    steps = [point["step"] for point in curve]
    fig = Figure(figsize=(5.2, 3.4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(steps, [p["loss"] for p in curve], label="all tokens")
    ax.plot(steps, [math.nan if p["repeat_loss"] is None else p["repeat_loss"] for p in curve], label="repeated tokens")
    if uniform_loss is not None:
        ax.axhline(uniform_loss, color="0.6", ls="--", lw=0.8, label="uniform")
    ax.set(xlabel="step", ylabel="loss (nats)")
    plain_title(ax, title)
    ax.legend(frameon=False, fontsize=8)
    return fig


def check_formats(formats: Sequence[str]) -> None:
    """Raise :class:`PlotError` unless every format is one of :data:`ALLOWED_FORMATS`."""
    unknown = [f for f in formats if f not in ALLOWED_FORMATS]
    if unknown or not formats:
        raise PlotError(
            f"unknown figure format(s) {unknown}; expected some of " + ", ".join(map(repr, ALLOWED_FORMATS))
            if unknown
            else "no figure format given; expected some of " + ", ".join(map(repr, ALLOWED_FORMATS))
        )


def plain_title(target: Axes | Figure, text) -> None:
    r"""Title ``target`` (an axes, or a figure's suptitle) with user text such as a checkpoint's
    name, as plain text: never Matplotlib's mathtext (``$\bad$`` would be parsed, and fail),
    control characters shown escaped and whitespace runs as one space. Prose with formulae
    (:func:`derivations.document.prose`) is set by :func:`mathtext` instead."""
    plain = isinstance(text, str)
    text = escape_text(text, "text") if plain else mathtext(text)
    (target.suptitle if isinstance(target, Figure) else target.set_title)(text, parse_math=not plain)


def mathtext(segments) -> str:
    r"""Prose as Matplotlib text: plain strings escaped (``$`` shown as a dollar), formulae
    (:class:`~derivations.document.Math`) typeset by mathtext from the one printer's LaTeX, so
    ``W_U W_E`` shows subscripts, not underscores.

    >>> from derivations.document import math, prose
    >>> mathtext(prose("induction_0l: ", math("W_U W_E"), " costs $1"))
    'induction_0l: $W_{U} W_{E}$ costs \\$1'
    """
    out = []
    for s in as_prose(segments):
        if isinstance(s, Math):
            out.append(f"${s.latex}$" if _mathtext_reads(s.latex) else escape_text(s.text, "text").replace("$", r"\$"))
        else:
            out.append(escape_text(s, "text").replace("$", r"\$"))
    return "".join(out)


def _mathtext_reads(latex: str) -> bool:
    """Whether Matplotlib's mathtext (a subset of TeX) typesets ``latex``."""
    try:
        MathTextParser("path").parse(f"${latex}$")
    except ValueError:
        return False
    return True


def save_figure(fig: Figure, out_dir: Path | str, name: str, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write ``fig`` as ``out_dir/name.png`` and ``.svg`` (or ``formats``); return the paths."""
    check_formats(formats)
    paths = []
    for fmt in formats:
        path = Path(out_dir) / f"{name}.{fmt}"
        metadata = {"Date": None} if fmt == "svg" else None
        # a temporary name of its own, renamed when complete, removed on failure: never half a figure
        with atomic_path(path) as tmp, rc_context({"svg.hashsalt": "tcircuits"}):  # reproducible SVG ids
            fig.savefig(tmp, format=fmt, dpi=150, metadata=metadata)
        paths.append(path)
    return paths
