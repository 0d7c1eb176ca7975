"""Q-, K- and V-composition scores, exactly as the paper defines them.

For a head ``h1`` writing into a later head ``h2`` (``l1 < l2``):

- Q: ``‖W_QK^{h2 T} W_OV^{h1}‖_F / (‖W_QK^{h2}‖_F ‖W_OV^{h1}‖_F)``
- K: ``‖W_QK^{h2} W_OV^{h1}‖_F / (‖W_QK^{h2}‖_F ‖W_OV^{h1}‖_F)``
- V: ``‖W_OV^{h2} W_OV^{h1}‖_F / (‖W_OV^{h2}‖_F ‖W_OV^{h1}‖_F)``

Paper convention: ``W_OV = W_O W_V``, ``W_QK = W_Qᵀ W_K`` act on column vectors. These are
the same numbers as TransformerLens's ``all_composition_scores`` (row convention: its
``OV = W_V W_O`` is our ``W_OVᵀ`` and its ``QK = W_Q W_Kᵀ`` is our ``W_QK``; its Q mode
takes ``‖OVᵀ… ‖`` of ``W_OV^{h1 T} W_QK^{h2}``, the transpose of ours, and transposes do
not change Frobenius norms). The paper's erratum: an early version of its library
permuted the product cyclically (e.g. ``W_OV^{h1} W_QK^{h2}`` for K), which changes the
Frobenius norm; the tests check that these scores equal the dense definitions above.

Every norm is the trace of a cyclic word rotated to ``d_head`` (small Gram matrices), so
no ``d_model × d_model`` product is formed when ``d_head`` is smaller.
"""

from __future__ import annotations

import html
import math
import re

import torch
from torch import Tensor

from numeric_check.errors import AnalysisError
from numeric_check.circuits.ov_qk import layer_pairs, scatter_pairs, stacked_head_weights
from numeric_check.circuits.factored import Factored

#: The kinds of composition :func:`composition_scores` measures: a later head's query, key or value reading an earlier one.
COMPOSITION_KINDS = ("Q", "K", "V")


def _reader_factors(W: dict[str, Tensor], kind: str) -> list[Tensor]:
    """The reading head's matrix as factors: ``W_QKᵀ`` (Q), ``W_QK`` (K) or ``W_OV`` (V)."""
    if kind == "Q":
        return [W["W_K"].mT, W["W_Q"]]
    if kind == "K":
        return [W["W_Q"].mT, W["W_K"]]
    return [W["W_O"], W["W_V"]]


def _check_kind(kind: str) -> None:
    if kind not in COMPOSITION_KINDS:
        raise AnalysisError(f"unknown composition kind {kind!r}; expected one of {', '.join(map(repr, COMPOSITION_KINDS))}")


def pair_composition_scores(reader: dict[str, Tensor], writer: dict[str, Tensor], kind: str, *,
                            erratum: bool = False) -> Tensor:
    """Scores of writers into readers from head weights with broadcastable batch dimensions.

    ``reader`` and ``writer`` hold ``W_Q, W_K, W_V [..., d_head, d_model]`` and
    ``W_O [..., d_model, d_head]``; the result has their broadcast batch shape. Zero
    matrices give NaN (0/0). ``erratum=True`` gives the paper's first, mistaken figure instead
    (:func:`erratum_composition_scores`).
    """
    _check_kind(kind)
    read = _reader_factors(reader, kind)
    write = [writer["W_O"], writer["W_V"]]
    if erratum:  # every product rotated by one factor: the first factor moved to the end
        read, write, together = read[1:] + read[:1], write[1:] + write[:1], read[1:] + write + read[:1]
    else:
        together = read + write
    return Factored(*together).frobenius_norm() / (Factored(*read).frobenius_norm() * Factored(*write).frobenius_norm())


_LABEL = re.compile(r"L(\d+)H(\d+)")


class CompositionScores(Tensor):
    """Composition scores with their heads named: a tensor ``[n_layers, n_heads, n_layers, n_heads]`` laid out as
    TransformerLens's ``all_composition_scores`` (``[l1, h1, l2, h2]``: ``L{l1}H{h1}`` writing into ``L{l2}H{h2}``),
    which reads by name (:meth:`at`, :meth:`pairs`), prints as a table of writers by readers, and shows as one in
    Jupyter. Any torch operation on it gives a plain tensor.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> scores = composition_scores(CircuitModel.random(Architecture(2, 2), d_model=8, d_head=2, d_vocab=10, n_ctx=4), "K")
    >>> scores.at("L0H1", "L1H0") == float(scores[0, 1, 1, 0])
    True
    >>> [(w, r) for w, r, _ in scores.pairs()][:1] == [max(((w, r) for w, r, _ in scores.pairs()),
    ...                                                    key=lambda p: scores.at(*p))]
    True
    >>> type(scores * 2).__name__
    'Tensor'
    """

    __torch_function__ = torch._C._disabled_torch_function_impl  # results of operations: plain tensors
    kind: str
    heads_per_layer: tuple[int, ...]

    @staticmethod
    def __new__(cls, scores: Tensor, kind: str, heads_per_layer) -> "CompositionScores | Tensor":
        try:
            named = scores.as_subclass(cls)
        except RuntimeError:  # the tensor is already another subclass's (a wrapper of the user's): left as it is
            return scores
        named.kind, named.heads_per_layer = kind, tuple(heads_per_layer)
        return named

    def _index(self, label: str, role: str) -> tuple[int, int]:
        found = _LABEL.fullmatch(label) if isinstance(label, str) else None
        layer, head = (int(found[1]), int(found[2])) if found else (-1, -1)
        if not 0 <= layer < len(self.heads_per_layer) or not 0 <= head < self.heads_per_layer[layer]:
            raise AnalysisError(f"the {role} {label!r} is not a head of this model; expected a label such as 'L0H1' "
                                f"(layers 0..{len(self.heads_per_layer) - 1}, numbered from 0 as in TransformerLens)")
        return layer, head

    def at(self, writer: str, reader: str) -> float:
        """The score of ``writer`` (a head label, ``'L0H1'``) writing into ``reader`` (``'L1H2'``, a later layer)."""
        (l1, h1), (l2, h2) = self._index(writer, "writer"), self._index(reader, "reader")
        if l1 >= l2:
            raise AnalysisError(f"{writer} cannot write into {reader}: a head composes only with heads of later layers")
        return float(self[l1, h1, l2, h2])

    def pairs(self) -> list[tuple[str, str, float]]:
        """Every ``(writer, reader, score)`` of heads in an earlier and a later layer, the largest score first."""
        found = [(f"L{l1}H{h1}", f"L{l2}H{h2}", float(self[l1, h1, l2, h2]))
                 for l1, n1 in enumerate(self.heads_per_layer) for h1 in range(n1)
                 for l2 in range(l1 + 1, len(self.heads_per_layer)) for h2 in range(self.heads_per_layer[l2])]
        return sorted(found, key=lambda p: -p[2] if not math.isnan(p[2]) else math.inf)

    def _grid(self) -> tuple[list[str], list[str], list[list[float | None]]]:
        """Writers (every layer but the last) by readers (every layer but the first), None where l1 >= l2."""
        heads = [(l, h) for l, n in enumerate(self.heads_per_layer) for h in range(n)]
        writers = [p for p in heads if p[0] < len(self.heads_per_layer) - 1]
        readers = [p for p in heads if p[0] > 0]
        rows = [[float(self[l1, h1, l2, h2]) if l1 < l2 else None for l2, h2 in readers] for l1, h1 in writers]
        return [f"L{l}H{h}" for l, h in writers], [f"L{l}H{h}" for l, h in readers], rows

    def __repr__(self) -> str:
        writers, readers, rows = self._grid()
        if not rows or not readers:
            return f"{self.kind}-composition scores: no pair of layers"
        width = max(6, *map(len, readers))
        lines = [f"{self.kind}-composition scores, writer (row) into reader (column):",
                 " " * max(map(len, writers)) + "".join(f" {r:>{width}}" for r in readers)]
        for name, row in zip(writers, rows):
            lines.append(f"{name:<{max(map(len, writers))}}" + "".join(
                f" {'' if v is None else f'{v:.3f}':>{width}}" for v in row))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """The table in Jupyter: a writer by reader grid, each score shaded by its size."""
        writers, readers, rows = self._grid()
        finite = [v for row in rows for v in row if v is not None and math.isfinite(v)]
        top = max(finite, default=0.0) or 1.0
        head = "".join(f"<th>{html.escape(r)}</th>" for r in readers)
        body = "".join(
            f"<tr><th>{html.escape(w)}</th>" + "".join(
                "<td></td>" if v is None else
                f'<td style="background: rgba(70, 110, 200, {max(0.0, v / top) * 0.6 if math.isfinite(v) else 0:.2f}); '
                f'text-align: right">{v:.3f}</td>' for v in row) + "</tr>"
            for w, row in zip(writers, rows))
        return (f"<table><caption>{html.escape(self.kind)}-composition scores: writer (row) into reader (column)"
                f"</caption><tr><th></th>{head}</tr>{body}</table>")


def composition_scores(
    model,
    kind: str,
    baseline: bool = False,
    *,
    n_samples: int = 64,
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> CompositionScores:
    """Composition scores ``[n_layers, n_heads, n_layers, n_heads]``; ``[l1, h1, l2, h2]``: ``L{l1}H{h1}`` into ``L{l2}H{h2}``,
    as a :class:`CompositionScores` (a tensor that names its heads: ``scores.at("L0H1", "L1H2")``, ``scores.pairs()``).

    ``kind`` is ``"Q"``, ``"K"`` or ``"V"`` (see the module docstring for the definitions).
    Entries are 0 unless ``l1 < l2`` (as TransformerLens), NaN for heads a layer lacks.
    ``baseline=True`` subtracts :func:`composition_baseline` (``n_samples``, ``seed``) from
    the ``l1 < l2`` entries, so 0 means "as much as random weights of these shapes".
    ``dtype`` (default: the model's, float32 for a half-precision model, whose norms of products of
    random weights overflow float16) is the precision of the computation.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(2, 3), d_model=16, d_head=4, d_vocab=20, n_ctx=8)
    >>> scores = composition_scores(model, "K")
    >>> scores.shape
    torch.Size([2, 3, 2, 3])
    >>> bool((scores[1] == 0).all()) and bool((scores[0, :, 1] > 0).all())
    True
    """
    scores = _layer_pair_scores(model, kind, dtype)  # [pairs, H1, H2]
    if baseline:
        scores = scores - composition_baseline(model, kind, n_samples=n_samples, seed=seed, dtype=scores.dtype)
    return CompositionScores(scatter_pairs(model, scores, fill=0.0), kind, model.arch.heads_per_layer)


def erratum_composition_scores(model, kind: str, *, dtype: torch.dtype | None = None) -> Tensor:
    """The scores of the paper's first composition figure, as its Correction describes them:
    ``[n_layers, n_heads, n_layers, n_heads]``, laid out as :func:`composition_scores`.

    A bug in the paper's low-rank library rotated each product cyclically before taking its
    Frobenius norm (right for traces and eigenvalues, wrong for norms). For K-composition it
    computed ``‖W_K^{h2} W_O^{h1} W_V^{h1} W_Q^{h2 T}‖_F`` instead of
    ``‖W_Q^{h2 T} W_K^{h2} W_O^{h1} W_V^{h1}‖_F``; Q and V alike. Here every norm of the
    ratio is rotated the same way (the first factor moved to the end), so the score is still
    scale-free. The Correction explains what it measured: how much the reader's query is built
    from the subspace the writer moved data into — what an induction head does with a
    previous-token head's output — so it singles out induction composition and filters out
    other kinds. The paper's findings use :func:`composition_scores`; this one shows why its
    first figure showed "only K-composition".

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(2, 2), d_model=16, d_head=4, d_vocab=20, n_ctx=8)
    >>> right, wrong = composition_scores(model, "K"), erratum_composition_scores(model, "K")
    >>> bool((right[0, :, 1] != wrong[0, :, 1]).all())
    True
    """
    return scatter_pairs(model, _layer_pair_scores(model, kind, dtype, erratum=True), fill=0.0)


def _layer_pair_scores(model, kind: str, dtype: torch.dtype | None, erratum: bool = False) -> Tensor:
    """Every writer of an earlier layer into every reader of a later one, ``[pairs, H1, H2]`` (see
    :func:`~numeric_check.circuits.ov_qk.layer_pairs`), in ``dtype`` (float32 for a half-precision model)."""
    _check_kind(kind)
    if dtype is None and model.dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    W = stacked_head_weights(model, dtype)
    first, second = layer_pairs(model)
    writer = {name: w[first][:, :, None] for name, w in W.items()}  # [pairs, H1, 1, ...]
    reader = {name: w[second][:, None] for name, w in W.items()}  # [pairs, 1, H2, ...]
    return pair_composition_scores(reader, writer, kind, erratum=erratum)


def composition_baseline(
    model, kind: str, *, n_samples: int = 64, seed: int = 0, dtype: torch.dtype = torch.float64, erratum: bool = False
) -> float:
    """The mean score of ``kind`` for random weights with the model's shapes (a sampled estimate).

    Draws ``n_samples`` pairs of heads with i.i.d. Gaussian ``W_Q, W_K, W_V, W_O`` of the
    model's shapes (``[d_head, d_model]``, ``[d_model, d_head]``: the low rank is kept), from
    a CPU generator seeded with ``seed``, and averages their scores. Scores are
    scale-invariant, so the variance does not matter. A check on the estimate: for such
    rotation-invariant weights ``E[score²] = 1/d_model`` exactly (the tests check it), so the
    baseline is a little below ``1/sqrt(d_model)``; the three kinds have the same baseline.
    ``erratum=True``: the mean of :func:`erratum_composition_scores` instead.

    >>> from derivations import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> model = CircuitModel.random(Architecture(2, 1), d_model=64, d_head=8, d_vocab=20, n_ctx=8)
    >>> round(composition_baseline(model, "K", n_samples=256) * 8, 1)  # ~ sqrt(d_model) * baseline
    1.0
    """
    _check_kind(kind)
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise AnalysisError(f"n_samples must be an int >= 1, got {n_samples!r}")
    d_model, d_head = model.cfg.d_model, model.cfg.d_head
    gen = torch.Generator().manual_seed(seed)

    def draw() -> dict[str, Tensor]:
        heads = {name: torch.randn(n_samples, d_head, d_model, generator=gen, dtype=torch.float64) for name in ("W_Q", "W_K", "W_V")}
        heads["W_O"] = torch.randn(n_samples, d_model, d_head, generator=gen, dtype=torch.float64)
        return {name: w.to(dtype) for name, w in heads.items()}

    reader, writer = draw(), draw()
    return float(pair_composition_scores(reader, writer, kind, erratum=erratum).mean())
