"""The command line on the model a person studies: ``--hf`` on a folder saved with
``save_pretrained`` (a model built offline, with a tokenizer trained offline), ``--text`` read by
its own tokenizer, the conversion checked against the source and said in the report (issue 17)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli, saved_hf_model

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return saved_hf_model(tmp_path_factory.mktemp("gpt2"), "gpt2")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return saved_hf_model(tmp_path_factory.mktemp("llama"), "llama", seed=1)


def test_verify_on_a_saved_hugging_face_folder_with_a_text_prompt(capsys, gpt2_dir):
    code, out, err = run_cli(capsys, "verify", "--hf", str(gpt2_dir), "--text", "The cat sat on the mat.",
                             "--max-order", "1", "--no-progress")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].startswith("converted from GPT2LMHeadModel (Hugging Face, float64): logits equal to the source within ")
    assert lines[2].startswith("tokens: ") and "'The'" in lines[2] and "' sat'" in lines[2]
    assert "PASSED" in out and "tok→L0H0" in out


def test_verify_on_a_llama_folder_reads_its_prompt_file_and_checks_a_head(capsys, llama_dir, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("When Mary and John went to the store", encoding="utf-8")
    code, out, err = run_cli(capsys, "verify", "--hf", str(llama_dir), "--text-file", str(prompt), "--qk", "1", "2",
                             "--max-order", "1", "--json", "--no-progress")
    assert code == 0, err
    report = json.loads(out)
    assert report["passed"] and report["source"].startswith("converted from LlamaForCausalLM (Hugging Face, float64)")
    assert "293 ' Mary'" in report["tokens"][0] and report["tokens"][0].endswith("… (18 tokens)")


@pytest.mark.parametrize("argv, message", [
    (["--hf", "/no/such/folder"], "cannot load the Hugging Face model '/no/such/folder': "),
    (["--text", "hello"], "--text needs the model's tokenizer: load the model with --hf or --tl"),
    (["--hf", "{dir}", "--layers", "2"], "--hf describes the model; do not also give --layers"),
    (["--hf", "{dir}", "--checkpoint", "m.safetensors"], "give one model: --hf and --checkpoint both name one"),
    (["--hf", "{dir}", "--text", "hi", "--tokens", "1,2"], "give the tokens once: --text or --tokens, not both"),
    (["--hf", "{dir}", "--text", "   "], "the prompt is empty"),
    (["--hf", "{dir}", "--text", "The cat sat on the mat. " * 20], "more than the model's context n_ctx=32"),
    (["--revision", "main", "--layers", "1"], "--revision goes with --hf"),
])
def test_bad_model_flags_get_one_line(capsys, gpt2_dir, argv, message):
    code, out, err = run_cli(capsys, "verify", *[a.replace("{dir}", str(gpt2_dir)) for a in argv], "--no-progress")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_a_folder_without_a_tokenizer_runs_on_ids_and_refuses_a_prompt(capsys, tmp_path, gpt2_dir):
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(gpt2_dir / name, bare / name)
    code, out, err = run_cli(capsys, "verify", "--hf", str(bare), "--tokens", "1,2,3", "--max-order", "0", "--no-progress")
    assert code == 0, err
    assert "tokens:" not in out
    code, out, err = run_cli(capsys, "verify", "--hf", str(bare), "--text", "hi", "--no-progress")
    assert code == 2 and "cannot load the tokenizer of the Hugging Face model " in err


def test_verify_on_a_transformer_lens_model_by_name(capsys, monkeypatch, gpt2_dir):
    """``--tl NAME`` goes through TransformerLens' own ``from_pretrained``; here it returns a model built
    offline with the saved tokenizer, and the prompt is read with TransformerLens' ``to_tokens`` (BOS first)."""
    tl = pytest.importorskip("transformer_lens")
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gpt2_dir)
    asked = {}

    def from_pretrained(name, device=None, dtype=None):
        asked.update(name=name, device=device, dtype=dtype)
        cfg = tl.HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=32, d_head=4, n_heads=4, d_vocab=len(tokenizer),
                                         act_fn="gelu_new", normalization_type="LN", dtype=dtype, device=device, seed=1)
        model = tl.HookedTransformer(cfg)
        model.set_tokenizer(tokenizer)
        return model

    monkeypatch.setattr(tl.HookedTransformer, "from_pretrained", staticmethod(from_pretrained))
    code, out, err = run_cli(capsys, "verify", "--tl", "my-model", "--text", "The cat sat", "--max-order", "1", "--no-progress")
    assert code == 0, err
    assert asked == {"name": "my-model", "device": "cpu", "dtype": torch.float64}
    lines = out.splitlines()
    assert lines[1].startswith("converted from HookedTransformer (TransformerLens, float64): logits equal to the source within ")
    assert lines[2].startswith("tokens: 0 '<|endoftext|>' · 260 'The'")


def test_analyze_a_saved_hugging_face_folder(capsys, gpt2_dir, tmp_path):
    code, out, err = run_cli(capsys, "analyze", "--hf", str(gpt2_dir), "--out", str(tmp_path / "report"),
                             "--sequences", "4", "--formats", "svg")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"analysed {gpt2_dir.name} (Hugging Face) (2 layers x 4 heads, standard positions, layer norm")
    assert lines[1].startswith("  converted from GPT2LMHeadModel (Hugging Face, float32): logits equal to the source within ")
    page = (tmp_path / "report" / "index.html").read_text(encoding="utf-8")
    assert "<p>converted from GPT2LMHeadModel (Hugging Face, float32): logits equal to the source within " in page
    assert "converted from GPT2LMHeadModel" in (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert json.loads((tmp_path / "report" / "analysis.json").read_text())["source"]["source"].startswith("GPT2LMHeadModel")
    code, out, err = run_cli(capsys, "analyze", "m.safetensors", "--hf", str(gpt2_dir), "--out", str(tmp_path / "r2"))
    assert code == 2 and "give one model: --hf and --checkpoint both name one" in err


def test_attribute_on_a_saved_hugging_face_folder_with_a_text_prompt(capsys, gpt2_dir, tmp_path):
    code, out, err = run_cli(capsys, "attribute", "--hf", str(gpt2_dir), "--text", "The capital of France is",
                             "--target", " the", "--top", "5")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "attribution of logit[263 ' the'] at position 8 (token 284 ' is')"
    assert lines[2].startswith("converted from GPT2LMHeadModel (Hugging Face, float64): logits equal to the source within ")
    assert "PASSED" in out
    code, out, err = run_cli(capsys, "attribute", "--hf", str(gpt2_dir), "--text", "When Mary and John went to the store",
                             "--logit-diff", " Mary", " John", "--max-order", "1", "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["source"].startswith("converted from GPT2LMHeadModel") and result["target"]["ids"] == [293, 292] and result["target"]["texts"] == [" Mary", " John"]
    code, out, err = run_cli(capsys, "attribute", "--hf", str(gpt2_dir), "--text", "The cat", "--target", " Paris")
    assert code == 2 and "target ' Paris' is 3 tokens for this tokenizer ([221, 297, 266]); expected exactly one" in err
