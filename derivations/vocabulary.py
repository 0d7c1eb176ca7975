"""One command-line vocabulary: the options every ``tcircuits`` command spells alike, and the old spellings
kept working for a release.

=====================  ===================================================================
``-o/--out``           where the output goes (a file, or a folder for commands that write many)
``--format``           the output's format (``json`` among them); figure types are ``--figure-formats``
``--text``             text itself (a prompt); ``--text-file FILE`` reads it from a file
``--checkpoint``       a tcircuits checkpoint (``--hf`` a Hugging Face model, ``--tl`` TransformerLens)
``--quiet``            no progress bar
``--index-from``       layers numbered from 0 (the default everywhere, as TransformerLens) or 1
                       (the paper's ``H_1``), in every command that names a head
``--dtype``            the precision computed in: ``float64`` by default everywhere
``--batch-size``       how many sequences (``--batch`` is its old spelling)
``--seq-len``          a prompt's length; ``--n-ctx`` is a model's context (its longest prompt)
``--max-terms``        how many terms a command shows: N (0: none, the summary only) or ``all``
                       (``--top``, ``--rows``, ``--max-rows`` its old spellings)
``--d-vocab``          a vocabulary's size, as TransformerLens names it (``--vocab`` its old spelling in
                       ``train-toy``); ``--vocab-file FILE`` its token strings (``--vocab`` in ``analyze``)
=====================  ===================================================================

``tests/test_cli_vocabulary.py`` holds every subcommand to the table. An old spelling (``--output``,
``--json``, ``--no-progress``, ``--formats``, ``--batch``, ``--top``, ``--rows``, ``--max-rows``, a positional
CHECKPOINT) still works and says once, on standard error, what to use instead.
"""

from __future__ import annotations

import argparse
import re
import sys

#: The old spellings noted in this process (each is said once).
_noted: set[tuple[str, str]] = set()


def note_once(prog: str, key: str, text: str) -> None:
    """Say ``text`` once (per ``key``), on standard error, as a note of ``prog``."""
    if (prog, key) in _noted:
        return
    _noted.add((prog, key))
    print(f"{prog}: note: {text}", file=sys.stderr)


def note_old_spelling(prog: str, old: str, use: str) -> None:
    """Say once, on standard error, that ``old`` is an old spelling of ``use``."""
    note_once(prog, old, f"{old} is an old spelling and goes in a later release; use {use}")


class _OldSpelling(argparse.Action):
    """An option kept under its old name: it does what ``use`` does and says so once."""

    def __init__(self, option_strings, dest, use: str, value=None, **kwargs):
        self.use, self.value = use, value
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        note_old_spelling(parser.prog, option_string, self.use)
        setattr(namespace, self.dest, self.value if self.nargs == 0 else values)


def old_spelling(parser, old: str, *, dest: str, use: str, flag_value=None, **kwargs) -> None:
    """Accept ``old`` (hidden from ``--help``) as ``use``: it sets ``dest`` to its value, or to ``flag_value``
    for an old flag that took no value (``--json`` is ``--format json``)."""
    if flag_value is not None:
        kwargs["nargs"] = 0
    parser.add_argument(old, dest=dest, action=_OldSpelling, use=use, value=flag_value, help=argparse.SUPPRESS,
                        default=argparse.SUPPRESS, **kwargs)


def names_a_file(text: str) -> bool:
    """Whether ``text``, given to ``--text`` as the text itself, also names a file (one line, no surrounding
    blanks, shorter than a path can be): what the commands point to ``--text-file`` for."""
    import os

    if len(text) >= 4096 or "\n" in text or text.strip() != text:
        return False
    try:
        return os.path.isfile(text)
    except (OSError, ValueError):
        return False


def add_quiet(parser) -> None:
    """``--quiet`` (``dest`` ``quiet``): no progress bar or status line on standard error, in every command that shows one."""
    parser.add_argument("--quiet", action="store_true", help="no progress bar or status line on standard error")


def terms_count(text: str) -> int | None:
    """What ``--max-terms`` reads: a count of terms, 0 or more, or ``all`` (None: every term)."""
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of terms (0 or more) or 'all', got {text!r}")
    return value


def add_max_terms(parser, *, dest: str, default, help: str, old: str | None) -> None:
    """``--max-terms N`` (or ``all``), how many terms (rows) a command shows, with one meaning everywhere: at most N,
    0 the summary only, ``all`` every term; the command's ``old`` name for it (``--top``, ``--rows``,
    ``--max-rows``) kept as an old spelling."""
    parser.add_argument("--max-terms", dest=dest, type=terms_count, default=default, metavar="N", help=help)
    if old is not None:
        old_spelling(parser, old, dest=dest, use="--max-terms N", type=terms_count, metavar="N")


def add_index_from(parser) -> None:
    """``--index-from {0,1}`` (``dest`` ``index_from``), 0 by default in every command."""
    parser.add_argument("--index-from", type=int, choices=(0, 1), default=0, metavar="{0,1}",
                        help="number layers from 0 (default, as TransformerLens: L0H3 is a head of the first layer) "
                             "or from 1 (the paper's: H_1 and L1H3 are the first layer's)")


_HEAD = re.compile(r"\b(L)(\d+)(H|KV)(\d+)\b")


def renumber(text: str, index_from: int) -> str:
    """``text`` with every head label (``L0H3``, ``L1KV0``) numbered from ``index_from``: what a command prints
    when ``--index-from 1`` asks for the paper's numbering of labels made from 0.

    >>> renumber("tok→L0H1→L1H0, L0KV2; L0 stays", 1)
    'tok→L1H1→L2H0, L1KV2; L0 stays'
    """
    if not index_from:
        return text
    return _HEAD.sub(lambda m: f"L{int(m[2]) + index_from}{m[3]}{m[4]}", text)


def add_batch_size(parser, *, default: int, help: str, type=int) -> None:
    """``--batch-size N`` (``dest`` ``batch_size``), with ``--batch`` kept as an old spelling."""
    parser.add_argument("--batch-size", type=type, default=default, metavar="N", help=help)
    old_spelling(parser, "--batch", dest="batch_size", use="--batch-size N", type=type, metavar="N")


def add_out(parser, *, metavar: str = "FILE", help: str, required: bool = False, type=None, old: str | None = "--output",
            dest: str = "out") -> None:
    """``-o/--out`` (``dest`` ``out``), with ``old`` (``--output`` by default) kept as an old spelling; where
    ``-o`` is required, either spelling gives it (a required group of the two)."""
    where = parser.add_mutually_exclusive_group(required=True) if required and old is not None else parser
    where.add_argument("-o", "--out", dest=dest, metavar=metavar, help=help, required=required and where is parser, type=type)
    if old is not None:
        old_spelling(where, old, dest=dest, use="-o/--out", metavar=metavar, type=type)


def add_checkpoint(parser, *, help: str, positional_help: str | None = None) -> None:
    """``--checkpoint PATH`` (``dest`` ``checkpoint``) and, where a command took one, the old positional
    CHECKPOINT (read by :func:`checkpoint_of`)."""
    from pathlib import Path

    parser.add_argument("--checkpoint", type=Path, metavar="PATH", help=help)
    if positional_help is not None:
        parser.add_argument("old_checkpoint", nargs="?", type=Path, metavar="CHECKPOINT", help=argparse.SUPPRESS)


def checkpoint_of(args) -> None:
    """Merge the old positional CHECKPOINT into ``args.checkpoint`` (saying once to use ``--checkpoint``); both
    given is an error of the command line."""
    old = getattr(args, "old_checkpoint", None)
    if old is None:
        return
    if args.checkpoint is not None:
        from derivations.errors import CommandLineError

        raise CommandLineError(f"a CHECKPOINT ({old}) and --checkpoint ({args.checkpoint}) were both given; give one, with --checkpoint")
    note_old_spelling(f"tcircuits {args.command}", "a positional CHECKPOINT", "--checkpoint PATH")
    args.checkpoint = old
