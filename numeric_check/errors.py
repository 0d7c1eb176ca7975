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
    """A :class:`~numeric_check.model.config.ModelConfig` field that cannot be used (a size < 1, an unknown ``act_fn``)."""


class WeightError(NumericCheckError, ValueError):
    """Weights that cannot be used: NaN/Inf entries, wrong shapes."""


class HookError(NumericCheckError, ValueError):
    """An unknown hook point name, or a hook that returned a tensor of the wrong shape."""


class UnsupportedModel(NumericCheckError, ValueError):
    """A model feature the algebra cannot express (rotary, ALiBi, grouped-query attention, ...); the message names it."""


class SourceMismatch(UnsupportedModel):
    """A conversion whose logits differ from its source's on probe tokens. The message is one line of at most
    ~175 characters: both figures (the difference and the tolerance, relative to the largest logit) and the first
    block that differs, e.g. ``from_hf: the logits differ from LlamaForCausalLM's by 0.018 of the largest, over the
    tolerance 5e-06; block 0 differs first; --explain says why``. ``detail`` holds the diagnosis, a line each: the
    source's full name, the largest absolute difference and the tokens compared; where the residual streams part;
    what changed in the model since it was built (``tcircuits ... --explain`` prints it, :meth:`explain` gives both)."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


class SourcePrecisionError(UnsupportedModel):
    """A half-precision source that runs neither as a float64 nor as a float32 copy of itself (a hook or a replaced
    ``forward`` holding half-precision tensors, a copy too large): at its own precision a conversion a few per cent
    off would pass, so it is refused unless that precision is accepted (``accept_source_precision=True``)."""


class ModelLoadError(NumericCheckError, ValueError):
    """A model or tokenizer that ``--hf`` / ``--tl`` cannot load (not found, not a causal LM, no
    tokenizer for a prompt); the message names it and what the loading library said."""


class CheckpointError(NumericCheckError, ValueError):
    """A checkpoint that is missing, corrupt, truncated or incompatible; the message names the path."""


class UncheckedCheckpoint(NumericCheckError, UserWarning):
    """A warning, not raised: a checkpoint without a content hash (saved by an older
    tcircuits) was loaded unchecked. Under ``-W error`` it is raised, and then reported in
    one line like every error of ours."""


class InputFileError(NumericCheckError, ValueError):
    """A file given as input besides a checkpoint (a vocabulary) that cannot be read or
    holds the wrong content; the message names it."""


class DeviceError(NumericCheckError, ValueError):
    """A dtype or device that cannot be used (CUDA requested but absent, an integer dtype)."""


class VerifyError(NumericCheckError, ValueError):
    """Arguments of a verification that cannot be used (a tolerance, a model of another type)."""


class ExpansionMismatch(VerifyError):
    """An expansion built for another architecture (or head) than the model's."""


class AttributionError(NumericCheckError, ValueError):
    """An attribution that cannot be made: a target outside the vocabulary or not one token, a position
    outside the prompt, an order not offered, several sequences where one prompt is expected."""


class AtomBindingError(NumericCheckError, ValueError):
    """An atom or coefficient that cannot be bound to this model: an unknown name, a layer
    or head the model does not have, a frozen value the forward pass did not record."""


class TrainConfigError(NumericCheckError, ValueError):
    """A training configuration that cannot be used (e.g. segments that cannot fit ``n_ctx``)."""


class VerifyCLIError(NumericCheckError, ValueError):
    """A ``tcircuits verify`` option that cannot be used; the message names it."""


class OutputPathError(NumericCheckError, ValueError):
    """An output file or folder that cannot be written; the message names it."""


class AnalysisError(NumericCheckError, ValueError):
    """An analysis asked of something the model cannot give (no positional embedding, bad head order, bad option)."""


class FactoredError(NumericCheckError, ValueError):
    """A factored product that cannot be built or cannot answer (no factors, non-square eigenvalues, bad index)."""


class FactoredShapeError(FactoredError):
    """Factors whose shapes do not chain (``[a, b] @ [c, d]`` with ``b != c``); the message names both."""


class PlotError(NumericCheckError, ValueError):
    """Numbers that cannot be plotted (wrong shapes, an unknown format)."""
