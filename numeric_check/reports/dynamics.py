"""The phase change as a reader looks at it: figures of a run's :class:`~numeric_check.training.dynamics.Dynamics`
(beside its one-layer control's), the follow-up paper's claims judged (:mod:`numeric_check.training.phase`),
and a page that holds them: ``index.html`` (works offline), ``dynamics.md``, ``dynamics.json`` and
``figures/*.png`` and ``.svg``, written whole into one folder (``tcircuits dynamics``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from derivations.architecture import head_label
from derivations.vocabulary import renumber
from derivations.html import page
from tensoralg.display import md_table, md_text
from tensoralg.escape import escape_text

from numeric_check.reports.plots import LAYER_COLOURS, plain_title, save_figure
from numeric_check.training.dynamics import icl_definition, random_tokens_definition, stopped_definition

#: What the snapshots table's headroom column is, for the page.
HEADROOM_DEFINITION = ("Induction headroom: how much the held-out loss would fall (nats a token) if the model's "
                       "prediction were mixed, at the best single weight, with the token that followed the current "
                       "token's last earlier occurrence: what a perfect induction head could still add to the model "
                       "as it is.")
#: Positions averaged together in each row of the heat map (a position's mean over 256 windows varies by ~0.15 nats).
HEATMAP_BIN = 4
#: The page's figures, in order, with their captions.
FIGURES = {
    "loss": "Held-out loss (left) and in-context learning score (right) at each snapshot; the shaded steps are the "
            "window in which the best last-layer head's prefix matching rises (a fifth to four fifths of its rise). "
            "Dashed: the one-layer control, trained alike.",
    "heatmap": "Held-out loss by token index (vertical) at each snapshot (horizontal, log steps), less that snapshot's "
               "mean over the context, four positions to a row: in-context learning shows as later tokens turning cheaper (blue) than early "
               "ones (red).",
    "heads": "Every head's prefix-matching (left) and copying (right) score at each snapshot, on repeated random "
             "tokens; the induction head the run ends with is drawn thick.",
    "kcomp": "The induction circuit's K-composition: its composition score (left) and the size of its term "
             "Id ⊗ A^{h1} ⊗ W_Eᵀ W_QK^{h2} W_OV^{h1} W_E in the induction head's scores on a repeated random sequence "
             "(right); every snapshot's expansion verified against the snapshot model.",
}


def _window(ax, run, window) -> None:
    if window is not None:
        ax.axvspan(run.steps[window[0]], run.steps[window[1]], color="#ffdd88", alpha=0.5, lw=0)


def loss_figure(run, control=None, window=None) -> Figure:
    fig = Figure(figsize=(8.4, 3.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    for d, style, name in ((run, "-", f"{run.n_layers} layers"), (control, "--", "control")):
        if d is None:
            continue
        left.plot(d.steps, [s.heldout_loss for s in d.snapshots], style, marker=".", label=name)
        right.plot(d.steps, [s.icl_score for s in d.snapshots], style, marker=".", label=name)
    for ax, ylabel in ((left, "held-out loss (nats)"), (right, "in-context learning score (nats)")):
        _window(ax, run, window)
        ax.set(xscale="log", xlabel="training step", ylabel=ylabel)
        ax.legend(frameon=False, fontsize=8)
    right.axhline(0, color="0.6", lw=0.8)
    return fig


def heatmap_figure(run) -> Figure:
    fig = Figure(figsize=(6.4, 3.6), layout="constrained")
    ax = fig.add_subplot()
    loss = np.array([s.position_loss for s in run.snapshots]).T  # [position, snapshot]
    loss = loss - loss.mean(0, keepdims=True)  # each snapshot against its own mean: the context's effect alone
    bins = np.arange(0, len(loss), HEATMAP_BIN)
    loss = np.add.reduceat(loss, bins, axis=0) / np.diff(np.append(bins, len(loss)))[:, None]  # means of 4 positions
    steps = np.array(run.steps, dtype=float)
    edges = np.concatenate([[steps[0] / 1.2], np.sqrt(steps[1:] * steps[:-1]), [steps[-1] * 1.2]])
    bound = max(float(np.quantile(np.abs(loss[1:]), 0.99)) if len(loss) > 1 else 0.0, 1e-9)  # the first tokens (little
    # context) cost far more than the others: the colours are scaled to the rest, and they show saturated
    mesh = ax.pcolormesh(edges, np.append(bins, run.n_ctx) + 0.5, loss, cmap="RdBu_r", vmin=-bound, vmax=bound,
                         shading="flat")
    ax.set(xscale="log", xlabel="training step", ylabel="token index")
    fig.colorbar(mesh, ax=ax, label="loss − the snapshot's mean (nats)")
    return fig


def heads_figure(run, window=None, index_from: int = 0) -> Figure:
    fig = Figure(figsize=(8.4, 3.4), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, name, label in ((axes[0], "prefix_matching", "prefix matching"), (axes[1], "copying", "copying (OV positivity)")):
        for layer in range(run.n_layers):
            for head in range(run.n_heads):
                values = [s.__dict__[name][layer][head] for s in run.snapshots]
                thick = (layer, head) == run.induction_head
                ax.plot(run.steps, values, color=LAYER_COLOURS[layer % len(LAYER_COLOURS)], lw=2.2 if thick else 0.6,
                        alpha=1.0 if thick else 0.6, label=f"layer {layer + index_from}" if head == 0 else
                        (head_label(layer + index_from, head) if thick else None))
        _window(ax, run, window)
        ax.set(xscale="log", xlabel="training step", ylabel=label, ylim=(0, 1) if name == "prefix_matching" else (-1, 1))
        ax.legend(frameon=False, fontsize=7)
    return fig


def kcomp_figure(run, window=None, index_from: int = 0) -> Figure:
    fig = Figure(figsize=(8.4, 3.0), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.plot(run.steps, [s.k_composition for s in run.snapshots], marker=".")
    right.plot(run.steps, [s.k_term_norm for s in run.snapshots], marker=".")
    pair = "" if run.induction_head is None else renumber(
        f"{head_label(*run.writer_head)} → {head_label(*run.induction_head)}", index_from)
    for ax, ylabel in ((left, f"K-composition score {pair}"), (right, "‖K-composition term‖ (Frobenius)")):
        _window(ax, run, window)
        ax.set(xscale="log", xlabel="training step", ylabel=ylabel)
    return fig


def figures(run, control=None, window=None, index_from: int = 0) -> dict[str, Figure]:
    """The page's figures by name; layers numbered from ``index_from`` in their labels."""
    out = {"loss": loss_figure(run, control, window), "heatmap": heatmap_figure(run)}
    if run.n_layers:
        out["heads"] = heads_figure(run, window, index_from)
    if run.induction_head is not None:
        out["kcomp"] = kcomp_figure(run, window, index_from)
    return out


def _h(text) -> str:
    return escape_text(str(text), "html")


def _headroom(snapshot) -> str:
    """A snapshot's induction headroom for a table: "—" where it was not measured."""
    value = snapshot.induction_headroom
    return "—" if math.isnan(value) else f"{value:.3f}"


def _verdict(holds) -> str:
    return "—" if holds is None else ("holds" if holds else "does not hold")


def markdown(run, claims, control=None, window=None) -> str:
    """The page as Markdown: the claims table, the snapshots table, the figures."""
    lines = [f"# How induction heads form in {run.checkpoint}", ""]
    if control is not None:
        lines += [f"Control: {control.checkpoint} ({control.n_layers} layer{'s' if control.n_layers != 1 else ''}, trained alike).", ""]
    lines += [md_text(icl_definition(run.n_ctx)), "", md_text(HEADROOM_DEFINITION), "",
              md_text(random_tokens_definition(run.random_tokens)), ""]
    lines += [md_text(stopped), ""] if (stopped := stopped_definition(run.record)) else []
    lines.append(md_table(("claim", "rule", "the model", "its figures", "the control", "its figures"),
                          [(md_text(c.name), md_text(c.rule), f"**{_verdict(c.holds)}**", md_text(c.detail),
                            _verdict(c.control_holds), md_text(c.control_detail)) for c in claims]))
    best = run.best("prefix_matching", run.n_layers - 1) if run.n_layers else [math.nan] * len(run.steps)
    lines += ["", md_table(("step", "held-out loss", "ICL score", "induction headroom", "best prefix matching (last layer)",
                            "K-composition", "‖K term‖", "verified"),
                           [(f"{s.step:,}", f"{s.heldout_loss:.3f}", f"{s.icl_score:+.3f}", _headroom(s), f"{b:.3f}",
                             f"{s.k_composition:.3f}", f"{s.k_term_norm:.3g}", "yes" if s.k_term_verified else "no")
                            for s, b in zip(run.snapshots, best)], right=range(7)), ""]
    for name, caption in FIGURES.items():
        lines += [f"![{caption}](figures/{name}.png)", "", f"*{caption}*", ""]
    return "\n".join(lines)


def html(run, claims, control=None, names: Sequence[str] = ()) -> str:
    rows = "".join(f"<tr><td>{_h(c.name)}</td><td>{_h(c.rule)}</td><td><b>{_verdict(c.holds)}</b></td><td>{_h(c.detail)}</td>"
                   f"<td>{_verdict(c.control_holds)}</td><td>{_h(c.control_detail)}</td></tr>" for c in claims)
    best = run.best("prefix_matching", run.n_layers - 1) if run.n_layers else [math.nan] * len(run.steps)
    snaps = "".join(f'<tr><td class="num">{s.step:,}</td><td class="num">{s.heldout_loss:.3f}</td>'
                    f'<td class="num">{s.icl_score:+.3f}</td><td class="num">{_headroom(s)}</td><td class="num">{b:.3f}</td><td class="num">{s.k_composition:.3f}</td>'
                    f'<td class="num">{s.k_term_norm:.3g}</td><td>{"yes" if s.k_term_verified else "no"}</td></tr>'
                    for s, b in zip(run.snapshots, best))
    control_line = "" if control is None else f"<p>Control: {_h(control.checkpoint)}, {control.n_layers} layer(s), trained alike.</p>"
    control_line += (f"<p>{_h(icl_definition(run.n_ctx))}</p><p>{_h(HEADROOM_DEFINITION)}</p>"
                     f"<p>{_h(random_tokens_definition(run.random_tokens))}</p>")
    control_line += f"<p>{_h(stopped)}</p>" if (stopped := stopped_definition(run.record)) else ""
    figs = "".join(f'<figure><img src="figures/{name}.svg" alt="{_h(FIGURES[name])}"><figcaption>{_h(FIGURES[name])}'
                   f"</figcaption></figure>" for name in FIGURES if name in names)
    body = (f"<h1>How induction heads form in {_h(run.checkpoint)}</h1>{control_line}"
            "<h2>The follow-up paper's claims</h2><table><thead><tr><th>claim</th><th>rule</th><th>the model</th>"
            f"<th>its figures</th><th>the control</th><th>its figures</th></tr></thead><tbody>{rows}</tbody></table>"
            f"<h2>Figures</h2>{figs}<h2>Snapshots</h2><table><thead><tr><th>step</th><th>held-out loss</th><th>ICL score</th>"
            "<th>induction headroom</th><th>best prefix matching</th><th>K-composition</th><th>‖K term‖</th><th>verified</th></tr></thead>"
            f"<tbody>{snaps}</tbody></table>")
    return page(f"Dynamics of {run.checkpoint}", body)


def _finite(value):
    """``value`` with every NaN or infinity as None (strict JSON: a score a head lacks is null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def output_names(formats: Sequence[str] = ("png", "svg")) -> list[str]:
    return ["index.html", "dynamics.md", "dynamics.json"] + [f"figures/{n}.{f}" for n in FIGURES for f in formats]


def write(out: Path, run, claims, control=None, window=None, index_from: int = 0) -> list[Path]:
    """Write the page, its Markdown, its JSON and its figures into ``out`` (a prepared folder); the page, its
    Markdown and figures number layers from ``index_from``, the JSON from 0 (as every JSON output)."""
    made = figures(run, control, window, index_from)
    (out / "figures").mkdir(exist_ok=True)
    for name, fig in made.items():
        save_figure(fig, out / "figures", name)
    data = {"run": run.to_dict(), "control": None if control is None else control.to_dict(),
            "window": None if window is None else [run.steps[window[0]], run.steps[window[1]]],
            "claims": [c.to_dict() for c in claims]}
    (out / "dynamics.json").write_text(json.dumps(_finite(data), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    (out / "dynamics.md").write_text(renumber(markdown(run, claims, control, window), index_from), encoding="utf-8")
    (out / "index.html").write_text(renumber(html(run, claims, control, list(made)), index_from), encoding="utf-8")
    return [out / "index.html"]
