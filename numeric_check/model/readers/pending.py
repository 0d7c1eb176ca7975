"""Features the algebra does not express yet (issue 18), each refused in one place by its true name.

A reader that meets one calls :func:`refuse` with the features it found (all of them at once, so
the message names everything the model would need); when a feature lands in ``derivations`` and
:class:`~numeric_check.model.circuit_model.CircuitModel`, the reader reads it instead and its key
leaves :data:`PENDING`. Nothing here decides *whether* a model uses a feature — the readers do,
from the modules and the config — only what the feature is called.

>>> refuse("the Qwen3 model", ("qk_norm", "q_norm, k_norm"))
Traceback (most recent call last):
...
numeric_check.errors.UnsupportedModel: the Qwen3 model uses q/k normalisation (q_norm, k_norm), which CircuitModel cannot express yet
"""

from __future__ import annotations

from numeric_check.errors import UnsupportedModel

#: feature key -> its name in a refusal
PENDING: dict[str, str] = {
    "qk_norm": "q/k normalisation",
    "post_norm": "norms after a sublayer",
    "window": "sliding-window attention",
    "local": "local attention",
    "attn_softcap": "attention-score soft-capping",
    "logit_softcap": "output-logit soft-capping",
    "alibi": "ALiBi position biases",
    "rope_scaling": "rope scaling",
    "moe": "mixture-of-experts MLPs",
}


def refuse(source: str, *found: tuple[str, str]) -> None:
    """Raise :class:`UnsupportedModel` naming every ``(feature, detail)`` in ``found`` (none: return)."""
    if not found:
        return
    names = [PENDING[key] + (f" ({detail})" if detail else "") for key, detail in found]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    raise UnsupportedModel(f"{source} uses {listed}, which CircuitModel cannot express yet")


def window(config_window: int | None, n_ctx: int, used: bool = True, key: str = "window") -> tuple[str, str] | None:
    """``(key, ...)`` when a sliding window of ``config_window`` positions is used and shorter
    than the context (``i − j < window`` is kept, so a window of ``n_ctx`` covers every position)."""
    if used and config_window is not None and config_window < n_ctx:
        return (key, f"window {config_window} < {n_ctx} positions")
    return None
