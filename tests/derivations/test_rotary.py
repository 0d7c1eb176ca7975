"""The catalogue entry ``rotary``: every line checked on a real rotary head, the named
operator standing for exactly the written-out terms, Q-/K-composition through it, one
operator in what is printed, and bad parameters refused."""

from __future__ import annotations

import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from tests.conftest import HEAVY

from tensoralg import atom, d_head, term, to_latex
from tensoralg.expr import TensorSum, Term
from tensoralg.rotary import expand_rotary, is_rotary, rotary_atom

from derivations.architecture import Architecture
from derivations.catalogue import get
from derivations.derivation import Chain, Derivation
from derivations.errors import DerivationError, TooManyTerms
from derivations.qk import expand_qk


@HEAVY
@given(st.integers(1, 3), st.booleans(), st.integers(1, 3), st.sampled_from(["neox", "gptj"]))
def test_every_line_checks_on_a_real_rotary_head(frequencies, partial, heads, style):
    d = get("rotary", frequencies=frequencies, partial=partial, heads=heads, style=style)
    assert d.verify().ok
    rotated, pairs, named, composition = d.chains
    assert len(pairs.first) == (2 * frequencies + partial) ** 2
    assert len(pairs.last) == len(named.last) == 4 * frequencies + partial
    # the named operator stands for exactly the written-out terms
    assert named.lhs == term(None, None, (atom("W_Q", "h").T, rotary_atom("h"), atom("W_K", "h")), coeff=1 / sp.sqrt(d_head))
    assert expand_rotary(named.lhs, frequencies, partial) == pairs.last == named.last
    # a later head: the terms of derivations.expand_qk, one operator each, grouped by composition
    arch = Architecture(2, (heads, 1), rotary=1.0)
    assert composition.last.expand() == expand_qk(arch, 1, 0).to_tensor_sum()
    assert all(sum(map(is_rotary, t.words[2])) == 1 for t in composition.last.expand())
    assert [label for label, _ in composition.steps[-1].groups] == ["direct", "Q-composition", "K-composition",
                                                                    "QK-composition"]


def test_the_check_catches_a_wrong_block_rule():
    """The bindings are a real rotary head: a sign error in J^{f}ᵀ J^{f} = C^{f} is caught."""
    d = get("rotary", frequencies=1)
    pairs = d.chains[1]

    def wrong(expr):
        return TensorSum([Term(-t.coeff if any(a.name == "C" for a in t.words[2]) else t.coeff, t.words)
                          for t in expr])

    broken = Derivation("broken", "broken", "a wrong sign", (pairs.apply(wrong, "regroup"),), numeric=d.numeric)
    assert not broken.verify().ok


def test_one_operator_is_printed_for_any_head_size():
    d = get("rotary", frequencies=3, partial=True)
    latex, text = to_latex(d.chains[2].lhs), d.to_text()
    assert latex.count("R^{h}") == 1 and "D_{cos}" not in latex
    composition = d.chains[3].last.expand()
    printed = to_latex(composition)
    assert printed.count("R^{") == len(composition) and "C^{" not in printed
    assert "R^{L1H0}" in text and "SwiGLU" in text


@pytest.mark.parametrize("params, error, message", [
    ({"frequencies": 0}, DerivationError, "frequencies must be an integer >= 1, got 0"),
    ({"partial": 1}, DerivationError, "partial must be True or False, got 1"),
    ({"heads": 0}, DerivationError, "heads must be an integer >= 1"),
    ({"style": "llama"}, DerivationError, "unknown rotary style 'llama'; expected one of 'neox', 'gptj'"),
    ({"frequencies": 40}, TooManyTerms, "rotary with 40 frequencies has 6,400 terms"),
    ({"heads": 80}, TooManyTerms, "rotary with 80 earlier heads has 6,561 terms"),
])
def test_bad_parameters_say_what_was_wrong(params, error, message):
    with pytest.raises(error, match=message):
        get("rotary", **params)


def test_the_chains_read_in_order():
    d = get("rotary")
    assert [s.rule.key for c in d.chains for s in c.steps] == [
        "definition", "distributivity", "mixed-product", "bilinear", "plane-blocks", "rotary-operator",
        "bilinear", "regroup"]
    assert isinstance(d.chains[2], Chain) and d.chains[2].lhs is not None
