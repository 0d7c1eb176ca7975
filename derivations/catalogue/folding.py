"""Weights across layers, deleted subspaces, and folding layer norms and biases into the weights."""

from __future__ import annotations

import numpy as np
import sympy as sp

from tensoralg import Atom, Product, TensorSum, atom, d_model, identity, n_ctx, term
from tensoralg.rules import fold_sum, fold_word, rewrite_words, substitute

from derivations.architecture import head_label
from derivations.catalogue.common import INDEXING, NOTATION
from derivations.catalogue.registry import check_count, check_flag, check_power_terms, check_terms, entry
from derivations.derivation import Chain, Derivation, Numeric
from derivations.document import Math, SumIndex, math, prose

d_c = sp.Symbol("d_c", positive=True, integer=True)  # width of a generic component (virtual weights)
k_dim = sp.Symbol("k", positive=True, integer=True)  # dimension of a deleted subspace


@entry("virtual-weights", "virtual weights across intermediate layers: W_virt = M_in^(J) (Π_k T^k) M_out^(I)")
def virtual_weights(layers: int = 2, heads: int = 2, concrete: bool = False) -> Derivation:
    K = check_count("layers", layers, 1)
    M = check_count("heads", heads, 1)
    concrete = check_flag("concrete", concrete)
    per_layer = 1 + (M if concrete else 1)  # Id and each component (or one symbolic sum) per layer
    check_power_terms(f"virtual-weights over {K} layers", per_layer, K,
                      "use fewer layers" + (" or heads" if concrete else ""))
    shapes = {"M_in": (d_c, d_model), "M_out": (d_model, d_c), "T": (d_model, d_model)}
    T = {k: atom("T", str(k), shapes) for k in range(1, K + 1)}

    def components(k):
        return [f"({k},{m})" for m in range(M)] if concrete else [f"m{k}"]

    def layer_map(k):
        return identity(1) + sum((term((atom("M_out", i, shapes), atom("M_in", i, shapes))) for i in components(k)),
                                 start=0)

    start = Product([term(atom("M_in", "J", shapes))] + [term(T[k]) for k in reversed(range(1, K + 1))]
                    + [term(atom("M_out", "I", shapes))])
    chain = Chain.start(math("W_virt^{J←I}"), start,
                        detail="what component I writes, carried through each intermediate layer, read by J",
                        sums=() if concrete else [SumIndex(f"m{k}", Math(f"C_{{{k}}}", f"C_{k}")) for k in range(K, 0, -1)])
    for k in reversed(range(1, K + 1)):
        chain = chain.apply(substitute, "substitution", T[k], layer_map(k), detail=prose(
            Math(f"T^{{{k}}}", f"T^{k}"), " := ", layer_map(k)) if concrete else prose(
            Math(f"T^{{{k}}}", f"T^{k}"), " := ", Math(rf"\mathrm{{Id}} + \sum_{{m_{k} \in C_{k}}} M_{{out}}^{{m_{k}}} M_{{in}}^{{m_{k}}}",
                                                         f"Id + Σ_{{m{k}∈C_{k}}} M_out^{{m{k}}} M_in^{{m{k}}}")))
    chain = chain.expand()
    groups = [(label.replace("heads", "components"), part)
              for label, part in _by_atom_count(chain.last, "M_in", offset=1)]
    if len(groups) > 1:
        chain = chain.regroup(groups, detail="by the number of intermediate components on the path")
    return Derivation(
        "virtual-weights", "Virtual weights across intermediate layers",
        "A component I that writes to the residual stream and a component J that reads from it, several layers "
        "later, are connected directly and through every chain of intermediate components.",
        (chain,),
        notes=(prose("Each component c reads with ", math("M_in^c"), " (",
                     math("d_c × d_model"), ") and writes with ", math("M_out^c"), "; an intermediate layer k maps "
                     "the residual stream by ", Math(r"T^{k} = \mathrm{Id} + \sum_m M_{out}^{(k,m)} M_{in}^{(k,m)}",
                                                    "T^k = Id + Σ_m M_out^(k,m) M_in^(k,m)"),
                     " (k names the layer, as a head's superscript does: not a power; positions and nonlinearities set aside: these are the residual-side words of the paths)."),
               prose("Column vectors, so products read right to left: I writes first, J reads last. In row-vector "
                     "order the same product is ", Math(r"M_{out}^{(I)} \bigl(\prod_k T^{k}\bigr) M_{in}^{(J)}",
                                                        "M_out^(I) (Π_k T^k) M_in^(J)"), "."),
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
        Chain.start(math("R"), identity(2) + term(A, W),
                    detail="the residual connection plus head h",
                    intro="A head can clear part of the residual stream, freeing it for later layers.")
        .apply(substitute, "substitution", A, identity(1), detail=prose("the head attends to its own position: ",
                                                                         math("A^h = Id")))
        .apply(substitute, "substitution", W, term((V, V.T), coeff=-1),
               detail=prose("its OV circuit is ", math("W_OV^h = -V Vᵀ")))
    )
    read = (
        Chain.start(None, Product([term(None, V.T), after.last]), detail="read the subspace after the head",
                    intro=prose("Whatever was in the subspace is gone: reading it with ", math("Vᵀ"),
                                " after the head gives zero."))
        .expand()
        .apply(rewrite_words, "orthonormality", {(V.T, V): ()}, detail=math("Vᵀ V = I_k"))
    )
    return Derivation(
        "subspace-deletion", "A head that deletes a residual subspace",
        "With an OV circuit equal to minus the projection onto a subspace, a head that attends to its own position "
        "removes that subspace from the residual stream.",
        (after, read),
        notes=(prose("Convention: the ", math("k"), " columns of ", math("V"), " (",
                     math("d_model × k"), ") are an orthonormal basis of the subspace, so ",
                     math("Vᵀ V = I_k"), " and the projection onto it is ",
                     math("V Vᵀ"), ". (With the basis as the rows of ", math("V"), ", the same head is ",
                     math("-Vᵀ V"), ".)"),
               prose("After the head the stream is ", math("(Id ⊗ (I - V Vᵀ))·x"),
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


#: `` := `` between a folded name, printed by the printer as its lines print it, and its definition.
DEFINED_AS = Math(r" := ", " := ")


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
                                 math("LN(x) = (N ⊗ G C)·x + (1 ⊗ b_LN)·1")))
        .expand()
        .apply(fold_word, "fold", (W, G, C), folded,
               detail=prose(term(folded), DEFINED_AS, term((W, G, C)),  # the printer's W_{OV'}, as in the lines
                            ": gain and centring folded into the weights"))
    )
    bias = (
        Chain.start(None, Product([term(A, W), term(one, beta)]), detail="the layer norm's bias, on every position",
                    intro="The layer norm's bias passes through the head as a constant, whatever the pattern:")
        .expand()
        .apply(rewrite_words, "stochastic", {(A, one): (one,)}, detail=prose(math("1"), " is a column of ones"))
    )
    return Derivation(
        "layer-norm-folding", "Folding a layer norm into the weights",
        "With its per-position scale frozen, a layer norm is a diagonal factor on positions times a fixed map on "
        "the residual stream, which folds into the next weights; its bias becomes a constant source.",
        (scale, bias),
        notes=(prose(math("N"), ": diagonal, one frozen ", math("1/σ"), " per position; ", math("G"), ": the gain, diagonal; ",
                     Math(r"C = I - \tfrac{1}{d_{model}} 1 1^{\top}", "C = I - 11ᵀ/d_model"),
                     ": centring; ", math("1"), ": a column of ones (", math("n_ctx × 1"), ")."),
               NOTATION),
        numeric=Numeric(special={"C": _centring, "1": _ones},
                        derived={"W_OV'": lambda a: term((atom("W_OV", a.index), G, C))}),
    )


@entry("bias-folding", "biases: b_V of every head folds into the output bias, b_O' = b_O + Σ_h W_O^h b_V^h")
def bias_folding(heads: int = 2) -> Derivation:
    H = check_count("heads", heads, 1)
    check_terms(f"bias-folding with {H:,} heads", H + 1, "use fewer heads")
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
                                " and the layer adds ", math("(1 ⊗ b_O)·1"), "."))
        .expand()
        .apply(rewrite_words, "stochastic", {(atom("A", i), one): (one,) for i in idx},
               detail=prose("for every head's pattern; ", math("1"), " is a column of ones"))
        .apply(fold_sum, "fold", folded, definition, 1,
               detail=prose(term(folded), DEFINED_AS, math("b_O + Σ_h W_O^h b_V^h")))
    )
    return Derivation(
        "bias-folding", "Folding the value biases into the output bias",
        "Because every row of an attention pattern sums to one, the value biases reach the output as constants "
        "and fold into the output bias; what remains is a constant source of the residual stream.",
        (chain,),
        notes=(prose(math("1"), " is a column of ones (", math("n_ctx × 1"),
                     "): a bias acts on it as a source that is the same at every position."),
               INDEXING),
        params=(("heads", H),),
        numeric=Numeric(special={"1": _ones}, derived={"b_O'": lambda a: definition}),
    )
