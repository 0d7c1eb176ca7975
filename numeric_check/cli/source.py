"""The model a person studies, on their own prompt: the numeric commands' ``--hf`` / ``--tl`` model
and ``--text`` / ``--text-file`` tokens.

``--hf NAME_OR_DIR`` loads a Hugging Face causal LM with the library's own ``from_pretrained``
resolution (a folder saved with ``save_pretrained``, or a name your cache or network serves;
``--revision``), and its tokenizer (``AutoTokenizer``) from the same place; ``--tl NAME`` loads a
TransformerLens ``HookedTransformer.from_pretrained``, ``--tl FOLDER`` one saved with
:func:`~numeric_check.conversion.tl_folder.save_tl` (:mod:`numeric_check.conversion.tl_folder`). Text is tokenized with the model's own
tokenizer, as the model expects it (Hugging Face: the tokenizer's default special tokens;
TransformerLens: ``to_tokens``, which prepends BOS). The conversion is checked against the loaded
model on probe tokens *and on these tokens* before anything is computed
(:mod:`numeric_check.conversion.source_check`).

A Hugging Face folder is data (:mod:`numeric_check.conversion.load`: no code, no pickle beyond tensors, the
config held to the stored tensors); the prompt and ``--target`` are read by the tokenizer, within a
time bound, before the weights. Nothing here prints but the progress line on a terminal
(:class:`Status`); every failure is a :class:`~numeric_check.errors.NumericCheckError` in one line.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numeric_check.errors import ModelLoadError, UnsupportedModel, VerifyCLIError

MAX_TOKEN_LINE = 16  # tokens shown per sequence in a report's token line
TOKENIZE_SECONDS = 20.0  # a prompt or target is tokenized within this, or the tokenizer is refused


def parse_token(text: str) -> int | str:
    """An id when ``text`` is digits, else the text (for the tokenizer to resolve).

    >>> parse_token("42"), parse_token(" Paris")
    (42, ' Paris')
    """
    return int(text) if re.fullmatch(r"\d{1,18}", text) else text


@contextmanager
def _quiet_loading():
    """Hugging Face's loading progress bars off for the block (errors stay one line), then as they were."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def add_model_arguments(group: argparse._ArgumentGroup) -> None:
    """``--hf``, ``--revision``, ``--tl`` (the model's dtype and device are the command's ``--dtype``/``--device``),
    and ``--explain``: a refusal's detail after its one line (the CLI prints it)."""
    group.add_argument("--hf", metavar="NAME_OR_DIR",
                       help="a Hugging Face causal LM: a folder saved with save_pretrained, or a name from_pretrained "
                            "resolves (your cache, or the network); its tokenizer is loaded from the same place")
    group.add_argument("--revision", metavar="REV", help="with --hf: the branch, tag or commit to load")
    group.add_argument("--tl", metavar="NAME_OR_DIR",
                       help="a TransformerLens model: a name HookedTransformer.from_pretrained knows, or a folder saved "
                            "with numeric_check.save_tl (its config, state dict and tokenizer)")
    group.add_argument("--explain", action="store_true",
                       help="when the model is refused, print the diagnosis after the one-line error (a conversion "
                            "that differs from its source: where the residual streams part, what changed in the model)")


def add_text_arguments(group: argparse._ArgumentGroup) -> None:
    """``--text`` and ``--text-file``: a prompt tokenized by the model's own tokenizer."""
    group.add_argument("--text", metavar="TEXT", help="a prompt, tokenized by the model's own tokenizer (with --hf or --tl)")
    group.add_argument("--text-file", type=Path, metavar="FILE", help="a UTF-8 file holding the prompt (instead of --text)")


@dataclass
class UserModel:
    """A source model and its tokenizer, before conversion: ``name`` is what reports call it."""

    source: Any
    tokenizer: Any | None
    name: str
    library: str  # "hf" or "tl"
    prompt_ids: Any | None = None  # the prompt's ids as read before the weights (--hf), or None
    status: Any = None  # the terminal's progress line (:class:`Status`), cleared by :func:`convert`
    accept_source_precision: bool = False  # --accept-source-precision: a half-precision source that cannot be copied


def wants_user_model(args: argparse.Namespace) -> bool:
    return getattr(args, "hf", None) is not None or getattr(args, "tl", None) is not None


def check_model_flags(args: argparse.Namespace, other_flags: list[str]) -> None:
    """One model at a time: ``--hf``, ``--tl`` and ``--checkpoint`` exclude each other and the
    random model's ``other_flags``; ``--revision`` goes with ``--hf``; text needs a tokenizer."""
    chosen = [f for f, v in (("--hf", args.hf), ("--tl", args.tl), ("--checkpoint", getattr(args, "checkpoint", None)))
              if v is not None]
    if len(chosen) > 1:
        raise VerifyCLIError(f"give one model: {' and '.join(chosen)} both name one")
    if chosen and chosen[0] != "--checkpoint" and other_flags:
        raise VerifyCLIError(f"{chosen[0]} describes the model; do not also give {', '.join(other_flags)}")
    if args.revision is not None and args.hf is None:
        raise VerifyCLIError("--revision goes with --hf")
    texts = [f for f, v in (("--text", args.text), ("--text-file", args.text_file)) if v is not None]
    if len(texts) > 1:
        raise VerifyCLIError("give the prompt once: --text or --text-file, not both")
    if texts and getattr(args, "tokens", None) is not None:
        raise VerifyCLIError(f"give the tokens once: {texts[0]} or --tokens, not both")
    if texts and (not chosen or (chosen[0] == "--checkpoint" and not _has_tokenizer(args.checkpoint))):
        raise VerifyCLIError(f"{texts[0]} needs the model's tokenizer: load the model with --hf or --tl, or a "
                             "--checkpoint trained on text (its NAME.tokenizer.json beside it), or give token ids with --tokens")


def _has_tokenizer(checkpoint) -> bool:
    """Whether a checkpoint trained on text has its tokenizer beside it (``NAME.tokenizer.json``): anything at that
    name, so that one that is not a file (a folder, a FIFO) is refused by name when it is read."""
    from numeric_check.training.config import tokenizer_path

    return tokenizer_path(checkpoint).exists()


def load_user_model(args: argparse.Namespace, dtype: Any, device: Any) -> UserModel:
    """The ``--hf`` or ``--tl`` model in ``dtype`` on ``device``, in eval mode, with its tokenizer.

    A Hugging Face folder is read as data (:mod:`numeric_check.conversion.load`): its tokenizer first, so
    that the prompt and ``--target`` are checked before the weights are read; a name is looked up in
    the cache at once when the hub cannot be reached. Progress is shown on a terminal."""
    for flag, text in _texts_given(args):
        check_utf8(text, flag)
    from numeric_check.conversion.load import check_hub_environment

    check_hub_environment()  # before the Hugging Face libraries read it at import
    status = Status(enabled=not getattr(args, "quiet", False))  # --quiet (it read a dest no option had)
    try:
        user = (_load_transformer_lens(args.tl, dtype, device, status) if args.tl is not None
                else _load_hugging_face(args, dtype, device, status))
    except BaseException:
        status.done()
        raise
    user.status = status
    user.accept_source_precision = bool(getattr(args, "accept_source_precision", False))
    return user


def _load_hugging_face(args: argparse.Namespace, dtype: Any, device: Any, status: "Status") -> UserModel:
    """The folder found, its tokenizer read and the arguments checked (no torch yet), then the weights."""
    try:
        import transformers  # noqa: F401 - only whether it is installed
    except ImportError:
        raise ModelLoadError("--hf needs Hugging Face transformers: pip install 'tcircuits[hf]'") from None
    from numeric_check.conversion import load

    what = f"the Hugging Face model {args.hf!r}" + (f" at revision {args.revision!r}" if args.revision else "")
    status.say(f"finding {what}")
    folder = _loading(what, lambda: load.model_folder(args.hf, args.revision))
    _loading(what, lambda: load.model_config(folder))  # a config error as one, not as the tokenizer's (it reads it too)
    needs_tokenizer = any(v is not None for v in (args.text, args.text_file, getattr(args, "target", None),
                                                   getattr(args, "logit_diff", None)))
    status.say(f"reading the tokenizer of {what}")
    try:
        tokenizer = _loading(f"the tokenizer of {what}", lambda: load.load_tokenizer(folder))
    except ModelLoadError:
        if needs_tokenizer:
            raise
        tokenizer = None  # labels only: a model saved without a tokenizer still runs on --tokens
    user = UserModel(None, tokenizer, f"{Path(args.hf).name or args.hf} (Hugging Face)", "hf")
    _check_arguments_early(args, user, _loading(what, lambda: load.read_config(folder)))
    status.say(f"loading {what}")
    import torch

    from numeric_check.model.config import resolve_device, resolve_dtype

    dtype, device = resolve_dtype(dtype), resolve_device(device)
    model = _loading(what, lambda: load.load_model(folder, dtype))
    with torch.no_grad():
        user.source = model.to(device).eval()
    status.say(f"converting {what} and checking it against the source")
    return user


def _load_transformer_lens(name: str, dtype: Any, device: Any, status: "Status") -> UserModel:
    """The folder ``name`` saved with ``save_tl`` (when ``name`` is on disk), or
    ``HookedTransformer.from_pretrained(name)``, from the Hugging Face cache alone (an error at once
    naming it) when the hub cannot be reached: before TransformerLens is imported when the cache holds
    no model at all."""
    import importlib.util

    if importlib.util.find_spec("transformer_lens") is None:
        raise ModelLoadError("--tl needs TransformerLens: pip install 'tcircuits[tl]'")
    from numeric_check.conversion.tl_folder import is_tl_folder, load_tl

    if is_tl_folder(name):  # a folder a person saved (numeric_check.save_tl): read from disk, no hub
        from numeric_check.model.config import resolve_device, resolve_dtype

        what = f"the TransformerLens folder {name!r}"
        status.say(f"loading {what}")
        model = _loading(what, lambda: load_tl(name, resolve_dtype(dtype), resolve_device(device)))
        status.say(f"converting {what} and checking it against the source")
        return UserModel(model, model.tokenizer, f"{Path(name).name or name} (TransformerLens)", "tl")
    from numeric_check.conversion.load import cache_holds_models, hub_offline, hub_reachable, offline_message

    status.say(f"finding the TransformerLens model {name!r}")
    offline = not hub_reachable()
    if offline and not cache_holds_models():
        raise ModelLoadError(f"cannot load the TransformerLens model: {offline_message(name)}")
    from numeric_check.conversion.tl_folder import tl_class
    from numeric_check.model.config import resolve_device, resolve_dtype

    HookedTransformer = tl_class("HookedTransformer", f"--tl {name} loads")

    dtype, device = resolve_dtype(dtype), resolve_device(device)
    status.say(f"loading the TransformerLens model {name!r}")
    try:
        with hub_offline(offline), warnings.catch_warnings():
            # TransformerLens 3 asks its own callers to move to TransformerBridge; nothing a tcircuits user can act on
            warnings.filterwarnings("ignore", message=r"HookedTransformer\.from_pretrained is deprecated")
            model = _loading(f"the TransformerLens model {name!r}",
                             lambda: HookedTransformer.from_pretrained(name, device=str(device), dtype=dtype))
    except ModelLoadError as error:
        if offline and any(word in str(error) for word in ("offline", "Offline", "cache", "LocalEntryNotFound")):
            raise ModelLoadError(f"cannot load the TransformerLens model: {offline_message(name)}") from None
        raise
    status.say(f"converting the TransformerLens model {name!r} and checking it against the source")
    return UserModel(model.eval(), getattr(model, "tokenizer", None), f"{name} (TransformerLens)", "tl")


def _texts_given(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(flag, text)`` of every text argument a tokenizer will read (``--text``, ``--target``, ``--logit-diff``)."""
    given = [("--text", args.text)] if getattr(args, "text", None) is not None else []
    if isinstance(getattr(args, "target", None), str):
        given.append(("--target", args.target))
    given += [("--logit-diff", t) for t in getattr(args, "logit_diff", None) or () if isinstance(t, str)]
    return given


def check_utf8(text: str, flag: str) -> None:
    """``text`` is valid Unicode: an argument that was not UTF-8 arrives with lone surrogates
    (``\\udcff``), which no tokenizer can read.

    >>> check_utf8("a\\udcffb", "--text")
    Traceback (most recent call last):
    numeric_check.errors.VerifyCLIError: --text is not valid UTF-8: the byte 0xff at character 1; give UTF-8 text
    """
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            byte = f"the byte 0x{ord(ch) - 0xDC00:02x}" if "\udc80" <= ch <= "\udcff" else f"a lone surrogate U+{ord(ch):04X}"
            raise VerifyCLIError(f"{flag} is not valid UTF-8: {byte} at character {i}; give UTF-8 text")


def _check_arguments_early(args: argparse.Namespace, user: UserModel, config: dict) -> None:
    """``--qk``'s head held to the config's layers and heads; the prompt and ``--target``/``--logit-diff``
    read by the tokenizer and held to the config's context and vocabulary, ``--position`` to the
    prompt: all before the weights are loaded. The prompt's ids are kept."""
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    _check_head_early(getattr(args, "qk", None), text_config)
    if user.tokenizer is None:
        return
    d_vocab = _config_int(text_config, "vocab_size", "n_vocab")
    n_ctx = _config_int(text_config, "n_positions", "max_position_embeddings", "n_ctx", "seq_length")
    user.prompt_ids = text_tokens(args, user, n_ctx, d_vocab)
    goal = getattr(args, "target", None), getattr(args, "logit_diff", None)
    if user.prompt_ids is not None and isinstance(getattr(args, "position", None), int) and any(g is not None for g in goal):
        from numeric_check.circuits.attribution import _position

        _position(args.position, user.prompt_ids.shape[1])
    if any(g is not None for g in goal) and d_vocab is not None:
        from numeric_check.circuits.attribution import resolve_target

        target, diff = goal
        resolve_target(None if target is None else parse_token(target),
                       None if diff is None else tuple(parse_token(t) for t in diff), d_vocab,
                       BoundedTokenizer(user.tokenizer))


def _config_int(config: dict, *keys: str) -> int | None:
    """The first of ``keys`` that ``config`` gives as a positive int, or ``None``."""
    return next((v for k in keys if isinstance(v := config.get(k), int) and not isinstance(v, bool) and v > 0), None)


def _check_head_early(qk: Any, config: dict) -> None:
    """``--qk LAYER HEAD`` against the layers and heads config.json gives (the converted model has
    no more), with the words :meth:`Architecture.check_head` uses after conversion."""
    from derivations.architecture import MAX_HEADS_TOTAL, Architecture

    layers = _config_int(config, "num_hidden_layers", "n_layer", "n_layers", "num_layers")
    heads = _config_int(config, "num_attention_heads", "n_head", "n_heads", "num_heads")
    if qk is None or layers is None or heads is None or layers * heads > MAX_HEADS_TOTAL:
        return  # sizes the folder checks refuse, or a config that gives heads per layer: checked after conversion
    Architecture(layers, heads).check_head(*qk)


class BoundedTokenizer:
    """A tokenizer whose ``encode`` and ``decode`` run within :data:`TOKENIZE_SECONDS` (for ``--target``
    and the token strings a report shows); anything else is the tokenizer's own."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __getattr__(self, name):
        if name == "tokenizer":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, text, add_special_tokens=False):
        return bounded(lambda: list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens)),
                       f"the tokenizer on {text[:40]!r}")

    def decode(self, ids):
        return bounded(lambda: self.tokenizer.decode(ids), f"the tokenizer's decoder on {len(ids)} tokens",
                       advice=DECODE_ADVICE)

    def decode_each(self, ids) -> list[str]:
        """Each id decoded alone, all within one bound (:func:`token_strings`)."""
        return token_strings(self.tokenizer, list(ids))


def convert(user: UserModel, dtype: Any, device: Any, tokens_for) -> tuple[Any, Any]:
    """The :class:`~numeric_check.model.circuit_model.CircuitModel` of ``user``'s model and the
    tokens ``tokens_for(model)`` picks for it, the model checked against its source on probe
    tokens and on those tokens (the ids the command studies) before it is returned."""
    from numeric_check.conversion.adapters import check_transformer_lens, from_transformer_lens
    from numeric_check.model.config import resolve_device
    from numeric_check.conversion.hf import check_hf, from_hf
    from numeric_check.conversion.source_check import in_dtype

    convert, check = (from_transformer_lens, check_transformer_lens) if user.library == "tl" else (from_hf, check_hf)
    try:  # checked in float64 whatever --dtype, then cast (the cast's rounding measured and stated apart)
        model = convert(user.source, dtype="float64", device=resolve_device(device), check=False)
        tokens = tokens_for(model)
        model.source_check = check(user.source, model, tokens, accept_source_precision=user.accept_source_precision)
        model = in_dtype(model, dtype)
    finally:
        if user.status is not None:
            user.status.done()
    return model, tokens


def text_tokens(args: argparse.Namespace, user: UserModel, n_ctx: int | None, d_vocab: int | None):
    """The ``--text`` / ``--text-file`` prompt as a ``[1, pos]`` id tensor, or ``None`` when neither was
    given; read by the tokenizer within :data:`TOKENIZE_SECONDS` (a tokenizer that panics or runs away
    is one line), held to ``n_ctx`` and ``d_vocab`` (each skipped when ``None``)."""
    import torch

    if args.text is None and args.text_file is None:
        return None
    if user.prompt_ids is not None:
        ids = user.prompt_ids
    else:
        if args.text_file is not None:
            from numeric_check.errors import InputFileError
            from numeric_check.files import read_text_file

            text = read_text_file(args.text_file, "the prompt file", InputFileError)
        else:
            text = args.text
            _note_a_file_given_as_text(args)
        check_utf8(text, "--text" if args.text_file is None else "the prompt file")
        if not text.strip():
            raise VerifyCLIError("the prompt is empty; give some text to tokenize")
        if user.tokenizer is None:
            raise ModelLoadError(f"{user.name} has no tokenizer to read the prompt with; give token ids with --tokens")
        if user.library == "tl":
            source = user.source
            ids = torch.tensor([bounded(lambda: source.to_tokens(text).reshape(-1).tolist(),
                                        f"the tokenizer on the prompt ({len(text):,} characters)")])
        else:
            tokenizer = user.tokenizer
            ids = torch.tensor([bounded(lambda: list(tokenizer(text)["input_ids"]),
                                        f"the tokenizer on the prompt ({len(text):,} characters)")],
                               dtype=torch.long)
    if ids.shape[1] == 0:
        raise VerifyCLIError("the prompt tokenizes to no tokens")
    if n_ctx is not None and ids.shape[1] > n_ctx:
        raise VerifyCLIError(f"the prompt is {ids.shape[1]:,} tokens, more than the model's context n_ctx={n_ctx:,}; "
                             "shorten it")
    if d_vocab is not None and int(ids.max()) >= d_vocab:
        raise VerifyCLIError(f"the tokenizer gives the id {int(ids.max())}, outside the model's vocabulary 0..{d_vocab - 1}")
    return ids


DECODE_SECONDS_PER_TOKEN = 1e-3  # and this much more per token decoded (a vocabulary of 50,000: 50 s more)
DECODE_ADVICE = "the tokenizer's decoder runs away or crashes; give another tokenizer, or token ids alone"
ENCODE_ADVICE = ("the tokenizer runs away on this input, or it is far longer than a model's context; shorten it or give "
                 "token ids with --tokens")


def bounded(call, what: str, seconds: float | None = None, advice: str = ENCODE_ADVICE):
    """``call()`` run in a forked child within ``seconds`` (:data:`TOKENIZE_SECONDS`): its result (a
    JSON value) comes back through a pipe; a call that raises — a Rust ``PanicException`` included —
    dies, or runs past the time is one :class:`ModelLoadError` line naming ``what``; the child's
    standard error (a panic's backtrace) is dropped. Without ``fork``, ``call()`` runs in-process."""
    import json
    import select
    import signal
    import time

    seconds = TOKENIZE_SECONDS if seconds is None else seconds
    if not hasattr(os, "fork"):
        return _in_process(call, what)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no thread pool to lose across the fork
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns when a multi-threaded process forks (torch's and CUDA's threads are): the
        # child only runs ``call`` and leaves by os._exit, and a child that hangs is killed at the bound
        warnings.filterwarnings("ignore", message=r".*multi-threaded, use of fork\(\) may lead to deadlocks",
                                category=DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, never return into the caller's code
        status = 0
        try:
            os.close(read)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            try:
                answer = {"ok": call()}
            except BaseException as error:  # noqa: BLE001 - a PanicException is a BaseException
                answer = {"error": _one_line(error)}
            data = json.dumps(answer).encode()
            while data:
                data = data[os.write(write, data):]
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    os.close(write)
    chunks, deadline = [], time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise ModelLoadError(f"{what} did not finish within {seconds:g} s: {advice}")
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read)
        if os.waitpid(pid, os.WNOHANG) == (0, 0):  # still running (stopped by a signal meanwhile): not waited for
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        raise ModelLoadError(f"{what} failed: the tokenizer crashed (give token ids with --tokens)") from None
    if "error" in answer:
        raise ModelLoadError(f"{what} failed: {answer['error']}")
    return answer["ok"]


def _in_process(call, what: str):
    try:
        return call()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # noqa: BLE001 - a PanicException is a BaseException
        raise ModelLoadError(f"{what} failed: {_one_line(error)}") from None


def _one_line(error: BaseException) -> str:
    from numeric_check.conversion.load import one_line

    return one_line(f"{type(error).__name__}: {error}" if type(error).__name__ == "PanicException" else error, 200)


class Status:
    """What is being done, one line on standard error that each step overwrites, while it is a
    terminal (and ``enabled``); cleared by :meth:`done`."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and sys.stderr.isatty()
        self.shown = False

    def say(self, text: str) -> None:
        if self.enabled:
            from tensoralg.escape import terminal_safe

            width = max(20, shutil.get_terminal_size().columns - 1)
            line = terminal_safe(f"tcircuits: {text} …")[:width]
            sys.stderr.write("\r\x1b[K" + line)
            sys.stderr.flush()
            self.shown = True

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.shown = False


def token_strings(tokenizer: Any | None, ids: list[int]) -> list[str]:
    """Each id's string as the tokenizer decodes it alone (``' Paris'``), or ``''`` without a tokenizer.
    Decoding is bounded as encoding is (:func:`bounded`): a decoder that runs away (a regular
    expression that backtracks without end) or panics is one line."""
    if tokenizer is None:
        return ["" for _ in ids]
    ids = [int(i) for i in ids]
    return bounded(lambda: [str(tokenizer.decode([i])) for i in ids],
                   f"the tokenizer's decoder on {len(ids):,} token{'s' if len(ids) != 1 else ''}",
                   seconds=TOKENIZE_SECONDS + len(ids) * DECODE_SECONDS_PER_TOKEN, advice=DECODE_ADVICE)


def token_line(tokenizer: Any | None, ids: list[int], limit: int = MAX_TOKEN_LINE) -> str:
    """``"464 'The' · 3797 ' cat' · … (40 tokens)"``: ids with their strings, for a report's token line."""
    strings = token_strings(tokenizer, ids[:limit])
    shown = " · ".join(f"{i} {s!r}" if tokenizer is not None else str(i) for i, s in zip(ids, strings))
    return shown + (f" · … ({len(ids):,} tokens)" if len(ids) > limit else "")


def _loading(what: str, load):
    """``load()`` with the library's progress bars off; any failure of the loading library as one
    :class:`ModelLoadError` line naming ``what``."""
    try:
        with _quiet_loading():
            return load()
    except (KeyboardInterrupt, MemoryError, UnsupportedModel):  # a model of a kind not read: its own one line
        raise
    except ModelLoadError as error:
        raise ModelLoadError(f"cannot load {what}: {error}") from None
    except Exception as error:  # noqa: BLE001 - the libraries raise OSError, ValueError, KeyError, ...
        raise ModelLoadError(f"cannot load {what}: {_one_line(error)}") from None


def _note_a_file_given_as_text(args) -> None:
    """``--text`` is the prompt itself; where it also names a file, say once how to read the file instead
    (``verify --text /tmp/prompt.txt`` tokenized the path)."""
    from derivations.vocabulary import names_a_file, note_once

    text = args.text
    if names_a_file(text):
        note_once(f"tcircuits {args.command}", "--text FILE", f"--text is the prompt itself, so {text!r} is read as "
                  f"text; it also names a file: to read the file, use --text-file {text}")
