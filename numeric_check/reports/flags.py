"""Flag types and checks shared by ``tcircuits``' numeric commands (verify, analyze and
train-toy in :mod:`numeric_check.cli`, and the demo, which lives with the reports it
prints): argparse refuses a bad value in one line before any work starts, and a size that
would not fit in memory is refused with the largest that does.

>>> int_in(1, 10)("3")
3
>>> seed("18446744073709551616")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected an integer in 0..9223372036854775807, got '18446744073709551616'
"""

from __future__ import annotations

import argparse
import math
import os

from numeric_check.errors import NumericCheckError

MAX_SEED = 2**63 - 1  # torch and numpy seeds fit in a signed 64-bit int
MAX_BATCH_BYTES = 2 * 2**30  # the logits of one evaluation batch (float32) stay under 2 GiB


def int_in(low: int, high: int | None = None):
    """An argparse ``type``: an integer in ``low..high`` (no upper bound when ``high`` is None).

    >>> int_in(0)("-1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected an integer >= 0, got '-1'
    """
    expected = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"

    def parse(text: str) -> int:
        try:
            value = int(text) if len(text) <= 40 else None
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    parse.__name__ = expected  # argparse names the type in its messages
    return parse


def finite_float(text: str) -> float:
    """An argparse ``type``: a finite number >= 0 (a tolerance, a learning rate)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


seed = int_in(0, MAX_SEED)


def cpu_count() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads(text: str) -> int:
    """An argparse ``type``: torch CPU threads, 1 up to the CPUs this process may use (far
    more threads than CPUs only slows the work down, and libgomp aborts at 100,000)."""
    return int_in(1, cpu_count())(text)


threads.__name__ = "a number of threads"


def check_batch(flag: str, n_sequences: int, n_ctx: int, d_vocab: int) -> None:
    """Refuse ``n_sequences`` sequences of ``n_ctx`` tokens whose float32 logits over
    ``d_vocab`` tokens would pass :data:`MAX_BATCH_BYTES`, naming the most that fit."""
    per_sequence = 4 * n_ctx * d_vocab
    if n_sequences * per_sequence > MAX_BATCH_BYTES:
        fits = MAX_BATCH_BYTES // per_sequence
        advice = f"use {flag} {fits:,} or fewer" if fits else "even one sequence does not fit; use a shorter context or a smaller vocabulary"
        raise NumericCheckError(
            f"{flag} {n_sequences:,} would need {n_sequences * per_sequence / 2**30:,.1f} GiB for the logits alone "
            f"({n_ctx:,} positions × {d_vocab:,} tokens each); {advice}"
        )
