"""The induction mechanism: the K-composition term of a second-layer head, with a concrete
previous-token pattern, attends to the token after an earlier copy of the current one.

:func:`induction_example` evaluates the term on a five-token sequence with the shift matrix
as the earlier head's pattern and a token-matching circuit; the entry prints its matrices.

>>> ex = induction_example()
>>> ex.tokens
('c', 'a', 'b', 'a', 'b')
>>> [int(j) for j in ex.scores.argmax(axis=1)[3:]]  # queries 3 (a) and 4 (b)
[2, 3]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensoralg import Atom, atom, n_ctx, sandwich, term
from tensoralg.rules import rewrite_words, substitute

from derivations.catalogue.common import INDEXING, NOTATION, SCORES
from derivations.catalogue.readings import bmatrix
from derivations.derivation import Chain, Derivation, Numeric
from derivations.catalogue.registry import entry
from derivations.errors import DerivationError
from derivations.document import Math, math, prose

SEQUENCE = ("c", "a", "b", "a", "b")
VOCABULARY = ("a", "b", "c")


def shift_matrix(n: int) -> np.ndarray:
    """The previous-token pattern: position i attends to i - 1; position 0, with nothing
    before it, to itself. Row-stochastic and causal.

    >>> shift_matrix(3)
    array([[1., 0., 0.],
           [1., 0., 0.],
           [0., 1., 0.]])
    """
    if n < 1:
        raise DerivationError(f"a shift matrix needs at least one position, got {n}")
    P = np.zeros((n, n))
    P[0, 0] = 1.0
    P[np.arange(1, n), np.arange(n - 1)] = 1.0
    return P


@dataclass(frozen=True)
class InductionExample:
    """One-hot tokens ``X`` (one row per position), the shift ``P`` and the scores
    ``S = X Xᵀ Pᵀ`` of the term ``Id ⊗ P ⊗ Id`` (key j carries the token at j - 1)."""

    tokens: tuple[str, ...]
    X: np.ndarray
    P: np.ndarray
    scores: np.ndarray

    def attends(self) -> dict[int, int]:
        """For each query with a single best key among the earlier ones (causal mask), that key."""
        out = {}
        for i in range(len(self.tokens)):
            row = self.scores[i, : i + 1]
            best = np.flatnonzero(row == row.max())
            if row.max() > 0 and len(best) == 1:
                out[i] = int(best[0])
        return out


def induction_example(tokens: tuple[str, ...] = SEQUENCE, vocabulary: tuple[str, ...] = VOCABULARY) -> InductionExample:
    """The scores of the induction term on ``tokens``: ``S[i, j] = 1`` when the token before
    key ``j`` equals the query's token ``i``."""
    unknown = sorted(set(tokens) - set(vocabulary))
    if unknown:
        raise DerivationError(f"tokens {unknown} are not in the vocabulary {list(vocabulary)}")
    X = np.eye(len(vocabulary))[[vocabulary.index(t) for t in tokens]]
    P = shift_matrix(len(tokens))
    return InductionExample(tuple(tokens), X, P, X @ X.T @ P.T)


def _matrix(M: np.ndarray) -> str:
    return bmatrix(tuple(tuple(int(v) for v in row) for row in M))


def _masked(S: np.ndarray) -> str:
    rows = [" & ".join(str(int(S[i, j])) if j <= i else r"\cdot" for j in range(S.shape[1])) for i in range(S.shape[0])]
    return r"\begin{bmatrix}" + r" \\ ".join(rows) + r"\end{bmatrix}"


def _rows_text(M: np.ndarray) -> str:
    return "[" + "; ".join(" ".join(str(int(v)) for v in row) for row in M) + "]"


def _masked_text(S: np.ndarray) -> str:
    return "[" + "; ".join(" ".join(str(int(S[i, j])) if j <= i else "·" for j in range(S.shape[1]))
                           for i in range(S.shape[0])) + "]"


def _identity(a, shape, rng):
    return np.eye(*shape)


def _orthonormal_columns(a, shape, rng):
    q, _ = np.linalg.qr(rng.standard_normal(shape))
    return q


@entry("induction-mechanism", "the induction mechanism: the K-composition term with a shift matrix A^{prev}, worked")
def induction_mechanism() -> Derivation:
    QK, OV, A_prev, W_E = atom("W_QK", "h"), atom("W_OV", "prev"), atom("A", "prev"), atom("W_E")
    P = Atom("P_shift", n_ctx, n_ctx)
    ex = induction_example()
    n = len(ex.tokens)
    k_term = (
        Chain.start(None, sandwich(term(None, W_E), QK, term(A_prev, (OV, W_E))), "bilinear",
                    detail=prose("queries direct, keys through the earlier head prev (the K-composition term of ",
                                 math("S^h"), ")"),
                    intro=prose("Head h of a later layer reads keys that head prev of an earlier layer has written to. "
                                "The term of ",
                                "its scores for that path (see two-layer-qk) is:"))
        .apply(substitute, "substitution", A_prev, term(P),
               detail=prose("the earlier head is a previous-token head: ", math("A^prev = P_shift"),
                            ", the shift matrix written out in the notes above"))
        .apply(rewrite_words, "substitution", {(W_E.T, QK, OV, W_E): ()},
               detail=prose("suppose the circuit matches tokens: ",
                            math("W_Eᵀ W_QK^h W_OV^prev W_E = Id"),
                            " (an idealised induction head: in a trained one this matrix is not Id, but its eigenvalues are "
                            "mostly positive, see eigenvalue-copying)"))
    )
    tokens_text = " ".join(ex.tokens)
    return Derivation(
        "induction-mechanism", "The induction mechanism",
        "With a previous-token head before it, the K-composition term makes a head attend to the token that "
        "followed an earlier copy of the current token: the mechanism of induction heads, worked on five tokens.",
        (k_term,),
        notes=(
            prose("A score term ", math("P ⊗ Q ⊗ M"), " acts on one-hot tokens ",
                  math("X"), " (one row per position) as ", math("P X M Xᵀ Qᵀ"),
                  ". The last line, ", math("Id ⊗ P_shift ⊗ Id"),
                  ", adds ", math("X Xᵀ P_shiftᵀ"), " to the scores ",
                  math("S^h"), ": its entry [i, j] is 1 when the token before key j equals the token of "
                  "query i. "
                  "The key side carries the previous token; the query side, its own."),
            prose(f"Worked on the sequence {tokens_text} (positions 0 to {n - 1}, vocabulary a, b, c): ",
                  Math(rf"P_{{shift}} = {_matrix(ex.P)}", f"P_shift = {_rows_text(ex.P)}"),
                  " (position 0 has nothing before it and attends to itself), ",
                  Math(rf"X = {_matrix(ex.X)}", f"X = {_rows_text(ex.X)}"), " and the term's scores, later keys masked (",
                  math("·"), "), ", Math(rf"X X^{{\top}} P_{{shift}}^{{\top}} = {_masked(ex.scores)}",
                                                     f"X Xᵀ P_shiftᵀ = {_masked_text(ex.scores)}"), "."),
            prose("Read row by row: query 3 (token a) scores key 2 (b), the token after the earlier a at position 1; "
                  "query 4 (b) scores key 3 (a), the token after the earlier b at position 2. Each attends to the "
                  "token after an earlier copy of itself, whose value (through the head's OV circuit) predicts "
                  "that the sequence repeats. Query 0 scores its own key only because position 0 is its own "
                  "previous position."),
            SCORES, NOTATION, INDEXING,
        ),
        numeric=Numeric(dims={"n_ctx": n, "d_vocab": len(VOCABULARY), "d_model": 4, "d_head": 4},
                        special={"A": lambda a, shape, rng: shift_matrix(shape[0]),
                                 "P_shift": lambda a, shape, rng: shift_matrix(shape[0]),
                                 "W_Q": _identity, "W_K": _identity, "W_O": _identity, "W_V": _identity,
                                 "W_E": _orthonormal_columns}),
    )
