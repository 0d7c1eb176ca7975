"""Evaluating every term of a QK expansion at once: each term's query and key sides are streams
of the shared trie (:mod:`numeric_check.verification.evaluate`), computed once each.

A QK term ``c · P ⊗ Q ⊗ M`` contributes ``c · P X_q M X_kᵀ Qᵀ`` to a head's scores. Its middle
word is cut where the query side ends, ``M = M_L M_R``, and the two sides ``U = P X_q M_L`` and
``V = Q X_k M_Rᵀ`` are streams shared between all terms; a term's scores are ``c · U Vᵀ``.

>>> from derivations.architecture import Architecture
>>> from derivations.qk import expand_qk
>>> from numeric_check.verification.bind import Binder
>>> from numeric_check.verification.hook_paths import record
>>> from numeric_check.model.circuit_model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0, dtype=torch.float64)
>>> rec = record(model, torch.tensor([[1, 2, 3, 4]]))
>>> ev = QKEvaluator(Binder(model, rec), list(expand_qk(model.arch, 1, 0)))
>>> total = sum(ev.scores(i) for i in range(len(ev.terms)))
>>> below = torch.ones(4, 4, dtype=torch.bool).tril()
>>> bool(torch.allclose(total[:, below], rec.cache["blocks.1.attn.hook_attn_scores"][:, 0][:, below]))
True
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from derivations.qk import QKTerm
from numeric_check.model.rotary import rotate
from numeric_check.verification.bind import Binder
from numeric_check.verification.evaluate import StreamSpec, StreamTrie, flip, _merge, _narrowest, word_factors
from tensoralg.atoms import Atom
from tensoralg.rotary import is_rotary


def _is_query_end(a: Atom, j: int) -> bool:
    """Whether the cut of a QK middle word should come right after this factor of ``a``."""
    return (a.name == "W_QK" and not a.transposed and j == 0) or (a.name in ("W_Q", "b_Q", "b_Qn") and a.transposed)


class QKEvaluator:
    """All terms of a QK expansion (a list of :class:`~derivations.qk.QKTerm`), shared.

    Each term ``c · P ⊗ Q ⊗ M`` is cut inside its middle word where the query side ends
    (after ``W_Qᵀ``, or ``b_Qᵀ``): ``M = M_L M_R``. The two sides are streams,
    ``U = P X_q M_L`` (queries) and ``V = Q X_k M_Rᵀ`` (keys), shared between all terms and
    evaluated once each; a term's scores are ``c · U Vᵀ`` ``[batch, q, k]``.

    A rotary head's terms hold one operator ``R^{h}`` (:mod:`tensoralg.rotary`): ``M = M_L R M_R``
    is cut at it, and each side is rotated by position before the product, ``c · rot(U) rot(V)ᵀ``
    (the model's own rotation): the operator is never written out.
    """

    def __init__(self, binder: Binder, terms: Sequence[QKTerm]):
        self.binder = binder
        self.terms = list(terms)
        self.trie = StreamTrie(binder)
        self._sides: list[tuple[int, int]] = []
        self._rotated = [any(map(is_rotary, t.term.words[2])) for t in self.terms]
        self._coeffs = [binder.coeff(t.term.coeff) for t in self.terms]
        streams: dict[StreamSpec, int] = {}
        for t in self.terms:
            q_spec, k_spec = self.plan(t)
            ids = []
            for spec in (q_spec, k_spec):
                if spec not in streams:
                    streams[spec] = self.trie.add(spec)
                ids.append(streams[spec])
            self._sides.append((ids[0], ids[1]))
        self._values: dict[int, Tensor] | None = None

    def plan(self, t: QKTerm) -> tuple[StreamSpec, StreamSpec]:
        P, Q, M = t.term.words
        at = [i for i, a in enumerate(M) if is_rotary(a)]
        if at:  # the cut is the operator itself: U = P X_q M_L, V = Q X_k M_Rᵀ
            left, right = word_factors(self.binder, M[: at[0]]), word_factors(self.binder, M[at[0] + 1:])
            q_rights = [(f.ref, f.atom, f.rows, f.cols) for f in left]
            k_rights = [(flip(f.ref), f.atom, f.cols, f.rows) for f in reversed(right)]
            return StreamSpec(t.query.source, _merge(P, q_rights)), StreamSpec(t.key.source, _merge(Q, k_rights))
        factors = word_factors(self.binder, M)
        q_width = self.binder.input_width(t.query.source)
        k_width = self.binder.input_width(t.key.source)
        # cut c (0..m): U = X_q F_1..F_c, V = X_k F_m^T..F_{c+1}^T; width rows(F_{c+1})
        widths = [q_width] + [f.cols for f in factors[:-1]] + [k_width]
        prefer = [False] + [_is_query_end(f.atom, f.ref[1]) for f in factors[:-1]] + [False]
        c = _narrowest(widths, prefer)
        q_rights = [(f.ref, f.atom, f.rows, f.cols) for f in factors[:c]]  # U ← U F
        k_rights = [(flip(f.ref), f.atom, f.cols, f.rows) for f in reversed(factors[c:])]  # V ← V Fᵀ
        return StreamSpec(t.query.source, _merge(P, q_rights)), StreamSpec(t.key.source, _merge(Q, k_rights))

    def side_values(self) -> dict[int, Tensor]:
        """Every distinct query or key stream ``[batch, pos, r]``, by stream id (computed once)."""
        if self._values is None:
            values: dict[int, Tensor] = {}
            for ids, y in self.trie.walk():
                for stream in ids:
                    values[stream] = y
            self._values = values
        return self._values

    def scores(self, index: int) -> Tensor:
        """Term ``index``'s contribution to the scores, ``[batch, q, k]`` (every entry, masked or not)."""
        values = self.side_values()
        q, k = self._sides[index]
        U, V = values[q], values[k]
        if self._rotated[index]:
            U, V = self.rotated(q), self.rotated(k)
        return self._coeffs[index] * (U @ V.transpose(-1, -2))

    def rotated(self, stream: int) -> Tensor:
        """A side stream ``[batch, pos, d_head]`` turned by position as the model turns its queries and keys."""
        cache = self.__dict__.setdefault("_rotations", {})
        if stream not in cache:
            cfg = self.binder.model.cfg
            cache[stream] = rotate(self.side_values()[stream], *cfg.rotary_args)
        return cache[stream]
