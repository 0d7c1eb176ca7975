"""Files at the edge of a numeric command: what it reads from a user, bounded before it is
parsed, and what it writes, never left half-written.

Reading: :func:`read_text_file` (a small UTF-8 file, its size checked before it is read) and
:func:`read_json` (JSON held to a size, a nesting depth, integer digits and finite numbers while it
is parsed); every failure is one error (:class:`~numeric_check.errors.InputFileError` unless the
caller names another) that names the file, never a ``RecursionError`` or ``UnicodeDecodeError``.
Our checkpoints, the training records, vocabularies and a Hugging Face folder's JSON are read
through them.

Writing: :mod:`derivations.files`' atomic writer (a temporary file with a name of its own beside
the output, then a rename; links replaced, never followed; FIFOs, devices and system folders
refused) and its folder written whole (:func:`output_folder`), with
:class:`~numeric_check.errors.OutputPathError` as the error, so that a checkpoint, a report or a
training record is never left half-written.

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> write_atomic(folder / "note.txt", '{"d_model": 4}').read_text()
'{"d_model": 4}'
>>> read_json(read_text_file(folder / "note.txt", "the note"), "the note")
{'d_model': 4}
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path
from typing import Any

from derivations import files, folders

from numeric_check.errors import InputFileError, OutputPathError

# -- writing: atomic files and folders, with OutputPathError ---------------------------------

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


# -- reading: JSON and text from files a user hands us, bounded before they are parsed -------

MAX_JSON_CHARS = 10_000_000  # a config is a few hundred characters, a training record a few thousand
MAX_JSON_DEPTH = 32  # a config nests three deep; the C parser would recurse ~100,000 deep on '[[[[…'
MAX_INT_DIGITS = 18  # every size and count fits in 10**18; 10**400 or 5,001 digits are refused as text


def read_json(text: str | bytes, what: str, error: type[Exception] = InputFileError) -> Any:
    """``text`` as JSON, within bounds checked before and while parsing: at most
    :data:`MAX_JSON_CHARS` characters, nesting at most :data:`MAX_JSON_DEPTH` deep, integers
    of at most :data:`MAX_INT_DIGITS` digits, finite numbers only (no ``NaN``/``Infinity``).
    Anything else raises ``error`` (:class:`InputFileError` unless told) naming ``what`` — never a
    ``RecursionError``, ``OverflowError`` or ``UnicodeDecodeError``.

    >>> read_json('{"d_model": 4, "ln_eps": 1e-05}', "a config")
    {'d_model': 4, 'ln_eps': 1e-05}
    >>> read_json('{"d_vocab": 1' + '0' * 400 + '}', "a config")
    Traceback (most recent call last):
    numeric_check.errors.InputFileError: a config is not usable JSON: the integer 1000000000000000000… has 401 digits; sizes have at most 18
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise error(f"{what} is not UTF-8 text (byte {err.start}: {err.reason})") from None
    if len(text) > MAX_JSON_CHARS:
        raise error(f"{what} holds {len(text):,} characters, more than the {MAX_JSON_CHARS:,} read as JSON")
    depth = _json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{what} nests {depth:,} deep, more than the {MAX_JSON_DEPTH} a JSON file of ours may")
    try:
        return json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except (ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError, as are the hooks' refusals
        raise error(f"{what} is not usable JSON: {err}") from None


def read_text_file(path: Path, what: str, error: type[Exception] = InputFileError) -> str:
    """The UTF-8 text of a small input file (a training record, a vocabulary): its size
    checked before it is read, every failure an ``error`` naming ``what`` and the path."""
    try:
        if not path.is_file():
            raise error(f"{what} {str(path)!r} is not a file")
        size = path.stat().st_size
        if size > MAX_JSON_CHARS:
            raise error(f"{what} {str(path)!r} holds {size:,} bytes, more than the {MAX_JSON_CHARS:,} read")
        data = path.read_bytes()
    except OSError as err:
        raise error(f"cannot read {what} {str(path)!r}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{what} {str(path)!r} is not UTF-8 text (byte {err.start}: {err.reason})") from None


def _json_depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` outside strings, in one pass."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _json_int(digits: str) -> int:
    n = len(digits.lstrip("-"))
    if n > MAX_INT_DIGITS:
        raise ValueError(f"the integer {digits[:19]}… has {n:,} digits; sizes have at most {MAX_INT_DIGITS}")
    return int(digits)


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} is beyond a float's range")
    return value


def _json_constant(name: str):
    raise ValueError(f"{name} is not a number a file of ours may hold")


__all__ = ["MAX_INT_DIGITS", "MAX_JSON_CHARS", "MAX_JSON_DEPTH", "OutputFolder", "OutputPathError", "atomic_path", "output_file",
           "output_folder", "read_json", "read_text_file", "writable_dir", "writable_file", "write_atomic", "write_together"]
