"""The shared evaluator against a dense, term-by-term reference; sharing; no vocab x vocab matrix."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from derivations.architecture import Architecture
from derivations.paths import expand_logits
from derivations.qk import expand_qk
import numeric_check.verification.evaluate as evaluate_module
from numeric_check.verification.bind import Binder
from numeric_check.verification.hook_paths import record
from numeric_check.verification.evaluate import LogitEvaluator, LogitSum, StreamTrie, evaluate_term_alone, gram
from numeric_check.verification.evaluate_qk import QKEvaluator
from numeric_check.model.circuit_model import CircuitModel
from tests.conftest import FAST
from tests.strategies import heads_of, models_and_tokens

torch.set_num_threads(1)


def dense_position(binder, word, n_batch, n_pos):
    out = torch.eye(n_pos, dtype=torch.float64).expand(n_batch, n_pos, n_pos)
    for a in word:
        value = binder.position(a)
        out = out @ (torch.diag_embed(value.value) if value.diagonal else value.value)
    return out


def dense_word(binder, word):
    out = None
    for a in word:
        for f in binder.factors(a):
            out = f if out is None else out @ f
    return out


def dense_logit_term(binder, t):
    """``coeff · P X Wᵀ`` with every matrix formed: the definition, term by term."""
    rec = binder.recording
    P, W = t.term.words
    X = binder.source_input(t.source).as_dense()
    return binder.coeff(t.term.coeff) * (dense_position(binder, P, rec.n_batch, rec.n_pos) @ X @ dense_word(binder, W).T)


def dense_qk_term(binder, t):
    rec = binder.recording
    P, Q, M = t.term.words
    Xq = binder.source_input(t.query.source).as_dense()
    Xk = binder.source_input(t.key.source).as_dense()
    Pd, Qd = (dense_position(binder, w, rec.n_batch, rec.n_pos) for w in (P, Q))
    return binder.coeff(t.term.coeff) * (Pd @ Xq @ dense_word(binder, M) @ Xk.transpose(-1, -2) @ Qd.transpose(-1, -2))


@FAST
@given(models_and_tokens(max_batch=2))
def test_logit_terms_match_the_dense_definition(pair):
    model, tokens = pair
    rec = record(model, tokens)
    binder = Binder(model, rec)
    terms = list(expand_logits(model.arch))
    ev = LogitEvaluator(binder, terms)
    total = LogitSum(ev)
    seen = set()
    for value in ev.values():
        expected = dense_logit_term(binder, terms[value.index])
        ours = ev.logits(value)
        assert torch.allclose(ours, expected, rtol=1e-10, atol=1e-12)
        assert math.isclose(ev.norm(value), float(expected.norm()), rel_tol=1e-8, abs_tol=1e-10)
        total.add(value)
        seen.add(value.index)
    assert seen == set(range(len(terms)))  # every term, once
    scale = float(rec.logits.abs().max())
    # (random float64 models have writing weights centred in float64, so layer norm is a pure scale)
    assert torch.allclose(total.logits(), rec.logits, rtol=0, atol=1e-9 * scale)


@FAST
@given(models_and_tokens(min_layers=1, max_batch=2), st.data())
def test_qk_terms_match_the_dense_definition(pair, data):
    model, tokens = pair
    layer, head = data.draw(heads_of(model.arch))
    binder = Binder(model, record(model, tokens))
    terms = list(expand_qk(model.arch, layer, head))
    ev = QKEvaluator(binder, terms)
    for i, t in enumerate(terms):
        assert torch.allclose(ev.scores(i), dense_qk_term(binder, t), rtol=1e-10, atol=1e-12)


def two_layer(d_vocab=13):
    arch = Architecture(2, 3, positional="standard")
    model = CircuitModel.random(arch, d_model=16, d_head=4, d_vocab=d_vocab, n_ctx=8, seed=0, dtype=torch.float64, device="cpu")
    tokens = torch.randint(0, d_vocab, (2, 7), generator=torch.Generator().manual_seed(0))
    return model, tokens


def test_sharing_applies_fewer_operations_and_fuses_virtual_weights():
    model, tokens = two_layer()
    binder = Binder(model, record(model, tokens))
    terms = list(expand_logits(model.arch))
    ev = LogitEvaluator(binder, terms)
    list(ev.values())
    alone = 0
    for t in terms:
        trie = StreamTrie(binder)
        trie.add(ev.plan(t)[0])
        list(trie.walk())
        alone += trie.n_ops
    assert ev.trie.n_ops < alone / 1.5
    spec, left = ev.plan(terms[-1])  # pos→L0H2→L1H2
    assert any(op[0] == "F" for op in spec.ops)  # W_O^{L0} then W_V^{L1}: one 4 x 4 product
    assert [ref[0].name for ref in left] == ["W_OV", "W_U"]  # left at its narrowest: W_O, then W_U


def test_sibling_leaves_are_evaluated_together():
    """The terms that end one head below a node (a right factor, then position-side atoms) come
    from two products for all of them: fewer operations than terms, and the same values."""
    model, tokens = two_layer()
    binder = Binder(model, record(model, tokens))
    terms = list(expand_logits(model.arch))
    ev = LogitEvaluator(binder, terms)
    values = list(ev.values())
    assert ev.trie.n_ops < len(terms)  # one at a time: 60 operations for these 32 terms; together: 28
    side_by_side = {op for ops in ev.trie._side_by_side for op in ops}
    assert side_by_side and not side_by_side & set(ev.trie._fused)  # each fused factor kept once, side by side
    for value in values:
        torch.testing.assert_close(ev.logits(value), dense_logit_term(binder, terms[value.index]), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("limit", [3 * 2 * 7 * 7, 2 * 7 * 7])  # 3 chains per product; 1: none together
def test_sibling_leaves_in_bounded_products(monkeypatch, limit):
    """The stacked position matrices of one product stay under a bound (long inputs): the chains
    go in smaller products, or one at a time when a single one reaches it, with the same values."""
    monkeypatch.setattr(evaluate_module, "_STACKED_POSITIONS", limit)
    model, tokens = two_layer()  # 2 sequences of 7 positions
    binder = Binder(model, record(model, tokens))
    terms = list(expand_logits(model.arch))
    ev = LogitEvaluator(binder, terms)
    for value in ev.values():
        torch.testing.assert_close(ev.logits(value), dense_logit_term(binder, terms[value.index]), rtol=1e-10, atol=1e-12)
    assert all(stacked.shape[0] <= 3 for stacked in ev.trie._stacked_runs[1:] if stacked is not None)
    assert (ev.trie.n_ops >= 60) == (limit < 2 * 2 * 7 * 7)  # one at a time: 60 operations, as before batching


def test_a_term_alone_equals_the_shared_value():
    model, tokens = two_layer()
    binder = Binder(model, record(model, tokens))
    terms = list(expand_logits(model.arch))
    ev = LogitEvaluator(binder, terms)
    for value in ev.values():
        if value.index % 7 == 0:
            assert torch.allclose(evaluate_term_alone(binder, terms[value.index]), ev.logits(value), rtol=1e-12, atol=1e-13)


def test_blocked_gram():
    R = torch.randn(300, 2500, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(gram(R), R @ R.T, rtol=1e-12, atol=1e-9)
    for panels in (3, 8):
        assert torch.allclose(gram(R, panels), R @ R.T, rtol=1e-12, atol=1e-9)
    assert torch.allclose(gram(R.float()), (R @ R.T).float(), rtol=1e-4, atol=1e-2)
    small = R[:10, :20]
    assert torch.equal(gram(small), small @ small.T)


class LargestShapes(TorchDispatchMode):
    """Records the shape of every tensor an operation returns."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def test_no_vocab_by_vocab_matrix_is_formed():
    d_vocab = 97  # no other dimension is this large
    model, tokens = two_layer(d_vocab)
    binder = Binder(model, record(model, tokens))
    logit_terms = list(expand_logits(model.arch))
    qk_terms = list(expand_qk(model.arch, 1, 0))
    with LargestShapes() as spy:
        ev = LogitEvaluator(binder, logit_terms)
        total = LogitSum(ev)
        for value in ev.values():
            total.add(value)
            ev.norm(value)
        total.logits()
        qk = QKEvaluator(binder, qk_terms)
        for i in range(len(qk_terms)):
            qk.scores(i)
    assert spy.shapes
    assert all(sum(1 for n in shape if n >= d_vocab) < 2 for shape in spy.shapes), max(spy.shapes, key=lambda s: sum(s))


@FAST
@given(models_and_tokens(max_batch=2), st.integers(1, 7))
def test_terms_in_batches_agree_with_the_dense_definition(pair, chunk):
    """Grouped by their last multipliers and stacked (what verify_logits does chunk by chunk), the
    terms give each one's dense norm, largest row, and the same sum (their parts minus a stream:
    test_logit_isolation)."""
    model, tokens = pair
    rec = record(model, tokens)
    binder = Binder(model, rec)
    terms = list(expand_logits(model.arch))
    ev = LogitEvaluator(binder, terms)
    values = list(ev.values())
    total = LogitSum(ev)
    for start in range(0, len(values), chunk):
        for batch in ev.batches(values[start:start + chunk]):
            assert all(v.left == batch.left for v in batch.values)
            total.add_batch(batch)
            dense = [dense_logit_term(binder, terms[v.index]) for v in batch.values]
            for norm, expected in zip(ev.batch_norms(batch), dense):
                assert math.isclose(norm, float(expected.norm()), rel_tol=1e-8, abs_tol=1e-10)
            parts = [ev.parts(v)[batch.left[-1]] for v in batch.values]
            rows = max(float(p.norm(dim=-1).max()) for p in parts)
            assert math.isclose(ev.batch_max_row_norm(batch), rows, rel_tol=1e-8, abs_tol=1e-12)
    scale = float(rec.logits.abs().max())  # the batched sum is the model's logits, as the term-by-term one is
    assert torch.allclose(total.logits(), rec.logits, rtol=0, atol=1e-9 * scale)
