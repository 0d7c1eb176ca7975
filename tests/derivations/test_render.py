"""Documents: golden LaTeX, escaping of hostile strings, layout (Σ, line breaks, elision), formats."""

import json
import re

import pytest

from derivations import catalogue
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from tensoralg import Atom, TensorSum, atom, d_head, d_model, identity, term

from tensoralg.escape import UnsafeLatex

from derivations.derivation import Chain, Derivation
from derivations.errors import DerivationError
from tests.conftest import FUZZ, THOROUGH, needs_pdflatex
from tests.strategies import any_expression
from derivations.render import (
    Layout,
    Math,
    SumIndex,
    check_math,
    escape_latex,
    escape_markdown,
    expr_pieces,
    latex_body,
    latex_document,
    pack,
    prose,
    text_width,
)

A0, W0 = atom("A", "h0"), atom("W_OV", "h0")
H0 = SumIndex("h0", Math("H_0", "H_0"))


def one_layer(**kw) -> Derivation:
    p = term(None, atom("W_U")) @ (identity(2) + term(A0, W0)) @ term(None, atom("W_E"))
    chain = Chain.start(Math("T", "T"), p, sums=[H0]).expand()
    return Derivation("one", kw.get("title", "One layer"), kw.get("summary", "Paths."), (chain,),
                      notes=kw.get("notes", ()))


# -- golden output ----------------------------------------------------------------------------

GOLDEN_LATEX = r"""Paths.

\begin{align*}
T &= \left(\mathrm{Id} \otimes W_{U}\right) \left(\mathrm{Id} \otimes \mathrm{Id} + \sum_{h_0 \in H_{0}} A^{h_0} \otimes W_{OV}^{h_0}\right) \left(\mathrm{Id} \otimes W_{E}\right)
\intertext{Distributivity: $X(Y + Z)W = XYW + XZW, \quad X \, \mathrm{Id} \, W = XW$.}
&= \left(\mathrm{Id} \otimes W_{U}\right) \left(\mathrm{Id} \otimes W_{E}\right) \\
&\quad + \left(\mathrm{Id} \otimes W_{U}\right) \left(\sum_{h_0 \in H_{0}} A^{h_0} \otimes W_{OV}^{h_0}\right) \left(\mathrm{Id} \otimes W_{E}\right)
\intertext{Mixed-product rule: $(A \otimes B)(C \otimes D) = (AC) \otimes (BD)$.}
&= \mathrm{Id} \otimes W_{U} W_{E} + \sum_{h_0 \in H_{0}} A^{h_0} \otimes W_{U} W_{OV}^{h_0} W_{E}
\end{align*}
"""

GOLDEN_TEXT = """One layer
=========

Paths.

T = (Id ⊗ W_U) (Id ⊗ Id + Σ_{h0∈H_0} A^{h0} ⊗ W_OV^{h0}) (Id ⊗ W_E)
    [Distributivity: X(Y + Z)W = XYW + XZW,  X Id W = XW.]
  = (Id ⊗ W_U) (Id ⊗ W_E)
      + (Id ⊗ W_U) (Σ_{h0∈H_0} A^{h0} ⊗ W_OV^{h0}) (Id ⊗ W_E)
    [Mixed-product rule: (A ⊗ B)(C ⊗ D) = (AC) ⊗ (BD).]
  = Id ⊗ W_U W_E + Σ_{h0∈H_0} A^{h0} ⊗ W_U W_OV^{h0} W_E
"""


def test_golden_latex_of_a_one_layer_expansion():
    assert "\n".join(latex_body(one_layer(), Layout(width=50))) == GOLDEN_LATEX


def test_golden_text_of_a_one_layer_expansion():
    assert one_layer().to_text() == GOLDEN_TEXT


def test_golden_pieces_of_a_sum_with_signs_and_coefficients():
    s = term(A0, W0, coeff=-2) + term(None, atom("W_QK", "h"), coeff=1 / sp.sqrt(d_head))
    pieces = expr_pieces(s, Layout())
    assert [p.latex for p in pieces] == [r"\frac{1}{\sqrt{d_{head}}} \mathrm{Id} \otimes W_{QK}^{h}",
                                         r"- 2 A^{h_0} \otimes W_{OV}^{h_0}"]
    assert [p.text for p in pieces] == ["1/sqrt(d_head)·Id ⊗ W_QK^{h}", "- 2·A^{h0} ⊗ W_OV^{h0}"]


def test_a_negative_first_term_and_a_scaled_product():
    pieces = expr_pieces(-1 * term(A0, W0), Layout())
    assert pieces[0].latex == r"-A^{h_0} \otimes W_{OV}^{h_0}"
    p = (term(A0, None) @ term(None, W0)).scale(sp.Rational(-1, 2))
    assert expr_pieces(p, Layout())[0].latex == r"-\frac{1}{2} \left(A^{h_0} \otimes \mathrm{Id}\right)"


def test_markdown_uses_display_math_and_states_each_rule():
    md = one_layer().to_markdown()
    assert md.startswith("# One layer\n")
    assert md.count("$$") == 6 and md.count(r"\begin{aligned}") == 3
    assert "Mixed-product rule: $(A \\otimes B)(C \\otimes D) = (AC) \\otimes (BD)$." in md


def test_json_has_every_step_in_full():
    d = one_layer()
    data = json.loads(d.to_json())
    steps = data["chains"][0]["steps"]
    assert [s["rule"] for s in steps] == ["definition", "distributivity", "mixed-product"]
    assert steps[-1]["expr"]["n_terms"] == 2 and steps[-1]["expr"]["kind"] == "TensorSum"
    assert steps[-1]["expr"]["text"] == "Id ⊗ W_U W_E + Σ_{h0∈H_0} A^{h0} ⊗ W_U W_OV^{h0} W_E"
    assert steps[1]["statement"]["text"] == "X(Y + Z)W = XYW + XZW,  X Id W = XW"
    assert data["chains"][0]["sums"] == [{"index": "h0", "over": {"latex": "H_{0}", "text": "H_0"}}]


# -- layout -------------------------------------------------------------------------------------


def long_sum(n):
    return sum((term(atom("A", f"L0H{i}"), (atom("W_U"), atom("W_OV", f"L0H{i}"), atom("W_E"))) for i in range(n)),
               start=identity(2) @ term(None, (atom("W_U"), atom("W_E"))))


def test_long_sums_break_into_lines_that_fit():
    pieces = expr_pieces(long_sum(12).expand(), Layout(max_terms=None))
    lines = pack(pieces, 50)
    assert len(lines) > 3
    for line in lines:
        assert len(line) == 1 or sum(p.width + 1 for p in line) <= 50


def test_long_sums_are_elided_in_documents_but_never_in_json():
    s = long_sum(30).expand()
    pieces = expr_pieces(s, Layout(max_terms=10))
    assert len(pieces) == 11 and pieces[5].text == "+ ⋯ (21 terms)"
    d = Derivation("x", "x", "", (Chain.start(None, s),))
    assert r"\underbrace{\cdots}_{21\ \mathrm{terms}}" in d.to_latex(max_terms=10)
    assert r"\cdots" not in d.to_latex(max_terms=None)
    assert json.loads(d.to_json())["chains"][0]["steps"][0]["expr"]["text"].count("⊗") == 31


def test_a_term_that_fits_a_line_is_never_split():
    # regression: a term broke after a tensor sign (A^{q0} ⊗ A^{k0} ⊗ / newline) when it fit a line
    word = tuple(atom("W_OV", f"h{i}") for i in range(4))
    wide = term(word, word, word)
    assert len(expr_pieces(wide, Layout(width=60))) == 1
    rows = pack(expr_pieces(term(W0, W0, W0) + wide, Layout(width=60)), 60)
    assert [len(r) for r in rows] == [1, 1]


def test_a_term_wider_than_a_whole_line_breaks_only_after_a_tensor_sign():
    word = tuple(atom("W_OV", f"L{i}H0") for i in range(12))
    pieces = expr_pieces(term(word, word, word), Layout(width=30))
    assert len(pieces) == 3 and pieces[0].latex.endswith(r"\otimes") and not pieces[1].starts


def test_a_long_sum_puts_each_summand_on_its_own_line():
    pieces = expr_pieces(long_sum(5).expand(), Layout(max_terms=None))
    rows = pack(pieces, 50)
    assert [len(r) for r in rows] == [1] * 6
    assert pack(expr_pieces(identity(2) + term(A0, W0), Layout()), 50) == [expr_pieces(identity(2) + term(A0, W0), Layout())]


def test_a_distributivity_step_keeps_each_bracketed_factor_whole():
    layers = [identity(2) + sum((term(atom("A", f"L{l}H{h}"), atom("W_OV", f"L{l}H{h}")) for h in range(2)), start=identity(2) * 0)
              for l in range(2)]
    p = term(None, atom("W_U")) @ layers[1] @ layers[0] @ term(None, atom("W_E"))
    rows = pack(expr_pieces(p, Layout(width=60)), 60)
    for row in rows:
        for piece in row:
            assert piece.latex.count(r"\left(") == piece.latex.count(r"\right)")  # no factor split across lines
    assert len(rows) > 1


def test_index_from_one_numbers_layers_as_the_paper():
    d = one_layer()
    assert r"\sum_{h_1 \in H_{1}}" in d.to_latex(index_from=1) and "h_0" not in d.to_latex(index_from=1)
    assert "Σ_{h1∈H_1}" in d.to_text(index_from=1)
    assert "H_{1}" in d.to_markdown(index_from=1)
    data = json.loads(d.to_json(index_from=1))
    assert data["index_from"] == 1 and "A^{h1}" in data["chains"][0]["steps"][-1]["expr"]["text"]
    labelled = Derivation("x", "x", "", (Chain.start(None, term(atom("A", "L0H3"), atom("W_OV", "L0H3"))),))
    assert r"\mathrm{L1H3}" in labelled.to_latex(index_from=1) and "L0H3" in labelled.to_latex()
    with pytest.raises(DerivationError, match="index_from"):
        d.to_latex(index_from=2)


def test_maths_in_prose_goes_through_the_printer():
    from derivations.document import math

    d = one_layer(summary=("The summary uses ", math("W_O^h r^h"), "."),
                  notes=[("For ", math("e_hᵀ e_k = 0"), " when h ≠ k; σ is a scale")])
    latex = d.to_latex()
    assert r"$W_{O}^{h} r^{h}$" in latex and r"W\_O" not in latex
    assert r"h $\neq$ k" in latex and r"$\sigma$ is a scale" in latex
    assert "W_O^h r^h" in d.to_text() and "h ≠ k" in d.to_text()


def test_layout_options_are_checked():
    with pytest.raises(DerivationError, match="max_terms"):
        one_layer().to_latex(max_terms=1)
    with pytest.raises(DerivationError, match="unknown layout options"):
        one_layer().to_markdown(colour="red")


def test_text_width_counts_scripts_small_and_markers_not_at_all():
    assert text_width("A^{h0}") == pytest.approx(1 + 2 * 0.6)
    assert text_width("W_OV") == pytest.approx(1 + 0.6 + 1)
    assert text_width("{}") == 0


# -- escaping ---------------------------------------------------------------------------------

HOSTILE = [
    r"\input{/etc/passwd}",
    r"\write18{touch /tmp/pwned}",
    r"\immediate\write18{id}",
    "^^5cinput{/etc/passwd}",
    r"$\input{x}$ & # % ~ _ ^ { } < > |",
    r"\def\x{1}\x \catcode`\@=11 \end{document}",
    "line one\n\nline two\ttab",
    "héllo ☃ ⊗ Σ λ 𝟙",
]


# Commands that only print a character (text mode); with the maths allow-list, all escaping may produce.
TEXT_PRINTING = {"textbackslash", "textasciicircum", "textasciitilde", "textless", "textgreater", "textbar",
                 "textbullet", "ldots", "S", "P", "copyright", "pounds", "ss", "ae", "AE", "o", "O", "aa", "AA",
                 "oe", "OE", "l", "L", "i", "j", "c", "v", "u", "r", "k", "H", "mathrm", "mathbf"}


def _inert(escaped: str, text: str) -> None:
    from tensoralg.escape import SAFE_COMMANDS

    commands = set(re.findall(r"\\([A-Za-z]+)", escaped))
    assert commands <= TEXT_PRINTING | SAFE_COMMANDS, commands
    assert not commands & {"input", "write", "def", "catcode", "immediate", "include", "openout", "end", "begin"}
    assert "^^" not in escaped and "\n" not in escaped
    assert not re.search(r"(?<!\\)[#%&_^]", re.sub(r"\$[^$]*\$", "", escaped))
    assert escaped.replace(r"\~{", "").count("~") == text.count("\xa0")  # a tie only for a no-break space


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_text_contains_no_commands_but_printing_ones(text):
    _inert(escape_latex(text), text)


@given(st.text(max_size=40))
@FUZZ
def test_escaping_any_text_leaves_only_inert_commands(text):
    _inert(escape_latex(text), text)


def test_markdown_escaping_stops_emphasis_links_html_and_math():
    assert escape_markdown("*a* _b_ [c](d) <script> $x$") == r"\*a\* \_b\_ \[c\](d) &lt;script&gt; \$x\$"


@pytest.mark.parametrize("bad, problem", [
    (r"A \input{x}", r"\\input"),
    (r"A^{h} \write18{x}", r"\\write"),
    ("A^^5cinput", "'\\^\\^'"),
    ("A % comment", "'%'"),
    ("A & B", "'&'"),
    ("A # B", "'#'"),
    ("A $ B", r"'\$'"),
    ("A^{h", "unbalanced"),
    (r"\begin{verbatim}x\end{verbatim}", "environment"),
    ("A \\\\ B", r"control symbol \\\\"),
])
def test_check_math_refuses_anything_but_printing(bad, problem):
    with pytest.raises(UnsafeLatex, match=problem):
        check_math(bad)


def test_check_math_accepts_what_the_printer_makes_of_hostile_atom_names():
    from tensoralg import to_latex

    for name in HOSTILE[:6]:
        hostile = Atom(name, d_model, d_model, "^^5c{x}")
        assert check_math(to_latex(term(hostile))) == to_latex(term(hostile))


def hostile_document() -> str:
    hostile_atom = Atom(r"\input{/etc/passwd}^^5cwrite18", d_model, d_model, r"\write18{id}")
    chain = Chain.start(Math("T", "T"), term(A0, hostile_atom) @ term(None, atom("W_OV", "%#&")),
                        detail=HOSTILE[1], intro=prose(*HOSTILE)).expand()
    d = Derivation(HOSTILE[0], " ".join(HOSTILE[:4]), HOSTILE[4], (chain,), notes=HOSTILE[5:])
    return d.to_latex()


def test_hostile_strings_never_reach_the_document_as_commands():
    document = hostile_document()
    comments = [line for line in document.splitlines() if line.startswith("%")]
    assert len(comments) == 1  # the name's newline did not end the comment line
    document = "\n".join(line for line in document.splitlines() if not line.startswith("%"))
    for forbidden in (r"\input{", r"\write18", r"\immediate", "^^5c", r"\def\x", r"\catcode"):
        assert forbidden not in document
    assert document.count(r"\end{document}") == 1


@needs_pdflatex
def test_a_document_full_of_hostile_strings_compiles(tmp_path):
    from derivations.commands import compile_latex

    pdf, log = compile_latex(hostile_document())
    assert pdf.startswith(b"%PDF")
    assert "/etc/passwd" not in log.split("(./derivation.tex")[-1].split(")")[0]
    assert "runsystem" not in log


# -- properties of the layout -------------------------------------------------------------------


@given(any_expression(), st.sampled_from([20, 40, 64]), st.sampled_from([None, 3, 5]))
@THOROUGH
def test_layout_signs_terms_and_brackets_for_any_expression(expr, width, max_terms):
    layout = Layout(max_terms=max_terms, width=width)
    pieces = expr_pieces(expr, layout)
    latex = " ".join(p.latex for p in pieces)
    text = " ".join(p.text for p in pieces)
    for bad in ("+ -", "- -", "+ +"):
        assert bad not in latex and bad not in text
    assert latex.count(r"\left(") == latex.count(r"\right)")
    for row in pack(pieces, width):
        check_math(" ".join(p.latex for p in row))
    if max_terms is None and isinstance(expr, TensorSum) and len(expr):
        # every term starts exactly one summand: nothing elided, nothing split across summands
        assert sum(p.starts for p in pieces) == len(expr)


def test_regroup_labels_and_details_may_carry_formulae():
    from derivations.document import math

    chain = Chain.start(Math("T", "T"), identity(2) + term(A0, W0), sums=[H0])
    chain = chain.regroup([(("through ", math("W_OV^h")), term(A0, W0)), ("direct", identity(2))],
                          detail=("by ", math("h ≠ k")))
    d = Derivation("g", "Groups", "", (chain,))
    latex, text = d.to_latex(), d.to_text()
    assert r"\text{[through $W_{OV}^{h}$]}" in latex and r"$h \neq k$" in latex
    assert "[through W_OV^h]" in text and "h ≠ k" in text


@pytest.mark.parametrize("fmt, check, summary", [
    ("text", "] ✓", "Checked numerically on random bindings: every line equals the first"),
    ("markdown", ". ✓", "*Checked numerically on random bindings: every line equals the first"),
    ("latex", r"\hfill $\checkmark$}", r"\emph{Checked numerically on random bindings: every line equals the first ($\checkmark$"),
])
def test_derive_marks_each_lines_numerical_check_in_every_format(fmt, check, summary):
    from derivations.commands import render as render_document

    document = render_document(catalogue.get("two-layer-logits", heads=2), fmt, 40)
    assert summary in document
    assert document.count(check) == len(catalogue.get("two-layer-logits", heads=2).steps) - 1  # all but the first line


def test_a_line_that_fails_its_check_is_marked_with_its_error():
    from derivations.numeric import Verification
    from derivations.render import text as render_text

    d = catalogue.get("zero-layer")
    failing = Verification(tuple((ci, si, 0.5 if si == 1 else 0.0) for ci, c in enumerate(d.chains)
                                 for si in range(len(c.steps))), 1e-9)
    out = " ".join(render_text(d, verification=failing).split())
    assert "SOME LINES DIFFER from the first (✗ beside them)" in out and "✗ (relative error 5.0e-01)" in out
