"""Term limits and sizes (issue 11): every path that can grow is counted first, with
Python ints and nothing built, and refused with a size or ``max_order`` that fits."""

from __future__ import annotations

import inspect
import itertools
import re
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from derivations.architecture import MAX_HEADS, MAX_HEADS_TOTAL, MAX_LAYERS, Architecture
from derivations.catalogue import DOCUMENT_LIMIT, ENTRIES, get
from derivations.catalogue.qk import check_pairs
from derivations.cli import build_parser, main
from derivations.errors import ArchitectureError, DerivationError, TooManyTerms
from derivations.expansion import expansion
from tensoralg import Product, identity, term
from tensoralg.atoms import Atom, atom
from tensoralg.errors import ParseError, TCircuitsError
from tensoralg.parse import parse
from tensoralg.rules import rewrite_words
from tests.conftest import FUZZ, PROPERTY, THOROUGH
from tests.helpers import quickly, run_cli as run
from tests.strategies import LAYOUTS, products


@pytest.mark.parametrize("name, params, fragment", [
    ("virtual-weights", dict(layers=18), "262,144 terms"),
    ("virtual-weights", dict(layers=1000), "2^1,000 terms"),
    ("virtual-weights", dict(layers=10_000_000), "2^10,000,000 terms"),
    ("virtual-weights", dict(layers=3, heads=100, concrete=True), "1,030,301 terms"),
    ("multi-head", dict(heads=200), "40,000 terms"),
    ("bias-folding", dict(heads=10_000), "10,001 terms"),
    ("post-norm", dict(heads=300), "90,601 terms"),  # (1 + H)² paths: 300 heads ran minutes before it counted
])
def test_catalogue_entries_count_before_building(name, params, fragment):
    with quickly(1), pytest.raises(TooManyTerms, match=re.escape(fragment)):
        get(name, **params)


def test_entries_at_their_limit_still_build():
    assert len(get("virtual-weights", layers=12).chains[0].last) == 2**12
    assert get("multi-head", heads=70).chains[0].steps
    assert get("bias-folding", heads=300).chains[0].steps


@pytest.mark.parametrize("layers, heads, fragment", [
    (10_000_000, 1, f"n_layers must be at most {MAX_LAYERS}"),
    (2, 10**9, f"at most {MAX_HEADS} heads per layer"),
    (200, 100, f"at most {MAX_HEADS_TOTAL:,} are supported"),
    (20, (1000,) * 20, f"at most {MAX_HEADS_TOTAL:,} are supported"),
])
def test_architecture_refuses_huge_models_before_building_per_layer_data(layers, heads, fragment):
    with quickly(0.5), pytest.raises(ArchitectureError, match=fragment):
        Architecture(layers, heads)


def test_deep_models_at_max_order_0_are_cheap():
    with quickly(20):
        d = get("qk-expansion", layers=MAX_LAYERS, heads=1, max_order=0)
    assert len(d.chains[-1].last) >= 1
    with quickly(20):
        get("path-expansion", layers=MAX_LAYERS, heads=1, max_order=0)


def test_a_deep_product_iterates_without_recursion():
    """The walk over a product's choices is iterative: with only 100 frames of stack left,
    a product of 400 factors (a recursive walk would need 400 frames) still iterates."""
    layer = identity(2) + term(atom("A"), atom("W_OV"))
    p = Product([layer] * 400)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 100)
    try:
        choices = list(p.iter_terms(max_order=1))
    finally:
        sys.setrecursionlimit(limit)
    assert len(choices) == 401 == p.count(max_order=1)
    assert [c.order for c in choices[:2]] == [0, 1]


@PROPERTY
@given(st.sampled_from(LAYOUTS).flatmap(products), st.one_of(st.none(), st.integers(0, 4)))
def test_order_counts_are_exact(p, max_order):
    counts = p.order_counts(max_order)
    assert sum(counts) == p.count(max_order) == sum(1 for _ in p.iter_terms(max_order))
    by_order: dict[int, int] = {}
    for c in p.iter_terms(max_order):
        by_order[c.order] = by_order.get(c.order, 0) + 1
    assert {k: n for k, n in enumerate(counts) if n} == by_order


def test_qk_pairs_are_counted_without_cubic_work():
    layer = identity(2) + term(atom("A"), atom("W_OV"))
    q = Product([layer] * 1000)
    with quickly(10), pytest.raises(TooManyTerms, match="pass max_order=1"):
        check_pairs("a deep head", q, q, 1000, None)
    with quickly(10):  # cubic work would take minutes; 10 s leaves room for a loaded machine
        check_pairs("a deep head", q, q, 1000, 1)  # 1 + 1000 + 1000 terms fit


def _old_rewrite(word, identities):
    """The rewrite before it hashed slices: rules longest first, the first that occurs applies."""
    rules = sorted(identities.items(), key=lambda kv: -len(kv[0]))
    changed = True
    while changed:
        changed = False
        for key, value in rules:
            k = len(key)
            for i in range(len(word) - k + 1):
                if word[i : i + k] == key:
                    if value is None:
                        return None
                    word = word[:i] + tuple(value) + word[i + k :]
                    changed = True
                    break
            if changed:
                break
    return word


LETTERS = [Atom(c, "d_model", "d_model") for c in "abc"]


@FUZZ
@given(st.lists(st.sampled_from(LETTERS), max_size=8).map(tuple),
       st.dictionaries(st.lists(st.sampled_from(LETTERS), min_size=2, max_size=3).map(tuple),  # shrinking rules end
                       st.one_of(st.none(), st.lists(st.sampled_from(LETTERS), max_size=1).map(tuple)), max_size=4))
def test_rewrite_words_agrees_with_the_quadratic_rewrite(word, identities):
    expected = _old_rewrite(word, identities)
    got = rewrite_words(term(word), identities)
    assert got == (term(expected) if expected is not None else term(word).scale(0))


def test_rewrite_words_is_linear_in_the_rules():
    heads = [Atom(f"e{h}", "d_model", "d_model") for h in range(300)]
    identities = {(a, b): (() if a == b else None) for a in heads for b in heads}
    expr = sum((term((a, b)) for a in heads[:50] for b in heads[:50]), start=term(()).scale(0))
    with quickly(5):
        assert len(rewrite_words(expr, identities)) == 1


# -- the CLI, in-process -----------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["derive", "virtual-weights", "--layers", "1000"],
    ["derive", "multi-head", "--heads", "200"],
    ["derive", "bias-folding", "--heads", "10000"],
    ["derive", "qk-expansion", "--layers", "1000000", "--max-order", "0"],
    ["derive", "path-expansion", "--layers", "10000000"],
    ["derive", "path-expansion", "--heads", "x"],
    ["expand", "A ⊗ W_OV · 1.5.5"],
    ["expand", "A ⊗ W_E", "--atom", "A=2,3"],
    ["expand", "V", "--atom", "V=-1,2"],
    ["nope"],
])
def test_refusals_are_one_line(capsys, argv):
    with quickly(5):
        code, out, err = run(capsys, *argv)
    lines = [line for line in err.splitlines() if "warning: command" not in line]
    assert code == 2 and "Traceback" not in err
    assert len(lines) in (1, 3), lines  # one line, or a parse error's line with the text and its caret
    assert "error" in lines[0]


def test_every_parameter_of_the_catalogue_has_an_option():
    """A parameter without a ``tcircuits derive`` option is unreachable (and once made the
    refusal of a wrong option a KeyError)."""
    from derivations.commands import OPTIONS

    missing = {(name, p) for name, e in ENTRIES.items() for p in e.params if p not in OPTIONS}
    assert not missing
    parser = build_parser()
    derive = parser._subparsers._group_actions[0].choices["derive"]
    flags = {s for action in derive._actions for s in action.option_strings}
    assert {flag for option, _ in OPTIONS.values() for flag in option.split("/")} <= flags


@THOROUGH
@given(st.sampled_from(sorted(n for n, e in ENTRIES.items() if "heads" in e.params or "layers" in e.params)),
       st.sampled_from(["--layers", "--heads", "--max-order"]),
       st.one_of(st.integers(-3, 40), st.integers(-(2**70), 2**70), st.sampled_from(["1.5", "nan", "", "1e9", "2,3"])))
def test_random_numbers_to_derive_give_a_result_or_a_clean_error(entry, flag, value):
    code = None
    # a guard against runaways, not a timing: the slowest value it draws (post-norm --heads 40, 1,681 terms
    # checked on random bindings) takes 2.6 s of CPU alone (7.1 s before the check kept its sizes), and over
    # 30 s of wall time on a 2-core machine beside two training runs
    with quickly(90):
        try:
            code = main(["derive", entry, flag, str(value)])
        except SystemExit as exit:
            code = exit.code
    assert code in (0, 2)


@pytest.mark.parametrize("entry", ["soft-caps", "alibi"])
def test_scores_of_layer_1_with_too_many_heads_are_refused_before_they_are_built(entry):
    """(1 + H)² terms: found by the hypothesis test above, --heads 883 took 24 s to build 781,456 terms."""
    with quickly(2), pytest.raises(TooManyTerms, match="781,456 terms, more than a document holds .*use at most 69 heads"):
        get(entry, heads=883)
    assert get(entry, heads=69).params == (("heads", 69),)


def test_max_order_fits_the_limit():
    assert DOCUMENT_LIMIT >= 5000
    with pytest.raises(DerivationError, match="max_order"):
        get("path-expansion", layers=12, heads=4, concrete=True)
    with pytest.raises(TCircuitsError):
        get("virtual-weights", layers=2, heads=-1)


# -- truncation inside groups ------------------------------------------------------------


def group_product(names: list[str]) -> str:
    """``((Id + A^{0})(Id + A^{1}))``: a parenthesised product of ``Id + atom`` factors."""
    return "(" + "".join(f"(Id + {n})" for n in names) + ")"


def test_max_order_truncates_inside_parenthesised_groups():
    d = expansion("((Id + A^{0})(Id + A^{1})(Id + A^{2})) ⊗ Id", max_order=1)
    assert d.chains[-1].last == parse("Id ⊗ Id + A^{0} ⊗ Id + A^{1} ⊗ Id + A^{2} ⊗ Id")
    assert d.chains[0].steps[0].rule.key == "mixed-product"  # the groups become slot-wise factors, shown


def test_twenty_four_groups_answer_at_once(capsys):
    text = group_product([f"A^{{{i}}}" for i in range(24)]) + " ⊗ Id"
    with quickly(5):
        code, out, err = run(capsys, "expand", text, "--max-order", "1")
    assert code == 0 and "A^{23} ⊗ Id" in out
    with quickly(5):
        code, out, err = run(capsys, "expand", text)  # 2^24 terms: counted, refused with an order that fits
    assert code == 2 and "16,777,216 terms" in err and "--max-order 3" in err


@PROPERTY
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3).filter(lambda sizes: max(sizes) > 1),
       st.one_of(st.none(), st.integers(0, 4)))
def test_truncation_inside_groups_keeps_exactly_the_low_order_products(sizes, max_order):
    """``(Π_i (Id + X_i)) ⊗ (Π_j (Id + Y_j)) ⊗ …`` (a product among the groups) truncated at
    order k is the sum over the sets of at most k factors of the non-identity picks, slot by
    slot."""
    slot_atoms = [[f"{'AWB'[s]}_{s}{i}" for i in range(n)] for s, n in enumerate(sizes)]
    text = " ⊗ ".join(group_product(names) for names in slot_atoms)
    got = parse(text).expand(max_order)
    picks = [(s, name) for s, names in enumerate(slot_atoms) for name in names]
    expected = []
    for k in range(len(picks) + 1 if max_order is None else min(max_order, len(picks)) + 1):
        for chosen in itertools.combinations(picks, k):
            words = [" ".join(name for s2, name in chosen if s2 == s) or "Id" for s in range(len(sizes))]
            expected.append(" ⊗ ".join(words))
    assert got == parse(" + ".join(expected))


def test_a_lazy_group_is_counted_before_the_reader_multiplies_it_out():
    huge = group_product([f"A^{{{i}}}" for i in range(20)])
    for text in (f"Σ_{{h∈H_0}} {huge} ⊗ A^h", f"({huge} ⊗ Id + A ⊗ Id)(A ⊗ W_E)"):
        with quickly(5), pytest.raises(ParseError, match="multiplies out to 1,048,57"):
            parse(text)
    with quickly(5):  # a transpose and a product of groups stay lazy
        assert parse(f"({huge} ⊗ Id)ᵀ ({huge} ⊗ Id)").count(max_order=1) == 41


def test_a_coefficient_of_300_terms_is_read_and_one_of_301_refused_before_it_is_expanded():
    """MAX_COEFFICIENT_TERMS: (2 + d_vocab)**-299 multiplies out to 300 terms, **-300 to 301."""
    from tensoralg.coefficients import MAX_COEFFICIENT_TERMS

    assert MAX_COEFFICIENT_TERMS == 300
    with quickly(30):
        assert len(parse("(2 + d_vocab)**-299 A").terms) == 1
    with quickly(5), pytest.raises(ParseError, match="multiplies out to 301 terms, more than the 300"):
        parse("(2 + d_vocab)**-300 A")
