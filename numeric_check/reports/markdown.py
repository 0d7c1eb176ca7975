"""The report as Markdown (``report.md``): findings, heads, composition, context, importance, skip-trigrams.

Every table goes through the one table writer (:func:`tensoralg.display.md_table`) and every
piece of user text (model names, notes, claims) through the one escaper. The writer reads an
analysis and the findings already computed for it (:class:`numeric_check.reports.report.Report`
computes them once for every format).
"""

from __future__ import annotations

from typing import Sequence

from tensoralg.display import md_table
from tensoralg.escape import escape_text

from numeric_check.circuits.behaviour import profile_rows
from numeric_check.reports.analysis import HEAD_HEADER, ModelAnalysis, composition_rows, head_rows, skip_trigram_title
from numeric_check.reports.findings import Finding


def _md(text) -> str:
    return escape_text(text, "markdown")


def findings_markdown(rows: Sequence[Finding]) -> str:
    """The findings as a Markdown table: claim, measured figures, holds (yes/no)."""
    return md_table(["claim", "measured", "holds"],
                    [[_md(f.claim), _md(f.measured), "yes" if f.holds else "**no**"] for f in rows], right=(2,))


def _training(a: ModelAnalysis) -> list[str]:
    if not a.training:
        return ["No training record was found beside the checkpoint.", ""]
    cfg, final = a.training.get("train_config", {}), a.training.get("final", {})
    keys = ("steps", "batch_size", "lr", "weight_decay", "init_std", "seed", "seg_min", "seg_max")
    lines = ["Trained by `tcircuits train-toy`: " + ", ".join(f"{k}={_md(cfg[k])}" for k in keys if k in cfg) + "."]
    if stopped := a.training.get("stopped"):
        lines.append(f"Stopped early, after step {stopped['step']:,} of {stopped['of']:,}: the model is the one of that "
                     "step, its learning rate where the schedule had it then.")
    if final:
        lines.append(
            f"Held-out loss at the end of training: {final.get('loss', float('nan')):.3f} nats overall, "
            f"{final.get('repeat_loss', float('nan')):.3f} on repeated tokens."
        )
    return lines + [""]


def _heads_table(a: ModelAnalysis) -> str:
    return md_table(HEAD_HEADER, head_rows(a), right=range(1, len(HEAD_HEADER)))


def _context(a: ModelAnalysis, figures: dict[str, str]) -> list[str]:
    """Behaviour by query position of the heads found, and the loss grid on repeats."""
    profile, found = a.heads.behaviour.profile, a.heads.by_behaviour
    lines = ["## Behaviour across the context", ""]
    if profile is not None:
        heads = sorted(set(found.previous_token) | set(found.induction))
        lines += [f"Attention at every query position, on {profile.seg_len}-token segments repeated with the first "
                  "copy swept over the context:", ""] + [f"- {row}" for row in profile_rows(profile, heads)] + [""]
    if "profiles" in figures:
        lines += [f"![attention by position]({figures['profiles']})", ""]
    if a.grid is not None:
        lines += [f"Loss (nats) on the second copy of a repeated random segment, its first token excluded, by segment "
                  f"length and offset of the first copy (uniform {a.grid.uniform:.2f}):", "", a.grid.to_markdown(), ""]
    return lines


def _model_lines(a: ModelAnalysis) -> list[str]:
    losses = a.losses
    return [
        f"Model: {a.model.arch.describe()}; d_model={a.model.cfg.d_model}, d_head={a.model.cfg.d_head}, "
        f"d_vocab={a.model.cfg.d_vocab}, n_ctx={a.model.cfg.n_ctx}.",
        f"Evaluated on repeated-segment data (segments of {a.data_config.seg_min}-{a.data_config.seg_max} tokens at "
        f"varying offsets): loss {losses['loss']:.3f} nats overall, {losses['repeat_loss']:.3f} on repeated tokens, "
        f"{losses['other_loss']:.3f} elsewhere; uniform {losses['uniform_loss']:.3f}.",
        *([escape_text(a.model.source_check.describe() + ".", "markdown")] if a.model.source_check else []),
        "",
    ]


def _sections(a: ModelAnalysis, figures: dict[str, str]) -> list[str]:
    lines = ["## Heads", "", "Copying = OV circuit eigenvalue positivity; QK = token QK circuit positivity; "
             "behaviour scores on repeated random sequences.", "", _heads_table(a), ""]
    if "positivity" in figures:
        lines += [f"![positivity]({figures['positivity']})", "",
                  "x: OV circuit eigenvalue positivity (copying). y: layer 0, the token QK circuit's positivity; "
                  "later layers, the positivity of the K-composition circuit W_Eᵀ W_QK W_OV^partner W_E with the "
                  "head's K-composition partner (same-matching).", ""]
    if a.composition:
        base = ", ".join(f"{k} {v:.3f}" for k, v in a.baseline.items())
        lines += ["## Composition scores", "", f"Random baselines (same shapes): {base}.", "",
                  md_table(["writer→reader", "Q", "K", "V"], composition_rows(a), right=(1, 2, 3)), ""]
        if "composition" in figures:
            lines += [f"![composition]({figures['composition']})", ""]
    if a.heads is not None:
        lines += ["## Previous-token and induction heads", "", a.heads.to_markdown(), ""]
        lines += _context(a, figures)
    if a.importance is not None:
        lines += ["## Term importance by order", "", "Patterns frozen; loss on all tokens:", "", a.importance.to_markdown(), ""]
        if a.importance_repeat is not None:
            lines += ["Loss on repeated tokens only:", "", a.importance_repeat.to_markdown(), ""]
        if "importance" in figures:
            lines += [f"![term importance]({figures['importance']})", ""]
    if a.skip_trigrams:
        lines += [f"## {_md(skip_trigram_title(a))}", ""]
        lines += [table.to_markdown() for table in a.skip_trigrams]
    return lines


def markdown_report(a: ModelAnalysis, rows: Sequence[Finding], control: ModelAnalysis | None = None,
                    figures: dict[str, str] | None = None) -> str:
    """The report as Markdown; ``rows`` are the findings of ``a`` (and ``control``), ``figures``
    maps figure names to paths relative to the report."""
    figures = figures or {}
    lines = [f"# Circuit analysis: {_md(a.name)}", "", *_model_lines(a), *_training(a)]
    lines += [f"Note: {_md(note)}" for note in a.notes] + ([""] if a.notes else [])
    if "training" in figures:
        lines += [f"![training curve]({figures['training']})", ""]
    if rows:
        lines += ["## Findings", "", findings_markdown(rows), ""]
    lines += _sections(a, figures)
    if control is not None:
        lines += [f"## Control: {_md(control.name)}", "", f"Model: {control.model.arch.describe()}; loss on repeated tokens "
                  f"{control.losses['repeat_loss']:.3f} nats (uniform {control.losses['uniform_loss']:.3f}).", "",
                  _heads_table(control), ""]
        if control.grid is not None:
            lines += ["Loss on the second copy of a repeat, by length and offset:", "", control.grid.to_markdown(), ""]
    return "\n".join(lines)
