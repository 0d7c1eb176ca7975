"""The ``tcircuits`` command line.

Subcommands live beside the code they drive. ``derive`` and ``expand`` are defined in
:mod:`derivations.commands`; other packages add theirs through the entry-point group
``tcircuits.commands`` (each entry is a function ``register(subparsers)`` that adds one
subparser and sets ``func``), so this module never imports them. Every error the
library raises is a :class:`tensoralg.errors.TCircuitsError`; the CLI prints its message
and exits with status 2 — never a traceback (under ``--explain``, an option of the commands that convert a
model, the error's ``detail`` lines follow its one line). Whatever reaches the terminal (messages that
quote the input, documents) goes through :func:`tensoralg.escape.terminal_safe`: a
control character in the input is shown escaped, never sent raw.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import contextvars
import difflib
import os
import re
import shutil
import signal
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path

from tensoralg.errors import TCircuitsError, TensorAlgError, cut
from tensoralg.escape import terminal_safe

from derivations import commands
from derivations.signals import Stopped, stoppable
from derivations.terminal import guarded_terminal

DESCRIPTION = """\
Symbolic derivations for "A Mathematical Framework for Transformer Circuits"
(Elhage et al., 2021), checked numerically against real torch models.

Notation: a transformer acts on the residual stream x (one row per position; each
position's vector is a column, as in the paper) as
  T = (Id ⊗ W_U) · Π_l (Id + Σ_h A^h ⊗ W_OV^h) · (Id ⊗ W_E),
where A^h ⊗ W means "mix positions with the attention pattern A^h, and transform each
position's vector with W": (A ⊗ W)·x = A x Wᵀ. The mixed-product rule (A⊗B)(C⊗D) = (AC)⊗(BD) expands T into paths: the
direct path, individual heads and virtual heads. Layers and heads are 0-indexed
(L0H3 = layer 0, head 3), as in TransformerLens; the paper's H_1 is our layer 0
(--index-from 1 numbers layers as the paper does).
"""

EPILOG = """\
examples:
  tcircuits derive --list
  tcircuits derive two-layer-logits --heads 2 --format markdown
  tcircuits expand "(Id + Σ_{h∈H_0} A^h ⊗ W_OV^h)(Id ⊗ W_E)"
  tcircuits expand "(A ⊗ W_O W_V)·x"

'tcircuits help COMMAND' (or 'tcircuits COMMAND --help') explains each command, with more examples.
"""

#: The command line being parsed, for the "did you mean" of a subcommand's parser that stops at a missing option.
_ARGV: contextvars.ContextVar[list[str]] = contextvars.ContextVar("tcircuits_argv", default=[])


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage block), exit status 2, with a "did you mean"
    for a mistyped command, option or choice; no option is taken by an abbreviation of its name (a new
    option would change what an old abbreviation means). The subcommands' parsers are of the same class,
    so every command reports alike."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        token = _ARGV.set(args)
        try:
            namespace, extras = self.parse_known_args(args, namespace)
        finally:
            _ARGV.reset(token)
        if extras:
            where = _subparser(self, namespace) or self
            where.error(f"unrecognized arguments: {' '.join(extras)}" + _suggestion(extras, where))
        return namespace

    def error(self, message: str):
        alone = re.fullmatch(r"one of the arguments (\S+) is required", message)  # -o/--out beside its hidden old spelling
        message = f"the following arguments are required: {alone[1]}" if alone else message
        if message.startswith("the following arguments are required") and self._subparsers is None:
            unknown = [a for a in _ARGV.get() if a.startswith("--") and a.split("=")[0] not in self._option_string_actions]
            if unknown:  # a mistyped option is why the required one is missing (--output for -o/--out): say both
                message = f"{message}; unrecognized arguments: {' '.join(unknown)}{_suggestion(unknown, self)}"
        message = terminal_safe(" ".join(message.split()))  # argparse quotes bad values, newlines and all
        if message.endswith("expected one argument"):  # --tokens -1,2: the value reads as a flag
            flag = message.removeprefix("argument ").split(":")[0].split("/")[-1]
            message += f" (a value that starts with '-' is written {flag}=VALUE)"
        choice = re.search(r"invalid choice: '(.*?)' \(choose from (.*)\)$", message)
        if choice:
            close = difflib.get_close_matches(choice.group(1), re.findall(r"'(.*?)'", choice.group(2)), n=1)
            message += f"; did you mean '{close[0]}'?" if close else ""
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def _print_message(self, message, file=None):
        """As argparse prints, but help that cannot reach standard output is not lost with exit status 0
        (argparse ignores the failed write): a reader gone away ends quietly (141), a full disk or a
        closed stream is one line (2)."""
        if not message or file is None or file is not sys.stdout:
            return super()._print_message(message, file)
        try:
            file.write(message)
            file.flush()
        except BrokenPipeError:
            _quiet_stdout()
            sys.exit(141)
        except OSError as error:  # a guarded stream's OutputError too
            _say(f"{self.prog}: error: {one_line(error)}")
            sys.exit(2)


def _subparser(parser: argparse.ArgumentParser, namespace) -> argparse.ArgumentParser | None:
    """The parser of the subcommand ``namespace`` was parsed for, if any."""
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return None if action is None else action.choices.get(getattr(namespace, "command", None))


def _suggestion(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """"; did you mean --format?" for the first unknown option close to one of ``parser``'s (hidden old spellings
    too), named as ``--help`` names it (``-o/--out`` for ``--output``). An option that begins several (``--fo``:
    ``--force``, ``--format``) or is as close to two names them all: no abbreviation is taken, none guessed."""
    names = {s: getattr(a, "use", None) or "/".join(a.option_strings)  # an old spelling: the name it points to
             for a in parser._actions for s in a.option_strings if s.startswith("--")}
    for extra in extras:
        typed = extra.split("=")[0]
        if not typed.startswith("--"):
            continue
        close = sorted(o for o in names if o.startswith(typed) and o != typed) or \
            difflib.get_close_matches(typed, names, n=3, cutoff=0.7)
        if close and not close[0].startswith(typed):  # by likeness: those as close as the closest
            best = difflib.SequenceMatcher(None, typed, close[0]).ratio()
            close = [o for o in close if difflib.SequenceMatcher(None, typed, o).ratio() >= best - 0.02]
        said = list(dict.fromkeys(names[o] for o in close))
        if said:
            return f"; did you mean {' or '.join(said) if len(said) < 3 else ', '.join(said[:-1]) + ' or ' + said[-1]}?"
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tcircuits",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tcircuits {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    commands.register(subparsers)
    for entry in sorted(entry_points(group="tcircuits.commands"), key=lambda e: e.name):
        try:
            register = entry.load()
        except (ImportError, AttributeError) as error:  # a broken plugin must not take the others down
            print(f"tcircuits: warning: command {entry.name!r} is unavailable: {terminal_safe(error)}", file=sys.stderr)
            continue
        register(subparsers)
    return parser


def version() -> str:
    """The installed tcircuits' version (its package metadata), or 'unknown' where it runs uninstalled."""
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return installed("tcircuits")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Run ``tcircuits ARGV``; return the exit status (argparse exits by itself on bad flags).
    Whatever the terminal is — closed, full, ASCII-only — the answer is a result or one line
    (:func:`derivations.terminal.guarded_terminal`)."""
    # torch's waiting threads sleep instead of spinning, so a busy machine does not slow a run down
    # (set before the numeric commands import torch; numeric_check.model.threads has the thread policy)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    _matplotlib_folder()
    with guarded_terminal(), stoppable():  # SIGTERM and SIGHUP clean up as Ctrl-C does
        return _run(argv)


def _matplotlib_folder() -> None:
    """Matplotlib keeps its settings and font cache under HOME (``~/.config``, ``~/.cache``); where it cannot
    write there (HOME is /dev/null, a file, read-only) it makes a temporary folder itself and warns in two lines
    on every run, which would break "a result or one line". Here the CLI makes that folder quietly, before
    matplotlib is imported, and removes it at exit. A folder the user chose (MPLCONFIGDIR) is left alone, and
    nothing is created under HOME."""
    if "MPLCONFIGDIR" in os.environ:
        return
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no HOME and no entry in the password file
        home = None
    for variable, default in (("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache")):
        base = os.environ.get(variable) or (home / default if home else None)
        if base is None or not _could_write(Path(base) / "matplotlib"):
            break
    else:
        return
    try:
        folder = tempfile.mkdtemp(prefix="tcircuits-matplotlib-")
    except OSError:  # no writable temporary folder either: matplotlib says so itself
        return
    os.environ["MPLCONFIGDIR"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


def _could_write(folder: Path) -> bool:
    """Whether ``folder`` is a writable folder, or could be made in its nearest existing parent (nothing is made)."""
    try:
        for candidate in (folder, *folder.parents):
            if candidate.exists():
                return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    except OSError:  # a parent it may not look into (another user's HOME)
        pass
    return False


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    argv = command_line() if argv is None else argv
    if not argv:  # plain tcircuits: a usage line and where help is, as git and pip do (exit 2: no command given)
        _say(parser.format_usage().rstrip() + "\n" + "tcircuits: error: no command given; 'tcircuits --help' lists "
             "the commands, 'tcircuits help COMMAND' explains one")
        return 2
    if argv[0] == "help":  # tcircuits help CMD is tcircuits CMD --help; plain help is --help
        argv = [*argv[1:2], "--help"]
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe or a full disk shows here, not at exit
        return code
    except BrokenPipeError:  # the reader went away (| head): end quietly, as other CLIs do
        _quiet_stdout()
        return 141
    except TCircuitsError as error:
        _say(f"tcircuits {args.command}: error: {one_line(error)}")
        if getattr(args, "explain", False):  # the commands that convert a model: the refusal's detail, line by line
            for line in error.detail.splitlines():
                _say(f"  {terminal_safe(line)}")
        return 2
    except Stopped as stop:
        _say("tcircuits: interrupted" if stop.signum == signal.SIGINT else f"tcircuits: stopped by {stop.name}")
        return 128 + stop.signum
    except KeyboardInterrupt:
        _say("tcircuits: interrupted")
        return 130
    except MemoryError:
        _say(f"tcircuits {args.command}: error: out of memory (the input asks for more than this machine has)")
        return 2
    except RecursionError:
        _say(f"tcircuits {args.command}: error: the input nests too deeply to be read")
        return 2
    except UnicodeEncodeError as error:  # a new file's name under an ASCII locale (LC_ALL=C PYTHONUTF8=0)
        _say(f"tcircuits {args.command}: error: the name {terminal_safe(ascii(cut(str(error.object))))} cannot be "
             f"spelled in this system's file-name encoding ({sys.getfilesystemencoding()}): run under a UTF-8 locale "
             "(LC_ALL=C.UTF-8) or give an ASCII name")
        return 2


def _quiet_stdout() -> None:
    """Standard output pointed at the null device: nothing more reaches a closed pipe at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def command_line() -> list[str]:
    """``sys.argv[1:]``, with arguments that the locale could not decode (``LC_ALL=C``: ``⊗``
    arrives as surrogates) read as the UTF-8 they almost always are; an argument that names an
    existing file or folder is kept as given, so the file system finds it by its own bytes."""
    def repaired(arg: str) -> str:
        if arg.isascii() or os.path.lexists(arg):
            return arg
        try:
            return os.fsencode(arg).decode("utf-8")
        except UnicodeDecodeError:
            return arg

    return [repaired(arg) for arg in sys.argv[1:]]


def one_line(error: Exception) -> str:
    r"""``error``'s message safe for a terminal, on one line: a line break that came with a file name or a
    model's config is shown as ``\n``. An algebra error keeps its lines: the text parsed, a caret under the problem.

    >>> one_line(TCircuitsError("checkpoint evil\nname.safetensors\x1b[2J is corrupt"))
    'checkpoint evil\\nname.safetensors\\x1b[2J is corrupt'
    """
    text = terminal_safe(error)
    return text if isinstance(error, TensorAlgError) else text.replace("\n", "\\n")


def _say(line: str) -> None:
    """One line on standard error, if it can be written at all."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
