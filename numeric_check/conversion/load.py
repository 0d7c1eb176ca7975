"""A Hugging Face model folder read as data: no code from it, no pickle that is more than tensors,
its config held to the tensors it stores and to the memory there is, before anything is built.

``--hf NAME_OR_DIR`` comes here. :func:`model_folder` finds the folder (a path, or a name in the
Hugging Face cache, downloaded when the hub can be reached — at once an error naming the cache when
it cannot); :func:`load_model` and :func:`load_tokenizer` read it:

1. ``config.json`` is bounded JSON of a model type this transformers knows; ``auto_map`` (code
   beside the weights) is refused by name, and ``trust_remote_code`` is always ``False``, so
   nothing is asked on standard input and no ``.py`` file of the folder runs.
2. The weights are ``model.safetensors`` (or its shards), whose headers give every stored
   tensor's name and shape without reading the data, or ``pytorch_model.bin`` read by torch's
   weights-only unpickler (a pickle that holds more than tensors is refused, with no advice to
   read it otherwise).
3. The config's layer count is held to the layers the weights hold (``n_layer = 10**6`` is
   refused in a line, not built for minutes); then the model is built on the ``meta`` device (no
   memory), its shapes compared with the stored ones and its size with the memory available.
4. ``from_pretrained(..., output_loading_info=True)``: tensors missing from the folder, stored
   but unused, or of another shape are an error that lists them, before any conversion.

Every failure is one :class:`~numeric_check.errors.ModelLoadError` line (transformers' tables and
terminal escapes are reduced to their words: :func:`one_line`).
"""

from __future__ import annotations

import os
import re
import struct
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from numeric_check.errors import ModelLoadError, UnsupportedModel
from numeric_check.files import read_json, read_text_file
from numeric_check.conversion.hub import (  # noqa: F401 - the hub's checks, named here as before
    cache_holds_models, check_hub_environment, hub_offline, hub_reachable, offline_message,
)

#: weight files read, in the order transformers prefers them
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLE, PICKLE_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
#: files other libraries save weights in, which are not read here
FOREIGN_WEIGHTS = ("tf_model.h5", "flax_model.msgpack", "model.ckpt.index", "consolidated.safetensors")
#: files a tokenizer is saved in (one of them is enough)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.tiktoken")
MAX_CONFIG_KEYS = 2_000  # keys of config.json read at all (numeric_check.conversion.options bounds the unknown ones)
MAX_HEADER_BYTES = 100_000_000  # a safetensors header: ~150 bytes a tensor; 100 MB is ~600,000 tensors
LISTED = 6  # tensor names shown in an error before "… and N more"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")


def one_line(error: BaseException | str, limit: int = 300) -> str:
    """An error message as one line: terminal escapes dropped, table rules and runs of space
    collapsed, cut at ``limit`` characters.

    >>> one_line("\\x1b[1mLOAD REPORT\\x1b[0m\\n| key | status |\\n|-----|--------|\\n| a.b | MISSING |")
    'LOAD REPORT key status a.b MISSING'
    """
    text = _ANSI.sub("", str(error))
    text = re.sub(r"[|+]?[-=+|:]{3,}[|+]?", " ", text)  # |-----|---| rules
    text = " ".join(text.replace("|", " ").split())
    return (text[: limit - 1] + "…" if len(text) > limit else text) or type(error).__name__


# -- where the folder is ---------------------------------------------------------------------

def model_folder(name: str, revision: str | None = None) -> Path:
    """The folder ``--hf name`` means: ``name`` itself when it is a folder, else the snapshot of the
    Hugging Face model ``name`` in the cache, downloaded first when the hub can be reached.

    >>> model_folder("/no/such/folder")
    Traceback (most recent call last):
    numeric_check.errors.ModelLoadError: there is no such folder (give a folder saved with save_pretrained, or a model name)
    """
    path = Path(name).expanduser()
    if path.is_dir():
        if revision is not None:
            raise ModelLoadError("it is a folder, and --revision picks a version of a model on the hub; give one or the other")
        return path
    if path.exists():
        raise ModelLoadError("it is a file; give the folder saved with save_pretrained (config.json beside the weights)")
    if not _looks_like_hub_name(name):
        raise ModelLoadError("there is no such folder (give a folder saved with save_pretrained, or a model name)")
    return _hub_snapshot(name, revision)


def _looks_like_hub_name(name: str) -> bool:
    """``gpt2`` or ``org/model`` as the hub spells them (not ``./x``, ``/x``, ``~/x`` or ``a/b/c``)."""
    return (re.fullmatch(r"(?:[\w.\-]+/)?[\w.\-]+", name) is not None and len(name) <= 96
            and ".." not in name and "--" not in name and not name.startswith((".", "-")))


def _hub_snapshot(name: str, revision: str | None) -> Path:
    """The cached snapshot of ``name``, downloaded (config, tokenizer, safetensors — or the pickle
    when that is all there is) when the hub can be reached."""
    from huggingface_hub import snapshot_download

    online = hub_reachable()
    try:
        with hub_offline(not online), _quiet():
            if not online:
                return Path(snapshot_download(name, revision=revision, local_files_only=True))
            text = ["*.json", "*.txt", "*.model", "*.tiktoken"]
            folder = Path(snapshot_download(name, revision=revision, allow_patterns=text + ["*.safetensors"]))
            if not list(folder.glob("*.safetensors")):
                folder = Path(snapshot_download(name, revision=revision, allow_patterns=text + ["pytorch_model*.bin"]))
            return folder
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as error:  # noqa: BLE001 - huggingface_hub raises its own errors, OSError, ValueError, ...
        if not online and type(error).__name__ in ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "FileNotFoundError"):
            raise ModelLoadError(offline_message(name)) from None
        raise ModelLoadError(f"cannot fetch the Hugging Face model {name!r}: {one_line(error)}") from None


# -- what the folder holds -------------------------------------------------------------------

def read_config(folder: Path) -> dict:
    """``folder/config.json`` as bounded JSON, refused when it asks for code of the folder's own."""
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError("the folder holds no config.json; give the folder saved with save_pretrained")
    config = json_object(path)
    if len(config) > MAX_CONFIG_KEYS:  # before transformers makes an attribute of each
        raise ModelLoadError(f"config.json holds {len(config):,} keys, more than the {MAX_CONFIG_KEYS:,} tcircuits reads (a "
                             "config saved by transformers holds fewer than 200)")
    refuse_code(config, path)
    return config


def json_object(path: Path) -> dict:
    """A JSON object from a file of the folder, its size bounded before it is read (transformers
    reads the same file itself; a tokenizer config's ``model_max_length`` may be 10**30)."""
    import json

    try:
        data = json.loads(read_text_file(path, path.name, ModelLoadError))
    except (ValueError, RecursionError) as error:
        raise ModelLoadError(f"{path.name} is not usable JSON: {one_line(error, 120)}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path.name} must hold a JSON object, not a {type(data).__name__}")
    return data


def refuse_code(config: dict, path: Path) -> None:
    """A config that names code beside it (``auto_map``) is refused: no code runs from a model folder."""
    if "auto_map" in config:
        files = config["auto_map"].values() if isinstance(config["auto_map"], dict) else [config["auto_map"]]
        named = ", ".join(sorted({str(v if isinstance(v, str) else (v or [""])[0]) for v in files}))[:200]
        raise ModelLoadError(f"{path.name} asks for code from the folder (auto_map: {named}); tcircuits runs no code from a "
                             "model folder (trust_remote_code stays off): use a model type transformers has built in")


def stored_tensors(folder: Path) -> tuple[str, dict[str, tuple[int, ...]]]:
    """``(weights file, {name: shape})`` of the tensors the folder stores: safetensors headers, or a
    pickle read by torch's weights-only unpickler onto the ``meta`` device (no data read)."""
    if (folder / SAFETENSORS).is_file():
        return SAFETENSORS, _safetensors_shapes(folder / SAFETENSORS)
    if (folder / SAFETENSORS_INDEX).is_file():
        shapes: dict[str, tuple[int, ...]] = {}
        for shard in _shards(folder, SAFETENSORS_INDEX):
            shapes.update(_safetensors_shapes(folder / shard))
        return SAFETENSORS_INDEX, shapes
    if (folder / PICKLE).is_file():
        return PICKLE, _pickle_shapes(folder / PICKLE)
    if (folder / PICKLE_INDEX).is_file():
        shapes = {}
        for shard in _shards(folder, PICKLE_INDEX):
            shapes.update(_pickle_shapes(folder / shard))
        return PICKLE_INDEX, shapes
    others = [name for name in FOREIGN_WEIGHTS if (folder / name).exists()]
    found = f" (it holds {', '.join(others)}, which is not read)" if others else ""
    raise ModelLoadError(f"the folder holds no weights{found}: expected {SAFETENSORS} (or {SAFETENSORS_INDEX} "
                         f"with its shards) or {PICKLE}")


def _shards(folder: Path, index: str) -> list[str]:
    data = read_json(read_text_file(folder / index, index, ModelLoadError), index, ModelLoadError)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelLoadError(f"{index} must map each tensor name to a shard file (\"weight_map\")")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if Path(shard).name != shard or not (folder / shard).is_file():
            raise ModelLoadError(f"{index} names the shard {shard!r}, which is not a file of the folder")
    return shards


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape from a safetensors file's header (8 bytes of length, then JSON), checked
    against the file's size; the data is not read."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 2 <= n <= min(MAX_HEADER_BYTES, size - 8):
                raise ModelLoadError(f"{path.name} is not a safetensors file (its header length {n:,} does not fit its "
                                     f"{size:,} bytes)")
            header = read_json(f.read(n), f"the header of {path.name}", ModelLoadError)
    except OSError as error:
        raise ModelLoadError(f"cannot read {path.name}: {error.strerror or error}") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path.name} is not a safetensors file (its header is not a JSON object)")
    shapes = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ModelLoadError(f"{path.name} gives the tensor {name!r} no usable shape ({shape!r})")
        shapes[name] = tuple(shape)
    return shapes


def _pickle_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape from a ``torch.save`` file, read by torch's weights-only unpickler onto the
    ``meta`` device; a pickle holding anything but tensors is refused (and nothing of it runs)."""
    import torch

    def read(mmap: bool):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="meta", weights_only=True, mmap=mmap)

    try:
        try:
            data = read(mmap=True)
        except RuntimeError as error:
            if "mmap" not in str(error):
                raise
            data = read(mmap=False)  # the format torch.save wrote before 1.6: not mapped, still weights only
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as error:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError, ...
        raise ModelLoadError(f"{path.name} is not a file of tensors: {_pickle_reason(error)}; tcircuits reads weights only "
                             "(save the model with safetensors)") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in data.items()):
        raise ModelLoadError(f"{path.name} must hold a dict of named tensors (a state_dict)")
    return {k: tuple(v.shape) for k, v in data.items()}


def _pickle_reason(error: Exception) -> str:
    """What torch's weights-only unpickler refused, without its advice to turn the check off."""
    text = str(error)
    for pattern in (r"unsupported GLOBAL (\S+)", r"Unsupported global: GLOBAL (\S+)", r"(Unsupported operand \d+)"):
        found = re.search(pattern, text)
        if found:
            what = found.group(1)
            return f"it names {what.rstrip('.,')}" if "GLOBAL" in pattern else what[0].lower() + what[1:]
    if "weights_only" in text or "Weights only" in text:
        return "it holds more than tensors"
    return one_line(error, 160)


# -- the config held to the tensors ----------------------------------------------------------

def stored_layers(shapes) -> tuple[str, int]:
    """``(prefix, count)`` of the numbered layers the tensors hold: the container whose first
    numbered component takes the most values (``transformer.h`` of ``transformer.h.0.attn...``).
    ``shapes`` maps each tensor's name to its shape (or is the names alone); a tensor with no
    entries (a dimension 0) holds no data and makes no layer.

    >>> stored_layers(["model.layers.0.q.weight", "model.layers.1.q.weight", "model.embed.weight"])
    ('model.layers', 2)
    >>> stored_layers({"h.0.w": (4, 4), "h.1.w": (4, 4), "h.2.bias": (0,)})
    ('h', 2)
    """
    found: dict[str, set[int]] = {}
    for name in shapes:
        if isinstance(shapes, dict) and 0 in tuple(shapes[name]):
            continue
        match = re.search(r"^(.*?)\.(\d+)(?:\.|$)", name)
        if match and len(match.group(2)) <= 9:
            found.setdefault(match.group(1), set()).add(int(match.group(2)))
    if not found:
        return "", 0
    prefix = max(found, key=lambda p: len(found[p]))
    return prefix, len(found[prefix])


#: Layers a config may ask for: building a model on the meta device takes about 5 ms a layer, so this
#: bounds the work before the weights are compared (the largest published models have about 130).
MAX_LAYERS = 1000


def check_layers(config: Any, raw: dict, shapes: dict[str, tuple[int, ...]], weights: str) -> None:
    """The config's layer count is at most the layers stored (counted from tensors that hold data) and
    at most :data:`MAX_LAYERS`; checked before a layer is built (more would be built at random, and
    10**6 layers take minutes and gigabytes). Fewer than stored is left to the loading info (unused
    tensors), where a family's own extra layers are known."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None)
    if not isinstance(layers, int) or isinstance(layers, bool):
        return
    key = next((k for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers") if raw.get(k) == layers),
               "num_hidden_layers")
    prefix, stored = stored_layers(shapes)
    if layers > stored:
        where = f" ({prefix}.0 … {prefix}.{stored - 1})" if stored else ""
        raise ModelLoadError(f"config.json says {layers:,} {'layer' if layers == 1 else 'layers'} ({key}) but {weights} "
                             f"holds {stored:,}{where}; the config does not describe these weights (a layer counts where "
                             "its tensors hold data)")
    if layers > MAX_LAYERS:
        raise ModelLoadError(f"config.json says {layers:,} layers ({key}), more than the {MAX_LAYERS:,} tcircuits builds "
                             "(the largest published models have about 130)")


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (``MemAvailable``), or ``None`` when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_built_model(empty: Any, shapes: dict[str, tuple[int, ...]], weights: str, dtype: Any) -> None:
    """The model built on ``meta`` against the stored tensors (same name, other shape) and its size in
    ``dtype`` against the memory available."""
    import torch

    own = {name: tuple(t.shape) for name, t in empty.state_dict().items()}
    other = sorted(n for n in own.keys() & shapes.keys() if own[n] != shapes[n])
    if other:
        listed = [f"{n} {list(shapes[n])} (config: {list(own[n])})" for n in other]
        raise ModelLoadError(f"{weights} holds tensors of other shapes than config.json gives: {_listing(listed)}")
    size = sum(t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size())
               for t in list(empty.parameters()) + list(empty.buffers()))
    free = available_memory()
    if free is not None and size > free:
        raise ModelLoadError(f"the model config.json describes needs {_gb(size)} as {str(dtype).removeprefix('torch.')}, "
                             f"more than the {_gb(free)} of memory available (a smaller --dtype needs less)")


def _gb(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _listing(names: list[str]) -> str:
    names = sorted(names)
    more = f" … and {len(names) - LISTED:,} more" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


# -- loading ---------------------------------------------------------------------------------

@contextmanager
def _quiet():
    """transformers' and huggingface_hub's progress bars, load reports and warnings held back (what
    matters is raised as one error), then as they were."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _model_type(raw: dict, path: Path) -> str:
    from transformers import CONFIG_MAPPING, __version__

    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        shown = f"the model type {model_type!r}" if isinstance(model_type, str) else "no model_type"
        raise ModelLoadError(f"{path.name} gives {shown[:120]}, which transformers {__version__} does not have built in")
    return model_type


_VALIDATION = re.compile(r"^(?:Class )?[Vv]alidation error for (?:field|validator) '[^']*': (?:\w+(?:Error|Exception): )?")


def model_config(folder: Path) -> Any:
    """``config.json`` as transformers reads it (``AutoConfig``, no code from the folder). A config its class
    refuses (transformers 5 validates every field: a Phi-3 rope factor of the wrong length, a Mixtral expert
    count that is not an int) is one :class:`ModelLoadError` line naming the file and the field — read before
    the tokenizer, which reads the same config and would otherwise take the blame.

    Returns the config; the raw JSON is :func:`read_config`'s."""
    from transformers import AutoConfig, __version__

    raw = read_config(folder)
    model_type = _model_type(raw, folder / "config.json")
    try:
        with _quiet():
            return AutoConfig.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    except (KeyboardInterrupt, MemoryError, ModelLoadError):
        raise
    except Exception as error:  # noqa: BLE001 - a strict dataclass's TypeError or ValueError, a KeyError, ...
        detail = _VALIDATION.sub("", one_line(error, 200)) or type(error).__name__
        raise ModelLoadError(f"config.json is not a valid {model_type} config for transformers {__version__}: {detail}; "
                             "correct that field in config.json, or save the model again with save_pretrained") from None


def load_model(folder: Path, dtype: Any) -> Any:
    """The causal LM saved in ``folder`` in ``dtype`` on the CPU, in eval mode, after the checks of
    the module docstring; every failure one :class:`ModelLoadError` line."""
    import torch
    from transformers import AutoModelForCausalLM

    raw = read_config(folder)
    config = model_config(folder)
    weights, shapes = stored_tensors(folder)
    with _quiet():
        refuse_family(config)
        check_layers(config, raw, shapes, weights)

        def empty_model():
            with torch.device("meta"):
                return AutoModelForCausalLM.from_config(config, trust_remote_code=False, dtype=dtype)

        check_built_model(_transformers("build the model of config.json", empty_model), shapes, weights, dtype)
        model, info = _transformers("load the weights", lambda: AutoModelForCausalLM.from_pretrained(
            folder, trust_remote_code=False, local_files_only=True, dtype=dtype, output_loading_info=True,
            use_safetensors=weights.startswith("model.safetensors")))
    check_loading_info(info, weights)
    return model.eval()


def refuse_family(config: Any) -> None:
    """A model whose causal-LM class no reader reads (an encoder, an encoder-decoder, a vision-language model, another
    family) is refused in one :class:`~numeric_check.errors.UnsupportedModel` line before its weights are read
    (:func:`numeric_check.conversion.readers.not_read`)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from numeric_check.conversion.readers import BY_CLASS, not_read

    cls = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if cls not in BY_CLASS:
        raise UnsupportedModel(not_read((getattr(config, "architectures", None) or [cls or config.model_type])[0], config))


def check_loading_info(info: dict, weights: str) -> None:
    """transformers' loading info: any tensor the model lacks from the folder (it would be filled at
    random), stores but does not use, or stores in another shape is an error listing them."""
    parts = []
    for key, what in (("missing_keys", "missing from"), ("unexpected_keys", "not used by the model but stored in"),
                      ("mismatched_keys", "of another shape in")):
        names = [n if isinstance(n, str) else str(n[0]) for n in info.get(key) or ()]
        if names:
            parts.append(f"{len(names):,} {'tensor' if len(names) == 1 else 'tensors'} {what} {weights} "
                         f"({_listing(names)})")
    if info.get("error_msgs"):
        parts.append(one_line(info["error_msgs"][0], 160))
    if parts:
        raise ModelLoadError("the saved model is not the one config.json describes: " + "; ".join(parts))


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer saved beside the model, without code from the folder; a folder that holds no
    tokenizer, or needs a library that is missing, is one line saying what to install or pass."""
    import importlib.util

    from transformers import AutoTokenizer

    present = [name for name in TOKENIZER_FILES if (folder / name).is_file()] + [p.name for p in folder.glob("*.tiktoken")]
    if not present:
        raise ModelLoadError(f"the folder holds no tokenizer ({', '.join(TOKENIZER_FILES[:4])}, ...): save one "
                             "beside the model (tokenizer.save_pretrained) or give token ids with --tokens")
    config_path = folder / "tokenizer_config.json"
    if config_path.is_file():
        refuse_code(json_object(config_path), config_path)
    if "tokenizer.json" not in present:
        for file, module in (("tokenizer.model", "sentencepiece"), ("spiece.model", "sentencepiece"),
                             ("sentencepiece.bpe.model", "sentencepiece"), ("tokenizer.tiktoken", "tiktoken")):
            if file in present and importlib.util.find_spec(module) is None:
                raise ModelLoadError(f"the tokenizer is {file}, which needs {module}: "
                                     f"pip install {module} (or give token ids with --tokens)")
    with _quiet():
        tokenizer = _transformers("load the tokenizer", lambda: AutoTokenizer.from_pretrained(
            folder, trust_remote_code=False, local_files_only=True))
    if len(tokenizer) < 2:
        raise ModelLoadError(f"the tokenizer has an empty vocabulary; give token ids with --tokens")
    return tokenizer


def _transformers(what: str, call):
    """``call()``, a failure of transformers as one :class:`ModelLoadError` line saying ``what`` failed."""
    try:
        return call()
    except (KeyboardInterrupt, ModelLoadError, UnsupportedModel):
        raise
    except MemoryError:
        raise ModelLoadError(f"cannot {what}: out of memory") from None
    except BaseException as error:  # noqa: BLE001 - ValueError, OSError, KeyError, a Rust PanicException, ...
        if isinstance(error, SystemExit):
            raise
        detail = one_line(error)
        if isinstance(error, (KeyError, IndexError, AttributeError)) or len(detail) < 24:  # "'metadata'" alone says little
            detail = f"{type(error).__name__} {detail}"
        raise ModelLoadError(f"cannot {what}: {detail}") from None


__all__ = ["available_memory", "cache_holds_models", "check_built_model", "check_hub_environment", "check_layers", "check_loading_info", "hub_offline",
           "hub_reachable", "load_model", "load_tokenizer", "model_config", "model_folder", "offline_message", "one_line",
           "read_config", "refuse_code", "refuse_family", "stored_layers", "stored_tensors"]
