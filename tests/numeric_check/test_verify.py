"""verify_logits / verify_qk: the three checks hold on random models, fail when something is wrong,
and bad input gets clear errors."""

from __future__ import annotations

import gc
import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import numeric_check.verification.grouped_isolation as grouped_isolation
import numeric_check.verification.logit_isolation as logit_isolation
import numeric_check.verification.verify as verify_module
from derivations.architecture import Architecture
from derivations.errors import ArchitectureError, TooManyTerms
from derivations.paths import expand_logits
from derivations.qk import expand_qk
from numeric_check.errors import DeviceError, ModelInputError, WeightError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.bind import Binder
from numeric_check.verification.budget import PathChoice
from numeric_check.errors import ExpansionMismatch, VerifyError
from numeric_check.verification.verify import verify_logits, verify_qk
from tests.conftest import FAST
from tests.strategies import heads_of, max_orders, models_and_tokens

torch.set_num_threads(1)


def small_model(arch=None, seed=0, **kw) -> CircuitModel:
    arch = arch or Architecture(2, 2, positional="standard", layer_norm=True, biases=True, mlp=True)
    sizes = dict(d_model=8, d_head=4, d_vocab=12, n_ctx=6, device="cpu") | kw
    return CircuitModel.random(arch, seed=seed, **sizes)


TOKENS = torch.tensor([[1, 2, 3, 1, 2], [4, 5, 6, 7, 0]])


# --- property tests: checks 1-3 on random architectures, weights and tokens --------------------


@FAST
@given(models_and_tokens(), st.data())
def test_logit_checks_hold_on_random_models(pair, data):
    model, tokens = pair
    max_order = data.draw(max_orders(model.arch.n_layers))
    report = verify_logits(model, tokens, max_order=max_order)
    assert report.passed, report.to_text()
    assert report.rel_error <= 1e-9
    assert all(t.passed for t in report.terms)
    assert len(report.terms) == len(expand_logits(model.arch, max_order))
    truncation = report.check("truncation")
    assert (truncation.passed is None) == (report.n_omitted == 0)


@FAST
@given(models_and_tokens(min_layers=1), st.data())
def test_qk_checks_hold_on_random_models(pair, data):
    model, tokens = pair
    arch = model.arch
    layer, head = data.draw(heads_of(arch))
    max_order = data.draw(max_orders(2 * layer))
    report = verify_qk(model, tokens, layer, head, max_order=max_order)
    assert report.passed, report.to_text()
    assert len(report.terms) == len(expand_qk(arch, layer, head, max_order))


def test_qk_only_positions_with_layer_norm():
    # positions join the queries and keys after ln1, as in TransformerLens' shortformer
    model = small_model(Architecture(2, 2, positional="qk_only", layer_norm=True, biases=True))
    report = verify_qk(model, TOKENS, 1, 0, max_order=1)
    assert report.passed, report.to_text()
    assert any(t.source == "pos" for t in report.terms)


# --- the checks can fail --------------------------------------------------------------------


@pytest.mark.parametrize("exact_errors", [None, False])
def test_a_wrong_coefficient_fails_checks_1_and_2(monkeypatch, exact_errors):
    real = Binder.coeff
    monkeypatch.setattr(Binder, "coeff", lambda self, c: real(self, c) * (1 + 1e-6))
    report = verify_logits(small_model(), TOKENS, exact_errors=exact_errors)
    assert not report.passed
    assert report.check("sum").passed is False
    assert report.check("isolation").passed is False
    assert "failed" in report.check("isolation").detail
    failed = [t for t in report.terms if not t.passed]
    assert failed and all(t.max_abs_error is not None and t.max_abs_error <= t.error_bound for t in failed)


@pytest.mark.parametrize("engine", ["grouped", "trie"])
def test_one_wrong_term_fails_check_1_in_logit_space(monkeypatch, engine):
    # a term off by 1e-7 of its size in one vocabulary direction only: the sum check sees it, in either evaluation
    label = "tok→L0H1→L1H0"
    if engine == "trie":
        monkeypatch.setattr(verify_module, "plan_groups", lambda *a, **k: None)
        real = verify_module.LogitEvaluator.values

        def values(self):
            for v in real(self):
                if self.terms[v.index].label == label:
                    v = v._replace(coeff=v.coeff * (1 + 1e-7))
                yield v

        monkeypatch.setattr(verify_module.LogitEvaluator, "values", values)
    else:
        from derivations.paths import expand_logits

        index = [t.label for t in expand_logits(small_model().arch)].index(label)
        real = verify_module.GroupEvaluator.blocks

        def blocks(self, group, copies=None):  # rows head-major: row first + r·H + h at y[h, :, :, r]
            for first, y in real(self, group, copies):
                if first <= index < first + y.shape[0] * y.shape[3]:
                    r, h = divmod(index - first, y.shape[0])
                    y = y.clone()
                    y[h, :, :, r] *= 1 + 1e-7
                yield first, y

        monkeypatch.setattr(verify_module.GroupEvaluator, "blocks", blocks)
        monkeypatch.setattr(verify_module, "choose_path", lambda *a: PathChoice("grouped", "forced"))  # (a small model)
    report = verify_logits(small_model(), TOKENS, exact_errors=False)
    assert report.check("sum").passed is False and report.check("sum").max_abs_error > 1e-9 * report.scale
    bad = next(t for t in report.terms if t.label == label)
    assert bad.passed is False and report.check("isolation").passed is False
    assert sum(not t.passed for t in report.terms) == 1


def test_a_wrong_omitted_part_fails_check_3(monkeypatch):
    monkeypatch.setattr(verify_module, "graded_final", lambda model, rec, k: torch.zeros_like(rec.final))
    report = verify_logits(small_model(), TOKENS, max_order=0)
    assert report.check("sum").passed and report.check("isolation").passed
    assert report.check("truncation").passed is False and not report.passed


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("where", ["grouped z", "z", "stream"])
def test_a_wrong_isolation_fails_check_2(monkeypatch, exact, where):
    """The model's isolated paths off by 1e-3 — in a head's z (paths ending in heads, certified through
    the head maps unless exact; from the grouped engine's prefix passes, or the trie's isolation) or in a
    finished stream (paths ending in no head) — fail check 2."""
    if where == "grouped z":
        run = grouped_isolation.PrefixPasses._run
        monkeypatch.setattr(grouped_isolation.PrefixPasses, "_run",
                            lambda *args: {layer: z + 1e-3 for layer, z in run(*args).items()})
        monkeypatch.setattr(verify_module, "choose_path", lambda *a: PathChoice("grouped", "forced"))  # (a small model)
        report = verify_logits(small_model(), TOKENS, exact_errors=exact)
        assert report.check("sum").passed and report.check("isolation").passed is False
        assert {t.label for t in report.terms if not t.passed} == {t.label for t in report.terms if t.order}
        return
    if where == "z":  # the trie's evaluation and isolation (sharded runs, models not of the grouped form)
        monkeypatch.setattr(verify_module, "plan_groups", lambda *args, **kwargs: None)
    real, wrong = logit_isolation.isolate_final_parts, set()

    def shifted(model, rec, paths, **kwargs):
        for part in real(model, rec, paths, **kwargs):
            if isinstance(part, logit_isolation.HeadGroup) == (where == "z"):
                wrong.update(paths[i].label for i in part[0])
            if isinstance(part, logit_isolation.HeadGroup):
                yield part._replace(z=part.z + 1e-3) if where == "z" else part
            else:
                indices, x, bias = part
                yield indices, (x + 1e-3 if where == "stream" else x), bias

    monkeypatch.setattr(logit_isolation, "isolate_final_parts", shifted)
    report = verify_logits(small_model(), TOKENS, exact_errors=exact)
    assert report.check("sum").passed and report.check("isolation").passed is False
    assert wrong and {t.label for t in report.terms if not t.passed} == wrong


def test_qk_coefficient_is_bound_to_the_models_attention_scale():
    from numeric_check.model.config import ModelConfig

    model = small_model(Architecture(2, 2))
    cfg = ModelConfig(model.arch, d_model=8, d_head=4, d_vocab=12, n_ctx=6, attn_scale=3.0)
    odd = CircuitModel(cfg, dtype=torch.float64, device="cpu")
    odd.load_state_dict(model.state_dict())
    assert verify_qk(odd, TOKENS, 1, 1).passed  # 1/sqrt(d_head) is bound to the model's 1/attn_scale


# --- reports --------------------------------------------------------------------------------


def test_report_fields_and_formats():
    report = verify_logits(small_model(), TOKENS, max_order=1)
    assert report.n_omitted == len(expand_logits(report_arch := small_model().arch)) - len(expand_logits(report_arch, 1))
    term = next(t for t in report.terms if t.heads)
    assert term.source == "tok" and term.order == len(term.heads) and term.norm > 0
    data = json.loads(report.to_json())
    assert data["passed"] is True and len(data["terms"]) == len(report.terms)
    assert {c["name"] for c in data["checks"]} == {"sum", "isolation", "truncation"}
    assert set(report.timings) >= {"forward", "evaluate", "isolation", "truncation"}
    md = report.to_markdown(max_rows=3)
    assert "| term | order | norm | max abs error | ok |" in md and "more" in md
    text = str(report)
    assert "1. sum of all terms = model" in text and "PASSED" in text and "tok→L0H1" in text


def test_bounded_and_exact_term_errors_agree():
    model = small_model()
    exact = verify_logits(model, TOKENS, exact_errors=True)
    bounded = verify_logits(model, TOKENS, exact_errors=False)
    assert exact.passed and bounded.passed
    for a, b in zip(exact.terms, bounded.terms):
        assert b.max_abs_error is None and a.max_abs_error <= min(a.error_bound, b.error_bound)
    assert "≤" in bounded.to_text() and "bound" in bounded.check("isolation").detail


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_left_as_it_was(enabled, monkeypatch):
    """verify_logits and verify_qk pause the cyclic collector while they build their terms, and
    restore it as they found it, also when they raise."""
    model = small_model()
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        verify_logits(model, TOKENS, max_order=1)
        verify_qk(model, TOKENS, 1, 0, max_order=1)
        def fails(*args, **kwargs):
            raise RuntimeError("the order-graded pass failed")

        monkeypatch.setattr(verify_module, "graded_final", fails)  # raised inside, while paused
        with pytest.raises(RuntimeError, match="order-graded"):
            verify_logits(model, TOKENS, max_order=1)
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_checks_1_and_3_pass_on_bounds_that_hold_the_exact_errors():
    model = small_model()
    exact = verify_logits(model, TOKENS, max_order=1, exact_errors=True)
    bounded = verify_logits(model, TOKENS, max_order=1, exact_errors=False)
    for name in ("sum", "truncation"):
        e, b = exact.check(name), bounded.check(name)
        assert e.passed and b.passed and not e.bounded and b.bounded
        assert 0 <= e.max_abs_error <= b.max_abs_error <= b.tolerance
    assert "max |error| ≤ " in bounded.to_text() and json.loads(bounded.to_json())["checks"][0]["bounded"] is True


def test_tolerance_follows_the_dtype():
    model = small_model()
    r64, r32 = verify_logits(model, TOKENS), verify_logits(model, TOKENS, dtype=torch.float32)
    assert r64.passed and r32.passed and r32.dtype == "float32"
    assert r64.check("sum").tolerance == pytest.approx(1e-9 * r64.scale)
    assert r32.check("sum").tolerance == pytest.approx(1e-4 * r32.scale)
    assert 1e-9 < r32.rel_error < 1e-4  # float32 rounding, well inside its tolerance


def test_norms_match_with_and_without_isolation():
    model = small_model()
    with_iso = verify_logits(model, TOKENS)
    without = verify_logits(model, TOKENS, isolation=False)
    assert without.check("isolation").passed is None and without.passed
    assert all(t.max_abs_error is None for t in without.terms)
    for a, b in zip(with_iso.terms, without.terms):
        assert a.label == b.label and math.isclose(a.norm, b.norm, rel_tol=1e-9, abs_tol=1e-12)


def test_qk_report_tags_compositions():
    report = verify_qk(small_model(), TOKENS, 1, 0, max_order=1)
    comps = {t.composition for t in report.terms}
    assert comps == {"direct", "Q", "K"}
    k_term = next(t for t in report.terms if t.composition == "K")
    assert k_term.heads == () and len(k_term.key_heads) == 1 and k_term.key_source
    assert report.check("truncation").passed


# --- the user's model is not touched --------------------------------------------------------


def test_model_is_not_modified():
    model = small_model(dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seen = []
    model.blocks[0].hook_resid_pre.add_hook(lambda x, hook: seen.append(1))
    verify_logits(model, TOKENS)
    verify_qk(model, TOKENS, 1, 1)
    assert model.dtype == torch.float32
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    model(TOKENS)
    assert seen  # the user's hook is still there


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens, match", [
    (torch.tensor([[1, 12]]), "out of range"),
    (torch.zeros(1, 7, dtype=torch.long), "does not fit n_ctx=6"),
    (torch.tensor([[0.5, 1.0]]), "integer dtype"),
])
def test_bad_tokens(tokens, match):
    with pytest.raises(ModelInputError, match=match):
        verify_logits(small_model(), tokens)


def test_nan_weights():
    model = small_model()
    with torch.no_grad():
        model.blocks[1].attn.W_V[0, 0, 0] = float("nan")
    with pytest.raises(WeightError, match="blocks.1.attn.W_V"):
        verify_logits(model, TOKENS)
    with pytest.raises(WeightError):
        verify_qk(model, TOKENS, 1, 0)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"dtype": torch.int64}, DeviceError, "floating dtype"),
    ({"dtype": "float7"}, DeviceError, "floating dtype"),
    ({"device": "tpu"}, DeviceError, "tpu"),
    ({"rtol": -1.0}, VerifyError, "rtol must be"),
    ({"atol": float("nan")}, VerifyError, "atol must be"),
])
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        verify_logits(small_model(), TOKENS, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # so on a GPU machine too
    with pytest.raises(DeviceError, match="CUDA is not available"):
        verify_logits(small_model(), TOKENS, device="cuda")


def test_expansion_of_another_architecture():
    model = small_model()
    with pytest.raises(ExpansionMismatch, match="built for 3 layers"):
        verify_logits(model, TOKENS, expansion=expand_logits(Architecture(3, 2)))
    with pytest.raises(ExpansionMismatch, match="L1H1, not L1H0"):
        verify_qk(model, TOKENS, 1, 0, expansion=expand_qk(model.arch, 1, 1))
    with pytest.raises(ExpansionMismatch, match="max_order=0"):
        verify_logits(model, TOKENS, max_order=0, expansion=expand_logits(model.arch, 1))
    with pytest.raises(VerifyError, match="LogitExpansion"):
        verify_logits(model, TOKENS, expansion=expand_qk(model.arch, 1, 1))
    assert verify_logits(model, TOKENS, expansion=expand_logits(model.arch, 1)).passed


def test_not_a_circuit_model():
    with pytest.raises(VerifyError, match="from_transformer_lens"):
        verify_logits(torch.nn.Linear(2, 2), TOKENS)


def test_head_that_does_not_exist():
    with pytest.raises(ArchitectureError, match="layer 2 does not exist"):
        verify_qk(small_model(), TOKENS, 2, 0)


def test_too_many_terms_suggests_max_order():
    model = small_model(Architecture(3, 4))
    with pytest.raises(TooManyTerms, match="max_order=1"):
        verify_logits(model, TOKENS, limit=50)


def test_check_1_skipped_when_the_untruncated_expansion_is_too_large(monkeypatch):
    monkeypatch.setattr(verify_module, "FULL_LIMIT", 3)
    report = verify_logits(small_model(Architecture(2, 2)), TOKENS, max_order=0)
    assert report.check("sum").passed is None and report.check("truncation").passed
    assert report.passed and any("check 1 (sum) skipped" in n for n in report.notes)


# --- converted models -----------------------------------------------------------------------


def test_transformer_lens_models_verify():
    tl = pytest.importorskip("transformer_lens")
    from numeric_check.conversion.adapters import from_transformer_lens

    for kwargs in ({"attn_only": True, "normalization_type": None, "positional_embedding_type": "standard"},
                   {"attn_only": True, "normalization_type": "LN", "positional_embedding_type": "shortformer"},
                   {"attn_only": False, "normalization_type": "LNPre", "act_fn": "gelu"}):
        torch.manual_seed(0)
        cfg = tl.HookedTransformerConfig(n_layers=2, d_model=12, n_ctx=8, d_head=4, n_heads=3, d_vocab=20,
                                         init_weights=True, d_mlp=16 if not kwargs["attn_only"] else None, device="cpu",
                                         **kwargs)
        source = tl.HookedTransformer(cfg)
        with torch.no_grad():
            for name, p in source.named_parameters():
                if name.split(".")[-1].startswith("b_"):
                    p.normal_(0, 0.1)
        model = from_transformer_lens(source, device="cpu")
        tokens = torch.randint(0, 20, (2, 6))
        assert torch.allclose(model(tokens), source(tokens).double(), atol=1e-4)
        assert verify_logits(model, tokens, max_order=1).passed


def test_gpt2_models_verify():
    transformers = pytest.importorskip("transformers")
    from numeric_check.conversion.hf import from_hf_gpt2

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=12, n_head=3, n_positions=8,
                                                              vocab_size=20, bos_token_id=0, eos_token_id=0)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    model = from_hf_gpt2(hf, device="cpu")
    tokens = torch.randint(0, 20, (2, 6))
    assert torch.allclose(model(tokens), hf(tokens).logits.double(), atol=1e-4)
    report = verify_logits(model, tokens)
    assert report.passed, report.to_text()
    assert verify_qk(model, tokens, 1, 2).passed


def test_terms_that_cancel_are_checked_at_their_own_scale():
    """Tokens and positions that nearly cancel (x ≈ 0): the terms are ~1e7 times the logits and the
    scores, and their sum is rounded at the terms' scale. Found by hypothesis on a 1-dim model."""
    model = CircuitModel.random(Architecture(1, 1, positional="standard"), d_model=4, d_head=3, d_vocab=5, n_ctx=2,
                                seed=0, dtype=torch.float64, device="cpu")
    with torch.no_grad():
        model.W_pos[:, 0] = -model.W_E[:, 2] * (1 - 1e-7)
    tokens = torch.tensor([[2]])
    for report in (verify_logits(model, tokens), verify_qk(model, tokens, 0, 0)):
        assert report.passed, report.to_text()
        assert "the terms cancel" in report.check("sum").detail
        assert max(t.norm for t in report.terms) > 1e5 * report.scale
    # without cancellation the tolerance stays relative to the logits
    assert "cancel" not in verify_logits(small_model(), TOKENS).check("sum").detail


def test_exact_errors_by_default_only_when_every_term_is_cheap(monkeypatch):
    model = small_model()
    cheap = verify_logits(model, TOKENS)
    assert all(t.max_abs_error is not None for t in cheap.terms) and not cheap.check("sum").bounded
    n_terms = len(cheap.terms)
    per_term = TOKENS.numel() * model.cfg.d_vocab * model.cfg.d_model
    monkeypatch.setattr(verify_module, "EXACT_LIMIT", per_term * n_terms - 1)  # one term fits, all of them do not
    costly = verify_logits(model, TOKENS)
    assert costly.passed and all(t.max_abs_error is None for t in costly.terms) and costly.check("sum").bounded
