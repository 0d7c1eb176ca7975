"""The companion's measurements: the shipped models analysed once, their controls, and checks.

:func:`measure` loads the three shipped models (0, 1 and 2 layers), runs
:func:`~numeric_check.reports.analysis.analyze_model` on each (once), verifies their path
expansions term by term against the models (:func:`~numeric_check.verification.verify.verify_logits`,
and :func:`~numeric_check.verification.verify.verify_qk` for an induction head), and measures the
controls the findings need: the OV positivity of random heads of the same shapes, and the
skip-trigram "bugs" of the one-layer model (:func:`skip_trigram_bugs`). Everything is seeded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from numeric_check.circuits.detect import repeated_tokens
from numeric_check.circuits.ov_qk import copying_scores, ov_circuit
from numeric_check.circuits.skip_trigrams import SkipTrigramTable, skip_trigram_table
from numeric_check.model.checkpoint import load_checkpoint
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.reports.analysis import ModelAnalysis, analyze_model
from numeric_check.training.toy import shipped_checkpoint, training_record_for
from numeric_check.verification.results import VerifyReport
from numeric_check.verification.verify import verify_logits, verify_qk

#: The shipped models, by number of layers.
LAYERS = (0, 1, 2)
#: Sequences of repeated random tokens the expansions are verified on: batch x (2 x SEGMENT).
VERIFY_BATCH, SEGMENT = 4, 16
#: Random models drawn for the copying control.
RANDOM_MODELS = 8


@dataclass(frozen=True)
class Bugs:
    """The skip-trigram "bugs" of one head for one source token, measured through the model.

    ``rise[i, j]``: mean rise of the logit of output ``outputs[j]`` at a destination holding
    ``destinations[i]`` when the source token is present earlier in the context (against the
    same contexts without it); ``control``: the same rise for outputs drawn at random.
    """

    layer: int
    head: int
    source: int
    destinations: tuple[int, ...]
    outputs: tuple[int, ...]
    rise: Tensor
    control: Tensor

    @property
    def diagonal(self) -> float:
        """Mean rise of the table's own trigrams (the i-th destination with the i-th output)."""
        return float(self.rise.diagonal().mean())

    @property
    def off_diagonal(self) -> float:
        """Mean rise of the "bug" trigrams (a destination with another destination's output)."""
        n = self.rise.shape[0]
        return float(self.rise[~torch.eye(n, dtype=torch.bool)].mean())


@dataclass
class Measurements:
    """Everything the companion reports, measured once."""

    analyses: dict[int, ModelAnalysis]
    random_copying: Tensor
    verification: dict[str, VerifyReport] = field(default_factory=dict)
    tables: list[SkipTrigramTable] = field(default_factory=list)
    bugs: list[Bugs] = field(default_factory=list)

    def analysis(self, n_layers: int) -> ModelAnalysis:
        return self.analyses[n_layers]


def load_shipped(n_layers: int) -> tuple[CircuitModel, dict | None]:
    """The shipped ``n_layers`` model and its training record."""
    path = shipped_checkpoint(n_layers)
    return load_checkpoint(path), training_record_for(path)


def random_copying(model: CircuitModel, n_models: int = RANDOM_MODELS, seed: int = 0) -> Tensor:
    """OV eigenvalue positivity of every head of ``n_models`` random models shaped as ``model`` (flat)."""
    cfg = model.cfg
    scores = [copying_scores(CircuitModel.random(model.arch, d_model=cfg.d_model, d_head=cfg.d_head, d_vocab=cfg.d_vocab,
                                                 n_ctx=cfg.n_ctx, seed=seed + i), dtype=torch.float64).flatten()
              for i in range(n_models)]
    return torch.cat(scores)


def strongest_sources(model: CircuitModel, layer: int, head: int, n: int = 3) -> list[int]:
    """The ``n`` source tokens whose largest direct logit effect through the head's OV circuit is largest."""
    with torch.no_grad():
        ov = ov_circuit(model, layer, head, dtype=torch.float64).materialize()  # [out, source]
    return [int(t) for t in ov.amax(0).topk(n).indices]


def skip_trigram_bugs(model: CircuitModel, table: SkipTrigramTable, *, k: int = 4, n_contexts: int = 32,
                      length: int = 16, seed: int = 0) -> Bugs:
    """Measure, through ``model``'s forward pass, whether the table's destinations and outputs combine freely.

    Contexts of ``length`` random tokens end in destination ``d_i`` and hold the source token at a
    random earlier position; the rise of each output's logit at the end, against the same contexts
    with the source replaced by another random token, is averaged over ``n_contexts``. A factored
    head predicts every ``(d_i, o_j)`` pair, not only its own trigrams ``(d_i, o_i)``.
    """
    gen = torch.Generator().manual_seed(seed)
    d_vocab, source = model.cfg.d_vocab, table.source_token
    dests = [d.token for d in table.destinations[:k]]
    outs = [o.token for o in table.outputs[:k]]
    shown = set(outs) | {source}
    pool = torch.tensor([t for t in range(d_vocab) if t not in shown])
    control = pool[torch.randperm(len(pool), generator=gen)[:k]]
    base = pool[torch.randint(len(pool), (n_contexts, length), generator=gen)]
    where = torch.randint(0, length - 1, (n_contexts,), generator=gen)
    rise = torch.zeros(len(dests), len(outs), dtype=torch.float64)
    rise_control = torch.zeros(len(dests), k, dtype=torch.float64)
    rows = torch.arange(n_contexts)
    with torch.no_grad():
        for i, d in enumerate(dests):
            without = base.clone()
            without[:, -1] = d
            with_source = without.clone()
            with_source[rows, where] = source
            diff = (model(with_source.to(model.device))[:, -1] - model(without.to(model.device))[:, -1]).double().cpu()
            rise[i] = diff[:, outs].mean(0)
            rise_control[i] = diff[:, control].mean(0)
    return Bugs(table.layer, table.head, source, tuple(dests), tuple(outs), rise, rise_control)


def measure(progress: Callable[[str], None] = lambda step: None, *, n_sequences: int = 64, seed: int = 0) -> Measurements:
    """Analyse the shipped models, verify their expansions and measure the controls.

    ``progress(step)`` is called after each step (:data:`STEPS` of them).
    """
    analyses, models = {}, {}
    for n_layers in LAYERS:
        model, record = load_shipped(n_layers)
        models[n_layers] = model
        analyses[n_layers] = analyze_model(model, name=f"induction_{n_layers}l", training=record,
                                           n_sequences=n_sequences, seed=seed)
        progress(f"analysed the {n_layers}-layer model")
    found = Measurements(analyses, random_copying(models[1], seed=seed))
    progress("random heads (control)")
    for n_layers, model in models.items():
        tokens = repeated_tokens(model, SEGMENT, VERIFY_BATCH, seed=seed)
        found.verification[f"logits-{n_layers}l"] = verify_logits(model, tokens)
        if n_layers == 2:
            head = induction_head(analyses[2])
            if head is not None:
                found.verification["qk-2l"] = verify_qk(model, tokens, *head)
    progress("verified the expansions on the models")
    head = analyses[1].top_head
    if head is not None:
        found.tables = [skip_trigram_table(models[1], *head, source, k=5) for source in strongest_sources(models[1], *head)]
        found.bugs = [skip_trigram_bugs(models[1], table, seed=seed) for table in found.tables]
    progress("skip-trigram bugs")
    return found


#: How many times :func:`measure` calls ``progress``.
STEPS = len(LAYERS) + 3


def induction_head(a: ModelAnalysis) -> tuple[int, int] | None:
    """The strongest induction head by behaviour in a layer >= 1, if any."""
    if a.heads is None:
        return None
    later = [h for h in a.heads.by_behaviour.induction if h[0] >= 1]
    if not later:
        return None
    return max(later, key=lambda h: float(a.heads.behaviour.induction[h]))


def previous_token_head(a: ModelAnalysis) -> tuple[int, int] | None:
    """The strongest previous-token head by behaviour in layer 0, if any."""
    if a.heads is None:
        return None
    first = [h for h in a.heads.by_behaviour.previous_token if h[0] == 0]
    if not first:
        return None
    return max(first, key=lambda h: float(a.heads.behaviour.previous_token[h]))


def flat_bigram_gap(model: CircuitModel) -> float:
    """Largest ``|log softmax(W_U W_E)[:, t] - log(1 / d_vocab)|`` over tokens: how far the direct
    path's next-token distributions are from the flat table of uniformly random tokens."""
    with torch.no_grad():
        table = (model.W_U.double() @ model.W_E.double())  # [d_vocab (out), d_vocab (in)]
        logp = torch.log_softmax(table, dim=0)
    return float((logp + math.log(model.cfg.d_vocab)).abs().max())
