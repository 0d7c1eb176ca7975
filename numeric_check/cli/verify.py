"""``tcircuits verify``: check a path expansion against a real model from the command line.

Registered through the entry point ``verify = numeric_check.cli.verify:register``; bad
input raises :class:`~tensoralg.errors.TCircuitsError` subclasses, which ``tcircuits``
prints without a traceback (exit 2). Exit 0 when every check passes, 1 when one fails.
"""

from __future__ import annotations

import argparse
import math
import sys
from numeric_check.reports.flags import MAX_SEED, add_runtime_arguments, finite_float, fit_threads, int_in, with_runtime
from typing import TYPE_CHECKING, Iterable

from derivations.architecture import MAX_LAYERS, POSITIONAL_KINDS, Architecture
from derivations.vocabulary import add_batch_size, add_index_from, add_max_terms, add_out, old_spelling, renumber
from tensoralg.escape import terminal_safe

from numeric_check.cli.source import (
    add_model_arguments,
    add_text_arguments,
    check_model_flags,
    convert,
    load_user_model,
    UserModel,
    text_tokens,
    token_line,
    wants_user_model,
)
from numeric_check.errors import VerifyCLIError

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from numeric_check.model.circuit_model import CircuitModel

# torch is imported inside the functions that run the command, not here: the CLI imports
# this module to build its parser, and `tcircuits --help` should not wait for torch.

DESCRIPTION = """\
Check, numerically, that the path expansion of a transformer adds up to what a real
torch model computes.

The logits of an attention-only transformer, with its attention patterns (and layer-norm
scales) frozen at their values on the given tokens, are a sum of path terms
  T = Σ_paths (A_path) ⊗ (W_U W_OV^path W_src),
one per source (tokens, positions, each layer's biases and MLP output) and per path
through the heads: the direct path, each head, and virtual heads through several layers.
Each term is bound to the model's weights and to the patterns, scales and MLP outputs of
a real forward pass, and three checks run:

  1. sum        the sum of all terms equals the model's logits (relative error <= rtol,
                1e-9 in float64);
  2. isolation  each term equals the same path computed by the model itself, with hooks:
                patterns and scales frozen, only the path's source and heads on, the
                residual connection dropped at the path's layers (the paper's procedure);
  3. truncation with --max-order K, the model's logits minus the kept terms equal the
                omitted terms (computed by the model in an order-graded forward pass).

With --qk LAYER HEAD the same checks run on that head's pre-softmax attention scores
(3-slot terms P ⊗ Q ⊗ M acting as S = P X_q M X_kᵀ Qᵀ: direct, Q-, K- and
QK-composition), compared on the causal lower triangle.

The model is the one you study — a Hugging Face causal LM (--hf NAME_OR_DIR: a folder
saved with save_pretrained, or a name from_pretrained resolves) or a TransformerLens model
(--tl NAME) — converted to the paper's convention and checked against it first (its logits
on probe tokens and on your tokens must equal the source's; the report says by how much),
or a random one (--layers, --heads, ...; seeded), or a checkpoint saved by tcircuits
(--checkpoint). Tokens are your prompt (--text "..." or --text-file F, tokenized by the
model's own tokenizer), ids (--tokens "1,2,3", sequences separated by ";"), or random
(--batch-size, --seq-len, --token-seed). Prints a table of every term (its order,
the Frobenius norm of its contribution, its error against isolation) or --format json; exits 0
when every check passes and 1 when one fails.
"""

EPILOG = """\
examples:
  tcircuits verify --hf ./my-gpt2 --text "The cat sat on the mat" --max-order 1
  tcircuits verify --hf EleutherAI/pythia-70m --text "When Mary and John" --qk 1 3 --max-order 1
  tcircuits verify --layers 2 --heads 4 --positional standard --layer-norm
  tcircuits verify --layers 3 --heads 8 --max-order 1 --format json
  tcircuits verify --layers 2 --heads 2 --qk 1 0 --tokens "5,1,2,5,1"
  tcircuits verify --checkpoint induction_2l.safetensors --seq-len 32 --no-isolation
  torchrun --nproc-per-node 2 $(which tcircuits) verify --layers 4 --heads 8 --max-order 2
      (each rank a share of the terms: gloo on CPUs, NCCL and one GPU per rank on CUDA; rank 0 prints)
"""

_RANDOM_DEFAULTS = {"layers": 2, "heads": "4", "d_model": 32, "d_head": 8, "d_vocab": 50, "n_ctx": 16,
                    "positional": "none", "layer_norm": False, "biases": False, "mlp": False, "seed": 0}


MAX_PARAMETERS = 50_000_000  # a random model larger than this is refused before it is allocated
DTYPES = ("float64", "float32", "float16", "bfloat16")


def register(subparsers) -> None:
    """Add ``verify`` to the ``tcircuits`` parser."""
    p = subparsers.add_parser(
        "verify",
        help="check a path expansion numerically against a real model (logits or one head's scores)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model = p.add_argument_group("model (yours with --hf or --tl, a --checkpoint, or a random one)")
    add_model_arguments(model)
    model.add_argument("--checkpoint", metavar="PATH", help="a tcircuits checkpoint (.safetensors, or a .pt saved with weights only)")
    model.add_argument("--layers", type=int_in(0, MAX_LAYERS), help=f"number of layers (default {_RANDOM_DEFAULTS['layers']})")
    model.add_argument("--heads", help="heads per layer: one int, or one per layer as '2,4' (default 4)")
    for name, text in (("d-model", "residual stream width"), ("d-head", "head width"), ("d-vocab", "vocabulary size"),
                       ("n-ctx", "context length")):
        model.add_argument(f"--{name}", type=int_in(1), help=f"{text} (default {_RANDOM_DEFAULTS[name.replace('-', '_')]})")
    model.add_argument("--positional", choices=POSITIONAL_KINDS, help="positional embeddings (default none)")
    model.add_argument("--layer-norm", action="store_true", default=None, help="a layer norm before attention, MLPs and unembedding")
    model.add_argument("--biases", action="store_true", default=None, help="biases b_Q, b_K, b_V, b_O, b_U")
    model.add_argument("--mlp", action="store_true", default=None, help="an MLP after each attention layer (an opaque source)")
    model.add_argument("--seed", type=int_in(0, MAX_SEED), help="seed of the random weights (default 0)")
    tokens = p.add_argument_group("tokens")
    add_text_arguments(tokens)
    tokens.add_argument("--tokens", help='token ids, "1,2,3"; several sequences of equal length as "1,2;3,4"')
    add_batch_size(tokens, type=int_in(1, 4096), default=2, help="random sequences (default 2)")
    tokens.add_argument("--seq-len", type=int_in(1), help="positions per random sequence (default: min(8, n_ctx))")
    tokens.add_argument("--token-seed", type=int_in(0, MAX_SEED), default=0, help="seed of the random tokens (default 0)")
    check = p.add_argument_group("what to check")
    check.add_argument("--max-order", type=int_in(0), help="keep paths through at most this many heads (check 3 covers the rest)")
    check.add_argument("--qk", nargs=2, type=int_in(0), metavar=("LAYER", "HEAD"),
                       help="verify this head's attention scores instead of the logits (LAYER numbered from --index-from)")
    add_index_from(check)
    check.add_argument("--no-isolation", action="store_true", help="skip check 2 (a forward pass per chunk of terms; slow on large vocabularies)")
    check.add_argument("--dtype", default="float64", choices=DTYPES,
                       help="dtype of the verification, and of the --hf/--tl model as loaded (default float64)")
    check.add_argument("--accept-source-precision", action="store_true",
                       help="a half-precision --hf/--tl model that runs as no float64 or float32 copy of itself (too large "
                            "to copy): compare it at its own precision, named on the report, instead of refusing it")
    add_runtime_arguments(check)
    check.add_argument("--rank-timeout", type=finite_float, default=1800.0, metavar="SECONDS",
                       help="under torchrun: how long a rank waits for the others before it stops with an error (default 1800)")
    check.add_argument("--join-timeout", type=finite_float, default=300.0, metavar="SECONDS",
                       help="under torchrun: how long a rank waits to meet the others when it starts (default 300; "
                            "at most --rank-timeout)")
    check.add_argument("--max-hours", type=finite_float, default=1.0, metavar="H",
                       help="refuse, before starting, a verification estimated to take longer (default 1)")
    check.add_argument("--rtol", type=finite_float, help="relative tolerance (default 1e-9 in float64, 1e-4 in float32; in bfloat16 and float16 the dtype's "
                       "epsilon plus 3 times the rounding measured on the tokens)")
    check.add_argument("--atol", type=finite_float, help="absolute tolerance added to rtol x scale (default 0)")
    out = p.add_argument_group("output")
    out.add_argument("--format", default="text", choices=("text", "json"), help="the report as text (default) or JSON")
    old_spelling(out, "--json", dest="format", use="--format json", flag_value="json")
    add_out(out, dest="output", help="write the report there (a temporary file renamed once complete) instead of printing "
                                    "it; - or /dev/stdout: standard output")
    out.add_argument("--force", action="store_true",
                     help="let -o replace a file this command reads, a checkpoint or a training record")
    add_max_terms(out, dest="max_rows", default=None, old="--max-rows",
                  help="print at most this many terms in the table (default: all; 0: the summary only)")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    old_spelling(out, "--no-progress", dest="quiet", use="--quiet", flag_value=True)
    p.set_defaults(func=with_runtime(run))


def run(args: argparse.Namespace) -> int:
    """Build the model and tokens, verify, print the report; 0 if every check passed, else 1. Under
    ``torchrun`` every rank verifies a share of the terms and rank 0 alone prints the whole report."""
    import sys

    from numeric_check.verification import distributed

    ranks = distributed.Torchrun.from_environment()  # every variable checked: WORLD_SIZE=abc is one line
    if ranks is not None:  # said before the wait, which is bounded
        print(f"tcircuits verify: rank {ranks.rank} of {ranks.world} meeting the others at {ranks.address}:{ranks.port} "
              f"(waiting at most {min(args.join_timeout, args.rank_timeout):.0f} s)", file=sys.stderr, flush=True)
    args.device = distributed.init_from_environment(args.device, args.rank_timeout, args.join_timeout)
    try:
        return _run(args)
    finally:
        distributed.finish()


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from numeric_check.files import output_file
    from numeric_check.verification.distributed import is_first_rank
    from numeric_check.verification.verify import verify_logits, verify_qk

    if args.qk is not None:
        args.qk = [qk_layer(args.qk[0], args.index_from), args.qk[1]]
    checkpoint = [Path(args.checkpoint), Path(args.checkpoint).with_suffix(".json")] if args.checkpoint else []  # and its record
    inputs = checkpoint + [Path(p) for p in (getattr(args, "text_file", None), getattr(args, "hf", None)) if p]
    output = output_file(args.output, inputs=inputs, force=args.force)  # checked before any work
    model, tokens, tokenizer = model_and_tokens(args)
    check_residual_width(model.cfg.d_model)
    dtype = args.dtype
    common = dict(max_order=args.max_order, dtype=dtype, device=args.device, atol=args.atol, rtol=args.rtol,
                  isolation=not args.no_isolation)
    first = is_first_rank()
    announce_duration(args, model, tokens, first)
    with _Progress(disabled=args.quiet or not first) as progress:
        if args.qk is None:
            report = verify_logits(model, tokens, progress=progress, **common)
        else:
            layer, head = args.qk
            report = verify_qk(model, tokens, layer, head, progress=progress, **common)
    if tokenizer is not None:
        report.tokens = [token_line(tokenizer, row) for row in tokens.tolist()]
    if first:
        write_report(report.json_pieces() if args.format == "json" else  # JSON numbers layers from 0, as every JSON
                     (renumber(terminal_safe(piece), args.index_from) for piece in report.text_pieces(args.max_rows)), output)
    return 0 if report.passed else 1


def qk_layer(layer: int, index_from: int) -> int:
    """``--qk LAYER`` as the model counts it (from 0), given as the command line numbers layers."""
    if layer < index_from:
        raise VerifyCLIError(f"--qk {layer}: with --index-from {index_from} the first layer is {index_from}")
    return layer - index_from


def write_report(pieces: Iterable[str], output: Path | None) -> None:
    """A report written a piece at a time (a chunk of its rows: never the whole document in memory), then a
    line break: to standard output (``output`` ``None``), or into a temporary file beside ``output``, renamed
    over it once complete; a full disk or a file-size limit is one line and leaves no file."""
    if output is None:
        for piece in pieces:
            sys.stdout.write(piece)
        sys.stdout.write("\n")
        return
    from numeric_check.files import atomic_path

    with atomic_path(output) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for piece in pieces:
            f.write(piece)
        f.write("\n")


ANNOUNCE_S = 600  # runs estimated longer than this say so on stderr before they start


def announce_duration(args: argparse.Namespace, model: CircuitModel, tokens, first: bool) -> None:
    """Before the verification: its terms counted and its time estimated; a one-line error above
    ``--max-hours``, a line on stderr (rank 0) above :data:`ANNOUNCE_S`."""
    import torch

    from numeric_check.verification.budget import duration, refuse_long

    ranks = torch.distributed.get_world_size() if torch.distributed.is_available() and torch.distributed.is_initialized() else 1
    seconds = refuse_long(model.arch, args.max_order, None if args.qk is None else tuple(args.qk), batch=tokens.shape[0],
                          pos=tokens.shape[-1], d_model=model.cfg.d_model, d_head=model.cfg.d_head, dtype=args.dtype,
                          device=args.device, max_hours=args.max_hours, ranks=ranks)
    if first and seconds > ANNOUNCE_S:
        print(f"tcircuits verify: about {duration(seconds)} on {args.device.type} (an estimate from the terms' count)",
              file=sys.stderr, flush=True)


def model_and_tokens(args: argparse.Namespace):
    """``(model, tokens, tokenizer)``: the --hf/--tl model converted and checked against its source
    on probe tokens and on the tokens studied, or a checkpoint or random model (no tokenizer)."""
    given = [name for name in _RANDOM_DEFAULTS if getattr(args, name, None) is not None]
    check_model_flags(args, ["--" + name.replace("_", "-") for name in given])
    if not wants_user_model(args):
        model = build_model(args)
        fit_threads(args, model.cfg.d_model)
        tokenizer = None
        if args.checkpoint is not None:  # a checkpoint trained on text reads prompts with its own tokenizer
            from numeric_check.training.text import CheckpointTokenizer

            tokenizer = CheckpointTokenizer.beside(args.checkpoint, model.cfg.d_vocab)
        text = None if tokenizer is None else text_tokens(
            args, UserModel(None, tokenizer, str(args.checkpoint), "checkpoint"), model.cfg.n_ctx, model.cfg.d_vocab)
        return model, text if text is not None else build_tokens(args, model), tokenizer
    user = load_user_model(args, args.dtype, args.device)

    def tokens_for(model):
        text = text_tokens(args, user, model.cfg.n_ctx, model.cfg.d_vocab)
        return text if text is not None else build_tokens(args, model)

    model, tokens = convert(user, args.dtype, args.device, tokens_for)
    fit_threads(args, model.cfg.d_model)
    return model, tokens, user.tokenizer


def build_model(args: argparse.Namespace) -> CircuitModel:
    """The checkpoint, or a random model from the options (defaults filled in)."""
    import torch

    from numeric_check.model.circuit_model import CircuitModel

    given = [name for name in _RANDOM_DEFAULTS if getattr(args, name, None) is not None]
    if args.checkpoint is not None:
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise VerifyCLIError(f"--checkpoint describes the model; do not also give {flags}")
        from numeric_check.model.checkpoint import load_checkpoint

        return load_checkpoint(args.checkpoint)
    opts = {name: getattr(args, name) if getattr(args, name, None) is not None else default
            for name, default in _RANDOM_DEFAULTS.items()}
    arch = Architecture(opts["layers"], parse_heads(opts["heads"]), positional=opts["positional"],
                        layer_norm=opts["layer_norm"], biases=opts["biases"], mlp=opts["mlp"])
    check_model_size(arch, opts)
    return CircuitModel.random(arch, d_model=opts["d_model"], d_head=opts["d_head"], d_vocab=opts["d_vocab"],
                               n_ctx=opts["n_ctx"], seed=opts["seed"], dtype=torch.float64)


def check_model_size(arch: Architecture, opts: dict) -> None:
    """Refuse a random model of more than :data:`MAX_PARAMETERS` weights before allocating it
    (the count: embeddings, unembedding, positions and each head's four matrices; MLPs of 4 d_model)."""
    d_model, d_head, d_vocab, n_ctx = (opts[k] for k in ("d_model", "d_head", "d_vocab", "n_ctx"))
    total = 2 * d_vocab * d_model + n_ctx * d_model + 4 * arch.n_heads_total * d_head * d_model
    if arch.mlp:
        total += arch.n_layers * 8 * d_model * d_model
    if total > MAX_PARAMETERS:
        raise VerifyCLIError(f"a random model of --d-model {d_model} --d-head {d_head} --d-vocab {d_vocab} --n-ctx {n_ctx} "
                             f"with {arch.n_heads_total} heads has {total:,} weights, more than {MAX_PARAMETERS:,}; "
                             "use smaller dimensions")


def check_residual_width(d_model: int) -> None:
    """Refuse a residual stream so wide that the check's ``d_model × d_model`` matrices (the
    Gram matrices behind each term's norm) would pass :data:`MAX_PARAMETERS` entries: with
    --d-model 100000 that was an 80 GB allocation and a traceback."""
    if d_model * d_model > MAX_PARAMETERS:
        raise VerifyCLIError(f"d_model={d_model:,}: the verification forms d_model × d_model matrices ({d_model * d_model:,} "
                             f"entries, more than {MAX_PARAMETERS:,}); verify a model with d_model <= {math.isqrt(MAX_PARAMETERS):,}")


def check_activations(model: CircuitModel, batch: int, seq_len: int, flag: str) -> None:
    """Refuse, before any tensor exists, sequences whose activations would pass
    :data:`MAX_PARAMETERS` entries: the attention patterns of every head (``batch × heads ×
    pos²``, all kept for the check) or the logits (``batch × pos × d_vocab``); name the longest
    sequence that fits. ``--n-ctx 100000 --seq-len 100000`` asked for 80 GB before."""
    heads, width = model.arch.n_heads_total, max(model.cfg.d_vocab, model.cfg.d_model)
    patterns, logits = batch * max(heads, 1) * seq_len * seq_len, batch * seq_len * width
    if max(patterns, logits) <= MAX_PARAMETERS:
        return
    fits = min(math.isqrt(MAX_PARAMETERS // (batch * max(heads, 1))), MAX_PARAMETERS // (batch * width))
    what = (f"the attention patterns of {heads} heads would hold {patterns:,} entries" if patterns >= logits
            else f"the logits would hold {logits:,} entries")
    advice = f"use {flag} with at most {fits:,} positions" if fits else "use fewer sequences (--batch-size)"
    raise VerifyCLIError(f"{batch:,} sequences of {seq_len:,} positions: {what}, more than {MAX_PARAMETERS:,}; {advice}")


def parse_heads(text: str) -> int | tuple[int, ...]:
    """``"4"`` → 4, ``"2,3"`` → (2, 3)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise VerifyCLIError(f"--heads must be an int or comma-separated ints such as 2,4; got {text!r}") from None
    return values[0] if len(values) == 1 else values


def build_tokens(args: argparse.Namespace, model: CircuitModel) -> torch.Tensor:
    """``--tokens`` parsed, or random tokens from ``--batch-size``, ``--seq-len``, ``--token-seed``."""
    import torch

    cfg = model.cfg
    if args.tokens is not None:
        try:
            rows = [[int(t) for t in row.split(",")] for row in args.tokens.split(";")]
        except ValueError:
            raise VerifyCLIError(f'--tokens must be comma-separated ids such as "1,2,3" (sequences separated by ";"); got {args.tokens!r}') from None
        if len({len(r) for r in rows}) != 1:
            raise VerifyCLIError(f"--tokens sequences must have equal lengths, got {[len(r) for r in rows]}")
        bad = [t for row in rows for t in row if not 0 <= t < cfg.d_vocab]
        if bad:
            raise VerifyCLIError(f"--tokens holds the id {bad[0]}, outside the vocabulary 0..{cfg.d_vocab - 1}")
        if len(rows[0]) > cfg.n_ctx:
            raise VerifyCLIError(f"--tokens sequences have {len(rows[0])} positions, more than the context n_ctx={cfg.n_ctx}")
        check_activations(model, len(rows), len(rows[0]), "--tokens")
        return torch.tensor(rows)
    seq_len = args.seq_len if args.seq_len is not None else min(8, cfg.n_ctx)
    if args.batch_size < 1 or seq_len < 1:
        raise VerifyCLIError(f"--batch-size and --seq-len must be >= 1, got {args.batch_size} and {seq_len}")
    if seq_len > cfg.n_ctx:
        raise VerifyCLIError(f"--seq-len {seq_len} is longer than the model's context n_ctx={cfg.n_ctx}")
    check_activations(model, args.batch_size, seq_len, "--seq-len")
    gen = torch.Generator().manual_seed(args.token_seed)
    return torch.randint(0, cfg.d_vocab, (args.batch_size, seq_len), generator=gen)


class _Progress:
    """A tqdm bar on stderr, shown only for runs longer than a second (and only on a terminal)."""

    def __init__(self, disabled: bool):
        self.disabled = disabled
        self.bars: dict[str, object] = {}

    def __enter__(self):
        return None if self.disabled else self

    def __call__(self, stage: str, done: int, total: int) -> None:
        bar = self.bars.get(stage)
        if bar is None:
            from tqdm import tqdm

            bar = self.bars[stage] = tqdm(total=total, desc=stage, unit="term", file=sys.stderr, delay=1.0,
                                          leave=False, disable=None)
        bar.update(done - bar.n)

    def __exit__(self, *exc) -> None:
        for bar in self.bars.values():
            bar.close()
