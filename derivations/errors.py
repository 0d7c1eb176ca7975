"""Errors raised by :mod:`derivations`. Every message says what was wrong and what was expected."""

from tensoralg.errors import TensorAlgError


class DerivationError(TensorAlgError):
    """Base class of every error raised by :mod:`derivations`."""


class ArchitectureError(DerivationError, ValueError):
    """An architecture that cannot exist (negative layers, zero heads, unknown option)."""


class TooManyTerms(DerivationError, ValueError):
    """An expansion larger than the configured limit; lower ``max_order``."""


class UnknownDerivation(DerivationError, KeyError):
    """A derivation name that is not in the catalogue."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])
