"""Hostile input, round 3 (issue 21): files and the terminal.

Files: every output of every command goes through one atomic writer
(:mod:`derivations.files`) — a link at the output path is replaced, never written through;
a FIFO, a device or a folder is refused before the work; a failed write leaves the old file
and no temporary one; a report never replaces what it reads. The environment: standard
output closed or full, an ASCII-only encoding, warnings — a result or one line, never a
traceback.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from derivations import files
from derivations.cli import main
from derivations.errors import OutputError
from derivations.terminal import GuardedStream, ascii_spelling
from tests.conftest import FAST, FUZZ
from tests.helpers import folder_state, quickly
from tests.strategies import OUTPUT_PLACES

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (["derive", "zero-layer"], ["expand", "(A ⊗ W_OV)(Id ⊗ W_E)"], ["derive", "two-layer-qk", "--format", "html"],
            ["expand", "A ⊗ B", "--format", "json"])


FRESH = object()


def run(argv: list[str], stdout=FRESH) -> tuple[int, str]:
    """``tcircuits ARGV`` in-process with ``stdout`` (a fresh buffer by default; None: closed):
    (status, stderr)."""
    err = io.StringIO()
    saved = sys.stdout
    sys.stdout = io.StringIO() if stdout is FRESH else stdout
    try:
        with contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exit_:
                code = exit_.code
    finally:
        sys.stdout = saved
    return code, err.getvalue()


def one_line_error(code: int, err: str) -> bool:
    lines = [line for line in err.splitlines() if "warning: command" not in line]
    return code == 2 and len(lines) == 1 and "error" in lines[0] and "Traceback" not in err


def place(kind: str, path: Path, victim: Path) -> None:
    """Put a thing of ``kind`` (see :data:`OUTPUT_PLACES`) at ``path``."""
    if kind == "file":
        path.write_text("old")
    elif kind == "link":
        path.symlink_to(victim)
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()


# -- the family: any command, anything at the output path -------------------------------------


@FAST
@given(st.sampled_from(COMMANDS), st.sampled_from(OUTPUT_PLACES), st.sampled_from(["out.txt", "o\x1bu\nt.tex"]))
def test_an_output_is_written_atomically_or_refused_and_nothing_else_changes(tmp_path_factory, argv, kind, name):
    """Status 0 and a regular file holding the document (a link replaced, its target as it
    was), or one line of error and nothing changed; never a temporary file left, never a
    control character on the terminal; within seconds."""
    folder, elsewhere = tmp_path_factory.mktemp("out"), tmp_path_factory.mktemp("elsewhere")
    victim = elsewhere / "victim.txt"
    victim.write_text("precious")
    target = folder / name
    place(kind, target, victim)
    before = folder_state(folder)
    out = io.StringIO()
    with quickly(20):
        code, err = run([*argv, "-o", str(target)], out)
    after = folder_state(folder)
    assert victim.read_text() == "precious"
    assert "\x1b" not in out.getvalue() + err and "Traceback" not in err
    if kind in ("fifo", "folder"):
        assert one_line_error(code, err) and after == before, err
    else:
        assert code == 0, err
        assert not target.is_symlink() and target.is_file() and target.read_text(encoding="utf-8") != "old"
        assert {p for p in after if p != str(target)} == {p for p in before if p != str(target)}  # nothing else


def test_a_link_at_the_output_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.tex"
    victim.write_text("precious")
    (tmp_path / "out.tex").symlink_to(victim)
    code, err = run(["derive", "zero-layer", "--format", "latex", "-o", str(tmp_path / "out.tex")])
    assert code == 0 and victim.read_text() == "precious" and not (tmp_path / "out.tex").is_symlink()


def test_a_fifo_at_the_output_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "fifo.tex")
    with quickly(5):
        code, err = run(["derive", "zero-layer", "-o", str(tmp_path / "fifo.tex")])
    assert one_line_error(code, err) and "is a FIFO" in err


def test_a_device_at_the_output_is_refused():
    with pytest.raises(OutputError, match="is a device"):
        files.writable_file("/dev/null")


def test_a_file_size_limit_keeps_the_old_file(tmp_path):
    """``ulimit -f 1`` and a 2-layer LaTeX document: the old file stays whole, no temporary file."""
    target = tmp_path / "doc.tex"
    target.write_text("old")
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024)); "
              "from derivations.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", script, "derive", "two-layer-logits", "--format", "latex", "-o", str(target)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 2 and "File too large" in done.stderr and "Traceback" not in done.stderr
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["doc.tex"]


def test_a_failed_figure_leaves_no_temporary_file_and_one_line(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from numeric_check.errors import OutputPathError
    from numeric_check.reports.plots import save_figure

    fig = plt.figure()

    def full_disk(path, **kwargs):
        Path(path).write_bytes(b"half a figure")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fig, "savefig", full_disk)
    with pytest.raises(OutputPathError, match="No space left on device"):
        save_figure(fig, tmp_path, "positivity", ["svg"])
    plt.close(fig)
    assert list(tmp_path.iterdir()) == []


def test_temporary_names_are_unique_per_write(tmp_path):
    with files.atomic_path(tmp_path / "a.svg") as first, files.atomic_path(tmp_path / "a.svg") as second:  # the last to end wins
        assert first != second
        first.write_text("1")
        second.write_text("2")
    assert (tmp_path / "a.svg").read_text() == "1" and [p.name for p in tmp_path.iterdir()] == ["a.svg"]


def test_a_report_never_replaces_the_checkpoints_training_record(tmp_path):
    """``analyze DIR/analysis.safetensors --out DIR``: the report's analysis.json is the
    checkpoint's record; refused before anything is read or written."""
    checkpoint = tmp_path / "analysis.safetensors"
    checkpoint.write_bytes(b"x")
    (tmp_path / "analysis.json").write_text("{}")
    before = folder_state(tmp_path)
    code, err = run(["analyze", str(checkpoint), "--out", str(tmp_path)])
    assert one_line_error(code, err) and "would replace" in err and folder_state(tmp_path) == before


def test_wrote_lines_are_terminal_safe(tmp_path):
    out = io.StringIO()
    code, _ = run(["derive", "zero-layer", "-o", str(tmp_path / "a\x1b[2Jb.txt")], out)
    assert code == 0 and "\x1b" not in out.getvalue() and "\\x1b" in out.getvalue()


# -- the environment family: closed, full or ASCII-only standard output --------------------------


class FullStream(io.StringIO):
    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")


def ascii_stream() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")


ENVIRONMENT_COMMANDS = (["derive", "--list"], ["expand", "(A ⊗ B)(C ⊗ D)"], ["derive", "one-layer"], ["expand", "--help"],
                        ["--help"], ["derive", "zero-layer", "--format", "markdown"],
                        ["verify", "--layers", "1", "--heads", "1", "--d-model", "4", "--d-head", "2", "--d-vocab", "5"])


@FUZZ
@given(st.sampled_from(ENVIRONMENT_COMMANDS), st.sampled_from(["closed", "full", "ascii", "normal"]))
def test_any_command_on_any_standard_output_gives_a_result_or_one_line(argv, where):
    stdout = {"closed": None, "full": FullStream(), "ascii": ascii_stream(), "normal": io.StringIO()}[where]
    with quickly(30):
        code, err = run(argv, stdout)
    assert "Traceback" not in err
    if where in ("closed", "full") and "--help" not in argv:
        assert one_line_error(code, err) and "standard output" in err
    else:
        assert code in (0, 1), err
    if where == "ascii":
        stdout.flush()
        stdout.buffer.getvalue().decode("ascii")  # written, in ASCII


@pytest.mark.parametrize("shell", ["{cmd} >&-", "{cmd} > /dev/full", "PYTHONIOENCODING=ascii {cmd}",
                                   "LC_ALL=C PYTHONUTF8=0 PYTHONCOERCECLOCALE=0 {cmd}"])
def test_a_real_terminal_closed_full_or_ascii_gives_no_traceback(shell):
    cmd = f"{sys.executable} -m derivations.cli expand '(A ⊗ B)(C ⊗ D)'"
    done = subprocess.run(shell.format(cmd=cmd), shell=True, capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert b"Traceback" not in done.stderr and b"Exception ignored" not in done.stderr, done.stderr
    if "dev/full" in shell or ">&-" in shell:
        assert done.returncode == 2 and b"cannot write to standard output" in done.stderr
    else:
        assert done.returncode == 0 and b"A C (x) B D" in done.stdout and done.stdout.isascii()


def test_ascii_spellings_read_back():
    from tensoralg import parse

    text = "(Id + Σ_{h∈H_0} A^h ⊗ W_OV^h)(Id ⊗ W_E)"
    assert parse(ascii_spelling(text)) == parse(text)


def test_a_guarded_stream_reports_a_closed_stream_in_one_line():
    with pytest.raises(OutputError, match="cannot write to standard output: it is closed"):
        GuardedStream(None, "standard output").write("x")


def test_warnings_are_one_line_without_a_source_line(tmp_path):
    script = ("import warnings, sys; from derivations import cli; "
              "cli.commands.derive = lambda a: warnings.warn('careful\\nnow') or 0; sys.exit(cli.main(['derive', 'x']))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stderr.splitlines() if "warning: command" not in line]
    assert lines == ["tcircuits: warning: careful now"], done.stderr
