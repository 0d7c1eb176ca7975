"""The companion's measurements: the shipped models analysed once, their controls, and checks.

:func:`measure` loads the three shipped models (0, 1 and 2 layers), runs
:func:`~numeric_check.reports.analysis.analyze_model` on each (once), verifies their path
expansions term by term against the models (:func:`~numeric_check.verification.verify.verify_logits`,
and :func:`~numeric_check.verification.verify.verify_qk` for an induction head), and measures the
controls the findings need: the OV positivity of random heads of the same shapes, the zero-layer
model's fit to its data's bigram table (:func:`bigram_fit`), and the skip-trigrams its data plant,
measured through the one-layer model (:func:`planted_measures`: the outs' rises, the "bugs", the
source attention). Everything is seeded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
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
from numeric_check.reports.paper.formation import Formation, measure_formation, your_formation
from numeric_check.reports.paper.language import LanguageMeasurements, load_language_models, measure_language
from numeric_check.training.toy import data_tables, next_token_losses, repeated_segment_batch, shipped_checkpoint, \
    training_record_for
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
    same contexts without it); ``control``: the same rise for outputs drawn at random;
    ``heads[i]``: the head that carries the skip-trigram ``source … destinations[i] → outputs[i]``
    (:func:`trigram_heads`), where known.
    """

    layer: int
    head: int
    source: int
    destinations: tuple[int, ...]
    outputs: tuple[int, ...]
    rise: Tensor
    control: Tensor
    heads: tuple[tuple[int, int], ...] = ()

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
    random heads; the skip-trigrams the one-layer model's data plant (``planted``, ``[n, 2, 3]``,
    :func:`~numeric_check.training.toy.data_tables`), each measured through the model: the rises of
    its outs (``bugs``, own pairs and swapped ones) and its head's attention on the source
    (``attention``, :func:`head_attention`, with a random token in the source's place as the
    control); how much the data favour each (``data_trigrams``, :func:`data_trigram_favour`); the
    zero-layer model's fit to the data's bigram table (``bigram``, :func:`bigram_fit`); and models
    that learned nothing (random weights of the shipped shapes) measured as the shipped ones are: ``random_analysis`` by layers (losses,
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
    data_trigrams: dict[tuple[int, int], dict[int, float]] = field(default_factory=dict)
    planted: Tensor | None = None
    bigram: BigramFit | None = None
    random_losses: dict[int, dict[str, float]] = field(default_factory=dict)
    random_importance: ImportanceReport | None = None
    random_importance_all: ImportanceReport | None = None
    random_bugs: list[Bugs] = field(default_factory=list)
    random_partner_same: dict[tuple[int, int], float] = field(default_factory=dict)
    language: LanguageMeasurements | None = None
    language_models: str | None = None  # the model and text the language page measured, when not the shipped ones
    formation: Formation | None = None  # the language model's training run (the chapter "How induction heads form")
    formation_note: str | None = None  # why the chapter shows the shipped run where a person's model was measured
    training_curve: list[dict] | None = None  # a person's model's loss curve, from its training record

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


def trigram_rises(model: CircuitModel, head: tuple[int, int], source: int, dests: list[int], outs: list[int], *,
                  n_contexts: int = 32, length: int = 16, seed: int = 0) -> Bugs:
    """Measure, through ``model``'s forward pass, how much ``source`` earlier in the context raises each out
    after each destination.

    Contexts of ``length`` random tokens end in destination ``d_i`` and hold the source token at a
    random earlier position; the rise of each output's logit at the end, against the same contexts
    with the source replaced by another random token, is averaged over ``n_contexts``. A factored
    head predicts every ``(d_i, o_j)`` pair, not only its own trigrams ``(d_i, o_i)``. ``head`` only
    labels the result: the rise is the whole model's.
    """
    gen = torch.Generator().manual_seed(seed)
    d_vocab, k = model.cfg.d_vocab, len(outs)
    shown = set(outs) | set(dests) | {source}
    pool = torch.tensor([t for t in range(d_vocab) if t not in shown])
    control = pool[torch.randperm(len(pool), generator=gen)[:max(k, 4)]]
    base = pool[torch.randint(len(pool), (n_contexts, length), generator=gen)]
    where = torch.randint(0, length - 1, (n_contexts,), generator=gen)
    rise = torch.zeros(len(dests), len(outs), dtype=torch.float64)
    rise_control = torch.zeros(len(dests), len(control), dtype=torch.float64)
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
    return Bugs(head[0], head[1], source, tuple(dests), tuple(outs), rise, rise_control)


def _contexts(model: CircuitModel, source: int, avoid: set[int], n_contexts: int, length: int, gen: torch.Generator):
    """Random contexts of tokens outside ``avoid``, a random earlier position for the source, and the pool."""
    pool = torch.tensor([t for t in range(model.cfg.d_vocab) if t not in avoid | {source}])
    base = pool[torch.randint(len(pool), (n_contexts, length), generator=gen)]
    where = torch.randint(0, length - 1, (n_contexts,), generator=gen)
    return pool, base, where


def head_attention(model: CircuitModel, head: tuple[int, int], source: int, dests: list[int], *, n_contexts: int = 32,
                   length: int = 16, seed: int = 0) -> SourceAttention:
    """Measure, through ``model``'s attention pattern, whether ``head`` picks ``source`` after each destination.

    Contexts of ``length`` random tokens end in destination ``d_i`` and hold the source token at
    a random earlier position; the head's attention from the last position on the source's
    position is divided by its mean attention on the other positions. The control puts a random
    token at the same position (the same contexts otherwise): the ratio a token that is not the
    source gets there.
    """
    gen = torch.Generator().manual_seed(seed)
    _, base, where = _contexts(model, source, set(dests), n_contexts, length, gen)
    rows = torch.arange(n_contexts)
    layer, index = head
    name = block_hook(layer, "attn.hook_pattern")

    def ratio(tokens: Tensor) -> float:
        _, cache = model.run_with_cache(tokens.to(model.device), names_filter=name)
        last = cache[name][:, index, -1].double().cpu()  # [batch, key]
        on = last[rows, where]
        others = (last.sum(-1) - on) / (length - 1)
        return float((on / others).mean())

    found, control = [], []
    with torch.no_grad():
        for d in dests:
            without = base.clone()
            without[:, -1] = d
            with_source = without.clone()
            with_source[rows, where] = source
            found.append(ratio(with_source))
            control.append(ratio(without))
    return SourceAttention(layer, index, source, tuple(dests),
                           torch.tensor(found, dtype=torch.float64), torch.tensor(control, dtype=torch.float64))


def data_trigram_favour(config, trigrams: Tensor, *, n_sequences: int = DATA_SEQUENCES,
                        seed: int = 0) -> dict[tuple[int, int], dict[int, float]]:
    """How much the training data favour each planted out after each planted destination when the
    source came earlier: ``[(A, B)][C] = P(next = C | current B, A earlier) · d_vocab``.

    ``trigrams`` ``[n, 2, 3]`` (:func:`~numeric_check.training.toy.data_tables`): for each source A,
    its two ``(A, B, C)``. Both outs of a source are counted after both of its destinations, over
    ``n_sequences`` sequences of the data ``config`` describes: an own pair (B then C) well above
    1, a swapped one (B then the other pair's C) near 1 — the data hold no bug.
    """
    batch = repeated_segment_batch(config, n_sequences, torch.Generator().manual_seed(seed))
    tokens = batch.tokens  # [batch, pos]
    current, nxt = tokens[:, :-1], tokens[:, 1:]
    out: dict[tuple[int, int], dict[int, float]] = {}
    for group in trigrams.tolist():
        a = group[0][0]
        earlier = (tokens == a).long().cumsum(1)[:, :-1] > 0  # A at or before the current position
        for _, b, _ in group:
            chosen = nxt[(current == b) & earlier & (current != a)]
            out[(a, b)] = {c: float((chosen == c).double().mean()) * config.d_vocab if len(chosen) else math.nan
                           for _, _, c in group}
    return out


@dataclass(frozen=True)
class BigramFit:
    """How well a zero-layer model's next-token table fits the data's bigram table, in nats.

    ``kl``: the mean over current tokens (weighted as the data hold them) of
    ``KL(data's next-token distribution || the model's)``, which is how far the model's loss lies
    above the best any bigram model reaches on these data; ``control``: the same for a model that
    learned nothing (random weights of the same shapes); ``uniform``: for the uniform prediction
    (``ln d_vocab`` less the data's conditional entropy ``entropy``); ``table``: the data's
    ``P[current, next]``.
    """

    kl: float
    control: float
    uniform: float
    entropy: float
    table: Tensor | None = field(default=None, compare=False, repr=False)


def data_bigram_table(config, *, n_sequences: int = 4 * DATA_SEQUENCES, seed: int = 0) -> tuple[Tensor, Tensor]:
    """The bigram table of the data ``config`` describes, counted on ``n_sequences`` sequences:
    ``P[current, next]`` (rows never seen are uniform) and how often each current token occurs."""
    batch = repeated_segment_batch(config, n_sequences, torch.Generator().manual_seed(seed))
    v = config.d_vocab
    counts = torch.zeros(v * v, dtype=torch.float64)
    counts.index_add_(0, (batch.tokens[:, :-1] * v + batch.tokens[:, 1:]).flatten(),
                      torch.ones(batch.tokens[:, 1:].numel(), dtype=torch.float64))
    counts = counts.view(v, v)
    seen = counts.sum(1)
    table = torch.where(seen[:, None] > 0, counts / seen.clamp(min=1)[:, None], torch.full_like(counts, 1 / v))
    return table, seen / seen.sum()


def table_kl(model: CircuitModel, table: Tensor, weight: Tensor) -> float:
    """``Σ_t weight[t] KL(table[t] || the model's next-token distribution after the single token t)``.

    The model reads each token alone at position 0: a zero-layer model's whole table (``W_U W_E``
    with its biases), whatever its positions."""
    with torch.no_grad():
        tokens = torch.arange(model.cfg.d_vocab, device=model.device)[:, None]
        logq = torch.log_softmax(model(tokens)[:, 0].double(), dim=-1).cpu()  # [current, next]
    p = table.double()
    terms = torch.where(p > 0, p * (p.clamp(min=1e-300).log() - logq), torch.zeros_like(p))
    return float((weight * terms.sum(1)).sum())


def bigram_fit(model: CircuitModel, config, *, seed: int = 0) -> BigramFit:
    """:class:`BigramFit` of the zero-layer ``model`` on the data ``config`` describes."""
    table, weight = data_bigram_table(config, seed=seed)
    logp = torch.where(table > 0, table.log(), torch.zeros_like(table))
    entropy = float(-(weight * (table * logp).sum(1)).sum())
    return BigramFit(table_kl(model, table, weight), table_kl(random_like(model, seed), table, weight),
                     math.log(config.d_vocab) - entropy, entropy, table)


def trigram_heads(model: CircuitModel, trigrams: Tensor) -> dict[tuple[int, int], tuple[int, int]]:
    """For each planted ``(A, B, C)``, by ``(A, B)``: the head of the first layer whose OV circuit raises C
    most when it attends to A (``(W_U W_OV^h W_E)[C, A]``) — the head that would carry the skip-trigram."""
    heads = [h for h in model.arch.heads() if h[0] == 0]
    with torch.no_grad():
        ov = {h: ov_circuit(model, *h, dtype=torch.float64).materialize().cpu() for h in heads}  # [out, source]
    return {(a, b): max(heads, key=lambda h: float(ov[h][c, a])) for a, b, c in trigrams.view(-1, 3).tolist()}


def planted_measures(model: CircuitModel, trigrams: Tensor, *, seed: int = 0):
    """The planted skip-trigrams measured through ``model``: for each source, the rises of both outs
    after both destinations (:func:`trigram_rises`: the own pairs and the swapped ones, the "bugs"),
    and for each ``(A, B)`` the attention of its head (:func:`trigram_heads`) on A from B (:func:`head_attention`)."""
    heads = trigram_heads(model, trigrams)
    bugs, attention = [], []
    for group in trigrams.tolist():
        a = group[0][0]
        dests, outs = [b for _, b, _ in group], [c for _, _, c in group]
        found = trigram_rises(model, heads[(a, dests[0])], a, dests, outs, seed=seed)
        bugs.append(replace(found, heads=tuple(heads[(a, b)] for b in dests)))
        attention += [head_attention(model, heads[(a, b)], a, [b], seed=seed) for b in dests]
    return bugs, attention


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
    for n_layers in (0, 1, 2):
        model, analysis = random_like(models[n_layers], seed), found.analysis(n_layers)
        batch = repeated_segment_batch(analysis.data_config, 64, torch.Generator().manual_seed(seed))
        batch = type(batch)(*(t.to(model.device) for t in batch))
        with torch.no_grad():
            found.random_losses[n_layers] = {k: float(v) for k, v in next_token_losses(model(batch.tokens), batch).items()}
        if n_layers == 2:
            found.random_importance = term_importance(model, batch.tokens, target_mask=batch.repeat_mask)
            found.random_importance_all = term_importance(model, batch.tokens)
            readers = [h for h in model.arch.heads() if h[0] >= 1]
            found.random_partner_same = random_partner_same(models[2], readers, seed)
        elif n_layers == 1 and found.planted is not None and len(found.planted):
            found.random_bugs, _ = planted_measures(model, found.planted, seed=seed)


def measure(progress: Callable[[str], None] = lambda step: None, *, n_sequences: int = 64, seed: int = 0,
            device=None, language=None) -> Measurements:
    """Analyse the shipped models (on ``device``; ``None``: CUDA when present), verify their expansions and
    measure the controls; measure the paper's tables on the shipped language models, or on ``language``
    (:class:`~numeric_check.reports.paper.your_model.LanguageModels`: a model of one's own and a text) when given.

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
    found.bigram = bigram_fit(models[0], analyses[0].data_config, seed=seed)
    found.planted = data_tables(analyses[1].data_config).trigrams
    if len(found.planted) and models[1].arch.n_heads:
        found.bugs, found.attention = planted_measures(models[1], found.planted, seed=seed)
        found.tables = [skip_trigram_table(models[1], b.layer, b.head, b.source, k=5) for b in found.bugs[:3]]
        found.data_trigrams = data_trigram_favour(analyses[1].data_config, found.planted, seed=seed)
    progress("the bigram table; the planted skip-trigrams: rises, bugs, source attention")
    _controls(found, models, seed)
    progress("controls: models that learned nothing")
    heldout = None  # the shipped held-out text's tokens, where the language page measured on them
    if language is None:
        shipped = load_language_models(device)
        found.language, heldout = measure_language(*shipped, seed=seed), shipped[2].ids
    else:
        found.language = measure_language(language.models, language.records, language.data, seed=seed,
                                          control=language.control)
        found.language_models = language.describe()
    progress("the language models: the paper's tables")
    if language is None:
        found.formation = measure_formation(ids=heldout, device=device)
    else:  # the person's run: their loss curve, and their snapshots where they kept them
        (record,) = language.records.values()
        curve = record.get("curve") if isinstance(record, dict) else None
        found.training_curve = curve or None
        found.formation, found.formation_note = your_formation(language.checkpoint, language.name, language.data.ids,
                                                               device=device)
    progress("the language model's training run: its stored measurements checked, the claims judged")
    return found


#: How many times :func:`measure` calls ``progress``.
STEPS = len(LAYERS) + 6


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


def non_previous_token_heads(a: ModelAnalysis, below: float) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Layer 0's heads that are not previous-token heads, split by their attention to i − 1 (by behaviour):
    those below ``below`` (the controls for the previous-token head) and the rest (partly previous-token heads)."""
    if a.heads is None:
        return [], []
    found = set(a.heads.by_behaviour.previous_token)
    rest = [h for h in a.model.arch.heads() if h[0] == 0 and h not in found]
    controls = [h for h in rest if float(a.heads.behaviour.previous_token[h]) < below]
    return controls, [h for h in rest if h not in controls]
