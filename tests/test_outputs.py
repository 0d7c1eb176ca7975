"""Hostile input, round 4 (issue 29): files written whole, a person's files never lost, no
system file replaced.

A folder a command writes (``paper --out``, ``analyze --out``) is written beside itself and
swapped in whole (:class:`derivations.folders.OutputFolder`): interrupted, out of disk or past
``ulimit -f``, the old folder stays exactly as it was; a file in it that tcircuits did not write
is refused by name unless ``--force``, which keeps the files at other names. ``-o -`` and
``-o /dev/stdout`` write to standard output, nothing under /dev is replaced (checked inside a
private mount namespace), ``-o DIR/`` is refused, and a file a command reads — a checkpoint, its
training record — is not replaced by an output without ``--force``.
"""

from __future__ import annotations

import difflib
import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from derivations import files, folders
from derivations.errors import OutputError
from derivations.folders import MANIFEST, OutputFolder
from tests.conftest import FUZZ, needs_pdflatex
from tests.helpers import folder_state, quickly, terminal_signals
from tests.strategies import output_folders, output_texts
from tests.test_hostile_files import one_line_error, run

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["index.html", "page.html", "figures/a.svg", "figures/b.svg"]


def write_site(folder: Path, text: str = "v1", names=NAMES, **options) -> None:
    with OutputFolder(folder, names, **options) as new:
        for name in names:
            (new / name).parent.mkdir(parents=True, exist_ok=True)
            (new / name).write_text(f"{text} {name}")


def beside(folder: Path) -> list[str]:
    """What sits in the folder's parent: the folder and nothing else (no new or old folder left)."""
    return sorted(p.name for p in folder.parent.iterdir())


# -- a folder written whole ---------------------------------------------------------------------


def test_a_new_folder_appears_whole_with_the_list_of_its_files(tmp_path):
    write_site(tmp_path / "a" / "site")
    site = tmp_path / "a" / "site"
    assert sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()) == sorted([MANIFEST, *NAMES])
    assert beside(site) == ["site"] and (site / "figures/a.svg").read_text() == "v1 figures/a.svg"


def test_a_second_run_replaces_the_tools_own_files_and_drops_the_stale_ones(tmp_path):
    site = tmp_path / "site"
    write_site(site)
    write_site(site, "v2", names=NAMES[:3], known=NAMES)  # figures/b.svg is not drawn now: the folder is the new run's
    assert (site / "index.html").read_text() == "v2 index.html" and not (site / "figures/b.svg").exists()
    assert beside(site) == ["site"]


def test_a_persons_files_are_refused_by_name_and_nothing_changes(tmp_path):
    site = tmp_path / "site"
    write_site(site)
    (site / "index.html").write_text("my own page")  # edited since: the person's now
    (site / "notes.txt").write_text("mine")
    before = folder_state(tmp_path)
    with pytest.raises(OutputError, match=r"did not write \(or that changed since\): 'index.html', 'notes.txt'; .*"
                                          r"--force to replace those at the names it writes \('index.html'\)"):
        write_site(site, "v2")
    assert folder_state(tmp_path) == before


def test_force_replaces_at_the_names_written_and_keeps_everything_else(tmp_path):
    site, victim = tmp_path / "site", tmp_path / "victim.txt"
    victim.write_text("precious")
    write_site(site)
    (site / "index.html").write_text("my own page")
    (site / "notes.txt").write_text("mine")
    (site / "figures" / "mine.svg").write_text("<svg/>")
    (site / "drafts" / "deep").mkdir(parents=True)
    (site / "drafts" / "deep" / "d.txt").write_text("draft")
    (site / "link").symlink_to(victim)
    os.mkfifo(site / "pipe")
    theirs = ("notes.txt", "figures/mine.svg", "drafts", "link", "pipe")
    kept = {k: v for k, v in folder_state(tmp_path).items()
            if k == str(victim) or any(k.startswith(str(site / name)) for name in theirs)}
    inode = os.stat(site / "notes.txt").st_ino
    write_site(site, "v2", force=True)
    after = folder_state(tmp_path)
    assert {k: after.get(k) for k in kept} == kept  # every file of the person's, as it was
    assert os.stat(site / "notes.txt").st_ino == inode and (site / "index.html").read_text() == "v2 index.html"
    assert beside(site) == ["site", "victim.txt"]
    with pytest.raises(OutputError, match="'drafts', 'figures/mine.svg', 'link', 'notes.txt', 'pipe'"):
        write_site(site, "v3")  # kept, they are still the person's: the next run asks again


@pytest.mark.parametrize("kind", ["folder", "fifo"])
@pytest.mark.parametrize("force", [False, True])
def test_a_folder_or_fifo_at_an_output_name_is_refused_before_any_work(tmp_path, kind, force):
    site = tmp_path / "site"
    (site / "figures").mkdir(parents=True)
    os.mkfifo(site / "figures/a.svg") if kind == "fifo" else (site / "figures/a.svg").mkdir()
    before = folder_state(tmp_path)
    with pytest.raises(OutputError, match=f"figures/a.svg' is a {'FIFO' if kind == 'fifo' else 'directory'}"):
        OutputFolder(site, NAMES, force=force).check()
    assert folder_state(tmp_path) == before


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two renames"])
@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt(),
                                     OSError(errno.EFBIG, "File too large")], ids=["full", "ctrl-c", "ulimit"])
def test_a_run_that_fails_part_way_leaves_the_old_folder_exactly_as_it_was(tmp_path, failure, exchange):
    site = tmp_path / "site"
    write_site(site)
    before = folder_state(tmp_path)
    with mock.patch.object(folders, "_exchange", folders._exchange if exchange else lambda a, b: False):
        with pytest.raises(type(failure)):
            with OutputFolder(site, NAMES) as new:
                (new / "index.html").write_text("half of the new site")
                raise failure
        assert folder_state(tmp_path) == before and beside(site) == ["site"]
        write_site(site, "v2")
    assert (site / "index.html").read_text() == "v2 index.html" and beside(site) == ["site"]


def test_a_new_folder_that_fails_leaves_nothing_not_even_its_parents(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with OutputFolder(tmp_path / "a" / "b" / "site", NAMES) as new:
            (new / "index.html").write_text("half")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_files_that_arrive_during_the_work_are_kept_or_the_run_refused(tmp_path):
    site = tmp_path / "site"
    write_site(site)
    with pytest.raises(OutputError, match="'arrived.txt'"):
        with OutputFolder(site, NAMES) as new:
            (new / "index.html").write_text("new")
            (site / "arrived.txt").write_text("saved during the run")
    assert (site / "arrived.txt").read_text() == "saved during the run" and beside(site) == ["site"]
    write_site(site, "v2", force=True)
    assert (site / "arrived.txt").read_text() == "saved during the run"


def test_an_input_at_an_output_name_is_refused_even_with_force(tmp_path):
    site = tmp_path / "site"
    write_site(site)
    with pytest.raises(OutputError, match="would replace .*page.html', which it reads"):
        OutputFolder(site, NAMES, force=True, inputs=[site / "page.html"]).check()


def test_folders_that_cannot_be_swapped_whole_are_refused(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    (tmp_path / "to-dev").symlink_to("/dev")
    monkeypatch.chdir(tmp_path)
    for path, why in [("file", "it is a regular file, not a folder"), (".", "it holds the current directory"),
                      (str(tmp_path.parent), "it holds the current directory"), ("/", "it holds the current directory"),
                      ("/dev/shm/site", "a system folder"), ("to-dev/site", "a system folder"), ("/proc", "a system folder"),
                      ("file/site", "is not a folder"), ("", "is empty")]:
        with pytest.raises(OutputError, match=why) as refused:
            OutputFolder(path, NAMES).check()
        assert str(refused.value).count("cannot write") <= 1  # one line, said once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "to-dev"]


@FUZZ
@given(entries=output_folders(NAMES), first=st.booleans(), fail_at=st.integers(-1, len(NAMES)),
       interrupt=st.booleans(), force=st.booleans(), exchange=st.booleans())
def test_a_folder_is_replaced_whole_or_not_at_all(tmp_path_factory, entries, first, fail_at, interrupt, force, exchange):
    """Any old folder, any failure point: the new folder whole with every file of the person's
    at another name as it was (force), or a refusal or failure and nothing changed — never a
    new or old folder left beside it, never a file elsewhere changed."""
    base, elsewhere = tmp_path_factory.mktemp("base"), tmp_path_factory.mktemp("elsewhere")
    victim = elsewhere / "victim.txt"
    victim.write_text("precious")
    site = base / "site"
    if first:
        write_site(site)
    placed = {}
    for rel, kind in entries.items():
        path = site / rel
        if kind in ("ours", "edited") and not (first and rel in NAMES):
            continue
        placed[rel] = kind
        if kind == "edited":
            path.write_text("edited by hand")
            continue
        if kind == "ours":
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(path):
            path.unlink()
        {"file": lambda: path.write_text("mine"), "link": lambda: path.symlink_to(victim),
         "fifo": lambda: os.mkfifo(path), "folder": lambda: (path.mkdir(), (path / "inside.txt").write_text("in"))}[kind]()
    before = folder_state(base)
    refused = (any(k in ("fifo", "folder") and rel in NAMES for rel, k in placed.items())
               or (not force and any(k != "ours" for k in placed.values())))
    outcome = "done"
    with mock.patch.object(folders, "_exchange", folders._exchange if exchange else lambda a, b: False):
        try:
            with OutputFolder(site, NAMES, force=force) as new:
                for i, name in enumerate(NAMES):
                    if i == fail_at:
                        raise KeyboardInterrupt if interrupt else OSError(errno.ENOSPC, "No space left on device")
                    (new / name).parent.mkdir(parents=True, exist_ok=True)
                    (new / name).write_text(f"v2 {name}")
        except OutputError:
            outcome = "refused"
        except (OSError, KeyboardInterrupt):
            outcome = "failed"
    assert victim.read_text() == "precious"
    assert beside(site) == (["site"] if site.exists() else [])
    expected = "refused" if refused else "failed" if 0 <= fail_at < len(NAMES) else "done"
    assert outcome == expected
    if outcome != "done":
        assert folder_state(base) == before
        return
    after = folder_state(base)
    assert all((site / name).read_text() == f"v2 {name}" for name in NAMES)
    for rel, kind in placed.items():
        if rel not in NAMES:  # a person's file at another name: kept, as it was
            assert {k: v for k, v in after.items() if k.startswith(str(site / rel))} == \
                   {k: v for k, v in before.items() if k.startswith(str(site / rel))}


# -- paper --out and analyze --out -------------------------------------------------------------


def tiny_checkpoint(folder: Path) -> Path:
    from numeric_check.model.checkpoint import save_checkpoint
    from tests.helpers import exact_induction_model

    path = folder / "m.safetensors"
    save_checkpoint(exact_induction_model(d_vocab=32, n_ctx=16), path)
    return path


ANALYZE = ["--sequences", "4", "--figure-formats", "svg"]


def test_paper_refuses_a_persons_page_before_any_work(tmp_path):
    site = tmp_path / "companion"
    site.mkdir()
    (site / "index.html").write_text("my own page")
    (site / "figures").mkdir()
    (site / "figures" / "bigrams.svg").write_text("<svg/>")
    before = folder_state(tmp_path)
    with quickly(30):
        code, err = run(["paper", "--out", str(site), "--quiet"])
    assert one_line_error(code, err) and "'figures/bigrams.svg', 'index.html'" in err and "--force" in err
    assert folder_state(tmp_path) == before


@needs_pdflatex  # (without it, --pdf is refused for that first)
@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_paper_pdf_refuses_a_folder_or_fifo_at_a_figure_pdf_before_anything_is_written(tmp_path, kind):
    site = tmp_path / "companion"
    (site / "figures").mkdir(parents=True)
    target = site / "figures" / "bigrams.pdf"
    target.mkdir() if kind == "folder" else os.mkfifo(target)
    before = folder_state(tmp_path)
    with quickly(30):
        code, err = run(["paper", "--out", str(site), "--pdf", "--quiet", "--force"])
    assert one_line_error(code, err) and "bigrams.pdf' is a" in err and folder_state(tmp_path) == before


@pytest.mark.slow
def test_paper_interrupted_while_writing_leaves_the_old_companion(tmp_path, monkeypatch):
    """Ctrl-C after three figures of the second run: the first run's companion, exactly."""
    from numeric_check.reports.paper import build

    site = tmp_path / "companion"
    assert run(["paper", "--out", str(site), "--quiet"])[0] == 0
    before = folder_state(tmp_path)
    saved, calls = build.save_figure, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return saved(*args, **kwargs)

    monkeypatch.setattr(build, "save_figure", interrupted)
    code, err = run(["paper", "--out", str(site), "--quiet", "--seed", "1"])
    assert code == 130 and "interrupted" in err and "Traceback" not in err
    assert folder_state(tmp_path) == before


def test_analyze_refuses_a_persons_file_and_force_keeps_it(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path)
    report = tmp_path / "report"
    assert run(["analyze", "--checkpoint", str(checkpoint), "--out", str(report), *ANALYZE])[0] == 0
    (report / "notes.md").write_text("mine")
    (report / "index.html").write_text("my own page")
    before = folder_state(tmp_path)
    code, err = run(["analyze", "--checkpoint", str(checkpoint), "--out", str(report), *ANALYZE])
    assert one_line_error(code, err) and "'index.html', 'notes.md'" in err and folder_state(tmp_path) == before
    assert run(["analyze", "--checkpoint", str(checkpoint), "--out", str(report), *ANALYZE, "--force"])[0] == 0
    assert (report / "notes.md").read_text() == "mine" and "Circuit analysis" in (report / "index.html").read_text()
    assert beside(report) == ["m.safetensors", "report"]


#: in the child, a real SIGINT (Ctrl-C) to itself as the new report starts to be written into its folder
CTRL_C_WHILE_WRITING = (
    "import os, signal\n"
    "from numeric_check.reports.report import Report\n"
    "write = Report.write\n"
    "def interrupted(self, *args, **kwargs):\n"
    "    os.kill(os.getpid(), signal.SIGINT)\n"
    "    return write(self, *args, **kwargs)\n"
    "Report.write = interrupted\n")


def analyze_process(checkpoint: Path, report: Path, limit: int | None = None, ctrl_c: bool = False) -> subprocess.Popen:
    limit_line = f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n" if limit else ""
    script = (f"import resource, sys\n{limit_line}{CTRL_C_WHILE_WRITING if ctrl_c else ''}"
              "from derivations.cli import main\nsys.exit(main(sys.argv[1:]))")
    return subprocess.Popen([sys.executable, "-c", script, "analyze", "--checkpoint", str(checkpoint), "--out", str(report), *ANALYZE,
                             "--seed", "1"],  # other numbers than the old report's: a figure replaced would show
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=terminal_signals,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_analyze_past_a_file_size_limit_leaves_the_old_report(tmp_path):
    """``ulimit -f`` just under the largest figure: the figures drawn before it fit, then the
    write fails; one line, and the old report exactly (no figure of the new one in it)."""
    checkpoint = tiny_checkpoint(tmp_path)
    report = tmp_path / "report"
    assert run(["analyze", "--checkpoint", str(checkpoint), "--out", str(report), *ANALYZE])[0] == 0
    before = folder_state(tmp_path)
    sizes = [(report / "figures" / f"{name}.svg").stat().st_size for name in ("positivity", "profiles", "composition")]
    limit = max(sizes) - 1
    assert sizes[0] < limit * 0.98  # the first figure fits: the run fails part-way, not at once
    out, err = analyze_process(checkpoint, report, limit=limit).communicate(timeout=300)
    assert "File too large" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert folder_state(tmp_path) == before


@pytest.mark.slow
def test_analyze_stopped_by_ctrl_c_while_writing_leaves_the_old_report(tmp_path):
    """A real SIGINT, sent by the process to itself as the new report starts to be written beside the old
    (a poll for the new folder from here missed it on a loaded machine: the run had finished in between)."""
    checkpoint = tiny_checkpoint(tmp_path)
    report = tmp_path / "report"
    assert run(["analyze", "--checkpoint", str(checkpoint), "--out", str(report), *ANALYZE])[0] == 0
    before = folder_state(tmp_path)
    process = analyze_process(checkpoint, report, ctrl_c=True)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert folder_state(tmp_path) == before


# -- -o: standard output, /dev, folders ----------------------------------------------------------


def test_dash_writes_to_standard_output():
    """(``-o /dev/stdout`` and every other path under /dev: in the private mount namespace below,
    never here, where a failure would replace the machine's /dev/stdout.)"""
    import io

    out = io.StringIO()
    code, err = run(["derive", "zero-layer", "-o", "-"], out)
    assert code == 0 and out.getvalue().startswith("A zero-layer transformer") and "wrote" not in out.getvalue()


@pytest.mark.parametrize("where", ["/proc/self/x", "/sys/x", "/proc/self/fd"])
def test_nothing_under_proc_or_sys_is_replaced(where):
    code, err = run(["derive", "zero-layer", "-o", where])
    assert one_line_error(code, err) and ("system folder" in err or "is a directory" in err)


@pytest.mark.parametrize("suffix", ["/", "/.", ""])
def test_dash_o_folder_slash_is_refused_never_a_file_named_folder(tmp_path, suffix):
    (tmp_path / "existing").mkdir()
    for name in ("newdir", "existing"):
        code, err = run(["derive", "zero-layer", "-o", str(tmp_path / name) + suffix])
        if name == "newdir" and suffix == "":
            assert code == 0 and (tmp_path / "newdir").is_file()  # no slash: a file name
            (tmp_path / "newdir").unlink()
        else:
            assert one_line_error(code, err) and ("names a folder" in err or "is a directory" in err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"] and not any((tmp_path / "existing").iterdir())


UNSHARE_SCRIPT = r"""
set -e
mount -t tmpfs tcircuits-dev /dev
mknod -m 666 /dev/urandom c 1 9; mknod -m 666 /dev/null c 1 3  # torch reads /dev/urandom
ln -s /proc/self/fd/0 /dev/stdin; ln -s /proc/self/fd/1 /dev/stdout; ln -s /proc/self/fd/2 /dev/stderr
ln -s /proc/self/fd /dev/fd; mkdir /dev/shm; echo mine > /dev/null-file; ln -s /dev "$LINK"
entries() { find /dev -mindepth 1 -name 'nvidia*' -prune -o -printf '%p %y %l %s %T@ %m %i\n' | sort; cat /dev/null-file; }
before=$(entries); before_dev=$(stat -c %y /dev)
tc() { "$PYTHON" -m derivations.cli "$@"; }
for where in /dev/stdout /dev/fd/1 /proc/self/fd/1 /dev//stdout; do tc derive zero-layer -o "$where" >> "$OUT"; done
tc attribute --layers 1 --heads 1 --seq-len 3 --target 2 --format json --device cpu -o /dev/stdout >> "$OUT" || [ $? = 1 ]
for target in /dev/null-file /dev/new.txt /dev/fd/5 /dev/shm/x.txt "$LINK/stdout" "$LINK/shm/y.txt"; do
  tc derive zero-layer -o "$target" 2>> "$ERR" >> "$OUT" && echo "wrote $target" >> "$ERR" || true
done
after=$(entries); after_dev=$(stat -c %y /dev)
# (on a GPU machine the CUDA driver makes its nvidia* nodes in /dev on first use: /dev's own time is then not ours)
[ -n "$(find /dev -maxdepth 1 -name 'nvidia*')" ] && after_dev=$before_dev
[ "$before $before_dev" = "$after $after_dev" ] && [ -L /dev/stdout ] && echo same > "$STATE" \
  || { echo "$before $before_dev" > "$STATE.before"; echo "$after $after_dev" > "$STATE.after"; }
"""


def test_dev_stdout_is_written_to_never_replaced_in_a_private_mount_namespace(tmp_path):
    """As root, inside ``unshare -m`` with a tmpfs over /dev (so a failure cannot harm the
    machine): ``-o /dev/stdout`` (derive, attribute) prints, and /dev stays exactly as it was —
    every other path under /dev, directly or through a link to /dev, is refused in one line."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs t /mnt && mknod /mnt/u c 1 9 && head -c 1 /mnt/u > /mnt/x"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"a private mount namespace is not permitted here: {probe.stderr.strip()}")
    out, err, state = tmp_path / "out.txt", tmp_path / "err.txt", tmp_path / "state"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "OUT": str(out), "ERR": str(err),
           "STATE": str(state), "LINK": str(tmp_path / "d"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", UNSHARE_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = out.read_text()
    assert printed.count("A zero-layer transformer") == 4 and '"target": {' in printed  # and attribute's JSON
    errors = err.read_text().splitlines()
    assert len(errors) == 6 and all("is under /dev" in line for line in errors), errors
    assert state.exists(), "".join(difflib.unified_diff(*(Path(f"{state}.{when}").read_text().splitlines(True)
                                                          for when in ("before", "after"))))


# -- a file a command reads is not replaced without --force -------------------------------------


def test_attribute_never_replaces_the_checkpoints_training_record(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path)
    record = tmp_path / "m.json"
    record.write_text('{"a": "training record"}')
    argv = ["attribute", "--checkpoint", str(checkpoint), "--tokens", "1,2,3", "--target", "4", "--format", "json",
            "--device", "cpu"]
    code, err = run([*argv, "-o", str(record)])
    assert one_line_error(code, err) and "this command reads it" in err and "--force" in err
    assert record.read_text() == '{"a": "training record"}'
    code, _ = run([*argv, "-o", str(record), "--force"])
    assert code in (0, 1) and record.read_text().startswith("{") and "training record" not in record.read_text()


def test_attribute_to_standard_output_with_a_suffix_checked_format():
    import io

    out = io.StringIO()
    code, err = run(["attribute", "--layers", "1", "--heads", "1", "--seq-len", "3", "--target", "2", "--format", "json",
                     "--device", "cpu", "-o", "-"], out)
    assert code in (0, 1) and out.getvalue().lstrip().startswith("{"), err


def test_train_toy_keeps_an_existing_checkpoint_and_its_record_without_force(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path)
    (tmp_path / "m.json").write_text("{}")
    before = folder_state(tmp_path)
    tiny = ["--d-vocab", "12", "--n-ctx", "16", "--seg-min", "2", "--seg-max", "6", "--d-model", "16", "--d-head", "8",
            "--heads", "2", "--steps", "1", "--quiet", "--layers", "1", "--device", "cpu"]
    code, err = run(["train-toy", "--out", str(checkpoint), *tiny])
    assert one_line_error(code, err) and "m.safetensors' is not replaced" in err and folder_state(tmp_path) == before
    (tmp_path / "other.json").write_text("a person's file")
    code, err = run(["train-toy", "--out", str(tmp_path / "other.safetensors"), *tiny])
    assert one_line_error(code, err) and "other.json' is not replaced: it exists" in err
    assert not (tmp_path / "other.safetensors").exists()
    assert run(["train-toy", "--out", str(checkpoint), *tiny, "--force"])[0] == 0
    assert (tmp_path / "m.json").read_text() != "{}"


def test_derive_never_replaces_a_training_record_beside_its_checkpoint(tmp_path):
    (tmp_path / "m.safetensors").write_bytes(b"weights")
    (tmp_path / "m.json").write_text("{}")
    code, err = run(["derive", "zero-layer", "--format", "json", "-o", str(tmp_path / "m.json")])
    assert one_line_error(code, err) and "training record of" in err and (tmp_path / "m.json").read_text() == "{}"
    code, err = run(["derive", "zero-layer", "-o", str(tmp_path / "m.safetensors")])
    assert one_line_error(code, err) and "it is a checkpoint" in err
    assert run(["derive", "zero-layer", "--format", "json", "-o", str(tmp_path / "m.json"), "--force"])[0] == 0


@FUZZ
@given(text=output_texts(), force=st.booleans(), argv=st.sampled_from([["derive", "zero-layer"],
                                                                       ["expand", "A ⊗ W", "--format", "json"]]))
def test_any_output_path_is_written_whole_or_refused_and_nothing_else_changes(tmp_path_factory, text, force, argv):
    """Any ``-o`` a person may type: status 0 and the one file named written (a link at it
    replaced, never followed), or one line of error and nothing changed; a checkpoint or its
    record replaced only with --force; never a file named after a folder, never a temporary file."""
    box, elsewhere = tmp_path_factory.mktemp("box"), tmp_path_factory.mktemp("elsewhere")
    victim = elsewhere / "victim.txt"
    victim.write_text("precious")
    (box / "DIR").mkdir()
    (box / "FILE").write_text("a person's file")
    (box / "LINKDIR").symlink_to(elsewhere, target_is_directory=True)
    for folder in (box, box / "DIR"):
        (folder / "EXISTING").write_text("old")
        (folder / "LINK").symlink_to(victim)
        (folder / "DANGLING").symlink_to(folder / "nowhere")
        os.mkfifo(folder / "FIFO")
        (folder / "m.safetensors").write_bytes(b"weights")
        (folder / "m.json").write_text('{"record": 1}')
    where = f"{box}/{''.join(text)}" if any(text) else ""  # joined as text: a trailing / kept
    before, outside = folder_state(box), folder_state(elsewhere)
    with quickly(20):
        code, err = run([*argv, "-o", where, *(["--force"] if force else [])])
    after = folder_state(box)
    assert "Traceback" not in err and victim.read_text() == "precious"
    if code != 0:
        assert one_line_error(code, err) and after == before and folder_state(elsewhere) == outside, err
        return
    folder, name, ending = text
    written = Path(where)
    assert ending == "" and name not in ("", ".", "..") and folder != "FILE/"
    assert written.is_file() and not written.is_symlink() and written.read_text(encoding="utf-8") != "old"
    if folder in ("", "DIR/"):  # where the FIFO, the checkpoint and its record are
        assert name != "FIFO" and (force or name not in ("m.json", "m.safetensors"))
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed <= {str(written), str(written.parent)} | ({str(box / "NEW")} if folder == "NEW/" else set())
    if folder == "LINKDIR/":  # through the link to a folder: that folder gains the one file
        assert set(folder_state(elsewhere)) - set(outside) == {str(elsewhere / name)}
    else:
        assert folder_state(elsewhere) == outside
