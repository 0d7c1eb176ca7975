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
    yours: bool = False  # a person's own run, measured from its history when the page was built (not the shipped file)

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
    scores = behaviour_scores(model, batch=RANDOM_BATCH, seed=RANDOM_SEED, tokens=run.random_tokens)  # as the file was measured
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


#: How a person keeps the snapshots this chapter reads (said where their model kept none).
SNAPSHOTS_COMMAND = "tcircuits train-toy --text-file FILE --snapshots 32 --out NAME.safetensors"


def no_snapshots(name: str, why: str = "kept no snapshots") -> str:
    """The chapter's note where a person's model has no history to read (the shipped run is shown instead)."""
    return (f"Your model {name} {why}, so this chapter shows the run of the shipped two-layer model instead. To see how "
            f"your own model's heads formed, train it keeping snapshots ({SNAPSHOTS_COMMAND}: a folder NAME.history/ "
            "beside the checkpoint) and build the companion on it again.")


@torch.no_grad()
def your_formation(checkpoint: Path | str | None, name: str, ids: torch.Tensor, *, device=None,
                   windows: int = HISTORY_WINDOWS) -> tuple[Formation, str | None]:
    """The chapter on a person's run: every snapshot of ``checkpoint``'s history measured as ``tcircuits dynamics``
    measures them, its last snapshot checked against the checkpoint, the ablation on ``windows`` windows of ``ids``
    (the text the language page measures), the claims judged without a control. Where the model kept no history
    (or is no checkpoint, or has no layers), the shipped run's chapter and a note saying why and how to keep one."""
    from numeric_check.training.dynamics import measure

    if checkpoint is None:
        return measure_formation(device=device), no_snapshots(name, "is not a tcircuits checkpoint and kept no snapshots")
    if not Path(checkpoint).with_suffix(".history").is_dir():
        return measure_formation(device=device), no_snapshots(name)
    try:
        run = measure(checkpoint, device=device)
    except CheckpointError as error:  # a history train-toy did not write, or changed since: said, not fatal
        return measure_formation(device=device), no_snapshots(name, f"has a history that cannot be read ({error})")
    if run.n_layers == 0:
        return measure_formation(device=device), no_snapshots(name, "has no attention layer, so no head to form")
    model = load_checkpoint(checkpoint, device=device, dtype=torch.float64)
    last = run.snapshots[-1]
    scores = behaviour_scores(model, batch=RANDOM_BATCH, seed=RANDOM_SEED, tokens=run.random_tokens)
    prefix, copying = _largest_difference(scores.induction, last.prefix_matching), \
        _largest_difference(copying_scores(model), last.copying)
    heads, others = ablation_heads(run)
    ablation = None
    if heads and len(ids) > run.n_ctx:
        ablation = ablated_icl(model, heldout_windows(ids.long(), run.n_ctx, windows).to(model.device), heads, others)
    hashes = (HashCheck(Path(checkpoint).name, last.sha256, stored_content_hash(checkpoint)),)
    source = (f"train-toy kept {len(run.snapshots)} snapshots in {Path(checkpoint).with_suffix('.history').name}/ and "
              "tcircuits dynamics' measures were taken on them when this page was built")
    return Formation(run, None, source, hashes, prefix, copying, ablation, tuple(heads), tuple(others), windows,
                     tuple(judge(run, None, ablation=ablation)), yours=True), None
