"""The recursive-descent reader behind :func:`tensoralg.parse.parse` and :func:`~tensoralg.parse.read`.

:class:`Parser` walks the token list of :func:`tensoralg.lexer.tokenize` with one method
per rule of the grammar that :mod:`tensoralg.parse` documents (``sum``, ``summand``,
``tensor``, ``product``, ``power``, ``postfix``, ``primary``), binds the indices of
``Σ`` sums, keeps an operator applied to an activation apart, and records the rewrites
made while reading. Every error it raises carries the position in the text. The limits
below bound what a text may ask of it, so hostile input is refused, never run.

>>> from tensoralg.atoms import STANDARD_SHAPES
>>> Parser("A ⊗ W_OV", dict(STANDARD_SHAPES), None, 0, "").parse()
TensorSum(A ⊗ W_OV)
"""

from __future__ import annotations

import bisect


import sympy as sp

from tensoralg.atoms import DIMS, STANDARD_SHAPES, Atom, transpose_word
from tensoralg.calls import _INTEGER, Calls, _is_scalar, _Word, number_value
from tensoralg.shape_checks import ShapeChecks
from tensoralg.coefficients import MAX_COEFFICIENT_TERMS, NON_FINITE, expanded_size
from tensoralg.errors import ParseError, ShapeMismatch, TensorAlgError, UnknownAtom, caret, cut
from tensoralg.expr import Add, Expr, Product, TensorSum, add, tensor, term
from tensoralg.inference import RESERVED, Shapes
from tensoralg.lexer import Token, tokenize
from tensoralg.names import NONLINEAR, split_name
from tensoralg.parts import _is_identity, _words, lazy_tensor
from tensoralg.bound import stored_free_index, stored_index
from tensoralg.reading import Applied, Bound, reindex

MAX_NESTING = 60  # nested "(", "sqrt(", "**" and Σ: deeper text is refused, never a RecursionError
MAX_SCALE_DIGITS = 300  # a number may reach 10**300 (as a float's range); larger powers are refused
MAX_EXPANDED = 20_000  # terms the reader may multiply out itself (a Σ's body, a group in a product)
MAX_LAYER_DIGITS = 18  # H_<n>: a layer number fits an int64
MAX_POWER = 1000  # |exponent| for a power of a symbolic base (d_head**1000 still expands cheaply)


class _Reading:
    """A word being read: its atoms, where each juxtaposed piece of it starts (``(first atom, position)``)
    and how many of its atoms are checked to chain (:meth:`Parser.close_word`)."""

    __slots__ = ("atoms", "pieces", "checked")

    def __init__(self, atoms, pos: int):
        self.atoms, self.pieces, self.checked = list(atoms), [(0, pos)], 0

    def add(self, atoms, pos: int) -> None:
        self.pieces.append((len(self.atoms), pos))
        self.atoms.extend(atoms)


class Parser(Calls, ShapeChecks):
    """Recursive descent over the token list; one method per grammar rule."""

    def __init__(self, text: str, table: dict, shapes: Shapes | None, index_from: int, hint: str,
                 visible: bool = False, opaque: bool = False, names: frozenset = frozenset(), exact: bool = False):
        self.text = text
        self.exact = exact  # decimals as the exact rationals they are written as (0.1 is 1/10), not floats
        self.visible = visible  # keep like terms typed at the top level apart (to collect as a step)
        self.depth = 0
        self.nesting = 0  # groups open at this point: bounded by MAX_NESTING
        self.tokens = tokenize(text)
        self.i = 0
        self.table = table
        self.shapes = shapes  # None: undeclared names are errors
        self.index_from = index_from
        self.hint = hint
        self.scalars = dict(DIMS)
        for rows, cols, *_ in self.table.values():
            for dim in (rows, cols):
                for s in sp.sympify(dim).free_symbols:
                    self.scalars.setdefault(s.name, s)
        self.scope: dict[str, str] = {}  # bound variable -> stored index, inside a Σ
        self.bound: dict[str, Bound] = {}
        self.rewrites: list[tuple] = []
        self.free: dict[str, int] = {}  # free index -> its first position
        self.opaque = opaque  # read f(…) of a nonlinear f as an opaque matrix instead of refusing it
        self.opaque_calls: dict[str, dict[str, str]] = {}
        declared = {name for name in table if name not in STANDARD_SHAPES}
        self.names = frozenset(declared | names | {t.text for t in self.tokens if t.kind == "NAME"
                                                   and t.text not in RESERVED and t.text not in self.scalars})

    # -- helpers --------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def take(self) -> Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def enter(self, pos: int, what: str) -> None:
        """Open one more nested construct; refuse past :data:`MAX_NESTING` (the parser recurses)."""
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(f"{what} nested more than {MAX_NESTING} deep; simplify the expression", pos)

    def scalar(self, value: sp.Expr, pos: int) -> sp.Expr:
        """A scalar just computed: finite, and no larger than ``10**MAX_SCALE_DIGITS``."""
        if value.has(*NON_FINITE):
            raise self.error(f"the scalar here is {value} (a division by zero or an overflow): "
                             "a coefficient must be finite", pos)
        if value.is_number and not value.is_zero:
            size = abs(sp.log(abs(value), 10).evalf(15))
            if not size.is_finite or size > MAX_SCALE_DIGITS:
                raise self.error(f"the scalar here is beyond 10**±{MAX_SCALE_DIGITS}: too large to be a coefficient", pos)
        elif not value.is_number:
            terms = expanded_size(value)  # counted before anything multiplies it out
            if terms > MAX_COEFFICIENT_TERMS:
                raise self.error(f"the scalar here multiplies out to {terms:,} terms, more than the "
                                 f"{MAX_COEFFICIENT_TERMS:,} a coefficient may have; use a smaller power or fewer terms", pos)
        return value

    def expanded(self, expr: Expr, pos: int, what: str) -> TensorSum:
        """``expr`` multiplied out by the reader itself, its terms counted first: more than
        :data:`MAX_EXPANDED` is refused before anything is built."""
        n = expr.count() if isinstance(expr, (Product, Add)) else len(expr)
        if n > MAX_EXPANDED:
            raise self.error(f"{what} here multiplies out to {n:,} terms, more than the {MAX_EXPANDED:,} "
                             "the reader expands itself; split the expression", pos)
        return expr.expand()

    def error(self, message: str, pos: int | None = None) -> ParseError:
        return ParseError(message, self.text, self.tok.pos if pos is None else pos)

    def located(self, err: TensorAlgError, pos: int) -> TensorAlgError:
        """The same kind of error with the position in the text added (shape pairs kept)."""
        message = f"{err} at position {pos}:\n{caret(self.text, pos)}"  # one line, then the text and its caret
        if isinstance(err, ShapeMismatch):
            return ShapeMismatch(message, dims=err.dims)
        return type(err)(message)

    def expect(self, kind: str, what: str) -> Token:
        if self.tok.kind != kind:
            raise self.error(f"expected {what} but found {self.describe(self.tok)}")
        return self.take()

    @staticmethod
    def describe(token: Token) -> str:
        return "the end of the text" if token.kind == "END" else repr(token.text)

    # -- grammar --------------------------------------------------------------
    def parse(self):
        if self.tok.kind == "END":
            raise ParseError("empty expression; expected something like 'A^h ⊗ W_OV^h'", self.text, 0)
        equals = next((t for t in self.tokens if t.kind == "EQUALS"), None)
        if equals is not None:
            raise self.error("an equation is not an expression: check it with tensoralg.check(\"LHS = RHS\") "
                             "or tcircuits check \"LHS = RHS\", or expand each side", equals.pos)
        value = self.sum()
        if self.tok.kind != "END":
            raise self.error(f"unexpected {self.describe(self.tok)} after a complete expression")
        for index, pos in self.free.items():
            if index in self.bound:
                b = self.bound[index]
                raise self.error(f"the index {index} is free here, but Σ_{{{b.var}∈{b.over}}} binds the same index; "
                                 "rename one of them", pos)
        if isinstance(value, _Word):
            return term(value.atoms, coeff=value.coeff)
        if _is_scalar(value) and value.is_zero and len(self.tokens) == 2:  # "0", as the printers write the zero sum
            return TensorSum([], n_slots=1)
        if not isinstance(value, (Expr, Applied)):
            raise ParseError(
                f"the text is only the scalar {value}; a tensor expression needs an atom or Id (e.g. '{value}·Id')",
                self.text, 0,
            )
        return value

    def sum(self):
        start = self.tok.pos
        parts = [(start, self.summand())]
        while self.tok.kind in ("PLUS", "MINUS"):
            op = self.take()
            pos = self.tok.pos
            value = self.summand()
            parts.append((pos, value if op.kind == "PLUS" else _negate(value)))
        if len(parts) == 1:
            return parts[0][1]
        scalars = [(p, v) for p, v in parts if _is_scalar(v)]
        if len(scalars) == len(parts):
            return sp.Add(*[v for _, v in parts])
        if scalars:
            pos, value = scalars[0]
            raise self.error(f"cannot add the scalar {value} to a tensor expression; multiply it by a term", pos)
        exprs = [self.as_expr(v, p) for p, v in parts]
        self.check_slots(parts, exprs, "add")
        self.equate(exprs)
        try:
            total = add(*exprs)
        except TensorAlgError as err:
            raise self.located(err, start) from None
        typed = sum(len(e) for e in exprs)
        if isinstance(total, TensorSum) and len(total) < typed:
            if self.visible and self.depth == 0:
                self.rewrites.append(("collect", typed - len(total)))
                return Add(exprs)  # like terms typed in the input collect as a visible step
            self.rewrites.append(("collected", typed - len(total)))  # inside a factor: collected on reading
        return total

    def summand(self):
        """``Σ_{h∈H_1} tensor``, a signed one, or a plain tensor."""
        k = self.i
        while self.tokens[k].kind in ("PLUS", "MINUS"):
            k += 1
        if self.tokens[k].kind != "SUM":
            return self.tensor()
        negative = sum(t.kind == "MINUS" for t in self.tokens[self.i : k]) % 2 == 1
        self.i = k
        token = self.take()
        var, over = token.text.split("∈")
        over, *others = over.split("∪")  # Σ_{h∈H_1∪H_2}: the body once per layer
        self.enter(token.pos, "indexed sums Σ")
        index, layer = self.binding(var, over, token.pos)
        outer = self.scope.get(var)
        self.scope[var] = index
        pos = self.tok.pos
        if self.tok.kind in ("END", "RPAREN", "PLUS"):
            raise self.error(f"expected the terms summed over {var} after {self.text[token.pos:token.end]!r}")
        try:
            body = self.as_expr(self.summand(), pos)
        finally:
            if outer is None:
                del self.scope[var]
            else:
                self.scope[var] = outer
        if _is_scalar(body):
            raise self.error(f"Σ sums tensor terms, got the scalar {body}; write '{body}·A^{var} ⊗ …'", pos)
        terms = self.expanded(body, pos, "the terms of a Σ")
        for t in terms:
            if not any(a.index == index for w in t.words for a in w):
                raise self.error(f"the summed index {var} does not appear in every term after "
                                 f"{self.text[token.pos:token.end]!r} (a term without it is not summed)", pos)
        self.bound[index] = Bound(index, var, over, layer)
        if others:  # Σ_{h∈H_1∪H_2}: the body again for each other layer, its index renamed
            if len(terms) * (1 + len(others)) > MAX_EXPANDED:
                raise self.error(f"the sum over {1 + len(others):,} layers' heads has {len(terms) * (1 + len(others)):,} "
                                 f"terms, more than the {MAX_EXPANDED:,} the reader multiplies out", token.pos)
            bounds = [Bound(i, var, o, layer) for o in others for i, layer in [self.binding(var, o, token.pos)]]
            self.bound.update((b.index, b) for b in bounds)
            body = add(body, *(reindex(body, {index: b.index}) for b in bounds))
        self.nesting -= 1
        return -body if negative else body

    def binding(self, var: str, over: str, pos: int) -> tuple[str, int | None]:
        """The stored index of ``Σ_{var∈over}``: ``h1`` for layer 1's heads (0-based), else ``var``."""
        head, _, sub = over.partition("_")
        layer = None
        if head == "H" and sub.isascii() and sub.isdigit():  # ٣ is a name, not a layer number
            if len(sub) > MAX_LAYER_DIGITS:
                raise self.error(f"a layer number has at most {MAX_LAYER_DIGITS} digits, {over[:20]}… has {len(sub):,}", pos)
            layer = int(sub) - self.index_from
            if layer < 0:
                raise self.error(f"{over} is not a layer when layers are numbered from {self.index_from}", pos)
        if layer is not None:
            index = stored_index(var, layer, self.index_from)
        else:  # another set: its variable is stored as a free index is (m2 read from 1 is m1, as the printer shows it)
            index = stored_free_index(var, self.index_from)
            if index is None:
                raise self.error(f"Σ_{{{var}∈{over}}}: {var} names layer 0, but layers are numbered from 1 here", pos)
        if index is None:  # Σ_{h2∈H_1}
            raise self.error(f"Σ_{{{var}∈{over}}}: the index {var} names another layer than {over}; write "
                             f"Σ_{{{var.rstrip('0123456789')}∈{over}}}", pos)
        while index in self.scope.values():  # a Σ inside another over the same set: rename apart
            index += "'"
        return index, layer

    def tensor(self):
        start = self.tok.pos
        operands = [(start, self.operand())]
        while self.tok.kind == "OTIMES":
            otimes = self.take()
            if otimes.text != "⊗" and self.tok.kind in ("END", "RPAREN", "PLUS", "MINUS", "OTIMES", "EQUALS"):
                before = self.text[start : otimes.pos].strip()
                raise self.error(f"'(x)' is the ASCII spelling of ⊗, so '{before}(x)' reads as '{before} ⊗' with "
                                 f"nothing after it; a function's value such as {before}(x) is not an expression of "
                                 "the algebra: write the operator applied to the activation, as in (A^h ⊗ W_OV^h) x "
                                 "or (A^h ⊗ W_OV^h)·x", otimes.pos)
            operands.append((self.tok.pos, self.operand()))
        if len(operands) == 1:
            return operands[0][1]
        for pos, value in operands:
            if _is_scalar(value):
                raise self.error(f"⊗ needs tensor operands, got the scalar {value}; write '{value}·A ⊗ B'", pos)
        exprs = [self.as_expr(v, p) for p, v in operands]
        try:
            if any(isinstance(e, (Product, Add)) for e in exprs):  # keep groups lazy: truncation sees them
                lazy = lazy_tensor(exprs, MAX_EXPANDED)
                self.rewrites.append(("tensor", len(exprs)))
                return lazy
            return tensor(*exprs)
        except TensorAlgError as err:
            raise self.located(err, start) from None

    def operand(self):
        """An operand of ⊗: a product; a scalar ending in the number ``1`` beside ⊗ (``1 ⊗ b_O``,
        ``-2·1 ⊗ b_O``, as the printers write a scaled column of ones) is that scalar times the column of ones."""
        start = self.i
        value = self.product()
        last, before = self.tokens[self.i - 1], self.tokens[self.i - 2] if self.i >= 2 else None
        beside = self.tok.kind == "OTIMES" or (start > 0 and self.tokens[start - 1].kind == "OTIMES")
        if (_is_scalar(value) and beside and last.kind == "NUM" and last.text == "1"
                and (before is None or self.i - 1 == start or before.kind not in ("DIV", "POW"))):
            return _Word(value, self.ones(last).atoms)
        return value

    def product(self):
        start = self.tok.pos
        coeff: sp.Expr = sp.S.One
        while self.tok.kind in ("MINUS", "PLUS"):
            if self.take().kind == "MINUS":
                coeff = -coeff
        items: list[tuple[int, object]] = []  # (position, a word being read or a group Expr)
        op = "TIMES"
        while True:
            pos, kind = self.tok.pos, self.tok.kind
            if kind != "NAME":  # what comes next cannot extend the word before it: check that word now
                self.close_word(items)
            value = self.power()
            if op == "JUXTAPOSED" and kind == "NUM" and items and self.tokens[self.i - 1][1:3] == ("1", pos):
                value = self.ones(self.tokens[self.i - 1])  # "A^h 1": A^h times the column of ones
            elif op == "JUXTAPOSED" and kind == "NUM" and items:  # "A 2" is not 2·A: refuse, never misread
                raise self.error(f"a number after a matrix ({cut(self.text[pos:self.tok.pos].strip())!r}) is not "
                                 "read as a scalar (only 1 there is read, as the column of ones); write the "
                                 "coefficient first, as in 2·A", pos)
            if op == "DIV":
                coeff = self.scalar(coeff / self.divisor(value, pos), pos)
            elif _is_scalar(value):
                coeff = self.scalar(coeff * value, pos)
            elif isinstance(value, _Word):  # juxtaposed atoms join the word before them
                coeff = self.scalar(coeff * value.coeff, pos)
                if items and isinstance(items[-1][1], _Reading):
                    items[-1][1].add(value.atoms, pos)
                else:
                    items.append((pos, _Reading(value.atoms, pos)))
            else:
                self.close_word(items)
                items.append((pos, self.as_expr(value, pos)))
            if self.tok.kind in ("TIMES", "DIV"):
                op = self.take().kind
            elif self.tok.kind in ("NUM", "NAME", "LPAREN", "SUM"):  # juxtaposition
                op = "JUXTAPOSED"
            else:
                break
        self.close_word(items)
        items = [(pos, tuple(v.atoms) if isinstance(v, _Reading) else v) for pos, v in items]
        return self.build_product(coeff, items, start)

    def close_word(self, items: list) -> None:
        """Check the links of the word being read (``items[-1]``) not checked yet: each link once, so
        a product of n atoms is read in time linear in n. A mismatch is reported at the piece where
        the word stopped chaining (never before its second piece, as the word is read)."""
        if not items or not isinstance(items[-1][1], _Reading) or len(items[-1][1].pieces) < 2:
            return
        word = items[-1][1]
        atoms, first = word.atoms, max(word.checked, 1)
        word.checked = len(atoms)
        bad = [k for k in range(first, len(atoms)) if atoms[k - 1].shape[1] != atoms[k].shape[0]]
        if not bad:
            return
        if self.shapes is not None and len(atoms) > 2 and len(bad) > 1:  # every link of the word at once (as equate)
            pairs = [(atoms[k - 1].shape[1], atoms[k].shape[0]) for k in bad]
            if any(self.shapes.is_fresh(d) for pair in pairs for d in pair):
                raise ShapeMismatch("the atoms of a product do not chain", dims=pairs)
        k = bad[0]
        piece = max(1, bisect.bisect_right([at for at, _ in word.pieces], k) - 1)
        self.check_word((atoms[k - 1], atoms[k]), word.pieces[piece][1])

    def divisor(self, value, pos: int) -> sp.Expr:
        if not _is_scalar(value):
            raise self.error("'/' divides by a scalar only", pos)
        if value.is_zero:
            raise self.error("division by zero", pos)
        return value

    def build_product(self, coeff: sp.Expr, items: list, start: int):
        """A scalar, a word, a scaled group, a lazy product, or an operator applied to an activation."""
        if not items:
            return coeff
        if len(items) == 1:
            value = items[0][1]
            if isinstance(value, tuple):
                return _Word(coeff, value)
            return value if coeff == 1 else value.scale(coeff)
        factors = [term(v) if isinstance(v, tuple) else v for _, v in items]
        factors = self.rename_apart(factors)
        split = self.activation_start(items, factors)
        if split is not None:
            return self.applied(items, factors, split, coeff, start)
        self.check_slots(items, factors, "multiply")
        for (pos, _), f in zip(items, factors):
            if isinstance(f, Add):  # a lazy sum inside a product is multiplied out: count it first
                self.expanded(f, pos, "a sum of products inside a product")
        self.equate_links(factors)
        try:
            return Product(factors, coeff)
        except TensorAlgError as err:
            raise self.located(err, start) from None

    def activation_start(self, items, factors) -> int | None:
        """Where the trailing 1-slot factors after 2-slot ones begin (an applied operator)."""
        if factors[-1].n_slots != 1 or _is_identity(factors[-1]):
            return None
        split = len(factors)
        while split > 0 and factors[split - 1].n_slots == 1 and not _is_identity(factors[split - 1]):
            split -= 1
        if split == 0 or any(f.n_slots == 1 and not _is_identity(f) for f in factors[:split]):
            return None
        if {f.n_slots for f in factors[:split]} != {2}:
            return None
        return split

    def applied(self, items, factors, split: int, coeff, start: int) -> Applied:
        operator = factors[0] if split == 1 else Product(factors[:split])
        activation = factors[split] if len(factors) == split + 1 else Product(factors[split:])
        self.expanded(operator, start, "an operator applied to an activation")
        self.expanded(activation, items[split][0], "an activation")
        try:
            typed = self.text[start : items[split][0]].rstrip().rstrip("·⋅*").rstrip()
            value = Applied(operator, activation.expand(), coeff, typed)
            value.result()  # checks the shapes
        except TensorAlgError as err:
            raise self.located(err, items[split][0]) from None
        return value

    def power(self):
        pos = self.tok.pos
        base = self.postfix()
        if self.tok.kind != "POW":
            return base
        self.enter(self.take().pos, "'**'")
        sign = 1
        if self.tok.kind == "MINUS":
            self.take()
            sign = -1
        epos = self.tok.pos
        exponent = self.power()
        self.nesting -= 1
        if not _is_scalar(base):
            raise self.error("'**' raises a scalar to a power; tensor expressions have no powers here", pos)
        if not _is_scalar(exponent):
            raise self.error("an exponent must be a scalar", epos)
        return self.raise_to(base, sign * exponent, pos, epos)

    def raise_to(self, base: sp.Expr, exponent: sp.Expr, pos: int, epos: int) -> sp.Expr:
        """``base ** exponent``, its size estimated before SymPy computes it (``9**9**9`` is refused
        at once, not after minutes)."""
        if exponent.is_number:
            if base.is_number and not base.is_zero and abs(base) != 1:
                size = abs(exponent.evalf(15)) * abs(sp.log(abs(base), 10).evalf(15))
                if not size.is_finite or size > MAX_SCALE_DIGITS:
                    raise self.error(f"the power here is beyond 10**±{MAX_SCALE_DIGITS}: too large to be a coefficient", pos)
            elif not base.is_number and abs(exponent.evalf(15)) > MAX_POWER:
                raise self.error(f"an exponent of a symbol must lie in -{MAX_POWER}..{MAX_POWER}, got {exponent}", epos)
        return self.scalar(base**exponent, pos)

    def postfix(self):
        pos, first, after = self.tok.pos, self.tok, self.tokens[min(self.i + 1, len(self.tokens) - 1)]
        value = self.primary()
        while self.tok.kind == "T":
            self.take()
            if _is_scalar(value):
                raise self.error(f"^T transposes an atom, Id or a parenthesised expression, not the scalar {value}", pos)
            if isinstance(value, _Word):
                if len(value.atoms) > 1:
                    self.rewrites.append(("transpose", value.atoms))
                value = _Word(value.coeff, transpose_word(value.atoms))
            else:
                value = self.as_expr(value, pos)
                for w in _words(value):
                    if len(w) > 1:
                        self.rewrites.append(("transpose", w))
                value = value.T
        if self.tok.kind == "INDEX":
            if first.kind == "NAME" and after.kind == "T":  # W_Q^T^h
                raise self.error(f"the index comes before the transpose: write {first.text}^{{{self.tok.text}}}ᵀ "
                                 f"(or {first.text}^{{{self.tok.text}}}^T)")
            raise self.error("an index '^{...}' must directly follow an atom name")
        return value

    def primary(self):
        token = self.tok
        if token.kind == "NUM":
            self.take()
            value = number_value(token.text, self.exact)
            return self.scalar(value, token.pos)
        if token.kind == "LPAREN":
            self.take()
            if self.tok.kind == "RPAREN":
                raise self.error("empty parentheses")
            self.enter(token.pos, "parentheses")
            self.depth += 1
            value = self.sum()
            self.depth -= 1
            self.nesting -= 1
            self.expect("RPAREN", f"')' to close the '(' at position {token.pos}")
            # a parenthesised word is a group: a product with a group stays lazy
            return self.as_expr(value, token.pos) if isinstance(value, (_Word, Applied)) else value
        if token.kind == "NAME":
            return self.name()
        if token.kind == "INDEX":
            raise self.error("an index '^{...}' must directly follow an atom name")
        if token.kind == "SUM":
            raise self.error("an indexed sum Σ_{...} starts a term: put it in parentheses to multiply it")
        raise self.error(f"expected an atom, Id, a number or '(' but found {self.describe(token)}")

    def name(self):
        token = self.take()
        name = token.text
        index_token = self.take() if self.tok.kind == "INDEX" else None
        if index_token is not None and name in self.scalars and _INTEGER.fullmatch(index_token.text):
            return self.raise_to(self.scalars[name], sp.Integer(index_token.text), token.pos, index_token.pos)
        if index_token is not None and (name in RESERVED or name in self.scalars):
            raise self.error(f"{name} takes no index", index_token.pos)
        if name == "Id":
            return _Word(sp.S.One, ())
        if name == "sqrt":
            self.expect("LPAREN", "'(' after sqrt")
            self.enter(token.pos, "sqrt(")
            pos = self.tok.pos
            value = self.sum()
            self.nesting -= 1
            self.expect("RPAREN", "')' to close sqrt(")
            if not _is_scalar(value):
                raise self.error("sqrt takes a scalar", pos)
            return self.scalar(sp.sqrt(value), token.pos)
        if name in self.scalars:
            return self.scalars[name]
        if name in NONLINEAR and self.tok.kind == "LPAREN":
            return self.nonlinear(token)
        if name in NONLINEAR and self.tok.kind == "OTIMES" and self.tok.text != "⊗" and index_token is None:
            return self.nonlinear_of_x(token)
        index = index_token.text if index_token else ""
        if index in self.scope:
            index = self.scope[index]
        elif index:
            index = stored_free_index(index, self.index_from)  # L1H3 from 1 is L0H3, as the printer numbers
            if index is None:
                raise self.error(f"{index_token.text} names layer 0, but layers are numbered from 1 here", index_token.pos)
            self.free.setdefault(index, index_token.pos)
        if name in self.table:
            return self.atom_named(name, index)
        pieces = split_name(name, self.names) if index_token is None else None
        if pieces is not None:  # (AC) ⊗ (BD): the atoms A and C of this expression, juxtaposed
            self.rewrites.append(("juxtaposed", name, pieces))
            atoms = tuple(a for piece in pieces for a in self.atom_named(piece, "").atoms)
            while self.tok.kind == "T":  # AxW^T: the postfix transpose binds to the atom before it, W
                self.take()
                atoms = atoms[:-1] + (atoms[-1].T,)
            return _Word(sp.S.One, atoms)
        return self.atom_named(name, index, token)

    def atom_named(self, name: str, index: str, token: Token | None = None) -> "_Word":
        """The atom ``name^{index}``: declared, the paper's, or (reading generically) a fresh shape."""
        if name in self.table:
            rows, cols, *rest = self.table[name]
            return _Word(sp.S.One, (Atom(name, rows, cols, index, symmetric=bool(rest and rest[0])),))
        if self.shapes is not None:
            rows, cols = self.shapes.shape(name)
            return _Word(sp.S.One, (Atom(name, rows, cols, index),))
        known = ", ".join(sorted(self.table))
        raise UnknownAtom(  # one line, then the text and its caret, as every parse error
            f"unknown atom {cut(name)!r} at position {token.pos}; known atoms: {known} ({self.hint}); also Id, sqrt "
            f"and the scalars {', '.join(sorted(self.scalars))}:\n{caret(self.text, token.pos)}"
        )

    def as_expr(self, value, pos: int) -> Expr:
        if isinstance(value, _Word):
            try:
                return term(value.atoms, coeff=value.coeff)
            except TensorAlgError as err:
                raise self.located(err, pos) from None
        if isinstance(value, Applied):  # inside a larger expression: applied at once
            return value.result()
        return value


def _negate(value):
    if isinstance(value, _Word):
        return _Word(-value.coeff, value.atoms)
    if isinstance(value, Applied):
        return value._replace(coeff=-value.coeff)
    return -value
