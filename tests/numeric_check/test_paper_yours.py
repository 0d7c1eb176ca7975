"""``tcircuits paper`` on a model of one's own: the language page measured on a TransformerLens attention-only
model (random weights, the API ``--tl`` goes through) and on a checkpoint trained with ``train-toy --text``; a
model the companion cannot read (MLPs, more than two layers) refused in one line before its conversion."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.errors import InputFileError, UnsupportedModel
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.reports.paper.language import N_CTX, heldout_path
from numeric_check.reports.paper.your_model import check_sizes, first_layer, language_models, text_data
from numeric_check.training.text import train_tokenizer
from tests.helpers import run_cli

#: A slice of the shipped held-out text: enough words for a BPE of 512 tokens and for the page's windows.
TEXT_CHARS = 40_000


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "psalms.txt"
    path.write_text(heldout_path().read_text(encoding="utf-8")[:TEXT_CHARS], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bpe(text_file):
    return train_tokenizer(text_file.read_text(encoding="utf-8"), 512)


def fake_transformer_lens(monkeypatch, bpe, **config):
    """``HookedTransformer.from_pretrained`` answering with a random model of ``config`` that reads ``bpe``
    (what ``--tl NAME`` loads, built offline); returns what it was asked."""
    tl = pytest.importorskip("transformer_lens")
    transformers = pytest.importorskip("transformers")
    asked = {}

    def from_pretrained(name, device=None, dtype=None):
        asked.update(name=name)
        cfg = tl.HookedTransformerConfig(**{"d_model": 16, "n_ctx": N_CTX, "d_head": 8, "n_heads": 2, "d_vocab": 512,
                                            "attn_only": True, "normalization_type": "LN",
                                            "positional_embedding_type": "shortformer", **config},
                                         dtype=dtype, device=device, seed=1)
        model = tl.HookedTransformer(cfg)
        model.set_tokenizer(transformers.PreTrainedTokenizerFast(tokenizer_object=bpe))
        return model

    monkeypatch.setattr(tl.HookedTransformer, "from_pretrained", staticmethod(from_pretrained))
    from numeric_check.conversion import load

    monkeypatch.setattr(load, "hub_reachable", lambda timeout=0: True)  # from_pretrained above stands in for the hub
    return asked


@pytest.mark.slow
@pytest.mark.parametrize("n_layers, findings", [
    (1, ("language-copying", "language-skip-trigrams")),
    (2, ("language-term-importance", "language-induction")),
])
def test_the_companion_on_a_transformer_lens_attention_only_model(capsys, monkeypatch, tmp_path, bpe, text_file,
                                                                  n_layers, findings):
    torch.set_num_threads(1)
    asked = fake_transformer_lens(monkeypatch, bpe, n_layers=n_layers)
    name = f"attn-only-{n_layers}l"
    code, out, err = run_cli(capsys, "paper", "--tl", name, "--text-file", str(text_file), "--out", str(tmp_path / "site"),
                             "--quiet", "--device", "cpu")
    assert code == 0, err
    assert asked == {"name": name}
    lines = out.splitlines()
    assert lines[1] == (f"  the language page: {name} (TransformerLens) ({n_layers} layer{'s' if n_layers > 1 else ''} x "
                        f"2 heads, qk_only positions, layer norm, d_model 16, a vocabulary of 512 tokens), measured on "
                        f"{text_file} (" + lines[1].split(f"measured on {text_file} (")[1])
    assert lines[2].startswith("  converted from HookedTransformer (TransformerLens, float64): logits equal to the source")
    page = (tmp_path / "site" / "language.html").read_text(encoding="utf-8")
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert f"This page measures the paper&#39;s findings on {name} (TransformerLens)" in page
    assert "What your model shows" in page and "King James Bible, at the model" in page
    assert f"The language page measures {name} (TransformerLens)" in index and "psalms.txt" in index
    for key in findings:
        assert f'id="{key}"' in page, key
    others = {"language-bigrams", "language-copying", "language-term-importance"} - set(findings)
    assert not any(f'id="{key}"' in page for key in others)


@pytest.mark.slow
def test_the_companion_on_a_checkpoint_trained_on_text(capsys, tmp_path):
    from tests.numeric_check.test_text import small_text

    torch.set_num_threads(1)
    text_file = tmp_path / "corpus.txt"
    text_file.write_text(small_text(), encoding="utf-8")
    model = tmp_path / "m.safetensors"
    code, _, err = run_cli(capsys, "train-toy", "--text-file", str(text_file), "--layers", "2", "--heads", "2", "--d-model",
                           "16", "--d-head", "8", "--n-ctx", str(N_CTX), "--seg-min", "3", "--seg-max", "8",
                           "--batch-size", "4", "--steps", "6", "--d-vocab", "300", "--quiet", "--threads", "1", "--out",
                           str(model), "--snapshots", "3")
    assert code == 0, err
    code, out, err = run_cli(capsys, "paper", "--checkpoint", str(model), "--text-file", str(text_file), "--out", str(tmp_path / "site"),
                             "--quiet", "--device", "cpu")
    assert code == 0, err
    assert out.splitlines()[1].startswith(f"  the language page: {model} (2 layers x 2 heads")
    page = (tmp_path / "site" / "language.html").read_text(encoding="utf-8")
    assert 'id="language-induction"' in page and 'id="language-term-importance"' in page
    assert "Your model&#x27;s training" in page or "Your model's training" in page
    assert 'src="figures/training-loss.svg"' in page and (tmp_path / "site" / "figures" / "training-loss.svg").is_file()
    # issue 56: the formation chapter is the person's run, from the snapshots train-toy kept, not the shipped KJV run's
    formation = (tmp_path / "site" / "formation.html").read_text(encoding="utf-8")
    assert "m.safetensors snapshot by snapshot (measured from its history" in formation
    assert "kjv_2l.dynamics.json" not in formation and "kept no snapshots" not in formation


def _args(*argv: str) -> argparse.Namespace:
    from derivations.cli import build_parser

    return build_parser().parse_args(["paper", *argv, "--out", "unused"])


def test_a_checkpoint_without_text_is_measured_on_the_shipped_held_out_text(tmp_path, monkeypatch):
    from numeric_check.cli import paper

    bpe = train_tokenizer(heldout_path().read_text(encoding="utf-8")[:TEXT_CHARS], 300)
    model = CircuitModel.random(Architecture(0, 1), d_model=8, d_head=4, d_vocab=300, n_ctx=N_CTX, seed=0)
    monkeypatch.setattr(paper, "_checkpoint", lambda args: (model, bpe, "m.safetensors", None, "--checkpoint m"))
    found = paper.your_language(_args("--checkpoint", "m.safetensors"))
    assert found.data.name == "the held-out King James Bible (shipped)" and set(found.models) == {0}


@pytest.mark.slow
def test_a_hugging_face_model_is_refused_from_its_config_before_its_weights(capsys, monkeypatch, tmp_path, text_file):
    pytest.importorskip("transformers")
    from numeric_check.conversion import load
    from tests.helpers import saved_hf_model

    folder = saved_hf_model(tmp_path / "gpt2", "gpt2")
    capsys.readouterr()  # what saving it printed
    monkeypatch.setattr(load, "load_model", lambda *a, **k: pytest.fail("the weights were read"))
    code, out, err = run_cli(capsys, "paper", "--hf", str(folder), "--text-file", str(text_file), "--out", str(tmp_path / "s"))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "gpt2 (GPT2LMHeadModel, Hugging Face) has MLPs: the companion measures the paper's findings on " \
           "attention-only models of 0, 1 or 2 layers" in err
    assert f"the algebra (tcircuits derive, tcircuits expand) and the verification (tcircuits verify --hf {folder})" in err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("config, why", [({"attn_only": False, "d_mlp": 32, "act_fn": "gelu"}, "has MLPs"),
                                         ({"n_layers": 3}, "has 3 layers")])
def test_a_transformer_lens_model_it_cannot_read_is_refused_before_the_conversion(capsys, monkeypatch, tmp_path, bpe,
                                                                                   text_file, config, why):
    fake_transformer_lens(monkeypatch, bpe, **{"n_layers": 2, **config})
    from numeric_check.cli import source

    monkeypatch.setattr(source, "convert", lambda *a, **k: pytest.fail("converted"))
    code, out, err = run_cli(capsys, "paper", "--tl", "big", "--text-file", str(text_file), "--out", str(tmp_path / "s"),
                             "--device", "cpu")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"big (TransformerLens) {why}: the companion measures" in err and "(tcircuits verify --tl big)" in err


@pytest.mark.parametrize("argv, message", [
    (["--text-file", "notes.txt"], "--text-file is the text your model is measured on: give the model too"),
    (["--tl", "attn-only-2l"], "--tl needs --text-file FILE: the text the model is measured on"),
    (["--hf", "a", "--tl", "b", "--text-file", "t"], "give one model: --hf and --tl both name one"),
    (["--checkpoint", "numeric_check/data/induction_2l.safetensors"], "has no tokenizer beside it (induction_2l.tokenizer.json)"),
])
def test_bad_model_arguments_are_one_line(capsys, tmp_path, argv, message):
    code, out, err = run_cli(capsys, "paper", *argv, "--out", str(tmp_path / "s"))
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_the_induction_control_is_the_first_layer_alone():
    """The same model with its second layer removed: the same logits as the model with that layer's output zeroed."""
    model = CircuitModel.random(Architecture(2, 2, positional="qk_only", layer_norm=True), d_model=8, d_head=4,
                                d_vocab=10, n_ctx=6, seed=0)
    tokens = torch.tensor([[1, 2, 3, 4, 1, 2]])
    zeroed = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_attn_out", lambda x, hook: torch.zeros_like(x))])
    one = first_layer(model)
    assert one.arch.n_layers == 1 and one.arch.heads_per_layer == (2,)
    torch.testing.assert_close(one(tokens), zeroed)


def test_a_model_or_text_the_page_cannot_measure_is_one_line():
    short = CircuitModel.random(Architecture(1, 1), d_model=8, d_head=4, d_vocab=500, n_ctx=32, seed=0)
    with pytest.raises(UnsupportedModel, match=f"measures on windows of {N_CTX} tokens of the text, and s reads at most 32"):
        check_sizes(short, "s")
    check_sizes(CircuitModel.random(Architecture(2, 12), d_model=8, d_head=4, d_vocab=48_262, n_ctx=N_CTX, seed=0), "a")
    wide = CircuitModel.random(Architecture(2, 64), d_model=8, d_head=4, d_vocab=48_262, n_ctx=N_CTX, seed=0)
    held = rf"would hold [\d,]+ logits at once \(\d+ paths × {N_CTX} tokens × a vocabulary of 48,262\)"
    with pytest.raises(UnsupportedModel, match="term importance on w " + held):
        language_models(wide, None, "w")
    bpe = train_tokenizer(heldout_path().read_text(encoding="utf-8")[:TEXT_CHARS], 300)
    with pytest.raises(InputFileError, match=r"short.txt is \d+ tokens; the companion measures on windows"):
        text_data(bpe, "In the beginning God created the heaven and the earth.", "short.txt", 300)
    with pytest.raises(InputFileError, match="outside the model's vocabulary 0..99: the tokenizer is not the model's"):
        text_data(bpe, heldout_path().read_text(encoding="utf-8")[:5000], "t.txt", 100)


def test_a_short_text_trains_with_a_smaller_held_out_part_and_the_companion_measures_the_model(tmp_path, capsys):
    """A text of 674 lines (the GPL-3's length) is under the 2,000 lines of the usual split: it holds out every 20th
    block of 16 lines instead of refusing, the record says so, and the model's default context (128 with a text) is
    the one the companion measures on."""
    text = tmp_path / "short.txt"
    rng = __import__("random").Random(3)
    words = [f"w{i}" for i in range(400)]
    text.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(674)) + "\n")
    model = tmp_path / "short.safetensors"
    code, _, err = run_cli(capsys, "train-toy", "--text-file", str(text), "--layers", "1", "--heads", "2", "--d-model", "16",
                           "--d-head", "8", "--d-vocab", "300", "--steps", "3", "--batch-size", "2", "--quiet", "--snapshots", "0",
                           "-o", str(model))
    assert code == 0, err
    record = json.loads(model.with_suffix(".json").read_text())
    assert record["text"]["heldout"] == "every 20th block of 16 lines" and record["train_config"]["n_ctx"] == 128
    code, out, err = run_cli(capsys, "paper", "--checkpoint", str(model), "--text-file", str(text), "-o", str(tmp_path / "site"),
                             "--quiet")
    assert code == 0, err
    assert "short.safetensors (1 layer" in out and "its own training text" in out
    page = (tmp_path / "site" / "language.html").read_text(encoding="utf-8")
    assert "held-out" not in page.replace("held-out part", "") and "the training text" in page  # issue 45: not called held-out
    assert 'src="figures/training-loss.svg"' in page  # issue 56: the person's loss curve, from the training record
    formation = (tmp_path / "site" / "formation.html").read_text(encoding="utf-8")
    assert "short.safetensors kept no snapshots" in formation and "--snapshots 32" in formation  # and how to keep them


def test_bugs_are_counted_against_the_training_text_a_record_names(tmp_path, capsys):
    """On its held-out part, a one-layer model's "bugs" are combinations its training text never holds when that
    text is given (checked against the record's SHA-256); another file is refused in one line."""
    from numeric_check.training.text import split_text

    rng = __import__("random").Random(4)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(3, 5))) for _ in range(24)]  # whole words
    whole = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(2_400)) + "\n"
    (text := tmp_path / "notes.txt").write_text(whole)
    (held := tmp_path / "held.txt").write_text(split_text(whole)[1] + "\n")
    model = tmp_path / "m.safetensors"
    code, _, err = run_cli(capsys, "train-toy", "--text-file", str(text), "--layers", "1", "--heads", "2", "--d-model", "16",
                           "--d-head", "8", "--d-vocab", "300", "--steps", "2", "--batch-size", "2", "--quiet", "--snapshots", "0",
                           "-o", str(model))
    assert code == 0, err
    base = ("paper", "--checkpoint", str(model), "--text-file", str(held), "--quiet")
    code, out, err = run_cli(capsys, *base, "-o", str(tmp_path / "without"))
    assert code == 0, err
    assert "the held-out part of its training text" in out
    assert ">not given<" in (tmp_path / "without" / "language.html").read_text(encoding="utf-8")
    code, out, err = run_cli(capsys, *base, "--training-text-file", str(text), "-o", str(tmp_path / "with"))
    assert code == 0, err
    page = (tmp_path / "with" / "language.html").read_text(encoding="utf-8")
    assert ">not given<" not in page and "the training text never holds" in page
    code, _, err = run_cli(capsys, *base, "--training-text-file", str(held), "-o", str(tmp_path / "wrong"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is not the text" in err and "was trained on" in err
