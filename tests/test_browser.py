"""HTML pages in a real browser: headless Chromium lays out the MathML of a derivation and the
analysis page, and the test checks what a reader would see (skipped where Chromium is absent).

The measuring script is added to a copy of the page for the test only (the pages themselves
carry no script); it writes what the browser laid out into the DOM, which ``--dump-dom`` prints.
"""

import json
import re
import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--window-size=1200,2000"]

MEASURE = """<script>
window.addEventListener('load', function () {
  const box = e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const maths = [...document.querySelectorAll('math')];
  // a superscript laid out as MathML sits above its base; as inline text it would not
  const raised = [...document.querySelectorAll('msup, msubsup')].slice(0, 20).map(m =>
      m.lastElementChild.getBoundingClientRect().top < m.firstElementChild.getBoundingClientRect().top);
  const closed = [...document.querySelectorAll('details')].map(d => box(d)[1]);
  const images = [...document.images].map(i => [i.getAttribute('src'), i.naturalWidth, box(i)[0]]);
  // a derivation block that scrolls (a scrollbar beside every block, issue 19): content beyond its box
  const scrolling = [...document.querySelectorAll('.lines')].filter(e =>
      e.scrollHeight > e.clientHeight + 1 || e.scrollWidth > e.clientWidth + 1).map(e => [e.scrollHeight, e.clientHeight]);
  const result = {maths: maths.map(box), raised, closed, images, scrolling,
                  merror: document.querySelectorAll('merror').length,
                  text: document.body.innerText.length, height: document.body.scrollHeight,
                  width: document.documentElement.scrollWidth};
  const out = document.createElement('pre'); out.id = 'measured'; out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script>"""


def browse(tmp_path, page: str, name: str = "page.html", screenshot: bool = True) -> dict:
    """Open ``page`` (written as ``tmp_path/name``) in Chromium; return the measurements."""
    path = tmp_path / name
    path.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    profile = tmp_path / "profile"
    run = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=5000",
                          "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="measured">(.*?)</pre>', run.stdout, re.DOTALL)
    assert found, f"Chromium printed no measurements (exit {run.returncode}): {run.stderr[-2000:]}"
    measured = json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
    if screenshot:  # what a person would see: the page is not blank
        png = tmp_path / (path.stem + ".png")
        subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}", path.as_uri()],
                       capture_output=True, timeout=120)
        measured["ink"] = ink(png)
    return measured


def ink(png) -> float:
    """The fraction of the screenshot's pixels that differ clearly from its background colour."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(png).convert("L"), dtype=np.int16)
    values, counts = np.unique(pixels, return_counts=True)
    background = values[counts.argmax()]
    return float((np.abs(pixels - background) > 40).mean())


def assert_readable(measured: dict, min_maths: int) -> None:
    assert measured["merror"] == 0
    assert len(measured["maths"]) >= min_maths
    assert all(w > 0 and h > 0 for w, h in measured["maths"]), [m for m in measured["maths"] if min(m) <= 0]
    assert measured["raised"] and all(measured["raised"])  # laid out as MathML, not as a line of text
    assert measured["text"] > 200 and measured["height"] > 400
    assert measured["width"] <= 1200  # nothing runs off the page sideways
    assert measured["ink"] > 0.01


@pytest.mark.parametrize("name, index_from", [("two-layer-qk", 0), ("induction-mechanism", 1), ("rotary", 0)])
def test_derivation_page_renders(tmp_path, name, index_from):
    from derivations import catalogue
    from derivations.html import html_document

    measured = browse(tmp_path, html_document(catalogue.get(name), index_from=index_from))
    assert_readable(measured, min_maths=10)
    assert measured["scrolling"] == []  # no block scrolls (its maths' depth gave each a vertical scrollbar)


def test_expanded_sum_folds_in_the_browser(tmp_path):
    from derivations.expansion import expansion
    from derivations.html import html_document

    d = expansion("(Id ⊗ W_U)(Id + A^2 ⊗ W_OV^2 + A^3 ⊗ W_OV^3)(Id + A^0 ⊗ W_OV^0 + A^1 ⊗ W_OV^1)"
                  "(Id + B ⊗ C + D ⊗ F)(Id ⊗ W_E)")
    measured = browse(tmp_path, html_document(d, max_terms=None))
    assert_readable(measured, min_maths=10)
    assert measured["closed"] and all(h < 40 for h in measured["closed"])  # folded: one summary line each


def test_analysis_page_renders_with_its_figures(tmp_path):
    import torch

    from derivations.architecture import Architecture
    from numeric_check.model.circuit_model import CircuitModel
    from numeric_check.reports.analysis import analyze_model
    from numeric_check.reports.report import Report

    torch.manual_seed(0)
    model = CircuitModel.random(Architecture(2, 2, positional="qk_only"), d_model=8, d_head=4, d_vocab=12, n_ctx=16, device="cpu")
    analysis = analyze_model(model, name="random <2l>", n_sequences=4)
    Report.of(analysis).write(tmp_path, formats=("svg",))
    measured = browse(tmp_path, (tmp_path / "index.html").read_text(encoding="utf-8"), name="index.html")
    assert_readable(measured, min_maths=8)
    assert measured["images"], "no figures on the page"
    for src, natural, shown in measured["images"]:
        assert natural > 0 and shown > 100, src  # the figure loaded and shows at a readable size


def test_the_attention_page_draws_every_head_and_the_chosen_one_large(tmp_path):
    """tcircuits attention's page (issues 46 and 56) in Chromium: a map per head, named as everywhere, the first head
    large with its tokens boxed and no blank band above it, a colour legend, the page titled by the model's file name,
    and the token view: pointing at a token colours those before it by its weights in the head shown, and a click on
    another head recolours them with that head's."""
    from derivations.cli import main

    out = tmp_path / "att.html"
    assert main(["attention", "--checkpoint", "numeric_check/data/kjv_2l.safetensors", "--text",
                 "And God said, Let there be light: and there was light.", "-o", str(out), "--index-from", "1"]) == 0
    page = out.read_text(encoding="utf-8")
    probe = """<script>window.addEventListener('load', function () {
      const figs = [...document.querySelectorAll('.tc-grid figure')];
      const big = document.querySelector('.tc-large canvas'), bar = document.querySelector('.tc-legend .tc-bar');
      const spans = () => [...document.querySelectorAll('.tc-token')];
      const weights = () => spans().map(s => s.dataset.weight === '' ? null : Number(s.dataset.weight));
      const point = (k) => spans()[k].dispatchEvent(new MouseEvent('mouseenter'));
      const title = document.querySelector('.tc-large h3').textContent;
      point(5); const head0 = weights(), later0 = spans().map(s => s.classList.contains('tc-later'));
      figs[3].click(); const head3 = weights(), title3 = document.querySelector('.tc-large h3').textContent;
      point(spans().length - 1); const last3 = weights();
      const legend = document.querySelector('.tc-legend');
      const p = document.createElement('pre'); p.id = 'heads'; p.style.display = 'none';
      p.textContent = JSON.stringify({n: figs.length, names: figs.map(f => f.innerText), big: [big.width, big.height],
        title, h1: document.querySelector('h1').textContent,
        gap: big.getBoundingClientRect().top - legend.getBoundingClientRect().bottom,
        legend: legend.innerText, gradient: getComputedStyle(bar).backgroundImage, bar: bar.getBoundingClientRect().width,
        tokens: spans().map(s => s.textContent), border: getComputedStyle(spans()[3]).borderTopStyle,
        said: document.querySelector('.tc-said').textContent, head0, later0, head3, title3, last3});
      document.body.appendChild(p); });</script>"""
    measured = browse(tmp_path, page.replace("</body>", probe + "</body>"))
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'p2'}", "--virtual-time-budget=5000", "--dump-dom",
                          (tmp_path / "page.html").as_uri()], capture_output=True, text=True, timeout=120).stdout
    heads = json.loads(re.search(r'<pre id="heads"[^>]*>(.*?)</pre>', dom, re.DOTALL).group(1).replace("&amp;", "&")
                       .replace("&lt;", "<").replace("&gt;", ">"))
    assert heads["n"] == 24 and heads["names"][:2] == ["L1H0", "L1H1"] and heads["names"][-1] == "L2H11"
    assert heads["title"] == "L1H0" and min(heads["big"]) > 200
    assert heads["h1"] == "Attention patterns: kjv_2l.safetensors"  # the file's name, not the path to it
    n = len(heads["tokens"])
    assert heads["big"][1] - n * 24 < 100 and 0 <= heads["gap"] < 30  # labels as tall as the longest, no band above
    assert "attention weight" in heads["legend"] and "0" in heads["legend"] and "1" in heads["legend"]
    assert "linear-gradient" in heads["gradient"] and heads["bar"] > 100
    assert heads["border"] == "solid" and "," in heads["tokens"] and any(t.startswith("\u2423") for t in heads["tokens"])
    # position 5 attends to positions 0..5 only, its weights summing to 1; later tokens greyed
    assert all(w is not None for w in heads["head0"][:6]) and heads["head0"][6:] == [None] * (n - 6)
    assert heads["later0"] == [False] * 6 + [True] * (n - 6) and abs(sum(heads["head0"][:6]) - 1) < 1e-3
    assert heads["title3"] == "L1H3" and heads["head3"] != heads["head0"] and abs(sum(heads["head3"][:6]) - 1) < 1e-3
    assert None not in heads["last3"] and abs(sum(heads["last3"]) - 1) < 1e-3 and "L1H3" in heads["said"]
    assert measured["width"] <= 1200 and measured["ink"] > 0.01
