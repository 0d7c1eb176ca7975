"""The head detectors checked against a known truth: recall and precision.

A detector that finds what a trained model learned cannot show that it finds *only* that: the
truth of a trained model is what the detector says. Here the truth is built in.

**Induction and previous-token heads** (:func:`planted_heads_model`): two-layer attention-only
models whose heads are written by hand, each with a role, in a residual stream laid out in four
blocks — the current token ``T`` (one-hot), the previous token ``P``, the output ``O`` read by
``W_U``, and the position ``S`` (``qk_only``: positions reach queries and keys only):

- ``previous-token``: attends from ``i`` to ``i − 1`` (positional QK) and copies the token there
  from ``T`` into ``P`` (in the second layer, into ``O``: it then reads as a previous-token head but
  feeds nothing);
- ``induction``: its query reads ``T`` and its key ``P``, so it attends to the token after an
  earlier occurrence of the current token, and copies that token into ``O`` — the K-composition
  term ``Id ⊗ A^{h−1} ⊗ W`` of the paper;
- decoys that a loose detector would take for one: ``current`` (attends to itself and writes its token
  into ``T`` again), ``duplicate``
  (attends to earlier occurrences of the current token itself, not the token after: query and key
  both read ``T``), and ``random`` (small random weights).

Every attention weight then gets Gaussian noise whose Frobenius norm is ``noise`` times the weight's. :func:`detector_recall` runs :func:`~numeric_check.circuits.detect.detect_heads` on
many such models with the roles placed at random and counts, for each kind and each view
(behaviour, weights), the planted heads found (recall) and the found heads that were planted
(precision).

**Skip-trigrams**: see :func:`skip_trigram_recall` — the planted triples of a model's training
data against the triples ranked highest by its heads' QK and OV circuits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from derivations.architecture import Architecture
from numeric_check.circuits.detect import detect_heads
from numeric_check.circuits.ov_qk import ov_circuit, qk_circuit
from numeric_check.errors import AnalysisError

#: The roles a planted head can have, by layer: the first layer's, then the second's.
ROLES = (("previous-token", "current", "random"), ("induction", "duplicate", "previous-token", "current", "random"))
#: The attention-score gap (after the ``1/√d_head`` scale) between the source a planted head picks and the rest.
SHARPNESS = 8.0
#: The detectors' kinds, as :class:`~numeric_check.circuits.detect.HeadClasses` names them.
KINDS = ("previous_token", "induction")
VIEWS = ("by_behaviour", "by_weights")


def planted_heads_model(roles: Sequence[Sequence[str]], *, d_vocab: int = 32, n_ctx: int = 32, noise: float = 0.0,
                        seed: int = 0):
    """A two-layer attention-only model (float64, CPU) whose head ``(l, h)`` plays ``roles[l][h]``.

    >>> m = planted_heads_model([["previous-token", "current"], ["induction", "random"]], d_vocab=8, n_ctx=8)
    >>> tokens = torch.tensor([[5, 1, 2, 3, 4, 1, 2, 3]])
    >>> m(tokens)[0, 5:8].argmax(-1).tolist()  # in the repeat of "1, 2, 3, 4": the next tokens, read by induction
    [2, 3, 4]
    """
    from numeric_check.model.circuit_model import CircuitModel

    if len(roles) != 2 or len({len(r) for r in roles}) != 1 or not roles[0]:
        raise AnalysisError(f"roles must be two lists of the same length (the heads of each layer), got {roles!r}")
    for layer, names in enumerate(roles):
        for name in names:
            if name not in ROLES[layer]:
                raise AnalysisError(f"layer {layer} cannot hold a {name!r} head; expected one of {', '.join(ROLES[layer])}")
    V, n, H = d_vocab, n_ctx, len(roles[0])
    T, P, O, S = slice(0, V), slice(V, 2 * V), slice(2 * V, 3 * V), slice(3 * V, 3 * V + n)
    d_head = max(V, n)
    model = CircuitModel.random(Architecture(2, H, positional="qk_only"), d_model=3 * V + n, d_head=d_head,
                                d_vocab=V, n_ctx=n, seed=seed, dtype=torch.float64, device="cpu")
    gen = torch.Generator().manual_seed(seed)
    eye, sharp = torch.eye(V, dtype=torch.float64), SHARPNESS * math.sqrt(d_head)
    shift = torch.diag(torch.ones(n - 1, dtype=torch.float64), -1)  # position j → slot j + 1
    with torch.no_grad():
        model.W_E.zero_()[T] = eye
        model.W_pos.zero_()[S] = torch.eye(n, dtype=torch.float64)
        model.W_U.zero_()[:, O] = eye
        for layer, names in enumerate(roles):
            attn = model.blocks[layer].attn
            for h, name in enumerate(names):
                W_Q, W_K, W_V, W_O = attn.W_Q[h], attn.W_K[h], attn.W_V[h], attn.W_O[h]
                if name == "random":
                    for w in (W_Q, W_K, W_V, W_O):
                        w.copy_(torch.randn(w.shape, generator=gen, dtype=torch.float64) * 0.1)
                else:
                    for w in (W_Q, W_K, W_V, W_O):
                        w.zero_()
                    W_V[:V, T] = eye  # every planted head moves the source's token
                    # the first layer's previous-token head writes P; its current head writes T again (doubling
                    # it); every other planted head writes O, the logits
                    W_O[{"previous-token": P, "current": T}.get(name, O) if layer == 0 else O, :V] = eye
                    if name in ("previous-token", "current"):
                        W_Q[:n, S] = sharp * torch.eye(n, dtype=torch.float64)
                        W_K[:n, S] = shift if name == "previous-token" else torch.eye(n, dtype=torch.float64)
                    else:  # induction (key: the previous token) or duplicate (key: the token itself)
                        W_Q[:V, T] = sharp * eye
                        W_K[:V, P if name == "induction" else T] = eye
                if noise:  # of noise × the Frobenius norm of the weight it is added to
                    for w in (W_Q, W_K, W_V, W_O):
                        draw = torch.randn(w.shape, generator=gen, dtype=torch.float64)
                        w.add_(draw * (noise * torch.linalg.matrix_norm(w) / torch.linalg.matrix_norm(draw)))
    return model


def random_roles(n_heads: int, generator: torch.Generator) -> list[list[str]]:
    """Roles placed at random: in the first layer a previous-token head (sometimes two), a ``current`` decoy and
    random heads; in the second one or two induction heads, a ``duplicate`` decoy, sometimes a previous-token
    head, and random heads. Needs ``n_heads >= 4``."""
    if n_heads < 4:
        raise AnalysisError(f"n_heads must be at least 4 to place every role, got {n_heads}")
    coin = torch.rand(3, generator=generator).tolist()
    first = ["previous-token", "current"] + ["previous-token"] * (coin[0] < 0.3)
    second = ["induction", "duplicate"] + ["induction"] * (coin[1] < 0.5) + ["previous-token"] * (coin[2] < 0.4)
    layers = []
    for names in (first, second):
        names = names + ["random"] * (n_heads - len(names))
        order = torch.randperm(n_heads, generator=generator).tolist()
        layers.append([names[i] for i in order])
    return layers


@dataclass(frozen=True)
class Recall:
    """One detector's counts over many planted models: ``found`` of ``planted`` heads, ``claimed`` in all;
    ``score``: the planted heads' mean score in this view (whether they still do what they were built for)."""

    kind: str
    view: str
    noise: float
    planted: int
    found: int
    claimed: int
    score: float = math.nan

    @property
    def recall(self) -> float:
        return self.found / self.planted if self.planted else math.nan

    @property
    def precision(self) -> float:
        return self.found / self.claimed if self.claimed else math.nan


def detector_recall(*, n_models: int = 8, noise: Sequence[float] = (0.0, 1.0), n_heads: int = 4,
                    d_vocab: int = 32, n_ctx: int = 32, seed: int = 0, batch: int = 16,
                    replace: dict[str, str] | None = None) -> list[Recall]:
    """Recall and precision of the previous-token and induction detectors, by behaviour and by weights,
    over ``n_models`` planted models for each ``noise`` level (the same roles at every level).

    ``replace`` (a control) builds each model with some roles swapped for a decoy — ``{"induction":
    "duplicate"}`` — while the truth stays the roles as drawn: the detector should then find none of them.
    """
    gen = torch.Generator().manual_seed(seed)
    layouts = [random_roles(n_heads, gen) for _ in range(n_models)]
    swap = replace or {}
    out = []
    for level in noise:
        counts = {(kind, view): [0, 0, 0] for kind in KINDS for view in VIEWS}
        scores: dict[tuple[str, str], list[float]] = {key: [] for key in counts}
        for i, roles in enumerate(layouts):
            built = [[swap.get(name, name) for name in names] for names in roles]
            model = planted_heads_model(built, d_vocab=d_vocab, n_ctx=n_ctx, noise=level, seed=seed + i)
            report = detect_heads(model, batch=batch, seed=seed + i)
            truth = {kind: {(l, h) for l, names in enumerate(roles) for h, name in enumerate(names)
                            if name == kind.replace("_", "-")} for kind in KINDS}
            for kind in KINDS:
                for view in VIEWS:
                    claimed = set(getattr(getattr(report, view), kind))
                    c = counts[kind, view]
                    c[0] += len(truth[kind])
                    c[1] += len(truth[kind] & claimed)
                    c[2] += len(claimed)
                    view_scores = report.behaviour if view == "by_behaviour" else report.weights.scores
                    scores[kind, view] += [float(getattr(view_scores, kind)[h]) for h in truth[kind]]
        out += [Recall(kind, view, level, *c, sum(scores[kind, view]) / max(len(scores[kind, view]), 1))
                for (kind, view), c in counts.items()]
    return out


@dataclass(frozen=True)
class TrigramRecall:
    """The planted skip-trigrams among each planted source's top-``k`` triples, over ``sources`` sources."""

    sources: int
    planted: int
    found: int
    k: int
    median_rank: float
    swapped: int = 0  # triples in the top k that pair one planted destination with another's out: the "bugs"

    @property
    def recall(self) -> float:
        return self.found / self.planted if self.planted else math.nan

    @property
    def precision(self) -> float:
        return self.found / (self.k * self.sources) if self.sources else math.nan


def head_tables(model) -> list[tuple[Tensor, Tensor]]:
    """Each head's ``(attention, rise)``, ``[d_vocab, d_vocab]`` each, float64: the attention a destination
    (row) gives a source (column) among all tokens equally present (the QK row's softmax), and the logit rise of
    an out (row) from a source (column) over the mean out (the OV column, centred; negative rises count 0)."""
    tables = []
    with torch.no_grad():
        for layer, head in model.arch.heads():
            qk = qk_circuit(model, layer, head, dtype=torch.float64).materialize() / model.cfg.scale
            ov = ov_circuit(model, layer, head, dtype=torch.float64).materialize()
            tables.append((qk.softmax(-1), (ov - ov.mean(0)).clamp(min=0)))
    return tables


def triple_scores(model, source: int, tables: list[tuple[Tensor, Tensor]] | None = None) -> Tensor:
    """How strongly the model's heads carry each skip-trigram ``source … destination → out``:
    ``[d_vocab (destination), d_vocab (out)]``, the largest over heads of the destination's attention to the
    source times the out's rise (:func:`head_tables`, computed here unless given). The copying out
    (``out == source``) is left out."""
    best = None
    for attention, rise in tables if tables is not None else head_tables(model):
        score = attention[:, source, None] * rise[None, :, source]
        best = score if best is None else torch.maximum(best, score)
    best[:, source] = -1.0
    return best


def skip_trigram_recall(model, planted: Tensor, *, k: int | None = None) -> TrigramRecall:
    """The planted skip-trigrams ``planted [n, 3]`` (rows ``A, B, C``) among the top ``k`` triples
    (:func:`triple_scores`) of each planted source ``A``; ``k`` defaults to the number planted per source."""
    planted = planted.reshape(-1, 3).tolist()
    by_source: dict[int, set[tuple[int, int]]] = {}
    for a, b, c in planted:
        by_source.setdefault(a, set()).add((b, c))
    k = k or max(len(v) for v in by_source.values())
    found, swapped, ranks, d, tables = 0, 0, [], model.cfg.d_vocab, head_tables(model)
    for a, truth in by_source.items():
        order = triple_scores(model, a, tables).flatten().argsort(descending=True)
        rank_of = torch.empty_like(order)
        rank_of[order] = torch.arange(len(order), device=order.device)
        for b, c in truth:
            ranks.append(int(rank_of[b * d + c]) + 1)
            found += ranks[-1] <= k
        bugs = {(b, c) for b, _ in truth for _, c in truth} - truth
        swapped += sum(divmod(int(i), d) in bugs for i in order[:k])
    return TrigramRecall(len(by_source), len(planted), found, k, float(torch.tensor(ranks, dtype=torch.float64).median()),
                         swapped)
