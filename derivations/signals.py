"""Stopping a command cleanly: SIGTERM and SIGHUP end a run as Ctrl-C (SIGINT) does.

A command that is told to stop — Ctrl-C, ``kill``, ``timeout``, a closed terminal — raises
:class:`Stopped` (a ``KeyboardInterrupt``) where it stands, so that every ``finally`` and every
``except BaseException`` on the way out runs: a half-written temporary file or a new folder
beside the output is removed, and the old output stays as it was. The CLI exits ``128 + N`` for
signal N (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP), as a shell reports a process the
signal ended.

A signal that arrives inside :func:`held` (the few steps that swap outputs in: two renames that
must both happen) waits until the block ends; one that arrives while the run is already stopping
(its clean-up under way) is let go, so the clean-up finishes. A signal the process was started
ignoring (``nohup`` ignores SIGHUP) stays ignored.

A long loop that can end early and keep its work (training) runs inside :func:`polled`: there the
first signal is only noted, for the loop to read (:func:`requested`) where a step ends, and a second
one stops the command at once as outside it.

>>> with stoppable():
...     with held():
...         pass
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

#: The signals that stop a command as Ctrl-C does.
STOPPING = tuple(s for s in (signal.SIGINT, getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
                 if s is not None)

_state = {"held": 0, "pending": None, "stopping": False, "polled": 0, "requested": None}


class Stopped(KeyboardInterrupt):
    """The command was told to stop by signal ``signum`` (SIGINT, SIGTERM or SIGHUP)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _stop(signum: int, frame) -> None:
    if _state["polled"] and _state["requested"] is None and not _state["held"]:  # the loop ends where a step does
        _state["requested"] = signum
        return
    if _state["held"] or _state["stopping"]:  # inside a swap, or already cleaning up: later, or not at all
        _state["pending"] = _state["pending"] or signum
        return
    _state["stopping"] = True
    raise Stopped(signum)


@contextlib.contextmanager
def stoppable() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise :class:`Stopped` (in the main thread; a
    signal the process ignores stays ignored); the handlers are put back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for signum in STOPPING:
        current = signal.getsignal(signum)
        if current is signal.SIG_IGN or current is None:
            continue
        saved[signum] = current
        signal.signal(signum, _stop)
    _state.update(held=0, pending=None, stopping=False, polled=0, requested=None)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        _state.update(held=0, pending=None, stopping=False, polled=0, requested=None)


@contextlib.contextmanager
def polled() -> Iterator[None]:
    """A block that reads its stop when it can: the first stopping signal within it is noted
    (:func:`requested` returns its number from then on, also after the block) instead of raised;
    a second one raises :class:`Stopped` as anywhere else. Outside :func:`stoppable` (a library
    call, another thread) nothing is caught and the block runs as it is."""
    _state["polled"] += 1
    try:
        yield
    finally:
        _state["polled"] -= 1


def requested() -> int | None:
    """The number of the stopping signal a :func:`polled` block noted (SIGINT's 2 for Ctrl-C), or None."""
    return _state["requested"]


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A block that a stopping signal does not cut in two: a signal that comes during it is raised
    as :class:`Stopped` when it ends (unless the block is already failing)."""
    _state["held"] += 1
    try:
        yield
    except BaseException:
        _state["held"] -= 1
        raise
    _state["held"] -= 1
    if not _state["held"] and _state["pending"] is not None and not _state["stopping"]:
        signum, _state["pending"] = _state["pending"], None
        _state["stopping"] = True
        raise Stopped(signum)


def stopping() -> bool:
    """Whether a stopping signal has come (the run is on its way out)."""
    return bool(_state["stopping"] or _state["pending"] is not None)


__all__ = ["STOPPING", "Stopped", "held", "polled", "requested", "stoppable", "stopping"]
