"""Path attribution: which paths make the model predict this token?

With attention patterns and layer-norm scales frozen at their values on a prompt, the logits are
the sum of the path terms of :func:`derivations.paths.expand_logits` (direct path, each head,
each virtual head, from every source: tokens, positions, each layer's biases and MLP output, the
unembedding bias). :func:`attribute` gives every term's contribution to *one* number: the
target's logit at one position, or the difference of two tokens' logits, ranked by size and
labelled as :func:`~numeric_check.verification.verify.verify_logits` labels them
(``tok→L5H1→L6H9``, ``mlp^L3 (direct)``).

One entry of a term ``c · P ⊗ W`` is ``c · e_pᵀ P X Wᵀ d`` (``d``: the target's one-hot, or
``e_A - e_B``), so it is contracted from the output side (:class:`TargetContraction`): the row
``e_pᵀ P`` over positions and the direction ``dᵀ W`` over the residual stream, each built
atom by atom from the verification's :class:`~numeric_check.verification.bind.Binder` and
shared by every term with the same prefix, then one product with the source's input ``X``. No
``[pos, d_vocab]`` logits are formed and ``W_U`` is read for one or two rows: ranking a
GPT-2-small-sized model's 51,782 order-2 terms takes about 1.5 s on one CPU thread in float32, the
whole attribution with the checks about 3 s, where the verification's own evaluator, which forms
every entry of every term, takes 17.7 s (``benchmarks/bench_scale.py --attribution --baseline``).

Every figure is checked against the model, not against this contraction:

- **sum** — the contributions of the kept terms, plus the remainder of every higher order
  computed by the model itself (an order-graded forward pass, :func:`~numeric_check.verification.isolate.graded_final`),
  equal the model's own logit (or difference);
- **isolation** — each of the ``top`` largest terms equals its path isolated through the
  model's hooks (:func:`~numeric_check.verification.isolate.isolate_final_streams`: only the
  path's source and heads on, patterns and scales frozen), as ``verify_logits`` checks.

>>> from derivations.architecture import Architecture
>>> from numeric_check.model.circuit_model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2, layer_norm=True, mlp=True), d_model=8, d_head=4, d_vocab=10,
...                             n_ctx=6, seed=0)
>>> a = attribute(model, [1, 2, 3, 4], target=5, max_order=1)
>>> a.passed, len(a.terms), abs(sum(t.contribution for t in a.terms) + a.remainder - a.value) < 1e-12
(True, 9, True)
>>> a.terms[0].label in {t.label for t in a.terms}
True
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import torch
from torch import Tensor

from derivations.paths import LogitExpansion, expand_logits, layer_atom, stream_terms
from derivations.sources import UNEMBED_BIAS, Path, Source
from numeric_check.circuits.attribution_report import Attribution, AttributionTerm, Target
from numeric_check.errors import AttributionError
from numeric_check.model.circuit_model import CircuitModel, max_abs
from numeric_check.verification.hook_paths import Recording, record
from numeric_check.verification.bind import Binder
from numeric_check.verification.isolate import graded_final, isolate_final_streams
from numeric_check.verification.shared import check_no_overflow, overflow_message
from numeric_check.verification.verify import _cyclic_gc_paused, default_rtol
from tensoralg.atoms import Word

MAX_ORDERS = (0, 1, 2, None)  # None: every order (small models: the expansion refuses too many terms)
_SOURCE_ATOM = ("token", "position", "bias")  # sources whose word ends in their own atom (W_E, W_pos, b_O)


class _Prefixes:
    """Words and every prefix of them, each once, with its parent (the word one atom shorter): what a
    contraction from the output side computes, level by level, one product per (level, last atom)."""

    def __init__(self) -> None:
        self.ids: dict[Word, int] = {(): 0}
        self.parent: list[int] = [-1]
        self.last: list = [None]
        self.length: list[int] = [0]

    def add(self, word: Word) -> int:
        i = self.ids.get(word)
        if i is None:
            parent = self.add(word[:-1])
            i = self.ids[word] = len(self.parent)
            self.parent.append(parent)
            self.last.append(word[-1])
            self.length.append(len(word))
        return i

    def evaluate(self, root: Tensor, step) -> tuple[dict[int, Tensor], Tensor]:
        """Every word's value from its parent's, ``step(atom, parent values [n, w], from_root)``, one call per
        level, last atom and parent width: the values as banks of equal width (``{width: [n, width]}``)
        and each word's row in the bank of its width (``[n_words]``; widths differ only at level 1, where
        ``b_U`` gives a scalar and ``W_U`` a row of ``d_model``)."""
        n = len(self.parent)
        width_of, row_of = [0] * n, [0] * n
        width_of[0] = root.shape[-1]
        levels: dict[int, dict[object, list[int]]] = {}
        for i in range(1, n):
            levels.setdefault(self.length[i], {}).setdefault(self.last[i], []).append(i)
        previous = {root.shape[-1]: root[None]}  # the last level's values by width
        kept: dict[int, list[Tensor]] = {root.shape[-1]: [root[None]]}
        offset = {root.shape[-1]: 1}
        for length in sorted(levels):
            here: dict[int, list[Tensor]] = {}
            counts: dict[int, int] = {}
            for atom, group in levels[length].items():
                by_width: dict[int, list[int]] = {}
                for i in group:
                    by_width.setdefault(width_of[self.parent[i]], []).append(i)
                for width, members in by_width.items():
                    parents = previous[width][[row_of[self.parent[i]] for i in members]]
                    value = step(atom, parents, length == 1)
                    out = value.shape[-1]
                    start = counts.get(out, 0)
                    here.setdefault(out, []).append(value)
                    counts[out] = start + len(members)
                    for k, i in enumerate(members):
                        width_of[i], row_of[i] = out, start + k
            previous = {w: torch.cat(values) for w, values in here.items()}
            for w, values in previous.items():  # rows numbered within the level so far: make them global
                kept.setdefault(w, []).append(values)
            for i in (i for group in levels[length].values() for i in group):
                row_of[i] += offset.get(width_of[i], 0)
            for w, values in previous.items():
                offset[w] = offset.get(w, 0) + values.shape[0]
            previous = {w: torch.cat(kept[w]) for w in previous}  # parents index globally from here on
        banks = {w: torch.cat(values) for w, values in kept.items()}
        return banks, torch.tensor(row_of)


class TargetContraction:
    """One entry of every logits term, ``c · e_pᵀ P X Wᵀ d``, contracted from the output side.

    For each term: the row ``e_pᵀ P`` over positions (sequence ``batch``), the direction ``dᵀ W`` over
    the residual stream (``d``: the vocabulary vector ``weights`` at ``ids``; ``W_U`` is read for those
    rows only), and the source's input ``X`` times its own atom (``X W_Eᵀ``: the prompt's token
    embeddings; an MLP's recorded output as it is). Rows and directions are built atom by atom from
    the :class:`~numeric_check.verification.bind.Binder`, each prefix once and in one product with
    every prefix of its level that ends in the same atom; the entries are then one product per source.
    """

    def __init__(self, binder: Binder, batch: int, position: int, ids: Sequence[int], weights: Sequence[float]):
        self.binder, self.batch = binder, batch
        model = binder.model
        self.ids = torch.tensor(list(ids), device=model.device)
        self.weights = torch.tensor(list(weights), dtype=model.dtype, device=model.device)
        self.start = torch.zeros(binder.recording.n_pos, dtype=model.dtype, device=model.device)
        self.start[position] = 1

    def _row_step(self, atom, rows: Tensor, from_root: bool) -> Tensor:
        value = self.binder.position(atom)
        return rows * value.value[self.batch] if value.diagonal else rows @ value.value[self.batch]

    def _direction_step(self, atom, dirs: Tensor, from_root: bool) -> Tensor:
        factors = self.binder.factors(atom)
        if from_root:  # dᵀ F_1: the target's rows of W_U (or b_U)
            dirs, factors = (self.weights @ factors[0][self.ids]).expand(dirs.shape[0], -1), factors[1:]
        for F in factors:
            dirs = dirs @ F
        return dirs

    def _source_stream(self, source: Source, own) -> Tensor:
        x = self.binder.source_input(source)
        if own is None:
            return x.as_dense()[self.batch]
        (F,) = self.binder.factors(own)
        return x.times_transpose(F)[self.batch]

    def contributions(self, terms: Sequence[tuple[Path, Word, Word]]) -> Tensor:
        """Each term's entry (``terms``: ``(path, position word, residual word)``, coefficient 1), ``[n]``.

        A term's row and direction are looked up by its heads first (a path's position word depends only
        on its heads and whether it has the final scale, its residual word less its source's own atom
        only on its heads, an MLP's or ``b_U``'s whole word on its input too): hashing pairs of ints
        instead of words of atoms."""
        rows, dirs = _Prefixes(), _Prefixes()
        row_by_heads: dict = {}
        dir_by_heads: dict = {}
        by_stream: dict[tuple, list[int]] = {}
        sources: dict[tuple, Source] = {}
        r_ids, d_ids = [], []
        for n, (path, position, residual) in enumerate(terms):
            source, heads = path.source, path.heads
            own = residual[-1] if source.kind in _SOURCE_ATOM and len(residual) > 1 else None
            r = row_by_heads.get((heads, len(position)))  # (b_U's word has no final scale)
            if r is None:
                r = row_by_heads[heads, len(position)] = rows.add(position)
            key = (source.input_key, own)
            fast = (heads, None if own is not None else key[0])
            d = dir_by_heads.get(fast)
            if d is None:
                d = dir_by_heads[fast] = dirs.add(residual if own is None else residual[:-1])
            r_ids.append(r)
            d_ids.append(d)
            stream = by_stream.get(key)
            if stream is None:
                sources[key], stream = source, by_stream.setdefault(key, [])
            stream.append(n)
        row_banks, row_at = rows.evaluate(self.start, self._row_step)
        (R,) = row_banks.values()
        dir_banks, dir_at = dirs.evaluate(self.start.new_ones(1), self._direction_step)
        r_rows, d_rows = row_at[r_ids], dir_at[d_ids]
        out = self.start.new_empty(len(terms))
        for key, members in by_stream.items():
            stream = self._source_stream(sources[key], key[1])  # [pos, width]
            members = torch.tensor(members)
            U = dir_banks[stream.shape[-1]][d_rows[members]]  # [n, width]
            out[members.to(out.device)] = ((U @ stream.T) * R[r_rows[members]]).sum(-1)
        return out

    def of_stream(self, x: Tensor, bias: float) -> float:
        """The entry of ``x @ W_Uᵀ + bias · b_U`` (``x``: an unembedding input ``[batch, pos, d_model]``)."""
        model = self.binder.model
        value = float(self.start @ (x[self.batch] @ (self.weights @ model.W_U[self.ids])))
        if bias and model.b_U is not None:
            value += bias * float(self.weights @ model.b_U[self.ids])
        return value


def attribute(
    model: CircuitModel,
    tokens,
    target: int | str | None = None,
    *,
    logit_diff: tuple[int | str, int | str] | None = None,
    position: int = -1,
    max_order: int | None = 2,
    top: int | None = 50,
    tokenizer=None,
    dtype: str | torch.dtype = torch.float64,
    device: str | torch.device | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    limit: int = 1_000_000,
) -> Attribution:
    """Every path term's contribution to ``target``'s logit (or to ``logit[A] - logit[B]`` with
    ``logit_diff=(A, B)``) at ``position`` (default: the last) of the prompt ``tokens`` (ids, ``[pos]``
    or ``[1, pos]``), ranked by size, the ``top`` largest checked by isolation (see the module docstring).

    A token is an id, or a string that ``tokenizer`` (anything with ``encode``; a Hugging Face
    tokenizer) turns into exactly one id; with a tokenizer, the result shows token strings beside
    ids. ``max_order``: paths through at most 0, 1 or 2 heads (``None``: every order, small models
    only); the rest is one remainder computed by the model. The model is copied to ``dtype`` and
    ``device``; ``rtol`` defaults to :func:`~numeric_check.verification.verify.default_rtol`.

    Raises :class:`~numeric_check.errors.AttributionError` for a bad target, position, order or
    ``top``, and what :func:`~numeric_check.verification.verify.verify_logits` raises for the model
    and tokens.
    """
    if not isinstance(model, CircuitModel):
        raise AttributionError(f"expected a numeric_check.CircuitModel, got {type(model).__name__}; convert "
                               "Hugging Face or TransformerLens models with numeric_check.from_hf / from_transformer_lens")
    if max_order not in MAX_ORDERS or isinstance(max_order, bool):
        raise AttributionError(f"max_order must be 0, 1, 2 or None (every order), got {max_order!r}")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
        raise AttributionError(f"top must be an int >= 0 or None (every term: the terms checked by isolation), got {top!r}")
    if max_order is not None:
        max_order = min(max_order, model.arch.n_layers)  # no path is deeper than the model
    goal = resolve_target(target, logit_diff, model.cfg.d_vocab, tokenizer)
    rtol = default_rtol(dtype) if rtol is None else rtol
    atol = 0.0 if atol is None else atol
    timings: dict[str, float] = {}
    start = time.perf_counter()
    work = model.working_copy(dtype, device)
    rec = record(work, _one_sequence(tokens))
    check_no_overflow(work, rec, max_abs(rec.logits), AttributionError)  # NaN would read as a failed expansion
    position = _position(position, rec.n_pos)
    timings["forward"] = time.perf_counter() - start
    with torch.no_grad(), _cyclic_gc_paused():  # (tens of thousands of small objects that live to the end)
        result = _attribute(work, rec, goal, position, max_order, top, tokenizer, atol, rtol, limit, timings)
    result.source = None if model.source_check is None else model.source_check.describe()
    return result


def _attribute(work: CircuitModel, rec: Recording, goal: Target, position: int, max_order, top: int | None, tokenizer,
               atol: float, rtol: float, limit: int, timings: dict[str, float]) -> Attribution:
    start = time.perf_counter()
    expansion = expand_logits(work.arch, max_order, limit=limit)  # refuses too many terms, suggesting an order
    kept = path_words(expansion)
    n_omitted = LogitExpansion(work.arch).n_terms - len(kept)
    timings["expand"] = time.perf_counter() - start
    start = time.perf_counter()
    contraction = TargetContraction(Binder(work, rec), 0, position, goal.ids, goal.weights)
    entries = contraction.contributions(kept) if kept else torch.zeros(0)
    values = entries.tolist()
    bad = [kept[i][0].label for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:  # finite logits, a product of weights past the dtype (float32 weights near 1e10)
        more = f" and {len(bad) - 1:,} more" if len(bad) > 1 else ""
        raise AttributionError(overflow_message(work, "the expansion", f"the contribution of {bad[0]}{more}"))
    order = torch.argsort(entries.abs(), descending=True, stable=True).tolist()  # largest first, ties in term order
    terms = [AttributionTerm(kept[i][0].label, kept[i][0].source.label, kept[i][0].heads, kept[i][0].order, values[i])
             for i in order]
    timings["rank"] = time.perf_counter() - start
    start = time.perf_counter()
    value = math.fsum(w * float(rec.logits[0, position, i]) for i, w in zip(goal.ids, goal.weights))  # the model's own
    remainder = contraction.of_stream(graded_final(work, rec, max_order), 0.0) if n_omitted else 0.0
    timings["remainder"] = time.perf_counter() - start
    scale = max(abs(value), abs(values[order[0]]) if values else 0.0)  # rounding: at the largest of these
    start = time.perf_counter()
    _isolate(work, rec, contraction, [kept[i][0] for i in order[:top]], terms[:top], atol, rtol, scale)
    timings["isolation"] = time.perf_counter() - start
    total = math.fsum(values) + remainder
    sum_error = abs(total - value)
    tolerance = atol + rtol * scale
    return Attribution(
        target=goal,
        model=work.arch.describe() + f"; d_model={work.cfg.d_model}, d_head={work.cfg.d_head}, d_vocab={work.cfg.d_vocab}",
        tokens=rec.tokens[0].tolist(),
        token_texts=_texts(tokenizer, rec.tokens[0].tolist()),
        position=position,
        max_order=max_order,
        dtype=str(work.dtype).replace("torch.", ""),
        device=str(work.device),
        value=value,
        terms=terms,
        remainder=remainder,
        n_omitted=n_omitted,
        sum_error=sum_error,
        tolerance=tolerance,
        n_checked=len(terms) if top is None else min(top, len(terms)),
        timings=timings,
    )


def path_words(expansion: LogitExpansion) -> list[tuple[Path, Word, Word]]:
    """``(path, position word, residual word)`` of every term of ``expansion``, in its order and with its
    words (coefficients are 1), without building its :class:`~tensoralg.expr.Term` objects (four
    times the time at GPT-2-small size: 1.5 s against 0.35 s for 84,267 terms)."""
    arch = expansion.arch
    final = (layer_atom("N", "final"),) if arch.normalised else ()
    unembed = (layer_atom("W_U", ""),)
    out = [(st.path, final + st.position, unembed + st.residual)
           for _, st in stream_terms(arch, arch.n_layers, expansion.max_order)]
    if arch.biases:
        out.append((Path(UNEMBED_BIAS), (), (layer_atom("b_U", ""),)))
    return out


def _isolate(work: CircuitModel, rec: Recording, contraction: TargetContraction, paths: list[Path],
             terms: list[AttributionTerm], atol: float, rtol: float, scale: float) -> None:
    """Check 2 of ``verify_logits`` for the ranked terms: each equals its path isolated by the model's hooks."""
    for i, x, bias in isolate_final_streams(work, rec, paths):
        term = terms[i]
        term.isolated = contraction.of_stream(x, bias)
        term.error = abs(term.contribution - term.isolated)
        term.passed = term.error <= atol + rtol * max(scale, abs(term.contribution))


def _one_sequence(tokens) -> Tensor:
    """``tokens`` as ``[1, pos]``: one prompt."""
    t = torch.as_tensor(tokens) if not isinstance(tokens, Tensor) else tokens
    if t.ndim == 2 and t.shape[0] == 1:
        return t
    if t.ndim != 1:
        raise AttributionError(f"expected one prompt of token ids, [pos] or [1, pos]; got shape {tuple(t.shape)}")
    return t[None]


def _position(position, n_pos: int) -> int:
    if isinstance(position, bool) or not isinstance(position, int) or not -n_pos <= position < n_pos:
        raise AttributionError(f"position must be an int in -{n_pos}..{n_pos - 1} (the prompt has {n_pos} tokens), got {position!r}")
    return position % n_pos


def resolve_token(token: int | str, d_vocab: int, tokenizer=None, what: str = "target") -> int:
    """A token id: ``token`` itself (in ``0..d_vocab-1``), or the one id ``tokenizer`` encodes a string to.

    >>> resolve_token(3, 10)
    3
    >>> resolve_token(10, 10)
    Traceback (most recent call last):
    ...
    numeric_check.errors.AttributionError: target 10 is outside the vocabulary 0..9
    """
    if isinstance(token, str):
        if tokenizer is None:
            raise AttributionError(f"{what} {token!r} is text, but no tokenizer was given to resolve it; give a token id")
        ids = _encode(tokenizer, token)
        if len(ids) != 1:
            raise AttributionError(f"{what} {token!r} is {len(ids)} tokens for this tokenizer ({ids}); expected exactly one")
        token = ids[0]
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < d_vocab:
        raise AttributionError(f"{what} {token!r} is outside the vocabulary 0..{d_vocab - 1}")
    return token


def resolve_target(target, logit_diff, d_vocab: int, tokenizer=None) -> Target:
    """The :class:`Target`: one token's logit, or the difference of two (``logit_diff=(A, B)``)."""
    if (target is None) == (logit_diff is None):
        raise AttributionError("give exactly one of target (a token) and logit_diff (two tokens A, B)")
    if target is not None:
        ids, weights = (resolve_token(target, d_vocab, tokenizer),), (1.0,)
    else:
        if not isinstance(logit_diff, (tuple, list)) or len(logit_diff) != 2:
            raise AttributionError(f"logit_diff must be two tokens (A, B), got {logit_diff!r}")
        ids = tuple(resolve_token(t, d_vocab, tokenizer, what) for t, what in zip(logit_diff, ("logit_diff A", "logit_diff B")))
        if ids[0] == ids[1]:
            raise AttributionError(f"logit_diff names the same token twice ({ids[0]}); the difference would be 0")
        weights = (1.0, -1.0)
    return Target(ids, weights, _texts(tokenizer, list(ids)))


def _encode(tokenizer, text: str) -> list[int]:
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:  # a tokenizer without that option
        ids = tokenizer.encode(text)
    return list(getattr(ids, "ids", ids))


def _texts(tokenizer, ids: list[int]) -> list[str] | None:
    """Each id decoded alone, or ``None`` without a tokenizer."""
    if tokenizer is None:
        return None
    if hasattr(tokenizer, "decode_each"):  # the command line's tokenizer: decoded within a bound
        return tokenizer.decode_each(ids)
    return [str(tokenizer.decode([i])) for i in ids]
