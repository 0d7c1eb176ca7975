"""A half-precision source's own rounding: measured on every probe and position, and bounded.

A source held in bfloat16 or float16 is compared as a float64 (else float32) copy of itself
(:func:`~numeric_check.conversion.source_check.half_precision_reference`), and how far the source as held is from
that copy is stated apart as its own rounding. Whatever acts only in half precision (a hook that checks the dtype, a
table held only in bfloat16) would hide there, so that difference is measured on every probe and every position, with
the source called as a person calls it (``model(input_ids)``) and, on the first probe, as the check calls it, and it
is bounded: at most :data:`OWN_MARGIN` times the rounding of the conversion itself run in the source's dtype on the same
tokens (``max |ours in bfloat16 − ours in float64| / max |ours in float64|``: the size of that dtype's rounding on
this very model, at this length and magnitude). Past it the source is refused
(:class:`~numeric_check.errors.SourceMismatch`): it computes in half precision what its weights do not say.

Measured on the 53 Hugging Face families the tests build (random weights, every parameter perturbed, 8 positions or
BLOOM's 2,048; six seeds for the largest), the untampered source's own rounding is 0.37 to 1.6 times the conversion's in bfloat16 and
0.43 to 2.1 times in float16 (Hugging Face runs its norms, rotary tables and softmax in float32 where the conversion
rounds them too; BLOOM's ALiBi bias of key ``j``, large far into the context, is added in the model's dtype, and the
conversion adds it so for this measure); a Llama whose MLP output is ×3 only in bfloat16 is 46 to 50 times it, a
TransformerLens model so tampered from position 64 on 20 times (its untampered twin 0.61 times).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from numeric_check.errors import SourceMismatch

#: the source's own rounding may be at most this many times the conversion's own rounding in the source's dtype
OWN_MARGIN = 4
#: where the conversion cannot run in the source's dtype on this device: the bound on the source's own rounding
UNMEASURED_BOUND = 5e-2


def relative(a: Tensor, b: Tensor) -> float:
    """``max |a − b| / max |b|`` in float64 on the CPU."""
    a, b = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-300)


@dataclass(frozen=True)
class HeldSource:
    """The source as held in half precision: ``run(tokens, first)`` gives its logits on probe tokens, once for each
    way it is called (as a person calls it on every probe; as the check calls it too on the ``first``); ``held``: its
    dtype; ``copied_in``: the precision of the copy that the conversion is compared with."""

    run: Callable[[Tensor, bool], list[Tensor]]
    held: torch.dtype
    copied_in: torch.dtype


class OwnRounding:
    """The source's own rounding over the probes (:meth:`measure` on each): ``worst``, the largest
    ``max |as held − copy| / max |copy|``, and ``ratio``, the largest of that over the conversion's own rounding in
    the held dtype on the same probe (``None`` where the conversion cannot run in it here).
    ``ours_rounding(tokens, exact, dtype)``: the conversion's rounding in ``dtype`` on ``tokens`` (``exact``: its
    float64 logits there), ``None`` where it cannot run so."""

    def __init__(self, held: HeldSource, ours_rounding: Callable[[Tensor, Tensor, torch.dtype], float | None]):
        self.held, self._ours = held, ours_rounding
        self.worst, self.ratio = 0.0, 0.0

    def measure(self, tokens: Tensor, first: bool, copy: Tensor, exact: Tensor, who: str, name: str,
                added: list[str]) -> None:
        """Measure it on ``tokens`` (``copy``: the copy's logits there, ``exact``: the conversion's in float64); refuse
        in one line where it passes :data:`OWN_MARGIN` times the conversion's own rounding (``who`` names the
        conversion, ``name`` the source; ``added``: what runs in the source, for the refusal's detail)."""
        own = max(relative(logits, copy) for logits in self.held.run(tokens, first))
        ours = self._ours(tokens, exact, self.held.held)
        bound = UNMEASURED_BOUND if ours is None else OWN_MARGIN * ours
        self.worst = max(self.worst, own)
        if self.ratio is not None:
            self.ratio = None if ours is None else max(self.ratio, own / max(ours, 1e-300))
        if own <= bound:
            return
        held, copied, size = _name(self.held.held), _name(self.held.copied_in), f"{tokens.shape[0]} x {tokens.shape[1]}"
        times = (f"{own / ours:.2g} times this model's {held} rounding (bound {OWN_MARGIN})" if ours is not None else
                 f"over {UNMEASURED_BOUND:g} (the conversion cannot run in {held} here to measure its rounding)")
        raise SourceMismatch(
            f"{who}: held in {held}, {name.partition(' (')[0]} is {own:.2g} of the largest logit off its {copied} "
            f"copy on {size} tokens, {times}; refused",
            f"the source ({name}) as held in {held} computes logits {own:.2g} of their largest entry from its {copied} "
            f"copy on {size} tokens, where the conversion itself run in {held} rounds by "
            f"{'an unmeasured amount' if ours is None else f'{ours:.2g}'}: that is not {held}'s rounding but something "
            f"that computes otherwise in {held} (a hook or forward that checks the dtype, a table held only in {held})"
            f"\nwhat runs in it: {'; '.join(added) or 'nothing added to it after it was built'}")


def bounded(held: str, ratio: float | None) -> str:
    """What bounds a source's own rounding, in words, after the difference it states (``held``: its dtype's name;
    ``ratio``: :attr:`OwnRounding.ratio`).

    >>> bounded("bfloat16", 0.8)
    'on every probe and position (its own rounding: at most 0.8 times the rounding of the conversion itself run in bfloat16 on the same tokens, bound 4)'
    """
    if ratio is None:
        return (f"on every probe and position (its own rounding: within {UNMEASURED_BOUND:g}; the conversion cannot "
                f"run in {held} here to measure its own)")
    return (f"on every probe and position (its own rounding: at most {ratio:.2g} times the rounding of the conversion "
            f"itself run in {held} on the same tokens, bound {OWN_MARGIN})")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
