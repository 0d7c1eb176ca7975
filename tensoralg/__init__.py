"""tensoralg: the algebra of tensor-product terms ``A ⊗ W`` for transformer circuits.

Terms ``c · F_1 ⊗ … ⊗ F_k`` (each ``F_i`` a word of atoms, the empty word ``Id``),
canonical sums, lazy products expanded by the mixed-product rule
``(A⊗B)(C⊗D) = (AC)⊗(BD)``, transposes, the bilinear sandwich that gives QK-score terms,
definitions to fold and unfold, a small text language, LaTeX and numeric bindings.

>>> from tensoralg import atom, identity, term
>>> layer = identity(2) + term(atom("A", "h"), atom("W_OV", "h"))
>>> T = term(None, atom("W_U")) @ layer @ term(None, atom("W_E"))
>>> T.expand()
TensorSum(Id ⊗ W_U W_E + A^{h} ⊗ W_U W_OV^{h} W_E)
"""

from tensoralg.action import act
from tensoralg.atoms import DIMS, Atom, Word, atom, d_head, d_mlp, d_model, d_vocab, n_ctx, word_shape
from tensoralg.bilinear import sandwich
from tensoralg.check import IdentityCheck, check
from tensoralg.definitions import STANDARD_DEFINITIONS, W_OV, W_QK, Definition, fold, unfold
from tensoralg.errors import (
    BindingError,
    EmptySum,
    InvalidOrder,
    ParseError,
    ShapeMismatch,
    SlotMismatch,
    TCircuitsError,
    TensorAlgError,
    UnknownAtom,
    UnsafeLatex,
)
from tensoralg.expr import Add, Choice, Expr, Product, TensorSum, Term, add, identity, tensor, term
from tensoralg.escape import check_math, escape_text
from tensoralg.formula import Formula, formula
from tensoralg.latex import to_latex
from tensoralg.numeric import to_numpy
from tensoralg.parse import parse, read, to_text
from tensoralg.reading import Reading

__all__ = [
    "Add", "Atom", "BindingError", "Choice", "DIMS", "Definition", "EmptySum", "Expr", "Formula", "IdentityCheck", "InvalidOrder",
    "ParseError", "Product", "Reading", "STANDARD_DEFINITIONS", "ShapeMismatch", "SlotMismatch", "TCircuitsError",
    "TensorAlgError", "TensorSum", "Term", "UnknownAtom", "UnsafeLatex", "W_OV", "W_QK", "Word", "act", "add",
    "atom", "check", "check_math", "d_head", "d_mlp", "d_model", "d_vocab", "escape_text", "fold", "formula", "identity",
    "n_ctx", "parse", "read", "sandwich", "tensor", "term", "to_latex", "to_numpy", "to_text", "unfold",
    "word_shape",
]
