"""The registry of catalogue entries, the checks of their parameters, and the size limit of a document."""

from __future__ import annotations

import difflib
import inspect
import math
from itertools import accumulate
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tensoralg import Product

from derivations.derivation import Derivation
from derivations.errors import DerivationError, TooManyTerms, UnknownDerivation

# The most terms one chain may hold before a document becomes unreadable.
DOCUMENT_LIMIT = 5000


# -- the registry -----------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """A catalogue entry: ``build(**params)`` makes the derivation; ``params`` maps each
    parameter it takes to its default."""

    name: str
    description: str
    build: Callable[..., Derivation]
    params: dict


ENTRIES: dict[str, Entry] = {}


def entry(name: str, description: str):
    """Register ``build`` under ``name``; its keyword arguments are the parameters."""

    def register(build):
        params = {p.name: p.default for p in inspect.signature(build).parameters.values()}
        ENTRIES[name] = Entry(name, description, build, params)
        return build

    return register


def names() -> list[str]:
    """The names of every derivation in the catalogue, in the paper's order."""
    return list(ENTRIES)


def descriptions() -> dict[str, str]:
    """``{name: one-line description}`` for every entry."""
    return {e.name: e.description for e in ENTRIES.values()}


def lookup(name: str) -> Entry:
    """The entry called ``name``; :class:`UnknownDerivation` lists the known ones and close matches."""
    if name in ENTRIES:
        return ENTRIES[name]
    close = difflib.get_close_matches(str(name), list(ENTRIES), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise UnknownDerivation(f"unknown derivation {name!r}{hint} Known: {', '.join(ENTRIES)}")


def get(name: str, **params) -> Derivation:
    """Build the derivation ``name`` with ``params`` (see :func:`lookup(name).params`).

    >>> get("two-layer-logits", heads=2, concrete=True).chains[0].last.n_slots
    2
    """
    e = lookup(name)
    unknown = sorted(set(params) - set(e.params))
    if unknown:
        takes = ", ".join(e.params) or "no parameters"
        raise DerivationError(f"derivation {name!r} does not take {', '.join(unknown)}; it takes: {takes}")
    return e.build(**params)


# -- parameters and atoms ---------------------------------------------------------------


def check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise DerivationError(f"{name} must be True or False, got {value!r}")
    return value


def check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DerivationError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_size(what: str, expr, max_order: int | None) -> None:
    """Refuse chains above :data:`DOCUMENT_LIMIT` terms, suggesting a ``max_order`` that fits."""
    if not isinstance(expr, Product):
        return
    exact = expr.order_counts(max_order)  # one pass, Python ints, nothing built
    total = sum(exact)
    if total > DOCUMENT_LIMIT:
        too_many(what, total, list(accumulate(exact)))


def check_terms(what: str, total: int, fix: str) -> None:
    """Refuse a derivation of ``total`` terms, counted before anything is built, above
    :data:`DOCUMENT_LIMIT`; ``fix`` says what to pass instead.

    >>> check_terms("multi-head with 3 heads", 9, "use fewer heads")
    """
    if total > DOCUMENT_LIMIT:
        raise TooManyTerms(f"{what} has {total:,} terms, more than a document holds ({DOCUMENT_LIMIT:,}); {fix}")


def check_power_terms(what: str, base: int, exponent: int, fix: str) -> None:
    """:func:`check_terms` for ``base ** exponent`` terms, never computing a huge power
    (``2**10_000_000`` is refused as such, in no time).

    >>> check_power_terms("virtual weights over 3 layers", 2, 3, "use fewer layers")
    """
    if base > 1 and exponent * math.log2(base) > 64:
        raise TooManyTerms(f"{what} has {base}^{exponent:,} terms, more than a document holds ({DOCUMENT_LIMIT:,}); {fix}")
    check_terms(what, base**exponent, fix)


def too_many(what: str, total: int, cumulative: list[int], smaller: str = "use fewer layers or heads") -> None:
    """Raise :class:`TooManyTerms`; ``cumulative[k]``: how many terms ``max_order=k`` keeps;
    ``smaller``: how else to ask for less (an expression typed by hand has no layers to drop)."""
    fits = [k for k, n in enumerate(cumulative) if n <= DOCUMENT_LIMIT]
    hint = (f"pass max_order={fits[-1]} (--max-order {fits[-1]}: {cumulative[fits[-1]]:,} terms) or {smaller}"
            if fits else smaller)
    raise TooManyTerms(f"{what} has {total:,} terms, more than a document holds ({DOCUMENT_LIMIT:,}); {hint}")
