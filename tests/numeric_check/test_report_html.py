"""The analysis report as a web page: every section, escaped names and tokens, figures beside it."""

import html
import re

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.checkpoint import save_checkpoint
from numeric_check.reports.analysis import analyze_model
from numeric_check.reports.findings import findings
from tensoralg.escape import escape_text
from numeric_check.reports.html import FIGURES
from numeric_check.reports.report import Report

pytestmark = pytest.mark.slow  # full model analyses: left out by pytest -m "not slow"

HOSTILE = "<script>alert(1)</script>&amp;"


@pytest.fixture(scope="module")
def analyses():
    torch.manual_seed(0)
    model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=12, n_ctx=16, device="cpu")
    control = CircuitModel.random(Architecture(1, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=12, n_ctx=16, device="cpu")
    vocab = [HOSTILE if i == 0 else f"tok{i}" for i in range(12)]
    a = analyze_model(model, name=HOSTILE, n_sequences=4, vocab=vocab)
    return a, analyze_model(control, name="control<1l>", n_sequences=4)


def test_page_has_every_section(analyses):
    a, control = analyses
    page = Report.of(a, control).html()
    for heading in ("Findings", "Heads and their circuits", "Composition scores", "Previous-token and induction heads",
                    "Term importance by order", "Control: control&lt;1l&gt;"):
        assert f"<h2>{heading}" in page, heading
    assert page.count("does not hold") + page.count(">holds<") == len(findings(a, control))
    # each head's OV and QK circuits as MathML, with its numbers
    for label in ("L0H0", "L0H1", "L1H0", "L1H1"):
        assert f"<td>{label}</td>" in page
    assert page.count("<math") == 2 * (4 + 2)  # OV and QK circuit of each head, model and control
    assert "\\" not in "".join(re.findall(r"<math.*?</math>", page))


def test_names_and_token_strings_are_escaped(analyses):
    a, _ = analyses
    page = Report.of(a).html()
    body = page.split("<body>", 1)[1]
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&amp;amp;" in body  # the name, shown as typed
    assert not re.search(r"<(?!/?(main|h1|h2|p|em|figure|img|figcaption|table|caption|thead|tbody|tr|th|td|span|code|"
                         r"footer|math|mrow|mi|mo|mn|msup|msub|msubsup|mtext|mspace)\b)[a-z]", body)


def test_the_page_shows_the_figures_written_with_it_svg_first(tmp_path, analyses):
    a, control = analyses
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "training.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")  # stale: not linked
    Report.of(a, control).write(tmp_path, formats=["png", "svg"])
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert '<img src="figures/positivity.svg"' in page and '<img src="figures/composition.svg"' in page
    assert "figures/training" not in page
    assert escape_text(FIGURES["positivity"], "html") in page
    Report.of(a, control).write(tmp_path / "png", formats=["png"])
    assert '<img src="figures/positivity.png"' in (tmp_path / "png" / "index.html").read_text(encoding="utf-8")


def test_analyze_cli_writes_index_html(tmp_path, capsys):
    from derivations.cli import main
    from tests.helpers import exact_induction_model

    checkpoint = tmp_path / "m<2l>.safetensors"
    save_checkpoint(exact_induction_model(d_vocab=32, n_ctx=16), checkpoint)
    out = tmp_path / "report"
    assert main(["analyze", "--checkpoint", str(checkpoint), "--out", str(out), "--sequences", "4", "--figure-formats", "svg"]) == 0
    assert "index.html" in capsys.readouterr().out
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "<h1>Circuit analysis: m&lt;2l&gt;</h1>" in page
    sources = re.findall(r'<img src="([^"]+)"', page)
    assert sources and all((out / s).is_file() and s.endswith(".svg") for s in sources)


def test_marginal_loss_is_said_to_be_the_change_when_a_term_is_added(analyses):
    """Issue 19: the page said "removed" while the numbers are the change when a term is added
    (negative: it helps), the sign of the paper's table and of ImportanceReport."""
    page = Report.of(analyses[0]).html()
    assert "when a term is removed" not in page
    assert "when a term is added to the terms of its order and below (negative: it helps)" in page
