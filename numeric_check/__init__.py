"""numeric_check: every derived term as a number computed from a real torch model.

Models in the paper's convention (:class:`CircuitModel`) with adapters from
TransformerLens and Hugging Face GPT-2, safetensors checkpoints, binding of atoms to
tensors, verification of path expansions, factored circuits and the paper's analyses.
"""

from numeric_check.adapters import from_hf_gpt2, from_transformer_lens, to_transformer_lens
from numeric_check.checkpoint import load_checkpoint, save_checkpoint
from numeric_check.circuits import (
    AnalysisError,
    copying_scores,
    eigenvalue_positivity,
    k_composition_circuit,
    ov_circuit,
    ov_circuit_eigenvalues,
    ov_circuits,
    ov_eigenvalues,
    positional_qk_circuit,
    qk_circuit,
    same_matching_scores,
    virtual_ov_circuit,
)
from numeric_check.composition import COMPOSITION_KINDS, composition_baseline, composition_scores
from numeric_check.detect import HeadReport, behaviour_scores, classify_heads, detect_heads, weight_scores
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
from numeric_check.factored import Factored, FactoredError, FactoredShapeError, eigenvalue_multiset_distance
from numeric_check.hooks import HookPoint
from numeric_check.model import CircuitModel, ModelConfig, resolve_device, resolve_dtype
from numeric_check.skip_trigrams import SkipTrigramTable, skip_trigram_table

__all__ = [
    "AnalysisError", "COMPOSITION_KINDS", "Factored", "FactoredError", "FactoredShapeError", "HeadReport",
    "SkipTrigramTable", "behaviour_scores", "classify_heads", "composition_baseline", "composition_scores",
    "copying_scores", "detect_heads", "eigenvalue_multiset_distance", "eigenvalue_positivity",
    "k_composition_circuit", "ov_circuit", "ov_circuit_eigenvalues", "ov_circuits", "ov_eigenvalues",
    "positional_qk_circuit", "qk_circuit", "same_matching_scores", "skip_trigram_table", "virtual_ov_circuit",
    "weight_scores",
    "CheckpointError", "CircuitModel", "ConfigError", "DeviceError", "HookError", "HookPoint",
    "ModelConfig", "ModelInputError", "NumericCheckError", "UnsupportedModel", "WeightError",
    "from_hf_gpt2", "from_transformer_lens", "load_checkpoint", "resolve_device", "resolve_dtype",
    "save_checkpoint", "to_transformer_lens",
]
