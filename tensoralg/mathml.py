r"""The printer's LaTeX as MathML: what a web page and a notebook's ``_repr_html_`` show.

``latex2mathml`` converts each line (pure Python, no Node.js; it covers every construct the
printer emits: ``\left( \right)``, ``\Bigl(``, ``\underbrace``, ``bmatrix``, ``\sum_{…}``,
``\frac``, ``\sqrt``, ``\mathrm``, ``\top``, ``\otimes``). Its serialiser writes the text of
``\text{…}`` unescaped, so :func:`to_mathml` serialises the element tree itself: nothing in
mathematics can become a tag.

>>> print(to_mathml(r"A^{h} \otimes W_{OV}^{h}"))  # doctest: +ELLIPSIS
<math display="inline"><mrow><msup><mi>A</mi><mrow><mi>h</mi></mrow></msup><mo lspace="0.2222em" rspace="0.2222em">&#8855;</mo>...</math>
"""

from __future__ import annotations

import re
from xml.etree.ElementTree import Element

from latex2mathml.converter import convert_to_element

from tensoralg.errors import MathMLError
from tensoralg.escape import check_math, escape_text, text_as_unicode

_COMMAND_LEFT = re.compile(r"\\[A-Za-z]+|\\.")
#: ``:=`` (as a relation) outside ``\text{…}``, which is left as it is.
_COLON_EQUALS = re.compile(r"(\\text\{[^{}]*\})|:\s*=")
_ENTITY = re.compile(r"&#x([0-9A-Fa-f]+);|&#(\d+);")


def _plain(text: str | None) -> str | None:
    """latex2mathml's text, its numeric character references decoded (serialising escapes)."""
    if text is None:
        return None
    return _ENTITY.sub(lambda m: chr(int(m.group(1), 16) if m.group(1) else int(m.group(2))), text)


#: Binary operators that browsers' operator dictionaries space too tightly (⊗ ⊕ ⊙), given
#: the medium space TeX puts round a binary operator.
_BINARY = frozenset("\u2297\u2295\u2299")


def _serialise(element: Element, out: list[str]) -> None:
    text = _plain(element.text)
    attrib = dict(element.attrib)
    if element.tag == "mo" and text in _BINARY:
        attrib.setdefault("lspace", "0.2222em")
        attrib.setdefault("rspace", "0.2222em")
    elif element.tag == "mo" and attrib.get("fence") == "true":  # \left( hugs its contents as in TeX
        attrib.setdefault("lspace", "0em")
        attrib.setdefault("rspace", "0em")
    attrs = "".join(f' {k}="{escape_text(v, "html")}"' for k, v in attrib.items() if k != "xmlns")
    if not len(element) and not text:
        out.append(f"<{element.tag}{attrs}/>" if element.tag in ("mspace",) else f"<{element.tag}{attrs}></{element.tag}>")
    else:
        out.append(f"<{element.tag}{attrs}>")
        out.append(_escape_math_text(text or ""))
        for child in element:
            _serialise(child, out)
        out.append(f"</{element.tag}>")
    if element.tail:
        out.append(_escape_math_text(_plain(element.tail)))


#: TeX's operator names (``\\log``, ``\\exp`` …), which latex2mathml writes as a plain ``<mi>``.
_FUNCTION_NAMES = frozenset("log ln exp sin cos tan det max min sup inf lim dim ker deg arg gcd Pr".split())


def _space_after_function_names(element: Element) -> None:
    """A thin space after an operator name followed by anything but an operator, as TeX sets
    ``\\log x``: browsers ran ``<mi>log</mi>`` into the next name (``logsoftmax``, ``logd_vocab``)."""
    for parent in element.iter():
        children = list(parent)
        for i, child in reversed(list(enumerate(children[:-1]))):
            if child.tag == "mi" and _plain(child.text) in _FUNCTION_NAMES and children[i + 1].tag != "mo":
                space = Element("mspace", {"width": "0.1667em"})
                space.tail, child.tail = child.tail, None
                parent.insert(i + 1, space)


def _escape_math_text(text: str) -> str:
    # character references for markup and for anything outside ASCII, so the page's bytes stay plain
    return "".join(f"&#{ord(ch)};" if ch in "&<>\"'" or ord(ch) > 126 else ch for ch in text)


def to_mathml(latex: str, display: str = "inline", check: bool = True) -> str:
    r"""The printer's LaTeX as a ``<math>`` element (checked by :func:`check_math` first).

    ``display`` is ``"inline"`` or ``"block"``; ``check=False`` skips the allow-list, for a
    hand-written formula (a ``bmatrix`` has ``&`` and ``\\``) — the output stays safe either
    way, since the serialiser escapes all text. Raises :class:`~tensoralg.errors.UnsafeLatex`
    for LaTeX that could do more than print, :class:`MathMLError` when latex2mathml fails.

    >>> to_mathml(r"\text{<b>}")
    '<math display="inline"><mrow><mtext>&#60;b&#62;</mtext></mrow></math>'
    """
    if display not in ("inline", "block"):
        raise MathMLError(f"display must be 'inline' or 'block', got {display!r}")
    if check:
        check_math(latex)
    latex = text_as_unicode(latex)  # a name's accented letters as letters: latex2mathml reads no text-mode accents
    try:  # ":=" as one relation (≔): latex2mathml reads it as ":" then "=", which browsers set as ": ="
        element = convert_to_element(_COLON_EQUALS.sub(lambda m: m.group(1) or r"\coloneqq ", latex), display=display)
    except Exception as error:  # latex2mathml raises its own and plain Python errors
        raise MathMLError(f"cannot convert {latex!r} to MathML: {type(error).__name__}: {error}") from None
    if display == "block":  # limits under Σ inside \left( … \right) too, as TeX sets them in display
        for sub in element.iter("msub"):
            if len(sub) and sub[0].tag == "mo" and _plain(sub[0].text) in ("\u2211", "\u220f"):
                sub.tag = "munder"
    _space_after_function_names(element)
    left = [m.group(0) for e in element.iter() for m in _COMMAND_LEFT.finditer(e.text or "")]
    if left:
        raise MathMLError(f"cannot convert {latex!r} to MathML: latex2mathml does not know {', '.join(left)}")
    out: list[str] = []
    _serialise(element, out)
    return "".join(out)
