"""The paper's tables on language: the shipped models trained on the King James Bible, measured on its held-out text.

The paper's findings are claims about what attention-only transformers trained on text learn.
:func:`measure_language` measures them on the zero-, one- and two-layer models trained here
(``numeric_check/data/kjv_{0,1,2}l``: 12 heads a layer as the paper's, a byte-level BPE of 2,048
tokens, 20.5 M tokens of the King James Bible, every sequence with a span of itself repeated) on the
held-out part of that text (``kjv_heldout.txt``), in the slides' forms, beside the paper's own numbers:

- the zero-layer bigram table against the held-out text's exact bigram counts (:class:`Bigrams`);
- one-layer skip-trigram tables read off the weights (source, destinations, outs, an example from the
  text) and the "bugs" the factored tables predict, combinations the whole training text never holds
  (:class:`TrigramTable`, :class:`Bug`; the text ships as ``kjv.txt.xz``), and the share of
  heads whose OV eigenvalues are mostly positive (:class:`Copying`);
- the two-layer term importance by order and by layer (:class:`Importance`);
- induction on a repeated held-out passage (:class:`Induction`).

Each comes with a control that has what the phenomenon needs but not the phenomenon itself (the
model's own frequencies without the current token, the same heads with their outputs permuted, the
head's source after a destination it does not pick, shuffled text, the one-layer model of the same
data, width and tokens), so the rule can fail there on the phenomenon.
"""

from __future__ import annotations

import lzma
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor

from numeric_check.circuits.factored import Factored
from numeric_check.circuits.importance import MAX_ELEMENTS, count_paths, logits_by_order
from numeric_check.circuits.ov_qk import copying_scores, eigenvalue_positivity, head_weights, model_weight
from numeric_check.circuits.repeats import KINDS, repeat_losses
from numeric_check.model.checkpoint import load_checkpoint
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.hooks import block_hook
from numeric_check.reports.findings import COPYING
from numeric_check.training.text import CheckpointTokenizer
from numeric_check.training.toy import training_record_for

#: The paper's own numbers (the slides' tables): term importance by order, and by layer — each layer's heads
#: relative to the direct path alone and to the direct path with the other layer's heads (its "added last").
PAPER_ORDERS = {"direct path": -1.8, "individual heads": -5.2, "virtual heads": -0.3}
PAPER_LAYERS = {("layer 1", "added to the direct path"): -1.3, ("layer 1", "added last"): -0.05,
                ("layer 2", "added to the direct path"): -5.2, ("layer 2", "added last"): -4.0,
                ("both layers", "added to the direct path"): -5.2}
#: The paper's two-layer model (12 heads a layer): how many terms each order has, for its numbers per term.
PAPER_TERMS = {"direct path": 1, "individual heads": 24, "virtual heads": 144}
PAPER_COPYING = (10, 12)  # heads of the one-layer model with mostly positive OV eigenvalues
#: Sequences of the held-out text measured on, and their length; term importance's shuffled control takes fewer.
N_SEQUENCES, N_CTX, N_SHUFFLED = 32, 128, 16
#: Sequences held at once in the term-importance decomposition (its memory follows paths × tokens × vocabulary).
IMPORTANCE_CHUNK = 4


def language_checkpoint(n_layers: int) -> Path:
    """The shipped language model of ``n_layers`` layers (``kjv_{n}l.safetensors``)."""
    return Path(str(resources.files("numeric_check") / "data" / f"kjv_{n_layers}l.safetensors"))


def heldout_path() -> Path:
    """The held-out text the companion measures on (``kjv_heldout.txt``, public domain)."""
    return Path(str(resources.files("numeric_check") / "data" / "kjv_heldout.txt"))


def training_text_path() -> Path:
    """The whole text the shipped language models were trained on and held out from (``kjv.txt.xz``)."""
    return Path(str(resources.files("numeric_check") / "data" / "kjv.txt.xz"))


def shipped_training_text(record: dict | None) -> str:
    """The shipped models' whole text, checked against the SHA-256 their training ``record`` names."""
    from numeric_check.training.text import text_sha256

    text = lzma.decompress(training_text_path().read_bytes()).decode("utf-8")
    named = ((record or {}).get("text") or {}).get("sha256")
    if text_sha256(text) != named:
        raise RuntimeError(f"{training_text_path()} is not the text the shipped models' record names ({named}): "
                           "rebuild it with `make corpus`")  # a packaging bug, not the user's
    return text


@dataclass(frozen=True)
class LanguageData:
    """A text to measure on, tokenized: ``ids`` the whole token stream; ``strings[i]`` token ``i`` as text."""

    tokenizer: object
    ids: Tensor
    strings: tuple[str, ...]
    name: str
    #: what the text is to the model, as its training record shows (:func:`text_kind`): ``held-out``,
    #: ``training`` (the text it was trained on) or ``unknown`` (no record, or another text)
    kind: str = "held-out"
    #: the token stream the model trained on (what a "bug" must be absent from); None where not given
    training: Tensor | None = None

    @classmethod
    def from_text(cls, tokenizer, text: str, name: str, kind: str = "held-out") -> "LanguageData":
        from numeric_check.training.text import encode

        strings = tuple(tokenizer.decode([i]) for i in range(tokenizer.get_vocab_size()))
        data = cls(tokenizer, encode(tokenizer, text), strings, name, kind)
        return data.trained_on(text) if kind == "training" else data

    def trained_on(self, whole_text: str) -> "LanguageData":
        """The same data with :attr:`training` read from the model's whole training text (split as it was)."""
        from numeric_check.training.text import encode, training_part

        return replace(self, training=encode(self.tokenizer, training_part(whole_text)))

    @property
    def text_words(self) -> str:
        """The text as the page names it: ``the held-out text``, ``the training text`` or ``the text``."""
        return {"held-out": "the held-out text", "training": "the training text"}.get(self.kind, "the text")

    @property
    def token_words(self) -> str:
        """Its tokens as the page names them: ``held-out tokens``, ``tokens of the training text`` or ``tokens``."""
        return {"held-out": "held-out tokens", "training": "tokens of the training text"}.get(self.kind, "tokens")

    def show(self, ids) -> str:
        """Token ids as the text they spell."""
        return self.tokenizer.decode([int(i) for i in ids])

    def token(self, i: int) -> str:
        """One token as it reads, quoted: ``'" Moses"'``."""
        return '"' + self.strings[int(i)].replace("\n", "\\n") + '"'

    def sequences(self, n: int = N_SEQUENCES, n_ctx: int = N_CTX) -> Tensor:
        """``n`` windows of ``n_ctx`` tokens spread evenly over the stream, ``[n, n_ctx]`` (deterministic)."""
        starts = torch.linspace(0, len(self.ids) - n_ctx - 1, n).long()
        return self.ids[starts[:, None] + torch.arange(n_ctx)]


# --- zero layers: the bigram table ------------------------------------------------------------------


@dataclass(frozen=True)
class Bigrams:
    """A zero-layer model's table ``W_U W_E`` against the text's exact bigram counts (every pair counted).

    ``loss``: the model's cross-entropy on the text's bigrams; ``unigram``: the entropy of the next
    token alone (what a table that ignores the current token reaches at best); ``bigram``: the text's
    own conditional entropy (what the counts themselves reach, in sample); ``captured``: the share of
    the gap between the two that the model closes; ``control_*``: the same for the model's own
    frequencies with the current token ignored (its table averaged over current tokens: frequencies
    learned, bigrams not); ``agreement``: the share of the text's tokens after which the model's most
    likely next token is the text's most frequent one; ``pairs``: the most frequent bigrams, as
    ``(current, next, count, P_text, P_model)``.
    """

    loss: float
    unigram: float
    bigram: float
    control_loss: float
    agreement: float
    control_agreement: float
    pairs: tuple[tuple[str, str, int, float, float], ...]
    tokens: int

    @property
    def captured(self) -> float:
        return (self.unigram - self.loss) / (self.unigram - self.bigram)

    @property
    def control_captured(self) -> float:
        return (self.unigram - self.control_loss) / (self.unigram - self.bigram)


def bigrams(model: CircuitModel, data: LanguageData, top: int = 12) -> Bigrams:
    """:class:`Bigrams` of a zero-layer ``model`` on ``data``'s text."""
    v = model.cfg.d_vocab
    ids = data.ids
    counts = torch.bincount(ids[:-1] * v + ids[1:], minlength=v * v).view(v, v).double()
    n = counts.sum()
    row, column = counts.sum(1), counts.sum(0)
    with torch.no_grad():
        logq = torch.log_softmax(model(torch.arange(v, device=model.device)[:, None])[:, 0].double(), -1).cpu()
    control = torch.log((row / n) @ logq.exp())  # [next]: the model's prediction with the current token unknown

    def xent(logp: Tensor) -> float:
        return float(-(counts * logp).sum() / n)

    nz = counts > 0
    bigram = float(-(counts[nz] * (counts / row.clamp(min=1)[:, None])[nz].log()).sum() / n)
    p_next = column / n
    unigram = float(-(p_next[p_next > 0] * p_next[p_next > 0].log()).sum())
    best = counts.argmax(1)
    agreement = float((row * (logq.argmax(1) == best)).sum() / n)
    control_agreement = float((row * (control.argmax() == best)).sum() / n)
    flat = counts.flatten().topk(top)
    pairs = tuple((data.token(i // v), data.token(i % v), int(c), float(c / row[i // v]), float(logq[i // v, i % v].exp()))
                  for c, i in zip(flat.values.tolist(), flat.indices.tolist()))
    return Bigrams(xent(logq), unigram, bigram, xent(control.expand(v, v)), agreement, control_agreement, pairs, len(ids))


# --- one layer: copying, skip-trigram tables and their bugs ----------------------------------------


@dataclass(frozen=True)
class Copying:
    """OV eigenvalue positivity of each head of the one-layer model (``positivity``), and of the same
    heads with the vocabulary's outputs permuted (``control``: the same learned weights, their outputs
    no longer aligned with their sources, so no copying)."""

    positivity: tuple[float, ...]
    control: tuple[float, ...]

    def count(self, control: bool = False) -> int:
        """Heads whose eigenvalues are mostly positive: positivity at least
        :data:`~numeric_check.reports.findings.COPYING`, the bar every copying finding uses."""
        return sum(p >= COPYING for p in (self.control if control else self.positivity))


def copying(model: CircuitModel, seed: int = 0) -> Copying:
    """:class:`Copying` of the first layer of ``model``."""
    found = copying_scores(model, dtype=torch.float64)[0].tolist()
    perm = torch.randperm(model.cfg.d_vocab, generator=torch.Generator().manual_seed(seed))
    W_U, W_E = model_weight(model, "W_U", torch.float64), model_weight(model, "W_E", torch.float64)
    control = []
    with torch.no_grad():
        for head in range(model.arch.heads_per_layer[0]):
            w = head_weights(model, 0, head, torch.float64)
            control.append(float(eigenvalue_positivity(Factored(W_U[perm.to(W_U.device)], w["W_O"], w["W_V"], W_E))))
    return Copying(tuple(found), tuple(control))


@dataclass(frozen=True)
class TrigramTable:
    """One row of the slides' skip-trigram tables: a head, a source token, the destinations its QK circuit
    picks most for that source and the outs its OV circuit raises most, and an example from the text."""

    head: int
    source: int
    destinations: tuple[int, ...]
    outs: tuple[int, ...]
    example: str


@dataclass(frozen=True)
class Bug:
    """A combination ``source … destination → out`` that one head's factored table predicts.

    ``seen``: how often the measured text holds it (source within the context before the destination, the
    out next); ``trained``: how often the text the model trained on holds it (None: that text was not given);
    ``rise``: how much the out's logit rises after the destination when the source is earlier in
    the context (the model's forward pass, text contexts); ``other_source``: the same rise with another
    frequent word in the source's place; ``control``: the same rise after the frequent destination the head
    avoids most for that source.
    """

    head: int
    source: int
    destination: int
    out: int
    seen: int
    rise: float
    other_source: float
    control: float
    trained: int | None = None

    @property
    def known(self) -> int:
        """How often the model could have learned it: in its training text where given, else in the measured one."""
        return self.seen if self.trained is None else self.trained


def _trigram_contexts(data: LanguageData, n: int, length: int, seed: int) -> Tensor:
    """``n`` windows of ``length`` tokens at random places of the text (the contexts bugs are measured in)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data.ids) - length, (n,), generator=g)
    return data.ids[starts[:, None] + torch.arange(length)]


def logit_rises(model: CircuitModel, contexts: Tensor, source: int, destination: int, seed: int) -> Tensor:
    """Mean rise of every logit ``[d_vocab]`` at the last position of ``contexts`` ending in ``destination`` when
    ``source`` replaces a random earlier token, against the same contexts without it (on the CPU, float64)."""
    g = torch.Generator().manual_seed(seed)
    n, length = contexts.shape
    without = contexts.clone()
    without[:, -1] = destination
    with_source = without.clone()
    with_source[torch.arange(n), torch.randint(0, length - 1, (n,), generator=g)] = source
    with torch.no_grad():
        diff = model(with_source.to(model.device))[:, -1] - model(without.to(model.device))[:, -1]
    return diff.double().mean(0).cpu()


def _occurrences(ids: Tensor, source: int, destination: int, out: int, window: int) -> tuple[int, int | None]:
    """How often ``ids`` hold ``source`` within ``window`` tokens before ``destination`` followed by ``out``,
    and the position of the first such destination (one pass over the stream, however long)."""
    at = ((ids[:-1] == destination) & (ids[1:] == out)).nonzero().flatten()
    if not len(at):
        return 0, None
    before = torch.cat([torch.zeros(1, dtype=torch.long), (ids == source).long().cumsum(0)])  # sources in ids[:i]
    hits = at[before[at] - before[(at - window).clamp(min=0)] > 0]
    return len(hits), (int(hits[0]) if len(hits) else None)


def word_tokens(data: LanguageData, ids) -> list[int]:
    """The ids among ``ids`` that are whole words (a space, then three letters or more): the slides' sources."""
    return [i for i in ids if re.fullmatch(r" [A-Za-z]{3,}", data.strings[i])]


def _ov_columns(model: CircuitModel, head: int, W_U: Tensor, W_E: Tensor, sources: Tensor) -> Tensor:
    """Columns ``sources`` of the first layer's OV circuit ``W_U W_OV^h W_E`` ``[d_vocab, len(sources)]``, on the CPU."""
    w = head_weights(model, 0, head, torch.float64)
    return (W_U @ (w["W_O"] @ (w["W_V"] @ W_E[:, sources.to(W_E.device)]))).cpu()


def trigram_tables(model: CircuitModel, data: LanguageData, *, heads: int = 3, sources: int = 2, k: int = 4,
                   frequent: int = 400, seed: int = 0) -> tuple[list[TrigramTable], list[Bug]]:
    """The slides' skip-trigram tables of the ``heads`` heads whose OV circuits raise a source's top out most,
    ``sources`` source words each (whole words among the ``frequent`` most frequent tokens of the text, their
    strongest rise first), with ``k`` destinations (among the frequent tokens) and outs; and every combination
    of their destinations and outs as a :class:`Bug` (in the training text, or not: a bug), measured through the model."""
    counts = torch.bincount(data.ids, minlength=model.cfg.d_vocab)
    common = counts.topk(min(frequent, model.cfg.d_vocab)).indices
    words = torch.tensor(word_tokens(data, common.tolist()), dtype=torch.long)
    if len(words) < 2:
        return [], []  # no whole words among the frequent tokens: no table in the slides' form
    W_U, W_E = model_weight(model, "W_U", torch.float64), model_weight(model, "W_E", torch.float64)
    found: list[tuple[float, int, int]] = []
    with torch.no_grad():
        for head in range(model.arch.heads_per_layer[0]):
            ov = _ov_columns(model, head, W_U, W_E, words)  # [out, source word]: the columns read, never vocab × vocab
            strength = ov.max(0).values - ov.median(0).values
            best = strength.topk(min(sources, len(words)))
            found += [(float(s), head, int(words[i])) for s, i in zip(best.values, best.indices)]
    strongest: dict[int, float] = {}
    for s, head, _ in found:
        strongest[head] = max(s, strongest.get(head, s))
    chosen = sorted(strongest, key=lambda h: -strongest[h])[:heads]
    contexts = _trigram_contexts(data, 32, 24, seed)
    tables, bugs = [], []
    with torch.no_grad():
        for head in chosen:
            w = head_weights(model, 0, head, torch.float64)
            for _, _, source in sorted((f for f in found if f[1] == head), reverse=True):
                column = torch.tensor([source])
                qk = (W_E[:, common].T @ w["W_Q"].T @ (w["W_K"] @ W_E[:, column])).flatten().cpu()  # [frequent destination]
                ov = _ov_columns(model, head, W_U, W_E, column).flatten()  # [out]
                dests = tuple(int(common[i]) for i in qk.topk(k).indices)
                outs = tuple(int(i) for i in ov.topk(k).indices)
                unpicked = int(common[qk.argmin()])  # a frequent destination the head avoids most
                other = next(x for x in words.tolist() if x != source and x not in outs)  # another frequent word
                example = ""
                avoided = logit_rises(model, contexts, source, unpicked, seed)
                for d in dests:
                    rise, instead = (logit_rises(model, contexts, s, d, seed) for s in (source, other))
                    for o in outs:
                        seen, first = _occurrences(data.ids, source, d, o, N_CTX - 1)
                        trained = None if data.training is None else _occurrences(data.training, source, d, o, N_CTX - 1)[0]
                        if seen and not example:
                            example = "… " + data.show(data.ids[max(0, first - 12):first + 2])
                        bugs.append(Bug(head, source, d, o, seen, float(rise[o]), float(instead[o]), float(avoided[o]),
                                        trained))
                tables.append(TrigramTable(head, source, dests, outs, example))
    return tables, bugs


# --- two layers: term importance --------------------------------------------------------------------


@dataclass(frozen=True)
class Importance:
    """Term importance of the two-layer model on the text, patterns frozen (nats, negative: lowers the loss).

    ``losses`` by the terms kept: ``uniform``, ``direct``, ``direct+L1`` (the direct path and the first
    layer's heads), ``direct+L2``, ``order 1`` (the direct path and every head), ``order 2`` (and every
    virtual head), ``order 2 - L1`` and ``order 2 - L2`` (all but one layer's individual heads), ``model``;
    ``unigram``: the text's next-token entropy; ``shuffled``: the same losses on the same sequences with their
    tokens shuffled within each (no order left: the control of the direct path's bigrams).
    """

    losses: dict[str, float]
    unigram: float
    shuffled: dict[str, float]
    tokens: int
    heads_per_layer: tuple[int, ...] = (12, 12)

    def terms(self, order: str) -> int:
        """How many terms an order has: 1 direct path, every head, every pair of heads of two layers."""
        h = self.heads_per_layer
        return {"direct path": 1, "individual heads": sum(h), "virtual heads": h[0] * h[1]}[order]

    def marginal(self, order: str, losses: dict[str, float] | None = None) -> float:
        """The loss change from adding an order's terms: ``direct path`` (from a uniform prediction),
        ``individual heads``, ``virtual heads``."""
        l = self.losses if losses is None else losses
        return {"direct path": l["direct"] - l["uniform"], "individual heads": l["order 1"] - l["direct"],
                "virtual heads": l["order 2"] - l["order 1"]}[order]

    def by_layer(self) -> dict[tuple[str, str], float]:
        """Each layer's individual heads added to the direct path; added last as the paper adds them (to the
        direct path and the other layer's heads: order 1 without them, the paper's quantity); and added last to
        every other term, the virtual heads too (ours, beside it)."""
        l = self.losses
        return {("layer 1", "added to the direct path"): l["direct+L1"] - l["direct"],
                ("layer 1", "added last"): l["order 1"] - l["direct+L2"],
                ("layer 1", "added last, virtual heads kept"): l["order 2"] - l["order 2 - L1"],
                ("layer 2", "added to the direct path"): l["direct+L2"] - l["direct"],
                ("layer 2", "added last"): l["order 1"] - l["direct+L1"],
                ("layer 2", "added last, virtual heads kept"): l["order 2"] - l["order 2 - L2"],
                ("both layers", "added to the direct path"): l["order 1"] - l["direct"]}


def _losses(model: CircuitModel, tokens: Tensor) -> dict[str, float]:
    """Mean next-token loss of each kept set of terms (see :class:`Importance`), over ``tokens`` in chunks.

    Paths are expanded to order 1 (the direct path and each head); the virtual heads are the exact remainder
    (a two-layer model has no path of a higher order), so the individual heads' logits are all that is held."""
    totals: dict[str, float] = {}
    per_sequence = (count_paths(model.arch.heads_per_layer, 1) + 1) * tokens.shape[1] * model.cfg.d_vocab
    chunks = tokens.split(max(1, min(IMPORTANCE_CHUNK, MAX_ELEMENTS // per_sequence)))  # a large vocabulary: fewer at once
    for chunk in chunks:
        chunk = chunk.to(model.device)
        parts = logits_by_order(model, chunk, 1)
        layer_sums = [sum(t for path, t in parts.by_path.items() if path and path[0][0] == layer) for layer in (0, 1)]
        direct, (l1, l2) = parts.by_path[()], layer_sums
        model_logits = parts.logits  # every term: the direct path, the heads and the virtual heads
        kept = {"uniform": torch.zeros_like(direct), "direct": direct, "direct+L1": direct + l1, "direct+L2": direct + l2,
                "order 1": direct + l1 + l2, "order 2": model_logits, "order 2 - L1": model_logits - l1,
                "order 2 - L2": model_logits - l2, "model": model_logits}
        targets = chunk[:, 1:].flatten()
        for name, logits in kept.items():
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).double(), targets)
            totals[name] = totals.get(name, 0.0) + float(loss) / len(chunks)
    return totals


def importance(model: CircuitModel, data: LanguageData, seed: int = 0) -> Importance:
    """:class:`Importance` of the two-layer ``model`` on :meth:`LanguageData.sequences` of ``data``."""
    tokens = data.sequences()
    g = torch.Generator().manual_seed(seed)
    shuffled = torch.stack([row[torch.randperm(len(row), generator=g)] for row in tokens[:N_SHUFFLED]])
    p = torch.bincount(data.ids, minlength=model.cfg.d_vocab).double()
    p = p[p > 0] / p.sum()
    return Importance(_losses(model, tokens), float(-(p * p.log()).sum()), _losses(model, shuffled), tokens.numel(),
                      tuple(model.arch.heads_per_layer))


# --- induction on a repeated passage ------------------------------------------------------------------


@dataclass(frozen=True)
class Induction:
    """A held-out passage of ``length`` tokens, then the same passage again: the loss on each copy for the
    two-layer model and the one-layer control (same data, width and tokens), and each second-layer head's
    attention from the second copy to the token after the earlier occurrence (``attention``, by head). A few
    positions of the second copy with what the model predicts there (``examples``: text so far, predicted,
    actual)."""

    passage: str
    length: int
    first: float
    second: float
    control_first: float
    control_second: float
    attention: dict[int, float]
    examples: tuple[tuple[str, str, str], ...] = field(default=())
    control: str = "the one-layer model (same text, width and tokens)"
    control_attention: dict[int, float] = field(default_factory=dict)  # the control's last layer, the same way
    passages: int = 1  # how many passages the losses and attention are means over (``passage`` is the first)
    #: Repeated random tokens (uniform, then the text's frequent ones): the model's and the control's losses by copy.
    random: tuple = ()
    control_random: tuple = ()


#: Sequences of repeated random tokens the induction finding measures on (each kind).
RANDOM_SEQUENCES = 32


def induction(model: CircuitModel, control: CircuitModel, data: LanguageData, *, length: int = 48,
              passages: int = 8) -> Induction:
    """:class:`Induction` on ``passages`` held-out passages of ``length`` tokens (the first one shown)."""
    seqs = data.sequences(passages, length)
    tokens = torch.cat([seqs, seqs], dim=1)  # [passages, 2 * length]

    def copy_losses(m: CircuitModel) -> tuple[float, float]:
        with torch.no_grad():
            logits = m(tokens.to(m.device)).double().cpu()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")
        return float(loss[:, :length - 1].mean()), float(loss[:, length:].mean())  # second copy: from its second token

    first, second = copy_losses(model)
    c_first, c_second = copy_losses(control)
    queries = torch.arange(length, 2 * length - 1)

    def to_next(m: CircuitModel, layer: int):
        """Each head of ``layer``: its mean attention from the second copy to the token after the earlier occurrence."""
        name = block_hook(layer, "attn.hook_pattern")
        with torch.no_grad():
            logits, cache = m.run_with_cache(tokens.to(m.device), names_filter=name)
        pattern = cache[name].double().cpu()  # [batch, head, query, key]
        return logits, {h: float(pattern[:, h, queries, queries - length + 1].mean()) for h in range(pattern.shape[1])}

    logits, attention = to_next(model, 1)
    _, control_attention = to_next(control, control.arch.n_layers - 1)
    predicted = logits[0].argmax(-1).cpu()
    examples = tuple((data.show(tokens[0, length:p + 1])[-40:], data.token(predicted[p]), data.token(tokens[0, p + 1]))
                     for p in range(length, 2 * length - 1, max(1, length // 6)))
    counts = torch.bincount(data.ids.long().cpu(), minlength=model.cfg.d_vocab)

    def on_random(m: CircuitModel) -> tuple:
        return tuple(repeat_losses(m, kind=kind, counts=counts, batch=RANDOM_SEQUENCES) for kind in KINDS)

    return Induction(data.show(seqs[0]), length, first, second, c_first, c_second, attention, examples,
                     control_attention=control_attention, passages=passages, random=on_random(model),
                     control_random=on_random(control))


# --- all of it ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LanguageMeasurements:
    """Everything the companion's language page shows (see the module's docstring); a part is None where
    its model is not given (a zero-layer model for the bigrams, a one-layer model for copying and the
    skip-trigram tables, a two-layer model for term importance and induction)."""

    data: LanguageData
    records: dict[int, dict | None]
    bigrams: Bigrams | None = None
    copying: Copying | None = None
    tables: tuple[TrigramTable, ...] = ()
    bugs: tuple[Bug, ...] = ()
    importance: Importance | None = None
    induction: Induction | None = None


def load_language_models(device=None) -> tuple[dict[int, CircuitModel], dict[int, dict | None], LanguageData]:
    """The shipped language models, their training records, and the held-out text tokenized as they read it."""
    models, records = {}, {}
    for n in (0, 1, 2):
        path = language_checkpoint(n)
        models[n] = load_checkpoint(path, device=device)
        records[n] = training_record_for(path, models[n])
    tokenizer = CheckpointTokenizer.beside(language_checkpoint(2)).tokenizer  # the same BPE beside all three
    text = heldout_path().read_text(encoding="utf-8")
    data = LanguageData.from_text(tokenizer, text, "the held-out King James Bible")
    return models, records, data.trained_on(shipped_training_text(records[2]))


def measure_language(models: dict[int, CircuitModel], records: dict[int, dict | None], data: LanguageData,
                     seed: int = 0, control: CircuitModel | None = None) -> LanguageMeasurements:
    """Measure the paper's tables on ``models`` (by number of layers, each of 0, 1 and 2 optional; in float64)
    on ``data``. Induction's control is the one-layer model, or ``control`` where one is given instead."""
    models = {n: m.to(dtype=torch.float64) for n, m in models.items()}
    found: dict = {}
    if 0 in models:
        found["bigrams"] = bigrams(models[0], data)
    if 1 in models:
        found["copying"] = copying(models[1], seed)
        found["tables"], found["bugs"] = map(tuple, trigram_tables(models[1], data, seed=seed))
    if 2 in models:
        found["importance"] = importance(models[2], data, seed)
        if 1 in models:
            found["induction"] = induction(models[2], models[1], data)
        elif control is not None:
            found["induction"] = replace(induction(models[2], control.to(dtype=torch.float64), data),
                                         control="the same model with its second layer removed")
    return LanguageMeasurements(data, records, **found)
