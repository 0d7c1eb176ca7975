"""Checkpoints: a :class:`CircuitModel` as a safetensors file, its config as JSON in the metadata.

The metadata holds ``format`` (``"tcircuits.CircuitModel"``), ``format_version`` and
``config`` (:meth:`ModelConfig.to_dict` as JSON); the tensors are the model's
``state_dict``. Torch files (``.pt``/``.pth``, a dict ``{"config": dict, "state_dict": ...}``)
are read with ``torch.load(..., weights_only=True)`` only: arbitrary objects are never
unpickled. Anything wrong with a file raises :class:`CheckpointError` naming the path.

>>> import tempfile, os
>>> from derivations.architecture import Architecture
>>> model = CircuitModel.random(Architecture(1, 2), d_model=4, d_head=2, d_vocab=5, n_ctx=3)
>>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
>>> save_checkpoint(model, path)
>>> torch.equal(load_checkpoint(path).W_E, model.W_E)
True
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from numeric_check.errors import CheckpointError, ConfigError, DeviceError, WeightError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.config import ModelConfig, resolve_device, resolve_dtype

FORMAT = "tcircuits.CircuitModel"
FORMAT_VERSION = 1
TORCH_SUFFIXES = (".pt", ".pth")


def save_checkpoint(model: CircuitModel, path: str | os.PathLike) -> None:
    """Write ``model`` to ``path`` as safetensors (atomically: a temporary file, then a rename).

    Refuses NaN/Inf weights (:class:`WeightError`) and torch-file suffixes (``.pt``, ``.pth``).
    """
    if not isinstance(model, CircuitModel):
        raise CheckpointError(f"save_checkpoint expects a CircuitModel, got {type(model).__name__}")
    path = Path(path)
    if path.suffix in TORCH_SUFFIXES:
        raise CheckpointError(f"cannot save {path}: checkpoints are written as safetensors; use a .safetensors path")
    if not path.parent.is_dir():
        raise CheckpointError(f"cannot save {path}: directory {path.parent} does not exist")
    model.check_finite()
    tensors = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "config": json.dumps(model.cfg.to_dict())}
    tmp = path.with_name(path.name + ".tmp")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"cannot save {path}: {err}") from err


def load_checkpoint(path: str | os.PathLike, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> CircuitModel:
    """Read a checkpoint written by :func:`save_checkpoint` (or a ``.pt``/``.pth`` torch file).

    ``dtype`` defaults to the stored one, ``device`` to CPU.
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
    if path.suffix in TORCH_SUFFIXES:
        config, tensors = _read_torch(path)
    else:
        config, tensors = _read_safetensors(path)
    try:
        cfg = ModelConfig.from_dict(config)
    except ConfigError as err:
        raise CheckpointError(f"checkpoint {path} has a bad config: {err}") from None
    stored_dtype = tensors["W_E"].dtype if "W_E" in tensors else torch.float32
    model = CircuitModel(cfg, dtype=target_dtype or stored_dtype, device="cpu")
    _load_tensors(model, tensors, path)
    try:
        model.check_finite()
    except WeightError as err:
        raise CheckpointError(f"checkpoint {path} is unusable: {err}") from None
    return model.to(target_device)


def _read_safetensors(path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            _check_format(path, metadata.get("format"), metadata.get("format_version"))
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except CheckpointError:
        raise
    except Exception as err:  # safetensors raises its own error types for corrupt or truncated files
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated (not a readable safetensors file): {err}") from None
    try:
        config = json.loads(metadata["config"])
    except (KeyError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint {path} has no readable model config in its metadata: {err}") from None
    return config, tensors


def _unpickler_detail(message: str) -> str:
    """The unpickler's own complaint inside torch's weights-only error message."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            rest = line.split("WeightsUnpickler error:", 1)[1].strip()
            return rest or (lines[i + 1] if i + 1 < len(lines) else "unreadable")
    return lines[-1] if lines else "unreadable"


def _read_torch(path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's message opens with advice to retry with weights_only=False: never pass that on.
        detail = _unpickler_detail(str(err))
        if "Unsupported global" in detail:
            detail = detail.split(" was not an allowed global")[0]  # drop torch's how-to-allow-it advice
            raise CheckpointError(
                f"checkpoint {path} holds objects other than tensors and plain containers ({detail}); "
                "refusing to unpickle them: only weights_only=True loading is allowed"
            ) from None
        raise CheckpointError(f"checkpoint {path} is corrupt or not a torch checkpoint ({detail})") from None
    except Exception as err:  # zip and pickle errors for corrupt or truncated files
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated (not a readable torch file): {err}") from None
    if not isinstance(data, dict) or not {"config", "state_dict"} <= set(data):
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise CheckpointError(f"torch checkpoint {path} must be a dict with 'config' and 'state_dict', got {got}")
    if "format_version" in data:
        _check_format(path, FORMAT, str(data["format_version"]))
    state = data["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"torch checkpoint {path}: 'state_dict' must map names to tensors")
    return data["config"], state


def _check_format(path: Path, fmt: Any, version: Any) -> None:
    if fmt != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a tcircuits CircuitModel checkpoint (format {fmt!r}, expected {FORMAT!r})")
    if version != str(FORMAT_VERSION):
        raise CheckpointError(f"checkpoint {path} has format version {version!r}; this version of tcircuits reads version {FORMAT_VERSION}")


def _load_tensors(model: CircuitModel, tensors: dict[str, torch.Tensor], path: Path) -> None:
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path} does not match its config ({model.arch.describe()}): "
            f"missing {missing or 'nothing'}, unexpected {unexpected or 'nothing'}"
        )
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"checkpoint {path}: {name} has shape {tuple(tensor.shape)}, expected {tuple(expected[name].shape)}"
            )
        if not tensor.dtype.is_floating_point:
            raise CheckpointError(f"checkpoint {path}: {name} has dtype {tensor.dtype}, expected a floating dtype")
    with torch.no_grad():
        for name, param in model.state_dict().items():
            param.copy_(tensors[name])
