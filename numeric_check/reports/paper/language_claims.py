"""The paper's findings on language, judged part by part, and its tables beside ours.

Built from :class:`~numeric_check.reports.paper.language.LanguageMeasurements` (the models trained
on the King James Bible, measured on its held-out text). Each finding is a
:class:`~numeric_check.reports.paper.claims.PaperFinding` whose parts apply one rule of
:mod:`numeric_check.reports.paper.rules` to the model and to a control that has what the phenomenon
needs (learned weights, the same text) but not the phenomenon itself; :func:`language_tables` gives
the slides' tables with the paper's numbers beside ours and why they differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from derivations.document import math as formula
from numeric_check.circuits.repeats import FREQUENT
from numeric_check.reports.paper.claims import PaperFinding, Part, finding, label
from numeric_check.reports.paper.language import (
    PAPER_COPYING, PAPER_LAYERS, PAPER_ORDERS, PAPER_TERMS, LanguageMeasurements,
)
from numeric_check.reports.paper.rules import MATTERS, carry_most, lowers, most_copy, much_smaller

#: The zero-layer table "approximates" the bigram table when it closes more than this share of the gap
#: between the next-token entropy alone and the text's own bigram entropy, and its most likely next token
#: is the text's most frequent one after at least this share of the text's tokens.
BIGRAM_SHARE = 0.5
#: A factored table's unseen combination is a bug when it rises at least this share of the seen ones' rise.
BUG_SHARE = 0.5


@dataclass(frozen=True)
class Table:
    """A table for the page and the PDF: plain-text cells (the writers escape them), the right-aligned
    columns ``numeric``, and a note under it (why ours differ from the paper's, where they do)."""

    key: str
    caption: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[int, ...] = ()
    note: str = ""


#: The King James Bible as scripts/corpus.py makes it, and what the same two-layer run did at other copy shares
#: (scripts/sweep.sh; the guide's "How induction heads form"): why the shipped models copy every sequence.
KJV_SHA256 = "a54f69ed07477e1215267694d7ea043f31e0d7a073c5157fd07c44f1f806d690"
SWEEP = ("Measured: the same two-layer run at copy shares 0, 0.1 and 0.25 formed no induction head within its 5,000 "
         "steps (best second-layer prefix matching on repeated random tokens 0.057, 0.057 and 0.059, against 0.214 at "
         "share 1, where one was still forming at the end). ")


def why_different(m: LanguageMeasurements) -> str:
    """Why our numbers differ from the paper's, from the models' training records (the widths, the vocabulary,
    the text and the tokens seen, the copy-augmentation); in general terms where a model has no record."""
    record = next((r for r in (m.records.get(n) for n in (2, 1, 0)) if r), None)
    paper = ("the paper's models are wider, with a vocabulary of tens of thousands of tokens, trained on far more and "
             "more varied text (web text and code). ")
    if record is None or "text" not in record:
        return (f"Why these numbers may differ from the paper's: {paper}The model measured here is described by its "
                "own configuration; differences of width, vocabulary, data and tokens seen change every number.")
    c, text = record["train_config"], record["text"]
    seen = c["steps"] * c["batch_size"] * c["n_ctx"]
    copies = (f"every sequence repeats a span of itself ({c['seg_min']}–{c['seg_max']} tokens)" if c["copy_share"] >= 1
              else f"{c['copy_share']:.0%} of the sequences repeat a span of themselves ({c['seg_min']}–{c['seg_max']} tokens)"
              if c["copy_share"] else "no sequence is copy-augmented")
    return (f"Why our numbers differ from the paper's: our models are {c['d_model']} wide with {c['n_heads']} heads of "
            f"{c['d_head']} and a byte-level BPE of {c['d_vocab']:,} tokens, trained on {seen / 1e6:.1f} M tokens of one "
            f"book ({', '.join(text['files'])}: {text['train_tokens'] / 1e6:.1f} M tokens, seen {seen / text['train_tokens']:.0f} "
            f"times); {copies}. {SWEEP if text.get('sha256') == KJV_SHA256 else ''}"
            f"{paper[0].upper() + paper[1:]}Fewer tokens "
            "and a smaller vocabulary leave less for the direct path to learn and for each head to specialise in (many of "
            "our tokens are pieces of words); a repetitive text and copied spans make copying and induction more useful.")


def _nats(x: float) -> str:
    return f"{x:+.3f}"


# --- findings -----------------------------------------------------------------------------------------


def bigrams_language(m: LanguageMeasurements) -> PaperFinding:
    b = m.bigrams
    share = Part(
        f"the zero-layer table closes more than {BIGRAM_SHARE:.0%} of the gap between the next token's entropy alone "
        f"({b.unigram:.3f} nats) and the text's exact bigram entropy ({b.bigram:.3f}, every pair of {m.data.text_words} counted)",
        f"zero-layer model {b.loss:.3f} nats: {b.captured:.0%} of the gap",
        b.captured > BIGRAM_SHARE,
        f"the same model's frequencies with the current token ignored (its table averaged over current tokens): "
        f"{b.control_loss:.3f} nats, {b.control_captured:.0%} of the gap",
        b.control_captured > BIGRAM_SHARE)
    agree = Part(
        f"its most likely next token is the text's most frequent one after at least {BIGRAM_SHARE:.0%} of the tokens",
        f"after {b.agreement:.0%} of the {b.tokens:,} {m.data.token_words}",
        b.agreement >= BIGRAM_SHARE,
        f"its frequencies alone: after {b.control_agreement:.0%}",
        b.control_agreement >= BIGRAM_SHARE)
    return finding("language-bigrams", ("A zero-layer transformer approximates the bigram log-likelihood table (its logits "
                                        "are ", formula("W_U W_E"), " applied to the current token)."), [share, agree])


def copying_language(m: LanguageMeasurements) -> PaperFinding:
    c = m.copying
    values = ", ".join(f"{label(0, h)} {p:.2f}" for h, p in enumerate(c.positivity))
    part = Part(
        "more than half of the one-layer model's heads have \u201cmostly positive\u201d OV eigenvalues, the paper's words, "
        "which set no number: here the positivity Σλ/Σ|λ| is at least 0.5 (our bar; above 0, the weakest reading, "
        "counted beside it)",
        f"{c.count()}/{len(c.positivity)} heads at or above 0.5, {sum(p > 0 for p in c.positivity)} above 0 "
        f"(the paper: {PAPER_COPYING[0]}/{PAPER_COPYING[1]}): {values}",
        most_copy(c.positivity),
        f"the same heads with the vocabulary's outputs permuted (learned weights, outputs no longer their sources): "
        f"{c.count(control=True)}/{len(c.control)}",
        most_copy(c.control))
    return finding("language-copying", (f"Most heads of a one-layer model copy: {PAPER_COPYING[0]} of "
                                        f"{PAPER_COPYING[1]} have mostly positive OV eigenvalues."), [part])


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def skip_trigrams_language(m: LanguageMeasurements) -> PaperFinding:
    learned = [b for b in m.bugs if b.known]
    unseen = [b for b in m.bugs if not b.known]
    trained = bool(m.bugs) and all(b.trained is not None for b in m.bugs)
    where = "the training text" if trained else (m.data.text_words if m.data else "the text")
    rise, other = _mean(b.rise for b in learned), _mean(b.other_source for b in learned)
    picks = Part(
        f"for the combinations of a table that {where} holds, the out's logit rises by at least {MATTERS} nats after "
        "the destination when the source is earlier in the context, and at least twice as much as with the other "
        "candidate for that place (the source, or another frequent word)",
        f"{len(learned)} combinations in {where}: mean rise {rise:+.2f} nats" if learned
        else f"no combination of a table is in {where}: none to measure",
        bool(learned) and rise >= MATTERS and rise >= 2 * other,
        f"another frequent word in the source's place: {other:+.2f}" if learned else "none to measure",
        bool(learned) and other >= MATTERS and other >= 2 * rise)
    bug_rise, bug_control = _mean(b.rise for b in unseen), _mean(b.control for b in unseen)
    caveat = "" if trained else " (the training text was not given: some may be in it, learned rather than bugs)"
    bugs = Part(
        f"the \u201cbugs\u201d: combinations of a table's destinations and outs that {where} never holds rise at least "
        f"{BUG_SHARE:.0%} as much as the learned ones (one head's table predicts every combination)",
        (f"{len(unseen)} combinations never in {where}{caveat}: mean rise {bug_rise:+.2f} nats "
         f"({bug_rise / rise:.0%} of the learned ones')") if learned and unseen
        else f"no table has combinations both in {where} and not",
        bool(learned and unseen) and bug_rise >= BUG_SHARE * rise,
        f"the same sources and outs after the frequent destination the head avoids most: {bug_control:+.2f} nats",
        bool(learned and unseen) and bug_control >= BUG_SHARE * rise)
    return finding("language-skip-trigrams",
                   ("One-layer heads implement skip-trigrams [source] … [destination] → [out], read off the weights; "
                    "their factored tables also predict combinations the text never holds (\u201ckeep … in bay\u201d)."),
                   [picks, bugs])


def term_importance_language(m: LanguageMeasurements) -> PaperFinding:
    imp = m.importance
    orders = [imp.marginal(k) for k in PAPER_ORDERS]
    shuffled = [imp.marginal(k, imp.shuffled) for k in PAPER_ORDERS]
    direct = Part(
        f"the direct path models bigrams: its loss lies at least {MATTERS} nats below the text's next-token entropy "
        f"({imp.unigram:.3f})",
        f"direct path {imp.losses['direct']:.3f} nats",
        lowers(imp.losses["direct"], imp.unigram),
        f"the same sequences with their tokens shuffled (no order): {imp.shuffled['direct']:.3f}",
        lowers(imp.shuffled["direct"], imp.unigram))
    heads = Part(
        "the individual heads lower the loss more than any other order",
        "direct " + ", heads ".join(_nats(x) for x in orders[:2]) + f", virtual {_nats(orders[2])} nats "
        f"(the paper: {PAPER_ORDERS['direct path']}, {PAPER_ORDERS['individual heads']}, {PAPER_ORDERS['virtual heads']})",
        carry_most(orders),
        "shuffled text: direct " + _nats(shuffled[0]) + f", heads {_nats(shuffled[1])}, virtual {_nats(shuffled[2])}",
        carry_most(shuffled))
    virtual = Part(
        "the virtual heads change the loss by less than a quarter of the individual heads",
        f"virtual {_nats(orders[2])} against heads {_nats(orders[1])}",
        much_smaller(orders[2], orders[1]),
        f"shuffled text: virtual {_nats(shuffled[2])} against heads {_nats(shuffled[1])}",
        much_smaller(shuffled[2], shuffled[1]))
    return finding("language-term-importance",
                   ("In a two-layer model the individual heads matter most (−5.2 nats), the direct path next (−1.8), "
                    "the virtual heads little (−0.3)."), [direct, heads, virtual])


def induction_language(m: LanguageMeasurements) -> PaperFinding:
    ind = m.induction
    head, best = max(ind.attention.items(), key=lambda kv: kv[1])
    c_head, c_best = max(ind.control_attention.items(), key=lambda kv: kv[1], default=(0, float("nan")))
    loss = Part(
        f"on a repeated passage of {m.data.text_words}, the loss on the second copy is at most half the first copy's",
        f"two-layer model: first copy {ind.first:.2f} nats, second {ind.second:.2f}",
        ind.second <= 0.5 * ind.first,
        f"{ind.control}: first {ind.control_first:.2f}, second {ind.control_second:.2f}",
        ind.control_second <= 0.5 * ind.control_first)
    attend = Part(
        "a second-layer head attends at least 0.4 on average from the second copy to the token after the earlier occurrence",
        f"{label(1, head)} {best:.2f}",
        best >= 0.4,
        (f"{ind.control}: its best head {label(0, c_head)} {c_best:.2f}" if ind.control_attention else
         f"{ind.control}: not measured"),
        c_best >= 0.4)
    parts = [loss, attend]
    if ind.random:
        parts.append(Part(
            f"on arbitrary tokens (random, repeated once: uniform over the vocabulary, and the text's {FREQUENT} most "
            f"frequent), the second copy costs at least {RANDOM_DROP:g} nats less than the first (our bar: an "
            "n-gram model cannot predict random tokens, an induction head can)",
            "two-layer model: " + "; ".join(_random(r) for r in ind.random),
            all(r.drop - r.interval >= RANDOM_DROP for r in ind.random),
            f"{ind.control}: " + "; ".join(_random(r) for r in ind.control_random),
            all(r.drop - r.interval >= RANDOM_DROP for r in ind.control_random)))
    note = "" if best >= 0.4 else (
        "No second-layer head attends to the token after the earlier occurrence: induction heads did not form within "
        f"this model's training ({_tokens_seen(m)}). The paper's two-layer models formed them; in the toy models of the "
        "later sections, trained on planted repeats, they form within a few thousand steps.")
    return finding("language-induction", ("Induction heads continue a repeated passage (\u201cMr and Mrs Dursley … "
                                         "Mr D\u201d → \u201cursley\u201d)."), parts, note=note)


#: The term-importance table's rows by position, not by number (the paper counts layers from 1, the page as
#: --index-from says): the keys of Importance.by_layer and PAPER_LAYERS are the paper's.
LAYER_NAMES = {"layer 1": "first layer", "layer 2": "second layer"}
#: How much cheaper the second copy of repeated random tokens must be (nats, the lower end of its 95 % interval).
RANDOM_DROP = 3.0
def _random(r) -> str:
    return f"{r.kind} {r.first:.2f} → {r.second:.2f} nats (a drop of {r.drop:.2f} ± {r.interval:.2f})"


def _tokens_seen(m: LanguageMeasurements) -> str:
    """``'20.5 M tokens, every sequence copy-augmented'`` from the two-layer model's record, or ``'its budget'``."""
    record = m.records.get(2)
    if not record:
        return "its budget"
    c = record["train_config"]
    share = "every sequence" if c["copy_share"] >= 1 else f"{c['copy_share']:.0%} of the sequences"
    return f"{c['steps'] * c['batch_size'] * c['n_ctx'] / 1e6:.1f} M tokens, {share} copy-augmented"


def language_findings(m: LanguageMeasurements) -> dict[str, PaperFinding]:
    """Every finding on language, by key."""
    makers = ((bigrams_language, m.bigrams), (copying_language, m.copying), (skip_trigrams_language, m.bugs),
              (term_importance_language, m.importance), (induction_language, m.induction))
    return {f.key: f for f in (make(m) for make, measured in makers if measured)}


# --- tables ---------------------------------------------------------------------------------------------


def language_tables(m: LanguageMeasurements) -> list[Table]:
    """The slides' tables on our language models, the paper's numbers beside ours."""
    tables = []
    if m.bigrams is not None:
        tables.append(_bigram_table(m))
    if m.copying is not None:
        tables += _one_layer_tables(m)
    if m.importance is not None:
        tables += _importance_tables(m)
    if m.induction is not None:
        tables.append(_induction_table(m))
    return tables


def _bigram_table(m: LanguageMeasurements) -> Table:
    b = m.bigrams
    return Table("bigrams", f"Zero layers: the most frequent bigrams of {m.data.text_words}, P(next | current) as the text "
                    "has it (every pair counted) and as the zero-layer model's table has it",
                    ("current", "next", "count", "P text", "P model"),
                    tuple((cur, nxt, f"{n:,}", f"{p:.3f}", f"{q:.3f}") for cur, nxt, n, p, q in b.pairs), (2, 3, 4),
                    f"Over all {b.tokens:,} {m.data.token_words}: the model's loss {b.loss:.3f} nats, the next token's entropy "
                    f"alone {b.unigram:.3f}, the text's own bigram entropy {b.bigram:.3f} (in sample: no table does better "
                    "on this text). The paper shows the same kind of table qualitatively.")


def _one_layer_tables(m: LanguageMeasurements) -> list[Table]:
    d = m.data
    rows, tables = [], []
    for t in m.tables:
        rows.append((label(0, t.head), d.token(t.source), " ".join(d.token(x) for x in t.destinations),
                     " ".join(d.token(x) for x in t.outs), t.example or f"(none in {d.text_words})"))
    tables.append(Table("skip-trigrams", "One layer: skip-trigram tables read off the weights, in the slides' form "
                        "(the destinations the QK circuit picks most for the source, the outs the OV circuit raises most)",
                        ("head", "source", "destinations", "outs", f"example from {d.text_words}"), tuple(rows)))
    trained = bool(m.bugs) and all(x.trained is not None for x in m.bugs)
    bug_rows = [(label(0, x.head), f"{d.token(x.source)} … {d.token(x.destination)} → {d.token(x.out)}", f"{x.seen}",
                 "not given" if x.trained is None else f"{x.trained}",
                 f"{x.rise:+.2f}", f"{x.other_source:+.2f}", f"{x.control:+.2f}")
                for x in sorted(m.bugs, key=lambda x: (x.known > 0, -x.rise))[:12]]
    where = "the training text" if trained else d.text_words
    tables.append(Table("bugs", f"Combinations the factored tables predict that {where} never holds "
                        "(the paper's \u201ckeep … in bay\u201d), largest rise first; then the learned ones",
                        ("head", "skip-trigram", f"in {d.text_words}", "in the training text", "rise (nats)",
                         "another source", "unpicked destination"),
                        tuple(bug_rows), (2, 3, 4, 5, 6),
                        "In the text: how often the source stands within the context before the destination and the "
                        "out follows. Rise: the out's logit after the destination with the source earlier in the "
                        "context, against the same contexts without it; then the same with another frequent word in the "
                        "source's place, and after the frequent destination the head avoids most for this source."))
    c = m.copying
    tables.append(Table("copying", "One layer: heads with \u201cmostly positive\u201d OV eigenvalues (the paper's words; "
                        "it sets no number, so ours are counted at two bars of the positivity Σλ/Σ|λ|)",
                        ("", "ours", "the paper"),
                        (("heads with positivity ≥ 0.5 (our bar)", f"{c.count()}/{len(c.positivity)}",
                          f"{PAPER_COPYING[0]}/{PAPER_COPYING[1]}"),
                         ("heads with positivity > 0", f"{sum(p > 0 for p in c.positivity)}/{len(c.positivity)}", "")),
                        (1, 2)))
    return tables


def _importance_tables(m: LanguageMeasurements) -> list[Table]:
    imp, tables = m.importance, []
    ours_gap = sum(imp.marginal(k) for k in PAPER_ORDERS)  # uniform to every term: the whole gap our terms close
    paper_gap = sum(PAPER_ORDERS.values())
    order_rows = [(k, f"{imp.terms(k)}", _nats(imp.marginal(k)), _nats(imp.marginal(k) / imp.terms(k)),
                   f"{imp.marginal(k) / ours_gap:.0%}", f"{v:+.1f}", f"{v / PAPER_TERMS[k]:+.3f}", f"{v / paper_gap:.0%}")
                  for k, v in PAPER_ORDERS.items()]  # the paper's per term: its own counts; shares: of each one's own gap
    tables.append(Table("term-importance", "Two layers: term importance by order (patterns frozen; the loss change "
                        "from adding each order's terms, nats, and as a share of the whole gap from a uniform prediction "
                        "to every term, which compares across vocabularies)",
                        ("terms", "count", "ours", "ours per term", "ours, share", "the paper", "the paper per term",
                         "the paper, share"), tuple(order_rows), (1, 2, 3, 4, 5, 6, 7),
                        f"On {imp.tokens:,} {m.data.token_words}; the direct path from a uniform prediction "
                        f"({imp.losses['uniform']:.3f} nats over our {len(m.data.strings):,} tokens; the paper's uniform is "
                        f"over about 50,000), the model itself {imp.losses['model']:.3f}. A loss in nats depends on the "
                        "vocabulary; the shares do not."))
    layers = imp.by_layer()
    layer_rows = [(LAYER_NAMES.get(row, row), col, _nats(layers[(row, col)]),
                   f"{PAPER_LAYERS[(row, col)]:+.2f}" if (row, col) in PAPER_LAYERS else "—") for row, col in layers]
    tables.append(Table("term-importance-layers", "Two layers: each layer's individual heads, added to the direct path "
                        "and added last", ("heads", "added", "ours", "the paper"),
                        tuple(layer_rows), (2, 3),
                        "The paper's second-layer heads do most of the work; the first layer's matter through the "
                        "second layer (K-composition), not on their own. \u201cAdded last\u201d is the paper's quantity: "
                        "the layer's heads added to the direct path and the other layer's heads (no virtual heads); "
                        "\u201cvirtual heads kept\u201d adds them to every other term, the virtual heads too (ours only)."))
    return tables


def _induction_table(m: LanguageMeasurements) -> Table:
    ind = m.induction
    attention = sorted(ind.attention.items(), key=lambda kv: -kv[1])[:4]
    return Table("induction", f"Induction on {ind.passages} repeated passages of {m.data.text_words}, {ind.length} tokens each: losses and "
                        f"attention are means over the {ind.passages}; the first passage: \u201c{ind.passage[:160]}…\u201d",
                        ("", "first copy", "second copy"),
                        (("two-layer model (nats)", f"{ind.first:.2f}", f"{ind.second:.2f}"),
                         (f"{ind.control} (nats)", f"{ind.control_first:.2f}", f"{ind.control_second:.2f}"))
                        + tuple((f"{who}, {r.seg_len} {r.kind} random tokens (nats)", f"{r.first:.2f}", f"{r.second:.2f}")
                                for who, rows in (("two-layer model", ind.random), ("control", ind.control_random))
                                for r in rows)
                        + tuple((f"{label(1, h)} attention to the token after the earlier occurrence", "", f"{a:.2f}")
                                for h, a in attention), (1, 2),
                        "On the second copy, the model's prediction against the text: " + "; ".join(
                            f"after \u201c…{ctx}\u201d {pred} (text: {act})" for ctx, pred, act in ind.examples[:4]))
