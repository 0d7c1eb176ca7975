"""Every catalogue entry as LaTeX: each non-ASCII character of its prose becomes the LaTeX it
means (regression: ``≠`` printed as ``=``, ``σ`` as ``[U+03C3]``), and maths is never escaped text."""

from __future__ import annotations

import unicodedata

import pytest

from tensoralg.escape import UNICODE_MATH, escape_text

from derivations import catalogue
from derivations.document import Math


def _strings(value):
    """Every plain string in a piece of prose (or a string)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, tuple):
        for s in value:
            if isinstance(s, str):
                yield s


def prose_strings(d):
    yield from _strings(d.title)
    yield from _strings(d.summary)
    for n in d.notes:
        yield from _strings(n)
    for chain in d.chains:
        yield from _strings(chain.intro)
        for step in chain.steps:
            yield from _strings(step.text)
            yield from _strings(step.detail)
            for label, _ in step.groups:
                yield from _strings(label)


def _expected(ch: str) -> str:
    if ch in UNICODE_MATH:
        return "$" + UNICODE_MATH[ch] + "$"
    base, *marks = unicodedata.normalize("NFD", ch)
    assert marks and base.isascii(), f"{ch!r} ({unicodedata.name(ch, '?')}) has no LaTeX spelling"
    return escape_text(ch, "latex")


@pytest.mark.parametrize("name", catalogue.names())
def test_every_non_ascii_prose_character_becomes_the_right_latex(name):
    d = catalogue.get(name)
    latex = d.to_latex()
    assert "[U+" not in latex
    for s in prose_strings(d):
        for ch in {c for c in s if not c.isascii() and not c.isspace()}:
            want = _expected(ch)
            assert escape_text(ch, "latex") == want
            assert want in latex, (name, ch, want)


@pytest.mark.parametrize("name", catalogue.names())
def test_maths_in_prose_is_never_escaped_text(name):
    latex = catalogue.get(name).to_latex()
    for escaped_maths in (r"\_O\textasciicircum", r"\textasciicircum{}h", r"M\_in", r"W\_O"):
        assert escaped_maths not in latex, (name, escaped_maths)


def test_multi_head_says_not_equal():
    latex = catalogue.get("multi-head").to_latex()
    assert "h = k" not in latex
    assert r"\neq" in latex


@pytest.mark.parametrize("name", catalogue.names())
def test_every_entry_numbers_layers_from_one_on_request(name):
    d = catalogue.get(name)
    assert d.to_latex(index_from=1).startswith("% ")
    assert isinstance(d.to_text(index_from=1), str)


def test_formula_math_objects_in_the_catalogue_print_through_the_printer():
    seen = 0
    for name in catalogue.names():
        for n in catalogue.get(name).notes:
            for s in n:
                if isinstance(s, Math) and s.source is not None:
                    seen += 1
    assert seen > 0


def test_the_numbering_note_is_true_in_both_numberings():
    # regression: math("H_0") in the note was shifted too, so with index_from=1 it read "its H_2 is our H_1"
    d = catalogue.get("path-expansion")
    assert "its H_1 (first layer) is our H_0" in " ".join(d.to_text().split())
    one = " ".join(d.to_text(index_from=1).split())
    assert "H_2 (first layer)" not in one and "numbered from 1, as in the paper: H_1 is the first layer" in one
