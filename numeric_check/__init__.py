"""numeric_check: every derived term as a number computed from a real torch model.

Models in the paper's convention (:class:`CircuitModel`) with adapters from
TransformerLens and Hugging Face GPT-2, safetensors checkpoints, binding of atoms to
tensors, verification of path expansions, factored circuits and the paper's analyses.

Names are imported on first use (PEP 562), so ``import numeric_check`` — and the
``tcircuits`` command line, which discovers its subcommands here — does not pay for
torch until something needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS: dict[str, tuple[str, ...]] = {
    "numeric_check.errors": (
        "AnalysisError", "AttributionError", "CheckpointError", "ConfigError", "DeviceError", "ExpansionMismatch",
        "FactoredError", "FactoredShapeError", "HookError", "ModelInputError", "ModelLoadError", "NumericCheckError",
        "SourceMismatch", "SourcePrecisionError", "UnsupportedModel", "VerifyError",
        "WeightError",
    ),
    "numeric_check.model.circuit_model": ("CircuitModel",),
    "numeric_check.model.config": ("ModelConfig", "resolve_device", "resolve_dtype"),
    "numeric_check.model.hooks": ("Constant", "HookPoint"),
    "numeric_check.conversion.adapters": ("from_tl", "from_transformer_lens", "to_transformer_lens"),
    "numeric_check.conversion.hf": ("from_hf", "from_hf_gpt2"),
    "numeric_check.conversion.source_check": ("SourceCheck",),
    "numeric_check.conversion.tl_folder": ("load_tl", "save_tl"),
    "numeric_check.model.checkpoint": ("load_checkpoint", "save_checkpoint"),
    "numeric_check.circuits.factored": ("Factored", "eigenvalue_multiset_distance"),
    "numeric_check.circuits.ov_qk": (
        "copying_scores", "eigenvalue_positivity", "k_composition_circuit", "ov_circuit",
        "ov_circuit_eigenvalues", "ov_circuits", "ov_eigenvalues", "positional_qk_circuit", "qk_circuit",
        "same_matching_scores", "virtual_ov_circuit",
    ),
    "numeric_check.circuits.composition": ("COMPOSITION_KINDS", "CompositionScores", "composition_baseline", "composition_scores"),
    "numeric_check.circuits.skip_trigrams": ("SkipTrigramTable", "skip_trigram_table"),
    "numeric_check.circuits.detect": ("HeadReport", "behaviour_scores", "classify_heads", "detect_heads", "weight_scores"),
    "numeric_check.circuits.behaviour": ("LossGrid", "PositionProfile", "position_profiles", "repeat_loss_grid"),
    "numeric_check.verification.verify": ("default_rtol", "verify_logits", "verify_qk"),
    "numeric_check.verification.results": ("VerifyReport",),
    "numeric_check.verification.bind": ("Binder",),
    "numeric_check.verification.hook_paths": ("Recording", "record"),
    "numeric_check.training.toy": ("shipped_checkpoint", "train_toy"),
    "numeric_check.training.config": ("TrainConfig",),
    "numeric_check.circuits.importance": ("term_importance",),
    "numeric_check.circuits.attribution": ("attribute",),
    "numeric_check.circuits.attribution_report": ("Attribution",),
    "numeric_check.reports.analysis": ("analyze_model",),
    "numeric_check.reports.report": ("Report", "write_report"),
    "numeric_check.reports.findings": ("findings",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'numeric_check' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and IDEs; at run time names load lazily above
    from numeric_check.conversion.adapters import from_tl, from_transformer_lens, to_transformer_lens  # noqa: F401
    from numeric_check.conversion.hf import from_hf, from_hf_gpt2  # noqa: F401
    from numeric_check.conversion.tl_folder import load_tl, save_tl  # noqa: F401
    from numeric_check.model.checkpoint import load_checkpoint, save_checkpoint  # noqa: F401
    from numeric_check.model.circuit_model import CircuitModel  # noqa: F401
    from numeric_check.model.config import ModelConfig  # noqa: F401
    from numeric_check.verification.verify import VerifyReport, verify_logits, verify_qk  # noqa: F401
