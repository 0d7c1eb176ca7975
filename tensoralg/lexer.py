"""Tokens of the expression language read by :mod:`tensoralg.parse`.

Each token keeps its 0-based position, so that every error can point at the text.
Superscripts: ``^T`` and ``ᵀ`` transpose; ``^{h1}`` and a bare ``^h1`` (letters and digits,
no braces needed for one symbol) are an index. An indexed sum ``Σ_{h∈H_1}`` (ASCII
``sum_{h in H_1}``) is one ``SUM`` token whose text is the bound index and the set.

>>> [(t.kind, t.text) for t in tokenize("Σ_{h∈H_1} A^h ⊗ W_OV^{h}ᵀ")]  # doctest: +NORMALIZE_WHITESPACE
[('SUM', 'h∈H_1'), ('NAME', 'A'), ('INDEX', 'h'), ('OTIMES', '⊗'), ('NAME', 'W_OV'), ('INDEX', 'h'),
 ('T', 'ᵀ'), ('END', '')]
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tensoralg.errors import ParseError


class Token(NamedTuple):
    kind: str  # NUM NAME INDEX SUM T OTIMES TIMES DIV POW PLUS MINUS LPAREN RPAREN END
    text: str  # for INDEX the index itself; for SUM "var∈set"
    pos: int
    end: int = -1


SIMPLE = {
    "⊗": "OTIMES", "·": "TIMES", "⋅": "TIMES", "*": "TIMES", "/": "DIV", "+": "PLUS",
    "-": "MINUS", "−": "MINUS", "(": "LPAREN", ")": "RPAREN", "ᵀ": "T",
}
NUMBER = re.compile(r"(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", re.ASCII)
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
OTIMES_ASCII = re.compile(r"\(\s*x\s*\)")
BARE_INDEX = re.compile(r"[A-Za-z0-9]+")
SUM_START = re.compile(r"(Σ|∑|sum(?![A-Za-z0-9]))")
SUM_BODY = re.compile(r"\s*([A-Za-z][A-Za-z0-9]*)\s*(?:∈|\s+in\s+)\s*([A-Za-z][A-Za-z0-9]*(?:_(?:\{[A-Za-z0-9]+\}|[A-Za-z0-9]+))?)\s*")
SUM_HINT = "an indexed sum is written Σ_{h∈H_1} or sum_{h in H_1}"
MAX_DIGITS = 100  # digits in one number literal
MAX_EXPONENT = 300  # |e| in a literal such as 1e-300 (as a float's range)


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens; raise :class:`ParseError` at the first bad character."""
    tokens: list[Token] = []
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
        elif m := SUM_START.match(text, i):
            token = indexed_sum(text, i, m.end())
        elif m := NUMBER.match(text, i):
            token = number(text, m)
        elif m := NAME.match(text, i):
            token = Token("NAME", m.group(), i, m.end())
        else:
            raise ParseError(f"unexpected character {ch!r}", text, i)
        tokens.append(token)
        i = token.end
    tokens.append(Token("END", "", n, n))
    return tokens


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
    if nxt == "{":
        close = text.find("}", i + 2)
        opening = text.find("{", i + 2)
        if close < 0:
            raise ParseError("unclosed index: '^{' without '}'", text, i)
        if 0 <= opening < close:
            raise ParseError("an index may not contain '{'", text, opening)
        index = text[i + 2 : close]
        if not index.strip():
            raise ParseError("empty index '^{}'", text, i)
        unprintable = next((k for k, ch in enumerate(index) if not ch.isprintable()), None)
        if unprintable is not None:  # a control character would reach the terminal and the documents
            raise ParseError(f"an index holds printable characters only, not {index[unprintable]!r}",
                             text, i + 2 + unprintable)
        return Token("INDEX", index, i, close + 1)
    m = BARE_INDEX.match(text, i + 1)
    if m is None:
        raise ParseError("after '^' expected an index ('^h', '^{h1}') or 'T' (transpose)", text, i + 1)
    if m.group() == "T":
        return Token("T", "^T", i, m.end())
    return Token("INDEX", m.group(), i, m.end())


def indexed_sum(text: str, i: int, start: int) -> Token:
    """``Σ_{h∈H_1}`` / ``sum_{h in H_1}`` from ``text[i]``; ``start`` is just after Σ/sum."""
    if text[start : start + 2] != "_{":
        raise ParseError(f"expected '_{{' after {text[i:start]!r}: {SUM_HINT}", text, start)
    close = text.find("}", start + 2)
    inner = text.find("{", start + 2)
    if 0 <= inner < close:  # H_{1} inside: the closing brace is the second one
        close = text.find("}", close + 1)
    if close < 0:
        raise ParseError(f"unclosed '{text[i:start]}_{{': {SUM_HINT}", text, i)
    m = SUM_BODY.fullmatch(text, start + 2, close)
    if m is None:
        raise ParseError(f"cannot read the range of the sum: {SUM_HINT}", text, start + 2)
    return Token("SUM", f"{m[1]}∈{m[2].replace('{', '').replace('}', '')}", i, close + 1)
