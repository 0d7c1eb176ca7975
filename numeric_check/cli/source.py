"""The model a person studies, on their own prompt: the numeric commands' ``--hf`` / ``--tl`` model
and ``--text`` / ``--text-file`` tokens.

``--hf NAME_OR_DIR`` loads a Hugging Face causal LM with the library's own ``from_pretrained``
resolution (a folder saved with ``save_pretrained``, or a name your cache or network serves;
``--revision``), and its tokenizer (``AutoTokenizer``) from the same place; ``--tl NAME`` loads a
TransformerLens ``HookedTransformer.from_pretrained``. Text is tokenized with the model's own
tokenizer, as the model expects it (Hugging Face: the tokenizer's default special tokens;
TransformerLens: ``to_tokens``, which prepends BOS). The conversion is checked against the loaded
model on probe tokens *and on these tokens* before anything is computed
(:mod:`numeric_check.model.source_check`).

Nothing here prints; every failure is a :class:`~numeric_check.errors.NumericCheckError` in one line.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numeric_check.errors import ModelLoadError, VerifyCLIError

MAX_TOKEN_LINE = 16  # tokens shown per sequence in a report's token line


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
    """``--hf``, ``--revision``, ``--tl`` (the model's dtype and device are the command's ``--dtype``/``--device``)."""
    group.add_argument("--hf", metavar="NAME_OR_DIR",
                       help="a Hugging Face causal LM: a folder saved with save_pretrained, or a name from_pretrained "
                            "resolves (your cache, or the network); its tokenizer is loaded from the same place")
    group.add_argument("--revision", metavar="REV", help="with --hf: the branch, tag or commit to load")
    group.add_argument("--tl", metavar="NAME", help="a TransformerLens model name (HookedTransformer.from_pretrained)")


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
    if texts and (not chosen or chosen[0] == "--checkpoint"):
        raise VerifyCLIError(f"{texts[0]} needs the model's tokenizer: load the model with --hf or --tl "
                             "(or give token ids with --tokens)")


def load_user_model(args: argparse.Namespace, dtype: Any, device: Any) -> UserModel:
    """The ``--hf`` or ``--tl`` model in ``dtype`` on ``device``, in eval mode, with its tokenizer."""
    import torch

    from numeric_check.model.config import resolve_device, resolve_dtype

    dtype, device = resolve_dtype(dtype), resolve_device(device)
    if args.tl is not None:
        try:
            from transformer_lens import HookedTransformer
        except ImportError:
            raise ModelLoadError("--tl needs TransformerLens: pip install 'tcircuits[tl]'") from None
        model = _loading(f"the TransformerLens model {args.tl!r}",
                         lambda: HookedTransformer.from_pretrained(args.tl, device=str(device), dtype=dtype))
        return UserModel(model.eval(), getattr(model, "tokenizer", None), f"{args.tl} (TransformerLens)", "tl")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ModelLoadError("--hf needs Hugging Face transformers: pip install 'tcircuits[hf]'") from None
    what = f"the Hugging Face model {args.hf!r}" + (f" at revision {args.revision!r}" if args.revision else "")
    model = _loading(what, lambda: AutoModelForCausalLM.from_pretrained(args.hf, revision=args.revision, dtype=dtype))
    try:
        tokenizer = _loading(f"the tokenizer of {what}", lambda: _tokenizer(AutoTokenizer, args.hf, args.revision))
    except ModelLoadError:
        if args.text is not None or args.text_file is not None or getattr(args, "target", None) is not None:
            raise
        tokenizer = None  # labels only: a model saved without a tokenizer still runs on --tokens
    with torch.no_grad():
        model = model.to(device).eval()
    return UserModel(model, tokenizer, f"{Path(args.hf).name or args.hf} (Hugging Face)", "hf")


def convert(user: UserModel, dtype: Any, device: Any, tokens_for) -> tuple[Any, Any]:
    """The :class:`~numeric_check.model.circuit_model.CircuitModel` of ``user``'s model and the
    tokens ``tokens_for(model)`` picks for it, the model checked against its source on probe
    tokens and on those tokens (the ids the command studies) before it is returned."""
    from numeric_check.model.adapters import check_transformer_lens, from_transformer_lens
    from numeric_check.model.config import resolve_device
    from numeric_check.model.hf import check_hf, from_hf

    convert, check = (from_transformer_lens, check_transformer_lens) if user.library == "tl" else (from_hf, check_hf)
    model = convert(user.source, dtype=dtype, device=resolve_device(device), check=False)
    tokens = tokens_for(model)
    model.source_check = check(user.source, model, tokens)
    return model, tokens


def text_tokens(args: argparse.Namespace, user: UserModel, n_ctx: int, d_vocab: int):
    """The ``--text`` / ``--text-file`` prompt as a ``[1, pos]`` id tensor, or ``None`` when neither was given."""
    import torch

    if args.text is None and args.text_file is None:
        return None
    if args.text_file is not None:
        from numeric_check.errors import InputFileError
        from numeric_check.model.checkpoint import read_text_file

        text = read_text_file(args.text_file, "the prompt file", InputFileError)
    else:
        text = args.text
    if not text.strip():
        raise VerifyCLIError("the prompt is empty; give some text to tokenize")
    if user.tokenizer is None:
        raise ModelLoadError(f"{user.name} has no tokenizer to read the prompt with; give token ids with --tokens")
    if user.library == "tl":
        ids = user.source.to_tokens(text).cpu().reshape(1, -1)
    else:
        ids = torch.tensor([user.tokenizer(text)["input_ids"]])
    if ids.shape[1] == 0:
        raise VerifyCLIError("the prompt tokenizes to no tokens")
    if ids.shape[1] > n_ctx:
        raise VerifyCLIError(f"the prompt is {ids.shape[1]:,} tokens, more than the model's context n_ctx={n_ctx:,}; "
                             "shorten it")
    if int(ids.max()) >= d_vocab:
        raise VerifyCLIError(f"the tokenizer gives the id {int(ids.max())}, outside the model's vocabulary 0..{d_vocab - 1}")
    return ids


def token_strings(tokenizer: Any | None, ids: list[int]) -> list[str]:
    """Each id's string as the tokenizer decodes it alone (``' Paris'``), or ``''`` without a tokenizer."""
    if tokenizer is None:
        return ["" for _ in ids]
    return [tokenizer.decode([i]) for i in ids]


def token_line(tokenizer: Any | None, ids: list[int], limit: int = MAX_TOKEN_LINE) -> str:
    """``"464 'The' · 3797 ' cat' · … (40 tokens)"``: ids with their strings, for a report's token line."""
    strings = token_strings(tokenizer, ids[:limit])
    shown = " · ".join(f"{i} {s!r}" if tokenizer is not None else str(i) for i, s in zip(ids, strings))
    return shown + (f" · … ({len(ids):,} tokens)" if len(ids) > limit else "")


def _tokenizer(auto: Any, name: str, revision: str | None) -> Any:
    """``AutoTokenizer.from_pretrained``, refusing the empty tokenizer it makes for a folder that holds none."""
    tokenizer = auto.from_pretrained(name, revision=revision)
    if len(tokenizer) < 2:
        raise ValueError("no tokenizer files were found beside the model (its vocabulary is empty)")
    return tokenizer


def _loading(what: str, load):
    """``load()`` with the library's progress bars off; any failure of the loading library as one
    :class:`ModelLoadError` line naming ``what``."""
    try:
        with _quiet_loading():
            return load()
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as error:  # noqa: BLE001 - the libraries raise OSError, ValueError, KeyError, ...
        detail = " ".join(str(error).split())[:300] or type(error).__name__
        raise ModelLoadError(f"cannot load {what}: {detail}") from None
