"""The paper's analyses of trained heads as derivations: the eigenvalue copying test and the
composition scores (with their random baseline).

The numbers the entries state are computed by the small numpy functions here, which the tests
check against the definitions (and against :mod:`numeric_check`'s batched versions).

>>> round(eigenvalue_positivity(np.array([2.0, 1.0, -1.0])), 3)
0.5
>>> M = np.eye(4)
>>> composition_score(M, M)
0.5
"""

from __future__ import annotations

import numpy as np

from tensoralg import W_OV, Product, TensorSum, Term, atom, sandwich, term

from derivations.catalogue.common import INDEXING, NOTATION
from derivations.catalogue.registry import entry
from derivations.derivation import Chain, Derivation
from derivations.errors import DerivationError
from derivations.document import Math, math, prose

# -- eigenvalues --------------------------------------------------------------------------


def nonzero_eigenvalues(M: np.ndarray, rtol: float = 1e-9) -> np.ndarray:
    """The eigenvalues of a square matrix whose modulus exceeds ``rtol`` times the largest,
    sorted by real part, then imaginary part.

    >>> nonzero_eigenvalues(np.diag([3.0, 0.0, -1.0]))
    array([-1.+0.j,  3.+0.j])
    """
    M = np.asarray(M)
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise DerivationError(f"eigenvalues need a square matrix, got shape {M.shape}")
    values = np.linalg.eigvals(M).astype(complex)
    scale = np.abs(values).max(initial=0.0)
    kept = values[np.abs(values) > rtol * scale] if scale > 0 else values[:0]
    return kept[np.lexsort((kept.imag, kept.real))]


def eigenvalue_positivity(values: np.ndarray) -> float:
    """``Σ_i λ_i / Σ_i |λ_i|``: 1 when every eigenvalue is positive (a copying circuit), -1 when
    all are negative; complex pairs pull it towards 0. (The real part: a real matrix's
    eigenvalues come in conjugate pairs, so ``Σλ`` is real.)"""
    values = np.asarray(values, dtype=complex)
    total = np.abs(values).sum()
    if total == 0:
        raise DerivationError("the positivity of a zero matrix is undefined (0/0)")
    return float(values.sum().real / total)


def copying_eigenvalues(W_U, W_O, W_V, W_E) -> tuple[np.ndarray, np.ndarray]:
    """The nonzero eigenvalues of the OV circuit ``W_U W_O W_V W_E`` (``d_vocab × d_vocab``) and
    of the small ``W_V W_E W_U W_O`` (``d_head × d_head``): equal, as ``λ(AB) = λ(BA)``."""
    big = W_U @ W_O @ W_V @ W_E
    small = W_V @ W_E @ W_U @ W_O
    return nonzero_eigenvalues(big), nonzero_eigenvalues(small)


# -- composition ----------------------------------------------------------------------------


def composition_score(X: np.ndarray, Y: np.ndarray) -> float:
    """``‖X Y‖_F / (‖X‖_F ‖Y‖_F)``: how much of what ``Y`` writes ``X`` reads (between 0 and 1)."""
    X, Y = np.asarray(X, dtype=float), np.asarray(Y, dtype=float)
    denominator = np.linalg.norm(X) * np.linalg.norm(Y)
    if denominator == 0:
        raise DerivationError("a composition score of a zero matrix is undefined (0/0)")
    return float(np.linalg.norm(X @ Y) / denominator)


def composition_scores(W_QK: np.ndarray, W_OV_reader: np.ndarray, W_OV_writer: np.ndarray) -> dict[str, float]:
    """The paper's three scores of a writer head ``h0`` into a later reader head ``h1``:
    Q: ``W_QK^{h1}ᵀ W_OV^{h0}``; K: ``W_QK^{h1} W_OV^{h0}``; V: ``W_OV^{h1} W_OV^{h0}``."""
    return {"Q": composition_score(W_QK.T, W_OV_writer), "K": composition_score(W_QK, W_OV_writer),
            "V": composition_score(W_OV_reader, W_OV_writer)}


def random_baseline(d_model: int, d_head: int, samples: int = 256, seed: int = 0) -> tuple[float, float]:
    """``(mean score, mean squared score)`` of random heads: ``X = W_Qᵀ W_K`` and
    ``Y = W_O W_V`` with i.i.d. Gaussian factors of the model's shapes (the low rank kept).
    ``E[score²] = 1/d_model`` exactly (``Y``'s law is invariant under rotations), so the mean
    score is a little below ``1/sqrt(d_model)``."""
    if min(d_model, d_head, samples) < 1:
        raise DerivationError(f"d_model, d_head and samples must be >= 1, got {d_model}, {d_head}, {samples}")
    rng = np.random.default_rng(seed)
    scores = []
    for _ in range(samples):
        X = rng.standard_normal((d_head, d_model)).T @ rng.standard_normal((d_head, d_model))
        Y = rng.standard_normal((d_model, d_head)) @ rng.standard_normal((d_head, d_model))
        scores.append(composition_score(X, Y))
    scores = np.array(scores)
    return float(scores.mean()), float((scores ** 2).mean())


# -- the entries ----------------------------------------------------------------------------


def split_word(expr: TensorSum, at: int) -> Product:
    """``c·X_1…X_n = c·(X_1…X_at)(X_at+1…X_n)``: a one-term, one-slot sum as a product of two
    factors (associativity read backwards)."""
    (t,) = expr.expand()
    (word,) = t.words
    if not 0 < at < len(word):
        raise DerivationError(f"cannot split a word of {len(word)} atoms at {at}")
    return Product([TensorSum([Term(t.coeff, (word[:at],))]), TensorSum([Term(1, (word[at:],))])])


@entry("eigenvalue-copying", "the copying test: eigenvalues of the OV circuit from the small W_V W_E W_U W_O")
def eigenvalue_copying() -> Derivation:
    W_U, W_O, W_V, W_E = atom("W_U"), atom("W_O", "h"), atom("W_V", "h"), atom("W_E")
    circuit = (
        Chain.start(None, term((W_U, atom("W_OV", "h"), W_E)),
                    detail="the OV circuit of head h: the vocabulary matrix of its term in the logits (see one-layer)",
                    intro=prose("A head copies when attending to a token raises that token's own logit. Its OV "
                                "circuit is a ", math("d_vocab × d_vocab"),
                                " matrix, the product of two thin factors:"))
        .unfold(W_OV)
        .apply(split_word, "associativity", 2,
               detail=prose(math("W_U W_O^h"), " is ", math("d_vocab × d_head"),
                            ", ", math("W_V^h W_E"), " is ", math("d_head × d_vocab")))
    )
    small = (
        Chain.start(None, Product([term((W_V, W_E)), term((W_U, W_O))]),
                    detail="the same two factors in the other order",
                    intro=prose("Multiplied the other way round, the factors give a ",
                                math("d_head × d_head"), " matrix:"))
        .expand()
    )
    return Derivation(
        "eigenvalue-copying", "The eigenvalue copying test",
        "Whether a head copies is read from the eigenvalues of its OV circuit; they are the eigenvalues of a "
        "small matrix, and their signs give a score.",
        (circuit, small),
        notes=(
            prose("For ", math("X"), " of size ", math("m × n"), " and ", math("Y"), " of size ",
                  math("n × m"), ", ", math("X Y"), " and ", math("Y X"),
                  " have the same nonzero eigenvalues with the same multiplicities, ",
                  math("λ(X Y) = λ(Y X)"), ": their characteristic polynomials satisfy ",
                  Math(r"t^{n} \det(t I_m - XY) = t^{m} \det(t I_n - YX)", "t^n det(t I_m - XY) = t^m det(t I_n - YX)"),
                  ". (If ", math("X Y v = λ v"), " with ", math("λ ≠ 0"), ", then ",
                  math("Y v ≠ 0"), " and ", math("Y X (Y v) = λ Y v"), ".)"),
            prose("So with ", math("X = W_U W_O^h"), " and ", math("Y = W_V^h W_E"),
                  ", the OV circuit, of rank at most ", math("d_head"), ", has at most ",
                  math("d_head"), " nonzero eigenvalues, and they are those of ",
                  math("W_V^h W_E W_U W_O^h"), ": an eigendecomposition of a ",
                  math("d_head × d_head"), " matrix instead of a ",
                  math("d_vocab × d_vocab"), " one, and the vocabulary matrix is never formed."),
            prose("The copying score is ", Math(r"\sum_i \lambda_i \big/ \sum_i |\lambda_i|",
                                                "Σ_i λ_i / Σ_i |λ_i|"),
                  ", between -1 and 1: near 1 when the eigenvalues are positive, as for a head whose circuit maps "
                  "each token to an increase of its own logit; complex eigenvalues, which come in conjugate pairs, "
                  "pull it towards 0."),
            NOTATION,
        ),
    )


@entry("composition-scores", "Q-, K- and V-composition scores of two heads, with the random baseline")
def composition_scores_entry() -> Derivation:
    QK, OV1, OV0 = atom("W_QK", "h"), atom("W_OV", "h"), atom("W_OV", "g")
    A0, A1, W_E = atom("A", "g"), atom("A", "h"), atom("W_E")
    moved = term(A0, (OV0, W_E))
    direct = term(None, W_E)
    q = Chain.start(None, sandwich(moved, QK, direct), "bilinear",
                    detail=prose("queries through head g, keys direct (the Q-composition term of ",
                                 math("S^h"), ")"),
                    intro=prose("Head g of an earlier layer writes into the residual stream that head h of a later "
                                "layer reads with its queries, its keys or its values. Each way gives a term whose middle matrix "
                                "is a product of the two heads' matrices:"))
    q_matrix = Chain.start(math("(W_QK^hᵀ W_OV^g)ᵀ"),
                           term((QK.T, OV0)).T, "transpose",
                           detail="the middle matrix of the Q-composition term, between the embeddings")
    k = Chain.start(None, sandwich(direct, QK, moved), "bilinear",
                    detail=prose("queries direct, keys through head g (the K-composition term of ",
                                 math("S^h"), ")"))
    v = Chain.start(None, Product([term(A1, OV1), term(A0, OV0)]),
                    detail="head h applied to what head g wrote (the V-composition, a virtual head)").expand()
    fro = r"\lVert {} \rVert_F"
    def ratio(top_latex, top_text, a_latex, a_text, b_latex, b_text):
        return Math(rf"{fro.format(top_latex)} \big/ \bigl({fro.format(a_latex)}\, {fro.format(b_latex)}\bigr)",
                    f"‖{top_text}‖_F / (‖{a_text}‖_F ‖{b_text}‖_F)")
    QK_l, OV1_l, OV0_l = r"W_{QK}^{h}", r"W_{OV}^{h}", r"W_{OV}^{g}"
    return Derivation(
        "composition-scores", "Composition scores",
        "How strongly a later head reads what an earlier head writes, through its queries, keys or values: "
        "a ratio of Frobenius norms of the matrices in the composition terms, compared with random heads.",
        (q, q_matrix, k, v),
        notes=(
            prose("The scores, as the paper defines them. Q-composition: ",
                  ratio(r"W_{QK}^{h\top} " + OV0_l, "W_QK^hᵀ W_OV^g", QK_l, "W_QK^h", OV0_l, "W_OV^g"),
                  " (the transpose of the Q-term's middle matrix: a transpose does not change a Frobenius norm); "
                  "K-composition: ", ratio(QK_l + " " + OV0_l, "W_QK^h W_OV^g", QK_l, "W_QK^h", OV0_l, "W_OV^g"),
                  "; V-composition: ", ratio(OV1_l + " " + OV0_l, "W_OV^h W_OV^g", OV1_l, "W_OV^h", OV0_l, "W_OV^g"),
                  ". Each lies between 0 and 1, since ", Math(r"\lVert XY \rVert_F \le \lVert X \rVert_F \lVert Y \rVert_F",
                                                             "‖XY‖_F ≤ ‖X‖_F ‖Y‖_F"), "."),
            prose("The random baseline: if the earlier head's ", math("Y = W_OV^g"),
                  " is drawn with a law invariant under rotations of the residual stream (Gaussian factors ",
                  math("W_O, W_V"), "), then ",
                  Math(r"\mathrm{E}[Y Y^{\top} / \lVert Y \rVert_F^2] = I / d_{model}", "E[Y Yᵀ / ‖Y‖_F²] = I / d_model"),
                  ", so for any fixed ", math("X"), " the squared score has mean ",
                  Math(r"\mathrm{E}\bigl[\lVert XY \rVert_F^2 / (\lVert X \rVert_F^2 \lVert Y \rVert_F^2)\bigr] = 1/d_{model}",
                       "E[‖XY‖_F² / (‖X‖_F² ‖Y‖_F²)] = 1/d_model"),
                  ": random heads score about ", math("1/sqrt(d_model)"),
                  " (a little less, the mean of a square root being below the root of the mean). "
                  "A pair of heads composes when its score stands clearly above that."),
            NOTATION, INDEXING,
        ),
    )
