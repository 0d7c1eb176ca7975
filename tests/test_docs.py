"""Every example of the guide (docs/) runs: an example that no longer runs fails here.

Read from the Markdown pages under ``docs/`` (the tutorials are notebooks, run by
``tests/test_tutorials.py``):

- a ```` ```python ```` block runs, in order with the page's other blocks in one namespace, in a
  fresh folder; a block with ``>>>`` prompts is a doctest whose printed output must match
  (``...`` stands for any text);
- each ``tcircuits …`` line of a ```` ```bash ```` block runs through the CLI's ``main`` in that
  folder and must exit 0; other lines (``make``, ``pip``, ``torchrun``) are what a person types
  at a shell, shown, not run here;
- a ```` ```console ```` block is a ``$ tcircuits …`` line and what it prints: the output must match
  (``...`` stands for any text); a refusal (``% test: exit 2``) is matched with its standard error.

The README's examples run the same way. A MyST comment line (in the README an HTML comment,
``<!-- test: … -->``) just above a block says how to run it: ``% test: slow`` (the test is marked
slow), ``% test: exit N`` (the command's expected exit status), ``% test: skip REASON`` (shown, not
run, and why; kept for what needs a GPU, a network or several processes). The relative paths the
examples use — ``numeric_check/data/…`` and ``./my-gpt2`` (a small saved Hugging Face model, made
offline by the lines the own-model guide shows) — exist in that folder.

The examples in the command line reference (the parser's own ``examples:``) of the symbolic
commands run too, and the generated pages' Markdown is checked without Sphinx; ``make docs``
builds the whole site, with warnings as errors, where Sphinx is installed.
"""

from __future__ import annotations

import doctest
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from derivations.cli import main as tcircuits

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
import generated  # noqa: E402  (docs/_ext: the generated pages, without Sphinx)

PAGES = sorted(p for p in DOCS.rglob("*.md") if not {"_notebooks", "_build", "_generated"} & set(p.parts))
README = ROOT / "README.md"
MARK = re.compile(r"^(?:% test:(.*)|<!-- test:(.*?)-->)$")
FENCE = re.compile(r"^(?P<marks>(?:(?:% test:[^\n]*|<!-- test:[^\n]*-->)\n)*)```(?P<lang>\{[^}\n]*\}|[\w-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$",
                   re.MULTILINE | re.DOTALL)
CHECKER = doctest.OutputChecker()
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    marks: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(DOCS if self.page != README else ROOT)}:{self.line}"

    def mark(self, name: str) -> str | None:
        """The argument of ``% test: NAME ARG`` above the block (``""`` without one), or None."""
        for m in self.marks:
            word, _, rest = m.partition(" ")
            if word == name:
                return rest.strip()
        return None


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        marks = tuple(next(g for g in MARK.match(line).groups() if g is not None).strip()
                      for line in m.group("marks").splitlines())
        out.append(Block(page, text.count("\n", 0, m.start("body")), m.group("lang"), m.group("body"), marks))
    return out


ALL = [b for p in [*PAGES, README] for b in blocks(p)]
RUN = {"python", "bash", "console"}


def _params(selected):
    return [pytest.param(*args, id=args[0].id if isinstance(args[0], Block) else args[0],
                         marks=[pytest.mark.slow] if any(b.mark("slow") is not None for b in args if isinstance(b, Block)) else [])
            for args in selected]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh folder holding what the examples' relative paths name."""
    (tmp_path / "numeric_check").mkdir()
    (tmp_path / "numeric_check" / "data").symlink_to(ROOT / "numeric_check" / "data")
    monkeypatch.chdir(tmp_path)
    return tmp_path


#: The own-model guide's lines that make ./my-gpt2: every page's examples use the model they make.
MY_GPT2 = next(b for b in blocks(DOCS / "how-to" / "own-model.md") if 'save_pretrained("my-gpt2")' in b.body)


def _needs(text: str, folder: Path) -> None:
    if "./my-gpt2" in text and not (folder / "my-gpt2").exists():
        exec(compile(MY_GPT2.body, MY_GPT2.id, "exec"), {"__name__": "my_gpt2"})  # in the example's folder


def _skip_reason(block: Block) -> str | None:
    reason = block.mark("skip")
    if reason is not None:
        return reason or "marked skip"
    if "--pdf" in block.body and shutil.which("pdflatex") is None:
        return "pdflatex is not installed"
    return None


def _run_cli(line: str, capsys, errors: bool = False) -> tuple[int, str]:
    """Run a ``tcircuits …`` line in this process: its exit status and standard output (standard
    error after it, with ``errors``)."""
    argv = shlex.split(line, comments=True)
    assert argv[0].endswith("tcircuits"), line
    capsys.readouterr()
    code = tcircuits(argv[1:])
    captured = capsys.readouterr()
    return code, captured.out + (captured.err if errors else "")


def _commands(body: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line.strip() for line in joined.splitlines()
            if re.match(r"(\.venv/bin/)?tcircuits\s", line.strip())]


def test_the_guide_has_examples_of_every_kind():
    kinds = {b.lang for b in ALL}
    assert {"python", "bash", "console"} <= kinds
    assert len([b for b in ALL if b.lang in RUN]) >= 20
    assert not [b.id for b in ALL if not b.lang], "say the language of every code block"
    assert {"{toctree}", "{cli-reference}", "{model-types}", "{error-tree}"} <= kinds  # directives, not examples


def test_every_page_is_in_a_table_of_contents():
    """Navigation reaches every page: each is listed in a toctree of the page above it."""
    listed = set()
    for page in PAGES:
        for toctree in re.findall(r"```\{toctree\}\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL):
            for entry in toctree.splitlines():
                if entry.strip() and not entry.startswith(":"):
                    listed.add((page.parent / entry.strip()).relative_to(DOCS).as_posix())
    pages = {p.relative_to(DOCS).with_suffix("").as_posix() for p in PAGES} - {"index"}
    assert pages - listed == set()


def test_no_page_speaks_of_issues():
    """User-facing text carries no development history: no issue numbers on the pages or the README."""
    for page in [*PAGES, README]:
        found = re.findall(r".{0,40}\bissues? #?\d+.{0,20}", page.read_text(encoding="utf-8"))
        assert not found, f"{page.relative_to(ROOT)}: {found}"


@pytest.mark.parametrize("page", [pytest.param(p, id=p.name if p == README else str(p.relative_to(DOCS)),
                                               marks=[pytest.mark.slow] if any(b.mark("slow") is not None for b in blocks(p)) else [])
                                  for p in sorted({b.page for b in ALL if b.lang == "python"})])
def test_python_examples(page, workdir, capsys):
    """A page's Python blocks, in order, in one namespace; doctests where they have prompts."""
    namespace: dict = {"__name__": "__docs__"}
    for block in (b for b in blocks(page) if b.lang == "python"):
        if _skip_reason(block):
            continue
        _needs(block.body, workdir)
        if ">>>" in block.body:
            test = doctest.DocTestParser().get_doctest(block.body, namespace, block.id, str(page), block.line)
            runner = doctest.DocTestRunner(optionflags=FLAGS)
            runner.run(test, clear_globs=False)
            namespace.update(test.globs)
            assert runner.failures == 0, f"{block.id}: a doctest failed (its output is above)"
        else:
            exec(compile(block.body, f"{page}:{block.line}", "exec"), namespace)  # noqa: S102


@pytest.mark.parametrize("block", _params([(b,) for b in ALL if b.lang == "bash" and _commands(b.body)]))
def test_bash_commands(block, workdir, capsys):
    reason = _skip_reason(block)
    if reason:
        pytest.skip(reason)
    _needs(block.body, workdir)
    expected = int(block.mark("exit") or 0)
    for line in _commands(block.body):
        code, out = _run_cli(line, capsys)
        assert code == expected, f"{block.id}: `{line}` exited {code}\n{out}"


@pytest.mark.parametrize("block", _params([(b,) for b in ALL if b.lang == "console"]))
def test_console_transcripts(block, workdir, capsys):
    reason = _skip_reason(block)
    if reason:
        pytest.skip(reason)
    _needs(block.body, workdir)
    first, _, expected = block.body.partition("\n")
    assert first.startswith("$ "), f"{block.id}: a console block starts with '$ tcircuits …'"
    expected_code = int(block.mark("exit") or 0)
    with mock.patch("torch.cuda.is_available", return_value=False):  # the pages show a run on a CPU
        code, out = _run_cli(first[2:], capsys, errors=expected_code == 2)
    assert code == expected_code, f"{block.id}: exit status {code}\n{out}"
    assert CHECKER.check_output(expected, out, FLAGS), f"{block.id}: the output differs\n" + \
        CHECKER.output_difference(doctest.Example(first, expected), out, FLAGS)


# --- the generated pages ----------------------------------------------------------------------------------

SYMBOLIC = ("", "derive", "expand", "check")


def _reference_examples():
    for command in generated.cli_commands():
        if command.name not in SYMBOLIC:
            continue
        for kind, text in command.blocks:
            for line in _commands(text) if kind == "pre" else ():
                yield pytest.param(line, id=line[:70])


@pytest.mark.parametrize("line", list(_reference_examples()))
def test_the_command_line_reference_examples_run(line, workdir, capsys):
    """The symbolic commands' own ``examples:`` (their ``--help``, shown in the reference) run;
    ``check``'s false identity exits 1."""
    if "--pdf" in line and shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed")
    code, out = _run_cli(line, capsys)
    assert code in (0, 1) and out, line
    assert code == 0 or line.startswith("tcircuits check"), line


def test_the_command_line_reference_has_every_command_and_option():
    from derivations.cli import build_parser

    commands = {c.name: c for c in generated.cli_commands()}
    assert {"", "derive", "expand", "check", "verify", "attribute", "analyze", "demo", "paper", "train-toy"} <= set(commands)
    help_text = {name: subprocess_free_help(name) for name in commands}
    for name, command in commands.items():
        for option in command.options:
            flag = option.invocation.split(",")[-1].split()[0]
            assert flag in help_text[name], (name, flag)
        assert command.usage.startswith(f"tcircuits {name}".strip())
    assert build_parser().prog == "tcircuits"


def subprocess_free_help(name: str) -> str:
    from derivations.cli import build_parser

    parser = build_parser()
    if name:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[name]
    return parser.format_help()


def test_help_text_splits_into_prose_and_preformatted_blocks():
    blocks_ = generated.text_blocks("A line\nwrapped.\n\nexamples:\n  tcircuits derive --list\n\n  indented\n  text")
    assert blocks_ == [("text", "A line wrapped."), ("pre", "examples:\n  tcircuits derive --list"), ("pre", "  indented\n  text")]


def test_the_error_tree_lists_every_error_class_under_the_root():
    tree = generated.error_tree_markdown()
    for cls in generated.error_classes():
        assert f"`~{cls.__module__}.{cls.__qualname__}`" in tree
    assert tree.startswith("- {py:class}`~tensoralg.errors.TCircuitsError`")
    assert ":class:" not in tree and "``" not in tree  # docstrings' reST written as MyST


@pytest.mark.parametrize("package", ["tensoralg", "derivations", "numeric_check"])
def test_the_module_map_lists_every_module_with_its_docstring(package):
    import pkgutil

    text = generated.module_map_markdown(package)
    root = __import__(package)
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        name = info.name.rsplit(".", 1)[-1]
        if not name.startswith("_"):
            assert (f"**`{info.name}`**" if info.ispkg else f"| `{name}` |") in text, info.name
    assert "| `errors` | " in text


def test_the_model_type_table_is_read_from_the_installed_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    table = generated.model_types_markdown()
    assert f"transformers {transformers.__version__} defines {len(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)} causal-LM" in table
    read, refused, others = table.split("**")[2], table.split("**")[4], table.split("**")[6]
    assert "| `gpt2` | `GPT2LMHeadModel` | GPT-2 |" in read and "| `llama` | `LlamaForCausalLM` | Llama |" in read
    assert "`qwen2_moe`" in refused + read and "`bert`" in others


@pytest.mark.slow
def test_make_docs_builds_the_site_with_warnings_as_errors(tmp_path):
    """Where Sphinx and the docs extra are installed: the whole site, warnings as errors (the
    notebooks left unexecuted here: tests/test_tutorials.py runs them)."""
    pytest.importorskip("sphinx", reason="the site needs the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("myst_nb", reason="the site needs the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("furo", reason="the site needs the docs extra: pip install -e '.[docs]'")
    result = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                             "-D", "nb_execution_mode=off", "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, textwrap.shorten(result.stderr, 4000)
    pages = list((tmp_path / "html").rglob("*.html"))
    assert len(pages) >= 20
    cli = (tmp_path / "html" / "reference" / "cli.html").read_text(encoding="utf-8")
    assert "tcircuits verify" in cli and "--max-order" in cli
    start = (tmp_path / "html" / "getting-started.html").read_text(encoding="utf-8")
    assert "<math" in start or "<math" in (tmp_path / "html" / "explanations" / "verification.html").read_text(encoding="utf-8")


def test_the_docs_configuration_makes_the_folders_sphinx_checks_first(tmp_path, monkeypatch):
    """Issue 56: in a fresh clone ``docs/_generated/`` (ignored by git) does not exist, and Sphinx checks
    ``html_extra_path`` when it reads the configuration, before the hook that makes the pictures: the first
    ``make docs`` failed. Reading the configuration on a copy of docs/ without that folder must make it."""
    import runpy

    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("_generated", "_build", "_notebooks"))
    assert not (docs / "_generated").exists()
    monkeypatch.setattr(sys, "path", list(sys.path))  # conf.py puts the repository and _ext first
    conf = runpy.run_path(str(docs / "conf.py"))
    for extra in conf["html_extra_path"] + conf["html_static_path"]:
        assert (docs / extra).is_dir(), extra


@pytest.mark.parametrize("package", generated.PACKAGES)
def test_the_api_reference_puts_every_public_name_in_one_topic_with_its_summary(package):
    """Issue 46: the API reference is grouped by topic, each with a summary table; every name the package exports
    is in exactly one topic, and the errors are a topic of their own, last, not among the main classes."""
    import importlib

    page = (DOCS / "reference" / f"api-{package}.md").read_text(encoding="utf-8")
    topics = generated.api_topics(page)
    named = [n for names in topics.values() for n in names]
    assert sorted(named) == sorted(importlib.import_module(package).__all__), "a name in no topic, or in two"
    last = list(topics)[-1]
    assert last == f"{package}:Errors" and all(n.endswith(("Error", "Mismatch", "Model", "Atom", "Sum", "Order",
                                                             "Latex", "Terms", "Derivation")) for n in topics[last])
    for key, names in topics.items():
        table = generated.api_topic_markdown(package, names)
        assert table.count("\n| {py:obj}`") == len(names) and "```{eval-rst}" in table, key


def test_every_picture_a_page_shows_is_made_by_the_docs_build():
    """Issue 46: the how-to pages' pictures are made by the commands they show while the guide is built
    (docs/_ext/pictures.py); a page that shows a picture no command makes fails here."""
    import pictures

    made = {p for names in pictures.PICTURES.values() for p in names}
    shown = set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        shown |= set(re.findall(r"\(\.\./_generated/([^)\s]+)\)", text))
        shown |= {f"html/{name}" for name in re.findall(r'<iframe src="\.\./([^"/]+\.html)"', text)}
    assert shown and shown <= made, shown - made
    assert {p.split("/")[0] for p in shown} >= {"analyze", "html", "toy"}


@pytest.mark.slow
def test_the_docs_build_makes_its_pictures(tmp_path):
    import pictures

    made = pictures.make(tmp_path, ["loss", "attribution"])
    assert [p.name for p in made] == ["toy1.loss.png", "attribution.html"] and all(p.stat().st_size > 1000 for p in made)


def test_every_value_in_the_api_reference_has_its_own_description():
    """A value (a dict, a symbol) has no docstring of its own: its ``#:`` comment describes it, never its type's."""
    import importlib
    import inspect

    for package in generated.PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            if not (inspect.isclass(getattr(module, name)) or inspect.isroutine(getattr(module, name))
                    or inspect.ismodule(getattr(module, name))):
                doc = generated.data_doc(package, name)
                assert doc and "dict" not in doc.split()[0], (package, name, doc)
