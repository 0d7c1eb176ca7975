"""Writing what a numeric command produces: :mod:`derivations.files`' atomic writer (a
temporary file with a name of its own beside the output, then a rename; links replaced,
never followed; FIFOs, devices and system folders refused) and its folder written whole
(:func:`output_folder`), with :class:`~numeric_check.errors.OutputPathError` as the error, so that a checkpoint, a report or a training record is never left half-written.

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> write_atomic(folder / "note.txt", "hello").read_text()
'hello'
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from derivations import files, folders

from numeric_check.errors import OutputPathError

OutputFolder = folders.OutputFolder
output_file = partial(files.output_file, error=OutputPathError)
writable_dir = partial(files.writable_dir, error=OutputPathError)
writable_file = partial(files.writable_file, error=OutputPathError, create=True)
write_atomic = partial(files.write_atomic, error=OutputPathError)
write_together = partial(files.write_together, error=OutputPathError)
atomic_path = partial(files.atomic_path, error=OutputPathError)


def output_folder(path: Path | str, names, *, force: bool = False, inputs=(), known=None) -> folders.OutputFolder:
    """A :class:`~derivations.folders.OutputFolder` (written beside ``path``, swapped in whole) whose
    errors are :class:`OutputPathError`."""
    return folders.OutputFolder(path, names, force=force, inputs=inputs, error=OutputPathError, known=known)

__all__ = ["OutputFolder", "OutputPathError", "atomic_path", "output_file", "output_folder", "writable_dir", "writable_file",
           "write_atomic", "write_together"]
