"""The grouped evaluation (terms through heads batched on the term axis) against the shared trie, term by term."""

import logging
import math
from itertools import product

import pytest
import torch
from hypothesis import given, settings, strategies as st

import numeric_check.verification.verify as verify_module
from derivations.architecture import Architecture
from derivations.paths import expand_logits
from derivations.sources import Path
from numeric_check import verify_logits
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.hook_paths import record
from numeric_check.verification.bind import Binder
from numeric_check.verification.budget import PathChoice, choose_path
from numeric_check.verification.evaluate import LogitEvaluator
from numeric_check.verification.grouped import GroupEvaluator, group_values, plan_groups
from numeric_check.verification.grouped_isolation import PrefixPasses
from numeric_check.verification.isolate import HeadGroup, isolate_final_parts
from tests.conftest import HEAVY
from tests.strategies import architectures, max_orders, seeds

ARCHS = {
    "attention only": Architecture(3, 2),
    "layer norm, MLPs, biases": Architecture(3, 3, layer_norm=True, mlp=True, biases=True),
    "heads differ per layer": Architecture(3, (2, 3, 1), layer_norm=True, biases=True),
    "parallel blocks, RMS norm": Architecture(2, 2, norm="rms_norm", mlp=True, parallel=True),
    "norms before and after sublayers": Architecture(3, 2, norm="rms_norm", sublayer_norm="both", mlp=True),
}


def _model(arch, seed=0):
    return CircuitModel.random(arch, d_model=12, d_head=4, d_vocab=11, n_ctx=7, seed=seed, dtype=torch.float64,
                               device="cpu")


def _trie_only(monkeypatch):
    monkeypatch.setattr(verify_module, "plan_groups", lambda *a, **k: None)


def _grouped_only(monkeypatch):
    monkeypatch.setattr(verify_module, "choose_path", lambda *a: PathChoice("grouped", "forced"))


@pytest.mark.parametrize("name", sorted(ARCHS))
@pytest.mark.parametrize("max_order", [1, 2, None])
def test_the_grouped_report_is_the_trie_report_term_by_term(monkeypatch, name, max_order):
    model = _model(ARCHS[name])
    tokens = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])  # two sequences: a batch axis that must not mix
    _grouped_only(monkeypatch)
    grouped = verify_logits(model, tokens, max_order=max_order, device="cpu", exact_errors=True)
    _trie_only(monkeypatch)
    trie = verify_logits(model, tokens, max_order=max_order, device="cpu", exact_errors=True)
    assert grouped.passed and trie.passed
    assert [t.label for t in grouped.terms] == [t.label for t in trie.terms]
    for g, t in zip(grouped.terms, trie.terms):
        assert math.isclose(g.norm, t.norm, rel_tol=1e-10, abs_tol=1e-12), (g.label, g.norm, t.norm)
        assert g.max_abs_error <= 1e-12 * max(1.0, t.norm) and g.passed
    for a, b in zip(grouped.checks, trie.checks):
        assert (a.name, a.passed) == (b.name, b.passed)


@HEAVY
@given(arch=architectures(min_layers=1, max_layers=3, max_heads=3), max_order=max_orders(3), seed=seeds(),
       chunk=st.sampled_from([1 << 12, 1 << 16, None]))
def test_either_path_gives_the_same_report_whatever_the_architecture_and_order(arch, max_order, seed, chunk):
    """The grouped passes and the shared trie, on any small architecture, at any order and chunk (the smallest:
    a pass of check 2 holds one copy of a prefix group, fewer than its heads): the same terms, norms, verdicts
    and checks."""
    max_order = None if max_order is None else min(max_order, arch.n_layers)
    model = CircuitModel.random(arch, d_model=6, d_head=3, d_vocab=7, n_ctx=5, seed=seed, dtype=torch.float64, device="cpu")
    tokens = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 1]])
    with pytest.MonkeyPatch.context() as patch:
        _grouped_only(patch)
        grouped = verify_logits(model, tokens, max_order=max_order, device="cpu", chunk_bytes=chunk)
    with pytest.MonkeyPatch.context() as patch:
        _trie_only(patch)
        trie = verify_logits(model, tokens, max_order=max_order, device="cpu", chunk_bytes=chunk)
    assert grouped.passed and trie.passed
    assert [t.label for t in grouped.terms] == [t.label for t in trie.terms]
    for g, t in zip(grouped.terms, trie.terms):
        assert math.isclose(g.norm, t.norm, rel_tol=1e-10, abs_tol=1e-12) and g.passed and t.passed, (g, t)
    assert [(c.name, c.passed, c.bounded) for c in grouped.checks] == [(c.name, c.passed, c.bounded) for c in trie.checks]


@pytest.mark.parametrize("name", sorted(ARCHS))
@pytest.mark.parametrize("budget", [1, 1 << 30])
def test_prefix_passes_give_each_path_the_z_the_model_isolates_for_it(name, budget):
    """Check 2 of a group reads the model's z of its paths from passes over a prefix group's copies (one
    copy a pass with the least budget, a prefix group a pass with room): each path's z is the one the
    path-by-path isolation gives it."""
    model = _model(ARCHS[name])
    rec = record(model, torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]))
    plan = plan_groups(Binder(model, rec), expand_logits(model.arch, None))
    passes = PrefixPasses(model, rec, budget)
    b, p = rec.n_batch, rec.n_pos
    for group in plan.groups:
        H = group.counts[-1]
        z = torch.cat([z for _, z in passes.z(group.entry, group.layers, group.counts, 0, group.n_terms // H)])
        rows = z.view(-1, b, p, H, z.shape[-1]).permute(0, 3, 1, 2, 4).flatten(0, 1)  # [n_terms, b, pos, e]
        paths = [Path.trusted(group.source, tuple(zip(group.layers, heads))) for heads in product(*map(range, group.counts))]
        seen = 0
        for part in isolate_final_parts(model, rec, paths):
            assert isinstance(part, HeadGroup)
            for k, i in enumerate(part.indices):
                torch.testing.assert_close(rows[i], part.z[:, :, k], rtol=0, atol=1e-12)
                seen += 1
        assert seen == group.n_terms == rows.shape[0]
    depth = max(len(g.layers) for g in plan.groups) - 1  # the deepest prefixes' copies: each runs once with room
    deepest = {(g.source, g.layers[:-1], g.counts[:-1]) for g in plan.groups if len(g.layers) == depth + 1}
    ran = sum(n for d, n in passes.sizes if d == depth)
    assert ran == sum(math.prod(counts) for _, _, counts in deepest) if budget > 1 else all(n == 1 for _, n in passes.sizes)


def test_rows_compared_in_full_a_few_at_a_time_give_the_same_errors(monkeypatch):
    """Rows the bound does not settle (every row, with exact errors) are compared through the model's modules
    a few at a time (their unembedding inputs are d_model wide): one row at a time gives the same report."""
    from numeric_check.verification import grouped_isolation

    model, tokens = _model(ARCHS["layer norm, MLPs, biases"]), torch.tensor([[1, 2, 3, 4, 5]])
    _grouped_only(monkeypatch)
    together = verify_logits(model, tokens, max_order=2, device="cpu", exact_errors=True)
    monkeypatch.setattr(grouped_isolation, "GROUP_BYTES", 1)
    alone = verify_logits(model, tokens, max_order=2, device="cpu", exact_errors=True)
    assert together.passed and alone.passed
    assert all(t.max_abs_error is not None for t in alone.terms)  # (rounding differs with the batch's size)
    assert [t.max_abs_error for t in alone.terms] == pytest.approx([t.max_abs_error for t in together.terms], abs=1e-14)
    assert [t.passed for t in alone.terms] == [t.passed for t in together.terms]


def test_a_wrong_term_is_caught_by_check_2_in_the_grouped_evaluation(monkeypatch):
    """The grouped values are what check 2 compares: a wrong pattern bound to one head fails its terms."""
    from numeric_check.verification import grouped as grouped_module

    model = _model(ARCHS["layer norm, MLPs, biases"])
    layer = grouped_module.GroupEvaluator.layer

    def wrong(self, index):
        got = layer(self, index)
        if index == 1:
            A = got.A.clone()
            A[2] = A[2].flip(-1)  # head L1H2 reads the wrong positions
            got = got._replace(A=A)
        return got

    monkeypatch.setattr(grouped_module.GroupEvaluator, "layer", wrong)
    _grouped_only(monkeypatch)
    report = verify_logits(model, torch.tensor([[1, 2, 3, 4, 5]]), max_order=2, device="cpu")
    failed = {t.label for t in report.terms if not t.passed}
    assert failed and all("L1H2" in label for label in failed)
    assert not report.passed


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 400), seed=st.integers(0, 3))
def test_chunks_of_any_size_give_the_same_rows(rows, seed):
    """Memory is bounded by the chunk: rows made a few at a time are the rows made at once (to rounding: a
    chunk's products are as wide as its rows, and a product's kernel may round a narrow one differently)."""
    model = _model(Architecture(3, 3, layer_norm=True, biases=True), seed)
    binder = Binder(model, record(model, torch.tensor([[3, 1, 4, 1, 5, 9]])))
    plan = plan_groups(binder, expand_logits(model.arch))
    whole, small = GroupEvaluator(binder), GroupEvaluator(binder, row_entries=rows)
    for group in plan.groups:
        a = torch.cat([y for _, y in whole.values(group)])
        parts = list(small.values(group))
        assert [first for first, _ in parts] == sorted(first for first, _ in parts)
        assert parts[0][0] == group.start and sum(y.shape[0] for _, y in parts) == group.n_terms
        torch.testing.assert_close(torch.cat([y for _, y in parts]), a, rtol=1e-14, atol=1e-15)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 60), data=st.data())
def test_rows_of_any_range_of_prefixes_are_those_rows_of_the_whole(rows, data):
    """A group's rows for a range of prefixes (a pass of check 2's copies), in chunks of any size, are exactly
    those rows of the whole group, head-major blocks that each hold whole prefixes or one prefix's heads."""
    model = _model(Architecture(4, (3, 2, 3, 2), layer_norm=True, biases=True))
    binder = Binder(model, record(model, torch.tensor([[3, 1, 4, 1, 5, 9]])))
    plan = plan_groups(binder, expand_logits(model.arch))
    group = data.draw(st.sampled_from([g for g in plan.groups if len(g.layers) >= 2]))
    H, n = group.counts[-1], group.n_terms // group.counts[-1]
    c0 = data.draw(st.integers(0, n - 1))
    c1 = data.draw(st.integers(c0 + 1, n))
    whole = torch.cat([y for _, y in GroupEvaluator(binder).values(group)])
    parts = list(GroupEvaluator(binder, row_entries=rows).values(group, range(c0, c1)))
    assert [first for first, _ in parts] == sorted(first for first, _ in parts)
    assert parts[0][0] == group.start + c0 * H and sum(y.shape[0] for _, y in parts) == (c1 - c0) * H
    torch.testing.assert_close(torch.cat([y for _, y in parts]), whole[c0 * H:c1 * H], rtol=1e-14, atol=1e-15)


def test_each_row_is_its_term_evaluated_alone():
    model = _model(ARCHS["layer norm, MLPs, biases"])
    binder = Binder(model, record(model, torch.tensor([[1, 2, 3, 4]])))
    terms = list(expand_logits(model.arch))
    plan = plan_groups(binder, expand_logits(model.arch))
    covered = sorted(plan.singles + [g.start + k for g in plan.groups for k in range(g.n_terms)])
    assert covered == list(range(len(terms)))  # every term exactly once
    ev, grouped = LogitEvaluator(binder, terms), GroupEvaluator(binder)
    for group in plan.groups:
        for first, y in grouped.values(group):
            for v in group_values(grouped, group, first, y):
                t = terms[v.index]
                assert (t.source, len(t.heads)) == (group.source, len(group.layers))
                alone = LogitEvaluator(binder, [t])
                (mine,) = alone.values()
                torch.testing.assert_close(ev.logits(v), alone.logits(mine), rtol=1e-12, atol=1e-13)


def test_a_model_whose_atoms_are_not_of_the_grouped_form_is_evaluated_by_the_trie(monkeypatch):
    model = _model(Architecture(2, 2))
    binder = Binder(model, record(model, torch.tensor([[1, 2, 3]])))
    factors = binder.factors
    monkeypatch.setattr(binder, "factors", lambda a: (factors(a)[0] @ factors(a)[1],) if a.name == "W_OV" else factors(a))
    assert plan_groups(binder, expand_logits(model.arch)) is None


@pytest.mark.parametrize("name", sorted(ARCHS))
@pytest.mark.parametrize("max_order", [0, 1, 2, None])
def test_the_paths_of_a_plan_are_the_expansion_s_in_its_order(name, max_order):
    from numeric_check.verification.grouped import plan_paths

    model = _model(ARCHS[name])
    binder = Binder(model, record(model, torch.tensor([[1, 2, 3]])))
    expansion = expand_logits(model.arch, max_order)
    plan = plan_groups(binder, expansion)
    paths, expected = plan_paths(plan, expansion.direct_terms()), [t.path for t in expansion]
    assert len(paths) == len(expected) and list(paths) == expected  # each made when asked for, by index
    assert paths[-1] == expected[-1] and paths[1:4] == expected[1:4]
    with pytest.raises(IndexError):
        paths[len(expected)]


def test_heads_whose_terms_cancel_give_the_same_largest_term_either_way(monkeypatch):
    """Two heads of one pattern whose outputs nearly cancel: their terms are far larger than the logits, so
    check 1 is judged at the largest term's scale, which the grouped rows must give exactly (a bound on it
    suffices only while it is small), as the trie does."""
    model = _model(Architecture(1, 2))
    with torch.no_grad():
        attn = model.blocks[0].attn
        for W in (attn.W_Q, attn.W_K, attn.W_V):
            W[1] = W[0]
        attn.W_O[0] *= 1e7
        attn.W_O[1] = -attn.W_O[0] * (1 - 1e-9)
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    _grouped_only(monkeypatch)
    grouped = verify_logits(model, tokens, device="cpu")
    _trie_only(monkeypatch)
    trie = verify_logits(model, tokens, device="cpu")
    assert "the terms cancel" in grouped.check("sum").detail
    assert grouped.check("sum").detail == trie.check("sum").detail
    assert grouped.passed and trie.passed


def _chosen(caplog, model, tokens, **kw) -> str:
    with caplog.at_level(logging.DEBUG, logger=verify_module.__name__):
        caplog.clear()
        verify_logits(model, tokens, device="cpu", **kw)
    (message,) = [r.getMessage() for r in caplog.records if "evaluated by" in r.getMessage()]
    return message


def test_each_path_is_chosen_where_the_cost_model_puts_it(caplog):
    """One head a layer: a pass of check 2 per prefix, a term or two each (the trie); many heads: many terms a
    pass (the grouped passes); no check 2: nothing for the grouped path to pay for; the reason is logged."""
    tokens = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    deep = _model(Architecture(5, 1, layer_norm=True))
    assert "by the trie path" in _chosen(caplog, deep, tokens) and "under 32" in _chosen(caplog, deep, tokens)
    assert "by the grouped path: no pass of check 2" in _chosen(caplog, deep, tokens, isolation=False)
    wide = _model(Architecture(2, 24, layer_norm=True))
    assert "by the grouped path" in _chosen(caplog, wide, tokens, max_order=2)


def test_the_cost_model_weighs_terms_per_pass_and_their_products():
    assert choose_path(160, 4, 0).path == "grouped"  # 40 terms a pass
    assert choose_path(100, 4, 0).path == "trie"  # 25 a pass
    assert choose_path(100, 4, 1 << 20).path == "grouped"  # twice that, for their products
    assert choose_path(10, None, 0).path == choose_path(10, 0, 0).path == "grouped"
