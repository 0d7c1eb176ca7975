"""The paper's findings on language (numeric_check/reports/paper/language*.py): each measurement on models
whose answer is known, and each rule able to fail on its control."""

from __future__ import annotations

import math

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.config import ModelConfig
from numeric_check.reports.paper.language import (
    Bug, Copying, LanguageData, LanguageMeasurements, bigrams, copying, induction, measure_language,
)
from numeric_check.reports.paper.language_claims import (
    copying_language, induction_language, language_findings, language_tables, skip_trigrams_language,
)
from tests.helpers import copying_model, exact_induction_model


class Letters:
    """A stand-in tokenizer: token i is the i-th string."""

    def __init__(self, strings):
        self.strings = strings

    def decode(self, ids):
        return "".join(self.strings[i] for i in ids)


def data_of(ids: torch.Tensor, v: int) -> LanguageData:
    strings = tuple(f" w{i}" for i in range(v))
    return LanguageData(Letters(strings), ids, strings, "test text")


def markov_text(v: int = 12, n: int = 6000, seed: int = 0) -> torch.Tensor:
    """A token stream whose next token depends on the current one (a random sparse bigram table)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.rand(v, v, generator=g).pow(6)
    table = table / table.sum(1, keepdim=True)
    ids = [0]
    for _ in range(n - 1):
        ids.append(int(torch.multinomial(table[ids[-1]], 1, generator=g)))
    return torch.tensor(ids)


def zero_layer(W_U: torch.Tensor) -> CircuitModel:
    v = W_U.shape[0]
    model = CircuitModel(ModelConfig(Architecture(0, 1, positional="qk_only"), d_model=v, d_head=1, d_vocab=v, n_ctx=8),
                         dtype=torch.float64, device="cpu")
    with torch.no_grad():
        model.W_E.copy_(torch.eye(v))
        model.W_U.copy_(W_U)
    return model


def test_a_zero_layer_table_of_the_texts_own_bigrams_closes_the_whole_gap_and_its_control_none():
    v = 12
    ids = markov_text(v)
    counts = torch.bincount(ids[:-1] * v + ids[1:], minlength=v * v).view(v, v).double()
    exact = zero_layer((counts / counts.sum(1, keepdim=True)).clamp(min=1e-12).log().T)  # logits[next, current]
    b = bigrams(exact, data_of(ids, v))
    assert math.isclose(b.loss, b.bigram, abs_tol=1e-6) and math.isclose(b.captured, 1.0, abs_tol=1e-5)
    assert b.agreement == pytest.approx(1.0) and b.control_captured < 0.5 and b.control_agreement < 0.5
    assert b.pairs[0][2] == int(counts.max()) and b.tokens == len(ids)
    found = language_findings(LanguageMeasurements(data_of(ids, v), {}, bigrams=b))
    assert list(found) == ["language-bigrams"] and found["language-bigrams"].verdict == "holds"
    # a table that ignores the current token (the frequencies alone) fails the same rules: it learned no bigram
    frequencies = zero_layer((counts.sum(0) / counts.sum()).log()[:, None].expand(v, v).clone())
    flat = bigrams(frequencies, data_of(ids, v))
    assert flat.captured == pytest.approx(0.0, abs=1e-6)
    assert language_findings(LanguageMeasurements(data_of(ids, v), {}, bigrams=flat))["language-bigrams"].verdict == \
        "does not hold"


def test_copying_heads_copy_and_their_permuted_outputs_do_not():
    c = copying(copying_model())
    assert c.positivity == (pytest.approx(1.0),) and c.count() == 1 and c.count(control=True) == 0
    assert copying_language(LanguageMeasurements(None, {}, copying=c)).verdict == "holds"
    negative = Copying((-0.4, 0.9, -0.2), (0.0, 0.1, -0.1))  # one of three copies: not most
    assert copying_language(LanguageMeasurements(None, {}, copying=negative)).verdict == "does not hold"
    # a control that passes too: the part cannot tell them apart, so it does not hold
    assert copying_language(LanguageMeasurements(None, {}, copying=Copying((0.9, 0.8), (0.9, 0.7)))).verdict == \
        "does not hold"


def _bug(seen: int, rise: float, other: float, control: float, trained: int | None = None) -> Bug:
    return Bug(0, 1, 2, 3, seen, rise, other, control, trained)


@pytest.mark.parametrize("bugs, verdicts", [
    ([_bug(2, 1.0, 0.0, 0.1), _bug(0, 0.8, 0.0, 0.1)], ["holds", "holds"]),
    ([_bug(2, 1.0, 0.0, 0.1), _bug(0, 0.2, 0.0, 0.1)], ["holds", "does not hold"]),  # unseen pairs barely rise
    ([_bug(2, 1.0, 0.6, 0.1), _bug(0, 0.8, 0.0, 0.1)], ["does not hold", "holds"]),  # any source raises the out almost as much
    ([_bug(2, 1.0, 0.2, 0.1), _bug(0, 0.8, 0.0, 0.1)], ["holds", "holds"]),  # another source a little: the source matters most
    ([_bug(2, 1.0, 0.0, 0.7), _bug(0, 0.8, 0.0, 0.7)], ["holds", "does not hold"]),  # any destination does
    ([_bug(0, 1.0, 0.0, 0.1)], ["does not hold", "does not hold"]),  # nothing the text holds to compare with
])
def test_the_skip_trigram_rules_fail_on_their_controls(bugs, verdicts):
    f = skip_trigrams_language(LanguageMeasurements(None, {}, bugs=tuple(bugs)))
    assert [p.verdict for p in f.parts] == verdicts


def test_a_combination_the_training_text_holds_is_learned_not_a_bug():
    # absent from the measured text, present in the training text: it joins the learned ones, and with it gone
    # there is no bug left to judge (the whole training text decides, not the held-out part)
    bugs = (_bug(2, 1.0, 0.0, 0.1, trained=40), _bug(0, 0.8, 0.0, 0.1, trained=3))
    f = skip_trigrams_language(LanguageMeasurements(None, {}, bugs=bugs))
    assert [p.verdict for p in f.parts] == ["holds", "does not hold"]
    assert "2 combinations in the training text" in f.parts[0].measured
    assert "both in the training text and not" in f.parts[1].measured
    never = (_bug(2, 1.0, 0.0, 0.1, trained=40), _bug(0, 0.8, 0.0, 0.1, trained=0))
    f = skip_trigrams_language(LanguageMeasurements(None, {}, bugs=never))
    assert [p.verdict for p in f.parts] == ["holds", "holds"] and "1 combinations never in the training text:" in \
        f.parts[1].measured
    # without the training text the page says the bugs may be learned
    assert "was not given" in skip_trigrams_language(LanguageMeasurements(None, {}, bugs=bugs[:1] + (_bug(0, 0.8, 0.0, 0.1),))
                                                     ).parts[1].measured


@pytest.mark.parametrize("ids, expected", [
    ([5, 1, 2, 3, 9, 9, 2, 3], (1, 2)),  # the source 5 stands 2 tokens before the first "2 3", 6 before the second
    ([1, 2, 3, 5, 2, 3], (1, 4)),  # a source after the destination does not count
    ([2, 3, 2, 3], (0, None)),
])
def test_occurrences_count_destinations_with_the_source_within_the_window_before(ids, expected):
    from numeric_check.reports.paper.language import _occurrences

    assert _occurrences(torch.tensor(ids), 5, 2, 3, window=4) == expected


def test_the_shipped_training_text_is_the_one_the_records_name():
    import json

    from numeric_check.reports.paper.language import language_checkpoint, shipped_training_text

    record = json.loads(language_checkpoint(2).with_suffix(".json").read_text())
    text = shipped_training_text(record)
    assert len(text.splitlines()) == 32_290 and text.startswith("In the beginning God created")
    with pytest.raises(RuntimeError, match="make corpus"):
        shipped_training_text({"text": {"sha256": "0" * 64}})


def test_induction_on_a_repeated_passage_finds_the_induction_head_and_not_in_a_one_layer_model():
    model, control = exact_induction_model(d_vocab=48, n_ctx=24), copying_model(d_vocab=48, n_ctx=24)
    g = torch.Generator().manual_seed(0)
    data = data_of(torch.randperm(48, generator=g).repeat(20)[torch.randperm(960, generator=g)], 48)
    ind = induction(model, control, data, length=12, passages=4)
    assert ind.second < 0.1 * ind.first and ind.attention[0] > 0.8  # a token recurs within the passage: not 1
    assert ind.control_second > 0.5 * ind.control_first and max(ind.control_attention.values()) < 0.4
    assert [p.verdict for p in induction_language(LanguageMeasurements(data, {}, induction=ind)).parts] == ["holds"] * 3
    # arbitrary tokens: uniform and the text's frequent ones, each far cheaper on the second copy, the control's not
    assert [r.kind for r in ind.random] == ["uniform", "frequent"] and all(r.drop > 3 for r in ind.random)
    assert all(r.drop < 1 for r in ind.control_random)
    # the two-layer model as its own control: the rule holds there too, so the part cannot hold
    same = induction(model, model, data, length=12, passages=4)
    assert [p.verdict for p in induction_language(LanguageMeasurements(data, {}, induction=same)).parts] == [
        "does not hold"] * 3  # the attention part's control is measured too, not assumed to fail


def test_measure_language_measures_only_the_models_given_and_the_page_shows_only_those():
    v = 12
    data = data_of(markov_text(v), v)
    m = measure_language({0: zero_layer(torch.randn(v, v, generator=torch.Generator().manual_seed(1)))}, {0: None}, data)
    assert m.bigrams is not None and m.copying is None and m.importance is None and m.induction is None
    assert list(language_findings(m)) == ["language-bigrams"]
    assert [t.key for t in language_tables(m)] == ["bigrams"]


def test_added_last_is_the_papers_quantity_and_the_paper_per_term_uses_the_papers_counts():
    """Issue 45: "added last" as the paper adds a layer (to the direct path and the other layer's heads, no virtual
    heads) — the shipped model's -0.218 and -1.840, not -0.112 and -1.277 — and the paper per term divided by the
    paper's own term counts (5.2 / 24), whatever the measured model's heads."""
    from numeric_check.reports.paper.language import Importance
    from numeric_check.reports.paper.language_claims import _importance_tables

    losses = {"uniform": 7.0, "direct": 5.0, "direct+L1": 4.8, "direct+L2": 3.5, "order 1": 3.2, "order 2": 3.0,
              "order 2 - L1": 3.1, "order 2 - L2": 4.4, "model": 3.0}
    imp = Importance(losses, unigram=6.0, shuffled=dict(losses), tokens=100, heads_per_layer=(4, 4))
    layers = imp.by_layer()
    assert layers[("layer 1", "added last")] == pytest.approx(3.2 - 3.5)
    assert layers[("layer 2", "added last")] == pytest.approx(3.2 - 4.8)
    assert layers[("layer 1", "added last, virtual heads kept")] == pytest.approx(3.0 - 3.1)

    class M:  # what _importance_tables reads
        importance = imp
        data = data_of(torch.arange(10), 10)

    orders, by_layer = _importance_tables(M())
    # rows named by position, whatever the numbering (the paper's layer 1 is the page's layer 0 by default)
    assert [r[0] for r in by_layer.rows] == ["first layer"] * 3 + ["second layer"] * 3 + ["both layers"]
    heads = next(r for r in orders.rows if r[0] == "individual heads")
    assert heads[6] == f"{-5.2 / 24:+.3f}"  # not -5.2 / 8
    assert heads[7] == "71%" and heads[4] == f"{(3.2 - 5.0) / (3.0 - 7.0):.0%}"  # shares of each one's own gap


def test_the_induction_caption_says_its_losses_are_means_over_every_passage():
    model, control = exact_induction_model(), copying_model()
    ids = torch.randint(0, 48, (2000,), generator=torch.Generator().manual_seed(0))
    ind = induction(model, control, data_of(ids, 48), length=10, passages=8)
    assert ind.passages == 8
    from numeric_check.reports.paper.language_claims import _induction_table

    class M:
        induction = ind
        data = data_of(ids, 48)

    caption = _induction_table(M()).caption
    assert "8 repeated passages of the held-out text" in caption and "means over the 8" in caption
