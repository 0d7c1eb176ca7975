"""A small text language for tensor expressions: a tokenizer and a recursive-descent parser.

No ``eval``: the text is tokenized and parsed by the grammar below, and errors carry the
0-based position of the problem. ``parse`` reads back exactly what ``str(TensorSum)`` and
:func:`to_text` print. This module is the entry (:func:`parse`, :func:`read`) and the
language's reference; the reader itself, one method per rule, is :mod:`tensoralg.grammar`.

Grammar, loosest binding first (the paper's precedence: product, then ⊗, then +)::

    sum      := summand (("+" | "-") summand)*
    summand  := ("-" | "+")* SUM summand | tensor                     (SUM: "Σ_{h∈H_1}", "sum_{h in H_1}")
    tensor   := product (("⊗" | "(x)") product)*
    product  := ("-" | "+")* power ((("·" | "⋅" | "*" | "/")? power)*   (juxtaposition is "·")
    power    := postfix ("**" ("-")? power)?                             (scalars only)
    postfix  := primary ("^T" | "ᵀ")*
    primary  := NUMBER | NAME INDEX? | "Id" | DIM | "sqrt" "(" sum ")" | "(" sum ")"

Rules worth knowing:

- Superscripts: ``A^h``, ``W_OV^h1`` and ``W_O^{h}`` are indices (braces optional for one
  symbol of letters and digits; braces hold any index verbatim; ``h_2`` is ``h2``). ``^T``,
  ``^{T}``, ``^\\top`` and ``ᵀ`` transpose, after an atom or a parenthesised group:
  ``W_OV^h^T``, ``(A B)^T``; ``W_Q^{hT}``, ``W_Q^{h^T}`` and ``W_Q^{h\\top}`` are ``W_Q^{h}ᵀ``, as the
  slides write them. ``W_Q^T^h`` is refused with what to type (``W_Q^{h}ᵀ``), and so is a
  superscript that is neither a head nor a transpose (``W_QK^{Th}``, ``A^{h^2}``). In atoms typed
  as one name, ``^T`` binds to the last: ``AxW^T`` is ``A x Wᵀ``. The printers' LaTeX reads back:
  ``^{\\mathrm{L0H3}\\top}``, ``^{h_{12}}``, ``W_{OV'}``, ``W_{\\mathrm{OV}}``.
- The paper's LaTeX: ``\\otimes``, ``\\cdot``, ``\\mathrm{Id}``, ``\\left( … \\right)``, ``W_{OV}``,
  ``\\sum_{h \\in H_1}`` read as their Unicode twins (:mod:`tensoralg.lexer`); other commands
  are refused with what to type.
- Juxtaposed atoms without a space: an undeclared name made of names of atoms of the same
  expression (``AC`` in ``(A ⊗ B)(C ⊗ D) = (AC) ⊗ (BD)``) is their product, and the reading
  says so (``("juxtaposed", "AC", ("A", "C"))`` in the rewrites; :func:`parse` warns with
  :class:`~tensoralg.names.ReadingNote`).
- A nonlinear function of an operator (``softmax(…)``, ``exp(…)``, ``LN(…)``) is refused
  ("write the pattern as A^h"); ``opaque=True`` reads it as an opaque matrix named by the
  function and its argument in canonical form, ``softmax(A + B)``: the same application is the
  same unknown, any other application another.
- ``1`` beside ``⊗`` or after a matrix (``1 ⊗ b_O``, ``A^h 1``) is the column of ones.
- An equation ``LHS = RHS`` is refused here: :func:`tensoralg.check` decides it.
- Names: the paper's atoms keep their shapes (``A`` is ``n_ctx × n_ctx``), atoms declared
  with ``atoms=`` theirs; any other name is a matrix with a fresh shape ``rows_B × cols_B``
  that the products fix (shape inference, :mod:`tensoralg.inference`).
- ``Σ_{h∈H_l} body`` sums ``body`` over the heads of layer ``l``: it binds ``h`` as the
  index ``h{l}`` (layers counted from ``index_from``, stored 0-based), each term being
  summed over the indices it carries, as the catalogue prints it. Sums over the same
  heads in two factors of a product are renamed apart (``h0``, ``h0'``). Other sets
  (``Σ_{j∈J}``) bind the letter itself. ``Σ_{h∈H_1∪H_2} body`` (ASCII ``sum_{h in H_1 cup H_2}``,
  LaTeX ``\\cup``) is ``Σ_{h∈H_1} body + Σ_{h∈H_2} body``.
- An operator applied to an activation, ``(A ⊗ W) x`` or ``(A ⊗ W)·x``, is ``A x Wᵀ``
  (:func:`tensoralg.action.act`): ``x`` holds one token per row.
- Juxtaposed atoms form one word at once: ``A^{h2} A^{h1} ⊗ W_OV^{h2} W_OV^{h1}`` is
  ``(A A) ⊗ (W W)``, one term. A product with a parenthesised factor stays a lazy
  :class:`~tensoralg.expr.Product`: ``(A ⊗ B)(C ⊗ D)`` is not multiplied until
  ``expand`` (so ``expand_steps`` can show the rewrite).
- ``+`` collects canonical sums; a sum with a lazy part is a lazy
  :class:`~tensoralg.expr.Add` of its parts, in order. :func:`read` keeps like terms typed
  at the top level apart, to be collected as a step.
- Scalars: integers, decimals (SymPy ``Float``, or exact with ``exact=True``, as
  :func:`tensoralg.check` reads them; write ``1/2`` for an exact half), ``\\frac{a}{b}``, ``\\sqrt{a}``,
  ``/``, ``**``, ``sqrt(...)`` and the dimension symbols ``n_ctx d_model d_head d_vocab
  d_mlp`` (plus any symbol used in a shape declared with ``atoms=``).
- ``(x)`` is always the tensor product, so an atom named ``x`` is written without
  parentheses around it.

>>> parse("A^{h2} A^{h1} ⊗ W_OV^{h2} W_OV^{h1}")
TensorSum(A^{h2} A^{h1} ⊗ W_OV^{h2} W_OV^{h1})
>>> parse("1/sqrt(d_head)·W_QK^{h}ᵀ")
TensorSum(1/sqrt(d_head)·W_QK^{h}ᵀ)
>>> len(parse("(Id ⊗ W_U)(Id ⊗ Id + A^{h} ⊗ W_OV^{h})(Id ⊗ W_E)").expand())
2
>>> parse("(Id + Σ_{h∈H_0} A^h ⊗ W_OV^h)(Id ⊗ W_E)").expand()
TensorSum(Id ⊗ W_E + Σ_{h0∈H_0} A^{h0} ⊗ W_OV^{h0} W_E)
"""

from __future__ import annotations

import warnings
from typing import Iterable, Mapping, Union

from tensoralg.atoms import STANDARD_SHAPES, Atom
from tensoralg.errors import ShapeMismatch, TensorAlgError
from tensoralg.expr import Expr
from tensoralg.grammar import Parser
from tensoralg.inference import Shapes, declared_table
from tensoralg.names import ReadingNote, juxtaposed_note
from tensoralg.reading import Applied, Bound, Reading
from tensoralg.text import to_text

__all__ = ["Applied", "Bound", "Reading", "ReadingNote", "notes", "parse", "read", "to_text"]

AtomDecl = Union[Atom, tuple]
API_HINT = "declare others with atoms="


def read(text: str, atoms: Mapping[str, AtomDecl] | Iterable[Atom] | None = None, *, index_from: int = 0,
         generic: bool = True, hint: str = API_HINT, visible: bool = True, opaque: bool = False,
         names: Iterable[str] = (), exact: bool = False) -> Reading:
    """Read ``text`` with everything :func:`parse` knows, and more: the indices bound by
    its sums, the rewrites made while reading, an operator applied to an activation (kept
    apart, so a derivation can show the step), and the shapes inferred for undeclared names.
    With ``visible`` (the default), like terms typed at the top level stay a lazy sum, to
    be collected as a step. ``names`` are more names of atoms of the expression (the other side
    of an identity), for reading ``AC`` as ``A C``; ``opaque`` reads ``softmax(…)`` as a matrix;
    ``exact`` reads decimals as the rationals they write (``0.1`` is ``1/10``; floats otherwise).

    ``index_from`` says how ``H_l`` counts layers: 0 (the default, as TransformerLens:
    ``H_1`` is the second layer) or 1 (the paper's: ``H_1`` is the first). Indices are
    stored 0-based: ``Σ_{h∈H_1}`` binds ``h1`` with ``index_from=0`` and ``h0`` with 1; so are free
    layer indices, as the printer writes them: ``L1H3`` and ``A^{h2}`` read from 1 are ``L0H3``, ``h1``.

    >>> r = read("(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id + Σ_{h∈H_0} A^h ⊗ W_OV^h)")
    >>> [b.index for b in r.bound]
    ['h0', 'h1']
    >>> read("(A ⊗ B)(C ⊗ D)").expr.expand()
    TensorSum(A C ⊗ B D)
    """
    if not isinstance(text, str):
        raise TensorAlgError(f"parse() takes a string, got {type(text).__name__}")
    if isinstance(index_from, bool) or index_from not in (0, 1):
        raise TensorAlgError(f"index_from is 0 (TransformerLens) or 1 (the paper), got {index_from!r}")
    table = {**STANDARD_SHAPES, **declared_table(atoms)}
    shapes = Shapes(len(text)) if generic else None
    while True:
        parser = Parser(text, table, shapes, index_from, hint, visible, opaque, frozenset(names), exact)
        try:
            value = parser.parse()
            break
        except ShapeMismatch as err:  # an equation between dimensions: solve it and read again
            if shapes is None or not shapes.unify(err.dims):
                raise
    applied = value if isinstance(value, Applied) else None
    bound = tuple(sorted(parser.bound.values()))
    expr = (value.operator if applied else value).with_bound(bound)
    inferred = {name: shapes.shape(name) for name in shapes.fresh} if shapes else {}
    return Reading(expr, bound, tuple(parser.rewrites), applied, inferred)


def notes(reading: Reading) -> list[str]:
    """What the reader says about how it read the text: ``AC`` read as ``A C``, ``softmax(…)``
    read as an opaque matrix (the CLI shows these as notes, :func:`parse` as warnings)."""
    out = []
    for rewrite in reading.rewrites:
        if rewrite[0] == "juxtaposed":
            out.append(juxtaposed_note(rewrite[1], rewrite[2]))
        elif rewrite[0] == "opaque":
            out.append(f"{rewrite[1]} is read as the opaque matrix {rewrite[2]}, an unknown of the function and "
                       "its argument (the same application is the same matrix, any other another)")
        elif rewrite[0] == "ones":
            out.append("1 beside ⊗ or after a matrix is read as a column of ones (n × 1)")
    return list(dict.fromkeys(out))


def parse(text: str, atoms: Mapping[str, AtomDecl] | Iterable[Atom] | None = None, *, index_from: int = 0,
          generic: bool = True, opaque: bool = False) -> Expr:
    """Parse the text language (see the module docstring) into an expression.

    ``atoms`` declares atoms beyond the paper's standard ones, as ``{name: (rows, cols)}``
    (a third entry ``True`` marks a symmetric atom; dimensions are names such as
    ``"d_model"`` or new ones such as ``"k"``), ``{name: Atom}`` or a list of atoms.
    Other names get fresh shapes that the products fix (``generic=False`` refuses them).
    An operator applied to an activation is applied: ``(A ⊗ W) x`` is ``A x Wᵀ``.

    Raises :class:`ParseError` (with the position) for malformed text,
    :class:`UnknownAtom` for an undeclared name when ``generic=False``,
    :class:`ShapeMismatch` / :class:`SlotMismatch` when the pieces do not fit.

    >>> parse("(A^{1} ⊗ W_OV^{1})(A^{2} ⊗ W_OV^{2})").expand()
    TensorSum(A^{1} A^{2} ⊗ W_OV^{1} W_OV^{2})
    >>> parse("V Vᵀ", atoms={"V": ("d_model", "k")}).slot_shapes
    ((d_model, d_model),)
    >>> parse("(A ⊗ W_O W_V) x")
    TensorSum(A x W_Vᵀ W_Oᵀ)
    """
    r = read(text, atoms, index_from=index_from, generic=generic, visible=False, opaque=opaque)
    for note in notes(r):
        warnings.warn(note, ReadingNote, stacklevel=2)
    return r.applied.result().with_bound(r.bound) if r.applied else r.expr
