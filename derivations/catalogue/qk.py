"""The attention scores of a later head expanded into paths: direct, Q-, K- and QK-composition."""

from __future__ import annotations

from itertools import accumulate

import sympy as sp

from tensoralg import Product, TensorSum, atom, d_head, sandwich, term
from tensoralg.expr import check_order

from derivations.architecture import Architecture, head_label
from derivations.catalogue.common import (INDEXING, NOTATION, SCORES, SUMS, architecture, head_name, per_layer,
                                          scaled_scores, stream_product, sum_index)
from derivations.catalogue.registry import DOCUMENT_LIMIT, check_flag, entry, too_many
from derivations.derivation import Chain, Derivation
from derivations.errors import DerivationError
from derivations.paths import stream_entries
from derivations.document import Math, math, prose

#: The note on ``qk_only`` positions, with and without a layer norm.
QK_ONLY_NOTE = {
    True: "Positions that enter the queries and keys only are added to them after the layer norm (unscaled), so "
          "each pair of inputs (tokens, positions) has its own sum.",
    False: "Positions that enter the queries and keys only are added to the residual stream as the queries and keys "
           "read it (not to the stream the heads write into), so each pair of inputs (tokens, positions) has its "
           "own sum.",
}

COMPOSITION_LABELS = {(False, False): "direct", (True, False): "Q-composition",
                      (False, True): "K-composition", (True, True): "QK-composition"}


def by_composition(expr: TensorSum) -> list[tuple[str, TensorSum]]:
    groups: dict[tuple[bool, bool], dict] = {}
    for t in expr:
        key = (any(a.name == "A" for a in t.words[0]), any(a.name == "A" for a in t.words[1]))
        groups.setdefault(key, {})[t.words] = t.coeff
    order = list(COMPOSITION_LABELS)
    return [(COMPOSITION_LABELS[k], TensorSum(groups[k], n_slots=3)) for k in order if k in groups]


def truncate(expr: TensorSum, max_order: int) -> TensorSum:
    """Keep the terms whose query and key sides pass through at most ``max_order`` heads together."""
    kept = {t.words: t.coeff for t in expr if sum(a.name == "A" for w in t.words[:2] for a in w) <= max_order}
    return TensorSum(kept, n_slots=expr.n_slots)


def qk_sides(arch: Architecture, layer: int, concrete: bool, letter: str) -> list[tuple[str, object]]:
    """``(input, stream)`` for each input of one side of the scores of a layer-``layer`` head
    (lazy: nothing is expanded yet). The layer norm's scale ``N^{Ll}`` leads the residual
    stream; ``qk_only`` positions join after the layer norm, unscaled (as in the model)."""
    lead = term(atom("N", f"L{layer}"), None) if arch.layer_norm else None
    sides = []
    for e in stream_entries(arch, layer):
        stream = stream_product(arch, e.first_layer, layer, e.word, concrete, letter)
        sides.append((e.source.input_key, Product([lead, stream]) if lead is not None else stream))
    if arch.positional == "qk_only":
        sides.append(("position", term(None, atom("W_pos"))))
    return sides


def exact_counts(expr, top: int) -> list[int]:
    """``[n_0, …, n_top]``: how many terms of each exact order an expression expands to."""
    if not isinstance(expr, Product):
        return [len(expr)] + [0] * top
    counts = expr.order_counts(top)
    return counts + [0] * (top + 1 - len(counts))


def check_pairs(what: str, q, k, layer: int, max_order: int | None) -> None:
    """Refuse a bilinear form of more than :data:`DOCUMENT_LIMIT` terms before building it
    (counted by order with Python ints: O(layers × max_order), nothing built)."""
    top = 2 * layer if max_order is None else min(max_order, 2 * layer)
    qn, kn = exact_counts(q, min(layer, top)), exact_counts(k, min(layer, top))
    pairs = [0] * (top + 1)  # pairs[t]: the terms of exact order t = i + j
    for i, a in enumerate(qn):
        if a:
            for j, b in enumerate(kn[: top + 1 - i]):
                pairs[i + j] += a * b
    cumulative = list(accumulate(pairs))
    if cumulative[-1] > DOCUMENT_LIMIT:
        too_many(what, cumulative[-1], cumulative)


def qk_derivation(name, title, arch: Architecture, layer: int, head: int, concrete: bool,
                  max_order: int | None) -> Derivation:
    if arch.biases or arch.mlp:
        raise DerivationError(f"{name} covers attention-only models without biases; for biases and MLPs use "
                              "derivations.expand_qk, which includes their terms")
    arch.check_head(layer, head)
    before = f"{layer} layer{'s' if layer != 1 else ''}"  # counted, not numbered: the same in either numbering
    check_order(max_order, 2 * layer, f"the scores of a head with {before} before it (two sides of {before})")
    h = head_label(layer, head) if concrete else "h"
    middle = term(atom("W_QK", h), coeff=1 / sp.sqrt(d_head))
    chains = []
    queries = qk_sides(arch, layer, concrete, "q")
    keys = qk_sides(arch, layer, concrete, "k")
    for qkey, q in queries:
        for kkey, k in keys:
            check_pairs(f"the scores of {h}", q, k, layer, max_order)
    if layer > 0:
        stream = stream_product(arch, 0, layer, (atom("W_E"),), concrete)
        sums = () if concrete else tuple(sum_index(l) for l in reversed(range(layer)))
        chains.append(Chain.start(Math(f"x_{layer}", f"x_{layer}"), stream,
                                  detail=prose(per_layer("the residual stream entering layer {}", layer), ", token source"),
                                  intro="Both sides of the scores read the residual stream; expanded into paths it is",
                                  sums=sums).expand(max_order))
    sums = () if concrete else tuple(sum_index(l, c) for c in "qk" for l in reversed(range(layer)))
    for qkey, q in queries:
        for kkey, k in keys:
            q, k = q.expand(max_order), k.expand(max_order)
            lhs = scaled_scores(h, (qkey, kkey) if len(queries) * len(keys) > 1 else None)
            chain = Chain.start(lhs, sandwich(q, middle, k), "bilinear", sums=sums, detail=prose(
                "query side: the ", qkey, " input", ", key side: the ", kkey, " input",
                *(() if concrete else ("; query-side heads are written ", math("q_l"),
                                       " and key-side heads ", math("k_l")))))
            if max_order is not None:
                chain = chain.apply(truncate, "truncation", max_order,
                                    detail=f"keep the terms through at most {max_order} heads on both sides together")
            groups = by_composition(chain.last)
            if len(groups) > 1:
                chain = chain.regroup(groups, detail="by which sides pass through heads")
            chains.append(chain)
    notes = [NOTATION, INDEXING, prose("A score term ", math("P ⊗ Q ⊗ M"), " acts as ",
                                       math("P x M xᵀ Qᵀ"),
                                       " on the stream ", math("x"), " (one row per position): an ",
                                       math("n_ctx × n_ctx"), " matrix, "
                                       "entry [i, j] for query i and key j."),
             SCORES]
    if not concrete:
        notes.append(SUMS)
    if arch.layer_norm:
        notes.append(prose(Math(r"N^{\mathrm{L}l}", "N^Ll"), ": the frozen per-position scale of the layer norm before "
                           "layer l; it leads both sides."))
    if arch.positional == "qk_only":
        notes.append(QK_ONLY_NOTE[arch.layer_norm])
    if layer > 0:  # the token-token chain (with positions in Q and K, the last chain is position-position)
        notes.append(_induction_note(next((c for c in chains if "K-composition" in dict(c.steps[-1].groups)), chains[-1]),
                                     concrete))
    params = (("layers", arch.n_layers), ("heads", arch.n_heads), ("layer", layer), ("head", head),
              ("positional", arch.positional), ("layer_norm", arch.layer_norm), ("concrete", concrete),
              ("max_order", max_order))
    return Derivation(name, title, "The attention scores of a head in a later layer, expanded into paths on the "
                      "query and key sides: direct, Q-, K- and QK-composition.", tuple(chains),
                      notes=tuple(notes), params=params)


def _induction_note(chain: Chain, concrete: bool) -> tuple:
    k_terms = dict(chain.steps[-1].groups).get("K-composition")
    if k_terms is None:
        return prose("No K-composition terms survive this truncation.")
    example = TensorSum([k_terms.terms[0]])
    return prose("The K-composition terms, such as ", example, ", can carry the induction mechanism: if the earlier "
                 "head attends to the previous token (its pattern is the shift matrix) and the term's vocabulary "
                 "matrix matches tokens, the key of each position carries the token before it, and this head "
                 "attends to the token after an earlier copy of the current one (worked in induction-mechanism).")


@entry("two-layer-qk", "second-layer QK scores: direct, Q-, K- and QK-composition, and the induction term Id ⊗ A^{h-1} ⊗ W")
def two_layer_qk(heads: int = 2, positional: str = "none", layer_norm: bool = False, concrete: bool = False,
                 max_order: int | None = None) -> Derivation:
    arch = architecture(2, heads, positional, layer_norm, False, False)
    return qk_derivation("two-layer-qk", "The QK expansion of a second-layer head", arch, 1, 0,
                         check_flag("concrete", concrete), max_order)


@entry("qk-expansion", "the QK scores of any head (default: head 0 of the last layer) of an attention-only model")
def qk_expansion(layers: int = 2, heads: int = 2, layer: int | None = None, head: int = 0, positional: str = "none",
                 layer_norm: bool = False, concrete: bool = False, max_order: int | None = None) -> Derivation:
    arch = architecture(layers, heads, positional, layer_norm, False, False)
    if arch.n_layers == 0:
        raise DerivationError("a model with no layers has no attention scores; pass layers >= 1")
    layer = arch.n_layers - 1 if layer is None else layer
    title = prose("The QK expansion of head ", head_name(layer, head) if isinstance(layer, int) and isinstance(head, int)
                  else str(head))
    return qk_derivation("qk-expansion", title, arch, layer, head, check_flag("concrete", concrete), max_order)
