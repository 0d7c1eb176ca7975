"""LaTeX in the paper's notation. (Minimal version; the full printer replaces it.)

The printer dispatches on class names (``_print_<ClassName>``) so that this module
imports nothing from :mod:`tensoralg.expr`.
"""

from __future__ import annotations

import sympy as sp


def _atom(a) -> str:
    name = a.name
    if "_" in name:
        head, sub = name.split("_", 1)
        name = f"{head}_{{{sub}}}"
    sup = [a.index] if a.index else []
    if a.transposed:
        sup.append("T")
    return name + ("^{" + " ".join(sup) + "}" if sup else "")


def _word(w) -> str:
    return " ".join(_atom(a) for a in w) if w else r"\mathrm{Id}"


def to_latex(expr) -> str:
    """LaTeX for an expression, atom or word."""
    kind = type(expr).__name__
    if kind == "Atom":
        return _atom(expr)
    if kind == "TensorSum":
        parts = []
        for t in expr:
            body = r" \otimes ".join(_word(w) for w in t.words)
            c = t.coeff
            parts.append(body if c == 1 else ("-" + body if c == -1 else sp.latex(c) + " " + body))
        return " + ".join(parts).replace("+ -", "- ") if parts else "0"
    if kind == "Product":
        return " ".join(f"\\left({to_latex(f)}\\right)" for f in expr.factors)
    if kind == "Add":
        return " + ".join(to_latex(p) for p in expr.parts)
    return _word(tuple(expr))
