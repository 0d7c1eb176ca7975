"""Rotary positions: the scores of a rotary head through one named operator ``R^{h}``."""

from __future__ import annotations

import numpy as np
import sympy as sp

from tensoralg import atom, d_head, identity, sandwich, term
from tensoralg.rotary import expand_rotary, feature_blocks, multiply_blocks, position_factors, rotary_atom, rotation

from derivations.architecture import Architecture
from derivations.catalogue.common import NOTATION, SCORES, per_layer, scaled_scores, stream_product
from derivations.catalogue.qk import by_composition
from derivations.catalogue.registry import check_count, check_flag, check_terms, entry
from derivations.derivation import Chain, Derivation, Numeric, Rule
from derivations.document import Math, math, prose
from derivations.errors import DerivationError
from derivations.qk import expand_qk

BLOCKS = Rule("plane-blocks", "products of the rotation blocks", Math(
    r"C^{f} C^{g} = \delta_{fg} C^{f},\ C^{f} J^{g} = \delta_{fg} J^{f},\ J^{f\top} = -J^{f},\ "
    r"J^{f} J^{g} = -\delta_{fg} C^{f},\ P_{pass}^2 = P_{pass},\ P_{pass} C^{f} = P_{pass} J^{f} = 0",
    "C^f C^g = δ_fg C^f, C^f J^g = δ_fg J^f, J^fᵀ = -J^f, J^f J^g = -δ_fg C^f, P_pass² = P_pass, "
    "P_pass C^f = P_pass J^f = 0"))
ROTARY_OPERATOR = Rule("rotary-operator", "writing out the rotary operator", Math(
    r"P \otimes Q \otimes L R M = \sum_{D_a \otimes D_b \otimes B \in R} D_a P \otimes D_b Q \otimes L B M",
    "P ⊗ Q ⊗ L R M = Σ_(D_a ⊗ D_b ⊗ B ∈ R) D_a P ⊗ D_b Q ⊗ L B M"))
STYLES = ("neox", "gptj")


def rotary_numeric(frequencies: int, partial: bool, style: str) -> Numeric:
    """Bind the blocks and the diagonal factors to a real rotary head (``d_head = 2F``, two
    more pass-through dimensions when ``partial``) at positions ``0 … n_ctx - 1``."""
    rot = 2 * frequencies
    d = rot + (2 if partial else 0)
    n = 5
    arrays = {**feature_blocks(d, rot, style), **position_factors(np.arange(n), rot)}

    def bound(a, shape, rng):
        return arrays[a.label]

    return Numeric(dims={"d_head": d, "n_ctx": n},
                   special={name: bound for name in ("C", "J", "P_pass", "D_cos", "D_sin")})


@entry("rotary", "rotary positions: the scores of a rotary head through one operator R^{h}, and Q-/K-composition through it")
def rotary(frequencies: int = 2, partial: bool = False, heads: int = 1, style: str = "neox") -> Derivation:
    F = check_count("frequencies", frequencies, 1)
    partial = check_flag("partial", partial)
    H = check_count("heads", heads, 1)
    if style not in STYLES:
        raise DerivationError(f"unknown rotary style {style!r}; expected one of " + ", ".join(map(repr, STYLES)))
    check_terms(f"rotary with {F:,} frequencies", (2 * F + partial) ** 2, "use fewer frequencies")
    check_terms(f"rotary with {H:,} earlier heads", (1 + H) ** 2, "use fewer heads")
    W_Q, W_K = atom("W_Q", "h"), atom("W_K", "h")
    R = rotation(F, partial)
    scale = 1 / sp.sqrt(d_head)
    rotated_query = (
        Chain.start(Math(r"\tilde{q}", "q̃"), R @ term(None, W_Q), detail=prose(
            "rotate each query ", math("W_Q^h x_i"), " by its position i"),
            intro=prose("Rotary turns the query and the key of each position by an angle that grows with the "
                        "position, plane by plane (", str(F), " planes of two dimensions here", *(
                            (", the other dimensions of the head passing through",) if partial else ()),
                        "). As an operator on a stream (the position slot ", math("⊗"), " the head-dimension slot) that rotation is ",
                        R, ":"))
        .expand()
    )
    pairs = (
        Chain.start(scaled_scores("h"), sandwich(R @ term(None, W_Q), identity(1).scale(scale), R @ term(None, W_K)),
                    "bilinear", detail="the rotated queries against the rotated keys",
                    intro="The scores read the rotated queries against the rotated keys; every pair of rotation terms "
                          "gives a term:")
        .apply(multiply_blocks, BLOCKS, detail="the planes are orthogonal to each other and to the pass-through")
    )
    written = pairs.last
    operator_form = term(None, None, (W_Q.T, rotary_atom("h"), W_K), coeff=scale)
    if expand_rotary(operator_form, F, partial) != written:  # the entry's own claim, checked as it is built
        raise DerivationError("the rotary operator's expansion disagrees with the bilinear form")
    named = Chain.start(operator_form, written, ROTARY_OPERATOR, detail=prose(
        "the terms ", math("D_a ⊗ D_b ⊗ B"), " of ", math("R^h"), ", ", str(4 * F + partial), " of them"), intro=prose(
        "Only pairs of the same plane survive, four terms each: ", math("q_iᵀ R_{j−i} k_j"),
        " with ", Math(r"R_{j-i} = " + (r"P_{pass} + " if partial else "") + r"\sum_f \cos((j-i)\theta_f)\, C^{f} + "
                       r"\sin((j-i)\theta_f)\, J^{f}", "R_(j−i) = " + ("P_pass + " if partial else "")
                       + "Σ_f cos((j−i)θ_f) C^f + sin((j−i)θ_f) J^f"),
        ". The algebra names that sum once per head, ", math("R^h"), ", and keeps it in the feature word, one "
        "operator whatever the size of the head; written out, it is the line above:"))
    arch = Architecture(2, (H, 1), rotary=1.0)
    stream = stream_product(arch, 0, 1, (atom("W_E"),), concrete=True).expand()
    middle = term((atom("W_Q", "L1H0").T, rotary_atom("L1H0"), atom("W_K", "L1H0")), coeff=scale)
    composition = Chain.start(
        scaled_scores("L1H0"), sandwich(stream, middle, stream), "bilinear", detail=prose(
            per_layer("each side the residual stream entering layer {}", 1), ", ", math("W_QK"), " unfolded around ", math("R^{L1H0}")),
        intro=prose("In a later layer the query and key sides are expanded into paths as for any head, ",
                    math("x_1"), " = ", stream, "; each term carries the one operator, so Q-, K- and QK-composition "
                    "keep their terms and their count:"))
    if composition.last != expand_qk(arch, 1, 0).to_tensor_sum():  # the same terms as derivations.expand_qk
        raise DerivationError("the rotary scores of L1H0 disagree with derivations.expand_qk")
    groups = by_composition(composition.last)
    composition = composition.regroup(groups, detail="by which sides pass through heads")
    D = Math(r"D_{\cos}^{f} = \mathrm{diag}(\cos(i\theta_f)),\ D_{\sin}^{f} = \mathrm{diag}(\sin(i\theta_f))",
             "D_cos^f = diag(cos(iθ_f)), D_sin^f = diag(sin(iθ_f))")
    notes = (
        NOTATION, SCORES,
        prose("The position factors ", D, " are diagonal (", math("θ_f = base^{−2f/d_rot}"),
              "); the feature blocks are fixed: ", math("C^f"),
              " projects onto plane f, ", math("J^f"), " turns it by a right angle (J, not S: S is the scores on every page)",
              *((" and ", math("P_pass"), " keeps the dimensions rotary leaves alone (partial rotary)")
                if partial else ()), "."),
        prose("A score term ", math("P ⊗ Q ⊗ (L R^h M)"), " stands for its ", str(4 * F + partial),
              " terms written out above (4 per plane", *((", 1 for the pass-through",) if partial else ()), "); numerically it is evaluated factored, "
              "rotating the rows of ", math("P x L"), " and of ", math("Q x Mᵀ"), " by their positions and "
              "multiplying, so neither the printed expansion nor the evaluation grows with ", math("d_head"), "."),
        prose("Two conventions pair the dimensions of a plane: GPT-NeoX, Llama, Qwen2 and Mistral rotate halves "
              "(dimension ", math("f"), " with ", math("f + d_rot/2"), "), GPT-J neighbours (", math("2f"), " with ",
              math("2f + 1"), "); the algebra is the same, only the blocks' entries differ (checked here with the ",
              style, " convention)."),
        prose("Rope scaling (linear, llama3, YaRN, dynamic NTK at the sequence length used) changes only the "
              "frequencies ", math("θ_f"), " and, for YaRN, multiplies the rotated dimensions of queries and keys by an "
              "attention factor a, so each plane's blocks of ", math("R^h"), " by ", math("a^2"),
              ": the operator keeps its form and its terms."),
        prose("The logits' path expansion has no rotary in it: the patterns ", math("A^h"),
              " are frozen, and rotary acts only inside them."),
        prose("RMSNorm enters as layer norm does, a frozen per-position scale ", math("N"), " (without centring); "
              "grouped-query heads share their ", math("W_K"), " and ", math("W_V"), ", named once per group; gated "
              "MLPs (SwiGLU) stay opaque sources, like any MLP."),
    )
    return Derivation(
        "rotary", "Rotary positions as one operator",
        prose("Rotary position embeddings turn queries and keys by their positions; the scores then read ",
              math("q_iᵀ R_{j−i} k_j"), ", which is again a sum of tensor products with diagonal position factors, "
              "named once per head."),
        (rotated_query, pairs, named, composition), notes=notes,
        params=(("frequencies", F), ("partial", partial), ("heads", H), ("style", style)),
        numeric=rotary_numeric(F, partial, style),
    )

