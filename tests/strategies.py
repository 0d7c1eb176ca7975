"""Hypothesis strategies shared by the test suite.

Algebra strategies (tensoralg): atoms, words whose shapes chain, k-slot terms, canonical
sums, lazy products and sums, and numeric bindings for them. Every slot has a fixed square
dimension (``n_ctx`` for position slots, ``d_model`` for residual slots), and a word in
that slot is a product of *loops*, short words that start and end at that dimension
(``A^{h}``, ``W_O^{h} W_V^{h}``, ``W_Q^{h}ᵀ W_K^{h}``, ``W_E W_Eᵀ`` …). So any sum,
product or sandwich of generated expressions with the same slot layout is well shaped,
while the words still mix rectangular atoms, transposes and symmetric atoms.

A few indices only (``INDICES``), so like terms meet and collect.
"""

from __future__ import annotations

from typing import NamedTuple

import sympy as sp
import torch
from hypothesis import strategies as st

from numeric_check.strategies import (  # noqa: F401 - re-exported for the suite
    architectures,
    circuit_models,
    model_configs,
    models_and_tokens,
    token_batches,
)

from tensoralg import Add, Product, TensorSum, atom, d_head
from tensoralg.expr import Term
from tests.helpers import random_bindings
from tests.conftest import PROPERTY  # noqa: F401 - re-exported for the algebra's property tests

INDICES = ("", "1", "2", "h1", "L0H3")

# Slot layouts: one dimension per slot (logits terms: position ⊗ residual; QK: 3 slots).
LAYOUTS = (("d_model",), ("n_ctx", "d_model"), ("n_ctx", "n_ctx", "d_model"))


def _loops(dim: str, i: str) -> list[tuple]:
    """Words that start and end at ``dim``, for index ``i``."""
    a = lambda name: atom(name, i)  # noqa: E731
    if dim == "n_ctx":
        return [(a("A"),), (a("A").T,), (a("N"),), (atom("W_pos").T, atom("W_pos"))]
    return [
        (a("W_OV"),), (a("W_OV").T,), (a("W_QK"),), (a("W_O"), a("W_V")), (a("W_Q").T, a("W_K")),
        (atom("W_E"), atom("W_E").T), (atom("W_U").T, atom("W_U")),
    ]


indices = st.sampled_from(INDICES)

# One static strategy per dimension (building strategies inside draws is slow in hypothesis).
_LOOPS = {dim: st.sampled_from([w for i in INDICES for w in _loops(dim, i)]) for dim in ("n_ctx", "d_model")}


def loops(dim: str):
    """One short square word at ``dim`` (``n_ctx`` or ``d_model``)."""
    return _LOOPS[dim]


def _concat(parts) -> tuple:
    return tuple(a for part in parts for a in part)


def words(dim: str, max_loops: int = 3):
    """A word (tuple of atoms, ``()`` = Id) of shape ``dim x dim``."""
    return st.lists(_LOOPS[dim], max_size=max_loops).map(_concat)


def atoms():
    """A standard atom with an index, possibly transposed."""
    return st.one_of(*_LOOPS.values()).flatmap(st.sampled_from)


coefficients = st.one_of(
    st.integers(-3, 3).filter(bool).map(sp.Integer),
    st.tuples(st.integers(-3, 3).filter(bool), st.integers(1, 4)).map(lambda t: sp.Rational(*t)),
    st.sampled_from([1 / sp.sqrt(d_head), sp.sqrt(2), 1 + sp.sqrt(2)]),
)
"""Scalar coefficients: small integers and fractions, ``1/sqrt(d_head)``, surds."""


layouts = st.sampled_from(LAYOUTS)


def terms(layout: tuple[str, ...], coeff: bool = True):
    """One term ``c · F_1 ⊗ … ⊗ F_k`` with ``F_i`` square at ``layout[i]``."""
    c = st.one_of(st.just(sp.S.One), coefficients) if coeff else st.just(sp.S.One)
    return st.builds(Term, c, st.tuples(*[words(dim) for dim in layout]))


@st.composite
def tensor_sums(draw, layout: tuple[str, ...], min_terms: int = 1, max_terms: int = 4) -> TensorSum:
    """A canonical sum of up to ``max_terms`` terms (like terms may collect, even to zero)."""
    ts = draw(st.lists(terms(layout), min_size=min_terms, max_size=max_terms))
    return TensorSum(ts, n_slots=len(layout))


@st.composite
def layers(draw, layout: tuple[str, ...], max_terms: int = 3) -> TensorSum:
    """``Id ⊗ … ⊗ Id + Σ terms``: a factor of a transformer-like product."""
    rest = draw(st.lists(terms(layout), min_size=1, max_size=max_terms))
    return TensorSum([Term(sp.S.One, ((),) * len(layout))] + rest)


@st.composite
def products(draw, layout: tuple[str, ...], max_factors: int = 3) -> Product:
    """A lazy product of 2..``max_factors`` sums, with an optional scalar."""
    factor = st.one_of(tensor_sums(layout, max_terms=3), layers(layout, max_terms=2))
    factors = draw(st.lists(factor, min_size=2, max_size=max_factors))
    coeff = draw(coefficients) if draw(st.booleans()) else 1
    return Product(factors, coeff)


@st.composite
def lazy_sums(draw, layout: tuple[str, ...]) -> Add:
    """A lazy sum of products and canonical sums."""
    parts = draw(st.lists(st.one_of(products(layout), tensor_sums(layout)), min_size=1, max_size=3))
    parts.append(draw(products(layout)))
    return Add(draw(st.permutations(parts)))


def expressions(layout: tuple[str, ...]):
    """Any expression with this slot layout: a canonical sum, a lazy product or a lazy sum."""
    return st.one_of(tensor_sums(layout), products(layout), lazy_sums(layout))


@st.composite
def any_expression(draw):
    """An expression with a random layout of 1 to 3 slots."""
    return draw(expressions(draw(layouts)))


@st.composite
def streams(draw, max_terms: int = 3) -> TensorSum:
    """A 2-slot residual stream on token one-hots: ``Σ P ⊗ (W … W_E)``, shapes n_ctx and d_model x d_vocab."""
    ts = draw(st.lists(terms(("n_ctx", "d_model")), min_size=1, max_size=max_terms))
    return TensorSum([Term(t.coeff, (t.words[0], t.words[1] + (atom("W_E"),))) for t in ts])


def seeds():
    """Seeds for :func:`tests.helpers.random_bindings` (numeric values drawn by numpy, not hypothesis)."""
    return st.integers(0, 2**32 - 1)


@st.composite
def numeric_bindings(draw, *exprs):
    """Random arrays for every atom of ``exprs`` (``W_OV = W_O W_V`` and ``W_QK = W_Qᵀ W_K`` hold)."""
    return random_bindings(*exprs, seed=draw(seeds()))


# -- architectures and models -----------------------------------------------------------
# The public strategies (architectures, model_configs, circuit_models, token_batches,
# models_and_tokens) live in numeric_check.strategies so that users can test their own
# code with them; they are imported above.


@st.composite
def architectures_with_head(draw, max_layers: int = 3, max_heads: int = 3, extras: bool = True):
    """``(arch, layer, head)`` for an existing head of a small architecture; ``extras=False``
    switches layer norm, biases and MLPs off."""
    off = {} if extras else {"layer_norm": False, "biases": False, "mlp": False}
    arch = draw(architectures(min_layers=1, max_layers=max_layers, max_heads=max_heads, **off))
    layer, head = draw(heads_of(arch))
    return arch, layer, head


def heads_of(arch):
    """``(layer, head)`` for an existing head of ``arch`` (which has at least one layer)."""
    return st.integers(0, arch.n_layers - 1).flatmap(
        lambda layer: st.tuples(st.just(layer), st.integers(0, arch.heads_per_layer[layer] - 1))
    )


def max_orders(largest: int):
    """``None`` (no truncation) or a truncation order in ``0..largest``."""
    return st.none() | st.integers(0, largest)


# -- factored products ---------------------------------------------------------------------


def _fill(shapes: list[tuple[int, ...]], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in shapes]


@st.composite
def factor_chains(
    draw,
    min_factors: int = 1,
    max_factors: int = 4,
    max_dim: int = 6,
    square: bool = False,
    batched: bool = False,
) -> list[torch.Tensor]:
    """Float64 tensors ``F_1 … F_n`` that chain (``[d_0, d_1], [d_1, d_2], …``); ``square``: ``d_n = d_0``.

    ``batched``: each factor may carry its own leading dimensions, broadcastable against the
    others (absent, of size 1, or of the drawn size), as per-head weights next to shared ones.
    Values come from a seeded torch generator (hypothesis draws shapes and the seed).
    """
    n = draw(st.integers(min_factors, max_factors))
    dims = draw(st.lists(st.integers(1, max_dim), min_size=n + 1, max_size=n + 1))
    if square:
        dims[-1] = dims[0]
    batch = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)) if batched else []
    shapes = []
    for i in range(n):
        own = [draw(st.sampled_from([1, size])) for size in batch] if batch and draw(st.booleans()) else []
        shapes.append(tuple(own) + (dims[i], dims[i + 1]))
    return _fill(shapes, draw(st.integers(0, 2**31 - 1)))


@st.composite
def factor_chain_pairs(draw, max_factors: int = 4, max_dim: int = 5) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Two chains of (possibly different) lengths with the same outer shape, for sums."""
    rows, cols = draw(st.integers(1, max_dim)), draw(st.integers(1, max_dim))

    def chain() -> list[tuple[int, int]]:
        n = draw(st.integers(1, max_factors))
        inner = draw(st.lists(st.integers(1, max_dim), min_size=n - 1, max_size=n - 1))
        dims = [rows, *inner, cols]
        return [(dims[i], dims[i + 1]) for i in range(n)]

    first, second = chain(), chain()
    tensors = _fill(first + second, draw(st.integers(0, 2**31 - 1)))
    return tensors[: len(first)], tensors[len(first) :]


@st.composite
def fraction_matrices(draw, rows: int, cols: int, bound: int = 5):
    """A ``rows × cols`` matrix of small exact fractions, as a tuple of row tuples."""
    from fractions import Fraction

    entry = st.builds(Fraction, st.integers(-bound, bound), st.integers(1, 4))
    return tuple(tuple(draw(entry) for _ in range(cols)) for _ in range(rows))


# -- the slides' notation (tensoralg.parse) ----------------------------------------------------


class SlideNotation(NamedTuple):
    """One operator written twice: ``new`` in the slides' notation (bare superscripts,
    indexed sums, implicit products, generic names, maybe applied to ``x``) and ``old``
    in the braced, fully declared syntax (``atoms`` declares its generic names)."""

    new: str
    old: str
    index_from: int
    atoms: dict
    applied: bool


@st.composite
def slide_notations(draw, max_factors: int = 3) -> SlideNotation:
    """``(Id ⊗ W_U) F_1 … F_k (Id ⊗ W_E)`` (or ``… x``) with each ``F_i`` one of: a layer
    ``Id + Σ_{h∈H_l} A^h ⊗ W_OV^h`` (its like term typed twice, sometimes), a head with an
    unfolded ``W_O^i W_V^i``, a transposed head, or a generic ``Id ⊗ B``."""
    index_from = draw(st.sampled_from((0, 1)))
    seen_layers: dict[int, int] = {}
    new, old = ["(Id ⊗ W_U)"], ["(Id ⊗ Id)(Id ⊗ W_U)"]
    atoms: dict = {}
    for _ in range(draw(st.integers(1, max_factors))):
        kind = draw(st.sampled_from(("layer", "head", "transposed", "generic")))
        i = draw(st.sampled_from(("1", "h", "q2")))  # free indices, never one a Σ binds
        stored = "q1" if i == "q2" and index_from else i  # q2 counted from 1 is q1 (as the printer writes it)
        if kind == "layer":
            layer = draw(st.integers(0, 2))
            index = f"h{layer}" + "'" * seen_layers.get(layer, 0)  # a second sum over a layer: renamed apart
            seen_layers[layer] = seen_layers.get(layer, 0) + 1
            term = f"Σ_{{h∈H_{layer + index_from}}} A^h ⊗ W_OV^h"
            ascii_term = f"sum_{{h in H_{{{layer + index_from}}}}} A^h (x) W_OV^{{h}}"
            twice = draw(st.booleans())
            body = draw(st.sampled_from((term, ascii_term)))
            new.append(f"(Id + {body}" + (f" + {term})" if twice else ")"))
            old.append(f"(Id ⊗ Id + {2 if twice else 1}·A^{{{index}}} ⊗ W_OV^{{{index}}})")
        elif kind == "head":
            new.append(f"(A^{i} ⊗ W_O^{i} W_V^{i})")
            old.append(f"(A^{{{stored}}} ⊗ W_O^{{{stored}}}·W_V^{{{stored}}})")
        elif kind == "transposed":
            new.append(f"(A^{i} ⊗ W_O^{i} W_V^{i})^T")
            old.append(f"(A^{{{stored}}}ᵀ ⊗ W_V^{{{stored}}}ᵀ W_O^{{{stored}}}ᵀ)")
        else:
            new.append("(Id ⊗ B)")
            old.append("(Id ⊗ B)")
            atoms["B"] = ("d_model", "d_model")
    applied = draw(st.booleans())
    new.append(draw(st.sampled_from((" x", "·x"))) if applied else "(Id ⊗ W_E)")
    if not applied:
        old.append("(Id ⊗ W_E)")
    return SlideNotation("".join(new), "".join(old), index_from, atoms, applied)


@st.composite
def token_rows(draw, max_rows: int = 3, max_len: int = 12, max_vocab: int = 6) -> torch.Tensor:
    """Small ``[rows, n]`` token tensors over a small vocabulary (so that tokens recur)."""
    rows, n, vocab = draw(st.integers(1, max_rows)), draw(st.integers(1, max_len)), draw(st.integers(1, max_vocab))
    flat = draw(st.lists(st.integers(0, vocab - 1), min_size=rows * n, max_size=rows * n))
    return torch.tensor(flat, dtype=torch.long).view(rows, n)


def token_sequences(vocabulary: tuple[str, ...] = ("a", "b", "c"), max_size: int = 8):
    """Short token sequences over a small vocabulary (induction examples)."""
    return st.lists(st.sampled_from(vocabulary), min_size=1, max_size=max_size).map(tuple)


# -- hostile text for the parser (issue 11): fragments of the grammar, numbers and junk --
HOSTILE_FRAGMENTS = [
    "A", "W_OV", "W_E", "W_U", "Id", "x", "B", "^h", "^{h1}", "^T", "ᵀ", "⊗", "(x)", "·", "*", "/", "**",
    "+", "-", "(", ")", "sqrt(", "Σ_{h∈H_0} ", "sum_{h in H_1} ", "0", "0.", ".0", "0e5", "1.5", "1e300",
    "1e-300", "9", "99999999999", "d_head", "n_ctx", " ", ".", "e", "{", "}", "^", "_",
]


@st.composite
def hostile_text(draw) -> str:
    """Text a careless user or an attacker might type: grammar fragments, numbers and junk."""
    parts = draw(st.lists(st.one_of(st.sampled_from(HOSTILE_FRAGMENTS), st.text(max_size=3)), max_size=40))
    if draw(st.booleans()):  # sometimes a deep or long run of one fragment
        piece = draw(st.sampled_from(["(", "sqrt(", "2**", "A·", "Σ_{h∈H_0} "]))
        parts.append(piece * draw(st.integers(0, 400)))
    return "".join(parts)


# Markup an attacker might put in a name, a title or a token string shown on an HTML page.
MARKUP_FRAGMENTS = [
    "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", '"><svg onload=alert(1)>', "' onmouseover='x",
    "&lt;", "&amp;", "&#60;", "</math>", "<math>", "<!--", "-->", "<![CDATA[", "]]>", "\\text{", "$", "\x00", "\u202e",
]


@st.composite
def markup_text(draw) -> str:
    """Text mixing HTML markup, entities, control characters and arbitrary Unicode."""
    parts = draw(st.lists(st.one_of(st.sampled_from(MARKUP_FRAGMENTS), st.text(max_size=4)), max_size=12))
    return "".join(parts)


# -- command lines (tests/test_fuzz.py) -------------------------------------------------------

#: Values a careless user or an attacker might give a flag: numbers of every size, special
#: floats, lists, non-ASCII digits, control characters, the formats, and junk.
HOSTILE_VALUES = st.one_of(
    st.integers(-3, 30).map(str),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["", "nan", "inf", "-inf", "1.5", "1e9", "2,3", "1,1,1", "0x10", "1_000", "٣", "1\x07", "\x1b[2J",
                     "text", "latex", "markdown", "json", "html", "standard", "qk_only", "neox", "gptj", "W_OV", "V=d_model,k",
                     "A=2,3", "V=-1,2", "x=n_ctx,d_model"]),
    st.text(max_size=6).filter(lambda v: not v.startswith("-") or v[1:2].isdigit()),  # never an option: no -o FILE
)
EXPAND_FLAGS = ("--max-order", "--atom", "--fold", "--index-from", "--format", "--max-terms", "--strict")
DERIVE_FLAGS = ("--layers", "--heads", "--layer", "--head", "--max-order", "--positional", "--index-from", "--format",
                "--max-terms", "--concrete", "--symbolic", "--layer-norm", "--biases", "--mlp", "--frequencies", "--partial",
                "--style")
SWITCHES = ("--strict", "--concrete", "--symbolic", "--layer-norm", "--biases", "--mlp", "--partial")
EXPAND_EXAMPLES = ["(Id ⊗ W_U)(Id + Σ_{h∈H_0} A^h ⊗ W_OV^h)(Id ⊗ W_E)", "(A ⊗ W_O W_V)·x", "V Vᵀ ⊗ A",
                   "((Id + A^{0})(Id + A^{1})(Id + A^{2})) ⊗ Id", "(A^h ⊗ W_O^h W_V^h)·x"]


@st.composite
def cli_arguments(draw, entries: list[str]) -> list[str]:
    """``tcircuits derive NAME …`` or ``tcircuits expand EXPR …`` with up to three flags, each
    with a hostile value; never ``-o`` or ``--pdf`` (nothing is written)."""
    if draw(st.booleans()):
        argv = ["expand", draw(st.one_of(hostile_text(), st.sampled_from(EXPAND_EXAMPLES)))]
        flags = EXPAND_FLAGS
    else:
        argv = ["derive", draw(st.one_of(st.sampled_from(entries), st.sampled_from(entries), st.text(max_size=8)))]
        flags = DERIVE_FLAGS
    for flag in draw(st.lists(st.sampled_from(flags), max_size=3, unique=True)):
        argv += [flag] if flag in SWITCHES else [flag, draw(HOSTILE_VALUES)]
    return argv


#: Any JSON value a careless or hostile writer might put in a config: huge integers,
#: special floats (NaN, infinities), strings, nested lists and objects.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


# -- hostile input, round 3 (issue 21): one strategy per family ------------------------------

#: What may already sit at an output path: nothing, a file, a link to a file elsewhere (which
#: must stay as it was), a dangling link, a FIFO, a folder.
OUTPUT_PLACES = ("absent", "file", "link", "dangling", "fifo", "folder")

#: What may already sit in a folder a command writes whole (issue 29): the tool's own file as it
#: wrote it, one a person edited since, a person's file, a link to a file elsewhere, a FIFO, a folder.
FOLDER_KINDS = ("ours", "edited", "file", "link", "fifo", "folder")


def output_folders(names: list[str]) -> st.SearchStrategy[dict[str, str]]:
    """An old output folder: ``{relative path: kind of FOLDER_KINDS}`` at names the command writes
    (``names``) and at names of a person's own."""
    return st.dictionaries(st.sampled_from([*names, "notes.txt", "figures/mine.svg", "sub/deep.txt"]),
                           st.sampled_from(FOLDER_KINDS), max_size=6)


def output_texts() -> st.SearchStrategy[tuple[str, str, str]]:
    """What a person may type after ``-o`` (issue 29), as ``(folder, name, ending)`` to join in a
    sandbox: a folder that exists, a new one, a file, a link to another folder; a new name, a
    file, a link, a FIFO, a checkpoint or its training record, nothing, ``.``, ``..``; and a
    trailing ``/`` or ``/.``. (Paths under /dev are tried only in a private mount namespace.)"""
    return st.tuples(st.sampled_from(["", "DIR/", "NEW/", "FILE/", "LINKDIR/"]),
                     st.sampled_from(["new.txt", "EXISTING", "LINK", "DANGLING", "FIFO", "m.json", "m.safetensors",
                                      "", ".", "..", "o\x1bu\nt.tex"]),
                     st.sampled_from(["", "/", "/."]))

LINE_BREAKS_IN_TOKENS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # str.splitlines() breaks on each


@st.composite
def vocab_files(draw) -> tuple[list[str], bytes]:
    """Tokens and a one-token-per-line file of them: any characters but ``\\n`` (those
    ``str.splitlines()`` breaks on included), a token never ending in ``\\r``; lines ended by
    ``\\n`` or ``\\r\\n``, perhaps a byte-order mark, perhaps no final line end; a BERT-style
    ``[PAD]`` first now and then."""
    alphabet = st.one_of(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"),
                         st.sampled_from(LINE_BREAKS_IN_TOKENS + "\r[]{}\"\ufeff"))
    tokens = draw(st.lists(st.text(alphabet, min_size=1, max_size=6).filter(lambda t: not t.endswith("\r")),
                           min_size=1, max_size=12))
    if draw(st.booleans()):
        tokens = ["[PAD]", "[UNK]", *tokens]
    end = draw(st.sampled_from(["\n", "\r\n"]))
    text = end.join(tokens) + (end if draw(st.booleans()) else "")
    return tokens, (("\ufeff" if draw(st.booleans()) else "") + text).encode("utf-8")


@st.composite
def long_digit_runs(draw) -> str:
    """A run of digits around Python's 4,300-digit conversion limit, or a short one."""
    return "1" + "0" * draw(st.one_of(st.integers(0, 30), st.integers(4290, 4400), st.integers(90, 110)))


@st.composite
def undeclared_products(draw) -> str:
    """A product or a sum of many undeclared names (shape inference's worst case)."""
    n = draw(st.integers(1, 2000))
    if draw(st.booleans()):
        return " ".join(f"B{i}" for i in range(n)) + " ⊗ C"
    return " + ".join(f"B{i} ⊗ C{i}" for i in range(min(n, 200)))


@st.composite
def scalar_texts(draw) -> str:
    """Coefficients the parser accepts at its bounds: powers of sizes and numbers, products of them."""
    base = draw(st.sampled_from(["d_head", "d_model", "n_ctx", "2", "10", "1/2", "sqrt(d_head)"]))
    exponent = draw(st.one_of(st.integers(-1000, 1000), st.integers(-5, 5)))
    factor = draw(st.sampled_from(["", "10**300·", "1e-300·", "d_model**500·"]))
    return f"{factor}{base}**{exponent}"


# -- what the printers write, read back (issue 27.4) -------------------------------------------

def _printable_loops(dim: str) -> list[tuple]:
    """Square words at ``dim`` whose printing exercises the reader: primes (``W_OV'``), upright
    LaTeX names and indices (``\\mathrm{Attn}``, ``A^{\\mathrm{prev}}``), escaped underscores, primed
    and comma indices, head labels, a layer's summed index ``h1``."""
    from tensoralg import Atom, d_model, n_ctx

    if dim == "n_ctx":
        return [(atom("A", i),) for i in ("h1", "prev", "L0H3", "2")] + [
            (Atom("P_shift", n_ctx, n_ctx),), (Atom("N", n_ctx, n_ctx, "h,q", symmetric=True),), (atom("A", "h1").T,)]
    return [(Atom("W_OV'", d_model, d_model, "h1"),), (Atom("Attn", d_model, d_model),),
            (Atom("W_a_b", d_model, d_model, "k1'"),), (atom("W_O", "h1"), atom("W_V", "h1")),
            (atom("W_Q", "L0H3").T, atom("W_K", "L0H3")), (atom("W_E"), atom("W_E").T)]


_PRINTABLE_LOOPS = {dim: st.sampled_from(_printable_loops(dim)) for dim in ("n_ctx", "d_model")}

#: Coefficients as people and sympy write them: integers, fractions, square roots and fractions of
#: them, sizes and their powers, decimals.
printable_coefficients = st.one_of(
    coefficients,
    st.sampled_from([sp.sqrt(2) / 3, 3 / (2 * sp.sqrt(d_head)), sp.sqrt(d_head) / d_head, 1 / sp.Symbol(
        "d_model", positive=True, integer=True), d_head**2, sp.Float(0.5), sp.Float(1.25), sp.Rational(-7, 2)]),
)


@st.composite
def printable_sums(draw, layout: tuple[str, ...]) -> TensorSum:
    """A canonical sum of terms over the printable loops, maybe summed over layer 1's heads (``h1``)."""
    from tensoralg.bound import Bound

    ts = []
    for _ in range(draw(st.integers(1, 3))):
        ws = tuple(tuple(a for loop in draw(st.lists(_PRINTABLE_LOOPS[d], max_size=2)) for a in loop) for d in layout)
        ts.append(Term(draw(st.one_of(st.just(sp.S.One), printable_coefficients)), ws))
    s = TensorSum(ts, n_slots=len(layout))
    return s.with_bound((Bound("h1", "h", "H_1", 1),)) if draw(st.booleans()) else s


@st.composite
def column_sums(draw) -> TensorSum:
    """Terms of the folding entries: ``c · P 1 ⊗ W b`` with the column of ones ``1`` (``n_ctx × 1``) and
    a bias ``b`` (``d_model × 1``), or ``1 ⊗ b`` itself."""
    from tensoralg import Atom, n_ctx

    ones = Atom("1", n_ctx, 1)
    ts = []
    for _ in range(draw(st.integers(1, 3))):
        position = draw(st.one_of(st.just(()), _PRINTABLE_LOOPS["n_ctx"]))
        residual = draw(st.one_of(st.just(()), _PRINTABLE_LOOPS["d_model"]))
        bias = draw(st.sampled_from([atom("b_O"), atom("b_O", "h1"), atom("W_O", "h1")]))
        bias = (bias, atom("b_V", "h1")) if bias.name == "W_O" else (bias,)
        ts.append(Term(draw(st.one_of(st.just(sp.S.One), printable_coefficients)), (position + (ones,), residual + bias)))
    return TensorSum(ts)


@st.composite
def printable_expressions(draw):
    """What the printers are asked to print: printable sums and column sums, lazy products and sums of
    them, generic expressions, and zero."""
    layout = draw(layouts)
    return draw(st.one_of(
        printable_sums(layout),
        # factors summed over the same heads would be one sum in the product, two in its printing: none here
        st.lists(printable_sums(layout).map(lambda s: TensorSum(list(s), n_slots=s.n_slots)), min_size=2,
                 max_size=3).map(Product),
        st.lists(printable_sums(layout), min_size=1, max_size=3).map(lambda parts: Add(parts)),
        column_sums(),
        expressions(layout),
        st.just(TensorSum([], n_slots=len(layout))),
    ))


#: Identities as people type them into ``tcircuits check`` (issues 27 and 29): the slides' forms,
#: opaque functions, zero sides, decimals, products of many sums, long sums of names.
CHECK_EXAMPLES = [
    "(A ⊗ W)x = AxW^T", "W_QK^h = W_Q^{h^T} W_K^h", "W_QK^{Th} = W_Q^{h}ᵀ W_K^h", "softmax(A) = softmax(B)",
    "exp(A) = exp(-A)", "h(x) = (A ⊗ W_OV) x", "LN(x) = x", "Σ_{h∈H_1∪H_2} A^h = A", "Id ⊗ Id = Id", "W_E = 0",
    "(A ⊗ B) x = 0", "0.1 A + 0.2 A = 0.3 A", r"\frac{1}{\sqrt{d_{head}}} A = 1/sqrt(d_head)·A", "A^{h} 1 ⊗ b_O = 0",
    "".join(f"(A^{{a{i}}}+A^{{b{i}}})" for i in range(24)) + " = A^{a0}", " + ".join(f"B{i}" for i in range(500)) + " = 0",
]
CHECK_FLAGS = ("--seed", "--opaque", "--index-from", "--atom", "--format")


@st.composite
def check_arguments(draw) -> list[str]:
    """``tcircuits check IDENTITY …``: an identity (one of the forms above, hostile text on either side,
    or hostile text alone) and up to two flags with hostile values; never ``-o`` (nothing is written)."""
    identity = draw(st.one_of(
        st.sampled_from(CHECK_EXAMPLES),
        st.tuples(hostile_text(), st.one_of(hostile_text(), st.sampled_from(["0", "A", "Id ⊗ Id"]))).map(" = ".join),
        hostile_text(),
    ))
    argv = ["check", identity]
    for flag in draw(st.lists(st.sampled_from(CHECK_FLAGS), max_size=2, unique=True)):
        argv += [flag] if flag == "--opaque" else [flag, draw(HOSTILE_VALUES)]
    return argv


# -- hostile input, round 5 (issue 38): one strategy per family ------------------------------

#: Where a link may sit on the way to an output folder (``analyze --out``, ``paper --out``) or to the
#: folder of ``-o DIR/FILE``: nowhere, at the folder itself, or at a parent; leading to a folder that
#: exists, or to nothing yet (a dangling link: the folder would be made wherever it points).
LINK_PLACES = ("none", "folder", "parent")
LINK_TARGETS = ("existing", "dangling", "dangling-deep")


def linked_outputs() -> st.SearchStrategy[tuple[str, str, int, bool]]:
    """``(where the link is, where it leads, folders still to make below it (0-2), force)``."""
    return st.tuples(st.sampled_from(LINK_PLACES), st.sampled_from(LINK_TARGETS), st.integers(0, 2), st.booleans())


#: Where a file system may be mounted inside an output folder (only ever inside a private mount
#: namespace): a folder the tool writes (``figures``), a person's folder, deeper, or the folder itself.
MOUNT_PLACES = ("figures", "mine", "mine/deep", "figures/deeper", ".")


def mounted_outputs() -> st.SearchStrategy[tuple[str, int, bool, bool]]:
    """``(where the mount is, how many files it holds (0-3), force, whether the folder was written
    by tcircuits before)``."""
    return st.tuples(st.sampled_from(MOUNT_PLACES), st.integers(0, 3), st.booleans(), st.booleans())


#: The signals that stop a command (each must clean up as Ctrl-C does).
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def signal_points() -> st.SearchStrategy[tuple[str, int]]:
    """``(signal, when)``: a stopping signal and after how many of the run's steps it comes
    (0: before the folder is made; large: during or after the swap)."""
    return st.tuples(st.sampled_from(STOP_SIGNALS), st.integers(0, 12))


@st.composite
def long_names(draw, low: int = 240, high: int = 255) -> str:
    """A file name of ``low``–``high`` bytes in UTF-8 (ASCII, accented letters, CJK, emoji), as long
    as a Linux file system allows: a temporary name beside it must fit too."""
    size = draw(st.integers(low, high))
    pieces = draw(st.lists(st.sampled_from(["a", "Z", "é", "∂", "語", "😀", "-", "_"]), min_size=1, max_size=8))
    text, i = "", 0
    while len((text + pieces[i % len(pieces)]).encode()) <= size - 4:
        text += pieces[i % len(pieces)]
        i += 1
    return text + "x" * (size - 4 - len(text.encode())) + ".txt"


#: Environment variables tcircuits (or a library it imports) reads, with the values an attacker or a
#: stale shell may leave there.
ENVIRONMENT = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", "HF_ENDPOINT", "HTTPS_PROXY",
               "https_proxy", "HTTP_PROXY", "ALL_PROXY", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")
ENVIRONMENT_VALUES = st.one_of(
    st.sampled_from(["", "abc", "-1", "0", "1", "2", "99999", "1e3", "٣", " 2 ", "2\n", "http://[::1", "http://[::1]:80",
                     "http://proxy:99999", "proxy:abc", "socks5://h:1080", "https://huggingface.co", "ftp://x", "http://",
                     "http://h:-1", "http://h:0x50", "x" * 300, "\x1b[2J", "http://a b"]),
    st.integers(-(2**40), 2**40).map(str),
    st.text(max_size=12),
)


def hostile_environments() -> st.SearchStrategy[dict[str, str]]:
    """Up to three of :data:`ENVIRONMENT` set to hostile values."""
    return st.dictionaries(st.sampled_from(ENVIRONMENT), ENVIRONMENT_VALUES.filter(lambda v: "\x00" not in v),
                           max_size=3)


@st.composite
def overflowing_identities(draw) -> tuple[str, bool]:
    """``(identity, holds)``: an identity whose sides are scaled by powers of ten near float64's range
    (1e150 to 1e300 a factor), true (the same product on both sides) or false (the factors swapped)."""
    k = draw(st.integers(1, 3))
    scales = [draw(st.integers(100, 300)) for _ in range(k)]
    names = draw(st.permutations(["A", "B", "C"]))[:k]
    left = "".join(f"(1e{s} {n})" for s, n in zip(scales, names))
    holds = k == 1 or draw(st.booleans())
    right = left if holds else "".join(f"(1e{s} {n})" for s, n in reversed(list(zip(scales, names))))
    return f"{left} = {right}", holds


@st.composite
def powers_of_sums(draw) -> str:
    """A coefficient that is a power (or a product of powers) of sums of sizes: the expansion SymPy
    would make is counted before it is made."""
    sizes = ["d_model", "d_head", "d_vocab", "d_mlp", "n_ctx", "2"]
    factors = []
    for _ in range(draw(st.integers(1, 3))):
        terms = draw(st.lists(st.sampled_from(sizes), min_size=1, max_size=5, unique=True))
        exponent = draw(st.one_of(st.integers(-1000, 1000), st.integers(-3, 40)))
        factors.append(f"({' + '.join(terms)})**{exponent}")
    return " ".join(factors) + " A"


@st.composite
def long_products(draw) -> str:
    """A product of many atoms as one might paste it (juxtaposed, with ``·``, transposes, groups,
    undeclared names), up to 20,000 atoms, now and then with a mismatch near the end."""
    n = draw(st.integers(1, 20_000))
    piece = draw(st.sampled_from(["A", "A·", "Aᵀ", "(A)", "B", "W_OV"]))
    text = " ".join([piece.rstrip("·")] * n) if piece != "A·" else "·".join(["A"] * n)
    if draw(st.booleans()):
        text += " " + draw(st.sampled_from(["W_E", "2", ")", "^", "Q^{h"]))
    return text
