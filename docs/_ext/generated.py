"""Pages of the guide generated from the installed code: the Hugging Face model types the installed
transformers defines and the family tcircuits reads each with, and the tree of error classes.

Plain functions returning Markdown (no Sphinx here), so that ``tests/test_docs.py`` checks them where
Sphinx is not installed; ``tcircuits_docs.py`` puts them on the pages.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
from dataclasses import dataclass

from tensoralg.display import md_table
from tensoralg.errors import TCircuitsError

#: the packages whose error classes the reference lists, in dependency order
PACKAGES = ("tensoralg", "derivations", "numeric_check")


def model_types_markdown() -> str:
    """Every causal-LM model type of the installed ``transformers``, by what
    :func:`numeric_check.from_hf` does with it: a table of those a family reads (each converted and
    checked against its source, or refused naming a feature its configuration uses) and of those
    registered only to be refused by name, then the list of those no family reads. Read from
    transformers' own registry and the readers' table, without building a model."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from numeric_check.conversion.readers import BY_CLASS

    read, refused, others = [], [], []
    for model_type, cls in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        cls = cls[0] if isinstance(cls, (tuple, list)) else cls
        family = BY_CLASS.get(cls)
        if family is None:
            others.append(f"`{model_type}`")
        else:
            (read if family.converts else refused).append([f"`{model_type}`", f"`{cls}`", family.name])
    total = len(read) + len(refused) + len(others)
    return "\n".join([
        f"transformers {transformers.__version__} defines {total} causal-LM model types.", "",
        f"**Read by a family of `from_hf`: {len(read)}** — converted and checked against the source, or refused "
        "naming a feature of the configuration that the algebra does not express.", "",
        md_table(["model type", "class", "family"], read), "",
        f"**Registered to be refused by name: {len(refused)}** — every model of these uses a feature the algebra "
        "does not express, and the refusal names it.", "",
        md_table(["model type", "class", "family"], refused), "",
        f"**Not a family tcircuits reads: {len(others)}** — `from_hf` refuses them as such: {', '.join(others)}.", "",
    ])


def error_classes() -> list[type]:
    """Every exception class of the three packages, found from their ``errors`` modules."""
    found: dict[type, None] = {}
    for package in PACKAGES:
        module = importlib.import_module(f"{package}.errors")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.split(".")[0] in PACKAGES:
                found[obj] = None
    return list(found)


_ROLE = re.compile(r":(\w+):`([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def myst_inline(rst: str) -> str:
    """A docstring's reStructuredText inline markup as MyST: ``x`` and :role:`x`.

    >>> myst_inline("Base class of :mod:`tensoralg`; lower ``max_order``.")
    'Base class of {py:mod}`tensoralg`; lower `max_order`.'
    """
    return _LITERAL.sub(r"`\1`", _ROLE.sub(lambda m: f"{{py:{m.group(1)}}}`{m.group(2)}`", rst))


def _first_paragraph(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return myst_inline(" ".join(doc.split("\n\n")[0].split()))


def error_tree_markdown() -> str:
    """The error classes as a nested list under :class:`tensoralg.errors.TCircuitsError`, each with
    the first paragraph of its docstring and its other bases (``ValueError``, ``KeyError`` …)."""
    classes = error_classes()
    ours = set(classes)

    def bases(cls: type) -> str:
        other = [b.__name__ for b in cls.__mro__[1:] if b not in ours and b not in (Exception, BaseException, object)]
        return f" (also `{'`, `'.join(dict.fromkeys(other))}`)" if other else ""

    lines: list[str] = []

    def walk(cls: type, depth: int) -> None:
        doc = _first_paragraph(cls)
        lines.append(f"{'  ' * depth}- {{py:class}}`~{cls.__module__}.{cls.__qualname__}`{bases(cls)}"
                     + (f": {doc}" if doc else ""))
        for sub in sorted((c for c in classes if cls in c.__bases__), key=lambda c: (c.__module__, c.__name__)):
            walk(sub, depth + 1)

    walk(TCircuitsError, 0)
    return "\n".join(lines) + "\n"


# --- the command line, read from the parser -------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One argument of a command as its ``--help`` shows it: ``-o FILE, --output FILE`` and its help."""

    invocation: str
    help: str
    required: bool


@dataclass(frozen=True)
class Command:
    """A command of the parser: its name (``""`` for ``tcircuits`` itself), one-line summary, usage,
    description and epilog as blocks (``("text", paragraph)`` for prose, ``("pre", block)`` for what
    the terminal shows indented), and its arguments."""

    name: str
    summary: str
    usage: str
    blocks: tuple[tuple[str, str], ...]
    options: tuple[Option, ...]


def text_blocks(text: str | None) -> list[tuple[str, str]]:
    """A help text written for the terminal, split into prose paragraphs (no line indented: joined
    into one line) and preformatted blocks (any indented line, or a line of a list: kept as written).

    >>> text_blocks("One line\\nand its end.\\n\\nexamples:\\n  tcircuits derive --list")
    [('text', 'One line and its end.'), ('pre', 'examples:\\n  tcircuits derive --list')]
    """
    blocks: list[tuple[str, str]] = []
    for paragraph in re.split(r"\n\s*\n", (text or "").strip("\n")):
        lines = paragraph.rstrip().splitlines()
        if not lines:
            continue
        if any(line[:1].isspace() for line in lines) or lines[0].rstrip().endswith(":") and len(lines) > 1:
            blocks.append(("pre", "\n".join(lines)))
        else:
            blocks.append(("text", " ".join(line.strip() for line in lines)))
    return blocks


def _options(parser: argparse.ArgumentParser) -> tuple[Option, ...]:
    formatter = parser._get_formatter()
    out = []
    for action in parser._actions:
        if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)) or action.help == argparse.SUPPRESS:
            continue
        invocation = formatter._format_action_invocation(action)
        help_text = " ".join(formatter._expand_help(action).split()) if action.help else ""
        out.append(Option(invocation, help_text, bool(action.required and action.option_strings)))
    return tuple(out)


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage line without its ``usage:`` label, continuation lines moved left with it."""
    first, *rest = parser.format_usage().strip().splitlines()
    return "\n".join([first.removeprefix("usage: ")] + [line[len("usage: "):] for line in rest])


def cli_commands(parser: argparse.ArgumentParser | None = None) -> list[Command]:
    """``tcircuits`` and each of its commands (those registered through entry points too), in the
    order of ``tcircuits --help``, read from :func:`derivations.cli.build_parser`."""
    if parser is None:
        from derivations.cli import build_parser
        parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {choice.dest: choice.help or "" for choice in subparsers._choices_actions}
    commands = [Command("", " ".join((parser.description or "").split("\n\n")[0].split()), _usage(parser),
                        tuple(text_blocks(parser.description) + text_blocks(parser.epilog)), _options(parser))]
    for name, sub in subparsers.choices.items():
        commands.append(Command(name, summaries.get(name, ""), _usage(sub),
                                tuple(text_blocks(sub.description) + text_blocks(sub.epilog)), _options(sub)))
    return commands


# --- the modules, read from their docstrings --------------------------------------------------------------


def _summary(doc: str | None) -> str:
    """A docstring's first sentence (or its first paragraph, when that has no full stop), as MyST."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    sentence = re.match(r"(.+?\.)(\s|$)", paragraph)
    return myst_inline(sentence.group(1) if sentence else paragraph).replace("|", "\\|")


def module_map_markdown(package: str) -> str:
    """A table per room of ``package`` (the package itself, then each subpackage): each module and
    the first sentence of its docstring, found by walking the installed package."""
    import pkgutil

    root = importlib.import_module(package)
    rooms: dict[str, list[tuple[str, str]]] = {package: []}
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if info.name.rsplit(".", 1)[-1].startswith("_"):
            continue
        module = importlib.import_module(info.name)
        room = info.name if info.ispkg else info.name.rsplit(".", 1)[0]
        rooms.setdefault(room, [])
        if not info.ispkg:
            rooms[room].append((info.name, _summary(module.__doc__)))
    out = []
    for room, modules in rooms.items():
        doc = _summary(importlib.import_module(room).__doc__)
        out.append(f"**`{room}`** — {doc}" if doc else f"**`{room}`**")
        out.append("")
        if modules:
            out.append(md_table(["module", "what it holds"], [[f"`{name.rsplit('.', 1)[-1]}`", text] for name, text in modules]))
            out.append("")
    return "\n".join(out)


# --- the API by topic ----------------------------------------------------------------------------------------


def _documented(obj) -> bool:
    return inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)


def data_doc(package: str, name: str) -> str:
    """The ``#:`` comment above the module-level assignment of ``name`` in ``package``'s modules (a value has no
    docstring of its own: a dict's would be the dict type's)."""
    import pkgutil

    pattern = re.compile(rf"((?:^[ \t]*#:.*\n)+)^(?:[A-Za-z_][\w, ]*,\s*)?{re.escape(name)}\b[^=\n]*=", re.M)
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        found = pattern.search(inspect.getsource(importlib.import_module(info.name)))
        if found:
            return " ".join(line.strip().removeprefix("#:").strip() for line in found.group(1).splitlines())
    return ""


def _directive(qualified: str, obj, doc: str) -> str:
    """The autodoc directive that documents ``obj`` under the name ``qualified`` (a value: its ``doc``)."""
    if inspect.isclass(obj):
        return f".. autoclass:: {qualified}"
    if inspect.ismodule(obj):
        return f".. automodule:: {obj.__name__}\n   :no-members:"
    if inspect.isroutine(obj):
        return f".. autofunction:: {qualified}"
    return f".. py:data:: {qualified}\n\n   {doc}\n"


def api_topic_markdown(package: str, names: list[str]) -> str:
    """One topic of ``package``'s API: a table of ``names``, each linked to its entry with its docstring's first
    sentence, then each documented in full (autodoc, in the order given)."""
    module = importlib.import_module(package)
    missing = [n for n in names if n not in module.__all__]
    if missing:
        raise ValueError(f"{package} does not export {', '.join(missing)}: the API page names them in a topic")
    rows, entries = [], []
    for name in names:
        obj = getattr(module, name)
        doc = obj.__doc__ if _documented(obj) else data_doc(package, name)
        target = obj.__name__ if inspect.ismodule(obj) else f"{package}.{name}"
        rows.append([f"{{py:obj}}`{name} <{target}>`", _summary(doc) or ""])
        entries.append(_directive(f"{package}.{name}", obj, doc))
    return "\n".join([md_table(["name", "what it is"], rows), "", "```{eval-rst}", *entries, "```", ""])


def api_topics(page: str) -> dict[str, list[str]]:
    """The topics an API page names, ``{"package:title": [names]}``, read from its ``{api-topic}`` blocks."""
    found = {}
    for m in re.finditer(r"^## (?P<title>[^\n]+)\n\n```\{api-topic\} (?P<package>\S+)\n(?P<names>.*?)^```", page, re.M | re.S):
        found[f"{m['package']}:{m['title']}"] = m["names"].split()
    return found
