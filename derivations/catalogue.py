"""The catalogue: every equation of the paper and its companion notes, as derivations.

Each entry builds a :class:`~derivations.derivation.Derivation` from parameters (layers,
heads, symbolic or concrete heads …); every line is produced by the algebra and every
chain checks numerically (:meth:`Derivation.verify`).

>>> "two-layer-qk" in names()
True
>>> d = get("zero-layer")
>>> print(d.chains[0].last)
Id ⊗ W_U W_E
>>> get("one-layer", heads=2, concrete=True).verify().ok
True
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np
import sympy as sp

from tensoralg import W_OV, W_QK, Atom, Product, TensorSum, atom, d_head, d_model, identity, n_ctx, sandwich, term

from derivations.architecture import Architecture, head_label
from derivations.derivation import (
    Chain,
    Derivation,
    Numeric,
    fold_sum,
    fold_word,
    rewrite_words,
    substitute,
)
from derivations.errors import DerivationError, TooManyTerms, UnknownDerivation
from derivations.paths import POSITION, TOKEN, Source, stream_entries
from derivations.render import Math, SumIndex, prose

# The most terms one chain may hold before a document becomes unreadable.
DOCUMENT_LIMIT = 5000

d_c = sp.Symbol("d_c", positive=True, integer=True)  # width of a generic component (virtual weights)
k_dim = sp.Symbol("k", positive=True, integer=True)  # dimension of a deleted subspace

NOTATION = prose(
    "Column vectors, as in the paper: ", Math(r"x_0 = W_E t", "x_0 = W_E t"), "; ",
    Math(r"(A \otimes W)\cdot x", "(A ⊗ W)·x"), " mixes positions with A and maps each position's vector with W. "
    "Numerically, with one row per position, ", Math(r"(A \otimes W)\cdot x = A\,x\,W^{\top}", "(A ⊗ W)·x = A x Wᵀ"), ".",
)
INDEXING = prose(
    "Layers and heads are 0-indexed, as in TransformerLens: L1H0 is head 0 of layer 1. "
    "The paper numbers layers from 1, so its ", Math("H_1", "H_1"), " (first layer) is our ", Math("H_0", "H_0"), ".",
)
SUMS = prose(
    Math(r"\sum_{h_l \in H_l}", "Σ_{h_l∈H_l}"), " sums over the heads ", Math("H_l", "H_l"),
    " of layer l; it binds its index within its own term.",
)


# -- the registry -----------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """A catalogue entry: ``build(**params)`` makes the derivation; ``params`` maps each
    parameter it takes to its default."""

    name: str
    description: str
    build: Callable[..., Derivation]
    params: dict


ENTRIES: dict[str, Entry] = {}


def entry(name: str, description: str):
    """Register ``build`` under ``name``; its keyword arguments are the parameters."""

    def register(build):
        params = {p.name: p.default for p in inspect.signature(build).parameters.values()}
        ENTRIES[name] = Entry(name, description, build, params)
        return build

    return register


def names() -> list[str]:
    """The names of every derivation in the catalogue, in the paper's order."""
    return list(ENTRIES)


def descriptions() -> dict[str, str]:
    """``{name: one-line description}`` for every entry."""
    return {e.name: e.description for e in ENTRIES.values()}


def lookup(name: str) -> Entry:
    """The entry called ``name``; :class:`UnknownDerivation` lists the known ones and close matches."""
    if name in ENTRIES:
        return ENTRIES[name]
    close = difflib.get_close_matches(str(name), list(ENTRIES), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise UnknownDerivation(f"unknown derivation {name!r}{hint} Known: {', '.join(ENTRIES)}")


def get(name: str, **params) -> Derivation:
    """Build the derivation ``name`` with ``params`` (see :func:`lookup(name).params`).

    >>> get("two-layer-logits", heads=2, concrete=True).chains[0].last.n_slots
    2
    """
    e = lookup(name)
    unknown = sorted(set(params) - set(e.params))
    if unknown:
        takes = ", ".join(e.params) or "no parameters"
        raise DerivationError(f"derivation {name!r} does not take {', '.join(unknown)}; it takes: {takes}")
    return e.build(**params)


# -- parameters and atoms ---------------------------------------------------------------


def check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise DerivationError(f"{name} must be True or False, got {value!r}")
    return value


def check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DerivationError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def heads_of(arch: Architecture, layer: int, concrete: bool, letter: str = "h") -> list[str]:
    """Indices of the heads of a layer: ``L0H0, L0H1…`` (concrete) or one summed ``h0``."""
    if concrete:
        return [head_label(layer, h) for h in range(arch.heads_per_layer[layer])]
    return [f"{letter}{layer}"]


def sum_index(layer: int, letter: str = "h") -> SumIndex:
    return SumIndex(f"{letter}{layer}", Math(f"H_{{{layer}}}", f"H_{layer}"))


def layer_factor(arch: Architecture, layer: int, concrete: bool, letter: str = "h") -> TensorSum:
    """``Id ⊗ Id + Σ_h (A^h N^l) ⊗ W_OV^h`` (``N^l`` only with layer norm)."""
    factor = identity(2)
    scale = (atom("N", f"L{layer}"),) if arch.layer_norm else ()
    for index in heads_of(arch, layer, concrete, letter):
        factor = factor + term((atom("A", index),) + scale, atom("W_OV", index))
    return factor


def stream_product(arch: Architecture, first: int, upto: int, word: tuple, concrete: bool, letter: str = "h"):
    """``Π_{l = upto-1 … first} (layer l) · (Id ⊗ word)``: a source entering at ``first``."""
    factors = [layer_factor(arch, l, concrete, letter) for l in reversed(range(first, upto))]
    if word:
        factors.append(term(None, word))
    if not factors:
        return identity(2)
    return factors[0] if len(factors) == 1 else Product(factors)


def check_size(what: str, expr, max_order: int | None) -> None:
    """Refuse chains above :data:`DOCUMENT_LIMIT` terms, suggesting a ``max_order`` that fits."""
    if not isinstance(expr, Product):
        return
    total = expr.count(max_order)
    if total > DOCUMENT_LIMIT:
        cumulative = [expr.count(k) for k in range(len(expr.factors) + 1)]
        too_many(what, total, cumulative[: (len(cumulative) if max_order is None else max_order + 1)])


def too_many(what: str, total: int, cumulative: list[int]) -> None:
    """Raise :class:`TooManyTerms`; ``cumulative[k]``: how many terms ``max_order=k`` keeps."""
    fits = [k for k, n in enumerate(cumulative) if n <= DOCUMENT_LIMIT]
    hint = (f"pass max_order={fits[-1]} (--max-order {fits[-1]}: {cumulative[fits[-1]]:,} terms) or use fewer layers "
            "or heads" if fits else "use fewer layers or heads")
    raise TooManyTerms(f"{what} has {total:,} terms, more than a document holds ({DOCUMENT_LIMIT:,}); {hint}")


def by_order(expr: TensorSum, slot: int = 0) -> list[tuple[str, TensorSum]]:
    """Groups of terms by how many patterns ``A`` their position word holds."""
    groups: dict[int, dict] = {}
    for t in expr:
        k = sum(a.name == "A" for a in t.words[slot])
        groups.setdefault(k, {})[t.words] = t.coeff
    names_ = {0: "direct path", 1: "individual heads"}
    return [(names_.get(k, f"virtual heads through {k} heads"), TensorSum(g, n_slots=expr.n_slots))
            for k, g in sorted(groups.items())]


def source_math(source: Source) -> Math:
    kind = source.kind
    if kind in ("token", "position"):
        short = "tok" if kind == "token" else "pos"
        return Math(rf"T_{{\mathrm{{{short}}}}}", f"T_{short}")
    if kind == "bias":
        return Math(rf"T_{{b_O^{{\mathrm{{L{source.layer}}}}}}}", f"T_(b_O^L{source.layer})")
    if kind == "mlp":
        return Math(rf"T_{{\mathrm{{mlp}}^{{\mathrm{{L{source.layer}}}}}}}", f"T_(mlp^L{source.layer})")
    return Math(r"T_{b_U}", "T_(b_U)")


def architecture(layers, heads, positional, layer_norm, biases, mlp) -> Architecture:
    return Architecture(layers, heads if isinstance(heads, int) else tuple(heads), positional=positional,
                        layer_norm=layer_norm, biases=biases, mlp=mlp)


# -- zero layers, attention heads ---------------------------------------------------------


@entry("zero-layer", "a zero-layer transformer: T = W_U W_E, the bigram table")
def zero_layer() -> Derivation:
    T = Chain.start(Math("T", "T"), term(None, atom("W_U")) @ term(None, atom("W_E")),
                    detail="embed the tokens, then unembed").expand()
    return Derivation(
        "zero-layer", "A zero-layer transformer",
        "With no layers the logits are the unembedding of the embedding: each position's prediction depends "
        "only on its own token, so W_U W_E approximates the bigram log-likelihoods.",
        (T,), notes=(NOTATION,),
    )


@entry("multi-head", "multi-head attention: concatenate-and-multiply is a sum of independent heads")
def multi_head(heads: int = 3) -> Derivation:
    H = check_count("heads", heads, 1)
    shapes = {"e": (H, 1), "r": (d_head, 1)}
    e = [atom("e", h, shapes) for h in range(H)]
    r = [atom("r", h, shapes) for h in range(H)]
    W_O = sum((term(e[h].T, atom("W_O", h)) for h in range(H)), start=0)
    stacked = sum((term(e[h], r[h]) for h in range(H)), start=0)
    shown = list(range(H)) if H <= 4 else [0, None, H - 1]
    blocks = Math(r"W_O = \begin{bmatrix}" + " & ".join(r"\cdots" if h is None else f"W_O^{{{h}}}" for h in shown)
                  + r"\end{bmatrix},\quad r = \begin{bmatrix}" + r" \\ ".join(r"\vdots" if h is None else f"r^{{{h}}}" for h in shown)
                  + r"\end{bmatrix}", f"W_O = [W_O^0 … W_O^{H - 1}], r = [r^0; …; r^{H - 1}]")
    identities = {(e[h].T, e[k]): (() if h == k else None) for h in range(H) for k in range(H)}
    chain = (
        Chain.start(Math("W_O r", "W_O r"), Product([W_O, stacked]), "block",
                    detail=prose("with the basis vectors ", Math("e_h", "e_h"), " of ", Math(rf"\mathbf{{R}}^{{{H}}}", f"R^{H}")),
                    intro=prose("Each head h writes its result ", Math("r^h", "r^h"), " (one position, ",
                                Math("d_{head}", "d_head"), " numbers); the layer concatenates them and multiplies by ",
                                Math("W_O", "W_O"), ", whose column blocks ", Math("W_O^h", "W_O^h"), " belong to the heads."))
        .expand()
        .apply(rewrite_words, "orthonormality", identities,
               detail=prose(Math(r"e_h^{\top} e_h = 1", "e_hᵀ e_h = 1"), " and ",
                            Math(r"e_h^{\top} e_k = 0", "e_hᵀ e_k = 0"), " for h ≠ k"))
    )
    return Derivation(
        "multi-head", "Multi-head attention is a sum of independent heads",
        "Concatenating the heads' results and multiplying by W_O equals adding each head's own output W_O^h r^h: "
        "heads are independent and additive.",
        (chain,),
        notes=(prose("The first slot is the block index: after the last step it is 1 x 1, and ",
                     Math(r"\mathrm{Id} \otimes X = X", "Id ⊗ X = X"), "."),),
        params=(("heads", H),),
        numeric=Numeric(special={"e": lambda a, shape, rng: np.eye(shape[0])[:, [int(a.index)]]}),
    )


@entry("attention-head", "an attention head as (A ⊗ W_O W_V)·x, with A = softmax*(xᵀ W_Qᵀ W_K x)")
def attention_head() -> Derivation:
    A, W_O, W_V = atom("A", "h"), atom("W_O", "h"), atom("W_V", "h")
    head = (
        Chain.start(Math("h", "h"), Product([term(None, W_O), term(A, None), term(None, W_V)]),
                    detail="values, then mixing across positions, then the output map",
                    intro=prose("Head h reads a value ", Math("W_V^h x_j", "W_V^h x_j"), " at each position, mixes "
                                "positions with its pattern ", Math("A^h", "A^h"), " and writes with ",
                                Math("W_O^h", "W_O^h"), ":"))
        .expand()
        .fold(W_OV)
    )
    x = Atom("x", d_model, n_ctx)
    scores = (
        Chain.start(Math("S^h", "S^h"), Product([term((atom("W_Q", "h"), x)).T, term((atom("W_K", "h"), x))]),
                    "transpose", detail=Math(r"(W_Q^h x)^{\top} = x^{\top} W_Q^{h\top}", "(W_Q^h x)ᵀ = xᵀ W_Q^hᵀ"),
                    intro=prose("The pattern comes from scores: the query ", Math("W_Q^h x_i", "W_Q^h x_i"),
                                " of position i against the key ", Math("W_K^h x_j", "W_K^h x_j"),
                                " of position j, for all pairs at once (x holds one column per position):"))
        .expand()
        .fold(W_QK)
    )
    return Derivation(
        "attention-head", "An attention head",
        "An attention head is a tensor product: a pattern over positions times a matrix on the residual stream.",
        (head, scores),
        notes=(NOTATION,
               prose("Then ", Math(r"A^h = \mathrm{softmax}^{*}\!\bigl(S^h / \sqrt{d_{head}}\bigr)",
                                   "A^h = softmax*(S^h / sqrt(d_head))"),
                     ", where the * masks the scores of later keys (autoregressive). A depends on x, so the "
                     "head is linear in x only once its pattern is frozen.")),
    )


# -- path expansions ----------------------------------------------------------------------


def logits_chains(arch: Architecture, concrete: bool, max_order: int | None) -> list[Chain]:
    """One chain per source: the product, its expansion, the terms grouped by order."""
    L = arch.n_layers
    head = term(atom("N", "final") if arch.layer_norm else None, atom("W_U"))
    sums = () if concrete else tuple(sum_index(l) for l in reversed(range(L)))
    chains = []
    entries = stream_entries(arch, L)
    for e in entries:
        expr = Product([head, stream_product(arch, e.first_layer, L, e.word, concrete)])
        lhs = source_math(e.source) if len(entries) > 1 or arch.biases else Math("T", "T")
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
        return prose("the residual stream starts as ", Math(r"(\mathrm{Id} \otimes W_E)\cdot t", "(Id ⊗ W_E)·t"),
                     " and each layer adds its heads to it")
    if source == POSITION:
        return prose("positional embeddings ", Math(r"(\mathrm{Id} \otimes W_{pos})", "(Id ⊗ W_pos)"),
                     " acting on the identity of positions")
    if source.kind == "bias":
        return prose(f"the output bias of layer {source.layer} (with b_V folded into it) acting on a column of ones, "
                     "entering after that layer")
    return prose(f"the output of the MLP of layer {source.layer}, an opaque source entering after that layer")


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


def _check_order(max_order, largest: int):
    if max_order is not None:
        check_count("max_order", max_order, 0)
        if max_order > largest:
            raise DerivationError(f"max_order={max_order} is more than the deepest path ({largest} heads); "
                                  f"pass 0..{largest} or leave it out")


@entry("path-expansion", "the logits of any attention-only model as a sum over paths (direct, heads, virtual heads)")
def path_expansion(layers: int = 2, heads: int = 2, positional: str = "none", layer_norm: bool = False,
                   biases: bool = False, mlp: bool = False, concrete: bool = False,
                   max_order: int | None = None) -> Derivation:
    arch = architecture(layers, heads, positional, layer_norm, biases, mlp)
    concrete = check_flag("concrete", concrete)
    _check_order(max_order, arch.n_layers)
    return _logits_derivation(
        "path-expansion", f"Path expansion of the logits ({arch.describe()})",
        "Expanding the product of the layers by the mixed-product rule writes the logits as a sum over paths: "
        "the direct path, each head, and virtual heads through several layers.",
        arch, concrete, max_order,
    )


VIRTUAL = prose("A virtual head ", Math(r"(A^{h_1} A^{h_0}) \otimes (W_U W_{OV}^{h_1} W_{OV}^{h_0} W_E)",
                                        "(A^{h1} A^{h0}) ⊗ (W_U W_OV^{h1} W_OV^{h0} W_E)"),
                " is the composition of two heads: its pattern is the product of their patterns, its OV "
                "circuit the product of their OV circuits.")


@entry("one-layer", "a one-layer attention-only transformer: its path expansion, QK circuit and OV circuit")
def one_layer(heads: int = 2, concrete: bool = False) -> Derivation:
    arch = architecture(1, heads, "none", False, False, False)
    concrete = check_flag("concrete", concrete)
    logits = logits_chains(arch, concrete, None)[0]
    h = head_label(0, 0) if concrete else "h"
    x0 = term(None, atom("W_E"))
    qk = (
        Chain.start(Math(f"S^{{{_index_latex(h)}}}", f"S^{h}"),
                    sandwich(x0, term((atom("W_Q", h).T, atom("W_K", h)), coeff=1 / sp.sqrt(d_head)), x0),
                    "bilinear", detail=prose("the scores ", Math(r"\tfrac{1}{\sqrt{d_{head}}}\, x_0^{\top} W_Q^{\top} W_K\, x_0",
                                                                "x_0ᵀ W_Qᵀ W_K x_0 / sqrt(d_head)"),
                                             " with ", Math(r"x_0 = (\mathrm{Id} \otimes W_E)\cdot t", "x_0 = (Id ⊗ W_E)·t")),
                    intro=prose("The QK circuit: the pattern of head ", h, " is a softmax of scores that are a "
                                "bilinear form of the embedded tokens on the query and key sides:"))
        .fold(W_QK)
    )
    ov = (
        Chain.start(None, term((atom("W_U"), atom("W_OV", h), atom("W_E"))),
                    detail=prose("the residual word of the term of head ", h),
                    intro=prose("The OV circuit: head ", h, "'s term in T is ", Math(f"A^{{{_index_latex(h)}}}", f"A^{h}"),
                                " tensored with a vocab x vocab matrix: how attending to a token changes the logits."))
        .unfold(W_OV)
    )
    return Derivation(
        "one-layer", "A one-layer attention-only transformer",
        "The logits are the direct path plus one term per head; each head is described by a QK circuit "
        "(where it attends) and an OV circuit (what it moves).",
        (logits, qk, ov), notes=path_notes(arch, concrete), params=(("heads", heads), ("concrete", concrete)),
    )


def _index_latex(index: str) -> str:
    return rf"\mathrm{{{index}}}" if len(index) > 1 else index


@entry("two-layer-logits", "a two-layer attention-only transformer: virtual heads (A^{h1} A^{h0}) ⊗ (W_U W_OV^{h1} W_OV^{h0} W_E)")
def two_layer_logits(heads: int = 2, positional: str = "none", layer_norm: bool = False, concrete: bool = False,
                     max_order: int | None = None) -> Derivation:
    arch = architecture(2, heads, positional, layer_norm, False, False)
    concrete = check_flag("concrete", concrete)
    _check_order(max_order, 2)
    return _logits_derivation(
        "two-layer-logits", "The path expansion of a two-layer attention-only transformer",
        "Two layers give the direct path, the heads of each layer, and virtual heads that pass through a head of "
        "layer 0 and then a head of layer 1.",
        arch, concrete, max_order, extra_notes=(VIRTUAL,),
    )


# -- QK expansions ------------------------------------------------------------------------

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
    cumulative = [expr.count(k) for k in range(top + 1)]
    return [cumulative[0]] + [b - a for a, b in zip(cumulative, cumulative[1:])]


def check_pairs(what: str, q, k, layer: int, max_order: int | None) -> None:
    """Refuse a bilinear form of more than :data:`DOCUMENT_LIMIT` terms before building it."""
    qn, kn = exact_counts(q, layer), exact_counts(k, layer)
    cumulative = [sum(qn[i] * kn[j] for i in range(layer + 1) for j in range(layer + 1) if i + j <= top)
                  for top in range(2 * layer + 1)]
    total = cumulative[-1 if max_order is None else max_order]
    if total > DOCUMENT_LIMIT:
        too_many(what, total, cumulative[: None if max_order is None else max_order + 1])


def qk_derivation(name, title, arch: Architecture, layer: int, head: int, concrete: bool,
                  max_order: int | None) -> Derivation:
    if arch.biases or arch.mlp:
        raise DerivationError(f"{name} covers attention-only models without biases; for biases and MLPs use "
                              "derivations.expand_qk, which includes their terms")
    arch.check_head(layer, head)
    _check_order(max_order, 2 * layer)
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
                                  detail=f"the residual stream entering layer {layer}, token source",
                                  intro="Both sides of the scores read the residual stream; expanded into paths it is",
                                  sums=sums).expand(max_order))
    sums = () if concrete else tuple(sum_index(l, c) for c in "qk" for l in reversed(range(layer)))
    for qkey, q in queries:
        for kkey, k in keys:
            q, k = q.expand(max_order), k.expand(max_order)
            pair = "" if len(queries) * len(keys) == 1 else f"_{{\\mathrm{{{qkey[:3]},{kkey[:3]}}}}}"
            lhs = Math(f"S^{{{_index_latex(h)}}}{pair}", f"S^{h}" + (f"_({qkey[:3]},{kkey[:3]})" if pair else ""))
            chain = Chain.start(lhs, sandwich(q, middle, k), "bilinear", sums=sums, detail=prose(
                "query side: the ", qkey, " input", ", key side: the ", kkey, " input",
                *(() if concrete else ("; query-side heads are written ", Math("q_l", "q_l"),
                                       " and key-side heads ", Math("k_l", "k_l")))))
            if max_order is not None:
                chain = chain.apply(truncate, "truncation", max_order,
                                    detail=f"keep the terms through at most {max_order} heads on both sides together")
            groups = by_composition(chain.last)
            if len(groups) > 1:
                chain = chain.regroup(groups, detail="by which sides pass through heads")
            chains.append(chain)
    notes = [NOTATION, INDEXING, prose("A score term ", Math(r"P \otimes Q \otimes M", "P ⊗ Q ⊗ M"), " acts as ",
                                       Math(r"S = P\, x^{\top} M\, x\, Q^{\top}", "S = P xᵀ M x Qᵀ"),
                                       " (x with one column per position, S[i, j] for query i and key j); the scale ",
                                       Math(r"1/\sqrt{d_{head}}", "1/sqrt(d_head)"), " is kept as a coefficient.")]
    if not concrete:
        notes.append(SUMS)
    if arch.layer_norm:
        notes.append(prose(Math(r"N^{\mathrm{L}l}", "N^Ll"), ": the frozen per-position scale of the layer norm before "
                           "layer l; it leads both sides."))
    if arch.positional == "qk_only":
        notes.append("Positions (qk_only) are added to the query and key inputs only, after the layer norm, so each "
                     "pair of inputs (tokens, positions) has its own sum.")
    if layer > 0:
        notes.append(_induction_note(chains[-1], concrete))
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
    return prose("The K-composition terms, such as ", example, ", are the induction mechanism: when the earlier "
                 "head attends to the previous token (its pattern is the shift matrix), the key of each position "
                 "carries the token before it, so this head can attend to the token after an earlier copy of "
                 "the current one.")


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
    return qk_derivation("qk-expansion", f"The QK expansion of head {head_label(layer, head) if isinstance(layer, int) and isinstance(head, int) else head}",
                         arch, layer, head, check_flag("concrete", concrete), max_order)


# -- weights across layers, subspaces, folding -------------------------------------------


@entry("virtual-weights", "virtual weights across intermediate layers: W_virt = M_in^(J) (Π_k T_k) M_out^(I)")
def virtual_weights(layers: int = 2, heads: int = 2, concrete: bool = False) -> Derivation:
    K = check_count("layers", layers, 1)
    M = check_count("heads", heads, 1)
    concrete = check_flag("concrete", concrete)
    shapes = {"M_in": (d_c, d_model), "M_out": (d_model, d_c), "T": (d_model, d_model)}
    T = {k: atom("T", str(k), shapes) for k in range(1, K + 1)}

    def components(k):
        return [f"({k},{m})" for m in range(M)] if concrete else [f"m{k}"]

    def layer_map(k):
        return identity(1) + sum((term((atom("M_out", i, shapes), atom("M_in", i, shapes))) for i in components(k)),
                                 start=0)

    start = Product([term(atom("M_in", "J", shapes))] + [term(T[k]) for k in reversed(range(1, K + 1))]
                    + [term(atom("M_out", "I", shapes))])
    chain = Chain.start(Math(r"W_{\mathrm{virt}}^{J \leftarrow I}", "W_virt^{J←I}"), start,
                        detail="what component I writes, carried through each intermediate layer, read by J",
                        sums=() if concrete else [SumIndex(f"m{k}", Math(f"C_{{{k}}}", f"C_{k}")) for k in range(K, 0, -1)])
    for k in reversed(range(1, K + 1)):
        chain = chain.apply(substitute, "substitution", T[k], layer_map(k), detail=prose(
            Math(f"T^{{{k}}}", f"T^{k}"), " := ", layer_map(k)) if concrete else prose(
            Math(f"T^{{{k}}}", f"T^{k}"), " := ", Math(rf"\mathrm{{Id}} + \sum_{{m_{k} \in C_{k}}} M_{{out}}^{{m_{k}}} M_{{in}}^{{m_{k}}}",
                                                         f"Id + Σ_{{m{k}∈C_{k}}} M_out^{{m{k}}} M_in^{{m{k}}}")))
    chain = chain.expand()
    groups = [(label.replace("direct path", "direct (M_in^J M_out^I)").replace("heads", "components"), part)
              for label, part in _by_atom_count(chain.last, "M_in", offset=1)]
    if len(groups) > 1:
        chain = chain.regroup(groups, detail="by the number of intermediate components on the path")
    return Derivation(
        "virtual-weights", "Virtual weights across intermediate layers",
        "A component I that writes to the residual stream and a component J that reads from it, several layers "
        "later, are connected directly and through every chain of intermediate components.",
        (chain,),
        notes=(prose("Each component c reads with ", Math(r"M_{in}^{c}", "M_in^c"), " (", Math("d_c", "d_c"),
                     " x d_model) and writes with ", Math(r"M_{out}^{c}", "M_out^c"), "; an intermediate layer k maps "
                     "the residual stream by ", Math(r"T_k = \mathrm{Id} + \sum_m M_{out}^{(k,m)} M_{in}^{(k,m)}",
                                                    "T_k = Id + Σ_m M_out^(k,m) M_in^(k,m)"),
                     " (positions and nonlinearities set aside: these are the residual-side words of the paths)."),
               prose("Column vectors, so products read right to left: I writes first, J reads last. In row-vector "
                     "order the same product is ", Math(r"M_{out}^{(I)} \bigl(\prod_k T_k\bigr) M_{in}^{(J)}",
                                                        "M_out^(I) (Π_k T_k) M_in^(J)"), "."),
               INDEXING),
        params=(("layers", K), ("heads", M), ("concrete", concrete)),
        numeric=Numeric(dims={"d_c": 2}, derived={"T": lambda a: layer_map(int(a.index))}),
    )


def _by_atom_count(expr: TensorSum, name: str, offset: int = 0) -> list[tuple[str, TensorSum]]:
    groups: dict[int, dict] = {}
    for t in expr:
        k = sum(a.name == name for a in t.words[0]) - offset
        groups.setdefault(k, {})[t.words] = t.coeff
    label = {0: "direct path", 1: "through one component"}
    return [(label.get(k, f"through {k} components"), TensorSum(g, n_slots=expr.n_slots)) for k, g in sorted(groups.items())]


def _orthonormal(a, shape, rng):
    q, _ = np.linalg.qr(rng.standard_normal(shape))
    return q


@entry("subspace-deletion", "a head that deletes a residual subspace: OV circuit -V Vᵀ for orthonormal columns V")
def subspace_deletion() -> Derivation:
    A, W = atom("A", "h"), atom("W_OV", "h")
    V = Atom("V", d_model, k_dim)
    after = (
        Chain.start(Math("R", "R"), identity(2) + term(A, W),
                    detail="the residual connection plus head h",
                    intro="A head can clear part of the residual stream, freeing it for later layers.")
        .apply(substitute, "substitution", A, identity(1), detail=prose("the head attends to its own position: ",
                                                                         Math(r"A^h = \mathrm{Id}", "A^h = Id")))
        .apply(substitute, "substitution", W, term((V, V.T), coeff=-1),
               detail=prose("its OV circuit is ", Math(r"W_{OV}^h = -V V^{\top}", "W_OV^h = -V Vᵀ")))
    )
    read = (
        Chain.start(None, Product([term(None, V.T), after.last]), detail="read the subspace after the head",
                    intro=prose("Whatever was in the subspace is gone: reading it with ", Math(r"V^{\top}", "Vᵀ"),
                                " after the head gives zero."))
        .expand()
        .apply(rewrite_words, "orthonormality", {(V.T, V): ()}, detail=Math(r"V^{\top} V = I_k", "Vᵀ V = I_k"))
    )
    return Derivation(
        "subspace-deletion", "A head that deletes a residual subspace",
        "With an OV circuit equal to minus the projection onto a subspace, a head that attends to its own position "
        "removes that subspace from the residual stream.",
        (after, read),
        notes=(prose("Convention: the k columns of V (d_model x k) are an orthonormal basis of the subspace, so ",
                     Math(r"V^{\top} V = I_k", "Vᵀ V = I_k"), " and the projection onto it is ",
                     Math(r"V V^{\top}", "V Vᵀ"), ". (With the basis as the rows of V, the same head is ",
                     Math(r"-V^{\top} V", "-Vᵀ V"), ".)"),
               prose("After the head the stream is ", Math(r"(\mathrm{Id} \otimes (I - V V^{\top}))\cdot x", "(Id ⊗ (I - V Vᵀ))·x"),
                     ": the projection onto the orthogonal complement.")),
        numeric=Numeric(dims={"k": 2}, special={"A": lambda a, shape, rng: np.eye(shape[0]), "V": _orthonormal},
                        derived={"W_OV": lambda a: term((V, V.T), coeff=-1)}),
    )


ONES = {"1": (n_ctx, 1)}


def _ones(a, shape, rng):
    return np.ones(shape)


def _centring(a, shape, rng):
    n = shape[0]
    return np.eye(n) - np.ones((n, n)) / n


@entry("layer-norm-folding", "layer norm with a frozen scale: (A ⊗ W_OV)(N ⊗ G C) = (A N) ⊗ W_OV', its bias a constant")
def layer_norm_folding() -> Derivation:
    A, W = atom("A", "h"), atom("W_OV", "h")
    N = atom("N")
    G = Atom("G", d_model, d_model, symmetric=True)
    C = Atom("C", d_model, d_model, symmetric=True)
    folded = Atom("W_OV'", d_model, d_model, "h")
    one, beta = atom("1", "", ONES), Atom("b_LN", d_model, 1)
    scale = (
        Chain.start(None, Product([term(A, W), term(N, (G, C))]),
                    detail=prose("the layer norm before the head, with its scale frozen: ",
                                 Math(r"\mathrm{LN}(x) = (N \otimes G C)\cdot x + (1 \otimes b_{LN})\cdot 1",
                                      "LN(x) = (N ⊗ G C)·x + (1 ⊗ b_LN)·1")))
        .expand()
        .apply(fold_word, "fold", (W, G, C), folded,
               detail=prose(Math(r"W_{OV'}^{h} := W_{OV}^{h}\, G\, C", "W_OV'^h := W_OV^h G C"),
                            ": gain and centring folded into the weights"))
    )
    bias = (
        Chain.start(None, Product([term(A, W), term(one, beta)]), detail="the layer norm's bias, on every position",
                    intro="The layer norm's bias passes through the head as a constant, whatever the pattern:")
        .expand()
        .apply(rewrite_words, "stochastic", {(A, one): (one,)}, detail=prose("1 is a column of ones"))
    )
    return Derivation(
        "layer-norm-folding", "Folding a layer norm into the weights",
        "With its per-position scale frozen, a layer norm is a diagonal factor on positions times a fixed map on "
        "the residual stream, which folds into the next weights; its bias becomes a constant source.",
        (scale, bias),
        notes=(prose(Math("N", "N"), ": diagonal, one frozen 1/σ per position; ", Math("G", "G"), ": the gain, diagonal; ",
                     Math(r"C = I - \tfrac{1}{d_{model}} 1 1^{\top}", "C = I - 11ᵀ/d_model"),
                     ": centring; 1: a column of ones (n_ctx x 1)."), NOTATION),
        numeric=Numeric(special={"C": _centring, "1": _ones},
                        derived={"W_OV'": lambda a: term((atom("W_OV", a.index), G, C))}),
    )


@entry("bias-folding", "biases: b_V of every head folds into the output bias, b_O' = b_O + Σ_h W_O^h b_V^h")
def bias_folding(heads: int = 2) -> Derivation:
    H = check_count("heads", heads, 1)
    one, b_O, folded = atom("1", "", ONES), atom("b_O"), Atom("b_O'", d_model, 1)
    idx = [head_label(0, h) for h in range(H)]
    parts = [Product([term(atom("A", i), atom("W_O", i)), term(one, atom("b_V", i))]) for i in idx]
    definition = term(b_O) + sum((term((atom("W_O", i), atom("b_V", i))) for i in idx), start=0)
    chain = (
        Chain.start(None, sum(parts[1:], start=parts[0]) + term(one, b_O),
                    detail="the part of the attention layer's output that does not depend on x",
                    intro=prose("With biases head h computes ", Math(r"(A^h \otimes W_O^h)\cdot\bigl((\mathrm{Id} \otimes W_V^h)"
                                                                     r"\cdot x + (1 \otimes b_V^h)\cdot 1\bigr)",
                                                                     "(A^h ⊗ W_O^h)·((Id ⊗ W_V^h)·x + (1 ⊗ b_V^h)·1)"),
                                " and the layer adds ", Math(r"(1 \otimes b_O)\cdot 1", "(1 ⊗ b_O)·1"), "."))
        .expand()
        .apply(rewrite_words, "stochastic", {(atom("A", i), one): (one,) for i in idx},
               detail=prose("for every head's pattern; 1 is a column of ones"))
        .apply(fold_sum, "fold", folded, definition, 1,
               detail=prose(Math(r"b_{O'} := b_O + \sum_h W_O^h b_V^h", "b_O' := b_O + Σ_h W_O^h b_V^h")))
    )
    return Derivation(
        "bias-folding", "Folding the value biases into the output bias",
        "Because every row of an attention pattern sums to one, the value biases reach the output as constants "
        "and fold into the output bias; what remains is a constant source of the residual stream.",
        (chain,),
        notes=("1 is a column of ones (n_ctx x 1): a bias acts on it as a source that is the same at every position.",
               INDEXING),
        params=(("heads", H),),
        numeric=Numeric(special={"1": _ones}, derived={"b_O'": lambda a: definition}),
    )


@entry("tensor-product-readings", "teaching: three equivalent readings of A ⊗ W (left-right multiply, Kronecker, 4-D tensor)")
def tensor_product_readings() -> Derivation:
    A, W = atom("A", "h"), atom("W_OV", "h")
    mix_then_map = Chain.start(None, Product([term(A, None), term(None, W)]), detail="mix positions, then map vectors",
                               intro="Mixing positions and mapping each position's vector are independent, "
                                     "so they commute and combine into one tensor product:").expand()
    map_then_mix = Chain.start(None, Product([term(None, W), term(A, None)]),
                               detail="map vectors, then mix positions").expand()
    return Derivation(
        "tensor-product-readings", "Three readings of A ⊗ W",
        "The tensor product of a pattern A (positions) and a matrix W (residual stream) can be read three "
        "equivalent ways.",
        (mix_then_map, map_then_mix),
        notes=(
            prose("Left-right multiplication: with x holding one row per position, ",
                  Math(r"(A \otimes W)\cdot x = A\, x\, W^{\top}", "(A ⊗ W)·x = A x Wᵀ"),
                  " (in the paper's column convention, ", Math(r"W x A^{\top}", "W x Aᵀ"), ")."),
            prose("Kronecker product: on the row-major vectorisation, ",
                  Math(r"\mathrm{vec}(A\, x\, W^{\top}) = (A \otimes_K W)\, \mathrm{vec}(x)",
                       "vec(A x Wᵀ) = kron(A, W) vec(x)"),
                  ", a matrix of size (n_ctx d_model) x (n_ctx d_model)."),
            prose("A 4-D tensor: ", Math(r"T_{i a j b} = A_{ij} W_{ab}", "T[i,a,j,b] = A[i,j] W[a,b]"), " and ",
                  Math(r"y_{ia} = \sum_{j,b} T_{iajb}\, x_{jb}", "y[i,a] = Σ_{j,b} T[i,a,j,b] x[j,b]"),
                  ": position i of the output takes from every position j, through W."),
        ),
    )
