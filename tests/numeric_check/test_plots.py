"""Tests for numeric_check.reports.plots: figures are built headless and written as PNG and SVG."""

from __future__ import annotations

import math

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.circuits.importance import term_importance
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.errors import PlotError
from numeric_check.reports.plots import (
    composition_heatmaps,
    importance_bars,
    positivity_scatter,
    save_figure,
    training_curve,
)

pytestmark = pytest.mark.slow  # analysis figures: left out by pytest -m "not slow"

torch.set_num_threads(1)


def _scores(n_layers=2, n_heads=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(n_layers, n_heads, n_layers, n_heads, generator=g)
    l1 = torch.arange(n_layers)[:, None, None, None]
    l2 = torch.arange(n_layers)[None, None, :, None]
    return scores * (l1 < l2)


def test_scatter_writes_png_and_svg(tmp_path):
    x = torch.tensor([[0.9, -0.3, float("nan")], [0.95, 0.99, 0.2]])
    fig = positivity_scatter(x, x.flip(-1), highlight=[(1, 1)])
    paths = save_figure(fig, tmp_path, "scatter")
    assert [p.name for p in paths] == ["scatter.png", "scatter.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = paths[1].read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "L1H1" in texts and "L0H2" not in texts  # NaN heads are left out
    # two layers -> two legend entries
    assert len(fig.axes[0].get_legend().get_texts()) == 2


def test_svg_is_reproducible(tmp_path):
    a, b = (
        save_figure(positivity_scatter(torch.zeros(1, 2), torch.ones(1, 2)), tmp_path, name, formats=["svg"])[0].read_text()
        for name in "ab"
    )
    assert "<dc:date>" not in a
    assert a == b


def test_composition_heatmaps_show_only_earlier_to_later_pairs(tmp_path):
    scores = {kind: _scores(3, 2, seed) for seed, kind in enumerate("QKV")}
    fig = composition_heatmaps(scores)
    assert len(fig.axes) == 4  # three panels and one shared colour bar
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["L1H0", "L1H1", "L2H0", "L2H1"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    grid = ax.get_images()[0].get_array()
    assert grid.mask[0, 2] and not grid.mask[2, 2]  # L1 cannot read L1; L2 reads L1
    assert grid[3, 1] == pytest.approx(float(scores["Q"][0, 1, 2, 1]))
    baseline = {kind: torch.full_like(s, 0.25) for kind, s in scores.items()}
    fig = composition_heatmaps(scores, baseline=baseline, title="minus baseline")
    assert fig.axes[0].get_images()[0].get_array()[3, 1] == pytest.approx(float(scores["Q"][0, 1, 2, 1]) - 0.25)
    save_figure(fig, tmp_path, "composition")


def test_importance_bars_and_training_curve(tmp_path):
    model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0, device="cpu")
    report = term_importance(model, torch.randint(0, 10, (2, 6), generator=torch.Generator().manual_seed(0)))
    fig = importance_bars(report)
    assert len(fig.axes) == 3
    heights = [bar.get_height() for bar in fig.axes[0].patches]
    assert heights == pytest.approx(report.marginal_by_order)
    save_figure(fig, tmp_path, "importance")
    curve = [{"step": s, "loss": 4.8 - s / 1000, "repeat_loss": 4.8 - s / 500} for s in (100, 200, 300)]
    fig = training_curve(curve, uniform_loss=math.log(128))
    assert len(fig.axes[0].get_lines()) == 3
    save_figure(fig, tmp_path, "curve", formats=["png"])


def test_bad_input_is_rejected_clearly():
    with pytest.raises(PlotError, match="ov_positivity has shape \\(1, 2\\) but qk_positivity has \\(2, 2\\)"):
        positivity_scatter(torch.zeros(1, 2), torch.zeros(2, 2))
    with pytest.raises(PlotError, match="must have 2 dimensions, got shape \\(3,\\)"):
        positivity_scatter(torch.zeros(3), torch.zeros(3))
    with pytest.raises(PlotError, match="at least 2 layers"):
        composition_heatmaps({"K": torch.zeros(1, 2, 1, 2)})
    with pytest.raises(PlotError, match="no composition scores"):
        composition_heatmaps({})
    with pytest.raises(PlotError, match="unknown figure format\\(s\\) \\['jpg'\\]"):
        save_figure(positivity_scatter(torch.zeros(1, 1), torch.zeros(1, 1)), ".", "x", formats=["jpg"])
    with pytest.raises(PlotError, match="training curve is empty"):
        training_curve([])


def test_scatter_labels_never_overlap_and_follow_the_layer_numbering():
    """Heads whose points lie close share one label (issue 27.5: the companion's scatters overlapped)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    x = torch.tensor([[-0.95, -0.83, -0.45, -0.55], [1.0, 1.0, 0.999, 0.998]])
    y = torch.tensor([[0.75, 0.75, -0.08, -0.3], [1.0, 1.0, 1.0, 0.999]])
    fig = positivity_scatter(x, y, index_from=1)
    FigureCanvasAgg(fig).draw()
    texts = fig.axes[0].texts
    assert sorted(t.get_text() for t in texts) == ["L1H0, L1H1", "L1H2", "L1H3", "L2H0, L2H1, L2H2, L2H3"]
    boxes = [t.get_window_extent() for t in texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    title = fig.axes[0].title.get_window_extent()
    assert not any(b.overlaps(title) for b in boxes)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["layer 1", "layer 2"]


def test_composition_values_are_readable_and_labels_follow_the_numbering():
    scores = {kind: _scores(2, 4, seed) for seed, kind in enumerate("QKV")}
    fig = composition_heatmaps(scores, index_from=1)
    values = [t for t in fig.axes[0].texts]
    assert len(values) == 16 and min(t.get_fontsize() for t in values) >= 8
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["L2H0", "L2H1", "L2H2", "L2H3"]
    assert fig.get_size_inches()[0] <= 9  # drawn at about the width it is shown at: 100 % in a page and the PDF


def test_a_title_with_a_formula_sets_it_by_the_printer_not_with_underscores(tmp_path):
    """Prose in a title: the name stays as typed (its underscore too), the formula is typeset from the one
    printer's LaTeX (W with subscripts U and E), and a dollar in user text is a dollar, not mathtext."""
    from matplotlib.figure import Figure

    from derivations.document import math as formula, prose
    from numeric_check.reports.plots import mathtext, plain_title, save_figure

    fig = Figure()
    ax = fig.add_subplot()
    plain_title(ax, prose("induction_0l $5: ", formula("W_U W_E"), " against the data's bigrams"))
    assert ax.get_title() == r"induction_0l \$5: $W_{U} W_{E}$ against the data's bigrams"
    svg = save_figure(fig, tmp_path, "title", formats=("svg",))[0].read_text(encoding="utf-8")
    assert "W_U" not in svg  # drawn as a W and a subscript U, never the raw name
    assert mathtext(prose(formula("log(1/d_vocab)"))).startswith("$") and "d_{vocab}" in mathtext(prose(formula("d_vocab")))
    plain_title(ax, "a plain name with $x$")  # plain text stays plain
    assert ax.get_title() == "a plain name with $x$"
