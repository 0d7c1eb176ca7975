"""The Hugging Face families tcircuits reads, one small reader per family (or per group of alike
families), each a :class:`~numeric_check.conversion.readers.common.Family`: the model classes it
covers, a function from the model to :class:`~numeric_check.conversion.build.SourceWeights`, and the
config options it understands. :func:`numeric_check.from_hf` looks a model up here by its class.
"""

from __future__ import annotations

from typing import Any

from numeric_check.conversion.readers import alibi, fairseq, falcon, gpt2, gptj, learned, llama, neox, phi
from numeric_check.conversion.readers.common import Family

FAMILIES: tuple[Family, ...] = (*gpt2.FAMILIES, *neox.FAMILIES, *gptj.FAMILIES, *llama.FAMILIES, *phi.FAMILIES,
                                *falcon.FAMILIES, *learned.FAMILIES, *fairseq.FAMILIES, *alibi.FAMILIES)
BY_CLASS: dict[str, Family] = {cls: family for family in FAMILIES for cls in family.classes}


def family_names() -> str:
    """``"GPT-2 (GPT2LMHeadModel), ..."``: what a refusal lists as read (the families registered only
    to be refused by a feature's name are not among them)."""
    return ", ".join(f"{f.name} ({', '.join(f.classes)})" for f in FAMILIES if f.converts)


def not_read(name: str, config: Any) -> str:
    """Why a model of class ``name`` with ``config`` is not read, in one line of at most :data:`REFUSAL_LENGTH`
    characters saying what it is and what to do: an encoder-decoder, a vision-language model, an encoder, or a
    causal LM of a family no reader reads.

    >>> from types import SimpleNamespace
    >>> not_read("T5ForConditionalGeneration", SimpleNamespace(model_type="t5", is_encoder_decoder=True))
    'T5ForConditionalGeneration is an encoder-decoder model; tcircuits reads decoder-only language models: give a causal LM'
    """
    from transformers.models.auto import modeling_auto

    model_type = getattr(config, "model_type", None)
    decoders = "tcircuits reads decoder-only language models"
    text = getattr(config, "text_config", None)
    if getattr(config, "is_encoder_decoder", False):
        line = f"{name} is an encoder-decoder model; {decoders}: give a causal LM"
    elif text is not None and text is not config or getattr(config, "vision_config", None) is not None:
        lm = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(text, "model_type", None), "a causal LM")
        line = f"{name} is a vision-language model; tcircuits reads its language model alone: pass {lm} built from config.text_config"
    elif model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        line = f"{name} is an encoder (it sees the whole input at once); {decoders}: give a causal LM"
    else:
        typed = f"{name} (model_type {model_type!r})" if isinstance(model_type, str) else name
        line = f"{typed} is not a family tcircuits reads; the guide's model families page (docs/reference/model-families.md) lists those it reads"
    return line[:REFUSAL_LENGTH]


REFUSAL_LENGTH = 170  # a refusal's characters at most: with the command's own "tcircuits verify: error: ", 200
