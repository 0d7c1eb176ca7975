r"""LaTeX in the paper's notation: ``A^{h_2} A^{h_1} \otimes W_{OV}^{h_2} W_{OV}^{h_1}``.

One entry point, :func:`to_latex`, with every option an argument. A
:class:`TensorLatexPrinter` dispatches on class names (``_print_<ClassName>``), so this
module imports nothing from :mod:`tensoralg.expr` (which imports it for
``_repr_latex_``). It does not subclass SymPy's ``LatexPrinter``: our ``Add``,
``Product`` and ``Atom`` share their class names with SymPy's, so one dispatch table
cannot serve both; SymPy's printer is used for the coefficients instead.

Notation (choices documented here, pinned by golden tests):

- An atom name ``W_OV`` prints as ``W_{OV}`` (the part after the first ``_`` is the
  subscript); a name longer than one letter before that is set upright, ``\mathrm{Attn}``.
- Indices: ``h`` and ``3`` print as they are, ``h2`` as ``h_2`` (``h12`` as ``h_{12}``);
  head labels ``L0H3`` print as ``\mathrm{L0H3}`` (the same label the code and the
  numeric reports use) or, with ``head_style="dotted"``, as ``0.3``; anything else is
  set upright, ``\mathrm{...}``.
- A transpose is ``\top`` after the index: ``W_{Q}^{h\top}``, ``W_{U}^{\top}``.
- The identity is ``\mathrm{Id}``; coefficients go through ``sympy.latex``
  (``\frac{1}{\sqrt{d_{head}}}``), sums of terms in parentheses.
- Brackets by precedence: juxtaposition binds tighter than ``\otimes``, which binds
  tighter than ``+``; a lazy product's factor is bracketed unless it is one unscaled word.
- Signs are pulled out of coefficients: ``A - 2 B``, never ``A + -2 B``.
- ``max_terms`` elides the middle of a long sum to one marker with the count; documents
  take the same summands (:meth:`TensorLatexPrinter.summands`) and only arrange them.
- Every string has a text twin by the same rules (:meth:`TensorLatexPrinter.text`), and
  ``index_from=1`` numbers layers as the paper does (``L0H3`` → ``L1H3``, ``h0`` → ``h_1``).

Names and indices are arbitrary strings, so every character that means something to
TeX (``\ { } # $ % & _ ^ ~``) is escaped and control characters are replaced: a
name can never inject a command such as ``\input`` or ``\write18``.

>>> from tensoralg import atom, term
>>> to_latex(term((atom("A", "h2"), atom("A", "h1")), (atom("W_OV", "h2"), atom("W_OV", "h1"))))
'A^{h_2} A^{h_1} \\otimes W_{OV}^{h_2} W_{OV}^{h_1}'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sympy as sp
from sympy.printing.latex import LatexPrinter
from sympy.printing.str import StrPrinter

from tensoralg.bound import shown_index
from tensoralg.errors import TensorAlgError
from tensoralg.escape import escape_text
from tensoralg.names import NONLINEAR

HEAD_STYLES = ("label", "dotted")

_LETTER_DIGITS = re.compile(r"([A-Za-z])(\d+)('*)", re.ASCII)  # h2, h2' (a second sum over a layer)
_HEAD_LABEL = re.compile(r"L(\d+)H(\d+)", re.ASCII)
_PLAIN = re.compile(r"[A-Za-z]|\d+", re.ASCII)
_APPLICATION = re.compile(r"([A-Za-z][A-Za-z_]*)\((.*)\)", re.DOTALL)  # an opaque matrix: softmax(A + B)
_ARGUMENT_SUM = re.compile(r"Σ_\{([^∈{}]*)∈([^{}]*)\}")
_ARGUMENT_INDEX = re.compile(r"\^\{([^{}]*)\}")
_ARGUMENT_TOKEN = re.compile(  # the canonical text of an opaque matrix's argument, token by token
    r"(?P<sum>Σ_\{(?P<var>[^∈{}]*)∈(?P<set>[^{}]*)\})|(?P<call>(?P<fn>[A-Za-z][A-Za-z_]*)\()"
    r"|(?P<atom>(?P<name>[A-Za-z][A-Za-z0-9_]*'*)(?:\^\{(?P<index>[^{}]*)\})?(?P<t>ᵀ)?)"
    r"|(?P<power>\*\*(?P<exponent>-?\d+))|(?P<open>\()|(?P<close>\))|(?P<space>\s+)|(?P<other>.)", re.DOTALL)


def escape(text: str) -> str:
    r"""``text`` made safe inside LaTeX math: TeX's special characters escaped,
    control characters replaced by ``?``.

    >>> escape("a_b#{c}")
    'a\\_b\\#\\{c\\}'
    """
    return escape_text(text, "latex-math")


def _upright(text: str) -> str:
    return r"\mathrm{" + escape(text) + "}"


class TensorLatexPrinter:
    """Prints atoms, words, terms, canonical sums, lazy products and lazy sums.

    Options (see :func:`to_latex`) are fixed at construction; per-atom and
    per-coefficient strings are cached, which keeps a 2,197-term sum in milliseconds.
    """

    def __init__(self, max_terms: int | None = None, line_break_every: int | None = None, head_style: str = "label",
                 index_from: int = 0):
        for name, value in (("max_terms", max_terms), ("line_break_every", line_break_every)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise TensorAlgError(f"{name} must be None or an integer >= 1, got {value!r}")
        if head_style not in HEAD_STYLES:
            raise TensorAlgError(f"head_style must be one of {', '.join(map(repr, HEAD_STYLES))}, got {head_style!r}")
        if isinstance(index_from, bool) or not isinstance(index_from, int) or index_from < 0:
            raise TensorAlgError(f"index_from must be an integer >= 0 (0 as TransformerLens, 1 as the paper), got {index_from!r}")
        self.index_from = index_from
        self.max_terms = max_terms
        self.line_break_every = line_break_every
        self.head_style = head_style
        self._scalar = _ScalarLatex()
        self._atoms: dict = {}
        self._coeffs: dict = {}
        self._atom_texts: dict = {}
        self._coeff_texts: dict = {}

    def doprint(self, expr) -> str:
        if isinstance(expr, sp.Basic):  # SymPy's Add, Product and Atom share our class names
            return self._scalar.doprint(expr)
        for cls in type(expr).__mro__:
            method = getattr(self, "_print_" + cls.__name__, None)
            if method is not None:
                return method(expr)
        raise TensorAlgError(
            f"to_latex() cannot print a {type(expr).__name__}; it prints atoms, words (tuples of atoms), "
            "terms, TensorSum, Product, Add, definitions and SymPy scalars"
        )

    # -- atoms and words --------------------------------------------------------
    def _print_Atom(self, a) -> str:
        text = self._atoms.get(a.key)
        if text is None:
            sup = [s for s in (self.index(a.index), r"\top" if a.transposed else "") if s]
            app = _APPLICATION.fullmatch(a.name)
            name = self.application(app[1], app[2]) if app and app[1] in NONLINEAR else self.name(a.name)
            text = name + ("^{" + "".join(sup) + "}" if sup else "")
            self._atoms[a.key] = text
        return text

    def application(self, function: str, argument: str) -> str:
        r"""An opaque matrix ``softmax(x W_QK^{h1} xᵀ)`` (a function of an argument the reader printed in
        canonical text) as ``\mathrm{softmax}\left(x W_{QK}^{h_1} x^{\top}\right)``, which reads back."""
        out, stack = [], []
        for m in _ARGUMENT_TOKEN.finditer(argument):
            kind, value = m.lastgroup, m.group()
            if kind == "sum":
                out.append(rf"\sum_{{{self.index(m['var'])} \in {self.name(self.set_text(m['set']))}}} ")
            elif kind == "call":
                name = m["fn"]
                stack.append(r"\right)" if name != "sqrt" else "}")
                out.append(r"\sqrt{" if name == "sqrt" else _upright(name) + r"\left(")
            elif kind == "atom":
                sup = [x for x in (self.index(m["index"] or ""), r"\top" if m["t"] else "") if x]
                base = r"\mathrm{Id}" if m["name"] == "Id" else self.name(m["name"])
                out.append(base + ("^{" + "".join(sup) + "}" if sup else ""))
            elif kind == "open":
                stack.append(r"\right)")
                out.append(r"\left(")
            elif kind == "close":
                out.append(stack.pop() if stack else r"\right)")
            elif kind == "power":
                out.append("^{" + m["exponent"] + "}")
            elif kind == "space":
                out.append(" ")
            else:
                out.append({"⊗": r" \otimes ", "·": r" \cdot ", "ᵀ": r"^{\top}"}.get(value, escape(value)))
        return _upright(function) + r"\left(" + re.sub(r" +", " ", "".join(out)).strip() + r"\right)"

    def set_text(self, over: str) -> str:
        """A head set ``H_1`` with its layer shifted by ``index_from``; any other set as it is."""
        m = re.fullmatch(r"H_(\d{1,18})", over)
        return f"H_{int(m[1]) + self.index_from}" if m else over

    def application_text(self, function: str, argument: str) -> str:
        """``softmax(A^{h1})`` with the layers of its argument shifted by ``index_from`` (``softmax(A^{h2})``
        from 1), as the reader reads it back."""
        argument = _ARGUMENT_SUM.sub(lambda m: f"Σ_{{{self.index_text(m[1])}∈{self.set_text(m[2])}}}", argument)
        return f"{function}({_ARGUMENT_INDEX.sub(lambda m: '^{' + self.index_text(m[1]) + '}', argument)})"

    @staticmethod
    def name(name: str) -> str:
        r"""``W_OV`` → ``W_{OV}``, ``A`` → ``A``, ``Attn`` → ``\mathrm{Attn}``."""
        head, sep, sub = name.partition("_")
        text = escape(head) if len(head) == 1 else _upright(head)
        return text + ("_{" + escape(sub) + "}" if sep else "")

    def index(self, index: str) -> str:
        r"""``h2`` → ``h_2``; ``L0H3`` → ``\mathrm{L0H3}`` (or ``0.3``); else upright.

        Layer numbers (``L0H3``'s 0, ``h0``'s 0) are shifted by ``index_from``."""
        index = self.index_text(index)
        if not index or _PLAIN.fullmatch(index):
            return index
        if m := _HEAD_LABEL.fullmatch(index):
            return f"{m[1]}.{m[2]}" if self.head_style == "dotted" else _upright(index)
        if m := _LETTER_DIGITS.fullmatch(index):
            digits = m[2]
            return (f"{m[1]}_{digits}" if len(digits) == 1 else f"{m[1]}_{{{digits}}}") + m[3]
        return _upright(index)

    def index_text(self, index: str) -> str:
        """The index as text with its layer number shifted by ``index_from``: ``L0H3`` → ``L1H3``
        (:func:`tensoralg.bound.shown_index`, the inverse of how the reader stores it)."""
        return shown_index(index, self.index_from)

    def _print_tuple(self, word) -> str:
        if not word:
            return r"\mathrm{Id}"
        atoms, printed = self._atoms, self._print_Atom  # words hold only atoms: skip the dispatch
        return " ".join([atoms.get(a.key) or printed(a) for a in word])

    # -- coefficients and terms -------------------------------------------------
    def coefficient(self, coeff) -> tuple[bool, str]:
        """``(negative, text)``: the sign pulled out, the magnitude with a trailing space."""
        cached = self._coeffs.get(coeff)
        if cached is None:
            coeff = sp.sympify(coeff)
            negative = bool(coeff.could_extract_minus_sign())
            magnitude = -coeff if negative else coeff
            if magnitude == 1:
                text = ""
            else:
                text = self._scalar.doprint(magnitude)
                text = (r"\left(" + text + r"\right)" if isinstance(magnitude, sp.Add) else text) + " "
            cached = self._coeffs[coeff] = (negative, text)
        return cached

    def signed_term(self, coeff, words) -> tuple[bool, str]:
        negative, text = self.coefficient(coeff)
        return negative, text + r" \otimes ".join([self._print_tuple(w) for w in words])

    def _print_Term(self, t) -> str:
        negative, text = self.signed_term(t.coeff, t.words)
        return ("-" if negative else "") + text

    def _print_Choice(self, choice) -> str:
        return self._print_Term(choice.term)

    def _print_TensorSum(self, s) -> str:
        return self.join([(x.negative, x.sum_latex + x.latex) for x in self.summands(s)]) if len(s) else "0"

    def sum_prefix(self, bound, words) -> tuple[str, str]:
        r"""``(latex, text)`` of the sums ``Σ_{h1∈H_1}`` over the bound indices that ``words`` carry
        (each followed by a space), outer layers first: what a term summed over heads starts with."""
        present = {a.index for w in words for a in w}
        latex, text = [], []
        for b in bound:
            if b.index in present:
                latex.append(rf"\sum_{{{self.index(b.index)} \in {self.name(b.over_text(self.index_from))}}} ")
                text.append(b.text(self.index_from) + " ")
        return "".join(latex), "".join(text)

    def join(self, pieces: list[tuple[bool, str]]) -> str:
        """Signed pieces joined with ``+``/``-`` (never ``+ -``), with optional line breaks for ``align``."""
        out = []
        every = self.line_break_every
        for i, (negative, text) in enumerate(pieces):
            if i == 0:
                out.append(("-" if negative else "") + text)
                continue
            if every and i % every == 0:
                out.append(" \\\\\n&\\quad")
            out.append((" - " if negative else " + ") + text)
        return "".join(out)

    # -- summands, elision and brackets (what documents lay out) ------------------------
    def summands(self, expr, bound=None) -> list["Summand"]:
        """The summands of a sum (terms; a lazy sum's products whole), signs pulled out,
        the middle elided to one marker when there are more than ``max_terms``; terms carrying
        an index of ``bound`` (default: the expression's own) get their ``Σ`` apart."""
        bound = getattr(expr, "bound", ()) if bound is None else bound
        items: list = []
        for part in getattr(expr, "parts", (expr,)):
            if hasattr(part, "factors"):
                items.append(part)
            else:
                items.extend(part)
        n, limit = len(items), self.max_terms
        if limit is not None and n > limit:
            head, tail = (limit + 1) // 2, limit // 2
            items = items[:head] + [n - head - tail] + (items[n - tail :] if tail else [])
        return [self.gap(x) if isinstance(x, int) else self.summand(x, bound) for x in items]

    def summand(self, part, bound=()) -> "Summand":
        """One term, or one lazy product, as a :class:`Summand`."""
        if hasattr(part, "factors"):
            negative, latex = self.coefficient(part.coeff)
            _, text = self.coefficient_text(part.coeff)
            brackets = [self.bracketed(f, bound) for f in part.factors]
            return Summand(negative, latex + " ".join(b[0] for b in brackets), text + factors_text(brackets),
                           product=part)
        negative, latex = self.signed_term(part.coeff, part.words)
        _, text = self.coefficient_text(part.coeff)
        sum_latex, sum_text = self.sum_prefix(bound, part.words) if bound else ("", "")
        return Summand(negative, latex, text + " ⊗ ".join([self.word_text(w) for w in part.words]), term=part,
                       sum_latex=sum_latex, sum_text=sum_text)

    @staticmethod
    def gap(omitted: int) -> "Summand":
        """The marker standing for ``omitted`` elided terms."""
        return Summand(False, r"\underbrace{\cdots}_{" + f"{omitted}" + r"\ \mathrm{terms}}", f"⋯ ({omitted} terms)",
                       omitted=omitted)

    @staticmethod
    def needs_brackets(factor) -> bool:
        """A factor of a product is bracketed unless it is one unscaled atom (or ``Id``).

        Juxtaposition binds tighter than ``⊗``, ``+`` and a coefficient, so a word of several
        atoms would need no brackets for its value; it keeps them because a lazy product's
        grouping is what an associativity step changes: ``(x^T W_Q^T)(W_K x)`` and
        ``x^T W_Q^T W_K x`` must not print alike."""
        terms = list(factor)
        return len(terms) != 1 or len(terms[0].words) != 1 or terms[0].coeff != 1 or len(terms[0].words[0]) > 1

    def bracketed(self, factor, bound=()) -> tuple[str, str, bool]:
        """``(latex, text, bracketed)`` of a product's factor, in brackets where precedence needs them."""
        parts = self.summands(factor, bound) if len(factor) else []
        # a zero factor keeps its slots, (0·Id ⊗ Id): "(0)" would read back as the coefficient 0
        zero = [r"\mathrm{Id}"] * factor.n_slots, ["Id"] * factor.n_slots
        latex = self.join([(x.negative, x.sum_latex + x.latex) for x in parts]) if parts else \
            r"0 \cdot " + r" \otimes ".join(zero[0])
        text = join_text([(x.negative, x.sum_text + x.text) for x in parts]) if parts else "0·" + " ⊗ ".join(zero[1])
        if self.needs_brackets(factor):
            return r"\left(" + latex + r"\right)", "(" + text + ")", True
        return latex, text, False

    # -- text, by the same rules ------------------------------------------------------
    def atom_text(self, a) -> str:
        """``W_OV^{h0}ᵀ`` (the binding label), the layer shifted by ``index_from``."""
        text = self._atom_texts.get(a.key)
        if text is None:
            index = self.index_text(a.index)
            app = _APPLICATION.fullmatch(a.name)
            name = self.application_text(app[1], app[2]) if app and app[1] in NONLINEAR and self.index_from else a.name
            text = self._atom_texts[a.key] = name + ("^{" + index + "}" if index else "") + ("ᵀ" if a.transposed else "")
        return text

    def word_text(self, word) -> str:
        return " ".join([self.atom_text(a) for a in word]) if word else "Id"

    def coefficient_text(self, coeff) -> tuple[bool, str]:
        """``(negative, text)``: the sign pulled out, the magnitude followed by ``·``."""
        cached = self._coeff_texts.get(coeff)
        if cached is None:
            cached = self._coeff_texts[coeff] = self._coefficient_text(coeff)
        return cached

    @staticmethod
    def _coefficient_text(coeff) -> tuple[bool, str]:
        coeff = sp.sympify(coeff)
        negative = bool(coeff.could_extract_minus_sign())
        magnitude = -coeff if negative else coeff
        if magnitude == 1:
            return negative, ""
        text = _SCALAR_TEXT.doprint(magnitude)
        return negative, ("(" + text + ")" if isinstance(magnitude, sp.Add) else text) + "·"

    def text(self, expr) -> str:
        """Plain text of a sum, lazy sum or product, by the same rules as the LaTeX."""
        if hasattr(expr, "factors"):
            x = self.summand(expr, expr.bound)
            return ("-" if x.negative else "") + x.text
        if not hasattr(expr, "parts"):  # a canonical sum: its terms' text alone, no LaTeX made
            return join_text(self.terms_text(expr)) if len(expr) else "0"
        parts = self.summands(expr)
        return join_text([(x.negative, x.sum_text + x.text) for x in parts]) if parts else "0"

    def terms_text(self, s) -> list[tuple[bool, str]]:
        """The signed text of each term of a canonical sum (the middle elided as :meth:`summands` does)."""
        items: list = list(s)
        n, limit = len(items), self.max_terms
        if limit is not None and n > limit:
            head, tail = (limit + 1) // 2, limit // 2
            items = items[:head] + [n - head - tail] + (items[n - tail:] if tail else [])
        out = []
        for t in items:
            if isinstance(t, int):
                out.append((False, self.gap(t).text))
                continue
            negative, coeff = self.coefficient_text(t.coeff)
            prefix = self.sum_prefix(s.bound, t.words)[1] if s.bound else ""
            out.append((negative, prefix + coeff + " ⊗ ".join([self.word_text(w) for w in t.words])))
        return out

    # -- lazy expressions ---------------------------------------------------------
    def _print_Product(self, p) -> str:
        x = self.summand(p, p.bound)
        return ("-" if x.negative else "") + x.latex

    def _print_Add(self, a) -> str:
        parts = self.summands(a)
        return self.join([(x.negative, x.sum_latex + x.latex) for x in parts]) if parts else "0"  # as the text

    def _print_Definition(self, d) -> str:
        return self.doprint(d.atom()) + " := " + self._print_tuple(d.word())



def _float_digits(expr: sp.Float, exponent: bool) -> sp.Float | str:
    """A double-precision number as its shortest digits that read back as the same number (``5/6`` as
    ``0.8333333333333334``, not SymPy's 15 digits, ``0.833333333333333``, which read back as another number),
    ``1e-20`` where ``exponent`` allows; otherwise the number itself at 17 digits or more (also exact)."""
    digits = repr(float(expr))
    plain = "n" not in digits and (exponent or "e" not in digits)  # (not inf, nan)
    return digits if expr._prec <= 53 and plain else sp.Float(expr, max(17, expr._prec // 3 + 2))


class _ScalarLatex(LatexPrinter):
    """SymPy's LaTeX of a coefficient, its floating-point numbers printed so that they read back exactly."""

    def _print_Float(self, expr):
        digits = _float_digits(expr, exponent=False)
        return digits if isinstance(digits, str) else super()._print_Float(digits)


class _ScalarText(StrPrinter):
    """SymPy's text of a coefficient (``sstr``), its floating-point numbers printed so that they read back exactly."""

    def _print_Float(self, expr):
        digits = _float_digits(expr, exponent=True)
        return digits if isinstance(digits, str) else super()._print_Float(digits)


_SCALAR_TEXT = _ScalarText()


@dataclass(frozen=True)
class Summand:
    """One summand as the printer writes it: the sign apart, LaTeX and text of the magnitude.

    ``term`` or ``product`` is what it prints; ``omitted`` > 0 marks the elided middle;
    ``sum_latex`` and ``sum_text`` the sums ``Σ_{h1∈H_1}`` that a term summed over heads
    starts with (kept apart: a derivation's layout writes a chain's sums itself).
    """

    negative: bool
    latex: str
    text: str
    term: object = None
    product: object = None
    omitted: int = 0
    sum_latex: str = ""
    sum_text: str = ""


def factors_text(brackets) -> str:
    """A lazy product's factors as text: ``(A ⊗ B)(C ⊗ D)``; a factor written without brackets is
    set apart by a space, and bracketed after another such (``A (B)``: ``A B`` would read as one word)."""
    out = ""
    for i, (_, text, bracketed) in enumerate(brackets):
        if i and not bracketed and not brackets[i - 1][2] and text != "x":  # "(x)" reads as ⊗
            text, bracketed = "(" + text + ")", True
        out += text if not out or (bracketed and brackets[i - 1][2]) else " " + text
        brackets[i] = (None, text, bracketed)
    return out


def join_text(pieces: list[tuple[bool, str]]) -> str:
    """Signed text pieces joined with ``+``/``-``: ``A - B``, never ``A + -B``."""
    return "".join((("-" if neg else "") if i == 0 else (" - " if neg else " + ")) + t for i, (neg, t) in enumerate(pieces))


def to_latex(expr, max_terms: int | None = None, line_break_every: int | None = None, head_style: str = "label",
             index_from: int = 0) -> str:
    r"""LaTeX (math mode, no delimiters) for an expression, term, word, atom or scalar.

    ``max_terms`` elides the middle of longer sums as ``\underbrace{\cdots}_{N\ \mathrm{terms}}``;
    ``line_break_every`` inserts ``\\`` and ``&\quad`` every that many terms (for ``align``);
    ``head_style`` is ``"label"`` (``\mathrm{L0H3}``) or ``"dotted"`` (``0.3``);
    ``index_from=1`` numbers layers as the paper does (``L0H3`` → ``L1H3``, ``h0`` → ``h_1``).

    >>> from tensoralg import atom, identity, term
    >>> to_latex(identity(2) + term(atom("A", "L0H3"), atom("W_OV", "L0H3").T))
    '\\mathrm{Id} \\otimes \\mathrm{Id} + A^{\\mathrm{L0H3}} \\otimes W_{OV}^{\\mathrm{L0H3}\\top}'
    """
    return TensorLatexPrinter(max_terms, line_break_every, head_style, index_from).doprint(expr)
