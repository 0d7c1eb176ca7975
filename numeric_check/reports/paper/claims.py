"""The paper's findings, each stated as the paper states it, measured on the shipped models.

Each :class:`PaperFinding` holds the claim, the value measured on the shipped model, the
control's value, a verdict (``holds``, ``holds in part`` or ``does not hold``), where it holds
when only in part (a range of positions, of repeat lengths), and the name of its figure.
The numbers come from :class:`~numeric_check.reports.paper.measure.Measurements` (the
analyses of :func:`~numeric_check.reports.analysis.analyze_model`, computed once); the bars are
the analysis report's own (:mod:`numeric_check.reports.findings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from derivations.architecture import head_label
from derivations.document import as_prose, math as formula, prose
from derivations.layout import prose_text
from numeric_check.circuits.behaviour import ACROSS_CONTEXT, MIN_REPEAT, usable_positions
from numeric_check.circuits.importance import path_label
from numeric_check.errors import AnalysisError
from numeric_check.reports.analysis import ModelAnalysis
from numeric_check.reports.findings import COPYING, INDUCTION_LOSS_FRACTION, NEAR_ONE, Finding, composition_with, findings
from numeric_check.reports.paper.measure import Measurements, flat_bigram_gap, induction_head, previous_token_head

VERDICTS = ("holds", "holds in part", "does not hold")
#: "Much smaller": virtual heads' marginal loss below this fraction of the individual heads'.
MUCH_SMALLER = 0.25
#: A repeat is "learned well" below this loss (nats) on its second copy.
WELL = 1.0


@dataclass(frozen=True)
class PaperFinding:
    """One claim of the paper with what the shipped models show."""

    key: str
    claim: tuple  # prose (derivations.document.prose): text and formulae for the one printer
    measured: str
    control: str
    verdict: str
    where: str = ""
    figure: str | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise AnalysisError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        object.__setattr__(self, "claim", as_prose(self.claim))

    @property
    def claim_text(self) -> str:
        """The claim as plain text (formulae in the text printer's notation)."""
        return prose_text(self.claim)


def analysis_checks(m) -> list[Finding]:
    """The analysis report's own findings (:func:`numeric_check.reports.findings.findings`) for the
    two-layer model with the one-layer model as its control; ``m``: measurements or a paper."""
    m = getattr(m, "measurements", m)
    return findings(m.analysis(2), m.analysis(1))


def verdict_of(holds: bool, partial: bool = False) -> str:
    """The verdict word: ``holds`` (or ``holds in part``) or ``does not hold``."""
    return ("holds in part" if partial else "holds") if holds else "does not hold"


def ranges(values: list[int]) -> str:
    """``[1, 2, 3, 7, 8]`` as ``"1–3, 7–8"``.

    >>> ranges([1, 2, 3, 7, 9, 10])
    '1–3, 7, 9–10'
    """
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(v) if v == start else f"{start}–{v}")
            start = None
    return ", ".join(out) or "none"


def bigrams(m: Measurements) -> PaperFinding:
    zero, two = m.analysis(0), m.analysis(2)
    uniform = zero.losses["uniform_loss"]
    direct = two.importance.loss_by_order[0] if two.importance else math.nan
    gap = flat_bigram_gap(zero.model)
    return PaperFinding(
        "bigrams", prose("A zero-layer transformer models bigram statistics: ", formula("W_U W_E"),
                         " approximates the bigram log-likelihoods."),
        f"zero-layer model: loss {zero.losses['loss']:.3f} nats on held-out data; its table's log-probabilities lie within "
        f"{gap:.3f} of the data's bigram table; the 2-layer model's direct path alone: loss {direct:.3f}",
        f"the data's bigram table (tokens uniform at random, so every bigram has probability 1/{zero.model.cfg.d_vocab}): "
        f"loss ln {zero.model.cfg.d_vocab} = {uniform:.3f}",
        verdict_of(abs(zero.losses["loss"] - uniform) < 0.01), "", "bigrams",
        "on these data the bigram statistics are flat, so the model learns the flat table; a corpus with structure "
        "would test the claim harder")


def copying_one_layer(m: Measurements) -> PaperFinding:
    one = m.analysis(1)
    heads = list(one.model.arch.heads())
    values = [float(one.copying[h]) for h in heads]
    rnd = m.random_copying
    copiers = sum(v >= COPYING for v in values)
    return PaperFinding(
        "copying", "Most attention heads in one-layer models dedicate much of their capacity to copying: their OV "
        "circuits have positive eigenvalues (a token raises its own logit).",
        "OV eigenvalue positivity " + ", ".join(f"{head_label(*h)} {v:.2f}" for h, v in zip(heads, values))
        + f"; {copiers}/{len(heads)} heads at or above {COPYING}",
        f"{len(rnd)} random heads of the same shapes: {float(rnd.mean()):.2f} ± {float(rnd.std()):.2f}, "
        f"largest {float(rnd.max()):.2f}", verdict_of(copiers * 2 > len(heads)), "", "positivity-1l")


def skip_trigrams(m: Measurements) -> PaperFinding:
    zero, one = m.analysis(0), m.analysis(1)
    tables = "; ".join(f"#{t.source_token} … #{t.destinations[0].token} → #{t.outputs[0].token} "
                       f"(QK {t.destinations[0].score:.2f}, OV {t.outputs[0].score:.2f})" for t in m.tables)
    better = one.losses["repeat_loss"] < zero.losses["repeat_loss"] - 0.1
    return PaperFinding(
        "skip-trigrams", "One-layer attention-only transformers are an ensemble of bigram and skip-trigram models "
        "([source] … [destination] → [out]): the QK circuit chooses the source, the OV circuit the out.",
        f"{head_label(*one.top_head)}'s strongest skip-trigrams: {tables}; loss on repeated tokens "
        f"{one.losses['repeat_loss']:.2f} nats", f"zero-layer model (bigrams only): {zero.losses['repeat_loss']:.2f} nats",
        verdict_of(better), "", None)


def bugs(m: Measurements) -> PaperFinding:
    if not m.bugs:
        return PaperFinding("bugs", BUGS_CLAIM, "no one-layer head to measure", "–", "does not hold")
    ratios = [b.off_diagonal / b.diagonal if b.diagonal > 0 else math.nan for b in m.bugs]
    parts = [f"source #{b.source}: own trigrams +{b.diagonal:.2f}, swapped pairs +{b.off_diagonal:.2f} "
             f"({r:.0%})" for b, r in zip(m.bugs, ratios)]
    control = max(float(b.control.abs().mean()) for b in m.bugs)
    signed = ", ".join(f"{float(b.control.mean()):+.3f}" for b in m.bugs)
    holds = all(r >= 0.5 and b.off_diagonal > 2 * float(b.control.abs().mean()) for b, r in zip(m.bugs, ratios))
    return PaperFinding(
        "bugs", BUGS_CLAIM, f"{head_label(m.bugs[0].layer, m.bugs[0].head)}, logit rise through the model when the source "
        "is present: " + "; ".join(parts),
        f"{len(m.bugs[0].control)} outputs drawn at random per source: mean rise {signed} "
        f"(mean |rise| at most {control:.3f})", verdict_of(holds), "", "bugs")


BUGS_CLAIM = ("Factored skip-trigrams have \u201cbugs\u201d: a head that predicts [s] … [d1] → [o1] and [s] … [d2] → [o2] "
              "also predicts [s] … [d1] → [o2] and [s] … [d2] → [o1].")


def _floor_positions(a: ModelAnalysis, kind: str, heads) -> tuple[list[int], list[int], list[int]]:
    """Query positions where the best of ``heads`` reaches :data:`ACROSS_CONTEXT`, every position
    measured, and those whose keys can serve a repeat of :data:`MIN_REPEAT` tokens or more."""
    profile = a.heads.behaviour.profile
    values = getattr(profile, kind)
    best = torch.stack([values[h] for h in heads]).nan_to_num(-1.0).amax(0)
    first, last = profile.measured(kind)
    usable = [p for p in usable_positions(kind, last + 1) if p >= first]
    measured = list(range(first, last + 1))
    return [p for p in measured if float(best[p]) >= ACROSS_CONTEXT], measured, usable


def _where(kind_text: str, good: list[int], measured: list[int], usable: list[int]) -> str:
    text = f"at least {ACROSS_CONTEXT} of {kind_text} at query positions {ranges(good)} of {measured[0]}–{measured[-1]}"
    missed = [p for p in measured if p not in good]
    if missed and all(p not in usable for p in missed):
        text += (f"; at {ranges(missed)}, whose keys can serve only repeats shorter than {MIN_REPEAT} tokens, "
                 "it does not")
    return text


def previous_token(m: Measurements) -> PaperFinding:
    two, one = m.analysis(2), m.analysis(1)
    head = previous_token_head(two)
    control = float(one.heads.behaviour.previous_token.nan_to_num(0).max()) if one.heads else math.nan
    claim = "Two-layer models have previous-token heads in their first layer: they attend to the token before the current one."
    if head is None:
        return PaperFinding("previous-token", claim, "no previous-token head in layer 0", f"{control:.2f}", "does not hold")
    good, measured, usable = _floor_positions(two, "previous_token", [head])
    return PaperFinding(
        "previous-token", claim,
        f"{head_label(*head)}: attention to i-1 {float(two.heads.behaviour.previous_token[head]):.2f} by behaviour, "
        f"{float(two.heads.weights.scores.previous_token[head]):.2f} by weights",
        f"best head of the one-layer model: {control:.2f}",
        verdict_of(bool(good), partial=len(good) < len(measured)),
        _where("its attention on i-1", good, measured, usable), "profiles")


def k_composition(m: Measurements) -> PaperFinding:
    two = m.analysis(2)
    prev, pairs = previous_token_head(two), []
    if prev is not None:
        pairs = [(prev, h) for h in two.heads.by_behaviour.induction if h[0] > prev[0]]
    k = [composition_with(two, "K", w, r) for w, r in pairs]
    q = [composition_with(two, "Q", w, r) for w, r in pairs]
    v = [composition_with(two, "V", w, r) for w, r in pairs]
    base = two.baseline
    return PaperFinding(
        "k-composition", "Induction heads use K-composition with a previous-token head: their K-composition score is "
        "well above that of random matrices, unlike Q- and V-composition.",
        ", ".join(f"{path_label(p)} K {s:.3f}" for p, s in zip(pairs, k)) + (
            f"; Q at most {max(q):.3f}, V at most {max(v):.3f}" if pairs else "no pair found"),
        f"random matrices of the same shapes: K {base.get('K', math.nan):.3f}, Q {base.get('Q', math.nan):.3f}, "
        f"V {base.get('V', math.nan):.3f}", verdict_of(bool(k) and min(k) > base["K"]), "", "composition")


def induction_heads(m: Measurements) -> PaperFinding:
    two, one = m.analysis(2), m.analysis(1)
    hr = two.heads
    heads = [h for h in hr.by_behaviour.induction if h[0] >= 1]
    weights = [h for h in hr.by_weights.induction if h[0] >= 1]
    control = float(one.heads.behaviour.induction.nan_to_num(0).max()) if one.heads else math.nan
    claim = ("Two-layer models form induction heads: on a repeated sequence they attend to the token after the earlier "
             "occurrence of the current token; they are found from the weights and from behaviour alike.")
    if not heads:
        return PaperFinding("induction-heads", claim, "no induction head by behaviour", f"{control:.2f}", "does not hold")
    good, measured, usable = _floor_positions(two, "induction", heads)
    return PaperFinding(
        "induction-heads", claim,
        "by behaviour " + ", ".join(f"{head_label(*h)} {float(hr.behaviour.induction[h]):.2f}" for h in heads)
        + "; by weights " + (", ".join(head_label(*h) for h in weights) or "none")
        + f"; the two views {'agree' if hr.agree else 'disagree'}",
        f"best head of the one-layer model: induction attention {control:.2f}",
        verdict_of(hr.agree and bool(good), partial=len(good) < len(measured)),
        _where("the best head's attention on the token after the earlier occurrence", good, measured, usable), "profiles")


def induction_circuits(m: Measurements) -> PaperFinding:
    two = m.analysis(2)
    hr = two.heads
    heads = [h for h in hr.by_behaviour.induction if h[0] >= 1]
    copying = [float(two.copying[h]) for h in heads]
    same = [float(hr.weights.same_matching[h]) for h in heads]
    rnd = m.random_copying
    return PaperFinding(
        "induction-circuits", "Induction heads have copying OV circuits and same-matching QK circuits (through "
        "K-composition with the previous-token head): both have eigenvalues that are mostly positive.",
        ", ".join(f"{head_label(*h)} OV {c:.2f}, QK {s:.2f}" for h, c, s in zip(heads, copying, same)) or "no induction head",
        f"random heads' OV positivity {float(rnd.mean()):.2f} ± {float(rnd.std()):.2f}",
        verdict_of(bool(heads) and min(copying + same) >= NEAR_ONE), "", "positivity-2l")


def induction_loss(m: Measurements) -> PaperFinding:
    two, one = m.analysis(2), m.analysis(1)
    grid, bar = two.grid, INDUCTION_LOSS_FRACTION * two.losses["uniform_loss"]
    cells = [(length, offset, float(grid.loss[i, j])) for i, length in enumerate(grid.lengths)
             for j, offset in enumerate(grid.offsets) if not math.isnan(float(grid.loss[i, j]))]
    everywhere = [length for length in grid.lengths if all(v < WELL for ln, _, v in cells if ln == length)]
    where = []
    for length in grid.lengths:
        row = [o for ln, o, v in cells if ln == length and v < WELL]
        offsets = [o for ln, o, _ in cells if ln == length]
        where.append(f"length {length}: " + ("every offset" if len(row) == len(offsets) else
                                           f"offsets {', '.join(map(str, row)) or 'none'} only (of {offsets[0]}–{offsets[-1]})"))
    return PaperFinding(
        "induction-loss", "Induction heads let the model predict the rest of a sequence it has seen before: the loss "
        "on the second copy of a repeated random segment falls far below chance.",
        f"loss on repeated tokens {two.losses['repeat_loss']:.2f} nats; on the second copy of a repeat, "
        f"{grid.describe()}",
        f"one-layer model: {one.losses['repeat_loss']:.2f} nats, by length and offset {one.grid.describe()}; "
        f"uniform {grid.uniform:.2f}",
        verdict_of(all(v < bar for *_, v in cells), partial=len(everywhere) < len(grid.lengths)),
        f"below {WELL:.1f} nat: " + "; ".join(where) + f" (below the induction bar {bar:.2f} everywhere)"
        if all(v < bar for *_, v in cells) else "", "repeat-loss")


def virtual_heads(m: Measurements) -> PaperFinding:
    two = m.analysis(2)
    report = two.importance_repeat or two.importance
    orders = report.marginal_by_order
    largest = report.top_virtual(1)
    head = min(report.head_marginal.values())
    return PaperFinding(
        "virtual-heads", "In two-layer attention-only models, virtual attention heads matter much less than the "
        "individual heads: their marginal effect on the loss is small.",
        f"on repeated tokens, all virtual heads together {orders[2]:+.3f} nats; the largest, "
        f"{path_label(largest[0][0]) if largest else '–'}, {largest[0][1] if largest else math.nan:+.3f}",
        f"all individual heads together {orders[1]:+.3f} nats; the largest single head {head:+.3f}",
        verdict_of(abs(orders[2]) < MUCH_SMALLER * abs(orders[1])), "", "importance")


def marginal_by_order(m: Measurements) -> PaperFinding:
    two = m.analysis(2)
    rows = []
    for what, report in (("all tokens", two.importance), ("repeated tokens", two.importance_repeat)):
        o = report.marginal_by_order
        rows.append(f"{what}: direct {o[0]:+.3f}, heads {o[1]:+.3f}, virtual {o[2]:+.3f}")
    o = two.importance_repeat.marginal_by_order
    one = m.analysis(1).importance_repeat.marginal_by_order
    return PaperFinding(
        "marginal-loss", "Expanding the logits by path order, the first-order terms (individual heads) carry most of the "
        "loss reduction, the direct path models bigrams, and the second-order terms (virtual heads) add little.",
        "; ".join(rows) + " (nats, when each order is added)",
        f"one-layer model on repeated tokens: direct {one[0]:+.3f}, heads {one[1]:+.3f}",
        verdict_of(abs(o[1]) > abs(o[0]) and abs(o[1]) > abs(o[2])), "", "importance")


def paper_findings(m: Measurements) -> dict[str, PaperFinding]:
    """Every finding, by key, in the paper's order."""
    makers = (bigrams, copying_one_layer, skip_trigrams, bugs, previous_token, k_composition, induction_heads,
              induction_circuits, induction_loss, virtual_heads, marginal_by_order)
    return {f.key: f for f in (make(m) for make in makers)}
