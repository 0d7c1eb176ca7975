"""The analysis report as one HTML page, ``index.html``, readable in any browser.

The page holds what ``report.md`` holds — the findings with their verdicts, each head's OV
and QK circuits (the circuit as MathML from the tensoralg printer, with its eigenvalue
positivity and behaviour scores), composition scores against their random baselines,
previous-token and induction heads, term importance by order, the loss on repeats and the
skip-trigram tables — and shows the figures that :meth:`numeric_check.reports.report.Report.write`
writes beside it (``figures/NAME.svg``, else ``.png``), so it needs no Markdown tooling and
no network. Model names and token strings are escaped (``escape_text(…, "html")``); the
page shell, the CSS and the MathML conversion are :mod:`derivations.html`'s.

>>> from derivations.architecture import Architecture
>>> from numeric_check.model.circuit_model import CircuitModel
>>> from numeric_check.reports.analysis import analyze_model
>>> model = CircuitModel.random(Architecture(1, 2), d_model=8, d_head=4, d_vocab=12, n_ctx=16)
>>> page = html_page(analyze_model(model, name="<b>m</b>", n_sequences=2), [])
>>> "&lt;b&gt;m&lt;/b&gt;" in page and "<b>m</b>" not in page
True
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from derivations.architecture import head_label
from derivations.document import math as formula
from derivations.html import mathml, page
from tensoralg.escape import escape_text

from numeric_check.circuits.importance import path_label
from numeric_check.reports.analysis import ModelAnalysis, composition_rows, skip_trigram_title
from numeric_check.reports.findings import Finding

__all__ = ["FIGURES", "html_page"]

#: The report's figures, in page order, with their captions.
FIGURES = {
    "training": "Loss during training (held-out data).",
    "positivity": "Each head's OV circuit eigenvalue positivity (copying, x) against its QK positivity (y; layer 0: "
                  "the token QK circuit; later layers: the K-composition circuit with the head's partner).",
    "profiles": "Attention by query position of the previous-token and induction heads found.",
    "composition": "Composition scores minus their random baseline, writer head by reader head.",
    "importance": "Term importance: loss as terms of each order are added (patterns frozen).",
}


def _h(text) -> str:
    return escape_text(text, "html")


def _num(value, digits: int = 3) -> str:
    value = float(value)
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Iterable[int] = (), caption: str = "") -> str:
    """An HTML table, the columns ``numeric`` aligned right; header and cells are HTML already."""
    numeric = set(numeric)
    head = "".join(f'<th class="num">{c}</th>' if i in numeric else f"<th>{c}</th>" for i, c in enumerate(header))
    body = "".join(
        "<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        + "</tr>" for row in rows)
    cap = f"<caption>{caption}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(name: str, figures: dict[str, str]) -> list[str]:
    if name not in figures:
        return []
    src = _h(figures[name])
    return [f'<figure><img src="{src}" alt="{_h(FIGURES[name])}" loading="eager">'
            f"<figcaption>{_h(FIGURES[name])}</figcaption></figure>"]


def _circuit(source: str, label: str) -> str:
    return mathml(formula(source.replace("HEAD", "{" + label + "}")).latex)


def _heads_section(a: ModelAnalysis) -> list[str]:
    b = a.heads.behaviour if a.heads else None
    rows = []
    for layer, head in a.model.arch.heads():
        label = head_label(layer, head)
        rows.append([
            _h(label),
            _circuit("W_U W_OV^HEAD W_E", label), _num(a.copying[layer, head]),
            _circuit("W_Eᵀ W_QK^HEAD W_E", label), _num(a.qk_positivity[layer, head]),
            _num(b.previous_token[layer, head]) if b else "–", _num(b.induction[layer, head]) if b else "–",
        ])
    header = ["head", "OV circuit", "copying", "QK circuit", "QK positivity", "previous-token (behaviour)",
              "induction (behaviour)"]
    return [_table(header, rows, numeric=(2, 4, 5, 6))]


def _findings_section(rows) -> list[str]:
    verdict = lambda f: '<span class="badge">holds</span>' if f.holds else '<span class="badge bad">does not hold</span>'
    return ["<h2>Findings</h2>",
            _table(["claim", "measured", "verdict"], [[_h(f.claim), _h(f.measured), verdict(f)] for f in rows])]


def _composition_section(a: ModelAnalysis, figures: dict[str, str]) -> list[str]:
    if not a.composition:
        return []
    base = ", ".join(f"{_h(k)} {v:.3f}" for k, v in a.baseline.items())
    return ["<h2>Composition scores</h2>", f"<p>Random baselines (matrices of the same shapes): {base}. "
            "Pairs ranked by K-composition.</p>",
            _table(["writer → reader", "Q", "K", "V"], [[_h(c) for c in row] for row in composition_rows(a)], numeric=(1, 2, 3)),
            *_figure("composition", figures)]


def _detected_section(a: ModelAnalysis, figures: dict[str, str]) -> list[str]:
    if a.heads is None:
        return []
    views = (("by behaviour", a.heads.by_behaviour), ("by weights", a.heads.by_weights))
    rows = []
    for kind in ("previous_token", "induction"):
        agree = a.heads.agreement.get(kind)
        cells = [", ".join(map(head_label, *zip(*getattr(v, kind)))) if getattr(v, kind) else "none" for _, v in views]
        rows.append([_h(kind.replace("_", "-")), *map(_h, cells), "–" if agree is None else ("yes" if agree else "no")])
    out = ["<h2>Previous-token and induction heads</h2>",
           _table(["kind", "by behaviour", "by weights", "views agree"], rows)]
    out += _figure("profiles", figures)
    g = getattr(a, "grid", None)  # the loss on repeats by length and offset, where measured
    if g is not None:
        grid_rows = [[str(length)] + [_num(v, 2) for v in g.loss[i].tolist()] for i, length in enumerate(g.lengths)]
        out += [f"<p>Loss (nats) on the second copy of a repeated random segment, its first token excluded, by "
                f"segment length (rows) and offset of the first copy (columns); uniform {g.uniform:.2f}.</p>",
                _table(["length \\ offset", *map(str, g.offsets)], grid_rows, numeric=range(1, len(g.offsets) + 1))]
    return out


def _importance_section(a: ModelAnalysis, figures: dict[str, str]) -> list[str]:
    if a.importance is None:
        return []
    out = ["<h2>Term importance by order</h2>", "<p>Attention patterns frozen; marginal: the change in loss "
           "(nats) when a term is added to the terms of its order and below (negative: it helps), as in the paper's "
           "table.</p>"]
    for report, what in ((a.importance, "all tokens"), (a.importance_repeat, "repeated tokens only")):
        if report is None:
            continue
        rows = [[_h(n), _num(loss), f"{gain:+.3f}"] for n, loss, gain in report.order_rows()]
        rows += [[_h(head_label(*h)), "", f"{v:+.3f}"] for h, v in sorted(report.head_marginal.items())]
        rows += [[_h(path_label(p)), "", f"{v:+.3f}"] for p, v in
                 sorted(report.virtual_marginal.items(), key=lambda kv: kv[1])[:10]]
        out.append(_table(["terms", "loss up to order", "marginal"], rows, numeric=(1, 2), caption=f"Loss on {_h(what)}"))
    return out + _figure("importance", figures)


def _token(score) -> str:
    return f"#{score.token}" if score.text is None else f"<code>{_h(repr(score.text))}</code> ({score.token})"


def _skip_trigram_section(a: ModelAnalysis) -> list[str]:
    if not a.skip_trigrams:
        return []
    out = [f"<h2>{_h(skip_trigram_title(a))}</h2>"]
    for t in a.skip_trigrams:
        source = f"#{t.source_token}" if t.source_text is None else f"<code>{_h(repr(t.source_text))}</code> ({t.source_token})"
        rows = [[str(r), _token(d), _num(d.score), _token(o), _num(o.score)]
                for r, (d, o) in enumerate(zip(t.destinations, t.outputs), start=1)]
        out.append(_table(["rank", "destination (QK)", "score", "out (OV)", "logit"], rows, numeric=(0, 2, 4),
                          caption=f"{_h(head_label(t.layer, t.head))}, source token {source}"))
    return out


def _model_line(a: ModelAnalysis) -> str:
    cfg, losses = a.model.cfg, a.losses
    return (f"<p>Model: {_h(a.model.arch.describe())}; d_model={cfg.d_model}, d_head={cfg.d_head}, "
            f"d_vocab={cfg.d_vocab}, n_ctx={cfg.n_ctx}. Loss on repeated-segment data: {losses['loss']:.3f} nats "
            f"overall, {losses['repeat_loss']:.3f} on repeated tokens, {losses['other_loss']:.3f} elsewhere "
            f"(uniform {losses['uniform_loss']:.3f}).</p>"
            + (f"<p>{_h(a.model.source_check.describe())}.</p>" if a.model.source_check else ""))


def html_page(a: ModelAnalysis, rows: Sequence[Finding], control: ModelAnalysis | None = None,
              figures: dict[str, str] | None = None) -> str:
    """The report of ``a`` and its findings ``rows`` as a complete HTML page; ``figures`` maps
    names of :data:`FIGURES` to relative paths."""
    figures = figures or {}
    body = [f"<h1>Circuit analysis: {_h(a.name)}</h1>", _model_line(a)]
    body += [f"<p><em>Note:</em> {_h(note)}</p>" for note in a.notes]
    body += _figure("training", figures)
    if rows:
        body += _findings_section(rows)
    body += ["<h2>Heads and their circuits</h2>",
             "<p>Copying: eigenvalue positivity of the OV circuit; QK positivity: of the token QK circuit; "
             "behaviour scores on repeated random sequences.</p>", *_heads_section(a), *_figure("positivity", figures)]
    body += _composition_section(a, figures)
    body += _detected_section(a, figures)
    body += _importance_section(a, figures)
    body += _skip_trigram_section(a)
    if control is not None:
        body += [f"<h2>Control: {_h(control.name)}</h2>", _model_line(control), *_heads_section(control)]
    body.append(f"<footer>{_h(a.name)} · generated by tcircuits analyze · report.md, tables.tex and "
                "analysis.json hold the same numbers</footer>")
    return page(f"Circuit analysis: {a.name}", "\n".join(body))
