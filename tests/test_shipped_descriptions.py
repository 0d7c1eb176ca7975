"""The README and the guide describe the shipped language models as their training records say they were made:
copy share, context, steps and tokens (issue 53: the descriptions had omitted the planted copies)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "numeric_check" / "data"


def _config(n_layers: int) -> dict:
    return json.loads((DATA / f"kjv_{n_layers}l.json").read_text(encoding="utf-8"))["train_config"]


def _flat(path: Path) -> str:
    """The page's text with every run of whitespace one space (a sentence may break across lines)."""
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


def _planted_words(config: dict) -> str:
    """What a description must say of the copies: planted in every sequence, in a share, or none."""
    share = config["copy_share"]
    return "every training sequence copy-augmented" if share >= 1 else (
        f"{share:.0%} of the training sequences copy-augmented" if share else "nothing planted")


def _paragraph(text: str, anchor: str) -> str:
    start = text.index(anchor)
    end = text.find("\n\n", start)
    return re.sub(r"\s+", " ", text[start:end if end != -1 else None])


def test_the_three_shipped_language_models_were_made_alike():
    configs = [{k: v for k, v in _config(n).items() if k != "n_layers"} for n in (0, 1, 2)]
    assert configs[0] == configs[1] == configs[2]


@pytest.mark.parametrize("page", ["docs/how-to/train-on-text.md"])
def test_the_guide_gives_each_record_s_budget_and_copy_share(page):
    c = _config(2)
    text = _flat(ROOT / page)
    section = text[text.index("## The shipped language models"):]
    tokens = c["steps"] * c["batch_size"] * c["n_ctx"]
    assert f"{c['steps']:,} batches of {c['batch_size']} × {c['n_ctx']} tokens" in section
    assert f"{tokens / 1e6:.1f} M tokens" in section
    assert f"copy share {c['copy_share']:g}" in section


def test_the_readme_and_the_companion_page_say_what_was_planted():
    words = _planted_words(_config(2))
    readme = _paragraph((ROOT / "README.md").read_text(encoding="utf-8"), "**The paper's companion.**")
    assert "King James Bible" in readme and words in readme, readme
    companion = _paragraph((ROOT / "docs/how-to/companion.md").read_text(encoding="utf-8"), "- **On language**")
    assert "copy share " + f"{_config(2)['copy_share']:g}" in companion, companion
