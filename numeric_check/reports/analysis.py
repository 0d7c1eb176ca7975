"""The analysis report of a model: the paper's findings measured, as Markdown, LaTeX and figures.

:func:`analyze_model` gathers every analysis of one model (losses on repeated-segment
data, copying and QK positivity, composition scores with their random baselines,
previous-token and induction heads by weights and by behaviour, term importance by
order, skip-trigram tables); :func:`findings` turns one analysis (and optionally a
1-layer control) into the paper's claims with measured figures and a verdict;
:func:`write_report` writes ``report.md``, ``tables.tex``, ``analysis.json`` and the
figures. ``tcircuits analyze`` drives it.

>>> from derivations.architecture import Architecture
>>> from numeric_check.model.circuit_model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=12, n_ctx=16)
>>> analysis = analyze_model(model, name="random", n_sequences=4)
>>> [f.claim for f in findings(analysis)][0]
'layer 0 has a previous-token head (by behaviour)'
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from derivations.architecture import head_label
from tensoralg.escape import escape_text
from numeric_check.circuits.behaviour import ACROSS_CONTEXT, LossGrid, profile_rows, repeat_loss_grid
from numeric_check.circuits.ov_qk import copying_scores, eigenvalue_positivity, qk_circuit
from numeric_check.errors import AnalysisError, NumericCheckError
from numeric_check.circuits.composition import COMPOSITION_KINDS, composition_baseline, composition_scores
from numeric_check.circuits.detect import HeadReport, detect_heads
from numeric_check.circuits.importance import ImportanceReport, path_label, term_importance
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.files import writable_dir, writable_file, write_atomic
from numeric_check.circuits.skip_trigrams import SkipTrigramTable, check_vocab, skip_trigram_table
from numeric_check.training.toy import TrainConfig, next_token_losses, repeated_segment_batch
from numeric_check.verification.results import strict_json
from numeric_check.reports.findings import Finding, composition_with, findings

Head = tuple[int, int]

# Longest evaluation sequences for a model without a training record.
DATA_N_CTX = 128


# --- gathering --------------------------------------------------------------------------------


@dataclass
class ModelAnalysis:
    """Every analysis of one model. Per-head tensors are ``[n_layers, n_heads]``; pair tensors ``[L, H, L, H]``."""

    name: str
    model: CircuitModel
    data_config: TrainConfig
    training: dict | None
    losses: dict[str, float]
    copying: Tensor
    qk_positivity: Tensor
    composition: dict[str, Tensor] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)
    heads: HeadReport | None = None
    importance: ImportanceReport | None = None
    importance_repeat: ImportanceReport | None = None
    top_head: Head | None = None
    skip_trigram_head: Head | None = None
    grid: LossGrid | None = None
    skip_trigrams: list[SkipTrigramTable] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def _repr_markdown_(self) -> str:
        """What a notebook shows: the report's Markdown (findings, heads, composition scores), no figures."""
        return render_markdown(self)

    @property
    def n_layers(self) -> int:
        return self.model.arch.n_layers

    @property
    def scatter_y(self) -> Tensor:
        """QK positivity for the scatter: same-matching with the K-composition partner in layers >= 1,
        the token QK circuit's positivity in layer 0."""
        y = self.qk_positivity.clone()
        if self.heads is not None and self.n_layers > 1:
            same = self.heads.weights.same_matching
            y[1:] = same[1:].to(y.dtype)
        return y


def data_config_for(model: CircuitModel, training: dict | None = None) -> TrainConfig:
    """The repeated-segment data to evaluate ``model`` on: its training data when recorded,
    else the default recipe fitted to the model's ``d_vocab`` and ``n_ctx`` (at most
    ``DATA_N_CTX`` positions, so that large models stay quick to analyse)."""
    if training and "train_config" in training:
        return TrainConfig.from_dict(training["train_config"])
    if model.cfg.n_ctx < 4:
        raise AnalysisError(
            f"repeated-segment data need n_ctx >= 4 (two copies of 2 tokens); the model has n_ctx={model.cfg.n_ctx}"
        )
    n_ctx = min(model.cfg.n_ctx, DATA_N_CTX)
    seg_max = min(32, n_ctx // 2)
    seg_min = min(8, max(2, seg_max // 2))
    return TrainConfig(n_layers=model.arch.n_layers, d_vocab=model.cfg.d_vocab, n_ctx=n_ctx, seg_min=seg_min, seg_max=seg_max)


def analyze_model(
    model: CircuitModel,
    *,
    name: str = "model",
    training: dict | None = None,
    n_sequences: int = 64,
    seed: int = 0,
    vocab: Sequence[str] | None = None,
    sources: Sequence[int] = (0, 1, 2),
) -> ModelAnalysis:
    """Run every analysis of ``model`` (see the module docstring) on seeded data.

    ``training`` is the JSON record written beside a checkpoint by ``train-toy`` (its data
    configuration is reused); ``sources`` are the source tokens of the skip-trigram tables
    of the most important head (the one whose individual-head term lowers the loss on
    repeated tokens most); ``vocab`` labels tokens.
    """
    if isinstance(n_sequences, bool) or not isinstance(n_sequences, int) or n_sequences < 1:
        raise AnalysisError(f"n_sequences must be an int >= 1, got {n_sequences!r}")
    vocab = check_vocab(model, vocab)
    config = data_config_for(model, training)
    if config.d_vocab != model.cfg.d_vocab or config.n_ctx > model.cfg.n_ctx:
        raise AnalysisError(
            f"the training record's data (d_vocab={config.d_vocab}, n_ctx={config.n_ctx}) do not match the model "
            f"(d_vocab={model.cfg.d_vocab}, n_ctx={model.cfg.n_ctx})"
        )
    batch = repeated_segment_batch(config, n_sequences, torch.Generator().manual_seed(seed))
    batch = type(batch)(*(t.to(model.device) for t in batch))
    with torch.no_grad():
        losses = {k: float(v) for k, v in next_token_losses(model(batch.tokens), batch).items()}
        check_finite_losses(model, losses)
        losses["uniform_loss"] = math.log(model.cfg.d_vocab)
        copying = copying_scores(model, dtype=torch.float64).cpu()
        qk = torch.full_like(copying, float("nan"))
        for layer, head in model.arch.heads():
            qk[layer, head] = eigenvalue_positivity(qk_circuit(model, layer, head, dtype=torch.float64)).cpu()
    analysis = ModelAnalysis(name, model, config, training, losses, copying, qk)
    if model.arch.n_layers == 0:
        analysis.importance = term_importance(model, batch.tokens)  # one path: never too many
        return analysis
    if model.arch.n_layers > 1:
        with torch.no_grad():
            for kind in COMPOSITION_KINDS:
                analysis.composition[kind] = composition_scores(model, kind, dtype=torch.float64).cpu()
                analysis.baseline[kind] = composition_baseline(model, kind, seed=seed)
    analysis.heads = detect_heads(model, seed=seed)
    analysis.grid = repeat_loss_grid(model, seed=seed)
    try:
        analysis.importance = term_importance(model, batch.tokens)
        analysis.importance_repeat = term_importance(model, batch.tokens, target_mask=batch.repeat_mask)
    except NumericCheckError as error:  # too many path logits to hold: report the rest
        analysis.notes.append(f"term importance skipped: {error}")
        analysis.importance = analysis.importance_repeat = None
    if analysis.importance_repeat is not None:
        # the head whose individual term matters most for the loss on repeated tokens
        ranked = sorted(analysis.importance_repeat.head_marginal.items(), key=lambda item: item[1])  # most negative
    else:  # the strongest copier
        ranked = sorted(((h, float(copying[h])) for h in model.arch.heads()), key=lambda item: -item[1])
    analysis.top_head = ranked[0][0]
    analysis.skip_trigram_head = _skip_trigram_head(analysis, [h for h, _ in ranked])
    if analysis.skip_trigram_head is None:
        analysis.notes.append("no skip-trigram tables: every head is a previous-token or induction head, which attends "
                              "by position or by K-composition, not by its token QK circuit")
    else:
        analysis.skip_trigrams = [
            skip_trigram_table(model, *analysis.skip_trigram_head, source, k=5, vocab=vocab)
            for source in sources
            if 0 <= source < model.cfg.d_vocab
        ]
    return analysis


def _skip_trigram_head(a: ModelAnalysis, ranked: Sequence[Head]) -> Head | None:
    """The first head of ``ranked`` whose token QK circuit is how it attends: not a previous-token
    head (it attends by position) nor an induction head (by K-composition), by behaviour or weights."""
    if a.heads is None:
        return ranked[0] if ranked else None
    views = (a.heads.by_behaviour, a.heads.by_weights)
    positional = {h for v in views for h in (*v.previous_token, *v.induction)}
    return next((h for h in ranked if h not in positional), None)


def skip_trigram_title(a: ModelAnalysis) -> str:
    """The heading of the skip-trigram tables (plain text)."""
    return f"Skip-trigrams of {head_label(*a.skip_trigram_head)}, the most important head that attends by token"


def check_finite_losses(model: CircuitModel, losses: dict[str, float]) -> None:
    """Refuse to analyse a model whose forward pass overflows: finite float32 weights near
    1e37 give infinite logits and NaN losses, and every number after would be meaningless."""
    bad = {k: v for k, v in losses.items() if not math.isfinite(v)}
    if bad:
        largest = max(float(p.detach().abs().max()) for p in model.parameters())
        raise AnalysisError(
            f"the model's forward pass overflows in {str(model.dtype).removeprefix('torch.')}: its losses are "
            + ", ".join(f"{k}={v}" for k, v in bad.items())
            + f" (largest weight magnitude {largest:.3g}); nothing was written. A model this large "
            "needs float64 or smaller weights"
        )


# --- rendering --------------------------------------------------------------------------------

def latex_escape(text: str) -> str:
    r"""Text safe inside a LaTeX table cell (the one text escaper, :func:`tensoralg.escape_text`).

    >>> latex_escape("a_b & 50% {x} → $ ≠ σ")
    'a\\_b \\& 50\\% \\{x\\} $\\to$ \\$ $\\neq$ $\\sigma$'
    """
    return escape_text(text, "latex")


def _latex_table(caption: str, label: str, header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """A ``table`` with a ruled ``tabular`` (plain LaTeX, no packages); cells must already be escaped."""
    lines = [r"\begin{table}[ht]", r"\centering", rf"\caption{{{latex_escape(caption)}}}", rf"\label{{tab:{label}}}",
             rf"\begin{{tabular}}{{{align}}}", r"\hline", " & ".join(header) + r" \\", r"\hline"]
    lines += [" & ".join(row) + r" \\" for row in rows]
    lines += [r"\hline", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def _num(value, digits: int = 3) -> str:
    value = float(value)
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _token_tex(token: int, text: str | None) -> str:
    return rf"\#{token}" if text is None else rf"\texttt{{{latex_escape(text)}}} ({token})"


def head_rows(a: ModelAnalysis) -> list[list[str]]:
    """Per head: label, copying, QK positivity, previous-token and induction scores by behaviour."""
    rows = []
    for layer, head in a.model.arch.heads():
        b = a.heads.behaviour if a.heads else None
        rows.append([
            head_label(layer, head), _num(a.copying[layer, head]), _num(a.qk_positivity[layer, head]),
            _num(b.previous_token[layer, head]) if b else "-", _num(b.induction[layer, head]) if b else "-",
        ])
    return rows


def composition_rows(a: ModelAnalysis, limit: int = 20) -> list[list[str]]:
    """Pairs ``writer → reader`` with Q, K, V scores, ranked by K-composition (at most ``limit``)."""
    if not a.composition:
        return []
    pairs = [((l1, h1), (l2, h2)) for l2, h2 in a.model.arch.heads() for l1, h1 in a.model.arch.heads() if l1 < l2]
    pairs.sort(key=lambda p: -composition_with(a, "K", *p))
    return [[path_label(p)] + [_num(composition_with(a, kind, *p)) for kind in COMPOSITION_KINDS] for p in pairs[:limit]]


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: int = 1) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * right + "---:|" * (len(header) - right)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _training_md(a: ModelAnalysis) -> list[str]:
    if not a.training:
        return ["No training record was found beside the checkpoint.", ""]
    cfg, final = a.training.get("train_config", {}), a.training.get("final", {})
    keys = ("steps", "batch_size", "lr", "weight_decay", "init_std", "seed", "seg_min", "seg_max")
    lines = ["Trained by `tcircuits train-toy`: " + ", ".join(f"{k}={cfg[k]}" for k in keys if k in cfg) + "."]
    if final:
        lines.append(
            f"Held-out loss at the end of training: {final.get('loss', float('nan')):.3f} nats overall, "
            f"{final.get('repeat_loss', float('nan')):.3f} on repeated tokens."
        )
    return lines + [""]


def findings_markdown(rows: Sequence[Finding]) -> str:
    """The findings as a Markdown table: claim, measured figures, holds (yes/no)."""
    return _md_table(["claim", "measured", "holds"], [[escape_text(f.claim, "markdown"), escape_text(f.measured, "markdown"),
                                                       "yes" if f.holds else "**no**"] for f in rows], right=2)


def render_markdown(a: ModelAnalysis, control: ModelAnalysis | None = None, figures: dict[str, str] | None = None) -> str:
    """The report as Markdown; ``figures`` maps figure names to paths relative to the report."""
    figures = figures or {}
    losses = a.losses
    lines = [
        f"# Circuit analysis: {escape_text(a.name, 'markdown')}",
        "",
        f"Model: {a.model.arch.describe()}; d_model={a.model.cfg.d_model}, d_head={a.model.cfg.d_head}, "
        f"d_vocab={a.model.cfg.d_vocab}, n_ctx={a.model.cfg.n_ctx}.",
        f"Evaluated on repeated-segment data (segments of {a.data_config.seg_min}-{a.data_config.seg_max} tokens at "
        f"varying offsets): loss {losses['loss']:.3f} nats overall, {losses['repeat_loss']:.3f} on repeated tokens, "
        f"{losses['other_loss']:.3f} elsewhere; uniform {losses['uniform_loss']:.3f}.",
        "",
    ]
    lines += _training_md(a)
    lines += [f"Note: {escape_text(note, 'markdown')}" for note in a.notes] + ([""] if a.notes else [])
    if "training" in figures:
        lines += [f"![training curve]({figures['training']})", ""]
    rows = findings(a, control)
    if rows:
        lines += ["## Findings", "", findings_markdown(rows), ""]
    lines += ["## Heads", "", "Copying = OV circuit eigenvalue positivity; QK = token QK circuit positivity; "
              "behaviour scores on repeated random sequences.", "",
              _md_table(["head", "copying", "QK positivity", "prev-token (behaviour)", "induction (behaviour)"], head_rows(a)), ""]
    if "positivity" in figures:
        lines += [f"![positivity]({figures['positivity']})", "",
                  "x: OV circuit eigenvalue positivity (copying). y: layer 0, the token QK circuit's positivity; "
                  "later layers, the positivity of the K-composition circuit W_Eᵀ W_QK W_OV^partner W_E with the "
                  "head's K-composition partner (same-matching).", ""]
    if a.composition:
        base = ", ".join(f"{k} {v:.3f}" for k, v in a.baseline.items())
        lines += ["## Composition scores", "", f"Random baselines (same shapes): {base}.", "",
                  _md_table(["writer→reader", "Q", "K", "V"], composition_rows(a)), ""]
        if "composition" in figures:
            lines += [f"![composition]({figures['composition']})", ""]
    if a.heads is not None:
        lines += ["## Previous-token and induction heads", "", a.heads.to_markdown(), ""]
        lines += _context_md(a, figures)
    if a.importance is not None:
        lines += ["## Term importance by order", "", "Patterns frozen; loss on all tokens:", "", a.importance.to_markdown(), ""]
        if a.importance_repeat is not None:
            lines += ["Loss on repeated tokens only:", "", a.importance_repeat.to_markdown(), ""]
        if "importance" in figures:
            lines += [f"![term importance]({figures['importance']})", ""]
    if a.skip_trigrams:
        lines += [f"## {skip_trigram_title(a)}", ""]
        lines += [table.to_markdown() for table in a.skip_trigrams]
    if control is not None:
        lines += [f"## Control: {escape_text(control.name, 'markdown')}", "", f"Model: {control.model.arch.describe()}; loss on repeated tokens "
                  f"{control.losses['repeat_loss']:.3f} nats (uniform {control.losses['uniform_loss']:.3f}).", "",
                  _md_table(["head", "copying", "QK positivity", "prev-token (behaviour)", "induction (behaviour)"], head_rows(control)), ""]
        if control.grid is not None:
            lines += ["Loss on the second copy of a repeat, by length and offset:", "", control.grid.to_markdown(), ""]
    return "\n".join(lines)


def _context_md(a: ModelAnalysis, figures: dict[str, str]) -> list[str]:
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


def render_latex(a: ModelAnalysis, control: ModelAnalysis | None = None) -> str:
    """LaTeX tables (plain LaTeX, no packages): findings, heads, composition, term importance, skip-trigrams."""
    parts = [f"% Tables of the circuit analysis of {escape_text(a.name, 'latex-comment')} (\\input this file; no packages needed).", ""]
    rows = findings(a, control)
    if rows:
        parts.append(_latex_table(f"Findings for {a.name}", "findings",
                                  ["claim", "measured", "holds"],
                                  [[latex_escape(f.claim), latex_escape(f.measured), "yes" if f.holds else "no"] for f in rows],
                                  "p{0.3\\linewidth}p{0.55\\linewidth}c"))
    header = ["head", "copying", "QK positivity", "prev-token", "induction"]
    parts.append(_latex_table(f"Heads of {a.name}: eigenvalue positivity and behaviour", "heads", header,
                              [[latex_escape(c) for c in row] for row in head_rows(a)], "lrrrr"))
    if a.composition:
        parts.append(_latex_table(
            f"Composition scores of {a.name} (baselines " + ", ".join(f"{k} {v:.3f}" for k, v in a.baseline.items()) + ")",
            "composition", ["writer $\\to$ reader", "Q", "K", "V"],
            [[latex_escape(c) for c in row] for row in composition_rows(a)], "lrrr"))
    for report, tag, what in ((a.importance, "importance", "all tokens"), (a.importance_repeat, "importance-repeat", "repeated tokens")):
        if report is not None:
            rows_ = [[latex_escape(n), _num(loss), f"{gain:+.3f}"] for n, loss, gain in report.order_rows()]
            rows_ += [[latex_escape(head_label(*h)), "", f"{v:+.3f}"] for h, v in sorted(report.head_marginal.items())]
            parts.append(_latex_table(f"Term importance of {a.name}, loss on {what} (nats)", tag,
                                      ["terms", "loss up to order", "marginal"], rows_, "lrr"))
    for i, table in enumerate(a.skip_trigrams):
        rows_ = [[str(r), _token_tex(d.token, d.text), _num(d.score), _token_tex(o.token, o.text), _num(o.score)]
                 for r, (d, o) in enumerate(zip(table.destinations, table.outputs), start=1)]
        parts.append(_latex_table(
            f"Skip-trigrams of {head_label(table.layer, table.head)}, source token "
            + (f"#{table.source_token}" if table.source_text is None else f"{table.source_text!r} ({table.source_token})"),
            f"skip-trigrams-{i}", ["rank", "destination (QK)", "score", "out (OV)", "logit"], rows_, "rlrlr"))
    if control is not None:
        parts.append(_latex_table(f"Heads of the control {control.name}", "control-heads", header,
                                  [[latex_escape(c) for c in row] for row in head_rows(control)], "lrrrr"))
    return "\n".join(parts)


def analysis_to_dict(a: ModelAnalysis, control: ModelAnalysis | None = None) -> dict:
    """The measured numbers as plain JSON data."""

    def tensor(t: Tensor) -> list:
        return [[None if math.isnan(v) else v for v in row] for row in t.tolist()]

    data = {
        "name": a.name,
        "architecture": a.model.arch.describe(),
        "losses": a.losses,
        "copying": tensor(a.copying),
        "qk_positivity": tensor(a.qk_positivity),
        "composition": {k: {path_label((tuple(p[0]), tuple(p[1]))): v for p, v in _pairs(a, k)} for k in a.composition},
        "composition_baseline": a.baseline,
        "importance": a.importance.to_dict() if a.importance else None,
        "importance_repeated": a.importance_repeat.to_dict() if a.importance_repeat else None,
        "findings": [vars(f) for f in findings(a, control)],
        "repeat_loss_grid": a.grid.to_dict() if a.grid else None,
        "notes": a.notes,
    }
    if a.heads is not None:
        data["heads"] = {"by_behaviour": a.heads.by_behaviour.labels(), "by_weights": a.heads.by_weights.labels(),
                         "agreement": a.heads.agreement,
                         "minimum_over_positions": {kind: tensor(a.heads.behaviour.minimum(kind))
                                                    for kind in ("previous_token", "induction")}}
    return data


def _pairs(a: ModelAnalysis, kind: str):
    for l2, h2 in a.model.arch.heads():
        for l1, h1 in a.model.arch.heads():
            if l1 < l2:
                yield ((l1, h1), (l2, h2)), composition_with(a, kind, (l1, h1), (l2, h2))


# --- writing ----------------------------------------------------------------------------------


def make_figures(a: ModelAnalysis) -> dict[str, object]:
    """The report's figures by name (Matplotlib figures, not yet written)."""
    from numeric_check.reports import plots  # imported when figures are drawn: matplotlib is slow to import

    figures = {}
    if a.training and a.training.get("curve"):
        figures["training"] = plots.training_curve(a.training["curve"], uniform_loss=a.losses["uniform_loss"],
                                                   title=f"Training of {a.name}")
    if a.n_layers:
        ylabel = ("QK positivity (layer 0: token QK;\nlater: K-composition with partner)" if a.n_layers > 1
                  else "QK circuit eigenvalue positivity")
        induction = a.heads.by_behaviour.induction + a.heads.by_behaviour.previous_token if a.heads else ()
        figures["positivity"] = plots.positivity_scatter(a.copying, a.scatter_y, ylabel=ylabel,
                                                         title=f"{a.name}: copying vs matching", highlight=induction)
    if a.heads is not None and a.heads.behaviour.profile is not None:
        profile, found = a.heads.behaviour.profile, a.heads.by_behaviour
        figures["profiles"] = plots.position_profiles_figure(
            profile.previous_token, profile.induction, previous_heads=found.previous_token,
            induction_heads=found.induction, threshold=ACROSS_CONTEXT, title=f"{a.name}: attention by query position")
    if a.composition:
        baseline = {k: torch.full_like(v, a.baseline[k]) for k, v in a.composition.items()}
        figures["composition"] = plots.composition_heatmaps(a.composition, baseline=baseline,
                                                            title=f"{a.name}: composition scores minus random baseline")
    if a.importance is not None and a.n_layers:
        figures["importance"] = plots.importance_bars(a.importance)
    return figures


REPORT_FILES = ("report.md", "tables.tex", "analysis.json", "index.html")  # and figures/


def report_folder(out_dir: Path | str) -> Path:
    """``out_dir``, checked before any analysis: a folder that can be written, in which every
    file of the report (and ``figures/``) can be replaced — a directory named ``report.md``
    is found now, not after minutes of work."""
    out_dir = writable_dir(out_dir)
    for name in REPORT_FILES:
        writable_file(out_dir / name)
    writable_dir(out_dir / "figures")
    return out_dir


def write_report(
    a: ModelAnalysis, out_dir: Path | str, *, control: ModelAnalysis | None = None, formats: Sequence[str] = ("png", "svg")
) -> list[Path]:
    """Write ``report.md``, ``tables.tex``, ``analysis.json`` and ``figures/`` into ``out_dir``; return the paths."""
    from numeric_check.reports.plots import save_figure

    out_dir = Path(out_dir)
    writable_dir(out_dir / "figures")
    written, links = [], {}
    for name, figure in make_figures(a).items():
        paths = save_figure(figure, out_dir / "figures", name, formats)
        written += paths
        links[name] = paths[0].relative_to(out_dir).as_posix()
    for filename, text in (
        ("report.md", render_markdown(a, control, links)),
        ("tables.tex", render_latex(a, control)),
        ("analysis.json", json.dumps(strict_json(analysis_to_dict(a, control)), indent=2, allow_nan=False) + "\n"),
    ):
        written.append(write_atomic(out_dir / filename, text))
    return written
