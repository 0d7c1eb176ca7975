"""Today's decoders in the algebra: q/k normalisation and norms after a sublayer, as frozen scales."""

from __future__ import annotations

from math import isqrt

import sympy as sp

from tensoralg import Product, atom, d_head, sandwich, term

from derivations.architecture import Architecture
from derivations.catalogue.common import NOTATION, SCORES, by_order, per_layer, scaled_scores, stream_product
from derivations.catalogue.qk import by_composition
from derivations.catalogue.registry import DOCUMENT_LIMIT, check_count, check_flag, check_terms, entry
from derivations.derivation import Chain, Derivation, Rule
from derivations.document import Math, math, prose
from derivations.errors import DerivationError
from derivations.paths import expand_logits
from derivations.qk import expand_qk

FROZEN_SCALE = Rule("frozen-scale", "a norm's scale frozen, its gain and centring folded", Math(
    r"\gamma \odot \frac{C y_i}{s_i} = \frac{1}{s_i}\, \mathrm{diag}(\gamma)\, C\, y_i "
    r"\ \Rightarrow\ (N \otimes \mathrm{diag}(\gamma) C)\cdot y",
    "γ ⊙ C y_i / s_i = (1/s_i) diag(γ) C y_i  ⇒  (N ⊗ diag(γ) C)·y"))


@entry("qk-norm", "q/k normalisation (Qwen3, OLMo 2, Persimmon, StableLM, Cohere): a frozen scale on each side of W_QK")
def qk_norm(heads: int = 1) -> Derivation:
    H = check_count("heads", heads, 1)
    scale = 1 / sp.sqrt(d_head)
    N_q, N_k = atom("N", "h,q"), atom("N", "h,k")
    W_Q, W_K = atom("W_Q", "h"), atom("W_K", "h")
    query = Chain.start(Math(r"\tilde{q}", "q̃"), term(N_q, W_Q), FROZEN_SCALE, detail=prose(
        "the query ", math("W_Q^h x_i"), " normalised over the head, its scale frozen"), intro=prose(
        "q/k normalisation divides each head's query (and key) by its own scale ", math("s_i"), " at each position "
        "i, after the projection and before rotary, then multiplies by a gain ", math("γ"), " (a layer norm also "
        "centres over the head, ", math("C"), ", and adds a bias). Frozen at the values of a forward pass, the scale "
        "is a diagonal position factor ", math("N^{h,q} = diag(1/s_i)"), ", and the gain and centring fold into ",
        math("W_Q^h"), ":"))
    scores = Chain.start(scaled_scores("h"), sandwich(term(N_q, W_Q), _one(scale), term(N_k, W_K)), "bilinear", detail=prose(
        "the normalised queries against the normalised keys"), intro=prose(
        "The scores read the normalised queries against the normalised keys: the two scales stand on the two "
        "position slots, and the feature slot is ", math("W_QK^h"), " with the gains folded in:"))
    arch = Architecture(2, (H, 1), qk_norm="rms_norm")
    stream = stream_product(arch, 0, 1, (atom("W_E"),), concrete=True).expand()
    normed = lambda side: (term(atom("N", f"L1H0,{side}"), None) @ stream).expand()  # noqa: E731
    composition = Chain.start(
        scaled_scores("L1H0"), sandwich(normed("q"), _one(scale, atom("W_QK", "L1H0")), normed("k")),
        "bilinear", detail=prose(per_layer("each side the residual stream entering layer {}", 1), ", led by its frozen scale"),
        intro=prose("In a later layer each side is the residual stream expanded into paths, ", math("x_1"), " = ",
                    stream, ", and the scale leads every position word of its side, so Q-, K- and QK-composition keep "
                    "their terms and their count:"))
    if composition.last != expand_qk(arch, 1, 0).to_tensor_sum():  # the entry's claim, checked as it is built
        raise DerivationError("the q/k-normalised scores of L1H0 disagree with derivations.expand_qk")
    composition = composition.regroup(by_composition(composition.last), detail="by which sides pass through heads")
    notes = (
        NOTATION, SCORES,
        prose("Folded weights: ", math("W_Q^h"), " stands for ", Math(r"\mathrm{diag}(\gamma_q) C\, W_Q^h",
              "diag(γ_q) C W_Q^h"), " and ", math("b_Q^h"), " for ", Math(r"\mathrm{diag}(\gamma_q) C\, b_Q^h",
              "diag(γ_q) C b_Q^h"), " (", math("C = Id - 11ᵀ/d_head"), " for a layer norm, ", math("C = Id"),
              " for RMSNorm); the same on the key side. A layer norm's own bias is added after the scale: one more "
              "constant side, ", math("Id ⊗ b_Qn^h"), " (Persimmon), with no scale in front."),
        prose("Over all heads at once (OLMo 2 normalises the whole projection) the scale is one per position, ",
              _named("N", "L1,q"), ", shared by the heads of the layer; the centring of a layer norm then runs over all "
              "heads and still folds into each head's ", math("W_Q^h"), ". Keys are normalised per key/value head: "
              "with grouped-query attention the key-side scale is named once per group, ", _named("N", "L1KV0,k"), "."),
        prose("Rotary turns the normalised queries and keys; a diagonal position factor commutes with its diagonal "
              "factors, so the terms keep the form ", math("N^q P ⊗ N^k Q ⊗ W_pᵀ W_Qᵀ R^h W_K W_q"), "."),
        prose("The logits' path expansion is unchanged: the patterns ", math("A^h"), " are frozen, and the "
              "q/k norm acts only inside them."),
    )
    return Derivation(
        "qk-norm", "q/k normalisation as frozen scales",
        prose("A norm of each head's queries and keys is, with its scale frozen, a diagonal position factor on each "
              "side of the bilinear form; its gains fold into ", math("W_Q"), " and ", math("W_K"), "."),
        (query, scores, composition), notes=notes, params=(("heads", H),))


def _named(name: str, index: str):
    """An indexed atom for prose, printed as the expressions print it (``N^{L0,post}``)."""
    return term(atom(name, index))


def _one(coeff, middle=None):
    """The middle of a bilinear form: ``coeff · middle`` (``Id`` when ``None``), one slot."""
    return term(middle, coeff=coeff)


@entry("post-norm", "norms after a sublayer (OLMo 2; Gemma 2's sandwich norms): a frozen scale on each head's output")
def post_norm(heads: int = 1, post_only: bool = False) -> Derivation:
    H = check_count("heads", heads, 1)
    sandwich_norms = not check_flag("post_only", post_only)
    # two layers of H heads: (1 + H)² logit paths, each built and checked (about 1 ms a term), so counted first
    check_terms(f"post-norm with {H:,} heads", (1 + H) ** 2, f"use at most {isqrt(DOCUMENT_LIMIT) - 1} heads")
    arch = Architecture(2, H, norm="rms_norm", sublayer_norm="both" if sandwich_norms else "post")
    N, M = atom("N", "L0"), atom("N", "L0,post")
    pre = (N,) if sandwich_norms else ()
    heads_of = [term((atom("A", f"L0H{h}"),) + pre, atom("W_OV", f"L0H{h}")) for h in range(H)]
    layer = Chain.start(Math(r"\mathrm{layer}_0", "layer_0"), term(None, None) + term(M, None) @ _sum(heads_of),
                        detail=prose("the residual connection, plus the attention output normalised before it joins "
                                     "the stream"), intro=prose(
        "A norm after a sublayer (OLMo 2, and Gemma 2 after its pre-norm: sandwich norms) divides the attention "
        "output by its own scale at each position and multiplies it by a gain ", math("γ"), ". Frozen, the scale is a "
        "diagonal position factor ", _named("N", "L0,post"), " in front of every head, and the gain folds into ",
        math("W_O^h"), " (so into ", math("W_OV^h"), ") and ", math("b_O"), ":")).expand()
    logits = _logits_chain(arch)
    notes = (
        NOTATION,
        prose("Folded weights: ", math("W_OV^h"), " stands for ", Math(r"\mathrm{diag}(\gamma) W_O^h W_V^h",
              "diag(γ) W_O^h W_V^h"), " and ", _named("b_O", "L0"), " for ", Math(r"\mathrm{diag}(\gamma) b_O",
              "diag(γ) b_O"), ", which enters the stream behind the same scale: its term is ",
              term(atom("N", "L0,post"), atom("b_O", "L0")), "."),
        prose("An MLP's output is normalised the same way before it joins the stream; an MLP is an opaque source, "
              "and its source is what joins the stream, the norm included."),
        prose("With both norms (Gemma 2) each head reads the stream through the pre-norm's scale ", _named("N", "L0"),
              " and writes through the post-norm's scale ", _named("N", "L0,post"), ".") if sandwich_norms else
        prose("Without a norm before the sublayers (OLMo 2) the attention reads the stream itself: there is no ",
              _named("N", "L0"), ", and q/k normalisation (entry qk-norm) usually takes its place in the scores."),
    )
    return Derivation(
        "post-norm", "Norms after a sublayer as frozen scales",
        prose("A norm of a sublayer's output, with its scale frozen, is one more diagonal position factor in every "
              "path through that sublayer; its gain folds into ", math("W_O"), "."),
        (layer, logits), notes=notes, params=(("heads", H), ("post_only", post_only)))


def _sum(terms):
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def _logits_chain(arch: Architecture) -> Chain:
    """The logits of a 2-layer model with norms after its attention layers, checked against expand_logits."""
    def layer(l):
        pre = (atom("N", f"L{l}"),) if arch.pre_norm else ()
        return term(None, None) + _sum([term((atom("N", f"L{l},post"), atom("A", f"L{l}H{h}")) + pre,
                                             atom("W_OV", f"L{l}H{h}")) for h in range(arch.heads_per_layer[l])])
    expr = Product([term(atom("N", "final"), atom("W_U")), layer(1), layer(0), term(None, atom("W_E"))])
    chain = Chain.start(math("T"), expr, detail=prose("two layers, each head behind its layer's frozen post-norm scale"),
                        intro="Through two layers every path carries the post-norm scale of each layer it passes:").expand()
    if chain.last != expand_logits(arch).to_tensor_sum():  # the entry's claim, checked as it is built
        raise DerivationError("the post-norm logits disagree with derivations.expand_logits")
    return chain.regroup(by_order(chain.last), detail="by the number of heads on the path")
