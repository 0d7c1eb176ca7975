"""Features the algebra does not express yet (issue 18), each refused in one place by its true name.

A reader that meets one calls :func:`refuse` with the features it found (all of them at once, so
the message names everything the model would need); when a feature lands in ``derivations`` and
:class:`~numeric_check.model.circuit_model.CircuitModel`, the reader reads it instead and its key
leaves :data:`PENDING`. Nothing here decides *whether* a model uses a feature — the readers do,
from the modules and the config — only what the feature is called.

q/k norms, norms after a sublayer, sliding windows and local attention, soft-caps, ALiBi, linear,
llama3, YaRN and dynamic NTK rope (constant within the context) and mixtures of experts have left
(the readers read them, :mod:`~numeric_check.conversion.readers.decoder`); what is left is the rope
scalings whose frequencies change within the context (longrope: long factors from
``original_max_position_embeddings`` on) and any other rope type.

>>> refuse("the Phi-3 model", ("rope_scaling", "'longrope' in rope_parameters"))
Traceback (most recent call last):
...
numeric_check.errors.UnsupportedModel: the Phi-3 model uses rope scaling ('longrope' in rope_parameters), which CircuitModel cannot express yet
"""

from __future__ import annotations

from numeric_check.errors import UnsupportedModel

#: feature key -> its name in a refusal
PENDING: dict[str, str] = {
    "rope_scaling": "rope scaling",
}


def refuse(source: str, *found: tuple[str, str]) -> None:
    """Raise :class:`UnsupportedModel` naming every ``(feature, detail)`` in ``found`` (none: return)."""
    if not found:
        return
    names = [PENDING[key] + (f" ({detail})" if detail else "") for key, detail in found]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    raise UnsupportedModel(f"{source} uses {listed}, which CircuitModel cannot express yet")
