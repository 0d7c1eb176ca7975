"""What every catalogue entry says: one meaning per symbol, the rule each step really applies,
and no mathematics typed into plain prose."""

import re

import pytest
import sympy as sp

from tensoralg import Product, TensorSum, d_head

from derivations import catalogue
from derivations.derivation import Chain, product_rule
from derivations.render import Math

from tests.derivations.test_catalogue import IDS, VARIANTS


def segments(paragraph):
    """The segments of a paragraph (a string, or prose), with layer-numbered parts in both numberings."""
    if isinstance(paragraph, str):
        yield paragraph
        return
    for s in paragraph:
        if hasattr(s, "from0") and hasattr(s, "from1"):  # prose that depends on the numbering
            yield from s.from0
            yield from s.from1
        else:
            yield s


def prose_parts(d):
    """``(where, segment)`` for every piece of prose of a derivation."""
    yield from (("title", s) for s in segments(d.title))
    yield from (("summary", s) for s in segments(d.summary))
    for note in d.notes:
        yield from (("note", s) for s in segments(note))
    for chain in d.chains:
        if isinstance(chain.lhs, Math):
            yield "lhs", chain.lhs
        yield from (("intro", s) for s in segments(chain.intro))
        for step in chain.steps:
            yield from (("detail", s) for s in segments(step.detail))
            yield from (("text", s) for s in segments(step.text))
            for label, _ in step.groups:
                yield from (("group label", s) for s in segments(label))


def terms_of(expr):
    if isinstance(expr, TensorSum):
        return list(expr)
    return list(expr.expand())


@pytest.fixture(scope="module", params=VARIANTS, ids=IDS)
def derivation(request):
    name, params = request.param
    return catalogue.get(name, **params)


def test_every_product_step_names_the_rule_it_applies(derivation):
    for chain in derivation.chains:
        for before, step in zip(chain.steps, chain.steps[1:]):
            if step.rule.key in ("associativity", "mixed-product", "sum-out", "scalars"):
                assert step.rule.key == product_rule(before.expr, chain.sums), (derivation.name, str(before.expr))
                slots = before.expr.n_slots
                assert (slots == 1) == (step.rule.key != "mixed-product"), (derivation.name, step.rule.key, slots)


def test_plain_matrix_products_are_associativity_not_the_mixed_product_rule():
    scores = catalogue.get("attention-head").chains[1]
    assert [s.rule.key for s in scores.steps] == ["transpose", "associativity", "fold"]
    virtual = {s.rule.key for s in catalogue.get("virtual-weights").steps}
    # issue 19: M_in (Σ_m M_out^m M_in^m) M_out = Σ_m M_in M_out^m M_in^m M_out is distributivity over Σ
    assert "sum-out" in virtual and "associativity" not in virtual and "mixed-product" not in virtual
    assert "mixed-product" in {s.rule.key for s in catalogue.get("path-expansion").steps}


def test_product_rule_needs_two_slots_for_the_mixed_product():
    from tensoralg import atom, term
    assert product_rule(Product([term(atom("W_Q", "h").T), term(atom("W_K", "h"))])) == "associativity"
    assert product_rule(Product([term(atom("A", "h"), atom("W_OV", "h")), term(None, atom("W_E"))])) == "mixed-product"


def test_a_product_step_that_moves_a_sum_or_a_scalar_says_so():
    """Issue 19: "Associativity" named distributivity over Σ and a step that moved a scalar."""
    from derivations.document import SumIndex
    from tensoralg import atom, term

    W_U, W_E, W = term(atom("W_U")), term(atom("W_E")), term(atom("W_OV", "h1"))
    assert product_rule(Product([W_U, W, W_E]), [SumIndex("h1", "H_1")]) == "sum-out"
    assert product_rule(Product([W_U, W, W_E])) == "associativity"  # h1 a fixed head: nothing summed
    assert product_rule(Product([W_U, W, W_E], 3)) == "scalars"
    assert product_rule(Product([W_U, -W_E])) == "scalars"
    chain = Chain.start(None, Product([W_U, W, W_E]), "given", sums=(SumIndex("h1", "H_1"),)).expand()
    assert chain.steps[-1].rule.name == "distributivity over a sum" and "Σ_m" in chain.steps[-1].rule.statement.text


def test_scores_have_one_meaning_across_the_catalogue(derivation):
    """``S^h`` is always unscaled: a chain whose left side is a bare ``S^h`` has no 1/sqrt(d_head), one whose
    left side is ``S^h / sqrt(d_head)`` carries it on every term; every masked softmax (an attention pattern)
    divides S by sqrt(d_head)."""
    for chain in derivation.chains:
        lhs = chain.lhs.text if isinstance(chain.lhs, Math) else ""
        if not lhs.startswith("S^"):
            continue
        scaled = lhs.endswith("/ sqrt(d_head)")
        for step in chain.steps:
            for t in terms_of(step.expr):
                has_scale = d_head in sp.sympify(t.coeff).free_symbols
                assert has_scale == scaled, (derivation.name, lhs, str(t))
    for where, segment in prose_parts(derivation):
        text = segment.text if isinstance(segment, Math) else segment if isinstance(segment, str) else ""
        if "softmax*" in text and isinstance(segment, Math):
            assert "softmax*(S^h / sqrt(d_head))" in text, (derivation.name, where, text)


MATHS_IN_TEXT = re.compile(r"[A-Za-z][_^]|[ᵀ⊗≠Σ·→←↦≤≥√λσ∈‖∑∏Π≈×]|sqrt\(|softmax\*|\b[A-Za-z]\[|\b[a-z]\d?\s*[=<>]\s*\w")


def test_no_mathematics_is_typed_into_plain_prose(derivation):
    """Maths in titles, summaries, notes, intros, details and labels is a Math segment, never a plain string."""
    for where, segment in prose_parts(derivation):
        if isinstance(segment, str):
            found = MATHS_IN_TEXT.search(segment)
            assert found is None, (derivation.name, where, segment, found and found.group())


@pytest.mark.parametrize("text", ["W_O^h r^h", "M_in^J", "for h ≠ k", "(n_ctx x d_model)", "T[i,a,j,b]", "Vᵀ", "1/σ", "h = k"])
def test_the_maths_detector_catches_the_defects_of_the_issue(text):
    assert MATHS_IN_TEXT.search(text)


@pytest.mark.parametrize("text", ["the direct path", "Q-composition", "L1H0 is head 0 of layer 1", "2 layers x 2 heads", "a softmax of scores"])
def test_the_maths_detector_passes_plain_words(text):
    assert not MATHS_IN_TEXT.search(text)


def test_descriptions_give_the_pattern_its_scale():
    for name, description in catalogue.descriptions().items():
        if "softmax" in description:
            assert "/ sqrt(d_head)" in description, name


def test_the_qk_note_does_not_claim_every_k_term_is_induction():
    note = " ".join(s for s in catalogue.get("two-layer-qk").notes[-1] if isinstance(s, str))
    assert "can carry the induction mechanism" in note and "induction-mechanism" in note


@pytest.mark.parametrize("name, params", [("path-expansion", dict(biases=True, mlp=True)), ("two-layer-qk", {}),
                                          ("two-layer-logits", {})])
def test_layer_numbers_in_prose_follow_the_documents_numbering(name, params):
    d = catalogue.get(name, **params)
    zero, one = (" ".join(d.to_text(index_from=k).split()) for k in (0, 1))
    if name == "path-expansion":
        assert "output bias of layer 0" in zero and "output bias of layer 1" in one
        assert "output bias of layer 0" not in one and "b_O^L1" in one and "b_O^L0" in zero
    if name == "two-layer-qk":
        assert "entering layer 1" in zero and "entering layer 2" in one
    assert "of layer 0 and then" not in zero
