"""Check 2 of verify_logits by groups: the model's isolated streams a group at a time, and each
group's errors before the unembedding, against the term-by-term definitions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import numeric_check.verification.isolate as isolate_module
from derivations.architecture import Architecture
from derivations.paths import expand_logits
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.hook_paths import record
from numeric_check.verification.bind import Binder
from numeric_check.verification.evaluate import LogitEvaluator
from numeric_check.verification.isolate import GROUP_BYTES, isolate_final_groups, isolate_logit_paths
from numeric_check.verification.logit_space import LogitSpace
from numeric_check.verification.verify import verify_logits
from tests.conftest import FAST
from tests.strategies import models_and_tokens

torch.set_num_threads(1)
TOKENS = torch.tensor([[1, 2, 3, 4, 5], [5, 6, 7, 0, 1]])


def setup(model, tokens):
    rec = record(model, tokens)
    terms = list(expand_logits(model.arch))
    ev = LogitEvaluator(Binder(model, rec), terms)
    return rec, terms, ev, LogitSpace(model, rec)


@FAST
@given(models_and_tokens(max_batch=2), st.data())
def test_groups_hold_each_path_once_and_equal_its_logits(pair, data):
    """Every path comes once, in a group of one source whose last heads share a layer; the stacked
    streams are each path's unembedding input (its logits, through W_U, as isolate_logit_paths gives)."""
    model, tokens = pair
    rec = record(model, tokens)
    paths = [t.path for t in expand_logits(model.arch)]
    chunk = data.draw(st.sampled_from([1, 10**4, 10**9]))
    seen = []
    alone = dict(isolate_logit_paths(model, rec, paths, chunk_bytes=chunk))
    for indices, x, bias in isolate_final_groups(model, rec, paths, chunk_bytes=chunk):
        assert x.shape == (len(indices), *rec.final.shape)
        assert len({paths[i].source for i in indices}) == 1
        assert len({paths[i].heads[-1][0] if paths[i].heads else None for i in indices}) == 1
        assert len(indices) == 1 or x.numel() * x.element_size() <= GROUP_BYTES
        for i, xi in zip(indices, x.unbind(0)):
            with torch.no_grad():
                logits = xi @ model.W_U.T + (bias * model.b_U if model.b_U is not None else 0)
            torch.testing.assert_close(logits, alone[i], rtol=0, atol=1e-12 * max(1.0, float(alone[i].detach().abs().max())))
        seen += indices
    assert sorted(seen) == list(range(len(paths)))


def test_a_copys_paths_through_one_layer_come_in_one_group():
    model = CircuitModel.random(Architecture(2, 3), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0, dtype=torch.float64, device="cpu")
    rec, terms, _, _ = setup(model, TOKENS)
    sizes = sorted(len(indices) for indices, _, _ in isolate_final_groups(model, rec, [t.path for t in terms]))
    # tok (direct) alone; tok through each L0 head alone (each stream is also its copy's start); tok
    # through the L1 heads at once; then the copy of each L0 head: its 3 paths through L1 at once
    assert sizes == [1, 1, 1, 1, 3, 3, 3, 3]


def test_groups_stay_under_their_bound(monkeypatch):
    model = CircuitModel.random(Architecture(2, 3), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=0, dtype=torch.float64, device="cpu")
    rec, terms, _, _ = setup(model, TOKENS)
    per_path = rec.final.numel() * rec.final.element_size()
    monkeypatch.setattr(isolate_module, "GROUP_BYTES", 2 * per_path)
    sizes = [len(indices) for indices, _, _ in isolate_final_groups(model, rec, [t.path for t in terms])]
    assert max(sizes) == 2 and sum(sizes) == len(terms)  # 3 heads of a layer: parts of 2 and 1


@FAST
@given(models_and_tokens(max_batch=2))
def test_differences_are_each_terms_part_minus_its_stream(pair):
    """LogitSpace.differences, batched (one product left, same shapes) or term by term, gives each
    term's input to W_U minus the stream given for it, as the terms' own parts do."""
    model, tokens = pair
    rec, terms, ev, space = setup(model, tokens)
    values = [v for v in ev.values() if space.ends_in_W_U(v)]
    by_left: dict = {}
    for v in values:
        by_left.setdefault((len(v.left), v.y.shape), []).append(v)
    gen = torch.Generator().manual_seed(0)
    for group in list(by_left.values()) + [values[:5]]:
        x = torch.randn(len(group), *rec.final.shape, dtype=rec.final.dtype, generator=gen)
        expected = torch.stack([ev.parts(v)[v.left[-1]].expand(rec.final.shape) for v in group]) - x
        for chosen, xs in ((group, x), (group[:1], x[:1])):
            torch.testing.assert_close(space.differences(ev, chosen, xs), expected[:len(chosen)], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("biases", [False, True])
def test_verification_by_groups_fails_on_one_wrong_head(monkeypatch, biases):
    """A group's product goes wrong for one head only: that head's terms, and only those, fail check 2."""
    arch = Architecture(2, 3, layer_norm=True, biases=biases)
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=1, device="cpu")
    attn = type(model.blocks[1].attn)
    outputs = attn.head_outputs

    def off(self, z, heads):
        out = outputs(self, z, heads)
        if self is model_copy["attn"] and 2 in heads:
            out[heads.index(2)] *= 1 + 1e-6
        return out

    model_copy = {}
    working = model.working_copy
    monkeypatch.setattr(CircuitModel, "working_copy", lambda self, *a, **k: _remember(working(*a, **k), model_copy))
    monkeypatch.setattr(attn, "head_outputs", off)
    report = verify_logits(model, TOKENS, exact_errors=False)
    failed = {t.label for t in report.terms if not t.passed}
    assert failed and all(label.endswith("L1H2") for label in failed), failed
    assert report.check("isolation").passed is False and report.check("sum").passed


def _remember(work, into):
    into["attn"] = work.blocks[1].attn
    return work


def test_stacked_factors_stay_under_their_bound(monkeypatch):
    """The stacked factors of batched differences are kept up to STACKS_LIMIT entries, then dropped
    and stacked again; the differences do not change."""
    import numeric_check.verification.logit_space as logit_space_module

    model = CircuitModel.random(Architecture(3, 3), d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=2, dtype=torch.float64, device="cpu")
    rec = record(model, TOKENS)
    terms = list(expand_logits(model.arch, 2))  # order 2: the copies through L0 end in L1 and in L2
    ev = LogitEvaluator(Binder(model, rec), terms)
    groups = [(indices, x) for indices, x, _ in isolate_final_groups(model, rec, [t.path for t in terms]) if len(indices) > 1]
    values = {v.index: v for v in ev.values()}
    space = LogitSpace(model, rec)
    first = [space.differences(ev, [values[i] for i in indices], x) for indices, x in groups]
    one_set = 3 * 4 * 8  # a layer's three W_O^hᵀ, 4 x 8 each
    monkeypatch.setattr(logit_space_module, "STACKS_LIMIT", one_set)
    space = LogitSpace(model, rec)
    for (indices, x), expected in zip(groups, first):
        torch.testing.assert_close(space.differences(ev, [values[i] for i in indices], x), expected, rtol=0, atol=0)
        assert sum(t.numel() for t in space._stacks.values()) <= one_set
    assert len({tuple(v.left[0] for v in (values[i] for i in indices)) for indices, _ in groups}) > 1  # sets were dropped


@FAST
@given(models_and_tokens(max_batch=2), st.sampled_from([torch.float64, torch.float32]))
def test_head_map_bounds_hold_the_exact_errors(pair, dtype):
    """Check 2's bound through the head maps (the model's z, then x[p] = σ_p z[p] M_h) is at least each
    term's exact logit-space error, for any architecture the strategy draws (norms before and after
    attention, RMSNorm, grouped queries, rotary…), in float64 and float32."""
    model, tokens = pair
    exact = verify_logits(model, tokens, exact_errors=True, dtype=dtype)
    bounded = verify_logits(model, tokens, exact_errors=False, dtype=dtype)
    assert exact.passed and bounded.passed
    for a, b in zip(exact.terms, bounded.terms):
        assert a.max_abs_error <= b.error_bound or b.max_abs_error is not None, (a.label, a.max_abs_error, b.error_bound)


def test_head_maps_are_the_models_own_map_after_z():
    """HeadMaps: σ_p z[p] M_h is what the model's modules give the unembedding from a head's z, within
    the rounding it measures (kappa), on a model with norms after attention and RMSNorm."""
    from numeric_check.verification.isolate import head_final_inputs
    from numeric_check.verification.logit_isolation import HeadMaps

    arch = Architecture(2, 3, norm="rms_norm", sublayer_norm="both")
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=10, n_ctx=6, seed=1, dtype=torch.float64, device="cpu")
    rec = record(model, TOKENS)
    maps = HeadMaps(model, rec)
    for layer in range(2):
        M, norms, sigma, kappa = maps.layer(layer)
        z = torch.randn(*TOKENS.shape, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(layer))
        ours = sigma[None, ..., None] * torch.einsum("bpne,ned->nbpd", z, M)
        torch.testing.assert_close(ours, head_final_inputs(model, rec, layer, [0, 1, 2], z), rtol=1e-13, atol=1e-13)
        assert kappa < 1e-12 and norms.shape == (3,)


def test_settlement_unembeds_a_terms_own_input_only_when_its_error_needs_its_scale():
    """A term passes when its exact error is within ``atol + rtol · max(scale, own)``, ``own`` its own largest
    logit: a term within the tolerance at the logits' scale passes without its own input being made; one over it
    is judged with its own largest logit (passes when that is large enough, fails when not)."""
    from types import SimpleNamespace

    import numpy as np

    from numeric_check.verification.bounds import MaxAbsProduct
    from numeric_check.verification.logit_isolation import Settlement

    class Table:
        def __init__(self, n):
            self.passed, self.bound, self.error = np.full(n, -1, np.int8), np.full(n, np.nan), np.full(n, np.nan)

        def set_bound(self, i, b):
            self.bound[i] = b

        def set_error(self, i, e):
            self.error[i] = e

    space = SimpleNamespace(product=MaxAbsProduct([torch.eye(2, dtype=torch.float64)]), widened=lambda x: x)
    table, made = Table(4), []
    settlement = Settlement(None, space, table, (0.0, 0.1, 1.0), exact=True)  # tolerance 0.1 at the scale 1
    errors = torch.tensor([[[0.05, 0.0]], [[0.0, -0.3]], [[0.5, 0.0]], [[0.0, 0.1]]], dtype=torch.float64)
    ours = torch.tensor([[[9.0, 0.0]], [[0.0, 5.0]], [[2.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)

    def own(k):
        made.append(k.tolist())
        return ours[k]
    settlement.settle([0, 1], errors[:2], torch.ones(2, dtype=torch.float64), own)
    settlement.settle([2, 3], errors[2:], torch.ones(2, dtype=torch.float64), lambda k: own(k + 2))
    settlement.finish()
    assert table.error.tolist() == [0.05, 0.3, 0.5, 0.1]
    assert table.passed.tolist() == [1, 1, 0, 1]  # 0.3 ≤ 0.1 · 5 (its own); 0.5 > 0.1 · max(1, 2)
    assert made == [[0, 1], [2, 3]]  # each batch's own inputs made once, unembedded only for terms 1 and 2
    settlement.settle([0], errors[:1], torch.ones(1, dtype=torch.float64), own)
    settlement.finish()
    assert made == [[0, 1], [2, 3]]  # every error within the tolerance at the scale: no own input made
