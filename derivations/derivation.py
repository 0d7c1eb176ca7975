"""Derivations: chains of equations, each line produced by a rule of the algebra.

A :class:`Derivation` is a titled list of :class:`Chain`\\ s. A chain reads
``lhs = e_1 = e_2 = …``: each :class:`Step` holds an expression and the :class:`Rule`
that produced it from the line before (the first step's rule says where ``e_1`` comes
from, e.g. a definition). Steps are made by applying the algebra's own functions
(:meth:`Chain.apply`, :meth:`Chain.expand`, :meth:`Chain.fold` …), never typed by hand,
and :meth:`Derivation.verify` checks every line numerically on random bindings.

>>> from tensoralg import atom, term
>>> T = Chain.start(math("T"), term(None, atom("W_U")) @ term(None, atom("W_E")))
>>> T = T.apply(lambda e: e.expand(), "mixed-product")
>>> print(T.last)
Id ⊗ W_U W_E
>>> d = Derivation("zero", "Zero layers", "The bigram table.", (T,))
>>> [s.rule.key for s in d.steps]
['definition', 'mixed-product']
>>> d.verify().ok
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from tensoralg import Add, Definition, Expr, Product, TensorSum, Term, fold, unfold
from tensoralg.atoms import DIMS
from tensoralg.rules import expand_steps

from derivations import render
from derivations.errors import DerivationError
from derivations.document import Math, SumIndex, as_prose, math, prose
from derivations.numeric import Numeric, RandomBindings, Verification, finite_operator, instantiate

# -- rules ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A justification: its key, its name, and the identity it states (if one)."""

    key: str
    name: str
    statement: Math | None = None


#: Every justification a derivation's step may give, by key.
RULES: dict[str, Rule] = {
    r.key: r
    for r in (
        Rule("definition", "definition"),
        Rule("given", "the expression as given"),
        Rule("substitution", "substitution"),
        Rule("distributivity", "distributivity",  # an identity factor chosen from a sum is left out
             Math(r"X(Y + Z)W = XYW + XZW, \quad X \, \mathrm{Id} \, W = XW", "X(Y + Z)W = XYW + XZW,  X Id W = XW")),
        Rule("mixed-product", "mixed-product rule",
             Math(r"(A \otimes B)(C \otimes D) = (AC) \otimes (BD)", "(A ⊗ B)(C ⊗ D) = (AC) ⊗ (BD)")),
        Rule("associativity", "associativity", Math(r"(XY)Z = X(YZ)", "(XY)Z = X(YZ)")),
        Rule("sum-out", "distributivity over a sum",  # a factor summed over heads, multiplied into its neighbours
             Math(r"X \left(\sum_m Y_m\right) Z = \sum_m X Y_m Z", "X (Σ_m Y_m) Z = Σ_m X Y_m Z")),
        Rule("scalars", "associativity and scalars",
             Math(r"(XY)Z = X(YZ), \quad X (aY) = a\, XY", "(XY)Z = X(YZ),  X (aY) = a XY")),
        Rule("identity", "identity", math("Id X = X Id = X")),
        Rule("collect", "collecting like terms", Math(r"aX + bX = (a + b)X", "aX + bX = (a + b)X")),
        Rule("fold", "folding a definition"),
        Rule("unfold", "unfolding a definition"),
        Rule("transpose", "transpose", Math(r"(XY)^{\top} = Y^{\top} X^{\top}", "(XY)ᵀ = Yᵀ Xᵀ")),
        Rule("bilinear", "bilinear form of two residual streams",
             Math(r"(P \otimes W_p)^{\top}\!\cdot M \cdot (Q \otimes W_q) \mapsto P \otimes Q \otimes W_p^{\top} M W_q",
                  "(P ⊗ W_p)ᵀ · M · (Q ⊗ W_q) ↦ P ⊗ Q ⊗ W_pᵀ M W_q")),
        Rule("block", "block matrices as tensor products",
             Math(r"\begin{bmatrix} X^{0} & X^{1} \end{bmatrix} = e^{0\top} \otimes X^{0} + e^{1\top} \otimes X^{1}",
                  "[X^0 X^1] = e^0ᵀ ⊗ X^0 + e^1ᵀ ⊗ X^1")),
        Rule("orthonormality", "orthonormality",
             Math(r"Q^{\top} Q = I \text{ for orthonormal columns}", "Qᵀ Q = I for orthonormal columns")),
        Rule("stochastic", "rows of an attention pattern sum to one", math("A 1 = 1")),
        Rule("regroup", "regrouping the terms"),
        Rule("truncation", "truncation by order"),
    )
}


def rule(key: str | Rule) -> Rule:
    """The rule named ``key`` (``"mixed-product"``, ``"mixed_product"`` …); unknown keys
    (from a rewrite engine that knows more rules) get a rule named after them.

    >>> rule("mixed_product").name
    'mixed-product rule'
    """
    if isinstance(key, Rule):
        return key
    if not isinstance(key, str) or not key.strip():
        raise DerivationError(f"a rule is a Rule or a non-empty name, got {key!r}; known: {', '.join(RULES)}")
    normal = "-".join(key.strip().lower().replace("_", " ").split())
    return RULES.get(normal) or Rule(normal, normal.replace("-", " "))


# -- steps and chains -------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One line ``= expr`` and its justification.

    ``detail`` says exactly what the rule did (e.g. which definition was folded);
    ``text`` is prose shown before the line; ``groups`` optionally splits the line's terms
    into labelled parts whose sum is ``expr`` (e.g. by composition).
    """

    expr: Expr
    rule: Rule
    detail: tuple = ()
    text: tuple = ()
    groups: tuple[tuple[str, TensorSum], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.expr, Expr):
            raise DerivationError(f"a step's expression must be a tensoralg expression, got {self.expr!r}")
        object.__setattr__(self, "rule", rule(self.rule))
        object.__setattr__(self, "detail", as_prose(self.detail))
        object.__setattr__(self, "text", as_prose(self.text))
        groups = tuple((label if isinstance(label, str) else as_prose(label), part) for label, part in self.groups)
        if groups and sum_of(part for _, part in groups) != self.expr.expand():
            raise DerivationError(f"the groups of a {self.rule.name} step do not add up to its expression")
        object.__setattr__(self, "groups", groups)


def sum_of(parts) -> TensorSum:
    parts = list(parts)
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


@dataclass(frozen=True)
class Chain:
    """``lhs = e_1 = e_2 = …`` (``lhs`` a :class:`Math` name, an expression, or ``None``).

    Immutable: every method returns a new chain with one more step.
    """

    lhs: Math | Expr | None
    steps: tuple[Step, ...]
    intro: tuple = ()
    sums: tuple[SumIndex, ...] = ()

    def __post_init__(self) -> None:
        if self.lhs is not None and not isinstance(self.lhs, (Math, Expr)):
            raise DerivationError(f"a chain's left-hand side is a Math name, an expression or None, got {self.lhs!r}")
        if not self.steps:
            raise DerivationError("a chain needs at least one step")
        if not all(isinstance(s, SumIndex) for s in self.sums):
            raise DerivationError(f"a chain's sums are SumIndex values, got {self.sums!r}")
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "intro", as_prose(self.intro))
        object.__setattr__(self, "sums", tuple(self.sums))

    @classmethod
    def start(cls, lhs, expr: Expr, rule: str | Rule = "definition", detail=(), intro=(), sums=()) -> "Chain":
        """A chain whose first line is ``expr``, justified by ``rule``; ``sums`` are the head
        indices its terms sum over (shown as Σ)."""
        return cls(lhs, (Step(expr, rule, detail),), intro, tuple(sums))

    @property
    def first(self) -> Expr:
        return self.steps[0].expr

    @property
    def last(self) -> Expr:
        return self.steps[-1].expr

    def _then(self, step: Step) -> "Chain":
        return Chain(self.lhs, self.steps + (step,), self.intro, self.sums)

    def apply(self, fn: Callable[..., Expr], rule: str | Rule, *args, detail=(), text=(), **kwargs) -> "Chain":
        """Add the line ``fn(last, *args, **kwargs)``, justified by ``rule``."""
        return self._then(Step(fn(self.last, *args, **kwargs), rule, detail, text))

    def expand(self, max_order: int | None = None, text=()) -> "Chain":
        """Add each rewrite of :func:`tensoralg.rules.expand_steps` as its own line
        (distributivity or truncation, mixed-product rule or associativity, collecting like
        terms: see :func:`product_rule`). When
        collecting combines nothing, it replaces the line before instead of repeating it."""
        chain = self
        for name, expr in expand_steps(self.last, max_order=max_order):
            if name == "mixed_product":
                name = product_rule(chain.last, self.sums)
            step = Step(expr, name, (), () if chain is not self else text)
            if step.rule.key == "collect" and _only_reorders(chain.last, expr):
                previous = chain.steps[-1]
                step = Step(expr, previous.rule, previous.detail, previous.text)
                chain = Chain(chain.lhs, chain.steps[:-1], chain.intro, chain.sums)
            chain = chain._then(step)
        return chain

    def fold(self, definition: Definition, text=()) -> "Chain":
        """Fold ``definition`` (``W_O W_V → W_OV``) everywhere in the last line."""
        return self.apply(fold, "fold", definition, detail=definition_math(definition), text=text)

    def unfold(self, definition: Definition, text=()) -> "Chain":
        """Unfold ``definition`` (``W_OV → W_O W_V``) everywhere in the last line."""
        return self.apply(unfold, "unfold", definition, detail=definition_math(definition), text=text)

    def regroup(self, groups: Sequence[tuple[str, TensorSum]], rule: str | Rule = "regroup", detail=(), text=()) -> "Chain":
        """Repeat the last line split into labelled groups (which must add up to it)."""
        return self._then(Step(self.last.expand(), rule, detail, text, tuple(groups)))


def product_rule(expr: Expr, sums: Sequence[SumIndex] = ()) -> str:
    """The rule that multiplies out the products of single terms in ``expr``.

    With two or more slots the tensor factors combine slot by slot: the ``mixed-product``
    rule. With one slot they are plain matrix products: ``sum-out`` when a factor carries an
    index summed over (one of ``sums``, printed as ``X (Σ_m Y_m) Z``) and the sum leaves the
    product; ``scalars`` when a coefficient moves to the front; else ``associativity``
    (``(x W_Qᵀ)(W_K xᵀ)``).

    >>> from tensoralg import atom, term
    >>> product_rule(Product([term(atom("W_U")), term(atom("W_E"))]))
    'associativity'
    >>> product_rule(Product([term(None, atom("W_U")), term(None, atom("W_E"))]))
    'mixed-product'
    >>> product_rule(Product([term(atom("W_U")), term(atom("W_OV", "h1")), term(atom("W_E"))]), [SumIndex("h1", "H_1")])
    'sum-out'
    >>> product_rule(Product([term(atom("W_U")), 2 * term(atom("W_E"))]))
    'scalars'
    """
    if expr.n_slots != 1:
        return "mixed-product"
    products = [p for p in (expr.parts if isinstance(expr, Add) else (expr,)) if isinstance(p, Product) and len(p.factors) > 1]
    summed = {s.index for s in sums}
    if summed and any(a.index in summed for p in products for f in p.factors for t in f.expand()
                      for w in t.words for a in w):
        return "sum-out"
    if any(p.coeff != 1 or any(t.coeff != 1 for f in p.factors for t in f.expand()) for p in products):
        return "scalars"
    return "associativity"


def _only_reorders(before: Expr, collected: TensorSum) -> bool:
    """True when ``before`` is a sum of single terms with no two alike."""
    parts = before.parts if isinstance(before, Add) else (before,)
    return all(isinstance(p, TensorSum) for p in parts) and sum(len(p) for p in parts) == len(collected)


def definition_math(d: Definition) -> tuple:
    """``W_{OV}^{h} := W_O^{h} W_V^{h}`` for a tensoralg definition, as prose."""
    lhs, rhs = TensorSum([Term(1, ((d.atom("h"),),))]), TensorSum([Term(1, (d.word("h"),))])
    return prose(lhs, Math(r" := ", " := "), rhs, " for every head h")


# -- derivations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Derivation:
    """A named, titled sequence of chains with notes on assumptions and notation."""

    name: str
    title: str
    summary: str
    chains: tuple[Chain, ...]
    notes: tuple = ()
    params: tuple[tuple[str, object], ...] = ()
    numeric: Numeric = field(default_factory=Numeric)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise DerivationError(f"a derivation's name must be a string, got {self.name!r}")
        for attr in ("title", "summary"):  # plain text, or prose with formulae (math(...))
            value = getattr(self, attr)
            if not isinstance(value, str):
                try:
                    object.__setattr__(self, attr, as_prose(value))
                except (DerivationError, TypeError):
                    raise DerivationError(f"a derivation's {attr} must be a string or prose, got {value!r}") from None
        if not self.chains or not all(isinstance(c, Chain) for c in self.chains):
            raise DerivationError("a derivation needs at least one Chain")
        object.__setattr__(self, "chains", tuple(self.chains))
        object.__setattr__(self, "notes", tuple(as_prose(n) for n in self.notes))
        object.__setattr__(self, "params", tuple(dict(self.params).items()))

    @property
    def steps(self) -> tuple[Step, ...]:
        """Every step of every chain, in order."""
        return tuple(s for c in self.chains for s in c.steps)

    # rendering: options as in derivations.render
    def to_latex(self, **options) -> str:
        """A complete LaTeX document that compiles with pdflatex."""
        return render.latex_document(self, **options)

    def to_markdown(self, **options) -> str:
        """Markdown with ``$$`` display math (KaTeX/MathJax)."""
        return render.markdown(self, **options)

    def to_text(self, **options) -> str:
        """Plain Unicode text."""
        return render.text(self, **options)

    def to_json(self, **options) -> str:
        """JSON: every step with its rule, LaTeX and text forms."""
        return render.to_json(self, **options)

    def _repr_latex_(self) -> str:
        return render.latex_math(self)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        """A notebook shows the derivation as ``--format html`` does (MathML), without the page around it."""
        return render.html_fragment(self)

    def verify(self, seed: int = 0, tol: float = 1e-9) -> "Verification":
        """Evaluate every line on random bindings; see :func:`verify` (below)."""
        return verify(self, seed=seed, tol=tol)


# -- the numeric check -----------------------------------------------------------------


def slot_rows(chain: Chain, bindings: RandomBindings) -> dict[int, int]:
    """Rows of each slot, from the first line that fixes them (a position slot defaults to ``n_ctx``)."""
    n_slots = chain.first.n_slots
    rows: dict[int, int] = {}
    for step in chain.steps:
        for i, shape in enumerate(step.expr.slot_shapes):
            if shape is not None and i not in rows:
                rows[i] = bindings.size(shape[0])
    for i in range(n_slots):
        rows.setdefault(i, bindings.size(DIMS["n_ctx"]))
    return rows


def verify(derivation: Derivation, seed: int = 0, tol: float = 1e-9) -> Verification:
    """Evaluate every line of every chain on random bindings and compare with the first.

    Summed indices stand for ``numeric.count`` heads each. Returns a :class:`Verification`.
    """
    sums = [s for c in derivation.chains for s in c.sums]
    bindings = RandomBindings(derivation.numeric, np.random.default_rng(seed), sums)
    count = derivation.numeric.count
    errors = []
    for ci, chain in enumerate(derivation.chains):
        rows = slot_rows(chain, bindings)
        reference = None
        for si, step in enumerate(chain.steps):
            expr = instantiate(step.expr, chain.sums, count)
            if isinstance(expr, TensorSum) and expr.is_zero and reference is not None:
                value = np.zeros_like(reference)
            else:
                value = finite_operator(bindings, expr, rows, f"line {si + 1} of chain {ci + 1}")
            if reference is None or step.rule.key == "truncation":
                reference = value
                scale = max(float(np.abs(value).max(initial=0.0)), 1.0)
            if value.shape != reference.shape:
                raise DerivationError(
                    f"step {si} of chain {ci} ({step.rule.name}) has an operator of shape {value.shape}, "
                    f"the first line {reference.shape}"
                )
            errors.append((ci, si, float(np.abs(value - reference).max(initial=0.0)) / scale))
    return Verification(tuple(errors), tol)
