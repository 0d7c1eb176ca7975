"""A CUDA device that a CPU-only torch can run: real values on the CPU, reported as ``cuda:0``.

``fake_cuda()`` is a context in which ``torch.cuda.is_available()`` is true, ``device="cuda"``
makes tensors (factories, ``.to``, ``nn.Module.to``) and every operation checks the devices of
its tensor inputs as CUDA does: a tensor on ``cuda:0`` meeting one on the CPU raises torch's own
``Expected all tensors to be on the same device`` error (0-dimensional CPU tensors, the scalars
CUDA kernels accept, excepted), and ``.numpy()`` of a "cuda" tensor raises as CUDA's does.
Gradients are off inside (verification needs none). A Hugging Face ``from_pretrained`` run inside the
fake leaves transformers' non-persistent buffers (rotary ``inv_freq``) unset, in that load and in every
later one of the process: the tests that load a saved folder on the fake device run it in a child process. The arithmetic is done on the CPU, so conversions and
verifications give their real numbers — which a ``FakeTensorMode`` (shapes only) cannot: the
source check and the verification branch on values.

This is how the CPU suite catches the class of defect a GPU machine showed (a tensor made
without the device of what it meets, a buffer left behind by a copy): every path from a user's
model is run here on "cuda" with its source on "cuda" or on the CPU.

>>> import torch
>>> with fake_cuda():
...     x = torch.ones(2, 2, device="cuda")
...     x.device, (x @ x).device
(device(type='cuda', index=0), device(type='cuda', index=0))
>>> with fake_cuda():
...     torch.ones(2, device="cuda") + torch.ones(2)
Traceback (most recent call last):
RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! (...)
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

CUDA = torch.device("cuda", 0)

# operations that CUDA runs with inputs on two devices: a copy between devices, and indices
# (which CUDA moves to the indexed tensor's device)
_MIXED_OK = {torch.ops.aten.copy_.default, torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default,
             torch.ops.aten.index_put.default, torch.ops.aten._index_put_impl_.default,
             torch.ops.aten._local_scalar_dense.default, torch.ops.aten.lift_fresh.default}


_MIXED_OK_PY = {"copy_", "__getitem__", "__setitem__", "index_put_", "index_put", "__repr__", "__format__"}


class OnCuda(torch.Tensor):
    """A CPU tensor (``inner``) that says it is on ``cuda:0``."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> "OnCuda":
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), storage_offset=inner.storage_offset(), dtype=inner.dtype,
            device=CUDA, requires_grad=False)

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f"OnCuda({self.inner!r})"

    # what converts to Python runs on the CPU tensor (torch's bindings would guard the CUDA device first)
    def item(self):
        return self.inner.item()

    def tolist(self):
        return self.inner.tolist()

    def __float__(self):
        return float(self.inner)

    def __int__(self):
        return int(self.inner)

    def __bool__(self):
        return bool(self.inner)

    def __index__(self):
        return self.inner.__index__()

    def __getitem__(self, index):
        out = self.inner[tree_map(lambda t: t.inner if isinstance(t, OnCuda) else t, index)]
        return OnCuda(out) if isinstance(out, torch.Tensor) else out

    def __setitem__(self, index, value) -> None:
        index = tree_map(lambda t: t.inner if isinstance(t, OnCuda) else t, index)
        if isinstance(value, torch.Tensor) and not isinstance(value, OnCuda) and value.dim() > 0:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
                               "(setitem)")
        self.inner[index] = value.inner if isinstance(value, OnCuda) else value

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")

    def __array__(self, *args, **kwargs):
        self.numpy()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # every Python-level call on a "cuda" tensor runs on the CPU tensors (torch's bindings would
        # guard the CUDA device first); devices are checked in _run, below the bindings
        if func == torch.Tensor.device.__get__:
            return CUDA
        if func == torch.Tensor.is_cuda.__get__:
            return True
        if func is torch._has_compatible_shallow_copy_type:  # nn.Module.to asks before swapping in the new tensor
            return False
        return _run(func, args, kwargs or {}, python=True)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _is_cuda(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _run(func, args, kwargs, python: bool = False):
    devices: set[str] = set()
    first = args[0] if args else None

    def unwrap(x):
        if isinstance(x, OnCuda):
            devices.add("cuda:0")
            return x.inner
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.device.type != "meta":
            devices.add("cpu")
        return x

    args, kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
    if len(devices) > 1 and func not in _MIXED_OK and not (python and getattr(func, "__name__", "") in _MIXED_OK_PY):
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                           f"cuda:0 and cpu! ({func})")
    target = kwargs.get("device")
    if target is not None:
        kwargs = {**kwargs, "device": torch.device("cpu") if _is_cuda(target) else target}
        on_cuda = _is_cuda(target)
    else:
        on_cuda = devices == {"cuda:0"}
    out = func(*args, **kwargs)
    if func is torch.ops.aten._local_scalar_dense.default:
        return out
    if isinstance(first, OnCuda) and out is first.inner:  # in place: the same "cuda" tensor
        return first
    wrap = (lambda t: OnCuda(t) if isinstance(t, torch.Tensor) and not isinstance(t, OnCuda) else t) if on_cuda else (lambda t: t)
    return tree_map(wrap, out)


_plain_to = torch.Tensor.to


def _to(self: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """``Tensor.to``: "cuda" wraps, "cpu" unwraps, a dtype alone keeps the device (no copy when nothing changes)."""
    copy = bool(kwargs.pop("copy", False))
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    inner = self.inner if isinstance(self, OnCuda) else self
    to_cuda = _is_cuda(device) if device is not None else isinstance(self, OnCuda)
    if not to_cuda:  # the CPU, or another device such as meta: torch's own
        return _plain_to(inner, device=device if device is not None else inner.device, dtype=dtype or inner.dtype, copy=copy)
    out = _plain_to(inner, device="cpu", dtype=dtype or inner.dtype, copy=copy)
    if isinstance(self, OnCuda) and out is inner:
        return self
    return OnCuda(out)


class _Generator(torch.Generator):
    """``torch.Generator(device="cuda")``: a CPU generator (the fake device's tensors are drawn on the CPU)."""

    def __new__(cls, device: Any = "cpu"):
        return super().__new__(cls, device="cpu" if _is_cuda(device) else device)


def _factory(plain):
    """``torch.tensor``/``torch.as_tensor`` with ``device="cuda"`` (they bypass the dispatch mode)."""
    def make(*args, device=None, **kwargs):
        if not _is_cuda(device):
            return plain(*args, device=device, **kwargs) if device is not None else plain(*args, **kwargs)
        out = plain(*tree_map(lambda t: t.inner if isinstance(t, OnCuda) else t, args), device="cpu", **kwargs)
        return OnCuda(out) if isinstance(out, torch.Tensor) else out
    return make


class _FakeCudaMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.copy_.default:  # in place, between devices as CUDA allows
            dst, src = args[0], args[1]
            (dst.inner if isinstance(dst, OnCuda) else dst).copy_(src.inner if isinstance(src, OnCuda) else src)
            return dst
        return _run(func, args, kwargs)


@contextlib.contextmanager
def fake_cuda() -> Iterator[None]:
    """Within: one CUDA device, ``cuda:0``, whose tensors live on the CPU and check devices as CUDA does."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())  # autograd's bookkeeping would guard the CUDA device (and abort)
        stack.enter_context(mock.patch("torch.cuda.is_available", return_value=True))
        stack.enter_context(mock.patch("torch.cuda.device_count", return_value=1))
        stack.enter_context(mock.patch("torch.cuda.current_device", return_value=0))
        stack.enter_context(mock.patch("torch.cuda.get_device_name", return_value="fake CUDA (CPU)"))
        stack.enter_context(mock.patch("torch.cuda.mem_get_info", return_value=(8 * 2**30, 16 * 2**30)))
        stack.enter_context(mock.patch("torch.cuda.synchronize", return_value=None))
        stack.enter_context(mock.patch("torch.cuda._lazy_init", return_value=None))
        stack.enter_context(mock.patch.object(torch, "Generator", _Generator))
        for name in ("tensor", "as_tensor"):
            stack.enter_context(mock.patch.object(torch, name, _factory(getattr(torch, name))))
        stack.enter_context(mock.patch.object(torch.Tensor, "to", _to))
        stack.enter_context(mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: _to(self, CUDA)))
        stack.enter_context(mock.patch.object(torch.Tensor, "cpu", lambda self, *a, **k: _to(self, "cpu")))
        stack.enter_context(_FakeCudaMode())
        yield


def on_cuda(t: torch.Tensor) -> bool:
    """Whether ``t`` is on the fake ``cuda:0`` (or, on a GPU machine, on a real CUDA device)."""
    return isinstance(t, OnCuda) or t.device.type == "cuda"


def cuda() -> contextlib.AbstractContextManager:
    """The real CUDA device where there is one (``make gpu-check``), else the fake ``cuda:0``."""
    return contextlib.nullcontext() if torch.cuda.is_available() else fake_cuda()
