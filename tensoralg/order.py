"""The truncation order of an expansion: how many attention (or other) factors a term holds.

Every expansion that can stop early takes ``max_order``: ``None`` keeps every term, an
integer ``n >= 0`` keeps the terms of order at most ``n``. :func:`check_order` is the one
check of that argument, shared by the algebra, the derivations and the numeric checks.
"""

from __future__ import annotations

import numbers

from tensoralg.errors import InvalidOrder

def check_order(max_order, largest: int | None = None, what: str = "the expansion") -> None:
    """The one check of a truncation order: ``max_order`` is ``None`` (every term) or an
    integer ``>= 0`` — at most ``largest`` when given, the order of the deepest term of
    ``what``. Raises :class:`InvalidOrder` saying what was given and what is allowed.

    >>> check_order(2), check_order(None, 3)
    (None, None)
    >>> check_order(3, 2, "the logits of a 2-layer model")
    Traceback (most recent call last):
    ...
    tensoralg.errors.InvalidOrder: max_order must be None (every term) or an integer in 0..2 (the deepest term of the logits of a 2-layer model has order 2), got 3
    """
    if max_order is None:
        return
    integer = isinstance(max_order, numbers.Integral) and not isinstance(max_order, bool)
    if integer and max_order >= 0 and (largest is None or max_order <= largest):
        return
    allowed = ">= 0" if largest is None else f"in 0..{largest} (the deepest term of {what} has order {largest})"
    raise InvalidOrder(f"max_order must be None (every term) or an integer {allowed}, got {max_order!r}")
