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
import importlib.abc
import importlib.util
import sys
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


#: Kept for compatibility: modules that moved to a room of their own, by their old name. The
#: conversion of other people's models left ``numeric_check.model`` for
#: :mod:`numeric_check.conversion`, and the hook-path engine went to the verification that uses it;
#: ``import numeric_check.model.hf`` (and every module under an old package, such as
#: ``numeric_check.model.readers.llama``) still works and gives the very same module object as
#: the new name, so patching through either name patches both. The table lives here, at the root,
#: so that ``numeric_check.model`` itself never names the room above it.
MOVED = {
    **{f"numeric_check.model.{name}": f"numeric_check.conversion.{name}"
       for name in ("adapters", "build", "hf", "hub", "load", "options", "readers", "source_check")},
    "numeric_check.model.hook_paths": "numeric_check.verification.hook_paths",
}


def moved_to(name: str) -> str | None:
    """The module's new name when ``name`` is an old one (or lies under an old package), else None.

    >>> moved_to("numeric_check.model.readers.llama")
    'numeric_check.conversion.readers.llama'
    >>> moved_to("numeric_check.model.config") is None
    True
    """
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return None


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name and loads it as the new module itself (the loader puts the new
    module in ``sys.modules`` under the old name, which the import system then returns)."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if moved_to(fullname) else None

    def create_module(self, spec):
        return None  # a placeholder module, replaced in exec_module

    def exec_module(self, module) -> None:
        sys.modules[module.__name__] = importlib.import_module(moved_to(module.__name__))


if not any(isinstance(finder, _OldNames) for finder in sys.meta_path):
    sys.meta_path.insert(0, _OldNames())


if TYPE_CHECKING:  # for type checkers and IDEs; at run time names load lazily above
    from numeric_check.conversion.adapters import from_tl, from_transformer_lens, to_transformer_lens  # noqa: F401
    from numeric_check.conversion.hf import from_hf, from_hf_gpt2  # noqa: F401
    from numeric_check.conversion.tl_folder import load_tl, save_tl  # noqa: F401
    from numeric_check.model.checkpoint import load_checkpoint, save_checkpoint  # noqa: F401
    from numeric_check.model.circuit_model import CircuitModel  # noqa: F401
    from numeric_check.model.config import ModelConfig  # noqa: F401
    from numeric_check.verification.verify import VerifyReport, verify_logits, verify_qk  # noqa: F401
