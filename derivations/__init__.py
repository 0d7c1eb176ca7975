"""Transformers as algebra: architectures, path expansions, derivations, documents, CLI."""

from derivations.architecture import Architecture, head_label
from derivations.errors import ArchitectureError, DerivationError, TooManyTerms, UnknownDerivation

__all__ = ["Architecture", "head_label", "ArchitectureError", "DerivationError", "TooManyTerms", "UnknownDerivation"]
