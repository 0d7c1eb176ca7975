"""Training data from real text: a byte-level BPE tokenizer, a held-out split, and batches.

The paper's models are language models; :func:`read_texts` reads the text a person gives
(``tcircuits train-toy --text FILE…``), :func:`split_text` holds out every ``HELDOUT_EVERY``-th
block of ``BLOCK_LINES`` lines (so the held-out text is drawn from the whole corpus, not from
its last book), :func:`train_tokenizer` trains a byte-level BPE on the training part with
Hugging Face ``tokenizers``, and :func:`text_batch` cuts sequences from the token stream at
random offsets. A share of the sequences (``copy_share``) repeat a span of themselves
(copy-augmentation: what lets induction heads form within a CPU budget); the record and every
page that uses such a model say so.

>>> text = "\\n".join(f"line {i} of a small text, with words that repeat" for i in range(2000))
>>> train, held = split_text(text)
>>> len(held.splitlines()), len(train.splitlines())
(100, 1900)
>>> tok = train_tokenizer(train, 300)
>>> tok.get_vocab_size()
300
>>> tok.decode(tok.encode("line 7 of a small text").ids)
'line 7 of a small text'
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from numeric_check.errors import InputFileError, TrainConfigError
from numeric_check.training.batch import RepeatBatch
from numeric_check.training.config import BLOCK_LINES, HELDOUT_EVERY

#: The largest text read (bytes, all files together): the King James Bible is 4.3 MB.
MAX_TEXT_BYTES = 200_000_000
#: Share of control characters (other than tab, newline, carriage return, form feed) above which a file is binary.
BINARY_SHARE = 0.01


def read_texts(paths) -> str:
    """The UTF-8 text of ``paths``, joined by newlines; each file checked before training starts.

    An empty file, one that is not UTF-8, or one that looks binary (a NUL byte, or more than 1 %
    control characters) is an :class:`InputFileError` naming it.
    """
    parts, total = [], 0
    for path in map(Path, paths):
        what = f"the text file {str(path)!r}"
        try:
            if not path.is_file():
                raise InputFileError(f"{what} is not a file")
            total += path.stat().st_size
            if total > MAX_TEXT_BYTES:
                raise InputFileError(f"the text files hold more than the {MAX_TEXT_BYTES:,} bytes read; give fewer or smaller files")
            data = path.read_bytes()
        except OSError as err:
            raise InputFileError(f"cannot read {what}: {err.strerror or err}") from None
        if not data.strip():
            raise InputFileError(f"{what} is empty: expected text to train on")
        if b"\0" in data:
            raise InputFileError(f"{what} is binary (it holds NUL bytes): expected UTF-8 text")
        try:
            text = data.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as err:
            raise InputFileError(f"{what} is not UTF-8 text (byte {err.start}: {err.reason}); "
                                 "convert it first, e.g. iconv -f latin1 -t utf-8") from None
        control = sum(1 for c in text if ord(c) < 32 and c not in "\t\n\r\f")
        if control > BINARY_SHARE * len(text):
            raise InputFileError(f"{what} looks binary ({control:,} control characters in {len(text):,}): expected text")
        parts.append(text.replace("\r\n", "\n"))
    if not parts:
        raise InputFileError("no text files given")
    return "\n".join(parts)


def text_sha256(text: str) -> str:
    """The SHA-256 of ``text`` as UTF-8: what a training record names its data by."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def split_text(text: str, block_lines: int = BLOCK_LINES, every: int = HELDOUT_EVERY) -> tuple[str, str]:
    """``(train, held_out)``: the lines of ``text`` in blocks of ``block_lines``, every ``every``-th
    block (the last of each run of ``every``) held out. Deterministic, and spread over the whole text."""
    lines = text.splitlines()
    train, held = [], []
    for start in range(0, len(lines), block_lines):
        block = lines[start:start + block_lines]
        (held if (start // block_lines) % every == every - 1 else train).extend(block)
    return "\n".join(train), "\n".join(held)


def train_tokenizer(text: str, vocab_size: int):
    """A byte-level BPE tokenizer (Hugging Face ``tokenizers``) of exactly ``vocab_size`` tokens
    trained on ``text``: the 256 bytes and the most frequent merges. Deterministic for one text.
    A text too small to support ``vocab_size`` tokens is a :class:`TrainConfigError` saying how many it does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet):
        raise TrainConfigError(f"a byte-level tokenizer needs at least {len(alphabet)} tokens (one per byte); got --vocab {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, initial_alphabet=alphabet,
                                  show_progress=False, special_tokens=[])
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one order of merges, whatever the machine
    try:
        tokenizer.train_from_iterator(text.splitlines(), trainer)
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous
    size = tokenizer.get_vocab_size()
    if size < vocab_size:
        raise TrainConfigError(f"the text supports only {size:,} tokens (every pair seen twice merged), fewer than "
                               f"--vocab {vocab_size:,}; lower --vocab to at most {size:,} or give more text")
    return tokenizer


class CheckpointTokenizer:
    """The byte-level BPE saved beside a checkpoint trained on text (``NAME.tokenizer.json``), with the calls
    the command line makes of a tokenizer: ``tok(text)["input_ids"]``, ``tok.decode(ids)``, ``len(tok)``.

    >>> tok = CheckpointTokenizer(train_tokenizer("the cat sat on the mat\\n" * 50, 260))
    >>> ids = tok("the mat")["input_ids"]; tok.decode(ids), len(tok)
    ('the mat', 260)
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def beside(cls, checkpoint) -> "CheckpointTokenizer | None":
        """The tokenizer beside ``checkpoint``, or None when it has none; an unreadable one is an
        :class:`InputFileError` naming it."""
        from tokenizers import Tokenizer

        from numeric_check.training.config import tokenizer_path

        path = tokenizer_path(checkpoint)
        if not path.is_file():
            return None
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as err:  # the Rust parser's errors have no common Python class
            raise InputFileError(f"the tokenizer {str(path)!r} beside the checkpoint cannot be read: "
                                 f"{str(err).splitlines()[0][:200]}; delete it or train the model again") from None

    def __call__(self, text: str) -> dict:
        return {"input_ids": self.tokenizer.encode(text).ids}

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()


def encode(tokenizer, text: str) -> torch.Tensor:
    """The token ids of ``text`` (lines joined by newlines, as in the file) as a 1-d long tensor."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(text.splitlines(keepends=True)):
        ids.extend(encoding.ids)
    return torch.tensor(ids, dtype=torch.long)


@dataclass(frozen=True)
class TextData:
    """A corpus made ready to train on: its tokenizer, the training and held-out token streams,
    and the SHA-256 of the text they came from."""

    tokenizer: object
    train: torch.Tensor
    heldout: torch.Tensor
    sha256: str

    @classmethod
    def build(cls, text: str, vocab_size: int, n_ctx: int) -> "TextData":
        """Split ``text``, train the tokenizer on the training part, encode both parts; refuse a text
        too short for one sequence of ``n_ctx + 1`` tokens in either part."""
        train_text, held_text = split_text(text)
        if not held_text.strip():
            raise TrainConfigError(f"the text has {len(text.splitlines()):,} lines, too few to hold out any: the held-out "
                                   f"part is every {HELDOUT_EVERY}th block of {BLOCK_LINES} lines, so at least "
                                   f"{HELDOUT_EVERY * BLOCK_LINES:,} lines are needed")
        tokenizer = train_tokenizer(train_text, vocab_size)
        data = cls(tokenizer, encode(tokenizer, train_text), encode(tokenizer, held_text), text_sha256(text))
        for name, ids in (("training", data.train), ("held-out", data.heldout)):
            if len(ids) < n_ctx + 1:
                raise TrainConfigError(f"the {name} part of the text is {len(ids):,} tokens, shorter than one sequence "
                                       f"of {n_ctx + 1}; give more text or a smaller --n-ctx")
        return data


def text_batch(ids: torch.Tensor, n_ctx: int, batch_size: int, generator: torch.Generator, *,
               copy_share: float, seg_min: int, seg_max: int):
    """``batch_size`` sequences of ``n_ctx + 1`` tokens cut from ``ids`` at random offsets, as a
    :class:`~numeric_check.training.toy.RepeatBatch` (the last token of each is a target only).

    In a share ``copy_share`` of them (a coin per sequence) a span of ``seg_min..seg_max`` tokens
    (log-uniform) is copied to a later place of the same sequence, overwriting what stood there:
    ``copies[b, 0]`` is ``(source start, copy start, length)`` (``-1`` where none), and
    ``repeat_mask`` marks the tokens an induction head can predict: those whose pair (previous token,
    token) occurred earlier in the sequence (:func:`induction_mask`) — a copy's tokens after its first,
    and the text's own repeats.

    >>> g = torch.Generator().manual_seed(0)
    >>> b = text_batch(torch.arange(1000), 16, 4, g, copy_share=1.0, seg_min=2, seg_max=8)
    >>> b.tokens.shape, b.copies.shape
    (torch.Size([4, 17]), torch.Size([4, 1, 3]))
    >>> src, start, n = b.copies[0, 0].tolist()
    >>> bool((b.tokens[0, src:src + n] == b.tokens[0, start:start + n]).all()) and start >= src + n
    True
    """
    length = n_ctx + 1
    offsets = torch.randint(0, len(ids) - length + 1, (batch_size,), generator=generator)
    tokens = ids[offsets[:, None] + torch.arange(length)]  # [batch, n_ctx + 1]
    copies = torch.full((batch_size, 1, 3), -1, dtype=torch.long)
    u = torch.rand((4, batch_size), generator=generator, dtype=torch.float64)
    lo, hi = math.log(seg_min), math.log(min(seg_max, length // 2) + 1)
    spans = (lo + u[1] * (hi - lo)).exp().floor().long().clamp(seg_min, max(seg_min, min(seg_max, length // 2)))
    for b in range(batch_size):
        n = int(spans[b])
        if not u[0, b] < copy_share or 2 * n > length:
            continue
        start = n + int(u[2, b] * (length - 2 * n + 1))  # the copy starts in n .. length - n
        src = int(u[3, b] * (start - n + 1))  # its source ends at or before the copy's start
        tokens[b, start:start + n] = tokens[b, src:src + n].clone()
        copies[b, 0] = torch.tensor([src, start, n])
    return RepeatBatch(tokens, copies, induction_mask(tokens))


def induction_mask(tokens: torch.Tensor) -> torch.Tensor:
    """``[batch, pos]`` True where the pair (``tokens[p - 1]``, ``tokens[p]``) occurred earlier in the
    same sequence: the tokens that looking back to the previous occurrence of the current token and
    copying its successor predicts (an induction head's tokens).

    >>> induction_mask(torch.tensor([[5, 6, 7, 5, 6, 8, 5, 6]])).int().tolist()
    [[0, 0, 0, 0, 1, 0, 0, 1]]
    """
    pairs = tokens[:, :-1] * (int(tokens.max()) + 1) + tokens[:, 1:]  # [batch, pos - 1]: pair ending at p
    n = pairs.shape[1]
    earlier = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril(-1)  # [p, q]: q < p
    seen = ((pairs[:, :, None] == pairs[:, None, :]) & earlier).any(-1)  # [batch, pos - 1]
    return torch.cat([torch.zeros_like(seen[:, :1]), seen], dim=1)
