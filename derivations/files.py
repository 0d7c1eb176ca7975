"""Writing what a command produces, for every command of ``tcircuits``: every output path
checked before the work starts, and each file written atomically — a temporary file with a
name of its own beside it, then a rename — so that a run that fails or is interrupted (a
full disk, a file-size limit, Ctrl-C) never leaves a half-written file or a temporary one,
and the old file stays as it was. A file replaced keeps its permissions (and its owner and
group where the process may set them); a file the person could not write is refused, not
replaced; a temporary name fits wherever the final name fits (a 255-byte name included).

The rename replaces a symbolic link at the output path instead of writing through it to
the link's target; a FIFO, a device or a socket at the output path is refused (writing to
one would block, or go somewhere else than a file), and nothing under ``/dev``, ``/proc`` or
``/sys`` is ever replaced: ``-o -`` and ``-o /dev/stdout`` mean standard output
(:func:`output_file`). A file a command reads (a checkpoint, its training record) is not
replaced without ``force``. Files that belong together (a checkpoint and its training record)
are replaced together or not at all (:func:`write_together`). No folder is made through a link
that leads nowhere yet. A folder (``paper --out``, ``analyze --out``) is written beside itself and
swapped in whole at the end (:class:`~derivations.folders.OutputFolder`); a file system mounted inside it is refused,
never copied nor emptied. Errors are one line naming
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
import errno
import json
import os
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


def dangling_link(path: Path | str) -> str | None:
    """The first component of ``path`` that is a symbolic link to nothing (a folder made at ``path``
    would be made at the link's target, wherever it points), or None."""
    parts = Path(os.path.abspath(path)).parts
    for i in range(1, len(parts) + 1):
        prefix = os.path.join(*parts[:i])
        if os.path.islink(prefix) and not os.path.exists(prefix):
            return prefix
        if not os.path.lexists(prefix):
            return None
    return None


def writable_dir(path: Path | str, error: type[Exception] = OutputError, create: bool = True) -> Path:
    """Check that a file can be written in the folder ``path``, created first (with its
    parents) unless ``create`` is false; never made through a link that leads nowhere."""
    path = Path(path)
    link = dangling_link(path)
    if link is not None:
        raise error(f"cannot write to {_shown(path)}: {_shown(Path(link))} is a link to {_shown(Path(os.readlink(link)))}, "
                    "which does not exist; tcircuits makes no folder through a link (make the folder, or name another)")
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
    """Refuse an output path that is not a regular file, a symbolic link or absent — a folder, a
    FIFO (writing would block until a reader comes), a device or a socket — and a file the person
    could not write (read-only to them): tcircuits replaces only what they could have changed."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet: the folder check says the rest
        _refuse_system(path, error)
        return
    except OSError as err:
        raise error(f"cannot write {_shown(path)}: {_reason(err)}") from None
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        raise error(f"output {_shown(path)} is a directory; it must be a file that can be replaced")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise error(f"output {_shown(path)} is {_kind(mode)}; expected a regular file (or a new name)")
    _refuse_system(path, error)
    if stat.S_ISREG(mode) and not _may_write(path):
        raise error(f"output {_shown(path)} is read-only for you (mode {stat.S_IMODE(mode):04o}); tcircuits does not "
                    "replace a file you could not write: make it writable, or choose another name")


def _may_write(path: Path) -> bool:
    """Whether this process may write the file ``path`` (as the effective user, where the system tells)."""
    effective = os.access in os.supports_effective_ids
    return os.access(path, os.W_OK, effective_ids=effective, follow_symlinks=False)


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


#: Bytes a file name may take where the system does not say (``NAME_MAX`` on Linux and macOS).
NAME_MAX = 255
_RANDOM = 8  # the random letters tempfile puts in a name


def _name_max(folder: Path | str) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return NAME_MAX


def temporary_prefix(folder: Path | str, name: str, suffix: str) -> str:
    """``.NAME.`` for a temporary name beside ``folder/name`` (``.NAME.xxxxxxxx`` + ``suffix``), ``NAME``
    cut (at a character) so that the whole fits in a name of the folder's file system: a temporary
    name fits wherever the final name fits.

    >>> len(os.fsencode(temporary_prefix("/tmp", "a" * 255, ".tmp"))) + 8 + len(".tmp") <= 255
    True
    """
    room = max(_name_max(folder) - _RANDOM - len(os.fsencode(suffix)) - 2, 1)
    raw = os.fsencode(name)
    if len(raw) > room:
        cut = raw[:room]
        while cut and (cut[-1] & 0xC0) == 0x80:  # not in the middle of a UTF-8 character
            cut = cut[:-1]
        if cut and cut[-1] >= 0xC0:
            cut = cut[:-1]
        raw = cut or raw[:room]
    return "." + os.fsdecode(raw) + "."


def _fresh(path: Path, error: type[Exception]) -> Path:
    """A new empty temporary file beside ``path`` with ``path``'s permissions (and owner and group,
    where the process may set them) when a regular file is there, else those ``open()`` gives."""
    try:
        info = os.lstat(path)
    except OSError:
        info = None
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path.parent, path.name, ".tmp"),
                                    suffix=".tmp")
    except OSError as err:
        raise error(f"cannot write {_shown(path)}: {_reason(err)}") from None
    try:
        if info is not None and stat.S_ISREG(info.st_mode):
            if (info.st_uid, info.st_gid) != (os.geteuid(), os.getegid()):
                for uid, gid in ((info.st_uid, info.st_gid), (-1, info.st_gid)):
                    try:
                        os.fchown(fd, uid, gid)
                        break
                    except OSError:  # another user's file: the owner (or the group too) cannot be given away
                        continue
            os.fchmod(fd, stat.S_IMODE(info.st_mode) & 0o777)  # no set-user-ID bit carried to new content
        else:
            os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would create it, not mkstemp's 0600
    except OSError as err:
        os.close(fd)
        os.unlink(name)
        raise error(f"cannot write {_shown(path)}: {_reason(err)}") from None
    os.close(fd)
    return Path(name)


@contextlib.contextmanager
def atomic_paths(paths: Sequence[Path | str], error: type[Exception] = OutputError) -> Iterator[list[Path]]:
    """Fresh temporary file names beside each of ``paths`` (unique per write, with the permissions of
    the file each replaces) for writers that need names of their own; when the block ends they are
    renamed over ``paths`` together — all of them or, when one rename fails, none (the files already
    renamed are put back) — and removed when it fails. An ``OSError`` becomes one line of ``error``;
    anything else (Ctrl-C, SIGTERM) passes on, the temporary files removed."""
    from derivations.signals import held

    paths = [Path(p) for p in paths]
    for path in paths:
        check_replaceable(path, error)
    temps: list[Path] = []
    try:
        for path in paths:
            temps.append(_fresh(path, error))
        yield temps
        with held():
            _swap_in(list(zip(temps, paths)))
    except OSError as err:
        _unlink(temps)
        if isinstance(err, error):
            raise
        where = next((p for t, p in zip(temps, paths) if err.filename in (str(t), str(p))), paths[0])
        raise error(f"cannot write {_shown(where)}: {_reason(err)}") from None
    except BaseException:
        _unlink(temps)
        raise


def _unlink(paths: Iterable[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


def _swap_in(pairs: list[tuple[Path, Path]]) -> None:
    """Rename each temporary file over its path; when one rename fails, the paths already replaced get
    their old files back (kept meanwhile as hard links) before the error passes on."""
    if len(pairs) == 1:
        os.replace(*pairs[0])  # a link at the path is replaced, never followed
        return
    kept: list[tuple[Path, Path | None]] = []  # (path, its old file's hard link or None when there was none)
    try:
        for tmp, path in pairs:
            old = None
            if os.path.lexists(path):
                old = tmp.with_name(tmp.name[:-4] + ".old")
                os.link(path, old, follow_symlinks=False)
            kept.append((path, old))
            os.replace(tmp, path)
    except BaseException:
        for path, old in reversed(kept):
            with contextlib.suppress(OSError):
                if old is not None:
                    os.replace(old, path)
                elif os.path.lexists(path):
                    path.unlink()
        raise
    finally:
        _unlink(old for _, old in kept if old is not None and os.path.lexists(old))


@contextlib.contextmanager
def atomic_path(path: Path | str, error: type[Exception] = OutputError) -> Iterator[Path]:
    """A fresh temporary file name beside ``path`` (unique per write) for a writer that needs a
    name of its own (matplotlib's ``savefig``); renamed over ``path`` when the block ends, removed
    when it fails (:func:`atomic_paths` for one path)."""
    with atomic_paths([path], error) as (tmp,):
        yield tmp


def write_together(files: dict, error: type[Exception] = OutputError) -> list[Path]:
    """Write each ``{path: data}`` (text as UTF-8) to a temporary file beside it, then rename them all
    over their paths together: files that belong together (a checkpoint and its training record) are
    replaced together or not at all."""
    items = [(Path(path), data.encode("utf-8") if isinstance(data, str) else data) for path, data in files.items()]
    with atomic_paths([path for path, _ in items], error) as temps:
        for tmp, (_, payload) in zip(temps, items):
            with open(tmp, "wb") as f:
                f.write(payload)
    return [path for path, _ in items]


def write_atomic(path: Path | str, data: str | bytes, error: type[Exception] = OutputError) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file in the same folder,
    renamed over ``path`` only once it is complete."""
    return write_together({path: data}, error)[0]


# -- a folder written whole ------------------------------------------------------------------

#: The list of the files tcircuits wrote into a folder (each one's size and SHA-256), written with them:
#: on the next run a file is the tool's own only while it is listed there, unchanged.
