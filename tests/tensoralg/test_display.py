"""Notebook reprs of expressions: maths from the one printer, a long sum's middle elided with its count."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

try:  # IPython comes with the notebook extra; the tests that use it skip without it
    from IPython.lib.pretty import pretty
except ImportError:
    pretty = None

from tensoralg import TensorAlgError, TensorSum, atom, parse, term, to_latex
from tensoralg.display import REPR_MAX_TERMS, elided_table, head_and_tail, latex_repr, md_text, text_repr


def _wide_sum(n: int) -> TensorSum:
    return TensorSum({((atom("A", f"h{i}"),), (atom("W_OV", f"h{i}"),)): 1 for i in range(n)})


@pytest.mark.skipif(pretty is None, reason="needs IPython (pip install ipython)")
def test_a_30k_term_sum_shows_head_and_tail_and_the_count_left_out():
    s = _wide_sum(30_000)
    left_out = 30_000 - REPR_MAX_TERMS
    latex = s._repr_latex_()
    assert len(latex) < 2_000
    assert rf"{left_out}\ \mathrm{{terms}}" in latex
    assert latex.count(r"\otimes") == REPR_MAX_TERMS
    first, last = list(s)[0], list(s)[-1]
    assert to_latex(TensorSum([first])) in latex and to_latex(TensorSum([last])) in latex
    text = pretty(s)  # what IPython shows as text/plain
    assert len(text) < 1_000 and f"({left_out} terms)" in text and text.startswith("TensorSum(")


@pytest.mark.skipif(pretty is None, reason="needs IPython (pip install ipython)")
def test_short_expressions_show_whole_through_the_printer():
    T = parse("(Id ⊗ W_U)(Id + A^h ⊗ W_OV^h)(Id ⊗ W_E)")
    assert T._repr_latex_() == "$\\displaystyle " + to_latex(T) + "$"
    assert T.expand()._repr_latex_() == "$\\displaystyle " + to_latex(T.expand()) + "$"
    assert (T + T)._repr_latex_() == "$\\displaystyle " + to_latex(T + T) + "$"
    assert pretty(T.expand()) == "TensorSum(Id ⊗ W_U W_E + A^{h} ⊗ W_U W_OV^{h} W_E)"
    assert pretty(T).startswith("Product((Id ⊗ W_U)")


def test_a_term_renders_as_maths():
    (t,) = list(term(atom("A", "h"), atom("W_OV", "h").T))
    assert t._repr_latex_() == r"$\displaystyle A^{h} \otimes W_{OV}^{h\top}$"


def test_a_lazy_product_of_long_factors_elides_each_factor():
    layer = _wide_sum(40) + term(None, None)
    shown = (layer @ layer)._repr_latex_()
    assert shown.count(rf"{41 - REPR_MAX_TERMS}\ \mathrm{{terms}}") == 2


def test_max_terms_is_checked():
    with pytest.raises(TensorAlgError, match="max_terms must be None or an int >= 2, got 1"):
        latex_repr(_wide_sum(3), max_terms=1)
    with pytest.raises(TensorAlgError, match="got True"):
        text_repr(_wide_sum(3), max_terms=True)


def test_text_in_tables_is_escaped():
    table = elided_table(["term"], [[md_text("<script>alert(1)</script>")]])
    assert "<script>" not in table and "&lt;script&gt;" in table


@given(n=st.integers(0, 60), limit=st.one_of(st.none(), st.integers(2, 20)))
def test_head_and_tail_keep_order_and_count_the_rest(n, limit):
    rows = list(range(n))
    head, n_out, tail = head_and_tail(rows, limit)
    assert head + tail == [r for r in rows if r < len(head) or r >= n - len(tail)]
    assert len(head) + n_out + len(tail) == n
    assert limit is None and n_out == 0 or len(head) + len(tail) == min(n, limit)
    table = elided_table(["x"], [[str(r)] for r in rows], limit, what="rows")
    assert (f"⋯ {n_out:,} rows left out" in table) == (n_out > 0)


def test_notebook_markdown_maths_cannot_carry_html():
    from tensoralg import parse
    from tensoralg.display import expansion_markdown, md_math

    hostile = parse("A^{<img} ⊗ W_OV")
    for markdown in (md_math(hostile), expansion_markdown("t", {"sum": hostile.expand()})):
        assert "<" not in markdown and r"\lt" in markdown


def test_one_term_is_counted_in_the_singular():
    """Issue 19: "1 terms" in an expansion's repr and its notebook Markdown."""
    from derivations import Architecture, expand_qk
    from tensoralg.display import counted, expansion_markdown

    assert counted(1, "term") == "1 term" and counted(0, "term") == "0 terms" and counted(12_345, "term") == "12,345 terms"
    expansion = expand_qk(Architecture(1, 2), 0, 1)
    assert repr(expansion).endswith(": 1 term)")
    assert "1 term:" in expansion_markdown("x", {"input": expansion.to_tensor_sum()})
