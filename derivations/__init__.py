"""Transformers as algebra: architectures, path expansions, derivations, documents, CLI.

>>> from derivations import Architecture, expand_logits, catalogue
>>> len(expand_logits(Architecture(2, 3)))   # (1 + 3)^2 paths from the tokens
16
>>> "two-layer-qk" in catalogue.names()
True
"""

from derivations import catalogue
from derivations.architecture import Architecture, head_label
from derivations.derivation import Chain, Derivation, Rule, RULES, Step, verify
from derivations.errors import ArchitectureError, DerivationError, TooManyTerms, UnknownDerivation
from derivations.numeric import Numeric, RandomBindings, Verification
from derivations.paths import LogitExpansion, Path, PathTerm, Source, estimate_logit_terms, expand_logits
from derivations.qk import QKExpansion, QKTerm, estimate_qk_terms, expand_qk
from derivations.render import escape_latex, latex_document, markdown, text, to_json

__all__ = [
    "Architecture", "ArchitectureError", "Chain", "Derivation", "DerivationError", "LogitExpansion", "Numeric",
    "Path", "PathTerm", "QKExpansion", "QKTerm", "RULES", "RandomBindings", "Rule", "Source", "Step",
    "TooManyTerms", "UnknownDerivation", "Verification", "catalogue", "escape_latex", "estimate_logit_terms",
    "estimate_qk_terms", "expand_logits", "expand_qk", "head_label", "latex_document", "markdown", "text",
    "to_json", "verify",
]
