"""Sphinx glue of the tcircuits guide: maths as MathML from the project's printer, and the
directives that put the generated tables on their pages (``generated.py`` makes their Markdown).

- ``html_math_renderer = "mathml"``: ``$…$``, ``$$…$$`` and ``{math}`` become ``<math>`` elements
  through :func:`tensoralg.mathml.to_mathml`, the converter behind the reports and the companion,
  so the site needs no script and no network;
- ``{model-types}``: the model types of the installed transformers and what ``from_hf`` does with each;
- ``{error-tree}``: every error class under ``TCircuitsError``;
- ``{cli-reference}``: every command and option of ``tcircuits``, from its parser;
- ``{module-map} PACKAGE``: where things live, each module with its docstring's first sentence;
- ``{api-topic} PACKAGE`` with names as its content: a topic of the API reference, a table of the names with
  their docstrings' first sentences, then each documented in full.
"""

from __future__ import annotations

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

from tensoralg.mathml import to_mathml

import generated


def _inline(self, node) -> None:
    self.body.append(to_mathml(node.astext(), "inline", check=False))
    raise nodes.SkipNode


def _block(self, node) -> None:
    latex = node.astext()
    number = node.get("number")
    self.body.append(self.starttag(node, "div", CLASS="math notranslate"))
    if number:
        self.body.append(f'<span class="eqno">({number})</span>')
    self.body.append(to_mathml(latex, "block", check=False))
    self.body.append("</div>\n")
    raise nodes.SkipNode


class _Generated(SphinxDirective):
    """A directive whose content is Markdown made by a function of ``generated``."""

    has_content = False
    make = staticmethod(lambda: "")

    def run(self):
        container = nodes.container()
        self.state.nested_parse(StringList(self.make().splitlines(), source="(generated)"), self.content_offset, container)
        return container.children


class ModelTypes(_Generated):
    make = staticmethod(generated.model_types_markdown)


class ErrorTree(_Generated):
    make = staticmethod(generated.error_tree_markdown)


def _command_nodes(command: generated.Command, document) -> list:
    """A command's section: usage, description and epilog (prose as paragraphs, indented text as
    written), and its arguments as a definition list."""
    title = f"tcircuits {command.name}".strip()
    section = nodes.section(ids=[nodes.make_id(f"cli {command.name or 'tcircuits'}")], names=[nodes.fully_normalize_name(title)])
    section += nodes.title(text=title)
    if command.name and command.summary:
        section += nodes.paragraph(text=command.summary[:1].upper() + command.summary[1:] + ".")
    section += nodes.literal_block(text=command.usage, language="text")
    for kind, text in command.blocks:
        section += nodes.paragraph(text=text) if kind == "text" else nodes.literal_block(text=text, language="text")
    listing = nodes.definition_list(classes=["cli-options"])
    for option in command.options:
        item = nodes.definition_list_item()
        term = nodes.term()
        term += nodes.literal(text=option.invocation)
        if option.required:
            term += nodes.Text(" (required)")
        item += term
        item += nodes.definition("", nodes.paragraph(text=option.help))
        listing += item
    section += listing
    document.note_implicit_target(section)
    return [section]


class ModuleMap(SphinxDirective):
    """``{module-map} PACKAGE``: each module of the package and the first sentence of its docstring."""

    required_arguments = 1

    def run(self):
        container = nodes.container()
        text = generated.module_map_markdown(self.arguments[0])
        self.state.nested_parse(StringList(text.splitlines(), source="(generated)"), self.content_offset, container)
        return container.children


class ApiTopic(SphinxDirective):
    """``{api-topic} PACKAGE`` holding names: one topic of the API reference (:func:`generated.api_topic_markdown`)."""

    required_arguments = 1
    has_content = True

    def run(self):
        container = nodes.container()
        text = generated.api_topic_markdown(self.arguments[0], " ".join(self.content).split())
        self.state.nested_parse(StringList(text.splitlines(), source="(generated)"), self.content_offset, container)
        return container.children


class CliReference(SphinxDirective):
    """``tcircuits`` and every command, read from ``derivations.cli.build_parser()``."""

    has_content = False

    def run(self):
        out = []
        for command in generated.cli_commands():
            out.extend(_command_nodes(command, self.state.document))
        return out


def setup(app):
    app.add_html_math_renderer("mathml", (_inline, None), (_block, None))
    app.add_directive("model-types", ModelTypes)
    app.add_directive("error-tree", ErrorTree)
    app.add_directive("cli-reference", CliReference)
    app.add_directive("module-map", ModuleMap)
    app.add_directive("api-topic", ApiTopic)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
