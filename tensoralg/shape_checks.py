"""How the reader keeps shapes consistent: the :class:`~tensoralg.grammar.Parser` methods that check words,
slot counts, the links of a product and the terms of a sum, all at once where undeclared names are involved
(so that shape inference reads the text again once, not once per name), and that keep two sums over the same
heads apart in a product. :class:`ShapeChecks` is a mixin: the parser inherits these methods, as it does
:class:`~tensoralg.calls.Calls`'.
"""

from __future__ import annotations

from tensoralg.atoms import Word, word_shape
from tensoralg.errors import ShapeMismatch, SlotMismatch
from tensoralg.expr import widen_identity
from tensoralg.parts import _indices
from tensoralg.reading import reindex


#: What a student may type for the identity; the language reads it as a matrix of one slot named so.
_IDENTITY_LOOKALIKES = {"I"}
_IDENTITY_HINT = " (I is read here as a matrix of that name: the identity of every slot is written Id, or \\mathrm{Id})"


class ShapeChecks:
    """Shape checks of the parser (needs ``self.shapes``, ``self.bound`` and ``self.located``)."""

    def rename_apart(self, factors: list) -> list:
        """Sums over the same heads in two factors of a product bind different indices:
        ``(Σ_h A^h ⊗ W^h)(Σ_h A^h ⊗ W^h)`` is a double sum, not a sum of squares."""
        seen: set[str] = set()
        out = []
        for f in factors:
            used = {index for index in _indices(f) if index in self.bound}
            clash = used & seen
            if clash:
                mapping = {}
                for old in clash:
                    new = old + "'"
                    while new in self.bound or new in seen or new in used:
                        new += "'"
                    mapping[old] = new
                    self.bound[new] = self.bound[old]._replace(index=new)
                f = reindex(f, mapping)
                used = (used - clash) | set(mapping.values())
            seen |= used
            out.append(f)
        return out

    def equate(self, exprs: list) -> None:
        """The terms of a sum have one shape per slot: all the equations that involve undeclared names
        at once, so that shape inference reads the text again once, not once per name (a sum of
        3,000 names took minutes)."""
        if self.shapes is None or len(exprs) < 3 or len({e.n_slots for e in exprs}) != 1:
            return
        pairs = []
        for i in range(exprs[0].n_slots):
            shapes = [e.slot_shapes[i] for e in exprs if e.slot_shapes[i] is not None]
            pairs += [(a, b) for shape in shapes[1:] for a, b in zip(shapes[0], shape) if a != b]
        if any(self.shapes.is_fresh(d) for pair in pairs for d in pair):
            raise ShapeMismatch("the terms of a sum have different shapes", dims=pairs)

    def equate_links(self, factors: list) -> None:
        """The factors of a product chain slot by slot: every link that does not, at once, when one
        involves an undeclared name (so that ``(B0)(B1)…(B799)`` is one more reading, not 800)."""
        if self.shapes is None or len(factors) < 3:
            return
        pairs = []
        for i in range(factors[0].n_slots):
            current = None
            for f in factors:
                shape = f.slot_shapes[i] if i < f.n_slots else None
                if shape is None:
                    continue
                if current is not None and current[1] != shape[0]:
                    pairs.append((current[1], shape[0]))
                current = shape if current is None else (current[0], shape[1])
        if len(pairs) > 1 and any(self.shapes.is_fresh(d) for pair in pairs for d in pair):
            raise ShapeMismatch("the factors of a product do not chain", dims=pairs)

    def check_word(self, word: Word, pos: int) -> None:
        """The shape of ``word``, a mismatch located at ``pos``."""
        try:
            word_shape(word)
        except ShapeMismatch as err:
            raise self.located(err, pos) from None

    def check_slots(self, items, exprs, verb: str) -> None:
        """Slot counts must agree, except that a bare ``Id`` widens (see :func:`widen_identity`)."""
        widest = max(e.n_slots for e in exprs)
        widened = [widen_identity(e, widest) for e in exprs]
        first = widened[0].n_slots
        for (pos, _), e in zip(items, widened):
            if e.n_slots != first:
                hint = _IDENTITY_HINT if any(str(x) in _IDENTITY_LOOKALIKES and x.n_slots == 1 for x in exprs) else ""
                raise self.located(
                    SlotMismatch(f"cannot {verb} a {e.n_slots}-slot expression and a {first}-slot expression{hint}"),
                    pos,
                )
