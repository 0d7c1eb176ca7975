"""Jupyter's HTML: MathML from the one printer for expressions, sums (head and tail, one summand
a line), derivations and checks."""

from __future__ import annotations

from derivations import catalogue
from derivations.checking import identity_document
from derivations.html import mathml
from tensoralg import Atom, TensorSum, atom, check, parse, term, to_latex


def test_a_sum_shows_one_summand_a_line_with_head_and_tail():
    s = sum(term(atom("A", f"h{i}"), atom("W_OV", f"h{i}")) for i in range(50))
    html = s._repr_html_()
    assert html.count("<div style=") == 17 and html.count("<math") == 17  # 16 terms and the gap
    assert "48" not in html.split("<math")[9] and "34" in html  # the count of the 34 left out
    first = to_latex(term(atom("A", "h0"), atom("W_OV", "h0")))
    assert mathml(first) in html  # the same MathML as --format html


def test_a_product_shows_a_factor_a_line_and_keeps_its_sums():
    e = parse("(Id ⊗ W_U)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id ⊗ W_E)")
    html = e._repr_html_()
    assert html.count("<math") == 3 and "&#8721;" in html  # Σ
    assert "&#8721;" in e.expand()._repr_html_()


def test_a_hostile_name_cannot_become_a_tag():
    shown = term(Atom("x<script>", 2, 2, "<b>"))._repr_html_()
    assert "<script" not in shown and "<b>" not in shown and "<mo>&#60;</mo>" in shown
    assert TensorSum([], n_slots=1)._repr_html_().count("<math") == 1  # the zero sum


def test_derivations_and_checks_show_html():
    d = catalogue.get("two-layer-logits")
    html = d._repr_html_()
    assert html.startswith('<div class="tcircuits-derivation">') and "<math" in html and "<html" not in html
    doc, _ = identity_document("(XY)^T = X^T Y^T")
    assert "does not hold" in doc._repr_html_()
    r = check("(XY)^T = X^T Y^T")
    assert "LHS - RHS" in r._repr_html_() and "<math" in r._repr_html_() and "<code>X = [[" in r._repr_html_()
