"""A model's sizes and how to run it: :class:`ModelConfig`, activation functions, dtypes and devices.

A config is the architecture (:class:`~derivations.architecture.Architecture`) plus the sizes
the algebra leaves symbolic (``d_model``, ``d_head``, ``d_vocab``, ``n_ctx``, ``d_mlp``); it
is validated when built and round-trips through JSON (checkpoints store it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from derivations.architecture import Architecture
from derivations.errors import ArchitectureError
from tensoralg.errors import TensorAlgError
from tensoralg.rotary import rotary_dims
from numeric_check.errors import ConfigError, DeviceError


ACT_FNS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,  # exact (erf) GELU
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's tanh approximation
    "relu": F.relu,
    "silu": F.silu,  # SwiGLU's gate (Llama, Qwen2, Mistral)
    "relu2": lambda x: F.relu(x).square(),  # squared ReLU (Persimmon, Nemotron, Arcee, Jais 2)
}


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The device a person asked for, decided once at the edge (a command's ``--device``, a ``device=``
    argument): ``None`` or ``"auto"`` is the current CUDA device when CUDA is present, else the CPU;
    ``"cuda"`` is the current CUDA device, ``"cuda:N"`` that one. Code inside follows its input's
    device and never calls this with ``None``.

    Raises :class:`~numeric_check.errors.DeviceError` naming the device and what to use instead.

    >>> resolve_device("cpu")
    device(type='cpu')
    >>> resolve_device("tpu")
    Traceback (most recent call last):
    numeric_check.errors.DeviceError: unknown device 'tpu'; expected 'auto', 'cpu', 'cuda' or 'cuda:N'
    """
    if device is None or device == "auto":
        return torch.device("cuda", _current_cuda()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise DeviceError(f"unknown device {device!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'") from err
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise DeviceError(f"device type {device.type!r} is not supported; expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else "no CUDA device is visible"
        raise DeviceError(f"device {str(device)!r} requested but CUDA is not available here ({build}); use --device cpu")
    count = torch.cuda.device_count()
    if device.index is None:
        return torch.device("cuda", _current_cuda())
    if device.index >= count:
        raise DeviceError(f"device {str(device)!r} does not exist: this machine has {count} CUDA device"
                          f"{'s' if count != 1 else ''} (cuda:0{f'..cuda:{count - 1}' if count > 1 else ''}); "
                          "name one of them or use --device cpu")
    return device


def _current_cuda() -> int:
    """The current CUDA device's index, without starting CUDA (and its threads) when nothing has yet:
    until then it is device 0 of those visible."""
    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A floating-point ``torch.dtype`` from a dtype or its name (``"float64"``).

    >>> resolve_dtype("float64")
    torch.float64
    """
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, dtype)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise DeviceError(
            f"dtype {dtype!r} cannot hold weights; expected a floating dtype "
            "(torch.float64, torch.float32, torch.float16, torch.bfloat16)"
        )
    return dtype


def _check_int(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and options of a :class:`CircuitModel`; validated on construction.

    >>> cfg = ModelConfig(Architecture(1, 2, mlp=True), d_model=8, d_head=4, d_vocab=10, n_ctx=5)
    >>> cfg.d_mlp
    32
    >>> ModelConfig.from_dict(cfg.to_dict()) == cfg
    True
    """

    arch: Architecture
    d_model: int
    d_head: int
    d_vocab: int
    n_ctx: int
    d_mlp: int | None = None
    act_fn: str = "gelu"
    ln_eps: float = 1e-5
    attn_scale: float | None = None
    gated_mlp: bool = False
    rotary_base: float = 10000.0
    alibi_slopes: tuple[float, ...] | None = None  # one per head; None: the standard slopes (BLOOM's rule)
    #: the dtype in which the ALiBi bias ``m_h · j`` is made from the slopes rounded to it, then divided by
    #: ``alibi_divisor`` (Falcon: "bfloat16", sqrt(d_head)); None: ``m_h (j − i)`` exact
    alibi_rounding: str | None = None
    alibi_divisor: float = 1.0
    rotary_inv_freq: tuple[float, ...] | None = None  # rope scaling: θ_f themselves, rotary_dims/2; None: base^(-2f/d)
    rotary_factor: float = 1.0  # rope scaling's attention factor (YaRN) on the rotated dimensions of q and k
    moe_renormalise: bool = True  # mixture of experts: the top-k routing weights renormalised to sum to 1 (Mixtral)

    def __post_init__(self) -> None:
        if not isinstance(self.arch, Architecture):
            raise ConfigError(f"arch must be a derivations.Architecture, got {self.arch!r}")
        for name in ("d_model", "d_head", "d_vocab", "n_ctx"):
            _check_int(name, getattr(self, name))
        if self.arch.mlp:
            if self.d_mlp is None:
                object.__setattr__(self, "d_mlp", 4 * self.d_model)
            _check_int("d_mlp", self.d_mlp)
        elif self.d_mlp is not None:
            raise ConfigError(f"d_mlp={self.d_mlp!r} given but the architecture has no MLPs; leave it None")
        if self.act_fn not in ACT_FNS:
            raise ConfigError(f"unknown act_fn {self.act_fn!r}; expected one of {', '.join(map(repr, ACT_FNS))}")
        if isinstance(self.ln_eps, bool) or not isinstance(self.ln_eps, (int, float)) or not (
            math.isfinite(self.ln_eps) and self.ln_eps >= 0
        ):
            raise ConfigError(f"ln_eps must be a finite number >= 0, got {self.ln_eps!r}")
        if self.attn_scale is not None and (
            isinstance(self.attn_scale, bool)
            or not isinstance(self.attn_scale, (int, float))
            or not (math.isfinite(self.attn_scale) and 1e-100 <= self.attn_scale <= 1e100)  # its square is a size
        ):
            raise ConfigError(f"attn_scale must be None or a number in 1e-100..1e100, got {self.attn_scale!r}")
        object.__setattr__(self, "ln_eps", float(self.ln_eps))
        if not isinstance(self.gated_mlp, bool):
            raise ConfigError(f"gated_mlp must be True or False, got {self.gated_mlp!r}")
        if self.gated_mlp and not self.arch.mlp:
            raise ConfigError("gated_mlp=True but the architecture has no MLPs; pass mlp=True in the Architecture")
        if isinstance(self.rotary_base, bool) or not isinstance(self.rotary_base, (int, float)) or not (
            math.isfinite(self.rotary_base) and self.rotary_base > 1
        ):
            raise ConfigError(f"rotary_base must be a finite number > 1, got {self.rotary_base!r}")
        object.__setattr__(self, "rotary_base", float(self.rotary_base))
        self._check_alibi()
        self._check_rope_scaling()
        if not isinstance(self.moe_renormalise, bool):
            raise ConfigError(f"moe_renormalise must be True or False, got {self.moe_renormalise!r}")
        if self.arch.rotary is not None:
            try:
                rotary_dims(self.d_head, self.arch.rotary)
            except TensorAlgError as err:
                raise ConfigError(f"bad rotary for d_head={self.d_head}: {err}") from None

    def _check_alibi(self) -> None:
        if self.alibi_rounding not in (None, "bfloat16", "float16"):
            raise ConfigError(f"alibi_rounding must be None, 'bfloat16' or 'float16', got {self.alibi_rounding!r}")
        divisor = self.alibi_divisor
        if isinstance(divisor, bool) or not isinstance(divisor, (int, float)) or not (math.isfinite(divisor) and divisor > 0):
            raise ConfigError(f"alibi_divisor must be a finite number > 0, got {divisor!r}")
        object.__setattr__(self, "alibi_divisor", float(divisor))
        slopes = self.alibi_slopes
        if slopes is None:
            return
        if not self.arch.alibi:
            raise ConfigError("alibi_slopes given but the architecture has no ALiBi; pass alibi=True in the Architecture")
        try:
            slopes = tuple(float(m) for m in slopes)
        except (TypeError, ValueError):
            raise ConfigError(f"alibi_slopes must be one number per head, got {self.alibi_slopes!r}") from None
        if not all(math.isfinite(m) for m in slopes) or any(n != len(slopes) for n in self.arch.heads_per_layer):
            raise ConfigError(f"alibi_slopes must be {'/'.join(map(str, sorted(set(self.arch.heads_per_layer))))} finite "
                              f"numbers, one per head of every layer; got {len(slopes)}")
        object.__setattr__(self, "alibi_slopes", slopes)

    def _check_rope_scaling(self) -> None:
        factor = self.rotary_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (math.isfinite(factor) and factor > 0):
            raise ConfigError(f"rotary_factor must be a finite number > 0, got {factor!r}")
        object.__setattr__(self, "rotary_factor", float(factor))
        inv = self.rotary_inv_freq
        if inv is None:
            if self.arch.rotary is None and factor != 1.0:
                raise ConfigError("rotary_factor given but the architecture has no rotary; pass rotary= in the Architecture")
            return
        if self.arch.rotary is None:
            raise ConfigError("rotary_inv_freq given but the architecture has no rotary; pass rotary= in the Architecture")
        try:
            inv = tuple(float(f) for f in inv)
        except (TypeError, ValueError):
            raise ConfigError(f"rotary_inv_freq must be numbers, one per rotated plane, got {self.rotary_inv_freq!r}") from None
        planes = rotary_dims(self.d_head, self.arch.rotary) // 2
        if len(inv) != planes or not all(math.isfinite(f) and f >= 0 for f in inv):
            raise ConfigError(f"rotary_inv_freq must be {planes} finite numbers >= 0 (one per rotated plane of "
                              f"{2 * planes} dimensions), got {len(inv)}")
        object.__setattr__(self, "rotary_inv_freq", inv)

    @property
    def rotary_args(self) -> tuple | None:
        """What :func:`~numeric_check.model.rotary.rotate` takes after the tensor: ``(rotary_dims, style, base,
        inv_freq, factor)``, or ``None`` without rotary."""
        if self.arch.rotary is None:
            return None
        return (self.rotary_dims, self.arch.rotary_style, self.rotary_base, self.rotary_inv_freq, self.rotary_factor)

    @property
    def rotary_dims(self) -> int | None:
        """The rotated dimensions of each head (``int(d_head · rotary)``, even), or ``None`` without rotary."""
        return None if self.arch.rotary is None else rotary_dims(self.d_head, self.arch.rotary)

    @property
    def scale(self) -> float:
        """The divisor of ``q·k``: ``attn_scale``, or ``sqrt(d_head)`` when that is None."""
        return math.sqrt(self.d_head) if self.attn_scale is None else float(self.attn_scale)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; :meth:`from_dict` inverts it."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "arch"}
        for name in ("alibi_slopes", "rotary_inv_freq"):
            if data[name] is not None:
                data[name] = list(data[name])
        # the architecture's constructor arguments only: fields it derives (heads_per_layer, ...) are rebuilt
        arch = {f.name: getattr(self.arch, f.name) for f in fields(self.arch) if f.init}
        arch = {name: list(value) if isinstance(value, tuple) else value for name, value in arch.items()}
        return {"arch": arch, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        """Rebuild a config from :meth:`to_dict` output; unknown or missing keys are errors."""
        if not isinstance(data, dict):
            raise ConfigError(f"a model config must be a dict, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known, key=repr)
        if unknown:
            raise ConfigError(f"unknown model config keys {unknown}; expected some of {sorted(known)}")
        arch = data.get("arch")
        if not isinstance(arch, dict):
            raise ConfigError(f"model config needs 'arch' as a dict of Architecture fields, got {arch!r}")
        try:
            arch = Architecture(**{**arch, "n_heads": _heads_from_json(arch.get("n_heads"))})
            lists = {name: tuple(data[name]) for name in ("alibi_slopes", "rotary_inv_freq") if isinstance(data.get(name), list)}
            return cls(**{**data, "arch": arch, **lists})
        except TypeError as err:  # a missing or unexpected field
            raise ConfigError(f"bad model config {data!r}: {err}") from None
        except ArchitectureError as err:
            raise ConfigError(f"bad architecture in model config: {err}") from None


def _heads_from_json(n_heads: Any) -> Any:
    return tuple(n_heads) if isinstance(n_heads, list) else n_heads
