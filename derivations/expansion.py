"""``tcircuits expand``: an expression typed in the slides' notation, rewritten step by step.

Every rewrite is its own line with the rule that justifies it: transposes of products read
from the input (``(W_O W_V)ᵀ = W_Vᵀ W_Oᵀ``), distributivity, the mixed-product rule,
collecting like terms (those typed in the input too), an operator applied to an
activation (``(A ⊗ W)·x = A x Wᵀ``) and folding definitions (``W_OV := W_O W_V``).
Indices bound by ``Σ_{h∈H_l}`` stay symbolic: each term is summed over the heads its
indices range over, as the catalogue's derivations print it.

>>> d = expansion("(Id ⊗ W_U)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id ⊗ W_E)")
>>> [s.rule.key for s in d.steps]
['given', 'distributivity', 'mixed-product']
>>> d.chains[0].last
TensorSum(Id ⊗ W_U W_E + A^{h1} ⊗ W_U W_OV^{h1} W_E)
"""

from __future__ import annotations

import re
from typing import Sequence

from tensoralg.action import act, transposed_products
from tensoralg.atoms import transpose_word
from tensoralg.definitions import STANDARD_DEFINITIONS
from tensoralg.errors import TensorAlgError
from tensoralg.formula import formula
from tensoralg.lexer import OTIMES_ASCII
from tensoralg.expr import Add, Product, check_order, term
from tensoralg.latex import to_latex
from tensoralg.parse import Bound, notes, parse, read

from derivations import catalogue
from derivations.derivation import Chain, Derivation, Rule
from derivations.errors import DerivationError
from derivations.document import Math, SumIndex, math, prose
from derivations.numeric import Numeric

ACTION = Rule("action", "an operator applied to an activation",
              Math(r"(A \otimes W)\cdot x = A\, x\, W^{\top}", "(A ⊗ W)·x = A x Wᵀ"))
TRANSPOSE = Rule("transpose", "transpose of a product", Math(r"(XY)^{\top} = Y^{\top} X^{\top}", "(XY)ᵀ = Yᵀ Xᵀ"))
GROUPS_UNDER_OTIMES = prose("read backwards: a product inside one slot is a product of factors acting on that "
                             "slot alone, ", Math(r"(FG) \otimes H = (F \otimes \mathrm{Id})(G \otimes \mathrm{Id})"
                                                 r"(\mathrm{Id} \otimes H)", "(FG) ⊗ H = (F ⊗ Id)(G ⊗ Id)(Id ⊗ H)"),
                             ", so truncation by order counts the groups' factors too")
CLI_HINT = "declare others with --atom NAME=ROWS,COLS"
SIZES_HINT = "a name without a declared shape has no size to check with: declare it with --atom NAME=ROWS,COLS (sizes such as d_model or 3)"
OPERATOR = Math("T", "T")  # the operator applied to an activation, when it needs expanding first
STAR = re.compile(r"(?<!\*)\*(?!\*)")


def sum_indices(bound: Sequence[Bound]) -> tuple[SumIndex, ...]:
    """The :class:`SumIndex` of each bound index, outer layers first (as the catalogue does).

    >>> from tensoralg.parse import read
    >>> [s.text() for s in sum_indices(read("Σ_{h∈H_1} A^h ⊗ W_OV^h").bound)]
    ['Σ_{h1∈H_1}']
    """
    out = []
    for b in sorted(bound, key=lambda b: (-(b.layer if b.layer is not None else -1), b.index)):
        if b.layer is not None:
            over = Math(f"H_{{{b.layer}}}", f"H_{b.layer}")
        else:
            head, _, sub = b.over.partition("_")
            over = Math(head + (f"_{{{sub}}}" if sub else ""), b.over)
        out.append(SumIndex(b.index, over))
    return tuple(out)


def transpose_math(words) -> tuple:
    """``(W_O W_V)ᵀ = W_Vᵀ W_Oᵀ`` for each word, through the tensoralg printer, as prose."""
    pieces: list = []
    for word in words:
        before, after = term(word), term(transpose_word(word))
        latex = rf"\left({to_latex(before)}\right)^{{\top}} = {to_latex(after)}"
        text = f"({before})ᵀ = {after}"
        pieces += [", " if pieces else "", Math(latex, text)]
    return prose(*pieces)


def expansion(text: str, max_order: int | None = None, atoms: dict | None = None, *, index_from: int = 0,
              fold: Sequence[str] = (), strict: bool = False, hint: str | None = None, opaque: bool = False) -> Derivation:
    """The rewrite steps of the expression ``text``, as a derivation (for teaching).

    ``index_from`` says how ``H_l`` in the text counts layers (0 as TransformerLens, 1 as
    the paper); ``fold`` names definitions to fold at the end (``"W_OV"``, ``"W_QK"``);
    ``strict`` refuses undeclared names (``hint`` says how to declare them); ``opaque`` reads
    ``softmax(…)`` as an opaque matrix instead of refusing it. How the text was read where it
    could mean something else (``AC`` read as ``A C``) is a note of the derivation.
    """
    check_order(max_order)
    definitions = [_definition(name) for name in fold]
    reading = read(text, atoms=atoms or None, index_from=index_from, generic=not strict, opaque=opaque,
                   **({"hint": hint} if hint else {}))
    expr = reading.expr
    applied = reading.applied
    if applied is not None and applied.coeff != 1:
        expr = expr.scale(applied.coeff)
    _check_size(expr, max_order)
    sums = sum_indices(reading.bound)
    transposes = list(dict.fromkeys(w for kind, w, *_ in reading.rewrites if kind == "transpose"))
    collected = sum(n for kind, n, *_ in reading.rewrites if kind == "collected")
    if transposes or collected:  # the input as typed, then what reading it rewrote
        lhs = typed(applied.typed if applied else text, atoms, index_from)
        detail = transpose_math(transposes) if transposes else ()
        if transposes and collected:
            detail += prose("; like terms collected inside the factors")
        first = Chain.start(lhs, expr, TRANSPOSE if transposes else "collect", detail=detail, sums=sums)
    elif any(kind == "tensor" for kind, *_ in reading.rewrites):  # groups under ⊗ became slot-wise factors
        lhs = typed(applied.typed if applied else text, atoms, index_from)
        first = Chain.start(lhs, expr, "mixed-product", detail=GROUPS_UNDER_OTIMES, sums=sums)
    else:
        first = Chain.start(None, expr, "given", sums=sums)
    chains = [first.expand(max_order)]
    if applied is not None:
        shown = typed(text, atoms, index_from)
        if len(chains[0].steps) == 1 and not transposes and shown is not None:
            chains = [_act(shown, chains[0].last, applied.activation, sums)]  # nothing to expand: act at once
        else:  # T = the operator, expanded; then T·x
            chains[0] = Chain(OPERATOR, chains[0].steps, chains[0].intro, chains[0].sums)
            x_latex, x_text = to_latex(applied.activation), str(applied.activation)
            if len(applied.activation) > 1 or any(len(w) > 1 for t in applied.activation for w in t.words):
                x_latex, x_text = rf"\left({x_latex}\right)", f"({x_text})"
            lhs = Math(rf"{OPERATOR.latex} \cdot {x_latex}", f"{OPERATOR.text}·{x_text}")
            chains.append(_act(lhs, chains[0].last, applied.activation, sums))
    if definitions:
        last = chains[-1]
        for d in definitions:
            folded = last.fold(d)
            if folded.last == last.last:
                raise DerivationError(f"--fold {d.name}: {d.text.split(':=')[-1].strip()} does not occur in "
                                      f"the expansion, so there is nothing to fold")
            last = folded
        chains[-1] = last
    steps = sum(len(c.steps) for c in chains)
    summary = ("It is already expanded: a canonical sum of tensor terms." if steps == 1 and not applied else
               "Each line applies one rule of the algebra to the line before.")
    params = (("expression", text), ("max_order", max_order), ("index_from", index_from), ("fold", list(fold)))
    read_as = tuple(f"How the text was read: {n}." for n in notes(reading))
    numeric = Numeric(missing=SIZES_HINT) if hint == CLI_HINT else Numeric()
    return Derivation("expand", "Expansion, step by step", summary, tuple(chains),
                      notes=(catalogue.NOTATION,) + read_as, params=params, numeric=numeric)


def typed(text: str, atoms: dict | None = None, index_from: int = 0) -> Math | None:
    """The input as typed, printed by :func:`tensoralg.formula.formula`, or ``None`` when
    what that printer shows would not read back as the same expression. Its layer numbers
    are the reader's already, so it is never re-numbered (no ``source``).

    >>> typed("sum_{h in H_1} A^h (x) W_OV^h").text
    'Σ_{h ∈ H_1} A^h ⊗ W_OV^h'
    """
    if "**" in text:  # the formula's text writes a power as x^2, which the expression reader takes for an index
        return None
    source = STAR.sub("·", OTIMES_ASCII.sub("⊗", text))
    try:
        f = formula(source)
        same = parse(f.text, atoms or None, index_from=index_from) == parse(text, atoms or None, index_from=index_from)
    except TensorAlgError:
        return None
    return Math(f.latex, f.text) if same else None


def _act(lhs: Math, operator, activation, sums) -> Chain:
    """``lhs = (Σ P ⊗ W)·x = Σ P x Wᵀ``, with the transposes of products it takes."""
    detail = [math("x"), " holds one token per row; ", math("A"), " mixes the rows (positions) and ", math("W"),
              " maps each row's vector, which for a row is the product by ", math("Wᵀ"), " on the right"]
    products = transposed_products(operator)
    if products:
        detail += [", with ", *transpose_math(products)]
    result = act(operator, activation)
    return Chain.start(lhs, result, ACTION, detail=prose(*detail), sums=sums)


def _definition(name: str):
    try:
        return STANDARD_DEFINITIONS[name]
    except KeyError:
        raise DerivationError(f"cannot fold {name!r}; the definitions are "
                              f"{', '.join(d.text for d in STANDARD_DEFINITIONS.values())}") from None


def _check_size(expr, max_order) -> None:
    if not isinstance(expr, (Product, Add)):
        return
    n = expr.count(max_order)
    if n > catalogue.DOCUMENT_LIMIT:
        parts = expr.parts if isinstance(expr, Add) else (expr,)
        largest = max((len(p.factors) for p in parts if isinstance(p, Product)), default=0)
        catalogue.too_many("the expansion", n, [expr.count(k) for k in range(largest + 1)],
                           smaller="expand fewer factors (or sums with fewer terms) at once")


__all__ = ["ACTION", "CLI_HINT", "TRANSPOSE", "expansion", "sum_indices", "transpose_math"]
