"""How induction heads form: the follow-up paper's measures (Olsson et al., 2022), snapshot by snapshot,
computed from a training run's history (:mod:`numeric_check.training.history`).

For every snapshot of ``NAME.history/``:

- the held-out loss, and its value at every position of the context (the heat map of loss by token
  index × training step), measured again on the snapshot file in float64 where the history keeps its
  windows (the history's own figure is the training model's, before the save's rounding);
- the **in-context learning score**: the loss of a late token minus that of an early one. The paper
  takes the 500th and the 50th tokens of contexts of 512 or more; scaled to a context of ``n_ctx``
  tokens, the late token is the last and the early one a tenth of the way (:func:`icl_positions`),
  each averaged over a few neighbouring positions, since a held-out text of a few ten thousand
  tokens gives one position's mean loss to about 0.15 nats only;
- every head's **prefix-matching** score (attention from a token in the second copy of repeated
  random tokens to the token that followed its earlier occurrence) and previous-token score, and its
  **copying** score (the positivity of its OV circuit's eigenvalues, the paper's measure);
- the **K-composition term** of the induction circuit from the algebra: the term
  ``Id ⊗ A^{h1} ⊗ W_Eᵀ W_QK^{h2} W_OV^{h1} W_E`` of the induction head ``h2``'s attention scores, with
  ``h1`` the layer-0 head that K-composes with it most in the last snapshot; its size (Frobenius norm
  over a repeated random sequence) and whether :func:`~numeric_check.verification.verify.verify_qk`
  checks every term of that expansion against the snapshot model, as every term is.

>>> icl_positions(128)
((11, 16), (118, 128))
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from derivations.architecture import head_label
from numeric_check.errors import CheckpointError
from numeric_check.files import read_json, read_text_file

#: The paper's tokens for the in-context learning score, and the context they were read in.
PAPER_EARLY, PAPER_LATE, PAPER_CONTEXT = 50, 500, 512
#: Repeated random sequences for the heads' scores: batch and the seed of the tokens.
RANDOM_BATCH, RANDOM_SEED = 32, 0


def icl_positions(n_ctx: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The positions (``range`` bounds; position ``p`` predicts token ``p + 1``) whose mean losses are the early
    and the late loss of the in-context learning score: the late band the context's last ten positions, the
    early band five positions around a tenth of the context (the paper's 50th token of 500)."""
    late = n_ctx - 1
    early = max(2, round(late * PAPER_EARLY / PAPER_LATE))
    return (max(0, early - 2), min(early + 3, late)), (max(early + 3, late - 9), late + 1)


def icl_score(position_loss, n_ctx: int) -> float:
    """The late band's mean loss minus the early band's (:func:`icl_positions`): negative when the model
    predicts later tokens better, using what came before them."""
    (a, b), (c, d) = icl_positions(n_ctx)
    loss = list(position_loss)
    return sum(loss[c:d]) / (d - c) - sum(loss[a:b]) / (b - a)


@dataclass
class SnapshotMeasures:
    """The measures of one snapshot (``[n_layers, n_heads]`` lists of lists for the heads' scores)."""

    step: int
    sha256: str
    heldout_loss: float
    icl_score: float
    position_loss: list[float]
    previous_token: list[list[float]]
    prefix_matching: list[list[float]]
    copying: list[list[float]]
    k_composition: float
    k_term_norm: float
    k_term_verified: bool


@dataclass
class Dynamics:
    """A run's measures snapshot by snapshot, with the heads they follow and the run's training losses."""

    checkpoint: str
    n_layers: int
    n_heads: int
    n_ctx: int
    induction_head: tuple[int, int] | None
    writer_head: tuple[int, int] | None
    snapshots: list[SnapshotMeasures]
    training_loss: list[float] = field(default_factory=list)
    record: dict = field(default_factory=dict)

    @property
    def steps(self) -> list[int]:
        return [s.step for s in self.snapshots]

    def best(self, name: str, layer: int | None = None) -> list[float]:
        """The best head's value of score ``name`` at each snapshot (in ``layer``, or in any)."""
        out = []
        for s in self.snapshots:
            rows = getattr(s, name) if layer is None else [getattr(s, name)[layer]]
            values = [v for row in rows for v in row if not math.isnan(v)]
            out.append(max(values) if values else math.nan)
        return out

    def to_dict(self) -> dict:
        def head(h):
            return None if h is None else head_label(*h)

        return {
            "format": "tcircuits.dynamics", "format_version": 1, "checkpoint": self.checkpoint,
            "n_layers": self.n_layers, "n_heads": self.n_heads, "n_ctx": self.n_ctx,
            "icl_positions": {"early": list(icl_positions(self.n_ctx)[0]), "late": list(icl_positions(self.n_ctx)[1])},
            "induction_head": head(self.induction_head), "writer_head": head(self.writer_head),
            "snapshots": [s.__dict__ for s in self.snapshots],
            "train_config": self.record.get("train_config"),
        }


def read_history(checkpoint: Path | str) -> tuple[Path, dict]:
    """The history folder beside ``checkpoint`` and its ``history.json``, checked (a run trained without
    ``--snapshots`` has none: a :class:`CheckpointError` saying so)."""
    from numeric_check.training.history import HISTORY_INDEX

    folder = Path(checkpoint).with_suffix(".history")
    index = folder / HISTORY_INDEX
    if not index.is_file():
        raise CheckpointError(f"{str(checkpoint)!r} has no training history ({str(index)!r} is missing): train it with "
                              "'tcircuits train-toy --text-file FILE --snapshots N' to keep one")
    history = read_json(read_text_file(index, "the training history", CheckpointError), f"the history {str(index)!r}",
                        CheckpointError)
    snapshots = history.get("snapshots") if isinstance(history, dict) else None
    if history.get("format") != "tcircuits.history" or not isinstance(snapshots, list) or not snapshots or not all(
            isinstance(s, dict) and isinstance(s.get("step"), int) and isinstance(s.get("file"), str)
            and isinstance(s.get("position_loss"), list) for s in snapshots):
        raise CheckpointError(f"the history {str(index)!r} is not one train-toy wrote (format tcircuits.history with "
                              "snapshots of step, file and position_loss); train again to remake it")
    for s in snapshots:
        if Path(s["file"]).name != s["file"] or not (folder / s["file"]).is_file():
            raise CheckpointError(f"the history {str(index)!r} lists {s['file']!r}, which is not in {str(folder)!r}")
    return folder, history


@torch.no_grad()
def measure(checkpoint: Path | str, *, device=None, progress=None) -> Dynamics:
    """Every snapshot of ``checkpoint``'s history measured (see the module docstring), in float64."""
    from numeric_check.circuits.composition import composition_scores
    from numeric_check.circuits.detect import behaviour_scores
    from numeric_check.circuits.ov_qk import copying_scores
    from numeric_check.model.checkpoint import load_checkpoint, stored_content_hash

    folder, history = read_history(checkpoint)
    entries = sorted(history["snapshots"], key=lambda s: s["step"])
    models = {}

    def model_at(entry):
        path = folder / entry["file"]
        if entry.get("sha256") not in (None, stored_content_hash(path)):
            raise CheckpointError(f"{str(path)!r} is not the snapshot its history lists (another content hash)")
        return load_checkpoint(path, device=device, dtype=torch.float64)

    from numeric_check.training.history import position_losses, read_windows

    windows = read_windows(checkpoint)  # the held-out windows: each snapshot's loss measured again from its file
    last = model_at(entries[-1])
    models[entries[-1]["step"]] = last
    n_layers, n_heads, n_ctx = last.arch.n_layers, max(last.arch.heads_per_layer, default=0), last.cfg.n_ctx
    induction, writer, last_scores = _tracked_heads(last)
    tokens = _repeated_random(last)
    measures = []
    for i, entry in enumerate(entries):
        model = models.pop(entry["step"], None) or model_at(entry)
        if n_layers:  # the last snapshot's were measured to pick the heads followed
            scores = last_scores if entry is entries[-1] else behaviour_scores(model, batch=RANDOM_BATCH, seed=RANDOM_SEED)
            previous, prefix = scores.previous_token.tolist(), scores.induction.tolist()
            copying = copying_scores(model).tolist()
        else:
            previous = prefix = copying = []
        k_score, k_norm, verified = (composition_scores(model, "K")[writer + induction].item(), *_k_term(model, tokens, induction, writer)) \
            if induction is not None else (math.nan, math.nan, False)
        # the file's weights in float64 (the history's figure is the training model's, before the save's rounding)
        loss = position_losses(model, windows).tolist() if windows is not None else [float(v) for v in entry["position_loss"]]
        measures.append(SnapshotMeasures(entry["step"], entry.get("sha256", ""), sum(loss) / len(loss), icl_score(loss, n_ctx), loss,
                                         previous, prefix, copying, k_score, k_norm, verified))
        if progress is not None:
            progress(i + 1, len(entries))
    record_path = Path(checkpoint).with_suffix(".json")
    record = json.loads(record_path.read_text(encoding="utf-8")) if record_path.is_file() else {}
    return Dynamics(Path(checkpoint).name, n_layers, n_heads, n_ctx, induction, writer, measures,
                    [float(v) for v in history.get("training_loss", [])], record)


def _tracked_heads(model):
    """The induction head the run ends with (the last layer's highest prefix-matching score, from layer 1 on),
    the layer-0 head that K-composes with it most (both None for a model of fewer than two layers), and the
    model's behaviour scores they were read from (None without layers)."""
    from numeric_check.circuits.composition import composition_scores
    from numeric_check.circuits.detect import behaviour_scores

    scores = behaviour_scores(model, batch=RANDOM_BATCH, seed=RANDOM_SEED) if model.arch.n_layers else None
    if model.arch.n_layers < 2:
        return None, None, scores
    layer = model.arch.n_layers - 1
    head = int(torch.nan_to_num(scores.induction[layer], nan=-1.0).argmax())
    k = composition_scores(model, "K")[0, :, layer, head]
    return (layer, head), (0, int(torch.nan_to_num(k, nan=-1.0).argmax())), scores


def _repeated_random(model) -> torch.Tensor:
    """One sequence of random tokens repeated once, as long as the context allows (at most 64 tokens)."""
    from numeric_check.circuits.detect import repeated_tokens

    return repeated_tokens(model, min(model.cfg.n_ctx, 64) // 2, 1, seed=RANDOM_SEED)


def _k_term(model, tokens, induction, writer) -> tuple[float, bool]:
    """The size of the K-composition term ``Id ⊗ A^{writer} ⊗ …`` of ``induction``'s scores from the token
    source, and whether every term of the order-1 expansion checks against the model."""
    from numeric_check.verification.verify import verify_qk

    report = verify_qk(model, tokens, *induction, max_order=1)
    norm = next((t.norm for t in report.terms if t.composition == "K" and tuple(t.key_heads or ()) == (writer,)
                 and t.key_source == "tok" and t.source == "tok"), math.nan)
    return float(norm), bool(report.passed)
