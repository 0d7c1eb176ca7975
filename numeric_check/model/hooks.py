"""Hook points: named places in a forward pass where activations can be read or replaced.

A :class:`HookPoint` is an identity module. Hook functions follow TransformerLens'
convention: ``fn(tensor, hook)`` returns a new tensor, or ``None`` to keep the value.
``hook`` is a :class:`HookName`, a ``str`` (the module path, e.g.
``"blocks.0.attn.hook_pattern"``) that also answers ``hook.name`` like TL's ``HookPoint``.

>>> import torch
>>> point = HookPoint()
>>> point.name = HookName("blocks.0.hook_resid_pre")
>>> point.add_hook(lambda x, hook: x * 2)
>>> point(torch.ones(2)).tolist()
[2.0, 2.0]

A :class:`Constant` hook replaces the value whatever it was. Modules ask
:meth:`HookPoint.fixed` before computing a value that such a hook would discard: with a
frozen attention pattern the model skips queries, keys and scores, and with a frozen
layer-norm scale it skips the variance (the paper's path isolation freezes both).

>>> point.add_hook(Constant(torch.zeros(2)))
>>> point.fixed().tolist()  # what the hooks give, whatever the input
[0.0, 0.0]
"""

from __future__ import annotations

import contextlib
import difflib
from typing import Callable, Iterable, Iterator, Union

import torch
from torch import Tensor, nn

from numeric_check.errors import HookError

HookFn = Callable[[Tensor, "HookName"], Union[Tensor, None]]
NameFilter = Union[str, Callable[[str], bool]]


class HookName(str):
    """A hook point's name; ``.name`` returns it too, so TL-style hooks (``hook.name``) work."""

    @property
    def name(self) -> str:
        return str(self)


class Constant:
    """A hook function that returns ``value`` whatever it is given (an activation frozen at a recorded value).

    Registered like any hook; hook points that find one let their module skip computing the
    value it replaces (:meth:`HookPoint.fixed`).
    """

    def __init__(self, value: Tensor):
        self.value = value

    def __call__(self, x: Tensor, hook: "HookName") -> Tensor:
        return self.value

    def __repr__(self) -> str:
        return f"Constant({tuple(self.value.shape)})"


class TiledConstant(Constant):
    """A :class:`Constant` whose value is ``base`` repeated along the batch for ``copies`` stacked copies of it
    (the recorded patterns and scales of a pass over copies of a batch), made only when asked for (by ``make``
    when given, else by repeating ``base``): a module that can use ``base`` for every copy at once
    (:meth:`HookPoint.fixed_tiles`) never makes it."""

    def __init__(self, base: Tensor, copies: int, make: Callable[[], Tensor] | None = None):
        self.base, self.copies, self._make = base, copies, make

    @property
    def value(self) -> Tensor:
        if self._make is not None:
            return self._make()
        return self.base.repeat(self.copies, *([1] * (self.base.ndim - 1)))

    def __repr__(self) -> str:
        return f"TiledConstant({tuple(self.base.shape)} x {self.copies})"


class Zeros(Constant):
    """A :class:`Constant` of zeros of ``shape`` (of ``like``'s dtype and device), made only when asked for: a
    module that finds it (:meth:`HookPoint.fixed_zero`) adds nothing, rather than zeros."""

    def __init__(self, like: Tensor, shape: tuple[int, ...]):
        self.like, self.shape = like, tuple(shape)

    @property
    def value(self) -> Tensor:
        return self.like.new_zeros(()).expand(self.shape)  # one zero, read everywhere

    def __repr__(self) -> str:
        return f"Zeros({self.shape})"


class HookPoint(nn.Module):
    """Identity on its input, except that registered hook functions may replace the value.

    Hooks run in the order they were added; each sees the previous one's output.
    A replacement must keep the shape: otherwise :class:`HookError` names the hook point.
    """

    def __init__(self) -> None:
        super().__init__()
        self.name = HookName("")
        self._hooks: list[HookFn] = []

    def add_hook(self, fn: HookFn) -> None:
        self._hooks.append(fn)

    def remove_hook(self, fn: HookFn) -> None:
        """Remove the most recently added registration of ``fn`` (no error if absent)."""
        for i in range(len(self._hooks) - 1, -1, -1):
            if self._hooks[i] is fn:
                del self._hooks[i]
                return

    def remove_hooks(self) -> None:
        self._hooks.clear()

    @property
    def hooks(self) -> tuple[HookFn, ...]:
        """The registered hook functions, in the order they run."""
        return tuple(self._hooks)

    def forward(self, x: Tensor) -> Tensor:
        return self._run_hooks(self._hooks, x)

    @property
    def has_hooks(self) -> bool:
        """Whether any hook function is registered (modules skip forming values nobody reads)."""
        return bool(self._hooks)

    def fixed(self, shape: tuple[int, ...] | None = None) -> Tensor | None:
        """What the hooks return whatever the input, or ``None`` when that depends on the input.

        It does when no :class:`Constant` hook is registered; otherwise the value is the last
        constant, passed through the hooks registered after it (which see it as usual). A
        module calls this *instead of* ``forward`` when it can skip computing the input.
        ``shape``: the shape the input would have had; a constant of another shape is an error.
        """
        last = next((i for i in range(len(self._hooks) - 1, -1, -1) if isinstance(self._hooks[i], Constant)), None)
        if last is None:
            return None
        value = self._hooks[last].value
        if shape is not None and tuple(value.shape) != tuple(shape):
            raise HookError(f"constant hook on {self.name!s} holds {tuple(value.shape)}; expected a tensor of shape {tuple(shape)}")
        return self._run_hooks(self._hooks[last + 1:], value)

    def fixed_zero(self) -> bool:
        """Whether the hooks return zeros whatever the input: the last hook is :class:`Zeros`."""
        return bool(self._hooks) and isinstance(self._hooks[-1], Zeros)

    def fixed_tiles(self, shape: tuple[int, ...]) -> tuple[Tensor, int] | None:
        """``(base, copies)`` when the last hook is a :class:`TiledConstant` of ``shape`` (``copies`` stacked
        copies of ``base`` along the batch), else ``None`` (then :meth:`fixed` says what the hooks return)."""
        last = self._hooks[-1] if self._hooks else None
        if not isinstance(last, TiledConstant) or last.copies * last.base.shape[0] != shape[0] \
                or tuple(last.base.shape[1:]) != tuple(shape[1:]):
            return None
        return last.base, last.copies

    def _run_hooks(self, hooks: list[HookFn], x: Tensor) -> Tensor:
        for fn in hooks:
            out = fn(x, self.name)
            if out is None:
                continue
            if not isinstance(out, Tensor) or out.shape != x.shape:
                got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise HookError(
                    f"hook on {self.name!s} returned {got}; expected None or a tensor of shape "
                    f"{tuple(x.shape)}"
                )
            x = out
        return x

    def extra_repr(self) -> str:
        return f"{self.name!s}, {len(self._hooks)} hooks" if self._hooks else str(self.name)


def block_hook(layer: int, name: str) -> str:
    """The full name of hook ``name`` of block ``layer``.

    >>> block_hook(1, "attn.hook_pattern")
    'blocks.1.attn.hook_pattern'
    """
    return f"blocks.{layer}.{name}"


def name_hook_points(module: nn.Module) -> dict[str, HookPoint]:
    """Give every :class:`HookPoint` under ``module`` its module path as name; return them by name."""
    points = {}
    for path, sub in module.named_modules():
        if isinstance(sub, HookPoint):
            sub.name = HookName(path)
            points[path] = sub
    return points


def select_hook_points(points: dict[str, HookPoint], name: NameFilter) -> list[HookPoint]:
    """The hook points matching ``name``: an exact name, or a predicate on names.

    An unknown exact name raises :class:`HookError` with the closest valid names.
    """
    if callable(name):
        return [point for key, point in points.items() if name(key)]
    if not isinstance(name, str):
        raise HookError(f"a hook must be given a name (str) or a predicate on names, got {name!r}")
    if name not in points:
        close = difflib.get_close_matches(name, list(points), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see model.hook_names"
        raise HookError(f"no hook point named {name!r}{hint}")
    return [points[name]]


def names_filter_to_predicate(names_filter: None | str | Iterable[str] | Callable[[str], bool]) -> Callable[[str], bool]:
    """``None`` (every name), a name, a list of names, or a predicate -> a predicate."""
    if names_filter is None:
        return lambda name: True
    if callable(names_filter):
        return names_filter
    if isinstance(names_filter, str):
        return lambda name: name == names_filter
    wanted = set(names_filter)
    return lambda name: name in wanted


@contextlib.contextmanager
def hooks_set_aside(module: nn.Module) -> Iterator[None]:
    """Take every hook function off ``module``'s hook points for the block; put them back, in order, after.

    For copying a model without the hook functions registered on it (``deepcopy`` inside the
    block gives hook points with no hooks, and never copies a user's closures).

    >>> point = HookPoint()
    >>> point.add_hook(Constant(torch.zeros(1)))
    >>> with hooks_set_aside(point):
    ...     point.has_hooks
    False
    >>> point.has_hooks
    True
    """
    saved = [(point, point.hooks) for point in module.modules() if isinstance(point, HookPoint)]
    for point, _ in saved:
        point.remove_hooks()
    try:
        yield
    finally:
        for point, fns in saved:
            point.remove_hooks()
            for fn in fns:
                point.add_hook(fn)
