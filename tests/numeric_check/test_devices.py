"""One device, decided at the edge: every path from a user's model runs on "cuda" without meeting the CPU.

On a GPU machine (``make gpu-check``) they run on its CUDA device; on a CPU-only machine :func:`tests.fake_cuda.fake_cuda` makes a ``cuda:0`` whose tensors
live on the CPU and raise torch's own device-mismatch error when they meet a CPU tensor, as a GPU
machine does. The source is held on "cuda" or on the CPU, the result is asked on "cuda", and every
parameter and buffer of the result, and the verification, must be there.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from derivations.architecture import Architecture
from numeric_check.errors import DeviceError
from numeric_check.conversion.build import fold_norm
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.config import resolve_device
from numeric_check.verification.verify import verify_logits, verify_qk
from tests.fake_cuda import cuda, fake_cuda, on_cuda

transformers = pytest.importorskip("transformers")
from tests.hf_zoo import build as build_hf, source_dtype  # noqa: E402  (needs transformers)

TOKENS = torch.tensor([[1, 5, 2, 7, 3, 5, 2]])
REAL_CUDA = torch.cuda.is_available()  # asked at import, before a rehearsal (TCIRCUITS_FAKE_CUDA) fakes one


def all_on_cuda(model) -> list[str]:
    """The parameters and buffers of ``model`` that are not on the fake ``cuda:0``."""
    return [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t is not None and not on_cuda(t)]


# --- the one decision -------------------------------------------------------------------------

def test_auto_is_cuda_when_present_and_cuda_means_the_current_device():
    with fake_cuda():
        assert resolve_device(None) == resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 0)
        with pytest.raises(DeviceError, match=r"device 'cuda:1' does not exist: this machine has 1 CUDA device "
                                              r"\(cuda:0\); name one of them or use --device cpu"):
            resolve_device("cuda:1")


def test_auto_is_the_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == resolve_device("auto") == torch.device("cpu")
    with pytest.raises(DeviceError, match=r"device 'cuda' requested but CUDA is not available here .*; use --device cpu"):
        resolve_device("cuda")
    with pytest.raises(DeviceError, match=r"unknown device 'gpu0'; expected 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        resolve_device("gpu0")


def test_the_fake_device_catches_a_fold_across_devices():
    """What a GPU showed (a reader's CPU zeros meeting the source's CUDA weights in fold_norm) fails here too."""
    with fake_cuda():
        W = torch.randn(4, 3, dtype=torch.float64).to("cuda")
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            fold_norm((torch.ones(4, dtype=torch.float64, device="cuda"), torch.zeros(4, dtype=torch.float64)), W,
                      torch.zeros(3, dtype=torch.float64), 0)


# --- models made here -------------------------------------------------------------------------

def test_a_working_copy_moves_buffers_with_parameters():
    arch = Architecture(2, 2, positional="none", norm="rms_norm", alibi=True, n_kv_heads=1)
    model = CircuitModel.random(arch, d_model=8, d_head=4, d_vocab=11, n_ctx=8, seed=0, device="cpu")
    with cuda():
        work = model.working_copy(torch.float64, "cuda")
        assert all_on_cuda(work) == []
        assert work(TOKENS).device.type == "cuda"
    assert model.device.type == "cpu"  # the user's model stays where it was


def test_verification_follows_the_model_it_is_given():
    arch = Architecture(2, (2, 3), positional="standard", layer_norm=True, biases=True, mlp=True)
    with cuda():
        model = CircuitModel.random(arch, d_model=16, d_head=4, d_vocab=40, n_ctx=10, seed=0)  # auto: cuda
        assert all_on_cuda(model) == []
        report = verify_logits(model, TOKENS, max_order=2)
        assert report.device.startswith("cuda") and report.passed, report.to_text()
        qk = verify_qk(model, TOKENS, 1, 2, max_order=1)
        assert qk.device.startswith("cuda") and qk.passed, qk.to_text()
        assert verify_logits(model, TOKENS, max_order=1, device="cpu").device == "cpu"


# --- the user's model: Hugging Face, held on the CPU or on "cuda" -----------------------------

FAMILIES = [
    ("gpt2", {}),  # learned positions, layer norm, biases
    ("qwen2", {}),  # rotary with grouped queries, RMSNorm, a gated MLP
    ("bloom", {}),  # ALiBi
    ("mixtral", {}),  # a mixture of experts
    ("gemma2", {}),  # norms after each sublayer, soft-caps, windows
]


@pytest.mark.parametrize("source_on", ["cpu", "cuda"])
@pytest.mark.parametrize("model_type, options", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_a_hugging_face_model_converts_onto_cuda_and_verifies_there(model_type, options, source_on):
    if model_type == "mixtral" and source_on == "cuda" and not REAL_CUDA:
        pytest.skip("Hugging Face routes experts with torch.histc on integers, a CUDA kernel the CPU lacks")
    torch.set_num_threads(1)
    # as Hugging Face built it (the zoo's exact float64 rotary is a test patch that makes CPU tensors)
    hf = build_hf(model_type, 1, exact=False, dtype=source_dtype(model_type), **options)
    with cuda():
        hf = hf.to(source_on)
        model = nc_from_hf(hf, device="cuda", check_tokens=TOKENS)
        assert all_on_cuda(model) == [], model_type
        assert model.source_check.rel_diff <= model.source_check.tolerance
        report = verify_logits(model, TOKENS, max_order=1)
        assert report.device.startswith("cuda") and report.passed, report.to_text()


def nc_from_hf(hf, **kwargs):
    from numeric_check.conversion.hf import from_hf

    return from_hf(hf, **kwargs)


def test_a_cuda_model_converts_onto_the_cpu():
    hf = build_hf("llama", 2, exact=False)
    with cuda():
        model = nc_from_hf(hf.to("cuda"), device="cpu")
        assert all(not on_cuda(t) for t in model.parameters())
        assert verify_logits(model, TOKENS, max_order=1).passed


# --- the user's model: TransformerLens --------------------------------------------------------

def test_a_transformer_lens_model_converts_onto_cuda_and_verifies_there():
    tl = pytest.importorskip("transformer_lens")
    cfg = tl.HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=10, d_head=4, n_heads=2, d_vocab=12, d_mlp=24,
                                     act_fn="gelu", normalization_type="LN", device="cpu", seed=0)
    source = tl.HookedTransformer(cfg).eval()
    from numeric_check.conversion.adapters import from_transformer_lens

    with cuda():
        model = from_transformer_lens(source, device="cuda", check_tokens=TOKENS)
        assert all_on_cuda(model) == []
        assert verify_logits(model, TOKENS, max_order=2).passed


# --- the command line on a user's saved folder, on the default device (auto: "cuda" here) -----

@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    from tests.helpers import saved_hf_model

    return saved_hf_model(tmp_path_factory.mktemp("gpt2"), "gpt2")


def run_on_cuda(*argv: str) -> tuple[int, str, str]:
    """``tcircuits ARGV`` on CUDA, the real device where there is one, else the fake ``cuda:0`` in a child
    process (transformers' loading under the fake leaves state behind in its process; see tests/fake_cuda.py)."""
    if REAL_CUDA:
        from derivations.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
        return code, out.getvalue(), err.getvalue()
    script = ("import sys; from tests.fake_cuda import fake_cuda; from derivations.cli import main\n"
              "with fake_cuda():\n    code = main(sys.argv[1:])\nsys.exit(code)")
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run([sys.executable, "-c", script, *argv], cwd=root, capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    return child.returncode, child.stdout, child.stderr


@pytest.mark.slow
def test_verify_and_attribute_a_saved_folder_on_cuda(gpt2_dir):
    code, out, err = run_on_cuda("verify", "--hf", str(gpt2_dir), "--text", "The cat sat on the mat.", "--max-order", "1",
                                 "--format", "json")
    assert code == 0, err
    assert json.loads(out)["device"].startswith("cuda")
    code, out, err = run_on_cuda("attribute", "--hf", str(gpt2_dir), "--text", "The capital of France is",
                                 "--target", " the", "--max-terms", "5", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["device"].startswith("cuda")


@pytest.mark.slow
def test_analyze_a_saved_folder_on_cuda(gpt2_dir, tmp_path):
    code, out, err = run_on_cuda("analyze", "--hf", str(gpt2_dir), "--out", str(tmp_path / "report"), "--sequences", "4",
                                 "--figure-formats", "svg")
    assert code == 0, err
    assert (tmp_path / "report" / "index.html").exists()


def test_a_device_that_does_not_exist_is_one_line_before_loading(capsys, gpt2_dir):
    from tests.helpers import run_cli

    with fake_cuda():
        code, out, err = run_cli(capsys, "verify", "--hf", str(gpt2_dir), "--device", "cuda:2")
    assert code == 2 and err.count("\n") == 1
    assert "device 'cuda:2' does not exist: this machine has 1 CUDA device (cuda:0)" in err


def test_a_model_split_across_two_devices_is_one_line():
    hf = build_hf("gpt2", 0, exact=False)
    with fake_cuda():
        hf.transformer.h[1].to("cuda")
        with pytest.raises(DeviceError, match=r"the GPT-2 model is split across cpu and cuda:0 without a device map to run "
                                              r"it; put it on one device first"):
            nc_from_hf(hf, device="cuda")


def test_cuda_out_of_memory_is_one_line_naming_the_device_and_what_to_do():
    from numeric_check.reports.flags import device_errors

    with fake_cuda():
        with pytest.raises(DeviceError, match=r"CUDA ran out of memory on cuda:0 \(8.0 of 16.0 GiB free now\); try "
                                              r".*or --device cpu"):
            with device_errors(torch.device("cuda", 0)):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        with pytest.raises(DeviceError, match=r"the CUDA device cuda:0 failed: CUDA error: all CUDA-capable devices are "
                                              r"busy or unavailable; if another process holds it"):
            with device_errors(torch.device("cuda", 0)):
                raise RuntimeError("CUDA error: all CUDA-capable devices are busy or unavailable")


# --- no tensor made without saying where ------------------------------------------------------

FACTORIES = {"zeros", "ones", "empty", "full", "eye", "arange", "tensor", "as_tensor", "randn", "rand", "randint",
             "linspace", "logspace", "randperm", "normal"}
#: the folders where a tensor meets the model's: the model (but its readers, which read the source into
#: CPU float64 by design) and the verification engine
GUARDED = ["numeric_check/model", "numeric_check/verification"]


def device_less_factories(root) -> list[str]:
    """``torch.zeros(...)`` and the like without a ``device=`` (or ``**`` options that carry one)."""
    import ast
    from pathlib import Path

    found = []
    for folder in GUARDED:
        for path in sorted((Path(root) / folder).rglob("*.py")):
            if "readers" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                        and not any(k.arg in ("device", None) for k in node.keywords)):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: torch.{node.func.attr}(...)")
    return found


def test_no_tensor_is_made_without_a_device_where_it_meets_the_model():
    """Every new tensor in the model and the verification names its device: the device of what it will
    meet, or "cpu" where the CPU is meant (seeded draws, probe tokens) — never torch's default."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert device_less_factories(root) == []


@pytest.mark.slow
def test_demo_and_the_companion_run_on_cuda(capsys, tmp_path):
    """The shipped models on the default device: the demo's verdict and the companion's 14 files (its
    figures once called .numpy() on CUDA tensors)."""
    from tests.helpers import run_cli

    with cuda():
        code, out, err = run_cli(capsys, "demo", "--max-terms", "0")
        assert code == 0 and "working at every position: yes" in out, err
        code, out, err = run_cli(capsys, "paper", "--out", str(tmp_path / "companion"), "--quiet")
    assert code == 0, err
    assert (tmp_path / "companion" / "index.html").exists()


# --- threads ----------------------------------------------------------------------------------

def test_the_thread_policy_follows_the_width_and_the_idle_cores(monkeypatch):
    from numeric_check.model import threads

    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (2.6, 0.0, 0.0))
    assert threads.default_threads(width=256) == 1  # narrow: one thread, whatever the machine
    assert threads.default_threads(width=4096) == threads.default_threads() == 1  # 4 cores, 3 busy
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.2, 0.0, 0.0))
    assert threads.default_threads(width=4096) == 4  # quiet: every core
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (9.0, 0.0, 0.0))
    assert threads.default_threads(width=4096) == 1  # busier than the cores: still one


def test_threads_are_set_once_and_bad_counts_refused():
    from numeric_check.model.threads import use_threads

    before = torch.get_num_threads()
    try:
        assert use_threads(2) == 2 and torch.get_num_threads() == 2
        assert use_threads(None, width=64) == 1 and torch.get_num_threads() == 1
        for bad in (0, -1, 1.5, True):
            with pytest.raises(DeviceError, match="threads must be an int >= 1"):
                use_threads(bad)
    finally:
        torch.set_num_threads(before)


def test_a_command_runs_a_narrow_model_on_one_thread_unless_told(capsys):
    from tests.helpers import run_cli

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        code, out, err = run_cli(capsys, "verify", "--layers", "1", "--heads", "1", "--quiet", "--max-terms", "1")
        assert code == 0, err
        assert torch.get_num_threads() == 1  # d_model 32: below the width where threads pay
        code, out, err = run_cli(capsys, "verify", "--layers", "1", "--heads", "1", "--threads", "2", "--quiet")
        assert code == 0 and torch.get_num_threads() == 2, err
    finally:
        torch.set_num_threads(before)
