"""Options by allow-list: a conversion reads the options it understands; every other option of the
source's config must be at its default, or the conversion is refused by name.

A deny-list (refuse the features we know to be unsupported) lets every option added to a
library after it was written through unread — ``use_bidirectional_attention`` on Gemma, YaRN
rope on TransformerLens — and the converted model silently computes something else. Here an
option is either understood by the reader, known :data:`HARMLESS` (it changes no value the model
computes in eval mode: token ids, dropout, caching, hook flags), or at its default.

>>> check_options({"n_layer": 2, "shout": True}, {"n_layer": 1, "shout": False}, {"n_layer"}, "the toy model")
Traceback (most recent call last):
...
numeric_check.errors.UnsupportedModel: the toy model sets shout=True (default False), an option tcircuits does not read; ...
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
import types
from typing import Any, Iterable, Mapping

from numeric_check.errors import UnsupportedModel

_MISSING = object()
LISTED_OPTIONS = 6  # options named in a refusal before "and N more"

#: Hugging Face config keys that never change what a causal LM computes in eval mode
HF_HARMLESS = frozenset({
    "_name_or_path", "architectures", "transformers_version", "model_type", "dtype", "torch_dtype", "id2label",
    "label2id", "problem_type", "finetuning_task", "tokenizer_class", "prefix", "task_specific_params",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "use_cache", "output_attentions", "output_hidden_states", "return_dict", "torchscript", "chunk_size_feed_forward",
    "initializer_range", "initializer_factor", "tie_word_embeddings",  # the readers read lm_head itself
    "attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "classifier_dropout", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "num_labels", "vocab_size", "max_position_embeddings",
    "_attn_implementation", "_attn_implementation_autoset", "_experts_implementation",
})

#: TransformerLens config fields that never change what a HookedTransformer computes (hooks,
#: devices, tokenizers, initialisation, bookkeeping), or that follow from fields read
TL_HARMLESS = frozenset({
    "device", "use_attn_result", "use_split_qkv_input", "default_prepend_bos", "dtype", "model_name", "use_hook_mlp_in",
    "use_attn_in", "from_checkpoint", "checkpoint_index", "checkpoint_label_type", "checkpoint_value",
    "tokenizer_name", "init_mode", "n_devices", "seed", "initializer_range", "init_weights", "use_hook_tokens",
    "tokenizer_prepends_bos", "trust_remote_code", "decoder_start_token_id", "tie_word_embeddings", "n_params",
    "ungroup_grouped_query_attention", "layer_norm_folding", "uses_rms_norm",
})


def check_options(options: Mapping[str, Any], defaults: Mapping[str, Any], understood: Iterable[str], source: str,
                  harmless: Iterable[str] = ()) -> None:
    """Refuse, naming each, the options in ``options`` that are neither ``understood`` nor
    ``harmless`` and differ from their value in ``defaults`` (absent there: any value but None, which is unset)."""
    allowed = set(understood) | set(harmless)
    unread = []
    for key, value in options.items():
        default = defaults.get(key, _MISSING)
        if key not in allowed and not _same(value, default) and not (default is _MISSING and value is None):  # null: unset
            unread.append(f"{key}={value!r} (default {'not set' if default is _MISSING else repr(default)})")
    if unread:
        what = "an option" if len(unread) == 1 else "options"
        if len(unread) > LISTED_OPTIONS:
            unread = unread[:LISTED_OPTIONS] + [f"{len(unread) - LISTED_OPTIONS:,} more"]
        raise UnsupportedModel(
            f"{source} sets {' and '.join(unread)}, {what} tcircuits does not read; converting the model without "
            f"{'it' if len(unread) == 1 else 'them'} would give a different model, so it is refused (options are read by allow-list)"
        )


#: a key transformers 5 reads -> the keys transformers 4 spelt the same options with (a reader that understands the
#: first reads the others too: :func:`numeric_check.conversion.readers.common.rope_parameters`)
HF_4X_SPELLINGS = {
    "rope_parameters": frozenset({"rope_theta", "rope_scaling", "partial_rotary_factor", "rope_local_base_freq"}),
}


def check_hf_options(config: Any, understood: Iterable[str], source: str, model: Any = None) -> None:
    """:func:`check_options` for a Hugging Face ``PretrainedConfig``: the defaults are those of a
    config of the same class built with no arguments. Options transformers 4 spelt otherwise
    (:data:`HF_4X_SPELLINGS`) are understood with the option they became. A stray key (one the config
    class does not define, kept from a checkpoint's config.json) that no code of ``model``'s class
    names (:func:`named_in_code`) is ignored by the source, so it is not refused either."""
    understood = set(understood)
    understood |= {old for new, olds in HF_4X_SPELLINGS.items() if new in understood for old in olds}
    options = config.to_dict()
    defaults = hf_defaults(type(config), {key: options[key] for key in understood if key in options})
    stray = set()
    if model is not None and defaults:  # only the keys that would be refused are looked for in the code
        unread = {key for key in options if key not in defaults and key not in understood and key not in HF_HARMLESS}
        if len(unread) > MAX_UNKNOWN_KEYS:
            raise UnsupportedModel(f"{source}'s config sets {len(unread):,} keys its class does not define, more than the "
                                   f"{MAX_UNKNOWN_KEYS:,} tcircuits looks for in the model's code (a config.json saved by "
                                   "transformers holds a few dozen); it is refused")
        stray = {key for key in unread if not named_in_code(type(model), key)}
    check_options(options, defaults, understood, source, HF_HARMLESS | stray)


def hf_defaults(config_class: type, understood: Mapping[str, Any]) -> dict[str, Any]:
    """What ``config_class`` holds when built from the ``understood`` options alone: the value of every
    other option that follows from them. A newer transformers may write a mirror of an option a reader
    understands (transformers 5.25's ``FalconConfig`` sets ``num_key_value_heads`` from ``num_kv_heads``,
    ``multi_query`` and ``new_decoder_architecture``): at the value it follows from, it is no option of the
    user's; set otherwise, it is refused as any other. A class that cannot be built from them: its bare
    defaults; one that needs arguments: none.

    >>> class Mirrored:  # a config that derives one option from another, as a newer release might
    ...     def __init__(self, heads=1): self.heads, self.kv_heads = heads, heads
    ...     def to_dict(self): return vars(self).copy()
    >>> hf_defaults(Mirrored, {"heads": 4})
    {'heads': 4, 'kv_heads': 4}
    """
    for arguments in (dict(understood), {}):
        try:
            return config_class(**arguments).to_dict()
        except Exception:  # noqa: BLE001 - a constructor's own validation: try the bare defaults, then none
            continue
    return {}


#: Keys of a config its class does not define that are looked up in the model's code, at most (a config
#: saved by transformers has none or a handful; each is a set lookup, the words read once per class).
MAX_UNKNOWN_KEYS = 1000


def named_in_code(model_class: type, key: str) -> bool:
    """Whether ``key`` appears as a word in the code a Hugging Face model class runs: its modeling and
    configuration modules and the transformers modules they draw on (rope, masks, attention kernels,
    ``modeling_utils``; not ``transformers.utils``' docstrings and logging). A key no such code names
    cannot change what the model computes; code whose source cannot be read may name anything, and so
    may a key that is not a word (the code is read once into its set of words: a lookup per key)."""
    words = _words_of(model_class)
    return words is None or not _WORD.fullmatch(key) or key in words


_WORD = re.compile(r"\w+")


@functools.lru_cache(maxsize=64)
def _words_of(model_class: type) -> frozenset[str] | None:
    code = _code_of(model_class)
    return None if code is None else frozenset(_WORD.findall(code))


@functools.lru_cache(maxsize=64)
def _code_of(model_class: type) -> str | None:
    module = sys.modules.get(model_class.__module__)
    if module is None:
        return None
    modules = {module}
    for obj in list(vars(module).values()):
        name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
        found = sys.modules.get(name) if isinstance(name, str) else None
        if found is not None and name.startswith("transformers.") and not name.startswith(
                ("transformers.utils", "transformers.generation")):
            modules.add(found)
    try:
        return "\n".join(inspect.getsource(found) for found in modules)
    except (OSError, TypeError):  # no source to read
        return None


def check_tl_options(cfg: Any, understood: Iterable[str], source: str) -> None:
    """:func:`check_options` for a TransformerLens ``HookedTransformerConfig``: the defaults are a
    config built from the understood fields alone (so fields derived from them agree)."""
    understood = set(understood)
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
    defaults = type(cfg)(**{k: v for k, v in fields.items() if k in understood | TL_HARMLESS})
    check_options(fields, {f: getattr(defaults, f) for f in fields}, understood, source, TL_HARMLESS)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) or (a != a and b != b)  # NaN defaults equal themselves
    except Exception:  # noqa: BLE001 - tensors, arrays: an ambiguous comparison is a difference
        return a is b
