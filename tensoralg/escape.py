r"""One escaper for user text in every output format, and one allow-list for mathematics.

User text (a title, a name, a file name, a token string) goes through :func:`escape_text`
with the format it is written into; it can never start a command, a comment, a tag, a
link or mathematics there:

- ``"latex"``: LaTeX body text. TeX's special characters escaped; mathematical Unicode
  becomes the LaTeX it means (``≠`` → ``$\neq$``, ``σ`` → ``$\sigma$``, ``ᵀ`` →
  ``$^{\top}$``; every Greek letter, arrow and relation of :data:`UNICODE_MATH`); accented
  letters become accents (``é`` → ``\'{e}``); a character TeX cannot typeset shows as a
  visible ``[U+2603]`` — never a different symbol.
- ``"latex-math"``: a name inside mathematics (``W\_{}``-style escapes, no ``$``).
- ``"latex-comment"``: the rest of a ``%`` line; a newline cannot end the comment.
- ``"markdown"``: Markdown with HTML escaped (``<img>`` stays text).
- ``"html"``: HTML text or a quoted attribute value: ``& < > " '`` as character
  references, so no tag, entity or attribute can start; control characters shown escaped.
- ``"text"``: plain text; control characters shown escaped (``\x07``), never raw.

Whitespace runs (newlines included) become one space in every format.
:func:`check_math` is the allow-list for mathematics written into a document: only
printing commands, balanced braces, no ``$ % # & ^^``.

>>> escape_text("e_h ≠ e_k, 50%", "latex")
'e\\_h $\\neq$ e\\_k, 50\\%'
>>> escape_text("<img src=x onerror=alert(1)>", "markdown")
'&lt;img src=x onerror=alert(1)&gt;'
"""

from __future__ import annotations

import re
import unicodedata

from tensoralg.errors import TensorAlgError, UnsafeLatex

FORMATS = ("latex", "latex-math", "latex-comment", "markdown", "html", "text")


_GREEK = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
    "sigma tau upsilon phi chi psi omega"
).split()
_GREEK_UPPER = {"Γ": "Gamma", "Δ": "Delta", "Θ": "Theta", "Λ": "Lambda", "Ξ": "Xi", "Π": "Pi", "Σ": "Sigma",
                "Υ": "Upsilon", "Φ": "Phi", "Ψ": "Psi", "Ω": "Omega"}
_LATIN_LOOKING = {"Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
                  "Ο": "O", "Ρ": "P", "Τ": "T", "Χ": "X", "ο": "o"}

#: Unicode characters with a mathematical meaning, as LaTeX (math mode).
UNICODE_MATH: dict[str, str] = {
    **{unicodedata.lookup("GREEK SMALL LETTER " + {"lambda": "LAMDA"}.get(name, name.upper())): "\\" + name for name in _GREEK if name != "omicron"},
    "ς": r"\varsigma", "ϕ": r"\phi", "φ": r"\varphi", "ϵ": r"\epsilon", "ε": r"\varepsilon", "ϑ": r"\vartheta",
    **{k: "\\" + v for k, v in _GREEK_UPPER.items()},
    **{k: r"\mathrm{" + v + "}" for k, v in _LATIN_LOOKING.items()},
    # relations
    "≠": r"\neq", "≤": r"\le", "≥": r"\ge", "≈": r"\approx", "≡": r"\equiv", "∼": r"\sim", "≃": r"\simeq",
    "∝": r"\propto", "≪": r"\ll", "≫": r"\gg", "∈": r"\in", "∉": r"\notin", "⊂": r"\subset", "⊆": r"\subseteq",
    "⊃": r"\supset", "⊇": r"\supseteq", "≔": r":=", "∣": r"\mid", "⊥": r"\perp", "∥": r"\parallel",
    # arrows
    "→": r"\to", "←": r"\leftarrow", "↔": r"\leftrightarrow", "↦": r"\mapsto", "⇒": r"\Rightarrow",
    "⇐": r"\Leftarrow", "⇔": r"\Leftrightarrow", "⟶": r"\longrightarrow", "↑": r"\uparrow", "↓": r"\downarrow",
    # operators and symbols
    "⊗": r"\otimes", "⊕": r"\oplus", "⊙": r"\odot", "·": r"\cdot", "⋅": r"\cdot", "×": r"\times", "÷": r"\div",
    "∘": r"\circ", "−": "-", "±": r"\pm", "∓": r"\mp", "∑": r"\sum", "∏": r"\prod", "∫": r"\int", "√": r"\surd",
    "∞": r"\infty", "∂": r"\partial", "∇": r"\nabla", "∪": r"\cup", "∩": r"\cap", "∀": r"\forall", "∃": r"\exists",
    "¬": r"\neg", "∧": r"\wedge", "∨": r"\vee", "∅": r"\emptyset", "⋯": r"\cdots", "⋮": r"\vdots", "⋱": r"\ddots",
    "′": r"\prime", "″": r"\prime\prime", "∗": r"\ast", "⊤": r"\top", "†": r"\dagger", "‖": r"\Vert",
    "⟨": r"\langle", "⟩": r"\rangle", "ℓ": r"\ell", "ℝ": r"\mathbf{R}", "𝟙": r"\mathbf{1}", "°": r"^{\circ}",
    "ᵀ": r"^{\top}", "⁻": "^{-}", "⁺": "^{+}",
    **{ch: "^{" + str(d) + "}" for d, ch in enumerate("⁰¹²³⁴⁵⁶⁷⁸⁹")},
    **{ch: "_{" + str(d) + "}" for d, ch in enumerate("₀₁₂₃₄₅₆₇₈₉")},
}

# Text-mode typography (LaTeX body text only; other formats keep the character).
_TEXT_SYMBOLS = {
    "–": "--", "—": "---", "‘": "`", "’": "'", "“": "``", "”": "''", "…": r"\ldots{}", "•": r"\textbullet{}",
    "\u00a0": "~", "§": r"\S{}", "¶": r"\P{}", "©": r"\copyright{}", "£": r"\pounds{}", "ß": r"\ss{}",
    "æ": r"\ae{}", "Æ": r"\AE{}", "ø": r"\o{}", "Ø": r"\O{}", "å": r"\aa{}", "Å": r"\AA{}", "œ": r"\oe{}",
    "Œ": r"\OE{}", "ł": r"\l{}", "Ł": r"\L{}", "ı": r"\i{}", "¡": r"!`", "¿": r"?`",
}
_ACCENTS = {"\u0300": "`", "\u0301": "'", "\u0302": "^", "\u0303": "~", "\u0304": "=", "\u0306": "u",
            "\u0307": ".", "\u0308": '"', "\u030a": "r", "\u030b": "H", "\u030c": "v", "\u0327": "c", "\u0328": "k"}

_LATEX_TEXT = {
    "\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#", "^": r"\textasciicircum{}",
    "_": r"\_", "%": r"\%", "~": r"\textasciitilde{}", "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
}
_LATEX_MATH = {
    "\\": r"\backslash{}", "{": r"\{", "}": r"\}", "#": r"\#", "$": r"\$", "%": r"\%", "&": r"\&", "_": r"\_",
    "^": r"\hat{}", "~": r"\sim{}", " ": r"\ ",
}
_MARKDOWN = {"<": "&lt;", ">": "&gt;", "&": "&amp;", **{ch: "\\" + ch for ch in "\\`*_{}[]#|$~"}}
_SPACE = re.compile(r"[ \t\n\r\f\v\u2028\u2029\u0085]+")


def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def control_characters(text: str) -> list[str]:
    r"""The control characters of ``text`` (line breaks and tabs included), each as shown escaped.

    >>> control_characters("W\x1b[2J")
    ['\\x1b']
    """
    if text.isprintable():
        return []
    return [_shown(ch) for ch in text if _is_control(ch)]


def _shown(ch: str) -> str:
    """A control character, visibly: ``\\x07``, ``\\u200b``."""
    return ascii(ch)[1:-1]


def _code_point(ch: str) -> str:
    return f"[U+{ord(ch):04X}]"


def _latex_letter(ch: str) -> str | None:
    """An accented or transliterable letter as LaTeX text, or None."""
    if ch in _TEXT_SYMBOLS:
        return _TEXT_SYMBOLS[ch]
    base, *marks = unicodedata.normalize("NFD", ch)
    if marks and base.isascii() and all(m in _ACCENTS for m in marks):
        out = base if base not in "ij" else "\\" + base  # dotless i/j under an accent
        for m in marks:
            out = "\\" + _ACCENTS[m] + "{" + out + "}"
        return out
    plain = unicodedata.normalize("NFKC", ch)
    if plain != ch and plain.isascii() and plain.isprintable():
        return escape_text(plain, "latex")
    return None


def _latex_char(ch: str) -> str:
    if ch in _LATEX_TEXT:
        return _LATEX_TEXT[ch]
    if ch.isascii():
        return ch if ch.isprintable() else _code_point(ch)
    if ch in UNICODE_MATH:
        return "$" + UNICODE_MATH[ch] + "$"
    return _latex_letter(ch) or _code_point(ch)


def _math_char(ch: str) -> str:
    if ch in _LATEX_MATH:
        return _LATEX_MATH[ch]
    if ch.isascii():
        return ch if ch.isprintable() else "?"
    if ch in UNICODE_MATH:
        return "{" + UNICODE_MATH[ch] + "}"
    if ch.isspace():
        return "\\ "
    letter = _latex_letter(ch)
    return r"\text{" + letter + "}" if letter else "?"


def _comment_char(ch: str) -> str:
    return "?" if _is_control(ch) else ch


def _markdown_char(ch: str) -> str:
    return _MARKDOWN.get(ch) or (_shown(ch) if _is_control(ch) else ch)


_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}


def _html_char(ch: str) -> str:
    return _HTML.get(ch) or (_shown(ch) if _is_control(ch) else ch)


def _text_char(ch: str) -> str:
    return _shown(ch) if _is_control(ch) else ch


_BACKENDS = {"latex": _latex_char, "latex-math": _math_char, "latex-comment": _comment_char,
             "markdown": _markdown_char, "html": _html_char, "text": _text_char}


def escape_text(text, fmt: str = "latex") -> str:
    r"""``text`` as inert text in ``fmt`` (one of :data:`FORMATS`); whitespace runs become one space.

    >>> escape_text(r"\input{x}", "latex")
    '\\textbackslash{}input\\{x\\}'
    >>> escape_text("bell\x07", "text")
    'bell\\x07'
    >>> escape_text("title\n\\write18{rm}", "latex-comment")
    'title \\write18{rm}'
    >>> escape_text('<a href="x">Tom & Jerry</a>', "html")
    '&lt;a href=&quot;x&quot;&gt;Tom &amp; Jerry&lt;/a&gt;'
    """
    backend = _BACKENDS.get(fmt)
    if backend is None:
        raise TensorAlgError(f"unknown text format {fmt!r}; expected one of {', '.join(map(repr, FORMATS))}")
    text = str(text)
    if fmt != "latex-math":
        text = _SPACE.sub(" ", text)
    out = "".join([backend(ch) for ch in text])
    if fmt == "markdown" and out[:1] in ("-", "+", "="):
        out = "\\" + out  # no list item or heading underline at the start of a line
    elif fmt == "markdown" and re.match(r"\d+[.)]", out):
        out = re.sub(r"^(\d+)([.)])", r"\1\\\2", out)  # "1\." (CommonMark escapes the period, not the digit)
    return out


def terminal_safe(text) -> str:
    r"""``text`` (a message, a document) safe to print on a terminal: every control character
    (escape sequences, carriage returns, bells, bidirectional overrides, …) shown escaped,
    as :func:`escape_text` does; line breaks and tabs kept, so a message keeps its lines.

    >>> terminal_safe("bad \x1b[2J input\nnext line\u202e")
    'bad \\x1b[2J input\nnext line\\u202e'
    """
    return "".join([ch if ch in "\n\t" or not _is_control(ch) else _shown(ch) for ch in str(text)])


# -- the allow-list for mathematics ---------------------------------------------------------

#: Control sequences mathematics may contain: printing only, nothing that reads files,
#: writes, defines or executes.
SAFE_COMMANDS = frozenset(
    """
    otimes oplus odot cdot cdots dots ldots vdots ddots times div sum prod int in notin le ge leq geq to top
    mathrm mathbf mathit mathsf mathcal text textrm operatorname left right bigl bigr Bigl Bigr
    biggl biggr big Big frac dfrac tfrac sqrt surd quad qquad underbrace overbrace
    neq ne approx equiv sim simeq propto ll gg subset subseteq supset supseteq mid perp parallel
    leftarrow rightarrow leftrightarrow mapsto Rightarrow Leftarrow Leftrightarrow longrightarrow uparrow downarrow
    pm mp circ infty partial nabla cup cap forall exists neg wedge vee emptyset prime ast star dagger ell
    Vert vert lvert rvert langle rangle lbrace rbrace backslash bullet
    hat tilde bar widehat widetilde overline underline vec
    mathrel mathbin mathop mathord mathpunct displaystyle textstyle scriptstyle
    begin end bmatrix pmatrix matrix hphantom phantom vphantom colon ldotp cdotp
    textbackslash textasciicircum textasciitilde textless textgreater textbar textbullet
    S P copyright pounds ss ae AE o O aa AA oe OE l L i j c v u r k H
    """.split()
    + _GREEK + ["varsigma", "varphi", "varepsilon", "vartheta"] + list(_GREEK_UPPER.values())
)
SAFE_ENVIRONMENTS = frozenset({"bmatrix", "pmatrix", "matrix"})
_COMMAND = re.compile(r"\\([A-Za-z@]+|.)", re.DOTALL)
_SYMBOL_COMMANDS = frozenset(",;:! {}_#$&%|") | frozenset("'`\"=.^~")  # the last: accents in \\text


def _math_problem(latex: str) -> str | None:
    for m in _COMMAND.finditer(latex):
        name = m.group(1)
        if len(name) == 1 and not name.isalpha():
            if name not in _SYMBOL_COMMANDS:
                return f"the control symbol \\{name}"
        elif name not in SAFE_COMMANDS:
            return f"the command \\{name}"
    bare = _COMMAND.sub("", latex)
    for bad in ("%", "#", "&", "$", "^^", "\n", "\r"):
        if bad in bare:
            return f"the character {bad!r}"
    for m in re.finditer(r"\\begin\{([^}]*)\}|\\end\{([^}]*)\}", latex):
        env = m.group(1) or m.group(2)
        if env not in SAFE_ENVIRONMENTS:
            return f"the environment {env!r}"
    depth = 0
    for ch in _COMMAND.sub(lambda m: "" if len(m.group(1)) == 1 else m.group(0), latex):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            break
    return "unbalanced braces" if depth else None


def check_math(latex: str, what: str = "expression") -> str:
    r"""Return ``latex`` if it is inert mathematics; raise :class:`UnsafeLatex` if not.

    Inert: only printing commands (:data:`SAFE_COMMANDS`), balanced braces, and none of
    ``%``, ``#``, ``&``, ``$``, ``^^`` (TeX's character-code escape) or line breaks.

    >>> check_math(r"A^{h} \otimes W_{OV}^{h}")
    'A^{h} \\otimes W_{OV}^{h}'
    """
    problem = _math_problem(latex)
    if problem:
        raise UnsafeLatex(
            f"refusing to print the {what} {latex!r}: it contains {problem}; names of atoms and "
            "indices must be letters, digits and underscores"
        )
    return latex


#: What mathematics may not carry into Markdown as such: ``<`` and ``>`` would start raw
#: HTML (a tag, an autolink), ``[`` and ``]`` a link; KaTeX and MathJax read the commands.
# The printer's text-mode LaTeX for letters and typography (``\'{e}``, ``\ss{}``, ``--``) read back as the
# characters it sets, for a reader that knows no text-mode commands (latex2mathml): longest first.
_TEXT_BACK = sorted(((latex, ch) for ch, latex in _TEXT_SYMBOLS.items() if ch != "\u00a0"), key=lambda kv: -len(kv[0]))
_ACCENT_BACK = {command: mark for mark, command in _ACCENTS.items()}
_ACCENTED = re.compile(r"\\([`'^~=u.\"rHvck])\{(\\[ij](?:\{\})?|[A-Za-z\u0080-\U0010ffff])\}")


def _unescape_text(body: str) -> str:
    for _ in range(4):  # accents nest (``\'{\^{e}}``): innermost first
        body, n = _ACCENTED.subn(lambda m: unicodedata.normalize(
            "NFC", {"\\i": "\u0131", "\\j": "\u0237"}.get(m.group(2)[:2], m.group(2)) + _ACCENT_BACK[m.group(1)]), body)
        if not n:
            break
    for latex, ch in _TEXT_BACK:
        body = body.replace(latex, ch)
    return body


def text_as_unicode(latex: str) -> str:
    r"""``latex`` with the body of every ``\text{…}`` read back into the characters it sets: accented letters,
    ``\ss{}``, ``\ldots{}``, ``--`` and the rest that :func:`escape_text` writes for names outside ASCII.

    >>> text_as_unicode(r"A^{\mathrm{\text{\`{A}\ss{}--x}}}")
    'A^{\\mathrm{\\text{Àß–x}}}'
    """
    out, i = [], 0
    while (start := latex.find("\\text{", i)) >= 0:
        j, depth = start + len("\\text{"), 1
        while j < len(latex) and depth:
            depth += {"{": 1, "}": -1}.get(latex[j], 0) if latex[j - 1] != "\\" else 0
            j += 1
        body_start = start + len("\\text{")
        out += [latex[i:body_start], _unescape_text(latex[body_start:j - 1]), latex[j - 1:j]]
        i = j
    return "".join(out) + latex[i:]


_MARKDOWN_MATH = {"<": r"\lt ", ">": r"\gt ", "[": r"\lbrack ", "]": r"\rbrack "}


def markdown_math(latex: str) -> str:
    r"""Mathematics for Markdown's ``$…$`` and ``$$…$$``: the same LaTeX, with the characters
    that Markdown would read as HTML or a link written as commands.

    Inside ``\text{…}`` MathJax and KaTeX print a command as it is written, so there the
    command steps out of the text and back in (``\text{}\lbrack\text{direct}``).

    >>> markdown_math(r"A^{\mathrm{<img\ src=x>}}")
    'A^{\\mathrm{\\lt img\\ src=x\\gt }}'
    >>> markdown_math(r"X \text{[direct path]}")
    'X \\text{}\\lbrack \\text{direct path}\\rbrack \\text{}'
    """
    return _as_commands(latex, _MARKDOWN_MATH)


#: What mathematics may not carry into HTML as such (a notebook that inserts ``text/latex`` as HTML).
_HTML_MATH = {"<": r"\lt ", ">": r"\gt "}


def html_safe_math(latex: str) -> str:
    r"""Mathematics that a notebook may insert as HTML (classic Jupyter shows ``text/latex`` so): the
    same LaTeX, with ``<`` and ``>`` written as commands, so no name can open a tag.

    >>> html_safe_math(r"A^{\mathrm{<img\ src=x>}} \text{[ok]}")
    'A^{\\mathrm{\\lt img\\ src=x\\gt }} \\text{[ok]}'
    """
    return _as_commands(latex, _HTML_MATH)


def _as_commands(latex: str, commands: dict) -> str:
    """``latex`` with the characters of ``commands`` replaced by theirs (stepping out of ``\text{…}``)."""
    out, text_depth, depth, i = [], None, 0, 0
    while i < len(latex):
        if text_depth is None and latex.startswith("\\text{", i):
            out.append("\\text{")
            depth += 1
            text_depth, i = depth, i + len("\\text{")
            continue
        ch = latex[i]
        if ch == "\\" and i + 1 < len(latex):  # a command or an escaped character passes whole
            out.append(latex[i:i + 2])
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            if depth == text_depth:
                text_depth = None
            depth -= 1
        command = commands.get(ch)
        out.append(ch if command is None else "}" + command + "\\text{" if text_depth is not None else command)
        i += 1
    return "".join(out)
