"""Transformers as algebra: architectures, path expansions, derivations, documents, CLI."""

from derivations.architecture import Architecture, head_label
from derivations.errors import ArchitectureError, DerivationError, TooManyTerms, UnknownDerivation
from derivations.paths import LogitExpansion, Path, PathTerm, Source, estimate_logit_terms, expand_logits
from derivations.qk import QKExpansion, QKTerm, estimate_qk_terms, expand_qk

__all__ = ["Architecture", "head_label", "ArchitectureError", "DerivationError", "TooManyTerms", "UnknownDerivation",
           "LogitExpansion", "Path", "PathTerm", "Source", "estimate_logit_terms", "expand_logits",
           "QKExpansion", "QKTerm", "estimate_qk_terms", "expand_qk"]
