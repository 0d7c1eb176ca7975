"""What a path attribution found (:func:`numeric_check.circuits.attribution.attribute`): the ranked
terms with their checks, as text, Markdown, strict JSON and an HTML page with a bar chart.

Plain data and its renderers; nothing here touches a model. Every user string (token texts,
the model's description) goes through the project's one escaping function,
:func:`tensoralg.escape.escape_text`, in each format. The HTML bar chart is inline SVG: the
page needs no network and no script.

>>> t = Target((5,), (1.0,), None)
>>> a = Attribution(t, "toy", [1, 5], None, 1, 1, "float64", "cpu", 2.0,
...                 [AttributionTerm("tok (direct)", "tok", (), 0, 1.5), AttributionTerm("tok→L0H0", "tok", ((0, 0),), 1, 0.5)],
...                 0.0, 0, 0.0, 1e-9, 0)
>>> print(a.to_text().splitlines()[0])
attribution of logit[5] at position 1 (token 5)
>>> a.by_component()
{'tok': 1.5, 'L0H0': 0.5}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Sequence

from derivations.architecture import head_label
from derivations.html import page
from numeric_check.verification.results import strict_json
from tensoralg.display import REPR_MAX_TERMS, md_table, md_text
from tensoralg.escape import escape_text

CHART_TERMS = 20  # bars in the HTML chart


def token_name(token: int, text: str | None) -> str:
    """``5`` or ``5 ' Paris'`` (unescaped: each renderer escapes it)."""
    return str(token) if text is None else f"{token} {text!r}"


@dataclass
class Target:
    """What is attributed: ``Σ weights[i] · logit[ids[i]]`` (one logit, or ``A - B``); ``texts``: the
    tokens' strings when a tokenizer was given."""

    ids: tuple[int, ...]
    weights: tuple[float, ...]
    texts: list[str] | None = None

    @property
    def label(self) -> str:
        names = [token_name(i, None if self.texts is None else self.texts[k]) for k, i in enumerate(self.ids)]
        if len(names) == 1:
            return f"logit[{names[0]}]"
        return f"logit[{names[0]}] - logit[{names[1]}]"


@dataclass
class AttributionTerm:
    """One path term: its label (``tok→L0H1→L1H2``), source, heads, order and contribution to the target;
    for the ranked terms checked by isolation, the same path computed by the model's hooks
    (``isolated``), the absolute difference (``error``) and whether it is within the tolerance."""

    label: str
    source: str
    heads: tuple[tuple[int, int], ...]
    order: int
    contribution: float
    isolated: float | None = None
    error: float | None = None
    passed: bool | None = None

    @property
    def component(self) -> str:
        """What writes the term into the final residual stream: its last head, or its source when direct."""
        return head_label(*self.heads[-1]) if self.heads else self.source


@dataclass
class Attribution:
    """Every path term's contribution to one target at one position of one prompt, largest first.

    ``value``: the model's own logit (or difference); ``remainder``: every path of order above
    ``max_order``, computed by the model (0 when nothing is omitted); ``sum_error``: ``|Σ terms +
    remainder - value|`` against ``tolerance``; the first ``n_checked`` terms were checked by isolation.
    """

    target: Target
    model: str
    tokens: list[int]
    token_texts: list[str] | None
    position: int
    max_order: int | None
    dtype: str
    device: str
    value: float
    terms: list[AttributionTerm]
    remainder: float
    n_omitted: int
    sum_error: float
    tolerance: float
    n_checked: int
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    source: str | None = None  # the model it was converted from and the measured difference (None: not converted)

    @property
    def sum_passed(self) -> bool:
        return self.sum_error <= self.tolerance

    @property
    def isolation_error(self) -> float:
        """The largest isolation error of the checked terms (0 when none was checked)."""
        return max((t.error for t in self.terms[: self.n_checked] if t.error is not None), default=0.0)

    @property
    def passed(self) -> bool:
        """The sum check and every isolation check passed."""
        return self.sum_passed and all(t.passed for t in self.terms[: self.n_checked])

    def by_component(self) -> dict[str, float]:
        """Contributions summed by what writes them into the final stream (:attr:`AttributionTerm.component`),
        with ``remainder`` when terms were omitted: with every order kept, the direct logit attribution
        of each head, embedding, bias and MLP."""
        out: dict[str, float] = {}
        for t in self.terms:
            out[t.component] = out.get(t.component, 0.0) + t.contribution
        if self.n_omitted:
            out["remainder"] = self.remainder
        return out

    # -- text -----------------------------------------------------------------------------------
    def _at(self, fmt: str = "none") -> str:
        token = token_name(self.tokens[self.position], None if self.token_texts is None else self.token_texts[self.position])
        return f"position {self.position} (token {_esc(token, fmt)})"

    def summary_lines(self, fmt: str = "none") -> list[str]:
        """The verdicts in a few lines; user strings (token texts, the model) escaped for ``fmt``
        (``text``, ``markdown``, ``html``; ``none``: as they are)."""
        order = "every order" if self.max_order is None else f"up to order {self.max_order}"
        rest = f", {self.n_omitted:,} omitted" if self.n_omitted else ""
        iso = self.terms[: self.n_checked]
        lines = [
            f"attribution of {_esc(self.target.label, fmt)} at {self._at(fmt)}",
            f"model: {_esc(self.model, fmt)}; {self.dtype} on {self.device}",
            *([_esc(self.source, fmt)] if self.source else []),
            f"the model's value: {self.value:+.6g}; {len(self.terms):,} terms {order}{rest}",
            f"  sum of terms + remainder = model: |error| {self.sum_error:.3g} (tolerance {self.tolerance:.3g}) "
            + ("PASS" if self.sum_passed else "FAIL"),
        ]
        if iso:
            ok = all(t.passed for t in iso)
            lines.append(f"  top {len(iso):,} terms = their paths isolated in the model: max |error| "
                         f"{self.isolation_error:.3g} " + ("PASS" if ok else "FAIL"))
        return lines + [f"  note: {_esc(n, fmt)}" for n in self.notes]

    def rows(self, limit: int | None = None) -> list[list[str]]:
        """``[rank, term, order, contribution, isolated error, ok]`` for the first ``limit`` terms (all)."""
        out = []
        for rank, t in enumerate(self.terms[:limit], start=1):
            error = "" if t.error is None else f"{t.error:.1e}"
            ok = "" if t.passed is None else ("ok" if t.passed else "FAIL")
            out.append([str(rank), t.label, str(t.order), f"{t.contribution:+.6g}", error, ok])
        return out

    def _remainder_row(self) -> list[str] | None:
        if not self.n_omitted:
            return None
        return ["", f"remainder: {self.n_omitted:,} terms of order > {self.max_order}, computed by the model", "",
                f"{self.remainder:+.6g}", "", ""]

    def to_text(self, top: int | None = 30) -> str:
        """The summary and an aligned table of the ``top`` largest terms (all with ``None``), then the remainder."""
        header = ["rank", "term", "order", "contribution", "isolation error", "ok"]
        rows = [[escape_text(c, "text") for c in r] for r in self.rows(top)]
        extra = [self._remainder_row()] if self.n_omitted else []
        widths = [max(len(r[i]) for r in [header] + rows) for i in range(6)]
        table = ["  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                 for r in [header] + rows] if rows or not self.terms else []  # --max-terms 0: no empty table
        if top is not None and len(self.terms) > top:
            table.append(f"… {len(self.terms) - top:,} more terms" if rows else f"({len(self.terms):,} terms not listed)")
        table += [f"{'':>{widths[0]}}  {r[1]}: {r[3]}" for r in extra]
        lines = self.summary_lines("text")
        return "\n".join(lines + [""] + table + ["", "PASSED" if self.passed else "FAILED"])

    def __str__(self) -> str:
        return self.to_text()

    def to_markdown(self, top: int | None = 30) -> str:
        """The summary and a Markdown table of the ``top`` largest terms and the remainder."""
        rows = [[md_text(c) for c in r] for r in self.rows(top)]
        if top is not None and len(self.terms) > top:
            rows.append(["", md_text(f"… {len(self.terms) - top:,} more terms"), "", "", "", ""])
        if self.n_omitted:
            rows.append([md_text(c) for c in self._remainder_row()])
        summary = self.summary_lines("markdown")
        lines = [f"**{summary[0]}**: " + ("**PASSED**" if self.passed else "**FAILED**"), ""]
        lines += [f"- {line.strip()}" for line in summary[1:]] + [""]
        lines.append(md_table(["rank", "term", "order", "contribution", "isolation error", "ok"], rows, right=[0, 2, 3, 4]))
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        return self.to_markdown(REPR_MAX_TERMS)

    # -- JSON -----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(target_label=self.target.label, passed=self.passed, sum_passed=self.sum_passed,
                    isolation_error=self.isolation_error)
        return strict_json(data)

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON (non-finite numbers as ``null``) listing every term with its contribution."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False)

    # -- HTML -----------------------------------------------------------------------------------
    def html_body(self, top: int | None = 50) -> str:
        """The chart of the largest terms, the summary and the table, as an HTML fragment."""
        h = lambda s: escape_text(s, "html")  # noqa: E731
        rows = self.rows(top) + ([self._remainder_row()] if self.n_omitted else [])
        cells = "".join("<tr>" + "".join(f'<td class="num">{h(c)}</td>' if i in (0, 2, 3, 4) else f"<td>{h(c)}</td>"
                                         for i, c in enumerate(r)) + "</tr>" for r in rows)
        head = "".join(f"<th>{c}</th>" for c in ["rank", "term", "order", "contribution", "isolation error", "ok"])
        summary = "".join(f"<li>{line.strip()}</li>" for line in self.summary_lines("html")[1:])
        verdict = '<span class="badge">passed</span>' if self.passed else '<span class="badge bad">failed</span>'
        more = f"<p>… {len(self.terms) - top:,} more terms (every term is in the JSON output)</p>" if top is not None and len(self.terms) > top else ""
        return "\n".join([f"<p>{verdict}</p>", f"<ul>{summary}</ul>", bar_chart(self.terms[:CHART_TERMS], self.value),
                          f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>", more])

    def to_html(self, top: int | None = 50) -> str:
        """A complete page: the chart of the largest terms (inline SVG), the checks and the table."""
        title = f"Path attribution of {self.target.label} at {self._at()}"  # page() escapes it
        return page(title, f"<h1>{escape_text(title, 'html')}</h1>\n" + self.html_body(top))

    def _repr_html_(self) -> str:
        return self.html_body(REPR_MAX_TERMS)


def _esc(text: str, fmt: str) -> str:
    return text if fmt == "none" else escape_text(text, fmt)


def bar_chart(terms: Sequence[AttributionTerm], value: float, width: int = 760, row: int = 20) -> str:
    """Horizontal bars of the terms' contributions (right: positive, left: negative), labelled, as SVG."""
    label_w, pad = 260, 8
    half = (width - label_w - 2 * pad) / 2
    zero = label_w + pad + half
    top = max([abs(t.contribution) for t in terms] + [abs(value), 1e-300])
    height = row * (len(terms) + 1) + pad
    h = lambda s: escape_text(s, "html")  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="contributions of the largest terms" font-family="sans-serif" font-size="12">',
             f'<line x1="{zero:.1f}" y1="0" x2="{zero:.1f}" y2="{pad + len(terms) * row}" stroke="#888"/>']
    for k, t in enumerate(terms):
        y = pad + k * row
        size = half * abs(t.contribution) / top
        x = zero if t.contribution >= 0 else zero - size
        colour = "#3b6fb6" if t.contribution >= 0 else "#c0392b"
        parts.append(f'<g><title>{h(t.label)}: {t.contribution:+.6g}</title>'
                     f'<text x="{label_w}" y="{y + row * 0.65:.1f}" text-anchor="end">{h(t.label)}</text>'
                     f'<rect x="{x:.1f}" y="{y + 2}" width="{max(size, 0.5):.1f}" height="{row - 4}" fill="{colour}"/></g>')
    y = pad + len(terms) * row
    parts.append(f'<text x="{label_w + pad}" y="{y + row * 0.65:.1f}" fill="#444">'
                 f'bars to scale from the line at 0; half the width is {top:.4g} (the model\'s value {value:+.4g})</text>')
    return "".join(parts) + "</svg>"
