"""One exception hierarchy for the algebra, under the project's root. Messages quote the bad
input and what was expected.

Every error tcircuits raises is a :class:`TCircuitsError`, through exactly one package root:
:class:`TensorAlgError` (the algebra), ``derivations.errors.DerivationError`` (derivations,
documents, the CLI) or ``numeric_check.errors.NumericCheckError`` (models and checks). The
roots do not derive from one another: a checkpoint that will not load is not an algebra error.
A program that wants every error of ours, and nothing else, catches :class:`TCircuitsError`.

>>> issubclass(ShapeMismatch, TCircuitsError), issubclass(ShapeMismatch, ValueError)
(True, True)
"""


class TCircuitsError(Exception):
    """The root of every error raised by tcircuits (the three packages' roots derive from it).

    ``str(error)`` is one line; an error with more to say keeps it in ``detail`` (lines, ``""`` when none),
    which the CLI prints under ``--explain``, and :meth:`explain` gives both.
    """

    detail: str = ""

    def explain(self) -> str:
        """The message, then the :attr:`detail` lines when there are any.

        >>> TCircuitsError("refused").explain()
        'refused'
        """
        return f"{self}\n{self.detail}" if self.detail else str(self)


class TensorAlgError(TCircuitsError):
    """Base class of every error raised by :mod:`tensoralg`."""


class ShapeMismatch(TensorAlgError, ValueError):
    """Two shapes that must agree do not; the message names both.

    ``dims`` holds the pairs of dimensions that disagreed (for shape inference).
    """

    def __init__(self, message: str, dims=()):
        super().__init__(message)
        self.dims = tuple(dims)


class SlotMismatch(TensorAlgError, ValueError):
    """Terms with different numbers of tensor slots were combined."""


class UnknownAtom(TensorAlgError, KeyError):
    """A name that is not a known atom; the message lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0])


#: Line breaks and other whitespace controls, each shown as one space when a message quotes
#: the text: the quote stays on one line and the caret under it stays in place.
_ONE_LINE = str.maketrans({ch: " " for ch in "\n\r\t\v\f\x1c\x1d\x1e\x1f\x85\u2028\u2029"})


def quoted_line(text: str) -> str:
    r"""``text`` as one line, character for character (see :data:`_ONE_LINE`).

    >>> quoted_line("A ⊗\nB")
    'A ⊗ B'
    """
    return text.translate(_ONE_LINE)


#: Characters of the input an error shows on each side of its caret (a long input is cut around it).
ECHO_WINDOW = 60


def caret(text: str, position: int, window: int = ECHO_WINDOW) -> str:
    r"""Two indented lines: ``text`` on one line, cut to ``window`` characters each side of
    ``position`` (``…`` where it is cut), and a caret under ``position``: an error about a
    120,000-character input stays a few lines of at most 2 × ``window`` characters.

    >>> print(caret("A ⊗ B", 2))
      A ⊗ B
        ^
    >>> print(caret("x" * 100 + "!" + "y" * 100, 100, window=4))
      …xxxx!yyyy…
           ^
    """
    line = quoted_line(text)
    start, end = max(0, position - window), min(len(line), position + window + 1)
    shown = ("…" if start else "") + line[start:end] + ("…" if end < len(line) else "")
    return f"  {shown}\n  {' ' * (position - start + (1 if start else 0))}^"


def cut(text: str, limit: int = ECHO_WINDOW) -> str:
    """``text``, or its first ``limit`` characters and ``…`` (input quoted inside a message).

    >>> cut("W" * 100, 5)
    'WWWWW…'
    """
    return text if len(text) <= limit else text[:limit] + "…"


class ParseError(TensorAlgError, ValueError):
    """Malformed expression text. ``position`` is the 0-based offset of the problem."""

    def __init__(self, message: str, text: str, position: int):
        self.text = text
        self.position = position
        super().__init__(f"{message} at position {position}:\n{caret(text, position)}")


class InvalidOrder(TensorAlgError, ValueError):
    """A truncation order that is not an integer >= 0."""


class ExpansionTooLarge(TensorAlgError, ValueError):
    """An expression whose expansion counts more terms than a caller's limit (counted, never built)."""


class NumericUnchecked(TensorAlgError, ValueError):
    """A numeric comparison that was not made, and why: the values leave float64, or an array would be
    larger than its bound (a verdict by expansion stands; the numbers say nothing either way)."""


class NumericTooLarge(NumericUnchecked):
    """An array a numeric check would make that is larger than its bound (sized before it is made)."""


class EmptySum(TensorAlgError, ValueError):
    """An operation that needs at least one term was given none."""


class BindingError(TensorAlgError, ValueError):
    """Numeric bindings that are missing or do not fit the atoms' shapes."""


class UnsafeLatex(TensorAlgError, ValueError):
    """LaTeX offered as mathematics that could do more than print (a command, ``%``, ``$`` …)."""


class ReadingNote(TensorAlgError, UserWarning):
    """A warning, not an error: how a text was read where it could mean something else
    (``AC`` read as the product ``A C``, ``softmax(…)`` as an opaque matrix)."""


class MathMLError(TensorAlgError, ValueError):
    """LaTeX that latex2mathml cannot convert to MathML."""
