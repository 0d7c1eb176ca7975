"""Whether a lock (``requirements/lock.txt``, made by ``make lock``) still matches ``pyproject.toml``.

The README's two commands install the lock, exact versions with their hashes; ``pyproject.toml`` keeps
the ranges a ``pip install`` takes. The two must agree, or the lock installs something the package does
not declare (or lacks what it does): every dependency ``pyproject.toml`` declares, with the extras the
lock was made for (read from the command in its header), must be pinned at a version its range allows,
and every package the lock pins for tcircuits itself (``# via tcircuits``) must still be declared.

    python scripts/check_lock.py [LOCK]     # exit 0, or one line naming the difference and exit 1
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
EXTRA = re.compile(r"--extra[= ]([A-Za-z0-9_-]+)")
OURS = "tcircuits (pyproject.toml)"


def read_lock(text: str) -> tuple[dict[str, Version], set[str], list[str]]:
    """The lock's pins by canonical name, the names pinned for tcircuits itself, and its extras."""
    pins: dict[str, Version] = {}
    ours: set[str] = set()
    current = None
    for line in text.splitlines():
        pin = PIN.match(line)
        if pin:
            current = canonicalize_name(pin.group(1))
            pins[current] = Version(pin.group(2))
        elif current is not None and OURS in line:
            ours.add(current)
    header = next((line for line in text.splitlines() if "pip-compile" in line and "--" in line), "")
    return pins, ours, EXTRA.findall(header)


def declared(pyproject: dict, extras: list[str]) -> dict[str, Requirement]:
    """The requirements ``pyproject.toml`` declares for the package and ``extras``, by canonical name
    (an extra that names the package itself, such as ``all``, adds nothing of its own)."""
    project = pyproject["project"]
    lines = list(project.get("dependencies", []))
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"the lock was made with --extra {extra}, which pyproject.toml does not define; run make lock")
        lines += optional[extra]
    requirements = (Requirement(line) for line in lines)
    return {canonicalize_name(r.name): r for r in requirements if canonicalize_name(r.name) != canonicalize_name(project["name"])}


def differences(lock_text: str, pyproject: dict, lock_name: str = "requirements/lock.txt") -> list[str]:
    """What differs between the lock and ``pyproject.toml``, a line each (none: they agree)."""
    pins, ours, extras = read_lock(lock_text)
    wanted = declared(pyproject, extras)
    problems = []
    for name, requirement in sorted(wanted.items()):
        if name not in pins:
            problems.append(f"pyproject.toml requires {requirement}, which {lock_name} does not pin")
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{lock_name} pins {name}=={pins[name]}, outside pyproject.toml's {requirement}")
    for name in sorted(ours - set(wanted)):
        problems.append(f"{lock_name} pins {name}=={pins[name]} for tcircuits, which pyproject.toml no longer requires")
    return problems


def main(argv: list[str]) -> int:
    lock = Path(argv[0]) if argv else ROOT / "requirements" / "lock.txt"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    try:
        shown = lock.relative_to(ROOT).as_posix()
    except ValueError:
        shown = str(lock)
    problems = differences(lock.read_text(encoding="utf-8"), pyproject, shown)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        print(f"the lock does not match pyproject.toml: {problems[0]}{more}; run make lock", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
