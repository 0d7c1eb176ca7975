"""The paper's claims checked against one model's analysis: each a :class:`Finding` with a verdict.

:func:`findings` reads a :class:`~numeric_check.reports.analysis.ModelAnalysis` (and optionally
the analysis of a 1-layer control) and states, for two-layer models, that a previous-token head
in layer 0 and an induction head in layer 1 exist by weights and by behaviour, that the
induction head K-composes with the previous-token head and lowers the loss on repeated tokens;
for one-layer models, that heads copy and that the model cannot do induction. Each finding
carries the figures measured for it, so a reader can disagree with the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from torch import Tensor

from derivations.architecture import head_label
from tensoralg.escape import escape_text
from numeric_check.circuits.behaviour import ACROSS_CONTEXT, MIN_REPEAT, best_head_floor, usable_positions
from numeric_check.circuits.importance import path_label
from numeric_check.errors import AnalysisError
from numeric_check.reports.analysis import Head, ModelAnalysis, composition_with

# A positivity "near 1": the paper's induction heads sit above ~0.9. A head "copies" when
# its OV positivity is clearly positive: random heads of the shipped models' shapes
# (d_model 64, d_head 16, d_vocab 128) give 0.01 ± 0.11, at most 0.43 over 200 heads.
NEAR_ONE = 0.8
COPYING = 0.5
# A model "does induction" when its loss on repeated tokens is below half of log(d_vocab);
# a control "cannot" when it stays above that bar and no head attends inductively. (A
# 1-layer model can still copy every token it has seen, which lowers its loss on repeated
# tokens to about log(#distinct tokens in context): some way below log(d_vocab), far above
# what induction reaches.)
INDUCTION_LOSS_FRACTION = 0.5

@dataclass(frozen=True)
class Finding:
    """One of the paper's claims, the figures measured for it, and whether they bear it out."""

    claim: str
    measured: str
    holds: bool

    def _repr_markdown_(self) -> str:
        """What a notebook shows: the claim, the figures measured for it and the verdict."""
        verdict = "holds" if self.holds else "**does not hold**"
        return f"{escape_text(self.claim, 'markdown')}: {verdict} ({escape_text(self.measured, 'markdown')})"


def _label(head: Head, index_from: int = 0) -> str:
    """``L{l}H{h}`` with layers numbered from ``index_from`` (0: TransformerLens, 1: the paper)."""
    return head_label(head[0] + index_from, head[1])


def _path(heads: Sequence[Head], index_from: int = 0) -> str:
    return "→".join(_label(h, index_from) for h in heads) if heads else path_label(())


def _heads_text(heads: Sequence[Head], values: Tensor | None = None, ix: int = 0) -> str:
    if not heads:
        return "none"
    if values is None:
        return ", ".join(_label(h, ix) for h in heads)
    return ", ".join(f"{_label(h, ix)} {float(values[h]):.2f}" for h in heads)


def _one_layer_findings(a: ModelAnalysis, role: str, ix: int = 0) -> list[Finding]:
    heads = list(a.model.arch.heads())
    copying = [float(a.copying[h]) for h in heads]
    copiers = sum(c >= COPYING for c in copying)
    out = [
        Finding(
            f"the 1-layer {role}'s heads copy (OV eigenvalue positivity clearly positive)",
            f"OV positivity {', '.join(f'{_label(h, ix)} {c:.2f}' for h, c in zip(heads, copying))}; "
            f"{copiers}/{len(heads)} >= {COPYING} (random heads: about 0 ± 0.1)",
            copiers * 2 > len(heads),
        )
    ]
    uniform, repeat = a.losses["uniform_loss"], a.losses["repeat_loss"]
    bar = INDUCTION_LOSS_FRACTION * uniform
    found = a.heads.by_behaviour.induction if a.heads else ()
    heads_found = f"induction heads by behaviour: {_heads_text(found, ix=ix)}"
    if a.grid is not None:  # repeats of random tokens: nothing but induction predicts their second copy
        out.append(Finding(f"the 1-layer {role} cannot do induction at any length or offset (loss on the second copy of a repeat)",
                           f"{a.grid.describe()}; induction bar < {bar:.2f}; {heads_found}",
                           a.grid.best[2] >= bar and not found))
    else:  # the training data's repeats: on data with bigrams and skip-trigrams partly predictable without induction
        out.append(Finding(f"the 1-layer {role} cannot do induction (loss on repeated tokens stays high)",
                           f"loss on repeated tokens {repeat:.2f} nats (uniform {uniform:.2f}, induction bar < {bar:.2f}); "
                           f"{heads_found}", repeat >= bar and not found))
    return out


def _across_context(a: ModelAnalysis, kind: str, heads: Sequence[Head], claim: str, ix: int = 0) -> Finding:
    """Whether, at every usable query position, one of ``heads`` scores at least ``ACROSS_CONTEXT``.

    ``claim`` holds ``{positions}``, filled with the range of query positions checked (``1–59``),
    so that a claim names its range: a previous-token head's work at the last ``MIN_REPEAT``
    positions serves only shorter repeats, and is left out of the claim, not hidden in it.
    """
    profile = a.heads.behaviour.profile
    if profile is None or not heads:
        return Finding(claim.format(positions="(none measured)"), "no such head by behaviour", False)
    floor, where = best_head_floor(profile, kind, heads)
    first, last = profile.measured(kind)
    usable = usable_positions(kind, last + 1)
    low, high = max(first, usable[0]), min(last, usable[-1])
    claim = claim.format(positions=f"{low}–{high}")
    per_head = "; ".join(f"{_label(h, ix)} {profile.summary(kind, h)}" for h in heads)
    left_out = (f"; positions {high + 1}–{last} serve only repeats shorter than {MIN_REPEAT} tokens and are not claimed"
                if kind == "previous_token" and high < last else "")
    return Finding(claim, f"best head's lowest {floor:.2f} at position {where} of {low}–{high} (bar {ACROSS_CONTEXT}){left_out}; "
                          f"each head alone: {per_head}", floor >= ACROSS_CONTEXT)


def _multi_layer_findings(a: ModelAnalysis, ix: int = 0) -> list[Finding]:
    hr = a.heads
    out = []
    for view, classes, values in (
        ("behaviour", hr.by_behaviour, hr.behaviour.previous_token),
        ("weights", hr.by_weights, hr.weights.scores.previous_token),
    ):
        layer0 = [h for h in classes.previous_token if h[0] == 0]
        out.append(Finding(f"layer {ix} has a previous-token head (by {view})", f"attention to i-1: {_heads_text(layer0, values, ix)}", bool(layer0)))
    out.append(_across_context(a, "previous_token", [h for h in hr.by_behaviour.previous_token if h[0] == 0],
                               "at every query position {positions}, a previous-token head attends to i-1", ix))
    for view, classes, values in (
        ("behaviour", hr.by_behaviour, hr.behaviour.induction),
        ("weights", hr.by_weights, hr.weights.scores.induction),
    ):
        later = [h for h in classes.induction if h[0] >= 1]
        out.append(Finding(f"a later layer has induction heads (by {view})", f"induction scores: {_heads_text(later, values, ix)}", bool(later)))
    out.append(_across_context(a, "induction", [h for h in hr.by_behaviour.induction if h[0] >= 1],
                               "at every query position {positions} of a repeat, one of the induction heads attends inductively", ix))
    found = bool(hr.by_behaviour.previous_token) and bool(hr.by_behaviour.induction)
    out.append(
        Finding(
            "weights and behaviour find the same previous-token and induction heads",
            "; ".join(f"{k.replace('_', '-')}: {'agree' if v else 'disagree' if v is False else 'n/a'}" for k, v in hr.agreement.items())
            + ("" if found else " (but behaviour finds no heads of some kind)"),
            hr.agree and found,
        )
    )
    induction = [h for h in hr.by_behaviour.induction if h[0] >= 1]
    if induction:
        copying = [float(a.copying[h]) for h in induction]
        out.append(Finding("induction heads copy (OV positivity near 1)", _heads_text(induction, a.copying, ix), min(copying) >= NEAR_ONE))
        pairs = [(hr.weights.partner[h[0]][h[1]], h) for h in induction]
        same = [float(hr.weights.same_matching[h]) for h in induction]
        out.append(
            Finding(
                "induction heads same-match (K-composition circuit positivity near 1)",
                ", ".join(f"{_path((w, r), ix)} {s:.2f}" for (w, r), s in zip(pairs, same)),
                min(same) >= NEAR_ONE,
            )
        )
        k = [composition_with(a, "K", w, r) for w, r in pairs]
        out.append(
            Finding(
                "K-composition with the previous-token head is above the random baseline",
                ", ".join(f"{_path((w, r), ix)} {s:.3f}" for (w, r), s in zip(pairs, k)) + f" (baseline {a.baseline['K']:.3f})",
                min(k) > a.baseline["K"],
            )
        )
        for kind in ("Q", "V"):
            scores = [composition_with(a, kind, w, r) for w, r in pairs]
            out.append(
                Finding(
                    f"{kind}-composition with the previous-token head is not above the baseline",
                    ", ".join(f"{_path((w, r), ix)} {s:.3f}" for (w, r), s in zip(pairs, scores))
                    + f" (baseline {a.baseline[kind]:.3f}; K above: {min(k):.3f})",
                    max(scores) <= a.baseline[kind],
                )
            )
    uniform, repeat = a.losses["uniform_loss"], a.losses["repeat_loss"]
    out.append(
        Finding(
            f"the {a.n_layers}-layer model does induction (loss on repeated tokens far below uniform)",
            f"loss on repeated tokens {repeat:.2f} nats, elsewhere {a.losses['other_loss']:.2f} "
            f"(uniform {uniform:.2f}, induction bar < {INDUCTION_LOSS_FRACTION * uniform:.2f})",
            repeat < INDUCTION_LOSS_FRACTION * uniform,
        )
    )
    if a.grid is not None:
        out.append(Finding(f"the {a.n_layers}-layer model does induction at every length and offset (loss on the second copy of a repeat)",
                           f"{a.grid.describe()}; induction bar < {INDUCTION_LOSS_FRACTION * uniform:.2f}",
                           a.grid.worst[2] < INDUCTION_LOSS_FRACTION * uniform))
    if a.importance is not None and len(a.importance.loss_by_order) > 2:
        orders = a.importance.marginal_by_order
        out.append(
            Finding(
                "virtual heads (order 2) matter far less than individual heads (order 1)",
                f"marginal loss (change when each order is added): direct {orders[0]:+.3f}, heads {orders[1]:+.3f}, "
                f"virtual {orders[2]:+.3f} nats",
                abs(orders[2]) < 0.25 * abs(orders[1]),
            )
        )
    return out


def findings(analysis: ModelAnalysis, control: ModelAnalysis | None = None, *, index_from: int = 0) -> list[Finding]:
    """The paper's findings for ``analysis`` (and a 1-layer ``control``), with measured figures.

    Multi-layer models: a previous-token head in layer 0 and induction heads later, by
    behaviour and by weights, agreeing; induction heads copy and same-match (positivity
    >= ``NEAR_ONE``); their K-composition with the previous-token head exceeds the random
    baseline while Q and V do not; the loss on repeated tokens is below
    ``INDUCTION_LOSS_FRACTION * log(d_vocab)``; virtual heads matter little. 1-layer
    models (or the control): most heads copy (positivity >= ``COPYING``); the loss on repeated tokens stays above
    that bar and no head attends inductively. Heads and layers are numbered from ``index_from`` (0, as
    TransformerLens; 1, as the paper).
    """
    out: list[Finding] = []
    if analysis.n_layers >= 2:
        out += _multi_layer_findings(analysis, index_from)
    elif analysis.n_layers == 1:
        out += _one_layer_findings(analysis, "model", index_from)
    if control is not None:
        if control.n_layers != 1:
            raise AnalysisError(f"the control must be a 1-layer model; {control.name!r} has {control.n_layers} layers")
        out += _one_layer_findings(control, "control", index_from)
    return out
