"""The releases of the libraries tcircuits reads models from, at each end of pyproject.toml's ranges,
for the version tests of ``.ci/run`` (the locked suite runs with the lock's own).

    python scripts/versions.py oldest DIR   # the oldest supported releases into DIR
    python scripts/versions.py newest DIR   # the newest the registry serves within the ranges into DIR

Each installs into DIR (put first on PYTHONPATH for the version tests) only what differs from the
environment, with no dependencies of its own beyond what the releases need, and prints one line:
the versions it installed beside the lock's. ``newest`` asks pip to resolve the ranges of the ``hf``
and ``tl`` extras against the environment with ``--upgrade``, so the releases of today are tested the
day they appear; it also says when the registry serves a release beyond a range's upper bound (README:
the version table says why a bound excludes one). Exit 0 with "nothing newer" when the lock already
holds the newest.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("hf", "tl")  # the libraries whose models tcircuits reads
#: The oldest supported releases (the ranges' lower ends) and what they need that the lock holds newer.
OLDEST = ("transformers==4.57.1", "tokenizers>=0.22,<0.23", "huggingface-hub>=0.34,<1.0", "transformer-lens==2.18.0",
          "datasets==4.0.0")
PIP = [sys.executable, "-m", "pip"]


def ranges() -> list[Requirement]:
    """The requirements of the ``hf`` and ``tl`` extras, as pyproject.toml declares them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [Requirement(line) for extra in EXTRAS for line in project["optional-dependencies"][extra]]


def installed(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def resolve_newest(requirements: list[Requirement]) -> dict[str, str]:
    """What pip would change in this environment to take the newest releases within ``requirements``
    (and what they need): name -> version. torch stays the locked CPU build."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(PIP + ["install", "-qq", "--dry-run", "--upgrade", "--upgrade-strategy", "only-if-needed",
                              "--report", str(report), "-c", str(ROOT / "requirements" / "torch-cpu.in"),
                              *map(str, requirements)], check=True)
        changes = json.loads(report.read_text(encoding="utf-8"))["install"]
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in changes}


def served_beyond(requirement: Requirement) -> str | None:
    """The newest release the registry serves when the range excludes it, else None (asked of pip's index)."""
    result = subprocess.run(PIP + ["index", "versions", requirement.name], capture_output=True, text=True)
    first = result.stdout.splitlines()[0] if result.returncode == 0 and result.stdout else ""
    newest = first.partition("(")[2].partition(")")[0].strip()
    return newest if newest and not requirement.specifier.contains(newest, prereleases=False) else None


def install(target: Path, pins: list[str]) -> None:
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    if pins:
        subprocess.run(PIP + ["install", "-qq", "--no-deps", "--target", str(target), *pins], check=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("oldest", "newest"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    which, target = argv[0], Path(argv[1])
    if which == "oldest":
        install(target, list(OLDEST))
        print("the oldest supported:", ", ".join(OLDEST))
        return 0
    requirements = ranges()
    changes = resolve_newest(requirements)
    install(target, [f"{name}=={version}" for name, version in changes.items()])
    shown = []
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        newest = next((v for n, v in changes.items() if canonicalize_name(n) == name), None)
        locked = installed(requirement.name)
        line = f"{requirement.name} {newest} (the lock: {locked})" if newest else f"{requirement.name} {locked}, the lock's"
        beyond = served_beyond(requirement)
        shown.append(line + (f"; the registry also serves {beyond}, beyond {requirement}" if beyond else ""))
    extra = sorted(set(changes) - {r.name for r in requirements})
    print("the newest within the ranges:", "; ".join(shown) + (f"; with {', '.join(extra)}" if extra else ""))
    if not changes:
        print("nothing newer than the lock: the locked suite has tested the newest")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
