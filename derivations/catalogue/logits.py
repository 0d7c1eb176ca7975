"""The logits as a sum over paths: any attention-only model, one and two layers."""

from __future__ import annotations

import sympy as sp

from tensoralg import W_OV, W_QK, Product, atom, d_head, sandwich, term
from tensoralg.expr import check_order

from derivations.architecture import Architecture, head_label
from derivations.catalogue.common import (INDEXING, NOTATION, SCORES, SUMS, architecture, by_order, head_name, per_layer,
                                          scaled_scores, source_math, stream_product, sum_index)
from derivations.catalogue.qk import QK_ONLY_NOTE, qk_sides
from derivations.catalogue.registry import check_flag, check_size, entry
from derivations.derivation import Chain, Derivation
from derivations.paths import POSITION, TOKEN, Source, stream_entries
from derivations.document import Math, math, prose


def logits_chains(arch: Architecture, concrete: bool, max_order: int | None) -> list[Chain]:
    """One chain per source: the product, its expansion, the terms grouped by order."""
    L = arch.n_layers
    head = term(atom("N", "final") if arch.layer_norm else None, atom("W_U"))
    sums = () if concrete else tuple(sum_index(l) for l in reversed(range(L)))
    chains = []
    entries = stream_entries(arch, L)
    for e in entries:
        expr = Product([head, stream_product(arch, e.first_layer, L, e.word, concrete)])
        lhs = source_math(e.source) if len(entries) > 1 or arch.biases else math("T")
        check_size(f"the path expansion of {lhs.text}", expr, max_order)
        chain = Chain.start(lhs, expr, detail=_source_detail(e.source),
                            sums=[s for s in sums if int(s.index[1:]) >= e.first_layer]).expand(max_order)
        groups = by_order(chain.last)
        if len(groups) > 1:
            chain = chain.regroup(groups, detail="by the number of heads on the path")
        chains.append(chain)
    if arch.biases:
        chains.append(Chain.start(source_math(Source("unembed_bias")), term(None, atom("b_U")),
                                  detail="the unembedding bias, added at every position"))
    return chains


def _source_detail(source: Source) -> tuple:
    if source == TOKEN:
        return prose("the residual stream starts as ", math("(Id ⊗ W_E)·t"),
                     " and each layer adds its heads to it")
    if source == POSITION:
        return prose("positional embeddings ", math("(Id ⊗ W_pos)"),
                     " acting on the identity of positions")
    if source.kind == "bias":
        return prose(per_layer("the output bias of layer {}", source.layer), " (with ", math("b_V"),
                     " folded into it) acting on a column of ones, entering after that layer")
    return prose(per_layer("the output of the MLP of layer {}", source.layer),
                 ", an opaque source entering after that layer")


def path_notes(arch: Architecture, concrete: bool) -> tuple:
    notes = [NOTATION, INDEXING]
    if not concrete:
        notes.append(SUMS)
    if arch.layer_norm:
        notes.append(prose(Math(r"N^{\mathrm{L}l}", "N^Ll"), ": the frozen per-position scale of the layer norm "
                           "before layer l (a diagonal matrix on positions); its centring and gain are folded into "
                           "the weights (see layer-norm-folding)."))
    if arch.mlp:
        notes.append("MLPs are opaque sources: a path ends at an MLP's input and a new one starts at its output.")
    return tuple(notes)


def _logits_derivation(name, title, summary, arch, concrete, max_order, extra_notes=()) -> Derivation:
    chains = logits_chains(arch, concrete, max_order)
    params = (("layers", arch.n_layers), ("heads", arch.n_heads), ("positional", arch.positional),
              ("layer_norm", arch.layer_norm), ("biases", arch.biases), ("mlp", arch.mlp),
              ("concrete", concrete), ("max_order", max_order))
    return Derivation(name, title, summary, tuple(chains), notes=path_notes(arch, concrete) + tuple(extra_notes),
                      params=params)


@entry("path-expansion", "the logits of any attention-only model as a sum over paths (direct, heads, virtual heads)")
def path_expansion(layers: int = 2, heads: int = 2, positional: str = "none", layer_norm: bool = False,
                   biases: bool = False, mlp: bool = False, concrete: bool = False,
                   max_order: int | None = None) -> Derivation:
    arch = architecture(layers, heads, positional, layer_norm, biases, mlp)
    concrete = check_flag("concrete", concrete)
    check_order(max_order, arch.n_layers, f"the logits of a {arch.n_layers}-layer model")
    return _logits_derivation(
        "path-expansion", f"Path expansion of the logits ({arch.describe()})",
        "Expanding the product of the layers by distributivity and the mixed-product rule writes the logits as a "
        "sum over paths: "
        "the direct path, each head, and virtual heads through several layers.",
        arch, concrete, max_order,
    )


VIRTUAL = prose("A virtual head ", math("(A^{h1} A^{h0}) ⊗ (W_U W_OV^{h1} W_OV^{h0} W_E)"),
                " is the composition of two heads: its pattern is the product of their patterns, its OV "
                "circuit the product of their OV circuits.")


@entry("one-layer", "a one-layer attention-only transformer: its path expansion, QK circuit and OV circuit")
def one_layer(heads: int = 2, positional: str = "none", concrete: bool = False) -> Derivation:
    arch = architecture(1, heads, positional, False, False, False)
    concrete = check_flag("concrete", concrete)
    logits = logits_chains(arch, concrete, None)
    h = head_label(0, 0) if concrete else "h"
    name = head_name(0, 0) if concrete else h
    sides = qk_sides(arch, 0, concrete, "q")  # tokens, and positions where the model has them
    pairs = [(qkey, q, kkey, k) for qkey, q in sides for kkey, k in sides]
    middle = term((atom("W_Q", h).T, atom("W_K", h)), coeff=1 / sp.sqrt(d_head))
    intro = prose("The QK circuit: the pattern of head ", name, " is a softmax of scores that are a bilinear form "
                  "of the embedded tokens on the query and key sides:")
    detail = prose("the scaled scores ", Math(r"\tfrac{1}{\sqrt{d_{head}}}\, x_0^{\top} W_Q^{\top} W_K\, x_0",
                                              "x_0ᵀ W_Qᵀ W_K x_0 / sqrt(d_head)"), " with ", math("x_0 = (Id ⊗ W_E)·t"))
    if len(pairs) > 1:
        intro = prose("The QK circuit: the pattern of head ", name, " is a softmax of scores that are a bilinear form "
                      "of the embedded tokens and positions on the query and key sides, one sum for each pair of inputs:")
    qk = [Chain.start(scaled_scores(h, (qkey, kkey) if len(pairs) > 1 else None), sandwich(q, middle, k), "bilinear",
                      detail=detail if len(pairs) == 1 else prose("query side: the ", qkey, " input, key side: the ",
                                                                  kkey, " input"),
                      intro=intro if i == 0 else None).fold(W_QK)
          for i, (qkey, q, kkey, k) in enumerate(pairs)]
    ov = (
        Chain.start(None, term((atom("W_U"), atom("W_OV", h), atom("W_E"))),
                    detail=prose("the residual word of the term of head ", name),
                    intro=prose("The OV circuit: head ", name, "'s term in T is ", math(f"A^{{{h}}}"),
                                " tensored with a ", math("d_vocab × d_vocab"), " matrix: how attending to a token changes the logits."))
        .unfold(W_OV)
    )
    notes = path_notes(arch, concrete) + (SCORES,) + ((QK_ONLY_NOTE[False],) if positional == "qk_only" else ())
    return Derivation(
        "one-layer", "A one-layer attention-only transformer",
        "The logits are the direct path plus one term per head; each head is described by a QK circuit "
        "(where it attends) and an OV circuit (what it moves).",
        (*logits, *qk, ov), notes=notes,
        params=(("heads", heads), ("positional", arch.positional), ("concrete", concrete)),
    )


@entry("two-layer-logits", "a two-layer attention-only transformer: virtual heads (A^{h1} A^{h0}) ⊗ (W_U W_OV^{h1} W_OV^{h0} W_E)")
def two_layer_logits(heads: int = 2, positional: str = "none", layer_norm: bool = False, concrete: bool = False,
                     max_order: int | None = None) -> Derivation:
    arch = architecture(2, heads, positional, layer_norm, False, False)
    concrete = check_flag("concrete", concrete)
    check_order(max_order, 2, "the logits of a two-layer model")
    return _logits_derivation(
        "two-layer-logits", "The path expansion of a two-layer attention-only transformer",
        "Two layers give the direct path, the heads of each layer, and virtual heads that pass through a head of "
        "the first layer and then a head of the second.",
        arch, concrete, max_order, extra_notes=(VIRTUAL,),
    )
