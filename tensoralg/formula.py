r"""Formulae in the slides' notation, printed as LaTeX and as text by the same rules.

``formula(source, index_from=0) -> Formula(latex, text)``: ``source`` is a formula as the
slides and the paper write it, in Unicode or ASCII:

- names with ``_`` subscripts and ``^`` superscripts: ``W_OV^h`` → ``W_{OV}^{h}``,
  ``W_O^{h}``, ``M_in^J``, ``d_head``; the printer's own rules for names and indices
  (:meth:`TensorLatexPrinter.name` and :meth:`TensorLatexPrinter.index`: ``h2`` → ``h_2``,
  ``L0H3`` → ``\mathrm{L0H3}``);
- transposes ``ᵀ`` or ``^T``: ``e_hᵀ`` → ``e_{h}^{\top}``, ``W_Q^hᵀ`` → ``W_{Q}^{h\top}``;
- relations ``= ≠ ≤ ≥ ≈ := → ↦ ∈`` (ASCII ``!= <= >= -> in``), operators ``+ - ⊗ · × /``;
- sums and products ``Σ_{h∈H_1}`` (ASCII ``sum_{h in H_1}``), ``Π_l``;
- ``sqrt(d_head)`` → ``\sqrt{d_{head}}``, ``softmax``, ``Id``, ``exp``, ``log`` upright;
  ``softmax*`` → ``\mathrm{softmax}^{*}``;
- Greek letters (``σ`` or ``sigma``), numbers, parentheses and brackets;
- ``"quoted words"`` as upright text inside the formula.

``index_from=1`` writes layers as the paper numbers them: head-set names ``H_0`` → ``H_1``,
head labels ``L0H3`` → ``L1H3`` and layer indices ``h0`` → ``h_1``.

The text is the source with ASCII spelled as the slides print it (``^T`` → ``ᵀ``, ``!=``
→ ``≠``, ``sum_{h in H}`` → ``Σ_{h∈H}``); the two cannot disagree because both come from
one parse. A malformed formula raises :class:`tensoralg.ParseError` pointing at the problem.

>>> formula("e_hᵀ e_k ≠ 0").latex
'e_{h}^{\\top} e_{k} \\neq 0'
>>> formula("W_O^h r^h").latex
'W_{O}^{h} r^{h}'
>>> f = formula("sum_{h in H_0} A^h != Id", index_from=1)
>>> f.latex, f.text
('\\sum_{h \\in H_{1}} A^{h} \\neq \\mathrm{Id}', 'Σ_{h ∈ H_1} A^h ≠ Id')
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tensoralg.errors import ParseError
from tensoralg.escape import UNICODE_MATH, escape_text
from tensoralg.latex import TensorLatexPrinter


@dataclass(frozen=True)
class Formula:
    """A formula's LaTeX (math mode, no delimiters) and its Unicode text."""

    latex: str
    text: str


_UPRIGHT_WORDS = frozenset(
    "Id softmax exp log ln tr diag vec max min argmax argmin det rank ReLU GELU LN rms mean var std sin cos".split()
)
# words that join a formula to a condition, spaced as prose: "= 0 for h ≠ k"
_CLAUSE_WORDS = frozenset("for if where otherwise when unless".split())
_JOINING_WORDS = frozenset("and or all each some with".split())
_SPELLED_GREEK = frozenset(
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi pi rho sigma tau upsilon phi chi "
    "psi omega Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega".split()
)
_BIG = {"Σ": ("\\sum", "Σ"), "∑": ("\\sum", "Σ"), "sum": ("\\sum", "Σ"),
        "Π": ("\\prod", "Π"), "∏": ("\\prod", "Π"), "prod": ("\\prod", "Π")}
# longest first
_ASCII_OPS = [(":=", ":=", ":="), ("!=", "\\neq", "≠"), ("<=", "\\le", "≤"), (">=", "\\ge", "≥"),
              ("|->", "\\mapsto", "↦"), ("->", "\\to", "→"), ("<-", "\\leftarrow", "←"), ("...", "\\ldots", "…")]
_PLAIN_OPS = set("+-=<>,;:/|.!")
_OPEN, _CLOSE = "([{", ")]}"
_IDENT = re.compile(r"[A-Za-z]+")
_INDEX_WORD = re.compile(r"L\d+H\d+(?![A-Za-z0-9])|[A-Za-z]\d+(?![A-Za-z0-9])", re.ASCII)  # h0, L0H3: layer indices
_NUMBER = re.compile(r"\d+(?:\.\d+)?", re.ASCII)
_SCRIPT_RUN = re.compile(r"[A-Za-z0-9]+")
_HEAD_SET = re.compile(r"H(\d+)", re.ASCII)
_SUPERSCRIPT_DIGITS = "⁰¹²³⁴⁵⁶⁷⁸⁹"
_HEAD_THEN_T = re.compile(r"\s*([A-Za-z0-9]+'*)\s*(?:\^\s*)?(?:T|ᵀ|\\top(?![A-Za-z])|\{T\})\s*\}")  # {hT}, {h^T}
_TRANSPOSE_FIRST = re.compile(r"T[a-z0-9].*", re.DOTALL)  # Th, T1: a transpose written before the head
_SUBSCRIPT_DIGITS = "₀₁₂₃₄₅₆₇₈₉"


class _Parser:
    def __init__(self, source: str, index_from: int):
        self.src = source
        self.pos = 0
        self.printer = TensorLatexPrinter(index_from=index_from)
        self.index_from = index_from
        self.transpose_after = False  # the superscript just read ends in a transpose (^{hT})

    def error(self, message: str, pos: int | None = None):
        raise ParseError(message, self.src, self.pos if pos is None else pos)

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.src[i] if i < len(self.src) else ""

    # -- a sequence of tokens up to a closing bracket ------------------------------------------
    def sequence(self, closer: str | None) -> tuple[list[str], list[str]]:
        latex: list[str] = []
        text: list[str] = []
        while True:
            space = self.skip_space()
            ch = self.peek()
            if not ch:
                if closer is not None:
                    self.error(f"missing {closer!r}")
                return latex, text
            if ch in _CLOSE:
                if ch != closer:
                    self.error(f"unexpected {ch!r}" + (f"; expected {closer!r}" if closer else ""))
                return latex, text
            piece_latex, piece_text = self.item()
            latex.append(piece_latex)
            text.append((" " if space and text else "") + piece_text)

    def skip_space(self) -> bool:
        start = self.pos
        while self.peek().isspace():
            self.pos += 1
        return self.pos > start

    # -- one item: a primary with its scripts, or an operator ------------------------------
    def item(self) -> tuple[str, str]:
        src, pos = self.src, self.pos
        for ascii_op, latex, text in _ASCII_OPS:
            if src.startswith(ascii_op, pos):
                self.pos += len(ascii_op)
                return latex, text
        ch = src[pos]
        if ch == '"':
            return self.quoted()
        if ch in _PLAIN_OPS:
            self.pos += 1
            return ("-" if ch == "-" else ch), ch
        if ch == "*":
            self.pos += 1
            return "\\ast", "*"
        if ch in _BIG:
            self.pos += 1
            return self.scripts(_BIG[ch][0], _BIG[ch][1])
        m = _INDEX_WORD.match(src, pos)
        if m:
            self.pos = m.end()
            return self.scripts(*self.index(m.group()))
        m = _IDENT.match(src, pos)
        if m:
            return self.word(m.group())
        m = _NUMBER.match(src, pos)
        if m:
            self.pos = m.end()
            return self.scripts(m.group(), m.group())
        if ch in _OPEN:
            return self.scripts(*self.bracketed())
        if ch in UNICODE_MATH:
            if ch == "ᵀ":
                self.error("a transpose ᵀ needs something before it")
            self.pos += 1
            if ch.isalpha():  # a Greek letter takes scripts: σ^2, λ_i
                return self.scripts(UNICODE_MATH[ch], ch)
            return UNICODE_MATH[ch], ch
        self.error(f"unexpected character {ch!r} in a formula")

    def quoted(self) -> tuple[str, str]:
        end = self.src.find('"', self.pos + 1)
        if end < 0:
            self.error("unterminated quoted text")
        words = self.src[self.pos + 1 : end]
        self.pos = end + 1
        parts = []
        for chunk in re.split(r"([^\x20-\x7e])", words):
            if not chunk:
                continue
            if len(chunk) == 1 and chunk in UNICODE_MATH:
                parts.append(UNICODE_MATH[chunk])
            else:
                parts.append("\\text{" + escape_text(chunk, "latex-math").replace("\\ ", " ") + "}")
        if parts and parts[0].startswith("\\text{"):
            parts[0] = "\\text{ " + parts[0][6:]
        if parts and parts[-1].startswith("\\text{"):
            parts[-1] = parts[-1][:-1] + " }"
        return " ".join(parts), words

    def bracketed(self) -> tuple[str, str]:
        opener = self.peek()
        closer = _CLOSE[_OPEN.index(opener)]
        self.pos += 1
        latex, text = self.sequence(closer)
        self.pos += 1
        inner_latex, inner_text = " ".join(latex), "".join(text)
        if opener == "{":
            return "{" + inner_latex + "}", "{" + inner_text + "}"
        return opener + inner_latex + closer, opener + inner_text + closer

    def word(self, name: str) -> tuple[str, str]:
        self.pos += len(name)
        if name in _BIG and self.peek() in "_^":
            return self.scripts(*_BIG[name])
        if name == "in":
            return "\\in", "∈"
        if name == "sqrt":
            self.skip_space()
            if self.peek() != "(":
                self.error("sqrt needs a parenthesised argument, as in sqrt(d_head)")
            self.pos += 1
            latex, text = self.sequence(")")
            self.pos += 1
            return self.scripts("\\sqrt{" + " ".join(latex) + "}", "sqrt(" + "".join(text) + ")")
        if name in _SPELLED_GREEK:
            return self.scripts("\\" + name, name)
        if name in _CLAUSE_WORDS:  # a condition after the formula: a quad before, a space after
            return "\\quad \\text{" + name + "}\\ ", name
        if name in _JOINING_WORDS:
            return "\\ \\text{" + name + "}\\ ", name
        base = "\\mathrm{" + name + "}" if name in _UPRIGHT_WORDS else self.printer.name(name)
        text = name
        if self.peek() == "_":  # the subscript belongs to the name: W_OV, d_head, H_0
            sub_latex, sub_text = self.subscript(name)
            base, text = base + "_{" + sub_latex + "}", text + "_" + sub_text
        return self.scripts(base, text)

    def subscript(self, name: str) -> tuple[str, str]:
        self.pos += 1
        if self.peek() == "{":
            self.pos += 1
            latex, text = self.sequence("}")
            self.pos += 1
            inner = "".join(text)
            return " ".join(latex), "{" + inner + "}" if len(inner) > 1 else inner
        m = _SCRIPT_RUN.match(self.src, self.pos)
        if not m:
            self.error("a subscript _ needs a name, a number or {…}")
        self.pos = m.end()
        run = m.group()
        if name == "H" and run.isascii() and run.isdigit() and len(run) <= 18:  # the heads of a layer
            run = str(int(run) + self.index_from)
        return escape_text(run, "latex-math"), run

    def scripts(self, base: str, text: str) -> tuple[str, str]:
        """Superscripts, transposes and primes after a primary."""
        sup: list[str] = []
        sup_text = ""
        transposed = star = False
        while True:
            ch = self.peek()
            if transposed and (ch == "ᵀ" or self.src.startswith("^T", self.pos) or self.src.startswith("**", self.pos)):
                # a second script on a transpose applies to the transposed matrix: (Wᵀ)ᵀ, (W_Q^hᵀ)ᵀ, (Wᵀ)²
                base, text = _attach(base, text, sup, sup_text, star, transposed)
                base, text = "(" + base + ")", "(" + text + ")"
                sup, sup_text, star, transposed = [], "", False, False
            if ch == "ᵀ":
                self.pos += 1
                transposed = True
            elif self.src.startswith("**", self.pos):  # Python's power: x**2 is x^2
                self.pos += 2
                if sup:
                    self.error("a second power needs brackets, as in (x^2)^3")
                latex, raw = self.power()
                sup.append(latex)
                sup_text = raw
            elif ch == "'":
                self.pos += 1
                base, text = base + "'", text + "'"
            elif ch == "*" and not sup and text.isalpha():  # softmax*
                self.pos += 1
                sup.append("*")
                star = True
            elif ch == "^":
                self.pos += 1
                self.transpose_after = False
                latex, raw = self.superscript()
                if self.transpose_after:  # ^{hT}, ^{h^T}: head h, then a transpose
                    transposed = True
                if latex == "\\top":
                    transposed = True
                elif sup:
                    self.error("a second superscript needs brackets, as in (x^a)^b")
                else:
                    sup.append(latex)
                    sup_text = raw
            elif ch == "_" and base.startswith("\\") and "_" not in base:  # Σ_{…}, λ_1
                sub_latex, sub_text = self.subscript("")
                base, text = base + "_{" + sub_latex + "}", text + "_" + sub_text
            elif ch and ch in _SUPERSCRIPT_DIGITS:
                self.pos += 1
                sup.append(str(_SUPERSCRIPT_DIGITS.index(ch)))
                sup_text = sup_text + str(_SUPERSCRIPT_DIGITS.index(ch))
            else:
                break
        return _attach(base, text, sup, sup_text, star, transposed)

    def power(self) -> tuple[str, str]:
        """The exponent after ``**``: a number, a name, or a bracketed expression."""
        self.skip_space()
        if self.peek() == "(":
            self.pos += 1
            latex, text = self.sequence(")")
            self.pos += 1
            return " ".join(latex), "".join(text)
        m = _NUMBER.match(self.src, self.pos) or _IDENT.match(self.src, self.pos)
        if m is None:
            m = re.compile(r"-\d+(?:\.\d+)?").match(self.src, self.pos)
        if m is None:
            self.error("a power ** needs a number, a name or a bracketed exponent, as in x**2")
        self.pos = m.end()
        return m.group(), m.group()

    def superscript(self) -> tuple[str, str]:
        if self.peek() == "{" and (m := _HEAD_THEN_T.match(self.src, self.pos + 1)):  # {hT} {h^T} {hᵀ} {h\top}
            self.pos = m.end()
            self.transpose_after = True
            return self.index(m[1])
        if self.peek() == "{":
            start = self.pos
            self.pos += 1
            m = _SCRIPT_RUN.match(self.src, self.pos)
            if m and self.src[m.end() : m.end() + 1] == "}":
                self.pos = m.end() + 1
                return self.index(m.group())
            self.pos = start + 1
            latex, text = self.sequence("}")
            self.pos += 1
            return " ".join(latex), "".join(text)
        if self.peek() == "*":
            self.pos += 1
            return "*", "*"
        m = _SCRIPT_RUN.match(self.src, self.pos)
        if not m:
            self.error("a superscript ^ needs an index, T, * or {…}")
        self.pos = m.end()
        return self.index(m.group())

    def index(self, run: str) -> tuple[str, str]:
        if run == "T":
            return "\\top", "ᵀ"
        if _TRANSPOSE_FIRST.fullmatch(run):  # ^{Th}: not a head named Th
            self.error(f"the superscript '{run}' is neither a head nor a transpose: a head's transpose is written "
                       f"after the head, as in ^{{{run[1:]}T}}")
        if len(run) > 1 and run.endswith("T"):  # ^hT, as the reader reads it: head h, then a transpose
            self.transpose_after = True
            run = run[:-1]
        return self.printer.index(run), self.printer.index_text(run)


def _attach(base: str, text: str, sup: list[str], sup_text: str, star: bool, transposed: bool) -> tuple[str, str]:
    """A primary with its superscripts, star and transpose, as LaTeX and as text."""
    sup = sup + ["\\top"] if transposed else sup
    if sup:
        base += "^{" + "".join(sup) + "}"
        if star:
            text += "*"
        if sup_text:
            text += "^" + (sup_text if _SCRIPT_RUN.fullmatch(sup_text) or sup_text == "*" else "{" + sup_text + "}")
    return base, text + ("ᵀ" if transposed else "")


def formula(source: str, index_from: int = 0) -> Formula:
    r"""The LaTeX and the text of a formula written in the slides' notation (see the module).

    >>> formula("A^h = softmax*(S^h / sqrt(d_head))").latex
    'A^{h} = \\mathrm{softmax}^{*} (S^{h} / \\sqrt{d_{head}})'
    """
    if not isinstance(source, str):
        raise ParseError(f"a formula is a string, got {type(source).__name__}", repr(source), 0)
    parser = _Parser(source, index_from)
    latex, text = parser.sequence(None)
    return Formula(" ".join(latex), "".join(text))
