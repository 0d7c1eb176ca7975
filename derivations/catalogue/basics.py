"""Zero layers, multi-head attention and a single attention head."""

from __future__ import annotations

import numpy as np

from tensoralg import W_OV, W_QK, Atom, Product, atom, d_head, d_model, n_ctx, term
from tensoralg.rules import rewrite_words

from derivations.catalogue.common import NOTATION, SCORES
from derivations.catalogue.registry import check_count, check_terms, entry
from derivations.derivation import Chain, Derivation, Numeric
from derivations.document import Math, math, prose


@entry("zero-layer", "a zero-layer transformer: T = W_U W_E, the bigram table")
def zero_layer() -> Derivation:
    T = Chain.start(math("T"), term(None, atom("W_U")) @ term(None, atom("W_E")),
                    detail="embed the tokens, then unembed").expand()
    return Derivation(
        "zero-layer", "A zero-layer transformer",
        "With no layers the logits are the unembedding of the embedding: each position's prediction depends "
        "only on its own token, so this one matrix approximates the bigram log-likelihoods.",
        (T,), notes=(NOTATION,),
    )


@entry("multi-head", "multi-head attention: concatenate-and-multiply is a sum of independent heads")
def multi_head(heads: int = 3) -> Derivation:
    H = check_count("heads", heads, 1)
    check_terms(f"multi-head with {H:,} heads", H * H, "use fewer heads")  # W_O r expands to H² terms
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
        Chain.start(math("W_O r"), Product([W_O, stacked]), "block",
                    detail=prose("with the basis vectors ", math("e^h"), " of ", Math(rf"\mathbf{{R}}^{{{H}}}", f"R^{H}")),
                    intro=prose("Each head h writes its result ", math("r^h"), " (one position, ",
                                math("d_head"), " numbers); the layer concatenates them and multiplies by ",
                                math("W_O"), ", whose column blocks ", math("W_O^h"), " belong to the heads: ",
                                blocks, "."))
        .expand()
        .apply(rewrite_words, "orthonormality", identities,
               detail=prose(math("e^hᵀ e^h = 1"), " and ",
                            math("e^hᵀ e^k = 0"), " for ", math("h ≠ k")))
    )
    return Derivation(
        "multi-head", "Multi-head attention is a sum of independent heads",
        "Concatenating the heads' results and multiplying by the output matrix equals adding each head's own "
        "output: heads are independent and additive.",
        (chain,),
        notes=(prose("The first slot is the block index: after the last step it is ", math("1 × 1"), ", and ",
                     math("Id ⊗ X = X"), "."),),
        params=(("heads", H),),
        numeric=Numeric(special={"e": lambda a, shape, rng: np.eye(shape[0])[:, [int(a.index)]]}),
    )


@entry("attention-head", "an attention head as (A ⊗ W_O W_V)·x, with A = softmax*(S / sqrt(d_head)), S = x W_QK xᵀ")
def attention_head() -> Derivation:
    A, W_O, W_V = atom("A", "h"), atom("W_O", "h"), atom("W_V", "h")
    head = (
        Chain.start(math("h"), Product([term(None, W_O), term(A, None), term(None, W_V)]),
                    detail="values, then mixing across positions, then the output map",
                    intro=prose("Head h reads a value ", math("W_V^h x_j"), " at each position, mixes "
                                "positions with its pattern ", math("A^h"), " and writes with ",
                                math("W_O^h"), ":"))
        .expand()
        .fold(W_OV)
    )
    x = Atom("x", n_ctx, d_model)
    scores = (
        Chain.start(math("S^h"), Product([term((x, atom("W_Q", "h").T)), term((x, atom("W_K", "h").T)).T]),
                    "transpose", detail=math("(x W_K^hᵀ)ᵀ = W_K^h xᵀ"),
                    intro=prose("The pattern comes from scores: the query ", math("W_Q^h x_i"),
                                " of position i against the key ", math("W_K^h x_j"),
                                " of position j, for all pairs at once (x holds one row per position, so its "
                                "queries are the rows of ", math("x W_Q^hᵀ"), "):"))
        .expand()
        .fold(W_QK)
    )
    return Derivation(
        "attention-head", "An attention head",
        "An attention head is a tensor product: a pattern over positions times a matrix on the residual stream.",
        (head, scores),
        notes=(NOTATION, SCORES,
               prose(math("A^h"), " depends on ", math("x"), ", so the head is linear in ", math("x"),
                     " only once its pattern is frozen.")),
    )
