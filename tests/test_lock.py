"""The locked environment: the README's commands install ``requirements/lock.txt`` (exact versions and
their hashes), which must match ``pyproject.toml``'s ranges (``scripts/check_lock.py``), be what is
installed, and stay what is installed when newer releases appear."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "lock.txt"
DOCS_LOCK = ROOT / "requirements" / "docs-lock.txt"

spec = importlib.util.spec_from_file_location("check_lock", ROOT / "scripts" / "check_lock.py")
check_lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_lock)

PYPROJECT = check_lock.tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _lock_with(text: str, name: str, version: str, via: str) -> str:
    return text + f"{name}=={version} \\\n    --hash=sha256:{'0' * 64}\n    # via {via}\n"


@pytest.mark.parametrize("lock", [LOCK, DOCS_LOCK], ids=["lock", "docs-lock"])
def test_the_committed_locks_match_pyproject(lock):
    assert check_lock.differences(lock.read_text(encoding="utf-8"), PYPROJECT) == []


def test_a_dependency_added_to_pyproject_only_is_named():
    pyproject = {"project": {**PYPROJECT["project"], "dependencies": [*PYPROJECT["project"]["dependencies"], "einops>=0.7"]}}
    text = LOCK.read_text(encoding="utf-8").replace("# via tcircuits (pyproject.toml)\neinops", "# via x\neinops")
    assert "pyproject.toml requires einops>=0.7, which requirements/lock.txt does not pin" in \
        check_lock.differences(re.sub(r"(?m)^einops==.*$", "", text), pyproject)


def test_a_dependency_dropped_from_pyproject_but_locked_for_tcircuits_is_named():
    text = _lock_with(LOCK.read_text(encoding="utf-8"), "colorama", "0.4.6", "tcircuits (pyproject.toml)")
    assert check_lock.differences(text, PYPROJECT) == [
        "requirements/lock.txt pins colorama==0.4.6 for tcircuits, which pyproject.toml no longer requires"]


def test_a_pin_outside_the_declared_range_is_named():
    text = re.sub(r"(?m)^sympy==\S+", "sympy==1.11.0", LOCK.read_text(encoding="utf-8"))
    assert check_lock.differences(text, PYPROJECT) == [
        "requirements/lock.txt pins sympy==1.11.0, outside pyproject.toml's sympy>=1.12"]


def test_the_check_says_one_line_and_fails(tmp_path):
    bad = tmp_path / "lock.txt"
    bad.write_text(re.sub(r"(?m)^numpy==\S+ \\\n(    --hash=\S+( \\)?\n)+", "", LOCK.read_text(encoding="utf-8")))
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_lock.py"), str(bad)],
                            capture_output=True, text=True)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("the lock does not match pyproject.toml: pyproject.toml requires numpy>=1.24, which ")
    assert result.stderr.endswith("; run make lock\n")


def _made_by_make() -> bool:
    return (Path(sys.prefix) / ".installed").is_file()


@pytest.mark.skipif(not _made_by_make(), reason="the environment was not built by make from the lock")
def test_the_environment_is_the_lock():
    """Every package the lock pins is installed at exactly that version (make builds .venv from the lock in an
    empty environment: this is what a fresh clone gets, next month too)."""
    pins, _, _ = check_lock.read_lock(LOCK.read_text(encoding="utf-8"))
    wrong = {name: (str(version), metadata.version(name)) for name, version in pins.items()
             if metadata.version(name) != str(version)}
    assert wrong == {}


def _wheel(folder: Path, name: str, version: str, body: str = "") -> Path:
    """A minimal pure-Python wheel of ``name`` ``version``."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n{body}",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tcircuits-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d.encode()).digest()).rstrip(b'=').decode()},{len(d)}\n"
                     for n, d in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in {**files, f"{info}/RECORD": record}.items():
            z.writestr(n, d)
    return path


def _install_locked(lock: Path, wheels: Path, target: Path) -> subprocess.CompletedProcess:
    """The Makefile's own install command for a lock, offline, from ``wheels``, into ``target``."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    flags = re.search(r"^INSTALL_LOCKED := \$\(BIN\)/pip install (.*)$", makefile, re.M).group(1).split()
    return subprocess.run([sys.executable, "-m", "pip", "install", *flags, str(lock), "--no-index", "--find-links",
                           str(wheels), "--target", str(target)], capture_output=True, text=True)


def test_a_newer_release_does_not_change_what_the_lock_installs(tmp_path):
    """Published after the lock was made, a newer release is not taken; a file that is not the one locked
    (same version, other bytes) is refused."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    locked = _wheel(wheels, "tcfake", "1.0")
    lock = tmp_path / "lock.txt"
    lock.write_text(f"tcfake==1.0 \\\n    --hash=sha256:{hashlib.sha256(locked.read_bytes()).hexdigest()}\n")
    _wheel(wheels, "tcfake", "2.0")  # a newer release appears
    result = _install_locked(lock, wheels, tmp_path / "env")
    assert result.returncode == 0, result.stderr
    assert "VERSION = '1.0'" in (tmp_path / "env" / "tcfake" / "__init__.py").read_text()
    _wheel(wheels, "tcfake", "1.0", body="# republished with other bytes\n")
    result = _install_locked(lock, wheels, tmp_path / "env2")
    assert result.returncode != 0 and "hash" in result.stderr.lower()


def test_the_readme_version_table_says_what_the_lock_pins():
    pins, _, _ = check_lock.read_lock(LOCK.read_text(encoding="utf-8"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for library, name in (("transformers", "transformers"), ("TransformerLens", "transformer-lens"), ("torch", "torch")):
        row = re.search(rf"^\| {library} \| ([^ |]+)", readme, re.M)
        assert row and row.group(1) == str(pins[name]).split("+")[0], (library, row and row.group(1), pins[name])
