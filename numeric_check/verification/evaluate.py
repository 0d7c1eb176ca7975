"""Evaluating every term of an expansion at once, sharing the work common to many terms.

A logits term ``c · P ⊗ W`` contributes ``c · P X Wᵀ`` (``X`` its source's input, one row
per position); a QK term ``c · P ⊗ Q ⊗ M`` contributes ``c · P X_q M X_kᵀ Qᵀ`` (its two sides:
:mod:`numeric_check.verification.evaluate_qk`). Both are evaluated as *streams*: start from ``X`` and apply one operation at a time, either a
position-side atom on the left (``Y ← A Y``, or a diagonal layer-norm scale) or a factor on
the right (``Y ← Y R``). ``X`` is never formed for tokens: the first factor is gathered by
token id. Residual atoms are applied factor by factor (``W_OV`` as ``W_V`` then ``W_O``), so
a stream is at most ``d_model`` wide and often ``d_head``.

Sharing: the operations of all streams form a trie rooted at the sources' inputs, walked
depth first, so a prefix such as ``X W_Eᵀ W_V^{L0H3}ᵀ`` followed by ``A^{L0H3}`` is computed
once for every term that starts with it. Each word is cut where it is narrowest: the
part towards the source is applied in the trie, the part towards the output (``W_U``, or
``W_U W_O^h``) is left for the consumer, so that

- the sum of all logits terms needs a single unembedding (terms are summed by their left
  part first: the common prefix ``W_U`` is applied once), and
- a term's Frobenius norm uses the Gram matrix of its left part (``W_Uᵀ W_U`` once for
  every term), never the term's ``[batch, pos, d_vocab]`` logits.

A ``vocab × vocab`` matrix is never formed. Operations are chosen in a canonical order
(by layer: ``W_V`` first, then the position side, then ``W_O``) so that terms which share
heads share prefixes.

Most terms end one head below a shared node (at order 2, the second head of a path): one right
factor (``W_O^{h1}`` fused with ``W_V^{h2}``), then position-side atoms (``N^{l2}``, ``A^{h2}``,
``N^{final}``). Such sibling *leaf chains* are evaluated together: ``Y [F_1 | … | F_k]`` in one
product, then each chain's position atoms as one ``[b, pos, pos]`` matrix, stacked, in one batched
product (a GPT-2-small-sized order-2 expansion: about 3,900 nodes instead of 207,000 operations).

>>> from derivations.architecture import Architecture
>>> from derivations.paths import expand_logits
>>> from numeric_check.verification.bind import Binder
>>> from numeric_check.verification.hook_paths import record
>>> from numeric_check.model.circuit_model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0, dtype=torch.float64)
>>> rec = record(model, torch.tensor([[1, 2, 3, 4]]))
>>> ev = LogitEvaluator(Binder(model, rec), list(expand_logits(model.arch)))
>>> total = LogitSum(ev)
>>> for value in ev.values():
...     total.add(value)
>>> bool(torch.allclose(total.logits(), rec.logits))
True
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterator, Mapping, NamedTuple, Sequence

import torch
from torch import Tensor

from derivations.paths import PathTerm, Source
from numeric_check.model.circuit_model import widened
from numeric_check.verification.bind import Binder, SourceInput
from numeric_check.verification.constants import UnembedConstants, gram  # noqa: F401 - gram: public here too
from tensoralg.atoms import Atom, Word

# A right-multiplier ``R`` of a stream: ``(base atom, factor index j, transposed)`` stands for
# factor ``j`` of the base atom's binding, transposed when the flag is set.
FactorRef = tuple[Atom, int, bool]
OpKey = tuple  # ("P", atom), ("R", base atom, j, transposed) or ("F", ref, ref): two factors fused

_LAST = 10**9  # stage of W_U, b_U, N^{final}: after every layer


_STAGES: dict[Atom, int] = {}


def _stage(a: Atom) -> int:
    """The layer an atom belongs to, for ordering operations (``W_E``, ``W_pos``: -1; output: last)."""
    stage = _STAGES.get(a)
    if stage is None:
        stage = _STAGES[a] = _stage_of(a)
    return stage


def _stage_of(a: Atom) -> int:
    index = a.index
    if index.startswith("L"):
        digits = ""
        for ch in index[1:]:
            if not ch.isdigit():
                break
            digits += ch
        if digits:
            return int(digits)
    if index == "final" or a.name in ("W_U", "b_U"):
        return _LAST
    return -1


class _Factor(NamedTuple):
    ref: FactorRef  # this factor F of the word, as (base atom, j, transposed)
    atom: Atom
    rows: int
    cols: int


class StreamSpec(NamedTuple):
    """One stream: a source and its operations in application order."""

    source: Source
    ops: tuple[OpKey, ...]


class LogitTermValue(NamedTuple):
    """A logits term evaluated up to its narrowest point: its logits are ``coeff · y @ R_1 @ … @ R_k``.

    ``index`` is the term's position in the list given to the evaluator; ``left`` the
    remaining right-multipliers ``R`` (``W_Uᵀ`` last); ``y`` is ``[batch, pos, r]``.
    """

    index: int
    coeff: float
    y: Tensor
    left: tuple[FactorRef, ...]


_NO_CHILDREN: Mapping = MappingProxyType({})


class _Node:
    """A trie node: its children by operation and the streams that end here (both made when first
    needed: most nodes of an order-3 expansion are leaves, and most have no stream ending)."""

    __slots__ = ("children", "ends")

    def __init__(self) -> None:
        self.children: Mapping[OpKey, _Node] = _NO_CHILDREN
        self.ends: tuple[int, ...] = ()


class StreamTrie:
    """Streams sharing their common prefixes of operations; :meth:`walk` evaluates them all.

    Add streams with :meth:`add` (returns the stream's id); :meth:`walk` yields ``(ids, Y)``
    for each trie node where streams end, depth first, keeping only the current branch
    in memory. ``Y`` is ``[batch, pos, width]``; it is never modified afterwards.
    """

    def __init__(self, binder: Binder):
        self.binder = binder
        self.roots: dict[str, tuple[Source, _Node]] = {}
        self._fused: dict[OpKey, Tensor] = {}
        self._side_by_side: dict[tuple[OpKey, ...], Tensor] = {}  # right factors of sibling leaf chains, concatenated
        self._stacked_runs: tuple = ((), None)  # their position-side runs as matrices, stacked (the last set)
        self._runs: dict[tuple[Atom, ...], Tensor] = {}  # each run of position-side atoms as one matrix
        self._ops: dict[OpKey, OpKey] = {}
        self.n_streams = 0
        self.n_ops = 0  # operations applied by walk(): the work after sharing

    def add(self, spec: StreamSpec) -> int:
        key = spec.source.input_key
        if key not in self.roots:
            self.roots[key] = (spec.source, _Node())
        node = self.roots[key][1]
        for op in spec.ops:
            child = node.children.get(op)
            if child is None:
                if node.children is _NO_CHILDREN:
                    node.children = {}
                op = self._ops.setdefault(op, op)  # one key object per operation, however many streams apply it
                child = node.children[op] = _Node()
            node = child
        node.ends += (self.n_streams,)
        self.n_streams += 1
        return self.n_streams - 1

    def walk(self) -> Iterator[tuple[tuple[int, ...], Tensor]]:
        for source, root in self.roots.values():
            yield from self._walk(root, self.binder.source_input(source))

    def _walk(self, node: _Node, value) -> Iterator[tuple[tuple[int, ...], Tensor]]:
        if node.ends:
            if isinstance(value, SourceInput):
                value = value.as_dense()
            yield node.ends, value
        chains = [] if isinstance(value, SourceInput) else _leaf_chains(node)
        per_product = _STACKED_POSITIONS // max(1, value.shape[0] * value.shape[-2] ** 2) if chains else 0
        if len(chains) > 1 and per_product > 1:  # (else one [b, pos, pos] run is too large to stack)
            yield from self._leaves_at_once(chains, value, per_product)
            chained = {id(chain[1]) for chain in chains}
        else:
            chained = set()
        for op, child in node.children.items():
            if id(child) not in chained:
                self.n_ops += 1
                yield from self._walk(child, self.apply(op, value))

    def _leaves_at_once(self, chains: list[tuple], value: Tensor, per_product: int) -> Iterator[tuple[tuple[int, ...], Tensor]]:
        """The leaf chains below one node (see :func:`_leaf_chains`) in two products for all of them:
        ``Y [R_1 | … | R_k]`` (the right factors side by side, made once per set of chains), then
        each chain's position-side operations as one matrix, stacked: ``P_i (Y R_i)`` for every ``i``.
        Chains whose factors differ in width go in separate groups, of at most ``per_product``."""
        by_width: dict[int, list[tuple]] = {}
        for chain in chains:
            op = chain[0]  # its output width, without forming a fused factor
            by_width.setdefault(right_multiplier(self.binder, op[2] if op[0] == "F" else op[1:]).shape[1], []).append(chain)
        groups = [(width, same[i:i + per_product]) for width, same in by_width.items() for i in range(0, len(same), per_product)]
        for width, group in groups:
            ops = tuple(chain[0] for chain in group)
            side = self._side_by_side.get(ops)
            if side is None:  # kept when fused (they recur below every source; not kept one by one as well)
                side = self._side_by_side_of(ops)
                if all(op[0] == "F" for op in ops):  # (plain factors, W_V^h below a source, come once each)
                    self._side_by_side[ops] = side
            runs = tuple(chain[2] for chain in group)
            if self._stacked_runs[0] != runs:  # siblings of the next node usually have the same runs
                self._stacked_runs = (runs, torch.stack([self._position_run(run, value) for run in runs]))
            y = (value @ side).unflatten(-1, (len(group), width)).movedim(-2, 0)  # [k, b, pos, width]
            out = self._stacked_runs[1] @ y  # [k, b, pos, width]
            self.n_ops += 2
            for chain, leaf in zip(group, out.unbind(0)):
                yield chain[3].ends, leaf

    def _side_by_side_of(self, ops: tuple[OpKey, ...]) -> Tensor:
        """``[R_1 | … | R_k]`` for right-multiplying operations; fused ones that share their first
        factor (``W_O^{h1}`` then each ``W_V^{h2}``) as one product, ``R [S_1 | … | S_k]``."""
        firsts = {op[1] if op[0] == "F" else None for op in ops}
        if len(firsts) == 1 and None not in firsts:
            rest = torch.cat([right_multiplier(self.binder, op[2]) for op in ops], 1)
            return right_multiplier(self.binder, ops[0][1]) @ rest
        return torch.cat([self._right(op, keep=False) for op in ops], 1)

    def _right(self, op: OpKey, keep: bool = True) -> Tensor:
        """The matrix of a right-multiplying operation (``R`` or ``F``; a fused one kept when ``keep``)."""
        if op[0] == "F":
            R = self._fused.get(op)
            if R is None:
                R = right_multiplier(self.binder, op[1]) @ right_multiplier(self.binder, op[2])
                if keep:
                    self._fused[op] = R
            return R
        return right_multiplier(self.binder, op[1:])

    def _position_run(self, atoms: tuple[Atom, ...], like: Tensor) -> Tensor:
        """The position-side atoms applied one after the other, as one matrix ``[b, pos, pos]``."""
        if atoms not in self._runs:
            b, p = like.shape[0], like.shape[-2]
            m = torch.eye(p, dtype=like.dtype, device=like.device).expand(b, p, p)
            for a in atoms:
                m = self.apply(("P", a), m)
            self._runs[atoms] = m
        return self._runs[atoms]

    def apply(self, op: OpKey, value) -> Tensor:
        """One operation on a stream ``[b, pos, r]`` (or on a source's lazy input)."""
        if op[0] == "P":
            pos = self.binder.position(op[1])
            if isinstance(value, SourceInput):
                value = value.as_dense()
            if pos.diagonal:
                return pos.value[..., None] * value
            return pos.value @ value
        R = self._right(op)
        if isinstance(value, SourceInput):
            return value.times_transpose(R.T)
        return value @ R


_STACKED_POSITIONS = 1 << 22  # entries of the stacked [k, b, pos, pos] position matrices of one product


def _leaf_chains(node: _Node) -> list[tuple[OpKey, _Node, tuple[Atom, ...], _Node]]:
    """The children of ``node`` that start a *leaf chain*: one right factor (``R`` or ``F``), then
    one or more position-side atoms, then the end of streams and nothing below; as
    ``(right op, child, position atoms in order, last node)``. Below a head they are the
    terms that end one head later, most terms of an expansion."""
    chains = []
    for op, child in node.children.items():
        if op[0] == "P" or child.ends or len(child.children) != 1:
            continue
        atoms, last = [], child
        while len(last.children) == 1 and not last.ends:
            (step, last), = last.children.items()
            if step[0] != "P":
                break
            atoms.append(step[1])
        else:
            if last.ends and not last.children and atoms:
                chains.append((op, child, tuple(atoms), last))
    return chains


_CONTIGUOUS_LIMIT = 1 << 22  # entries up to which a transposed factor is copied contiguous (never W_U, W_E)


def right_multiplier(binder: Binder, ref: FactorRef) -> Tensor:
    """The matrix ``R`` that ``ref`` stands for.

    A small transposed factor is returned as a contiguous copy, made once per binder: with
    a transposed right operand and a short inner dimension (``y @ W_Oᵀ``, 64 wide) the CPU
    float64 product is about 2x slower.
    """
    base, j, transposed = ref
    F = binder.factors(base)[j]
    if not transposed:
        return F
    if F.numel() > _CONTIGUOUS_LIMIT or F.T.is_contiguous():
        return F.T
    cache = binder.__dict__.setdefault("_right_multipliers", {})
    if ref not in cache:
        cache[ref] = F.T.contiguous()
    return cache[ref]


def word_factors(binder: Binder, word: Word) -> list[_Factor]:
    """The factors of a word, left to right, each with its reference and size (each atom's
    made once per binder: an expansion repeats a few hundred atoms in tens of thousands of words)."""
    cache = binder.__dict__.setdefault("_atom_factors", {})
    out: list[_Factor] = []
    for a in word:
        factors = cache.get(a)
        if factors is None:
            factors = cache[a] = _atom_factors(binder, a)
        out += factors
    return out


def _atom_factors(binder: Binder, a: Atom) -> list[_Factor]:
    base = a.base
    base_factors = binder.factors(base)
    n = len(base_factors)
    out = []
    for j in (range(n - 1, -1, -1) if a.transposed else range(n)):
        F = base_factors[j]
        rows, cols = (F.shape[1], F.shape[0]) if a.transposed else (F.shape[0], F.shape[1])
        out.append(_Factor((base, j, a.transposed), a, rows, cols))
    return out


def flip(ref: FactorRef) -> FactorRef:
    """The same factor, transposed the other way (``Fᵀ`` for ``F``)."""
    return (ref[0], ref[1], not ref[2])


def _merge(position: Word, rights: list[tuple[FactorRef, Atom, int, int]]) -> tuple[OpKey, ...]:
    """Position atoms (applied last-first) and right-multipliers ``(ref, atom, input width,
    output width)`` (in application order), merged by layer; within a layer the position
    side comes right after the layer's narrowest factor (``W_V`` of ``W_OV``), where it is
    cheapest. Two neighbouring factors that widen then narrow (``W_O^{L0}`` then ``W_V^{L1}``:
    ``d_head → d_model → d_head``) become one fused operation, their small product."""
    by_stage: dict[int, tuple[list, list]] = {}  # stage -> (right factors, position atoms), each side in order
    for ref, a, w_in, w_out in rights:
        by_stage.setdefault(_stage(a), ([], []))[0].append((("R",) + ref, (w_in, w_out)))
    for a in reversed(position):
        by_stage.setdefault(_stage(a), ([], []))[1].append((("P", a), None))
    ops: list = []
    for stage in sorted(by_stage):
        here, pos = by_stage[stage]
        if here:
            narrowest = min(widths[1] for _, widths in here)
            split = next(k for k, (_, widths) in enumerate(here) if widths[1] == narrowest) + 1
            ops += here[:split] + pos + here[split:]
        else:
            ops += pos
    return _fuse(ops)


def _fuse(ops: list[tuple[OpKey, tuple[int, int] | None]]) -> tuple[OpKey, ...]:
    """Replace each right factor that widens followed by one that narrows by their product."""
    out: list[OpKey] = []
    k = 0
    while k < len(ops):
        (op, widths), nxt = ops[k], ops[k + 1] if k + 1 < len(ops) else (None, None)
        if widths and nxt[1] and widths[1] > widths[0] and widths[1] > nxt[1][1]:
            out.append(("F", op[1:], nxt[0][1:]))
            k += 2
        else:
            out.append(op)
            k += 1
    return tuple(out)


def _narrowest(widths: Sequence[int], prefer: Sequence[bool] = ()) -> int:
    """The index of the smallest width (the first preferred index, when any is preferred)."""
    preferred = [i for i, p in enumerate(prefer) if p]
    if preferred:
        return preferred[0]
    return widths.index(min(widths))


# --- logits ---------------------------------------------------------------------------------


class LogitEvaluator:
    """All terms of a logits expansion (a list of :class:`~derivations.paths.PathTerm`), shared.

    :meth:`values` yields a :class:`LogitTermValue` per term (in trie order, not list
    order); :meth:`logits` and :meth:`norm` finish one term; :class:`LogitSum` adds them.
    ``constants``: the model's :class:`~numeric_check.verification.constants.UnembedConstants`, where
    ``W_Uᵀ W_U`` is kept between verifications of one model.
    """

    def __init__(self, binder: Binder, terms: Sequence[PathTerm], constants: UnembedConstants | None = None):
        self.binder, self.constants = binder, constants
        self.terms = list(terms)
        self.trie = StreamTrie(binder)
        self._left: list[tuple[FactorRef, ...]] = []
        self._coeffs: list[float] = []
        self._stream_of: dict[int, list[int]] = {}
        self._grams: dict[tuple[FactorRef, ...], Tensor] = {}
        for index, t in enumerate(self.terms):
            spec, left = self.plan(t)
            self._stream_of.setdefault(self.trie.add(spec), []).append(index)
            self._left.append(left)
            self._coeffs.append(binder.coeff(t.term.coeff))

    def plan(self, t: PathTerm) -> tuple[StreamSpec, tuple[FactorRef, ...]]:
        """The stream of a term and the right-multipliers left after its narrowest point."""
        position, residual = t.term.words
        factors = word_factors(self.binder, residual)
        # cut c (1..m): left F_1..F_c, applied F_{c+1}..F_m; its width is cols(F_c)
        widths = [f.cols for f in factors[:-1]] + [self.binder.input_width(t.source)]
        c = _narrowest(widths) + 1
        rights = [(flip(f.ref), f.atom, f.cols, f.rows) for f in reversed(factors[c:])]  # Y ← Y Fᵀ
        left = tuple(flip(f.ref) for f in reversed(factors[:c]))
        return StreamSpec(t.source, _merge(position, rights)), left

    def values(self) -> Iterator[LogitTermValue]:
        """Every term, evaluated up to its narrowest point, depth first through the trie."""
        for ids, y in self.trie.walk():
            for stream in ids:
                for index in self._stream_of[stream]:
                    yield LogitTermValue(index, self._coeffs[index], y, self._left[index])

    def last_factor_named(self, name: str) -> FactorRef | None:
        """The reference of the last right-multiplier named ``name`` (e.g. ``"W_U"``) that ends some term, or None."""
        return next((left[-1] for left in self._left if left[-1][0].name == name), None)

    def apply_left(self, y: Tensor, left: Sequence[FactorRef]) -> Tensor:
        for ref in left:
            y = y @ right_multiplier(self.binder, ref)
        return y

    def parts(self, value: LogitTermValue) -> dict[FactorRef, Tensor]:
        """The term before its last right-multiplier (``W_Uᵀ`` or ``b_Uᵀ``): ``{R: y}``, logits ``y @ R``."""
        return {value.left[-1]: self.apply_left(_scaled(value), value.left[:-1])}

    def logits(self, value: LogitTermValue) -> Tensor:
        """The term's contribution to the logits, ``[batch, pos, d_vocab]``."""
        return self.apply_left(_scaled(value), value.left)

    def gram(self, left: tuple[FactorRef, ...], wide: bool = False) -> Tensor:
        """``K = (R_1 … R_k)(R_1 … R_k)ᵀ``, cached by suffix (``W_Uᵀ W_U`` is computed once); ``wide``: in
        float64 (:meth:`squares`: where the working dtype's Gram matrix overflows)."""
        key = (left, wide)
        if key not in self._grams:
            R = right_multiplier(self.binder, left[0])
            R = R.double() if wide else R
            if len(left) == 1 and left[0][0].name == "W_U" and self.constants is not None and not wide:
                self._grams[key] = self.constants.get(f"gram {left[0][1]} {left[0][2]}", lambda: gram(R))
            elif len(left) == 1:
                self._grams[key] = gram(R)
            else:
                self._grams[key] = R @ self.gram(left[1:], wide) @ R.T
        return self._grams[key]

    def squares(self, y: Tensor, left: tuple[FactorRef, ...], reduce) -> Tensor:
        """``reduce((y K) ∘ y)``, ``K`` the Gram matrix of ``left``: squared norms of ``y``'s rows through ``left``.
        Where the working dtype overflows (float32 weights near 1e4: ``K`` past 3.4e38 while ``y`` is tiny), again
        in float64, so a finite term never gets a NaN norm."""
        out = reduce((y @ self.gram(left)) * y)
        if out.dtype != torch.float64 and not bool(torch.isfinite(out).all()):
            y = y.double()
            out = reduce((y @ self.gram(left, wide=True)) * y)
        return out

    def max_row_norm(self, value: LogitTermValue) -> float:
        """The largest row norm (over positions) of ``parts(value)``, the term's input to its last
        multiplier, from the Gram matrix of the left part before it (no full-width product)."""
        return self.batch_max_row_norm(_batch([value], value.left))

    def norm(self, value: LogitTermValue) -> float:
        """The Frobenius norm of the term's logits over the batch, from the Gram matrix of its left part."""
        return self.batch_norms(_batch([value], value.left))[0]

    # -- many terms at once --------------------------------------------------------------------
    def batches(self, values: Sequence[LogitTermValue]) -> list["TermBatch"]:
        """``values`` grouped by their remaining multipliers ``left`` and stacked, one
        :class:`TermBatch` per group (first appearance order; within a group, the given order):
        what follows is one product per group instead of one per term."""
        groups: dict[tuple[FactorRef, ...], list[LogitTermValue]] = {}
        for value in values:
            groups.setdefault(value.left, []).append(value)
        out = []
        for left, group in groups.items():
            if len({tuple(v.y.shape) for v in group}) > 1:  # cannot stack: one batch per term
                out += [_batch([v], left) for v in group]
            else:
                out.append(_batch(group, left))
        return out

    def batch_norms(self, batch: "TermBatch") -> list[float]:
        """Each term's Frobenius norm over the batch (:meth:`norm` for many terms)."""
        squared = self.squares(batch.y, batch.left, lambda q: q.flatten(1).sum(1))
        return squared.clamp_min(0).sqrt().tolist()

    def batch_max_row_norm(self, batch: "TermBatch") -> float:
        """The largest :meth:`max_row_norm` of the batch's terms."""
        y, inner = batch.y, batch.left[:-1]
        if not y.numel():
            return 0.0
        squared = self.squares(y, inner, lambda q: q.sum(-1).max()) if inner else widened(lambda y: y.pow(2).sum(-1).max(), y)
        return max(float(squared), 0.0) ** 0.5


class TermBatch(NamedTuple):
    """Terms that share their remaining right-multipliers ``left``, stacked: ``y`` is
    ``[n, batch, pos, r]``, each term's stream already times its coefficient, so that term ``i``'s
    logits are ``y[i] @ R_1 @ … @ R_k``; ``values`` are the terms in the order stacked."""

    values: list[LogitTermValue]
    left: tuple[FactorRef, ...]
    y: Tensor


def _batch(values: list[LogitTermValue], left: tuple[FactorRef, ...]) -> TermBatch:
    y = torch.stack([v.y for v in values])
    coeffs = [v.coeff for v in values]
    if any(c != 1 for c in coeffs):
        y = y * y.new_tensor(coeffs).view(-1, *([1] * (y.dim() - 1)))
    return TermBatch(values, left, y)


def _scaled(value: LogitTermValue) -> Tensor:
    """``coeff · y``, scaled where the term is narrowest (``y`` itself when ``coeff`` is 1)."""
    return value.y if value.coeff == 1 else value.coeff * value.y


class LogitSum:
    """Adds evaluated terms by their left parts, then applies each left part once.

    >>> # see the module docstring for a complete example
    """

    def __init__(self, evaluator: LogitEvaluator):
        self.evaluator = evaluator
        self.groups: dict[tuple[FactorRef, ...], Tensor] = {}

    def add(self, value: LogitTermValue, sign: float = 1.0) -> None:
        part = (sign * value.coeff) * value.y
        previous = self.groups.get(value.left)
        self.groups[value.left] = part if previous is None else previous + part

    def add_batch(self, batch: TermBatch) -> None:
        """Add every term of ``batch`` (:meth:`add` for many terms: one sum for the group)."""
        part = batch.y.sum(0)
        previous = self.groups.get(batch.left)
        self.groups[batch.left] = part if previous is None else previous + part

    def parts(self) -> dict[FactorRef, Tensor]:
        """The sum before its last right-multiplier: ``{R: y}`` with logits ``Σ y @ R``.

        For logits the last multipliers are ``W_Uᵀ`` (``y`` is then the sum's contribution to
        the unembedding's input, ``[batch, pos, d_model]``) and ``b_Uᵀ``.
        """
        groups = dict(self.groups)
        out: dict[FactorRef, Tensor] = {}
        while groups:
            left = max(groups, key=len)
            y = groups.pop(left)
            if len(left) == 1:
                out[left[0]] = y if left[0] not in out else out[left[0]] + y
                continue
            y = y @ right_multiplier(self.evaluator.binder, left[0])
            rest = left[1:]
            groups[rest] = y if rest not in groups else groups[rest] + y
        return out

    def logits(self) -> Tensor | None:
        """The sum's logits ``[batch, pos, d_vocab]``, or ``None`` when nothing was added."""
        total = None
        for ref, y in self.parts().items():
            y = y @ right_multiplier(self.evaluator.binder, ref)
            total = y if total is None else total + y
        return total


def evaluate_term_alone(binder: Binder, term: PathTerm) -> Tensor:
    """One term's logits computed on its own (no sharing), for comparisons and benchmarks."""
    ev = LogitEvaluator(binder, [term])
    (value,) = ev.values()
    return ev.logits(value)
