"""What several entries share: the notes on notation, and the residual stream as a product of layers."""

from __future__ import annotations

from dataclasses import replace

from tensoralg import Product, TensorSum, add, atom, identity, term
from tensoralg.latex import TensorLatexPrinter

from derivations.architecture import Architecture, head_label
from derivations.paths import Source
from derivations.document import Math, Numbered, SumIndex, math, prose

NOTATION = prose(
    "A position's vector is a column, as in the paper (", math("x_i = W_E t_i"), "); the stream ", math("x"),
    " holds one row per position, row i being ", math("x_iᵀ"), ", as numerically. ",
    math("(A ⊗ W)·x"), " mixes positions with A and maps each position's vector with W: ",
    math("(A ⊗ W)·x = A x Wᵀ"), ".",
)
INDEXING = prose(Numbered(
    ("Layers and heads are 0-indexed, as in TransformerLens: L1H0 is head 0 of layer 1. "
     "The paper numbers layers from 1, so its ", math("H_1", fixed=True), " (first layer) is our ", math("H_0", fixed=True), "."),
    ("Layers are numbered from 1, as in the paper: ", math("H_1", fixed=True), " is the first layer's heads and L1H0 "
     "is its head 0 (TransformerLens and the code number layers from 0, so L1H0 here is their L0H0)."),
))
SCORES = prose(
    "One meaning of S everywhere: the scores ", math("S^h = x W_QK^h xᵀ"),
    " (entry [i, j]: ", math("x_iᵀ W_QK^h x_j"), ", query i against key j) are unscaled, and the pattern is ",
    math("A^h = softmax*(S^h / sqrt(d_head))"),
    ", where the * masks the scores of later keys (autoregressive). A chain whose left side is ",
    math("S^h / sqrt(d_head)"), " carries the scale as a coefficient.",
)


def scaled_scores(head: str, pair: tuple[str, str] | None = None) -> Math:
    """The left side ``S^h / sqrt(d_head)`` of a chain of scaled scores (see :data:`SCORES`) of the head
    ``head`` as the atoms store it (``h``, ``L1H0``); its layer follows the document's numbering.
    ``pair``: the query and key inputs (``("token", "position")``) where the scores have several.

    >>> scaled_scores("h").text, scaled_scores("L1H0").at(1).text
    ('S^h / sqrt(d_head)', 'S^L2H0 / sqrt(d_head)')
    >>> scaled_scores("h", ("token", "position")).text
    'S^h_(tok,pos) / sqrt(d_head)'
    """
    short = f"{pair[0][:3]},{pair[1][:3]}" if pair else ""
    pair_latex, pair_text = (rf"_{{\mathrm{{{short}}}}}", f"_({short})") if pair else ("", "")

    def numbered(index_from: int) -> Math:
        p = TensorLatexPrinter(index_from=index_from)
        return Math(rf"S^{{{p.index(head)}}}{pair_latex} / \sqrt{{d_{{head}}}}",
                    f"S^{p.index_text(head)}{pair_text} / sqrt(d_head)")
    return replace(numbered(0), from1=numbered(1))


def head_name(layer: int, head: int) -> Numbered:
    """A head's label in prose, ``L1H0``, in the document's numbering (``L2H0`` from 1).

    >>> head_name(1, 0).at(1)
    ('L2H0',)
    """
    return Numbered(head_label(layer, head), head_label(layer + 1, head))


SUMS = prose(
    math("Σ_{h_l∈H_l}"), " sums over the heads ", math("H_l"),
    " of layer l; it binds its index within its own term.",
)


def heads_of(arch: Architecture, layer: int, concrete: bool, letter: str = "h") -> list[str]:
    """Indices of the heads of a layer: ``L0H0, L0H1…`` (concrete) or one summed ``h0``."""
    if concrete:
        return [head_label(layer, h) for h in range(arch.heads_per_layer[layer])]
    return [f"{letter}{layer}"]


def sum_index(layer: int, letter: str = "h") -> SumIndex:
    return SumIndex(f"{letter}{layer}", Math(f"H_{{{layer}}}", f"H_{layer}"))


def layer_factor(arch: Architecture, layer: int, concrete: bool, letter: str = "h") -> TensorSum:
    """``Id ⊗ Id + Σ_h (A^h N^l) ⊗ W_OV^h`` (``N^l`` only with layer norm)."""
    scale = (atom("N", f"L{layer}"),) if arch.layer_norm else ()
    heads = [term((atom("A", index),) + scale, atom("W_OV", index)) for index in heads_of(arch, layer, concrete, letter)]
    return add(identity(2), *heads)  # one sum, not one per head (linear in the heads)


def stream_product(arch: Architecture, first: int, upto: int, word: tuple, concrete: bool, letter: str = "h"):
    """``Π_{l = upto-1 … first} (layer l) · (Id ⊗ word)``: a source entering at ``first``."""
    factors = [layer_factor(arch, l, concrete, letter) for l in reversed(range(first, upto))]
    if word:
        factors.append(term(None, word))
    if not factors:
        return identity(2)
    return factors[0] if len(factors) == 1 else Product(factors)


def by_order(expr: TensorSum, slot: int = 0) -> list[tuple[str, TensorSum]]:
    """Groups of terms by how many patterns ``A`` their position word holds."""
    groups: dict[int, dict] = {}
    for t in expr:
        k = sum(a.name == "A" for a in t.words[slot])
        groups.setdefault(k, {})[t.words] = t.coeff
    names_ = {0: "direct path", 1: "individual heads"}
    return [(names_.get(k, f"virtual heads through {k} heads"), TensorSum(g, n_slots=expr.n_slots))
            for k, g in sorted(groups.items())]


def per_layer(template: str, layer: int) -> Numbered:
    """Prose that names a layer: ``template.format(layer)``, or ``layer + 1`` in the paper's numbering.

    >>> per_layer("the output of layer {}", 0).at(1)
    ('the output of layer 1',)
    """
    return Numbered(template.format(layer), template.format(layer + 1))


def source_math(source: Source) -> Math:
    kind = source.kind
    if kind in ("token", "position"):
        short = "tok" if kind == "token" else "pos"
        return Math(rf"T_{{\mathrm{{{short}}}}}", f"T_{short}")
    if kind == "bias":
        return math(f"T_{{b_O^{{L{source.layer}}}}}")
    if kind == "mlp":
        return math(f"T_{{mlp^{{L{source.layer}}}}}")
    return Math(r"T_{b_U}", "T_(b_U)")


def architecture(layers, heads, positional, layer_norm, biases, mlp) -> Architecture:
    return Architecture(layers, heads if isinstance(heads, int) else tuple(heads), positional=positional,
                        layer_norm=layer_norm, biases=biases, mlp=mlp)
