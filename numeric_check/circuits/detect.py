"""Previous-token and induction heads, found two ways: from behaviour and from weights.

**Behaviour** (:func:`behaviour_scores`): attention patterns on random sequences that
repeat a segment, its first copy swept over the whole context (seeded; see
:mod:`numeric_check.circuits.behaviour`). Previous-token score: attention from query ``i`` to
``i - 1``; induction score: attention from ``i`` to the tokens that followed earlier
occurrences of its token. Both are measured at every query position: the score is the
mean over positions, and :attr:`HeadScores.profile` keeps the by-position profile and its
minimum, so a head that works in only part of the context is seen as such.

**Weights** (:func:`weight_scores`):

- previous-token score: the positional QK circuit ``W_posᵀ W_QK W_pos / scale``, causally
  masked and softmaxed, read as the mean attention from ``i`` to ``i - 1`` (position terms
  of the head's own input only: token terms, earlier heads and layer-norm scales are left
  out). A model without a positional embedding has none: the score is NaN and a note says so;
- induction score: a head ``h2`` K-composing with an earlier previous-token head ``h1``,
  times how well that circuit matches same tokens and how well ``h2`` copies:
  ``max(same_matching, 0) × max(copying, 0) × previous`` where ``same_matching`` is the positivity
  of ``W_Eᵀ W_QK^{h2} W_OV^{h1} W_E``, ``copying`` of ``W_U W_OV^{h2} W_E`` and ``previous`` the
  partner's previous-token score (1 without positions). The
  partner ``h1`` is the earlier head with the largest ``K-composition excess ×
  previous-token score`` (excess: the K-composition score minus its random baseline); the
  score is 0 when that excess is not positive, and for layer-0 heads.

:func:`classify_heads` turns either view into head lists with thresholds, and
:func:`detect_heads` reports both views and whether they agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from derivations.architecture import head_label
from tensoralg.display import md_table
from numeric_check.circuits.behaviour import PositionProfile, position_profiles, profile_length, random_tokens
from numeric_check.errors import AnalysisError
from numeric_check.circuits.ov_qk import (
    Head,
    copying_scores,
    head_mask,
    model_weight,
    same_matching_scores,
    stacked_head_weights,
)
from numeric_check.circuits.composition import composition_scores
from numeric_check.circuits.factored import Factored


@dataclass(frozen=True)
class HeadScores:
    """Per-head scores ``[n_layers, n_heads]`` of one view (NaN for heads a layer lacks).

    ``profile``: the behaviour view's scores by query position (None for the weight view).
    """

    previous_token: Tensor
    induction: Tensor
    profile: PositionProfile | None = None

    def minimum(self, kind: str) -> Tensor:
        """The lowest score of each head over query positions (the score itself without a profile)."""
        return getattr(self, kind) if self.profile is None else self.profile.minimum(kind)


@dataclass(frozen=True)
class HeadClasses:
    """Heads classified as previous-token and as induction heads, ``(layer, head)`` in order."""

    previous_token: tuple[Head, ...]
    induction: tuple[Head, ...]

    def labels(self) -> dict[str, list[str]]:
        return {kind: [head_label(*h) for h in heads] for kind, heads in (("previous_token", self.previous_token), ("induction", self.induction))}


# --- behaviour ------------------------------------------------------------------------------------


def repeated_tokens(model, seg_len: int, batch: int, seed: int = 0, *, tokens: Tensor | None = None) -> Tensor:
    """Random tokens ``[batch, 2 * seg_len]`` whose second half repeats the first (CPU generator, seeded), drawn from
    every id or from ``tokens`` (:func:`~numeric_check.circuits.behaviour.random_tokens`)."""
    first = random_tokens((batch, seg_len), model.cfg.d_vocab, seed, tokens=tokens)
    return torch.cat([first, first], dim=1).to(model.device)


def behaviour_scores(
    model, *, seg_len: int | None = None, batch: int = 64, seed: int = 0, n_positions: int | None = None,
    tokens: Tensor | None = None,
) -> HeadScores:
    """Previous-token and induction scores from attention at every position of repeated random sequences.

    The scores are means over query positions of :func:`~numeric_check.circuits.behaviour.position_profiles`
    (``seg_len``, ``batch``, ``seed``, ``n_positions`` and ``tokens``, the ids to draw from, are passed on), which
    the result keeps.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=20, n_ctx=8)
    >>> scores = behaviour_scores(model, batch=4)
    >>> scores.previous_token.shape, scores.profile.previous_token.shape
    (torch.Size([2, 2]), torch.Size([2, 2, 8]))
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise AnalysisError(f"batch must be an int >= 1, got {batch!r}")
    profile = position_profiles(model, seg_len=seg_len, batch=batch, seed=seed, n_positions=n_positions, tokens=tokens)
    return HeadScores(profile.mean("previous_token"), profile.mean("induction"), profile)


# --- weights ----------------------------------------------------------------------------------------


def previous_token_scores_by_weights(model, *, n_positions: int | None = None) -> Tensor:
    """Attention to the previous position predicted by ``W_posᵀ W_QK W_pos`` alone, ``[n_layers, n_heads]``.

    Mean over query positions ``1 … n_positions - 1`` (default ``min(n_ctx, 64)``) of the
    causal softmax of the positional QK circuit divided by the attention scale. Raises
    :class:`AnalysisError` when the model has no positional embedding.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(1, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=20, n_ctx=8)
    >>> previous_token_scores_by_weights(model).shape
    torch.Size([1, 2])
    """
    if model.W_pos is None:
        raise AnalysisError(
            "previous-token heads cannot be found from weights: the model has no positional embedding "
            "(positional='none'); use behaviour_scores"
        )
    n_ctx = model.cfg.n_ctx
    n = min(n_ctx, 64) if n_positions is None else n_positions
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= n_ctx:
        raise AnalysisError(f"n_positions must be an int in 2..{n_ctx} (n_ctx), got {n_positions!r}")
    W = stacked_head_weights(model, torch.float64, ("W_Q", "W_K"))
    W_pos = model_weight(model, "W_pos", torch.float64)[:, :n]
    scores = Factored(W_pos.T, W["W_Q"].mT, W["W_K"], W_pos).materialize() / model.cfg.scale  # [L, H, query, key]
    causal = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
    pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    queries = torch.arange(1, n, device=scores.device)
    previous = pattern[..., queries, queries - 1].mean(-1)
    return previous.masked_fill(~head_mask(model), float("nan")).cpu()


@dataclass(frozen=True)
class WeightEvidence:
    """The weight-based view and the terms behind it, each ``[n_layers, n_heads]``.

    ``partner[l][h]``: the earlier head whose output ``L{l}H{h}``'s keys read most (see the
    module docstring), or None in layer 0; ``k_composition`` (excess over the random
    baseline) and ``same_matching``: with that partner, NaN in layer 0.
    """

    scores: HeadScores
    copying: Tensor
    k_composition: Tensor
    same_matching: Tensor
    partner: tuple[tuple[Head | None, ...], ...]
    notes: tuple[str, ...] = ()


def weight_scores(model, *, n_positions: int | None = None, n_samples: int = 64, seed: int = 0) -> WeightEvidence:
    """Previous-token and induction scores from the weights alone (see the module docstring).

    ``n_samples`` and ``seed`` estimate the random K-composition baseline.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=20, n_ctx=8)
    >>> evidence = weight_scores(model)
    >>> evidence.notes[0][:40]
    'no positional embedding: previous-token '
    """
    notes = []
    shape = (model.arch.n_layers, max(model.arch.heads_per_layer, default=0))
    if model.W_pos is None:
        notes.append("no positional embedding: previous-token scores by weights are NaN, and the "
                     "induction partner is chosen by K-composition alone")
        previous = torch.full(shape, float("nan"), dtype=torch.float64)
    else:
        previous = previous_token_scores_by_weights(model, n_positions=n_positions)
    with torch.no_grad():
        copying = copying_scores(model, dtype=torch.float64).cpu()
        excess = composition_scores(model, "K", baseline=True, n_samples=n_samples, seed=seed, dtype=torch.float64).cpu()
        matching = same_matching_scores(model, dtype=torch.float64).cpu()
    weight = previous.nan_to_num(1.0).clamp(0, 1)[:, :, None, None]  # [l1, h1, 1, 1]
    ranking = (excess.clamp(min=0) * weight).nan_to_num(-1.0)  # [l1, h1, l2, h2]
    k_comp = torch.full(shape, float("nan"), dtype=torch.float64)  # NaN for layer 0: no earlier head
    same = k_comp.clone()
    induction = torch.zeros(shape, dtype=torch.float64)
    partners: list[list[Head | None]] = [[None] * shape[1] for _ in range(shape[0])]
    for l2, h2 in model.arch.heads():
        if l2 == 0:
            continue
        flat = int(ranking[:l2, :, l2, h2].argmax())
        l1, h1 = divmod(flat, shape[1])
        partners[l2][h2] = (l1, h1)
        k_comp[l2, h2], same[l2, h2] = excess[l1, h1, l2, h2], matching[l1, h1, l2, h2]
        if k_comp[l2, h2] > 0:  # times how much the partner is a previous-token head: K-composition with a head
            # that attends to itself (a "duplicate-token" reader) is not induction (caught on planted heads)
            induction[l2, h2] = same[l2, h2].clamp(min=0) * copying[l2, h2].clamp(min=0) * weight[l1, h1, 0, 0]
    missing = ~head_mask(model).cpu()
    induction = induction.nan_to_num(0.0).masked_fill(missing, float("nan"))
    return WeightEvidence(
        scores=HeadScores(previous, induction),
        copying=copying,
        k_composition=k_comp,
        same_matching=same,
        partner=tuple(tuple(row) for row in partners),
        notes=tuple(notes),
    )


# --- classification and the report ------------------------------------------------------------------


def classify_heads(scores: HeadScores, *, previous_token_threshold: float = 0.4, induction_threshold: float = 0.4) -> HeadClasses:
    """Heads whose previous-token / induction score exceeds its threshold (NaN never does).

    >>> s = HeadScores(torch.tensor([[0.9, 0.1], [0.0, 0.2]]), torch.tensor([[0.0, 0.0], [0.7, 0.1]]))
    >>> classify_heads(s).labels()
    {'previous_token': ['L0H0'], 'induction': ['L1H0']}
    """

    def above(values: Tensor, threshold: float) -> tuple[Head, ...]:
        return tuple((int(l), int(h)) for l, h in (values > threshold).nonzero().tolist())

    return HeadClasses(above(scores.previous_token, previous_token_threshold), above(scores.induction, induction_threshold))


@dataclass(frozen=True)
class HeadReport:
    """Both views of a model's previous-token and induction heads, and whether they agree.

    ``agreement`` maps ``"previous_token"`` and ``"induction"`` to True/False, or None when
    the weights cannot say (no positional embedding for previous-token heads).
    """

    behaviour: HeadScores
    weights: WeightEvidence
    by_behaviour: HeadClasses
    by_weights: HeadClasses
    agreement: dict[str, bool | None] = field(default_factory=dict)

    @property
    def agree(self) -> bool:
        """True when every kind the weights can judge finds the same heads as behaviour."""
        return all(v for v in self.agreement.values() if v is not None)

    @property
    def notes(self) -> tuple[str, ...]:
        return self.weights.notes

    def _repr_markdown_(self) -> str:
        """What a notebook shows: :meth:`to_markdown`."""
        return self.to_markdown()

    def to_markdown(self) -> str:
        """A per-head table of both views, the classifications and the agreement."""
        header = ["head", "prev-token (behaviour)", "min over positions", "prev-token (weights)", "induction (behaviour)",
                  "min over positions", "induction (weights)", "copying", "K-comp excess", "same-matching", "partner"]
        b, w = self.behaviour, self.weights
        low_prev, low_ind = b.minimum("previous_token"), b.minimum("induction")
        rows = []
        for l, h in _heads(b.previous_token):
            partner = w.partner[l][h]
            cells = [b.previous_token[l, h], low_prev[l, h], w.scores.previous_token[l, h], b.induction[l, h], low_ind[l, h],
                     w.scores.induction[l, h], w.copying[l, h], w.k_composition[l, h], w.same_matching[l, h]]
            rows.append([head_label(l, h), *map(_number, cells), head_label(*partner) if partner else "-"])
        lines = [md_table(header, rows, right=range(1, 10)), ""]
        for name, classes in (("behaviour", self.by_behaviour), ("weights", self.by_weights)):
            found = classes.labels()
            lines.append(f"- by {name}: previous-token {', '.join(found['previous_token']) or 'none'}; "
                         f"induction {', '.join(found['induction']) or 'none'}")
        verdict = {True: "agree", False: "disagree", None: "weights cannot say"}
        lines.append("- " + "; ".join(f"{kind.replace('_', '-')}: {verdict[v]}" for kind, v in self.agreement.items()))
        lines += [f"- note: {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


def _number(value: Tensor) -> str:
    return "-" if value.isnan() else f"{float(value):.3f}"


def _heads(values: Tensor) -> list[Head]:
    return [(l, h) for l in range(values.shape[0]) for h in range(values.shape[1]) if not values[l, h].isnan()]


def detect_heads(
    model,
    *,
    seg_len: int | None = None,
    batch: int = 64,
    seed: int = 0,
    n_positions: int | None = None,
    previous_token_threshold: float = 0.4,
    induction_threshold: float = 0.4,
    weight_previous_token_threshold: float | None = None,
    weight_induction_threshold: float | None = None,
    n_samples: int = 64,
) -> HeadReport:
    """Previous-token and induction heads by behaviour and by weights, with their agreement.

    Behaviour is measured on ``batch`` sequences of ``n_positions`` tokens (see
    :func:`behaviour_scores`), and the weights' previous-token score over the same positions.
    Thresholds for the weight view default to the behaviour ones; ``seed`` seeds both the
    random sequences and the composition baseline.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=20, n_ctx=8)
    >>> report = detect_heads(model, batch=4)
    >>> sorted(report.agreement)
    ['induction', 'previous_token']
    """
    behaviour = behaviour_scores(model, seg_len=seg_len, batch=batch, seed=seed, n_positions=n_positions)
    weights = weight_scores(model, n_positions=profile_length(model, n_positions), n_samples=n_samples, seed=seed)
    by_behaviour = classify_heads(behaviour, previous_token_threshold=previous_token_threshold, induction_threshold=induction_threshold)
    by_weights = classify_heads(
        weights.scores,
        previous_token_threshold=previous_token_threshold if weight_previous_token_threshold is None else weight_previous_token_threshold,
        induction_threshold=induction_threshold if weight_induction_threshold is None else weight_induction_threshold,
    )
    agreement = {
        "previous_token": None if model.W_pos is None else by_behaviour.previous_token == by_weights.previous_token,
        "induction": by_behaviour.induction == by_weights.induction,
    }
    return HeadReport(behaviour, weights, by_behaviour, by_weights, agreement)
