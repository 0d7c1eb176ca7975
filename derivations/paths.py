"""Path expansion of the logits: the residual stream as a sum over sources and paths.

The residual stream entering layer ``l`` is a sum over *sources* (token one-hots,
position one-hots, each layer's output bias, each layer's MLP output) and, for each
source, over *paths*: the heads of the layers between the source's entry and ``l``
that it passed through, at most one head per layer, layers increasing. Head ``h`` of
layer ``j`` acts as ``(A^{LjHh} N^{Lj}) ⊗ W_OV^{LjHh}`` (``N`` only with layer norm; with a norm
after the attention layer, OLMo 2 and Gemma 2, ``(N^{Lj,post} A^{LjHh} N^{Lj}) ⊗ W_OV^{LjHh}``, the
norm's gain folded into ``W_O``, and ``b_O^{Lj}`` enters behind ``N^{Lj,post}`` too), so by
the mixed-product rule a path's term is

    (A^{hk} N … A^{h1} N) ⊗ (W_OV^{hk} … W_OV^{h1} W_src),

and the logits are ``(N^{final} ⊗ W_U) · stream + (Id ⊗ b_U)·1``. ``N`` is the frozen scale of a
layer norm or of an RMSNorm alike (:attr:`Architecture.normalised`). Each
:class:`PathTerm` is a 2-slot term ``P ⊗ W`` whose contribution to the logits is
``coeff · P X Wᵀ`` where ``X`` (one row per position) is its source's input (the types
:class:`Source`, :class:`Path` and :class:`PathTerm` live in :mod:`derivations.sources`):

==============  ==========================  =======================================
source kind     input ``X``                 residual word ends with
==============  ==========================  =======================================
token           one-hots ``[pos, d_vocab]``   ``W_E``
position        identity ``[pos, n_ctx]``     ``W_pos`` (only for ``standard``)
bias            ones ``[pos, 1]``             ``b_O^{Lm}`` (``b_V`` folded into it)
mlp             the MLP's output            nothing (``[pos, d_model]``)
unembed_bias    ones ``[pos, 1]``             ``b_U`` (the whole word)
==============  ==========================  =======================================

>>> from derivations.architecture import Architecture
>>> e = expand_logits(Architecture(2, 2))
>>> len(e), [t.label for t in e][:3]
(9, ['tok (direct)', 'tok→L0H0', 'tok→L0H1'])
>>> list(e)[-1].term
Term(A^{L1H1} A^{L0H1} ⊗ W_U W_OV^{L1H1} W_OV^{L0H1} W_E)
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations, product
from typing import Iterator, NamedTuple

import sympy as sp

from tensoralg.atoms import Atom, Word, atom, transpose_word, word_shape
from tensoralg.display import counted, expansion_markdown
from tensoralg.expr import Term, TensorSum, check_order

from derivations.architecture import Architecture, head_label
from derivations.errors import ArchitectureError, DerivationError, TooManyTerms
from derivations.sources import POSITION, TOKEN, UNEMBED_BIAS, Path, PathTerm, Source

ONE = sp.S.One


# -- atoms, by the naming conventions the numeric binder relies on --------------------


@lru_cache(maxsize=None)
def head_atom(name: str, layer: int, head: int) -> Atom:
    """``A^{L1H0}``, ``W_OV^{L1H0}``, ``W_QK^{L1H0}``, ``b_Q^{L1H0}``…"""
    return atom(name, head_label(layer, head))


@lru_cache(maxsize=None)
def layer_atom(name: str, index: str) -> Atom:
    """``b_O^{L0}``, ``N^{L0}``, ``N^{final}``; ``index=''`` for ``W_E``…"""
    return atom(name, index)


@lru_cache(maxsize=None)
def transposed(a: Atom) -> Atom:
    """``aᵀ``, cached (building an atom costs SymPy work)."""
    return a.T


def ln_scale(layer: int) -> Atom:
    """The frozen scale of layer ``l``'s ``ln1``, ``N^{Ll}`` (diagonal, one entry per position)."""
    return layer_atom("N", f"L{layer}")


def post_scale(layer: int) -> Atom:
    """The frozen scale of the norm after layer ``l``'s attention, ``N^{Ll,post}`` (OLMo 2, Gemma 2):
    it scales every head's output and ``b_O`` before they join the stream."""
    return layer_atom("N", f"L{layer},post")


def mlp_ln_scale(arch: Architecture, layer: int) -> Atom:
    """The frozen scale of the norm before layer ``l``'s MLP: ``N^{Ll,mlp}`` for a sequential
    block; ``N^{Ll}`` itself for a parallel one, whose MLP normalises the very stream its
    attention does (a separate norm with other gains has the same per-position scale)."""
    return ln_scale(layer) if arch.parallel else layer_atom("N", f"L{layer}mlp")


# -- grouped-query attention: the factors of each head, each named once ----------------


def kv_atom(arch: Architecture, name: str, layer: int, head: int) -> Atom:
    """The key/value factor ``name`` (``W_K``, ``W_V``, ``b_K``, ``b_V``) that query head
    ``head`` reads: ``W_K^{L0KV1}``, shared by its group, or ``W_K^{L0H3}`` without grouping."""
    return atom(name, arch.kv_label(layer, head))


def head_factors(arch: Architecture, layer: int, head: int) -> dict[str, Word]:
    """What a head's derived weights are made of: ``W_OV^{h} = W_O^{h} W_V^{g}`` and
    ``W_QK^{h} = W_Q^{h}ᵀ W_K^{g}``, ``g`` the key/value head it reads.

    >>> head_factors(Architecture(1, 4, n_kv_heads=2), 0, 3)
    {'W_OV': (W_O^{L0H3}, W_V^{L0KV1}), 'W_QK': (W_Q^{L0H3}ᵀ, W_K^{L0KV1})}
    """
    return {"W_OV": (head_atom("W_O", layer, head), kv_atom(arch, "W_V", layer, head)),
            "W_QK": (transposed(head_atom("W_Q", layer, head)), kv_atom(arch, "W_K", layer, head))}


def weight_factors(arch: Architecture) -> tuple[Atom, ...]:
    """Every attention weight matrix of the model once: ``W_Q``, ``W_O`` per query head and
    ``W_K``, ``W_V`` per key/value head, layer by layer. What a parameter count or a
    norm sums over: a key/value factor shared by a group counts once, not once per head.

    >>> len(weight_factors(Architecture(2, 8, n_kv_heads=2)))  # 2 x (8 W_Q + 8 W_O + 2 W_K + 2 W_V)
    40
    """
    out: dict[Atom, None] = {}
    for layer, head in arch.heads():
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            out[atom(name, arch.kv_label(layer, head)) if name in ("W_K", "W_V") else head_atom(name, layer, head)] = None
    return tuple(out)


def unfold_heads(expr, arch: Architecture) -> TensorSum:
    """Replace every ``W_OV^{h}`` and ``W_QK^{h}`` by its factors (:func:`head_factors`):
    with grouped-query attention the heads of a group share their ``W_K``/``W_V`` atom.

    >>> from tensoralg import term
    >>> unfold_heads(term(head_atom("W_QK", 0, 1)), Architecture(1, 2, n_kv_heads=1))
    TensorSum(W_Q^{L0H1}ᵀ W_K^{L0KV0})
    """
    s = expr.expand()
    labels = {head_label(layer, head): (layer, head) for layer, head in arch.heads()}
    out: dict = {}
    for t in s:
        words = []
        for w in t.words:
            new: list[Atom] = []
            for a in w:
                if a.name in ("W_OV", "W_QK") and a.index in labels:
                    factors = head_factors(arch, *labels[a.index])[a.name]
                    new.extend(transpose_word(factors) if a.transposed else factors)
                else:
                    new.append(a)
            words.append(tuple(new))
        key = tuple(words)
        out[key] = out.get(key, 0) + t.coeff
    return TensorSum(out, n_slots=s.n_slots)


# -- streams ------------------------------------------------------------------------


class StreamEntry(NamedTuple):
    """A source entering the residual stream: its first layer, its residual word and the position word
    it enters with (``N^{Ll,post}`` for ``b_O`` behind a norm after attention, else ``Id``)."""

    source: Source
    first_layer: int
    word: Word
    position: Word = ()


class StreamTerm(NamedTuple):
    """One term of a residual stream: ``position ⊗ residual`` for one path."""

    path: Path
    position: Word
    residual: Word


def stream_entries(arch: Architecture, upto: int) -> list[StreamEntry]:
    """The sources present in the residual stream entering layer ``upto`` (``n_layers``: the end)."""
    entries = [StreamEntry(TOKEN, 0, (layer_atom("W_E", ""),))]
    if arch.positional == "standard":
        entries.append(StreamEntry(POSITION, 0, (layer_atom("W_pos", ""),)))
    for m in range(upto):
        if arch.biases:
            lead = (post_scale(m),) if arch.post_norm else ()
            entries.append(StreamEntry(Source("bias", m), m + 1, (layer_atom("b_O", f"L{m}"),), lead))
        if arch.mlp:
            entries.append(StreamEntry(Source("mlp", m), m + 1, ()))
    return entries


def head_sets(arch: Architecture, first: int, upto: int, order: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Every choice of ``order`` heads, one per layer, in layers ``first..upto-1`` increasing."""
    counts = arch.heads_per_layer
    for layers in combinations(range(first, upto), order):
        for heads in product(*(range(counts[j]) for j in layers)):
            yield tuple(zip(layers, heads))


def order_counts(arch: Architecture, first: int, upto: int, max_order: int | None) -> list[int]:
    """``counts[k]``: how many paths of exactly ``k`` heads run through layers ``first..upto-1``
    (the elementary symmetric polynomials of the head counts), for ``k <= max_order``."""
    poly = [1]
    for j in range(first, upto):
        h = arch.heads_per_layer[j]
        poly = [a + h * b for a, b in zip(poly + [0], [0] + poly)]
    return poly if max_order is None else poly[: max_order + 1]


def stream_terms(arch: Architecture, upto: int, max_order: int | None) -> Iterator[tuple[int, StreamTerm]]:
    """``(order, term)`` for the residual stream entering layer ``upto``, source by source,
    then by order, then by layers and heads. Position words carry no final scale."""
    ln, post = arch.pre_norm, arch.post_norm
    for entry in stream_entries(arch, upto):
        top = upto - entry.first_layer
        if max_order is not None:
            top = min(top, max_order)
        for k in range(top + 1):
            for heads in head_sets(arch, entry.first_layer, upto, k):
                position: list[Atom] = []
                residual: list[Atom] = []
                for layer, head in reversed(heads):
                    if post:
                        position.append(post_scale(layer))
                    position.append(head_atom("A", layer, head))
                    if ln:
                        position.append(ln_scale(layer))
                    residual.append(head_atom("W_OV", layer, head))
                yield k, StreamTerm(Path.trusted(entry.source, heads), tuple(position) + entry.position, tuple(residual) + entry.word)


# -- validation shared with the QK expansion ------------------------------------------


def check_arch(arch) -> None:
    if not isinstance(arch, Architecture):
        raise ArchitectureError(f"expected a derivations.Architecture, got {type(arch).__name__} {arch!r}")


def check_limit(limit) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise DerivationError(f"limit must be an int >= 1 (the most terms to build), got {limit!r}")


def refuse_oversize(what: str, per_order: list[int], limit: int) -> None:
    """Raise :class:`TooManyTerms` when ``sum(per_order) > limit``, suggesting the largest
    ``max_order`` whose terms fit (``per_order[k]``: terms of exactly order ``k``)."""
    total = sum(per_order)
    if total <= limit:
        return
    fits, running = None, 0
    for k, n in enumerate(per_order):
        running += n
        if running > limit:
            break
        fits, kept = k, running
    message = f"{what} has {total:,} terms, more than limit={limit:,}"
    if fits is None:
        message += f"; even max_order=0 gives {per_order[0]:,} terms: raise limit"
    else:
        message += f"; pass max_order={fits} (keeps {kept:,} terms) or raise limit"
    raise TooManyTerms(message)


def group_sum(collected: dict[tuple[Word, ...], sp.Expr], n_slots: int, what: str) -> TensorSum:
    """The canonical sum of ``{words: coeff}``, without re-checking every word's shape.

    The terms of one expansion are distinct (a path's words name its own heads and
    source) and, for sources that share an input, chain by construction — the tests
    check both — so each slot's shape is read off its first non-identity word. Several
    times faster than ``TensorSum(terms)`` on large expansions.
    """
    if not collected:
        raise DerivationError(f"{what} has no terms")
    shapes = tuple(word_shape(next((w[i] for w in collected if w[i]), ())) for i in range(n_slots))
    return TensorSum.from_canonical(collected, n_slots, shapes)


# -- the logits ------------------------------------------------------------------------


class LogitExpansion:
    """The logits as a sum of :class:`PathTerm`, generated lazily (each iteration rebuilds);
    :func:`expand_logits` builds one after checking the size.

    ``len()`` is exact and computed without building. Terms come source by source
    (token, position, then each layer's ``b_O`` and MLP, then ``b_U``), each source by
    order, then by layers and heads.
    """

    def __init__(self, arch: Architecture, max_order: int | None = None):
        check_arch(arch)
        check_order(max_order, arch.n_layers, f"the logits of a {arch.n_layers}-layer model")
        self.arch = arch
        self.max_order = max_order
        L = arch.n_layers
        self._entries = stream_entries(arch, L)
        self._counts = {e.source: order_counts(arch, e.first_layer, L, max_order) for e in self._entries}
        if arch.biases:
            self._counts[UNEMBED_BIAS] = [1]

    @property
    def sources(self) -> tuple[Source, ...]:
        return tuple(self._counts)

    @property
    def n_terms(self) -> int:
        """The exact number of terms (``len()`` too, up to ``sys.maxsize``)."""
        return sum(map(sum, self._counts.values()))

    def __len__(self) -> int:
        return self.n_terms

    def __iter__(self) -> Iterator[PathTerm]:
        return _logit_terms(self.arch, self.max_order)

    def direct_terms(self) -> list[PathTerm]:
        """The terms through no head (each source alone, then ``b_U``), in the expansion's order.

        >>> [t.label for t in expand_logits(Architecture(2, 2, biases=True)).direct_terms()]
        ['tok (direct)', 'b_O^L0 (direct)', 'b_O^L1 (direct)', 'b_U (direct)']
        """
        return list(_logit_terms(self.arch, 0))

    def count_by_source(self) -> dict[Source, int]:
        """How many terms each source gives (computed without building)."""
        return {s: sum(c) for s, c in self._counts.items()}

    def count_by_order(self) -> dict[int, int]:
        """How many terms of each order (computed without building)."""
        out: dict[int, int] = {}
        for counts in self._counts.values():
            for k, n in enumerate(counts):
                out[k] = out.get(k, 0) + n
        return out

    def by_order(self) -> dict[int, list[PathTerm]]:
        """The terms grouped by order (number of heads), orders increasing."""
        out: dict[int, list[PathTerm]] = {k: [] for k in sorted(self.count_by_order())}
        for t in self:
            out[t.order].append(t)
        return {k: v for k, v in out.items() if v}

    def by_source(self) -> dict[Source, list[PathTerm]]:
        """The terms grouped by source, in the order of :attr:`sources`."""
        out: dict[Source, list[PathTerm]] = {s: [] for s in self._counts}
        for t in self:
            out[t.source].append(t)
        return out

    def to_tensor_sum(self, source: Source | str | None = None) -> TensorSum:
        """The canonical :class:`TensorSum` of the terms of ``source`` (a :class:`Source`,
        its label such as ``"tok"``, or an input key such as ``"constant"``), or of all terms.

        Sources with different inputs ``X`` (token one-hots, positions, ones, each MLP's
        output) cannot share one sum: their residual words have different shapes, and
        even equal shapes (two MLPs) would add terms that act on different inputs. So
        with ``source=None`` every term must act on the same input (true without
        ``standard`` positions, biases and MLPs); otherwise this raises and
        :meth:`to_tensor_sums` gives one sum per input.
        """
        keys = {s.input_key for s in self._counts}
        if source is None:
            if len(keys) > 1:
                raise DerivationError(
                    "the logits' terms act on different inputs (" + ", ".join(sorted(keys)) + ") and cannot be "
                    "added into one TensorSum; pass source= one of "
                    + ", ".join(repr(s.label) for s in self._counts)
                    + " or an input key, or use to_tensor_sums()"
                )
            return group_sum({t.term.words: t.term.coeff for t in self}, 2, "the logits")
        pick = _source_filter(source, self._counts)
        return group_sum({t.term.words: t.term.coeff for t in self if pick(t.source)}, 2, f"source {source}")

    def to_tensor_sums(self) -> dict[str, TensorSum]:
        """One canonical sum per input key (``token``, ``position``, ``constant``, ``mlp^L{l}``)."""
        groups: dict[str, dict] = {}
        for t in self:
            groups.setdefault(t.source.input_key, {})[t.term.words] = t.term.coeff
        return {k: group_sum(v, 2, f"input {k}") for k, v in groups.items()}

    def _repr_markdown_(self) -> str:
        """What a notebook shows: the count, then one sum per input as maths (long ones elided)."""
        return expansion_markdown(repr(self), {f"input {k}": s for k, s in self.to_tensor_sums().items()})

    def __repr__(self) -> str:
        order = "" if self.max_order is None else f", max_order={self.max_order}"
        return f"LogitExpansion({self.arch.describe()}{order}: {counted(self.n_terms, 'term')})"


def _logit_terms(arch: Architecture, max_order: int | None) -> Iterator[PathTerm]:
    head = ((layer_atom("N", "final"),) if arch.normalised else (), (layer_atom("W_U", ""),))
    for _, st in stream_terms(arch, arch.n_layers, max_order):
        yield PathTerm(st.path, Term(ONE, (head[0] + st.position, head[1] + st.residual)))
    if arch.biases:
        yield PathTerm(Path(UNEMBED_BIAS), Term(ONE, ((), (layer_atom("b_U", ""),))))


def _source_filter(source, known):
    if isinstance(source, Source):
        if source not in known:
            raise DerivationError(f"source {source.label} is not in this expansion; its sources: "
                                  + ", ".join(s.label for s in known))
        return lambda s: s == source
    labels = {s.label: s for s in known}
    if source in labels:
        return lambda s: s == labels[source]
    keys = {s.input_key for s in known}
    if source in keys:
        return lambda s: s.input_key == source
    raise DerivationError(
        f"unknown source {source!r}; expected a Source, one of the labels " + ", ".join(map(repr, labels))
        + " or one of the input keys " + ", ".join(map(repr, sorted(keys)))
    )


def estimate_logit_terms(arch: Architecture, max_order: int | None = None) -> int:
    """The exact number of terms :func:`expand_logits` would build, without building them.

    >>> estimate_logit_terms(Architecture(3, 12)), estimate_logit_terms(Architecture(3, 12), 1)
    (2197, 37)
    """
    return LogitExpansion(arch, max_order).n_terms


def expand_logits(arch: Architecture, max_order: int | None = None, *, limit: int = 1_000_000) -> LogitExpansion:
    """The logits as a path sum: direct paths, single heads and virtual heads of each source.

    ``max_order`` keeps paths through at most that many heads. Raises
    :class:`TooManyTerms` (suggesting a ``max_order`` that fits) when more than ``limit``
    terms would be built.

    >>> e = expand_logits(Architecture(1, 2))
    >>> print(e.to_tensor_sum())
    Id ⊗ W_U W_E + A^{L0H0} ⊗ W_U W_OV^{L0H0} W_E + A^{L0H1} ⊗ W_U W_OV^{L0H1} W_E
    """
    check_limit(limit)
    expansion = LogitExpansion(arch, max_order)
    if expansion.n_terms > limit:
        refuse_oversize(
            f"the logits of {arch.describe()}",
            [n for k, n in sorted(LogitExpansion(arch).count_by_order().items())],
            limit,
        )
    return expansion


# -- the input of an MLP ----------------------------------------------------------------


def _mlp_entries(arch: Architecture, layer: int) -> tuple[int, list[StreamEntry]]:
    """``(upto, entries)``: the MLP of ``layer`` reads the stream entering layer ``upto`` —
    ``layer + 1`` in a sequential block (after its own attention), ``layer`` in a parallel
    one — less its own output."""
    if not arch.mlp:
        raise ArchitectureError(f"the model has no MLPs, so layer {layer} has no MLP input; pass mlp=True")
    arch.check_head(layer, 0)
    upto = layer if arch.parallel else layer + 1
    own = Source("mlp", layer)
    return upto, [e for e in stream_entries(arch, upto) if e.source != own]


def estimate_mlp_input_terms(arch: Architecture, layer: int, max_order: int | None = None) -> int:
    """The number of terms :func:`expand_mlp_input` builds, counted without building.

    A parallel block's MLP misses every path through its own layer's heads:

    >>> sequential = Architecture(2, 3, mlp=True)
    >>> estimate_mlp_input_terms(sequential, 1), estimate_mlp_input_terms(Architecture(2, 3, mlp=True, parallel=True), 1)
    (20, 5)
    """
    check_arch(arch)
    upto, entries = _mlp_entries(arch, layer)
    check_order(max_order, upto, f"the input of layer {layer}'s MLP")
    return sum(sum(order_counts(arch, e.first_layer, upto, max_order)) for e in entries)


def mlp_input_terms(arch: Architecture, layer: int, max_order: int | None = None) -> Iterator[PathTerm]:
    """The input of layer ``layer``'s MLP as path terms ``(N^{mlp} P) ⊗ W`` (``N^{mlp}`` with
    a norm: :func:`mlp_ln_scale`), source by source, then by order, lazily. Paths end here:
    the MLP is opaque (gated ones too), and its output is a source of its own."""
    check_arch(arch)
    upto, entries = _mlp_entries(arch, layer)
    check_order(max_order, upto, f"the input of layer {layer}'s MLP")
    own = Source("mlp", layer)
    lead = (mlp_ln_scale(arch, layer),) if arch.pre_norm else ()
    for _, st in stream_terms(arch, upto, max_order):
        if st.path.source != own:
            yield PathTerm(st.path, Term(ONE, (lead + st.position, st.residual)))


def expand_mlp_input(arch: Architecture, layer: int, max_order: int | None = None, *,
                     limit: int = 1_000_000) -> list[PathTerm]:
    """The terms of :func:`mlp_input_terms`, built after checking there are at most ``limit``.

    >>> [t.label for t in expand_mlp_input(Architecture(1, 2, mlp=True), 0)]
    ['tok (direct)', 'tok→L0H0', 'tok→L0H1']
    >>> [t.label for t in expand_mlp_input(Architecture(1, 2, mlp=True, parallel=True), 0)]
    ['tok (direct)']
    """
    check_limit(limit)
    n = estimate_mlp_input_terms(arch, layer, max_order)
    if n > limit:
        upto, entries = _mlp_entries(arch, layer)
        per_order = [0] * (upto + 1)
        for e in entries:
            for k, c in enumerate(order_counts(arch, e.first_layer, upto, None)):
                per_order[k] += c
        refuse_oversize(f"the input of layer {layer}'s MLP in {arch.describe()}", per_order, limit)
    return list(mlp_input_terms(arch, layer, max_order))
