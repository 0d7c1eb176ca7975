"""Writing what a command produces, for every command of ``tcircuits``: every output path
checked before the work starts, and each file written atomically — a temporary file with a
name of its own beside it, then a rename — so that a run that fails or is interrupted (a
full disk, a file-size limit, Ctrl-C) never leaves a half-written file or a temporary one,
and the old file stays as it was.

The rename replaces a symbolic link at the output path instead of writing through it to
the link's target; a FIFO, a device or a socket at the output path is refused (writing to
one would block, or go somewhere else than a file), and nothing under ``/dev``, ``/proc`` or
``/sys`` is ever replaced: ``-o -`` and ``-o /dev/stdout`` mean standard output
(:func:`output_file`). A file a command reads (a checkpoint, its training record) is not
replaced without ``force``. A folder (``paper --out``, ``analyze --out``) is written beside
itself and swapped in whole at the end (:class:`OutputFolder`). Errors are one line naming
the path; their class is :class:`~derivations.errors.OutputError` unless the caller names its
own (``numeric_check`` raises its ``OutputPathError``).

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> write_atomic(folder / "note.txt", "hello").read_text()
'hello'
>>> sorted(p.name for p in folder.iterdir())  # no temporary file left behind
['note.txt']
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from tensoralg.escape import terminal_safe

from derivations.errors import OutputError

_UMASK = os.umask(0o022)  # read once (os.umask can only be read by setting it), then restored
os.umask(_UMASK)


def _shown(path: Path) -> str:
    """A path quoted for a one-line message: control characters and bytes that are not UTF-8 escaped."""
    return terminal_safe(repr(str(path)))


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


#: What ``-o`` takes to mean standard output (``/dev/stdout`` is never replaced: it is written to).
STANDARD_OUTPUT = ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")
#: Folders of the system's devices and kernel files: nothing in them is ever replaced.
SYSTEM_FOLDERS = ("/dev", "/proc", "/sys")


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _refuse_system(path: Path, error: type[Exception]) -> None:
    """Refuse ``path`` when it, or the folder it would be renamed into, is under /dev, /proc or /sys."""
    places = (os.path.abspath(path), os.path.realpath(path.parent))
    for folder in SYSTEM_FOLDERS:
        if any(_inside(place, folder) for place in places):
            raise error(f"output {_shown(path)} is under {folder}: tcircuits never replaces a file in a system folder "
                        "(use -o - for standard output)")


def writable_dir(path: Path | str, error: type[Exception] = OutputError, create: bool = True) -> Path:
    """Check that a file can be written in the folder ``path``, created first (with its
    parents) unless ``create`` is false."""
    path = Path(path)
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
        elif os.path.lexists(path) and not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "it is not a folder")
        elif not path.is_dir():
            raise FileNotFoundError(errno.ENOENT, "No such directory")
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise error(f"cannot write to {_shown(path)}: {_reason(err)}") from None
    return path


def check_replaceable(path: Path, error: type[Exception] = OutputError) -> None:
    """Refuse an output path that is not a regular file, a symbolic link or absent: a folder,
    a FIFO (writing would block until a reader comes), a device or a socket."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet: the folder check says the rest
        _refuse_system(path, error)
        return
    except OSError as err:
        raise error(f"cannot write {_shown(path)}: {_reason(err)}") from None
    if stat.S_ISDIR(mode):
        raise error(f"output {_shown(path)} is a directory; it must be a file that can be replaced")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise error(f"output {_shown(path)} is {_kind(mode)}; expected a regular file (or a new name)")
    _refuse_system(path, error)


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket"
            if stat.S_ISSOCK(mode) else "a link" if stat.S_ISLNK(mode) else "a regular file" if stat.S_ISREG(mode)
            else "a device")


def check_kept(path: Path, *, inputs: Sequence[Path | str] = (), force: bool = False, new: bool = False,
               error: type[Exception] = OutputError) -> None:
    """Refuse to replace, unless ``force``, an existing ``path`` that is one of ``inputs`` (or in a
    folder among them), a checkpoint (``.safetensors``) or the training record beside one, or any
    existing file when ``new``: a file the person keeps is never replaced by another output."""
    if force or not os.path.lexists(path):
        return
    real = os.path.realpath(path)
    why = None
    for item in inputs:
        source = os.path.realpath(item)
        if real == source:
            why = "this command reads it"
            break
        if os.path.isdir(source) and _inside(real, source):
            why = f"it is in {_shown(Path(item))}, which this command reads"
            break
    if why is None and path.suffix == ".safetensors":
        why = "it is a checkpoint"
    elif why is None and path.suffix == ".json" and os.path.lexists(path.with_suffix(".safetensors")):
        why = f"it is the training record of {_shown(path.with_suffix('.safetensors'))}"
    elif why is None and new:
        why = "it exists"
    if why is not None:
        raise error(f"output {_shown(path)} is not replaced: {why}; choose another name, or --force to replace it")


def writable_file(path: Path | str, suffix: str | None = None, error: type[Exception] = OutputError,
                  create: bool = False, *, inputs: Sequence[Path | str] = (), force: bool = False,
                  new: bool = False) -> Path:
    """``path``, checked before any work: the right ``suffix``, a regular file, a link or a
    new name (never a folder, FIFO or device, nothing under /dev), not a file the person keeps
    (:func:`check_kept`), in a folder that can be written (created first when ``create`` is true)."""
    text = os.fspath(path)
    if text == "":
        raise error("output '' is empty; expected a file name")
    if text.endswith(("/", "/.", "/..")) or text in (".", ".."):
        raise error(f"output {terminal_safe(repr(text))} names a folder; expected a file name in it, such as "
                    f"{_shown(Path(text) / ('out' + (suffix or '.txt')))}")
    path = Path(path)
    if suffix is not None and path.suffix != suffix:
        raise error(f"output {_shown(path)} should end in {suffix!r}")
    check_replaceable(path, error)
    check_kept(path, inputs=inputs, force=force, new=new, error=error)
    writable_dir(path.parent, error, create)
    return path


def output_file(text: str | Path | None, suffix: str | None = None, error: type[Exception] = OutputError, *,
                inputs: Sequence[Path | str] = (), force: bool = False) -> Path | None:
    """The file ``-o TEXT`` names, checked as :func:`writable_file` does, or None for standard
    output: no ``-o``, ``-o -`` or ``-o /dev/stdout`` (written to, never replaced)."""
    if text is None or text == "-" or os.path.abspath(os.fspath(text) or ".") in STANDARD_OUTPUT[1:]:
        return None
    return writable_file(text, suffix, error, inputs=inputs, force=force)


@contextlib.contextmanager
def atomic_path(path: Path | str, error: type[Exception] = OutputError) -> Iterator[Path]:
    """A fresh temporary file name beside ``path`` (unique per write) for a writer that needs a
    name of its own (matplotlib's ``savefig``); renamed over ``path`` when the block ends, removed
    when it fails. An ``OSError`` becomes one line of ``error``; anything else (Ctrl-C) passes on."""
    path = Path(path)
    check_replaceable(path, error)
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would create it, not mkstemp's 0600
        os.close(fd)
    except OSError as err:
        raise error(f"cannot write {_shown(path)}: {_reason(err)}") from None
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)  # a link at ``path`` is replaced, never followed
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise error(f"cannot write {_shown(path)}: {_reason(err)}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path | str, data: str | bytes, error: type[Exception] = OutputError) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file in the same folder,
    renamed over ``path`` only once it is complete."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path, error) as tmp, open(tmp, "wb") as f:
        f.write(payload)
    return Path(path)


# -- a folder written whole ------------------------------------------------------------------

#: The list of the files tcircuits wrote into a folder (each one's size and SHA-256), written with them:
#: on the next run a file is the tool's own only while it is listed there, unchanged.
MANIFEST = ".tcircuits-files.json"
_MANIFEST_LIMIT = 1 << 20
_NAMED_AT_MOST = 5


def _digest(path: Path | str) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def _exchange(a: Path, b: Path) -> bool:
    """Swap the paths ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where
    the system or the file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    at_cwd, exchange = -100, 2
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _keep(source: str, target: str) -> None:
    """``source`` at ``target`` too: a hard link (any file but a folder), else a copy of a link or a file."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)


def _names(things: Sequence[str]) -> str:
    shown = ", ".join(_shown(Path(t)) for t in things[:_NAMED_AT_MOST])
    return shown + (f" and {len(things) - _NAMED_AT_MOST} more" if len(things) > _NAMED_AT_MOST else "")


class OutputFolder:
    """A folder written whole: the work writes into a new folder beside ``path`` (the context
    manager's value), which is swapped in at the end in one rename, so a run that fails or is
    interrupted (Ctrl-C, a full disk, a file-size limit) leaves the old folder exactly as it was.

    ``names`` are the files (relative paths such as ``figures/a.svg``) the tool may write.
    Before any work (:meth:`check`, and again on entry) the folder is refused when it is a file,
    a mount point, under /dev, /proc or /sys, or holds the current directory; when a folder, FIFO
    or device sits at one of ``names``; when one of ``inputs`` sits at one of ``names``; and, unless
    ``force``, when it holds any file tcircuits did not write (:data:`MANIFEST`) or that changed
    since, each named. With ``force`` those at the names written are replaced and the others
    kept: they are linked into the new folder, as are files that appear during the work.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp()) / "site"
    >>> with OutputFolder(folder, ["index.html"]) as new:
    ...     _ = (new / "index.html").write_text("<p>hello</p>")
    >>> sorted(p.name for p in folder.iterdir())
    ['.tcircuits-files.json', 'index.html']
    """

    def __init__(self, path: Path | str, names: Iterable[str], *, force: bool = False,
                 inputs: Sequence[Path | str] = (), error: type[Exception] = OutputError) -> None:
        self._empty = os.fspath(path) == ""
        self.path = Path(path)
        self.names = frozenset(names) | {MANIFEST}
        self.folders = frozenset(str(p) for name in self.names for p in Path(name).parents if str(p) != ".")
        self.force, self.inputs, self.error = force, tuple(inputs), error
        self._staging: Path | None = None
        self._made: list[Path] = []

    def check(self) -> "OutputFolder":
        """Every check, before any work; nothing is created or changed."""
        self._existing(self._target())
        return self

    # -- checks --------------------------------------------------------------------------------

    def _fail(self, why: str) -> Exception:
        return self.error(f"cannot write to {_shown(self.path)}: {why}")

    def _target(self) -> Path:
        """The folder's real path, checked: a folder or nothing, in a folder that takes a new one."""
        if self._empty:
            raise self.error("output folder '' is empty; expected a folder name")
        real = Path(os.path.realpath(self.path))
        for folder in SYSTEM_FOLDERS:
            if _inside(str(real), folder):
                raise self._fail(f"it is under {folder}" + ("" if str(real) == os.path.abspath(self.path) else
                                 f" (as {_shown(real)})") + ": tcircuits never replaces a file in a system folder")
        try:
            here = os.getcwd()
        except OSError:
            here = None
        if real == Path(real.anchor) or (here is not None and _inside(here, str(real))):
            raise self._fail("it holds the current directory, and the folder is replaced whole at the end; "
                             f"name a new folder, such as {_shown(self.path / 'companion')}")
        try:
            mode = os.stat(real).st_mode
            if not stat.S_ISDIR(mode):
                raise self._fail(f"it is {_kind(mode)}, not a folder")
            if os.stat(real.parent).st_dev != os.stat(real).st_dev:
                raise self._fail("it is a mount point, and the folder is replaced whole at the end; name a folder in it")
        except (FileNotFoundError, NotADirectoryError):  # nothing there yet: its parents are checked next
            pass
        except self.error:  # ours, already one line (OutputError is an OSError too)
            raise
        except OSError as err:
            raise self._fail(_reason(err)) from None
        ancestor = real.parent
        while not os.path.lexists(ancestor):
            ancestor = ancestor.parent
        try:
            if not ancestor.is_dir():
                raise self._fail(f"{_shown(ancestor)} is not a folder")
            with tempfile.TemporaryFile(dir=ancestor):
                pass
        except self.error:  # ours, already one line (OutputError is an OSError too)
            raise
        except OSError as err:
            raise self._fail(_reason(err)) from None
        return real

    def _manifest(self, real: Path) -> dict | None:
        """The files listed in ``real``'s manifest, ``{name: [size, sha256]}``, or None."""
        try:
            with open(real / MANIFEST, "rb") as f:
                text = f.read(_MANIFEST_LIMIT + 1)
            if len(text) > _MANIFEST_LIMIT or os.path.islink(real / MANIFEST):
                return None
            files = json.loads(text)["files"]
            return {str(k): [int(v[0]), str(v[1])] for k, v in files.items()}
        except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None

    def _scan(self, real: Path) -> list[str]:
        """The entries of ``real`` tcircuits did not write (or that changed since), as relative paths;
        refuses a folder, FIFO or device at a name the tool writes."""
        if not real.is_dir():
            return []
        known = self._manifest(real)
        foreign: list[str] = []

        def walk(folder: Path, prefix: str) -> None:
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                rel = prefix + entry.name
                info = entry.stat(follow_symlinks=False)
                if rel in self.folders:
                    if not stat.S_ISDIR(info.st_mode):
                        raise self.error(f"output {_shown(real / rel)} is {_kind(info.st_mode)}; expected a folder")
                    walk(Path(entry.path), rel + "/")
                    continue
                if rel in self.names and not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
                    raise self.error(f"output {_shown(real / rel)} is {_kind(info.st_mode)}; expected a regular file "
                                     "(or a new name)")
                ours = known is not None and (rel == MANIFEST or (
                    stat.S_ISREG(info.st_mode) and rel in known and known[rel][0] == info.st_size
                    and known[rel][1] == _digest(entry.path)))
                if not ours:
                    foreign.append(rel)

        try:
            walk(real, "")
        except self.error:  # ours, already one line (OutputError is an OSError too)
            raise
        except OSError as err:
            raise self._fail(_reason(err)) from None
        return foreign

    def _existing(self, real: Path) -> list[str]:
        """:meth:`_scan`, then the refusals of what is foreign (see the class)."""
        for item in self.inputs:
            rel = os.path.relpath(os.path.realpath(item), real)
            if rel in self.names or rel in self.folders or any(_inside(rel, f) for f in self.folders):
                raise self.error(f"the output in {_shown(self.path)} would replace {_shown(Path(item))}, which it "
                                 "reads; choose another folder")
        foreign = self._scan(real)
        if foreign and not self.force:
            clash = sorted(set(foreign) & self.names)
            raise self._fail(
                f"it holds files tcircuits did not write (or that changed since): {_names(foreign)}; choose a new "
                "folder, or --force to " + (f"replace those at the names it writes ({_names(clash)}) and keep the "
                                            "others" if clash else "keep them beside the new files"))
        return foreign

    # -- the work ------------------------------------------------------------------------------

    def __enter__(self) -> Path:
        real = self._target()
        self._existing(real)
        self._real, self._made = real, []
        try:
            for folder in reversed(real.parents):
                if not os.path.lexists(folder):
                    folder.mkdir()
                    self._made.append(folder)
            self._staging = Path(tempfile.mkdtemp(dir=real.parent, prefix=f".{real.name}.", suffix=".new"))
            os.chmod(self._staging, 0o777 & ~_UMASK)
        except OSError as err:
            self._undo()
            raise self._fail(_reason(err)) from None
        return self._staging

    def __exit__(self, kind, value, traceback) -> bool:
        done = False
        try:
            if kind is None:
                try:
                    self._finish(self._real, self._staging)
                except self.error:
                    raise
                except OSError as err:
                    raise self._fail(_reason(err)) from None
                done = True
        finally:
            shutil.rmtree(self._staging, ignore_errors=True)  # the partial new folder, or the old one once swapped
            if not done:
                self._undo()
        return False

    def _undo(self) -> None:
        for folder in reversed(self._made):  # the parents made for a folder that was never swapped in
            with contextlib.suppress(OSError):
                folder.rmdir()

    def _finish(self, real: Path, staging: Path) -> None:
        """List the files written, keep the foreign ones, swap the new folder in."""
        written = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
        manifest = {"written by": "tcircuits", "files": {rel: [os.path.getsize(staging / rel), _digest(staging / rel)]
                                                         for rel in written}}
        with open(staging / MANIFEST, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        foreign = self._existing(real) if real.is_dir() else []  # again: files may have come during the work
        for rel in foreign:
            if os.path.lexists(staging / rel):  # replaced (--force)
                continue
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            source = real / rel
            if source.is_dir() and not source.is_symlink():
                shutil.copytree(source, staging / rel, symlinks=True, copy_function=_keep)
            else:
                _keep(str(source), str(staging / rel))
        if not real.is_dir():
            os.rename(staging, real)
            return
        os.chmod(staging, stat.S_IMODE(os.stat(real).st_mode))
        if not _exchange(staging, real):
            aside = staging.with_name(staging.name[:-4] + ".old")
            os.rename(real, aside)
            try:
                os.rename(staging, real)
            except BaseException:
                os.rename(aside, real)
                raise
            os.rename(aside, staging)  # removed by __exit__
