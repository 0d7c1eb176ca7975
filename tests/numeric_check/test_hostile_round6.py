"""Hostile input, round 6 (issue 48, item 3): every surface added since round 5 attacked as an attacker would,
a table per family. Bad input: one line on standard error, exit 2, nothing written; never a traceback, never a
verdict computed on numbers that are not the model's.

Each family was tried before the change that closed it (issue 48's closing note has the table): ``paper --hf``
with ``architectures: 5`` and ``tcircuits dynamics`` on a history whose ``windows``, ``training_loss`` or whole
index was not what train-toy writes gave tracebacks; ``verify --dtype float32`` on finite weights near 1e37 gave
FAIL verdicts on NaN and ``attention`` a page of NaN patterns; a file name or a config string with a line break
split the error line in two; help written to a full disk or a closed pipe was lost with exit status 0; an
output named in UTF-8 under an ASCII locale was a traceback; a training record's ``text`` that was a list was a
traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.model.checkpoint import FORMAT, FORMAT_VERSION, content_hash
from numeric_check.model.circuit_model import CircuitModel
from tests.helpers import folder_state, run_cli
from tests.numeric_check.test_hostile_text import TINY, _prose

ROOT = Path(__file__).resolve().parents[2]
TCIRCUITS = str(Path(sys.executable).with_name("tcircuits"))


def one_line(code, out: str, err: str, fragment: str = "") -> bool:
    """The project's rule for bad input: exit 2, nothing on standard output, one terminal-safe line on standard
    error that holds ``fragment``."""
    lines = [line for line in err.splitlines() if "warning: command" not in line]
    return (code == 2 and out == "" and len(lines) == 1 and fragment in lines[0] and "Traceback" not in err
            and "\x1b" not in err)


class within:
    """The block ends within ``seconds`` or fails (SIGALRM: a hang on a FIFO or a device is a failure, not a
    stuck suite)."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def __enter__(self):
        def late(signum, frame):
            raise AssertionError(f"took more than {self.seconds} s")

        self.saved = signal.signal(signal.SIGALRM, late)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.saved)
        return False


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-layer model trained on text for 2 steps, with its record, tokenizer and a history of snapshots."""
    folder = tmp_path_factory.mktemp("trained")
    (folder / "text.txt").write_text(_prose(2200))
    out = folder / "m.safetensors"
    code = run_cli(_NoCapture(), "train-toy", "--text-file", str(folder / "text.txt"), *TINY, "--layers", "2",
                   "--snapshots", "2", "--out", str(out))[0]
    assert code == 0
    return out


class _NoCapture:
    """What :func:`run_cli` reads outputs from, for a fixture that has no ``capsys``."""

    def readouterr(self):
        return "", ""


def copy_of(trained: Path, folder: Path, name: str = "m") -> Path:
    """The trained checkpoint and everything beside it, copied into ``folder`` as ``name``."""
    for item in trained.parent.iterdir():
        if item.name.startswith("m."):
            target = folder / (name + item.name[1:])
            (shutil.copytree if item.is_dir() else shutil.copy)(item, target)
    return folder / f"{name}.safetensors"


# -- (a) paper --hf / --tl with a model the companion cannot read: refused before its weights ----------------------


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.helpers import saved_hf_model

    return saved_hf_model(tmp_path_factory.mktemp("hf") / "gpt2", "gpt2")


def _edited(config: dict, case: str) -> dict:
    edits = {"3 layers": {"n_layer": 3}, "48 layers": {"n_layer": 48}, "architectures 5": {"architectures": 5},
             "architectures of dicts": {"architectures": [{"a": 1}]}, "architectures a string": {"architectures": "GPT2"},
             "architectures 1 MB": {"architectures": ["A" * 1_000_000]},
             "architectures with escapes": {"architectures": ["\x1b[2J\nEvil"]},
             "model_type a list": {"architectures": [], "model_type": [1]}}
    return {**config, **edits.get(case, {})}


@pytest.mark.parametrize("case, fragment", [
    ("as saved", "gpt2 (GPT2LMHeadModel, Hugging Face) has MLPs"),
    ("3 layers", "(GPT2LMHeadModel, Hugging Face) has MLPs"),
    ("48 layers", "(GPT2LMHeadModel, Hugging Face) has MLPs"),
    ("architectures 5", "(gpt2, Hugging Face) has MLPs"),  # was a TypeError
    ("architectures of dicts", "(gpt2, Hugging Face) has MLPs"),
    ("architectures a string", "(gpt2, Hugging Face) has MLPs"),  # was its first letter
    ("architectures 1 MB", "AAAA…, Hugging Face) has MLPs"),
    ("architectures with escapes", "(\\x1b[2J\\nEvil, Hugging Face) has MLPs"),  # was two lines
    ("model_type a list", "(causal LM, Hugging Face) has MLPs"),
    ("a folder named with a line break", "evil\\nname\\x1b[31m (GPT2LMHeadModel, Hugging Face) has MLPs"),
])
def test_paper_refuses_a_hugging_face_model_from_its_config_in_one_line(capsys, monkeypatch, tmp_path, hf_gpt2, case,
                                                                       fragment):
    from numeric_check.conversion import load

    folder = tmp_path / ("evil\nname\x1b[31m" if "line break" in case else "gpt2")
    shutil.copytree(hf_gpt2, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(_edited(config, case)))
    (tmp_path / "t.txt").write_text("In the beginning\n")
    monkeypatch.setattr(load, "load_model", lambda *a, **k: pytest.fail("the weights were read"))
    code, out, err = run_cli(capsys, "paper", "--hf", str(folder), "--text-file", str(tmp_path / "t.txt"), "--out",
                             str(tmp_path / "site"))
    assert one_line(code, out, err, fragment), err[:500]
    assert len(err) < 1000 and not (tmp_path / "site").exists()


@pytest.fixture(scope="module")
def small_bpe():
    from numeric_check.reports.paper.language import heldout_path
    from numeric_check.training.text import train_tokenizer

    return train_tokenizer(heldout_path().read_text(encoding="utf-8")[:20_000], 512)


@pytest.mark.parametrize("config, why", [
    ({"n_layers": 3}, "has 3 layers"),
    ({"n_layers": 12}, "has 12 layers"),
    ({"n_layers": 1, "attn_only": False, "d_mlp": 32, "act_fn": "gelu"}, "has MLPs"),
    ({"n_layers": 4, "attn_only": False, "d_mlp": 32, "act_fn": "relu"}, "big (TransformerLens) has"),
])
def test_paper_refuses_a_transformer_lens_model_before_its_conversion(capsys, monkeypatch, tmp_path, small_bpe, config,
                                                                      why):
    from numeric_check.cli import source
    from tests.numeric_check.test_paper_yours import fake_transformer_lens

    fake_transformer_lens(monkeypatch, small_bpe, **config)
    monkeypatch.setattr(source, "convert", lambda *a, **k: pytest.fail("converted"))
    (tmp_path / "t.txt").write_text("In the beginning\n")
    code, out, err = run_cli(capsys, "paper", "--tl", "big", "--text-file", str(tmp_path / "t.txt"), "--out",
                             str(tmp_path / "s"), "--device", "cpu")
    assert one_line(code, out, err, why) and "(tcircuits verify --tl big)" in err, err
    assert not (tmp_path / "s").exists()


# -- (b) checkpoints whose weights are not numbers, or hold nothing ------------------------------------------------


def forged(path: Path, edit, dtype=torch.float32) -> Path:
    """A checkpoint as an attacker writes it: a small model's tensors and config edited by ``edit(tensors,
    config)``, saved with a content hash that matches (the hash is public: it proves no tampering)."""
    from safetensors.torch import save_file

    model = CircuitModel.random(Architecture(2, 2, positional="standard", layer_norm=True, biases=True), d_model=8,
                                d_head=4, d_vocab=12, n_ctx=8, seed=0, dtype=torch.float32, device="cpu")
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    config = model.cfg.to_dict()
    edit(tensors, config)
    metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "config": json.dumps(config),
                "content_sha256": content_hash(tensors, config)}
    save_file(tensors, str(path), metadata=metadata)
    return path


def _entry(name: str, value: float):
    def edit(tensors, config):
        tensors[name].view(-1)[1] = value
    return edit


def _emptied(size: str, old: int):
    """``size`` set to 0 in the config and every tensor's axis of that size cut to nothing."""
    def edit(tensors, config):
        config[size] = 0
        for name, t in tensors.items():
            for axis, n in enumerate(t.shape):
                if n == old:
                    t = t.narrow(axis, 0, 0)
            tensors[name] = t.contiguous()
    return edit


def _no_heads(tensors, config):
    config["arch"]["n_heads"] = 0


def _one_tensor_empty(tensors, config):
    tensors["W_E"] = tensors["W_E"][:, :0].contiguous()  # the config still says 12 tokens


NOT_NUMBERS = [(f"{name} {value}", _entry(name, value), dtype, f"parameter {name} ")
               for name in ("W_E", "blocks.1.attn.W_Q", "blocks.0.attn.b_V")
               for value in (float("nan"), float("inf"), -float("inf"))
               for dtype in (torch.float32, torch.float16)]
HOLD_NOTHING = [("d_vocab 0", _emptied("d_vocab", 12), torch.float32, "d_vocab must be an int >= 1, got 0"),
                ("n_ctx 0", _emptied("n_ctx", 8), torch.float32, "n_ctx must be an int >= 1, got 0"),
                ("d_head 0", _emptied("d_head", 4), torch.float32, "d_head must be an int >= 1, got 0"),
                ("no heads", _no_heads, torch.float32, "layer 0 must have at least one head"),
                ("W_E of no tokens", _one_tensor_empty, torch.float32, "W_E has shape (8, 0), expected (8, 12)")]
COMMANDS = {"verify": ["verify", "--max-order", "1", "--tokens", "1,2,3"],
            "analyze": ["analyze", "--sequences", "2", "-o", "OUT"],
            "attention": ["attention", "--tokens", "1,2,3", "-o", "OUT.html"],
            "paper": ["paper", "-o", "OUT"]}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case, edit, dtype, fragment", NOT_NUMBERS + HOLD_NOTHING,
                         ids=[c[0] for c in NOT_NUMBERS + HOLD_NOTHING])
def test_a_checkpoint_of_weights_that_are_not_numbers_or_hold_nothing_is_one_line(capsys, tmp_path, command, case, edit,
                                                                                  dtype, fragment):
    path = forged(tmp_path / "m.safetensors", edit, dtype)
    before = folder_state(tmp_path)
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in COMMANDS[command]]
    code, out, err = run_cli(capsys, *argv, "--checkpoint", str(path))
    assert one_line(code, out, err, fragment) and str(path) in err, err
    assert folder_state(tmp_path) == before  # nothing written


def _huge(scale: float, stored: torch.dtype = torch.float32):
    def edit(tensors, config):
        for name, t in tensors.items():
            tensors[name] = (torch.sign(t) * scale).to(stored).contiguous()
    return edit


OVERFLOWING = {**COMMANDS, "attribute": ["attribute", "--tokens", "1,2,3", "--target", "2"]}


@pytest.mark.parametrize("scale, stored, command, dtype", [
    (1e37, torch.float32, "verify", "float32"), (1e20, torch.float32, "verify", "float32"),
    (6e4, torch.float16, "verify", "float16"), (1e37, torch.float32, "verify", "float16"),
    (1e37, torch.float32, "attention", "float32"), (1e20, torch.float32, "attention", "float32"),
    *((1e10, torch.float32, command, "float32") for command in ("verify", "attention", "analyze", "attribute")),
    (1e15, torch.float32, "attribute", "float32"),
])
def test_finite_weights_whose_forward_pass_overflows_give_no_verdict(capsys, tmp_path, scale, stored, command, dtype):
    """Finite weights the float32 forward pass cannot hold: once, verify printed FAIL on NaN for every check and
    attention wrote a page of NaN patterns; near 1e10 a layer norm's variance overflowed, the stream after it was 0
    and verify PASSED every check on logits that were b_U alone (attribute printed FAIL on NaN). Now one line naming
    the overflow, and nothing written."""
    path = forged(tmp_path / "m.safetensors", _huge(scale, stored), stored)
    before = folder_state(tmp_path)
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in OVERFLOWING[command]]
    code, out, err = run_cli(capsys, *argv, "--checkpoint", str(path), "--dtype", dtype)
    assert one_line(code, out, err, f"the model's forward pass overflows in {dtype}: NaN or Inf in"), err
    assert "float64" in err and folder_state(tmp_path) == before


def test_a_contribution_that_overflows_where_the_model_does_not_is_refused(capsys, tmp_path, monkeypatch):
    """A term past the dtype while the model's own pass is finite (the layer norms keep its stream finite): attribute
    refuses it by name instead of ranking NaN. (Weights alone reach the layer norms' overflow first, so the
    contraction is made to return one Inf here.)"""
    from numeric_check.circuits import attribution

    contributions = attribution.TargetContraction.contributions

    def one_infinite(self, kept):
        out = contributions(self, kept)
        out[1] = float("inf")
        return out

    monkeypatch.setattr(attribution.TargetContraction, "contributions", one_infinite)
    path = forged(tmp_path / "m.safetensors", _huge(1.0))
    code, out, err = run_cli(capsys, *OVERFLOWING["attribute"], "--checkpoint", str(path), "--dtype", "float32")
    assert one_line(code, out, err, "the expansion overflows in float32: NaN or Inf in the contribution of tok→L0H0 "
                                    "(largest weight magnitude"), err


@pytest.mark.parametrize("scale", [3e4, 6e4])
@pytest.mark.parametrize("qk", [False, True])
def test_terms_whose_norms_overflow_float32_get_their_norms(capsys, tmp_path, scale, qk):
    """Float32 weights near 3e4: every term finite, but the Gram matrix its norm was computed through passed 3.4e38,
    and a PASSED report showed NaN norms; the norms are now taken in float64 where float32's overflow."""
    path = forged(tmp_path / "m.safetensors", _huge(scale))
    argv = ["verify", "--checkpoint", str(path), "--tokens", "1,2,3", "--dtype", "float32", "--max-order", "2"]
    code, out, err = run_cli(capsys, *argv, *(["--qk", "1", "0"] if qk else []))
    assert code == 0 and "PASSED" in out and "nan" not in out.lower() and " inf" not in out, out + err


def test_terms_evaluated_by_head_groups_get_their_norms_where_float32_overflows(caplog):
    """The grouped path (3 layers of 8 heads) keeps its norm kernels in float64 where float32's overflow: at weights
    of 1e6, 3 of 1,550 norms were NaN in a PASSED report."""
    import logging
    import math

    from numeric_check.verification.verify import verify_logits

    model = CircuitModel.random(Architecture(3, 8, positional="standard", layer_norm=True, biases=True), d_model=64,
                                d_head=8, d_vocab=50, n_ctx=16, seed=0, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.sign(parameter) * 1e6)
    with caplog.at_level(logging.DEBUG, logger="numeric_check.verification.verify"):
        report = verify_logits(model, torch.arange(16).reshape(1, 16), max_order=3, dtype="float32")
    assert "evaluated by the grouped path" in caplog.text
    assert report.passed and all(math.isfinite(t.norm) for t in report.terms)


def test_the_same_weights_verify_in_float64(capsys, tmp_path):
    path = forged(tmp_path / "m.safetensors", _huge(1e20))
    code, out, err = run_cli(capsys, "verify", "--checkpoint", str(path), "--max-order", "1", "--tokens", "1,2,3")
    assert code == 0 and "PASSED" in out and "nan" not in out, out + err


# -- a training run's history (tcircuits dynamics) --------------------------------------------------------------


def _history(edit):
    def apply(folder: Path):
        index = folder / "m.history" / "history.json"
        history = json.loads(index.read_text())
        replaced = edit(history)
        index.write_text(replaced if isinstance(replaced, str) else json.dumps(history))
    return apply


def _first(**fields):
    return _history(lambda h: h["snapshots"][0].update(fields))


def _without_windows(edit):
    def apply(folder: Path):
        (folder / "m.history" / "heldout-windows.u16").unlink()
        edit(folder)
    return apply


def _nan_snapshot(folder: Path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = next((folder / "m.history").glob("step-*.safetensors"))
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    tensors["W_E"][0, 0] = float("nan")
    metadata["content_sha256"] = content_hash(tensors, json.loads(metadata["config"]))
    save_file(tensors, str(path), metadata=metadata)
    _first(sha256=metadata["content_sha256"])(folder)


NOT_WRITTEN_BY_TRAIN_TOY = "is not one train-toy wrote"
HISTORIES = [
    ("a snapshot of NaN weights", _nan_snapshot, "has 1 NaN and 0 Inf entries"),
    ("an index that is a list", _history(lambda h: "[1, 2]"), NOT_WRITTEN_BY_TRAIN_TOY),  # was an AttributeError
    ("windows that are a list", _history(lambda h: h.update(windows=[])), None),  # was an AttributeError: now the
    ("windows of negative sizes", _history(lambda h: h.update(windows={"count": -256, "tokens": -33})), None),  # losses
    ("training losses of text", _history(lambda h: h.update(training_loss=["x"])), NOT_WRITTEN_BY_TRAIN_TOY),  # recorded
    ("a step below 1", _first(step=-5), NOT_WRITTEN_BY_TRAIN_TOY),  # was drawn on a log axis with 4 warnings
    ("a step that is a boolean", _first(step=True), NOT_WRITTEN_BY_TRAIN_TOY),
    ("a snapshot listed 2,000 times", _history(lambda h: h.update(snapshots=h["snapshots"] * 2000)),
     NOT_WRITTEN_BY_TRAIN_TOY),
    ("a held-out loss of text", _first(heldout_loss="x"), NOT_WRITTEN_BY_TRAIN_TOY),
    ("position losses of text, no windows", _without_windows(_first(position_loss=["a"] * 32)), NOT_WRITTEN_BY_TRAIN_TOY),
    ("one position loss, no windows", _without_windows(_first(position_loss=[1.0])), "gives 1 position losses at step"),
    ("100,000 position losses, no windows", _without_windows(_first(position_loss=[1.0] * 100_000)),
     "gives 100,000 position losses"),
    ("a record that is not UTF-8", lambda folder: (folder / "m.json").write_bytes(b"\xff{}"), "is not UTF-8 text"),
    ("a record 10,000 deep", lambda folder: (folder / "m.json").write_text("[" * 10_000 + "]" * 10_000),
     "nests 10,000 deep"),
]


@pytest.mark.parametrize("case, tamper, fragment", HISTORIES, ids=[h[0] for h in HISTORIES])
def test_a_tampered_training_history_is_one_line_or_measured_from_the_snapshots(capsys, tmp_path, trained, case, tamper,
                                                                                fragment):
    checkpoint = copy_of(trained, tmp_path)
    tamper(tmp_path)
    code, out, err = run_cli(capsys, "dynamics", "--checkpoint", str(checkpoint), "-o", str(tmp_path / "out"), "--quiet",
                             "--device", "cpu")
    if fragment is None:  # nothing the snapshots do not give: each one's losses measured from its file again
        assert code == 0 and "Traceback" not in err and (tmp_path / "out" / "index.html").is_file(), err
    else:
        assert one_line(code, out, err, fragment), err[-800:]
        assert not (tmp_path / "out").exists()


# -- (c) the command line in another environment: locale, HOME, TMPDIR, closed pipes --------------------------------


def tcircuits(*argv: str, env: dict | None = None, cwd=None, unset=(), **kwargs) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}.items() if k not in unset}
    return subprocess.run([TCIRCUITS, *argv], env=environment, cwd=cwd, capture_output=True, timeout=120, **kwargs)


ASCII_LOCALE = {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}  # no UTF-8 mode: file names in ASCII


@pytest.mark.slow
@pytest.mark.parametrize("env, unset", [
    ({"LC_ALL": "C"}, ()), ({"LANG": "C", "LC_ALL": "", "LC_CTYPE": ""}, ()), (ASCII_LOCALE, ()),
    ({"PYTHONIOENCODING": "ascii"}, ()), ({}, ("HOME",)), ({"HOME": "/dev/null"}, ()), ({"HOME": "/nonexistent"}, ()),
    ({"TMPDIR": "/nonexistent"}, ()), ({"TMPDIR": "/dev/null"}, ()),
])
def test_a_checkpoint_named_in_unicode_is_read_in_any_environment(tmp_path, trained, env, unset):
    checkpoint = copy_of(trained, tmp_path, "naïve ⊗")
    (tmp_path / "prompt ü.txt").write_text("Ünï ⊗ words\n", encoding="utf-8")  # within the context of 32 tokens
    done = tcircuits("attention", "--checkpoint", checkpoint.name, "--text-file", "prompt ü.txt", "-o", "page.html",
                     env=env, unset=unset, cwd=tmp_path)
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    assert (tmp_path / "page.html").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("home", ["/dev/null", "a file", "missing/deeper"])
def test_figures_drawn_where_home_cannot_be_written_say_nothing_of_it(tmp_path, trained, home):
    """Matplotlib warned in two lines on every run where it could not write under HOME (it made a temporary folder
    for its font cache); the CLI now gives it a private one, removed at exit."""
    checkpoint = copy_of(trained, tmp_path)
    (tmp_path / "a file").write_text("")
    (tmp_path / "tmp").mkdir()
    env = {"HOME": str(tmp_path / home), "XDG_CONFIG_HOME": "", "XDG_CACHE_HOME": "", "TMPDIR": str(tmp_path / "tmp")}
    done = tcircuits("analyze", "--checkpoint", checkpoint.name, "--sequences", "2", "-o", "out",
                     env=env, unset=("MPLCONFIGDIR",), cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == b"", done.stderr.decode(errors="replace")
    assert any((tmp_path / "out").rglob("*.png")) and not any((tmp_path / "tmp").iterdir())  # drawn; cleaned up


@pytest.mark.slow
@pytest.mark.parametrize("argv, fragment", [
    (["attention", "--checkpoint", "naïve ⊗.safetensors", "--tokens", "1,2", "-o", "nëw é.html"],
     "the name 'n\\xebw \\xe9.html' cannot be spelled in this system's file-name encoding (ascii)"),  # a traceback
    (["verify", "--checkpoint", "nö ⊗.safetensors"], "checkpoint n\\xf6 \\u2297.safetensors does not exist"),
])
def test_a_name_an_ascii_locale_cannot_spell_is_one_line(tmp_path, trained, argv, fragment):
    copy_of(trained, tmp_path, "naïve ⊗")
    done = tcircuits(*argv, env=ASCII_LOCALE, cwd=tmp_path)
    assert one_line(done.returncode, done.stdout.decode(), done.stderr.decode(), fragment), done.stderr
    assert not any(p.suffix == ".html" for p in tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["derive", "--list"], ["--help"], ["verify", "--help"], ["--version"],
                                  ["verify", "--layers", "1", "--heads", "1", "--d-model", "8", "--d-head", "4"]])
def test_a_reader_gone_away_ends_the_command_quietly(argv):
    """``tcircuits … | head -c 10``, the reader gone before the first write: exit 141 as a shell reports a
    SIGPIPE death, nothing on standard error (help once ended 0, its text lost)."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([TCIRCUITS, *argv], stdout=write, stderr=subprocess.PIPE, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == b"", done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("shell, message", [("{cmd} > /dev/full", "No space left on device"), ("{cmd} >&-", "it is closed")])
def test_help_that_cannot_be_written_is_one_line(shell, message):
    done = subprocess.run(shell.format(cmd=f"{TCIRCUITS} verify --help"), shell=True, capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and done.stderr.decode().splitlines() == [
        f"tcircuits verify: error: cannot write to standard output: {message}"], done.stderr


# -- (d) round 5's classes again: the tokenizer, the record and the text beside a checkpoint -------------------------


def _tokenizer(case: str, folder: Path, original: str) -> None:
    path = folder / "m.tokenizer.json"
    data = json.loads(original)
    vocab = data["model"]["vocab"]
    if case == "truncated":
        path.write_text(original[: len(original) // 2])
    elif case == "not UTF-8":
        path.write_bytes(original.encode("utf-16"))
    elif case == "empty":
        path.write_bytes(b"")
    elif case == "10,000 deep inside a field":
        data["normalizer"] = json.loads("[" * 30 + "]" * 30)
        path.write_text(json.dumps(data).replace('"normalizer": ' + "[" * 30, '"normalizer": ' + "[" * 10_000)
                        .replace("]" * 30, "]" * 10_000))
    elif case == "a folder":
        path.unlink()
        path.mkdir()
    elif case == "a FIFO":
        path.unlink()
        os.mkfifo(path)
    elif case == "a link to /dev/zero":
        path.unlink()
        path.symlink_to("/dev/zero")
    elif case == "merges as many as tokens":
        data["model"]["merges"] = [["a", "b"]] * len(vocab)
        path.write_text(json.dumps(data))
    elif case == "a negative id":
        vocab[next(iter(vocab))] = -1
        path.write_text(json.dumps(data))
    elif case == "an id of 10**30":
        vocab[next(iter(vocab))] = 10**30
        path.write_text(json.dumps(data))
    elif case == "ids as floats":
        data["model"]["vocab"] = {k: float(v) for k, v in vocab.items()}
        path.write_text(json.dumps(data))


TOKENIZERS = [("truncated", "is not usable JSON"), ("not UTF-8", "is not UTF-8 text"), ("empty", "is not usable JSON"),
              ("10,000 deep inside a field", "nests 10,001 deep"), ("a folder", "is not a file"),
              ("a FIFO", "is not a file"), ("a link to /dev/zero", "is not a file"),
              ("merges as many as tokens", "merges for 300 tokens"), ("an id of 10**30", "31 digits"),
              ("ids as floats", "is not a byte-level BPE")]


@pytest.mark.parametrize("case, fragment", TOKENIZERS, ids=[t[0] for t in TOKENIZERS])
def test_a_tokenizer_beside_a_checkpoint_that_cannot_be_its_own_is_one_line(capsys, tmp_path, trained, case, fragment):
    checkpoint = copy_of(trained, tmp_path)
    _tokenizer(case, tmp_path, trained.with_suffix(".tokenizer.json").read_text())
    with within(20):
        code, out, err = run_cli(capsys, "verify", "--checkpoint", str(checkpoint), "--text", "line of words",
                                 "--max-order", "1")
    assert one_line(code, out, err, fragment), err


def test_a_tokenizer_with_a_negative_id_reads_no_token_outside_the_model(capsys, tmp_path, trained):
    checkpoint = copy_of(trained, tmp_path)
    _tokenizer("a negative id", tmp_path, trained.with_suffix(".tokenizer.json").read_text())
    code, out, err = run_cli(capsys, "verify", "--checkpoint", str(checkpoint), "--text", "line of words",
                             "--max-order", "1")
    assert one_line(code, out, err) or (code == 0 and "PASSED" in out), err


def _record(edit):
    def apply(folder: Path):
        record = json.loads((folder / "m.json").read_text())
        edit(record)
        (folder / "m.json").write_text(json.dumps(record))
    return apply


NOT_ITS_TEXT = "has a 'text' that is not an object with the SHA-256s of its text"
RECORDS = [
    ("text a list", _record(lambda r: r.update(text=[1])), NOT_ITS_TEXT),  # was an AttributeError
    ("text SHA-256 a number", _record(lambda r: r["text"].update(sha256=5)), NOT_ITS_TEXT),
    ("text SHA-256 1 MB", _record(lambda r: r["text"].update(sha256="a" * 1_000_000)), NOT_ITS_TEXT),
    ("held-out SHA-256 a list", _record(lambda r: r["text"].update(heldout_sha256=[1])), NOT_ITS_TEXT),
    ("text SHA-256 that lies", _record(lambda r: r["text"].update(sha256="0" * 64)), "is not the text"),
    ("a record of 11 MB", lambda folder: (folder / "m.json").write_text("{}" + " " * 11_000_000), "more than the"),
]


@pytest.mark.parametrize("case, tamper, fragment", RECORDS, ids=[r[0] for r in RECORDS])
def test_a_training_record_that_lies_about_its_text_is_one_line(capsys, tmp_path, trained, case, tamper, fragment):
    checkpoint = copy_of(trained, tmp_path)
    tamper(tmp_path)
    code, out, err = run_cli(capsys, "paper", "--checkpoint", str(checkpoint), "--training-text-file",
                             str(trained.parent / "text.txt"), "-o", str(tmp_path / "site"))
    assert one_line(code, out, err, fragment) and len(err) < 1000, err[:500]
    assert not (tmp_path / "site").exists()


def _text_path(case: str, folder: Path) -> Path:
    if case == "a FIFO":
        os.mkfifo(folder / "fifo")
        return folder / "fifo"
    if case == "a folder":
        (folder / "dir").mkdir()
        return folder / "dir"
    if case == "a link to /dev/urandom":
        (folder / "r.txt").symlink_to("/dev/urandom")
        return folder / "r.txt"
    if case == "a name with a line break and an escape":
        path = folder / "new\nline\x1b[31m.txt"
        path.write_bytes(b"\xff not text")
        return path
    return Path(case)


TEXTS = ["a FIFO", "a folder", "/dev/zero", "a link to /dev/urandom", "/dev/stdin",
         "a name with a line break and an escape"]
TEXT_COMMANDS = {"train-toy": ["train-toy", *TINY, "--out", "OUT.safetensors", "--text-file"],
                 "verify": ["verify", "--checkpoint", "CKPT", "--max-order", "1", "--text-file"],
                 "paper": ["paper", "--checkpoint", "CKPT", "-o", "OUT", "--text-file"],
                 "paper, training text": ["paper", "--checkpoint", "CKPT", "-o", "OUT", "--training-text-file"]}


@pytest.mark.parametrize("command", TEXT_COMMANDS)
@pytest.mark.parametrize("case", TEXTS)
def test_a_text_file_that_is_not_a_file_is_refused_at_once(capsys, monkeypatch, tmp_path, trained, command, case):
    checkpoint = copy_of(trained, tmp_path)
    path = _text_path(case, tmp_path)
    monkeypatch.setattr("sys.stdin", None)
    argv = [{"CKPT": str(checkpoint), "OUT": str(tmp_path / "out"), "OUT.safetensors": str(tmp_path / "o.safetensors")}
            .get(a, a) for a in TEXT_COMMANDS[command]]
    with within(20):
        code, out, err = run_cli(capsys, *argv, str(path))
    shown = "new\\nline\\x1b[31m.txt" if "line break" in case else ""
    assert one_line(code, out, err, shown), err
    assert not (tmp_path / "out").exists() and not (tmp_path / "o.safetensors").exists()
