"""numeric_check: every derived term as a number computed from a real torch model.

Models in the paper's convention (:class:`CircuitModel`) with adapters from
TransformerLens and Hugging Face GPT-2, safetensors checkpoints, binding of atoms to
tensors, verification of path expansions, factored circuits and the paper's analyses.
"""

from numeric_check.adapters import from_hf_gpt2, from_transformer_lens, to_transformer_lens
from numeric_check.checkpoint import load_checkpoint, save_checkpoint
from numeric_check.errors import (
    CheckpointError,
    ConfigError,
    DeviceError,
    HookError,
    ModelInputError,
    NumericCheckError,
    UnsupportedModel,
    WeightError,
)
from numeric_check.hooks import HookPoint
from numeric_check.model import CircuitModel, ModelConfig, resolve_device, resolve_dtype

__all__ = [
    "CheckpointError", "CircuitModel", "ConfigError", "DeviceError", "HookError", "HookPoint",
    "ModelConfig", "ModelInputError", "NumericCheckError", "UnsupportedModel", "WeightError",
    "from_hf_gpt2", "from_transformer_lens", "load_checkpoint", "resolve_device", "resolve_dtype",
    "save_checkpoint", "to_transformer_lens",
]
