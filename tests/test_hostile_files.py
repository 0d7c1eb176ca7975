"""Hostile input, rounds 3 and 5 (issues 21 and 38): files and the terminal.

Files: every output of every command goes through one atomic writer
(:mod:`derivations.files`) — a link at the output path is replaced, never written through;
a FIFO, a device or a folder is refused before the work; a failed write leaves the old file
and no temporary one; a report never replaces what it reads. The environment: standard
output closed or full, an ASCII-only encoding, warnings — a result or one line, never a
traceback.

Round 5: a file system mounted inside an output folder is refused, never copied nor emptied
(mounts only inside a private namespace made with ``unshare -m``; a faked device number
elsewhere); a replaced file keeps its permissions and owner, and a file the person could not
write is refused; no folder is made through a link that leads nowhere; files that belong
together are replaced together or not at all; SIGTERM and SIGHUP clean up as Ctrl-C does; an
implied PDF is checked as ``-o`` is; a list of files found in a folder is verified, not trusted;
names as long as the file system allows are written.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from derivations import files, folders
from derivations.cli import main
from derivations.errors import OutputError
from derivations.terminal import GuardedStream, ascii_spelling
from tests.conftest import FAST, FUZZ
from tests.helpers import folder_state, quickly, terminal_signals
from tests.strategies import OUTPUT_PLACES, linked_outputs, long_names, signal_points

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
    code, err = run(["analyze", "--checkpoint", str(checkpoint), "--out", str(tmp_path)])
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
    if where in ("closed", "full"):  # help too: never lost with exit status 0 (issue 48)
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


# -- round 5 (issue 38): no file system wiped, no file widened, nothing made through a link -----

NAMES = ["index.html", "figures/a.svg"]


def write_folder(site: Path, text: str = "v1", **options) -> None:
    with folders.OutputFolder(site, NAMES, **options) as new:
        for name in NAMES:
            (new / name).parent.mkdir(parents=True, exist_ok=True)
            (new / name).write_text(f"{text} {name}")


def leftovers(folder: Path) -> list[str]:
    """Temporary names the writers make (``.NAME.xxxxxxxx.tmp``, ``.new``, ``.old``) left anywhere below ``folder``."""
    return [str(p) for p in folder.rglob(".*") if p.name.endswith((".tmp", ".new", ".old"))]


MOUNT_SCRIPT = r"""
import os, subprocess, sys, tempfile
from pathlib import Path

from hypothesis import given

from derivations import files, folders
from derivations.errors import OutputError
from tests.conftest import FAST
from tests.helpers import folder_state
from tests.strategies import mounted_outputs

NAMES = ["index.html", "figures/a.svg"]


def write(site, force=False):
    with folders.OutputFolder(site, NAMES, force=force) as new:
        for name in NAMES:
            (new / name).parent.mkdir(parents=True, exist_ok=True)
            (new / name).write_text("new " + name)


@FAST
@given(mounted_outputs())
def mounted(case):
    place, count, force, ours = case
    base = Path(tempfile.mkdtemp(dir=os.environ["BASE"]))
    site = base / "site"
    if ours:
        write(site)
    site.mkdir(exist_ok=True)
    point = site / place
    point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(point)], check=True)
    try:
        for i in range(count):
            (point / f"kept{i}.txt").write_text(f"precious {i}")
        before = folder_state(point)
        try:
            write(site, force)
            outcome = "written"
        except OutputError as err:
            outcome = str(err)
        assert "mount point" in outcome, (case, outcome)
        assert os.path.ismount(point) and folder_state(point) == before, case  # its files all there, none copied
        assert [p.name for p in base.iterdir()] == ["site"], case  # no new or old folder beside it
    finally:
        subprocess.run(["umount", "-l", str(point)], check=True)


mounted()
print("held")
"""


def test_a_file_system_mounted_inside_an_output_folder_is_refused_never_emptied(tmp_path):
    """The family of mounts, inside a private mount namespace (``unshare -m``; a tmpfs mounted at the
    folder, at a folder the tool writes, at a person's folder, deeper): the run is refused before any
    work, with or without --force; the mounted files stay, none is copied, the mount stays where it was."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs t /mnt"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"a private mount namespace is not permitted here: {probe.stderr.strip()}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BASE": str(tmp_path)}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", MOUNT_SCRIPT],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and done.stdout.strip() == "held", done.stderr[-3000:]


def test_a_folder_on_another_device_is_refused_by_its_device_number(tmp_path, monkeypatch):
    """Where the system lists no mount points (no /proc), a folder inside on another device (a faked
    device number) is found by the scan: refused, with --force too, and nothing changed."""
    site = tmp_path / "site"
    write_folder(site)
    other = site / "mine" / "deep"
    other.mkdir(parents=True)
    (other / "kept.txt").write_text("precious")
    foreign = {os.stat(other).st_ino, os.stat(other / "kept.txt").st_ino}
    monkeypatch.setattr(folders, "mount_points", lambda: frozenset())
    monkeypatch.setattr(folders, "_device", lambda info: 999 if info.st_ino in foreign else info.st_dev)
    before = folder_state(tmp_path)
    for force in (False, True):
        with pytest.raises(OutputError, match="mine/deep' in it is on another file system"):
            write_folder(site, "v2", force=force)
    assert folder_state(tmp_path) == before


def test_a_mount_point_the_system_lists_is_refused_on_the_same_device(tmp_path, monkeypatch):
    """A bind mount of the same file system has the same device number: the system's list of mount
    points finds it."""
    site = tmp_path / "site"
    write_folder(site)
    (site / "mine").mkdir()
    monkeypatch.setattr(folders, "mount_points", lambda: frozenset({str(site / "mine")}))
    with pytest.raises(OutputError, match="mine' in it is a mount point"):
        write_folder(site, "v2", force=True)
    assert (site / "index.html").read_text() == "v1 index.html"


def test_removing_a_folder_never_crosses_into_another_file_system(tmp_path, monkeypatch):
    tree = tmp_path / "old"
    (tree / "kept").mkdir(parents=True)
    (tree / "kept" / "file.txt").write_text("precious")
    (tree / "gone.txt").write_text("x")
    inode = os.stat(tree / "kept").st_ino
    monkeypatch.setattr(folders, "_device", lambda info: 999 if info.st_ino == inode else info.st_dev)
    folders.remove_tree(tree)
    assert (tree / "kept" / "file.txt").read_text() == "precious" and not (tree / "gone.txt").exists()


@FAST
@given(linked_outputs())
def test_no_folder_is_made_through_a_link_that_leads_nowhere(tmp_path_factory, case):
    """The family of links on the way to an output folder (the folder itself or a parent, leading to a
    folder or to nothing yet, folders to make below it): written where a link leads to a folder that
    exists; refused in one line where it leads nowhere — and then nothing is made anywhere."""
    place, target, depth, force = case
    base = tmp_path_factory.mktemp("links")
    (base / "existing").mkdir()
    goal = {"existing": base / "existing", "dangling": base / "made",
            "dangling-deep": base / "x" / "deep" / "made"}[target]
    below = Path(*(["sub"] * depth)) if depth else Path()
    if place == "none":
        out = base / "out" / below
    elif place == "folder":
        (base / "rep").symlink_to(goal)
        out = base / "rep" / below
    else:
        (base / "parent").symlink_to(goal)
        out = base / "parent" / "site" / below
    before = folder_state(base)
    dangling = place != "none" and target != "existing"
    for make in ("folder", "file"):
        try:
            if make == "folder":
                write_folder(out, force=force)
            else:
                files.writable_dir(out, create=True)
            made = True
        except OutputError as err:
            made = False
            assert "is a link to" in str(err) and "which does not exist" in str(err), str(err)
        assert made != dangling, (case, make)
        if dangling:
            assert folder_state(base) == before  # nothing made at the link's target, nor anywhere
        assert leftovers(base) == []


@FAST
@given(mode=st.integers(0, 0o777), owner=st.sampled_from([(0, 0), (1000, 1000), (65534, 65534), (1000, 0)]),
       writer=st.sampled_from(["write_atomic", "atomic_path", "write_together"]))
def test_a_replaced_file_keeps_its_permissions_and_owner(tmp_path_factory, mode, owner, writer):
    """Whatever the old file's mode and owner, the new file has them (as root, who may give a file
    away); never more than the old permissions, no temporary file left."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another owner needs root")
    folder = tmp_path_factory.mktemp("modes")
    target = folder / "out.txt"
    target.write_text("old")
    os.chown(target, *owner)
    os.chmod(target, mode)
    if writer == "write_atomic":
        files.write_atomic(target, "new")
    elif writer == "atomic_path":
        with files.atomic_path(target) as tmp:
            tmp.write_text("new")
    else:
        files.write_together({target: "new", folder / "other.txt": "also"})
    info = os.stat(target)
    assert target.read_text() == "new" and stat.S_IMODE(info.st_mode) == mode and (info.st_uid, info.st_gid) == owner
    assert leftovers(folder) == []


AS_ANOTHER_USER = r"""
import io, os, sys
from contextlib import redirect_stderr
from derivations.cli import main

main(["expand", "A B", "-o", sys.argv[1] + "/warm.txt"])  # every module read while the files are ours
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
for target in sys.argv[2:]:
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["expand", "A B", "-o", target])
    print(code, err.getvalue().strip().replace("\n", " "), flush=True)
"""


def test_a_file_the_person_could_not_write_is_refused_not_replaced(tmp_path):
    """As a user who is not root, in a folder anyone may write: a read-only file of another user is
    refused in one line and stays as it was; a file they may write is replaced, its mode kept."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    folder = Path(tempfile.mkdtemp(prefix="tcircuits-users-"))  # in /tmp, which every user may enter
    try:
        os.chmod(folder, 0o777)
        readonly, shared = folder / "ro.txt", folder / "shared.txt"
        readonly.write_text("keep")
        os.chmod(readonly, 0o444)
        shared.write_text("old")
        os.chmod(shared, 0o666)
        done = subprocess.run([sys.executable, "-c", AS_ANOTHER_USER, str(folder), str(readonly), str(shared)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
        lines = [line for line in done.stdout.splitlines() if not line.startswith("wrote ")]
        assert done.returncode == 0 and len(lines) == 2, done.stdout + done.stderr
        assert lines[0].startswith("2 tcircuits expand: error: output") and "read-only for you (mode 0444)" in lines[0]
        assert readonly.read_text() == "keep" and stat.S_IMODE(os.stat(readonly).st_mode) == 0o444
        assert lines[1].startswith("0"), lines[1]
        assert "A B" in shared.read_text() and stat.S_IMODE(os.stat(shared).st_mode) == 0o666
        assert leftovers(folder) == []
    finally:
        shutil.rmtree(folder)


@FAST
@given(count=st.integers(1, 3), existing=st.lists(st.booleans(), min_size=3, max_size=3),
       fail=st.sampled_from(["none", "write", "rename", "interrupt"]), at=st.integers(0, 2))
def test_files_written_together_are_all_new_or_all_old(tmp_path_factory, monkeypatch, count, existing, fail, at):
    """A checkpoint and its training record (and tokenizer): whatever fails — writing one of them,
    renaming one over the old, Ctrl-C — either every file is new or every file is as it was, and no
    temporary file is left."""
    folder = tmp_path_factory.mktemp("pair")
    paths = [folder / f"f{i}.bin" for i in range(count)]
    for path, old in zip(paths, existing):
        if old:
            path.write_text(f"old {path.name}")
    before = folder_state(folder)
    at = min(at, count - 1)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if fail == "rename" and len(calls) == at + 1 and count > 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real_replace(src, dst)

    data = {path: f"new {path.name}" for path in paths}
    if fail in ("write", "interrupt"):
        def opened(name, *args, **kwargs):
            if str(name).endswith(".tmp") and paths[at].name in str(name):
                raise KeyboardInterrupt if fail == "interrupt" else OSError(errno.EFBIG, "File too large")
            return open(name, *args, **kwargs)

        monkeypatch.setattr(files, "open", opened, raising=False)  # the writer's open, not everyone's
    monkeypatch.setattr(files.os, "replace", replace)
    try:
        files.write_together(data)
        outcome = "written"
    except (OutputError, KeyboardInterrupt):
        outcome = "failed"
    finally:
        monkeypatch.undo()
    after = folder_state(folder)
    assert leftovers(folder) == []
    if outcome == "written":
        assert all(path.read_text() == f"new {path.name}" for path in paths)
    else:
        assert after == before, (fail, at, count)


def test_train_toy_force_replaces_the_checkpoint_and_its_record_together_or_not_at_all(tmp_path):
    """``ulimit -f`` between the checkpoint's size and its record's: the record cannot be written,
    so the old pair stays — never a new checkpoint beside the old record."""
    args = ["train-toy", "--layers", "1", "--steps", "120", "--d-model", "8", "--heads", "1", "--d-head", "4", "--d-vocab", "16",
            "--n-ctx", "16", "--seg-max", "4", "--seg-min", "2", "--batch-size", "2", "--out", str(tmp_path / "m.safetensors"),
            "--quiet", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "derivations.cli", *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    checkpoint, record = os.path.getsize(tmp_path / "m.safetensors"), os.path.getsize(tmp_path / "m.json")
    assert record > checkpoint + 256, (checkpoint, record)  # 120 steps of curve outweigh 8-wide weights
    before = folder_state(tmp_path)
    limit = (checkpoint + record) // 2
    script = (f"import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
              "from derivations.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", script, *args, "--force", "--seed", "3"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 2 and "File too large" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert folder_state(tmp_path) == before and leftovers(tmp_path) == []


SIGNAL_SCRIPT = r"""
import os, sys, time
from pathlib import Path

from derivations import files, folders
from derivations.signals import Stopped, stoppable

site, names = Path(sys.argv[1]), [f"page{i}.html" for i in range(8)]
with stoppable():
    try:
        print("ready", flush=True)
        with folders.OutputFolder(site, names) as new:
            for i, name in enumerate(names):
                (new / name).write_text("new " + name)
                print(f"step {i}", flush=True)
                time.sleep(0.02)
        files.write_together({site.parent / "a.txt": "new a", site.parent / "b.txt": "new b"})
        print("done", flush=True)
        time.sleep(2)  # a signal after the work still finds the handlers
    except Stopped as stop:
        sys.exit(128 + stop.signum)
"""


@FAST
@given(signal_points())
def test_a_stopping_signal_at_any_point_leaves_old_or_new_and_nothing_else(tmp_path_factory, point):
    """SIGINT, SIGTERM or SIGHUP after any step of writing a folder and a pair of files: exit 128 + N
    (or 0 when the work had ended), the old folder and files as they were or the new ones whole, never a
    temporary file or a new or old folder left beside them."""
    import signal as signals

    name, when = point
    base = tmp_path_factory.mktemp("signals")
    site = base / "site"
    names = [f"page{i}.html" for i in range(8)]
    with folders.OutputFolder(site, names) as new:
        for page in names:
            (new / page).write_text("old " + page)
    (base / "a.txt").write_text("old a")
    (base / "b.txt").write_text("old b")
    child = subprocess.Popen([sys.executable, "-c", SIGNAL_SCRIPT, str(site)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=terminal_signals)
    assert child.stdout.readline() == "ready\n"
    for _ in range(when):
        if child.stdout.readline() in ("", "done\n"):
            break
    child.send_signal(getattr(signals, name))
    child.stdout.read()
    code = child.wait(timeout=120)
    assert code in (0, 128 + getattr(signals, name)), code  # 0: the signal came after the work
    pages = {page: (site / page).read_text() for page in names}
    assert set(pages.values()) in ({f"old {p}" for p in names}, {f"new {p}" for p in names}), pages
    pair = ((base / "a.txt").read_text(), (base / "b.txt").read_text())
    assert pair in (("old a", "old b"), ("new a", "new b")), pair
    assert sorted(p.name for p in base.iterdir()) == ["a.txt", "b.txt", "site"] and leftovers(base) == []


def test_a_signal_while_the_new_folder_is_made_leaves_no_staging_folder(tmp_path, monkeypatch):
    """The signal that comes while the staging folder is made is raised as that step ends, inside ``__enter__``,
    where no ``__exit__`` follows: the staging folder and the parents made for it go too (the fuzz test above
    caught one left behind, once, under load)."""
    import signal as signals

    from derivations.signals import Stopped, stoppable

    chmod = os.chmod

    def chmod_then_signal(path, mode):
        chmod(path, mode)
        os.kill(os.getpid(), signals.SIGTERM)  # held: raised when the folder's first step ends

    monkeypatch.setattr(folders.os, "chmod", chmod_then_signal)
    with stoppable(), pytest.raises(Stopped):
        with folders.OutputFolder(tmp_path / "new" / "site", ["page.html"]) as new:
            (new / "page.html").write_text("never")
    assert list(tmp_path.iterdir()) == []  # neither the staging folder nor the parent made for it


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_analyze_stopped_by_sigterm_or_sighup_cleans_up_as_ctrl_c_does(tmp_path, name):
    """``analyze --out`` told to stop while its new folder is being written: exit 128 + N, one line,
    the old report as it was and no new folder left beside it."""
    import signal as signals
    import time

    from tests.test_outputs import ANALYZE, tiny_checkpoint

    checkpoint = tiny_checkpoint(tmp_path)
    report = tmp_path / "report"
    argv = [sys.executable, "-m", "derivations.cli", "analyze", "--checkpoint", str(checkpoint), "--out", str(report), *ANALYZE]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    assert subprocess.run(argv, capture_output=True, env=env, timeout=600).returncode == 0
    before = folder_state(report)
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                             preexec_fn=terminal_signals)
    deadline = time.monotonic() + 600
    while not any(p.name.endswith(".new") for p in tmp_path.iterdir()) and child.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    child.send_signal(getattr(signals, name))
    err = child.stderr.read()
    code = child.wait(timeout=120)
    assert code in (0, 128 + getattr(signals, name)) and "Traceback" not in err, err
    if code:
        assert err.strip().splitlines()[-1] == f"tcircuits: stopped by {name}" and folder_state(report) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors", "report"], list(tmp_path.iterdir())


def test_a_pdf_the_person_did_not_name_is_kept_without_force(tmp_path, monkeypatch):
    """``--pdf`` writes NAME.pdf (or FILE.pdf beside -o FILE): an existing one is refused before any
    work, as -o is, and nothing is written; --force replaces it (pdflatex is not needed to refuse)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "zero-layer.pdf").write_text("mine")
    (tmp_path / "x.pdf").write_text("mine too")
    before = folder_state(tmp_path)
    for argv in (["derive", "zero-layer", "--pdf"], ["expand", "A B", "-o", "x.tex", "--pdf"]):
        code, err = run(argv)
        assert one_line_error(code, err) and "is not replaced: it exists" in err and "--force" in err, err
    assert folder_state(tmp_path) == before


@pytest.mark.parametrize("forgery", ["a person's file listed", "listed files of another user", "a list of another user",
                                     "a list that is a link"])
def test_a_list_of_files_found_in_a_folder_is_verified_not_trusted(tmp_path, forgery):
    """A prepared ``.tcircuits-files.json`` cannot make a person's files the tool's: a file counts as
    written by tcircuits only when it is at a name the command writes, it and the list are this
    user's, and the list is a file; otherwise it is refused by name without --force, and kept with it."""
    import json

    site = tmp_path / "site"
    site.mkdir()
    precious = {"notes.txt": "my notes", "index.html": "my page"}
    for name, text in precious.items():
        (site / name).write_text(text)
    listing = {"written by": "tcircuits", "files": {name: [len(text), hashlib.sha256(text.encode()).hexdigest()]
                                                    for name, text in precious.items()}}
    manifest = site / folders.MANIFEST
    if forgery == "a list that is a link":
        (tmp_path / "list.json").write_text(json.dumps(listing))
        manifest.symlink_to(tmp_path / "list.json")
    else:
        manifest.write_text(json.dumps(listing))
    if forgery in ("listed files of another user", "a list of another user"):
        if os.geteuid() != 0:
            pytest.skip("giving a file to another owner needs root")
        for path in ([site / n for n in precious] if forgery.startswith("listed") else [manifest]):
            os.chown(path, 65534, 65534)
    expected = ("'notes.txt'",) if forgery == "a person's file listed" else ("'index.html'", "'notes.txt'")
    with pytest.raises(OutputError, match="did not write") as refused:
        write_folder(site, "v2")
    assert all(name in str(refused.value) for name in expected), str(refused.value)
    assert all((site / name).read_text() == text for name, text in precious.items())
    write_folder(site, "v2", force=True)
    assert (site / "notes.txt").read_text() == "my notes"


@FAST
@given(long_names())
def test_a_name_as_long_as_the_file_system_allows_is_written(tmp_path_factory, name):
    """Names of 240 to 255 bytes: the temporary name beside it is cut to fit, for a file and for a
    folder written whole; nothing is left behind."""
    folder = tmp_path_factory.mktemp("long")
    files.write_atomic(folder / name, "text")
    write_folder(folder / (name[:-4] + ".dir"))
    assert (folder / name).read_text() == "text" and (folder / (name[:-4] + ".dir") / "index.html").is_file()
    assert leftovers(folder) == []
