"""Hostile and corrupt input to numeric_check (issue 11): checkpoints, training records and
vocabulary files. Every bad file raises our error, before anything large is allocated."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from derivations.architecture import Architecture
from numeric_check.errors import CheckpointError, InputFileError, UncheckedCheckpoint
from numeric_check.files import MAX_INT_DIGITS, MAX_JSON_DEPTH, read_json, read_text_file
from numeric_check.model.checkpoint import FORMAT, content_hash, load_checkpoint, save_checkpoint
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.training.toy import shipped_checkpoint, training_record_for
from tests.conftest import THOROUGH, needs_pdflatex
from tests.helpers import quickly, run_cli as run

torch.set_num_threads(1)


@pytest.fixture
def saved(tmp_path):
    """A small model saved, with its config as a dict and its tensors."""
    model = CircuitModel.random(Architecture(1, 2, positional="standard"), d_model=4, d_head=2, d_vocab=5, n_ctx=3, seed=1, device="cpu")
    path = tmp_path / "model.safetensors"
    save_checkpoint(model, path)
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return path, model.cfg.to_dict(), tensors


def rewrite(path, tensors, config, **metadata):
    """A safetensors file with our format, ``config`` (a dict or raw text) and ``tensors``."""
    text = config if isinstance(config, str) else json.dumps(config)
    meta = {"format": FORMAT, "format_version": "1", "config": text, **metadata}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)
    return path


# -- the config in the metadata ----------------------------------------------------------


@pytest.mark.parametrize("make_text, fragment", [
    (lambda c: '{"arch":' * 100_000 + "1" + "}" * 100_000, "nests 100,000 deep"),
    (lambda c: json.dumps(c)[:-1] + ', "ln_eps": 1' + "0" * 400 + "}", "has 401 digits"),
    (lambda c: json.dumps(c)[:-1] + ', "attn_scale": 1' + "0" * 400 + "}", "has 401 digits"),
    (lambda c: json.dumps(c).replace('"d_vocab": 5', '"d_vocab": ' + "1" * 5001), "has 5,001 digits"),
    (lambda c: json.dumps(c).replace('"ln_eps": 1e-05', '"ln_eps": NaN'), "NaN is not a number"),
    (lambda c: json.dumps(c).replace('"ln_eps": 1e-05', '"ln_eps": 1e999'), "beyond a float's range"),
    (lambda c: "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), f"more than the {MAX_JSON_DEPTH}"),
])
def test_a_hostile_config_is_a_checkpoint_error(saved, tmp_path, make_text, fragment):
    _, config, tensors = saved
    path = rewrite(tmp_path / "bad.safetensors", tensors, make_text(config))
    with quickly(2), pytest.raises(CheckpointError, match=fragment):
        load_checkpoint(path, device="cpu")


@pytest.mark.parametrize("field, value", [("d_vocab", 10**12), ("d_model", 10**9), ("n_ctx", 10**12), ("d_head", 10**10)])
def test_huge_sizes_are_checked_against_the_tensors_before_allocation(saved, tmp_path, field, value):
    """A 10**12-entry embedding would be a MemoryError (or swap) if the model were built first."""
    _, config, tensors = saved
    path = rewrite(tmp_path / "huge.safetensors", tensors, {**config, field: value})
    with quickly(5), pytest.raises(CheckpointError, match=r"has shape .*, expected .* from its config"):
        load_checkpoint(path, device="cpu")


@pytest.mark.parametrize("convert", [lambda t: t.to(torch.float8_e4m3fn), lambda t: t.to(torch.int8)])
def test_weights_of_an_unusable_dtype_are_refused(saved, tmp_path, convert):
    _, config, tensors = saved
    path = rewrite(tmp_path / "f8.safetensors", {k: convert(v) for k, v in tensors.items()}, config)
    with pytest.raises(CheckpointError, match="expected one of float64, float32, float16, bfloat16"):
        load_checkpoint(path, device="cpu")
    with pytest.raises(CheckpointError, match="cannot load .* as torch.float8_e4m3fn"):
        load_checkpoint(saved[0], dtype="float8_e4m3fn", device="cpu")


@pytest.mark.parametrize("convert, fragment", [
    (lambda t: torch.empty_like(t, device="meta"), "a meta tensor"),
    (lambda t: t.to_sparse(), "sparse_coo tensor"),
    (lambda t: t.to(torch.float8_e5m2), "float8_e5m2"),
])
def test_torch_files_with_meta_sparse_or_float8_tensors_are_refused(saved, tmp_path, convert, fragment):
    _, config, tensors = saved
    path = tmp_path / "odd.pt"
    torch.save({"config": config, "state_dict": {k: convert(v) for k, v in tensors.items()}}, path)
    with pytest.raises(CheckpointError, match=fragment):
        load_checkpoint(path, device="cpu")


def test_a_torch_config_is_held_to_the_same_bounds(saved, tmp_path):
    _, config, tensors = saved
    for bad, fragment in ((dict(config, ln_eps=10**400), "about 401 digits"), (dict(config, d_vocab=10**5000), "bad.pt"),  # the weights-only unpickler refuses it itself
                          (dict(config, ln_eps=float("nan")), "nan")):
        path = tmp_path / "bad.pt"
        torch.save({"config": bad, "state_dict": tensors}, path)
        with pytest.raises(CheckpointError, match=fragment):
            load_checkpoint(path, device="cpu")


# -- the content hash ----------------------------------------------------------------------


def test_save_stores_a_content_hash_and_load_checks_it(saved, tmp_path):
    path, config, tensors = saved
    with safe_open(str(path), "pt") as f:
        assert f.metadata()["content_sha256"] == content_hash(tensors, config)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40  # one bit of the last weight
    flipped = tmp_path / "flipped.safetensors"
    flipped.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="do not match the content hash"):
        load_checkpoint(flipped, device="cpu")


def test_a_changed_config_does_not_match_the_hash(saved, tmp_path):
    path, config, tensors = saved
    with safe_open(str(path), "pt") as f:
        stored = f.metadata()["content_sha256"]
    changed = rewrite(tmp_path / "eps.safetensors", tensors, {**config, "ln_eps": 1e-15}, content_sha256=stored)
    with pytest.raises(CheckpointError, match="do not match the content hash"):
        load_checkpoint(changed, device="cpu")


def test_a_file_without_a_hash_loads_with_a_note(saved, tmp_path):
    _, config, tensors = saved
    old = rewrite(tmp_path / "old.safetensors", tensors, config)
    with pytest.warns(UncheckedCheckpoint, match="no content hash"):
        model = load_checkpoint(old, device="cpu")
    assert torch.equal(model.W_E, tensors["W_E"])


def test_the_shipped_models_carry_their_hash():
    for layers in (0, 1, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("error", UncheckedCheckpoint)
            load_checkpoint(shipped_checkpoint(layers), device="cpu")


# -- training records and vocabulary files ---------------------------------------------------


@pytest.mark.parametrize("content, fragment", [
    (b"\xff\xfe not utf-8", "not UTF-8"),
    (b"[" * 5000 + b"]" * 5000, "nests 5,000 deep"),
    (b'{"train_config": {"d_vocab": 1' + b"0" * 400 + b"}}", "401 digits"),
    (b"[1, 2]", "must be an object with 'train_config'"),
    (b'{"final": {}}', "must be an object with 'train_config'"),
    (b'{"train_config": {"d_vocab": "x"}}', "unusable train_config"),
    (b'{"train_config": {"nope": 1}}', "unusable train_config"),
    (b'{"train_config": {}, "final": "fast"}', "'final' that is not an object"),
    (b'{"train_config": {}, "final": {"loss": "low"}}', "'final' that is not an object"),
    (b'{"train_config": {}, "curve": [{"step": 1}]}', "'curve' that is not a list"),
    (b'{"train_config": {}, "uniform_loss": null}', "uniform_loss None, not a number"),
])
def test_a_malformed_training_record_is_a_checkpoint_error(tmp_path, content, fragment):
    checkpoint = tmp_path / "m.safetensors"
    checkpoint.with_suffix(".json").write_bytes(content)
    with quickly(2), pytest.raises(CheckpointError, match=fragment):
        training_record_for(checkpoint)


def test_a_training_record_that_is_a_folder_is_a_checkpoint_error(tmp_path):
    (tmp_path / "m.json").mkdir()
    with pytest.raises(CheckpointError, match="is not a file"):
        training_record_for(tmp_path / "m.safetensors")


@pytest.mark.parametrize("content, fragment", [
    (b"\xff\xfe\x00", "not UTF-8"),
    (b"[" * 5000, "nests 5,000 deep"),
    (b'[{"a": 1}]', "entry 0 is {'a': 1}"),
    (b'["a", 2]', "entry 1 is 2"),
    (b'["a", ' + b"1" * 5001 + b"]", "5,001 digits"),
])
def test_a_malformed_vocabulary_file_is_an_input_file_error(tmp_path, content, fragment):
    from numeric_check.cli.train_analyze import _read_vocab

    path = tmp_path / "vocab.json"
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=fragment):
        _read_vocab(path)


def test_read_json_keeps_strings_that_look_nested():
    assert read_json('{"s": "' + "[" * 100 + '"}', "text") == {"s": "[" * 100}
    assert read_json(str(10**MAX_INT_DIGITS - 1), "text") == 10**MAX_INT_DIGITS - 1


@pytest.mark.parametrize("content, fragment", [
    (b"\xff{}", "the list '.*l.json' is not UTF-8 text"),
    (b"[" * 40 + b"]" * 40, "the list nests 40 deep"),
    (b"[NaN]", "NaN is not a number"),
])
def test_a_users_file_read_as_json_is_an_input_file_error_naming_it(tmp_path, content, fragment):
    """The bounded readers (:mod:`numeric_check.files`) raise InputFileError unless the caller
    names another error (our checkpoints: CheckpointError; a Hugging Face folder: ModelLoadError)."""
    path = tmp_path / "l.json"
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=fragment):
        read_json(read_text_file(path, "the list"), "the list")
    with pytest.raises(InputFileError, match="the list .* is not a file"):
        read_text_file(tmp_path, "the list")


def test_the_readers_keep_their_old_home():
    from numeric_check.model import checkpoint

    assert checkpoint.read_json is read_json and checkpoint.read_text_file is read_text_file


# -- outputs: plain titles, strict JSON, paths checked first, atomic files --------------------


def test_a_name_with_mathtext_is_a_plain_title(tmp_path):
    from numeric_check.reports import plots

    name = "$\\bad$ \x1b[2J {x}^2"
    figure = plots.training_curve([{"step": 1, "loss": 2.0, "repeat_loss": 1.0}], title=name)
    (path,) = plots.save_figure(figure, tmp_path, "curve", ["png"])  # mathtext would raise ParseFatalException
    assert path.exists() and [p.name for p in tmp_path.iterdir()] == ["curve.png"]
    assert figure.axes[0].get_title() == "$\\bad$ \\x1b[2J {x}^2"


def test_weights_near_the_float32_limit_are_an_overflow_error_not_nan():
    from numeric_check.errors import AnalysisError
    from numeric_check.reports.analysis import analyze_model

    model = CircuitModel.random(Architecture(1, 1), d_model=4, d_head=2, d_vocab=6, n_ctx=8, seed=0, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.sign(p) * 1e37)  # finite weights near float32's limit; the logits are not
    with pytest.raises(AnalysisError, match="forward pass overflows in float32"):
        analyze_model(model, n_sequences=2)


def test_report_json_is_strict():
    from numeric_check.verification.results import strict_json

    data = strict_json({"a": [1.0, float("nan"), float("inf")], "b": {"c": -float("inf")}, "d": "x"})
    assert data == {"a": [1.0, None, None], "b": {"c": None}, "d": "x"}
    json.dumps(data, allow_nan=False)


def test_write_atomic_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    from numeric_check import files

    target = files.write_atomic(tmp_path / "report.md", "old")
    monkeypatch.setattr(files.files.os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(files.OutputPathError, match="No space left on device"):
        files.write_atomic(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_a_report_folder_is_checked_before_the_analysis(tmp_path):
    from numeric_check.errors import OutputPathError
    from numeric_check.reports.report import REPORT_FILES, report_folder

    for name in REPORT_FILES:
        (tmp_path / name).mkdir()
        with pytest.raises(OutputPathError, match=f"{name}' is a directory"):
            report_folder(tmp_path)
        (tmp_path / name).rmdir()
    assert report_folder(tmp_path) == tmp_path


# -- flags of the numeric commands --------------------------------------------------------------


@pytest.mark.parametrize("argv, fragment", [
    (["demo", "--seed", "18446744073709551616"], "argument --seed: expected an integer in 0..9223372036854775807"),
    (["demo", "--batch-size", "100000000"], "argument --batch-size: expected an integer in 1..1024"),
    (["demo", "--max-terms", "-1"], "argument --max-terms: expected a number of terms (0 or more) or 'all'"),
    (["analyze", "--seed", "18446744073709551616", "--out", "x"], "argument --seed: expected an integer in 0.."),
    (["analyze", "--sequences", "100000000", "--out", "REPORT"], "--sequences 100,000,000 would need"),
    (["analyze", "--threads", "100000", "--out", "x"], "argument --threads: expected an integer in 1.."),
    (["train-toy", "--threads", "100000", "--out", "m.safetensors"], "argument --threads: expected an integer in 1.."),
    (["train-toy", "--seed", str(2**64), "--out", "m.safetensors"], "argument --seed"),
    (["train-toy", "--lr", "nan", "--out", "m.safetensors"], "argument --lr: expected a finite number"),
    (["train-toy", "--batch-size", "100000000", "--out", "OUT"], "--batch-size 100,000,000 would need"),
    (["train-toy", "--max-repeats", str(2**63), "--out", "OUT"], "max_repeats must be at most 1,000"),
    (["train-toy", "--max-repeats", "100000", "--out", "OUT"], "max_repeats must be at most 1,000"),
    (["train-toy", "--d-model", str(10**12), "--out", "OUT"], "parameters, more than the 50,000,000"),
    (["verify", "--d-model", "100000"], "the verification forms d_model × d_model matrices"),  # an 80 GB allocation
    (["train-toy", "--d-head", "100000", "--d-model", "8", "--out", "OUT"], "activations would need"),  # ran 6 minutes
    (["train-toy", "--n-ctx", str(2**63), "--positional", "none", "--out", "OUT"], "would need"),
])
def test_numeric_flags_are_refused_in_one_line_before_any_work(capsys, tmp_path, argv, fragment):
    argv = [str(tmp_path / a) if a in ("REPORT", "OUT") else a for a in argv]
    argv = [str(tmp_path / "OUT.safetensors") if a.endswith("OUT") else a for a in argv]
    with quickly(30):
        code, out, err = run(capsys, *argv)
    lines = [line for line in err.splitlines() if "warning: command" not in line]
    assert code == 2 and len(lines) == 1 and fragment in lines[0], err


def test_train_toy_checks_its_record_path_before_training(capsys, tmp_path):
    (tmp_path / "m.json").mkdir()
    with quickly(10):
        code, out, err = run(capsys, "train-toy", "--steps", "100000", "--out", str(tmp_path / "m.safetensors"))
    assert code == 2 and "m.json' is a directory" in err
    assert not (tmp_path / "m.safetensors").exists()  # nothing trained, nothing written


# -- injection into the report ---------------------------------------------------------------

HOSTILE_NAME = "evil\n\\input{secret}\n\\immediate\\write18{touch pwned}<img src=x onerror=alert(1)>$\\bad$ \x1b[2J"
HOSTILE_TOKENS = ["a\n\nb", "<script>alert(1)</script>", "x|y", "\x07\x1b[2J\x00", "\\input{secret}", "$\\bad$", "%", "#&_^~{}",
                  "\u202e", "\\\\", "]]>", "\r"]


@pytest.fixture(scope="module")
def hostile_analysis():
    from numeric_check.reports.analysis import analyze_model
    from tests.helpers import exact_induction_model

    model = exact_induction_model(d_vocab=24, n_ctx=12)
    vocab = HOSTILE_TOKENS + [f"t{i}" for i in range(len(HOSTILE_TOKENS), 24)]
    return analyze_model(model, name=HOSTILE_NAME, n_sequences=4, vocab=vocab, sources=range(len(HOSTILE_TOKENS)))


@pytest.mark.slow
def test_the_markdown_report_has_no_raw_html(hostile_analysis):
    from markdown_it import MarkdownIt

    from numeric_check.reports.report import Report

    markdown = Report.of(hostile_analysis).markdown()
    tokens = MarkdownIt("commonmark").parse(markdown)
    raw = [t.content for token in tokens for t in [token, *(token.children or ())] if t.type.startswith("html")]
    assert raw == [] and "\x1b" not in markdown and "\x07" not in markdown


@pytest.mark.slow
@needs_pdflatex
def test_the_latex_tables_with_hostile_names_and_tokens_compile_inertly(tmp_path, hostile_analysis):
    import subprocess

    from numeric_check.reports.report import Report

    (tmp_path / "secret.tex").write_text("SECRET-CONTENT")
    tables = Report.of(hostile_analysis).latex()
    assert tables.splitlines()[0].startswith("% Tables of") and "\\input{secret}" in tables.splitlines()[0]  # inert
    assert "\\input{secret}" not in "\n".join(tables.splitlines()[1:])
    (tmp_path / "tables.tex").write_text(tables)
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\n\\begin{document}\n\\input{tables}\n\\end{document}\n")
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-shell-escape", "doc.tex"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:]
    log = (tmp_path / "doc.log").read_text(errors="replace")
    assert "SECRET-CONTENT" not in log and "runsystem" not in log and not (tmp_path / "pwned").exists()


# -- a Hugging Face model folder (issue 29 items 1 and 5, issue 28 item 4) ---------------------

@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.helpers import saved_hf_model

    return saved_hf_model(tmp_path_factory.mktemp("hf") / "gpt2", "gpt2")


HOSTILE_FIELDS = ("n_layer", "n_embd", "n_head", "n_inner", "n_positions", "vocab_size", "layer_norm_epsilon",
                  "model_type", "activation_function", "tie_word_embeddings", "num_hidden_layers", "torch_dtype")
HOSTILE_VALUES = (0, 1, 3, -1, 2.5, 10**6, 10**9, 10**12, 10**30, "x", "gpt2", "llama", None, True, [], {}, "float8_e4m3fn")


def _hostile_folder(src, dst, edits, drop=(), extra=()):
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(edits)
    (dst / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if drop or extra:
        tensors = load_file(dst / "model.safetensors")
        for name in drop:
            tensors.pop(name, None)
        tensors.update({name: torch.zeros(2) for name in extra})
        save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_any_hostile_model_folder_loads_as_saved_or_is_one_of_our_errors(hf_folder, tmp_path_factory, monkeypatch):
    """A property per family: any edit of a saved folder's config and tensors gives the model as saved
    or a :class:`ModelLoadError` line, in bounded time and memory, with nothing read from standard
    input and no file of the folder changed."""
    from hypothesis import given, settings, strategies as st

    from numeric_check.errors import NumericCheckError
    from numeric_check.conversion.load import load_model
    from tests.helpers import bounded, folder_state

    names = sorted(json.loads((hf_folder / "config.json").read_text()))
    from safetensors import safe_open

    with safe_open(str(hf_folder / "model.safetensors"), "pt") as f:
        stored = sorted(f.keys())
    monkeypatch.setattr("sys.stdin", None)
    counter = iter(range(10**6))

    @settings(max_examples=25, deadline=None)
    @given(edits=st.dictionaries(st.sampled_from(HOSTILE_FIELDS + tuple(names)), st.sampled_from(HOSTILE_VALUES), max_size=3),
           drop=st.lists(st.sampled_from(stored), max_size=2), extra=st.lists(st.sampled_from(["x.y", "transformer.h.5.z"]),
                                                                              max_size=1))
    def check(edits, drop, extra):
        folder = _hostile_folder(hf_folder, tmp_path_factory.mktemp("edit") / f"m{next(counter)}", edits, drop, extra)
        before = folder_state(folder)
        with bounded(60, 200):
            try:
                model = load_model(folder, torch.float64)
            except NumericCheckError as error:
                assert "\n" not in str(error) and "\x1b" not in str(error), str(error)
            else:  # what loaded is what was saved: every stored tensor used, none made up
                assert not drop and not extra, (edits, drop, extra)
                assert sum(p.numel() for p in model.parameters()) > 0
        assert folder_state(folder) == before

    check()


# -- round 5 (issue 38): layers counted from tensors that hold data -------------------------------


@THOROUGH
@given(st.dictionaries(st.integers(0, 40), st.lists(st.sampled_from([(0,), (4, 0), (3,), (2, 2), ()]), min_size=1,
                                                    max_size=3), max_size=12))
def test_a_layer_counts_where_its_tensors_hold_data(layers):
    """Any numbered layers, each with tensors of any shape: the count is the layers with at least one
    tensor that holds data (a dimension 0 holds none)."""
    from numeric_check.conversion.load import stored_layers

    shapes = {f"transformer.h.{i}.t{j}": shape for i, tensors in layers.items() for j, shape in enumerate(tensors)}
    shapes["transformer.wte.weight"] = (5, 4)
    holding = {i for i, tensors in layers.items() if any(0 not in shape for shape in tensors)}
    prefix, count = stored_layers(shapes)
    assert count == len(holding) and (prefix == "transformer.h" or not holding)


def test_more_layers_than_are_built_is_refused_even_when_the_weights_hold_them():
    from types import SimpleNamespace

    from numeric_check.errors import ModelLoadError
    from numeric_check.conversion.load import MAX_LAYERS, check_layers

    shapes = {f"h.{i}.w": (1,) for i in range(MAX_LAYERS + 1)}
    with quickly(5), pytest.raises(ModelLoadError, match=f"says 1,001 layers \\(n_layer\\), more than the 1,000"):
        check_layers(SimpleNamespace(num_hidden_layers=MAX_LAYERS + 1), {"n_layer": MAX_LAYERS + 1}, shapes, "x")
    check_layers(SimpleNamespace(num_hidden_layers=MAX_LAYERS), {}, shapes, "x")
    with pytest.raises(ModelLoadError, match="holds 0; the config does not describe"):
        check_layers(SimpleNamespace(num_hidden_layers=3), {}, {f"h.{i}.w": (0, 4) for i in range(3)}, "x")


def test_a_layer_number_of_thousands_of_digits_is_not_a_layer():
    from numeric_check.conversion.load import stored_layers

    with quickly(2):
        assert stored_layers({"h." + "9" * 5000 + ".w": (2,), "h.0.w": (2,)}) == ("h", 1)
