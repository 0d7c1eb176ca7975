"""One command-line vocabulary: the options every ``tcircuits`` command spells alike, and the old spellings
kept working for a release.

=====================  ===================================================================
``-o/--out``           where the output goes (a file, or a folder for commands that write many)
``--format``           the output's format (``json`` among them); figure types are ``--figure-formats``
``--text``             text itself (a prompt); ``--text-file FILE`` reads it from a file
``--checkpoint``       a tcircuits checkpoint (``--hf`` a Hugging Face model, ``--tl`` TransformerLens)
``--quiet``            no progress bar
``--index-from``       layers numbered from 0 (TransformerLens) or 1 (the paper)
=====================  ===================================================================

``tests/test_cli_vocabulary.py`` holds every subcommand to the table. An old spelling (``--output``,
``--json``, ``--no-progress``, ``--formats``, a positional CHECKPOINT, ``--text FILE`` where a file
is meant) still works and says once, on standard error, what to use instead.
"""

from __future__ import annotations

import argparse
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


def add_out(parser, *, metavar: str = "FILE", help: str, required: bool = False, type=None, old: str | None = "--output",
            dest: str = "out") -> None:
    """``-o/--out`` (``dest`` ``out``), with ``old`` (``--output`` by default) kept as an old spelling."""
    parser.add_argument("-o", "--out", dest=dest, metavar=metavar, help=help, required=required, type=type)
    if old is not None:
        old_spelling(parser, old, dest=dest, use="-o/--out", metavar=metavar, type=type)


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
