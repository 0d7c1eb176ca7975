"""Path expansion of one head's attention scores: Q-, K- and QK-composition.

The scores of head ``h`` of layer ``l`` are a bilinear form of two expanded residual
streams: ``S = (1/sqrt(d_head)) · q_in W_Qᵀ W_K k_inᵀ`` (one row per position). With
the query input ``Σ P ⊗ W_p`` and the key input ``Σ Q ⊗ W_q`` (the stream entering layer
``l``, each path's position word led by the layer-norm scale when there is one), each
pair of paths gives the 3-slot term

    (1/sqrt(d_head)) · P ⊗ Q ⊗ (W_pᵀ W_QK^{LlHh} W_q),   acting as   S = P X_q M X_kᵀ Qᵀ,

``X_q``/``X_k`` the inputs of the two paths' sources (see :mod:`derivations.paths`).
A term is tagged by where its heads are: ``direct`` (none), ``Q`` (query side only),
``K`` (key side only: the induction-head term ``Id ⊗ A ⊗ …``) or ``QK`` (both).

Extras, each an order-0 entry of the sides:

- ``qk_only`` positions enter only the Q/K inputs: a ``position`` source ``Id ⊗ W_pos``
  on each side, never through heads, added after the layer norm (as TransformerLens'
  shortformer does: Q/K read ``ln1(resid_pre) + pos``), so it carries no ``N^{Ll}``.
- biases: ``b_Q``/``b_K`` of the head are a constant query/key side, sources
  ``Source("query_bias", l, h)``/``Source("key_bias", l, h)`` with input ones ``[pos, 1]``
  and position word ``Id``; their terms use ``W_K``/``W_Q`` unfolded:
  ``Id ⊗ Q ⊗ (b_Qᵀ W_K W_q)``, ``P ⊗ Id ⊗ (W_pᵀ W_Qᵀ b_K)``, ``Id ⊗ Id ⊗ (b_Qᵀ b_K)``.

The models studied today:

- a norm (layer norm or RMSNorm) leads both sides with its frozen scale ``N^{Ll}``;
- q/k normalisation (Qwen3, OLMo 2, Persimmon, StableLM, Cohere): a norm of each head's query
  and key (over ``d_head``, or over all heads at once) is one more frozen per-position scale on
  each side, ``N^{LlHh,q}`` and ``N^{LlKVg,k}`` (``N^{Ll,q}``, ``N^{Ll,k}`` over all heads), in
  front of every position word of the side, the biases ``b_Q``/``b_K`` included; its gains (and a
  layer norm's centring over the head) fold into ``W_Q``/``W_K`` and their biases, and a layer
  norm's own bias is one more constant side, ``b_Qn``/``b_Kn``, after the scale;
- grouped-query attention: ``W_QK^{h} = W_Q^{h}ᵀ W_K^{g}`` with ``g`` the key/value head of
  ``h``'s group, so unfolded words (biases, rotary) name ``W_K^{g}``/``b_K^{g}`` once per group;
- ALiBi (BLOOM, MPT, Falcon): a fixed position-only matrix ``m_h (j - i)`` added to the scaled
  scores is one more term, ``Id ⊗ Id ⊗ B_ALiBi^{h}`` with coefficient 1, whose two sides read the
  identity of positions (source ``Source("alibi", l, h)``, input key ``position``);
- sliding windows and soft-caps change no term: a window masks more keys (the terms are compared
  on the positions the mask keeps), and an attention soft-cap acts after the scores expanded here;
- rotary: the queries and keys are rotated by position after ``W_Q``/``W_K`` (and their
  biases), so ``W_QK`` unfolds around the head's rotary operator ``R^{h}``
  (:mod:`tensoralg.rotary`): a term reads ``P ⊗ Q ⊗ (W_pᵀ W_Qᵀ R^{h} W_K W_q)``, which stands
  for ``Σ (D_a P) ⊗ (D_b Q) ⊗ (W_pᵀ W_Qᵀ B W_K W_q)`` over the terms of ``R``
  (:func:`tensoralg.rotary.expand_rotary`) and is evaluated factored
  (:func:`tensoralg.rotary.rotary_scores`). The number of terms is unchanged.

>>> from derivations.architecture import Architecture
>>> e = expand_qk(Architecture(2, 1), 1, 0)
>>> [(t.composition, t.label) for t in e]  # doctest: +NORMALIZE_WHITESPACE
[('direct', 'q: tok (direct) | k: tok (direct)'), ('Q', 'q: tok→L0H0 | k: tok (direct)'),
 ('K', 'q: tok (direct) | k: tok→L0H0'), ('QK', 'q: tok→L0H0 | k: tok→L0H0')]
>>> list(e)[2].term
Term(1/sqrt(d_head)·Id ⊗ A^{L0H0} ⊗ W_Eᵀ W_QK^{L1H0} W_OV^{L0H0} W_E)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple

import sympy as sp

from tensoralg.atoms import Atom, Word, d_head
from tensoralg.rotary import rotary_atom
from tensoralg.display import counted, expansion_markdown
from tensoralg.expr import TensorSum, Term, check_order

from derivations.architecture import Architecture, head_label
from derivations.errors import DerivationError
from derivations.paths import (
    POSITION,
    Path,
    Source,
    check_arch,
    check_limit,
    group_sum,
    head_atom,
    kv_atom,
    layer_atom,
    ln_scale,
    order_counts,
    refuse_oversize,
    stream_entries,
    stream_terms,
    transpose_word,
    transposed,
)

COMPOSITIONS = ("direct", "Q", "K", "QK")


@dataclass(frozen=True)
class QKTerm:
    """One term of a head's scores: ``coeff · P ⊗ Q ⊗ M``, contributing ``coeff · P X_q M X_kᵀ Qᵀ``.

    ``query``/``key`` are the paths of the two sides; ``composition`` is ``direct``,
    ``Q``, ``K`` or ``QK`` by which of them pass through heads.
    """

    query: Path
    key: Path
    composition: str
    term: Term

    @property
    def order(self) -> int:
        """Heads on the query side plus heads on the key side."""
        return len(self.query.heads) + len(self.key.heads)

    @property
    def label(self) -> str:
        return f"q: {self.query.label} | k: {self.key.label}"

    def __str__(self) -> str:
        return f"{self.label} [{self.composition}]: {self.term}"


class _Side(NamedTuple):
    """One path of one side: its position word and its share of the middle word ``M``.

    Query side: ``to_input`` is ``W_pᵀ W_QK`` (``b_Qᵀ W_K`` for the bias), used next to a
    key-side residual word; ``to_bias`` is ``W_pᵀ W_Qᵀ`` (``b_Qᵀ``), used next to ``b_K``.
    Key side: ``to_input`` is the residual word ``W_q`` (``b_K``); ``to_bias`` is unused.
    """

    path: Path
    position: Word
    to_input: Word
    to_bias: Word
    is_bias: bool


def qk_norm_scale(arch: Architecture, layer: int, head: int, side: str) -> Atom:
    """The frozen scale of a q/k norm on the ``side`` (``"q"`` or ``"k"``) of head ``(layer, head)``:
    ``N^{L1H0,q}``, ``N^{L1KV0,k}`` (a key norm belongs to the key/value head), or ``N^{L1,q}``
    when the norm runs over all heads at once (one scale per position, OLMo 2)."""
    if arch.qk_norm_scope == "all":
        return layer_atom("N", f"L{layer},{side}")
    return layer_atom("N", (head_label(layer, head) if side == "q" else arch.kv_label(layer, head)) + f",{side}")


def _sides(arch: Architecture, layer: int, head: int, max_order: int | None, query: bool) -> list[list[_Side]]:
    """The query (or key) side of head ``(layer, head)``, by order."""
    qk_only = arch.positional == "qk_only"
    # a q/k norm scales every term of a side (its bias b_Qn comes after the scale); then ln1's scale
    qn = (qk_norm_scale(arch, layer, head, "q" if query else "k"),) if arch.qk_norm else ()
    scale = qn + ((ln_scale(layer),) if arch.pre_norm else ())
    W_K = kv_atom(arch, "W_K", layer, head)
    # rotary turns the query (and key) after W_Q and b_Q: W_QK unfolds around R^{h}
    R = (rotary_atom(head_label(layer, head)),) if arch.rotary is not None else ()
    W_QK = (transposed(head_atom("W_Q", layer, head)),) + R + (W_K,) if R else (head_atom("W_QK", layer, head),)
    if query:
        W_Q_T = (transposed(head_atom("W_Q", layer, head)),) + R

        def side(path, position, word, lead=scale):
            wt = transpose_word(word)
            return _Side(path, lead + position, wt + W_QK, wt + W_Q_T, False)
    else:

        def side(path, position, word, lead=scale):
            return _Side(path, lead + position, word, word, False)

    top = layer if max_order is None else min(layer, max_order)
    out: list[list[_Side]] = [[] for _ in range(top + 1)]
    for k, st in stream_terms(arch, layer, max_order):
        out[k].append(side(st.path, st.position, st.residual))
    if qk_only:
        # Positions join the Q/K inputs after the layer norm (as TransformerLens' shortformer).
        out[0].append(side(Path(POSITION), (), (layer_atom("W_pos", ""),), lead=qn))
    biases = [("b_Q", "b_K", "query_bias", "key_bias", qn)] if arch.biases else []
    if arch.qk_norm == "layer_norm":  # the q/k layer norm's own bias, after its scale
        biases.append(("b_Qn", "b_Kn", "query_norm_bias", "key_norm_bias", ()))
    for q_name, k_name, q_kind, k_kind, lead in biases:
        if query:
            b = transposed(head_atom(q_name, layer, head))
            out[0].append(_Side(Path(Source(q_kind, layer, head)), lead, (b,) + R + (W_K,), (b,) + R, True))
        else:
            b = kv_atom(arch, k_name, layer, head)
            out[0].append(_Side(Path(Source(k_kind, layer, head)), lead, (b,), (b,), True))
    return out


def _side_counts(arch: Architecture, layer: int, max_order: int | None) -> list[int]:
    counts = [0] * ((layer if max_order is None else min(layer, max_order)) + 1)
    for entry in stream_entries(arch, layer):
        for k, n in enumerate(order_counts(arch, entry.first_layer, layer, max_order)):
            counts[k] += n
    counts[0] += (arch.positional == "qk_only") + arch.biases + (arch.qk_norm == "layer_norm")
    return counts


def _pair_counts(side: list[int], max_order: int | None) -> list[int]:
    top = 2 * (len(side) - 1) if max_order is None else max_order
    out = [0] * (top + 1)
    for i, a in enumerate(side):
        for j, b in enumerate(side):
            if i + j <= top:
                out[i + j] += a * b
    return out


class QKExpansion:
    """The scores of one head as a sum of :class:`QKTerm`, generated lazily;
    :func:`expand_qk` builds one after checking the size.

    ``len()`` is exact and computed without building. Terms come by total order, then
    by query-side order (so ``direct``, ``Q``, ``K``, then order 2 …), then query path,
    then key path.
    """

    def __init__(self, arch: Architecture, layer: int, head: int, max_order: int | None = None):
        check_arch(arch)
        arch.check_head(layer, head)
        check_order(max_order, 2 * layer, f"the scores of a layer-{layer} head (two sides of {layer} layers)")
        self.arch = arch
        self.layer = layer
        self.head = head
        self.max_order = max_order
        self._sides: tuple[list[list[_Side]], list[list[_Side]]] | None = None
        self._per_order = _pair_counts(_side_counts(arch, layer, max_order), max_order)
        self._alibi = Source("alibi", layer, head) if arch.alibi else None
        self._per_order[0] += arch.alibi

    @property
    def label(self) -> str:
        return head_label(self.layer, self.head)

    @property
    def n_terms(self) -> int:
        """The exact number of terms (``len()`` too, up to ``sys.maxsize``)."""
        return sum(self._per_order)

    def __len__(self) -> int:
        return self.n_terms

    def count_by_order(self) -> dict[int, int]:
        return {k: n for k, n in enumerate(self._per_order) if n}

    def _blocks(self, query=None, key=None) -> Iterator[tuple[str, list[_Side], list[_Side], sp.Expr]]:
        """``(composition, query sides, key sides, coefficient)`` whose pairs are the (selected) terms, in order."""
        if self._sides is None:  # small (the square root of the term count): kept
            self._sides = tuple(_sides(self.arch, self.layer, self.head, self.max_order, q) for q in (True, False))
        queries, keys = self._sides
        if query is not None:
            queries = _select(queries, query, "query", self._alibi)
        if key is not None:
            keys = _select(keys, key, "key", self._alibi)
        coeff = 1 / sp.sqrt(d_head)
        for total in range(len(self._per_order)):
            for i in range(min(total, len(queries) - 1), max(0, total - len(keys) + 1) - 1, -1):
                yield COMPOSITIONS[(i > 0) + 2 * (total > i)], queries[i], keys[total - i], coeff
            if total == 0 and self._alibi is not None and _matches(query, self._alibi) and _matches(key, self._alibi):
                # ALiBi: one position-only term m_h (j - i), added to the scaled scores (coefficient 1)
                B = layer_atom("B_ALiBi", self.label)
                path = Path(self._alibi)
                yield "direct", [_Side(path, (), (B,), (B,), False)], [_Side(path, (), (), (), False)], sp.S.One

    def _terms(self, query=None, key=None) -> Iterator[tuple[_Side, _Side, str, Term]]:
        for tag, queries, keys, coeff in self._blocks(query, key):
            for q in queries:
                for k in keys:
                    middle = (q.to_bias if k.is_bias else q.to_input) + k.to_input
                    yield q, k, tag, Term(coeff, (q.position, k.position, middle))

    def _word_dict(self, query=None, key=None) -> dict[tuple[Word, ...], sp.Expr]:
        """``{words: coeff}`` of the selected terms, built block by block in comprehensions
        (a third of the time of going through :class:`QKTerm`)."""
        out: dict[tuple[Word, ...], sp.Expr] = {}
        for _, queries, keys, coeff in self._blocks(query, key):
            inputs = [k for k in keys if not k.is_bias]
            biases = [k for k in keys if k.is_bias]
            out.update({(q.position, k.position, q.to_input + k.to_input): coeff for q in queries for k in inputs})
            out.update({(q.position, k.position, q.to_bias + k.to_input): coeff for q in queries for k in biases})
        return out

    def __iter__(self) -> Iterator[QKTerm]:
        for q, k, tag, term in self._terms():
            yield QKTerm(q.path, k.path, tag, term)

    def by_composition(self) -> dict[str, list[QKTerm]]:
        """The terms grouped by ``direct``, ``Q``, ``K``, ``QK`` (empty groups left out)."""
        out: dict[str, list[QKTerm]] = {c: [] for c in COMPOSITIONS}
        for t in self:
            out[t.composition].append(t)
        return {c: v for c, v in out.items() if v}

    def by_order(self) -> dict[int, list[QKTerm]]:
        out: dict[int, list[QKTerm]] = {}
        for t in self:
            out.setdefault(t.order, []).append(t)
        return out

    def to_tensor_sum(self, query: Source | str | None = None, key: Source | str | None = None) -> TensorSum:
        """The canonical 3-slot sum of the terms whose query/key sources match ``query``/``key``
        (a :class:`Source`, its label or an input key; ``None``: any).

        Terms whose sources have different inputs cannot share one sum (see
        :meth:`derivations.paths.LogitExpansion.to_tensor_sum`): when the selected terms
        mix inputs this raises; :meth:`to_tensor_sums` gives one sum per input pair.
        """
        query_inputs, key_inputs = set(), set()
        for _, queries, keys, _ in self._blocks(query, key):
            if queries and keys:
                query_inputs.update(q.path.source.input_key for q in queries)
                key_inputs.update(k.path.source.input_key for k in keys)
        if len(query_inputs) > 1 or len(key_inputs) > 1:
            raise DerivationError(
                f"the selected scores of {self.label} act on different inputs (query side: "
                + ", ".join(sorted(query_inputs)) + "; key side: " + ", ".join(sorted(key_inputs))
                + ") and cannot be added into one TensorSum; pass query= and key= (a source label or input key) "
                "or use to_tensor_sums()"
            )
        return group_sum(self._word_dict(query, key), 3, f"the selected scores of {self.label}")

    def to_tensor_sums(self) -> dict[tuple[str, str], TensorSum]:
        """One canonical sum per pair of input keys ``(query input, key input)``."""
        groups: dict[tuple[str, str], dict] = {}
        for q, k, _, term in self._terms():
            groups.setdefault((q.path.source.input_key, k.path.source.input_key), {})[term.words] = term.coeff
        return {k: group_sum(v, 3, f"inputs {k}") for k, v in groups.items()}

    def _repr_markdown_(self) -> str:
        """What a notebook shows: the count, then one sum per input as maths (long ones elided)."""
        return expansion_markdown(repr(self), {f"query input {k[0]}, key input {k[1]}": s for k, s in self.to_tensor_sums().items()})

    def __repr__(self) -> str:
        order = "" if self.max_order is None else f", max_order={self.max_order}"
        return f"QKExpansion({self.label} of {self.arch.describe()}{order}: {counted(self.n_terms, 'term')})"


def _matches(want, source: Source) -> bool:
    """Whether a selection (``None``: any; a Source, a label or an input key) picks ``source``."""
    if want is None:
        return True
    return want == source if isinstance(want, Source) else want in (source.label, source.input_key)


def _select(sides: list[list[_Side]], want, name: str, alibi: Source | None = None) -> list[list[_Side]]:
    """The sides whose source is ``want`` (a Source, a label or an input key), by order."""
    if not isinstance(want, (Source, str)):
        raise DerivationError(f"select a {name} source by a Source, a label or an input key, got {want!r}")
    chosen = [[s for s in side if _matches(want, s.path.source)] for side in sides]
    if not any(chosen) and not (alibi is not None and _matches(want, alibi)):
        known = list(dict.fromkeys(s.path.source for side in sides for s in side)) + ([alibi] if alibi else [])
        raise DerivationError(
            f"no {name}-side source matches {want!r}; the {name} side has the sources "
            + ", ".join(s.label for s in known) + " (input keys "
            + ", ".join(sorted({s.input_key for s in known})) + ")"
        )
    return chosen


def estimate_qk_terms(arch: Architecture, layer: int, head: int, max_order: int | None = None) -> int:
    """The exact number of terms :func:`expand_qk` would build, without building them.

    >>> estimate_qk_terms(Architecture(2, 12), 1, 0)
    169
    """
    return QKExpansion(arch, layer, head, max_order).n_terms


def expand_qk(arch: Architecture, layer: int, head: int, max_order: int | None = None, *,
              limit: int = 1_000_000) -> QKExpansion:
    """The attention scores of head ``(layer, head)`` as 3-slot terms tagged by composition.

    ``max_order`` bounds the heads on both sides together. Raises
    :class:`~derivations.errors.TooManyTerms` (suggesting a ``max_order`` that fits) above
    ``limit`` terms and :class:`~derivations.errors.ArchitectureError` for a head that
    does not exist.

    >>> print(expand_qk(Architecture(1, 2), 0, 1).to_tensor_sum())
    1/sqrt(d_head)·Id ⊗ Id ⊗ W_Eᵀ W_QK^{L0H1} W_E
    """
    check_limit(limit)
    expansion = QKExpansion(arch, layer, head, max_order)
    if expansion.n_terms > limit:
        refuse_oversize(f"the scores of {head_label(layer, head)} in {arch.describe()}",
                        QKExpansion(arch, layer, head)._per_order, limit)
    return expansion
