"""``tcircuits attention``: every head's attention pattern on your prompt, as a page that works offline."""

from __future__ import annotations

import argparse

from derivations.vocabulary import add_index_from
from derivations.vocabulary import add_out, add_quiet
from numeric_check.reports.flags import add_runtime_arguments, with_runtime

DESCRIPTION = """\
Show every head's attention pattern on a prompt: one self-contained HTML page (open it in a
browser; it needs no network), tokens on both axes, one small map per head named as every
other command names it (L0H3; --index-from 1 for the paper's numbering), and the head you
click shown large with each weight on hover and a colour legend, and the prompt's tokens
coloured by how much the token you point at attends to each (tokens boxed, a space shown as ␣
and a new line as ⏎; the page is titled by the model's file name). The model is yours
(--hf, --tl) or a tcircuits --checkpoint, converted and checked against its source first,
as verify does; the patterns are those of its own forward pass on your --text (or
--text-file, or --tokens).
"""

EPILOG = """\
examples:
  tcircuits attention --checkpoint numeric_check/data/kjv_2l.safetensors --text "And God said, Let there be light" -o att.html
  tcircuits attention --hf ./my-gpt2 --text "The cat sat on the mat. The cat" -o att.html
"""


def register(subparsers) -> None:
    """Add ``attention`` to the ``tcircuits`` parser."""
    from numeric_check.cli.attribute import add_source_options

    p = subparsers.add_parser("attention", help="every head's attention pattern on your prompt, as a web page",
                              description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_options(p)
    p.add_argument("--dtype", default="float64", choices=("float64", "float32"),
                   help="dtype of the computation, and of the --hf/--tl model as loaded (default float64)")
    add_index_from(p)
    add_out(p, required=True, metavar="FILE.html", help="the page to write (atomically)")
    p.add_argument("--force", action="store_true", help="let -o replace a file this command reads")
    add_quiet(p)
    add_runtime_arguments(p)
    p.set_defaults(func=with_runtime(run))


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from numeric_check.cli.attribute import load_source
    from numeric_check.files import output_file, write_atomic
    from numeric_check.reports.attention import attention_patterns

    inputs = [Path(p) for p in (args.checkpoint, getattr(args, "text_file", None), getattr(args, "hf", None)) if p]
    output = output_file(args.out, ".html", inputs=inputs, force=args.force)
    model, tokens, tokenizer = load_source(args)
    ids = tokens[0].tolist()
    strings = [tokenizer.decode([i]) for i in ids] if tokenizer is not None else None
    source = args.hf or args.tl or args.checkpoint
    # the file's name, not the path to it (/home/… on a shared page); a hub or TransformerLens name as given
    name = (Path(source).name if Path(source).exists() else source) if source else "a random model"
    view = attention_patterns(model.to(dtype=getattr(torch, args.dtype)), ids, strings,  # a float16 checkpoint too
                              index_from=args.index_from, title=str(name))
    check = getattr(model, "source_check", None)
    if check is not None:
        view.notes.append(check.describe())
    if output is None:
        print(view.to_html())
    else:
        write_atomic(output, view.to_html())
        print(f"wrote {output}: {len(view.heads)} heads on {len(ids)} tokens")
        if check is not None:
            print(check.describe())
    return 0
