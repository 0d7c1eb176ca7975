"""Output folders, written whole: a new folder beside the one asked for, swapped in at the end.

:class:`OutputFolder` serves ``paper --out`` and ``analyze --out``: every name checked before the work, a file
in the folder that tcircuits did not write (or that changed since) refused by name unless ``force``, the list
of files it wrote (:data:`MANIFEST`) verified rather than trusted, a file system mounted inside refused
(:func:`mount_points`; never copied nor emptied), and the old folder removed without crossing into another
file system (:func:`remove_tree`). Single files: :mod:`derivations.files`.
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
from typing import Iterable, Sequence

from derivations.errors import OutputError
from derivations.files import (  # noqa: F401 - the shared checks of single files
    SYSTEM_FOLDERS, _UMASK, _inside, _kind, _reason, _shown, dangling_link, temporary_prefix,
)


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
        self._real, self._made, self._staging = real, [], None
        try:
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
                    raise self._fail(_reason(err)) from None
        except BaseException:  # a failure, or a signal raised as the block ends: no __exit__ will run to clean up
            with held():
                if self._staging is not None:
                    remove_tree(self._staging)
                self._undo()
            raise
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
