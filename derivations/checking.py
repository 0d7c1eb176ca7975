"""``tcircuits check "LHS = RHS"``: an identity decided by canonical expansion, as a document.

:func:`tensoralg.check.check` decides the identity; this module lays its verdict out as a
:class:`~derivations.derivation.Derivation`, so that every output format of ``expand``
(text, Markdown, LaTeX, HTML, JSON) shows it: the verdict, each side expanded step by step
until both meet, and, when they do not, the terms of ``LHS - RHS`` and a small numeric
counterexample.

>>> d, result = identity_document("(A ⊗ B)(C ⊗ D) = (AC) ⊗ (BD)")
>>> result.holds, [c.lhs.text for c in d.chains]
(True, ['LHS', 'RHS'])
"""

from __future__ import annotations

from tensoralg.check import IdentityCheck, check
from tensoralg.definitions import STANDARD_DEFINITIONS

from derivations import catalogue
from derivations.derivation import Chain, Derivation, Rule
from derivations.document import Math
from derivations.expansion import sum_indices

LHS, RHS, DIFFERENCE = Math(r"\mathrm{LHS}", "LHS"), Math(r"\mathrm{RHS}", "RHS"), \
    Math(r"\mathrm{LHS} - \mathrm{RHS}", "LHS - RHS")


SUBTRACTED = Rule("difference", "the right side subtracted from the left, like terms collected")


def identity_document(text: str, atoms: dict | None = None, *, index_from: int = 0, opaque: bool = False,
                      seed: int = 0) -> tuple[Derivation, IdentityCheck]:
    """The check of ``text`` (``"LHS = RHS"``) as a derivation, with the :class:`IdentityCheck`."""
    result = check(text, atoms=atoms or None, index_from=index_from, opaque=opaque, seed=seed,
                   max_terms=catalogue.DOCUMENT_LIMIT)  # the limit of tcircuits expand
    chains = [_side(LHS, result.lhs, result.lhs_text), _side(RHS, result.rhs, result.rhs_text)]
    if result.holds and chains[0].last != chains[1].last:  # W_OV on one side, W_O W_V on the other: unfold
        for d in STANDARD_DEFINITIONS.values():
            chains = [c.unfold(d) if any(a.name == d.name for t in c.last for w in t.words for a in w) else c
                      for c in chains]
    notes = [catalogue.NOTATION] + [f"How the text was read: {n}." for n in result.notes]
    if not result.holds:
        chains.append(Chain.start(DIFFERENCE, result.difference, SUBTRACTED, sums=sum_indices(result.difference.bound),
                                  intro=("The terms that differ (definitions W_OV and W_QK unfolded to compare, "
                                         "folded again to show):",)))
        if result.counterexample is not None:
            notes.append(f"A counterexample, every dimension {result.counterexample.size}: "
                         + "; ".join(result.counterexample.lines()) + ".")
    params = (("identity", text), ("index_from", index_from), ("holds", result.holds),
              ("numeric_error", result.numeric_error)) + ((("not_checked_numerically", result.unchecked),)
                                                          if result.unchecked is not None else ())
    title = "The identity holds" if result.holds else "The identity does not hold"
    return Derivation("check", title, result.summary(), tuple(chains), notes=tuple(notes), params=params), result


def _side(name: Math, expr, typed: str) -> Chain:
    """One side: as read, then each rule of the expansion (definitions stay as typed)."""
    intro = (f"{name.text}, as typed: {typed}",)
    return Chain.start(name, expr, "given", intro=intro, sums=sum_indices(expr.bound)).expand()


__all__ = ["identity_document"]
