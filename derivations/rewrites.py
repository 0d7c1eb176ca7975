"""Rewrites the derivations need beyond expansion and folding: substituting a matrix for an
atom, word identities (orthonormality, stochastic rows), and folding a word or a sum into a
named atom. Each keeps lazy products and sums lazy and returns a new expression.

>>> from tensoralg import atom, term
>>> print(substitute(term(atom("A", "h"), atom("W_OV", "h")), atom("A", "h"), term(atom("A", "g"))))
A^{g} ⊗ W_OV^{h}
"""

from __future__ import annotations

import itertools
from typing import Callable, Mapping

import sympy as sp

from tensoralg import Add, Atom, Expr, Product, TensorSum, Term

from derivations.errors import DerivationError


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

    >>> from tensoralg import atom, term, identity
    >>> print(substitute(term(atom("A", "h"), atom("W_OV", "h")), atom("A", "h"), identity(1)))
    Id ⊗ W_OV^{h}
    """
    rep = replacement.expand()
    if rep.n_slots != 1:
        raise DerivationError(f"a substitution replaces an atom by a matrix (1 slot), got {rep.n_slots} slots")
    forward = [(t.words[0], t.coeff) for t in rep]
    backward = [(tuple(a.T for a in reversed(w)), c) for w, c in forward]
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

    >>> from tensoralg import atom, term
    >>> from tensoralg.atoms import Atom
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
    (and ``wordᵀ`` by ``nameᵀ``): folding a definition ``name := word``."""
    transposed = tuple(a.T for a in reversed(word))
    return rewrite_words(expr, {tuple(word): (name,), transposed: (name.T,)})


def fold_sum(expr: Expr, name: Atom, definition: Expr, slot: int) -> TensorSum:
    """Fold ``name := definition`` (a 1-slot sum) where the terms of ``expr`` that agree
    outside ``slot`` hold, in ``slot``, a multiple of the definition's terms.

    >>> from tensoralg import atom, term
    >>> from tensoralg.atoms import Atom
    >>> b, c, s = Atom("b", 3, 1), Atom("c", 3, 1), Atom("s", 3, 1)
    >>> print(fold_sum(term(None, b) + term(None, c), s, term(b) + term(c), 1))
    Id ⊗ s
    """
    total = expr.expand()
    rhs = {t.words[0]: t.coeff for t in definition.expand()}
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
