"""``from_hf``: a Hugging Face causal language model as a :class:`CircuitModel`, checked against it.

One entry point looks the model's family up by its class (:mod:`numeric_check.conversion.readers`:
one small reader per family), refuses by name every config option the reader does not
understand that is set off its default (:mod:`numeric_check.conversion.options`), reads the weights
into :class:`~numeric_check.conversion.build.SourceWeights`, builds the model
(:func:`~numeric_check.conversion.build.build`), and runs it beside the source on probe tokens
(:mod:`numeric_check.conversion.source_check`) before returning it. What the algebra cannot express
raises :class:`UnsupportedModel` naming it; a config whose sizes disagree with the weights raises
:class:`WeightError` naming both; a conversion that does not compute the source's logits raises
:class:`SourceMismatch`.

Folding: norm gains fold into the weights that read the norm (RMSNorm has no bias and no
centring, so nothing is centred for it); Gemma's ``(1 + w)`` gains and its embedding scale
``sqrt(d_model)`` fold into the weights too.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from numeric_check.errors import UnsupportedModel, WeightError
from numeric_check.conversion.build import build, on_one_device
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.rotary import table_excess
from numeric_check.conversion.options import check_hf_options
from numeric_check.conversion.readers import BY_CLASS, decoder, not_read
from numeric_check.conversion.own_rounding import HeldSource
from numeric_check.conversion.source_calls import AsCalled, Call, additions, logits_of, plain_calls
from numeric_check.conversion.source_check import (
    changed_modules,
    check_against_source,
    fresh_on_meta,
    half_precision_reference,
    in_dtype,
    in_eval_mode,
    lowest_precision,
    probe_batches,
    unchecked,
    user_tokens,
)


def from_hf(model: Any, dtype: str | torch.dtype = torch.float64, device: str | torch.device | None = None,
            biases: bool | None = None, *, check: bool = True, check_tokens: Tensor | None = None,
            accept_source_precision: bool = False) -> CircuitModel:
    """A :class:`CircuitModel` computing the same logits as a Hugging Face causal LM, checked against it.

    Families read: :func:`numeric_check.conversion.readers.family_names`. ``dtype`` of the result
    (folding is done in float64 on the CPU), ``device`` where it goes (``None`` or ``"auto"``: CUDA when
    present, else the CPU; the source may be anywhere); ``biases``: ``None`` keeps
    biases only when some folded bias is non-zero, ``True`` always, ``False`` requires them zero.
    Before it is returned the result runs beside the source on probe tokens (and on
    ``check_tokens``, the ids you will study, when given); the measurement is kept as
    ``model.source_check`` and every verification report states it. ``check=False`` skips it
    (the reports then say the model was not checked against its source). Whatever ``dtype``, the
    conversion is checked in float64 (held to float64's tolerance) and then cast; the cast's rounding is
    measured and stated apart (``source_check.rounding``). A source held in half precision is compared as a
    float64 copy of itself, else a float32 one; one that runs as neither is refused
    (:class:`~numeric_check.errors.SourcePrecisionError`) unless ``accept_source_precision=True``, which
    compares it at its own precision and says so on its source line.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> hf = LlamaForCausalLM(LlamaConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
    ...     num_attention_heads=4, num_key_value_heads=2, intermediate_size=12, max_position_embeddings=6))
    >>> model = from_hf(hf)
    >>> model.arch.describe()
    '1 layer x 4 heads, no positional embedding, RMSNorm, MLPs, 2 key/value heads (2 query heads each), rotary on all of the head dimensions (neox pairing)'
    >>> model.source_check.rel_diff < 1e-6
    True
    """
    name = type(model).__name__
    if BY_CLASS.get(name) is None and type(model).__module__.startswith("transformer_lens"):
        raise UnsupportedModel(f"from_hf reads Hugging Face models; {name} is a TransformerLens model: use from_transformer_lens")
    ours = read_hf(model, device, biases)
    ours.source_check = (check_hf(model, ours, check_tokens, accept_source_precision=accept_source_precision) if check
                         else unchecked(f"{name} (Hugging Face)"))
    return in_dtype(ours, dtype)


def read_hf(model: Any, device: str | torch.device | None = None, biases: bool | None = None) -> CircuitModel:
    """The float64 conversion of a Hugging Face ``model``, not yet checked against it: its family read by class, its
    options by allow-list, its weights refused where they cannot run (:func:`from_hf` checks and casts it)."""
    family = BY_CLASS.get(type(model).__name__)
    if family is None:
        raise UnsupportedModel(not_read(type(model).__name__, getattr(model, "config", None)))
    source = f"the {family.name} model"
    check_hf_options(model.config, family.options, source, model)
    _refuse_bad_weights(model, source)
    on_one_device(model, source)
    return build(family.read(model), torch.float64, device, biases)


#: ``from_hf_gpt2`` reads every family now; the name stays for the code that used it
from_hf_gpt2 = from_hf


def check_hf(model: Any, ours: CircuitModel, tokens: Tensor | None = None, *, accept_source_precision: bool = False,
             also: tuple[Call, ...] = (), who: str = "from_hf", library: str = "Hugging Face"):
    """Run ``ours`` beside the Hugging Face ``model`` (:func:`~numeric_check.conversion.source_check.check_against_source`).

    A source held in half precision (bfloat16, float16) is run as a float64 copy of itself, else as a float32
    one (:func:`~numeric_check.conversion.source_check.half_precision_reference`): the conversion is held to that
    precision's tolerance (Hugging Face's own float32 round trips set it), so a half-precision model that is not
    what its weights say is refused like a float64 one; how far the source as held is from its copy (its own
    rounding) is measured on every probe, bounded (:mod:`~numeric_check.conversion.own_rounding`) and stated apart.
    One that runs as neither copy (a hook holding a bfloat16 tensor, a ``forward`` replaced on the instance, a copy too large) is refused unless
    ``accept_source_precision``: then it is compared as it is, at its own precision, which its source line names. A
    float32 source is compared as it is: its rounding (~1e-7 of the largest logit) hides nothing the check is for.
    ``also``: more calls held to the same tolerance (a TransformerLens 4 bridge's own forward); ``who`` names the
    conversion in a refusal, ``library`` where the source came from in its name."""
    cfg = ours.cfg
    batches = probe_batches(cfg.d_vocab, cfg.n_ctx, max(ours.arch.heads_per_layer, default=1))
    if tokens is not None:
        batches.append(user_tokens(tokens, cfg.d_vocab, cfg.n_ctx))
    device = next(iter(model.parameters())).device
    dtype = next(iter(model.parameters())).dtype

    family = BY_CLASS.get(type(model).__name__)

    def runner(source: Any):
        def run(tokens: Tensor):
            with as_it_runs_in_float64(source, family), block_inputs(source, len(ours.blocks)) as seen:
                out = source(input_ids=tokens.to(device), output_hidden_states=True)
            streams = getattr(out, "hidden_states", None)
            return out.logits, seen or (list(streams[:-1]) if streams else None)
        return run

    def suspects() -> list[str]:
        fresh = fresh_on_meta(lambda: type(model)(model.config))
        return [] if fresh is None else changed_modules(model, fresh)

    def as_held(tokens: Tensor, first: bool) -> list[Tensor]:  # as a person calls it; on the first probe as checked too
        out = [logits_of(_plain(model, family, tokens.to(device)))]
        return out + [runner(model)(tokens)[0]] if first else out

    held = str(dtype).removeprefix("torch.")
    added, training = additions(model), model.training  # before the check puts it in eval mode and hooks its blocks
    reference, own, label, precision = model, None, "", lowest_precision(dtype, torch.float32)
    if dtype.itemsize == 2:  # half precision: its own rounding would hide a wrong conversion of a few per cent
        ref = in_eval_mode(model, lambda: half_precision_reference(
            model, lambda source: runner(source)(batches[0])[0], who, accept_source_precision,
            lambda copied: _tables_made_again(copied, dtype)))
        reference, label = ref.model, ref.label
        own = None if ref.copied_in is None else HeldSource(as_held, dtype, ref.copied_in)
        # its norms, rotary and softmax round through float32 whatever it is held in
        precision = lowest_precision(ref.precision, torch.float32)
    name = f"{type(model).__name__} ({library}, {held}{label})"
    calls, notes = plain_calls(reference, lambda tokens: _plain(reference, family, tokens.to(device)), "model(input_ids)",
                               training)
    as_called = AsCalled(calls + list(also), notes, added, "with output_hidden_states=True")
    check = in_eval_mode(model, lambda: check_against_source(ours, runner(reference), name, precision, batches,
                                                             suspects, who, own, as_called=as_called))
    accepted = held if own is None and reference is model and dtype.itemsize == 2 else None
    return replace(check, note=decoder.dropped_score_cap(model), accepted_at=accepted)


def _plain(source: Any, family: Any, tokens: Tensor) -> Any:
    """``source(tokens)``, as a person calls it: no flag passed (its config's ``use_cache`` and ``return_dict``)."""
    with as_it_runs_in_float64(source, family):
        return source(tokens)


@contextmanager
def as_it_runs_in_float64(source: Any, family: Any):
    """Within the block, a float64 ``source`` runs as its own code allows in float64: its experts through
    transformers' eager implementation (the same sums, expert by expert; the default ``grouped_mm`` kernel has no
    float64), and a family that makes tensors in torch's default dtype (:attr:`Family.default_dtype_float64`)
    with that default float64; each put back as it was afterwards."""
    config = getattr(source, "config", None)
    wanted = next((p.dtype for p in source.parameters()), None) == torch.float64
    experts = getattr(config, "_experts_implementation", None)
    eager = wanted and experts not in (None, "eager")
    default = torch.get_default_dtype()
    if eager:
        config._experts_implementation = "eager"
    if wanted and family is not None and family.default_dtype_float64:
        torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(default)
        if eager:
            config._experts_implementation = experts


@contextmanager
def block_inputs(source: Any, n_layers: int):
    """Within the block, the list it yields fills with the residual stream at the input of each of ``source``'s
    ``n_layers`` blocks as each block receives it: after any hook a user put on the block before (Hugging Face's
    ``hidden_states`` are recorded inside each block's ``forward``, before those hooks act). Left empty where the
    blocks are not found (a first ``ModuleList`` of ``n_layers`` layers or blocks) or one's input is not a tensor."""
    layers = next((list(m) for m in source.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers
                   and all(any(w in type(b).__name__ for w in ("Layer", "Block")) for b in m)), [])
    seen: list[Tensor] = []

    def record(module: Any, args: tuple, kwargs: dict) -> None:
        stream = args[0] if args else kwargs.get("hidden_states")
        seen.append(stream.detach() if isinstance(stream, Tensor) else None)

    handles = [layer.register_forward_pre_hook(record, with_kwargs=True) for layer in layers]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
    if len(seen) != n_layers or any(s is None for s in seen):
        seen.clear()


def _tables_made_again(copied: Any, held: torch.dtype) -> Any:
    """A float64 (or float32) copy whose sin/cos tables (GPT-J's and CodeGen's ``embed_positions``, a table per position that a
    half-precision cast rounds position by position: no frequency gives them, the rounding is the source's own)
    are made again by its own code; a table it cannot make again is left as the cast left it. The table as held (in
    ``held``, the copy has it before it is made again) is held to the one its code makes, entry by entry, to its own
    rounding (:func:`~numeric_check.model.rotary.table_excess`): one that is not is refused by name."""
    if copied is None:
        return None
    for name, module in copied.named_modules():
        table = getattr(module, "embed_positions", None)
        make = getattr(sys.modules.get(type(module).__module__), "create_sinusoidal_positions", None)
        if isinstance(table, Tensor) and callable(make) and hasattr(module, "pos_embd_dim"):
            made = make(module.max_positions, module.pos_embd_dim).to(table.device, torch.float64)
            _refuse_other_table(table.to(torch.float64), made, held, f"{name}.embed_positions")
            module.embed_positions = made.to(table.dtype)
    return copied


def _refuse_other_table(table: Tensor, made: Tensor, held: torch.dtype, where: str) -> None:
    """A ``[pos, sin | cos]`` table held in ``held`` that differs from the one its code ``made`` past its own rounding
    (each plane's angle ``θ_f`` read at position 1) is refused by name."""
    half = made.shape[1] // 2
    angles = torch.arange(made.shape[0], dtype=torch.float64, device=made.device)[:, None] * torch.atan2(
        made[1, :half], made[1, half:]).abs().repeat(2)
    worst, position, column = table_excess(table.cpu(), made.cpu(), angles.cpu(), held)
    if worst > 1:
        raise UnsupportedModel(f"from_hf: its sin/cos table {where} is not the one its code makes: {worst:.2g} times its "
                               f"rounding in {str(held).removeprefix('torch.')} at position {position}, plane {column % half}")


def _refuse_bad_weights(model: Any, source: str) -> None:
    """NaN/Inf weights and dtypes that cannot run a forward pass are refused before anything is built."""
    for name, param in model.named_parameters():
        if param.device.type == "meta":
            raise WeightError(f"{source} is on the meta device ({name} holds no values); load its weights first")
        if not param.dtype.is_floating_point or param.dtype.itemsize < 2:
            raise UnsupportedModel(f"{source} holds {name} in {str(param.dtype).removeprefix('torch.')}; convert a model "
                                   "in float64, float32, float16 or bfloat16")
        if not bool(torch.isfinite(param.detach()).all()):
            raise WeightError(f"{source}: {name} holds NaN or infinite values")
