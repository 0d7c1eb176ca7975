"""Today's decoders in the algebra: ALiBi as one more term of the scores; sliding windows and soft-caps,
which change no term (a mask on a frozen pattern; a cap after the expanded quantity)."""

from __future__ import annotations

from math import isqrt

import sympy as sp

from tensoralg import atom, d_head, sandwich, term

from derivations.architecture import Architecture
from derivations.catalogue.common import NOTATION, SCORES, by_order, per_layer, scaled_scores, stream_product
from derivations.catalogue.qk import by_composition
from derivations.catalogue.registry import DOCUMENT_LIMIT, check_count, check_terms, entry
from derivations.derivation import Chain, Derivation, Rule
from derivations.document import Math, math, prose
from derivations.errors import DerivationError
from derivations.paths import expand_logits
from derivations.qk import expand_qk

ALIBI_TERM = Rule("alibi-term", "a position-only matrix as a term of the scores", Math(
    r"B = I\, B\, I^{\top} \ \Rightarrow\ B \text{ is the term } \mathrm{Id} \otimes \mathrm{Id} \otimes B "
    r"\text{ acting on } X_q = X_k = I",
    "B = I B Iᵀ ⇒ B is the term Id ⊗ Id ⊗ B acting on X_q = X_k = I"))
WINDOWS = prose(
    "Sliding windows (Mistral, Gemma 2, GPT-Neo's local layers) change only the mask: a query sees the keys of "
    "its last w positions. The pattern is frozen as always, so the logits' paths are unchanged, and a head's score "
    "terms are the same bilinear forms, compared on the positions the mask keeps.")


def _scores_of_layer_1(arch: Architecture, intro) -> Chain:
    """The scores of L1H0 from the token source on both sides, checked against expand_qk: ``(1 + H)²``
    terms for ``H`` heads in layer 0, refused above :data:`DOCUMENT_LIMIT` before anything is built."""
    H = arch.heads_per_layer[0]
    fits = isqrt(DOCUMENT_LIMIT) - 1
    check_terms(f"the scores of L1H0 with {H} heads in layer 0", (1 + H) ** 2, f"use at most {fits} heads")
    stream = stream_product(arch, 0, 1, (atom("W_E"),), concrete=True).expand()
    middle = term(atom("W_QK", "L1H0"), coeff=1 / sp.sqrt(d_head))
    chain = Chain.start(scaled_scores("L1H0"), sandwich(stream, middle, stream), "bilinear",
                        detail=prose(per_layer("each side the residual stream entering layer {}", 1)), intro=intro)
    if chain.last != expand_qk(arch, 1, 0).to_tensor_sum(query="token", key="token"):
        raise DerivationError("the scores of L1H0 disagree with derivations.expand_qk")
    return chain.regroup(by_composition(chain.last), detail="by which sides pass through heads")


@entry("alibi", "ALiBi (BLOOM, MPT, Falcon): a fixed position-only matrix added to each head's scores, one more term")
def alibi(heads: int = 1) -> Derivation:
    H = check_count("heads", heads, 1)
    arch = Architecture(2, (H, 1), alibi=True)
    B = atom("B_ALiBi", "L1H0")
    bias = Chain.start(Math(r"B_{ALiBi}^{h}[i, j]", "B_ALiBi^h[i, j]"), term(None, None, B), ALIBI_TERM, detail=prose(
        "the bias ", math("m_h (j − i)"), " of query i and key j, added to the scaled scores"), intro=prose(
        "ALiBi adds to each head's scaled scores a fixed matrix that depends only on positions, ",
        Math(r"m_h\,(j - i)", "m_h (j − i)"), ", with one slope ", math("m_h"), " per head. As a term of the "
        "scores it is a 3-slot term whose two sides read the identity of positions (like positional embeddings), "
        "with coefficient 1, since it is added after the scale:"))
    if expand_qk(arch, 1, 0).to_tensor_sum(query="position", key="position") != bias.last:
        raise DerivationError("the ALiBi term disagrees with derivations.expand_qk")
    composition = _scores_of_layer_1(arch, prose(
        "Every other term is the bilinear form of the two residual streams, as without ALiBi; the head's scores "
        "are these terms plus the one above, so Q-, K- and QK-composition keep their terms and the expansion "
        "gains one:"))
    notes = (
        NOTATION, SCORES,
        prose("The slopes are fixed, ", Math(r"m_h = 2^{-8(h+1)/n}", "m_h = 2^(−8(h+1)/n)"), " for n heads (a power "
              "of two; BLOOM's rule otherwise), so the term has no weight to fold: it is a constant of the head."),
        prose("Conventions differ by a constant per query (BLOOM adds ", math("m_h j"), ", TransformerLens ",
              math("m_h (j − i)"), "): the softmax removes it, so the patterns and the logits are the same; the "
              "scores a report compares are the model's own."),
        WINDOWS,
        prose("The logits' path expansion is unchanged: the patterns ", math("A^h"), " are frozen, ALiBi acts inside them."),
    )
    return Derivation(
        "alibi", "ALiBi as one more term of the scores",
        prose("ALiBi's bias is a fixed position-only matrix; in the algebra it is one more term of a head's scores, ",
              term(None, None, B), ", named once per head."),
        (bias, composition), notes=notes, params=(("heads", H),))


@entry("soft-caps", "attention and final-logit soft-caps (Gemma 2): the expansion is of the quantity before the cap")
def soft_caps(heads: int = 1) -> Derivation:
    H = check_count("heads", heads, 1)
    arch = Architecture(2, (H, 1), attn_softcap=50.0, logit_softcap=30.0)
    cap = Rule("soft-cap", "a soft-cap acts after the expanded quantity", Math(
        r"\mathrm{cap}_c(x) = c \tanh(x / c)", "cap_c(x) = c tanh(x/c)"))
    logits = Chain.start(Math(r"T_{\text{pre-cap}}", "T_pre-cap"), expand_logits(arch).to_tensor_sum(), cap, detail=prose(
        "elementwise and not linear, so the expansion is of the logits before the final soft-cap; the model's "
        "logits are ", math("c·tanh(T/c)")), intro=prose(
        "A final-logit soft-cap (Gemma 2 caps at 30) squashes each logit after the unembedding. It is not linear, so the "
        "path expansion stops where it acts: the terms add up to the logits before the cap, and that is what "
        "is verified (the reports say so):"))
    logits = logits.regroup(by_order(logits.last), detail="by the number of heads on the path")
    scores = _scores_of_layer_1(arch, prose(
        "An attention soft-cap (Gemma 2 caps at 50) squashes each head's scaled scores before the mask and the softmax. "
        "The pattern is frozen as always; the score terms are those of the scores before the cap (what the "
        "model's hook on its scores holds), unchanged:"))
    notes = (
        NOTATION, SCORES,
        prose("The cap acts on each scaled score ", math("x = S^h / sqrt(d_head)"), " as ", math("c·tanh(x/c)"),
              ", before the mask and the softmax; the expansion of ", math("S^h / sqrt(d_head)"),
              " is exact, the cap acts after it."),
        WINDOWS,
    )
    return Derivation(
        "soft-caps", "Soft-caps act after the expanded quantity",
        prose("Soft-capping (", math("c·tanh(x/c)"), ") is not linear: the expansion and the verification are of the "
              "scores and the logits before the cap, which the cap then squashes."),
        (logits, scores), notes=notes, params=(("heads", H),))
