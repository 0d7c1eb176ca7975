"""``--tl FOLDER``: a HookedTransformer a person saved with ``numeric_check.save_tl`` (its config as JSON, its
state dict, its tokenizer) reaches the command line; a folder that is not one is refused in one line (issue 47)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import run_cli

pytest.importorskip("transformer_lens")


@pytest.fixture(scope="module")
def tl_dir(tmp_path_factory):
    """A 2-layer HookedTransformer with layer norm, biases and MLPs, every weight off its default, saved with a
    byte-level BPE tokenizer."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    import numeric_check as nc

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["The cat sat on the mat.", "A B C D A B C D"], trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    made = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    made.save_pretrained(saved := tmp_path_factory.mktemp("tokenizer"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(saved)  # as a person has one (TransformerLens reads its path)
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=12, d_head=4, n_heads=4, d_vocab=len(tokenizer),
                                  d_mlp=32, act_fn="gelu", normalization_type="LN", seed=1)
    model = HookedTransformer(cfg, tokenizer=tokenizer)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * (torch.rand(p.shape, generator=gen) * 2 - 1))
    return nc.save_tl(model, tmp_path_factory.mktemp("tl") / "my-tl")


def test_a_saved_folder_loads_as_it_was_saved(tl_dir):
    from numeric_check.conversion.tl_folder import CONFIG, load_tl

    assert sorted(p.name for p in tl_dir.iterdir()) >= [CONFIG, "model.pt", "tokenizer.json"]
    assert not {"dtype", "device", "seed"} & set(json.loads((tl_dir / CONFIG).read_text()))
    model = load_tl(tl_dir, torch.float64, "cpu")
    assert model.cfg.dtype == torch.float64 and model.tokenizer is not None
    assert all(p.dtype == torch.float64 for p in model.parameters())


@pytest.mark.parametrize("argv", [("--tokens", "1,2,3,4"), ("--text", "The cat sat")])
def test_verify_on_a_saved_transformer_lens_folder(capsys, tl_dir, argv):
    code, out, err = run_cli(capsys, "verify", "--tl", str(tl_dir), *argv, "--max-order", "1", "--quiet")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].startswith("converted from HookedTransformer (TransformerLens, float64): logits equal to the source")
    assert "PASSED" in out and "Moving model" not in out


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("spoil, fragment", [
    (lambda f: (f / "hooked_transformer_config.json").unlink(), "the folder holds no hooked_transformer_config.json; "
     "save a HookedTransformer with numeric_check.save_tl(model, folder)"),
    (lambda f: (f / "hooked_transformer_config.json").write_text('{"n_layers": 2, "bogus": 1}'),
     "hooked_transformer_config.json is not a HookedTransformerConfig (TypeError: "),
    (lambda f: (f / "hooked_transformer_config.json").write_text("[1]"), "must hold a JSON object"),
    (lambda f: (f / "model.pt").unlink(), "the folder holds no weights: expected model.safetensors or model.pt"),
    (lambda f: (f / "model.pt").write_bytes(b"junk"), "cannot read model.pt as a state dict of tensors"),
    (lambda f: torch.save({"x": 1}, f / "model.pt"), "model.pt holds a dict, not a state dict of tensors"),
    (lambda f: torch.save({k: v for k, v in torch.load(f / "model.pt").items() if k != "embed.W_E"}, f / "model.pt"),
     "1 tensor missing from model.pt (embed.W_E)"),
    (lambda f: torch.save({**torch.load(f / "model.pt"), "embed.W_E": torch.zeros(3, 3)}, f / "model.pt"),
     "1 tensor of another shape than the model's in model.pt (embed.W_E)"),
])
def test_a_folder_that_is_not_a_saved_model_is_one_line(capsys, tmp_path, tl_dir, spoil, fragment):
    folder = _copy(tl_dir, tmp_path / "spoilt")
    spoil(folder)
    code, out, err = run_cli(capsys, "verify", "--tl", str(folder), "--tokens", "1,2", "--quiet")
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"tcircuits verify: error: cannot load the TransformerLens folder '{folder}': ") and fragment in err, err


def test_a_file_or_a_hugging_face_folder_given_to_tl_says_what_to_give(capsys, tmp_path, tl_dir):
    code, out, err = run_cli(capsys, "verify", "--tl", str(tl_dir / "model.pt"), "--tokens", "1,2", "--quiet")
    assert code == 2 and "is not a folder; give the folder numeric_check.save_tl wrote" in err, err
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "gpt2"}')
    code, out, err = run_cli(capsys, "verify", "--tl", str(hf), "--tokens", "1,2", "--quiet")
    assert code == 2 and "(a Hugging Face folder: give it to --hf)" in err, err
