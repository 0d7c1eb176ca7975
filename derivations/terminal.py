"""What ``tcircuits`` writes to the terminal, whatever the terminal is: standard output closed
(``>&-``) or full (``> /dev/full``) is one line of :class:`~derivations.errors.OutputError`,
never a traceback; an output encoding that cannot spell ``⊗`` or ``→`` (``PYTHONIOENCODING=ascii``,
``LC_ALL=C``) gets the ASCII spellings the parser reads back (``(x)``, ``->``, ``^T``, ``sum``);
a warning is one line ``tcircuits: warning: …``, without the source line Python would quote.

>>> ascii_spelling("A ⊗ W_OVᵀ → Σ_{h∈H_0}")
'A (x) W_OV^T -> sum_{h in H_0}'
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Iterator

from tensoralg.escape import terminal_safe

from derivations.errors import OutputError

#: ASCII spellings of the symbols the printers and help texts use; the maths ones are the
#: parser's own ASCII input (``(x)``, ``sum_{h in H_1}``, ``^T``, ``*``).
ASCII = {"⊗": "(x)", "→": "->", "←": "<-", "ᵀ": "^T", "Σ": "sum", "∈": " in ", "·": "*", "×": "x", "−": "-",
         "≤": "<=", "≥": ">=", "≠": "!=", "≈": "~", "…": "...", "—": "--", "–": "-", "‘": "'", "’": "'",
         "“": '"', "”": '"', "•": "*", "√": "sqrt", "≔": ":=", "⁻": "^-", "¹": "1", "²": "^2"}


def ascii_spelling(text: str) -> str:
    """``text`` in ASCII: the symbols of :data:`ASCII` spelled out, any other character as
    ``\\uXXXX``; ``∈`` between braces loses the spaces it gains (``h∈H`` and ``h ∈ H`` alike)."""
    out = "".join(ASCII.get(ch, ch) if ord(ch) > 127 else ch for ch in text)
    out = out.replace("  in  ", " in ").replace("  in ", " in ").replace(" in  ", " in ")
    return out.encode("ascii", "backslashreplace").decode("ascii")


class GuardedStream:
    """A text stream (``sys.stdout``, ``sys.stderr``) whose failures are one line of
    :class:`OutputError`: closed (``None``), full or broken (an ``OSError``; a broken pipe
    passes on, for the CLI to end quietly), or an encoding without ``⊗`` (then the text is
    written in its :func:`ascii_spelling`)."""

    def __init__(self, stream, name: str):
        self.stream, self.name = stream, name

    def _fail(self, error: OSError | None) -> OutputError:
        if error is not None:
            _discard_pending(self.stream)
        reason = "it is closed" if error is None else (error.strerror or str(error))
        return OutputError(f"cannot write to {self.name}: {reason}")

    def write(self, text: str) -> int:
        if self.stream is None:
            raise self._fail(None)
        try:
            try:
                return self.stream.write(text)
            except UnicodeEncodeError:  # nothing was written: the whole text is encoded first
                return self.stream.write(ascii_spelling(text))
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as error:  # ValueError: a stream closed inside Python
            raise self._fail(error if isinstance(error, OSError) else None) from None

    def flush(self) -> None:
        if self.stream is None:
            return
        try:
            self.stream.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as error:
            raise self._fail(error if isinstance(error, OSError) else None) from None

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _discard_pending(stream) -> None:
    """Point a failed standard stream at the null device, so that Python's flush at exit
    finds nothing more to complain about."""
    with contextlib.suppress(Exception):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = terminal_safe(" ".join(str(message).split()))
    with contextlib.suppress(Exception):
        print(f"tcircuits: warning: {text}", file=sys.stderr)


@contextlib.contextmanager
def guarded_terminal() -> Iterator[None]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` are :class:`GuardedStream` and
    warnings print as one line; both restored afterwards."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = GuardedStream(sys.stdout, "standard output"), GuardedStream(sys.stderr, "standard error")
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            yield
    finally:
        sys.stdout, sys.stderr = saved
