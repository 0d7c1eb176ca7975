"""Rotary position embeddings as one named operator of the algebra.

Rotary (Su et al. 2021; GPT-NeoX, GPT-J, Llama, Qwen2, Mistral) rotates each query and
key by its position before the dot product. Split a head's first ``d_rot`` dimensions
into ``F = d_rot / 2`` planes; plane ``f`` turns by the angle ``i·θ_f`` at position
``i`` (``θ_f = base^(-2f/d_rot)``); the other ``d_head - d_rot`` dimensions pass through
(partial rotary). As an operator on a query (or key) stream, position ⊗ head feature,

    ℛ = Id ⊗ P_pass + Σ_f (D_cos^{f} ⊗ C^{f} + D_sin^{f} ⊗ J^{f}),

with *diagonal* position factors ``D_cos^{f} = diag(cos i·θ_f)``, ``D_sin^{f} = diag(sin i·θ_f)``
and *fixed* feature blocks: ``C^{f}`` projects onto plane ``f``, ``J^{f}`` turns it by a
right angle (``J^{f}ᵀ = -J^{f}``, ``J^{f}ᵀ J^{f} = C^{f}``), ``P_pass`` projects onto the
dimensions that are not rotated. So ``q̃_i = R_i q_i`` with ``R_i = P_pass + Σ_f cos(iθ_f) C^{f} + sin(iθ_f) J^{f}``.

The scores read ``q̃_iᵀ k̃_j = q_iᵀ R_iᵀ R_j k_j = q_iᵀ R_{j−i} k_j``: the bilinear form of
two rotated streams, in which the blocks of different planes annihilate
(:func:`multiply_blocks`), is the 3-slot sum (query position ⊗ key position ⊗ feature)

    R = Id ⊗ Id ⊗ P_pass + Σ_f (D_cos ⊗ D_cos ⊗ C + D_sin ⊗ D_sin ⊗ C + D_cos ⊗ D_sin ⊗ J − D_sin ⊗ D_cos ⊗ J)^{f},

again a sum of tensor products with diagonal position factors. The QK expansion does not
write it out (it would multiply every term by ``4F + 1``): a rotary head's score terms carry
one atom ``R^{h}`` in their feature word, ``P ⊗ Q ⊗ (L R^{h} M)``, which stands for
``Σ (D_a P) ⊗ (D_b Q) ⊗ (L B M)`` over the terms ``D_a ⊗ D_b ⊗ B`` of ``R``
(:func:`expand_rotary`). Numerically (:func:`rotary_scores`) such a term is evaluated
factored: rotate the rows of ``P X_q L`` and of ``Q X_k Mᵀ`` by their positions, then
multiply; nothing of size ``F`` times the terms is ever built.

Two conventions pair the dimensions: ``"neox"`` (Hugging Face's ``rotate_half``: GPT-NeoX,
Llama, Qwen2, Mistral, Gemma) pairs ``(f, f + d_rot/2)``; ``"gptj"`` (GPT-J's
``rotate_every_two``) pairs ``(2f, 2f + 1)``. Both rotate the first ``d_rot`` dimensions.

>>> from tensoralg.atoms import atom
>>> s = term(None, None, (atom("W_Q", "h").T, rotary_atom("h"), atom("W_K", "h")))
>>> s
TensorSum(Id ⊗ Id ⊗ W_Q^{h}ᵀ R^{h} W_K^{h})
>>> len(expand_rotary(s, frequencies=2, partial=True))
9
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import sympy as sp

from tensoralg.atoms import Atom, Word, d_head, n_ctx, transpose_word
from tensoralg.errors import TensorAlgError
from tensoralg.expr import Expr, TensorSum, Term, term

STYLES = ("neox", "gptj")
ROTARY = "R"  # the name of the rotary operator's atom
DEFAULT_BASE = 10000.0

# -- the atoms ------------------------------------------------------------------------


def rotary_atom(index: str = "") -> Atom:
    """``R^{h}``: the rotary operator of head ``index`` in a score term's feature word
    (``d_head × d_head``; it stands for the 3-slot sum of the module docstring)."""
    return Atom(ROTARY, d_head, d_head, str(index))


def is_rotary(a: Atom) -> bool:
    """True for the atom :func:`rotary_atom` makes."""
    return a.name == ROTARY and a.shape == (d_head, d_head)


def _frequency(f: int) -> str:
    return f"f{f}"


def cos_factor(f: int) -> Atom:
    """``D_cos^{f}``: diagonal, ``cos(i θ_f)`` at position ``i``."""
    return Atom("D_cos", n_ctx, n_ctx, _frequency(f), symmetric=True)


def sin_factor(f: int) -> Atom:
    """``D_sin^{f}``: diagonal, ``sin(i θ_f)`` at position ``i``."""
    return Atom("D_sin", n_ctx, n_ctx, _frequency(f), symmetric=True)


def plane_block(f: int) -> Atom:
    """``C^{f}``: the projection onto rotation plane ``f`` (symmetric)."""
    return Atom("C", d_head, d_head, _frequency(f), symmetric=True)


def turn_block(f: int) -> Atom:
    """``J^{f}``: plane ``f`` turned by a right angle (``J^{f}ᵀ = -J^{f}``)."""
    return Atom("J", d_head, d_head, _frequency(f))


PASS_BLOCK = Atom("P_pass", d_head, d_head, "", symmetric=True)  # the dimensions rotary leaves alone


def _check_frequencies(frequencies) -> int:
    if isinstance(frequencies, bool) or not isinstance(frequencies, int) or frequencies < 1:
        raise TensorAlgError(f"frequencies must be an int >= 1 (rotated planes per head), got {frequencies!r}")
    return frequencies


def rotation(frequencies: int, partial: bool = False) -> TensorSum:
    """``ℛ = [Id ⊗ P_pass +] Σ_f (D_cos^{f} ⊗ C^{f} + D_sin^{f} ⊗ J^{f})``, position ⊗ feature.

    >>> print(rotation(1))
    D_cos^{f0} ⊗ C^{f0} + D_sin^{f0} ⊗ J^{f0}
    """
    _check_frequencies(frequencies)
    terms = [Term(sp.S.One, ((), (PASS_BLOCK,)))] if partial else []
    for f in range(frequencies):
        terms += [Term(sp.S.One, ((cos_factor(f),), (plane_block(f),))),
                  Term(sp.S.One, ((sin_factor(f),), (turn_block(f),)))]
    return TensorSum(terms)


def relative_terms(frequencies: int, partial: bool = False) -> list[tuple[Word, Word, Word, int]]:
    """``(query factor, key factor, feature block, sign)`` for each term of the 3-slot ``R``."""
    _check_frequencies(frequencies)
    out: list[tuple[Word, Word, Word, int]] = [((), (), (PASS_BLOCK,), 1)] if partial else []
    for f in range(frequencies):
        c, s, C, J = (cos_factor(f),), (sin_factor(f),), (plane_block(f),), (turn_block(f),)
        out += [(c, c, C, 1), (s, s, C, 1), (c, s, J, 1), (s, c, J, -1)]
    return out


def relative_rotation(frequencies: int, partial: bool = False) -> TensorSum:
    """The 3-slot ``R`` (query position ⊗ key position ⊗ feature) that ``R^{h}`` stands for.

    >>> len(relative_rotation(3)), len(relative_rotation(3, partial=True))
    (12, 13)
    """
    return TensorSum([Term(sp.Integer(sign), (a, b, B)) for a, b, B, sign in relative_terms(frequencies, partial)])


# -- rules ----------------------------------------------------------------------------


def expand_rotary(expr: Expr, frequencies: int, partial: bool = False) -> TensorSum:
    """Write out every ``R^{h}`` of a 3-slot sum: ``P ⊗ Q ⊗ (L R M) = Σ (D_a P) ⊗ (D_b Q) ⊗ (L B M)``
    over the terms ``D_a ⊗ D_b ⊗ B`` of :func:`relative_rotation` (``Rᵀ``: ``B`` transposed).

    The diagonal factors lead the position words: they act at the query (key) position
    the term ends at. A term without ``R`` is kept as it is; one with two is refused.

    >>> from tensoralg.atoms import atom
    >>> s = term(atom("A", 0), None, (rotary_atom("h"), atom("W_K", "h")))
    >>> e = expand_rotary(s, 1)
    >>> len(e), e.coeff((sin_factor(0), atom("A", 0)), cos_factor(0), (turn_block(0), atom("W_K", "h")))
    (4, -1)
    """
    s = expr.expand()
    if s.n_slots != 3:
        raise TensorAlgError(f"rotary acts on 3-slot score terms (query ⊗ key ⊗ feature), got {s.n_slots} slots")
    table = relative_terms(frequencies, partial)
    out: dict = {}
    for t in s:
        p, q, m = t.words
        at = [i for i, a in enumerate(m) if is_rotary(a)]
        if not at:
            out[t.words] = out.get(t.words, 0) + t.coeff
            continue
        if len(at) > 1:
            raise TensorAlgError(f"a score term holds one rotary operator, got {len(at)} in {Term(t.coeff, t.words)!r}")
        i = at[0]
        for a, b, block, sign in table:
            feature = m[:i] + (transpose_word(block) if m[i].transposed else block) + m[i + 1:]
            key = (a + p, b + q, feature)
            out[key] = out.get(key, 0) + sign * t.coeff
    return TensorSum(out, n_slots=3)


def _block(a: Atom) -> tuple[str, int, bool] | None:
    """``(kind, frequency, transposed)`` of a feature block atom; ``None`` for other atoms."""
    if a.name == "P_pass" and a.index == "":
        return "P", -1, False
    if a.name in ("C", "J") and a.index.startswith("f") and a.index[1:].isdigit():
        return a.name, int(a.index[1:]), a.transposed
    return None


def _product(x: tuple[str, int, bool], y: tuple[str, int, bool]) -> tuple[int, Atom | None]:
    """``x · y`` for two blocks: ``(sign, block)``, or ``(0, None)`` when it vanishes."""
    (kx, fx, tx), (ky, fy, ty) = x, y
    if (kx == "P") != (ky == "P") or fx != fy:
        return 0, None  # different planes, or a plane against the pass-through: orthogonal
    if kx == "P":
        return 1, PASS_BLOCK
    sx = -1 if tx else 1  # Jᵀ = -J
    sy = -1 if ty else 1
    if kx == "C" and ky == "C":
        return 1, plane_block(fx)
    if kx == "C":
        return sy, turn_block(fx)
    if ky == "C":
        return sx, turn_block(fx)
    return -sx * sy, plane_block(fx)  # J J = -C


def multiply_blocks(expr: Expr) -> TensorSum:
    """Multiply neighbouring feature blocks: ``C^{f} C^{g} = δ_{fg} C^{f}``, ``C^{f} J^{g} =
    J^{g} C^{f} = δ_{fg} J^{f}``, ``J^{f} J^{g} = -δ_{fg} C^{f}``, ``J^{f}ᵀ = -J^{f}``,
    ``P_pass P_pass = P_pass`` and ``P_pass`` against any plane ``0``: the planes and the
    pass-through are orthogonal. Terms that vanish are dropped.

    >>> s = term(None, (plane_block(0), turn_block(0).T, turn_block(1)))
    >>> multiply_blocks(s).is_zero, multiply_blocks(term(None, (turn_block(0).T, turn_block(0))))
    (True, TensorSum(Id ⊗ C^{f0}))
    """
    s = expr.expand()
    out: dict = {}
    for t in s:
        coeff, words = t.coeff, []
        for w in t.words:
            sign, word = _reduce(w)
            if sign == 0:
                break
            coeff = coeff * sign
            words.append(word)
        else:
            key = tuple(words)
            out[key] = out.get(key, 0) + coeff
    return TensorSum(out, n_slots=s.n_slots)


def _reduce(word: Word) -> tuple[int, Word]:
    stack: list[Atom] = []
    sign = 1
    for a in word:
        b = _block(a)
        top = _block(stack[-1]) if stack else None
        if b is not None and top is not None:
            s, merged = _product(top, b)
            if s == 0:
                return 0, ()
            sign *= s
            stack[-1] = merged
        else:
            stack.append(a)
    return sign, tuple(stack)


# -- numbers --------------------------------------------------------------------------


def check_style(style: str) -> str:
    if style not in STYLES:
        raise TensorAlgError(f"unknown rotary style {style!r}; expected one of " + ", ".join(map(repr, STYLES)))
    return style


def rotary_dims(d_head_: int, fraction: float = 1.0) -> int:
    """The rotated dimensions of a head, ``int(d_head · fraction)`` as GPT-NeoX computes
    them; refused unless even and at least 2.

    >>> rotary_dims(64, 0.25)
    16
    """
    if isinstance(d_head_, bool) or not isinstance(d_head_, (int, np.integer)) or d_head_ < 1:
        raise TensorAlgError(f"d_head must be an int >= 1, got {d_head_!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise TensorAlgError(f"the rotary fraction must be a number in (0, 1], got {fraction!r}")
    dims = int(d_head_ * fraction)
    if dims < 2 or dims % 2:
        raise TensorAlgError(
            f"rotary on {fraction:g} of d_head={d_head_} rotates {dims} dimensions; rotary turns planes, so it needs "
            "an even number >= 2"
        )
    return dims


def _pairs(rot_dims: int, style: str) -> list[tuple[int, int]]:
    """The two dimensions ``(a, b)`` of each plane: ``(f, f + d_rot/2)`` (neox) or ``(2f, 2f + 1)`` (gptj)."""
    half = rot_dims // 2
    if check_style(style) == "neox":
        return [(f, f + half) for f in range(half)]
    return [(2 * f, 2 * f + 1) for f in range(half)]


def inverse_frequencies(rot_dims: int, base: float = DEFAULT_BASE) -> np.ndarray:
    """``θ_f = base^(-2f / d_rot)`` for ``f = 0 … d_rot/2 - 1``, float64."""
    return base ** (-np.arange(0, rot_dims, 2, dtype=np.float64) / rot_dims)


def feature_blocks(d_head_: int, rot_dims: int, style: str = "neox") -> dict[str, np.ndarray]:
    """The fixed blocks as arrays, by label: ``C^{f0}``, ``J^{f0}`` …, ``P_pass``."""
    out: dict[str, np.ndarray] = {}
    for f, (a, b) in enumerate(_pairs(rot_dims, style)):
        C = np.zeros((d_head_, d_head_))
        C[a, a] = C[b, b] = 1.0
        J = np.zeros((d_head_, d_head_))
        J[b, a], J[a, b] = 1.0, -1.0  # (J q)_a = -q_b, (J q)_b = q_a: a quarter turn
        out[plane_block(f).label], out[turn_block(f).label] = C, J
    P = np.zeros((d_head_, d_head_))
    P[range(rot_dims, d_head_), range(rot_dims, d_head_)] = 1.0
    out[PASS_BLOCK.label] = P
    return out


def position_factors(positions: Sequence[int] | np.ndarray, rot_dims: int, base: float = DEFAULT_BASE) -> dict[str, np.ndarray]:
    """The diagonal factors ``D_cos^{f}``, ``D_sin^{f}`` as arrays, by label, for these positions."""
    angles = np.outer(np.asarray(positions, dtype=np.float64), inverse_frequencies(rot_dims, base))
    out: dict[str, np.ndarray] = {}
    for f in range(angles.shape[1]):
        out[cos_factor(f).label] = np.diag(np.cos(angles[:, f]))
        out[sin_factor(f).label] = np.diag(np.sin(angles[:, f]))
    return out


def rotate(x: np.ndarray, positions: Sequence[int] | np.ndarray, rot_dims: int, style: str = "neox",
           base: float = DEFAULT_BASE) -> np.ndarray:
    """``R_i x_i`` for each row ``x_i`` of ``x [..., pos, d_head]`` at ``positions[i]``:
    each plane ``(a, b)`` turned by ``i θ_f``, the other dimensions left alone."""
    x = np.asarray(x)
    positions = np.asarray(positions, dtype=np.float64)
    if x.shape[-2] != positions.shape[0]:
        raise TensorAlgError(f"rotate: x has {x.shape[-2]} positions (rows) but {positions.shape[0]} positions were given")
    if rot_dims > x.shape[-1]:
        raise TensorAlgError(f"rotate: {rot_dims} rotary dimensions in a head of {x.shape[-1]}")
    angles = np.outer(positions, inverse_frequencies(rot_dims, base))  # [pos, F]
    a, b = np.array(_pairs(rot_dims, style)).T
    cos, sin = np.cos(angles), np.sin(angles)
    out = x.astype(np.result_type(x, np.float64), copy=True)
    out[..., a] = x[..., a] * cos - x[..., b] * sin
    out[..., b] = x[..., b] * cos + x[..., a] * sin
    return out


def rotary_scores(q: np.ndarray, k: np.ndarray, rot_dims: int, style: str = "neox", base: float = DEFAULT_BASE,
                  query_positions=None, key_positions=None) -> np.ndarray:
    """``S[i, j] = q_iᵀ R_{j−i} k_j``, factored: rotate each side by its positions, then
    ``q̃ k̃ᵀ``. ``q [..., pos_q, d_head]`` and ``k [..., pos_k, d_head]``; positions default
    to ``0, 1, …``. This is how a score term ``P ⊗ Q ⊗ (L R M)`` is evaluated, with
    ``q = P X_q L`` and ``k = Q X_k Mᵀ``."""
    qp = np.arange(q.shape[-2]) if query_positions is None else query_positions
    kp = np.arange(k.shape[-2]) if key_positions is None else key_positions
    return rotate(q, qp, rot_dims, style, base) @ np.swapaxes(rotate(k, kp, rot_dims, style, base), -1, -2)


def relative_matrix(delta: float, d_head_: int, rot_dims: int, style: str = "neox", base: float = DEFAULT_BASE) -> np.ndarray:
    """``R_Δ = P_pass + Σ_f cos(Δθ_f) C^{f} + sin(Δθ_f) J^{f}``: what ``q_iᵀ · k_j`` passes through for ``Δ = j − i``."""
    blocks = feature_blocks(d_head_, rot_dims, style)
    out = blocks[PASS_BLOCK.label].copy()
    for f, theta in enumerate(inverse_frequencies(rot_dims, base)):
        out += np.cos(delta * theta) * blocks[plane_block(f).label] + np.sin(delta * theta) * blocks[turn_block(f).label]
    return out


def rotary_bindings(positions: Sequence[int] | np.ndarray, d_head_: int, rot_dims: int, style: str = "neox",
                    base: float = DEFAULT_BASE) -> dict[str, np.ndarray]:
    """Every atom of :func:`expand_rotary`'s terms bound to its array, by label (for :func:`tensoralg.to_numpy`)."""
    return {**feature_blocks(d_head_, rot_dims, style), **position_factors(positions, rot_dims, base)}
