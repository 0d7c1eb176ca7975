"""Exercises in the tutorials: an answer checked with the tool, and what is wrong with a hint.

A tutorial leaves each answer blank (``None``) for the student; the cell after it calls
:func:`check_expression` (an expression, decided by :func:`tensoralg.check`) or
:func:`check_value` (a number, a string, an array) and shows the :class:`Feedback`: not
answered yet, right, or what differs — the terms of ``answer - expected`` for an expression —
with the hint. The solutions notebooks assert ``feedback.ok``.

A check never shows the answer: what is wrong is said in the student's own terms (which of
them are not in the answer, how many are missing), and a value is compared with its digest
(:func:`answer_digest`, :func:`check_digest`), so that the cell does not hold the answer. An
exercise that asks for a form (``"expanded"``: a sum of tensor products; ``"transposes on
atoms"``: ``ᵀ`` only right after a name) refuses an equal expression in another form, such as
the question pasted back.

>>> check_expression(None, "A ⊗ B", hint="one term").ok is None
True
>>> f = check_expression("A ⊗ B + C ⊗ D", "A ⊗ B", hint="only the first term")
>>> f.ok, f.message
(False, 'Not yet: this term of yours is not in the answer (or not with this coefficient): C ⊗ D. Hint: only the first term')
>>> check_expression("0", "A ⊗ B + C ⊗ D").message  # the answer is never shown
'Not yet: 2 terms of the answer are missing. Hint: '
>>> check_expression("(A ⊗ B)(C ⊗ D)", "(A ⊗ B)(C ⊗ D)", form="expanded").ok  # the question pasted back
False
>>> check_value(6, 6, hint="count them").ok
True
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from tensoralg import TensorSum, check, parse
from tensoralg.errors import TCircuitsError
from tensoralg.escape import escape_text


@dataclass(frozen=True)
class Feedback:
    """``ok``: ``True`` (right), ``False`` (wrong: ``message`` says what differs and hints) or
    ``None`` (not answered yet)."""

    ok: bool | None
    message: str

    def __str__(self) -> str:
        return self.message

    def _repr_markdown_(self) -> str:
        mark = {True: "✓", False: "✗", None: "…"}[self.ok]
        return f"**{mark}** {escape_text(self.message, 'markdown')}"


def _blank(answer) -> bool:
    return answer is None or (isinstance(answer, str) and not answer.strip())


#: The forms an exercise may ask for, each with what an answer in another form is told.
FORMS = {
    "expanded": "multiply it out: write a sum of tensor products of words, with no product of brackets left",
    "transposes on atoms": "move every transpose onto a single name (Xᵀ), none after a bracket",
}
_TRANSPOSED_BRACKET = re.compile(r"\)\s*(ᵀ|\^\s*\{?\s*(T|⊤|\\top)\s*\}?)")


def form_problem(answer: str, form: str | None, atoms: dict | None = None) -> str:
    """What keeps ``answer`` from the asked ``form`` (a key of :data:`FORMS`), or ``""``.

    >>> form_problem("(A ⊗ B)(C ⊗ D)", "expanded")[:13], form_problem("A C ⊗ B D", "expanded")
    ('multiply it o', '')
    >>> form_problem("(A ⊗ B)ᵀ", "transposes on atoms")[:12], form_problem("Aᵀ ⊗ Bᵀ", "transposes on atoms")
    ('move every t', '')
    """
    if form is None:
        return ""
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; expected one of {', '.join(map(repr, FORMS))}")
    if form == "transposes on atoms":
        return FORMS[form] if _TRANSPOSED_BRACKET.search(answer) else ""
    parsed = parse(answer, atoms=atoms)
    return "" if isinstance(parsed, TensorSum) and parsed == parsed.expand() else FORMS[form]


def _unlike(answer: str, difference: TensorSum, atoms: dict | None) -> str:
    """What differs, in the student's terms only: which of their terms are not in the answer, how
    many of the answer's are missing (``answer - expected`` would show the expected answer)."""
    mine = {t.words for t in parse(answer, atoms=atoms).expand().terms}
    wrong = [t for t in difference.terms if t.words in mine]
    missing = len(difference.terms) - len(wrong)
    parts = []
    if wrong:
        parts.append(f"{'this term' if len(wrong) == 1 else 'these terms'} of yours "
                     f"{'is' if len(wrong) == 1 else 'are'} not in the answer (or not with this coefficient): "
                     f"{TensorSum(wrong)}")
    if missing:
        parts.append(f"{missing} term{'s' if missing != 1 else ''} of the answer {'is' if missing == 1 else 'are'} missing")
    return "; ".join(parts)


def check_expression(answer, expected: str, hint: str = "", atoms: dict | None = None, form: str | None = None) -> Feedback:
    """Is the expression ``answer`` (text in the tool's notation) equal to ``expected``, and in the
    asked ``form`` (see :data:`FORMS`)? ``expected`` may be the question itself: it is never shown."""
    if _blank(answer):
        return Feedback(None, f"Not answered yet: write your answer as text in the tool's notation. Hint: {hint}")
    if not isinstance(answer, str):
        return Feedback(False, f"Write the answer as text, e.g. \"A ⊗ B\", not a {type(answer).__name__}. Hint: {hint}")
    try:
        result = check(answer, expected, atoms=atoms)
        problem = form_problem(answer, form, atoms) if result.holds else _unlike(answer, result.difference, atoms)
    except TCircuitsError as error:
        first = str(error).splitlines()[0]
        return Feedback(False, f"The tool cannot read or compare your answer: {first}. Hint: {hint}")
    if result.holds and not problem:
        return Feedback(True, f"Right: {answer}.")
    if result.holds:
        return Feedback(False, f"Equal, but not in the asked form: {problem}. Hint: {hint}")
    return Feedback(False, f"Not yet: {problem}. Hint: {hint}")


def answer_digest(answer, decimals: int | None = None) -> str:
    """A digest of ``answer``'s canonical text (a string stripped; numbers and arrays as floats,
    rounded to ``decimals`` when given): what :func:`check_digest` compares.

    >>> answer_digest(6) == answer_digest(6.0) != answer_digest(7)
    True
    >>> answer_digest(" K ") == answer_digest("K")
    True
    """
    if isinstance(answer, str):
        text = "str:" + answer.strip()
    else:
        a = np.asarray(answer, dtype=float)
        if decimals is not None:
            a = np.round(a, decimals) + 0.0  # no -0.0
        text = f"array{a.shape}:" + ",".join(repr(float(x)) for x in a.flatten())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_digest(answer, digest: str, hint: str = "", decimals: int | None = None) -> Feedback:
    """Is ``answer`` the answer whose :func:`answer_digest` is ``digest``? The check holds no answer.

    >>> check_digest(6, answer_digest(6)).ok, check_digest(5, answer_digest(6)).ok
    (True, False)
    """
    return _compared(answer, lambda: answer_digest(answer, decimals) == digest, hint)


def check_value(answer, expected, hint: str = "", tol: float = 1e-6) -> Feedback:
    """Is ``answer`` (a number, a string or an array) ``expected`` (numbers to ``tol``)?"""
    def same() -> bool:
        if isinstance(expected, str) or isinstance(answer, str):
            return str(answer).strip() == str(expected)
        a, e = np.asarray(answer, dtype=float), np.asarray(expected, dtype=float)
        return a.shape == e.shape and bool(np.allclose(a, e, atol=tol, rtol=tol))

    return _compared(answer, same, hint)


def _compared(answer, right, hint: str) -> Feedback:
    """The feedback on a value: not answered, right (``right()``; an answer it cannot read is wrong) or what was written."""
    if _blank(answer):
        return Feedback(None, f"Not answered yet. Hint: {hint}")
    try:
        ok = right()
    except (TypeError, ValueError):
        ok = False
    if ok:
        return Feedback(True, "Right.")
    shown = np.array2string(np.asarray(answer), max_line_width=200) if not isinstance(answer, str) else repr(answer)
    return Feedback(False, f"Not yet: you wrote {shown}. Hint: {hint}")


__all__ = ["FORMS", "Feedback", "answer_digest", "check_digest", "check_expression", "check_value", "form_problem"]
