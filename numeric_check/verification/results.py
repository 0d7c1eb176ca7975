"""What a verification found: one :class:`TermResult` per term, one :class:`CheckResult` per check,
and the :class:`VerifyReport` that holds them (text, Markdown for notebooks, JSON).

Plain data: :mod:`numeric_check.verification.verify` fills them in; nothing here touches a model.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial

import numpy as np

from tensoralg.display import REPR_MAX_TERMS, elided_table, head_and_tail, html_table, html_text, md_table, md_text


@dataclass
class TermResult:
    """One term of a verified expansion.

    ``norm``: Frobenius norm of the term's contribution over the batch (for scores, over
    the causal lower triangle); ``max_abs_error``: the largest absolute difference from the
    path isolated through the model, computed exactly (``None`` when isolation was skipped,
    or when the logits term was certified by ``error_bound`` alone); ``error_bound``: a
    rigorous upper bound on that difference for logits terms (see :func:`verify_logits`).
    For QK terms ``source``/``heads`` are the query side's and ``key_source``/``key_heads``
    the key side's.
    """

    label: str
    source: str
    heads: tuple[tuple[int, int], ...]
    order: int
    norm: float = math.nan
    max_abs_error: float | None = None
    passed: bool | None = None
    composition: str | None = None
    key_source: str | None = None
    key_heads: tuple[tuple[int, int], ...] | None = None
    error_bound: float | None = None


_COLUMNS = ("norm", "error_bound", "_bound_set", "max_abs_error", "_error_set", "passed")  # a TermTable's


class TermTable(Sequence[TermResult]):
    """The results of many terms, kept as columns, each term's :class:`TermResult` made when asked for
    (``table[i]``, iteration): a verification of millions of terms fills the columns a chunk at a time,
    and a report makes objects only for the rows it shows. ``paths[i]`` names term ``i``.

    Columns (numpy): ``norm`` (NaN until set), ``error_bound`` and ``max_abs_error`` (``None`` in a
    :class:`TermResult` until set: :meth:`set_bound`, :meth:`set_error`), ``passed`` (``int8``: -1 for
    ``None``, 0, 1).

    >>> from derivations.paths import TOKEN, Path
    >>> table = TermTable([Path(TOKEN), Path(TOKEN, ((0, 1),))])
    >>> table.norm[1] = 2.0
    >>> table.set_bound(1, 1e-9); table.passed[1] = 1
    >>> table[1]
    TermResult(label='tok→L0H1', source='tok', heads=((0, 1),), order=1, norm=2.0, max_abs_error=None, passed=True, composition=None, key_source=None, key_heads=None, error_bound=1e-09)
    >>> table[0].passed is None and math.isnan(table[0].norm)
    True
    """

    def __init__(self, paths: Sequence):
        n = len(paths)
        self.paths = paths
        self.norm = np.full(n, np.nan)
        self.error_bound, self._bound_set = np.full(n, np.nan), np.zeros(n, bool)
        self.max_abs_error, self._error_set = np.full(n, np.nan), np.zeros(n, bool)
        self.passed = np.full(n, -1, np.int8)

    def __len__(self) -> int:
        return len(self.norm)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = operator.index(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"term {i} of {len(self):,}")
        path, passed = self.paths[i], int(self.passed[i])
        return TermResult(path.label, path.source.label, path.heads, len(path.heads), float(self.norm[i]),
                          float(self.max_abs_error[i]) if self._error_set[i] else None, None if passed < 0 else bool(passed),
                          error_bound=float(self.error_bound[i]) if self._bound_set[i] else None)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"<TermTable of {len(self):,} terms>"

    def set_bound(self, i, bound) -> None:
        """Term(s) ``i`` (an index, a slice or an index array) get their error bound(s)."""
        self.error_bound[i], self._bound_set[i] = bound, True

    def set_error(self, i, error) -> None:
        """Term(s) ``i`` get their exact largest error(s)."""
        self.max_abs_error[i], self._error_set[i] = error, True

    def take(self, rows) -> dict[str, np.ndarray]:
        """The columns of ``rows`` (an index array), to send to another process (:meth:`put`)."""
        return {name: getattr(self, name)[rows] for name in _COLUMNS}

    def put(self, rows, columns: dict[str, np.ndarray]) -> None:
        """Fill ``rows`` from :meth:`take` of another table's same rows."""
        for name in _COLUMNS:
            getattr(self, name)[rows] = columns[name]

    def summary(self) -> tuple[float, int, int, list[int]]:
        """``(worst error, terms certified by a bound alone, terms failed, the first three failed)``: a term's
        error is its exact one where computed, else its bound (NaN: any NaN, or a term with neither)."""
        errors = np.where(self._error_set, self.max_abs_error, np.where(self._bound_set, self.error_bound, np.nan))
        worst = math.nan if np.isnan(errors).any() else float(errors.max(initial=0.0))
        failed = np.flatnonzero(self.passed != 1)
        return worst, int((~self._error_set).sum()), len(failed), failed[:3].tolist()


@dataclass
class CheckResult:
    """One of the three checks. ``passed`` is ``None`` when it did not run (``detail`` says why).

    ``bounded``: ``max_abs_error`` is a rigorous upper bound on the largest absolute error
    (the check passed on it), not the error itself; see :func:`verify_logits`.
    """

    name: str
    passed: bool | None
    max_abs_error: float | None
    rel_error: float | None
    tolerance: float | None
    detail: str
    bounded: bool = False


@dataclass
class VerifyReport:
    """What :func:`verify_logits` or :func:`verify_qk` found; ``passed`` when every check that ran passed."""

    target: str
    model: str
    n_batch: int
    n_pos: int
    max_order: int | None
    dtype: str
    device: str
    passed: bool
    max_abs_error: float
    rel_error: float
    scale: float
    terms: Sequence[TermResult]  # a list, or a TermTable
    checks: list[CheckResult]
    n_omitted: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    source: str | None = None  # the model it was converted from and the measured difference (None: not converted)
    tokens: list[str] = field(default_factory=list)  # each sequence's ids with their strings, when a tokenizer gave them

    def check(self, name: str) -> CheckResult:
        """The check called ``name`` (``sum``, ``isolation`` or ``truncation``)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r}; checks: {[c.name for c in self.checks]}")

    def to_dict(self) -> dict:
        data = asdict(replace(self, terms=[]))
        data["terms"] = [asdict(t) for t in self.terms]
        return strict_json(data)

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON (non-finite numbers as ``null``): ``json.dumps(self.to_dict(), indent=indent)``."""
        return "".join(self.json_pieces(indent))

    def json_pieces(self, indent: int | None = 2) -> Iterator[str]:
        """:meth:`to_json` in pieces, the terms :data:`ROWS_AT_ONCE` at a time, so that a report of millions of
        terms is written out holding one piece (the same text as ``json.dumps`` of :meth:`to_dict`: key order,
        separators and indentation).

        >>> report = VerifyReport("logits", "m", 1, 2, None, "float64", "cpu", True, 0.0, 0.0, 1.0,
        ...                       [TermResult("tok", "tok", (), 0, 1.5)], [])
        >>> "".join(report.json_pieces(None)) == json.dumps(report.to_dict(), ensure_ascii=False)
        True
        """
        dumps = partial(json.dumps, indent=indent, ensure_ascii=False, allow_nan=False)  # strict JSON
        nl, pad = ("", "") if indent is None else ("\n", " " * indent)
        sep = ", " if indent is None else ",\n"  # json's item separator with and without indentation
        yield "{" + nl
        for k, (key, value) in enumerate(strict_json(asdict(replace(self, terms=[]))).items()):
            yield (sep if k else "") + pad + dumps(key) + ": "
            if key != "terms":
                yield dumps(value).replace("\n", nl + pad)
                continue
            if not self.terms:
                yield "[]"
                continue
            yield "[" + nl
            for start in range(0, len(self.terms), ROWS_AT_ONCE):
                text = dumps([_term_data(t) for t in self.terms[start:start + ROWS_AT_ONCE]])
                body = text[1 + len(nl):len(text) - 1 - len(nl)]  # the rows without the list's brackets
                yield (sep if start else "") + pad + body.replace("\n", nl + pad)
            yield nl + pad + "]"
        yield nl + "}"

    def summary_lines(self) -> list[str]:
        order = "all orders" if self.max_order is None else f"max_order={self.max_order} ({self.n_omitted:,} terms omitted)"
        lines = [
            f"verify {self.target} of {self.model}",
            *([self.source] if self.source else []),
            *(f"tokens: {line}" for line in self.tokens),
            f"batch {self.n_batch} x {self.n_pos} positions, {len(self.terms):,} terms, {order}, {self.dtype} on {self.device}",
        ]
        for c in self.checks:
            status = "skipped" if c.passed is None else ("PASS" if c.passed else "FAIL")
            le = "≤ " if c.bounded else ""
            # the tolerance bounds the absolute error; the relative error is said apart, as a fraction of the scale
            side = "within" if c.passed else "over"
            err = "" if c.max_abs_error is None else (
                f": max |error| {le}{c.max_abs_error:.3g}, {side} the tolerance {c.tolerance:.3g} "
                f"({le}{c.rel_error:.3g} of the largest entry)")
            lines.append(f"  {_CHECK_TITLES[c.name]:<47} {status}{err}")
            if c.detail:
                lines.append(f"      {c.detail}")
        lines += [f"  note: {n}" for n in self.notes]
        lines.append("PASSED" if self.passed else "FAILED")
        return lines

    def rows(self, terms: Sequence[TermResult] | None = None) -> list[tuple[str, str, str, str, str]]:
        """A table row per term (of ``terms``, a part of :attr:`terms`, when given)."""
        out = []
        for t in self.terms if terms is None else terms:
            err = "—" if t.max_abs_error is None and t.error_bound is None else (
                f"≤ {t.error_bound:.2e}" if t.max_abs_error is None else f"{t.max_abs_error:.2e}")
            ok = "—" if t.passed is None else ("ok" if t.passed else "FAIL")
            out.append((t.label, str(t.order), f"{t.norm:.4g}", err, ok))
        return out

    def to_markdown(self, max_rows: int | None = None) -> str:
        """A summary and a Markdown table of the terms (the first ``max_rows``, or all)."""
        n = len(self.terms)
        rows = self.rows(self.terms[:max_rows] if max_rows is not None else None)  # only those shown are made
        shown = [[md_text(label), order, norm, err, ok] for label, order, norm, err, ok in rows]
        if max_rows is not None and n > max_rows:
            shown.append([f"… {n - max_rows:,} more", "", "", "", ""])
        table = md_table(["term", "order", "norm", "max abs error", "ok"], shown, right=[1, 2, 3])
        return "\n".join(["```", *self.summary_lines(), "```", "", table])

    def to_text(self, max_rows: int | None = None) -> str:
        """A summary and an aligned plain-text table of the terms (the first ``max_rows``, or all)."""
        return "".join(self.text_pieces(max_rows))

    def text_pieces(self, max_rows: int | None = None) -> Iterator[str]:
        """:meth:`to_text` in pieces, the rows :data:`ROWS_AT_ONCE` at a time (made twice: once for the
        columns' widths, once to write them), so that a table of millions of terms holds one piece."""
        n = len(self.terms) if max_rows is None else min(max_rows, len(self.terms))

        def chunks() -> Iterator[list[tuple[str, ...]]]:
            for start in range(0, n, ROWS_AT_ONCE):
                yield self.rows(self.terms[start:min(n, start + ROWS_AT_ONCE)])  # only those shown are made

        header = ("term", "order", "norm", "max abs error", "ok")
        widths = [len(cell) for cell in header]
        for rows in chunks():
            widths = [max(w, *(len(r[i]) for r in rows)) for i, w in enumerate(widths)]

        def line(row: tuple[str, ...]) -> str:
            return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))

        if not n:  # the summary only (--max-terms 0): the terms counted, no empty table
            yield "\n".join(self.summary_lines() + ["", f"({len(self.terms):,} terms not listed)"])
            return
        yield "\n".join(self.summary_lines() + ["", line(header)])
        for rows in chunks():
            yield "".join("\n" + line(r) for r in rows)
        if n < len(self.terms):
            yield f"\n… {len(self.terms) - n:,} more terms"

    def __str__(self) -> str:
        return self.to_text()

    def _repr_markdown_(self, max_rows: int | None = REPR_MAX_TERMS) -> str:
        """What a notebook shows: the verdict, each check with its worst error and tolerance, and the
        first and last terms (the count of the rest) with their norms and errors."""
        order = "all orders" if self.max_order is None else f"up to order {self.max_order} ({self.n_omitted:,} terms omitted)"
        lines = [f"**verify {md_text(self.target)}** of {md_text(self.model)}: "
                 + ("**PASSED**" if self.passed else "**FAILED**"), "",
                 *([md_text(self.source), ""] if self.source else []),
                 *(item for line in self.tokens for item in (md_text(f"tokens: {line}"), "")),
                 md_text(f"batch {self.n_batch} x {self.n_pos} positions, {len(self.terms):,} terms, {order}, "
                         f"{self.dtype} on {self.device}"), ""]
        checks = []
        for c in self.checks:
            status = "skipped" if c.passed is None else ("PASS" if c.passed else "**FAIL**")
            le = "≤ " if c.bounded else ""
            cells = ["" if v is None else f"{le}{v:.3g}" for v in (c.max_abs_error, c.rel_error)]
            checks.append([md_text(_CHECK_TITLES[c.name]), status, *cells,
                           "" if c.tolerance is None else f"{c.tolerance:.3g}", md_text(c.detail)])
        lines += [md_table(["check", "result", "max abs error", "relative", "tolerance", "detail"], checks, right=[2, 3, 4]), ""]
        lines += [f"- note: {md_text(n)}" for n in self.notes] + ([""] if self.notes else [])
        rows = _Rows(self.terms, lambda terms: [[md_text(label), order_, norm, err, ok if ok != "FAIL" else "**FAIL**"]
                                                 for label, order_, norm, err, ok in self.rows(terms)])
        lines.append(elided_table(["term", "order", "norm", "max abs error", "ok"], rows, max_rows, right=[1, 2, 3], what="terms"))
        return "\n".join(lines)

    def _repr_html_(self, max_rows: int | None = REPR_MAX_TERMS) -> str:
        """What a notebook shows as HTML: the verdict, the checks, the notes and the first and last
        terms (the count of the rest) — the same content as :meth:`_repr_markdown_`."""
        verdict = "PASSED" if self.passed else "FAILED"
        order = "all orders" if self.max_order is None else f"up to order {self.max_order} ({self.n_omitted:,} omitted)"
        checks = []
        for c in self.checks:
            le = "≤ " if c.bounded else ""
            cells = ["" if v is None else f"{le}{v:.3g}" for v in (c.max_abs_error, c.rel_error)]
            status = "skipped" if c.passed is None else ("PASS" if c.passed else "<b>FAIL</b>")
            checks.append([html_text(_CHECK_TITLES[c.name]), status, *map(html_text, cells),
                           "" if c.tolerance is None else f"{c.tolerance:.3g}", html_text(c.detail)])
        head, n_out, tail = head_and_tail(_Rows(self.terms, self.rows), max_rows)
        gap = [[html_text(f"⋯ {n_out:,} terms left out"), "", "", "", ""]] if n_out else []
        terms = [[html_text(cell) if cell != "FAIL" else "<b>FAIL</b>" for cell in row] for row in head] + gap + \
            [[html_text(cell) if cell != "FAIL" else "<b>FAIL</b>" for cell in row] for row in tail]
        size = f"batch {self.n_batch} x {self.n_pos} positions, {len(self.terms):,} terms, {order}, " \
            f"{self.dtype} on {self.device}"
        return "\n".join([
            f"<p><b>verify {html_text(self.target)}</b> of {html_text(self.model)}: <b>{verdict}</b></p>",
            f"<p>{html_text(size)}</p>",
            html_table(["check", "result", "max abs error", "relative", "tolerance", "detail"], checks, right=[2, 3, 4]),
            *[f"<p>note: {html_text(n)}</p>" for n in self.notes],
            html_table(["term", "order", "norm", "max abs error", "ok"], terms, right=[1, 2, 3]),
        ])


class _Rows(Sequence):
    """A report's table rows, made only when read (a notebook shows the first and last of millions):
    ``make(terms)`` gives the rows of a list of terms."""

    def __init__(self, terms: Sequence[TermResult], make):
        self.terms, self.make = terms, make

    def __len__(self) -> int:
        return len(self.terms)

    def __getitem__(self, i):
        return self.make(self.terms[i]) if isinstance(i, slice) else self.make([self.terms[i]])[0]


_CHECK_TITLES = {
    "sum": "1. sum of all terms = model",
    "isolation": "2. each term = its path isolated in the model",
    "truncation": "3. model - kept terms = omitted terms",
}


ROWS_AT_ONCE = 4096  # terms made into a report's rows at a time when it is written out (JSON or text)
_TERM_FIELDS = tuple(f.name for f in fields(TermResult))


def _term_data(term: TermResult) -> dict:
    """``strict_json(asdict(term))``, without asdict's deep copy (a report may write millions)."""
    return strict_json({name: getattr(term, name) for name in _TERM_FIELDS})


def strict_json(value):
    """``value`` as strict JSON data: a float that is not finite (a quantity that does not
    apply, such as a 0-layer model's composition) becomes ``null``, never ``NaN``.

    >>> strict_json({"a": [1.0, float("nan")]})
    {'a': [1.0, None]}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value
