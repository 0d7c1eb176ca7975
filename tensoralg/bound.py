"""Indices bound by an indexed sum ``Σ_{h∈H_1}``, as the reader finds them and the printer writes them.

A :class:`Bound` says that every term carrying ``index`` is summed over ``over``; an
expression read from text keeps the indices its sums bind (``expr.bound``) through
``expand``, scaling and transposes, so ``str`` and the LaTeX still show the ``Σ``.

>>> b = Bound("h1", "h", "H_1", 1)
>>> b.text(), b.text(index_from=1)
('Σ_{h1∈H_1}', 'Σ_{h2∈H_2}')
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple

_STORED = re.compile(r"([A-Za-z]+)(\d*)('*)", re.ASCII)


class Bound(NamedTuple):
    """An index bound by ``Σ_{var∈over}``: atoms carrying ``index`` are summed over ``over``.

    ``layer`` is the layer (0-based, as stored) when ``over`` is a layer's heads ``H_l``.
    """

    index: str
    var: str
    over: str
    layer: int | None

    def over_text(self, index_from: int = 0) -> str:
        """``H_1`` (the layer numbered from ``index_from``), or the set as typed."""
        return self.over if self.layer is None else f"H_{self.layer + index_from}"

    def index_text(self, index_from: int = 0) -> str:
        """The stored index with its layer number shifted, as the atoms carrying it print: ``h0'`` → ``h1'``
        from 1 (an index of another set too, ``m1`` → ``m2``, since its atoms print so)."""
        return shown_index(self.index, index_from)

    def text(self, index_from: int = 0) -> str:
        """``Σ_{h1∈H_1}``: what the text language reads back as this sum."""
        return f"Σ_{{{self.index_text(index_from)}∈{self.over_text(index_from)}}}"


def stored_index(var: str, layer: int, index_from: int = 0) -> str | None:
    """The index stored for ``Σ_{var∈H_l}`` over layer ``layer`` (0-based): ``h`` → ``h1``; a variable
    that names the layer as the printer writes it (``h1``, ``h1'``; ``h_1`` arrives as ``h1``) keeps
    its name; ``None`` when it names another layer.

    >>> stored_index("h", 1), stored_index("h2", 1, index_from=1), stored_index("h2", 1)
    ('h1', 'h1', None)
    """
    m = _STORED.fullmatch(var)
    if m is None or not m[2]:
        return f"{var}{layer}"
    return f"{m[1]}{layer}{m[3]}" if int(m[2]) == layer + index_from else None


# a layer's label: L0H3, a key/value head L1KV0, a layer's own L1 and what follows (N^{L1H0,q}, N^{L0,post},
# N^{L0mlp}); longer digit runs are no layer number
_HEAD_LABEL = re.compile(r"L(\d{1,18})((?:H|KV)\d+)?(,[A-Za-z]+|mlp)?", re.ASCII)
_LAYER_INDEX = re.compile(r"([A-Za-z]+)(\d{1,18})('*)", re.ASCII)  # h2, h2', head2: letters, then the layer


def shown_index(index: str, index_from: int = 0) -> str:
    """A stored index as printed with layers counted from ``index_from`` (the inverse of
    :func:`stored_free_index`): ``L0H3`` → ``L1H3``, ``h0'`` → ``h1'``, ``head0`` → ``head1``; others as stored.

    >>> shown_index("L0H3", 1), shown_index("h0'", 1), shown_index("1", 1), shown_index("h0")
    ('L1H3', "h1'", '1', 'h0')
    >>> shown_index("L1H0,q", 1), shown_index("L1KV0,k", 1), shown_index("L0,post", 1)
    ('L2H0,q', 'L2KV0,k', 'L1,post')
    """
    if not index_from:
        return index
    if m := _HEAD_LABEL.fullmatch(index):
        return f"L{int(m[1]) + index_from}{m[2] or ''}{m[3] or ''}"
    if m := _LAYER_INDEX.fullmatch(index):
        return f"{m[1]}{int(m[2]) + index_from}{m[3]}"
    return index


def stored_free_index(index: str, index_from: int = 0) -> str | None:
    """A free index as stored, its layer counted from 0: with ``index_from=1`` the head label
    ``L1H3`` is ``L0H3`` and ``h2`` is ``h1`` (the printer writes them shifted back); other indices
    (``h``, ``1``, ``q``) as they are; ``None`` for a layer 0 that numbering from 1 has not.

    >>> stored_free_index("L1H3", 1), stored_free_index("h2", 1), stored_free_index("1", 1), stored_free_index("h0", 1)
    ('L0H3', 'h1', '1', None)
    """
    if not index_from:
        return index
    if m := _HEAD_LABEL.fullmatch(index):
        layer = int(m[1]) - index_from
        return f"L{layer}{m[2] or ''}{m[3] or ''}" if layer >= 0 else None
    if m := _LAYER_INDEX.fullmatch(index):
        layer = int(m[2]) - index_from
        return f"{m[1]}{layer}{m[3]}" if layer >= 0 else None
    return index


def merge_bound(*groups: Iterable[Bound]) -> tuple[Bound, ...]:
    """The bound indices of several expressions together, each once, outer layers first."""
    seen = {b.index: b for group in groups for b in group}
    return tuple(sorted(seen.values(), key=lambda b: (-(b.layer if b.layer is not None else -1), b.index)))
