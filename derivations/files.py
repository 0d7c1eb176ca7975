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
swapped in whole at the end (:class:`OutputFolder`); a file system mounted inside it is refused,
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
import ctypes
import errno
import hashlib
import json
import os
import re
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
    """``source`` at ``target`` too: a hard link (any file but a folder), else a copy of a link or a
    file on the same file system — never a copy from another one (a mount is refused before)."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as err:
        if err.errno == errno.EXDEV:
            raise
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)


def _names(things: Sequence[str]) -> str:
    shown = ", ".join(_shown(Path(t)) for t in things[:_NAMED_AT_MOST])
    return shown + (f" and {len(things) - _NAMED_AT_MOST} more" if len(things) > _NAMED_AT_MOST else "")


def mount_points() -> frozenset[str]:
    """Every mount point this process sees (``/proc/self/mountinfo``), or nothing where the system
    does not tell; a mount point is found by its device number too (:class:`OutputFolder`)."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read(1 << 24).splitlines()
    except OSError:
        return frozenset()
    found = set()
    for line in lines:
        fields = line.split(b" ")
        if len(fields) > 4:  # the fifth field, with space, tab, newline and backslash written in octal
            point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4])
            found.add(os.fsdecode(point))
    return frozenset(found)


def _device(info: os.stat_result) -> int:
    """The file system a file is on (its device number)."""
    return info.st_dev


def remove_tree(folder: Path | str) -> None:
    """Remove ``folder`` and what it holds, never crossing into another file system: a folder on
    another device (a mount point) is left where it is, with everything in it."""
    try:
        top = os.lstat(folder)
        device = _device(top)
    except OSError:
        return
    if not stat.S_ISDIR(top.st_mode):
        with contextlib.suppress(OSError):
            os.unlink(folder)
        return
    mounts = mount_points()

    def remove(path: str) -> None:
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for entry in entries:
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode):
                    os.unlink(entry.path)
                elif _device(info) == device and os.path.realpath(entry.path) not in mounts:
                    remove(entry.path)
                    os.rmdir(entry.path)

    remove(os.fspath(folder))
    with contextlib.suppress(OSError):
        os.rmdir(folder)


class OutputFolder:
    """A folder written whole: the work writes into a new folder beside ``path`` (the context
    manager's value), which is swapped in at the end in one rename, so a run that fails or is
    interrupted (Ctrl-C, SIGTERM, SIGHUP, a full disk, a file-size limit) leaves the old folder
    exactly as it was.

    ``names`` are the files (relative paths such as ``figures/a.svg``) this run may write; ``known``
    (by default ``names``) every name the command writes in any run (other figure formats).
    Before any work (:meth:`check`, and again on entry and before the swap) the folder is refused
    when it is a file, a mount point or holds one anywhere inside (its files would be copied, then
    deleted with the old folder), under /dev, /proc or /sys, reached through a link that leads
    nowhere, or holds the current directory; when a folder, FIFO or device sits at one of ``names``;
    when one of ``inputs`` sits at one of ``names``; and, unless ``force``, when it holds any file
    tcircuits did not write or that changed since, each named. A file is the tool's own only when
    the list of the files it wrote (:data:`MANIFEST`) — a file of this user, not a link — lists it
    with its size and SHA-256, it is this user's, and its name is one of ``known``: a list found in
    a prepared folder cannot make a person's file the tool's. With ``force`` those at the names
    written are replaced and the others kept: they are linked into the new folder, as are files that
    appear during the work.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp()) / "site"
    >>> with OutputFolder(folder, ["index.html"]) as new:
    ...     _ = (new / "index.html").write_text("<p>hello</p>")
    >>> sorted(p.name for p in folder.iterdir())
    ['.tcircuits-files.json', 'index.html']
    """

    def __init__(self, path: Path | str, names: Iterable[str], *, force: bool = False,
                 inputs: Sequence[Path | str] = (), error: type[Exception] = OutputError,
                 known: Iterable[str] | None = None) -> None:
        self._empty = os.fspath(path) == ""
        self.path = Path(path)
        self.names = frozenset(names) | {MANIFEST}
        self.known = self.names | (frozenset(known) if known is not None else frozenset())
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
        link = dangling_link(self.path)
        if link is not None:
            raise self._fail(f"{_shown(Path(link))} is a link to {_shown(Path(os.readlink(link)))}, which does not "
                             "exist; tcircuits makes no folder through a link (make the folder, or name another)")
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
            if _device(os.stat(real.parent)) != _device(os.stat(real)) or str(real) in mount_points():
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
        """The files listed in ``real``'s manifest, ``{name: [size, sha256]}``, or None when there is
        none, or it is a link, too large, unreadable, or not this user's (then it lists nothing)."""
        try:
            fd = os.open(real / MANIFEST, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                info = os.fstat(f.fileno())
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                    return None
                text = f.read(_MANIFEST_LIMIT + 1)
            if len(text) > _MANIFEST_LIMIT:
                return None
            files = json.loads(text)["files"]
            return {str(k): [int(v[0]), str(v[1])] for k, v in files.items()}
        except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
            return None

    def _scan(self, real: Path) -> list[str]:
        """The entries of ``real`` tcircuits did not write (or that changed since), as relative paths;
        refuses a folder, FIFO or device at a name the tool writes, and a file system mounted anywhere
        inside (found by its device number, or among the system's mount points)."""
        if not real.is_dir():
            return []
        known = self._manifest(real)
        foreign: list[str] = []
        device, uid = _device(os.stat(real)), os.geteuid()
        mounts = [m for m in mount_points() if _inside(m, str(real)) and m != str(real)]
        if mounts:
            raise self._fail(f"{_shown(Path(sorted(mounts)[0]))} in it is a mount point; tcircuits replaces the folder "
                             "whole, and never copies or deletes across file systems: unmount it, or name another folder")

        def walk(folder: Path, prefix: str) -> None:
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                rel = prefix + entry.name
                info = entry.stat(follow_symlinks=False)
                if _device(info) != device:
                    raise self._fail(f"{_shown(real / rel)} in it is on another file system (a mount point); tcircuits "
                                     "replaces the folder whole, and never copies or deletes across file systems: "
                                     "unmount it, or name another folder")
                if rel in self.folders:
                    if not stat.S_ISDIR(info.st_mode):
                        raise self.error(f"output {_shown(real / rel)} is {_kind(info.st_mode)}; expected a folder")
                    walk(Path(entry.path), rel + "/")
                    continue
                if rel in self.names and not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
                    raise self.error(f"output {_shown(real / rel)} is {_kind(info.st_mode)}; expected a regular file "
                                     "(or a new name)")
                if stat.S_ISDIR(info.st_mode):
                    walk_devices(Path(entry.path), rel + "/")
                ours = known is not None and (rel == MANIFEST or (
                    stat.S_ISREG(info.st_mode) and rel in self.known and rel in known and info.st_uid == uid
                    and known[rel][0] == info.st_size and known[rel][1] == _digest(entry.path)))
                if not ours:
                    foreign.append(rel)

        def walk_devices(folder: Path, prefix: str) -> None:
            """A person's folder, kept whole: only looked into for another file system."""
            for entry in os.scandir(folder):
                info = entry.stat(follow_symlinks=False)
                if _device(info) != device:
                    raise self._fail(f"{_shown(real / (prefix + entry.name))} in it is on another file system (a mount "
                                     "point); tcircuits replaces the folder whole, and never copies or deletes across "
                                     "file systems: unmount it, or name another folder")
                if stat.S_ISDIR(info.st_mode):
                    walk_devices(Path(entry.path), prefix + entry.name + "/")

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
        from derivations.signals import held

        real = self._target()
        self._existing(real)
        self._real, self._made = real, []
        with held():  # a stopping signal waits until the new folder is known, so that it is removed
            try:
                for folder in reversed(real.parents):
                    if not os.path.lexists(folder):
                        folder.mkdir()
                        self._made.append(folder)
                self._staging = Path(tempfile.mkdtemp(dir=real.parent, suffix=".new",
                                                      prefix=temporary_prefix(real.parent, real.name, ".new")))
                os.chmod(self._staging, 0o777 & ~_UMASK)
            except OSError as err:
                self._undo()
                raise self._fail(_reason(err)) from None
        return self._staging

    def __exit__(self, kind, value, traceback) -> bool:
        from derivations.signals import held

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
            with held():
                remove_tree(self._staging)  # the partial new folder, or the old one once swapped
                if not done:
                    self._undo()
        return False

    def _undo(self) -> None:
        for folder in reversed(self._made):  # the parents made for a folder that was never swapped in
            with contextlib.suppress(OSError):
                folder.rmdir()

    def _finish(self, real: Path, staging: Path) -> None:
        """List the files written, keep the foreign ones, swap the new folder in."""
        from derivations.signals import held

        written = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
        manifest = {"written by": "tcircuits", "files": {rel: [os.path.getsize(staging / rel), _digest(staging / rel)]
                                                         for rel in written}}
        with open(staging / MANIFEST, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        foreign = self._existing(real) if real.is_dir() else []  # again: files (or mounts) may have come meanwhile
        for rel in foreign:
            if os.path.lexists(staging / rel):  # replaced (--force)
                continue
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            source = real / rel
            if source.is_dir() and not source.is_symlink():
                shutil.copytree(source, staging / rel, symlinks=True, copy_function=_keep)
            else:
                _keep(str(source), str(staging / rel))
        with held():  # both renames happen, or neither
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
