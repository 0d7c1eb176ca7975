"""Build the language models' corpus: the King James Bible as prose, one verse a line.

The text comes from Debian's ``bible-kjv`` program (``bible gen1:1-rev22:21``; its data package
``bible-kjv-text``, version 4.38, holds the 1611 translation, in the public domain). The program
prints each chapter under a heading, each verse numbered and wrapped at 80 columns; this keeps the
words as they are, drops the headings and verse numbers, joins each verse on one line, and leaves a
blank line between chapters. The result is deterministic: its SHA-256 is printed, and the training
records of the shipped language models name it.

Writes ``build/corpus/kjv.txt`` (4.2 MB), the held-out part the companion measures on,
``numeric_check/data/kjv_heldout.txt`` (every 20th block of 100 lines:
:func:`numeric_check.training.text.split_text`), and the whole text xz-compressed,
``numeric_check/data/kjv.txt.xz`` (0.9 MB: the companion counts the skip-trigram "bugs" against the
text the models were trained on, so that a combination they saw in training is never called one).

    python scripts/corpus.py            # or: make corpus
"""

from __future__ import annotations

import lzma
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "corpus" / "kjv.txt"
HELDOUT = ROOT / "numeric_check" / "data" / "kjv_heldout.txt"
PACKED = ROOT / "numeric_check" / "data" / "kjv.txt.xz"
VERSE = re.compile(r"^\s+(\d+) (.*)$")


def kjv_prose(raw: str) -> str:
    """The ``bible`` program's output as prose: one verse a line, chapters apart by a blank line."""
    chapters: list[list[str]] = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        verse = VERSE.match(line)
        if verse:
            if verse.group(1) == "1" or not chapters:
                chapters.append([])
            chapters[-1].append(verse.group(2).strip())
        elif line[:1].isspace() or not chapters or not chapters[-1] or re.fullmatch(r"[1-3]? ?[A-Z][\w ]+ \d+", line.strip()):
            continue  # a chapter heading ("Genesis 1", "1 Kings 3")
        else:
            chapters[-1][-1] += " " + line.strip()  # a wrapped verse goes on
    return "\n\n".join("\n".join(verses) for verses in chapters) + "\n"


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from numeric_check.training.text import split_text, text_sha256

    if shutil.which("bible") is None:
        print("corpus: the 'bible' program is missing: install Debian's bible-kjv (apt-get install bible-kjv)", file=sys.stderr)
        return 2
    raw = subprocess.run(["bible", "gen1:1-rev22:21"], capture_output=True, text=True, check=True,
                         env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"}).stdout
    text = kjv_prose(raw)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    _, held = split_text(text)
    HELDOUT.write_text(held + "\n", encoding="utf-8")
    PACKED.write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
    print(f"wrote {OUT.relative_to(ROOT)} ({len(text.encode()):,} bytes, {len(text.splitlines()):,} lines, "
          f"sha256 {text_sha256(text)}), {HELDOUT.relative_to(ROOT)} ({len(held.encode()):,} bytes) and {PACKED.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
