"""``tcircuits attribute``: which paths make the model predict this token?

Registered through the entry point ``attribute = numeric_check.cli.attribute:register``. Bad input
raises :class:`~tensoralg.errors.TCircuitsError` subclasses, which ``tcircuits`` prints in one line
(exit 2); exit 0 when the checks pass, 1 when one fails.

The model and the prompt come from :func:`add_source_options` and :func:`load_source` (the shared
``--hf``/``--tl``/``--text`` options of :mod:`numeric_check.cli.source`, read as ``tcircuits verify``
reads them): your Hugging Face or TransformerLens model with a text prompt, a tcircuits checkpoint or
a random model, token ids or random tokens.
"""

from __future__ import annotations

import argparse

from numeric_check.reports.flags import MAX_SEED, add_runtime_arguments, int_in, with_runtime
from derivations.architecture import MAX_LAYERS, POSITIONAL_KINDS
from derivations.vocabulary import add_index_from, add_max_terms, add_out, add_quiet, renumber
from numeric_check.cli.source import add_model_arguments, add_text_arguments, parse_token
from numeric_check.errors import AttributionError

DESCRIPTION = """\
Attribute one logit to the paths of the model: every path term's contribution to the
target's logit (or to a difference of two logits) at one position of the prompt.

With the attention patterns and layer-norm scales frozen at their values on the prompt,
the logits are a sum of path terms (A_path) ⊗ (W_U W_OV^path W_src): the direct path,
each head, each virtual head through two heads (--max-order 2), from every source
(tokens, positions, each layer's biases and MLP output, the unembedding bias). The
terms are ranked by the size of their contribution and labelled as on the slides
(tok→L0H1→L1H2). Two checks against the model itself:

  sum        the contributions, plus the remainder of every higher order (one line,
             computed by the model in an order-graded forward pass), equal the model's
             own logit (or difference);
  isolation  each of the --max-terms largest terms equals its path isolated through the
             model's hooks (only its source and heads on, patterns and scales frozen).

A token is an id, or text that the model's tokenizer turns into exactly one token.
"""

EPILOG = """\
examples:
  tcircuits attribute --hf ./my-gpt2 --text "The capital of France is" --target " Paris"
  tcircuits attribute --hf ./my-gpt2 --text "When Mary and John went to the store, John gave a drink to" --logit-diff " Mary" " John"
  tcircuits attribute --checkpoint induction_2l.safetensors --tokens "5,1,2,5,1" --target 2
  tcircuits attribute --layers 2 --heads 4 --layer-norm --mlp --seq-len 8 --logit-diff 3 4 --position 5
  tcircuits attribute --checkpoint model.safetensors --tokens "1,2,3" --target 4 --format html -o attribution.html
"""

FORMATS = ("text", "json", "html", "markdown")
SUFFIXES = {"html": ".html", "json": ".json", "markdown": ".md", "text": None}
DTYPES = ("float64", "float32")


def register(subparsers) -> None:
    """Add ``attribute`` to the ``tcircuits`` parser."""
    p = subparsers.add_parser("attribute", help="rank every path's contribution to one logit, checked against the model",
                              description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_options(p)
    what = p.add_argument_group("what to attribute")
    goal = what.add_mutually_exclusive_group(required=True)
    goal.add_argument("--target", metavar="TOKEN", help="the token whose logit is attributed (an id, or text with a tokenizer)")
    goal.add_argument("--logit-diff", nargs=2, metavar=("A", "B"), help="attribute logit[A] - logit[B]")
    what.add_argument("--position", type=int, default=-1, help="the prompt position (default -1: the last)")
    what.add_argument("--max-order", type=int, default=2, help="paths through at most 1 or 2 heads (default 2); the rest is one line")
    add_max_terms(what, dest="top", default=30, old="--top",
                  help="terms shown and checked by isolation, largest first (default 30; 0: the summary only; all: "
                       "every term)")
    add_index_from(what)
    what.add_argument("--dtype", default="float64", choices=DTYPES,
                      help="dtype of the computation, and of the --hf/--tl model as loaded (default float64)")
    add_runtime_arguments(what)
    out = p.add_argument_group("output")
    out.add_argument("--format", default="text", choices=FORMATS, help="text (default), json (every term), html (a bar chart), markdown")
    add_out(out, dest="output", help="write there (atomically) instead of printing; - or /dev/stdout: standard output")
    out.add_argument("--force", action="store_true",
                     help="let -o replace a file this command reads, a checkpoint or a training record")
    add_quiet(out)
    p.set_defaults(func=with_runtime(run))


def add_source_options(p: argparse.ArgumentParser) -> None:
    """The model and prompt options: yours (--hf, --tl) with a --text prompt, a tcircuits checkpoint or a
    random model; token ids or random tokens."""
    from numeric_check.cli.verify import _RANDOM_DEFAULTS

    model = p.add_argument_group("model (yours with --hf or --tl, a --checkpoint, or a random one)")
    add_model_arguments(model)
    model.add_argument("--checkpoint", metavar="PATH", help="a tcircuits checkpoint (.safetensors)")
    model.add_argument("--layers", type=int_in(0, MAX_LAYERS), help=f"layers of a random model (default {_RANDOM_DEFAULTS['layers']})")
    model.add_argument("--heads", help="heads per layer: one int, or one per layer as '2,4' (default 4)")
    for name in ("d-model", "d-head", "d-vocab", "n-ctx"):
        model.add_argument(f"--{name}", type=int_in(1), help=f"(default {_RANDOM_DEFAULTS[name.replace('-', '_')]})")
    model.add_argument("--positional", choices=POSITIONAL_KINDS, help="positional embeddings (default none)")
    for flag in ("layer-norm", "biases", "mlp"):
        model.add_argument(f"--{flag}", action="store_true", default=None, help=f"a random model with {flag.replace('-', ' ')}")
    model.add_argument("--seed", type=int_in(0, MAX_SEED), help="seed of the random weights (default 0)")
    prompt = p.add_argument_group("prompt")
    add_text_arguments(prompt)
    prompt.add_argument("--tokens", help='token ids, "1,2,3"')
    prompt.add_argument("--seq-len", type=int_in(1), help="positions of a random prompt (default: min(8, n_ctx))")
    prompt.add_argument("--token-seed", type=int_in(0, MAX_SEED), default=0, help="seed of the random prompt (default 0)")


def load_source(args: argparse.Namespace):
    """``(model, tokens [1, pos], tokenizer or None)`` from the options of :func:`add_source_options`:
    an --hf/--tl model is converted and checked against its source on probe tokens and on the prompt."""
    from numeric_check.cli.verify import model_and_tokens

    if args.tokens is not None and ";" in args.tokens:
        raise AttributionError(f"--tokens must be one prompt (no ';'), got {args.tokens!r}")
    from numeric_check.cli.source import BoundedTokenizer

    args.batch_size = 1
    model, tokens, tokenizer = model_and_tokens(args)
    return model, tokens, None if tokenizer is None else BoundedTokenizer(tokenizer)  # decoded within a bound too


def run(args: argparse.Namespace) -> int:
    """Attribute, print or write the result; 0 when every check passed, else 1."""
    from numeric_check.circuits.attribution import attribute
    from pathlib import Path

    from numeric_check.files import output_file, write_atomic

    if args.max_order not in (1, 2):
        raise AttributionError(f"--max-order must be 1 or 2, got {args.max_order}")
    checkpoint = [Path(args.checkpoint), Path(args.checkpoint).with_suffix(".json")] if args.checkpoint else []  # and its record
    inputs = checkpoint + [Path(p) for p in (getattr(args, "text_file", None), getattr(args, "hf", None)) if p]
    output = output_file(args.output, SUFFIXES[args.format], inputs=inputs, force=args.force)
    model, tokens, tokenizer = load_source(args)
    goal = dict(target=parse_token(args.target)) if args.target is not None else dict(
        logit_diff=tuple(parse_token(t) for t in args.logit_diff))
    result = attribute(model, tokens, position=args.position, max_order=args.max_order, top=args.top, tokenizer=tokenizer,
                       dtype=args.dtype, device=args.device, **goal)
    text = {"text": lambda: result.to_text(args.top), "json": result.to_json, "html": lambda: result.to_html(args.top),
            "markdown": lambda: result.to_markdown(args.top)}[args.format]()
    text = text if args.format == "json" else renumber(text, args.index_from)  # JSON numbers layers from 0
    if output is None:
        print(text)
    else:
        write_atomic(output, text + "\n")
    return 0 if result.passed else 1
