"""Training that keeps its history: snapshots of the model at log-spaced steps, each with its
held-out loss at every position of the context.

The follow-up paper (Olsson et al., 2022) reads how induction heads form from the whole run: the
loss as training goes, the in-context learning score (a late token's loss minus an early one's),
and every head's behaviour, snapshot by snapshot. ``train-toy --text-file`` keeps what those measures
need as files, so that they are computed like every other analysis (:mod:`numeric_check.training.dynamics`):
``NAME.history/step-NNNNNN.safetensors`` (a checkpoint with its content hash) and
``NAME.history/history.json``, which lists them with the held-out loss by position and the training
loss of every step. Taking a snapshot draws nothing from the training's random stream, so the run
keeps the same weights, bit for bit, with or without its history.

>>> snapshot_steps(5000, 8)
[10, 24, 59, 143, 349, 847, 2058, 5000]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from numeric_check.training.config import DEFAULT_SNAPSHOTS  # noqa: F401 - part of this module's API

#: Held-out windows each snapshot's loss by position is measured on (spread evenly over the held-out
#: text), and how many go through the model at once.
HISTORY_WINDOWS, WINDOW_CHUNK = 256, 32
#: The file that lists a history's snapshots, inside ``NAME.history/``, and the held-out windows they were
#: measured on (``uint16`` token ids, ``[count, n_ctx + 1]`` row by row: what an independent check reads).
HISTORY_INDEX, HISTORY_WINDOWS_FILE = "history.json", "heldout-windows.u16"
#: The first snapshot's step: before it, the model is its initialisation plus noise.
FIRST_SNAPSHOT = 10


def snapshot_steps(steps: int, count: int) -> list[int]:
    """``count`` steps spaced evenly in log from :data:`FIRST_SNAPSHOT` to ``steps`` (the last always among
    them; fewer where the run is too short to hold as many distinct steps). ``count`` 0: none."""
    if count <= 0:
        return []
    first = min(FIRST_SNAPSHOT, steps)
    if count == 1 or first == steps:
        return [steps]
    ratio = math.log(steps / first) / (count - 1)
    return sorted({min(steps, round(first * math.exp(ratio * i))) for i in range(count)} | {steps})


def snapshot_file(step: int) -> str:
    """The file of the snapshot at ``step`` inside the history folder.

    >>> snapshot_file(42)
    'step-000042.safetensors'
    """
    return f"step-{step:06d}.safetensors"


def heldout_windows(ids: torch.Tensor, n_ctx: int, count: int = HISTORY_WINDOWS) -> torch.Tensor:
    """``[count, n_ctx + 1]``: windows of the held-out token stream ``ids`` at evenly spaced offsets
    (the first at 0, the last ending at the stream's end): the same windows at every snapshot and in
    every run on the same text, with no random draw. No span is copied into them."""
    length = n_ctx + 1
    if len(ids) < length:
        raise ValueError(f"the held-out text is {len(ids):,} tokens, shorter than one window of {length}")
    offsets = torch.linspace(0, len(ids) - length, count, dtype=torch.float64).round().long()
    return ids[offsets[:, None] + torch.arange(length)].long()


def window_bytes(windows: torch.Tensor) -> bytes:
    """``windows`` as the bytes of :data:`HISTORY_WINDOWS_FILE` (little-endian ``uint16``)."""
    import numpy as np

    if int(windows.max()) > np.iinfo(np.uint16).max:
        raise ValueError("token ids beyond 65,535 do not fit the windows file")
    return windows.numpy().astype("<u2").tobytes()


def read_windows(checkpoint) -> torch.Tensor | None:
    """The held-out windows of ``checkpoint``'s history (``[count, n_ctx + 1]`` long), or None where it has none."""
    import numpy as np

    from numeric_check.errors import CheckpointError
    from numeric_check.files import read_json, read_text_file

    folder = Path(checkpoint).with_suffix(".history")
    path, index = folder / HISTORY_WINDOWS_FILE, folder / HISTORY_INDEX
    if not path.is_file() or not index.is_file():
        return None
    shape = read_json(read_text_file(index, "the training history", CheckpointError), "the training history",
                      CheckpointError)
    shape = shape.get("windows") if isinstance(shape, dict) else None
    count, tokens = (shape.get("count"), shape.get("tokens")) if isinstance(shape, dict) else (None, None)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (count, tokens)):
        return None
    ids = np.fromfile(path, dtype="<u2")
    if ids.size != count * tokens:
        return None
    return torch.from_numpy(ids.astype(np.int64)).view(count, tokens)


@torch.no_grad()
def window_losses(model, windows: torch.Tensor, chunk: int = WINDOW_CHUNK) -> torch.Tensor:
    """``[count, n_ctx]`` float64 on the CPU: the next-token loss (nats) of ``model`` at each position of each
    of ``windows`` (``[count, n_ctx + 1]``), window by window (:func:`position_losses` is their mean)."""
    from numeric_check.model.layers import fused_attention

    device = next(model.parameters()).device
    rows = []
    with fused_attention(model):  # no pattern is read: the fused kernel, whatever hooks z, the output or the stream
        for part in windows.split(chunk):
            part = part.to(device)
            logits = model(part[:, :-1])  # [chunk, n_ctx, d_vocab]
            logits = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
            loss = F.cross_entropy(logits.flatten(0, 1), part[:, 1:].flatten(), reduction="none")
            rows.append(loss.view(part.shape[0], -1).double().cpu())
    return torch.cat(rows)


def position_losses(model, windows: torch.Tensor, chunk: int = WINDOW_CHUNK) -> torch.Tensor:
    """``[n_ctx]`` float64 on the CPU: the mean next-token loss (nats) of ``model`` at each position over ``windows``
    (``[count, n_ctx + 1]``; position ``p`` predicts token ``p + 1``): :func:`window_losses` averaged."""
    return window_losses(model, windows, chunk).mean(0)


@dataclass
class Snapshot:
    """One snapshot: its step, the checkpoint's bytes and content hash, the held-out loss by position."""

    step: int
    weights: bytes
    sha256: str
    position_loss: list[float]

    def record(self) -> dict:
        """What ``history.json`` lists of it."""
        loss = self.position_loss
        return {"step": self.step, "file": snapshot_file(self.step), "sha256": self.sha256,
                "heldout_loss": round(sum(loss) / len(loss), 6), "position_loss": [round(v, 6) for v in loss]}


@dataclass
class History:
    """The snapshots a run keeps (call it with ``(step, model)`` after each step; it keeps those at
    :attr:`steps`), saved at ``save_dtype``, each measured on the held-out ``windows``."""

    steps: list[int]
    windows: torch.Tensor
    save_dtype: torch.dtype = torch.float32
    snapshots: list[Snapshot] = field(default_factory=list)

    def __call__(self, step: int, model) -> None:
        if step in self.steps:
            self.take(step, model)

    def take(self, step: int, model) -> None:
        """Keep ``model`` as the snapshot of ``step``, whether or not :attr:`steps` lists it (a run stopped early
        keeps the model it stopped with)."""
        from numeric_check.model.checkpoint import checkpoint_bytes

        was_training = model.training
        model.eval()
        loss = position_losses(model, self.windows)
        model.train(was_training)
        copy = _copy_at(model, self.save_dtype)
        weights, sha = checkpoint_bytes(copy)
        self.snapshots.append(Snapshot(step, weights, sha, loss.tolist()))

    def files(self) -> dict[str, bytes]:
        """The snapshots' files by name inside the history folder, and the windows they were measured on."""
        return {**{snapshot_file(s.step): s.weights for s in self.snapshots}, HISTORY_WINDOWS_FILE: window_bytes(self.windows)}

    def index(self, training_loss: list[float], checkpoint_sha256: str) -> dict:
        """``history.json``: the windows measured on, every snapshot, and the loss of every training step."""
        return {
            "format": "tcircuits.history", "format_version": 1,
            "checkpoint_sha256": checkpoint_sha256,
            "windows": {"count": int(self.windows.shape[0]), "tokens": int(self.windows.shape[1]),
                        "where": "evenly spaced over the held-out text; nothing copied into them"},
            "snapshots": [s.record() for s in self.snapshots],
            "training_loss": [round(v, 6) for v in training_loss],
        }


def _copy_at(model, dtype: torch.dtype):
    """A copy of ``model`` at ``dtype`` on the CPU (the training model itself is left as it is)."""
    import copy

    return copy.deepcopy(model).to(device="cpu", dtype=dtype)
