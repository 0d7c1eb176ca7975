"""Tests for numeric_check.reports.analysis: analyses gathered, the paper's findings judged, the report written.

A hand-built 2-layer model with an exact previous-token head (L0H0) and an exact
induction head (L1H0) must bear out every finding; a random model must not.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.errors import AnalysisError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.reports.analysis import analyze_model, data_config_for
from numeric_check.reports.findings import findings
from numeric_check.reports.latex import latex_escape
from numeric_check.reports.report import REPORT_FILES, Report, write_report
from tensoralg.escape import escape_text
from tests.conftest import needs_pdflatex
from tests.helpers import copying_model, exact_induction_model

pytestmark = pytest.mark.slow  # full model analyses: left out by pytest -m "not slow"

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def induction_analysis():
    return analyze_model(exact_induction_model(), name="handmade", n_sequences=16)


@pytest.fixture(scope="module")
def control_analysis():
    return analyze_model(copying_model(), name="control", n_sequences=16)


def test_hand_built_induction_model_bears_out_every_finding(induction_analysis, control_analysis):
    rows = findings(induction_analysis, control_analysis)
    failed = [(f.claim, f.measured) for f in rows if not f.holds]
    assert not failed
    claims = " / ".join(f.claim for f in rows)
    for phrase in ("previous-token head (by behaviour)", "previous-token head (by weights)", "induction heads (by weights)",
                   "K-composition", "Q-composition", "V-composition", "same-match", "1-layer control cannot do induction"):
        assert phrase in claims
    heads = induction_analysis.heads
    assert heads.by_behaviour.previous_token == heads.by_weights.previous_token == ((0, 0),)
    assert heads.by_behaviour.induction == heads.by_weights.induction == ((1, 0),)


def test_measured_figures_are_exact_for_the_hand_built_model(induction_analysis):
    a = induction_analysis
    assert float(a.copying[1, 0]) == pytest.approx(1.0)
    assert float(a.composition["Q"][0, 0, 1, 0]) == pytest.approx(0.0, abs=1e-12)
    assert float(a.composition["V"][0, 0, 1, 0]) == pytest.approx(0.0, abs=1e-12)
    # W_QK W_OV = Id on tokens: ||Id_V|| / (||W_QK|| ||Id_V||), where W_QK also holds key 0's
    # column of -1s (as large as Id_V): 1 / sqrt(2 V)
    assert float(a.composition["K"][0, 0, 1, 0]) == pytest.approx((2 * 48) ** -0.5)
    assert a.losses["repeat_loss"] < 0.5 * a.losses["uniform_loss"]
    assert a.top_head == (1, 0)
    # issue 19: no skip-trigram tables for a previous-token or induction head (their token QK
    # circuit is not how they attend); here both heads are, so none, and a note says why
    assert a.skip_trigram_head is None and a.skip_trigrams == []
    assert any(note.startswith("no skip-trigram tables") for note in a.notes)


def test_random_model_fails_the_induction_findings():
    model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=16, d_head=4, d_vocab=20, n_ctx=16, seed=3, device="cpu")
    rows = {f.claim: f.holds for f in findings(analyze_model(model, n_sequences=8))}
    assert not rows["layer 0 has a previous-token head (by behaviour)"]
    assert not rows["a later layer has induction heads (by behaviour)"]
    assert not rows["weights and behaviour find the same previous-token and induction heads"]


def test_control_must_have_one_layer(induction_analysis):
    with pytest.raises(AnalysisError, match="the control must be a 1-layer model; 'handmade' has 2 layers"):
        findings(induction_analysis, induction_analysis)


def test_data_config_is_fitted_to_the_model():
    model = CircuitModel.random(Architecture(1, 1), d_model=4, d_head=2, d_vocab=7, n_ctx=10, device="cpu")
    config = data_config_for(model)
    assert (config.d_vocab, config.n_ctx, config.seg_max) == (7, 10, 5)
    tiny = CircuitModel.random(Architecture(1, 1), d_model=4, d_head=2, d_vocab=7, n_ctx=3, device="cpu")
    with pytest.raises(AnalysisError, match="need n_ctx >= 4"):
        data_config_for(tiny)
    record = {"train_config": {"d_vocab": 9, "n_ctx": 10, "seg_min": 2, "seg_max": 5}}
    with pytest.raises(AnalysisError, match="do not match the model"):
        analyze_model(model, training=record)


def test_vocab_of_wrong_length_is_rejected():
    model = CircuitModel.random(Architecture(1, 1), d_model=4, d_head=2, d_vocab=7, n_ctx=10, device="cpu")
    with pytest.raises(AnalysisError, match="vocab has 3 entries but the model's d_vocab is 7"):
        analyze_model(model, vocab=["a", "b", "c"])


def test_latex_escape():
    assert latex_escape("a_b & 50% {x} #1 ~ ^ \\") == r"a\_b \& 50\% \{x\} \#1 \textasciitilde{} \textasciicircum{} \textbackslash{}"


def test_report_with_token_strings_escapes_them(tmp_path):
    model = copying_model(d_vocab=24, n_ctx=12)  # a head that attends by token: it gets skip-trigram tables
    vocab = [f"t{i}" for i in range(24)]
    vocab[0], vocab[1] = "a_b&c", "50% | $x$"
    analysis = analyze_model(model, name="tok_model", n_sequences=4, vocab=vocab)
    assert analysis.skip_trigram_head == (0, 0)
    tex = Report.of(analysis).latex()
    assert r"\texttt{a\_b\&c} (0)" in tex and "tok\\_model" in tex
    assert "a_b&c" not in tex
    markdown = Report.of(analysis).markdown()
    # Markdown: no maths, HTML entity or table cell can start in a token string
    assert '"50% \\| \\$x\\$" (1)' in markdown or '"a\\_b&amp;c" (0)' in markdown
    assert "$x$" not in markdown


def test_write_report_writes_markdown_latex_json_and_figures(tmp_path, induction_analysis, control_analysis):
    paths = write_report(induction_analysis, tmp_path, control=control_analysis, formats=["png"])
    names = sorted(p.relative_to(tmp_path).as_posix() for p in paths)
    # issue 20: every file REPORT_FILES lists, index.html included (it was written apart, by the CLI)
    assert names == ["analysis.json", "figures/composition.png", "figures/importance.png", "figures/positivity.png",
                     "figures/profiles.png", "index.html", "report.md", "tables.tex"]
    assert {p.name for p in paths if p.parent == tmp_path} == set(REPORT_FILES)
    report = (tmp_path / "report.md").read_text()
    for heading in ("## Findings", "## Heads", "## Composition scores", "## Previous-token and induction heads",
                    "## Term importance by order", "## Control: control"):
        assert heading in report
    assert "Skip-trigrams" not in report and "Note: no skip-trigram tables" in report  # its heads attend by position
    assert "![composition](figures/composition.png)" in report
    data = json.loads((tmp_path / "analysis.json").read_text())
    assert data["heads"]["by_behaviour"]["induction"] == ["L1H0"]
    assert all(f["holds"] for f in data["findings"])
    assert data == json.loads(json.dumps(Report.of(induction_analysis, control_analysis).to_dict()))


@needs_pdflatex
def test_latex_tables_compile(tmp_path, induction_analysis, control_analysis):
    body = Report.of(induction_analysis, control_analysis).latex()
    document = "\\documentclass{article}\n\\begin{document}\n" + body + "\n\\end{document}\n"
    (tmp_path / "tables.tex").write_text(document)
    result = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "tables.tex"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]


def test_shipped_models_bear_out_the_papers_findings():
    """The models trained by train-toy and shipped in numeric_check/data (see their JSON records)."""
    from numeric_check.model.checkpoint import load_checkpoint
    from numeric_check.training.toy import shipped_checkpoint, training_record_for

    analyses = {}
    for layers in (2, 1):
        path = shipped_checkpoint(layers)
        assert path.stat().st_size < 1_000_000, f"{path.name} should stay under a megabyte"  # d_model 256 in float16: 690 KB
        record = training_record_for(path)
        assert record is not None and record["train_config"]["n_layers"] == layers
        analyses[layers] = analyze_model(load_checkpoint(path), name=path.stem, training=record, n_sequences=32)
    rows = {f.claim: f for f in findings(analyses[2], analyses[1])}
    expected = [
        "layer 0 has a previous-token head (by behaviour)",
        "layer 0 has a previous-token head (by weights)",
        "a later layer has induction heads (by behaviour)",
        "a later layer has induction heads (by weights)",
        "weights and behaviour find the same previous-token and induction heads",
        "induction heads copy (OV positivity near 1)",
        "induction heads same-match (K-composition circuit positivity near 1)",
        "K-composition with the previous-token head is above the random baseline",
        "Q-composition with the previous-token head is not above the baseline",
        "V-composition with the previous-token head is not above the baseline",
        "the 2-layer model does induction (loss on repeated tokens far below uniform)",
        "the 1-layer control's heads copy (OV eigenvalue positivity clearly positive)",
        # issue 27: the loss on the training data's repeated tokens is no longer a test of induction for the control
        # (the data's bigram table and planted skip-trigrams make repeats partly predictable without it: 2.18 nats,
        # under the bar of half ln 128), so with a grid it is not judged; the repeats of random tokens by length and
        # offset below are, and the control fails them
        # issue 12: across the whole context, not on average
        "at every query position 1–59, a previous-token head attends to i-1",  # issue 19: the range is named
        "at every query position 8–63 of a repeat, one of the induction heads attends inductively",
        "the 2-layer model does induction at every length and offset (loss on the second copy of a repeat)",
        "the 1-layer control cannot do induction at any length or offset (loss on the second copy of a repeat)",
    ]
    failed = [(claim, rows[claim].measured) for claim in expected if not rows[claim].holds]
    assert not failed
    assert "the 1-layer control cannot do induction (loss on repeated tokens stays high)" not in rows
    # each form of the 1-layer rule fails on a model that does induction (the 2-layer model in its place)
    import dataclasses

    from numeric_check.reports.findings import _one_layer_findings

    for analysis in (analyses[2], dataclasses.replace(analyses[2], grid=None)):
        verdicts = {f.claim: f.holds for f in _one_layer_findings(analysis, "control")}
        induction = [claim for claim in verdicts if "cannot do induction" in claim]
        assert len(induction) == 1 and not verdicts[induction[0]], verdicts
        assert ("at any length or offset" in induction[0]) == (analysis.grid is not None)
    assert analyses[1].losses["repeat_loss"] > analyses[2].losses["repeat_loss"] + 1.5  # 2.18 against 0.38
    # issue 19: skip-trigram tables for a layer-0 head that is not the previous-token head
    head = analyses[2].skip_trigram_head
    assert head[0] == 0 and head not in analyses[2].heads.by_behaviour.previous_token
    assert shipped_checkpoint(0).exists()


def test_large_models_are_evaluated_on_capped_sequences_and_skip_term_importance_with_a_note(monkeypatch, tmp_path):
    import numeric_check.reports.analysis as report
    from numeric_check.errors import NumericCheckError

    model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=12, n_ctx=300, device="cpu")
    assert data_config_for(model).n_ctx == report.DATA_N_CTX

    def too_big(*args, **kwargs):
        raise NumericCheckError("25 paths would hold too many logits")

    monkeypatch.setattr(report, "term_importance", too_big)
    analysis = analyze_model(model, n_sequences=2)
    assert analysis.importance is None and analysis.notes == ["term importance skipped: 25 paths would hold too many logits"]
    assert analysis.top_head in set(model.arch.heads())
    assert not any("virtual heads" in f.claim for f in findings(analysis))
    write_report(analysis, tmp_path, formats=["svg"])
    assert "Note: term importance skipped" in (tmp_path / "report.md").read_text()


# -- one escaper (issue 9) ---------------------------------------------------------------------------


def test_report_text_goes_through_the_one_escaper():
    from numeric_check.reports.markdown import findings_markdown
    from numeric_check.reports.findings import Finding
    from numeric_check.circuits.skip_trigrams import token_label

    assert latex_escape("h ≠ k, σ") == r"h $\neq$ k, $\sigma$"  # regression: no other symbol, no code point
    label = token_label(3, "<img src=x onerror=alert(1)>")
    assert "<" not in label and "&lt;img" in label
    md = findings_markdown([Finding("a <b>claim</b>", "x | y", True)])
    assert "<b>" not in md and "x \\| y" in md


# -- a claim names its range or does not hold (issue 19) ---------------------------------------------


def _profile_analysis(previous, induction):
    from types import SimpleNamespace
    from numeric_check.circuits.behaviour import PositionProfile

    profile = PositionProfile(torch.tensor(previous, dtype=torch.float64), torch.tensor(induction, dtype=torch.float64), 2)
    return SimpleNamespace(heads=SimpleNamespace(behaviour=SimpleNamespace(profile=profile)))


def test_an_across_context_claim_names_the_positions_it_covers_and_leaves_out():
    from numeric_check.reports.findings import _across_context

    nan = float("nan")
    # 12 positions: a previous-token head good at 1-7 (12 - MIN_REPEAT - 1) and failing at 8-11
    previous = [[[nan] + [0.9] * 7 + [0.0] * 4]]
    a = _profile_analysis(previous, [[[nan] * 12]])
    f = _across_context(a, "previous_token", [(0, 0)], "at every query position {positions}, a previous-token head attends to i-1")
    assert f.claim == "at every query position 1–7, a previous-token head attends to i-1" and f.holds
    assert "positions 8–11 serve only repeats shorter than 4 tokens and are not claimed" in f.measured


def test_heads_that_share_the_context_hold_only_as_a_group_and_say_so():
    from numeric_check.reports.findings import _across_context

    nan = float("nan")
    induction = [[[nan] * 4 + [0.9, 0.9, 0.3, 0.3], [nan] * 4 + [0.3, 0.3, 0.9, 0.9]]]
    a = _profile_analysis([[[nan] * 8, [nan] * 8]], induction)
    claim = "at every query position {positions} of a repeat, one of the induction heads attends inductively"
    f = _across_context(a, "induction", [(0, 0), (0, 1)], claim)
    assert f.holds and f.claim.startswith("at every query position 4–7 of a repeat, one of")
    assert "each head alone: L0H0 mean 0.60, min 0.30" in f.measured  # a single head's minimum below the bar is shown
    alone = _across_context(a, "induction", [(0, 0)], claim)
    assert not alone.holds and "best head's lowest 0.30" in alone.measured


# -- one home for a model's report (issue 20) --------------------------------------------------------


def test_a_report_computes_its_findings_once_for_every_format(monkeypatch, tmp_path, induction_analysis, control_analysis):
    import numeric_check.reports.report as report_module

    calls = []
    real = report_module.findings
    monkeypatch.setattr(report_module, "findings", lambda *args: calls.append(args) or real(*args))
    report = Report.of(induction_analysis, control_analysis)
    written = report.write(tmp_path, formats=["svg"])
    assert len(calls) == 1 and report.verdict == f"{len(report.findings)}/{len(report.findings)} findings hold"
    claims = [f.claim for f in report.findings]
    markdown, html = (tmp_path / "report.md").read_text(), (tmp_path / "index.html").read_text()
    data = json.loads((tmp_path / "analysis.json").read_text())
    assert [f["claim"] for f in data["findings"]] == claims
    assert all(escape_md(c) in markdown and escape_text(c, "html") in html for c in claims)
    assert len(written) == len(REPORT_FILES) + 4  # and 4 figures (no training curve for a hand-built model)


def escape_md(text: str) -> str:
    return escape_text(text, "markdown")


def test_write_report_takes_a_report_or_an_analysis_and_refuses_a_second_control(tmp_path, induction_analysis,
                                                                                  control_analysis):
    report = Report.of(induction_analysis, control_analysis)
    with pytest.raises(AnalysisError, match="already holds its control"):
        write_report(report, tmp_path, control=control_analysis)
    with pytest.raises(AnalysisError, match="ModelAnalysis"):
        Report.of("not an analysis")
    assert report._repr_markdown_() == report.markdown()


def test_an_analysis_says_each_stage_as_it_starts():
    """``tcircuits analyze`` shows these on a terminal while it works (it showed nothing for 18 s)."""
    model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=12, n_ctx=16,
                                seed=0, device="cpu")
    steps: list[str] = []
    analyze_model(model, n_sequences=4, progress=steps.append)
    assert steps == ["losses, copying and QK circuits", "composition scores", "previous-token and induction heads",
                     "the loss on repeats across the context", "term importance"]
