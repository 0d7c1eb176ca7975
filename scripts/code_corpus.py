"""SymPy's source as one text, for the seventh plain-text run of issue 53: text with in-context repeats
that a model cannot learn by heart.

The Bible repeats itself across the whole book: a phrase seen again in a window was seen many times in
training, so a model learns it as a phrase and a perfect induction head would add little (the guide's
"induction headroom", 0.007 nats a token at the fifth run's end). In source code an identifier is defined
and then used again within a few hundred tokens, and most identifiers are rare across the corpus: only
the context tells what comes next. SymPy is locked (``requirements/lock.txt``), so every machine that builds
``.venv`` has the same files; its licence is BSD. This writes every ``.py`` file of the installed
``sympy`` package but its tests, in byte order of their paths, each after a line ``# file: PATH``:

    .venv/bin/python scripts/code_corpus.py build/corpus/sympy.txt

The text of 2026-12-07 (sympy 1.14.0): 16,647,659 bytes, 499,105 lines, SHA-256
d39e52983d0131c8… (printed in full when written).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path


def sources(package: Path) -> list[Path]:
    """The package's ``.py`` files outside any ``tests`` folder, in byte order of their paths."""
    files = [p for p in package.rglob("*.py") if "tests" not in p.relative_to(package).parts]
    return sorted(files, key=lambda p: str(p.relative_to(package.parent)).encode())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[0], "\nusage: code_corpus.py OUT.txt", file=sys.stderr)
        return 2
    import sympy

    package = Path(sympy.__file__).parent
    parts = []
    for path in sources(package):
        parts.append(f"# file: {path.relative_to(package.parent)}\n{path.read_text(encoding='utf-8')}\n")
    data, newline = "".join(parts).encode(), b"\n"
    Path(argv[0]).write_bytes(data)
    print(f"wrote {argv[0]}: sympy {sympy.__version__}, {len(parts):,} files, {len(data):,} bytes, "
          f"{data.count(newline):,} lines, SHA-256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
