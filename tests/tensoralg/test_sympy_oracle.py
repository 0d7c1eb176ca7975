"""SymPy as an oracle on small cases: ``KroneckerProduct`` with ``combine_kronecker`` (term by
term: SymPy 1.14 returns a wrong term when given an expanded sum) and
``sympy.physics.quantum.TensorProduct`` with ``expand(tensorproduct=True)``."""

from __future__ import annotations

from collections import Counter

import sympy as sp
from hypothesis import given
from sympy.matrices.expressions.kronecker import combine_kronecker
from sympy.physics.quantum import TensorProduct

from tensoralg import Product, TensorSum, d_model, identity, n_ctx, term
from tensoralg.coefficients import canonical_coeff
from tests.helpers import transformer_product
from tests.strategies import PROPERTY, products

LAYOUT = ("n_ctx", "d_model")
DIMS = {0: n_ctx, 1: d_model}


def kronecker_products(p: Product):
    """Per product of the expansion: (ours, SymPy's), each as ``(coeff, words as names)``."""
    tables = [list(f) for f in p.factors]
    for choice in p.iter_terms():
        chosen = [tables[k][j] for k, j in enumerate(choice.indices)]
        # scalars outside: combine_kronecker cannot see through (-(A ⊗ B))**2
        bodies = [term(*t.words).to_sympy(DIMS) for t in chosen]
        coeff = sp.Mul(p.coeff, *[t.coeff for t in chosen])
        theirs = _kron_key(combine_kronecker(sp.MatMul(*bodies)))
        theirs = (canonical_coeff(sp.expand(coeff * theirs[0])), theirs[1])
        yield _kron_key(term(*choice.term.words, coeff=choice.term.coeff).to_sympy(DIMS)), theirs


def _kron_key(m) -> tuple:
    """``c·KroneckerProduct(F_1, F_2)`` as ``(c, (names of F_1, names of F_2))``, powers unrolled."""
    coeff, body = sp.S.One, m
    if isinstance(m, sp.MatMul):
        scalars = [a for a in m.args if not getattr(a, "is_Matrix", False)]
        matrices = [a for a in m.args if getattr(a, "is_Matrix", False)]
        coeff, body = sp.Mul(*scalars), (matrices[0] if len(matrices) == 1 else sp.MatMul(*matrices))
    if isinstance(body, sp.KroneckerProduct):
        slots = body.args
    elif isinstance(body, sp.Identity):
        slots = (sp.Identity(n_ctx), sp.Identity(d_model))
    else:
        raise AssertionError(f"not a Kronecker product: {m}")
    return canonical_coeff(sp.expand(coeff)), tuple(_matrix_names(s) for s in slots)


def _matrix_names(m) -> tuple:
    if isinstance(m, sp.Identity):
        return ()
    if isinstance(m, sp.MatrixSymbol):
        return (m.name,)
    if isinstance(m, sp.Transpose):
        return (m.arg.name + "ᵀ",)
    if isinstance(m, sp.MatPow):
        return _matrix_names(m.base) * int(m.exp)
    if isinstance(m, sp.MatMul):
        return tuple(n for a in m.args for n in _matrix_names(a))
    raise AssertionError(f"unexpected factor {m!r}")


@PROPERTY
@given(products(LAYOUT, max_factors=3))
def test_each_product_matches_combine_kronecker(p):
    for ours, theirs in kronecker_products(p):
        assert ours == theirs


def test_transformer_product_matches_combine_kronecker():
    pairs = list(kronecker_products(transformer_product(2, 2)))
    assert len(pairs) == 9
    for ours, theirs in pairs:
        assert ours == theirs


# -- sympy.physics.quantum.TensorProduct ------------------------------------------------------


def _symbol(a) -> sp.Symbol:
    return sp.Symbol(repr(a), commutative=False)


ID = sp.Symbol("Id", commutative=False)


def tensor_product_expansion(p: Product) -> dict:
    """Expand ``p`` with TensorProduct; return ``{(slot names, …): coeff}``.

    Each factor gets a third slot holding its own marker symbol: SymPy 1.14 crashes on
    ``TP(X, Y) * TP(X, Y)`` (it tries ``TP(X, Y)**2``), and the markers keep neighbouring
    tensor products distinct. The markers and ``Id`` are dropped when reading back.
    """
    factors = []
    for k, f in enumerate(p.factors):
        marker = sp.Symbol(f"F{k}", commutative=False)
        terms = [t.coeff * TensorProduct(*[sp.Mul(*map(_symbol, w)) if w else ID for w in t.words], marker) for t in f]
        factors.append(sp.Add(*terms))
    expanded = sp.expand(sp.Mul(p.coeff, *factors), tensorproduct=True)
    if expanded == 0:  # a zero factor (hypothesis finds them): nothing to read back
        return {}
    out: Counter = Counter()
    for summand in sp.Add.make_args(expanded):
        commutative, (tp,) = summand.args_cnc()
        assert isinstance(tp, TensorProduct)
        key = tuple(_names(slot) for slot in tp.args[:-1])
        out[key] += sp.Mul(*commutative)
    return {k: canonical_coeff(sp.expand(c)) for k, c in out.items() if sp.expand(c) != 0}


def _names(slot) -> tuple:
    """The atom names of a noncommutative monomial, powers unrolled, ``Id`` dropped."""
    names = []
    for factor in sp.Mul.make_args(slot):
        base, exp = factor.as_base_exp()
        names.extend([base.name] * int(exp))
    return tuple(n for n in names if n != "Id")


def ours(p: Product) -> dict:
    return {tuple(tuple(map(repr, w)) for w in t.words): t.coeff for t in p.expand()}


@PROPERTY
@given(products(LAYOUT, max_factors=3))
def test_expansion_matches_tensor_product(p):
    assert tensor_product_expansion(p) == ours(p)


def test_a_zero_factor_expands_to_zero_in_both():
    p = Product([identity(2), TensorSum({}, n_slots=2)])
    assert tensor_product_expansion(p) == ours(p) == {}


def test_transformer_product_matches_tensor_product():
    p = transformer_product(2, 3)
    assert tensor_product_expansion(p) == ours(p)
    assert len(ours(p)) == 16
