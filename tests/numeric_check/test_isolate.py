"""Path isolation through the model's hooks: against hand computations, linearity and the graded pass."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from derivations.architecture import Architecture
from derivations.paths import TOKEN, Path, Source, expand_logits
from derivations.qk import expand_qk
from numeric_check.verification.hook_paths import record
from numeric_check.errors import NumericCheckError
from numeric_check.verification.isolate import graded_logits, graded_qk, isolate_logit_paths, isolate_qk, isolate_streams
from numeric_check.model.circuit_model import CircuitModel
from tests.conftest import FAST
from tests.strategies import heads_of, models_and_tokens

torch.set_num_threads(1)
TOKENS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0]])


def isolated(model, rec, paths, **kw):
    return [logits for _, logits in sorted(isolate_logit_paths(model, rec, paths, **kw), key=lambda pair: pair[0])]


def test_one_head_by_hand():
    model = CircuitModel.random(Architecture(1, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0, dtype=torch.float64, device="cpu")
    rec = record(model, TOKENS)
    (logits,) = isolated(model, rec, [Path(TOKEN, ((0, 1),))])
    A = rec.cache["blocks.0.attn.hook_pattern"][:, 1]
    attn = model.blocks[0].attn
    x = model.W_E.T[TOKENS]
    expected = A @ x @ attn.W_V[1].T @ attn.W_O[1].T @ model.W_U.T
    assert torch.allclose(logits, expected.detach(), rtol=1e-12, atol=1e-14)


def test_bias_and_mlp_sources_by_hand():
    arch = Architecture(2, 2, layer_norm=True, biases=True, mlp=True)
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0, dtype=torch.float64, device="cpu")
    rec = record(model, TOKENS)
    n_final = 1 / rec.cache["ln_final.hook_scale"]
    bias, mlp, b_U = isolated(model, rec, [Path(Source("bias", 0)), Path(Source("mlp", 1)), Path(Source("unembed_bias"))])
    with torch.no_grad():
        assert torch.allclose(bias, n_final * model.folded_b_O(0) @ model.W_U.T, atol=1e-13)
        assert torch.allclose(mlp, n_final * rec.cache["blocks.1.hook_mlp_out"] @ model.W_U.T, atol=1e-13)
        assert torch.allclose(b_U, model.b_U.expand_as(b_U), atol=0)


@FAST
@given(models_and_tokens(max_batch=2), st.data())
def test_paths_add_up_and_the_graded_pass_matches(pair, data):
    model, tokens = pair
    rec = record(model, tokens)
    terms = list(expand_logits(model.arch))
    parts = isolated(model, rec, [t.path for t in terms], chunk_bytes=data.draw(st.sampled_from([1, 10**4, 10**9])))
    scale = float(rec.logits.abs().max())
    assert torch.allclose(sum(parts), rec.logits, rtol=0, atol=1e-9 * scale)  # through the model only
    k = data.draw(st.integers(0, model.arch.n_layers))
    above = sum((p for p, t in zip(parts, terms) if t.order > k), torch.zeros_like(rec.logits))
    assert torch.allclose(graded_logits(model, rec, k), above, rtol=0, atol=1e-9 * scale)


@FAST
@given(models_and_tokens(min_layers=1, max_batch=2), st.data())
def test_qk_pairs_add_up_to_the_scores(pair, data):
    model, tokens = pair
    layer, head = data.draw(heads_of(model.arch))
    rec = record(model, tokens)
    terms = list(expand_qk(model.arch, layer, head))
    scores = [s for _, s in isolate_qk(model, rec, layer, head, [(t.query, t.key) for t in terms], chunk_bytes=10**5)]
    below = torch.ones(rec.n_pos, rec.n_pos, dtype=torch.bool).tril()
    reference = rec.cache[f"blocks.{layer}.attn.hook_attn_scores"][:, head][:, below]
    # terms far larger than the scores cancel in their sum, which is rounded at their scale
    scale = max([float(reference.abs().max())] + [float(s[:, below].abs().max()) for s in scores])
    total = sum(s[:, below] for s in scores)
    assert torch.allclose(total, reference, rtol=0, atol=1e-9 * scale)
    k = data.draw(st.integers(0, 2 * layer))
    above = sum((s[:, below] for s, t in zip(scores, terms) if t.order > k), torch.zeros_like(reference))
    assert torch.allclose(graded_qk(model, rec, layer, head, k)[:, below], above, rtol=0, atol=1e-9 * scale)


def test_streams_stop_at_the_layer():
    model = CircuitModel.random(Architecture(3, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0, dtype=torch.float64, device="cpu")
    rec = record(model, TOKENS)
    direct, through = isolate_streams(model, rec, [Path(TOKEN), Path(TOKEN, ((0, 1),))], layer=1)
    assert torch.allclose(direct, model.W_E.T[TOKENS].detach())
    A = rec.cache["blocks.0.attn.hook_pattern"][:, 1]
    attn = model.blocks[0].attn
    assert torch.allclose(through, (A @ model.W_E.T[TOKENS] @ attn.W_V[1].T @ attn.W_O[1].T).detach(), atol=1e-13)


def test_isolation_leaves_no_hooks_and_no_changes():
    arch = Architecture(2, 2, biases=True, mlp=True, positional="qk_only")
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0, dtype=torch.float64, device="cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rec = record(model, TOKENS)
    paths = [t.path for t in expand_logits(arch)]
    isolated(model, rec, paths)
    list(isolate_qk(model, rec, 1, 0, [(t.query, t.key) for t in expand_qk(arch, 1, 0)]))
    graded_logits(model, rec, 0)
    graded_qk(model, rec, 1, 0, 0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(model(TOKENS), rec.logits)  # no hook left behind


def test_paths_differing_in_their_last_head_share_a_copy():
    arch = Architecture(2, 3, layer_norm=True)
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0, dtype=torch.float64, device="cpu")
    rec = record(model, TOKENS)
    paths = [t.path for t in expand_logits(arch)]  # tok: direct, 3 through L0, 3 through L1, 9 through both
    rows = {"hook_embed": 0, "blocks.1.hook_resid_pre": 0}

    def count(x, hook):
        rows[str(hook)] += x.shape[0]

    with model.hooks([(name, count) for name in rows]):
        parts = isolated(model, rec, paths)
    b = TOKENS.shape[0]
    # one copy from the embeddings (tok: every path through at most one head), and one per L0 head
    # starting at block 1 (its three paths through L1)
    assert rows == {"hook_embed": b, "blocks.1.hook_resid_pre": 4 * b}
    (path,) = [i for i, p in enumerate(paths) if p.heads == ((0, 2), (1, 1))]
    A0, A1 = (rec.cache[f"blocks.{l}.attn.hook_pattern"][:, h] for l, h in ((0, 2), (1, 1)))
    N0, N1, Nf = (1 / rec.cache[name] for name in ("blocks.0.ln1.hook_scale", "blocks.1.ln1.hook_scale", "ln_final.hook_scale"))
    at0, at1 = model.blocks[0].attn, model.blocks[1].attn
    x = A0 @ (N0 * model.W_E.T[TOKENS]) @ at0.W_V[2].T @ at0.W_O[2].T
    expected = Nf * (A1 @ (N1 * x) @ at1.W_V[1].T @ at1.W_O[1].T) @ model.W_U.T
    assert torch.allclose(parts[path], expected.detach(), rtol=1e-12, atol=1e-13)


def test_qk_side_paths_share_copies_and_run_the_target_block_alone():
    """Side paths entering layer 2 are isolated one copy per prefix (as logits paths are); queries and
    keys come from block 2 alone, and no query or key is formed below it (patterns frozen)."""
    arch = Architecture(3, 2)
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0, dtype=torch.float64, device="cpu")
    rec = record(model, TOKENS)
    pairs = [(t.query, t.key) for t in expand_qk(arch, 2, 1)]
    rows = {"hook_embed": 0, "blocks.0.attn.hook_q": 0, "blocks.1.attn.hook_q": 0, "blocks.2.attn.hook_q": 0}

    def count(x, hook):
        rows[str(hook)] += x.shape[0]

    with model.hooks([(name, count) for name in rows]):
        scores = dict(isolate_qk(model, rec, 2, 1, pairs))
    b, sides = TOKENS.shape[0], len({path for pair in pairs for path in pair})
    assert rows == {"hook_embed": b, "blocks.0.attn.hook_q": 0, "blocks.1.attn.hook_q": 0, "blocks.2.attn.hook_q": sides * b}
    total = sum(scores.values())
    below = torch.ones(4, 4, dtype=torch.bool).tril()
    assert torch.allclose(total[:, below], rec.cache["blocks.2.attn.hook_attn_scores"][:, 1][:, below], atol=1e-12)


def test_streams_of_paths_through_later_heads_are_an_error():
    model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=10, n_ctx=5, seed=0, dtype=torch.float64, device="cpu")
    rec = record(model, TOKENS)
    with pytest.raises(NumericCheckError, match=r"pass through heads at or after layer 1"):
        isolate_streams(model, rec, [Path(TOKEN, ((1, 0),))], layer=1)
