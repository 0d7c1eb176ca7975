"""The Hugging Face families tcircuits reads, one small reader per family (or per group of alike
families), each a :class:`~numeric_check.model.readers.common.Family`: the model classes it
covers, a function from the model to :class:`~numeric_check.model.build.SourceWeights`, and the
config options it understands. :func:`numeric_check.from_hf` looks a model up here by its class.
"""

from __future__ import annotations

from numeric_check.model.readers import alibi, fairseq, falcon, gpt2, gptj, learned, llama, neox, phi
from numeric_check.model.readers.common import Family

FAMILIES: tuple[Family, ...] = (*gpt2.FAMILIES, *neox.FAMILIES, *gptj.FAMILIES, *llama.FAMILIES, *phi.FAMILIES,
                                *falcon.FAMILIES, *learned.FAMILIES, *fairseq.FAMILIES, *alibi.FAMILIES)
BY_CLASS: dict[str, Family] = {cls: family for family in FAMILIES for cls in family.classes}


def family_names() -> str:
    """``"GPT-2 (GPT2LMHeadModel), ..."``: what a refusal lists as read (the families registered only
    to be refused by a feature's name are not among them)."""
    return ", ".join(f"{f.name} ({', '.join(f.classes)})" for f in FAMILIES if f.converts)
