"""The ``tcircuits`` subcommands of :mod:`numeric_check` (entry points in pyproject.toml).

Each ``register_*`` function adds one subparser to ``tcircuits`` and sets ``func``;
``func(args)`` returns an exit code. Bad input raises a
:class:`~tensoralg.errors.TCircuitsError`, which the CLI prints without a traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import time
from pathlib import Path

from tensoralg.display import counted
from tensoralg.escape import terminal_safe

from derivations.signals import polled, requested
from derivations.vocabulary import (
    add_checkpoint, add_index_from, add_out, add_quiet, checkpoint_of, names_a_file, old_spelling, renumber,
)
from numeric_check.cli.progress import StepBar
from numeric_check.cli.source import Status, add_model_arguments, check_model_flags, wants_user_model
from numeric_check.reports.flags import (
    add_runtime_arguments, check_batch, finite_float, fit_threads, int_in, seed, with_runtime,
)
from numeric_check.errors import InputFileError, NumericCheckError
from numeric_check.files import output_folder, writable_file, write_together
from numeric_check.cli.train_help import TRAIN_DESCRIPTION, TRAIN_EPILOG
from numeric_check.training.config import BLOCK_LINES, DEFAULT_SNAPSHOTS, HELDOUT_EVERY, tokenizer_path


def _add_command(subparsers, name: str, summary: str, description: str, epilog: str) -> argparse.ArgumentParser:
    """A subparser whose description and examples keep their line breaks."""
    return subparsers.add_parser(
        name, help=summary, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )


# --- train-toy -------------------------------------------------------------------------



def register_train_toy(subparsers) -> None:
    """Add ``train-toy`` to the ``tcircuits`` parser."""
    from numeric_check.training.config import POS_INITS, TrainConfig  # torch-free: --help stays fast

    d = TrainConfig()
    p = _add_command(subparsers, "train-toy", "train a small attention-only model on your text (--text-file) or on planted repeats",
                     TRAIN_DESCRIPTION, TRAIN_EPILOG)
    add_out(p, required=True, type=Path, metavar="PATH.safetensors", help="checkpoint to write")
    p.add_argument("--layers", type=int_in(0, 2), default=d.n_layers, metavar="N", help=f"attention layers: 0, 1 or 2 (default {d.n_layers})")
    p.add_argument("--heads", type=int, default=d.n_heads, metavar="H", help=f"heads per layer (default {d.n_heads})")
    p.add_argument("--d-model", type=int, default=d.d_model, help=f"residual width (default {d.d_model})")
    p.add_argument("--d-head", type=int, default=d.d_head, help=f"head width (default {d.d_head})")
    p.add_argument("--d-vocab", dest="vocab", type=int, default=None, metavar="N",
                   help=f"vocabulary size (default {d.d_vocab}; on text the BPE's size, default {TEXT_VOCAB} or the "
                        "most the text supports, said when fewer)")
    old_spelling(p, "--vocab", dest="vocab", use="--d-vocab N", type=int, metavar="N")
    p.add_argument("--n-ctx", type=int, default=None,
                   help=f"sequence length (default {d.n_ctx}; on text {TEXT_N_CTX}, the windows 'tcircuits paper' measures on)")
    text = p.add_argument_group("training on text (the paper's kind of model) instead of the planted data")
    text.add_argument("--text-file", nargs="+", type=Path, metavar="FILE", dest="text_files",
                      help="UTF-8 text to train on (e.g. build/corpus/kjv.txt from 'make corpus'): a byte-level BPE "
                           "of --d-vocab tokens is trained on it and saved beside the checkpoint (NAME.tokenizer.json); "
                           f"every {HELDOUT_EVERY}th block of {BLOCK_LINES} lines is held out for evaluation (of fewer "
                           f"lines in a text under {HELDOUT_EVERY * BLOCK_LINES:,} lines; none under {HELDOUT_EVERY}, and "
                           "the record says so)")
    text.add_argument("--text", metavar="TEXT", help="the text itself to train on, instead of --text-file (a few "
                                                     "hundred characters at least: one sequence of --n-ctx tokens)")
    text.add_argument("--copy-share", type=finite_float, default=None, metavar="P",
                      help=f"share of sequences that repeat a span of themselves (copy-augmentation, which plants "
                           f"repeats for induction heads to learn), on text (default {TEXT_COPY_SHARE:g}: none); the "
                           "span is --seg-min..--seg-max tokens")
    text.add_argument("--snapshots", type=int_in(0, 1000), default=None, metavar="N",
                      help=f"on text, keep N snapshots at log-spaced steps (the last among them) in NAME.history/, "
                           f"each a checkpoint with its held-out loss at every position: what 'tcircuits dynamics' "
                           f"reads (default {DEFAULT_SNAPSHOTS}; 0: none)")
    p.add_argument("--seg-min", type=int, default=d.seg_min, help=f"shortest repeated segment (default {d.seg_min})")
    p.add_argument("--seg-max", type=int, default=d.seg_max, help=f"longest repeated segment; 2*seg_max <= n_ctx (default {d.seg_max})")
    p.add_argument("--max-repeats", type=int, default=d.max_repeats, help=f"most repeats per sequence (default {d.max_repeats})")
    p.add_argument("--bigram-successors", type=int_in(0), default=None, metavar="K",
                   help=f"likely successors of each token in the data's bigram table; 0: tokens uniformly at random "
                        f"(default min(4, vocab/4): {d.bigram_successors})")
    p.add_argument("--bigram-follow", type=finite_float, default=d.bigram_follow, metavar="P",
                   help=f"probability that the next token is one of the likely successors (default {d.bigram_follow})")
    p.add_argument("--skip-trigrams", type=int_in(0), default=None, metavar="N",
                   help=f"source tokens with two planted skip-trigrams each, A … B -> C (default min(8, vocab/16): "
                        f"{d.skip_trigrams}; 0: none)")
    p.add_argument("--trigrams-per-sequence", type=int_in(0), default=d.trigrams_per_sequence, metavar="N",
                   help=f"planted skip-trigrams per sequence, at most (default {d.trigrams_per_sequence})")
    p.add_argument("--train-last-position", action=argparse.BooleanOptionalAction, default=d.train_last_position,
                   help="draw each sequence one token longer, so that the last position too predicts a token and is "
                        f"trained (default {'on' if d.train_last_position else 'off'})")
    p.add_argument("--positional", default=d.positional, choices=["none", "standard", "qk_only"], help=f"positional embedding (default {d.positional})")
    p.add_argument("--layer-norm", action="store_true", help="parameter-free layer norm before each layer (default: none)")
    p.add_argument("--steps", type=int, default=d.steps,
                   help=f"optimiser steps (default {d.steps}); Ctrl-C (or SIGTERM, SIGHUP) ends the run where a step "
                        "ends and saves the model of that step, its record (\"stopped\": the step) and its history so "
                        "far, exiting 130 (128 + the signal); a second one abandons the run, nothing written")
    p.add_argument("--batch-size", type=int_in(1), default=None, metavar="N",
                   help=f"sequences per step (default {d.batch_size}; on text at most a quarter of the text a step, said "
                        "when fewer)")
    p.add_argument("--lr", type=finite_float, default=d.lr, help=f"AdamW learning rate (default {d.lr})")
    p.add_argument("--warmup-steps", type=int_in(0), default=None, metavar="N",
                   help=f"steps over which the learning rate rises linearly to --lr (default min(100, steps/10): {d.warmup_steps})")
    p.add_argument("--decay-steps", type=int_in(0), default=None, metavar="N",
                   help="last steps over which it falls linearly to 0 (default min(4500, the rest/3): "
                        f"{d.decay_steps}; 0: constant to the end)")
    p.add_argument("--weight-decay", type=finite_float, default=d.weight_decay, help=f"AdamW weight decay (default {d.weight_decay})")
    p.add_argument("--init-std", type=finite_float, default=d.init_std, help=f"std of the initial weights (default {d.init_std})")
    p.add_argument("--pos-init", default=d.pos_init, choices=POS_INITS,
                   help="how the positional embedding starts: drawn like the other weights (normal), or the sines and "
                        "cosines of Vaswani et al. at 10 × --init-std, from which a previous-token head forms in a "
                        f"fraction of the steps (sinusoidal); learnt either way (default {d.pos_init})")
    p.add_argument("--seed", type=seed, default=d.seed, help=f"seed of the weights and the data (default {d.seed})")
    add_runtime_arguments(p, device_help="auto (the default: CUDA when present, else the CPU), cpu, cuda or cuda:N; "
                          "the shipped weights are rebuilt bit for bit on the CPU")
    p.add_argument("--save-dtype", default="float32", choices=["float32", "float16"],
                   help="dtype of the saved weights (default float32; float16 halves the file, and every command "
                        "loads it back as float32)")
    p.add_argument("--force", action="store_true", help="replace an existing checkpoint at --out and its training record")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=with_runtime(_run_train_toy))


def _run_train_toy(args) -> int:
    import torch

    from numeric_check.training.history import HISTORY_INDEX, HISTORY_WINDOWS_FILE, snapshot_file
    from numeric_check.training.toy import TrainConfig, train_toy, training_record

    on_text = args.text is not None or args.text_files is not None
    if args.text is not None and args.text_files is not None:
        raise NumericCheckError("give the text once: --text TEXT (the text itself) or --text-file FILE, not both")
    for flag, value in (("--copy-share", args.copy_share), ("--snapshots", args.snapshots)):
        if not on_text and value is not None:
            raise NumericCheckError(f"{flag} applies to training on text: give --text-file FILE (or --text TEXT) too")
    fit_vocab, fit_batch = on_text and args.vocab is None, on_text and args.batch_size is None
    args.vocab = args.vocab if args.vocab is not None else (TEXT_VOCAB if on_text else TrainConfig.d_vocab)
    args.n_ctx = args.n_ctx if args.n_ctx is not None else (TEXT_N_CTX if on_text else TrainConfig.n_ctx)
    args.batch_size = args.batch_size if args.batch_size is not None else TrainConfig.batch_size
    check_batch("--batch-size", args.batch_size, args.n_ctx, args.vocab)  # before TrainConfig's own, less specific check
    data = text_data(args, fit_vocab) if on_text else None
    if data is not None and (fit_vocab or fit_batch):
        fitted = fit_to_text(args, data, fit_vocab, fit_batch)
        if fitted:
            print(terminal_safe(fitted), flush=True)
    config = TrainConfig(
        n_layers=args.layers,
        n_heads=args.heads,
        d_model=args.d_model,
        d_head=args.d_head,
        d_vocab=args.vocab,
        n_ctx=args.n_ctx,
        seg_min=args.seg_min,
        seg_max=args.seg_max,
        max_repeats=args.max_repeats,
        bigram_successors=args.bigram_successors,
        bigram_follow=args.bigram_follow,
        skip_trigrams=args.skip_trigrams,
        trigrams_per_sequence=args.trigrams_per_sequence,
        train_last_position=args.train_last_position,
        positional=args.positional,
        layer_norm=args.layer_norm,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        decay_steps=args.decay_steps,
        weight_decay=args.weight_decay,
        seed=args.seed,
        init_std=args.init_std,
        pos_init=args.pos_init,
        text_sha256=None if data is None else data.sha256,
        copy_share=(TEXT_COPY_SHARE if args.copy_share is None else args.copy_share) if data is not None else 0.0,
    )
    # every output checked before the training, not after; an existing one is kept unless --force
    out = writable_file(args.out, ".safetensors", new=True, force=args.force)
    sidecar = writable_file(out.with_suffix(".json"), new=True, force=args.force)
    tokenizer_file = writable_file(tokenizer_path(out), new=True, force=args.force) if data is not None else None
    curve_file = writable_file(out.with_suffix(".loss.png"), new=True, force=args.force)
    history = _history(args, config, data)
    history_folder = None if history is None else output_folder(
        out.with_suffix(".history"), [snapshot_file(s) for s in history.steps] + [HISTORY_INDEX, HISTORY_WINDOWS_FILE], force=args.force).check()
    start = time.perf_counter()
    tokens_per_step = config.batch_size * config.n_ctx
    with StepBar(config.steps, args.quiet) as bar, polled():  # Ctrl-C ends the run where a step ends, and keeps it
        def progress(step: int, record: dict) -> None:
            every = step % 50 == 0 or step == config.steps  # the losses beside the bar, refreshed now and then
            rate = step * tokens_per_step / max(time.perf_counter() - start, 1e-9)
            bar.tick(**({"loss": f"{record['loss']:.3f}", "repeat": _nats(record["repeat_loss"]),
                         "tok/s": f"{rate:,.0f}"} if every else {}))

        model, losses = train_toy(config, progress, device=args.device, data=data, on_step=history,
                                  stop=lambda: requested() is not None)
    seconds = time.perf_counter() - start
    steps = config.steps if losses.stopped_at is None else losses.stopped_at
    if losses.stopped_at is not None:
        print(f"stopped by {_signal_name(requested())} after step {steps:,} of {config.steps:,}: saving the model of "
              f"that step (a second {_signal_name(requested())} abandons it)", flush=True)
        if history is not None:  # the model it stopped with is its history's last snapshot, as a finished run's is
            history.take(steps, model)
            history_folder = output_folder(history_folder.path, [snapshot_file(s) for s in history.steps + [steps]]
                                           + [HISTORY_INDEX, HISTORY_WINDOWS_FILE], force=args.force)
    from numeric_check.model.checkpoint import checkpoint_bytes

    info = training_record(config, losses, seconds)
    info["trained_on"] = trained_on(next(model.parameters()).device)
    if losses.stopped_at is not None:
        info["stopped"]["signal"] = signal.Signals(requested()).name
    if data is not None:
        info["text"] = text_record(args.text_files, data, tokenizer_file)
    try:  # strict JSON, checked before either file is written
        json.dumps(info, allow_nan=False)
    except ValueError:
        raise NumericCheckError("the training diverged (its losses are not finite numbers); nothing was written: "
                                "try a smaller --lr or --init-std") from None
    weights, info["checkpoint_sha256"] = checkpoint_bytes(model.to(dtype=getattr(torch, args.save_dtype)))
    outputs = {out: weights, sidecar: json.dumps(info, indent=2, allow_nan=False) + "\n"}
    if tokenizer_file is not None:
        outputs[tokenizer_file] = data.tokenizer.to_str() + "\n"
    outputs[curve_file] = _curve_png(info, out.stem)
    if history_folder is not None:  # the snapshots first: a record never names a history that is not there
        info["history"] = {"folder": history_folder.path.name, "snapshots": len(history.snapshots)}
        outputs[sidecar] = json.dumps(info, indent=2, allow_nan=False) + "\n"
        with history_folder as folder:
            for name, payload in history.files().items():
                (folder / name).write_bytes(payload)
            (folder / HISTORY_INDEX).write_text(json.dumps(history.index(losses.loss, info["checkpoint_sha256"]),
                                                           allow_nan=False) + "\n", encoding="utf-8")
    write_together(outputs)  # the checkpoint, its record (and tokenizer) replaced together or not at all
    final = losses.final
    print(terminal_safe(
        f"trained {config.arch.describe()} for {steps} steps"
        + (f" (of {config.steps}, stopped early)" if losses.stopped_at is not None else "") + f" in {seconds:.0f} s\n"
        f"held-out loss {final['loss']:.3f} nats overall, {_nats(final['repeat_loss'])} on repeated tokens, "
        f"{_nats(final['other_loss'])} elsewhere (uniform: {info['uniform_loss']:.3f})\n"
        f"wrote {out}, {sidecar}" + (f", {tokenizer_file}" if tokenizer_file else "") + f" and the loss curve {curve_file}"
        + (f"\nkept {counted(len(history.snapshots), 'snapshot')} in {history_folder.path}" if history_folder else "")
    ))
    return 0 if losses.stopped_at is None else 128 + requested()  # kept, but not the run asked for: as a shell reports it


def _signal_name(signum: int) -> str:
    """How a person names the signal that stopped a run: Ctrl-C, or SIGTERM and SIGHUP by name."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _nats(value: float) -> str:
    """A loss to 3 decimals, or 'none' where there were no such tokens (NaN)."""
    return "none" if value != value else f"{value:.3f}"


def trained_on(device) -> dict:
    """Where a run was trained, for its record: the device (a GPU by name), torch's threads and version."""
    import platform

    import torch

    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _processor() or platform.machine()
    return {"device": str(device), "name": name, "threads": torch.get_num_threads(), "torch": torch.__version__}


def _processor() -> str | None:
    """The CPU's model name as the system gives it (Linux's /proc/cpuinfo; elsewhere platform's), or None."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


def _curve_png(record: dict, name: str) -> bytes:
    """The training loss curve (the record's, smoothed over 100 steps) as a PNG, against the uniform loss."""
    import io

    from numeric_check.reports.plots import training_curve

    figure = training_curve(record["curve"], uniform_loss=record["uniform_loss"], title=f"Training loss: {name}")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, metadata={"Software": None})
    return buffer.getvalue()


def _history(args, config, data):
    """The snapshots a run on text keeps (``--snapshots``, by default :data:`DEFAULT_SNAPSHOTS`), or None."""
    import torch

    from numeric_check.training.history import History, heldout_windows, snapshot_steps

    count = DEFAULT_SNAPSHOTS if args.snapshots is None else args.snapshots
    if data is None or count == 0:
        return None
    return History(snapshot_steps(config.steps, count), heldout_windows(data.heldout, config.n_ctx),
                   save_dtype=getattr(torch, args.save_dtype))


#: On text: the BPE's size (at most: fewer where the text supports fewer), the share of copy-augmented sequences
#: (none: planting is asked for by name) and the context, unless given.
TEXT_VOCAB, TEXT_COPY_SHARE, TEXT_N_CTX = 2048, 0.0, 128


def text_data(args, fit_vocab: bool = False):
    """The text of ``--text-file`` read (or ``--text`` itself), split, tokenized (a BPE of ``--d-vocab`` tokens, or
    of as many as the text supports with ``fit_vocab``): refused in one line, before any training, when a file
    is empty, binary or not UTF-8, or the text is too short."""
    from numeric_check.cli.source import check_utf8
    from numeric_check.training.text import TextData, read_texts

    if args.text_files is not None:
        text = read_texts(args.text_files)
    else:
        text = args.text
        if names_a_file(text):
            raise NumericCheckError(f"--text is the text itself, and {text!r} names a file: to train on the file, use "
                                    f"--text-file {text}")
        if not text.strip():
            raise NumericCheckError("--text is empty: expected the text to train on (or --text-file FILE)")
        check_utf8(text, "--text")
    return TextData.build(text, args.vocab, args.n_ctx, fit_vocab=fit_vocab)


def fit_to_text(args, data, fit_vocab: bool, fit_batch: bool) -> str:
    """``args.vocab`` and ``args.batch_size`` brought to a short text where they were not given (the tokens it
    supports; at most a quarter of its training windows a step), and the line that says so ('' if neither moved)."""
    said = []
    supported = data.tokenizer.get_vocab_size()
    if fit_vocab and supported < args.vocab:
        said.append(f"--d-vocab {supported:,} (the most it supports; default {args.vocab:,})")
        args.vocab = supported
    quarter = max(1, len(data.train) // (4 * (args.n_ctx + 1)))
    if fit_batch and quarter < args.batch_size:
        said.append(f"--batch-size {quarter:,} (a quarter of its windows a step; default {args.batch_size})")
        args.batch_size = quarter
    if not said:
        return ""
    check_batch("--batch-size", args.batch_size, args.n_ctx, args.vocab)
    return f"fitted to the text ({len(data.train):,} training tokens): " + ", ".join(said)


def text_record(paths, data, tokenizer_file) -> dict:
    """What a training record says of its text: the files (none for ``--text``), their SHA-256, the split and the
    tokenizer."""
    return {"files": [Path(p).name for p in paths or ()], "sha256": data.sha256,
            "train_tokens": len(data.train), "heldout_tokens": len(data.heldout),
            "heldout": data.split, "heldout_sha256": data.heldout_sha256,
            "tokenizer": tokenizer_file.name}


# --- analyze ---------------------------------------------------------------------------

ANALYZE_DESCRIPTION = """\
Analyse a model's circuits and write a report: Markdown with figures and tables,
LaTeX tables, and the numbers as JSON.

The report measures the paper's findings (Elhage et al., 2021) on the model:
  - copying: eigenvalue positivity of each head's OV circuit W_U W_OV W_E (near 1:
    attending to a token raises that token's logit);
  - QK positivity and same-matching: eigenvalue positivity of the QK circuit
    W_E^T W_QK W_E and of the K-composition circuit W_E^T W_QK^{h2} W_OV^{h1} W_E;
  - Q-, K- and V-composition scores of every pair of heads, with the score random
    weights of the same shapes would give;
  - previous-token and induction heads found from the weights and from behaviour
    (attention on repeated random sequences), and whether the two agree;
  - term importance by order: with attention patterns frozen, the loss using the
    direct path, + individual heads, + virtual heads, and each term's marginal effect;
  - skip-trigram tables (source ... destination -> out) of the most important head.
With a 1-layer --control, the findings also check that it copies but cannot do
induction. Without CHECKPOINT, the 2-layer model shipped with tcircuits is analysed,
with the shipped 1-layer model as control.

Writes into OUT: index.html (the report as a web page: open it in a browser),
report.md, tables.tex (plain LaTeX), analysis.json, and figures/*.png and *.svg. OUT is
written whole: in a new folder beside it, swapped in at the end, so a run that fails or is
interrupted leaves OUT as it was. A file in OUT that tcircuits did not write (or that changed
since) is refused by name; --force replaces those at the names the report writes and keeps
the others.
"""

ANALYZE_EPILOG = """\
examples:
  tcircuits analyze --out report/
  tcircuits train-toy --layers 2 --out m2.safetensors
  tcircuits train-toy --layers 1 --out m1.safetensors
  tcircuits analyze --checkpoint m2.safetensors --control m1.safetensors --out report/
  tcircuits analyze --hf ./my-model --out report/
"""


def register_analyze(subparsers) -> None:
    """Add ``analyze`` to the ``tcircuits`` parser."""
    p = _add_command(subparsers, "analyze", "analyse a model's circuits (copying, composition, induction heads, term importance) into a report",
                     ANALYZE_DESCRIPTION, ANALYZE_EPILOG)
    add_checkpoint(p, help="a .safetensors checkpoint (default: the shipped 2-layer model, or --hf / --tl)",
                   positional_help="")
    yours = p.add_argument_group("your model (instead of CHECKPOINT), converted and checked against it first")
    add_model_arguments(yours)
    yours.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                       help="dtype of the --hf/--tl model as loaded and analysed (default float64, as in every command; "
                            "float32 halves the memory of a large model)")
    p.set_defaults(text=None, text_file=None)
    add_out(p, required=True, type=Path, metavar="DIR", help="folder to write the report into (created)")
    p.add_argument("--force", action="store_true",
                   help="replace files in OUT that tcircuits did not write (or that changed since) at the names it writes")
    add_quiet(p)
    p.add_argument("--control", type=Path, metavar="CHECKPOINT", help="a 1-layer control model to compare with")
    p.add_argument("--vocab-file", dest="vocab", type=Path, metavar="FILE",
                   help="token strings: a JSON list, or one token per line (d_vocab entries)")
    old_spelling(p, "--vocab", dest="vocab", use="--vocab-file FILE", type=Path, metavar="FILE")
    p.add_argument("--sequences", type=int_in(1), default=64, metavar="N", help="repeated-segment sequences to evaluate on (default 64)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the evaluation data and the random baselines (default 0)")
    p.add_argument("--figure-formats", dest="formats", default="png,svg", metavar="FORMATS",
                   help="figure formats, comma-separated: png, svg, pdf (default png,svg)")
    old_spelling(p, "--formats", dest="formats", use="--figure-formats")
    add_index_from(p)
    add_runtime_arguments(p)
    p.set_defaults(func=with_runtime(_run_analyze))


def _read_vocab(path: Path) -> list[str]:
    """Token strings from ``--vocab-file``: a JSON list of strings, a JSON object of token ids
    (Hugging Face's ``vocab.json``: token -> id, the ids 0..n-1), or one token per line (a
    BERT-style ``vocab.txt``, ``[PAD]`` first included). Lines end at ``\n`` or ``\r\n`` only —
    a token may hold any other character, form feeds and ``\u2028`` included — and a byte-order
    mark is not part of the first token. The file is read within bounds
    (:func:`~numeric_check.files.read_json`); every problem is an
    :class:`InputFileError` naming it."""
    from numeric_check.files import read_json, read_text_file

    what = f"the vocabulary file {str(path)!r}"
    text = read_text_file(path, "the vocabulary file", InputFileError).removeprefix("\ufeff")
    if not _looks_like_json(text):
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the last line's end, not an empty token
        return [line.removesuffix("\r") for line in lines]
    vocab = read_json(text, what, InputFileError)
    if isinstance(vocab, dict):
        return _vocab_by_id(vocab, what)
    if not isinstance(vocab, list):
        raise InputFileError(f"{what} must be a JSON list of strings or an object of token ids, got a {type(vocab).__name__}")
    bad = next((i for i, t in enumerate(vocab) if not isinstance(t, str)), None)
    if bad is not None:
        raise InputFileError(f"{what} must be a JSON list of strings; entry {bad} is {vocab[bad]!r}")
    return vocab


def _user_model(args):
    """The --hf / --tl model, converted and checked against its source: ``(model, name, tokenizer)``."""
    from numeric_check.cli.source import convert, load_user_model

    user = load_user_model(args, args.dtype, args.device)
    model, _ = convert(user, args.dtype, args.device, lambda model: None)
    return model, user.name, user.tokenizer


def _tokenizer_vocab(tokenizer, d_vocab: int) -> list[str] | None:
    """Each id's string as the tokenizer decodes it (``<id>`` past the tokenizer's vocabulary), or None."""
    from numeric_check.cli.source import token_strings

    if tokenizer is None:
        return None
    known = min(len(tokenizer), d_vocab)
    return token_strings(tokenizer, list(range(known))) + [f"<{i}>" for i in range(known, d_vocab)]


def _looks_like_json(text: str) -> bool:
    """A JSON list or object, not a token file whose first token is ``[PAD]`` or ``{``."""
    first = text.lstrip().split("\n", 1)[0].strip()
    return first.startswith("{") or (first.startswith("[") and re.fullmatch(r"\[[^\s\"\[\]]*\]", first) is None)


def _vocab_by_id(vocab: dict, what: str) -> list[str]:
    """The tokens of a JSON object ``{token: id}`` in the order of their ids, which must be 0..n-1."""
    ids = list(vocab.values())
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) or sorted(ids) != list(range(len(ids))):
        raise InputFileError(f"{what} is a JSON object, so it must map each token to its id, the ids 0..{len(ids) - 1} "
                             "once each (as a Hugging Face vocab.json does)")
    tokens = [""] * len(ids)
    for token, i in vocab.items():
        tokens[i] = token
    return tokens


def _load_model(path: Path, device):
    from numeric_check.model.checkpoint import load_checkpoint
    from numeric_check.training.toy import training_record_for

    model = load_checkpoint(path, device=device)
    return model, training_record_for(path, model)


def _run_analyze(args) -> int:
    from numeric_check.reports.plots import check_formats
    from numeric_check.reports.analysis import analyze_model, data_config_for
    from numeric_check.reports.report import Report, report_output
    from numeric_check.training.toy import shipped_checkpoint

    checkpoint_of(args)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    check_formats(formats)
    checkpoint, control_path = args.checkpoint, args.control
    check_model_flags(args, [])
    if checkpoint is None and not wants_user_model(args):
        checkpoint = shipped_checkpoint(2)
        control_path = control_path or shipped_checkpoint(1)
    vocab = _read_vocab(args.vocab) if args.vocab else None
    inputs = [p for c in (checkpoint, control_path) if c is not None for p in (c, Path(c).with_suffix(".json"))]
    folder = report_output(args.out, inputs + ([args.vocab] if args.vocab else []), force=args.force, formats=formats)
    if wants_user_model(args):
        model, name, tokenizer = _user_model(args)
        record, vocab, control_path = None, vocab or _tokenizer_vocab(tokenizer, model.cfg.d_vocab), args.control
    else:
        model, record = _load_model(checkpoint, args.device)
        name = checkpoint.stem
        if vocab is None:  # a model trained on text: its own tokenizer's strings
            from numeric_check.training.text import CheckpointTokenizer

            vocab = _tokenizer_vocab(CheckpointTokenizer.beside(checkpoint, model.cfg.d_vocab), model.cfg.d_vocab)
    fit_threads(args, model.cfg.d_model)  # the policy's threads for this width (--threads overrides)
    control_model = control_record = None
    if control_path is not None:
        control_model, control_record = _load_model(control_path, args.device)
        if control_model.arch.n_layers != 1:
            raise NumericCheckError(
                f"the control must be a 1-layer model; {str(control_path)!r} has {control_model.arch.n_layers} layers"
            )
    for m, r in ((model, record), (control_model, control_record)):
        if m is not None:
            data = data_config_for(m, r)
            check_batch("--sequences", args.sequences, data.n_ctx, m.cfg.d_vocab)
    settings = {"n_sequences": args.sequences, "seed": args.seed}
    status = Status(enabled=not args.quiet)  # a line on a terminal that each stage overwrites
    analysis = analyze_model(model, name=name, training=record, vocab=vocab,
                             progress=lambda step: status.say(f"analysing {name}: {step}"), **settings)
    control = None if control_model is None else analyze_model(
        control_model, name=control_path.stem, training=control_record,
        progress=lambda step: status.say(f"analysing the control {control_path.stem}: {step}"), **settings)
    status.say("writing the report")
    report = Report.of(analysis, control, index_from=args.index_from)  # the findings, once for the terminal and every file
    with folder as staging:  # written beside --out, swapped in whole
        written = report.write(staging, formats)
    status.done()
    out = folder.path
    lines = [f"analysed {checkpoint or name} ({model.arch.describe()})" + (f" with control {control_path}" if control else "")]
    if model.source_check is not None:
        lines.append(f"  {model.source_check.describe()}")
    lines += [renumber(f"  [{'x' if f.holds else ' '}] {f.claim}: {f.measured}", args.index_from) for f in report.findings]
    lines.append(f"{report.verdict}; wrote {len(written)} files into {out}/ (index.html, report.md, tables.tex, analysis.json, figures/)")
    print(terminal_safe("\n".join(lines)))  # file names may hold control characters
    return 0
