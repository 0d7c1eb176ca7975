"""CircuitModel: shapes, hooks, freezing, token validation, random init, folding, dtypes."""

import math

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.errors import ConfigError, DeviceError, HookError, ModelInputError, WeightError
from numeric_check.model.hooks import Constant
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.config import ModelConfig, resolve_device, resolve_dtype

torch.set_num_threads(1)

DIMS = dict(d_model=12, d_head=5, d_vocab=17, n_ctx=7)
FULL = Architecture(2, (2, 3), positional="standard", layer_norm=True, biases=True, mlp=True)
ARCHS = [
    Architecture(0, 1),
    Architecture(1, 1),
    Architecture(2, 3, positional="standard"),
    Architecture(2, (1, 2), positional="qk_only", layer_norm=True, biases=True),
    Architecture(1, 2, positional="qk_only", mlp=True),
    FULL,
]


def make(arch=FULL, seed=0, dtype=torch.float64, **kw):
    return CircuitModel.random(arch, **{**DIMS, "device": "cpu", **kw}, seed=seed, dtype=dtype)


def tokens(batch=3, pos=7, seed=1):
    return torch.randint(0, DIMS["d_vocab"], (batch, pos), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.describe())
def test_forward_shapes_and_cache(arch):
    model = make(arch)
    logits, cache = model.run_with_cache(tokens())
    assert logits.shape == (3, 7, DIMS["d_vocab"])
    assert torch.isfinite(logits).all()
    assert set(cache) == set(model.hook_names)
    assert torch.equal(model(tokens()), logits)
    assert model(tokens()[0]).shape == (1, 7, DIMS["d_vocab"])
    for layer, n_heads in enumerate(arch.heads_per_layer):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert pattern.shape == (3, n_heads, 7, 7)
        assert torch.allclose(pattern.sum(-1), torch.ones((), dtype=pattern.dtype))
        assert (pattern.triu(1) == 0).all()
        assert cache[f"blocks.{layer}.attn.hook_result"].shape == (3, 7, n_heads, DIMS["d_model"])
        assert cache[f"blocks.{layer}.attn.hook_q"].shape == (3, 7, n_heads, DIMS["d_head"])


def test_hook_names_follow_the_architecture():
    names = make(FULL).hook_names
    for name in ["hook_embed", "hook_pos_embed", "blocks.1.ln1.hook_scale", "blocks.0.attn.hook_attn_scores",
                 "blocks.1.mlp.hook_pre", "blocks.1.hook_mlp_out", "blocks.0.hook_resid_mid", "ln_final.hook_scale"]:
        assert name in names
    bare = make(Architecture(1, 1)).hook_names
    assert "hook_pos_embed" not in bare and "ln_final.hook_scale" not in bare
    assert "blocks.0.hook_resid_post" in bare and "blocks.0.hook_mlp_out" not in bare


def test_attn_scores_masked_with_minus_inf():
    _, cache = make().run_with_cache(tokens(), names_filter="blocks.0.attn.hook_attn_scores")
    scores = cache["blocks.0.attn.hook_attn_scores"]
    assert list(cache) == ["blocks.0.attn.hook_attn_scores"]
    upper = torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert torch.isneginf(scores[..., upper]).all() and torch.isfinite(scores[..., ~upper]).all()


def test_run_with_hooks_modifies_and_cleans_up():
    model, toks = make(), tokens()
    clean = model(toks)
    zero_head = lambda x, hook: x * 0
    ablated = model.run_with_hooks(toks, [("blocks.0.attn.hook_pattern", zero_head)])
    assert not torch.allclose(ablated, clean)
    assert torch.equal(model(toks), clean)  # removed afterwards
    with pytest.raises(RuntimeError):
        model.run_with_hooks(toks, [("hook_embed", lambda x, hook: (_ for _ in ()).throw(RuntimeError("boom")))])
    assert torch.equal(model(toks), clean)  # removed even on error
    seen = []
    model.run_with_hooks(toks, [(lambda name: name.endswith("hook_scale"), lambda x, hook: seen.append(hook.name))])
    assert seen == ["blocks.0.ln1.hook_scale", "blocks.0.ln2.hook_scale", "blocks.1.ln1.hook_scale",
                    "blocks.1.ln2.hook_scale", "ln_final.hook_scale"]


def test_hooks_nest_and_compose():
    model, toks = make(), tokens()
    double = lambda x, hook: 2 * x
    with model.hooks([("hook_embed", double)]):
        inner = model.run_with_hooks(toks, [("hook_embed", double)])  # 4 * embed
        outer = model(toks)  # the outer hook survives the inner run: 2 * embed
    four = model.run_with_hooks(toks, [("hook_embed", lambda x, hook: 4 * x)])
    two = model.run_with_hooks(toks, [("hook_embed", double)])
    assert torch.equal(inner, four) and torch.equal(outer, two)
    assert torch.equal(model(toks), make()(toks))
    with pytest.raises(HookError):
        with model.hooks([("hook_embed", double), ("no_such_hook", double)]):
            pass
    assert torch.equal(model(toks), make()(toks))  # the first hook was removed too


def test_hook_errors_are_clear():
    model = make()
    with pytest.raises(HookError, match=r"no hook point named 'blocks.0.attn.hook_patern'; did you mean blocks.0.attn.hook_pattern"):
        model.run_with_hooks(tokens(), [("blocks.0.attn.hook_patern", lambda x, hook: None)])
    with pytest.raises(HookError, match=r"hook on blocks.0.attn.hook_z returned \(2,\); expected None or a tensor of shape \(3, 7, 2, 5\)"):
        model.run_with_hooks(tokens(), [("blocks.0.attn.hook_z", lambda x, hook: torch.zeros(2))])


def test_freezing_scales_and_patterns_reproduces_logits():
    model, toks, other = make(), tokens(seed=1), tokens(seed=2)
    frozen_names = [n for n in model.hook_names if n.endswith(("hook_scale", "hook_pattern"))]
    logits, cache = model.run_with_cache(toks, names_filter=frozen_names)
    freeze = [(name, lambda x, hook: cache[hook]) for name in frozen_names]
    assert torch.allclose(model.run_with_hooks(toks, freeze), logits, rtol=0, atol=1e-12)
    # frozen values really are used: a different input with the frozen values differs from its own run
    assert not torch.allclose(model.run_with_hooks(other, freeze), model(other))


def test_constant_hooks_freeze_and_skip_what_they_replace():
    """A Constant pattern skips queries, keys and scores; a Constant scale skips the variance. The
    logits are those of freezing by an ordinary hook, bit for bit."""
    model, toks = make(), tokens()
    names = [n for n in model.hook_names if n.endswith(("hook_scale", "hook_pattern"))]
    _, cache = model.run_with_cache(toks, names_filter=names)
    by_function = model.run_with_hooks(toks, [(name, lambda x, hook: cache[hook]) for name in names])
    fired = []
    spies = [(lambda n: n.endswith(("hook_q", "hook_k", "hook_attn_scores")), lambda x, hook: fired.append(str(hook)))]
    by_constant = model.run_with_hooks(toks, [(name, Constant(cache[name])) for name in names] + spies)
    assert torch.equal(by_constant, by_function) and fired == []
    # a hook after the constant still applies to it; one before it is irrelevant
    halved = [("blocks.1.attn.hook_pattern", lambda x, hook: x * 0.5)]
    doubled = model.run_with_hooks(toks, [(n, Constant(cache[n])) for n in names] + halved)
    reference = model.run_with_hooks(toks, [(n, lambda x, hook: cache[hook]) for n in names] + halved)
    assert torch.equal(doubled, reference)


def test_constant_of_the_wrong_shape_is_a_clear_error():
    model = make()
    bad = [("blocks.0.attn.hook_pattern", Constant(torch.zeros(1, 2, 7, 7, dtype=torch.float64)))]
    with pytest.raises(HookError, match=r"constant hook on blocks.0.attn.hook_pattern holds \(1, 2, 7, 7\); expected .*\(3, 2, 7, 7\)"):
        model.run_with_hooks(tokens(), bad)


def test_reading_hook_result_changes_nothing_and_head_output_is_its_slice():
    model, toks = make(), tokens()
    plain = model(toks)
    logits, cache = model.run_with_cache(toks)
    assert torch.equal(plain, logits)  # per-head results are formed for the cache, not used for the sum
    attn = model.blocks[1].attn
    z, result = cache["blocks.1.attn.hook_z"], cache["blocks.1.attn.hook_result"]
    for head in range(attn.n_heads):
        assert torch.allclose(attn.head_output(z[:, :, head], head), result[:, :, head], rtol=0, atol=1e-14)
    # editing the per-head results does change the output
    zeroed = model.run_with_hooks(toks, [("blocks.1.attn.hook_result", lambda x, hook: torch.zeros_like(x))])
    without = model.run_with_hooks(toks, [("blocks.1.hook_attn_out", lambda x, hook: x * 0 + attn.b_O)])
    assert torch.allclose(zeroed, without, atol=1e-12)


def test_frozen_ln_scale_makes_logits_linear_in_the_residual():
    """With every scale frozen and no MLP, doubling W_E and W_pos and b's is a linear map; check one."""
    arch = Architecture(1, 2, positional="standard", layer_norm=True)
    model, toks = make(arch), tokens()
    names = [n for n in model.hook_names if n.endswith(("hook_scale", "hook_pattern"))]
    _, cache = model.run_with_cache(toks, names_filter=names)
    freeze = [(name, lambda x, hook: cache[hook]) for name in names]
    base = model.run_with_hooks(toks, freeze)
    with torch.no_grad():
        model.W_E.mul_(2)
        model.W_pos.mul_(2)
    assert torch.allclose(model.run_with_hooks(toks, freeze), 2 * base, atol=1e-10)


@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.tensor([[1, 17]]), r"token id 17 at index \(0, 1\) is out of range: ids must be in \[0, 17\) \(d_vocab=17\)"),
        (torch.tensor([-1]), r"token id -1 at index \(0,\) is out of range"),
        (torch.zeros(2, 8, dtype=torch.long), r"sequence of 8 tokens does not fit n_ctx=7: give 1 to 7 positions"),
        (torch.zeros(1, 0, dtype=torch.long), r"sequence of 0 tokens does not fit n_ctx=7"),
        (torch.tensor([1.0, 2.0]), r"tokens must have an integer dtype, got torch.float32"),
        (torch.tensor([True]), r"tokens must have an integer dtype, got torch.bool"),
        (torch.zeros(1, 2, 3, dtype=torch.long), r"tokens must have shape \[pos\] or \[batch, pos\], got shape \(1, 2, 3\)"),
    ],
)
def test_check_tokens_errors(bad, message):
    model = make()
    with pytest.raises(ModelInputError, match=message):
        model(bad)


def test_check_tokens_accepts_lists_and_int32():
    model = make()
    out = model.check_tokens(torch.tensor([[1, 2]], dtype=torch.int32))
    assert out.dtype == torch.long
    assert model.check_tokens([3, 4]).tolist() == [3, 4]


def test_random_is_deterministic_per_seed():
    a, b, c = make(seed=3), make(seed=3), make(seed=4)
    for (name, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, pc), name
    assert torch.equal(make(seed=3, dtype=torch.float32).W_E, a.W_E.float())
    state = torch.random.get_rng_state()
    make(seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched


def test_random_biases_nonzero_and_scale_reasonable():
    model = make(Architecture(3, 4, positional="standard", biases=True, mlp=True), d_model=64, d_head=16, d_vocab=50, n_ctx=7)
    for name, param in model.named_parameters():
        assert param.abs().max() > 0, name
    resid = model.run_with_cache(tokens())[1]["blocks.2.hook_resid_post"]
    assert 0.3 < resid.std() < 10  # O(1) after a few layers


def test_layer_norm_centres_writing_weights():
    model = make()
    writers = [model.W_E, model.W_pos]
    for block in model.blocks:
        writers += [block.attn.W_O.transpose(0, 1), block.attn.b_O, block.mlp.W_out, block.mlp.b_out]
    for w in writers:
        assert w.mean(0).abs().max() < 1e-12
    _, cache = model.run_with_cache(tokens())
    for name in ("blocks.0.hook_resid_pre", "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post"):
        assert cache[name].mean(-1).abs().max() < 1e-12
    uncentred = make(Architecture(1, 2, positional="standard", biases=True))
    assert uncentred.W_E.mean(0).abs().max() > 1e-3


@pytest.mark.parametrize("positional", ["standard", "qk_only"])
def test_random_models_and_working_copies_centre_the_same_residual_writers(positional):
    """Regression: ``random`` centred ``W_pos`` of ``qk_only`` models too, which is added after the
    layer norm and never writes to the residual stream, while the working copy left it alone."""
    model = make(Architecture(2, 2, positional=positional, layer_norm=True, biases=True, mlp=True))
    writers = model.residual_writers()
    assert ("W_pos" in {name for _, name, _ in writers}) == (positional == "standard")
    for module, name, axis in writers:
        assert getattr(module, name).mean(axis).abs().max() < 1e-12, name
    if positional == "qk_only":
        assert model.W_pos.mean(0).abs().max() > 1e-3  # not a writer: left as drawn
    copy = model.working_copy(torch.float64, "cpu")
    for (name, before), (_, after) in zip(model.named_parameters(), copy.named_parameters()):
        assert torch.equal(before, after), f"the working copy changed {name} of a model already centred"


def test_working_copy_centres_writing_weights_only_with_layer_norm():
    model = make(dtype=torch.float32)
    copy = model.working_copy(torch.float64, "cpu")
    assert copy is not model and copy.dtype == torch.float64 and model.dtype == torch.float32
    assert float(copy.W_E.detach().mean(0).abs().max()) < 1e-15
    assert not any(p.requires_grad for p in copy.parameters())
    plain = make(Architecture(1, 1), dtype=torch.float32)
    assert torch.equal(plain.working_copy(torch.float64, "cpu").W_E, plain.W_E.double())


def test_working_copy_leaves_the_hooks_behind_and_on_the_model():
    model = make()
    seen = []
    model.hook_embed.add_hook(lambda x, hook: seen.append(hook) or x)
    copy = model.working_copy(torch.float64, "cpu")
    assert not copy.hook_embed.has_hooks and len(model.hook_embed.hooks) == 1
    copy(tokens())
    assert not seen
    model(tokens())
    assert seen


def test_folded_b_O_moves_value_biases():
    model, toks = make(), tokens()
    logits = model(toks)
    folded = [model.folded_b_O(layer) for layer in range(2)]
    with torch.no_grad():
        for block, b_O in zip(model.blocks, folded):
            block.attn.b_O.copy_(b_O)
            block.attn.b_V.zero_()
    assert torch.allclose(model(toks), logits, atol=1e-12)
    assert torch.equal(model.folded_b_O(0), folded[0])
    no_bias = make(Architecture(1, 2))
    assert torch.equal(no_bias.folded_b_O(0), torch.zeros(DIMS["d_model"], dtype=torch.float64))


def test_dtypes_and_to():
    model = make(dtype=torch.float32)
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    double = model.to(torch.float64)
    assert double.dtype == torch.float64 and double(tokens()).dtype == torch.float64
    assert torch.allclose(make(dtype=torch.float32)(tokens()).double(), make()(tokens()), atol=1e-4)
    with pytest.raises(DeviceError, match=r"expected a floating dtype"):
        CircuitModel(ModelConfig(FULL, **DIMS), dtype=torch.int64)
    assert resolve_dtype("float64") is torch.float64


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_absent_is_a_device_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # so on a GPU machine too
    with pytest.raises(DeviceError, match=r"device 'cuda' requested but CUDA is not available here"):
        make(device="cuda")
    assert resolve_device(None).type == "cpu"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    cpu = make()
    gpu = make(device="cuda")
    assert gpu.device.type == "cuda"
    assert torch.allclose(gpu(tokens()).cpu(), cpu(tokens()), atol=1e-10)


def test_check_finite_names_the_parameter():
    model = make()
    model.check_finite()
    with torch.no_grad():
        model.blocks[1].attn.W_K[0, 1, 2] = float("nan")
    with pytest.raises(WeightError, match=r"parameter blocks.1.attn.W_K \(3, 5, 12\) has 1 NaN and 0 Inf entries \(first at index \(0, 1, 2\)\)"):
        model.check_finite()


def test_config_validation_and_json_round_trip():
    cfg = ModelConfig(FULL, **DIMS, act_fn="gelu_new", attn_scale=2.0)
    assert cfg.d_mlp == 48 and cfg.scale == 2.0
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert ModelConfig(Architecture(1, 1), **DIMS).scale == math.sqrt(5)
    with pytest.raises(ConfigError, match=r"unknown act_fn 'swish'; expected one of 'gelu', 'gelu_new', 'relu'"):
        ModelConfig(FULL, **DIMS, act_fn="swish")
    with pytest.raises(ConfigError, match=r"d_head must be an int >= 1, got 0"):
        ModelConfig(FULL, **{**DIMS, "d_head": 0})
    with pytest.raises(ConfigError, match=r"d_mlp=8 given but the architecture has no MLPs"):
        ModelConfig(Architecture(1, 1), **DIMS, d_mlp=8)
    with pytest.raises(ConfigError, match=r"unknown model config keys \['colour'\]"):
        ModelConfig.from_dict({**cfg.to_dict(), "colour": 1})
    with pytest.raises(ConfigError, match=r"bad architecture"):
        ModelConfig.from_dict({**cfg.to_dict(), "arch": {"n_layers": -1, "n_heads": 1}})


def test_repr_is_honest():
    text = repr(make())
    assert text.startswith("CircuitModel(2 layers x heads 2/3, standard positions, layer norm, biases, MLPs; d_model=12")
    assert "dtype=torch.float64" in text


# --- properties over random architectures --------------------------------------------------------
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.conftest import FAST  # noqa: E402
from tests.strategies import circuit_models, token_batches  # noqa: E402



@FAST
@given(st.data())
def test_property_freezing_every_scale_and_pattern_is_exact(data):
    model = data.draw(circuit_models())
    toks = data.draw(token_batches(model.cfg))
    names = [n for n in model.hook_names if n.endswith(("hook_scale", "hook_pattern"))]
    logits, cache = model.run_with_cache(toks, names_filter=names)
    assert logits.shape == (*toks.shape, model.cfg.d_vocab) and torch.isfinite(logits).all()
    frozen = model.run_with_hooks(toks, [(n, lambda x, hook: cache[hook]) for n in names])
    torch.testing.assert_close(frozen, logits, rtol=1e-12, atol=1e-12)
    for name in names:
        if name.endswith("hook_pattern"):
            torch.testing.assert_close(cache[name].sum(-1), torch.ones_like(cache[name][..., 0]))


@FAST
@given(st.data())
def test_property_folded_b_O_and_centring(data):
    model = data.draw(circuit_models())
    toks = data.draw(token_batches(model.cfg))
    logits, cache = model.run_with_cache(toks)
    if model.arch.layer_norm and model.arch.n_layers:
        assert cache["blocks.0.hook_resid_pre"].mean(-1).abs().max() < 1e-9
    if model.arch.biases:
        with torch.no_grad():
            for layer, block in enumerate(model.blocks):
                block.attn.b_O.copy_(model.folded_b_O(layer))
                block.attn.b_V.zero_()
        torch.testing.assert_close(model(toks), logits, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("n_batch", [1, 2])
def test_tiled_constants_give_the_pass_over_copies_that_their_copies_give(n_batch):
    """Patterns and scales recorded once and shared by stacked copies of the batch (TiledConstant: of one
    sequence, z is one product a head over every copy) give what the same values repeated give."""
    from numeric_check.model.hooks import TiledConstant

    model, copies = make(), 3
    toks = tokens()[:n_batch]
    names = [n for n in model.hook_names if n.endswith(("hook_scale", "hook_pattern"))]
    _, cache = model.run_with_cache(toks, names_filter=names)
    stacked = toks.repeat(copies, 1)
    zs = {}
    spy = [(lambda n: n.endswith("hook_z"), lambda x, hook: zs.setdefault(str(hook), []).append(x.clone()))]
    repeated = model.run_with_hooks(stacked, [(n, Constant(cache[n].repeat(copies, *[1] * (cache[n].ndim - 1)))) for n in names] + spy)
    tiled = model.run_with_hooks(stacked, [(n, TiledConstant(cache[n], copies)) for n in names] + spy)
    torch.testing.assert_close(tiled, repeated, rtol=1e-13, atol=1e-13)
    for name, (a, b) in zs.items():
        torch.testing.assert_close(b, a, rtol=1e-13, atol=1e-13, msg=name)
    # a hook after the tiled constant sees its copies, whole, and what it returns is used
    hooks = model.blocks[1].attn.hook_pattern
    seen = []
    halved = [("blocks.1.attn.hook_pattern", lambda x, hook: seen.append(x.shape) or x * 0.5)]
    after = model.run_with_hooks(stacked, [(n, TiledConstant(cache[n], copies)) for n in names] + halved)
    assert seen == [torch.Size((copies * n_batch, *cache["blocks.1.attn.hook_pattern"].shape[1:]))]
    reference = model.run_with_hooks(stacked, [(n, Constant(cache[n].repeat(copies, *[1] * (cache[n].ndim - 1)))) for n in names] + halved)
    torch.testing.assert_close(after, reference, rtol=1e-13, atol=1e-13)
    assert hooks.fixed_tiles((copies * n_batch, 3, 7, 7)) is None  # (no hooks left on it)


def test_zeros_add_nothing_and_read_as_zeros():
    """A Zeros hook on a block's output: the block adds nothing (the stream bit for bit what zeros added give),
    and a hook after it reads zeros of the right shape."""
    from numeric_check.model.hooks import Zeros

    model, toks = make(), tokens()
    shape = (*toks.shape, DIMS["d_model"])
    like = torch.zeros((), dtype=torch.float64)
    names = ["blocks.0.hook_attn_out", "blocks.1.hook_mlp_out"]
    by_zeros = model.run_with_hooks(toks, [(n, Zeros(like, shape)) for n in names])
    by_constant = model.run_with_hooks(toks, [(n, Constant(torch.zeros(shape, dtype=torch.float64))) for n in names])
    assert torch.equal(by_zeros, by_constant)
    read = []
    model.run_with_hooks(toks, [(names[0], Zeros(like, shape)), (names[0], lambda x, hook: read.append(x.clone()))])
    assert read[0].shape == shape and not read[0].any()


def test_a_working_copy_centres_each_weight_once_and_again_when_it_changes():
    """Verifying prompt after prompt centres a weight once (kept while it is unchanged); written in place,
    the next working copy is centred from its new values, never a stale copy."""
    model = make(dtype=torch.float32)
    first, second = model.working_copy(torch.float32, "cpu"), model.working_copy(torch.float32, "cpu")
    assert second.W_E is not model.W_E and second.W_E.data_ptr() == first.W_E.data_ptr()  # centred once
    assert float(second.W_E.mean(0).abs().max()) < 1e-6
    with torch.no_grad():
        model.W_E.add_(1.0)  # in place: the same tensor, another version
    third = model.working_copy(torch.float32, "cpu")
    torch.testing.assert_close(third.W_E, model.W_E - model.W_E.mean(0, keepdim=True))
    wide = model.working_copy(torch.float64, "cpu")  # each dtype its own
    assert wide.W_E.dtype == torch.float64 and float(wide.W_E.mean(0).abs().max()) < 1e-15


def test_a_model_shows_itself_in_jupyter_with_its_heads_named_as_the_reports_name_them():
    from derivations import Architecture

    model = CircuitModel.random(Architecture(2, 12), d_model=8, d_head=4, d_vocab=10, n_ctx=6)
    html = model._repr_html_()
    assert "2 layers x 12 heads" in html and "L1H0 L1H1" in html and "… L1H11" in html and "<table>" in html
