"""Exercises in the tutorials: an answer checked with the tool, and what is wrong with a hint.

A tutorial leaves each answer blank (``None``) for the student; the cell after it calls
:func:`check_expression` (an expression, decided by :func:`tensoralg.check`) or
:func:`check_value` (a number, a string, an array) and shows the :class:`Feedback`: not
answered yet, right, or what differs — the terms of ``answer - expected`` for an expression —
with the hint. The solutions notebooks assert ``feedback.ok``.

>>> check_expression(None, "A ⊗ B", hint="one term").ok is None
True
>>> f = check_expression("A ⊗ B + C ⊗ D", "A ⊗ B", hint="only the first term")
>>> f.ok, f.message
(False, 'Not yet: your answer - the expected = C ⊗ D. Hint: only the first term')
>>> check_value(6, 6, hint="count them").ok
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensoralg import check
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


def check_expression(answer, expected: str, hint: str = "", atoms: dict | None = None) -> Feedback:
    """Is the expression ``answer`` (text in the tool's notation) equal to ``expected``?"""
    if _blank(answer):
        return Feedback(None, f"Not answered yet: write your answer as text in the tool's notation. Hint: {hint}")
    if not isinstance(answer, str):
        return Feedback(False, f"Write the answer as text, e.g. \"A ⊗ B\", not a {type(answer).__name__}. Hint: {hint}")
    try:
        result = check(answer, expected, atoms=atoms)
    except TCircuitsError as error:
        first = str(error).splitlines()[0]
        return Feedback(False, f"The tool cannot read or compare your answer: {first}. Hint: {hint}")
    if result.holds:
        return Feedback(True, f"Right: {answer} = {expected}.")
    return Feedback(False, f"Not yet: your answer - the expected = {result.difference}. Hint: {hint}")


def check_value(answer, expected, hint: str = "", tol: float = 1e-6) -> Feedback:
    """Is ``answer`` (a number, a string or an array) ``expected`` (numbers to ``tol``)?"""
    if _blank(answer):
        return Feedback(None, f"Not answered yet. Hint: {hint}")
    try:
        if isinstance(expected, str) or isinstance(answer, str):
            right = str(answer).strip() == str(expected)
        else:
            a, e = np.asarray(answer, dtype=float), np.asarray(expected, dtype=float)
            right = a.shape == e.shape and bool(np.allclose(a, e, atol=tol, rtol=tol))
    except (TypeError, ValueError):
        right = False
    if right:
        return Feedback(True, "Right.")
    shown = np.array2string(np.asarray(answer), max_line_width=200) if not isinstance(answer, str) else repr(answer)
    return Feedback(False, f"Not yet: you wrote {shown}. Hint: {hint}")


__all__ = ["Feedback", "check_expression", "check_value"]
