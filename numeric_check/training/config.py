"""The configuration of a toy training run, validated on construction.

Kept apart from :mod:`numeric_check.training.toy` so that the command line can show the
defaults in ``tcircuits train-toy --help`` without importing torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from derivations.architecture import POSITIONAL_KINDS, Architecture
from derivations.errors import ArchitectureError
from numeric_check.errors import TrainConfigError

MAX_PARAMETERS = 50_000_000  # a toy model; larger ones are refused before anything is allocated
MAX_REPEATS = 1000  # repeats per sequence: far more than a toy context holds
# fields added after records were first written, at the values those runs used
LEGACY_FIELDS = {"warmup_steps": 0, "decay_steps": 0, "bigram_successors": 0, "skip_trigrams": 0,
                 "train_last_position": False, "text_sha256": None, "copy_share": 0.0,
                 "attention_kernel": "einsum", "pos_init": "normal"}
#: Training on text: lines per block of the held-out split, and which block is held out (every HELDOUT_EVERY-th).
BLOCK_LINES, HELDOUT_EVERY = 100, 20
#: Snapshots kept by ``train-toy --text-file`` unless ``--snapshots`` says otherwise (:mod:`numeric_check.training.history`).
DEFAULT_SNAPSHOTS = 32
#: How training computes attention: ``"sdpa"`` torch's fused causal kernel (the pattern never formed; 4 to 6x faster
#: at 512 positions on a CPU), ``"einsum"`` scores and pattern as analysis forms them (every run before 2026-12-06).
ATTENTION_KERNELS = ("sdpa", "einsum")
#: How the positional embedding starts: ``"normal"`` drawn like the other weights, ``"sinusoidal"`` the sines and cosines
#: of Vaswani et al. (2017), still learnt (:func:`~numeric_check.training.toy.sinusoidal_positions`).
POS_INITS = ("normal", "sinusoidal")
MAX_ACTIVATIONS = 2**28  # batch × n_ctx × the widest activation (logits, or q, k and v): 1 GiB in float32


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run; validated on construction.

    Defaults give induction heads across the context, on repeats of every length (at most 1 nat
    on the second copy of a repeat of 4 tokens at every offset), in about 15 minutes of
    CPU time on one thread (2-layer model): vocab 128, context 64, up to ``max_repeats`` 8 repeats
    per sequence of 3–32 tokens (``seg_min``–``seg_max``, log-uniform), ``d_model`` 128, 4 heads of
    32, ``qk_only`` positions, no layer norm, weights drawn ``N(0, 0.1²)`` (``init_std``), AdamW lr
    1e-3 reached over 100 steps (``warmup_steps``), held, and brought down linearly to 0 over the
    last 4,500 (``decay_steps``), batch 64, 14,000 steps. Left ``None``, ``warmup_steps`` is
    ``min(100, steps // 10)`` and ``decay_steps`` ``min(4500, (steps - warmup_steps) // 3)``, so any
    ``steps`` gets the same shape of schedule; the record keeps the numbers.

    The tokens between the repeats follow a bigram table and hold planted skip-trigrams,
    so that a zero-layer model has bigrams to learn and a one-layer model skip-trigrams: each token
    has ``bigram_successors`` likely successors (4; left ``None``, ``min(4, d_vocab // 4)``), each
    column of them a random permutation of the vocabulary so that every token is as common as any
    other, followed with probability ``bigram_follow`` 0.75, else a token drawn uniformly;
    ``skip_trigrams`` source tokens A (8; left ``None``, ``min(8, d_vocab // 16)``) each have two
    (destination B, out C) pairs, and up to ``trigrams_per_sequence`` 3 times per sequence one of
    those pairs is planted: A at a random position, later B followed by C ("keep … in mind",
    "keep … at bay"). The table and the triples are drawn from ``seed`` alone
    (:func:`~numeric_check.training.toy.data_tables`). ``bigram_successors=0`` and
    ``skip_trigrams=0`` give the uniformly random tokens of the models trained before, which a
    record without these fields describes. Measured here: with one repeat of 16–32
    tokens per sequence (the first copy never past position 32) the previous-token head learnt
    only the first half of the context; with repeats placed left to right only, sources were rare
    near the end and it stopped near position 54–60; with segments of 8–24 tokens and one repeat
    no phase change came within 4,000 steps. The width and the schedule are what short repeats
    need: ``d_model`` 64 at a constant rate stayed at 1.0–1.75 nats on repeats of 4 tokens past
    offset 24 (5,000 steps; 8,000 and 10,000 with more repeats: 0.94–1.25), 128 wide with the
    decay at 0.4–0.9; a rate of 2e-3 without weight decay, or repeats from 2 tokens, did no better.
    On the bigram data (2-layer runs of 14,000 steps, worst cell of repeats of 4 tokens on
    random tokens): the defaults 1.63 nats; ``bigram_follow`` 0.5 1.18, and virtual heads carried part of
    the bigrams through self-attending layer-0 heads (-1.00 nats against the heads' -2.78 on repeated
    tokens); ``d_model`` 256 with 0.5 and ``train_last_position`` 0.98, virtual -0.16 against -3.58,
    direct path -0.74; the same with ``max_repeats`` 12 1.14; ``d_model`` 256, 0.4 and
    ``train_last_position`` 0.93, virtual -0.10 against -3.74, direct -0.61: the shipped 2-layer model
    (saved in float16 to stay under 1 MB). At 256 wide one layer-0 head attends to i-1 in part (0.34)
    and K-composes at 0.106, above 1.5 × the random 0.063; the companion shows it and takes as controls
    only the heads that attend to i-1 below 0.2 (0.074 at most).

    >>> TrainConfig(n_layers=1).arch.describe()
    '1 layer x 4 heads, qk_only positions'
    >>> TrainConfig(n_ctx=32, seg_max=24)
    Traceback (most recent call last):
    ...
    numeric_check.errors.TrainConfigError: two copies of a segment of up to seg_max=24 tokens need 48 positions, but n_ctx=32; lower seg_max to at most 16 or raise n_ctx
    """

    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 128
    d_head: int = 32
    d_vocab: int = 128
    n_ctx: int = 64
    seg_min: int = 3
    seg_max: int = 32
    max_repeats: int = 8
    positional: str = "qk_only"
    layer_norm: bool = False
    steps: int = 14000
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int | None = None
    decay_steps: int | None = None
    weight_decay: float = 0.01
    seed: int = 0
    eval_batches: int = 8
    init_std: float | None = 0.1
    bigram_successors: int | None = None
    bigram_follow: float = 0.75
    skip_trigrams: int | None = None
    trigrams_per_sequence: int = 3
    train_last_position: bool = False
    text_sha256: str | None = None
    copy_share: float = 0.0
    attention_kernel: str = "sdpa"
    pos_init: str = "normal"

    def __post_init__(self) -> None:
        if self.text_sha256 is not None:  # real text: no planted structure, every position trained
            if not isinstance(self.text_sha256, str) or len(self.text_sha256) != 64:
                raise TrainConfigError(f"text_sha256 must be the 64 hex digits of a SHA-256, got {self.text_sha256!r}")
            for name, value in (("bigram_successors", 0), ("skip_trigrams", 0), ("train_last_position", True)):
                object.__setattr__(self, name, value)
        for name in ("n_heads", "d_model", "d_head", "n_ctx", "steps", "batch_size", "eval_batches", "max_repeats"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("n_layers", self.n_layers, minimum=0)
        _check_int("d_vocab", self.d_vocab, minimum=2)
        _check_int("seed", self.seed, minimum=0)
        _check_int("seg_min", self.seg_min, minimum=2)
        _check_int("seg_max", self.seg_max, minimum=2)
        if self.seg_min > self.seg_max:
            raise TrainConfigError(
                f"seg_min={self.seg_min} is larger than seg_max={self.seg_max}; expected seg_min <= seg_max"
            )
        if 2 * self.seg_max > self.n_ctx:
            raise TrainConfigError(
                f"two copies of a segment of up to seg_max={self.seg_max} tokens need "
                f"{2 * self.seg_max} positions, but n_ctx={self.n_ctx}; lower seg_max to at most "
                f"{self.n_ctx // 2} or raise n_ctx"
            )
        if self.max_repeats > MAX_REPEATS:  # each is a row of every batch's copy table, placed one by one
            raise TrainConfigError(f"max_repeats must be at most {MAX_REPEATS:,}, got {self.max_repeats:,}")
        if self.bigram_successors is None:  # by default as many as the vocabulary allows, up to 4 and 8
            object.__setattr__(self, "bigram_successors", min(4, self.d_vocab // 4))
        if self.skip_trigrams is None:
            object.__setattr__(self, "skip_trigrams", min(8, self.d_vocab // 16))
        _check_int("bigram_successors", self.bigram_successors, minimum=0)
        _check_int("skip_trigrams", self.skip_trigrams, minimum=0)
        _check_int("trigrams_per_sequence", self.trigrams_per_sequence, minimum=0)
        if self.bigram_successors >= self.d_vocab:
            raise TrainConfigError(f"bigram_successors={self.bigram_successors} must be below d_vocab={self.d_vocab}")
        if 5 * self.skip_trigrams > self.d_vocab:
            raise TrainConfigError(f"skip_trigrams={self.skip_trigrams} need 5 distinct tokens each (a source, two "
                                   f"destinations, two outs), {5 * self.skip_trigrams}, but d_vocab={self.d_vocab}; "
                                   f"lower skip_trigrams to at most {self.d_vocab // 5}")
        if not isinstance(self.train_last_position, bool):
            raise TrainConfigError(f"train_last_position must be True or False, got {self.train_last_position!r}")
        for name in ("bigram_follow", "copy_share"):
            p = getattr(self, name)
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
                raise TrainConfigError(f"{name} must be a probability in [0, 1], got {p!r}")
        if self.copy_share and self.text_sha256 is None:
            raise TrainConfigError("copy_share applies to training on text (text_sha256); the planted data hold repeats of their own")
        self._check_sizes()
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise TrainConfigError(f"unknown attention_kernel {self.attention_kernel!r}; expected one of "
                                   + ", ".join(repr(k) for k in ATTENTION_KERNELS))
        if self.pos_init not in POS_INITS:
            raise TrainConfigError(f"unknown pos_init {self.pos_init!r}; expected one of " + ", ".join(map(repr, POS_INITS)))
        if self.pos_init != "normal" and self.positional == "none":
            raise TrainConfigError(f"pos_init {self.pos_init!r} starts a positional embedding, and positional is 'none'; "
                                   "use positional 'qk_only' or 'standard'")
        if self.positional not in POSITIONAL_KINDS:
            raise TrainConfigError(
                f"unknown positional kind {self.positional!r}; expected one of "
                + ", ".join(repr(k) for k in POSITIONAL_KINDS)
            )
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise TrainConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.lr == 0:
            raise TrainConfigError("lr must be > 0, got 0")
        if self.warmup_steps is None:  # by default a schedule that fits any number of steps
            object.__setattr__(self, "warmup_steps", min(100, self.steps // 10))
        if self.decay_steps is None:
            object.__setattr__(self, "decay_steps", min(4500, (self.steps - self.warmup_steps) // 3))
        for name in ("warmup_steps", "decay_steps"):
            _check_int(name, getattr(self, name), minimum=0)
        if self.warmup_steps + self.decay_steps > self.steps:
            raise TrainConfigError(f"warmup_steps={self.warmup_steps} and decay_steps={self.decay_steps} add up to more "
                                   f"than steps={self.steps}; expected warmup_steps + decay_steps <= steps")
        if self.init_std is not None and (
            isinstance(self.init_std, bool)
            or not isinstance(self.init_std, (int, float))
            or not (math.isfinite(self.init_std) and self.init_std > 0)
        ):
            raise TrainConfigError(f"init_std must be None or a finite number > 0, got {self.init_std!r}")

    def _check_sizes(self) -> None:
        """Refuse, with Python ints and before any tensor exists, a model or a batch too
        large for a toy run (a 10**18-wide model, a batch of 10**8 sequences)."""
        try:
            arch = Architecture(self.n_layers, self.n_heads)
        except ArchitectureError as err:
            raise TrainConfigError(f"bad architecture: {err}") from None
        parameters = (4 * arch.n_heads_total * self.d_head * self.d_model + 2 * self.d_vocab * self.d_model
                      + self.n_ctx * self.d_model)
        if parameters > MAX_PARAMETERS:
            raise TrainConfigError(f"the model would have {parameters:,} parameters, more than the {MAX_PARAMETERS:,} "
                                   "of a toy run; use smaller --d-model, --d-head, --d-vocab or --n-ctx")
        # per position, the widest activation: the logits, or a layer's queries, keys and values
        width = max(self.d_vocab, 3 * self.n_heads * self.d_head, self.d_model)
        for batch, name in ((self.batch_size, "batch_size"), (self.eval_batches * self.batch_size, "eval_batches × batch_size")):
            if batch * self.n_ctx * width > MAX_ACTIVATIONS:
                raise TrainConfigError(f"{name} {batch:,} sequences of {self.n_ctx:,} positions × {width:,} activations "
                                       f"would need {batch * self.n_ctx * width * 4 / 2**30:,.1f} GiB at once; use fewer "
                                       "sequences or a narrower model")

    @property
    def on_text(self) -> bool:
        """Whether this run trains on real text (:mod:`numeric_check.training.text`) rather than planted data."""
        return self.text_sha256 is not None

    @property
    def arch(self) -> Architecture:
        """The :class:`~derivations.architecture.Architecture` this run trains."""
        return Architecture(self.n_layers, self.n_heads, positional=self.positional, layer_norm=self.layer_norm)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def lr_factor(self, step: int) -> float:
        """The learning rate at ``step`` (from 0) as a fraction of ``lr``: rising linearly over the first
        ``warmup_steps``, then held, then falling linearly to 0 over the last ``decay_steps``.

        >>> c = TrainConfig(steps=10, warmup_steps=2, decay_steps=4)
        >>> [round(c.lr_factor(i), 2) for i in range(10)]
        [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2]
        """
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        left = self.steps - step  # steps still to take, this one included
        return min(1.0, left / (self.decay_steps + 1)) if self.decay_steps else 1.0

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        """Inverse of :meth:`to_dict`; unknown keys are an error that lists the known ones. A record
        written before the learning-rate schedule existed trained at a constant rate."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TrainConfigError(f"unknown TrainConfig fields {unknown}; expected some of {sorted(known)}")
        return cls(**{**LEGACY_FIELDS, **data})


def tokenizer_path(checkpoint) -> Path:
    """Where the tokenizer of a model trained on text lies: beside its checkpoint, ``NAME.tokenizer.json``.

    >>> tokenizer_path("models/lang_2l.safetensors").as_posix()
    'models/lang_2l.tokenizer.json'
    """
    return Path(checkpoint).with_suffix(".tokenizer.json")


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TrainConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
