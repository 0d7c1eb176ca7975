"""Counting the ATen operations a call dispatches: a machine-independent measure of its overhead.

On a GPU each operation is at least one kernel launch of several microseconds, so a verification
that dispatches many small operations is slow however little work each does. :class:`OpCount`
counts every operation dispatched below autograd (views and copies included) while it is active;
the benchmark prints the count of :func:`~numeric_check.verification.verify.verify_logits` beside
TransformerLens's ``run_with_cache``, and a test pins it.

>>> with OpCount() as ops:
...     _ = torch.ones(3).add(1).sum()
>>> ops.n
3
"""

from __future__ import annotations

from collections import Counter

import torch  # noqa: F401 - the doctest uses it
from torch.utils._python_dispatch import TorchDispatchMode


class OpCount(TorchDispatchMode):
    """Counts the ATen operations dispatched while active: ``n`` in all, ``by_op`` by operation name."""

    def __init__(self):
        super().__init__()
        self.n = 0
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        self.by_op[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn) -> tuple[object, int]:
    """``(fn(), the number of ATen operations it dispatched)``."""
    with OpCount() as ops:
        result = fn()
    return result, ops.n
