r"""Tokens of the expression language read by :mod:`tensoralg.parse`.

Each token keeps its 0-based position, so that every error can point at the text.
Superscripts: ``^T`` and ``ᵀ`` transpose; ``^{h1}`` and a bare ``^h1`` (letters and digits,
no braces needed for one symbol) are an index. An indexed sum ``Σ_{h∈H_1}`` (ASCII
``sum_{h in H_1}``) is one ``SUM`` token whose text is the bound index and the set; a union of
layers' heads ``Σ_{h∈H_1∪H_2}`` (``\cup``, ASCII ``cup``) is one token whose set is ``H_1∪H_2``.

The paper's LaTeX reads as the same tokens: ``\otimes`` (⊗), ``\cdot`` (·), ``^\top``,
``^{T}`` and ``^{h\top}`` / ``^{hT}`` (index ``h``, then a transpose), ``\mathrm{Id}``,
``\left( … \right)``, ``W_{OV}`` (the name ``W_OV``), ``\sum_{h \in H_1}``; spacing
commands (``\,``, ``\quad``) are skipped. Any other command is refused with what to type.

>>> [(t.kind, t.text) for t in tokenize("Σ_{h∈H_1} A^h ⊗ W_OV^{h}ᵀ")]  # doctest: +NORMALIZE_WHITESPACE
[('SUM', 'h∈H_1'), ('NAME', 'A'), ('INDEX', 'h'), ('OTIMES', '⊗'), ('NAME', 'W_OV'), ('INDEX', 'h'),
 ('T', 'ᵀ'), ('END', '')]
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tensoralg.errors import ParseError


class Token(NamedTuple):
    kind: str  # NUM NAME INDEX SUM T OTIMES TIMES DIV POW PLUS MINUS LPAREN RPAREN EQUALS END
    text: str  # for INDEX the index itself; for SUM "var∈set"
    pos: int
    end: int = -1


SIMPLE = {
    "⊗": "OTIMES", "·": "TIMES", "⋅": "TIMES", "*": "TIMES", "/": "DIV", "+": "PLUS",
    "-": "MINUS", "−": "MINUS", "(": "LPAREN", ")": "RPAREN", "ᵀ": "T", "=": "EQUALS",
}
NUMBER = re.compile(r"(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", re.ASCII)
NAME = re.compile(r"[A-Za-z](?:[A-Za-z0-9]|_(?!\{))*(?:_\{(?:[A-Za-z0-9]|\\_)+'*\})?'*", re.ASCII)  # W_OV' (a folded weight), W_{OV}, W_{OV'}
LATEX_SUBSCRIPT = re.compile(r"_\{\\(?:mathrm|text|operatorname|mathit)\{([A-Za-z0-9]+'*)\}\}", re.ASCII)  # W_{\mathrm{OV}}
OTIMES_ASCII = re.compile(r"\(\s*x\s*\)")
BARE_INDEX = re.compile(r"[A-Za-z0-9]+")
SUM_START = re.compile(r"(Σ|∑|sum(?![A-Za-z0-9])|\\sum(?![A-Za-z])|\\Sigma(?![A-Za-z]))")
SUM_BODY = re.compile(r"\s*([A-Za-z][A-Za-z0-9]*(?:_(?:\{\d+\}|\d+))?'*)\s*(?:∈|\\in(?![A-Za-z])|\s+in\s+)\s*([A-Za-z][A-Za-z0-9]*(?:_(?:\{[A-Za-z0-9]+\}|[A-Za-z0-9]+))?)\s*")
SUM_HINT = "an indexed sum is written Σ_{h∈H_1} or sum_{h in H_1}"
UNION = re.compile(r"∪|\\cup(?![A-Za-z])|(?<![A-Za-z0-9_])cup(?![A-Za-z0-9_])")  # H_1∪H_2, H_1 \cup H_2, H_1 cup H_2
HEAD_SET = re.compile(r"H_(?:\{(\d+)\}|(\d+))", re.ASCII)
MAX_DIGITS = 100  # digits in one number literal
MAX_EXPONENT = 300  # |e| in a literal such as 1e-300 (as a float's range)


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens; raise :class:`ParseError` at the first bad character."""
    tokens: list[Token] = []
    frames: list[str] = []  # what each open brace of \frac{…}{…} or \sqrt{…} closes
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if ch == "(" and (m := OTIMES_ASCII.match(text, i)):
            token = Token("OTIMES", m.group(), i, m.end())
        elif text.startswith("**", i):
            token = Token("POW", "**", i, i + 2)
        elif ch in SIMPLE:
            token = Token(SIMPLE[ch], ch, i, i + 1)
        elif ch == "^":
            token = caret(text, i)
            if token.kind == "INDEX" and (m := INDEX_THEN_T.fullmatch(token.text)):  # ^{hT}, ^{h\top}: h, then ᵀ
                tokens.append(Token("INDEX", m[1], i, token.end))
                token = Token("T", m[2], token.end, token.end)
        elif ch == "\\" and (m := BRACED_COMMAND.match(text, i)):  # \frac{a}{b} is (a)/(b), \sqrt{a} is sqrt(a)
            frames.append("numerator" if m[1] != "sqrt" else "root")
            if m[1] == "sqrt":
                tokens.append(Token("NAME", "sqrt", i, m.end() - 1))
            token = Token("LPAREN", "{", m.end() - 1, m.end())
        elif ch == "\\" and not SUM_START.match(text, i):
            token = latex_command(text, i)
            if token is None:  # spacing
                i = COMMAND.match(text, i).end()
                continue
        elif m := SUM_START.match(text, i):
            token = indexed_sum(text, i, m.end())
        elif m := NUMBER.match(text, i):
            token = number(text, m)
        elif m := NAME.match(text, i):
            token = Token("NAME", _name_text(m.group()), i, m.end())
            if (sub := LATEX_SUBSCRIPT.match(text, m.end())) and "_" not in token.text:  # W_{\mathrm{OV}}
                token = Token("NAME", f"{token.text}_{sub[1]}", i, sub.end())
        elif ch == "{" and frames:
            raise ParseError("a '{' here opens nothing: braces follow \\frac, \\sqrt, '^' or '_'", text, i)
        elif ch == "}" and frames:
            tokens.extend(close_frame(text, i, frames))
            i = tokens[-1].end
            continue
        else:
            raise ParseError(f"unexpected character {ch!r}", text, i)
        tokens.append(token)
        i = token.end
    if frames:
        raise ParseError(f"unclosed '{{' of a LaTeX {'fraction' if frames[-1] != 'root' else 'square root'}", text, n)
    tokens.append(Token("END", "", n, n))
    return tokens


BRACED_COMMAND = re.compile(r"\\(d?frac|tfrac|sqrt)\s*\{")
_ESCAPED = re.compile(r"\\([_{}#$%&])")


def _name_text(matched: str) -> str:
    """``W_{OV'}`` → ``W_OV'``; ``W_{a\\_b}`` → ``W_a_b`` (the printer escapes TeX's ``_``)."""
    return _ESCAPED.sub(r"\1", matched).replace("{", "").replace("}", "")


def close_frame(text: str, i: int, frames: list[str]) -> list[Token]:
    """The tokens of a ``}`` that closes a LaTeX group: ``)``, and after a numerator ``/ (`` (the
    denominator's ``{`` must follow)."""
    frame = frames.pop()
    out = [Token("RPAREN", "}", i, i + 1)]
    if frame == "numerator":
        j = i + 1
        while j < len(text) and text[j].isspace():
            j += 1
        if text[j : j + 1] != "{":
            raise ParseError("\\frac takes two groups, \\frac{a}{b}: expected '{' for the denominator", text, j)
        frames.append("denominator")
        out += [Token("DIV", "/", j, j), Token("LPAREN", "{", j, j + 1)]
    return out


SUBSCRIPTED_INDEX = re.compile(r"\^(?:\{([A-Za-z]+)_\{?(\d+)\}?\}|([A-Za-z]+)_(\d+))", re.ASCII)
COMMAND = re.compile(r"\\([A-Za-z]+|.)", re.DOTALL)
INDEX_THEN_T = re.compile(r"(.*[^\s\\^])\s*(?:\^\s*)?(T|\\top|\{T\}|ᵀ)")  # hT, h^T, h\top: h, then ᵀ
LATEX_TOKENS = {"otimes": ("OTIMES", "⊗"), "cdot": ("TIMES", "·"), "top": ("T", "ᵀ"), "intercal": ("T", "ᵀ")}
SPACING = frozenset([" "] + ", ; ! : quad qquad left right bigl bigr Bigl Bigr big Big biggl biggr".split())
TEXT_COMMANDS = re.compile(r"\\(?:mathrm|operatorname|text|mathit)\{([A-Za-z][A-Za-z0-9_]*)\}")
LATEX_HINTS = {
    "frac": "write a/b, as in 1/sqrt(d_head)", "sqrt": "write sqrt(d_head)", "times": "write ⊗ (or (x)) for "
    "the tensor product and · for the product", "prod": "write the factors out", "in": "∈ belongs inside "
    "\\sum_{h \\in H_1}", "mathbf": "write the name itself, as in x", "hat": "write the name itself",
}


def latex_command(text: str, i: int) -> Token | None:
    """A LaTeX command of the paper's notation as the token it stands for; ``None`` for spacing
    (``\\,``, ``\\quad``, ``\\left``, ``\\right``); a :class:`ParseError` with what to type otherwise."""
    if m := TEXT_COMMANDS.match(text, i):  # \mathrm{Id}, \operatorname{softmax}
        return Token("NAME", m[1], i, m.end())
    m = COMMAND.match(text, i)
    if m is None:  # a backslash ending the text (or before a line break)
        raise ParseError("a lone '\\' ends the text: a LaTeX command is a backslash and a name, as in \\otimes", text, i)
    name = m[1]
    if name in LATEX_TOKENS:
        kind, shown = LATEX_TOKENS[name]
        return Token(kind, shown, i, m.end())
    if name in SPACING:
        return None
    hint = LATEX_HINTS.get(name, "the language reads \\otimes \\cdot ^\\top \\mathrm{Id} \\left( \\right) "
                                 "\\sum_{h \\in H_1} and W_{OV}; see 'tcircuits expand --help'")
    raise ParseError(f"the LaTeX command {m.group()!r} is not read here: {hint}", text, i)


def number(text: str, m: re.Match) -> Token:
    """A number literal, refused when malformed (``1.5.5``, ``2e3.1``) or too long to be a
    coefficient (more than :data:`MAX_DIGITS` digits, or a decimal exponent beyond
    :data:`MAX_EXPONENT`)."""
    i, end = m.start(), m.end()
    if text[end : end + 1] == "." or (text[end : end + 1].isdigit()):
        raise ParseError(f"malformed number {text[i:end + 1]!r}...: a number has at most one '.'", text, end)
    mantissa, exponent = m.group(1), m.group(2)
    digits = sum(c.isdigit() for c in mantissa)
    if digits > MAX_DIGITS:
        raise ParseError(f"a number literal has at most {MAX_DIGITS} digits, this one has {digits}", text, i)
    if exponent and (len(exponent) > 6 or abs(int(exponent[1:])) > MAX_EXPONENT):
        raise ParseError(f"a number's exponent must lie in -{MAX_EXPONENT}..{MAX_EXPONENT}, got {exponent[1:]}",
                         text, m.start(2))
    return Token("NUM", m.group(), i, end)


def caret(text: str, i: int) -> Token:
    """``^{index}``, ``^index`` or ``^T`` starting at ``text[i] == '^'``."""
    nxt = text[i + 1 : i + 2]
    if m := SUBSCRIPTED_INDEX.match(text, i):  # ^{h_2}, ^{h_{2}}, ^h_2: the index h2
        return Token("INDEX", (m[1] or m[3]) + (m[2] or m[4]), i, m.end())
    if nxt == "{":
        close = matching_brace(text, i + 1)
        if close < 0:
            opening = text.find("{", i + 2)
            if 0 <= opening < text.find("}", i + 2):
                raise ParseError("an index may not contain '{'", text, opening)
            raise ParseError("unclosed index: '^{' without '}'", text, i)
        index = text[i + 2 : close]
        if not index.strip():
            raise ParseError("empty index '^{}'", text, i)
        unprintable = next((k for k, ch in enumerate(index) if not ch.isprintable()), None)
        if unprintable is not None:  # a control character would reach the terminal and the documents
            raise ParseError(f"an index holds printable characters only, not {index[unprintable]!r}",
                             text, i + 2 + unprintable)
        if index.strip() in ("T", "\\top", "\\intercal", "ᵀ"):  # ^{T}, ^{\top}: a transpose, as ^T
            return Token("T", "^T", i, close + 1)
        return Token("INDEX", latex_index(index, text, i + 2), i, close + 1)
    for command in ("\\top", "\\intercal"):  # ^\top
        if text.startswith(command, i + 1):
            return Token("T", "^T", i, i + 1 + len(command))
    m = BARE_INDEX.match(text, i + 1)
    if m is None:
        raise ParseError("after '^' expected an index ('^h', '^{h1}') or 'T' (transpose)", text, i + 1)
    if m.group() == "T":
        return Token("T", "^T", i, m.end())
    transposed_first(m.group(), text, i + 1)
    return Token("INDEX", m.group(), i, m.end())


def matching_brace(text: str, start: int) -> int:
    """The position of the ``}`` closing the ``{`` at ``text[start]`` (nested braces counted), or -1."""
    depth = 0
    for k in range(start, len(text)):
        if text[k] == "{" and text[k - 1 : k] != "\\":
            depth += 1
        elif text[k] == "}" and text[k - 1 : k] != "\\":
            depth -= 1
            if depth == 0:
                return k
    return -1


LATEX_IN_INDEX = re.compile(r"\\(?:mathrm|text|operatorname|mathit)\{([^{}]*)\}")
SUB_IN_INDEX = re.compile(r"([A-Za-z])_(?:\{(\d+)\}|(\d))")


def latex_index(index: str, text: str, pos: int) -> str:
    r"""What the printers write inside ``^{…}`` read back as the index: ``\mathrm{L0H3}`` → ``L0H3``,
    ``h_{12}`` → ``h12``, ``\mathrm{a\_b}`` → ``a_b``, a trailing ``\top`` kept for :func:`tokenize` to
    split off. Refused: a superscript that is neither an index nor a transpose (``^{Th}``: the
    transpose goes after the head; ``^{h^2}``; any other LaTeX command)."""
    read = LATEX_IN_INDEX.sub(lambda m: _ESCAPED.sub(r"\1", m[1]), index)
    read = SUB_IN_INDEX.sub(lambda m: m[1] + (m[2] or m[3]), read)
    core = INDEX_THEN_T.fullmatch(read)
    core = core[1] if core else read
    transposed_first(core.strip(), text, pos)
    if "^" in core:
        raise ParseError(f"a superscript inside an index ('{index}') is neither a head nor a transpose: an index "
                         "is a head such as h or h1, a transpose is written after it, as in ^{hT} or ^{h}ᵀ", text, pos)
    if "{" in core or "}" in core:
        raise ParseError(f"an index may not contain '{{' (read '{index}'); write ^{{h1}}, ^{{L0H3}} or "
                         "^{\\mathrm{L0H3}}", text, pos + index.find("{") if "{" in index else pos)
    return read


TRANSPOSE_FIRST = re.compile(r"(?:T|ᵀ|\\top(?![A-Za-z]))\s*([A-Za-z0-9].*)", re.DOTALL)


def transposed_first(index: str, text: str, pos: int) -> None:
    """Refuse ``^{Th}``: a transpose before the head would otherwise name a head ``Th``."""
    if m := TRANSPOSE_FIRST.fullmatch(index):
        raise ParseError(f"the superscript '{index}' is neither a head nor a transpose: a head's transpose is "
                         f"written after the head, as in ^{{{m[1]}T}} or ^{{{m[1]}}}ᵀ", text, pos)


def indexed_sum(text: str, i: int, start: int) -> Token:
    """``Σ_{h∈H_1}`` / ``sum_{h in H_1}`` from ``text[i]``; ``start`` is just after Σ/sum."""
    if text[start : start + 2] != "_{":
        raise ParseError(f"expected '_{{' after {text[i:start]!r}: {SUM_HINT}", text, start)
    close = matching_brace(text, start + 1)  # H_{1}, \mathrm{head1} inside
    if close < 0:
        raise ParseError(f"unclosed '{text[i:start]}_{{': {SUM_HINT}", text, i)
    inside = text[start + 2 : close]
    first, *others = UNION.split(LATEX_IN_INDEX.sub(lambda m: m[1], inside))  # \sum_{\mathrm{head1} \in H_{1}}
    m = SUM_BODY.fullmatch(first)
    if m is None:
        raise ParseError(f"cannot read the range of the sum: {SUM_HINT}, a union of layers' heads "
                         "Σ_{h∈H_1∪H_2} or sum_{h in H_1 cup H_2}", text, start + 2)
    var = re.sub(r"[_{}]", "", m[1])  # h_2, h_{2}: the subscripted index h2
    sets = [m[2], *(s.strip() for s in others)]
    if others:  # Σ_{h∈H_1∪H_2}: the heads of several layers
        layers = [HEAD_SET.fullmatch(s) for s in sets]
        if not all(layers):
            bad = next(s for s, layer in zip(sets, layers) if not layer)
            raise ParseError(f"a sum over a union runs over layers' heads, as Σ_{{{var}∈H_1∪H_2}}; "
                             f"'{bad}' is not a layer's heads H_l", text, start + 2)
        numbers = [(layer[1] or layer[2]).lstrip("0") for layer in layers]  # compared as text: any length
        if len(set(numbers)) < len(numbers):
            raise ParseError(f"a layer appears twice in the union '{inside.strip()}': name each layer once",
                             text, start + 2)
    return Token("SUM", f"{var}∈{'∪'.join(s.replace('{', '').replace('}', '') for s in sets)}", i, close + 1)
