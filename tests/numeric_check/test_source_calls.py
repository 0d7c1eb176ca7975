"""The source is called as a person calls it (issue 54, item 3): a plain ``model(input_ids)`` / ``model(tokens)`` with
its own defaults, gradients on, in training mode when it is held so, beside the check's own call with hidden states;
and what was added to it after it was built (a hook, a replaced or wrapped ``forward``) is named on acceptance too.

Each tamper below was accepted before (the check called the source only with ``output_hidden_states=True`` or
``run_with_cache``, gradients off, in eval mode); each untampered twin is accepted."""

from __future__ import annotations

import pytest
import torch

from numeric_check import SourceMismatch, from_hf, from_transformer_lens
from numeric_check.conversion.source_calls import additions
from tests.numeric_check.test_source_check import hooked, llama

pytest.importorskip("transformers")
pytest.importorskip("transformer_lens")
pytestmark = pytest.mark.slow

#: when a tampered ``forward`` scales the logits: what differs between the check's call and a person's
WHEN = {
    "without output_hidden_states": lambda model, args, kwargs: not kwargs.get("output_hidden_states"),
    "with gradients on": lambda model, args, kwargs: torch.is_grad_enabled(),
    "with input_ids passed by position": lambda model, args, kwargs: bool(args),
    "with the default use_cache": lambda model, args, kwargs: "output_hidden_states" not in kwargs
    and kwargs.get("use_cache") is None,
    "in training mode": lambda model, args, kwargs: model.training,
}


def tampered_forward(model, when, factor=1.5):
    """``model.forward`` replaced on the instance: the logits times ``factor`` when ``when`` holds, else as built."""
    original = model.forward

    def forward(*args, **kwargs):
        out = original(*args, **kwargs)
        if not when(model, args, kwargs):
            return out
        if isinstance(out, torch.Tensor):  # TransformerLens' logits
            return out * factor
        out.logits = out.logits * factor
        return out

    model.forward = forward
    return model


@pytest.mark.parametrize("when", list(WHEN))
def test_a_hugging_face_forward_that_differs_as_a_person_calls_it_is_refused(when):
    hf = llama()
    if when == "in training mode":
        hf.train()  # held so, as a model built from its config is (Llama's dropout is 0: each call the same)
    with pytest.raises(SourceMismatch) as refused:
        from_hf(tampered_forward(hf, WHEN[when]), device="cpu")
    line = str(refused.value)
    assert "\n" not in line and line.startswith("from_hf: called as model(input_ids)"), line
    assert "which equal its own with output_hidden_states=True: refused" in line
    assert "LlamaForCausalLM.forward replaced on the instance by tampered_forward.<locals>.forward" in refused.value.detail
    # the twin: the same replaced forward, scaling nothing, is accepted and named
    twin = llama().train() if when == "in training mode" else llama()
    check = from_hf(tampered_forward(twin, WHEN[when], 1.0), device="cpu").source_check
    assert check.rel_diff <= check.tolerance
    assert check.added == ("LlamaForCausalLM.forward replaced on the instance by tampered_forward.<locals>.forward in "
                           f"test_source_calls.py:{tampered_forward.__code__.co_firstlineno + 4} (wrapping the original)",)
    assert "what was added to the source after it was built runs in it" in check.describe()


@pytest.mark.parametrize("when", ["outside run_with_cache", "with gradients on", "in training mode"])
def test_a_transformer_lens_forward_that_differs_as_a_person_calls_it_is_refused(when):
    model = hooked()
    hooks = list(model.hook_dict.values())
    condition = {
        "outside run_with_cache": lambda m, args, kwargs: not any(h._forward_hooks for h in hooks),
        "with gradients on": WHEN["with gradients on"],
        "in training mode": WHEN["in training mode"],
    }[when]
    if when == "in training mode":
        model.train()
    with pytest.raises(SourceMismatch, match=r"^from_transformer_lens: called as model\(tokens\).* which equal its own "
                                             r"in run_with_cache: refused$"):
        from_transformer_lens(tampered_forward(model, condition), device="cpu")
    twin = hooked().train() if when == "in training mode" else hooked()
    check = from_transformer_lens(tampered_forward(twin, condition, 1.0), device="cpu").source_check
    assert check.rel_diff <= check.tolerance and len(check.added) == 1


def test_a_source_held_in_training_mode_with_dropout_is_compared_in_eval_mode_and_says_so():
    hf = llama(attention_dropout=0.5).train()
    check = from_hf(hf, device="cpu").source_check
    assert hf.training and check.rel_diff <= check.tolerance
    assert check.called == "held in training mode, where its dropout makes each call differ: compared in eval mode"
    assert check.called in check.describe()
    assert from_hf(llama().train(), device="cpu").source_check.called is None  # no dropout: compared in training mode


@pytest.mark.parametrize("flags", [dict(use_cache=False), dict(output_hidden_states=True)])
def test_a_config_that_sets_how_the_source_answers_is_accepted(flags):
    hf = llama()
    for key, value in flags.items():
        setattr(hf.config, key, value)
    check = from_hf(hf, device="cpu").source_check
    assert check.rel_diff <= check.tolerance and check.added == ()


def test_hooks_and_wrapped_forwards_that_change_nothing_are_named_on_acceptance():
    hf = llama()
    seen = []
    hf.model.layers[1].mlp.register_forward_hook(lambda module, inputs, output: seen.append(output.shape))
    hf.model.norm.register_forward_pre_hook(lambda module, inputs: None)
    check = from_hf(hf, device="cpu").source_check
    assert seen and [a.split(" (")[0] for a in check.added] == ["a forward hook on model.layers.1.mlp",
                                                                 "a forward pre-hook on model.norm"]
    assert "a forward hook on model.layers.1.mlp (test_hooks_and_wrapped" in check.describe()
    model = hooked()
    model.blocks[0].hook_resid_pre.add_hook(lambda tensor, hook: tensor, is_permanent=True)
    check = from_transformer_lens(model, device="cpu").source_check
    assert [a.split(" (")[0] for a in check.added] == ["a forward hook on blocks.0.hook_resid_pre"]


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "falcon", "qwen2"])
def test_an_untouched_source_names_nothing(model_type):
    from tests.hf_zoo import build

    hf = build(model_type, 1, exact=False)  # exact=True replaces forwards (float64 norms)
    assert additions(hf) == []
    assert from_hf(hf, device="cpu").source_check.added == ()
    assert additions(hf) == []  # nothing of the check's own is left on it
    assert additions(hooked()) == []


def test_a_class_forward_replaced_outside_its_library_is_named(monkeypatch):
    import transformers

    original = transformers.LlamaForCausalLM.forward
    monkeypatch.setattr(transformers.LlamaForCausalLM, "forward", lambda self, *a, **k: original(self, *a, **k))
    assert additions(llama()) == [f"LlamaForCausalLM.forward replaced on the class by "
                                  f"test_a_class_forward_replaced_outside_its_library_is_named.<locals>.<lambda> in "
                                  f"test_source_calls.py:{test_a_class_forward_replaced_outside_its_library_is_named.__code__.co_firstlineno + 4}"]
