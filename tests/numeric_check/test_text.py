"""Training on real text: reading and splitting the text, the BPE, the batches, the command line."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from numeric_check.errors import InputFileError, TrainConfigError
from numeric_check.training.config import TrainConfig, tokenizer_path
from numeric_check.training.text import (
    CheckpointTokenizer, TextData, induction_mask, read_texts, split_text, text_batch, train_tokenizer,
)
from tests.helpers import run_cli

WORDS = ("the", "lord", "said", "unto", "moses", "and", "israel", "went", "out", "of", "egypt", "into", "land")


def small_text(lines: int = 2100, seed: int = 0) -> str:
    """Lines of words drawn with a fixed generator: enough lines for the held-out split."""
    g = torch.Generator().manual_seed(seed)
    return "\n".join(" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (12,), generator=g).tolist())
                     for _ in range(lines)) + "\n"


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"  \n\n", "is empty"),
    (b"abc\0def", r"is binary \(it holds NUL bytes\)"),
    (b"\xff\xfe hello", r"is not UTF-8 text \(byte 0"),
    (b"\x01\x02\x03\x04 text" * 10, "looks binary"),
])
def test_bad_text_files_are_one_line_naming_the_file(tmp_path, content, message):
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=message) as err:
        read_texts([path])
    assert "t.txt" in str(err.value) and "\n" not in str(err.value)


def test_a_missing_file_and_no_files_are_refused(tmp_path):
    with pytest.raises(InputFileError, match="is not a file"):
        read_texts([tmp_path / "nope.txt"])
    with pytest.raises(InputFileError, match="no text files"):
        read_texts([])


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 5000), block=st.integers(1, 120), every=st.integers(2, 25))
def test_the_split_keeps_every_line_once_and_holds_out_every_nth_block(n, block, every):
    lines = [f"l{i}" for i in range(n)]
    train, held = split_text("\n".join(lines), block, every)
    train_lines, held_lines = (train.split("\n") if train else []), (held.split("\n") if held else [])
    assert sorted(train_lines + held_lines, key=lambda s: int(s[1:])) == lines
    assert all((int(s[1:]) // block) % every == every - 1 for s in held_lines)


def test_the_tokenizer_has_exactly_the_size_asked_and_is_deterministic():
    text = small_text(300)
    a, b = train_tokenizer(text, 300), train_tokenizer(text, 300)
    assert a.get_vocab_size() == 300 and a.to_str() == b.to_str()
    with pytest.raises(TrainConfigError, match="the text supports only .* lower --d-vocab to at most"):
        train_tokenizer(text, 5000)
    fitted = train_tokenizer(text, 5000, fit=True)  # what train-toy does when --d-vocab is not given
    assert 256 < fitted.get_vocab_size() < 5000 and fitted.to_str() == train_tokenizer(text, 5000, fit=True).to_str()
    with pytest.raises(TrainConfigError, match="at least 256 tokens"):
        train_tokenizer(text, 100)


def test_a_short_text_holds_out_less_and_a_tiny_one_none_and_says_so():
    data = TextData.build(small_text(500), 300, 16)
    assert data.split == "every 20th block of 12 lines" and 0 < len(data.heldout) < len(data.train) / 10
    tiny = TextData.build(small_text(15), 260, 4)
    assert tiny.split == "none: 15 lines are too few to hold out any; evaluated on the training text"
    assert torch.equal(tiny.heldout, tiny.train)


def test_text_data_refuses_a_text_too_short_to_fill_a_sequence():
    with pytest.raises(TrainConfigError, match=r"tokens \([\d,]+ characters\), fewer than the 10,001 of one sequence "
                                               r"\(--n-ctx 10000\): give more text \(at [\d.]+ characters a token"):
        TextData.build(small_text(2100), 300, 10_000)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), share=st.sampled_from([0.0, 0.5, 1.0]), seg=st.tuples(st.integers(2, 6), st.integers(6, 12)))
def test_text_batches_copy_a_span_of_themselves_and_mark_what_induction_predicts(seed, share, seg):
    ids = torch.randint(0, 50, (5000,), generator=torch.Generator().manual_seed(seed))
    batch = text_batch(ids, 32, 16, torch.Generator().manual_seed(seed), copy_share=share, seg_min=seg[0], seg_max=seg[1])
    assert batch.tokens.shape == (16, 33) and batch.repeat_mask.shape == (16, 33)
    copied = 0
    for b in range(16):
        src, start, n = batch.copies[b, 0].tolist()
        if start < 0:
            continue
        copied += 1
        assert seg[0] <= n <= seg[1] and src + n <= start and start + n <= 33
        assert torch.equal(batch.tokens[b, start:start + n], batch.tokens[b, src:src + n])
        assert batch.repeat_mask[b, start + 1:start + n].all()  # every copied token after the first
    assert (copied == 0) == (share == 0.0) or share == 0.5
    assert torch.equal(batch.repeat_mask, induction_mask(batch.tokens))


def test_the_induction_mask_is_the_pairs_seen_before():
    tokens = torch.tensor([[1, 2, 3, 1, 2, 3, 4, 2, 3]])
    assert induction_mask(tokens).int().tolist() == [[0, 0, 0, 0, 1, 1, 0, 0, 1]]


def test_the_config_of_a_run_on_text():
    config = TrainConfig(text_sha256="a" * 64, copy_share=0.5)
    assert config.on_text and config.bigram_successors == 0 and config.skip_trigrams == 0 and config.train_last_position
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert not TrainConfig().on_text and TrainConfig.from_dict({k: v for k, v in TrainConfig().to_dict().items()
                                                               if k not in ("text_sha256", "copy_share")}) == TrainConfig()
    with pytest.raises(TrainConfigError, match="64 hex digits"):
        TrainConfig(text_sha256="abc")
    with pytest.raises(TrainConfigError, match="copy_share applies to training on text"):
        TrainConfig(copy_share=0.5)
    with pytest.raises(TrainConfigError, match="copy_share must be a probability"):
        TrainConfig(text_sha256="a" * 64, copy_share=1.5)


TINY = ("--layers", "2", "--heads", "2", "--d-model", "16", "--d-head", "8", "--n-ctx", "32", "--seg-min", "3",
        "--seg-max", "8", "--batch-size", "4", "--steps", "3", "--d-vocab", "300", "--quiet", "--threads", "1")


def test_train_toy_on_text_writes_the_model_its_record_and_its_tokenizer(tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text(small_text(), encoding="utf-8")
    out = tmp_path / "m.safetensors"
    code, stdout, stderr = run_cli(capsys, "train-toy", "--text-file", str(text), *TINY, "--out", str(out))
    assert code == 0, stderr
    assert f"{tokenizer_path(out)}" in stdout and f"the loss curve {out.with_suffix('.loss.png')}" in stdout
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["train_config"]["copy_share"] == 0.0 and len(record["train_config"]["text_sha256"]) == 64  # planting asked by name
    assert record["text"]["files"] == ["corpus.txt"] and record["text"]["tokenizer"] == "m.tokenizer.json"
    assert record["text"]["train_tokens"] > record["text"]["heldout_tokens"] > 0
    tokenizer = CheckpointTokenizer.beside(out)
    assert len(tokenizer) == 300 and tokenizer.decode(tokenizer("moses said unto")["input_ids"]) == "moses said unto"
    # the same run again gives the same weights: a rebuild bit for bit
    again = tmp_path / "again.safetensors"
    assert run_cli(capsys, "train-toy", "--text-file", str(text), *TINY, "--out", str(again))[0] == 0
    assert json.loads(again.with_suffix(".json").read_text())["checkpoint_sha256"] == record["checkpoint_sha256"]
    # every command that reads the checkpoint reads prompts with its tokenizer
    code, stdout, stderr = run_cli(capsys, "verify", "--checkpoint", str(out), "--text", "the lord said", "--no-isolation",
                                   "--quiet")
    assert code == 0, stderr
    assert "' lord'" in stdout and "' said'" in stdout


def test_train_toy_fits_its_vocabulary_and_batch_to_a_short_text_and_says_so(tmp_path, capsys):
    """Issue 56: a short text with the defaults (GPL-3 wanted --d-vocab 1,807) trains: the vocabulary the text
    supports and at most a quarter of it a step, said in one line; what a person gives is kept (and refused)."""
    text = tmp_path / "short.txt"
    text.write_text(small_text(300), encoding="utf-8")
    tiny = [a for a in TINY if a not in ("--d-vocab", "300", "--batch-size", "4")]
    out = tmp_path / "m.safetensors"
    code, stdout, stderr = run_cli(capsys, "train-toy", "--text-file", str(text), *tiny, "--out", str(out))
    assert code == 0, stderr
    fitted = stdout.splitlines()[0]
    assert fitted.startswith("fitted to the text (") and "--d-vocab " in fitted and "(the most it supports; default 2,048)" in fitted
    assert "--batch-size " in fitted and "(a quarter of its windows a step; default 64)" in fitted
    config = json.loads(out.with_suffix(".json").read_text())["train_config"]
    assert 256 < config["d_vocab"] < 2048 and config["batch_size"] < 64
    code, _, stderr = run_cli(capsys, "train-toy", "--text-file", str(text), *tiny, "--d-vocab", "5000", "--out", str(out), "--force")
    assert code == 2 and "lower --d-vocab to at most" in stderr and stderr.count("\n") == 1


def test_train_toy_text_is_the_text_itself(tmp_path, capsys, monkeypatch):
    """Issue 56: --text is text everywhere (--text-file a file): train-toy trains on it, or refuses it in one
    line for being short (saying how much is needed), never 'not a file'; a --text that names a file points
    to --text-file."""
    monkeypatch.chdir(tmp_path)
    out = str(tmp_path / "m.safetensors")
    tiny = [a for a in TINY if a not in ("--d-vocab", "300")]
    code, _, stderr = run_cli(capsys, "train-toy", "--text", "hello world", *tiny, "--out", out)
    assert code == 2 and stderr.count("\n") == 1 and "not a file" not in stderr
    assert "the training part of the text is 11 tokens (11 characters), fewer than the 33 of one sequence" in stderr
    code, stdout, stderr = run_cli(capsys, "train-toy", "--text", small_text(20).replace("\n", " "), *tiny, "--out", out)
    assert code == 0, stderr
    assert json.loads((tmp_path / "m.json").read_text())["text"]["files"] == []
    (tmp_path / "a.txt").write_text(small_text(20))
    for argv, message in ((["--text", "a.txt"], "--text is the text itself, and 'a.txt' names a file: to train on the "
                                                 "file, use --text-file a.txt"),
                          (["--text", " "], "--text is empty"),
                          (["--text", "x", "--text-file", "a.txt"], "give the text once: --text TEXT (the text itself) "
                                                                    "or --text-file FILE, not both")):
        code, _, stderr = run_cli(capsys, "train-toy", *argv, *tiny, "--out", out, "--force")
        assert code == 2 and message in stderr and stderr.count("\n") == 1, stderr


@pytest.mark.parametrize("extra, message", [
    (("--copy-share", "0.5"), "--copy-share applies to training on text"),
])
def test_text_options_without_text_are_refused(tmp_path, capsys, extra, message):
    code, _, stderr = run_cli(capsys, "train-toy", *extra, "--out", str(tmp_path / "m.safetensors"))
    assert code == 2 and message in stderr and stderr.count("\n") == 1


def test_a_bad_text_is_refused_before_training(tmp_path, capsys):
    bad = tmp_path / "b.txt"
    bad.write_bytes(b"\xff\xfe")
    code, _, stderr = run_cli(capsys, "train-toy", "--text-file", str(bad), *TINY, "--out", str(tmp_path / "m.safetensors"))
    assert code == 2 and "is not UTF-8 text" in stderr and stderr.count("\n") == 1
    assert not (tmp_path / "m.safetensors").exists()


def test_an_unreadable_tokenizer_beside_a_checkpoint_is_one_line(tmp_path):
    checkpoint = tmp_path / "m.safetensors"
    tokenizer_path(checkpoint).write_text("{not json", encoding="utf-8")
    with pytest.raises(InputFileError, match="is not usable JSON"):
        CheckpointTokenizer.beside(checkpoint)
    assert CheckpointTokenizer.beside(tmp_path / "other.safetensors") is None


def test_the_corpus_builder_keeps_the_words_and_drops_headings_and_verse_numbers():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("corpus", Path(__file__).parents[2] / "scripts" / "corpus.py")
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    raw = ("\nGenesis 1\n\n  1 In the beginning God created the heaven and the earth.\n  2 And the earth was without form,"
           " and void; and darkness was upon the face of\nthe deep.\n\n1 Kings 2\n\n  1 Now the days of David drew nigh."
           "\n  2 I go the way of all the earth: be thou\nstrong therefore.\n")
    assert corpus.kjv_prose(raw) == (
        "In the beginning God created the heaven and the earth.\n"
        "And the earth was without form, and void; and darkness was upon the face of the deep.\n\n"
        "Now the days of David drew nigh.\nI go the way of all the earth: be thou strong therefore.\n")
