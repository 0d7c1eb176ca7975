"""The companion's chapter "How induction heads form": the shipped two-layer language model's training run.

The shipped ``kjv_2l.safetensors`` and ``kjv_1l.safetensors`` are the last snapshots of two runs that kept 32
snapshots each (``scripts/sweep.sh 2 1.0`` and ``1 1.0``; about 70 MB, not shipped). ``tcircuits dynamics``
measured them; its run and control ship as ``kjv_2l.dynamics.json`` (``scripts/ship_dynamics.py``), and the
snapshots' measurements are read from there. :func:`measure_formation` measures, when the companion is built:

- each run's last snapshot's content hash against the shipped checkpoint's (:class:`HashCheck`);
- every head's prefix-matching and copying scores of the shipped two-layer model, as ``tcircuits dynamics``
  measures a snapshot's, against the last snapshot's stored row (the largest difference);
- the ablation (:func:`~numeric_check.training.phase.ablated_icl`) on windows of the shipped held-out text;
- the four claims judged on the stored measurements with that ablation (:func:`~numeric_check.training.phase.judge`).

:mod:`numeric_check.reports.paper.formation_text` says it for the page and the PDF, and draws the figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from numeric_check.circuits.detect import behaviour_scores
from numeric_check.circuits.ov_qk import copying_scores
from numeric_check.errors import CheckpointError
from numeric_check.files import read_json, read_text_file
from numeric_check.model.checkpoint import load_checkpoint, stored_content_hash
from numeric_check.reports.paper.language import heldout_path, language_checkpoint
from numeric_check.training.dynamics import RANDOM_BATCH, RANDOM_SEED, Dynamics, read_dynamics
from numeric_check.training.history import HISTORY_WINDOWS, heldout_windows
from numeric_check.training.text import CheckpointTokenizer, encode
from numeric_check.training.phase import Ablation, Claim, ablated_icl, ablation_heads, judge, phase_window

#: The shipped measurements of the runs, beside the models they end with.
DYNAMICS_FILE = "kjv_2l.dynamics.json"


def dynamics_path() -> Path:
    """The shipped measurements of the runs (``kjv_2l.dynamics.json``)."""
    return Path(str(resources.files("numeric_check") / "data" / DYNAMICS_FILE))


@dataclass(frozen=True)
class HashCheck:
    """A run's last snapshot's content hash as the file records it, and the shipped checkpoint's (None: unreadable)."""

    checkpoint: str
    stored: str
    shipped: str | None

    @property
    def matches(self) -> bool:
        return self.shipped is not None and self.stored == self.shipped


@dataclass(frozen=True)
class Formation:
    """The chapter's measurements: the stored runs and what was measured when the companion was built.

    ``prefix_difference`` and ``copying_difference``: the largest absolute difference over heads between the
    shipped two-layer model's scores and the last snapshot's stored row; ``ablation``:
    :func:`~numeric_check.training.phase.ablated_icl`'s scores (intact, ``heads`` at their mean, ``others`` at
    theirs) on ``windows`` held-out windows, None where the run has no induction head."""

    run: Dynamics
    control: Dynamics | None
    source: str
    hashes: tuple[HashCheck, ...]
    prefix_difference: float
    copying_difference: float
    ablation: Ablation | None
    heads: tuple[tuple[int, int], ...]
    others: tuple[tuple[int, int], ...]
    windows: int
    claims: tuple[Claim, ...]

    @property
    def hashes_match(self) -> bool:
        return all(h.matches for h in self.hashes)

    @property
    def window(self) -> tuple[int, int] | None:
        return phase_window(self.run)


def _largest_difference(measured: torch.Tensor, stored: list[list[float]]) -> float:
    """The largest ``|measured − stored|`` over heads both have (NaN: a head neither has; infinity: another shape)."""
    stored = torch.tensor(stored, dtype=torch.float64)
    if stored.shape != measured.shape:
        return math.inf
    diff = (measured.double().cpu() - stored).abs()
    diff = diff[~diff.isnan()]
    return float(diff.max()) if diff.numel() else math.nan


def heldout_ids(tokenizer) -> torch.Tensor:
    """The shipped held-out text as ``tokenizer`` reads it (one stream of token ids)."""
    return encode(tokenizer, heldout_path().read_text(encoding="utf-8"))


@torch.no_grad()
def measure_formation(path: Path | str | None = None, *, ids: torch.Tensor | None = None, device=None,
                      windows: int = HISTORY_WINDOWS) -> Formation:
    """The chapter's measurements (see the module docstring): the runs read from ``path`` (the shipped file unless
    given), checked against the shipped models on ``device``; the ablation on ``windows`` windows of the held-out
    token stream ``ids`` (the shipped held-out text tokenized with the model's BPE unless given)."""
    path = dynamics_path() if path is None else Path(path)
    run, control = read_dynamics(path)
    source = read_json(read_text_file(path, "the dynamics file", CheckpointError), "the dynamics file",
                       CheckpointError).get("source", "")
    shipped = [(language_checkpoint(d.n_layers), d) for d in (run, control) if d is not None]  # kjv_2l, kjv_1l
    hashes = tuple(HashCheck(c.name, d.snapshots[-1].sha256, stored_content_hash(c)) for c, d in shipped)
    model = load_checkpoint(language_checkpoint(run.n_layers), device=device, dtype=torch.float64)
    last = run.snapshots[-1]
    scores = behaviour_scores(model, batch=RANDOM_BATCH, seed=RANDOM_SEED)  # as tcircuits dynamics measures a snapshot
    prefix, copying = _largest_difference(scores.induction, last.prefix_matching), \
        _largest_difference(copying_scores(model), last.copying)
    heads, others = ablation_heads(run)
    ablation = None
    if heads:
        if ids is None:
            ids = heldout_ids(CheckpointTokenizer.beside(language_checkpoint(run.n_layers)).tokenizer)
        # float32, as the model is stored: the ablation's scores agree with float64's to about 1e-7 and cost a fifth
        model = model.to(dtype=torch.float32)
        ablation = ablated_icl(model, heldout_windows(ids.long(), run.n_ctx, windows).to(model.device), heads, others)
    return Formation(run, control, str(source), hashes, prefix, copying, ablation, tuple(heads), tuple(others), windows,
                     tuple(judge(run, control, ablation=ablation)))
