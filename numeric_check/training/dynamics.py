"""How induction heads form: the follow-up paper's measures (Olsson et al., 2022), snapshot by snapshot,
computed from a training run's history (:mod:`numeric_check.training.history`).

For every snapshot of ``NAME.history/``:

- the held-out loss, and its value at every position of the context (the heat map of loss by token
  index × training step), measured again on the snapshot file in float64 where the history keeps its
  windows (the history's own figure is the training model's, before the save's rounding);
- the **in-context learning score**: the loss of a late token minus that of an early one. The paper
  takes the 500th and the 50th tokens of contexts of 512 or more, and so does this where the context
  holds them (``n_ctx`` >= 512); a shorter context gets a score *scaled* to it, the late token the last
  and the early one a tenth of the way, which is not the paper's measure and is labelled so
  (:func:`icl_positions`). Each is averaged over five neighbouring positions, since a held-out text of
  a few ten thousand tokens gives one position's mean loss to about 0.15 nats only;
- the **induction headroom** (:mod:`numeric_check.training.headroom`): how much a perfect token-level
  induction guess, mixed in at its best single weight, would take off the held-out loss of the snapshot as
  it is; where it has fallen near zero the text gives an induction head little left to learn;
- every head's **prefix-matching** score (attention from a token in the second copy of repeated
  random tokens to the token that followed its earlier occurrence) and previous-token score, and its
  **copying** score (the positivity of its OV circuit's eigenvalues, the paper's measure);
- the **K-composition term** of the induction circuit from the algebra: the term
  ``Id ⊗ A^{h1} ⊗ W_Eᵀ W_QK^{h2} W_OV^{h1} W_E`` of the induction head ``h2``'s attention scores, with
  ``h1`` the layer-0 head that K-composes with it most in the last snapshot; its size (Frobenius norm
  over a repeated random sequence) and whether :func:`~numeric_check.verification.verify.verify_qk`
  checks every term of that expansion against the snapshot model, as every term is.

>>> icl_positions(128)   # scaled to the context: tokens about 15 and 125
((11, 16), (118, 128))
>>> icl_positions(512)   # the paper's: the positions that predict tokens 48-52 and 498-502
((46, 51), (496, 501))
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from derivations.architecture import head_label
from numeric_check.errors import CheckpointError
from numeric_check.files import read_json, read_text_file

#: The paper's tokens for the in-context learning score, and the context they were read in.
PAPER_EARLY, PAPER_LATE, PAPER_CONTEXT = 50, 500, 512
#: Repeated random sequences for the heads' scores: batch and the seed of the tokens.
RANDOM_BATCH, RANDOM_SEED = 32, 0


def is_paper_icl(n_ctx: int) -> bool:
    """Whether a context of ``n_ctx`` positions holds the paper's 500th token, so that :func:`icl_score` is the
    paper's measure (loss at token 500 minus loss at token 50) and not one scaled to a shorter context."""
    return n_ctx >= PAPER_LATE


def icl_positions(n_ctx: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The positions (``range`` bounds; position ``p`` predicts the token at index ``p + 1``, the ``p + 2``-th)
    whose mean losses are the early and the late loss of the in-context learning score. Where the context
    holds the paper's tokens (:func:`is_paper_icl`): five positions around the ones that predict the 50th and
    the 500th token. Else scaled to the context: the late band its last ten positions, the early band five
    positions around a tenth of it."""
    if is_paper_icl(n_ctx):
        early, late = PAPER_EARLY - 2, PAPER_LATE - 2  # the positions that predict the 50th and the 500th token
        return (early - 2, early + 3), (late - 2, late + 3)
    late = n_ctx - 1
    early = max(2, round(late * PAPER_EARLY / PAPER_LATE))
    return (max(0, early - 2), min(early + 3, late)), (max(early + 3, late - 9), late + 1)


def icl_definition(n_ctx: int) -> str:
    """What the in-context learning score of a context of ``n_ctx`` positions is, in a sentence for a page.

    >>> icl_definition(512)
    "ICL score: the loss at token 500 minus the loss at token 50 (the paper's measure; each a mean over five neighbouring tokens)."
    >>> icl_definition(128)
    'ICL score: scaled to a context of 128, the loss at about token 125 minus that at about token 15 (the paper takes tokens 500 and 50, which this context does not hold).'
    """
    (a, b), (c, d) = icl_positions(n_ctx)
    if is_paper_icl(n_ctx):
        return (f"ICL score: the loss at token {PAPER_LATE} minus the loss at token {PAPER_EARLY} (the paper's measure; "
                "each a mean over five neighbouring tokens).")
    return (f"ICL score: scaled to a context of {n_ctx}, the loss at about token {(c + d) // 2 + 2} minus that at about "
            f"token {(a + b) // 2 + 2} (the paper takes tokens {PAPER_LATE} and {PAPER_EARLY}, which this context "
            "does not hold).")


def random_tokens_definition(pool) -> str:
    """What the heads' scores were measured on, in a sentence for a page (``pool``: :attr:`Dynamics.random_tokens`).

    >>> print(random_tokens_definition([3, 5, 8]))
    Heads' scores: 32 sequences of random tokens repeated (seed 0), drawn from the 3 token ids the held-out text holds.
    """
    drawn = "drawn from every token id" if pool is None else f"drawn from the {len(pool):,} token ids the held-out text holds"
    return f"Heads' scores: {RANDOM_BATCH} sequences of random tokens repeated (seed {RANDOM_SEED}), {drawn}."


def stopped_definition(record: dict) -> str:
    """A sentence for a page when the run was stopped before its last step (``record``: its training record), else "".

    >>> stopped_definition({"stopped": {"step": 9, "of": 40, "signal": "SIGINT"}})
    'The run was stopped after step 9 of 40 (its learning rate where the schedule had it then); its last snapshot is that step.'
    """
    stopped = record.get("stopped")
    if not stopped:
        return ""
    return (f"The run was stopped after step {stopped['step']:,} of {stopped['of']:,} (its learning rate where the "
            "schedule had it then); its last snapshot is that step.")


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
    #: nats a token (:mod:`~numeric_check.training.headroom`); NaN where the history keeps no windows, and in
    #: records written before it was measured
    induction_headroom: float = math.nan

    @classmethod
    def from_dict(cls, data, n_layers: int, n_heads: int, n_ctx: int, where: str = "a dynamics record") -> "SnapshotMeasures":
        """One snapshot as :meth:`Dynamics.to_dict` writes it (a score a head lacks may be null: NaN), checked
        against the run's shape; anything else a one-line :class:`CheckpointError` naming ``where``."""
        expected = [f.name for f in fields(cls)]
        if isinstance(data, dict) and "induction_headroom" not in data:  # a record from before it was measured
            data = {**data, "induction_headroom": None}
        if not isinstance(data, dict) or set(data) != set(expected):
            found = set(data) if isinstance(data, dict) else set()
            odd = [f"without {k}" for k in expected if k not in found] + [f"with {str(k)[:40]!r}" for k in found - set(expected)]
            raise CheckpointError(f"{where} has a snapshot that is not one tcircuits dynamics wrote ("
                                  + (", ".join(odd[:3]) if isinstance(data, dict) else f"a {type(data).__name__}")
                                  + f"); each holds {', '.join(expected)}")
        step = data["step"]
        if not _step(step) or not isinstance(data["sha256"], str) or not isinstance(data["k_term_verified"], bool):
            raise CheckpointError(f"{where} has a snapshot whose step, sha256 or k_term_verified is not a step >= 1, "
                                  "a string and true or false")
        label = f"{where}, step {step}"
        heads = {name: _grid(data[name], n_layers, n_heads, f"{label}: {name}")
                 for name in ("previous_token", "prefix_matching", "copying")}
        loss = data["position_loss"]
        if not _losses(loss) or len(loss) != n_ctx:
            raise CheckpointError(f"{label}: position_loss is not a list of {n_ctx} finite numbers")
        values = {name: _number(data[name], f"{label}: {name}", finite=name in ("heldout_loss", "icl_score"))
                  for name in ("heldout_loss", "icl_score", "k_composition", "k_term_norm", "induction_headroom")}
        return cls(step, data["sha256"], values["heldout_loss"], values["icl_score"], [float(v) for v in loss],
                   heads["previous_token"], heads["prefix_matching"], heads["copying"], values["k_composition"],
                   values["k_term_norm"], data["k_term_verified"], values["induction_headroom"])


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
    #: The token ids the heads' random sequences were drawn from: those the run's held-out text holds, where
    #: that is fewer than the vocabulary; None where every id was drawn (and in files written before it was kept).
    random_tokens: list[int] | None = None

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
            "train_config": self.record.get("train_config"), "random_tokens": self.random_tokens,
        }

    @classmethod
    def from_dict(cls, data, where: str = "a dynamics record") -> "Dynamics":
        """A run's measures as :meth:`to_dict` writes them (``tcircuits dynamics``' ``dynamics.json`` holds one as
        ``run``, another as ``control``), checked: anything else is a one-line :class:`CheckpointError` naming
        ``where``. The training losses are not in the record (an empty list).

        >>> Dynamics.from_dict({"format": "tcircuits.dynamics"})
        Traceback (most recent call last):
        numeric_check.errors.CheckpointError: a dynamics record is not one tcircuits dynamics wrote (format tcircuits.dynamics, format_version 1, checkpoint, n_layers, n_heads, n_ctx, induction_head, writer_head, snapshots)
        """
        keys = ("format", "format_version", "checkpoint", "n_layers", "n_heads", "n_ctx", "induction_head",
                "writer_head", "snapshots")
        if not isinstance(data, dict) or not all(k in data for k in keys) or data["format"] != "tcircuits.dynamics" \
                or data["format_version"] != 1:
            raise CheckpointError(f"{where} is not one tcircuits dynamics wrote (format tcircuits.dynamics, "
                                  f"format_version 1, {', '.join(keys[2:])})")
        sizes = [data[k] for k in ("n_layers", "n_heads", "n_ctx")]
        if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 1 << 20 for n in sizes) or sizes[2] < 1 \
                or not isinstance(data["checkpoint"], str):
            raise CheckpointError(f"{where}: checkpoint, n_layers, n_heads and n_ctx are not a name and sizes (n_ctx >= 1)")
        n_layers, n_heads, n_ctx = sizes
        snapshots = data["snapshots"]
        if not isinstance(snapshots, list) or not snapshots:
            raise CheckpointError(f"{where}: snapshots is not a list of at least one snapshot")
        measures = [SnapshotMeasures.from_dict(s, n_layers, n_heads, n_ctx, where) for s in snapshots]
        if any(a.step >= b.step for a, b in zip(measures, measures[1:])):
            raise CheckpointError(f"{where}: the snapshots' steps do not increase")
        config = data.get("train_config")
        if config is not None and not isinstance(config, dict):
            raise CheckpointError(f"{where}: train_config is not an object or null")
        pool = data.get("random_tokens")
        if pool is not None and not (isinstance(pool, list) and len(pool) >= 2 and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 24 for t in pool) and pool == sorted(set(pool))):
            raise CheckpointError(f"{where}: random_tokens is not null or a list of at least 2 distinct token ids, sorted")
        return cls(data["checkpoint"], n_layers, n_heads, n_ctx, _head(data["induction_head"], n_layers, n_heads, where),
                   _head(data["writer_head"], n_layers, n_heads, where), measures,
                   record={} if config is None else {"train_config": config}, random_tokens=pool)


def read_dynamics(path: Path | str) -> tuple[Dynamics, Dynamics | None]:
    """The run and its control (None where it has none) from a ``dynamics.json`` that ``tcircuits dynamics`` wrote,
    or from a file holding the same two records (``numeric_check/data/kjv_2l.dynamics.json``), checked: a file that
    is not one is a one-line :class:`CheckpointError`."""
    where = f"the dynamics file {str(path)!r}"
    data = read_json(read_text_file(Path(path), "the dynamics file", CheckpointError), where, CheckpointError)
    if not isinstance(data, dict) or "run" not in data:
        raise CheckpointError(f"{where} is not one tcircuits dynamics wrote (an object with run and control)")
    control = data.get("control")
    return (Dynamics.from_dict(data["run"], f"{where} (run)"),
            None if control is None else Dynamics.from_dict(control, f"{where} (control)"))


def _number(value, where: str, finite: bool = False) -> float:
    """``value`` as a float (null: NaN, unless ``finite``), or a :class:`CheckpointError` naming ``where``."""
    if value is None and not finite:
        return math.nan
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (finite and not math.isfinite(value)):
        raise CheckpointError(f"{where} is {str(value)[:40]!r}, not a {'finite ' if finite else ''}number")
    return float(value)


def _grid(value, n_layers: int, n_heads: int, where: str) -> list[list[float]]:
    """A ``[n_layers, n_heads]`` list of lists of scores (null: NaN), or a :class:`CheckpointError`."""
    if not isinstance(value, list) or len(value) != n_layers or not all(isinstance(r, list) and len(r) == n_heads
                                                                        for r in value):
        raise CheckpointError(f"{where} is not {n_layers} lists of {n_heads} scores")
    return [[_number(v, where) for v in row] for row in value]


def _head(value, n_layers: int, n_heads: int, where: str) -> tuple[int, int] | None:
    """A head label (``'L1H7'``) as ``(layer, head)``, checked against the run's shape; null: None."""
    if value is None:
        return None
    found = re.fullmatch(r"L(\d{1,6})H(\d{1,6})", value) if isinstance(value, str) else None
    if found is None or int(found[1]) >= n_layers or int(found[2]) >= n_heads:
        raise CheckpointError(f"{where}: the head {str(value)[:40]!r} is not a head of {n_layers} layers of {n_heads} "
                              "(a label such as 'L1H7')")
    return int(found[1]), int(found[2])


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
    if not _as_written(history):
        raise CheckpointError(f"the history {str(index)!r} is not one train-toy wrote (format tcircuits.history with "
                              "snapshots of distinct steps >= 1, a file and finite losses); train again to remake it")
    for s in history["snapshots"]:
        if Path(s["file"]).name != s["file"] or not (folder / s["file"]).is_file():
            raise CheckpointError(f"the history {str(index)!r} lists {s['file']!r}, which is not in {str(folder)!r}")
    return folder, history


def _as_written(history) -> bool:
    """Whether ``history`` is as train-toy writes it: its format, snapshots of distinct steps from 1, each with
    a file name and finite losses, and finite training losses."""
    snapshots = history.get("snapshots") if isinstance(history, dict) else None
    if not isinstance(snapshots, list) or not snapshots or history.get("format") != "tcircuits.history":
        return False
    entries = all(isinstance(s, dict) and _step(s.get("step")) and isinstance(s.get("file"), str)
                  and _losses(s.get("position_loss")) and _losses([s.get("heldout_loss", 0.0)]) for s in snapshots)
    return entries and len({s["step"] for s in snapshots}) == len(snapshots) and _losses(history.get("training_loss", []))


def _step(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _losses(values) -> bool:
    """Whether ``values`` is a list of finite numbers (losses as the history keeps them)."""
    return isinstance(values, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)


@torch.no_grad()
def measure(checkpoint: Path | str, *, device=None, progress=None) -> Dynamics:
    """Every snapshot of ``checkpoint``'s history measured (see the module docstring), in float64."""
    from numeric_check.circuits.composition import composition_scores
    from numeric_check.circuits.detect import behaviour_scores
    from numeric_check.circuits.ov_qk import copying_scores
    from numeric_check.model.checkpoint import load_checkpoint, stored_content_hash
    from numeric_check.training.toy import training_record_for

    folder, history = read_history(checkpoint)
    entries = sorted(history["snapshots"], key=lambda s: s["step"])
    models = {}

    def model_at(entry):
        path = folder / entry["file"]
        if entry.get("sha256") not in (None, stored_content_hash(path)):
            raise CheckpointError(f"{str(path)!r} is not the snapshot its history lists (another content hash)")
        return load_checkpoint(path, device=device, dtype=torch.float64)

    from numeric_check.training.headroom import induction_guesses, induction_headroom
    from numeric_check.training.history import read_windows, window_losses

    windows = read_windows(checkpoint)  # the held-out windows: each snapshot's loss measured again from its file
    guesses = None if windows is None else induction_guesses(windows)
    last = model_at(entries[-1])
    models[entries[-1]["step"]] = last
    n_layers, n_heads, n_ctx = last.arch.n_layers, max(last.arch.heads_per_layer, default=0), last.cfg.n_ctx
    pool = random_pool(windows, last.cfg.d_vocab)
    induction, writer, last_scores = _tracked_heads(last, pool)
    tokens = _repeated_random(last, pool)
    measures = []
    for i, entry in enumerate(entries):
        model = models.pop(entry["step"], None) or model_at(entry)
        if n_layers:  # the last snapshot's were measured to pick the heads followed
            scores = last_scores if entry is entries[-1] else behaviour_scores(model, batch=RANDOM_BATCH, seed=RANDOM_SEED,
                                                                               tokens=pool)
            previous, prefix = scores.previous_token.tolist(), scores.induction.tolist()
            copying = copying_scores(model).tolist()
        else:
            previous = prefix = copying = []
        k_score, k_norm, verified = (composition_scores(model, "K")[writer + induction].item(), *_k_term(model, tokens, induction, writer)) \
            if induction is not None else (math.nan, math.nan, False)
        # the file's weights in float64 (the history's figure is the training model's, before the save's rounding)
        by_window = None if windows is None else window_losses(model, windows)
        loss = by_window.mean(0).tolist() if by_window is not None else [float(v) for v in entry["position_loss"]]
        headroom = math.nan if by_window is None else induction_headroom(by_window, windows, guesses).gain
        if len(loss) != n_ctx:
            raise CheckpointError(f"the history of {str(checkpoint)!r} gives {len(loss):,} position losses at step "
                                  f"{entry['step']}, where the model reads {n_ctx} positions; train again to remake it")
        measures.append(SnapshotMeasures(entry["step"], entry.get("sha256", ""), sum(loss) / len(loss), icl_score(loss, n_ctx), loss,
                                         previous, prefix, copying, k_score, k_norm, verified, headroom))
        if progress is not None:
            progress(i + 1, len(entries))
    record = training_record_for(checkpoint, last) or {}  # bounded, checked, and the checkpoint's own
    return Dynamics(Path(checkpoint).name, n_layers, n_heads, n_ctx, induction, writer, measures,
                    [float(v) for v in history.get("training_loss", [])], record,
                    None if pool is None else pool.tolist())


def random_pool(windows: torch.Tensor | None, d_vocab: int) -> torch.Tensor | None:
    """The token ids the heads' random sequences are drawn from: those the held-out ``windows`` hold, or None
    (every id) where there are no windows or they hold every id. A model trained on text with a small byte-level
    vocabulary never saw most bytes; random sequences of them measure what it does on tokens it never read.

    >>> random_pool(torch.tensor([[1, 4, 4]]), 6).tolist(), random_pool(torch.tensor([[0, 1]]), 2), random_pool(None, 6)
    ([1, 4], None, None)
    """
    from numeric_check.circuits.behaviour import occurring_tokens

    if windows is None:
        return None
    pool = occurring_tokens(windows, d_vocab)
    return None if len(pool) == d_vocab else pool


def _tracked_heads(model, pool=None):
    """The induction head the run ends with (the last layer's highest prefix-matching score, from layer 1 on),
    the layer-0 head that K-composes with it most (both None for a model of fewer than two layers), and the
    model's behaviour scores they were read from (None without layers)."""
    from numeric_check.circuits.composition import composition_scores
    from numeric_check.circuits.detect import behaviour_scores

    scores = behaviour_scores(model, batch=RANDOM_BATCH, seed=RANDOM_SEED, tokens=pool) if model.arch.n_layers else None
    if model.arch.n_layers < 2:
        return None, None, scores
    layer = model.arch.n_layers - 1
    head = int(torch.nan_to_num(scores.induction[layer], nan=-1.0).argmax())
    k = composition_scores(model, "K")[0, :, layer, head]
    return (layer, head), (0, int(torch.nan_to_num(k, nan=-1.0).argmax())), scores


def _repeated_random(model, pool=None) -> torch.Tensor:
    """One sequence of random tokens (from ``pool``) repeated once, as long as the context allows (at most 64)."""
    from numeric_check.circuits.detect import repeated_tokens

    return repeated_tokens(model, min(model.cfg.n_ctx, 64) // 2, 1, seed=RANDOM_SEED, tokens=pool)


def _k_term(model, tokens, induction, writer) -> tuple[float, bool]:
    """The size of the K-composition term ``Id ⊗ A^{writer} ⊗ …`` of ``induction``'s scores from the token
    source, and whether every term of the order-1 expansion checks against the model."""
    from numeric_check.verification.verify import verify_qk

    report = verify_qk(model, tokens, *induction, max_order=1)
    norm = next((t.norm for t in report.terms if t.composition == "K" and tuple(t.key_heads or ()) == (writer,)
                 and t.key_source == "tok" and t.source == "tok"), math.nan)
    return float(norm), bool(report.passed)
