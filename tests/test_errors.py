"""One error tree: every exception class the three packages define derives from the project's
root, :class:`~tensoralg.errors.TCircuitsError`, through exactly one package root — a checkpoint
that will not load is not an algebra error — and each class lives in its package's errors.py.
Every error a person can cause is one line and exit status 2 (issue 38: the environment variables
read, a torchrun rendezvous that cannot happen, a stopping signal's own line and status)."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil

import pytest
from hypothesis import given

import derivations
import numeric_check
import tensoralg
from derivations.errors import DerivationError
from numeric_check.errors import NumericCheckError
from tensoralg.errors import TCircuitsError, TensorAlgError
from tests.conftest import FUZZ
from tests.helpers import terminal_signals
from tests.strategies import hostile_environments

ROOTS = {"tensoralg": TensorAlgError, "derivations": DerivationError, "numeric_check": NumericCheckError}

# Exceptions used as signals, not errors: raised and caught inside one package (a hook ends a
# forward pass once the wanted activation is read), never reported. They stay out of the tree
# so that ``except TCircuitsError`` can never swallow one.
SIGNALS = {"StopForward"}


def modules(package):
    """Every module of ``package`` (its ``__main__`` aside: importing it would run the CLI)."""
    yield package
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith("__main__"):
            yield importlib.import_module(info.name)


def public_exceptions(package) -> dict[str, type]:
    """``{qualified name: class}`` of the public exception classes defined in ``package``."""
    found = {}
    for module in modules(package):
        for name, cls in vars(module).items():
            if (inspect.isclass(cls) and issubclass(cls, Exception) and not name.startswith("_")
                    and cls.__module__.split(".")[0] == package.__name__
                    and cls is not TCircuitsError and cls.__name__ not in SIGNALS):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


PACKAGES = [tensoralg, derivations, numeric_check]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_public_exception_has_the_project_root_and_exactly_one_package_root(package):
    classes = public_exceptions(package)
    assert ROOTS[package.__name__] in classes.values()
    for name, cls in classes.items():
        assert issubclass(cls, TCircuitsError), f"{name} is not a TCircuitsError"
        roots = [root for root in ROOTS.values() if issubclass(cls, root)]
        assert roots == [ROOTS[package.__name__]], f"{name} derives from {[r.__name__ for r in roots]}"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_exception_classes_live_in_their_packages_errors_module(package):
    misplaced = [name for name, cls in public_exceptions(package).items()
                 if cls.__module__ != f"{package.__name__}.errors"]
    assert misplaced == []


def test_signals_are_not_errors():
    signals = [cls for package in PACKAGES for module in modules(package) for cls in vars(module).values()
               if inspect.isclass(cls) and cls.__name__ in SIGNALS]
    assert signals and all(not issubclass(cls, TCircuitsError) for cls in signals)


def test_the_package_roots_do_not_derive_from_one_another():
    for root in ROOTS.values():
        assert root.__bases__ == (TCircuitsError,)
    assert TCircuitsError.__bases__ == (Exception,)


def test_the_project_root_is_exported_and_catches_every_package():
    assert tensoralg.TCircuitsError is TCircuitsError
    from derivations.catalogue import get

    for failing in (lambda: tensoralg.parse("A ⊗"), lambda: get("virtual-weights", layers=2, heads=-1)):
        with pytest.raises(TCircuitsError):
            failing()


def test_the_cli_reports_each_packages_errors_in_one_line(tmp_path, capsys):
    from derivations.cli import main

    missing = tmp_path / "missing.safetensors"
    for argv, message in (
        (["expand", "(Id ⊗ W_U)(Id ⊗ W_E)", "--max-order", "-1"], "error: max_order must be None"),  # tensoralg
        (["derive", "no-such-derivation"], "error: "),  # derivations
        (["verify", "--checkpoint", str(missing)], f"error: checkpoint {missing} does not exist"),  # numeric_check
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tcircuits {argv[0]}: error: ") and message in err
        assert err.count("\n") == 1 and "Traceback" not in err


# -- round 5 (issue 38): every environment variable read is checked; one line, status 2 ----------


@FUZZ
@given(hostile_environments())
def test_every_environment_variable_read_is_a_value_or_one_line(environment):
    """torchrun's variables and those the Hugging Face libraries read at import (the hub, the
    proxies, their timeouts), hostile or stale: read as a value, or one error line naming the
    variable — never a ValueError from deep inside a library."""
    from numeric_check.errors import ModelLoadError, VerifyError
    from numeric_check.conversion.load import check_hub_environment
    from numeric_check.verification.distributed import Torchrun

    try:
        ranks = Torchrun.from_environment(environment)
    except VerifyError as error:
        assert "\n" not in str(error) and any(name in str(error) for name in environment), str(error)
    else:
        if ranks is not None:
            assert 0 <= ranks.rank < ranks.world and 1 <= ranks.port <= 65535 and ranks.address
    try:
        check_hub_environment(environment)
    except ModelLoadError as error:
        assert "\n" not in str(error) and "the environment variable" in str(error), str(error)


@pytest.mark.parametrize("variable, value, argv, fragment", [
    ("WORLD_SIZE", "abc", ["verify", "--layers", "1", "--heads", "1"], "WORLD_SIZE='abc' is not a whole number"),
    ("MASTER_PORT", "99999", ["verify", "--layers", "1", "--heads", "1"], "MASTER_PORT=99999 is outside 1..65535"),
    ("HF_ENDPOINT", "http://[::1", ["verify", "--hf", "/no/such/folder"], "HF_ENDPOINT='http://[::1' is not a usable URL"),
    ("HTTPS_PROXY", "http://proxy:99999", ["verify", "--tl", "gpt2"], "HTTPS_PROXY='http://proxy:99999' is not a usable URL"),
    ("HF_HUB_ETAG_TIMEOUT", "abc", ["analyze", "--hf", "/no/such/folder", "--out", "r"], "HF_HUB_ETAG_TIMEOUT='abc'"),
])
def test_a_bad_environment_variable_is_one_line_with_status_2(monkeypatch, capsys, variable, value, argv, fragment):
    from derivations.cli import main

    monkeypatch.setenv(variable, value)
    if variable == "MASTER_PORT":
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "0")
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and fragment in err and "Traceback" not in err, err


def test_an_unreachable_torchrun_master_is_announced_and_bounded(tmp_path):
    """Rank 1 of 2 whose master cannot be reached (a closed port on this machine), and rank 0 whose
    other rank never comes: each says where it waits and for how long, then one error line and status 2
    after about --join-timeout seconds — never a silent wait of --rank-timeout (30 minutes)."""
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    for rank in ("1", "0"):
        env = {**os.environ, "PYTHONPATH": str(root), "WORLD_SIZE": "2", "RANK": rank, "LOCAL_RANK": rank,
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "derivations.cli", "verify", "--layers", "1", "--heads", "1",
                               "--device", "cpu", "--join-timeout", "3", "--quiet"],
                              capture_output=True, text=True, env=env, timeout=300)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 2, done.stderr[-2000:]
        assert lines[0] == f"tcircuits verify: rank {rank} of 2 meeting the others at 127.0.0.1:{port} (waiting at most 3 s)"
        assert lines[1].startswith(f"tcircuits verify: error: rank {rank} of 2 could not meet the others at 127.0.0.1:{port}")
        assert time.monotonic() - start < 120


STOP_SCRIPT = r"""
import signal, sys, time
from derivations import cli

def slow(args):
    print("working", flush=True)
    time.sleep(60)
    return 0

cli.commands.derive = slow
sys.exit(cli.main(["derive", "zero-layer"]))
"""


@pytest.mark.parametrize("name, code", [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_stopping_signal_ends_the_cli_with_one_line_and_128_plus_its_number(name, code):
    import signal as signals
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-c", STOP_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, preexec_fn=terminal_signals)
    assert child.stdout.readline() == "working\n"
    child.send_signal(getattr(signals, name))
    _, err = child.communicate(timeout=60)
    said = "tcircuits: interrupted" if name == "SIGINT" else f"tcircuits: stopped by {name}"
    assert child.returncode == code and err.strip() == said, (child.returncode, err)
