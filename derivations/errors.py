"""Errors raised by :mod:`derivations`. Every message says what was wrong and what was expected.

:class:`DerivationError` is a :class:`~tensoralg.errors.TCircuitsError` but not a
:class:`~tensoralg.errors.TensorAlgError`: the algebra's errors pass through derivations
unchanged, and a program that wants every error of the project catches ``TCircuitsError``.
"""

from tensoralg.errors import TCircuitsError


class DerivationError(TCircuitsError):
    """Base class of every error raised by :mod:`derivations`."""


class ArchitectureError(DerivationError, ValueError):
    """An architecture that cannot exist (negative layers, zero heads, unknown option)."""


class TooManyTerms(DerivationError, ValueError):
    """An expansion larger than the configured limit; lower ``max_order``."""


class UnknownDerivation(DerivationError, KeyError):
    """A derivation name that is not in the catalogue."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class OutputError(DerivationError, OSError):
    """A result that cannot be written where asked."""


class LatexError(DerivationError):
    """pdflatex is missing, or failed on a document."""


class HtmlError(DerivationError):
    """Mathematics that cannot be converted to MathML."""


class CommandLineError(DerivationError, ValueError):
    """Options of the command line that contradict each other (what argparse cannot see alone)."""
