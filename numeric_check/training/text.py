"""Training data from real text: a byte-level BPE tokenizer, a held-out split, and batches.

The paper's models are language models; :func:`read_texts` reads the text a person gives
(``tcircuits train-toy --text-file FILE…``), :func:`split_text` holds out every ``HELDOUT_EVERY``-th
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
import itertools
import math
import multiprocessing
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from numeric_check.errors import InputFileError, TrainConfigError
from numeric_check.training.batch import RepeatBatch
from numeric_check.training.config import BLOCK_LINES, HELDOUT_EVERY

#: The largest text read (bytes, all files together): the King James Bible is 4.3 MB.
MAX_TEXT_BYTES = 200_000_000
#: Share of control characters (other than tab, newline, carriage return, form feed) above which a file is binary.
BINARY_SHARE = 0.01
#: The budget of the tokenizer's training, whatever the text: the BPE is trained on at most this many characters
#: of the training part (a sample of evenly spaced stretches where the text is longer: 2,048 tokens need far
#: less; the King James Bible, 4.1 MB, is used whole), and no pretoken (a run the byte-level regex keeps whole)
#: is longer than MAX_PRETOKEN characters: a longer run of characters with no space is cut into pieces of that
#: length, in training and in every encoding, so a 20 MB "word" costs time linear in its size.
TOKENIZER_SAMPLE_CHARS, MAX_PRETOKEN = 8_000_000, 256
#: Characters of text encoded per call into the tokenizer (a stopping signal is seen between calls), and the
#: longest line read: text is split, held out and encoded a line at a time, so a longer line is refused.
ENCODE_CHUNK_CHARS, MAX_LINE_BYTES = 200_000, 200_000
_CONTROL = [chr(c) for c in range(32) if chr(c) not in "\t\n\r\f"]


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
        _check_lines(data, what)
        try:
            text = data.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as err:
            raise InputFileError(f"{what} is not UTF-8 text (byte {err.start}: {err.reason}); "
                                 "convert it first, e.g. iconv -f latin1 -t utf-8") from None
        control = sum(map(text.count, _CONTROL))  # each a pass in C: a 50 MB text in a fraction of a second
        if control > BINARY_SHARE * len(text):
            raise InputFileError(f"{what} looks binary ({control:,} control characters in {len(text):,}): expected text")
        parts.append(text.replace("\r\n", "\n"))
    if not parts:
        raise InputFileError("no text files given")
    return "\n".join(parts)


def _check_lines(data: bytes, what: str) -> None:
    """Refuse a line longer than :data:`MAX_LINE_BYTES` (found with one vectorised pass over the bytes)."""
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n"))
    bounds = np.concatenate([[-1], ends, [len(data)]])
    lengths = np.diff(bounds) - 1
    longest = int(lengths.argmax())
    if lengths[longest] > MAX_LINE_BYTES:
        raise InputFileError(f"{what} has a line of {int(lengths[longest]):,} bytes (line {longest + 1:,}), more than the "
                             f"{MAX_LINE_BYTES:,} read: text is split and tokenized a line at a time; break it into lines "
                             "(e.g. fold -s -w 1000 FILE)")


def text_sha256(text: str) -> str:
    """The SHA-256 of ``text`` as UTF-8: what a training record names its data by."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def heldout_block(n_lines: int, block_lines: int = BLOCK_LINES, every: int = HELDOUT_EVERY) -> int | None:
    """The lines per block of the held-out split of a text of ``n_lines`` lines: ``block_lines`` (100) from
    ``every × block_lines`` (2,000) lines on; below, blocks small enough that two of them are held out (a GPL-3
    of 674 lines: blocks of 16, 32 lines held out); None below ``every`` lines, too few to hold out any.

    >>> heldout_block(32_290), heldout_block(674), heldout_block(19)
    (100, 16, None)
    """
    if n_lines >= every * block_lines:
        return block_lines
    return max(1, n_lines // (2 * every)) if n_lines >= every else None


def split_rule(n_lines: int) -> str:
    """What a training record says of the held-out split of a text of ``n_lines`` lines."""
    block = heldout_block(n_lines)
    if block is None:
        return f"none: {n_lines:,} lines are too few to hold out any; evaluated on the training text"
    return f"every {HELDOUT_EVERY}th block of {block} line{'s' if block > 1 else ''}"


def split_text(text: str, block_lines: int | None = None, every: int = HELDOUT_EVERY) -> tuple[str, str]:
    """``(train, held_out)``: the lines of ``text`` in blocks of ``block_lines`` (by default
    :func:`heldout_block`'s for its length), every ``every``-th block (the last of each run of ``every``)
    held out. Deterministic, and spread over the whole text; ``held_out`` is empty for a text of fewer
    than ``every`` lines."""
    lines = text.splitlines()
    block_lines = heldout_block(len(lines)) if block_lines is None else block_lines
    if block_lines is None:
        return "\n".join(lines), ""
    train, held = [], []
    for start in range(0, len(lines), block_lines):
        block = lines[start:start + block_lines]
        (held if (start // block_lines) % every == every - 1 else train).extend(block)
    return "\n".join(train), "\n".join(held)


def training_part(text: str) -> str:
    """What a model trained on ``text`` trained on: its training part (:func:`split_text`), or the whole text
    where it is too short to hold any out (as :meth:`TextData.build` splits it)."""
    train, held = split_text(text)
    return train if held.strip() else text


def pre_tokenizer():
    """The byte-level BPE's pre-tokenizer: runs of :data:`MAX_PRETOKEN` characters with no whitespace cut apart,
    then GPT-2's byte-level regex (for ordinary text, the byte-level regex alone: its pieces are shorter)."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(rf"[^\s]{{{MAX_PRETOKEN}}}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])


def tokenizer_sample(text: str, budget: int = TOKENIZER_SAMPLE_CHARS, stretches: int = 64) -> str:
    """``text`` itself, or where it is longer than ``budget`` characters, ``stretches`` evenly spaced stretches of it
    ``budget // stretches`` characters long, each cut at a line end where one is near (deterministic).

    >>> tokenizer_sample("abc\\n" * 10, budget=100) == "abc\\n" * 10
    True
    >>> len(tokenizer_sample("x" * 10_000, budget=1_000, stretches=4))  # four stretches of 249 and three newlines
    999
    """
    if len(text) <= budget:
        return text
    size, step = budget // stretches - 1, len(text) / stretches  # the stretches and the newlines between them
    parts = []
    for i in range(stretches):
        start = int(i * step)
        if start and text[start - 1] != "\n":  # from the next line's start where one is near
            newline = text.find("\n", start, start + size // 2)
            start = newline + 1 if newline >= 0 else start
        parts.append(text[start:start + size])
    return "\n".join(parts)


def train_tokenizer(text: str, vocab_size: int, fit: bool = False):
    """A byte-level BPE tokenizer (Hugging Face ``tokenizers``) of exactly ``vocab_size`` tokens
    trained on ``text`` (:func:`tokenizer_sample` of it): the 256 bytes and the most frequent merges.
    Deterministic for one text. The training runs in a child process, so Ctrl-C, SIGTERM and SIGHUP
    stop the command at once (native code holds the thread it runs on). A text too small to support
    ``vocab_size`` tokens is a :class:`TrainConfigError` saying how many it does; with ``fit``, the
    tokenizer of the tokens it supports (at most ``vocab_size``) is returned instead."""
    from tokenizers import Tokenizer, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet):
        raise TrainConfigError(f"a byte-level tokenizer needs at least {len(alphabet)} tokens (one per byte); got --d-vocab {vocab_size}")
    tokenizer = Tokenizer.from_str(in_child(_trained_json, tokenizer_sample(text), vocab_size))
    size = tokenizer.get_vocab_size()
    if size < vocab_size and not fit:
        raise TrainConfigError(f"the text supports only {size:,} tokens (every pair seen twice merged), fewer than "
                               f"--d-vocab {vocab_size:,}; lower --d-vocab to at most {size:,} or give more text")
    return tokenizer


def _trained_json(text: str, vocab_size: int) -> str:
    """The tokenizer trained on ``text``, as JSON (what the child process sends back)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one order of merges, whatever the machine
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=[])
    tokenizer.train_from_iterator(text.splitlines(), trainer)
    return tokenizer.to_str()


def in_child(function, *args):
    """``function(*args)`` run in a child process (forked where the system can, so ``args`` are not copied), its
    result returned. The parent waits in short polls, so a stopping signal reaches it at once
    (:mod:`derivations.signals`): the child is killed and the signal goes on. An exception in the child is raised
    again here as a :class:`TrainConfigError` with its message; a child that dies says how."""
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, function, args), daemon=True)
    child.start()
    send.close()
    try:
        while not receive.poll(0.05):
            if not child.is_alive() and not receive.poll(0):
                raise TrainConfigError(f"training the tokenizer stopped: its process ended with code {child.exitcode}"
                                       + (" (out of memory?)" if child.exitcode == -signal.SIGKILL else ""))
        status, value = receive.recv()
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()
    if status == "error":
        raise TrainConfigError(f"training the tokenizer failed: {value}")
    return value


def _child(send, function, args) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if signum is not None and signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)  # the parent decides; the child just ends
    try:
        send.send(("ok", function(*args)))
    except Exception as err:  # noqa: BLE001 - sent to the parent, which reports it in one line
        send.send(("error", str(err).splitlines()[0][:300] if str(err) else type(err).__name__))
    finally:
        send.close()


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
    def beside(cls, checkpoint, d_vocab: int | None = None) -> "CheckpointTokenizer | None":
        """The tokenizer beside ``checkpoint``, or None when it has none. One that cannot be ours is an
        :class:`InputFileError` naming it, before the Rust parser sees it: larger than a JSON file is read,
        nested deeper than a tokenizer nests, not a byte-level BPE (``model.type`` BPE, a vocabulary of
        tokens by id, merges), more merges than tokens (a BPE of N tokens has fewer than N merges), or ids
        at or beyond ``d_vocab`` (the model's vocabulary: a tokenizer of another model)."""
        from tokenizers import Tokenizer

        from numeric_check.files import read_json, read_text_file
        from numeric_check.training.config import tokenizer_path

        path = tokenizer_path(checkpoint)
        if not path.exists():
            return None
        where = f"the tokenizer {str(path)!r} beside the checkpoint"
        text = read_text_file(path, "the tokenizer")
        data = read_json(text, where)
        model = data.get("model") if isinstance(data, dict) else None
        vocab, merges = (model.get("vocab"), model.get("merges")) if isinstance(model, dict) else (None, None)
        if not (isinstance(model, dict) and model.get("type") == "BPE" and isinstance(vocab, dict) and isinstance(merges, list)
                and all(isinstance(i, int) and not isinstance(i, bool) for i in vocab.values())):
            raise InputFileError(f"{where} is not a byte-level BPE as train-toy saves it (model.type BPE with a "
                                 "vocab of token ids and merges); delete it or train the model again")
        if len(merges) >= max(len(vocab), 1):
            raise InputFileError(f"{where} lists {len(merges):,} merges for {len(vocab):,} tokens; a BPE has fewer merges "
                                 "than tokens; delete it or train the model again")
        top = max(vocab.values(), default=-1)
        if d_vocab is not None and top >= d_vocab:
            raise InputFileError(f"{where} has token ids up to {top:,}, but the model's vocabulary is {d_vocab:,} tokens: "
                                 "it belongs to another model; put the model's own tokenizer beside it or delete it")
        try:
            return cls(Tokenizer.from_str(text))
        except Exception as err:  # the Rust parser's errors have no common Python class
            raise InputFileError(f"{where} cannot be read: {str(err).splitlines()[0][:200]}; delete it or train the "
                                 "model again") from None

    def __call__(self, text: str) -> dict:
        return {"input_ids": self.tokenizer.encode(text).ids}

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()


def encode(tokenizer, text: str) -> torch.Tensor:
    """The token ids of ``text`` (lines joined by newlines, as in the file) as a 1-d long tensor."""
    return encode_compact(tokenizer, text).long()


def encode_compact(tokenizer, text: str) -> torch.Tensor:
    """The token ids of ``text`` as a 1-d ``uint16`` tensor (2 bytes a token: a 50 MB text's 12 million tokens in
    24 MB), encoded :data:`ENCODE_CHUNK_CHARS` characters at a time so that a stopping signal is seen between
    calls. A vocabulary beyond 65,536 tokens is kept as ``int32``."""
    wide = tokenizer.get_vocab_size() > np.iinfo(np.uint16).max + 1
    parts, batch, size = [], [], 0
    lines = iter(text.splitlines(keepends=True))
    while True:
        line = next(lines, None)
        if line is not None:
            batch.append(line)
            size += len(line)
        if batch and (line is None or size >= ENCODE_CHUNK_CHARS):
            encodings = tokenizer.encode_batch_fast(batch) if hasattr(tokenizer, "encode_batch_fast") else tokenizer.encode_batch(batch)
            parts.append(np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int32 if wide else np.uint16))
            batch, size = [], 0
        if line is None:
            break
    joined = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32 if wide else np.uint16)
    return torch.from_numpy(joined)


@dataclass(frozen=True)
class TextData:
    """A corpus made ready to train on: its tokenizer, the training and held-out token streams (``uint16``
    tensors, 2 bytes a token: :func:`encode_compact`), and the SHA-256 of the text they came from."""

    tokenizer: object
    train: torch.Tensor
    heldout: torch.Tensor
    sha256: str
    split: str = ""
    heldout_sha256: str | None = None  # of the held-out part as one text (trailing newlines aside); None: none held out

    @classmethod
    def build(cls, text: str, vocab_size: int, n_ctx: int, fit_vocab: bool = False) -> "TextData":
        """Split ``text`` (:func:`split_text`; a text too short to hold out any is evaluated on itself, and
        :attr:`split` says so), train the tokenizer on the training part (of fewer than ``vocab_size`` tokens
        where the text supports fewer and ``fit_vocab``), encode both parts; refuse a text too short for one
        sequence of ``n_ctx + 1`` tokens in either part, saying about how many characters it needs."""
        n_lines = len(text.splitlines())
        train_text, held_text = split_text(text)
        split = split_rule(n_lines)
        if not held_text.strip():  # nothing to hold out: measured on what it trains on, and said so
            held_text = train_text
            if heldout_block(n_lines) is not None:  # held-out blocks of blank lines only
                split = f"none: the held-out blocks of its {n_lines:,} lines are blank; evaluated on the training text"
        tokenizer = train_tokenizer(train_text, vocab_size, fit=fit_vocab)
        held_sha = None if split.startswith("none") else text_sha256(held_text.rstrip("\n"))
        data = cls(tokenizer, encode_compact(tokenizer, train_text), encode_compact(tokenizer, held_text), text_sha256(text),
                   split, held_sha)
        for name, ids, part in (("training", data.train, train_text), ("held-out", data.heldout, held_text)):
            if len(ids) < n_ctx + 1:
                per_token = len(part) / max(len(ids), 1)
                raise TrainConfigError(f"the {name} part of the text is {len(ids):,} tokens ({len(part):,} characters), "
                                       f"fewer than the {n_ctx + 1:,} of one sequence (--n-ctx {n_ctx}): give more text "
                                       f"(at {per_token:.1f} characters a token, {round((n_ctx + 1) * per_token):,} or "
                                       "more; a longer text packs more into a token) or a smaller --n-ctx")
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
    tokens = ids[offsets[:, None] + torch.arange(length)].long()  # [batch, n_ctx + 1] (ids may be held as uint16)
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
