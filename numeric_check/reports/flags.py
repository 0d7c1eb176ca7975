"""Flag types and checks shared by ``tcircuits``' numeric commands (verify, analyze and
train-toy in :mod:`numeric_check.cli`, and the demo, which lives with the reports it
prints): argparse refuses a bad value in one line before any work starts, and a size that
would not fit in memory is refused with the largest that does. Every numeric command takes
``--device`` and ``--threads`` (:func:`add_runtime_arguments`); :func:`with_runtime` wraps its
``run`` so that the device is decided once, before anything is loaded (``args.device`` is then a
``torch.device``), the threads follow :mod:`numeric_check.model.threads`' policy, and CUDA's own
failures are one line (:func:`device_errors`).

>>> int_in(1, 10)("3")
3
>>> seed("18446744073709551616")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected an integer in 0..9223372036854775807, got '18446744073709551616'
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
from typing import Callable, Iterator

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


DEVICE_HELP = ("auto (the default: the current CUDA device when there is one, else the CPU), cpu, cuda or cuda:N; "
               "decided once, everything follows it")
THREADS_HELP = ("CPU threads for torch (default: 1 for models narrower than d_model 1024, else the idle cores; "
                "threads that wait sleep, so a busy machine does not slow the run)")


def add_runtime_arguments(group, device_help: str = DEVICE_HELP) -> None:
    """``--device`` and ``--threads`` on ``group`` (a parser or an argument group)."""
    group.add_argument("--device", default="auto", metavar="DEVICE", help=device_help)
    group.add_argument("--threads", type=threads, metavar="N", help=THREADS_HELP)


def with_runtime(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``run`` with ``args.device`` resolved (a one-line error for a device that does not exist, before
    anything is loaded) and torch's threads set by the policy (``--threads`` when given)."""
    @functools.wraps(run)
    def wrapped(args: argparse.Namespace) -> int:
        from numeric_check.model.config import resolve_device
        from numeric_check.model.threads import use_threads

        args.device = resolve_device(args.device)
        use_threads(args.threads, getattr(args, "d_model", None))
        with device_errors(args.device):
            return run(args)
    return wrapped


@contextlib.contextmanager
def device_errors(device) -> Iterator[None]:
    """CUDA's own failures — out of memory, a device busy or lost — as one
    :class:`~numeric_check.errors.DeviceError` line naming the device and what to do (outputs are
    written whole at the end, so none is left half-written)."""
    import torch

    from numeric_check.errors import DeviceError

    try:
        yield
    except torch.cuda.OutOfMemoryError:
        free = ""
        try:
            free_bytes, total = torch.cuda.mem_get_info(device)
            free = f" ({free_bytes / 2**30:.1f} of {total / 2**30:.1f} GiB free now)"
        except Exception:  # noqa: BLE001 - only to say how much is free
            pass
        raise DeviceError(f"CUDA ran out of memory on {device}{free}; try shorter prompts, a lower --max-order, "
                          "--dtype float32, or --device cpu") from None
    except RuntimeError as error:
        text = " ".join(str(error).split())
        if device.type != "cuda" or not any(k in text for k in ("CUDA error", "CUDA-capable", "cuDNN", "CUBLAS", "NCCL")):
            raise
        raise DeviceError(f"the CUDA device {device} failed: {text[:200]}; if another process holds it, wait or "
                          "pick another with --device cuda:N, or use --device cpu") from None


def fit_threads(args: argparse.Namespace, d_model: int) -> None:
    """Once the model's width is known: the policy's threads for it (unless ``--threads`` was given)."""
    from numeric_check.model.threads import use_threads

    use_threads(args.threads, d_model)

