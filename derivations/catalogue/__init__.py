"""The catalogue: every equation of the paper and its companion notes, as derivations.

Each entry builds a :class:`~derivations.derivation.Derivation` from parameters (layers,
heads, symbolic or concrete heads …); every line is produced by the algebra and every
chain checks numerically (:meth:`Derivation.verify`). The entries live in modules by
topic and register themselves, in the paper's order, when this package is imported.

>>> "two-layer-qk" in names()
True
>>> d = get("zero-layer")
>>> print(d.chains[0].last)
Id ⊗ W_U W_E
>>> get("one-layer", heads=2, concrete=True).verify().ok
True
"""

from derivations.catalogue.registry import (
    DOCUMENT_LIMIT,
    ENTRIES,
    Entry,
    check_count,
    check_flag,
    check_power_terms,
    check_size,
    check_terms,
    descriptions,
    entry,
    get,
    lookup,
    names,
    too_many,
)
from derivations.catalogue.common import INDEXING, NOTATION, SUMS, by_order, layer_factor, stream_product, sum_index
from derivations.catalogue import basics, logits, qk, folding, readings, analyses, induction, marginal, rotary, decoder, decoder_attention  # noqa: F401  (registers the entries)
from derivations.catalogue.qk import by_composition, qk_derivation, truncate

__all__ = [
    "DOCUMENT_LIMIT", "ENTRIES", "Entry", "INDEXING", "NOTATION", "SUMS", "by_composition", "by_order",
    "check_count", "check_flag", "check_power_terms", "check_size", "check_terms", "descriptions", "entry", "get", "layer_factor", "lookup", "names",
    "qk_derivation", "stream_product", "sum_index", "too_many", "truncate",
]
