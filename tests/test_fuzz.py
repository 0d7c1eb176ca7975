"""Hostile input end to end (issue 11).

Random text, numbers and flag values fed to ``tcircuits derive`` / ``tcircuits expand``
(in-process; :func:`tensoralg.parse` alone: ``tests/tensoralg/test_hostile.py``) give a
result or one of our errors — argparse's exit status 2 with a one-line message — within
seconds; random bytes, configs and flipped bits given to the checkpoint loader give a
model or a :class:`CheckpointError`; Markdown output carries no raw HTML (rendered with a
CommonMark parser); no control character reaches the terminal raw.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import tempfile
import unicodedata
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from safetensors.torch import save_file

from derivations.architecture import Architecture
from derivations.catalogue import ENTRIES, get
from derivations.cli import main
from derivations.expansion import expansion
from tensoralg.errors import TCircuitsError
from tensoralg.escape import terminal_safe
from numeric_check.errors import CheckpointError
from numeric_check.model.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from numeric_check.model.circuit_model import CircuitModel
from tests.conftest import FAST, FUZZ, PROPERTY, THOROUGH
from tensoralg.check import check as tensoralg_check
from tensoralg.errors import ECHO_WINDOW
from tests.helpers import bounded, quickly
from tests.strategies import (check_arguments, cli_arguments, json_values, long_products, markup_text, overflowing_identities,
                              powers_of_sums)

SECONDS = 10  # one input: a result or an error within seconds, never minutes


def raw_controls(text: str) -> list[str]:
    """The control characters of ``text`` other than line breaks and tabs."""
    return [ch for ch in text if ch not in "\n\t" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")]


def run(argv: list[str], seconds: float = SECONDS) -> tuple[int, str, str]:
    """``tcircuits ARGV`` in-process: (exit status, stdout, stderr), any other exception raised."""
    out, err = io.StringIO(), io.StringIO()
    with quickly(seconds), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    return code, out.getvalue(), err.getvalue()


def assert_clean_answer(argv: list[str]) -> None:
    """A result (status 0), or one error of ours: status 2, one line (a parse error adds the
    text and its caret), nothing raw for the terminal."""
    code, out, err = run(argv)
    assert code in (0, 2), (argv, code, err)
    assert not raw_controls(out) and not raw_controls(err), argv
    errors = [line for line in err.splitlines() if "warning: command" not in line]
    if code == 2:
        assert "Traceback" not in err
        assert len(errors) in (1, 3) and "error" in errors[0], (argv, errors)
        if len(errors) == 3:
            assert errors[2].strip() == "^", errors


# -- the CLI ------------------------------------------------------------------------------


@FUZZ
@given(cli_arguments(sorted(ENTRIES)))
def test_tcircuits_gives_a_result_or_a_one_line_error(argv):
    assert_clean_answer(argv)


@pytest.mark.parametrize("argv", [
    ["expand", "A \x1b[2J ⊗ B"],
    ["expand", "A^{a\x1b[31mb} ⊗ B"],
    ["expand", "A^{a\u202eb} ⊗ B"],
    ["expand", "A ⊗ B\r\x07"],
    ["derive", "nope\x1b[2J"],
    ["derive", "path-expansion", "--layers", "1\x07"],
    ["expand", "A", "--atom", "V\x1b=2,3"],
])
def test_control_characters_never_reach_the_terminal_raw(argv):
    code, out, err = run(argv)
    assert code == 2 and not raw_controls(err) and not raw_controls(out)
    assert "\\x1b" in err or "\\x07" in err or "\\u202e" in err


@pytest.mark.parametrize("text", ["A ⊗\nB +", "A ⊗\r\n(x", "A\u2028⊗ B ⊗", "W_OV\t^{h\n}"])
def test_a_parse_error_quotes_text_with_line_breaks_on_one_line(text):
    """The message, the text, the caret: three lines, whatever line breaks the text holds,
    with the caret under the character it points at."""
    code, _, err = run(["expand", text, "--strict"])
    lines = err.splitlines()
    assert code == 2 and len(lines) == 3, lines
    position = int(re.search(r"at position (\d+)", lines[0]).group(1))
    assert lines[2].index("^") == 2 + position and lines[1][2:] == text.translate({ord(c): " " for c in "\n\r\t\u2028"})


def test_terminal_safe_escapes_controls_and_keeps_lines():
    assert terminal_safe("a\x1b[2Jb\rc\u202ed\x00") == "a\\x1b[2Jb\\rc\\u202ed\\x00"
    assert terminal_safe("line one\n\tline two ⊗ σ") == "line one\n\tline two ⊗ σ"


# -- Markdown -----------------------------------------------------------------------------


def html_in_markdown(markdown: str) -> list[str]:
    """What a CommonMark parser reads as raw HTML or a link in ``markdown``."""
    found = []
    for token in MarkdownIt("commonmark").parse(markdown):
        for t in [token, *(token.children or ())]:
            if t.type.startswith("html") or t.type == "link_open":
                found.append(t.content or t.attrs.get("href", ""))
    return found


@pytest.mark.parametrize("index", [
    "<img src=x onerror=alert(1)>", "<script>alert(1)</script>", "[x](javascript:alert(1))", "<http://evil.example>",
    "&lt;b&gt;", "</math>", "<!-- x", "a<b", "<a href=x>",
])
def test_markdown_of_an_expansion_has_no_raw_html(index):
    text = f"A^{{{index}}} ⊗ W_OV + Σ_{{h∈H_0}} A^h ⊗ W_OV^h"
    assert html_in_markdown(expansion(text).to_markdown()) == []
    code, out, _ = run(["expand", text, "--format", "markdown"])
    assert code == 0 and html_in_markdown(out) == []


@PROPERTY
@given(markup_text())
def test_markdown_of_any_index_that_reads_has_no_raw_html(index):
    try:
        d = expansion(f"A^{{{index}}} ⊗ W_OV")
    except TCircuitsError:
        return
    assert html_in_markdown(d.to_markdown()) == []


def test_the_catalogues_markdown_has_no_raw_html():
    for name in ("path-expansion", "two-layer-qk", "induction-mechanism", "tensor-product-readings"):
        assert html_in_markdown(get(name).to_markdown()) == [], name


def test_the_markdown_renderer_finds_raw_html_when_it_is_there():
    assert html_in_markdown("$$\nA^{<img src=x onerror=alert(1)>}\n$$") != []


# -- the checkpoint loader ---------------------------------------------------------------------

SMALL = CircuitModel.random(Architecture(1, 2), d_model=4, d_head=2, d_vocab=5, n_ctx=3, seed=0, device="cpu")
SMALL_CONFIG = SMALL.cfg.to_dict()


def load_or_refuse(path: Path) -> None:
    """A model, or a CheckpointError — nothing else, within seconds."""
    with quickly(SECONDS), contextlib.suppress(CheckpointError):
        load_checkpoint(path)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch notes the random bytes' protocol byte
@THOROUGH
@given(st.binary(max_size=600), st.sampled_from([".safetensors", ".pt"]))
def test_random_bytes_are_a_checkpoint_error(data, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"random{suffix}"
        path.write_bytes(data)
        with pytest.raises(CheckpointError):
            load_checkpoint(path)


@THOROUGH
@given(st.sampled_from(sorted(SMALL_CONFIG) + ["arch"]), json_values, st.sampled_from(["", "arch"]))
def test_a_config_with_a_random_field_loads_or_is_refused(field, value, where):
    config = json.loads(json.dumps(SMALL_CONFIG))
    target = config["arch"] if where == "arch" else config
    target[field if where == "" else field.replace("arch", "n_layers")] = value
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.safetensors"
        text = json.dumps(config)  # NaN and Infinity included, as a careless writer would
        save_file({k: v.contiguous() for k, v in SMALL.state_dict().items()}, str(path),
                  metadata={"format": FORMAT, "format_version": "1", "config": text})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no content hash in these files
            load_or_refuse(path)


@PROPERTY
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4))
def test_a_saved_checkpoint_with_flipped_bytes_loads_or_is_refused(flips):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.safetensors"
        save_checkpoint(SMALL, path)
        data = bytearray(path.read_bytes())
        for position, mask in flips:
            data[position % len(data)] ^= mask
        path.write_bytes(bytes(data))
        load_or_refuse(path)


# -- tcircuits check (issues 27 and 29) ------------------------------------------------------------


@FUZZ
@given(check_arguments())
def test_check_gives_a_verdict_or_a_one_line_error(argv):
    """Any identity and flags: exit 0 or 1 with a verdict, or 2 with one line of ours (a parse error
    adds its text and caret), within seconds, never a traceback."""
    code, out, err = run(argv)
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err and not raw_controls(out) and not raw_controls(err), argv
    if code in (0, 1):
        assert ("The identity holds" if code == 0 else "The identity does not hold") in out or "--format" in argv, argv
    else:
        errors = [line for line in err.splitlines() if "warning: command" not in line]
        assert len(errors) in (1, 3) and "error" in errors[0], (argv, errors)


# -- round 5 (issue 38): no false "agree", every array sized first, bounded reading -----------------


@THOROUGH
@given(overflowing_identities())
def test_an_overflowing_comparison_is_never_called_agreement(case):
    """Sides scaled towards float64's range: a true identity holds (by expansion) and its numbers differ
    by a finite amount or are "not checked numerically: the values overflow float64"; a false one never
    "agrees numerically" — NaN is never dropped from the comparison."""
    identity, holds = case
    code, out, err = run(["check", identity])
    assert code == (0 if holds else 1) and "Traceback" not in err and "warning" not in err, (identity, out, err)
    summary = " ".join(out.split())
    assert "agree" not in summary and "nan" not in summary.lower().split("lhs")[0], summary
    result = tensoralg_check(identity)
    if result.numeric_error is None:
        assert result.unchecked == "the values overflow float64" and "not checked numerically: the values overflow" in summary
    else:
        assert math.isfinite(result.numeric_error)


@FAST
@given(slots=st.integers(1, 10), rows=st.integers(1, 80), cols=st.integers(1, 80), limit=st.sampled_from([64, 4096, 6400]))
def test_every_array_of_a_numeric_check_is_sized_before_it_is_made(monkeypatch, slots, rows, cols, limit):
    """Sizes at the bound (the bound lowered so that its neighbourhood is cheap to reach): an identity of
    ``slots`` slots, or of a declared ``rows × cols`` atom, is compared on numbers when every array fits,
    and otherwise holds by expansion with one clause saying which array would be too large — never an
    allocation past the bound, never a MemoryError."""
    from tensoralg import numeric

    monkeypatch.setattr(numeric, "MAX_ENTRIES", limit)
    for identity, atoms, largest in ((" ⊗ ".join(["A"] * slots) + " = " + " ⊗ ".join(["A"] * slots), None, None),
                                     ("X = X", {"X": (rows, cols)}, rows * cols)):
        with bounded(30, 64):
            result = tensoralg_check(identity, atoms=atoms)
        assert result.holds
        if result.numeric_error is None:
            assert "more than the" in result.unchecked and f"{limit:,}" in result.unchecked, result.unchecked
            assert largest is None or largest > limit
        else:
            assert largest is None or largest <= limit


def test_an_eight_slot_identity_and_a_huge_atom_are_one_clause_not_gigabytes():
    """The cases of issue 38: 32 GiB and 298 GiB asked for; now a verdict at once, the numbers skipped
    with the reason (and the page of a 7-slot expansion says its lines are not checked)."""
    with bounded(30, 64):
        code, out, err = run(["check", " ⊗ ".join(["A"] * 8) + " = " + " ⊗ ".join(["A"] * 8)], seconds=30)
    assert code == 0 and "not checked numerically: the operator would be a 65,536 × 65,536 array" in " ".join(out.split())
    with bounded(30, 64):
        code, out, err = run(["check", "X = X", "--atom", "X=200000,200000"], seconds=30)
    assert code == 0 and "the random matrix for X would be a 200,000 × 200,000 array" in " ".join(out.split())
    with bounded(30, 64):
        code, out, err = run(["expand", " ⊗ ".join(["A"] * 7), "--format", "html"], seconds=30)
    assert code == 0 and "not verified" in out and "is not checked numerically: the operator would be" in out


@FUZZ
@given(powers_of_sums())
def test_a_power_of_a_sum_is_counted_before_it_is_expanded(text):
    """``(d_model + d_head + …)**n``: read and expanded within seconds, or one error saying how many
    terms it would multiply out to — never minutes, gigabytes, or a SystemError."""
    with bounded(30, 200):
        code, out, err = run(["expand", text], seconds=30)
    assert code in (0, 2) and "Traceback" not in err, (text, err)
    if code == 2:
        assert "multiplies out to" in err or "beyond 10**" in err or "must lie in" in err or "division by zero" in err, err


@FAST
@given(long_products())
def test_a_long_product_is_read_in_time_linear_in_its_length(text):
    """Up to 20,000 atoms in one product (juxtaposed, with ·, transposed, in groups, undeclared):
    a result or one error within seconds; an error quotes at most a window of the text around its caret."""
    code, out, err = run(["expand", text, "--max-terms", "4"], seconds=60)
    assert "Traceback" not in err, err[-500:]
    if code == 2:
        lines = [line for line in err.splitlines() if "warning: command" not in line]
        assert len(lines) in (1, 3) and all(len(line) <= 2 * ECHO_WINDOW + 400 for line in lines), [len(x) for x in lines]
        if len(lines) == 3:  # the text and its caret: the caret under the character the message names
            position = int(re.search(r"at position (\d+)", lines[0]).group(1))
            column = lines[2].index("^")
            shown = lines[1][column] if column < len(lines[1]) else ""
            assert position == len(text) and shown == "" or shown == text[position] or shown == " " and not text[position].strip()


@pytest.mark.parametrize("text", ["Q" * 120_000 + " ⊗ (", "A " * 60_000 + "2", "(" * 50 + "A" * 100_000],
                         ids=["long name", "long product", "unclosed"])
def test_a_parse_error_on_a_long_input_echoes_a_window_around_the_caret(text):
    code, out, err = run(["expand", text], seconds=60)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 3 and max(len(line) for line in lines[1:]) <= 2 * ECHO_WINDOW + 8, [len(x) for x in lines]
    assert len(lines[0]) < 1000, lines[0][:200]


def html_tags(html: str) -> set[str]:
    """The names of the elements in ``html``, as a browser's parser reads them."""
    from html.parser import HTMLParser

    found: set[str] = set()
    parser = HTMLParser()
    parser.handle_starttag = lambda tag, attrs: found.add(tag)
    parser.feed(html)
    return found


@PROPERTY
@given(markup_text())
def test_a_terms_notebook_forms_carry_no_tag_from_a_name(index):
    """``Term`` shows MathML (``_repr_html_``) and LaTeX whose ``<``/``>`` are commands: a notebook that
    inserts ``text/latex`` as HTML finds no ``<img onerror>`` of an index, nor does its MathML."""
    from tensoralg import atom, term
    from tensoralg.expr import Term

    try:
        expr = term(atom("A", index), atom("W_OV", "h"))
    except TCircuitsError:  # an index that does not read (a control character): refused, shown nowhere
        return
    single = next(iter(expr))
    assert isinstance(single, Term)
    for shown in (single._repr_latex_(), expr._repr_latex_()):
        assert "<" not in shown and ">" not in shown, shown
        assert html_tags(shown) == set()
    html = single._repr_html_()
    assert html == expr._repr_html_()
    assert not html_tags(html) & {"img", "script", "svg", "iframe", "a", "style", "object", "embed"}, html
