"""HTML pages of derivations: MathML from the printer, escaped text, folding, verification, the CLI."""

import html
import re

import pytest
from hypothesis import given

from derivations import catalogue
from derivations.cli import main
from derivations.derivation import Chain, Derivation, Verification
from derivations.document import math, prose
from derivations.html import FOLD_ROWS, HtmlError, html_document, mathml, page, prose_html
from tensoralg import atom, identity, term
from tensoralg.escape import UnsafeLatex, escape_text
from tests.strategies import markup_text

MATH = re.compile(r"<math\b.*?</math>", re.DOTALL)


def math_texts(document: str) -> list[str]:
    """The text a reader sees in each <math> element (tags removed, references decoded)."""
    return [html.unescape(re.sub(r"<[^>]+>", "", m)) for m in MATH.findall(document)]


def tags(document: str) -> set[str]:
    return {t.lower() for t in re.findall(r"<([A-Za-z][\w-]*)", document)}


@pytest.mark.parametrize("index_from", [0, 1])
@pytest.mark.parametrize("name", catalogue.names())
def test_every_catalogue_entry_converts_to_mathml(name, index_from):
    document = html_document(catalogue.get(name), index_from=index_from, verification=None)
    texts = math_texts(document)
    assert texts, name
    for text in texts:
        assert "\\" not in text, (name, text)  # no LaTeX command left unconverted
    assert "<merror" not in document
    assert "<script" not in document and "<link" not in document
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", document)  # no network


def test_printer_constructs_convert():
    latex = (r"\left( A \right) \Bigl( B + C \Bigr) \underbrace{A B}_{x} \mathrm{Id} W^{\top} \otimes "
             r"\begin{bmatrix} 1 & 0 \\ 0 & 1 \end{bmatrix} \sum_{h \in H_{0}} \frac{1}{\sqrt{d_{head}}}")
    out = mathml(latex, check=False)
    text = math_texts(out)[0]
    assert "\\" not in text and "⊗" in text and "⊤" in text and "∑" in text
    assert {"mfrac", "msqrt", "mtable", "munder"} <= tags(out)


def test_mathml_refuses_unsafe_latex_and_reports_conversion_errors():
    with pytest.raises(UnsafeLatex, match="input"):
        mathml(r"\input{/etc/passwd}")
    with pytest.raises(HtmlError, match="display"):
        mathml("A", display="wide")
    with pytest.raises(HtmlError, match="cannot convert.*ExtraLeftOrMissingRight"):
        mathml(r"\left( a", check=False)
    with pytest.raises(HtmlError, match=r"does not know \\undefinedcommand"):
        mathml(r"a \undefinedcommand", check=False)


def test_text_inside_mathematics_cannot_become_markup():
    # latex2mathml's own serialiser writes \text{...} unescaped; ours escapes it
    out = mathml(r"\text{<script>alert(1)</script>} < b", check=False)
    assert "<script" not in out and "&#60;script&#62;" in out
    assert math_texts(out) == ["<script>alert(1)</script><b"]


@given(markup_text())
def test_escape_text_html_is_inert_and_faithful(text):
    escaped = escape_text(text, "html")
    assert not set("<>\"'") & set(escaped)
    assert re.fullmatch(r"([^&]|&(amp|lt|gt|quot|#39);)*", escaped)
    plain = re.sub(r"[ \t\n\r\f\v\u2028\u2029\u0085]+", " ", text)
    if all(ch.isprintable() or ch == " " for ch in plain):
        assert html.unescape(escaped) == plain


@given(markup_text(), markup_text())
def test_hostile_names_cannot_inject_markup(title, note):
    chain = Chain.start(math("T"), identity(2) + term(atom("A", "h0"), atom("W_OV", "h0")))
    d = Derivation(name=title, title=title, summary=prose(note, math("A^h")), chains=(chain,), notes=(note,))
    document = html_document(d, verification=None)
    body = document.split("<body>", 1)[1]
    assert tags(body) <= {"main", "h1", "h2", "p", "span", "ul", "li", "section", "div", "footer", "body", "html",
                          "math", "mrow", "mi", "mo", "mn", "msup", "msub", "msubsup", "mtext", "mspace", "mover",
                          "munder", "mfrac", "msqrt", "mpadded", "mphantom", "details", "summary"}
    assert "<script" not in document.lower()
    for attrs in re.findall(r"<[a-z]+((?: [^>]*)?)/?>", body):
        names = re.findall(r'([\w-]+)="[^"<>]*"', attrs)
        assert re.sub(r'\s*[\w-]+="[^"<>]*"', "", attrs).strip("/ ") == ""  # every attribute quoted, nothing else
        assert set(names) <= {"class", "display", "lspace", "rspace", "mathvariant", "stretchy", "fence", "form",
                              "minsize", "maxsize", "accent", "width", "height", "depth"}


def test_page_shows_rules_and_verification():
    document = html_document(catalogue.get("two-layer-qk"))
    assert "Mixed-product rule" in document and 'class="rule"' in document
    assert "worst relative error" in document and "tolerance 1e-09" in document and ">verified<" in document
    failed = Verification(((0, 0, 0.0), (0, 1, 0.5)), 1e-9)
    document = html_document(catalogue.get("two-layer-qk"), verification=failed)
    assert ">FAILED<" in document and "5.0e-01" in document and "✗" in document


def test_long_sums_fold():
    d = catalogue.get("path-expansion", layers=3, heads=2, concrete=True)
    document = html_document(d, max_terms=None, verification=None)
    assert "<details" in document and "more lines" in document
    for chunk in re.findall(r"<details.*?</details>", document, re.DOTALL):
        assert chunk.count('class="rhs') > FOLD_ROWS - 6
    visible = re.sub(r"<details.*?</details>", "", document, flags=re.DOTALL)
    assert visible.count('class="rhs') < 40  # 27 terms per step fold to a head and a tail


def test_index_from_numbers_layers_as_the_paper():
    zero = html_document(catalogue.get("two-layer-qk"), verification=None)
    one = html_document(catalogue.get("two-layer-qk"), index_from=1, verification=None)
    assert any("H0" in t for t in math_texts(zero)) and not any("H0" in t for t in math_texts(one))
    assert "numbered from 1" in one


def test_page_shell_escapes_title_and_is_self_contained():
    out = page("<b>&", "<p>x</p>")
    assert "<title>&lt;b&gt;&amp;</title>" in out and out.startswith("<!DOCTYPE html>")
    assert '<meta charset="utf-8">' in out and "<style>" in out


def test_prose_html_mixes_text_and_mathml():
    out = prose_html(("a < b for ", math("h ≠ k")))
    assert out.startswith("a &lt; b for <math") and "&#8800;" in out


def test_cli_derive_and_expand_write_html(tmp_path, capsys):
    assert main(["derive", "induction-mechanism", "--format", "html", "--index-from", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("<!DOCTYPE html>") and "<math" in out
    target = tmp_path / "e.html"
    code = main(["expand", "(Id ⊗ W_U)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id + Σ_{h∈H_0} A^h ⊗ W_OV^h)(Id ⊗ W_E)",
                 "--format", "html", "-o", str(target)])
    assert code == 0 and f"wrote {target}" in capsys.readouterr().out
    document = target.read_text(encoding="utf-8")
    assert "Distributivity" in document and "worst relative error" in document


def test_cli_refuses_pdf_with_html(capsys):
    assert main(["derive", "zero-layer", "--format", "html", "--pdf"]) == 2
    err = capsys.readouterr().err
    assert "--pdf compiles LaTeX" in err and "Traceback" not in err


def test_group_labels_stay_beside_their_terms():
    document = html_document(catalogue.get("two-layer-qk"), verification=None)
    assert document.count('<span class="group">') == 4  # direct, Q-, K- and QK-composition
    assert not re.search(r'<div class="rhs[^"]*"> ?<span class="group">', document)  # never on a line alone


def test_display_sums_put_limits_under_inside_brackets():
    out = mathml(r"\left( \mathrm{Id} + \sum_{h \in H_{0}} A^{h} \right)", "block")
    assert "<munder><mo>&#8721;</mo>" in out and "<msub><mo>&#8721;" not in out
    assert 'fence="true" form="prefix" lspace="0em"' in out


def test_every_line_of_an_expansion_says_its_rule():
    from derivations.expansion import expansion

    d = expansion("(A ⊗ B)(C ⊗ D)")
    document = html_document(d, verification=None)
    assert document.count('<p class="why">') == len(d.steps)
    assert "The expression as given" in document


def test_operator_names_keep_a_thin_space_before_what_they_apply_to():
    """Issue 19: the browser ran ``<mi>log</mi>`` into the next name: "logsoftmax", "logd_vocab"."""
    page_ = html_document(catalogue.get("marginal-loss"))
    logs = re.findall(r"<mi>log</mi>(<[a-z]+)", page_)
    assert len(logs) >= 3 and set(logs) <= {"<mspace", "<mo"}, logs
    assert mathml(r"\log(x)", check=False).count("mspace") == 0  # before a bracket, none (as TeX)
    assert "<mi>exp</mi><mspace" in mathml(r"\exp x", check=False)
