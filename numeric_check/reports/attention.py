"""Every head's attention pattern on a prompt, as a page a person looks at: tokens on both axes, one small
map per head (named as everywhere else: ``L0H3``, or ``L1H3`` with layers from 1), and the head clicked shown
large with its weights. One self-contained HTML file (the data inline, a few lines of script, no network),
and the same view in Jupyter (:meth:`AttentionPatterns._repr_html_`).

>>> from derivations import Architecture
>>> from numeric_check.model.circuit_model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=6)
>>> view = attention_patterns(model, [1, 2, 3, 1], ["a", "b", "c", "a"])
>>> view.heads, view.patterns.shape
(['L0H0', 'L0H1', 'L1H0', 'L1H1'], (2, 2, 4, 4))
>>> "<canvas" in view._repr_html_()
True
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from derivations.architecture import head_label
from derivations.html import page
from tensoralg.escape import escape_text

from numeric_check.errors import AnalysisError


@dataclass
class AttentionPatterns:
    """``patterns[layer, head, query, key]`` (float, rows summing to 1) on a prompt of ``tokens`` (their strings);
    ``index_from`` numbers the layers in the labels (0: TransformerLens, 1: the paper); ``title`` names the model."""

    patterns: np.ndarray
    tokens: list[str]
    index_from: int = 0
    title: str = "attention"
    notes: list[str] = field(default_factory=list)

    @property
    def heads(self) -> list[str]:
        n_layers, n_heads = self.patterns.shape[:2]
        return [head_label(l + self.index_from, h) for l in range(n_layers) for h in range(n_heads)]

    def _data(self) -> str:
        rounded = np.round(self.patterns.astype(np.float64), 4)
        data = {"tokens": self.tokens, "heads": self.heads, "n_heads": int(self.patterns.shape[1]),
                "patterns": rounded.reshape(-1, *self.patterns.shape[2:]).tolist()}
        return json.dumps(data, ensure_ascii=True).replace("</", "<\\/")  # never ends the script element

    def fragment(self) -> str:
        """The view as an HTML fragment (a ``div`` and its script), ids of its own so several can share a page:
        the heads small, the chosen one large with a colour legend, and its tokens coloured by how much the
        token you point at attends to each."""
        key = "att" + uuid.uuid4().hex[:8]
        notes = "".join(f"<p class='note'>{escape_text(n, 'html')}</p>" for n in self.notes)
        legend = ("<div class='tc-legend'><span>attention weight</span><span class='tc-scale'>0</span>"
                  "<span class='tc-bar' title='0 (white) to 1 (blue)'></span><span class='tc-scale'>1</span>"
                  "<span class='tc-masked'></span><span>a later position (masked)</span></div>")
        return (f"<div id='{key}' class='tc-attention'>{notes}<div class='tc-grid'></div>"
                f"<p class='tc-hint'>Click a head to see it large; hover a cell for its weight. Tokens are boxed, "
                f"a space shown as ␣ and a new line as ⏎.</p>"
                f"<div class='tc-large'><h3></h3>{legend}<canvas width='10' height='10'></canvas>"
                f"<p class='tc-cell'>&nbsp;</p></div>"
                f"<div class='tc-tokens'><h3>Tokens</h3><p class='tc-hint'>Point at (or click) a token: the tokens "
                f"before it are coloured by how much it attends to each, in the head shown above.</p>"
                f"<div class='tc-text'></div><p class='tc-said'>&nbsp;</p></div>"
                f"<style>{_CSS}</style><script>({_SCRIPT})(document.getElementById('{key}'), {self._data()});</script></div>")

    def _repr_html_(self) -> str:
        return self.fragment()

    def to_html(self) -> str:
        """A complete page that works offline."""
        body = (f"<h1>Attention patterns: {escape_text(self.title, 'html')}</h1>"
                f"<p>{len(self.heads)} heads on {len(self.tokens)} tokens; row: the position attending (query), column: "
                "the position attended to (key); darker is more attention.</p>" + self.fragment())
        return page(f"Attention: {self.title}", body)


def attention_patterns(model, tokens: Sequence[int] | torch.Tensor, strings: Sequence[str] | None = None, *,
                       index_from: int = 0, title: str = "attention") -> AttentionPatterns:
    """Every head's pattern of ``model`` on one prompt of ``tokens``, recorded from its forward pass
    (``blocks.L.attn.hook_pattern``); ``strings`` label the tokens (their ids where not given)."""
    from numeric_check.model.circuit_model import first_overflow
    from numeric_check.model.hooks import block_hook

    ids = torch.as_tensor(tokens).reshape(1, -1)
    names = [block_hook(layer, "attn.hook_pattern") for layer in range(model.arch.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids.to(model.device), names_filter=lambda name: name in names or
                                        name.endswith("hook_scale"))
    n_heads = max(model.arch.heads_per_layer, default=0)
    n = ids.shape[1]
    patterns = np.full((model.arch.n_layers, n_heads, n, n), np.nan)
    where = first_overflow(cache)  # a page of NaN, or of patterns after a layer norm that divided by Inf, would
    if where is not None:  # look like a model's
        raise AnalysisError(f"the model's forward pass overflows in {str(model.dtype).removeprefix('torch.')}: "
                            f"NaN or Inf in {where}; nothing was written. Run it in float64 (--dtype float64) or with "
                            "smaller weights")
    for layer, name in enumerate(names):
        pattern = cache[name][0].double().cpu().numpy()  # [head, query, key]
        patterns[layer, :pattern.shape[0]] = pattern
    labels = [str(s) for s in strings] if strings is not None else [str(int(i)) for i in ids[0]]
    return AttentionPatterns(patterns, labels, index_from, title)


_CSS = """
.tc-attention .tc-grid { display: grid; gap: 4px; margin: 0.5em 0; overflow-x: auto; justify-content: start; }
.tc-attention figure { margin: 0; text-align: center; cursor: pointer; font: 11px sans-serif; }
.tc-attention figure.tc-on canvas { outline: 2px solid #d62728; }
.tc-attention canvas { image-rendering: pixelated; border: 1px solid #ccc; }
.tc-attention .tc-large canvas { border: none; display: block; }
.tc-attention .tc-hint, .tc-attention .tc-cell, .tc-attention .tc-said { font: 12px sans-serif; color: #555; }
.tc-attention .tc-legend { display: flex; align-items: center; gap: 6px; font: 12px sans-serif; margin: 4px 0 8px; }
.tc-attention .tc-bar { display: inline-block; width: 160px; height: 12px; border: 1px solid #999;
  background: linear-gradient(to right, rgb(255,255,255), rgb(0,0,255)); }
.tc-attention .tc-masked { display: inline-block; width: 12px; height: 12px; background: #f4f4f4; border: 1px solid #999;
  margin-left: 12px; }
.tc-attention .tc-text { line-height: 2.2; max-width: 60em; }
.tc-attention .tc-token { font: 14px monospace; border: 1px solid #aaa; border-radius: 3px; padding: 1px 3px;
  margin: 0 2px; cursor: pointer; white-space: pre; }
.tc-attention .tc-token.tc-chosen { outline: 2px solid #d62728; }
.tc-attention .tc-token.tc-later { color: #bbb; border-color: #e4e4e4; }
"""

# draws each head small on a canvas, and the chosen head large with the tokens on both axes
_SCRIPT = """function (root, d) {
  const n = d.tokens.length, grid = root.querySelector('.tc-grid');
  grid.style.gridTemplateColumns = 'repeat(' + d.n_heads + ', auto)';
  const shade = (v) => { const c = Math.round(255 * (1 - (isNaN(v) ? 0 : v))); return 'rgb(' + c + ',' + c + ',255)'; };
  // a token as a person can see it: spaces, tabs and new lines drawn, never an empty or invisible label
  const visible = (t) => t.replace(/ /g, '\\u2423').replace(/\\t/g, '\\u21e5').replace(/\\r?\\n/g, '\\u23ce') || '\\u2205';
  function draw(canvas, p, cell, left, top) {
    const g = canvas.getContext('2d');
    for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
      g.fillStyle = j > i ? '#f4f4f4' : shade(p[i][j]); g.fillRect(left + j * cell, top + i * cell, cell, cell); }
  }
  const large = root.querySelector('.tc-large canvas'), info = root.querySelector('.tc-cell');
  const text = root.querySelector('.tc-text'), said = root.querySelector('.tc-said');
  let chosen = 0, pointed = n - 1;
  const spans = d.tokens.map((t, i) => {
    const s = document.createElement('span'); s.className = 'tc-token'; s.textContent = visible(t);
    s.dataset.position = i; s.onmouseenter = s.onclick = () => colour(i); text.append(s); return s; });
  function colour(i) {  // the tokens before i coloured by how much i attends to each, in the chosen head
    pointed = i;
    spans.forEach((s, j) => {
      const w = j <= i ? d.patterns[chosen][i][j] : NaN;
      s.classList.toggle('tc-chosen', j === i); s.classList.toggle('tc-later', j > i);
      s.style.background = j <= i ? shade(w) : ''; s.style.color = j <= i && w > 0.55 ? '#fff' : '';
      s.dataset.weight = j <= i ? w.toFixed(4) : ''; s.title = j <= i ? w.toFixed(3) : 'later: masked'; });
    const top = d.patterns[chosen][i].slice(0, i + 1).reduce((b, w, j) => w > d.patterns[chosen][i][b] ? j : b, 0);
    said.textContent = d.heads[chosen] + ': ' + JSON.stringify(d.tokens[i]) + ' (position ' + i + ') attends most to ' +
      JSON.stringify(d.tokens[top]) + ' (position ' + top + ', ' + d.patterns[chosen][i][top].toFixed(3) + ')';
  }
  function show(h) {
    chosen = h; root.querySelectorAll('figure').forEach((f, k) => f.classList.toggle('tc-on', k === h));
    root.querySelector('.tc-large h3').textContent = d.heads[h];
    const cell = Math.max(14, Math.min(24, Math.floor(640 / n))), font = '12px monospace', g = large.getContext('2d');
    g.font = font;
    const labels = d.tokens.map((t) => visible(t).slice(0, 14));
    const label = Math.ceil(Math.max(...labels.map((s) => g.measureText(s).width), 8)) + 14;  // as wide as the longest
    large.width = label + n * cell; large.height = label + n * cell;
    g.clearRect(0, 0, large.width, large.height);
    draw(large, d.patterns[h], cell, label, label);
    g.font = font; g.textBaseline = 'middle';
    labels.forEach((s, i) => {  // each token in a box, so a "," or a "." is seen as a token, not a speck
      const w = g.measureText(s).width + 6, mid = label + i * cell + cell / 2;
      g.strokeStyle = '#aaa'; g.fillStyle = '#fafafa';
      g.fillRect(label - 4 - w, mid - 7, w, 14); g.strokeRect(label - 4 - w, mid - 7, w, 14);
      g.fillStyle = '#111'; g.textAlign = 'right'; g.fillText(s, label - 7, mid);
      g.save(); g.translate(mid, label - 4); g.rotate(-Math.PI / 2);
      g.fillStyle = '#fafafa'; g.fillRect(0, -7, w, 14); g.strokeRect(0, -7, w, 14);
      g.fillStyle = '#111'; g.textAlign = 'left'; g.fillText(s, 3, 0); g.restore(); });
    large.onmousemove = (e) => {
      const r = large.getBoundingClientRect(), j = Math.floor((e.clientX - r.left - label) / cell),
            i = Math.floor((e.clientY - r.top - label) / cell);
      info.textContent = (i >= 0 && j >= 0 && i < n && j < n && j <= i) ? d.heads[h] + ': ' + JSON.stringify(d.tokens[i]) +
        ' (position ' + i + ') attends to ' + JSON.stringify(d.tokens[j]) + ' (position ' + j + ') with ' +
        d.patterns[h][i][j].toFixed(3) : '\\u00a0';
    };
    colour(pointed);
  }
  d.heads.forEach((name, h) => {
    const f = document.createElement('figure'), c = document.createElement('canvas'), cap = document.createElement('figcaption');
    const cell = Math.max(1, Math.floor(64 / n)); c.width = c.height = n * cell; draw(c, d.patterns[h], cell, 0, 0);
    cap.textContent = name; f.append(c, cap); f.onclick = () => show(h); grid.append(f);
  });
  show(0);
}"""
