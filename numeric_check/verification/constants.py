"""What verification derives from a model's unembedding alone (and from its other weights), kept between
verifications of that model.

Two quantities cost a verification as much as an unembedding of the whole batch, and depend on
nothing but ``W_U`` (and ``b_U``): the Gram matrix ``W_Uᵀ W_U`` that gives every term's norm, and
the float32 (or bfloat16) copy of ``[W_Uᵀ; b_U]`` that screens largest logits
(:class:`~numeric_check.verification.bounds.MaxAbsProduct`, which keeps its column norm and whether it
is finite here too). A person verifies one model on prompt
after prompt; :class:`UnembedConstants` keeps them with the model's own ``W_U`` parameter (weakly:
they go when it goes), for the dtype and device they were made in, and makes them again when
``W_U`` or ``b_U`` has changed (another tensor, or the same one written in place). A constant
above ``KEEP_BYTES`` (256 MiB: GPT-2's float32 ``W_U`` is 154 MB, Llama 3's would be 2 GiB) is
made each time rather than held after the verification.

>>> import torch
>>> W_U = torch.randn(10, 4)
>>> made = []
>>> first = UnembedConstants(W_U, None, torch.float64, "cpu").get("gram", lambda: made.append(1) or W_U.T @ W_U)
>>> again = UnembedConstants(W_U, None, torch.float64, "cpu").get("gram", lambda: made.append(1) or W_U.T @ W_U)
>>> len(made), again is first
(1, True)
>>> _ = W_U.mul_(2)  # written in place: made again
>>> _ = UnembedConstants(W_U, None, torch.float64, "cpu").get("gram", lambda: made.append(1) or W_U.T @ W_U)
>>> len(made)
2
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch import Tensor

# by id(W_U): (a weak reference to it, the stamp, the constants); a tensor compares by value, so it
# cannot be the key of a WeakKeyDictionary. An entry goes when its W_U is collected.
_STORE: dict[int, tuple[weakref.ref, tuple, dict[str, Tensor]]] = {}
KEEP_BYTES = 1 << 28  # a constant larger than this (256 MiB) is not kept between verifications


class UnembedConstants:
    """The constants of one model's unembedding in one dtype and device (see the module).

    ``W_U`` and ``b_U`` are the user's own parameters (not a working copy's): the store is keyed by
    ``W_U``, and stamped with both tensors' storage and version counter, the dtype and the device.
    """

    def __init__(self, W_U: Tensor, b_U: Tensor | None, dtype: torch.dtype, device: torch.device | str):
        self.key = W_U
        self.stamp = tuple((t.data_ptr(), t._version, tuple(t.shape), t.dtype) if t is not None else None
                           for t in (W_U, b_U)) + (dtype, str(device))

    def get(self, name: str, make: Callable[[], Tensor]) -> Tensor:
        """The constant ``name``, made by ``make()`` unless kept from an earlier verification."""
        key = id(self.key)
        entry = _STORE.get(key)
        if entry is None or entry[0]() is not self.key or entry[1] != self.stamp:
            entry = _STORE[key] = (weakref.ref(self.key, lambda _, key=key: _STORE.pop(key, None)), self.stamp, {})
        values = entry[2]
        if name in values:
            return values[name]
        value = make()
        if _bytes(value) <= KEEP_BYTES:  # a float32 copy of a 128k x 4096 W_U (2 GiB) is made again, not kept
            values[name] = value
        return value


class ModelConstants(UnembedConstants):
    """What verification derives from a whole model's weights, not from its tokens (each layer's kernels of the
    term norms, the heads' maps after ``z`` and their distances to the terms' factors), kept like
    :class:`UnembedConstants`: keyed by the user's model, stamped with every parameter and buffer (storage,
    version counter, shape, dtype), the dtype and the device, so that a weight written in place or replaced
    makes them again.

    >>> from derivations.architecture import Architecture
    >>> from numeric_check.model.circuit_model import CircuitModel
    >>> m = CircuitModel.random(Architecture(1, 1), d_model=4, d_head=2, d_vocab=5, n_ctx=3)
    >>> made = []
    >>> _ = [ModelConstants(m, torch.float64, "cpu").get("k", lambda: made.append(1) or torch.ones(1)) for _ in range(2)]
    >>> with torch.no_grad():
    ...     _ = m.blocks[0].attn.W_O.mul_(2)
    >>> _ = ModelConstants(m, torch.float64, "cpu").get("k", lambda: made.append(1) or torch.ones(1))
    >>> len(made)
    2
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, device: torch.device | str):
        self.key = model
        tensors = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if b is not None]
        self.stamp = tuple((n, t.data_ptr(), t._version, tuple(t.shape), t.dtype) for n, t in tensors) + (dtype, str(device))


def _bytes(value) -> int:
    """The bytes of the tensors in ``value`` (a tensor, a number, or a tuple of them)."""
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, tuple):
        return sum(_bytes(v) for v in value)
    return 0


def gram(R: Tensor, panels: int | None = None) -> Tensor:
    """``R Rᵀ`` computing only the panels on and above the diagonal when ``R`` is long and wide
    (``W_Uᵀ W_U`` for a large vocabulary: row panels, each times the rows from its own on; 1.38 ->
    0.85 s in float64 on one CPU core at 768 x 50257 with 8 panels, 56% of the products). ``panels``
    is 4 by default in float64 (62% of the products, but in larger, faster ones: 0.56 s against 0.70 s
    with 8, CPU seconds on one loaded machine) and 8 otherwise (float32: 0.22 s against 0.24 s)."""
    if panels is None:
        panels = 4 if R.dtype == torch.float64 else 8
    n = R.shape[0]
    if n < 256 or R.shape[1] < 8 * n:
        return R @ R.T
    edges = [n * i // panels for i in range(panels + 1)]
    out = R.new_empty(n, n)
    for i in range(panels):
        a, b = edges[i], edges[i + 1]
        panel = R[a:b] @ R[a:].T  # [b - a, n - a]
        out[a:b, a:] = panel
        out[b:, a:b] = panel[:, b - a:].T
    return out
