"""Writing what a command produces: every output path checked before the work starts, and
each file written atomically — a temporary file beside it, then a rename — so that a run
that fails or is interrupted never leaves a half-written file, and a checkpoint is never
left without the record it was promised.

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> write_atomic(folder / "note.txt", "hello").read_text()
'hello'
>>> sorted(p.name for p in folder.iterdir())  # no temporary file left behind
['note.txt']
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from numeric_check.errors import OutputPathError

_UMASK = os.umask(0o022)  # read once (os.umask can only be read by setting it), then restored
os.umask(_UMASK)


def writable_dir(path: Path | str) -> Path:
    """Create ``path`` (and its parents) and check that a file can be written in it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise OutputPathError(f"cannot write to {str(path)!r}: {error.strerror or error}") from None
    return path


def writable_file(path: Path | str, suffix: str | None = None) -> Path:
    """``path``, checked before any work: the right ``suffix``, not a folder, in a folder
    that can be written (created if need be)."""
    path = Path(path)
    if suffix is not None and path.suffix != suffix:
        raise OutputPathError(f"output {str(path)!r} should end in {suffix!r}")
    if path.is_dir():
        raise OutputPathError(f"output {str(path)!r} is a directory; it must be a file that can be replaced")
    writable_dir(path.parent)
    return path


def write_atomic(path: Path | str, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file in the same folder,
    renamed over ``path`` only once it is complete."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would create it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except OSError as error:
        Path(tmp).unlink(missing_ok=True)
        raise OutputPathError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def replace_atomic(tmp: Path, path: Path) -> Path:
    """Rename a finished temporary file ``tmp`` over ``path`` (for writers that need a file
    name of their own, such as matplotlib's ``savefig``)."""
    try:
        os.replace(tmp, path)
    except OSError as error:
        Path(tmp).unlink(missing_ok=True)
        raise OutputPathError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
    return path
