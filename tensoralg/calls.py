"""What the reader makes of a number and of a call: the number literals, the column of ones, and a
nonlinear function applied to an argument (refused, or an opaque matrix of the function and its argument).

:class:`Calls` holds the :class:`~tensoralg.grammar.Parser` methods for these (the parser inherits
them); the module functions are the pieces without a parser: :func:`number_value` (a literal, exact
on request) and :func:`canonical_argument` (one spelling of a function's argument).

>>> number_value("0.1", exact=True), number_value("2e-3", exact=True), number_value("3")
(1/10, 1/500, 3)
"""

from __future__ import annotations

import re
from typing import NamedTuple

import sympy as sp

from tensoralg.atoms import Atom, Word
from tensoralg.definitions import STANDARD_DEFINITIONS, fold, unfold
from tensoralg.expr import TensorSum
from tensoralg.lexer import Token
from tensoralg.names import NONLINEAR_HINT


class _Word(NamedTuple):
    """An unparenthesised product of atoms with a scalar: multiplied at once."""

    coeff: sp.Expr
    atoms: Word


class Calls:
    """The parser's rules for calls and ones (mixed into :class:`~tensoralg.grammar.Parser`, whose
    ``take``, ``expect``, ``error``, ``sum``, ``as_expr``, ``expanded`` and ``atom_named`` they use)."""

    def nonlinear(self, token: Token):
        """``softmax(…)``: refused, or with ``opaque`` an unknown matrix of the function and its argument."""
        self.take()
        self.enter(token.pos, f"{token.text}(")
        pos = self.tok.pos
        value = self.sum()
        self.nesting -= 1
        self.expect("RPAREN", f"')' to close {token.text}(")
        if not self.opaque:
            raise self.error(f"{token.text}(…) {NONLINEAR_HINT}", token.pos)
        return self.opaque_matrix(token, value, pos)

    def nonlinear_of_x(self, token: Token):
        """``LN(x)``: the tokenizer reads ``(x)`` as ⊗, but after a nonlinear function it is the application
        to the activation ``x`` (with ``opaque``); refused otherwise, saying both readings."""
        otimes = self.take()
        if not self.opaque:
            raise self.error(f"{token.text}(x): {token.text} {NONLINEAR_HINT}. Note that '(x)' alone is the ASCII "
                             f"spelling of ⊗ (so {token.text}(x) reads as '{token.text} ⊗'); an operator applied to "
                             "an activation is written (A^h ⊗ W_OV^h) x", token.pos)
        return self.opaque_matrix(token, self.atom_named("x", "", otimes), otimes.pos)

    def opaque_matrix(self, token: Token, value, pos: int) -> "_Word":
        """``f(arg)`` as one unknown matrix named ``f(arg)``, ``arg`` in canonical form: the same function of
        the same argument is the same unknown, anything else another; its shape is the argument's."""
        if _is_scalar(value):
            argument, shape = sp.sstr(value), None
        else:
            expr = canonical_argument(self.expanded(self.as_expr(value, pos), pos, f"the argument of {token.text}"))
            bound = tuple(b for i, b in sorted(self.bound.items()) if any(a.index == i for t in expr for w in t.words
                                                                          for a in w))
            argument = str(expr.with_bound(bound)) if len(expr) else "0"
            shape = expr.slot_shapes[0] if expr.n_slots == 1 else None
        name = f"{token.text}({argument})"
        typed = self.text[token.pos : self.tokens[self.i - 1].end]
        self.rewrites.append(("opaque", typed, name))
        if name in self.table or shape is None:
            return self.atom_named(name, "", token)
        return _Word(sp.S.One, (Atom(name, shape[0], shape[1]),))

    def ones(self, token: Token) -> "_Word":
        """The column of ones ``1`` (``n × 1``, its rows fixed by the product), where a matrix must stand:
        after a matrix (``A^h 1``) or beside ``⊗`` (``1 ⊗ b_O``), as the folding derivations print it."""
        self.rewrites.append(("ones", token.text))
        if "1" in self.table or self.shapes is None:
            return self.atom_named("1", "", token)
        rows, cols = self.shapes.shape("1")
        if self.shapes.is_fresh(cols):
            self.shapes.unify([(cols, sp.S.One)])
        rows, cols = self.shapes.shape("1")
        if cols != 1:
            raise self.error(f"the column of ones 1 has one column, but the products here give it {cols}", token.pos)
        return _Word(sp.S.One, (Atom("1", rows, cols),))

    # -- checks ---------------------------------------------------------------


_INTEGER = re.compile(r"-?\d{1,4}", re.ASCII)


def number_value(text: str, exact: bool = False) -> sp.Expr:
    """A number literal: an integer, or a decimal as a float (a double: the digits a printed double shows,
    ``0.8333333333333334``, read back as that double, not as the decimal they write at 16 digits), or with
    ``exact`` the rational it writes (``0.1`` is ``1/10``, ``2e-3`` is ``1/500``), as a person typing it means."""
    if not any(c in text for c in ".eE"):
        return sp.Integer(text)
    if not exact:
        return sp.Float(text, 15)  # 15 digits: 53 bits, the nearest double
    mantissa, _, exponent = text.lower().partition("e")
    return sp.Rational(mantissa if mantissa not in (".", "") else "0") * sp.Integer(10) ** int(exponent or 0)


def canonical_argument(expr: TensorSum) -> TensorSum:
    """A function's argument in one form for all its spellings: like terms collected, then the
    definitions unfolded and folded again (``x W_Q^{h}ᵀ W_K^{h} xᵀ`` is ``x W_QK^{h} xᵀ``)."""
    for d in STANDARD_DEFINITIONS.values():
        expr = unfold(expr, d)
    for d in STANDARD_DEFINITIONS.values():
        expr = fold(expr, d)
    return expr


def _is_scalar(value) -> bool:
    return isinstance(value, sp.Basic)
