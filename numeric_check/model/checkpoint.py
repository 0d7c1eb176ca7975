"""Checkpoints: a :class:`CircuitModel` as a safetensors file, its config as JSON in the metadata.

The metadata holds ``format`` (``"tcircuits.CircuitModel"``), ``format_version``,
``config`` (:meth:`ModelConfig.to_dict` as JSON) and ``content_sha256`` (a hash of the
config and of every tensor's name, dtype, shape and bytes: safetensors has no checksum of
its own, so a flipped byte would load silently); the tensors are the model's
``state_dict``. Torch files (``.pt``/``.pth``, a dict ``{"config": dict, "state_dict":
...}``) are read with ``torch.load(..., weights_only=True)`` only: arbitrary objects are
never unpickled. Anything wrong with a file raises :class:`CheckpointError` naming the
path, and before anything is allocated: the config is read as bounded JSON
(:func:`read_json`), and its sizes are checked against the stored tensors' real shapes
(the model the config describes is built with fake tensors first,
:func:`expected_shapes`). A file saved before content hashes loads with a
:class:`UncheckedCheckpoint` warning.

>>> import tempfile, os
>>> from derivations.architecture import Architecture
>>> model = CircuitModel.random(Architecture(1, 2), d_model=4, d_head=2, d_vocab=5, n_ctx=3)
>>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
>>> digest = save_checkpoint(model, path)
>>> torch.equal(load_checkpoint(path).W_E, model.W_E)
True
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import re
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save

from tensoralg.escape import terminal_safe

from numeric_check.errors import CheckpointError, ConfigError, DeviceError, OutputPathError, UncheckedCheckpoint, WeightError
from numeric_check.files import MAX_INT_DIGITS, MAX_JSON_DEPTH, read_json, write_atomic
from numeric_check.files import MAX_JSON_CHARS, read_text_file  # noqa: F401 - kept for compatibility: they were defined here
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.config import ModelConfig, resolve_device, resolve_dtype

FORMAT = "tcircuits.CircuitModel"
FORMAT_VERSION = 1
TORCH_SUFFIXES = (".pt", ".pth")
#: The dtypes a checkpoint's weights may have (float8 and integer tensors cannot run the model).
WEIGHT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
HALF_DTYPES = (torch.float16, torch.bfloat16)  # stored so, loaded as float32 unless a dtype is asked for


def save_checkpoint(model: CircuitModel, path: str | os.PathLike) -> str:
    """Write ``model`` to ``path`` as safetensors (atomically: a temporary file, then a rename);
    return its content hash (what :func:`stored_content_hash` reads back).

    Refuses NaN/Inf weights (:class:`WeightError`) and torch-file suffixes (``.pt``, ``.pth``).
    """
    path = checkpoint_path(path)
    data, content = checkpoint_bytes(model)
    try:
        write_atomic(path, data)
    except OutputPathError as err:
        raise CheckpointError(f"cannot save {path}: {err}") from None
    return content


def checkpoint_path(path: str | os.PathLike) -> Path:
    """``path`` checked as a place to save a checkpoint: a ``.safetensors`` name in a folder that exists."""
    path = Path(path)
    if path.suffix in TORCH_SUFFIXES:
        raise CheckpointError(f"cannot save {path}: checkpoints are written as safetensors; use a .safetensors path")
    if not path.parent.is_dir():
        raise CheckpointError(f"cannot save {path}: directory {path.parent} does not exist")
    return path


def checkpoint_bytes(model: CircuitModel) -> tuple[bytes, str]:
    """``model`` as the bytes of a safetensors checkpoint, and its content hash (to write it together
    with other files: :func:`numeric_check.files.write_together`)."""
    if not isinstance(model, CircuitModel):
        raise CheckpointError(f"save_checkpoint expects a CircuitModel, got {type(model).__name__}")
    model.check_finite()
    tensors = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "config": json.dumps(model.cfg.to_dict()),
                "content_sha256": content_hash(tensors, model.cfg.to_dict())}
    return save(tensors, metadata=metadata), metadata["content_sha256"]


def stored_content_hash(path: str | os.PathLike) -> str | None:
    """The content hash a safetensors checkpoint records (its metadata only is read); None for
    a torch file, a file saved before content hashes, or one that cannot be read."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            stored = (f.metadata() or {}).get("content_sha256")
    except Exception:  # noqa: BLE001 - unreadable: load_checkpoint names the problem
        return None
    return stored if isinstance(stored, str) else None


def load_checkpoint(path: str | os.PathLike, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> CircuitModel:
    """Read a checkpoint written by :func:`save_checkpoint` (or a ``.pt``/``.pth`` torch file).

    ``dtype`` defaults to the stored one, widened to float32 where that is half precision (float16,
    bfloat16: a size to store, not to compute in; a CPU without half-precision arithmetic runs it several
    times slower, and every result keeps three digits); ``device`` defaults to CPU.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} is not a file")
    try:
        target_device, target_dtype = resolve_device(device), None if dtype is None else resolve_dtype(dtype)
    except DeviceError as err:
        raise CheckpointError(f"cannot load {path}: {err}") from None
    if target_dtype is not None and target_dtype not in WEIGHT_DTYPES:
        raise CheckpointError(f"cannot load {path} as {target_dtype}: {_dtypes_expected()}")
    if path.suffix in TORCH_SUFFIXES:
        config, tensors, stored_hash = _read_torch(path)
    else:
        config, tensors, stored_hash = _read_safetensors(path)
    _check_plain(config, f"the config of checkpoint {path}")
    try:
        cfg = ModelConfig.from_dict(config)
    except ConfigError as err:
        raise CheckpointError(f"checkpoint {path} has a bad config: {err}") from None
    _check_tensors(expected_shapes(cfg), tensors, path, cfg)  # before the model is allocated
    _check_hash(stored_hash, tensors, config, path)
    stored_dtype = tensors["W_E"].dtype
    computed = torch.float32 if stored_dtype in HALF_DTYPES else stored_dtype
    model = CircuitModel(cfg, dtype=target_dtype or computed, device="cpu")
    with torch.no_grad():
        for name, param in model.state_dict().items():
            param.copy_(tensors[name])
    try:
        model.check_finite()
    except WeightError as err:
        raise CheckpointError(f"checkpoint {path} is unusable: {err}") from None
    return model.to(target_device)


def _read_safetensors(path: Path) -> tuple[Any, dict[str, torch.Tensor], str | None]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            _check_format(path, metadata.get("format"), metadata.get("format_version"))
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except CheckpointError:
        raise
    except Exception as err:  # safetensors raises its own error types for corrupt or truncated files
        if not _utf8_path(path):
            raise CheckpointError(f"cannot read checkpoint {terminal_safe(ascii(str(path)))}: its file name is not UTF-8 "
                                  "(the safetensors reader needs one); rename the file") from None
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated (not a readable safetensors file): {err}") from None
    if "config" not in metadata:
        raise CheckpointError(f"checkpoint {path} has no model config in its metadata")
    try:
        config = read_json(metadata["config"], "the config", CheckpointError)
    except CheckpointError as err:
        raise CheckpointError(f"checkpoint {path} has no readable model config in its metadata: {err}") from None
    stored_hash = metadata.get("content_sha256")
    return config, tensors, stored_hash


_GLOBAL = re.compile(r"unsupported global:?\s*(?:GLOBAL\s+)?([\w.]+)", re.IGNORECASE)


def _unpickler_detail(message: str) -> str:
    """The unpickler's own complaint inside torch's weights-only error message: the refused
    global by name (``posix.system``) when there is one."""
    if m := _GLOBAL.search(message):
        return f"Unsupported global: {m[1]}"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            rest = line.split("WeightsUnpickler error:", 1)[1].strip()
            return rest or (lines[i + 1] if i + 1 < len(lines) else "unreadable")
    return lines[-1] if lines else "unreadable"


def _utf8_path(path: Path) -> bool:
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8, kept as surrogates
        return False
    return True


def _read_torch(path: Path) -> tuple[Any, dict[str, torch.Tensor], str | None]:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's message opens with advice to retry with weights_only=False: never pass that on.
        detail = _unpickler_detail(str(err))
        if "Unsupported global" in detail:
            name = detail.split("Unsupported global:", 1)[1].split(" was not an allowed global")[0].strip()
            raise CheckpointError(
                f"checkpoint {path} holds the Python object {name}, not only tensors and plain containers; "
                "refusing to unpickle it: only weights_only=True loading is allowed"
            ) from None
        raise CheckpointError(f"checkpoint {path} is corrupt or not a torch checkpoint ({detail})") from None
    except RecursionError:  # containers nested ever deeper: the unpickler recurses
        raise CheckpointError(f"checkpoint {path} nests its containers too deep to be a checkpoint") from None
    except Exception as err:  # zip and pickle errors for corrupt or truncated files
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated (not a readable torch file): {err}") from None
    if not isinstance(data, dict) or not {"config", "state_dict"} <= set(data):
        got = sorted(data, key=repr) if isinstance(data, dict) else type(data).__name__
        raise CheckpointError(f"torch checkpoint {path} must be a dict with 'config' and 'state_dict', got {got}")
    if "format_version" in data:
        _check_format(path, FORMAT, str(data["format_version"]))
    state = data["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"torch checkpoint {path}: 'state_dict' must map names to tensors")
    stored_hash = data.get("content_sha256")
    if stored_hash is not None and not isinstance(stored_hash, str):
        raise CheckpointError(f"torch checkpoint {path}: 'content_sha256' must be a string, got {type(stored_hash).__name__}")
    return data["config"], state, stored_hash


def _check_format(path: Path, fmt: Any, version: Any) -> None:
    if fmt != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a tcircuits CircuitModel checkpoint (format {fmt!r}, expected {FORMAT!r})")
    if version != str(FORMAT_VERSION):
        raise CheckpointError(f"checkpoint {path} has format version {version!r}; this version of tcircuits reads version {FORMAT_VERSION}")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The name and shape of every tensor of a model of ``cfg``, found without allocating
    them: the model is built from fake tensors (shapes and dtypes only), so a config that
    claims ``d_vocab=10**8`` costs nothing until its sizes have met the file's tensors.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode  # heavy to import: only when a checkpoint is loaded

    with FakeTensorMode():
        model = CircuitModel(cfg, dtype=torch.float32, device="cpu")
        return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _check_tensors(expected: Mapping[str, tuple], tensors: Mapping[str, torch.Tensor], path: Path, cfg: ModelConfig) -> None:
    """Names, shapes, dtypes and storage of the stored tensors against those the config implies."""
    missing, unexpected = sorted(set(expected) - set(tensors), key=repr), sorted(set(tensors) - set(expected), key=repr)
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path} does not match its config ({cfg.arch.describe()}): "
            f"missing {missing or 'nothing'}, unexpected {unexpected or 'nothing'}"
        )
    for name, tensor in tensors.items():
        if tensor.layout != torch.strided or tensor.is_meta or tensor.is_quantized:
            kind = "a meta tensor (no data)" if tensor.is_meta else f"a {tensor.layout} tensor"
            raise CheckpointError(f"checkpoint {path}: {name} is {kind}; expected a dense tensor with its values")
        if tuple(tensor.shape) != expected[name]:
            raise CheckpointError(
                f"checkpoint {path}: {name} has shape {tuple(tensor.shape)}, expected {expected[name]} from its config "
                f"(d_model={cfg.d_model}, d_head={cfg.d_head}, d_vocab={cfg.d_vocab}, n_ctx={cfg.n_ctx})"
            )
        if tensor.dtype not in WEIGHT_DTYPES:
            raise CheckpointError(f"checkpoint {path}: {name} has dtype {tensor.dtype}; {_dtypes_expected()}")


def _dtypes_expected() -> str:
    return "expected one of " + ", ".join(str(d).removeprefix("torch.") for d in WEIGHT_DTYPES)


def content_hash(tensors: Mapping[str, torch.Tensor], config: Any = None) -> str:
    """SHA-256 of the config (as canonical JSON: a byte flipped in ``ln_eps`` counts, spacing
    does not) and of every tensor's name, dtype, shape and bytes, in name order: what
    ``content_sha256`` in a checkpoint's metadata holds.

    >>> content_hash({"W": torch.zeros(2, 2)}) == content_hash({"W": torch.zeros(2, 2)})
    True
    >>> content_hash({"W": torch.zeros(2, 2)}) == content_hash({"W": torch.ones(2, 2)})
    False
    >>> content_hash({"W": torch.zeros(2, 2)}, {"ln_eps": 1e-5}) == content_hash({"W": torch.zeros(2, 2)}, {"ln_eps": 1e-15})
    False
    """
    digest = hashlib.sha256()
    digest.update(json.dumps(config, sort_keys=True, separators=(",", ":")).encode() + b"\0")
    for name in sorted(tensors, key=repr):
        t = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}\0{str(t.dtype)}\0{tuple(t.shape)}\0".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def _check_hash(stored: str | None, tensors: Mapping[str, torch.Tensor], config: Any, path: Path) -> None:
    """Compare the stored content hash; a safetensors file without one loads with a warning
    (a torch file is someone else's format: without a hash it loads quietly)."""
    if stored is None and path.suffix in TORCH_SUFFIXES:
        return
    if stored is None:
        warnings.warn(f"checkpoint {path} has no content hash (saved by an older tcircuits): its tensors were "
                      "loaded unchecked; save it again to add one", UncheckedCheckpoint, stacklevel=3)
        return
    if content_hash(tensors, config) != stored:
        raise CheckpointError(f"checkpoint {path} is corrupt: its config and tensors do not match the content hash "
                              "stored when it was saved (the file changed after saving)")


def _check_plain(config: Any, what: str) -> None:
    """A config from a torch file is unpickled, not parsed: the same bounds as
    :func:`read_json` (nesting, integer sizes, finite numbers), walked without recursion."""
    stack = [(config, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise CheckpointError(f"{what} nests deeper than the {MAX_JSON_DEPTH} levels a config may")
        if isinstance(value, dict):
            stack += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, (list, tuple)):
            stack += [(v, depth + 1) for v in value]
        elif isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        elif isinstance(value, int):
            if abs(value) >= 10**MAX_INT_DIGITS:  # str() of a 5,001-digit int would itself raise
                digits = math.floor(abs(value).bit_length() * math.log10(2)) + 1
                raise CheckpointError(f"{what} holds an integer of about {digits:,} digits; sizes have at most {MAX_INT_DIGITS}")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise CheckpointError(f"{what} holds the number {value}; a config's numbers are finite")
        else:
            raise CheckpointError(f"{what} holds a {type(value).__name__}; a config holds numbers, strings, lists and dicts")
