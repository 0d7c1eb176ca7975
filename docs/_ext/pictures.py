"""The pictures of the how-to pages, made by the commands themselves while the guide is built.

Each picture is what a reader gets by typing the command the page shows beside it, run here on the
shipped models (no network): the circuit report's figures (``tcircuits analyze``), every head's
attention on a prompt (``tcircuits attention``), an attribution's bar chart (``tcircuits attribute
--format html``) and a training run's loss curve (``tcircuits train-toy``). They are written into
``docs/_generated/`` (ignored by git): images the pages show, and HTML pages the build copies beside
the guide's own, which the pages frame.

    python docs/_ext/pictures.py   # or: make docs, which makes them first
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent
OUT = DOCS / "_generated"
#: The commands, as the pages show them (a checkpoint's path relative to the repository), and what each writes.
COMMANDS = {
    "analyze": ["analyze", "--checkpoint", "numeric_check/data/induction_2l.safetensors",
                "--control", "numeric_check/data/induction_1l.safetensors", "--sequences", "16",
                "--figure-formats", "png", "-o", "{out}/analyze", "--force"],
    "attention": ["attention", "--checkpoint", "numeric_check/data/kjv_2l.safetensors", "--text",
                  "And God said, Let there be light: and there was light. And God saw the light, that it was good",
                  "-o", "{out}/html/attention.html", "--force"],
    "attribution": ["attribute", "--checkpoint", "numeric_check/data/induction_2l.safetensors", "--tokens",
                    "5,1,2,3,4,5,1,2,3", "--target", "4", "--max-terms", "12", "--format", "html",
                    "-o", "{out}/html/attribution.html", "--force"],
    "loss": ["train-toy", "--layers", "1", "--heads", "2", "--d-model", "32", "--d-head", "8", "--d-vocab", "32",
             "--n-ctx", "32", "--seg-max", "12", "--steps", "300", "--threads", "1", "--quiet", "-o", "{out}/toy/toy1.safetensors",
             "--force"],
}
#: What the pages show, by the name the page uses (relative to ``_generated/``).
PICTURES = {
    "analyze": ["analyze/figures/profiles.png", "analyze/figures/composition.png", "analyze/figures/importance.png"],
    "attention": ["html/attention.html"],
    "attribution": ["html/attribution.html"],
    "loss": ["toy/toy1.loss.png"],
}


def make(out: Path = OUT, names=None) -> list[Path]:
    """Run the commands (all, or ``names``) from the repository's root, writing into ``out``; the files made.
    A command that fails stops the build with its output (a page must not show a picture that is not made)."""
    from derivations.cli import main

    made = []
    for name in names or COMMANDS:
        argv = [a.replace("{out}", str(out)) for a in COMMANDS[name]]
        (out / "html").mkdir(parents=True, exist_ok=True)
        printed = io.StringIO()
        with contextlib.chdir(ROOT), contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            code = main(argv)
        if code != 0:
            raise RuntimeError(f"the picture {name} ({' '.join(argv)}) exited {code}:\n{printed.getvalue()}")
        made += [out / p for p in PICTURES[name]]
    missing = [p for p in made if not p.exists()]
    if missing:
        raise RuntimeError(f"the commands did not write {', '.join(map(str, missing))}")
    return made


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for path in make():
        print(path.relative_to(ROOT))
