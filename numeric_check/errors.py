"""Errors raised by :mod:`numeric_check`. Every message says what was wrong and what was expected.

All derive from :class:`NumericCheckError`, itself a
:class:`~tensoralg.errors.TCircuitsError` (the project's root, not an algebra error), so the
CLI reports them without a traceback.
"""

from tensoralg.errors import TCircuitsError


class NumericCheckError(TCircuitsError):
    """Base class of every error raised by :mod:`numeric_check`."""


class ModelInputError(NumericCheckError, ValueError):
    """Bad tokens: ids out of range, a sequence longer than ``n_ctx``, a wrong dtype or ndim."""


class ConfigError(NumericCheckError, ValueError):
    """A :class:`~numeric_check.model.ModelConfig` field that cannot be used (a size < 1, an unknown ``act_fn``)."""


class WeightError(NumericCheckError, ValueError):
    """Weights that cannot be used: NaN/Inf entries, wrong shapes."""


class HookError(NumericCheckError, ValueError):
    """An unknown hook point name, or a hook that returned a tensor of the wrong shape."""


class UnsupportedModel(NumericCheckError, ValueError):
    """A model feature the algebra cannot express (rotary, ALiBi, grouped-query attention, ...); the message names it."""


class CheckpointError(NumericCheckError, ValueError):
    """A checkpoint that is missing, corrupt, truncated or incompatible; the message names the path."""


class DeviceError(NumericCheckError, ValueError):
    """A dtype or device that cannot be used (CUDA requested but absent, an integer dtype)."""
