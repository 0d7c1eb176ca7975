"""Path attribution: every term's contribution equals the verification evaluator's entry and its path
isolated through the model, the contributions add up to the model's logit, a wrong term is caught,
the renderers escape what the user gave, and bad input gets one-line errors."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import numeric_check
from derivations.architecture import Architecture
from derivations.paths import expand_logits
from numeric_check.circuits import attribution as attribution_module
from numeric_check.circuits.attribution import attribute, path_words
from numeric_check.errors import AttributionError, NumericCheckError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.verification.hook_paths import record
from numeric_check.verification.bind import Binder
from numeric_check.verification.evaluate import LogitEvaluator
from tests.conftest import FAST
from tests.strategies import models_and_tokens

torch.set_num_threads(1)

FULL = Architecture(3, (2, 1, 2), positional="standard", layer_norm=True, biases=True, mlp=True)
PROMPT = [1, 2, 3, 1, 2, 7]


def small_model(arch=FULL, seed=0, **kw) -> CircuitModel:
    return CircuitModel.random(arch, seed=seed, **(dict(d_model=8, d_head=4, d_vocab=12, n_ctx=8, device="cpu") | kw))


class Tokenizer:
    """A tokenizer as attribute() sees one: one character per token, ``<b>`` for id 11."""

    def encode(self, text, add_special_tokens=False):
        return [11] if text == "<b>" else [ord(ch) - ord("a") for ch in text]

    def decode(self, ids):
        return "".join("<b>" if i == 11 else chr(ord("a") + i) for i in ids)


# --- the figures --------------------------------------------------------------------------------


def evaluator_entries(model: CircuitModel, prompt, position: int, ids, weights) -> tuple[dict[str, float], float]:
    """Each term's entry ``Σ w · logits[position, id]`` as the verification's own evaluator forms it (every
    entry of every term), and the model's own value."""
    work = model.working_copy("float64", "cpu")
    rec = record(work, torch.tensor([prompt]))
    terms = list(expand_logits(model.arch))
    ev = LogitEvaluator(Binder(work, rec), terms)
    out = {}
    for v in ev.values():
        logits = ev.logits(v)[0, position]
        out[terms[v.index].label] = sum(w * float(logits[i]) for i, w in zip(ids, weights))
    return out, sum(w * float(rec.logits[0, position, i]) for i, w in zip(ids, weights))


def assert_matches_evaluator(model, prompt, position, target=None, diff=None) -> None:
    a = attribute(model, prompt, target=target, logit_diff=diff, position=position, max_order=None, top=0)
    ids, weights = ((target,), (1.0,)) if diff is None else (diff, (1.0, -1.0))
    expected, value = evaluator_entries(model, prompt, position, ids, weights)
    got = {t.label: t.contribution for t in a.terms}
    assert got.keys() == expected.keys() and len(got) == len(a.terms)
    assert max(abs(got[k] - expected[k]) for k in got) < 1e-12
    assert abs(a.value - value) < 1e-12
    assert a.remainder == 0 and a.n_omitted == 0 and a.sum_error < 1e-12 and a.passed


@pytest.mark.parametrize("target, diff", [(5, None), (None, (4, 9))])
def test_each_contribution_is_the_evaluators_entry(target, diff):
    """Each term equals the entry of its logits as the verification's own evaluator forms them, for a
    logit and for a logit difference, at a position that is not the last."""
    assert_matches_evaluator(small_model(), PROMPT, 3, target, diff)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("case", range(9))
def test_each_contribution_on_the_families_from_hf(case):
    """The same on every family the conversion reads (rotary, grouped-query heads, RMSNorm, parallel blocks,
    gated MLPs, tied embeddings), every parameter perturbed."""
    from tests.numeric_check.test_from_hf import CASES, build

    assert len(CASES) == 9, "a family was added to test_from_hf.CASES: widen the range above"
    family, options = CASES[case]
    model = numeric_check.from_hf(build(family, seed=2, **options), device="cpu")
    assert_matches_evaluator(model, [1, 5, 2, 7, 3, 12], 4, diff=(3, 11))


def test_path_words_are_the_expansions_terms():
    for max_order in (0, 1, None):
        e = expand_logits(FULL, max_order)
        assert [(p.label, P, W) for p, P, W in path_words(e)] == [(t.label, *t.term.words) for t in e]


def test_ranked_largest_first_and_the_top_isolated():
    a = attribute(small_model(), PROMPT, target=3, max_order=2, top=6)
    sizes = [abs(t.contribution) for t in a.terms]
    assert sizes == sorted(sizes, reverse=True)
    assert a.n_checked == 6 and all(t.passed and t.error < 1e-12 for t in a.terms[:6])
    assert all(t.isolated is None for t in a.terms[6:])
    assert a.terms[0].label == max(a.terms, key=lambda t: abs(t.contribution)).label


def test_remainder_is_the_higher_orders_computed_by_the_model():
    """At max_order=1 the remainder (from the model's order-graded pass) equals the sum of the
    order-2 and order-3 terms of the full attribution, and the kept terms are the same."""
    model = small_model()
    full = attribute(model, PROMPT, target=6, max_order=None, top=0)
    one = attribute(model, PROMPT, target=6, max_order=1, top=0)
    higher = math.fsum(t.contribution for t in full.terms if t.order > 1)
    assert one.n_omitted == sum(t.order > 1 for t in full.terms) and one.n_omitted > 0
    assert abs(one.remainder - higher) < 1e-12 and abs(higher) > 1e-3
    kept = {t.label: t.contribution for t in full.terms if t.order <= 1}
    assert {t.label: t.contribution for t in one.terms} == pytest.approx(kept, abs=1e-13)
    assert one.sum_passed and one.sum_error < 1e-12
    assert "remainder" in one.by_component() and "remainder: " in one.to_text()


@FAST
@given(models_and_tokens(max_batch=1), st.sampled_from([0, 1, 2, None]), st.data())
def test_contributions_add_up_to_the_model(pair, max_order, data):
    model, tokens = pair
    position = data.draw(st.integers(0, tokens.shape[1] - 1))
    target = data.draw(st.integers(0, model.cfg.d_vocab - 1))
    a = attribute(model, tokens, target=target, position=position, max_order=max_order, top=3)
    assert a.passed, a.to_text()
    total = math.fsum(t.contribution for t in a.terms) + a.remainder
    assert abs(total - a.value) <= 1e-10 * max(1.0, abs(a.value), abs(a.terms[0].contribution) if a.terms else 0)
    assert len(a.terms) == expand_logits(model.arch, a.max_order).n_terms


def test_a_wrong_term_fails_isolation(monkeypatch):
    """Offset the contraction's largest term: isolation (the model's own hooks) catches it, and the sum too."""
    real = attribution_module.TargetContraction.contributions

    def wrong(self, terms):
        out = real(self, terms)
        out[int(out.abs().argmax())] += 1e-3
        return out

    monkeypatch.setattr(attribution_module.TargetContraction, "contributions", wrong)
    a = attribute(small_model(), PROMPT, target=3, max_order=1, top=2)
    assert not a.passed and not a.terms[0].passed and not a.sum_passed
    assert "FAIL" in a.to_text() and a.to_text().rstrip().endswith("FAILED")


def test_float32_on_the_default_tolerance():
    a = attribute(small_model(), PROMPT, target=3, max_order=2, dtype="float32")
    assert a.passed and a.dtype == "float32" and a.sum_error < 1e-5


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, words", [
    (dict(target=12), "target 12 is outside the vocabulary 0..11"),
    (dict(target=-1), "outside the vocabulary"),
    (dict(target="ab"), "no tokenizer"),
    (dict(target=3, position=6), "position must be an int in -6..5"),
    (dict(target=3, max_order=3), "max_order must be 0, 1, 2 or None"),
    (dict(target=3, top=-1), "top must be an int >= 0"),
    (dict(target=3, logit_diff=(1, 2)), "exactly one of target"),
    (dict(), "exactly one of target"),
    (dict(logit_diff=(4, 4)), "the same token twice"),
    (dict(logit_diff=(4,)), "two tokens"),
])
def test_bad_input_is_refused_in_one_line(kwargs, words):
    with pytest.raises(AttributionError, match=words) as info:
        attribute(small_model(), PROMPT, **kwargs)
    assert "\n" not in str(info.value)


def test_bad_prompts_and_models():
    with pytest.raises(AttributionError, match="one prompt"):
        attribute(small_model(), [PROMPT, PROMPT], target=1)
    with pytest.raises(AttributionError, match="CircuitModel"):
        attribute(object(), PROMPT, target=1)
    with pytest.raises(NumericCheckError, match="outside|range|vocab"):
        attribute(small_model(), [1, 99], target=1)
    with pytest.raises(AttributionError, match="2 tokens"):
        attribute(small_model(), PROMPT, target="ab", tokenizer=Tokenizer())


# --- output -------------------------------------------------------------------------------------


def test_outputs_show_and_escape_token_strings():
    a = attribute(small_model(), [11, 2, 11], target="<b>", tokenizer=Tokenizer(), max_order=1, top=3)
    assert a.target.ids == (11,) and a.target.label == "logit[11 '<b>']"
    text = a.to_text(5)
    assert text.splitlines()[0] == "attribution of logit[11 '<b>'] at position 2 (token 11 '<b>')"
    assert "tok→L0H1" in {t.label for t in a.terms} and "tok→L0H1" in a.to_text(None)
    html = a.to_html()
    assert "<b>" not in html and "&lt;b&gt;" in html and html.count("<svg") == 1 and "http" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert "<rect" in a._repr_html_() and "<html" not in a._repr_html_()
    md = a.to_markdown()
    assert "<b>" not in md and "| rank | term |" in md and md == a.to_markdown()
    assert a._repr_markdown_().startswith("**attribution of")


def test_json_is_strict_and_lists_every_term():
    a = attribute(small_model(), PROMPT, logit_diff=(3, 4), max_order=2, top=4)
    data = json.loads(a.to_json())
    assert len(data["terms"]) == len(a.terms) and data["passed"] is True
    assert data["target_label"] == "logit[3] - logit[4]"
    assert [t["contribution"] for t in data["terms"]] == [t.contribution for t in a.terms]
    assert data["terms"][0]["isolated"] is not None and data["terms"][-1]["isolated"] is None
    a.value = math.nan
    assert json.loads(a.to_json())["value"] is None  # strict: no NaN in the output


def test_exported_from_the_package():
    assert numeric_check.attribute is attribute


# --- against TransformerLens' direct logit attribution --------------------------------------------


def _tl_direct_logit_attribution(tl_model, tokens, position: int, target: int) -> dict[str, float]:
    """TransformerLens' own DLA at ``position``: every head's result (``stack_head_results``), the
    embeddings, each layer's ``b_O`` and MLP output (``decompose_resid``), each through the final layer
    norm's frozen scale (``apply_ln_to_stack``) onto the target's unembedding direction (its gain applied:
    the model is not folded). A head's result holds its value bias and ``ln1``'s bias through ``W_V``,
    which the algebra folds into ``b_O`` (pattern rows sum to 1): moved there the same way."""
    _, cache = tl_model.run_with_cache(tokens[None])
    direction = tl_model.ln_final.w * tl_model.W_U[:, target]

    def onto(stack):
        return (cache.apply_ln_to_stack(stack, layer=-1, pos_slice=position) @ direction)[:, 0].tolist()

    heads, labels = cache.stack_head_results(layer=-1, pos_slice=position, return_labels=True)
    blocks = tl_model.blocks
    value_bias = torch.stack([(b.attn.b_V[h] + b.ln1.b @ b.attn.W_V[h]) @ b.attn.W_O[h]
                              for b in blocks for h in range(tl_model.cfg.n_heads)])
    out = {label: r - v for label, r, v in zip(labels, onto(heads), onto(value_bias[:, None].expand_as(heads)))}
    parts, names = cache.decompose_resid(layer=-1, incl_embeds=True, pos_slice=position, return_labels=True)
    whole = dict(zip(names, onto(parts)))
    out["tok"], out["pos"] = whole["embed"], whole["pos_embed"]
    for layer in range(tl_model.cfg.n_layers):
        out[f"mlp^L{layer}"] = whole[f"{layer}_mlp_out"]
        out[f"b_O^L{layer}"] = whole[f"{layer}_attn_out"] - sum(out[f"L{layer}H{h}"] for h in range(tl_model.cfg.n_heads))
    out["b_U"] = float(tl_model.ln_final.b @ tl_model.W_U[:, target] + tl_model.b_U[target])
    return out


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("n_layers", [1, 3])
def test_order_one_equals_transformer_lens_direct_logit_attribution(n_layers):
    """On a TransformerLens model with every parameter perturbed (layer-norm gains off 1, biases off 0),
    converted by from_transformer_lens, float64: the order-1 attribution of a 1-layer model is its DLA
    term by term (summed over sources per head); with more layers, order 1 equals the DLA of every
    layer-0 head, embedding, bias and MLP, and the remainder is what the later heads' DLA holds beyond
    their order-1 terms; with every order kept, every component's DLA. All to 1e-10."""
    tl = pytest.importorskip("transformer_lens")
    from tests.numeric_check.test_adapters import randomise

    torch.manual_seed(0)
    cfg = tl.HookedTransformerConfig(n_layers=n_layers, d_model=12, n_ctx=8, d_head=5, n_heads=3, d_vocab=11, d_mlp=20,
                                     act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard",
                                     dtype=torch.float64, seed=0, device="cpu")
    source = randomise(tl.HookedTransformer(cfg), seed=1)
    model = numeric_check.from_transformer_lens(source)
    tokens = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    worst = 0.0
    for position, target in ((7, 4), (3, 10)):
        dla = _tl_direct_logit_attribution(source, tokens, position, target)
        one = attribute(model, tokens, target=target, position=position, max_order=1, top=0).by_component()
        full = attribute(model, tokens, target=target, position=position, max_order=None, top=0).by_component()
        assert full.keys() == dla.keys()
        worst = max([worst] + [abs(full[k] - dla[k]) for k in dla])
        later = [k for k in dla if k.startswith("L") and not k.startswith("L0H")]
        assert later == [] if n_layers == 1 else len(later) == 3 * (n_layers - 1)
        for k in dla:
            if k not in later:
                worst = max(worst, abs(one[k] - dla[k]))
        rest = math.fsum(dla[k] - one[k] for k in later)
        worst = max(worst, abs(one.get("remainder", 0.0) - rest))
    print(f"order-1 and full attribution against TransformerLens DLA: max |difference| {worst:.2g}")
    assert worst < 1e-10, worst


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_hugging_face_model_and_tokenizer_made_offline():
    """A GPT-2 built from its config with a BPE tokenizer trained here on a few sentences: targets given
    as text resolve through the tokenizer, labels show token strings, and the checks pass."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"])
    text = ["The capital of France is Paris.", "The capital of Italy is Rome.", "Mary gave John a book <b>."] * 5
    bpe.train_from_iterator(text, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=16, vocab_size=len(tokenizer),
                                     bos_token_id=0, eos_token_id=0)
    model = numeric_check.from_hf(transformers.GPT2LMHeadModel(config).eval(), device="cpu")
    prompt = tokenizer.encode("The capital of France is")
    a = attribute(model, prompt, target=" Paris", tokenizer=tokenizer, max_order=1, top=5)
    assert a.passed and a.target.ids == tuple(tokenizer.encode(" Paris")) and a.target.texts == [" Paris"]
    assert a.to_text().startswith(f"attribution of logit[{a.target.ids[0]} ' Paris'] at position {len(prompt) - 1} (token ")
    d = attribute(model, prompt, logit_diff=(" Paris", " Rome"), tokenizer=tokenizer, max_order=2, top=3)
    assert d.passed and d.target.label.endswith("' Rome']")
    with pytest.raises(AttributionError, match="expected exactly one"):
        attribute(model, prompt, target=" Paris is", tokenizer=tokenizer)
