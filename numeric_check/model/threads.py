"""Where and how the numeric work runs: CPU threads that hold on a busy machine.

The device is decided once, at the edge (:func:`~numeric_check.model.config.resolve_device`:
a command's ``--device``, a ``device=`` argument); everything inside follows its input. Threads
follow one policy, :func:`default_threads`, which every numeric command applies
(``--threads N`` overrides it):

- a model narrower than :data:`WIDE` (``d_model``) runs on **one thread**: its products are too
  small for a team of threads to pay for itself, and one thread cannot collapse when other
  processes hold the cores (torch's default did, 7x, on a busy 2-core machine);
- a wider model gets the cores that are **idle** (usable cores less the 1-minute load average,
  at least one), so it never waits on threads that another process has preempted;
- threads that wait **sleep instead of spinning** (``OMP_WAIT_POLICY=PASSIVE``, set by the command
  line before torch starts, unless you set it yourself).

On a laptop or a quiet server a wide model gets every core; on a busy server it gets the idle
ones; on a GPU machine the arithmetic is the GPU's and the CPU threads only feed it.

>>> default_threads(width=64)
1
>>> default_threads(width=4096) >= 1
True
"""

from __future__ import annotations

import os

import torch

from numeric_check.errors import DeviceError

#: ``d_model`` from which a model's products are wide enough to share among threads
WIDE = 1024


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def idle_cores() -> int:
    """Usable cores less the 1-minute load average (rounded), at least 1."""
    cores = usable_cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this system: assume quiet
        load = 0.0
    return max(1, min(cores, cores - int(load + 0.5)))


def default_threads(width: int | None = None) -> int:
    """The number of CPU threads for work on a model ``width`` wide (``d_model``; ``None``: not yet known):
    1 below :data:`WIDE`, else :func:`idle_cores`."""
    if width is not None and width < WIDE:
        return 1
    return idle_cores()


def use_threads(threads: int | None = None, width: int | None = None) -> int:
    """Set torch's intra-op threads to ``threads``, or to :func:`default_threads` for ``width`` when
    ``None``; returns the number set."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise DeviceError(f"threads must be an int >= 1, got {threads!r}")
    n = default_threads(width) if threads is None else threads
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
