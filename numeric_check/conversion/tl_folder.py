"""A TransformerLens model a person saved, for ``--tl FOLDER``.

TransformerLens 3.9 has no save and load of its own for a ``HookedTransformer`` built from a config
(its training loop ``torch.save``\\ s the state dict, ``model_{step}.pt``, and nothing of the config). A
folder here holds what rebuilds one:

- ``hooked_transformer_config.json``: the ``HookedTransformerConfig``'s fields (``cfg.to_dict()`` as
  JSON; ``dtype``, ``device`` and ``seed`` are left out: the command's ``--dtype`` and ``--device`` set
  the first two, and a seed would reseed every generator);
- ``model.safetensors`` or ``model.pt``: the state dict (``torch.save(model.state_dict(), ...)``; read
  by torch's weights-only unpickler, so a pickle holding more than tensors is refused);
- optionally a tokenizer saved beside them with ``tokenizer.save_pretrained(folder)`` (for ``--text``).

:func:`save_tl` writes such a folder; :func:`load_tl` reads it, every failure one
:class:`~numeric_check.errors.ModelLoadError` line saying what was wrong and what to do.

>>> from transformer_lens import HookedTransformer, HookedTransformerConfig
>>> import tempfile
>>> tl = HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_head=4, n_heads=2,
...     d_vocab=10, attn_only=True, normalization_type=None, device="cpu"))
>>> folder = save_tl(tl, tempfile.mkdtemp())
>>> again = load_tl(folder, torch.float32, "cpu")
>>> all(torch.equal(again.state_dict()[k], v) for k, v in tl.state_dict().items())
True
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from numeric_check.errors import ModelLoadError

CONFIG = "hooked_transformer_config.json"
WEIGHTS = ("model.safetensors", "model.pt")
_LEFT_OUT = ("dtype", "device", "seed")  # set by the command, or global state


def is_tl_folder(path: str) -> bool:
    """Whether ``--tl`` names something on disk (read as a saved folder) rather than a model name."""
    try:
        return Path(path).expanduser().exists()
    except (OSError, ValueError):
        return False


def save_tl(model: Any, folder: str | Path) -> Path:
    """``model`` (a ``HookedTransformer``) saved into ``folder`` as :func:`load_tl` reads it (see the module);
    its tokenizer too when it has one. Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in model.cfg.to_dict().items() if k not in _LEFT_OUT}
    try:
        text = json.dumps(config, indent=1, sort_keys=True)
    except (TypeError, ValueError) as error:
        raise ModelLoadError(f"the model's config cannot be written as JSON ({error}); save_tl writes plain values only") from None
    (folder / CONFIG).write_text(text, encoding="utf-8")
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, folder / "model.pt")
    if getattr(model, "tokenizer", None) is not None:
        model.tokenizer.save_pretrained(folder)
    return folder


def load_tl(folder: str | Path, dtype: torch.dtype, device: Any) -> Any:
    """The ``HookedTransformer`` saved in ``folder`` (see the module) in ``dtype`` on ``device``, in eval mode,
    with the tokenizer saved beside it (or none); TransformerLens 4, which has no ``HookedTransformer``, is refused."""
    HookedTransformer = tl_class("HookedTransformer", "--tl reads a folder saved from")
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(f"{str(folder)!r} is not a folder; give the folder numeric_check.save_tl wrote "
                             f"({CONFIG} and model.pt), or a TransformerLens model name")
    cfg = _config(folder, dtype, device)
    tokenizer = _tokenizer(folder)
    weights = next((folder / name for name in WEIGHTS if (folder / name).is_file()), None)
    if weights is None:
        raise ModelLoadError(f"the folder holds no weights: expected {' or '.join(WEIGHTS)} (the state dict, "
                             "torch.save(model.state_dict(), 'model.pt'))")
    state = _state_dict(weights)
    model = HookedTransformer(cfg, tokenizer=tokenizer)  # built on cfg.device (model.to would print that it moves)
    own = model.state_dict()
    missing = sorted(own.keys() - state.keys())
    unused = sorted(state.keys() - own.keys())
    other = sorted(k for k in own.keys() & state.keys() if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unused or other:
        from numeric_check.conversion.load import _listing

        parts = [f"{len(names):,} {'tensor' if len(names) == 1 else 'tensors'} {what} ({_listing(names)})" for names, what in (
            (missing, f"missing from {weights.name}"), (unused, f"in {weights.name} but not in the model"),
            (other, f"of another shape than the model's in {weights.name}")) if names]
        raise ModelLoadError(f"{weights.name} is not the model {CONFIG} describes: {'; '.join(parts)}; save both "
                             "from the same model (numeric_check.save_tl)")
    with torch.no_grad():
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)
    return model.eval()


def _config(folder: Path, dtype: torch.dtype, device: Any) -> Any:
    """The folder's ``HookedTransformerConfig`` in ``dtype`` on ``device``; one line when it is not one."""
    HookedTransformerConfig = tl_class("HookedTransformerConfig", "--tl reads a folder saved from")

    from numeric_check.conversion.load import available_memory, json_object

    path = folder / CONFIG
    if not path.is_file():
        hint = " (a Hugging Face folder: give it to --hf)" if (folder / "config.json").is_file() else ""
        raise ModelLoadError(f"the folder holds no {CONFIG}{hint}; save a HookedTransformer with "
                             "numeric_check.save_tl(model, folder)")
    fields = {k: v for k, v in json_object(path).items() if k not in _LEFT_OUT}
    try:
        cfg = HookedTransformerConfig.from_dict({**fields, "dtype": dtype, "device": str(device)})
    except Exception as error:  # noqa: BLE001 - TypeError (an unknown field), ValueError, AssertionError, ...
        from numeric_check.conversion.load import one_line

        detail = one_line(error, 160) or type(error).__name__
        raise ModelLoadError(f"{CONFIG} is not a HookedTransformerConfig ({type(error).__name__}: {detail}); write it "
                             "with numeric_check.save_tl(model, folder)") from None
    size = 4 * int(cfg.n_params or 0) + 4 * cfg.d_vocab * cfg.d_model * 2  # float32 at least, embeddings too
    free = available_memory()
    if free is not None and size > free:
        raise ModelLoadError(f"the model {CONFIG} describes needs about {size / 2**30:,.1f} GiB, more than the "
                             f"{free / 2**30:,.1f} GiB of memory available")
    return cfg


def _tokenizer(folder: Path) -> Any:
    """The tokenizer saved beside the model, or ``None`` when the folder holds none."""
    from numeric_check.conversion.load import TOKENIZER_FILES, load_tokenizer

    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    return load_tokenizer(folder)


def _state_dict(path: Path) -> dict:
    """The tensors of ``path`` (safetensors, or a weights-only pickle) by name, on the CPU."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - a pickle of more than tensors, a truncated file, ...
        from numeric_check.conversion.load import one_line

        detail = one_line(error, 120)
        detail = f"{type(error).__name__}: {detail}" if len(detail) < 24 else detail  # "174812789" alone says little
        raise ModelLoadError(f"cannot read {path.name} as a state dict of tensors ({detail}); save it with "
                             "torch.save(model.state_dict(), 'model.pt')") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ModelLoadError(f"{path.name} holds a {type(state).__name__}, not a state dict of tensors; save it with "
                             "torch.save(model.state_dict(), 'model.pt')")
    return state


def tl_class(name: str, what: str) -> Any:
    """``transformer_lens.<name>``; TransformerLens 4 removed it (importing it raises ImportError): refused in one line
    (:class:`ModelLoadError`) that starts with ``what`` (``"--tl reads a folder saved from"``) and says what to do."""
    import transformer_lens

    try:
        return getattr(transformer_lens, name)
    except ImportError:
        raise ModelLoadError(f"{what} a TransformerLens 2 or 3 HookedTransformer; the installed TransformerLens 4 has no "
                             f"{name}: install transformer-lens<4, or give the Hugging Face model (--hf; "
                             "from_transformer_lens converts a TransformerBridge)") from None
