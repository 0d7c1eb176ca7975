"""A small text language for tensor expressions: a tokenizer and a recursive-descent parser.

No ``eval``: the text is tokenized and parsed by the grammar below, and errors carry the
0-based position of the problem. ``parse`` reads back exactly what ``str(TensorSum)`` and
:func:`to_text` print.

Grammar, loosest binding first (the paper's precedence: product, then ⊗, then +)::

    sum      := tensor (("+" | "-") tensor)*
    tensor   := product (("⊗" | "(x)") product)*
    product  := ("-" | "+")* power ((("·" | "⋅" | "*" | "/")? power)*   (juxtaposition is "·")
    power    := postfix ("**" ("-")? power)?                             (scalars only)
    postfix  := primary ("^T" | "ᵀ")*
    primary  := NUMBER | ATOM ("^{" INDEX "}")? | "Id" | DIM | "sqrt" "(" sum ")" | "(" sum ")"

Rules worth knowing:

- ``A^{h1}`` is the atom ``A`` with index ``h1``: braces always hold an index (verbatim;
  it may not contain braces). A transpose is a postfix ``^T`` or ``ᵀ`` after the atom or
  a parenthesised group: ``W_OV^{h1}^T``, ``W_OV^{h1}ᵀ``, ``(A B)^T``. So ``A^{T}`` is
  the atom ``A`` with index ``T``, not a transpose.
- Juxtaposed atoms form one word at once: ``A^{h2} A^{h1} ⊗ W_OV^{h2} W_OV^{h1}`` is
  ``(A A) ⊗ (W W)``, one term. A product with a parenthesised factor stays a lazy
  :class:`~tensoralg.expr.Product`: ``(A ⊗ B)(C ⊗ D)`` is not multiplied until
  ``expand`` (so ``expand_steps`` can show the rewrite).
- ``⊗`` builds the tensor product of its operands (:func:`~tensoralg.expr.tensor`).
- ``+`` collects canonical sums; a sum with a lazy part is a lazy
  :class:`~tensoralg.expr.Add` of its parts, in order.
- Scalars: integers, decimals (SymPy ``Float``; write ``1/2`` for an exact half),
  ``/``, ``**``, ``sqrt(...)`` and the dimension symbols ``n_ctx d_model d_head d_vocab
  d_mlp`` (plus any symbol used in a shape declared with ``atoms=``).
- ``(x)`` is always the tensor product, so an atom named ``x`` is written without
  parentheses around it.

>>> parse("A^{h2} A^{h1} ⊗ W_OV^{h2} W_OV^{h1}")
TensorSum(A^{h2} A^{h1} ⊗ W_OV^{h2} W_OV^{h1})
>>> parse("1/sqrt(d_head)·W_QK^{h}ᵀ")
TensorSum(1/sqrt(d_head)·W_QK^{h}ᵀ)
>>> len(parse("(Id ⊗ W_U)(Id ⊗ Id + A^{h} ⊗ W_OV^{h})(Id ⊗ W_E)").expand())
2
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping, NamedTuple, Union

import sympy as sp

from tensoralg.atoms import DIMS, STANDARD_SHAPES, Atom, Word, atom, transpose_word, word_shape
from tensoralg.errors import ParseError, ShapeMismatch, SlotMismatch, TensorAlgError, UnknownAtom
from tensoralg.expr import Add, Expr, Product, TensorSum, add, tensor, term, widen_identity

AtomDecl = Union[Atom, tuple]
RESERVED = ("Id", "sqrt")


class Token(NamedTuple):
    kind: str  # NUM NAME INDEX T OTIMES TIMES DIV POW PLUS MINUS LPAREN RPAREN END
    text: str
    pos: int


_SIMPLE = {
    "⊗": "OTIMES", "·": "TIMES", "⋅": "TIMES", "*": "TIMES", "/": "DIV", "+": "PLUS",
    "-": "MINUS", "−": "MINUS", "(": "LPAREN", ")": "RPAREN", "ᵀ": "T",
}
_NUMBER = re.compile(r"(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_OTIMES_ASCII = re.compile(r"\(\s*x\s*\)")


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens; raise :class:`ParseError` at the first bad character."""
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if ch == "(" and (m := _OTIMES_ASCII.match(text, i)):
            tokens.append(Token("OTIMES", m.group(), i))
            i = m.end()
        elif text.startswith("**", i):
            tokens.append(Token("POW", "**", i))
            i += 2
        elif ch in _SIMPLE:
            tokens.append(Token(_SIMPLE[ch], ch, i))
            i += 1
        elif ch == "^":
            token = _caret(text, i)
            tokens.append(token)
            i += len(token.text)
        elif m := _NUMBER.match(text, i):
            tokens.append(Token("NUM", m.group(), i))
            i = m.end()
        elif m := _NAME.match(text, i):
            tokens.append(Token("NAME", m.group(), i))
            i = m.end()
        else:
            raise ParseError(f"unexpected character {ch!r}", text, i)
    tokens.append(Token("END", "", n))
    return tokens


def _caret(text: str, i: int) -> Token:
    """``^{index}`` or ``^T`` starting at ``text[i] == '^'``."""
    nxt = text[i + 1 : i + 2]
    if nxt == "{":
        close = text.find("}", i + 2)
        opening = text.find("{", i + 2)
        if close < 0:
            raise ParseError("unclosed index: '^{' without '}'", text, i)
        if 0 <= opening < close:
            raise ParseError("an index may not contain '{'", text, opening)
        return Token("INDEX", text[i : close + 1], i)
    if nxt == "T" and not re.match(r"[A-Za-z0-9_]", text[i + 2 : i + 3]):
        return Token("T", "^T", i)
    raise ParseError("after '^' expected '{index}' or 'T' (transpose)", text, i + 1)


class _Word(NamedTuple):
    """An unparenthesised product of atoms with a scalar: multiplied at once."""

    coeff: sp.Expr
    atoms: Word


def _declared_table(atoms) -> dict[str, tuple]:
    """``atoms=`` as ``{name: (rows, cols, symmetric)}``; shapes may be strings like ``"d_model"``."""
    if atoms is None:
        return {}
    if isinstance(atoms, Mapping):
        items = list(atoms.items())
    else:
        items = [(a.name, a) for a in atoms] if all(isinstance(a, Atom) for a in atoms) else None
        if items is None:
            raise TensorAlgError("atoms= takes a mapping {name: (rows, cols) or Atom} or a list of Atom objects")
    table = {}
    for name, spec in items:
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name in RESERVED or name in DIMS:
            raise TensorAlgError(
                f"cannot declare an atom named {name!r}: a name is a letter then letters, digits or '_', "
                f"and not one of {', '.join(RESERVED + tuple(DIMS))}"
            )
        if isinstance(spec, Atom):
            base = spec.base
            table[name] = (base.rows, base.cols, base.symmetric)
        elif isinstance(spec, (tuple, list)) and len(spec) in (2, 3):
            table[name] = (_dimension(spec[0]), _dimension(spec[1]), bool(spec[2]) if len(spec) == 3 else False)
        else:
            raise TensorAlgError(f"atom {name!r}: expected (rows, cols), (rows, cols, symmetric) or an Atom, got {spec!r}")
    return table


def _dimension(value) -> sp.Expr:
    """A declared dimension: a standard name maps to the standard symbol (with its assumptions)."""
    if isinstance(value, str):
        if value in DIMS:
            return DIMS[value]
        if value.isdigit():
            return sp.Integer(value)
        if not _NAME.fullmatch(value):
            raise TensorAlgError(f"a dimension is a name like 'd_model' or an integer, got {value!r}")
        return sp.Symbol(value, positive=True, integer=True)
    return sp.sympify(value)


class _Parser:
    """Recursive descent over the token list; one method per grammar rule."""

    def __init__(self, text: str, atoms=None):
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.table = {**STANDARD_SHAPES, **_declared_table(atoms)}
        self.scalars = dict(DIMS)
        for rows, cols, *_ in self.table.values():
            for dim in (rows, cols):
                for s in sp.sympify(dim).free_symbols:
                    self.scalars.setdefault(s.name, s)

    # -- helpers --------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def take(self) -> Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def error(self, message: str, pos: int | None = None) -> ParseError:
        return ParseError(message, self.text, self.tok.pos if pos is None else pos)

    def located(self, err: TensorAlgError, pos: int) -> TensorAlgError:
        """The same kind of error with the position in the text added."""
        pointer = " " * pos + "^"
        return type(err)(f"{err}\nat position {pos}:\n  {self.text}\n  {pointer}")

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
            raise ParseError("empty expression; expected something like 'A^{h} ⊗ W_OV^{h}'", self.text, 0)
        value = self.sum()
        if self.tok.kind != "END":
            raise self.error(f"unexpected {self.describe(self.tok)} after a complete expression")
        if isinstance(value, _Word):
            return term(value.atoms, coeff=value.coeff)
        if not isinstance(value, Expr):
            raise ParseError(
                f"the text is only the scalar {value}; a tensor expression needs an atom or Id (e.g. '{value}·Id')",
                self.text, 0,
            )
        return value

    def sum(self):
        start = self.tok.pos
        parts = [(start, self.tensor())]
        while self.tok.kind in ("PLUS", "MINUS"):
            op = self.take()
            pos = self.tok.pos
            value = self.tensor()
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
        try:
            return add(*exprs)
        except TensorAlgError as err:
            raise self.located(err, start) from None

    def tensor(self):
        start = self.tok.pos
        operands = [(start, self.product())]
        while self.tok.kind == "OTIMES":
            self.take()
            operands.append((self.tok.pos, self.product()))
        if len(operands) == 1:
            return operands[0][1]
        for pos, value in operands:
            if _is_scalar(value):
                raise self.error(f"⊗ needs tensor operands, got the scalar {value}; write '{value}·A ⊗ B'", pos)
        try:
            return tensor(*[self.as_expr(v, p) for p, v in operands])
        except TensorAlgError as err:
            raise self.located(err, start) from None

    def product(self):
        start = self.tok.pos
        coeff: sp.Expr = sp.S.One
        while self.tok.kind in ("MINUS", "PLUS"):
            if self.take().kind == "MINUS":
                coeff = -coeff
        items: list[tuple[int, object]] = []  # (position, a word's atoms or a group Expr)
        op = "TIMES"
        while True:
            pos = self.tok.pos
            value = self.power()
            if op == "DIV":
                coeff = coeff / self.divisor(value, pos)
            elif _is_scalar(value):
                coeff = coeff * value
            elif isinstance(value, _Word):  # juxtaposed atoms join the word before them
                coeff = coeff * value.coeff
                if items and isinstance(items[-1][1], tuple):
                    word = items[-1][1] + value.atoms
                    self.check_word(word, pos)
                    items[-1] = (items[-1][0], word)
                else:
                    items.append((pos, value.atoms))
            else:
                items.append((pos, value))
            if self.tok.kind in ("TIMES", "DIV"):
                op = self.take().kind
            elif self.tok.kind in ("NUM", "NAME", "LPAREN"):  # juxtaposition
                op = "TIMES"
            else:
                break
        return self.build_product(coeff, items, start)

    def divisor(self, value, pos: int) -> sp.Expr:
        if not _is_scalar(value):
            raise self.error("'/' divides by a scalar only", pos)
        if value == 0:
            raise self.error("division by zero", pos)
        return value

    def build_product(self, coeff: sp.Expr, items: list, start: int):
        """A scalar, a word, a scaled group, or a lazy product of several factors."""
        if not items:
            return coeff
        if len(items) == 1:
            value = items[0][1]
            if isinstance(value, tuple):
                return _Word(coeff, value)
            return value if coeff == 1 else value.scale(coeff)
        factors = [term(v) if isinstance(v, tuple) else v for _, v in items]
        self.check_slots(items, factors, "multiply")
        try:
            return Product(factors, coeff)
        except TensorAlgError as err:
            raise self.located(err, start) from None

    def power(self):
        pos = self.tok.pos
        base = self.postfix()
        if self.tok.kind != "POW":
            return base
        self.take()
        sign = 1
        if self.tok.kind == "MINUS":
            self.take()
            sign = -1
        epos = self.tok.pos
        exponent = self.power()
        if not _is_scalar(base):
            raise self.error("'**' raises a scalar to a power; tensor expressions have no powers here", pos)
        if not _is_scalar(exponent):
            raise self.error("an exponent must be a scalar", epos)
        return base ** (sign * exponent)

    def postfix(self):
        pos = self.tok.pos
        value = self.primary()
        while self.tok.kind == "T":
            self.take()
            if _is_scalar(value):
                raise self.error(f"^T transposes an atom, Id or a parenthesised expression, not the scalar {value}", pos)
            if isinstance(value, _Word):
                value = _Word(value.coeff, transpose_word(value.atoms))
            else:
                value = value.T
        if self.tok.kind == "INDEX":
            raise self.error("an index '^{...}' must directly follow an atom name")
        return value

    def primary(self):
        token = self.tok
        if token.kind == "NUM":
            self.take()
            return sp.Float(token.text) if any(c in token.text for c in ".eE") else sp.Integer(token.text)
        if token.kind == "LPAREN":
            self.take()
            if self.tok.kind == "RPAREN":
                raise self.error("empty parentheses")
            value = self.sum()
            self.expect("RPAREN", f"')' to close the '(' at position {token.pos}")
            # a parenthesised word is a group: a product with a group stays lazy
            return self.as_expr(value, token.pos) if isinstance(value, _Word) else value
        if token.kind == "NAME":
            return self.name()
        if token.kind == "INDEX":
            raise self.error("an index '^{...}' must directly follow an atom name")
        raise self.error(f"expected an atom, Id, a number or '(' but found {self.describe(token)}")

    def name(self):
        token = self.take()
        name = token.text
        index_token = self.take() if self.tok.kind == "INDEX" else None
        if name in self.table:
            index = index_token.text[2:-1] if index_token else ""
            return _Word(sp.S.One, (atom(name, index, self.table),))
        if index_token is not None and (name in RESERVED or name in self.scalars):
            raise self.error(f"{name} takes no index", index_token.pos)
        if name == "Id":
            return _Word(sp.S.One, ())
        if name == "sqrt":
            self.expect("LPAREN", "'(' after sqrt")
            pos = self.tok.pos
            value = self.sum()
            self.expect("RPAREN", "')' to close sqrt(")
            if not _is_scalar(value):
                raise self.error("sqrt takes a scalar", pos)
            return sp.sqrt(value)
        if name in self.scalars:
            return self.scalars[name]
        known = ", ".join(sorted(self.table))
        pointer = " " * token.pos + "^"
        raise UnknownAtom(
            f"unknown atom {name!r} at position {token.pos}:\n  {self.text}\n  {pointer}\n"
            f"known atoms: {known} (declare others with atoms=); also Id, sqrt and the scalars "
            f"{', '.join(sorted(self.scalars))}"
        )

    # -- checks ---------------------------------------------------------------
    def as_expr(self, value, pos: int) -> Expr:
        if isinstance(value, _Word):
            try:
                return term(value.atoms, coeff=value.coeff)
            except TensorAlgError as err:
                raise self.located(err, pos) from None
        return value

    def check_word(self, word: Word, pos: int) -> None:
        try:
            word_shape(word)
        except ShapeMismatch as err:
            raise self.located(err, pos) from None

    def check_slots(self, items, exprs, verb: str) -> None:
        """Slot counts must agree, except that a bare ``Id`` widens (see :func:`widen_identity`)."""
        widest = max(e.n_slots for e in exprs)
        widened = [widen_identity(e, widest) for e in exprs]
        first = widened[0].n_slots
        for (pos, _), e in zip(items, widened):
            if e.n_slots != first:
                raise self.located(
                    SlotMismatch(f"cannot {verb} a {e.n_slots}-slot expression and a {first}-slot expression"), pos
                )


def _is_scalar(value) -> bool:
    return isinstance(value, sp.Basic)


def _negate(value):
    if isinstance(value, _Word):
        return _Word(-value.coeff, value.atoms)
    return -value


def parse(text: str, atoms: Mapping[str, AtomDecl] | Iterable[Atom] | None = None) -> Expr:
    """Parse the text language (see the module docstring) into an expression.

    ``atoms`` declares atoms beyond the paper's standard ones, as ``{name: (rows, cols)}``
    (a third entry ``True`` marks a symmetric atom; dimensions are names such as
    ``"d_model"`` or new ones such as ``"k"``), ``{name: Atom}`` or a list of atoms.

    Raises :class:`ParseError` (with the position) for malformed text,
    :class:`UnknownAtom` for a name that is not an atom, Id, sqrt or a dimension,
    :class:`ShapeMismatch` / :class:`SlotMismatch` when the pieces do not fit.

    >>> parse("(A^{1} ⊗ W_OV^{1})(A^{2} ⊗ W_OV^{2})").expand()
    TensorSum(A^{1} A^{2} ⊗ W_OV^{1} W_OV^{2})
    >>> parse("V Vᵀ", atoms={"V": ("d_model", "k")}).slot_shapes
    ((d_model, d_model),)
    """
    if not isinstance(text, str):
        raise TensorAlgError(f"parse() takes a string, got {type(text).__name__}")
    return _Parser(text, atoms).parse()


def to_text(expr) -> str:
    """Text that :func:`parse` reads back to an equal expression.

    Canonical sums print as ``str`` does; lazy products as ``c·(F_1)(F_2)…``; lazy sums
    with their parts, multi-term parts in parentheses. A zero k-slot sum prints as
    ``0·Id ⊗ … ⊗ Id``. Atoms must have names the parser knows and indices without braces.

    >>> to_text(parse("(A^{1} ⊗ Id)(Id ⊗ W_E)"))
    '(A^{1} ⊗ Id)(Id ⊗ W_E)'
    """
    kind = type(expr).__name__
    if isinstance(expr, Atom):
        return repr(expr)
    if isinstance(expr, TensorSum):
        _check_indices(expr)
        return str(expr) if len(expr) else "0·" + " ⊗ ".join(["Id"] * expr.n_slots)
    if isinstance(expr, Product):
        return _coeff_prefix(expr.coeff) + "".join(f"({to_text(f)})" for f in expr.factors)
    if isinstance(expr, Add):
        return " + ".join(
            f"({to_text(p)})" if isinstance(p, TensorSum) and len(p) != 1 else to_text(p) for p in expr.parts
        )
    raise TensorAlgError(f"to_text() takes an atom or an expression (TensorSum, Product, Add), got {kind}")


def _coeff_prefix(coeff: sp.Expr) -> str:
    if coeff == 1:
        return ""
    if coeff == -1:
        return "-"
    text = sp.sstr(coeff)
    return f"({text})·" if isinstance(coeff, sp.Add) else f"{text}·"


def _check_indices(expr: TensorSum) -> None:
    for t in expr:
        for w in t.words:
            for a in w:
                if "{" in a.index or "}" in a.index:
                    raise TensorAlgError(f"atom {a!r}: an index with braces cannot be written as text")
