"""The companion as a self-contained site: ``index.html`` and one page per section, figures as SVG.

Pages use :mod:`derivations.html`'s shell and CSS (no script, no web font, no network), its
:func:`~derivations.html.html_body` for each derivation (MathML from the one printer, each line's
check beside it) and :func:`~derivations.html.prose_html` for prose; every other string goes
through ``escape_text(…, "html")``.
"""

from __future__ import annotations

import re

from derivations import catalogue
from derivations.commands import NUMBERED_OPTIONS
from derivations.derivation import RULES
from derivations.html import CSS, html_body, mathml, page, prose_html
from derivations.layout import Layout, prose_text
from tensoralg.escape import escape_text

from numeric_check.reports.paper.claims import ANALYSIS_CHECKS_NOTE, PaperFinding, Part, analysis_checks, label, verdict_of
from numeric_check.reports.paper.content import index_from, Equation, Paper, Section
from numeric_check.reports.paper.figures import CAPTIONS
from numeric_check.reports.paper.formation_text import (claims_table, figure_names, formation_opening, formation_texts,
                                                        snapshots_table)
from numeric_check.reports.paper.language_claims import Table, language_tables, why_different
from numeric_check.reports.paper.your_model import YOURS_DIFFERENT, yours_paragraph
from numeric_check.verification.results import VerifyReport

TITLE = "A Mathematical Framework for Transformer Circuits: the companion"

EXTRA_CSS = """
nav.pages { font: 0.9rem system-ui, sans-serif; display: flex; gap: 1.2rem; border-bottom: 1px solid var(--rule);
            padding-bottom: 0.5rem; margin-bottom: 1.2rem; flex-wrap: wrap; }
nav.pages a { color: #1a56a8; text-decoration: none; }
nav.pages .here { font-weight: 600; }
.finding { border: 1px solid var(--rule); border-radius: 6px; padding: 0.4rem 1rem 0.8rem; margin: 1.2rem 0; background: #fff; }
.finding blockquote { margin: 0.6rem 0; font-style: italic; }
.finding dl { display: grid; grid-template-columns: max-content 1fr; gap: 0.2rem 1rem; margin: 0.4rem 0; }
.finding dt { color: var(--muted); font: 0.85rem/1.6 system-ui, sans-serif; }
.finding dd { margin: 0; }
.finding .part { border-left: 3px solid var(--rule); padding-left: 0.8rem; margin: 0.6rem 0; }
.finding .part p { margin: 0.2rem 0; font-weight: 600; }
.badge.part { background: #b26a00; }
.derivation { border-top: 2px solid var(--rule); margin-top: 2rem; }
.finding figure img { width: auto; max-width: 100%; }  /* drawn at the size it is read at: 100 % */
td.section { white-space: nowrap; }
.trigrams { display: flex; gap: 1.5rem; flex-wrap: wrap; }
p.note { color: var(--muted); font-size: 0.9rem; margin-top: 0.3rem; }
h3.table-title { font-size: 1rem; margin: 1.6rem 0 0.4rem; }
"""


def _h(text) -> str:
    return escape_text(text, "html")


def plural(n: int, word: str) -> str:
    """``"1 finding"``, ``"3 findings"``.

    >>> plural(1, "finding"), plural(0, "layer")
    ('1 finding', '0 layers')
    """
    return f"{n} {word}{'' if n == 1 else 's'}"


def verdict_badge(verdict: str) -> str:
    cls = {"holds": "", "holds in part": " part", "does not hold": " bad"}[verdict]
    return f'<span class="badge{cls}">{_h(verdict)}</span>'


def _nav(paper: Paper, here: str) -> str:
    links = [("index", "Contents")] + [(s.slug, s.title.split(":")[0]) for s in paper.sections]
    items = [f'<span class="here">{_h(t)}</span>' if slug == here else f'<a href="{_h(slug)}.html">{_h(t)}</a>'
             for slug, t in links]
    return '<nav class="pages">' + "".join(items) + "</nav>"


def figure_html(name: str) -> str:
    return (f'<figure><img src="figures/{_h(name)}.svg" alt="{_h(prose_text(CAPTIONS[name], index_from()))}" loading="eager">'
            f"<figcaption>{prose_html(CAPTIONS[name], index_from())}</figcaption></figure>")


def control_text(part: Part) -> str:
    """The control's value and what the part's rule says on it."""
    said = ("the rule does not hold there, as it must" if not part.control_holds else
            "the rule holds there too, so it cannot tell the model from its control")
    return f"{part.control} — {said}"


def parts_html(f: PaperFinding) -> str:
    """Each part of the claim: the rule, the value on the model, the control and the verdict."""
    out = []
    for i, p in enumerate(f.parts, start=1):
        label = f"part {i} of {len(f.parts)}: " if len(f.parts) > 1 else "rule: "
        dl = f"<dt>measured</dt><dd>{_h(p.measured)}</dd><dt>control</dt><dd>{_h(control_text(p))}</dd>"
        if len(f.parts) > 1 or p.why:  # one part: its verdict is the finding's, shown once below
            dl += f"<dt>verdict</dt><dd>{verdict_badge(p.verdict)}</dd>"  # why: in the control's line
        out.append(f'<div class="part"><p>{_h(label)}{_h(p.text)}</p><dl>{dl}</dl></div>')
    return "".join(out)


def finding_html(f: PaperFinding, extra: str = "") -> str:
    """A finding's box: the claim, ``extra`` (HTML shown with the claim, e.g. its tables), each part, the verdict."""
    if f.parts:
        rows = [(k, v) for k, v in (("where", f.where), ("note", f.note)) if v]
    else:
        rows = [("measured", f.measured), ("control", f.control)] + [(k, v) for k, v in (("where", f.where), ("note", f.note)) if v]
    dl = "".join(f"<dt>{_h(k)}</dt><dd>{_h(v)}</dd>" for k, v in rows)
    dl += f"<dt>{'verdict' if len(f.parts) < 2 else 'the whole claim'}</dt><dd>{verdict_badge(f.verdict)}</dd>"
    return (f'<div class="finding" id="{_h(f.key)}"><blockquote>{prose_html(f.claim, index_from())}</blockquote>{extra}{parts_html(f)}<dl>{dl}</dl>'
            + (figure_html(f.figure) if f.figure else "") + "</div>")


CHECKS = {"sum": "sum of all terms = model", "isolation": "each term = its isolated path",
          "truncation": "omitted terms = model - kept terms"}


def model_check_text(report: VerifyReport) -> str:
    """One sentence: what was checked on the model and the largest errors against their tolerances (heads
    in the paper's numbering: the report names them as TransformerLens does)."""
    parts = [f"{CHECKS.get(c.name, c.name)}: max |error| "
             f"{c.max_abs_error:.1e} (tolerance {c.tolerance:.1e})"
             for c in report.checks if c.passed is not None and c.max_abs_error is not None]
    n = len(report.terms)
    target = re.sub(r"\bL(\d+)H(\d+)\b", lambda h: label(int(h.group(1)), int(h.group(2))), report.target)
    return (f"{target} of {report.model}, on {report.n_batch} × {report.n_pos} repeated random tokens in "
            f"{report.dtype}: {plural(n, 'term')}; the sum of all terms against the model's own forward "
            f"pass and each term against its path isolated by the model's hooks — " + "; ".join(parts))


def derive_command(e: Equation) -> str:
    """The command line that prints ``e``'s derivation as the companion shows it.

    >>> from derivations import catalogue
    >>> from numeric_check.reports.paper.claims import numbered_from
    >>> derive_command(Equation("two-layer-qk", catalogue.get("two-layer-qk", positional="qk_only"), "not run"))
    'tcircuits derive two-layer-qk --positional qk_only'
    >>> with numbered_from(1):  # the second layer, as the paper numbers it
    ...     derive_command(Equation("qk-expansion", catalogue.get("qk-expansion"), "not run"))
    'tcircuits derive qk-expansion --layer 2 --index-from 1'
    """
    defaults = catalogue.lookup(e.name).params
    options = [f"--{k.replace('_', '-')} {v + index_from() if k in NUMBERED_OPTIONS else v}" for k, v in e.derivation.params
               if k in defaults and v != defaults[k] and not isinstance(v, bool)]
    return " ".join([f"tcircuits derive {e.name}", *options] + (["--index-from 1"] if index_from() else []))


def equation_html(e: Equation) -> str:
    body = html_body(e.derivation, Layout(index_from=index_from()), e.verification, heading="h3")
    body += f'<p class="cmd">The whole derivation: <code>{_h(derive_command(e))}</code></p>'
    if e.model_check is not None:
        ok = e.model_check.passed
        body += (f'<p class="verification{"" if ok else " bad"}"><span class="badge{"" if ok else " bad"}">'
                 f'{"verified on the model" if ok else "FAILED on the model"}</span> {_h(model_check_text(e.model_check))}</p>')
    return f'<section class="derivation" id="{_h(e.name)}">{body}</section>'


def rules_html() -> str:
    rows = [f"<tr><td>{_h(r.name)}</td><td>{mathml(r.statement.latex, check=False)}</td></tr>"
            for r in RULES.values() if r.statement is not None]
    return ("<h2>The algebra's rules</h2><p>Each line of a derivation names the rule that produced it; these are the "
            "identities they state.</p><table><thead><tr><th>rule</th><th>identity</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def trigram_rows(table) -> list[list[str]]:
    """Rows of a skip-trigram table as plain text: rank, destination and its score, out and its logit."""
    return [[str(r), f"#{d.token}", f"{d.score:.2f}", f"#{o.token}", f"{o.score:.2f}"]
            for r, (d, o) in enumerate(zip(table.destinations, table.outputs), start=1)]


TRIGRAM_HEADER = ["rank", "destination (QK)", "score", "out (OV)", "logit"]


def trigrams_html(paper: Paper) -> str:
    """The skip-trigram tables of the one-layer model for planted sources, each from the head that carries it, side by side."""
    out = []
    for t in paper.measurements.tables:
        head = "".join(f"<th>{_h(c)}</th>" for c in TRIGRAM_HEADER)
        body = "".join("<tr>" + "".join(f'<td class="num">{_h(c)}</td>' for c in row) + "</tr>" for row in trigram_rows(t))
        out.append(f"<table><caption>{_h(label(t.layer, t.head))}, source #{t.source_token}</caption><thead><tr>{head}</tr></thead>"
                   f"<tbody>{body}</tbody></table>")
    return '<div class="trigrams">' + "".join(out) + "</div>"


def table_html(t: Table) -> str:
    """A :class:`~numeric_check.reports.paper.language_claims.Table` as HTML: every cell escaped, numbers right-aligned."""
    def cell(tag: str, i: int, text: str) -> str:
        return f'<{tag} class="num">{_h(text)}</{tag}>' if i in t.numeric else f"<{tag}>{_h(text)}</{tag}>"

    head = "".join(cell("th", i, c) for i, c in enumerate(t.header))
    body = "".join("<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in t.rows)
    note = f'<p class="note">{_h(t.note)}</p>' if t.note else ""
    return (f'<h3 class="table-title">{_h(t.caption)}</h3><table id="{_h(t.key)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>{note}")


def language_html(paper: Paper) -> str:
    """The slides' tables measured on the language models, with the paper's numbers and why ours differ."""
    m = paper.measurements.language
    note = why_different(m) if paper.measurements.language_models is None else YOURS_DIFFERENT
    return ("<h2>The paper's tables beside ours</h2>" + f"<p>{_h(note)}</p>"
            + "".join(table_html(t) for t in language_tables(m)))


def training_html(paper: Paper) -> str:
    """A person's model's training on the language page: its loss curve from its training record, or why none."""
    if paper.measurements.training_curve:
        return "<h2>Your model's training</h2>" + figure_html("training-loss")
    return ("<h2>Your model's training</h2><p>No loss curve is drawn here: none was found in a training record beside the "
            "model (the JSON tcircuits train-toy writes beside its checkpoint).</p>")


def formation_html(paper: Paper) -> str:
    """The training run of the shipped language model: what was read, what was measured now, the claims judged,
    the figures and the snapshots."""
    f = paper.measurements.formation
    body = [f"<h2>{_h(heading)}</h2>" + "".join(f"<p>{_h(t)}</p>" for t in texts) for heading, texts in formation_texts(f)]
    body += ["<h2>The follow-up paper's claims</h2>", table_html(claims_table(f)), "<h2>Figures</h2>"]
    body += [figure_html(name) for name in figure_names(f)] + [table_html(snapshots_table(f))]
    return "".join(body)


def analysis_checks_html(paper: Paper) -> str:
    """Every check of ``tcircuits analyze`` on the two-layer model with the one-layer control
    (:func:`numeric_check.reports.findings.findings`), folded."""
    rows = analysis_checks(paper)
    body = "".join(f"<tr><td>{_h(f.claim)}</td><td>{_h(f.measured)}</td>"
                   f"<td>{verdict_badge(verdict_of(f.holds))}</td></tr>" for f in rows)
    return (f"<details><summary>Every check of <code>tcircuits analyze</code> on {_h(paper.measurements.analysis(2).name)}"
            f" with {_h(paper.measurements.analysis(1).name)} as the control ({len(rows)})</summary>"
            f"<p>{_h(ANALYSIS_CHECKS_NOTE)}</p>"
            f"<table><thead><tr><th>check</th><th>measured</th><th>verdict</th></tr></thead><tbody>{body}</tbody></table>"
            "</details>")


def section_page(paper: Paper, section: Section) -> str:
    body = [_nav(paper, section.slug), f"<h1>{_h(section.title)}</h1>"]
    yours = paper.measurements.language_models if section.slug == "language" else None  # a model of one's own
    opening, replaces = formation_opening(paper.measurements) if section.slug == "formation" else ([], False)
    if yours is not None:
        body += [f"<p>{_h(yours_paragraph(yours))}</p>", training_html(paper)]
    else:  # a person's run in the formation chapter: the shipped run's paragraphs do not describe it
        body += [f"<p class='note'><strong>{_h(t)}</strong></p>" if not replaces else f"<p>{_h(t)}</p>" for t in opening]
        body += [] if replaces else [f"<p>{prose_html(p, index_from())}</p>" for p in section.spec.paragraphs]
    if section.slug == "language" and paper.measurements.language is not None:
        body.append(language_html(paper))
    if section.slug == "formation" and paper.measurements.formation is not None:
        body.append(formation_html(paper))
    if section.findings:
        body.append("<h2>What the shipped models show</h2>" if yours is None else "<h2>What your model shows</h2>")
        for f in section.findings:
            body.append(finding_html(f, trigrams_html(paper) if f.key == "skip-trigrams" else ""))
        if section.slug == "two-layers":
            body.append(analysis_checks_html(paper))
    if section.slug == "appendix":
        body.append(rules_html())
    if section.equations:
        body += ["<h2>Equations, derived and checked</h2>"] + [equation_html(e) for e in section.equations]
    body.append("<footer>generated by tcircuits paper · every number measured when this page was built</footer>")
    return page(f"{section.title} · {TITLE}", "\n".join(body), css=CSS + EXTRA_CSS)


def index_page(paper: Paper) -> str:
    analyses = paper.measurements.analyses
    models = "; ".join(f"{_h(a.name)}: {_h(plural(a.n_layers, 'layer'))}"
                       + (f" of {_h(plural(a.model.arch.heads_per_layer[0], 'head'))}" if a.n_layers else "")
                       + f", loss on repeated tokens {a.losses['repeat_loss']:.2f} nats" for a in analyses.values())
    checked = paper.equations
    ok = sum(1 for e in checked if not isinstance(e.verification, str) and e.verification.ok)
    body = [_nav(paper, "index"), f"<h1>{_h(TITLE)}</h1>",
            "<p>Elhage et al. (2021), in the paper's order: every equation is derived step by step by the tcircuits "
            "catalogue and checked numerically; every finding is measured on attention-only models trained here on "
            f"random sequences with repeated segments ({models}).</p>"]
    if paper.measurements.language_models is not None:
        body.append(f"<p>The language page measures {_h(paper.measurements.language_models)}.</p>")
    body += [f"<p>{ok} of {len(checked)} derivations check line by line; "
             f"{sum(1 for e in checked if e.model_check is not None and e.model_check.passed)} are also verified term "
             "by term against a shipped model.</p>", "<h2>Contents</h2><ol>"]
    for s in paper.sections:
        body.append(f'<li><a href="{_h(s.slug)}.html">{_h(s.title)}</a> — {plural(len(s.equations), "derivation")}'
                    + (f", {plural(len(s.findings), 'finding')}" if s.findings else "") + "</li>")
    body += ["</ol>", "<h2>Findings</h2>", "<table><thead><tr><th>claim (as the paper states it)</th><th>verdict</th>"
             "<th>section</th></tr></thead><tbody>"]
    for s in paper.sections:
        for f in s.findings:
            body.append(f'<tr><td><a href="{_h(s.slug)}.html#{_h(f.key)}">{prose_html(f.claim, index_from())}</a></td>'
                        f'<td>{verdict_badge(f.verdict)}</td><td class="section">{_h(s.title.split(":")[0])}</td></tr>')
    body += ["</tbody></table>", "<footer>generated by tcircuits paper</footer>"]
    return page(TITLE, "\n".join(body), css=CSS + EXTRA_CSS)


def site_pages(paper: Paper) -> dict[str, str]:
    """Every page by file name: ``index.html`` and ``SLUG.html`` per section."""
    pages = {"index.html": index_page(paper)}
    pages.update({f"{s.slug}.html": section_page(paper, s) for s in paper.sections})
    return pages
