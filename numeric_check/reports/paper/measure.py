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
from numeric_check.circuits.factored import Factored
from numeric_check.circuits.importance import ImportanceReport, term_importance
from numeric_check.circuits.ov_qk import copying_scores, eigenvalue_positivity, head_weights, model_weight, ov_circuit, \
    same_matching_scores
from numeric_check.circuits.skip_trigrams import SkipTrigramTable, skip_trigram_table
from numeric_check.model.checkpoint import load_checkpoint
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.hooks import block_hook
from numeric_check.reports.analysis import ModelAnalysis, analyze_model
from numeric_check.training.toy import next_token_losses, repeated_segment_batch, shipped_checkpoint, training_record_for
from numeric_check.verification.results import VerifyReport
from numeric_check.verification.verify import verify_logits, verify_qk

#: The shipped models, by number of layers.
LAYERS = (0, 1, 2)
#: Sequences of repeated random tokens the expansions are verified on: batch x (2 x SEGMENT).
VERIFY_BATCH, SEGMENT = 4, 16
#: Random models drawn for the copying control.
RANDOM_MODELS = 8
#: Training sequences sampled to count which skip-trigrams the data hold.
DATA_SEQUENCES = 1024


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


@dataclass(frozen=True)
class SourceAttention:
    """Whether a head's QK circuit picks the source of its skip-trigrams, measured through the model.

    ``ratio[i]``: in contexts of random tokens ending in ``destinations[i]`` with the source
    token at a random earlier position, the head's attention on that position over its mean
    attention on the other positions (1: the source is not picked out); ``control[i]``: the
    same ratio at the same position when a random token stands there instead.
    """

    layer: int
    head: int
    source: int
    destinations: tuple[int, ...]
    ratio: Tensor
    control: Tensor


@dataclass
class Measurements:
    """Everything the companion reports, measured once.

    Besides the analyses: the controls the findings are judged against — OV positivity of
    random heads, the source attention of the one-layer head's skip-trigrams
    (:func:`source_attention`), how much the training data favour each output after each
    source (:func:`data_skip_trigrams`), and models that learned nothing (random weights of the
    shipped shapes) measured as the shipped ones are: ``random_analysis`` by layers (losses,
    term importance on repeated tokens), ``random_bugs`` (the bugs rule on the random
    one-layer model), ``random_partner_same`` (the K-composition positivity of each induction
    head with a random head as its partner).
    """

    analyses: dict[int, ModelAnalysis]
    random_copying: Tensor
    verification: dict[str, VerifyReport] = field(default_factory=dict)
    tables: list[SkipTrigramTable] = field(default_factory=list)
    bugs: list[Bugs] = field(default_factory=list)
    attention: list[SourceAttention] = field(default_factory=list)
    data_trigrams: dict[int, dict[int, float]] = field(default_factory=dict)
    random_losses: dict[int, dict[str, float]] = field(default_factory=dict)
    random_importance: ImportanceReport | None = None
    random_bugs: list[Bugs] = field(default_factory=list)
    random_partner_same: dict[tuple[int, int], float] = field(default_factory=dict)

    def analysis(self, n_layers: int) -> ModelAnalysis:
        return self.analyses[n_layers]


def load_shipped(n_layers: int, device=None) -> tuple[CircuitModel, dict | None]:
    """The shipped ``n_layers`` model on ``device`` (``None``: CUDA when present) and its training record."""
    path = shipped_checkpoint(n_layers)
    return load_checkpoint(path, device=device), training_record_for(path)


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


def _contexts(model: CircuitModel, source: int, avoid: set[int], n_contexts: int, length: int, gen: torch.Generator):
    """Random contexts of tokens outside ``avoid``, a random earlier position for the source, and the pool."""
    pool = torch.tensor([t for t in range(model.cfg.d_vocab) if t not in avoid | {source}])
    base = pool[torch.randint(len(pool), (n_contexts, length), generator=gen)]
    where = torch.randint(0, length - 1, (n_contexts,), generator=gen)
    return pool, base, where


def source_attention(model: CircuitModel, table: SkipTrigramTable, *, k: int = 4, n_contexts: int = 32,
                     length: int = 16, seed: int = 0) -> SourceAttention:
    """Measure, through ``model``'s attention pattern, whether the head picks the table's source.

    Contexts of ``length`` random tokens end in destination ``d_i`` and hold the source token at
    a random earlier position; the head's attention from the last position on the source's
    position is divided by its mean attention on the other positions. The control puts a random
    token at the same position (the same contexts otherwise): the ratio a token that is not the
    source gets there.
    """
    gen = torch.Generator().manual_seed(seed)
    dests = [d.token for d in table.destinations[:k]]
    _, base, where = _contexts(model, table.source_token, set(dests), n_contexts, length, gen)
    rows = torch.arange(n_contexts)
    name = block_hook(table.layer, "attn.hook_pattern")

    def ratio(tokens: Tensor) -> float:
        _, cache = model.run_with_cache(tokens.to(model.device), names_filter=name)
        last = cache[name][:, table.head, -1].double().cpu()  # [batch, key]
        on = last[rows, where]
        others = (last.sum(-1) - on) / (length - 1)
        return float((on / others).mean())

    found, control = [], []
    with torch.no_grad():
        for d in dests:
            without = base.clone()
            without[:, -1] = d
            with_source = without.clone()
            with_source[rows, where] = table.source_token
            found.append(ratio(with_source))
            control.append(ratio(without))
    return SourceAttention(table.layer, table.head, table.source_token, tuple(dests),
                           torch.tensor(found, dtype=torch.float64), torch.tensor(control, dtype=torch.float64))


def data_skip_trigrams(config, sources: list[int], outputs: dict[int, list[int]], *, n_sequences: int = DATA_SEQUENCES,
                       seed: int = 0) -> dict[int, dict[int, float]]:
    """How much the training data favour each output after each source: ``P(next = o | s earlier) · d_vocab``.

    ``[s][o]`` over ``n_sequences`` sequences of the data ``config`` describes (its
    :func:`~numeric_check.training.toy.repeated_segment_batch`): at each position whose context
    holds ``s`` before the current token, how often the next token is ``o``, against chance
    ``1/d_vocab``. 1: the data do not tie ``o`` to ``s``; a skip-trigram the data hold is
    well above 1.
    """
    batch = repeated_segment_batch(config, n_sequences, torch.Generator().manual_seed(seed))
    tokens = batch.tokens  # [batch, pos]
    nxt = tokens[:, 2:]  # the token after the current one (current: positions 1..n-2)
    out: dict[int, dict[int, float]] = {}
    for s in sources:
        seen = (tokens == s).long().cumsum(1)[:, :-2] > 0  # s at or before position p - 1, current at p
        chosen = nxt[seen]
        out[s] = {o: float((chosen == o).double().mean()) * config.d_vocab if len(chosen) else math.nan
                  for o in outputs[s]}
    return out


def random_like(model: CircuitModel, seed: int = 0) -> CircuitModel:
    """A model that learned nothing: random weights of ``model``'s architecture and shapes, on its device."""
    cfg = model.cfg
    return CircuitModel.random(model.arch, d_model=cfg.d_model, d_head=cfg.d_head, d_vocab=cfg.d_vocab, n_ctx=cfg.n_ctx,
                               seed=seed, device=model.device)


def random_partner_same(model: CircuitModel, readers: list[tuple[int, int]], seed: int = 0) -> dict[tuple[int, int], float]:
    """K-composition positivity of each reader head with a random head of layer 0 as its partner:
    :func:`~numeric_check.circuits.ov_qk.same_matching_scores` with the partner's ``W_O W_V`` drawn at random."""
    partner = head_weights(random_like(model, seed), 0, 0, torch.float64)
    W_E = model_weight(model, "W_E", torch.float64)
    out = {}
    with torch.no_grad():
        for layer, head in readers:
            w = head_weights(model, layer, head, torch.float64)
            W_O, W_V = partner["W_O"].to(W_E.device), partner["W_V"].to(W_E.device)
            out[(layer, head)] = float(eigenvalue_positivity(Factored(w["W_Q"].T, w["W_K"], W_O, W_V, W_E @ W_E.T)))
    return out


def partner_same(model: CircuitModel) -> Tensor:
    """Every K-composition positivity ``[l1, h1, l2, h2]`` (writer, reader) of ``model``, on the CPU."""
    with torch.no_grad():
        return same_matching_scores(model, dtype=torch.float64).cpu()


def _controls(found: "Measurements", models: dict[int, CircuitModel], seed: int) -> None:
    """The models that learned nothing, measured as the shipped ones are (see :class:`Measurements`)."""
    for n_layers in (1, 2):
        model, analysis = random_like(models[n_layers], seed), found.analysis(n_layers)
        batch = repeated_segment_batch(analysis.data_config, 64, torch.Generator().manual_seed(seed))
        batch = type(batch)(*(t.to(model.device) for t in batch))
        with torch.no_grad():
            found.random_losses[n_layers] = {k: float(v) for k, v in next_token_losses(model(batch.tokens), batch).items()}
        if n_layers == 2:
            found.random_importance = term_importance(model, batch.tokens, target_mask=batch.repeat_mask)
            readers = [h for h in model.arch.heads() if h[0] >= 1]
            found.random_partner_same = random_partner_same(models[2], readers, seed)
        elif found.tables:
            head = found.tables[0].layer, found.tables[0].head
            tables = [skip_trigram_table(model, *head, t.source_token, k=5) for t in found.tables]
            found.random_bugs = [skip_trigram_bugs(model, t, seed=seed) for t in tables]


def measure(progress: Callable[[str], None] = lambda step: None, *, n_sequences: int = 64, seed: int = 0,
            device=None) -> Measurements:
    """Analyse the shipped models (on ``device``; ``None``: CUDA when present), verify their expansions and
    measure the controls.

    ``progress(step)`` is called after each step (:data:`STEPS` of them).
    """
    analyses, models = {}, {}
    for n_layers in LAYERS:
        model, record = load_shipped(n_layers, device)
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
        found.attention = [source_attention(models[1], table, seed=seed) for table in found.tables]
        outputs = {t.source_token: [o.token for o in t.outputs] for t in found.tables}
        found.data_trigrams = data_skip_trigrams(analyses[1].data_config, list(outputs), outputs, seed=seed)
    progress("skip-trigrams: bugs, source attention, the data's trigrams")
    _controls(found, models, seed)
    progress("controls: models that learned nothing")
    return found


#: How many times :func:`measure` calls ``progress``.
STEPS = len(LAYERS) + 4


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
