"""The source is called as a person calls it, and what was added to it is named.

The source check (:mod:`numeric_check.conversion.source_check`) runs the source with the flags it needs to see
inside it (``output_hidden_states=True``, TransformerLens' ``run_with_cache``), in eval mode, gradients off. A
``forward`` that computes otherwise without those flags would pass there and differ in use, so the source is also
called plainly (:class:`Call`): ``model(input_ids)`` (``model(tokens)``) with its own defaults (``use_cache``,
``return_dict`` as its config sets them) on every probe, and on the first probe with gradients on, and, when it is
held in training mode, in training mode (compared only where two calls agree: dropout makes each call differ).

What was added to the source after it was built runs in every call and is not read by the conversion:
:func:`additions` names it (a forward hook or pre-hook, a ``forward`` replaced or wrapped on an instance, a class's
``forward`` replaced by code outside its library, a global module hook), so a check that passes says so too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from numeric_check.errors import SourceMismatch

#: where a library's own code lives (a ``forward`` whose code is here is the library's, wrappers included): the two
#: libraries read, torch, and Hugging Face's ``kernels``, whose forwards transformers installs on its classes itself
LIBRARIES = ("transformers", "transformer_lens", "torch", "kernels")


@dataclass(frozen=True)
class Call:
    """One way a person calls the source: ``how`` in words (``"model(input_ids)"``), ``run`` on probe tokens giving its
    logits (``None``: not comparable, with ``why`` set by then), on the first probe only or on every probe."""

    how: str
    run: Callable[[Tensor], Tensor | None]
    first_only: bool = False


@dataclass
class AsCalled:
    """How else the source is called beside the check's own call (``probed``: its flags in words, ``"with
    output_hidden_states=True"``), the notes those calls leave (a call that cannot be compared), and what was added to
    the source after it was built (:func:`additions`)."""

    calls: list[Call]
    notes: list[str]
    added: list[str]
    probed: str

    def compare(self, tokens: Tensor, first: bool, ours: Tensor, tol: float, who: str, name: str) -> float:
        """The largest ``max |ours − call| / max |call|`` over the calls made on this probe (``first``: the first
        probe); a call that differs over ``tol`` is refused in one line naming the call."""
        worst = 0.0
        for call in self.calls:
            if call.first_only and not first:
                continue
            theirs = call.run(tokens)
            if theirs is None:
                continue
            theirs = theirs.detach().to("cpu", torch.float64)
            diff = float((ours.detach().to("cpu", torch.float64) - theirs).abs().max())
            rel = diff / max(float(theirs.abs().max()), 1e-300)
            if not rel <= tol:
                added = "; ".join(self.added) or "nothing added to it after it was built"
                raise SourceMismatch(
                    f"{who}: called as {call.how}, {name.partition(' (')[0]} computes logits {rel:.2g} of the largest "
                    f"from the conversion's (tolerance {tol:.2g}), which equal its own {self.probed}: refused",
                    f"the source ({name}) computes otherwise when called as {call.how} than {self.probed}: its logits "
                    f"differ from the conversion's by {rel:.2g} of their largest entry (max |difference| {diff:.2g}) on "
                    f"{tokens.shape[0]} x {tokens.shape[1]} tokens; a forward that depends on how it is called is not "
                    f"what its weights compute\nwhat runs in it: {added}")
            worst = max(worst, rel)
        return worst


def plain_calls(source: Any, call: Callable[[Tensor], Any], how: str, held_training: bool) -> tuple[list[Call], list[str]]:
    """The plain calls of ``source`` (``call(tokens)`` is ``source(tokens)`` on its device): with gradients off in eval
    mode on every probe; with gradients on, on the first; in training mode when it is ``held_training``. The list
    that comes back with them fills with a note where a call cannot be compared (dropout)."""
    notes: list[str] = []

    def plain(tokens: Tensor) -> Tensor:
        with torch.no_grad():
            return logits_of(call(tokens))

    def with_grad(tokens: Tensor) -> Tensor:
        with torch.enable_grad():
            return logits_of(call(tokens)).detach()

    def training(tokens: Tensor) -> Tensor | None:
        was = source.training
        source.train()
        try:
            with torch.random.fork_rng(devices=[]), torch.enable_grad():  # the caller's random state is left as it was
                first, second = (logits_of(call(tokens)).detach() for _ in range(2))
        finally:
            source.train(was)
        if not torch.equal(first, second):
            notes.append("held in training mode, where its dropout makes each call differ: compared in eval mode")
            return None
        return first

    calls = [Call(how, plain), Call(f"{how} with gradients on", with_grad, first_only=True)]
    if held_training:
        calls.append(Call(f"{how} in training mode, as it is held", training, first_only=True))
    return calls, notes


def logits_of(out: Any) -> Tensor:
    """The logits of a call's output: ``out.logits``, the first entry of a tuple (``return_dict=False``), or ``out``."""
    if isinstance(out, Tensor):
        return out
    logits = getattr(out, "logits", None)
    return logits if isinstance(logits, Tensor) else out[0]


def additions(model: Any) -> list[str]:
    """What runs in ``model`` beyond what its library built: forward hooks and pre-hooks on its modules (and global
    ones), a ``forward`` set on an instance (replaced or wrapped), a class ``forward`` whose code lives outside its
    library. Hooks and wrappers a library installs itself are not named."""
    out: list[str] = []
    glob = torch.nn.modules.module
    for kind, hooks in (("forward hook", glob._global_forward_hooks), ("forward pre-hook", glob._global_forward_pre_hooks)):
        out += [f"a global {kind} ({_named(h)})" for h in hooks.values() if not _library(h)]
    classes: set[type] = set()
    for name, module in model.named_modules():
        where = name or type(model).__name__
        for kind, hooks in (("forward hook", module._forward_hooks), ("forward pre-hook", module._forward_pre_hooks)):
            out += [f"a {kind} on {where} ({_named(h)})" for h in hooks.values() if not _library(h)]
        forward = vars(module).get("forward")
        if forward is not None and not _library(forward):
            wrapped = " (wrapping the original)" if _wraps(forward, module) else ""
            out.append(f"{where}.forward replaced on the instance by {_named(forward)}{wrapped}")
        cls = type(module)
        if cls not in classes and cls.__module__.split(".")[0] in LIBRARIES[:2]:
            classes.add(cls)
            if not _library(cls.forward):
                out.append(f"{cls.__name__}.forward replaced on the class by {_named(cls.forward)}")
    return out


def _code_file(fn: Any) -> str | None:
    fn = getattr(fn, "func", fn)  # a functools.partial (accelerate's hooks)
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "forward", None), "__code__", None)
    return None if code is None else code.co_filename


def _library(fn: Any) -> bool:
    """Whether ``fn`` is a library's own (its code lives in one of :data:`LIBRARIES`) and wraps no one else's function
    (TransformerLens' ``add_hook`` wraps the user's hook in a function of its own)."""
    return _user(fn) is None


def _user(fn: Any) -> Any | None:
    """``fn`` when its code lives outside :data:`LIBRARIES`, else the first function its closure holds whose code does
    (the user's hook inside a library's wrapper), else ``None``."""
    path = _code_file(fn)
    if path is None or not any(f"{os.sep}{lib}{os.sep}" in path for lib in LIBRARIES):
        return fn
    for cell in getattr(getattr(fn, "__func__", fn), "__closure__", None) or ():
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(held) and not isinstance(held, (type, torch.nn.Module)) and _code_file(held) is not None:
            path = _code_file(held)
            if not any(f"{os.sep}{lib}{os.sep}" in path for lib in LIBRARIES):
                return held
    return None


def _wraps(fn: Any, module: Any) -> bool:
    """Whether ``fn`` calls ``module``'s own ``forward``: ``functools.wraps`` says so, or its closure holds it."""
    fn = getattr(fn, "__func__", fn)
    if hasattr(fn, "__wrapped__"):
        return True
    cells = getattr(fn, "__closure__", None) or ()
    own = type(module).forward
    for cell in cells:
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if getattr(held, "__self__", None) is module and getattr(held, "__func__", None) is own:
            return True
    return False


def _named(fn: Any) -> str:
    """``fn``'s qualified name and where its code is (``scale.<locals>.<lambda> in test_x.py:12``): the user's function
    inside a library's wrapper."""
    fn = _user(fn) or fn
    inner = getattr(fn, "__func__", getattr(fn, "func", fn))
    name = getattr(inner, "__qualname__", None) or type(inner).__name__
    code = getattr(inner, "__code__", None)
    return f"{name} in {os.path.basename(code.co_filename)}:{code.co_firstlineno}" if code is not None else name
