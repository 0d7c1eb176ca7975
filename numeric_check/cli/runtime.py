"""What every numeric command shares about where it runs: ``--device`` and ``--threads``.

:func:`add_runtime_arguments` declares them; :func:`with_runtime` wraps a command's ``run`` so
that the device is decided once, before anything is loaded (``args.device`` is then a
``torch.device``), and the threads follow :mod:`numeric_check.runtime`'s policy.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from typing import Callable, Iterator

from numeric_check.reports.flags import threads

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
        from numeric_check.runtime import use_threads

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
    from numeric_check.runtime import use_threads

    use_threads(args.threads, d_model)

