"""The paper's analyses as catalogue entries: the statements their notes make, checked numerically."""

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from tensoralg import TensorSum, Term, atom, to_numpy

from derivations import catalogue
from derivations.catalogue.analyses import (composition_score, composition_scores, copying_eigenvalues,
                                            eigenvalue_positivity, nonzero_eigenvalues, random_baseline)
from derivations.catalogue.induction import induction_example, shift_matrix
from derivations.catalogue.marginal import PAPER, cross_entropy, marginal_losses
from derivations.numeric import RandomBindings
from derivations.errors import DerivationError

from tests.conftest import PROPERTY, THOROUGH
from tests.strategies import token_sequences


def bound(d, seed=0):
    return RandomBindings(d.numeric, np.random.default_rng(seed))


def operator(binder, expr, rows=None):
    return binder.operator(expr, rows or {0: 1})


# -- eigenvalue copying -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_small_matrix_has_the_nonzero_eigenvalues_of_the_ov_circuit(seed):
    d = catalogue.get("eigenvalue-copying")
    binder = bound(d, seed)
    big = operator(binder, d.chains[0].last)
    small = operator(binder, d.chains[1].last)
    assert big.shape == (6, 6) and small.shape == (3, 3)  # d_vocab x d_vocab, d_head x d_head
    np.testing.assert_allclose(nonzero_eigenvalues(big), nonzero_eigenvalues(small), atol=1e-10)
    assert np.linalg.matrix_rank(big) <= 3
    assert str(d.chains[1].last) == "W_V^{h} W_E W_U W_O^{h}"


@PROPERTY
@given(st.integers(1, 4), st.integers(5, 9), st.integers(4, 8), st.integers(0, 2**31 - 1))
def test_lambda_ab_equals_lambda_ba_for_any_thin_factors(d_head, d_vocab, d_model, seed):
    rng = np.random.default_rng(seed)
    W_U, W_O = rng.standard_normal((d_vocab, d_model)), rng.standard_normal((d_model, d_head))
    W_V, W_E = rng.standard_normal((d_head, d_model)), rng.standard_normal((d_model, d_vocab))
    big, small = copying_eigenvalues(W_U, W_O, W_V, W_E)
    assert len(big) == len(small) <= d_head
    np.testing.assert_allclose(big, small, atol=1e-8 * max(1.0, np.abs(small).max(initial=0)))


def test_the_copying_score_is_one_for_a_copying_circuit_and_minus_one_for_its_negative():
    rng = np.random.default_rng(0)
    W_E = rng.standard_normal((8, 10))
    V = np.linalg.qr(rng.standard_normal((8, 3)))[0].T  # orthonormal rows: W_V
    big, small = copying_eigenvalues(W_E.T, V.T, V, W_E)  # W_U = W_Eᵀ, W_O = W_Vᵀ: a Gram matrix
    assert eigenvalue_positivity(small) == pytest.approx(1.0)
    assert eigenvalue_positivity(-small) == pytest.approx(-1.0)
    assert eigenvalue_positivity(np.array([1j, -1j])) == pytest.approx(0.0)


def test_the_copying_score_agrees_with_numeric_check():
    from numeric_check.circuits.ov_qk import eigenvalue_positivity as torch_positivity

    values = np.linalg.eigvals(np.random.default_rng(5).standard_normal((5, 5)))
    assert eigenvalue_positivity(values) == pytest.approx(float(torch_positivity(torch.tensor(values))))
    with pytest.raises(DerivationError, match="0/0"):
        eigenvalue_positivity(np.zeros(3))
    with pytest.raises(DerivationError, match="square matrix"):
        nonzero_eigenvalues(np.zeros((2, 3)))


# -- composition scores ---------------------------------------------------------------------------


def test_the_composition_chains_hold_the_products_the_scores_measure():
    d = catalogue.get("composition-scores")
    q, q_matrix, k, v = d.chains
    QK, OV0, OV1 = atom("W_QK", "h"), atom("W_OV", "g"), atom("W_OV", "h")
    (qt,), (kt,), (vt,) = q.last, k.last, v.last
    assert qt.words[2][1:3] == (OV0.T, QK) and kt.words[2][1:3] == (QK, OV0) and vt.words[1] == (OV1, OV0)
    assert q_matrix.last == TensorSum([Term(1, ((OV0.T, QK),))])
    assert d.verify().ok


@pytest.mark.parametrize("seed", [0, 1])
def test_the_scores_are_the_papers_and_agree_with_numeric_check(seed):
    from numeric_check.circuits.composition import pair_composition_scores

    g = torch.Generator().manual_seed(seed)
    d_model, d_head = 7, 3
    heads = [{n: torch.randn(d_head, d_model, generator=g, dtype=torch.float64) for n in ("W_Q", "W_K", "W_V")}
             for _ in range(2)]
    for h in heads:
        h["W_O"] = torch.randn(d_model, d_head, generator=g, dtype=torch.float64)
    reader, writer = heads
    W_QK = (reader["W_Q"].T @ reader["W_K"]).numpy()
    ours = composition_scores(W_QK, (reader["W_O"] @ reader["W_V"]).numpy(), (writer["W_O"] @ writer["W_V"]).numpy())
    for kind, value in ours.items():
        assert value == pytest.approx(float(pair_composition_scores(reader, writer, kind)), rel=1e-10), kind
        assert 0 < value <= 1
    # a transpose leaves the Q score unchanged: the chain's middle matrix (W_QKᵀ W_OV)ᵀ gives the same number
    W_OV0 = (writer["W_O"] @ writer["W_V"]).numpy()
    assert composition_score(W_QK.T, W_OV0) == pytest.approx(np.linalg.norm((W_QK.T @ W_OV0).T)
                                                               / np.linalg.norm(W_QK) / np.linalg.norm(W_OV0))


@pytest.mark.parametrize("d_model, d_head", [(8, 2), (16, 4)])
def test_the_random_baseline_has_mean_square_one_over_d_model(d_model, d_head):
    mean, mean_square = random_baseline(d_model, d_head, samples=3000, seed=1)
    assert mean_square == pytest.approx(1 / d_model, rel=0.06)
    assert mean < np.sqrt(1 / d_model) and mean > 0.6 * np.sqrt(1 / d_model)
    with pytest.raises(DerivationError, match="must be >= 1"):
        random_baseline(0, 2)


# -- the induction mechanism ----------------------------------------------------------------------


def test_the_worked_example_attends_to_the_token_after_an_earlier_copy():
    ex = induction_example()
    assert ex.tokens == ("c", "a", "b", "a", "b")
    assert ex.attends() == {0: 0, 3: 2, 4: 3}
    np.testing.assert_array_equal(shift_matrix(5).sum(axis=1), np.ones(5))
    with pytest.raises(DerivationError, match="not in the vocabulary"):
        induction_example(("a", "z"))


@THOROUGH
@given(token_sequences())
def test_the_induction_term_scores_keys_whose_previous_token_is_the_querys(tokens):
    ex = induction_example(tokens)
    for i in range(len(tokens)):
        for j in range(1, len(tokens)):
            assert ex.scores[i, j] == (tokens[i] == tokens[j - 1])
        assert ex.scores[i, 0] == (tokens[i] == tokens[0])


def test_the_derived_term_with_the_entrys_bindings_gives_the_printed_scores():
    """The chain's first line, Id ⊗ A^prev ⊗ W_Eᵀ W_QK W_OV W_E, bound as the entry binds it and acting
    on one-hot tokens as P X M Xᵀ Qᵀ, gives exactly the scores the document prints."""
    d = catalogue.get("induction-mechanism")
    assert d.verify().ok
    ex = induction_example()
    binder = bound(d)
    (t,) = d.chains[0].first
    n = len(ex.tokens)
    P, Q, M = (to_numpy(TensorSum([Term(1, (w,))]), {a: binder.bind(a) for a in w}, dims=binder.dims,
                        slot_sizes={0: n}) for w in t.words)
    np.testing.assert_allclose(P @ ex.X @ M @ ex.X.T @ Q.T, ex.scores, atol=1e-12)
    assert str(d.chains[0].last) == "Id ⊗ P_shift ⊗ Id"
    latex = d.to_latex()
    assert latex.count(r"\begin{bmatrix}") == 3


# -- marginal loss --------------------------------------------------------------------------------


def test_marginal_losses_telescope_from_the_uniform_prediction_and_are_negative_when_loss_falls():
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 6, 10)
    helpful = 3.0 * np.eye(6)[targets]
    parts = [rng.standard_normal((10, 6)) * 0.1, helpful, rng.standard_normal((10, 6)) * 0.01]
    rows = marginal_losses(parts, targets)
    assert sum(change for _, change in rows) == pytest.approx(cross_entropy(sum(parts), targets) - np.log(6))
    assert rows[1][1] < 0  # adding the logits that favour the targets lowers the loss
    assert cross_entropy(np.zeros((3, 8)), [0, 1, 2]) == pytest.approx(np.log(8))
    with pytest.raises(DerivationError, match="one target per position"):
        cross_entropy(np.zeros((3, 4)), [0, 1])
    with pytest.raises(DerivationError, match="targets must lie in 0..3"):
        cross_entropy(np.zeros((2, 4)), [0, 4])


def test_the_truncations_are_the_sums_of_the_first_orders():
    d = catalogue.get("marginal-loss")
    full, upto0, upto1 = d.chains
    groups = dict(full.steps[-1].groups)
    assert list(groups) == ["direct path", "individual heads", "virtual heads through 2 heads"]
    assert upto0.last == groups["direct path"]
    assert upto1.last == groups["direct path"] + groups["individual heads"]
    assert d.verify().ok
    text = " ".join(d.to_text().split())
    for k, (name, value) in enumerate(zip(("direct path", "individual heads", "virtual heads"), PAPER)):
        assert f"{k} | {name} | {value:.1f}" in text and value < 0
    assert r"\begin{array}{clr}" in d.to_latex()


@pytest.mark.parametrize("name", ["composition-scores", "induction-mechanism", "eigenvalue-copying", "marginal-loss"])
def test_the_new_entries_read_the_same_in_the_papers_layer_numbering(name):
    """No layer number is written into their prose, so --index-from 1 cannot make it disagree with the terms."""
    d = catalogue.get(name)
    for numbering in (0, 1):
        text = " ".join(d.to_text(index_from=numbering).split())
        assert "of layer 0" not in text and "of layer 1 reads" not in text
    assert d.to_text(index_from=1) != "" and d.verify().ok
