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
from tests.conftest import FUZZ, PROPERTY, THOROUGH
from tests.helpers import quickly
from tests.strategies import check_arguments, cli_arguments, json_values, markup_text

SECONDS = 10  # one input: a result or an error within seconds, never minutes


def raw_controls(text: str) -> list[str]:
    """The control characters of ``text`` other than line breaks and tabs."""
    return [ch for ch in text if ch not in "\n\t" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")]


def run(argv: list[str]) -> tuple[int, str, str]:
    """``tcircuits ARGV`` in-process: (exit status, stdout, stderr), any other exception raised."""
    out, err = io.StringIO(), io.StringIO()
    with quickly(SECONDS), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
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
