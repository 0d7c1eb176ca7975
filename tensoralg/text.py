"""Expressions as text that :func:`tensoralg.parse.parse` reads back to the same operator.

There is one text printer, :meth:`tensoralg.latex.TensorLatexPrinter.text` (the LaTeX's
twin, by the same rules: signs pulled out, brackets by precedence, ``Σ_{h1∈H_1}`` before
the terms summed over heads); ``str``, ``repr``, the documents' text and :func:`to_text`
all print through it. :func:`to_text` adds only what a printout of everything needs: the
zero sum, and a refusal for an index that the language cannot write.
"""

from __future__ import annotations

from tensoralg.atoms import Atom
from tensoralg.errors import TensorAlgError
from tensoralg.expr import Expr, TensorSum
from tensoralg.latex import TensorLatexPrinter


def to_text(expr, index_from: int = 0) -> str:
    """Text that :func:`parse` (with the same ``index_from``) reads back to the same operator.

    Canonical sums print as ``str`` does; lazy products as ``c·(F_1)(F_2)…``; lazy sums
    with their parts. A zero k-slot sum prints as ``0·Id ⊗ … ⊗ Id``. Atoms must have
    indices without braces.

    >>> from tensoralg.parse import parse
    >>> to_text(parse("(A^{1} ⊗ Id)(Id ⊗ W_E)"))
    '(A^{1} ⊗ Id)(Id ⊗ W_E)'
    >>> to_text(parse("A ⊗ W_OV + -2·B ⊗ C"))
    'A ⊗ W_OV - 2·B ⊗ C'
    """
    printer = TensorLatexPrinter(index_from=index_from)
    if isinstance(expr, Atom):
        return printer.atom_text(expr)
    if not isinstance(expr, Expr):
        raise TensorAlgError(f"to_text() takes an atom or an expression (TensorSum, Product, Add), "
                             f"got {type(expr).__name__}")
    if isinstance(expr, TensorSum) and not len(expr):
        return "0·" + " ⊗ ".join(["Id"] * expr.n_slots)
    _check_indices(expr.expand() if isinstance(expr, TensorSum) else _factors(expr))
    return printer.text(expr)


def _factors(expr) -> list:
    parts = getattr(expr, "parts", (expr,))
    return [f for p in parts for f in getattr(p, "factors", (p,))]


def _check_indices(sums) -> None:
    for s in (sums if isinstance(sums, list) else [sums]):
        for t in s:
            for w in t.words:
                for a in w:
                    if "{" in a.index or "}" in a.index:
                        raise TensorAlgError(f"atom {a!r}: an index with braces cannot be written as text")
