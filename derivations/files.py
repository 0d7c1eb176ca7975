"""Writing what a command produces, for every command of ``tcircuits``: every output path
checked before the work starts, and each file written atomically — a temporary file with a
name of its own beside it, then a rename — so that a run that fails or is interrupted (a
full disk, a file-size limit, Ctrl-C) never leaves a half-written file or a temporary one,
and the old file stays as it was.

The rename replaces a symbolic link at the output path instead of writing through it to
the link's target; a FIFO, a device or a socket at the output path is refused (writing to
one would block, or go somewhere else than a file). Errors are one line naming the path;
their class is :class:`~derivations.errors.OutputError` unless the caller names its own
(``numeric_check`` raises its ``OutputPathError``).

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> write_atomic(folder / "note.txt", "hello").read_text()
'hello'
>>> sorted(p.name for p in folder.iterdir())  # no temporary file left behind
['note.txt']
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from tensoralg.escape import terminal_safe

from derivations.errors import OutputError

_UMASK = os.umask(0o022)  # read once (os.umask can only be read by setting it), then restored
os.umask(_UMASK)


def _shown(path: Path) -> str:
    """A path quoted for a one-line message: control characters and bytes that are not UTF-8 escaped."""
    return terminal_safe(repr(str(path)))


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def writable_dir(path: Path | str, error: type[Exception] = OutputError, create: bool = True) -> Path:
    """Check that a file can be written in the folder ``path``, created first (with its
    parents) unless ``create`` is false."""
    path = Path(path)
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
        elif not path.is_dir():
            raise FileNotFoundError(2, "No such directory")
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
        return
    except OSError as err:
        raise error(f"cannot write {_shown(path)}: {_reason(err)}") from None
    if stat.S_ISDIR(mode):
        raise error(f"output {_shown(path)} is a directory; it must be a file that can be replaced")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise error(f"output {_shown(path)} is {kind}; expected a regular file (or a new name)")


def writable_file(path: Path | str, suffix: str | None = None, error: type[Exception] = OutputError,
                  create: bool = False) -> Path:
    """``path``, checked before any work: the right ``suffix``, a regular file, a link or a
    new name (never a folder, FIFO or device), in a folder that can be written (created first
    when ``create`` is true)."""
    path = Path(path)
    if suffix is not None and path.suffix != suffix:
        raise error(f"output {_shown(path)} should end in {suffix!r}")
    check_replaceable(path, error)
    writable_dir(path.parent, error, create)
    return path


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
