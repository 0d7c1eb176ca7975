"""One escaper for user text in every format; one allow-list for mathematics."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensoralg import TensorAlgError
from tensoralg.escape import UNICODE_MATH, check_math, escape_text
from tests.strategies import PROPERTY


@pytest.mark.parametrize("ch, latex", [("≠", r"$\neq$"), ("σ", r"$\sigma$"), ("≤", r"$\le$"), ("→", r"$\to$"),
                                       ("∑", r"$\sum$"), ("⊗", r"$\otimes$"), ("ᵀ", r"$^{\top}$"),
                                       ("λ", r"$\lambda$"), ("Ω", r"$\Omega$"), ("↦", r"$\mapsto$"),
                                       ("é", r"\'{e}"), ("—", "---")])
def test_prose_symbols_become_the_latex_they_mean(ch, latex):
    # regression: ≠ became '=' and σ became '[U+03C3]'
    assert escape_text(f"a {ch} b", "latex") == f"a {latex} b"


def test_every_greek_letter_is_typeset():
    for code in range(0x3B1, 0x3CA):
        ch = chr(code)
        if ch in "ο":
            continue
        out = escape_text(ch, "latex")
        assert "[U+" not in out and out.startswith("$\\"), (ch, out)
        assert unicodedata.name(ch).split()[-1].lower().replace("lamda", "lambda").replace("final ", "") in out.lower() \
            or ch in "ςεφ"


def test_an_unknown_character_is_visible_never_another_symbol():
    assert escape_text("☃", "latex") == "[U+2603]"


def test_markdown_escapes_html():
    out = escape_text("<img src=x onerror=alert(1)> **b** [l](u)", "markdown")
    assert "<" not in out and ">" not in out
    assert out.startswith("&lt;img")


def test_a_comment_cannot_be_ended_by_a_newline():
    out = escape_text("name\n\\input{x}\r\u2028more", "latex-comment")
    assert "\n" not in out and "\r" not in out and "\u2028" not in out


def test_plain_text_shows_control_characters_escaped():
    assert escape_text("a\x07b\x1b[31m", "text") == "a\\x07b\\x1b[31m"


def test_unknown_format_is_named():
    with pytest.raises(TensorAlgError, match="'latex', 'latex-math'"):
        escape_text("x", "rtf")


@PROPERTY
@given(st.text(max_size=30))
def test_no_format_leaves_a_raw_control_character(text):
    for fmt in ("latex", "latex-comment", "markdown", "text"):
        out = escape_text(text, fmt)
        assert not any(unicodedata.category(c) == "Cc" for c in out), (fmt, out)
    check_math(escape_text(text, "latex-math"))


def test_every_unicode_math_symbol_is_allowed_in_mathematics():
    for latex in UNICODE_MATH.values():
        check_math(latex)
    assert not re.search(r"\[U\+", "".join(escape_text(ch, "latex") for ch in UNICODE_MATH))


# -- pages found wrong when read (issue 19) ----------------------------------------------------------


def test_a_markdown_line_that_would_start_a_list_escapes_its_period_not_its_digit():
    """CommonMark escapes punctuation only: "\\1." shows its backslash; "1\\." shows "1."."""
    from tensoralg.escape import escape_text

    assert escape_text("1. sum of all terms", "markdown") == "1\\. sum of all terms"
    assert escape_text("12) twelve", "markdown") == "12\\) twelve"
    assert escape_text("- item", "markdown") == "\\- item"
    assert escape_text("L1. x", "markdown") == "L1. x"


def test_markdown_math_writes_brackets_inside_text_as_maths():
    r"""``\text{\lbrack …}`` shows "\lbrack" raw under MathJax: the command leaves the text."""
    from tensoralg.escape import markdown_math

    out = markdown_math(r"W_{E} \qquad \text{[direct path]}")
    assert "\\text{\\lbrack" not in out and "\\rbrack \\text{}" in out
    assert out == r"W_{E} \qquad \text{}\lbrack \text{direct path}\rbrack \text{}"
    assert markdown_math(r"\mathrm{[x]}") == r"\mathrm{\lbrack x\rbrack }"  # maths mode: the commands as before
    assert markdown_math(r"\text{\{}[") == r"\text{\{}\lbrack "  # escaped braces do not end the text


def test_brackets_in_text_render_as_brackets_in_a_maths_renderer():
    """latex2mathml reads ``\\text{}`` as MathJax does: the bracket is an operator, not "\\lbrack" text."""
    from derivations.html import mathml
    from tensoralg.escape import markdown_math

    import pytest
    from derivations.errors import HtmlError

    shown = mathml(markdown_math(r"W_{E} \qquad \text{[direct path]}"), check=False)
    assert "lbrack" not in shown and ">[</" in shown and ">]</" in shown and "direct" in shown
    with pytest.raises(HtmlError, match="lbrack"):  # the old form: the command left as text
        mathml(r"W \text{\lbrack direct path\rbrack }", check=False)


@pytest.mark.parametrize("name, shown", [("é", "é"), ("À", "À"), ("ǘ", "ǘ"), ("ß", "ß"), ("Å", "Å"), ("ı", "ı"),
                                         ("…", "…"), ("–", "–"), ("¿", "¿"), ("façade", "ç")])
def test_a_name_outside_ascii_shows_in_mathml_as_the_letters_it_is(name, shown):
    """The LaTeX keeps pdflatex's text-mode accents (\\'{e}); MathML, which a notebook shows, gets the letters back
    (latex2mathml reads no text-mode accent: a head named "À" made ``_repr_html_`` raise)."""
    import html

    from tensoralg import atom, term
    from tensoralg.escape import text_as_unicode

    expr = term(atom("A", name), atom("W_OV", "h"))
    latex = expr._repr_latex_()
    assert "\\text{" in latex and (shown not in latex or name in "–…")  # LaTeX still spells what pdflatex needs
    texts = [html.unescape(t) for t in re.findall(r"<mtext>([^<]*)</mtext>", expr._repr_html_())]
    assert shown in texts, texts
    assert text_as_unicode(latex) != latex


@PROPERTY
@given(st.text(st.characters(min_codepoint=0xA0, max_codepoint=0x24F), min_size=1, max_size=4))
def test_every_latin_letter_a_name_can_hold_converts_to_mathml(name):
    from tensoralg import TCircuitsError, atom, term

    try:
        expr = term(atom("A", name), atom("W_OV", "h"))
    except TCircuitsError:  # a name that does not read: refused, shown nowhere
        return
    assert expr._repr_html_().startswith("<")
