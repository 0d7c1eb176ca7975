"""A model's analysis: every measurement the paper's findings need, gathered once.

:func:`analyze_model` gathers every analysis of one model (losses on repeated-segment
data, copying and QK positivity, composition scores with their random baselines,
previous-token and induction heads by weights and by behaviour, term importance by
order, skip-trigram tables) into a :class:`ModelAnalysis`. The paper's findings read it
(:mod:`numeric_check.reports.findings`); :class:`numeric_check.reports.report.Report`
holds it with its findings and writes it (Markdown, LaTeX, JSON, HTML, figures).

>>> from derivations.architecture import Architecture
>>> from numeric_check.model.circuit_model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=12, n_ctx=16)
>>> analysis = analyze_model(model, name="random", n_sequences=4)
>>> analysis.composition["K"].shape
torch.Size([2, 2, 2, 2])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from derivations.architecture import head_label
from tensoralg.display import md_table, md_text
from numeric_check.circuits.behaviour import LossGrid, repeat_loss_grid
from numeric_check.circuits.ov_qk import copying_scores, eigenvalue_positivity, qk_circuit
from numeric_check.errors import AnalysisError, NumericCheckError
from numeric_check.circuits.composition import COMPOSITION_KINDS, composition_baseline, composition_scores
from numeric_check.circuits.detect import HeadReport, detect_heads
from numeric_check.circuits.importance import ImportanceReport, path_label, term_importance
from numeric_check.model.circuit_model import CircuitModel, first_overflow
from numeric_check.circuits.skip_trigrams import SkipTrigramTable, check_vocab, skip_trigram_table
from numeric_check.training.toy import TrainConfig, next_token_losses, repeated_segment_batch

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
        """What a notebook shows: the model's losses and each head's numbers (``Report.of(analysis)``
        shows the findings and every table too)."""
        losses = ", ".join(f"{k} {v:.3f}" for k, v in self.losses.items())
        return (f"Analysis of {md_text(self.name)} ({self.model.arch.describe()}): {losses} nats.\n\n"
                + md_table(HEAD_HEADER, head_rows(self), right=range(1, 5)))

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
    ``DATA_N_CTX`` positions, so that large models stay quick to analyse) with uniformly random tokens."""
    if training and "train_config" in training:
        return TrainConfig.from_dict(training["train_config"])
    if model.cfg.n_ctx < 4:
        raise AnalysisError(
            f"repeated-segment data need n_ctx >= 4 (two copies of 2 tokens); the model has n_ctx={model.cfg.n_ctx}"
        )
    n_ctx = min(model.cfg.n_ctx, DATA_N_CTX)
    seg_max = min(32, n_ctx // 2)
    seg_min = min(8, max(2, seg_max // 2))
    # uniformly random tokens between the repeats: a model of unknown data has no bigram table or skip-trigrams of ours
    return TrainConfig(n_layers=model.arch.n_layers, d_vocab=model.cfg.d_vocab, n_ctx=n_ctx, seg_min=seg_min, seg_max=seg_max,
                       bigram_successors=0, skip_trigrams=0)


def analyze_model(
    model: CircuitModel,
    *,
    name: str = "model",
    training: dict | None = None,
    n_sequences: int = 64,
    seed: int = 0,
    vocab: Sequence[str] | None = None,
    sources: Sequence[int] = (0, 1, 2),
    progress: Callable[[str], None] = lambda step: None,
) -> ModelAnalysis:
    """Run every analysis of ``model`` (see the module docstring) on seeded data; ``progress(step)`` is
    called as each stage starts (the command line shows it on a terminal).

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
    progress("losses, copying and QK circuits")
    with torch.no_grad():
        logits, scales = model.run_with_cache(batch.tokens, names_filter=lambda name: name.endswith("hook_scale"))
        losses = {k: float(v) for k, v in next_token_losses(logits, batch).items()}
        check_finite_losses(model, losses, first_overflow(scales))
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
        progress("composition scores")
        with torch.no_grad():
            for kind in COMPOSITION_KINDS:
                analysis.composition[kind] = composition_scores(model, kind, dtype=torch.float64).cpu()
                analysis.baseline[kind] = composition_baseline(model, kind, seed=seed)
    progress("previous-token and induction heads")
    analysis.heads = detect_heads(model, seed=seed)
    progress("the loss on repeats across the context")
    analysis.grid = repeat_loss_grid(model, seed=seed)
    progress("term importance")
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


def check_finite_losses(model: CircuitModel, losses: dict[str, float], overflowed: str | None = None) -> None:
    """Refuse to analyse a model whose forward pass overflows: finite float32 weights near
    1e37 give infinite logits and NaN losses, and every number after would be meaningless;
    near 1e10 a layer norm's scale (``overflowed``, a hook's name) is Inf and the losses are finite and wrong."""
    bad = {k: v for k, v in losses.items() if not math.isfinite(v)}
    if bad or overflowed:
        largest = max(float(p.detach().abs().max()) for p in model.parameters())
        what = f"NaN or Inf in {overflowed}" if overflowed else "its losses are " + ", ".join(
            f"{k}={v}" for k, v in bad.items())
        raise AnalysisError(
            f"the model's forward pass overflows in {str(model.dtype).removeprefix('torch.')}: {what} "
            f"(largest weight magnitude {largest:.3g}); nothing was written. A model this large "
            "needs float64 or smaller weights"
        )


# --- per-head and per-pair figures, as every writer shows them -------------------------------

HEAD_HEADER = ["head", "copying", "QK positivity", "prev-token (behaviour)", "induction (behaviour)"]


def number(value, digits: int = 3, missing: str = "-") -> str:
    """A figure as shown in the tables; ``missing`` for NaN (a head a layer lacks)."""
    value = float(value)
    return missing if math.isnan(value) else f"{value:.{digits}f}"


def head_rows(a: ModelAnalysis, missing: str = "-") -> list[list[str]]:
    """Per head: label, copying, QK positivity, previous-token and induction scores by behaviour."""
    rows = []
    b = a.heads.behaviour if a.heads else None
    for layer, head in a.model.arch.heads():
        rows.append([
            head_label(layer, head), number(a.copying[layer, head], missing=missing),
            number(a.qk_positivity[layer, head], missing=missing),
            number(b.previous_token[layer, head], missing=missing) if b else missing,
            number(b.induction[layer, head], missing=missing) if b else missing,
        ])
    return rows


def composition_with(a: ModelAnalysis, kind: str, writer: Head, reader: Head) -> float:
    """The ``kind`` (Q, K or V) composition score of ``writer`` into ``reader``."""
    return float(a.composition[kind][writer[0], writer[1], reader[0], reader[1]])


def composition_pairs(a: ModelAnalysis) -> list[tuple[Head, Head]]:
    """Every ``(writer, reader)`` pair of heads in different layers, the writer earlier."""
    heads = list(a.model.arch.heads())
    return [(w, r) for r in heads for w in heads if w[0] < r[0]]


def composition_rows(a: ModelAnalysis, limit: int = 20) -> list[list[str]]:
    """Pairs ``writer → reader`` with Q, K, V scores, ranked by K-composition (at most ``limit``)."""
    if not a.composition:
        return []
    pairs = sorted(composition_pairs(a), key=lambda p: -composition_with(a, "K", *p))
    return [[path_label(p)] + [number(composition_with(a, kind, *p)) for kind in COMPOSITION_KINDS] for p in pairs[:limit]]
