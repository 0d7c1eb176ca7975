"""TransformerLens 4 (issue 54): ``HookedTransformer`` is gone (importing it raises ImportError); its models are a
``TransformerBridge`` around a Hugging Face model. ``from_transformer_lens`` converts the model a bridge wraps and
holds it to the bridge's own forward too: equal, or refused by name. Runs where TransformerLens 4 is installed
(``.ci/run``'s newest releases); skipped under 2 and 3."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from numeric_check import SourceMismatch, UnsupportedModel, from_transformer_lens
from tests.helpers import saved_hf_model

tl = pytest.importorskip("transformer_lens")
pytestmark = pytest.mark.slow


def _major() -> int:
    from importlib import metadata

    return int(metadata.version("transformer-lens").split(".")[0])


if _major() < 4:
    pytest.skip("TransformerLens 4's TransformerBridge (installed: an older release)", allow_module_level=True)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def folder(request, tmp_path_factory):
    return saved_hf_model(tmp_path_factory.mktemp(request.param), request.param)


def boot(folder):
    from transformer_lens.model_bridge import TransformerBridge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TransformerBridge.boot_transformers(str(folder), dtype=torch.float64, device="cpu")


@pytest.mark.parametrize("compatible", [False, True])
def test_a_bridge_converts_equal_to_its_own_forward(folder, compatible):
    bridge = boot(folder)
    if compatible:  # HookedTransformer's processing: layer norms folded, weights centred in place
        bridge.enable_compatibility_mode(disable_warnings=True)
    try:
        model = from_transformer_lens(bridge, device="cpu")
    except SourceMismatch as refused:  # GPT-2's folded layer norms are not read as its bridge computes them: by name
        assert compatible and folder.name.startswith("gpt2"), refused
        assert re.match(r"from_transformer_lens: a TransformerBridge after enable_compatibility_mode\(\) is not read as "
                        r"it computes \(logits [\d.]+ off\); convert one booted afresh, before that call$", str(refused)), refused
        assert len(str(refused)) <= 200
        return
    check = model.source_check
    assert re.match(r"converted from \w+ \(TransformerLens 4[.\d]* TransformerBridge over Hugging Face, float64\): "
                    r"logits equal to the source within ", check.describe()), check.describe()
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        theirs = bridge(tokens)
        assert float((model(tokens) - theirs).abs().max()) <= check.tolerance * float(theirs.abs().max())


def test_a_hook_on_a_bridge_that_changes_its_logits_is_refused_and_named(folder):
    bridge = boot(folder)
    bridge.blocks[0].hook_out.add_hook(lambda tensor, hook: tensor * 1.1, is_permanent=True)
    with pytest.raises(SourceMismatch, match=r"^from_transformer_lens: the logits differ from \w+'s by ") as refused:
        from_transformer_lens(bridge, device="cpu")
    assert re.search(r"a forward hook on \S+hook_out \(\S+<lambda> in test_tl4.py", refused.value.detail), refused.value.detail
    twin = boot(folder)  # a hook that changes nothing: accepted, named
    twin.blocks[0].hook_out.add_hook(lambda tensor, hook: tensor, is_permanent=True)
    added = from_transformer_lens(twin, device="cpu").source_check.added
    assert any(re.search(r"hook_out \(\S+<lambda> in test_tl4.py", a) for a in added), added


def test_hooked_transformer_is_gone_and_anything_else_is_refused_by_name():
    with pytest.raises(ImportError, match="HookedTransformer"):
        from transformer_lens import HookedTransformer  # noqa: F401
    with pytest.raises(UnsupportedModel, match=r"^from_transformer_lens expects a transformer_lens.HookedTransformer "
                                               r"\(TransformerLens 2 and 3\) or TransformerBridge \(TransformerLens 4\), "
                                               r"got Linear$"):
        from_transformer_lens(torch.nn.Linear(2, 2))


def test_a_saved_tl_folder_is_refused_in_one_line_saying_what_to_do(tmp_path):
    from numeric_check.conversion.tl_folder import load_tl
    from numeric_check.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"^--tl reads a folder saved from a TransformerLens 2 or 3 HookedTransformer; "
                                             r"the installed TransformerLens 4 has no HookedTransformer: install "
                                             r"transformer-lens<4, or give the Hugging Face model \(--hf; "):
        load_tl(tmp_path, torch.float64, "cpu")
