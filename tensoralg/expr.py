"""Tensor terms ``c · F_1 ⊗ … ⊗ F_k`` and their canonical sums.

A :class:`TensorSum` maps each tuple of words (one word per slot) to its coefficient:
like terms are collected on construction, zero terms dropped, and iteration follows a
deterministic canonical order, so the same sum built in any order is equal, hashes
equal and prints the same. :class:`Product` and :class:`Add` keep products and sums of
lazy parts unexpanded until asked. The pieces they are built from live beside them:
coefficients in :mod:`tensoralg.coefficients`, the words, shapes and text of slots in
:mod:`tensoralg.slots`, the check of a truncation order in :mod:`tensoralg.order`.

>>> from tensoralg.atoms import atom
>>> A, W = atom("A", "h"), atom("W_OV", "h")
>>> s = term(A, W) + term(None, None) + term(A, W)
>>> s
TensorSum(Id ⊗ Id + 2·A^{h} ⊗ W_OV^{h})
>>> len(s), s.n_slots
(2, 2)
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping, NamedTuple

import sympy as sp

from tensoralg.atoms import Atom, Word, transpose_word, word_shape
from tensoralg.bound import Bound, merge_bound
from tensoralg.coefficients import ONE, ZERO, as_coeff, canonical_coeff, mul, nonzero_terms
from tensoralg.display import html_repr, latex_repr, text_repr
from tensoralg.errors import EmptySum, SlotMismatch, TensorAlgError
from tensoralg.latex import to_latex
from tensoralg.order import check_order
from tensoralg.slots import (Shape, Slot, as_word, chain_shapes, check_identity_slots, join_words, sort_key,
                             unify_slot_shapes)
from tensoralg.sympy_bridge import sympy_of_sum


class Term(NamedTuple):
    """One term ``coeff · words[0] ⊗ words[1] ⊗ …``."""

    coeff: sp.Expr
    words: tuple[Word, ...]

    @property
    def n_slots(self) -> int:
        return len(self.words)

    @property
    def is_identity(self) -> bool:
        """True when every slot is ``Id`` (whatever the coefficient)."""
        return not any(self.words)

    @property
    def T(self) -> "Term":
        return Term(self.coeff, tuple(transpose_word(w) for w in self.words))

    def _repr_latex_(self) -> str:  # ``<`` and ``>`` as commands: a notebook inserting LaTeX as HTML reads no tag
        return latex_repr(TensorSum([self]))

    def _repr_html_(self) -> str:  # MathML from the same printer, which a notebook prefers to the LaTeX
        return html_repr(TensorSum([self]))

    def __repr__(self) -> str:
        return f"Term({text_repr(TensorSum([self]), None)})"


class Expr:
    """What every expression offers: slots, expansion, transpose, sums and products."""

    n_slots: int
    bound: tuple[Bound, ...] = ()  # indices summed by Σ_{h∈H_l} (printed, kept by expand; not compared)

    def expand(self, max_order: int | None = None) -> "TensorSum":  # pragma: no cover - abstract
        raise NotImplementedError

    def __add__(self, other):
        return add(self, other) if isinstance(other, Expr) else NotImplemented

    def __radd__(self, other):
        if isinstance(other, int) and other == 0:  # lets sum() start from 0
            return self
        return NotImplemented

    def __sub__(self, other):
        return add(self, -1 * other) if isinstance(other, Expr) else NotImplemented

    def __neg__(self):
        return -1 * self

    def __matmul__(self, other):
        if not isinstance(other, Expr):
            return NotImplemented
        return Product.of(self, other)

    def __mul__(self, other):
        if isinstance(other, Expr):
            return self @ other
        return self.scale(as_coeff(other))

    def __rmul__(self, other):
        return self.scale(as_coeff(other))

    def scale(self, coeff: sp.Expr) -> "Expr":  # pragma: no cover - abstract
        raise NotImplementedError

    # -- notebooks (IPython): the printer's maths, a long sum's middle elided with its count --
    def _repr_latex_(self) -> str:
        return latex_repr(self)

    def _repr_html_(self) -> str:
        return html_repr(self)

    def _repr_pretty_(self, p, cycle: bool) -> None:
        """IPython's plain text: elided like the LaTeX (IPython looks for this method before a
        subclass's ``__repr__``, which each subclass names again below)."""
        p.text(f"{type(self).__name__}({text_repr(self)})")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({text_repr(self, None)})"

    def __str__(self) -> str:
        return text_repr(self, None)

    def with_bound(self, bound) -> "Expr":
        """This expression with the indices ``bound`` summed by ``Σ`` (its own kept too)."""
        return _keep_bound(self.scale(1), self, bound)

    def to_sympy(self, dims: Mapping | None = None):
        """This expression as a SymPy matrix expression (``KroneckerProduct`` of slots)."""
        return self.expand().to_sympy(dims)


def _keep_bound(new: "Expr", old: "Expr", more=()) -> "Expr":  # new, made from old, sums as old does
    new.bound = merge_bound(new.bound, old.bound, more)
    return new


class TensorSum(Expr):
    """A canonical sum of k-slot tensor terms; immutable.

    Build one with :func:`term`, :func:`identity`, sums and scalar multiples of those, or
    ``TensorSum(terms)`` from :class:`Term`s or a ``{words: coeff}`` mapping.
    """

    __slots__ = ("_terms", "n_slots", "slot_shapes", "_sorted", "_hash", "bound")

    def __init__(self, terms: Iterable[Term] | Mapping[tuple[Word, ...], object] = (), n_slots: int | None = None):
        items = terms.items() if isinstance(terms, Mapping) else ((t.words, t.coeff) for t in terms)
        collected: dict[tuple[Word, ...], sp.Expr] = {}
        for words, coeff in items:
            words = tuple(as_word(w) for w in words)
            if n_slots is None:
                n_slots = len(words)
            elif len(words) != n_slots:
                raise SlotMismatch(f"cannot add a {len(words)}-slot term to {n_slots}-slot terms")
            coeff = as_coeff(coeff)
            previous = collected.get(words)
            collected[words] = coeff if previous is None else previous + coeff
        if n_slots is None:
            raise EmptySum("an empty sum has no number of slots; give n_slots or at least one term")
        if n_slots < 1:
            raise SlotMismatch(f"a term needs at least one slot, got {n_slots}")
        shapes: tuple[Shape, ...] = (None,) * n_slots
        for words in collected:
            shapes = unify_slot_shapes(shapes, [word_shape(w) for w in words])
        check_identity_slots(shapes, collected)
        self._terms = nonzero_terms(collected)
        self.n_slots = n_slots
        self.slot_shapes = tuple(shapes)
        self._sorted = None
        self._hash = None
        self.bound = ()

    @classmethod
    def from_canonical(cls, terms: Mapping[tuple[Word, ...], sp.Expr], n_slots: int, slot_shapes: tuple,
                       bound: tuple = ()) -> "TensorSum":
        """A sum from terms already checked, not checked again: the fast path for large expansions
        whose shapes hold by construction (the mixed-product rule, the path and QK expansions).

        ``terms`` maps each tuple of ``n_slots`` words to a SymPy coefficient, like terms added;
        ``slot_shapes`` holds each slot's shape (``None`` where every word is ``Id``); ``bound``
        the indices summed by ``Σ``. The promise is the caller's: words that chain, one shape per
        slot, ``Id`` only in square slots. The result equals ``TensorSum(terms)``.

        >>> from tensoralg.atoms import atom
        >>> A, W = atom("A", "h"), atom("W_OV", "h")
        >>> s = TensorSum.from_canonical({((A,), (W,)): sp.Integer(2)}, 2, (A.shape, W.shape))
        >>> s == TensorSum({((A,), (W,)): 2}), s
        (True, TensorSum(2·A^{h} ⊗ W_OV^{h}))
        """
        if len(slot_shapes) != n_slots:
            raise SlotMismatch(f"a {n_slots}-slot sum needs {n_slots} slot shapes, got {len(slot_shapes)}")
        obj = object.__new__(cls)
        obj._terms = nonzero_terms(terms)
        obj.n_slots = n_slots
        obj.slot_shapes = tuple(slot_shapes)
        obj._sorted = None
        obj._hash = None
        obj.bound = bound
        return obj

    # -- access ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._terms)

    def __iter__(self) -> Iterator[Term]:
        if self._sorted is None:
            self._sorted = [Term(self._terms[w], w) for w in sorted(self._terms, key=sort_key)]
        return iter(self._sorted)

    @property
    def terms(self) -> list[Term]:
        return list(self)

    def coeff(self, *slots: Slot) -> sp.Expr:
        """The coefficient of the term with these slots (0 if absent)."""
        return self._terms.get(tuple(as_word(s) for s in slots), ZERO)

    def as_dict(self) -> dict[tuple[Word, ...], sp.Expr]:
        return dict(self._terms)

    @property
    def is_zero(self) -> bool:
        return not self._terms

    # -- algebra --------------------------------------------------------------
    def expand(self, max_order: int | None = None) -> "TensorSum":
        """Already expanded; ``max_order`` is checked and otherwise has no effect."""
        check_order(max_order)
        return self

    def scale(self, coeff: sp.Expr) -> "TensorSum":
        coeff = as_coeff(coeff)
        terms = {} if coeff.is_zero else {w: mul(coeff, c) for w, c in self._terms.items()}
        return TensorSum.from_canonical(terms, self.n_slots, self.slot_shapes, self.bound)

    @property
    def T(self) -> "TensorSum":
        """Transpose slot by slot: each word reversed, each atom transposed."""
        shapes = tuple(None if s is None else (s[1], s[0]) for s in self.slot_shapes)
        return TensorSum.from_canonical(
            {tuple(transpose_word(w) for w in words): c for words, c in self._terms.items()}, self.n_slots, shapes,
            self.bound)

    def __eq__(self, other) -> bool:
        """Equal terms in as many slots; zero is zero in any number of slots (``0``, as typed, is every zero)."""
        if not isinstance(other, TensorSum):
            return NotImplemented
        if not self._terms and not other._terms:
            return True
        return self.n_slots == other.n_slots and self._terms == other._terms

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self.n_slots if self._terms else 0, frozenset(self._terms.items())))
        return self._hash

    def to_sympy(self, dims: Mapping | None = None):
        return sympy_of_sum(self, dims)

    _repr_pretty_ = Expr._repr_pretty_

    def __repr__(self) -> str:
        return f"TensorSum({text_repr(self, None)})" if self._terms else f"TensorSum(0, n_slots={self.n_slots})"



def term(*slots: Slot, coeff=1) -> TensorSum:
    """One term: ``term(A, W)`` is ``A ⊗ W``; a slot is an atom, a word (tuple) or ``None`` (Id).

    >>> from tensoralg.atoms import atom
    >>> term(atom("A", 2), (atom("W_OV", 2), atom("W_OV", 1)))
    TensorSum(A^{2} ⊗ W_OV^{2} W_OV^{1})
    """
    if not slots:
        raise SlotMismatch("a term needs at least one slot")
    return TensorSum([Term(as_coeff(coeff), tuple(as_word(s) for s in slots))])


def identity(n_slots: int = 1) -> TensorSum:
    """``Id ⊗ … ⊗ Id`` with ``n_slots`` slots."""
    return term(*([None] * n_slots))


def widen_identity(expr: Expr, n_slots: int) -> Expr:
    """A sum of 1-slot identities as the identity of ``n_slots`` slots: ``Id = Id ⊗ … ⊗ Id``.

    The identity of a tensor-product space is the tensor product of the identities, so
    ``Id + A ⊗ W`` means ``Id ⊗ Id + A ⊗ W``, as the paper writes it. Anything else is
    returned unchanged.
    """
    if (
        expr.n_slots == 1
        and n_slots > 1
        and isinstance(expr, TensorSum)
        and expr._terms
        and all(not words[0] for words in expr._terms)
    ):
        return TensorSum({((),) * n_slots: c for c in expr._terms.values()})
    return expr


def _widen_identities(exprs) -> list:
    widest = max(e.n_slots for e in exprs)
    return [widen_identity(e, widest) for e in exprs]


def add(*exprs: Expr) -> Expr:
    """Sum of expressions; two canonical sums collect eagerly, anything lazy stays lazy.

    A bare ``Id`` (1 slot) next to k-slot terms is the k-slot identity.
    """
    if not exprs:
        raise EmptySum("add() needs at least one expression")
    exprs = _widen_identities(exprs)
    slots = {e.n_slots for e in exprs}
    if len(slots) > 1:
        raise SlotMismatch(f"cannot add expressions with different numbers of slots: {sorted(slots)}")
    if all(isinstance(e, TensorSum) for e in exprs):
        return sum_tensor_sums(exprs)
    return Add.of(*exprs)


def sum_tensor_sums(sums: Iterable[TensorSum]) -> TensorSum:
    sums = list(sums)
    if not sums:
        raise EmptySum("cannot sum no expressions")
    shapes = sums[0].slot_shapes
    collected: dict = {}
    for s in sums:
        if s.n_slots != sums[0].n_slots:
            raise SlotMismatch(f"cannot add {s.n_slots}-slot terms to {sums[0].n_slots}-slot terms")
        shapes = unify_slot_shapes(shapes, s.slot_shapes)
        for w, c in s._terms.items():
            prev = collected.get(w)
            collected[w] = c if prev is None else prev + c
    check_identity_slots(shapes, collected)
    return TensorSum.from_canonical(collected, sums[0].n_slots, shapes, merge_bound(*(s.bound for s in sums)))


def tensor(*factors: Expr | Atom | Word) -> TensorSum:
    """The tensor product of expressions, slots concatenated: ``(A + B) ⊗ C = A⊗C + B⊗C``.

    >>> from tensoralg.atoms import atom
    >>> tensor(atom("A", 1), atom("W_OV", 1)) == term(atom("A", 1), atom("W_OV", 1))
    True
    """
    if not factors:
        raise SlotMismatch("tensor() needs at least one factor")
    result: dict = {(): ONE}
    shapes: tuple = ()
    for f in factors:
        f = f if isinstance(f, Expr) else term(f)
        f = f.expand()
        result = {w + fw: mul(c, fc) for w, c in result.items() for fw, fc in f._terms.items()}
        shapes += f.slot_shapes  # each factor is a checked sum, so the slots are too
        # collect: different left parts never collide, so no merge is needed
    return TensorSum.from_canonical(result, len(shapes), shapes)


# -- products and lazy sums --------------------------------------------------------


class Choice(NamedTuple):
    """One product of an expansion: which term was taken from each factor, and the result."""

    indices: tuple[int, ...]
    order: int
    term: Term


class Product(Expr):
    """A lazy product ``coeff · F_1 F_2 … F_n`` of sums with the same number of slots.

    Nothing is multiplied until :meth:`expand` (all terms, collected) or
    :meth:`iter_terms` (one product at a time, with which term each factor gave).
    The *order* of a product is the number of factors from which a non-identity term
    was chosen; factors without an identity term (such as ``Id ⊗ W_U``) add no order.

    >>> from tensoralg.atoms import atom
    >>> layer = lambda l: identity(2) + term(atom("A", l), atom("W_OV", l))
    >>> p = term(None, atom("W_U")) @ layer(1) @ layer(0) @ term(None, atom("W_E"))
    >>> len(p), p.count(max_order=1), len(p.expand())
    (4, 3, 4)
    """

    __slots__ = ("factors", "coeff", "n_slots", "slot_shapes", "_orders", "bound")

    def __init__(self, factors, coeff=1):
        flat: list[TensorSum] = []
        coeff = as_coeff(coeff)
        for f in factors:
            if isinstance(f, Product):
                flat.extend(f.factors)
                coeff = mul(coeff, f.coeff)
            elif isinstance(f, TensorSum):
                flat.append(f)
            elif isinstance(f, Expr):
                flat.append(f.expand())
            else:
                raise TensorAlgError(f"a product's factors must be expressions, got {f!r}")
        if not flat:
            raise EmptySum("a product needs at least one factor")
        flat = _widen_identities(flat)
        n_slots = flat[0].n_slots
        for f in flat:
            if f.n_slots != n_slots:
                raise SlotMismatch(f"cannot multiply a {f.n_slots}-slot sum with {n_slots}-slot sums")
        shapes: list[Shape] = list(flat[0].slot_shapes)
        for f in flat[1:]:
            shapes = [chain_shapes(a, b, i) for i, (a, b) in enumerate(zip(shapes, f.slot_shapes))]
        self.factors = tuple(flat)
        self.coeff = canonical_coeff(coeff)
        self.n_slots = n_slots
        self.slot_shapes = tuple(shapes)
        self._orders = None
        self.bound = merge_bound(*(f.bound for f in factors if isinstance(f, Expr)))

    @classmethod
    def of(cls, *exprs: Expr) -> "Product":
        return cls(exprs)

    def _factor_choices(self) -> list[list[tuple[tuple[Word, ...], sp.Expr, int]]]:
        """Per factor, its canonical terms as ``(words, coeff, order increment)``."""
        if self._orders is None:
            table = []
            for f in self.factors:
                terms = list(f)
                has_identity = any(t.is_identity for t in terms)
                table.append([(t.words, t.coeff, int(has_identity and not t.is_identity)) for t in terms])
            self._orders = table
        return self._orders

    def expand(self, max_order: int | None = None) -> TensorSum:
        """Distribute and apply the mixed-product rule ``(A⊗B)(C⊗D) = (AC)⊗(BD)``;
        collect like terms. ``max_order`` keeps only products of order ``<= max_order``."""
        check_order(max_order)
        n = self.n_slots
        states: dict[tuple, sp.Expr] = {(((),) * n, 0): self.coeff}
        for choices in self._factor_choices():
            table = [(fwords, any(fwords), fc, inc) for fwords, fc, inc in choices]
            identities = [t for t in table if not t[1]]
            if len(identities) == 1 and identities[0][2] is ONE:
                new = dict(states)  # Id · state = state: carried over without a Python loop
                table = [t for t in table if t[1]]
            else:
                new = {}
            no_order = [t for t in table if not t[3]]  # all a product at max_order may still take
            get = new.get
            for (words, order), c in states.items():
                for fwords, moves, fc, inc in (table if max_order is None or order < max_order else no_order):
                    key = (join_words(words, fwords) if moves else words, order + inc)
                    value = c if fc is ONE else mul(c, fc)
                    prev = get(key)
                    new[key] = value if prev is None else prev + value
            states = new
        collected: dict = {}
        for (words, _), c in states.items():
            prev = collected.get(words)
            collected[words] = c if prev is None else prev + c
        return TensorSum.from_canonical(collected, n, self.slot_shapes, self.bound)

    def iter_terms(self, max_order: int | None = None) -> Iterator[Choice]:
        """Each product of the expansion, lazily, in factor-major order, uncollected."""
        check_order(max_order)
        table = self._factor_choices()
        n = self.n_slots
        limit = len(table) if max_order is None else max_order
        # depth-first with an explicit stack (a product of thousands of factors must not recurse);
        # pushed in reverse so that the first factor's first term comes out first
        stack = [((), ((),) * n, self.coeff, 0)]
        while stack:
            indices, words, coeff, order = stack.pop()
            i = len(indices)
            if i == len(table):
                yield Choice(indices, order, Term(coeff, words))
                continue
            for j in reversed(range(len(table[i]))):
                fwords, fc, inc = table[i][j]
                if order + inc > limit:
                    continue
                words2 = join_words(words, fwords) if any(fwords) else words
                stack.append((indices + (j,), words2, mul(coeff, fc), order + inc))

    def count(self, max_order: int | None = None) -> int:
        """The number of products in the expansion, counted without building any.

        Exact for the products themselves; like terms that collect are counted once each
        (``len(self.expand())`` counts after collecting).
        """
        return sum(self.order_counts(max_order))

    def order_counts(self, max_order: int | None = None) -> list[int]:
        """``[n_0, n_1, …]``: how many products of each exact order the expansion has (up to
        ``max_order``), in one pass with Python ints and nothing built.

        >>> from tensoralg.atoms import atom
        >>> layer = lambda l: identity(2) + term(atom("A", l), atom("W_OV", l))
        >>> Product([layer(2), layer(1), layer(0)]).order_counts()
        [1, 3, 3, 1]
        """
        check_order(max_order)
        poly = [1]  # poly[k] = number of partial products of order k
        for choices in self._factor_choices():
            n1 = sum(inc for _, _, inc in choices)
            n0 = len(choices) - n1
            new = [0] * (len(poly) + 1)
            for k, count in enumerate(poly):
                new[k] += count * n0
                new[k + 1] += count * n1
            if max_order is not None:
                new = new[: max_order + 1]
            while len(new) > 1 and new[-1] == 0:  # factors without an identity add no order
                new.pop()
            poly = new
        return poly

    def __len__(self) -> int:
        return self.count()

    def scale(self, coeff: sp.Expr) -> "Product":
        return _keep_bound(Product(self.factors, mul(self.coeff, as_coeff(coeff))), self)

    @property
    def T(self) -> "Product":
        """``(F_1 … F_n)ᵀ = F_nᵀ … F_1ᵀ``."""
        return _keep_bound(Product([f.T for f in reversed(self.factors)], self.coeff), self)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Product):
            return NotImplemented
        return self.coeff == other.coeff and self.factors == other.factors

    def __hash__(self) -> int:
        return hash((self.coeff, self.factors))

    _repr_pretty_, __repr__ = Expr._repr_pretty_, Expr.__repr__


class Add(Expr):
    """A lazy sum of expressions (products among them) with the same number of slots.

    The parts' shapes are checked when the sum is made (slot by slot they must agree), so a
    sum that could never be expanded is never built.
    """

    __slots__ = ("parts", "n_slots", "slot_shapes", "bound")

    def __init__(self, parts):
        flat: list[Expr] = []
        for p in parts:
            if isinstance(p, Add):
                flat.extend(p.parts)
            elif isinstance(p, Expr):
                flat.append(p)
            else:
                raise TensorAlgError(f"a sum's parts must be expressions, got {p!r}")
        if not flat:
            raise EmptySum("a sum needs at least one part")
        slots = {p.n_slots for p in flat}
        if len(slots) > 1:
            raise SlotMismatch(f"cannot add expressions with different numbers of slots: {sorted(slots)}")
        shapes = flat[0].slot_shapes
        for p in flat[1:]:
            shapes = unify_slot_shapes(shapes, p.slot_shapes)
        self.parts = tuple(flat)
        self.n_slots = flat[0].n_slots
        self.slot_shapes = shapes
        self.bound = merge_bound(*(p.bound for p in flat))

    @classmethod
    def of(cls, *parts: Expr) -> "Add":
        return cls(parts)

    def expand(self, max_order: int | None = None) -> TensorSum:
        return _keep_bound(sum_tensor_sums(p.expand(max_order) for p in self.parts), self)

    def count(self, max_order: int | None = None) -> int:
        return sum(p.count(max_order) if isinstance(p, Product) else len(p.expand(max_order)) for p in self.parts)

    def __len__(self) -> int:
        return self.count()

    def scale(self, coeff: sp.Expr) -> "Add":
        return _keep_bound(Add([p.scale(coeff) for p in self.parts]), self)

    @property
    def T(self) -> "Add":
        return _keep_bound(Add([p.T for p in self.parts]), self)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Add):
            return NotImplemented
        return self.parts == other.parts

    def __hash__(self) -> int:
        return hash(self.parts)

    _repr_pretty_, __repr__ = Expr._repr_pretty_, Expr.__repr__
