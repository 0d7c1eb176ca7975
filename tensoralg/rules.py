"""Rewrite rules: small pure functions, each one identity of the algebra.

Expanding a lazy product in named steps, as a derivation writes it::

    (Σ_i a_i)(Σ_j b_j)                 a product of sums
    = Σ_{i,j} (a_i)(b_j)               distribute      (products of single terms, not yet multiplied)
    = Σ_{i,j} a_i b_j                  mixed_product   ((A⊗B)(C⊗D) = (AC)⊗(BD), slot by slot)
    = Σ_t c_t t                        collect         (like terms added, canonical order)

Every rule returns an expression equal to its input as an operator (property-tested on
random numeric bindings), except that ``distribute(…, max_order=k)`` drops the products
of order above ``k`` on purpose. :func:`expand_steps` lists the steps with the rule names
that derivations use as justifications: ``distributivity`` (or ``truncation`` when
products are dropped), ``mixed_product``, ``collect``.

>>> from tensoralg.parse import parse
>>> p = parse("(Id ⊗ W_U)(Id ⊗ Id + A^{h} ⊗ W_OV^{h})(Id ⊗ W_E)")
>>> [name for name, _ in expand_steps(p)]
['distributivity', 'mixed_product', 'collect']
>>> expand_steps(p)[-1][1]
TensorSum(Id ⊗ W_U W_E + A^{h} ⊗ W_U W_OV^{h} W_E)

Rules that rewrite words rather than products (used by derivations for substitutions,
orthonormality, stochastic rows and folds); each keeps lazy products and sums lazy:

- :func:`substitute`: an atom replaced by a matrix (and its transpose by the matrix's transpose);
- :func:`rewrite_words`: word identities such as ``Vᵀ V = Id`` or ``A 1 = 1``;
- :func:`fold_word` and :func:`fold_sum`: a definition ``name := word`` or ``name := Σ terms`` folded.
"""

from __future__ import annotations

import itertools
from typing import Callable, Mapping

import sympy as sp

from tensoralg.atoms import Atom, transpose_word
from tensoralg.errors import EmptySum, SlotMismatch
from tensoralg.coefficients import mul
from tensoralg.expr import Add, Expr, Product, TensorSum, Term, sum_tensor_sums
from tensoralg.order import check_order
from tensoralg.slots import join_words


def _single(t: Term, n_slots: int, slot_shapes: tuple) -> TensorSum:
    """A one-term sum; its shapes are those of the factor it came from (already checked)."""
    return TensorSum.from_canonical({t.words: t.coeff}, n_slots, slot_shapes)


def _parts(expr: Expr) -> tuple[Expr, ...]:
    return expr.parts if isinstance(expr, Add) else (expr,)


def _rebuild(parts: list[Expr]) -> Expr:
    return parts[0] if len(parts) == 1 else Add(parts)


def _is_monomial(p: Product) -> bool:
    return all(len(f) == 1 for f in p.factors)


def distribute(expr: Expr, max_order: int | None = None) -> Expr:
    """``(Σ_i a_i)(Σ_j b_j) = Σ_{i,j} (a_i)(b_j)``: a lazy sum of products of single terms.

    An identity factor ``Id ⊗ … ⊗ Id`` chosen from a sum is left out of its product
    (``X Id Y = X Y``), as a derivation written by hand leaves it out. Each product keeps
    its other factors unmultiplied (so the next step, :func:`mixed_product`,
    is visible); products already made of single terms, and canonical sums, are left
    alone. ``max_order`` keeps only the products that choose a non-identity term from at
    most that many factors (the truncation of :meth:`Product.expand`).

    >>> from tensoralg.parse import parse
    >>> distribute(parse("(A^{1} ⊗ Id + Id ⊗ W_OV^{1})(A^{2} ⊗ W_OV^{2})"))
    Add((Id ⊗ W_OV^{1})(A^{2} ⊗ W_OV^{2}) + (A^{1} ⊗ Id)(A^{2} ⊗ W_OV^{2}))
    """
    check_order(max_order)
    parts: list[Expr] = []
    for part in _parts(expr):
        if not isinstance(part, Product) or (max_order is None and _is_monomial(part)):
            parts.append(part)
            continue
        tables = [list(f) for f in part.factors]
        shapes = [f.slot_shapes for f in part.factors]
        n = part.n_slots
        for choice in part.iter_terms(max_order):
            chosen = [(k, tables[k][j]) for k, j in enumerate(choice.indices)]
            # Id X = X: an identity factor is left out of a product that has others
            kept = [(k, t) for k, t in chosen if not (t.is_identity and t.coeff == 1)] or chosen[:1]
            parts.append(Product([_single(t, n, shapes[k]) for k, t in kept], part.coeff))
    if not parts:  # truncation dropped every product
        return TensorSum.from_canonical({}, expr.n_slots, expr.slot_shapes)
    return _rebuild(parts)


def mixed_product(expr: Expr) -> Expr:
    """``(A⊗B)(C⊗D) = (AC)⊗(BD)``: each product of single terms becomes one term.

    Words are concatenated slot by slot and the coefficients multiplied; like terms are
    *not* collected yet (that is :func:`collect`). Products with a factor of several terms
    are left alone: :func:`distribute` them first.

    >>> from tensoralg.parse import parse
    >>> mixed_product(parse("(A^{1} ⊗ W_OV^{1})(2·A^{2} ⊗ W_OV^{2})"))
    TensorSum(2·A^{1} A^{2} ⊗ W_OV^{1} W_OV^{2})
    """
    parts: list[Expr] = []
    for part in _parts(expr):
        if isinstance(part, Product) and _is_monomial(part):
            coeff, words = part.coeff, ((),) * part.n_slots
            for f in part.factors:
                (t,) = f
                coeff = mul(coeff, t.coeff)
                words = join_words(words, t.words)
            parts.append(TensorSum.from_canonical({words: coeff}, part.n_slots, part.slot_shapes))
        else:
            parts.append(part)
    return _rebuild(parts)


def collect(expr: Expr) -> TensorSum:
    """``Σ_i c_i t + Σ_j d_j t = (Σ c_i + Σ d_j) t``: the canonical sum, like terms added,
    zero terms dropped, in canonical order. Lazy parts are expanded first.

    >>> from tensoralg.parse import parse
    >>> collect(parse("(A ⊗ W_OV)(Id ⊗ Id) + A ⊗ W_OV"))
    TensorSum(2·A ⊗ W_OV)
    """
    if isinstance(expr, TensorSum):
        return expr
    return sum_tensor_sums([p if isinstance(p, TensorSum) else p.expand() for p in _parts(expr)])


def transpose(expr: Expr) -> Expr:
    """``(c·F_1⊗…⊗F_k)ᵀ = c·F_1ᵀ⊗…⊗F_kᵀ`` with ``(X_1…X_n)ᵀ = X_nᵀ…X_1ᵀ``, and for lazy
    products ``(P_1…P_m)ᵀ = P_mᵀ…P_1ᵀ``. An involution: ``transpose(transpose(e)) == e``.

    >>> from tensoralg.parse import parse
    >>> transpose(parse("A^{2} A^{1} ⊗ W_U W_OV^{1}"))
    TensorSum(A^{1}ᵀ A^{2}ᵀ ⊗ W_OV^{1}ᵀ W_Uᵀ)
    """
    return expr.T


def expand_steps(expr: Expr, max_order: int | None = None) -> list[tuple[str, Expr]]:
    """The expansion of ``expr`` as ``[(rule name, expression after the rule), …]``.

    The rules run in order :func:`distribute` (named ``"distributivity"``, or
    ``"truncation"`` when ``max_order`` drops products), :func:`mixed_product`
    (``"mixed_product"``) and :func:`collect` (``"collect"``); a rule that changes
    nothing is not listed, so a canonical sum has no steps. The last expression equals
    ``expr.expand(max_order)``.

    >>> from tensoralg.parse import parse
    >>> steps = expand_steps(parse("(Id ⊗ Id + A^{1} ⊗ W_OV^{1})(Id ⊗ Id + A^{2} ⊗ W_OV^{2})"), max_order=1)
    >>> [(name, len(e)) for name, e in steps]
    [('truncation', 3), ('mixed_product', 3), ('collect', 3)]
    """
    check_order(max_order)
    truncating = max_order is not None and any(
        isinstance(p, Product) and p.count(max_order) < p.count() for p in _parts(expr)
    )
    steps: list[tuple[str, Expr]] = []
    current = expr
    for name, rule in (
        ("truncation" if truncating else "distributivity", lambda e: distribute(e, max_order)),
        ("mixed_product", mixed_product),
        ("collect", collect),
    ):
        new = rule(current)
        if new is not current and new != current:
            steps.append((name, new))
            current = new
    return steps


# -- word rewrites --------------------------------------------------------------------


def _map_terms(expr: Expr, fn: Callable[[Term], dict]) -> Expr:
    """Apply ``fn`` (term -> {words: coeff}) to every term, keeping lazy structure lazy."""
    if isinstance(expr, Product):
        return Product([_map_terms(f, fn) for f in expr.factors], expr.coeff)
    if isinstance(expr, Add):
        return Add([_map_terms(p, fn) for p in expr.parts])
    out: dict = {}
    for t in expr.expand():
        for words, c in fn(t).items():
            out[words] = out.get(words, 0) + c
    return TensorSum(out, n_slots=expr.n_slots)


def substitute(expr: Expr, target: Atom, replacement: Expr) -> Expr:
    """Replace the atom ``target`` by a matrix (a 1-slot expression) everywhere, ``targetᵀ``
    by its transpose, and distribute.

    >>> from tensoralg import atom, identity, term
    >>> print(substitute(term(atom("A", "h"), atom("W_OV", "h")), atom("A", "h"), identity(1)))
    Id ⊗ W_OV^{h}
    """
    rep = replacement.expand()
    if rep.n_slots != 1:
        raise SlotMismatch(f"a substitution replaces an atom by a matrix (1 slot), got {rep.n_slots} slots")
    forward = [(t.words[0], t.coeff) for t in rep]
    backward = [(transpose_word(w), c) for w, c in forward]
    target = target.base if not target.transposed else target.T

    def word_options(word):
        options = [((), sp.S.One)]
        for a in word:
            choices = forward if a == target else backward if a == target.T else [((a,), sp.S.One)]
            options = [(w + cw, c * cc) for w, c in options for cw, cc in choices]
        return options

    def fn(t: Term) -> dict:
        out: dict = {}
        for combo in itertools.product(*(word_options(w) for w in t.words)):
            words = tuple(w for w, _ in combo)
            coeff = t.coeff * sp.Mul(*(c for _, c in combo))
            out[words] = out.get(words, 0) + coeff
        return out

    return _map_terms(expr, fn)


def rewrite_words(expr: Expr, identities: Mapping[tuple, tuple | None]) -> Expr:
    """Apply word identities: each occurrence of a key (a tuple of atoms) becomes its value
    (a tuple of atoms, ``()`` for Id), or the term vanishes when the value is ``None``.

    >>> from tensoralg import Atom, term
    >>> V = Atom("V", "d_model", "k")
    >>> print(rewrite_words(term((V.T, V, V.T)), {(V.T, V): ()}))
    Vᵀ
    """
    rules = sorted(identities.items(), key=lambda kv: -len(kv[0]))
    # the first rule (longest keys first) that occurs anywhere applies at its first position;
    # found by hashing each slice, so the cost does not grow with the number of rules
    by_length: dict[int, dict] = {}
    for rank, (key, value) in enumerate(rules):
        by_length.setdefault(len(key), {}).setdefault(tuple(key), (rank, value))
    lengths = sorted(by_length, reverse=True)

    def rewrite(word):
        while True:
            for k in lengths:
                table = by_length[k]
                found = [(table[word[i : i + k]][0], i) for i in range(len(word) - k + 1) if word[i : i + k] in table]
                if found:
                    break
            else:
                return word
            rank, i = min(found)
            value = rules[rank][1]
            if value is None:
                return None
            word = word[:i] + tuple(value) + word[i + k :]

    def fn(t: Term) -> dict:
        words = tuple(rewrite(w) for w in t.words)
        return {} if any(w is None for w in words) else {words: t.coeff}

    return _map_terms(expr, fn)


def fold_word(expr: Expr, word: tuple, name: Atom) -> Expr:
    """Replace each occurrence of the product ``word`` by the single atom ``name``
    (and ``wordᵀ`` by ``nameᵀ``): folding a definition ``name := word``.

    >>> from tensoralg import atom, term
    >>> W_O, W_V, W_OV = atom("W_O", "h"), atom("W_V", "h"), atom("W_OV", "h")
    >>> print(fold_word(term((W_O, W_V)) + term((W_V.T, W_O.T)), (W_O, W_V), W_OV))
    W_OV^{h} + W_OV^{h}ᵀ
    """
    return rewrite_words(expr, {tuple(word): (name,), transpose_word(tuple(word)): (name.T,)})


def fold_sum(expr: Expr, name: Atom, definition: Expr, slot: int) -> TensorSum:
    """Fold ``name := definition`` (a 1-slot sum) where the terms of ``expr`` that agree
    outside ``slot`` hold, in ``slot``, a multiple of the definition's terms.

    >>> from tensoralg import Atom, term
    >>> b, c, s = Atom("b", 3, 1), Atom("c", 3, 1), Atom("s", 3, 1)
    >>> print(fold_sum(term(None, b) + term(None, c), s, term(b) + term(c), 1))
    Id ⊗ s
    """
    total, defined = expr.expand(), definition.expand()
    if defined.n_slots != 1:
        raise SlotMismatch(f"a folded definition is a matrix (1 slot), got {defined.n_slots} slots")
    if defined.is_zero:
        raise EmptySum(f"cannot fold {name.label} := 0: the definition has no terms")
    rhs = {t.words[0]: t.coeff for t in defined}
    first_word, first_coeff = next(iter(rhs.items()))
    out = dict(total.as_dict())
    for words, coeff in total.as_dict().items():
        if words[slot] != first_word or words not in out:
            continue
        scale = out[words] / first_coeff
        matches = {words[:slot] + (w,) + words[slot + 1:]: c * scale for w, c in rhs.items()}
        if all(sp.simplify(out.get(k, 0) - v) == 0 for k, v in matches.items()):
            for k, v in matches.items():
                out[k] = out[k] - v
            key = words[:slot] + ((name,),) + words[slot + 1:]
            out[key] = out.get(key, 0) + scale
    return TensorSum(out, n_slots=total.n_slots)
