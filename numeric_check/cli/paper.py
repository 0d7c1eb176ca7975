"""``tcircuits paper``: the paper's companion, every equation derived and verified, every finding measured.

Writes into DIR a self-contained site — index.html and one page per section of
"A Mathematical Framework for Transformer Circuits" (Elhage et al., 2021), in the paper's
order: the residual stream and the notation; zero layers (the bigram table); one layer
(path expansion, OV and QK circuits, copying by eigenvalues, skip-trigrams and their
"bugs"); two layers (virtual heads, the QK expansion with Q-, K- and QK-composition,
composition scores against the random baseline, the induction mechanism, induction heads
found by weights and by behaviour, term importance by order); the tensor-product readings
and the algebra's rules as an appendix. Mathematics as MathML, figures as SVG, no script
and no network: open DIR/index.html in any browser.

Each equation is a catalogue derivation (tcircuits derive NAME) with its numeric check
beside it (every line against the first on random matrices: worst error, tolerance) and,
where a shipped model has the architecture, the expansion verified term by term against
that model. Each finding is stated as the paper states it, with the value measured on the
shipped models when the page is built, the control's value, a verdict (holds, holds in part,
does not hold) and where it holds when only in part. With --pdf, DIR/paper.pdf holds the same
content (needs pdflatex).

The language page measures the paper's tables on attention-only models trained on text: the
shipped ones (0, 1 and 2 layers, trained on the King James Bible, measured on its held-out part),
or your own — CHECKPOINT, --hf or --tl, attention-only with 0, 1 or 2 layers — on the text you
give with --text (read whole, by the model's own tokenizer). Your model is measured at its own
layer count; a two-layer model's induction control is the same model with its second layer
removed (its learned first layer, on the same text). The page and the index name the model and
the text, and a CHECKPOINT's loss curve from the training record beside it; where train-toy kept
its snapshots (--snapshots N: NAME.history/ beside it), the chapter on how induction heads form
is measured on them instead of the shipped run (without them the chapter says how to keep
them). The derivations and the checks on planted data are built as without your model. A
model with MLPs or more than two layers is refused in one line: its algebra (tcircuits derive,
expand) and its verification (tcircuits verify) still build.

DIR is written whole: the site is built in a new folder beside it and swapped in at the end,
so a run that fails or is interrupted leaves DIR as it was. A file in DIR that tcircuits did
not write (or that changed since) is refused by name; --force replaces those at the names the
companion writes and keeps the others.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from derivations.vocabulary import add_checkpoint, add_index_from, add_out, checkpoint_of, names_a_file
from numeric_check.cli.progress import StepBar
from numeric_check.cli.source import add_model_arguments
from numeric_check.errors import VerifyCLIError
from numeric_check.reports.flags import add_runtime_arguments, seed, with_runtime

EPILOG = """\
examples:
  tcircuits paper --out companion/            # then open companion/index.html
  tcircuits paper --out companion/ --pdf      # and companion/paper.pdf
  tcircuits train-toy --text-file notes.txt --layers 2 --n-ctx 128 --out m2.safetensors
  tcircuits paper --checkpoint m2.safetensors --text-file notes.txt --out companion/   # the language page on your model
"""


def register(subparsers) -> None:
    """Add ``paper`` to the ``tcircuits`` parser."""
    parser = subparsers.add_parser(
        "paper", help="the paper's companion: every equation derived and verified, every finding measured (HTML, PDF)",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint(parser, help="an attention-only checkpoint of 0, 1 or 2 layers trained on text (train-toy "
                                "--text-file): the language page measures it instead of the shipped language models",
                   positional_help="")
    yours = parser.add_argument_group("your model (instead of CHECKPOINT), converted and checked against it first")
    add_model_arguments(yours)
    yours.add_argument("--text-file", type=Path, metavar="FILE", dest="text_path",
                       help="the UTF-8 text your model is measured on, read whole by its own tokenizer (needed with "
                            "--hf and --tl; a checkpoint is measured on the shipped held-out King James Bible without it)")
    yours.add_argument("--text", dest="measured_text", metavar="TEXT", help=argparse.SUPPRESS)  # refused in run()
    yours.add_argument("--training-text-file", type=Path, metavar="FILE", dest="training_path",
                       help="the whole text a --checkpoint was trained on (its training record's SHA-256 must match): "
                            "the skip-trigram \"bugs\" are then combinations the model never saw in training, not "
                            "only ones absent from --text-file")
    parser.set_defaults(text=None, text_file=None)  # no prompt: --text-file here is the text measured on
    add_out(parser, required=True, metavar="DIR", help="folder to write the site into (made if missing)")
    parser.add_argument("--pdf", action="store_true", help="also compile DIR/paper.pdf with pdflatex")
    parser.add_argument("--force", action="store_true",
                        help="replace files in DIR that tcircuits did not write (or that changed since) at the names it writes")
    parser.add_argument("--seed", type=seed, default=0, help="seed of every sampled batch and random control (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_index_from(parser)
    add_runtime_arguments(parser)
    parser.set_defaults(func=with_runtime(run))


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    # Heavy imports here: the CLI imports this module to build its parser.
    from tensoralg.escape import terminal_safe
    from numeric_check.cli.source import check_model_flags
    from numeric_check.reports.paper.build import check_outputs, step_count, write_paper

    if args.measured_text is not None:
        given = (f"{args.measured_text!r} names a file: use --text-file {args.measured_text}" if names_a_file(args.measured_text)
                 else "use --text-file FILE")
        raise VerifyCLIError(f"paper measures your model on a whole text read from a file, not on --text (the text itself, "
                             f"a prompt in verify, attribute and attention): {given}")
    checkpoint_of(args)
    check_model_flags(args, [])
    yours = args.checkpoint is not None or args.hf is not None or args.tl is not None
    if args.text_path is not None and not yours:
        raise VerifyCLIError("--text-file is the text your model is measured on: give the model too (--checkpoint, --hf or "
                             "--tl); without one, the shipped language models are measured on their held-out text")
    if args.text_path is None and (args.hf is not None or args.tl is not None):
        raise VerifyCLIError(f"{'--hf' if args.hf is not None else '--tl'} needs --text-file FILE: the text the model is "
                             "measured on (UTF-8, read whole by the model's tokenizer)")
    check_outputs(args.out, args.pdf, args.force)  # a bad folder is refused before any work
    language = your_language(args) if yours else None
    with StepBar(step_count(args.pdf), args.quiet) as bar:
        paper, written = write_paper(args.out, pdf=args.pdf, progress=bar.tick, seed=args.seed, force=args.force,
                                     device=args.device, language=language, index_from=args.index_from)
    counts: dict[str, int] = {}
    for f in paper.findings:
        counts[f.verdict] = counts.get(f.verdict, 0) + 1
    failed = [e.name for e in paper.equations if isinstance(e.verification, str) or not e.verification.ok
              or (e.model_check is not None and not e.model_check.passed)]
    lines = [f"wrote {len(written)} files into {args.out} ({time.perf_counter() - started:.1f} s): "
             f"{len(paper.equations)} derivations, " + ("all checked" if not failed else f"FAILED: {', '.join(failed)}")
             + "; findings: " + ", ".join(f"{n} {v}" for v, n in counts.items())]
    if language is not None:
        lines.append(f"  the language page: {language.describe()}")
        (model,) = language.models.values()
        if model.source_check is not None:
            lines.append(f"  {model.source_check.describe()}")
    print(terminal_safe("\n".join(lines)))
    return 1 if failed else 0


def your_language(args: argparse.Namespace):
    """The language page's model and text from CHECKPOINT, --hf or --tl and --text
    (:class:`~numeric_check.reports.paper.your_model.LanguageModels`): the text read first, the model refused
    before its conversion where it can be (MLPs, more than two layers), then converted and checked."""
    from dataclasses import replace

    from numeric_check.reports.paper.language import heldout_path
    from numeric_check.reports.paper.your_model import language_models, text_data, text_kind
    from numeric_check.training.text import read_texts

    if args.text_path is not None:
        text, text_name = read_texts([args.text_path]), str(args.text_path)
    else:
        text, text_name = heldout_path().read_text(encoding="utf-8"), "the held-out King James Bible (shipped)"
    if args.checkpoint is not None:
        model, tokenizer, name, record, verify = _checkpoint(args)
    elif args.hf is not None:
        _refuse_hugging_face(args)
    else:
        model, tokenizer, name, record, verify = _transformer_lens(args)
    data = text_data(tokenizer, text, text_name, model.cfg.d_vocab, text_kind(text, record))
    if args.training_path is not None:
        data = data.trained_on(_training_text(args.training_path, record, name))
    measured = language_models(model, data, name, record, verify=verify)
    return replace(measured, checkpoint=str(args.checkpoint)) if args.checkpoint is not None else measured


def _training_text(path: Path, record: dict | None, name: str) -> str:
    """The text ``--training-text-file`` names, refused in one line unless ``record`` names it as the training text."""
    from numeric_check.reports.paper.your_model import text_kind
    from numeric_check.training.text import read_texts

    text = read_texts([path])
    if record is None:
        raise VerifyCLIError(f"--training-text-file {path}: {name} has no training record to check it against (train-toy "
                             "writes one beside the checkpoint); without it the page says its bugs may be learned")
    if text_kind(text, record) != "training":
        raise VerifyCLIError(f"--training-text-file {path} is not the text {name} was trained on (its record names the "
                             f"SHA-256 {str((record.get('text') or {}).get('sha256'))[:12]}…): give that file as it was")
    return text


def _checkpoint(args: argparse.Namespace):
    from numeric_check.model.checkpoint import load_checkpoint
    from numeric_check.reports.paper.your_model import check_readable
    from numeric_check.training.config import tokenizer_path
    from numeric_check.training.text import CheckpointTokenizer
    from numeric_check.training.toy import training_record_for

    path = args.checkpoint
    model = load_checkpoint(path, device=args.device)
    verify = f"--checkpoint {path}"
    check_readable(model.arch.n_layers, model.arch.mlp, str(path), verify)
    tokenizer = CheckpointTokenizer.beside(path, model.cfg.d_vocab)
    if tokenizer is None:
        raise VerifyCLIError(f"{path} has no tokenizer beside it ({tokenizer_path(path).name}): the language page reads "
                             "its text with the model's own tokenizer; give a model trained on text (tcircuits train-toy "
                             "--text FILE), or one with --tl")
    return model, tokenizer.tokenizer, str(path), training_record_for(path, model), verify


def _refuse_hugging_face(args: argparse.Namespace) -> None:
    """Every Hugging Face causal LM that tcircuits reads has MLPs: refused from its config.json, before its weights."""
    from numeric_check.errors import ModelLoadError, UnsupportedModel
    from numeric_check.conversion import load
    from numeric_check.reports.paper.your_model import refusal
    from tensoralg.errors import cut

    what = f"the Hugging Face model {args.hf!r}"
    try:
        config = load.read_config(load.model_folder(args.hf, args.revision))
    except ModelLoadError as error:
        raise ModelLoadError(f"cannot load {what}: {error}") from None
    named = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    kind = next((k for k in [*named, config.get("model_type")] if isinstance(k, str) and k), "causal LM")
    name = f"{Path(args.hf).name or args.hf} ({cut(kind)}, Hugging Face)"  # a config's strings, cut: one line
    verify = f"--hf {args.hf}" + (f" --revision {args.revision}" if args.revision else "")
    raise UnsupportedModel(refusal(name, "MLPs", verify))


def _transformer_lens(args: argparse.Namespace):
    """The --tl model, refused from its config before the conversion, then converted (float64) and checked."""
    from numeric_check.cli.source import convert, load_user_model
    from numeric_check.errors import ModelLoadError
    from numeric_check.reports.paper.your_model import check_readable

    user = load_user_model(args, "float64", args.device)
    verify = f"--tl {args.tl}"
    try:
        cfg = user.source.cfg
        check_readable(cfg.n_layers, not cfg.attn_only, user.name, verify)
        tokenizer = getattr(user.tokenizer, "backend_tokenizer", None)
        if tokenizer is None:
            raise ModelLoadError(f"{user.name} has no fast tokenizer to read the text with; set one "
                                 "(model.set_tokenizer) or give a checkpoint trained on text")
    except BaseException:
        if user.status is not None:
            user.status.done()
        raise
    model, _ = convert(user, "float64", args.device, lambda model: None)
    return model, tokenizer, user.name, None, verify
