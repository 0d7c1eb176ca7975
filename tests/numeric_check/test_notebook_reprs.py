"""What verification reports and analysis results show in a notebook."""

from __future__ import annotations

import torch

import numeric_check as nc
from numeric_check.reports.findings import Finding
from numeric_check.verification.results import CheckResult, TermResult, VerifyReport


def _report(n_terms: int, label: str = "tok→L0H{i}", passed: bool = True) -> VerifyReport:
    terms = [TermResult(label.format(i=i), "tok", ((0, i),), 1, norm=1.0 + i, max_abs_error=1e-16, passed=passed)
             for i in range(n_terms)]
    checks = [CheckResult("sum", passed, 2e-15, 3e-16, 1e-9, ""), CheckResult("truncation", None, None, None, None, "no term omitted")]
    return VerifyReport("logits", "a <b>model</b>", 2, 8, None, "float64", "cpu", passed, 2e-15, 3e-16, 6.0, terms, checks)


def test_a_real_report_shows_verdict_checks_and_terms():
    model = nc.load_checkpoint(nc.shipped_checkpoint(1))
    report = nc.verify_logits(model, torch.zeros(1, 6, dtype=torch.long))
    shown = report._repr_markdown_()
    assert shown.startswith("**verify logits**") and "**PASSED**" in shown
    assert "| 1\\. sum of all terms = model | PASS |" in shown  # "1\." (issue 19: was "\1.", shown as typed)
    assert all(t.label in shown for t in report.terms)


def test_a_long_report_shows_head_and_tail_and_the_count_left_out():
    shown = _report(3_000)._repr_markdown_(max_rows=10)
    assert "⋯ 2,990 terms left out" in shown and "tok→L0H0 " in shown and "tok→L0H2999 " in shown
    assert "tok→L0H5 " not in shown and len(shown) < 3_000


def test_a_failed_report_and_hostile_labels():
    shown = _report(2, label="<script>alert({i})</script>", passed=False)._repr_markdown_()
    assert "**FAILED**" in shown and "**FAIL**" in shown and "skipped" in shown
    assert "<script>" not in shown and "<b>" not in shown and "&lt;script&gt;" in shown


def test_a_finding_escapes_its_text():
    shown = Finding("heads <i>copy</i>", "score 0.9 > 0.5", False)._repr_markdown_()
    assert shown == "heads &lt;i&gt;copy&lt;/i&gt;: **does not hold** (score 0.9 &gt; 0.5)"


def test_a_head_report_renders_its_table():
    heads = nc.detect_heads(nc.load_checkpoint(nc.shipped_checkpoint(1)), batch=4)
    assert heads._repr_markdown_() == heads.to_markdown() and heads.to_markdown().startswith("| head |")


def test_a_report_as_html_shows_head_and_tail_and_escapes_labels():
    shown = _report(3_000, label="<i>tok</i>→L0H{i}")._repr_html_(max_rows=10)
    assert "<b>PASSED</b>" in shown and "⋯ 2,990 terms left out" in shown and "L0H2999" in shown
    assert "<i>" not in shown and "&lt;i&gt;tok&lt;/i&gt;" in shown and "a &lt;b&gt;model" in shown
    assert shown.count("<tr>") == 1 + 2 + 1 + 10 + 1  # two headers, two checks, 10 terms and the gap


def test_an_analysis_shows_its_heads_and_a_report_its_findings_too():
    """Issue 20: the analysis no longer renders the report (that needed findings: an import
    circle); it shows its losses and heads, and ``Report.of(analysis)`` shows everything."""
    from derivations.architecture import Architecture
    from numeric_check.model.circuit_model import CircuitModel
    from numeric_check.reports.analysis import analyze_model
    from numeric_check.reports.report import Report

    model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=12, n_ctx=16, device="cpu")
    analysis = analyze_model(model, name="m<1>", n_sequences=2)
    shown = analysis._repr_markdown_()
    assert shown.startswith("Analysis of m&lt;1&gt; (2 layers x 2 heads") and "| L1H1 |" in shown
    assert "## Findings" in Report.of(analysis)._repr_markdown_()
