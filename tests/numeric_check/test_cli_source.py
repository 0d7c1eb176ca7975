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
                             "--max-order", "1", "--quiet")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].startswith("converted from GPT2LMHeadModel (Hugging Face, float64): logits equal to the source within ")
    assert lines[2].startswith("tokens: ") and "'The'" in lines[2] and "' sat'" in lines[2]
    assert "PASSED" in out and "tok→L0H0" in out


def test_verify_on_a_llama_folder_reads_its_prompt_file_and_checks_a_head(capsys, llama_dir, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("When Mary and John went to the store", encoding="utf-8")
    code, out, err = run_cli(capsys, "verify", "--hf", str(llama_dir), "--text-file", str(prompt), "--qk", "1", "2",
                             "--max-order", "1", "--format", "json", "--quiet")
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
    code, out, err = run_cli(capsys, "verify", *[a.replace("{dir}", str(gpt2_dir)) for a in argv], "--quiet")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_a_folder_without_a_tokenizer_runs_on_ids_and_refuses_a_prompt(capsys, tmp_path, gpt2_dir):
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(gpt2_dir / name, bare / name)
    code, out, err = run_cli(capsys, "verify", "--hf", str(bare), "--tokens", "1,2,3", "--max-order", "0", "--quiet")
    assert code == 0, err
    assert "tokens:" not in out
    code, out, err = run_cli(capsys, "verify", "--hf", str(bare), "--text", "hi", "--quiet")
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
    from numeric_check.conversion import load

    monkeypatch.setattr(load, "hub_reachable", lambda timeout=0: True)  # from_pretrained above stands in for the hub
    code, out, err = run_cli(capsys, "verify", "--tl", "my-model", "--text", "The cat sat", "--max-order", "1", "--quiet")
    assert code == 0, err
    assert asked == {"name": "my-model", "device": "cpu", "dtype": torch.float64}
    lines = out.splitlines()
    assert lines[1].startswith("converted from HookedTransformer (TransformerLens, float64): logits equal to the source within ")
    assert lines[2].startswith("tokens: 0 '<|endoftext|>' · 260 'The'")


def test_analyze_a_saved_hugging_face_folder(capsys, gpt2_dir, tmp_path):
    code, out, err = run_cli(capsys, "analyze", "--hf", str(gpt2_dir), "--out", str(tmp_path / "report"),
                             "--sequences", "4", "--figure-formats", "svg")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"analysed {gpt2_dir.name} (Hugging Face) (2 layers x 4 heads, standard positions, layer norm")
    assert lines[1].startswith("  converted from GPT2LMHeadModel (Hugging Face, float64): logits equal to the source within ")
    page = (tmp_path / "report" / "index.html").read_text(encoding="utf-8")
    assert "<p>converted from GPT2LMHeadModel (Hugging Face, float64): logits equal to the source within " in page
    assert "converted from GPT2LMHeadModel" in (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert json.loads((tmp_path / "report" / "analysis.json").read_text())["source"]["source"].startswith("GPT2LMHeadModel")
    code, out, err = run_cli(capsys, "analyze", "--checkpoint", "m.safetensors", "--hf", str(gpt2_dir), "--out", str(tmp_path / "r2"))
    assert code == 2 and "give one model: --hf and --checkpoint both name one" in err


def test_attribute_on_a_saved_hugging_face_folder_with_a_text_prompt(capsys, gpt2_dir, tmp_path):
    code, out, err = run_cli(capsys, "attribute", "--hf", str(gpt2_dir), "--text", "The capital of France is",
                             "--target", " the", "--max-terms", "5")
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


# -- a model folder is data (issue 29 item 1, issue 28 items 4 and 5) --------------------------

class NoStdin:
    """Standard input that fails the test if anything reads it (transformers' trust_remote_code question)."""

    def _read(self, *args):
        raise AssertionError("standard input was read")

    read = readline = readlines = _read

    def fileno(self):
        raise OSError("no standard input")

    def isatty(self):
        return True


def copy_folder(src, dst, **config):
    """A copy of the saved folder ``src`` at ``dst``, its config.json updated with ``config``."""
    import shutil

    shutil.copytree(src, dst)
    if config:
        path = dst / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}), encoding="utf-8")
    return dst


def edit_tensors(folder, edit):
    """``edit(tensors)`` applied to the folder's model.safetensors, which is saved again."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def one_line_error(code, out, err, *fragments):
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and err.startswith("tcircuits ") and "\x1b" not in err, err
    assert "Traceback" not in err and "LOAD REPORT" not in err, err
    for fragment in fragments:
        assert fragment in err, err


EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"


@pytest.mark.parametrize("model_type", ["evil", "gpt2"])
def test_a_folder_asking_for_its_own_code_is_refused_by_name_and_nothing_runs(capsys, monkeypatch, tmp_path, gpt2_dir,
                                                                              model_type):
    marker = tmp_path / "ran"
    folder = copy_folder(gpt2_dir, tmp_path / "remote", model_type=model_type, auto_map={
        "AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"})
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (folder / name).write_text(EVIL.format(marker=str(marker)), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", NoStdin())
    code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--text", "The cat", "--quiet")
    one_line_error(code, out, err, "config.json asks for code from the folder (auto_map: configuration_evil.EvilConfig, "
                   "modeling_evil.EvilModel); tcircuits runs no code from a model folder")
    assert not marker.exists()


def test_a_tokenizer_asking_for_its_own_code_is_refused(capsys, monkeypatch, tmp_path, gpt2_dir):
    marker = tmp_path / "ran"
    folder = copy_folder(gpt2_dir, tmp_path / "remote")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "tokenization_evil.py").write_text(EVIL.format(marker=str(marker)), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", NoStdin())
    code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--text", "The cat", "--quiet")
    one_line_error(code, out, err, "tokenizer_config.json asks for code from the folder (auto_map: "
                   "tokenization_evil.EvilTokenizer)")
    assert not marker.exists()


class Evil:
    """A pickle that would run a command when unpickled by a full unpickler."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("kind", ["state_dict", "bare", "legacy"])
def test_a_pickle_holding_more_than_tensors_is_refused_without_advice_to_unpickle_it(capsys, tmp_path, gpt2_dir, kind):
    import pickle

    import torch
    from safetensors.torch import load_file

    marker = tmp_path / "ran"
    folder = copy_folder(gpt2_dir, tmp_path / "pickle")
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    if kind == "bare":
        (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Evil(marker)))
    else:
        torch.save({**tensors, "x": Evil(marker)}, folder / "pytorch_model.bin",
                   _use_new_zipfile_serialization=kind == "state_dict")
    code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--tokens", "1,2", "--quiet")
    one_line_error(code, out, err, "pytorch_model.bin is not a file of tensors", "tcircuits reads weights only")
    assert "weights_only" not in err and "False" not in err and "arbitrary code" not in err
    assert not marker.exists()


def test_a_weights_only_pickle_is_read(capsys, tmp_path, gpt2_dir):
    import torch
    from safetensors.torch import load_file

    folder = copy_folder(gpt2_dir, tmp_path / "pickle")
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--text", "The cat", "--max-order", "0", "--quiet")
    assert code == 0 and "PASSED" in out, err


@pytest.mark.parametrize("layers, fragment", [
    (10**6, "config.json says 1,000,000 layers (n_layer) but model.safetensors holds 2 (transformer.h.0 … transformer.h.1)"),
    (3, "config.json says 3 layers (n_layer) but model.safetensors holds 2"),
    (1, "tensors not used by the model but stored in model.safetensors (transformer.h.1."),
])
def test_a_layer_count_the_weights_do_not_hold_is_refused_before_a_layer_is_built(capsys, tmp_path, gpt2_dir, layers,
                                                                                 fragment):
    from tests.helpers import quickly

    folder = copy_folder(gpt2_dir, tmp_path / "layers", n_layer=layers)
    with quickly(20):
        code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--tokens", "1,2", "--quiet")
    one_line_error(code, out, err, fragment)


@pytest.mark.parametrize("edit, config, fragment", [
    (lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"), {},
     "2 tensors missing from model.safetensors (transformer.h.0.attn.c_attn.weight, transformer.h.1.mlp.c_fc.bias)"),
    (lambda t: t.__setitem__("transformer.h.0.attn.extra", __import__("torch").zeros(3)), {},
     "1 tensor not used by the model but stored in model.safetensors (transformer.h.0.attn.extra)"),
    (lambda t: t.__setitem__("transformer.h.0.attn.c_attn.weight", __import__("torch").zeros(16, 40)), {},
     "model.safetensors holds tensors of other shapes than config.json gives: transformer.h.0.attn.c_attn.weight "
     "[16, 40] (config: [16, 48])"),
    (None, {"vocab_size": 10**12}, "transformer.wte.weight [300, 16] (config: [1000000000000, 16])"),
])
def test_tensors_missing_unused_or_reshaped_are_listed_before_any_conversion(capsys, monkeypatch, tmp_path, gpt2_dir,
                                                                             edit, config, fragment):
    from numeric_check.conversion import hf

    folder = copy_folder(gpt2_dir, tmp_path / "edited", **config)
    if edit is not None:
        edit_tensors(folder, lambda t: (t.pop("transformer.h.0.attn.c_attn.weight") if "missing" in fragment else None,
                                        edit(t)))
    monkeypatch.setattr(hf, "from_hf", lambda *a, **k: pytest.fail("converted"))
    code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--tokens", "1,2", "--quiet")
    one_line_error(code, out, err, fragment)


def test_a_model_larger_than_the_memory_is_refused_before_it_is_built(capsys, monkeypatch, gpt2_dir):
    from numeric_check.conversion import load

    monkeypatch.setattr(load, "available_memory", lambda: 4096)
    code, out, err = run_cli(capsys, "verify", "--hf", str(gpt2_dir), "--tokens", "1,2", "--quiet")
    one_line_error(code, out, err, "the model config.json describes needs 0.1 MiB as float64, more than the 0.0 MiB of "
                   "memory available")


def test_an_offline_hub_name_fails_at_once_naming_the_cache(capsys, monkeypatch, tmp_path):
    from huggingface_hub import constants

    from numeric_check.conversion import load
    from tests.helpers import quickly

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(load, "hub_reachable", lambda timeout=0: False)
    monkeypatch.chdir(tmp_path)
    with quickly(5):
        code, out, err = run_cli(capsys, "verify", "--hf", "gpt2", "--text", "hi", "--quiet")
    one_line_error(code, out, err, f"'gpt2' is not in the Hugging Face cache ({tmp_path / 'hub'}) and huggingface.co "
                   "cannot be reached")
    assert constants.HF_HUB_OFFLINE is False  # as it was


def test_an_offline_hub_name_is_read_from_the_cache(capsys, monkeypatch, tmp_path, gpt2_dir):
    import shutil

    from huggingface_hub import constants

    from numeric_check.conversion import load

    repo = tmp_path / "hub" / "models--someone--tiny-gpt2"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(gpt2_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(load, "hub_reachable", lambda timeout=0: False)
    code, out, err = run_cli(capsys, "verify", "--hf", "someone/tiny-gpt2", "--text", "The cat", "--max-order", "0",
                             "--quiet")
    assert code == 0 and "PASSED" in out, err


def test_the_hub_is_offline_at_once_with_hf_hub_offline(monkeypatch):
    from huggingface_hub import constants

    from numeric_check.conversion.load import hub_reachable

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub_reachable() is False


def test_an_offline_transformer_lens_name_fails_at_once_naming_the_cache(capsys, monkeypatch, tmp_path):
    pytest.importorskip("transformer_lens")
    from huggingface_hub import constants

    from numeric_check.conversion import load

    (tmp_path / "hub" / "models--someone--other").mkdir(parents=True)  # a cache, without gpt2: TransformerLens looks
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(load, "hub_reachable", lambda timeout=0: False)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "verify", "--tl", "gpt2", "--text", "hi", "--quiet")
    one_line_error(code, out, err, "cannot load the TransformerLens model: 'gpt2' is not in the Hugging Face cache")


@pytest.mark.parametrize("argv, fragment", [
    (["--hf", "{dir}/config.json"], "it is a file; give the folder saved with save_pretrained"),
    (["--hf", "./no-such-folder"], "there is no such folder"),
    (["--hf", "{dir}", "--revision", "main"], "it is a folder, and --revision picks a version of a model on the hub"),
])
def test_a_path_that_is_no_model_folder_is_one_line(capsys, gpt2_dir, argv, fragment):
    code, out, err = run_cli(capsys, "verify", *[a.replace("{dir}", str(gpt2_dir)) for a in argv], "--quiet")
    one_line_error(code, out, err, fragment)


def test_a_missing_tokenizer_says_what_to_save_install_or_pass(capsys, monkeypatch, tmp_path, gpt2_dir):
    import importlib.util

    folder = copy_folder(gpt2_dir, tmp_path / "bare")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--text", "hi", "--quiet")
    one_line_error(code, out, err, "the folder holds no tokenizer", "tokenizer.save_pretrained", "--tokens")
    (folder / "tokenizer.model").write_bytes(b"\x00")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sentencepiece" else real(name, *a))
    code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--text", "hi", "--quiet")
    one_line_error(code, out, err, "the tokenizer is tokenizer.model, which needs sentencepiece: pip install sentencepiece")


# -- prompts and tokenizers (issue 29 item 4) ---------------------------------------------------

@pytest.mark.parametrize("command, argv, fragment", [
    ("verify", ["--text", "a\udcffb"], "--text is not valid UTF-8: the byte 0xff at character 1"),
    ("attribute", ["--text", "The cat", "--target", "\udcff"], "--target is not valid UTF-8: the byte 0xff at character 0"),
    ("attribute", ["--text", "The cat", "--logit-diff", " the", "x\udc80"], "--logit-diff is not valid UTF-8: the byte 0x80"),
])
def test_a_prompt_or_target_that_is_not_utf8_is_one_line(capsys, gpt2_dir, command, argv, fragment):
    code, out, err = run_cli(capsys, command, "--hf", str(gpt2_dir), *argv)
    one_line_error(code, out, err, fragment)


def test_a_prompt_file_that_is_not_utf8_is_one_line(capsys, gpt2_dir, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(b"a\xffb")
    code, out, err = run_cli(capsys, "verify", "--hf", str(gpt2_dir), "--text-file", str(prompt), "--quiet")
    one_line_error(code, out, err, "is not UTF-8 text (byte 1")


@pytest.fixture(scope="module")
def panicking_dir(tmp_path_factory, gpt2_dir):
    """The GPT-2 folder with a tokenizer whose pre-tokenizer splits on ``(a+)+$`` (a Rust panic on ``aaa…a!``)."""
    import shutil

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("panic") / "model"
    shutil.copytree(gpt2_dir, folder)
    tok = Tokenizer(models.WordLevel({"a": 0, "!": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(a+)+$"), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("command, argv", [
    ("verify", ["--text", "a" * 40 + "!", "--quiet"]),
    ("attribute", ["--text", "a!", "--target", "a" * 40 + "!"]),
])
def test_a_tokenizer_that_panics_is_one_line(capsys, panicking_dir, command, argv):
    from tests.helpers import quickly

    with quickly(30):
        code, out, err = run_cli(capsys, command, "--hf", str(panicking_dir), *argv)
    one_line_error(code, out, err, "failed: PanicException: Onig: Regex search error: retry-limit-in-match over")
    assert ("the tokenizer on the prompt (41 characters) failed" if command == "verify" else "the tokenizer on 'aaaa") in err
    assert "panicked at" not in err


def test_a_call_that_runs_away_is_stopped_within_its_bound():
    import time

    from numeric_check.cli.source import bounded
    from numeric_check.errors import ModelLoadError
    from tests.helpers import quickly

    with quickly(5), pytest.raises(ModelLoadError, match=r"^the tokenizer on the prompt did not finish within 0.5 s: the "
                                                         r"tokenizer runs away on this input, or it is far longer"):
        bounded(lambda: time.sleep(60), "the tokenizer on the prompt", seconds=0.5)
    assert bounded(lambda: [1, 2, 3], "x") == [1, 2, 3]


@pytest.mark.parametrize("command, argv, fragment", [
    ("attribute", ["--text", "The cat", "--target", " Paris"],
     "target ' Paris' is 3 tokens for this tokenizer ([221, 297, 266]); expected exactly one"),
    ("attribute", ["--text", "The cat", "--target", " the", "--position", "40"],
     "position must be an int in -3..2 (the prompt has 3 tokens), got 40"),
    ("attribute", ["--text", "The cat", "--logit-diff", " the", "999"], "logit_diff B 999 is outside the vocabulary 0..299"),
    ("verify", ["--text", "The cat sat on the mat. " * 20, "--quiet"], "more than the model's context n_ctx=32"),
    ("verify", ["--tokens", "1,2", "--qk", "5", "0", "--quiet"], "layer 5 does not exist: the model has layers 0..1"),
    ("verify", ["--text", "The cat", "--qk", "1", "9", "--quiet"], "head 9 does not exist in layer 1: it has heads 0..3"),
])
def test_bad_arguments_are_reported_before_the_weights_are_read(capsys, monkeypatch, gpt2_dir, command, argv, fragment):
    from numeric_check.conversion import load

    monkeypatch.setattr(load, "load_model", lambda *a, **k: pytest.fail("the weights were read first"))
    code, out, err = run_cli(capsys, command, "--hf", str(gpt2_dir), *argv)
    one_line_error(code, out, err, fragment)


def test_the_prompt_is_tokenized_without_a_warning_in_a_threaded_process(capsys, monkeypatch, gpt2_dir):
    """Python 3.12 warns when a process with threads forks (one with CUDA started, on a GPU machine, has
    them): the tokenizer's bounded child is forked so, and the command still says one line (found on an H100)."""
    import os
    import warnings

    fork = os.fork

    def threaded_fork():
        warnings.warn(f"This process (pid={os.getpid()}) is multi-threaded, use of fork() may lead to deadlocks in "
                      "the child.", DeprecationWarning, stacklevel=2)
        return fork()

    monkeypatch.setattr(os, "fork", threaded_fork)
    code, out, err = run_cli(capsys, "attribute", "--hf", str(gpt2_dir), "--text", "The cat", "--target", " the",
                             "--position", "40")
    one_line_error(code, out, err, "position must be an int in -3..2")


def test_transformers_tables_and_escapes_become_one_line():
    from numeric_check.conversion.load import one_line

    report = ("\x1b[1mLOAD REPORT\x1b[0m from: /m\n|Key | Status|\n|----+-------|\n"
              "|transformer.wte.weight | \x1b[31mMISMATCH\x1b[0m|\n\nNotes:\n- MISMATCH:\tckpt weights were loaded")
    assert one_line(report) == "LOAD REPORT from: /m Key Status transformer.wte.weight MISMATCH Notes: - MISMATCH: ckpt weights were loaded"
    assert one_line("x" * 400, 50) == "x" * 49 + "…"


def test_analyze_shows_what_it_is_loading_on_a_terminal(capsys, monkeypatch, gpt2_dir, tmp_path):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    monkeypatch.setenv("COLUMNS", "400")
    code, out, err = run_cli(capsys, "analyze", "--hf", str(gpt2_dir), "--out", str(tmp_path / "report"),
                             "--sequences", "4", "--figure-formats", "svg")
    assert code == 0, screen.getvalue()
    shown = screen.getvalue()
    assert f"tcircuits: loading the Hugging Face model {str(gpt2_dir)!r} …" in shown
    assert "checking it against the source …" in shown and "\n" not in shown.split("against the source …")[0]
    assert shown.split("against the source …")[1].startswith("\r\x1b[K")  # the line is cleared before the analysis


def test_an_offline_transformer_lens_name_with_an_empty_cache_fails_before_transformer_lens_is_imported(
        capsys, monkeypatch, tmp_path):
    import sys

    from huggingface_hub import constants

    from numeric_check.conversion import load

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(load, "hub_reachable", lambda timeout=0: False)
    monkeypatch.setitem(sys.modules, "transformer_lens", None)  # importing it would fail the run with an ImportError
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object())
    code, out, err = run_cli(capsys, "verify", "--tl", "gpt2-small", "--text", "hi", "--quiet")
    one_line_error(code, out, err, "cannot load the TransformerLens model: 'gpt2-small' is not in the Hugging Face cache")


def test_a_hub_name_online_is_downloaded_as_data_safetensors_first(capsys, monkeypatch, gpt2_dir):
    import huggingface_hub

    from numeric_check.conversion import load

    asked = []

    def snapshot_download(name, revision=None, allow_patterns=None, local_files_only=False):
        asked.append((name, revision, tuple(allow_patterns or ()), local_files_only))
        return str(gpt2_dir)

    monkeypatch.setattr(load, "hub_reachable", lambda timeout=0: True)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    code, out, err = run_cli(capsys, "verify", "--hf", "someone/tiny-gpt2", "--revision", "v1", "--text", "The cat",
                             "--max-order", "0", "--quiet")
    assert code == 0 and "PASSED" in out, err
    assert asked == [("someone/tiny-gpt2", "v1", ("*.json", "*.txt", "*.model", "*.tiktoken", "*.safetensors"), False)]


def _one_setting_per_family():
    from tests.hf_zoo import CONVERTS

    seen = {}
    for model_type, options in CONVERTS:
        seen.setdefault(model_type, options)
    return sorted(seen.items())


@pytest.mark.parametrize("model_type, options", _one_setting_per_family(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_family_saved_with_save_pretrained_loads_as_data(tmp_path, model_type, options):
    """No family is refused by the folder checks (layers, shapes, memory, loading info) when its folder is
    what save_pretrained wrote: the checks refuse what differs from the config, not what is unusual."""
    import torch

    from numeric_check.conversion.load import load_model
    from tests.hf_zoo import build

    source = build(model_type, 0, exact=False, **options)
    source.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, torch.float64)
    assert type(loaded) is type(source)
    saved = source.state_dict()
    for name, tensor in loaded.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name].to(tensor.dtype)), name


def _lying_header(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes((10**12).to_bytes(8, "little") + data[8:])


def _sharded(folder, weight_map, metadata=True):
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    index = {"weight_map": weight_map, **({"metadata": {}} if metadata else {})}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")


@pytest.mark.parametrize("spoil, fragment", [
    (_lying_header, "model.safetensors is not a safetensors file (its header length 1,000,000,000,000 does not fit"),
    (lambda f: (f / "model.safetensors").write_bytes(b"\x01"), "model.safetensors is not a safetensors file"),
    (lambda f: (f / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"[]"), "its header is not a JSON object"),
    (lambda f: _sharded(f, {"transformer.wte.weight": "../../etc/passwd"}),
     "model.safetensors.index.json names the shard '../../etc/passwd', which is not a file of the folder"),
    (lambda f: _sharded(f, ["x"]), "model.safetensors.index.json must map each tensor name to a shard file"),
    (lambda f: _sharded(f, {"transformer.wte.weight": "model-00001-of-00001.safetensors"}, metadata=False),
     "cannot load the weights: KeyError 'metadata'"),
    (lambda f: (f / "model.safetensors").unlink(), "the folder holds no weights: expected model.safetensors"),
    (lambda f: (f / "config.json").write_text("[1, 2]"), "config.json must hold a JSON object, not a list"),
    (lambda f: (f / "config.json").write_text("{" * 100_000), "config.json is not usable JSON"),
    (lambda f: (f / "config.json").unlink(), "the folder holds no config.json"),
    (lambda f: (f / "config.json").write_text('{"model_type": "no-such-type"}'),
     "config.json gives the model type 'no-such-type', which transformers"),
])
def test_a_folder_whose_files_lie_is_one_line(capsys, tmp_path, gpt2_dir, spoil, fragment):
    folder = copy_folder(gpt2_dir, tmp_path / "spoilt")
    spoil(folder)
    code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--tokens", "1,2", "--quiet")
    one_line_error(code, out, err, fragment)


@pytest.mark.parametrize("argv", [("--text", "The cat"), ("--tokens", "1,2")])
@pytest.mark.parametrize("config, fragment", [
    ({"num_key_value_heads": 2.5}, "Field 'num_key_value_heads' with value 2.5"),  # a strict field (Mixtral's too)
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "Missing required keys in `rope_parameters`"),  # (Phi-3's)
])
def test_a_config_its_class_refuses_is_a_config_error_not_the_tokenizers(capsys, tmp_path, llama_dir, argv, config,
                                                                          fragment):
    """transformers 5 validates config.json when the tokenizer reads it too: the error names config.json and
    what to do, not the tokenizer (issue 47)."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("transformers 4 does not validate a config's fields")
    folder = copy_folder(llama_dir, tmp_path / "invalid", **config)
    code, out, err = run_cli(capsys, "verify", "--hf", str(folder), *argv, "--quiet")
    one_line_error(code, out, err, "config.json is not a valid llama config for transformers ", fragment,
                   "correct that field in config.json, or save the model again with save_pretrained")
    assert "tokenizer" not in err


def test_a_sharded_folder_loads(capsys, tmp_path, gpt2_dir):
    from safetensors import safe_open

    folder = copy_folder(gpt2_dir, tmp_path / "sharded")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    _sharded(folder, {name: "model-00001-of-00001.safetensors" for name in names})
    code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--text", "The cat", "--max-order", "0", "--quiet")
    assert code == 0 and "PASSED" in out, err


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_every_dtype_is_checked_in_float64_and_a_model_one_percent_off_is_refused(capsys, monkeypatch, llama_dir, dtype):
    from numeric_check.conversion import load

    code, out, err = run_cli(capsys, "verify", "--hf", str(llama_dir), "--tokens", "1,2,3", "--max-order", "1",
                             "--dtype", dtype, "--quiet")
    assert code == 0, out  # an exact model passes at every dtype (the tolerances follow the measured rounding)
    source = out.splitlines()[1]
    assert float(source.split("(tolerance ")[1].split(")")[0]) < 1e-4, source  # float64's (Hugging Face's float32 steps)
    if dtype != "float64":
        assert f"checked in float64, the conversion run in {dtype} differs from it by " in source
    loaded = load.load_model

    def off_by_one_percent(folder, dtype):
        model = loaded(folder, dtype)
        model.model.layers[0].mlp.register_forward_hook(lambda module, inputs, output: output * 1.01)
        return model

    monkeypatch.setattr(load, "load_model", off_by_one_percent)
    code, out, err = run_cli(capsys, "verify", "--hf", str(llama_dir), "--tokens", "1,2,3", "--dtype", dtype, "--quiet")
    one_line_error(code, out, err, "error: from_hf: the logits differ from LlamaForCausalLM's by ", "over the tolerance")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_tampered_model_is_refused_in_200_characters_and_explained_under_explain(capsys, monkeypatch, request, family):
    """Issue 47: the refusal is one line of at most 200 characters, CLI prefix included (both figures, the first block
    that differs, what to do); --explain prints the diagnosis after it, a line each, and nothing else changes."""
    from numeric_check.conversion import load

    folder, loaded = request.getfixturevalue(f"{family}_dir"), load.load_model
    capsys.readouterr()  # what saving the folder printed

    def tampered(folder, dtype):
        model = loaded(folder, dtype)
        blocks = model.model.layers if family == "llama" else model.transformer.h
        blocks[0].mlp.register_forward_hook(lambda module, inputs, output: output * 1.01)
        return model

    monkeypatch.setattr(load, "load_model", tampered)
    args = ("verify", "--hf", str(folder), "--tokens", "1,2,3", "--quiet")
    code, out, err = run_cli(capsys, *args)
    one_line_error(code, out, err, "tcircuits verify: error: from_hf: the logits differ from ", " of the largest, over the "
                   "tolerance ", "; block 0 differs first; --explain says why")
    assert len(err.rstrip("\n")) <= 200, (len(err), err)
    code, out, explained = run_cli(capsys, *args, "--explain")
    first, *detail = explained.splitlines()
    assert code == 2 and out == "" and first == err.rstrip("\n"), explained
    assert len(detail) == 4 and all(line.startswith("  ") for line in detail), explained
    assert detail[0].startswith("  the converted model's logits differ from the source's (") and " tokens" in detail[0]
    assert detail[1].startswith("  the residual streams agree at the input of block 0 and part at the input of block 1")
    assert "changed since it was built" in detail[2], explained
    assert detail[3].startswith("  what runs in it: a forward hook on "), explained  # issue 54: the hook is named


@pytest.mark.parametrize("command", ["verify", "attribute", "analyze", "attention", "paper"])
def test_every_command_that_converts_a_model_offers_explain(capsys, command):
    code, out, err = run_cli(capsys, command, "--help")
    assert code == 0 and "--explain" in out, out


def test_a_half_precision_folder_too_large_to_copy_is_refused_unless_its_precision_is_accepted(capsys, monkeypatch,
                                                                                                 llama_dir):
    """--dtype bfloat16 loads the source in bfloat16; one whose float64 and float32 copies would pass MEASURE_BYTES
    (lowered here) is refused in one line saying what to do; --accept-source-precision compares it as held, and the
    report's source line says at what precision (issue 47)."""
    from numeric_check.conversion import source_check

    monkeypatch.setattr(source_check, "MEASURE_BYTES", 1000)
    args = ("verify", "--hf", str(llama_dir), "--tokens", "1,2,3", "--max-order", "1", "--dtype", "bfloat16", "--quiet")
    code, out, err = run_cli(capsys, *args)
    one_line_error(code, out, err, "LlamaForCausalLM is held in bfloat16 and its float64 and float32 copies would pass "
                   "9.31e-07 GiB", "Load it in float32", "--accept-source-precision")
    code, out, err = run_cli(capsys, *args, "--accept-source-precision")
    assert code in (0, 1), err
    source = out.splitlines()[1]
    assert source.startswith("converted from LlamaForCausalLM (Hugging Face, bfloat16, compared at its own precision "
                             "bfloat16, as accepted: its float64 and float32 copies would pass 9.31e-07 GiB): logits "
                             "equal to the source within "), source
    assert float(source.split("(tolerance ")[1].split(")")[0]) > 1e-3, source  # bfloat16's, and the line shows it
    tolerance = source.split("(tolerance ")[1].split(")")[0]
    assert (f"; compared at bfloat16 as accepted: a conversion off by up to the tolerance {tolerance} of the largest "
            "logit would pass too, a tamper of that size included") in source, source  # issue 54: said, not blamed


def test_attention_prints_the_source_check_in_words_on_the_terminal_and_the_page(capsys, tmp_path, llama_dir):
    """Issue 54: the page held the check's dataclass repr (``SourceCheck(source=...``), the terminal nothing."""
    page = tmp_path / "att.html"
    code, out, err = run_cli(capsys, "attention", "--hf", str(llama_dir), "--tokens", "1,2,3", "-o", str(page))
    assert code == 0, err
    wrote, source = out.splitlines()
    assert wrote.startswith(f"wrote {page}: ") and source.startswith("converted from LlamaForCausalLM (Hugging Face, "
                                                                      "float64): logits equal to the source within "), out
    html = page.read_text(encoding="utf-8")
    assert "SourceCheck(" not in html and "converted from LlamaForCausalLM (Hugging Face, float64)" in html


@pytest.mark.parametrize("name", ["BertForMaskedLM", "T5ForConditionalGeneration", "LlavaForConditionalGeneration",
                                  "Gemma3ForConditionalGeneration"])
def test_a_folder_that_is_not_a_decoder_is_refused_in_one_short_line_before_its_weights_are_read(capsys, monkeypatch,
                                                                                                 tmp_path, gpt2_dir, name):
    from numeric_check.conversion import load
    from tests.numeric_check.test_from_hf import NOT_A_DECODER, not_decoders

    not_decoders()[name]().save_pretrained(tmp_path)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / file).write_bytes((gpt2_dir / file).read_bytes())
    monkeypatch.setattr(load, "check_built_model", lambda *a: pytest.fail("built"))
    capsys.readouterr()  # save_pretrained's progress
    code, out, err = run_cli(capsys, "verify", "--hf", str(tmp_path), "--tokens", "1,2", "--quiet")
    assert code == 2 and out == ""
    assert err.strip() == f"tcircuits verify: error: {name} {NOT_A_DECODER[name]}" and len(err.strip()) <= 200


# -- round 5 (issue 38): layers that hold data, config keys in linear time, decoding bounded -------


def test_layers_of_empty_tensors_do_not_pass_the_layer_count(capsys, tmp_path, gpt2_dir):
    """``n_layer=20000`` beside 20,000 empty ``transformer.h.{i}.attn.bias`` tensors (issue 38: the build
    ran past 120 s): a layer counts where its tensors hold data, so it is one line at once."""
    import torch

    from tests.helpers import quickly

    folder = copy_folder(gpt2_dir, tmp_path / "empty", n_layer=20_000)
    edit_tensors(folder, lambda t: t.update({f"transformer.h.{i}.attn.bias": torch.zeros(0) for i in range(20_000)}))
    with quickly(60):
        code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--tokens", "1,2", "--quiet")
    one_line_error(code, out, err, "config.json says 20,000 layers (n_layer) but model.safetensors holds 2")


@pytest.mark.parametrize("keys, refused", [(999, None), (1001, "sets 1,001 keys its class does not define, more than the 1,000"),
                                           (300_000, "config.json holds 300,0")])
def test_unknown_config_keys_are_matched_in_linear_time_and_counted(capsys, tmp_path, gpt2_dir, keys, refused):
    """Keys no code of the model names are ignored as before, each a set lookup (2,000 keys took 58 s,
    each a regular-expression search of the source); more than a thousand is refused by count, and a
    config of 300,000 keys (under the 10 MB bound) before transformers reads it."""
    from tests.helpers import quickly

    folder = copy_folder(gpt2_dir, tmp_path / "keys", **{f"zz_unknown_{i}": i for i in range(keys)})
    with quickly(120):
        code, out, err = run_cli(capsys, "verify", "--hf", str(folder), "--tokens", "1,2", "--quiet")
    if refused:
        one_line_error(code, out, err, refused)
    else:
        assert code == 0, err


@pytest.fixture(scope="module")
def decoder_bomb_dir(tmp_path_factory, gpt2_dir):
    """The GPT-2 folder with a tokenizer whose decoder replaces ``(a+)+$`` (a Rust panic on ``aaa…a!``)."""
    import shutil

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("decoder") / "model"
    shutil.copytree(gpt2_dir, folder)
    vocab = {"a" * 40 + "!": 0, "!": 1, "[UNK]": 2, **{f"t{i}": i for i in range(3, 300)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.Replace(Regex("(a+)+$"), "x")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink(missing_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("command, argv", [
    ("verify", ["--tokens", "0,1,2", "--quiet"]),
    ("attribute", ["--tokens", "0,1,2", "--target", "1"]),
])
def test_a_decoder_that_runs_away_is_one_line(capsys, decoder_bomb_dir, command, argv):
    """Decoding is bounded as encoding is: a decoder whose regular expression panics (or never ends)
    runs in a child within a bound and is one line, status 2."""
    from tests.helpers import quickly

    with quickly(60):
        code, out, err = run_cli(capsys, command, "--hf", str(decoder_bomb_dir), *argv)
    one_line_error(code, out, err, "the tokenizer's decoder on", "Regex search error")
    assert "panicked at" not in err
