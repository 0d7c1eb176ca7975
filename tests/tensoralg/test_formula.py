"""Formulae in slide notation: one parse gives the LaTeX and the text, so they cannot disagree."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensoralg import ParseError
from tensoralg.escape import check_math
from tensoralg.formula import formula
from tests.strategies import PROPERTY


@pytest.mark.parametrize("source, latex, text", [
    ("e_hᵀ e_k ≠ 0", r"e_{h}^{\top} e_{k} \neq 0", "e_hᵀ e_k ≠ 0"),
    ("e_h^T e_k != 0", r"e_{h}^{\top} e_{k} \neq 0", "e_hᵀ e_k ≠ 0"),
    ("W_O^h r^h", r"W_{O}^{h} r^{h}", "W_O^h r^h"),
    ("M_in^J", r"M_{in}^{J}", "M_in^J"),
    ("W_OV^h := W_O^h W_V^h", r"W_{OV}^{h} := W_{O}^{h} W_{V}^{h}", "W_OV^h := W_O^h W_V^h"),
    ("W_Q^hᵀ", r"W_{Q}^{h\top}", "W_Q^hᵀ"),
    ("A^{h2}", r"A^{h_2}", "A^h2"),
    ("A^{L0H3}", r"A^{\mathrm{L0H3}}", "A^L0H3"),
    ("Σ_{h∈H_1} A^h ⊗ W_OV^h", r"\sum_{h \in H_{1}} A^{h} \otimes W_{OV}^{h}", "Σ_{h∈H_1} A^h ⊗ W_OV^h"),
    ("(A ⊗ W)·x = A x Wᵀ", r"(A \otimes W) \cdot x = A x W^{\top}", "(A ⊗ W)·x = A x Wᵀ"),
    ("A^h = softmax*(S^h / sqrt(d_head))", r"A^{h} = \mathrm{softmax}^{*} (S^{h} / \sqrt{d_{head}})",
     "A^h = softmax*(S^h / sqrt(d_head))"),
    ("σ ≤ λ_1 ≈ 2", r"\sigma \le \lambda_{1} \approx 2", "σ ≤ λ_1 ≈ 2"),
    ("Id ⊗ X = X", r"\mathrm{Id} \otimes X = X", "Id ⊗ X = X"),
    ('Qᵀ Q = I "for orthonormal columns"', r"Q^{\top} Q = I \text{ for orthonormal columns }",
     "Qᵀ Q = I for orthonormal columns"),
    ("W_virt^{J←I}", r"W_{virt}^{J \leftarrow I}", "W_virt^{J←I}"),
    # Python's power is a power, never two stars; a double transpose stays two transposes
    ("x**2", r"x^{2}", "x^2"),
    ("x**(n+1)", r"x^{n + 1}", "x^{n+1}"),
    ("x**-1", r"x^{-1}", "x^{-1}"),
    ("W^T^T", r"(W^{\top})^{\top}", "(Wᵀ)ᵀ"),
    ("Wᵀᵀ", r"(W^{\top})^{\top}", "(Wᵀ)ᵀ"),
    ("W^T**2", r"(W^{\top})^{2}", "(Wᵀ)^2"),
    ("W_Q^hᵀᵀ", r"(W_{Q}^{h\top})^{\top}", "(W_Q^hᵀ)ᵀ"),
])
def test_golden_formulae(source, latex, text):
    f = formula(source)
    assert (f.latex, f.text) == (latex, text)
    check_math(f.latex)


def test_not_equal_stays_not_equal():
    # regression: the prose escaper turned ≠ into =; a formula keeps its relation
    assert r"\neq" in formula("h ≠ k").latex and "=" not in formula("h ≠ k").latex


def test_index_from_shifts_layers_only():
    f = formula("Σ_{h0∈H_0} A^{h0} A^{L0H3} x_0", index_from=1)
    assert f.latex == r"\sum_{h_1 \in H_{1}} A^{h_1} A^{\mathrm{L1H3}} x_{0}"
    assert f.text == "Σ_{h1∈H_1} A^h1 A^L1H3 x_0"


@pytest.mark.parametrize("bad, where", [("((a)", 4), ("a)", 1), ("W_^h", 2), ("x ᵀ", 2), ('"open', 0),
                                         ("sqrt d", 5), ("a @ b", 2)])
def test_malformed_formulae_point_at_the_problem(bad, where):
    with pytest.raises(ParseError) as info:
        formula(bad)
    assert info.value.position == where


_NAMES = st.sampled_from(["A", "W_OV", "W_O", "x", "e_h", "M_in", "d_head", "σ", "Id"])
_INDICES = st.sampled_from(["", "^h", "^{h2}", "ᵀ", "^T", "^{L1H2}"])
_OPS = st.sampled_from([" ⊗ ", " = ", " ≠ ", " + ", " - ", "·", " ", " ≤ ", " := "])


@PROPERTY
@given(st.lists(st.tuples(_NAMES, _INDICES), min_size=1, max_size=6), st.lists(_OPS, min_size=6, max_size=6))
def test_text_round_trips_and_latex_is_inert(atoms, ops):
    source = "".join(name + idx + op for (name, idx), op in zip(atoms, ops)).rstrip(" ⊗=≠+-·≤:")
    f = formula(source)
    check_math(f.latex)
    # the text is itself a formula that prints the same LaTeX: the two cannot disagree
    assert formula(f.text).latex == f.latex



def test_a_condition_is_spaced_as_words_not_run_into_the_symbols():
    f = formula("e_h^T e_k = 0 for h ≠ k and h, k ∈ H")
    assert r"0 \quad \text{for}\  h \neq k \ \text{and}\  h" in f.latex
    assert f.text == "e_hᵀ e_k = 0 for h ≠ k and h, k ∈ H"
    check_math(f.latex)


@pytest.mark.parametrize("bad", ["x^2^3", "x**2**3", "x**"])
def test_stacked_powers_need_brackets(bad):
    with pytest.raises(ParseError, match="brackets|needs a number"):
        formula(bad)


@pytest.mark.parametrize("source", ["W_Q^{h^T}", "W_Q^{hT}", "W_Q^{hᵀ}", "W_Q^{h\\top}", "W_Q^hT", "W_Q^hᵀ", "W_Q^{h}ᵀ"])
def test_a_heads_transpose_in_a_superscript_is_the_transpose(source):
    """``W_QK^h = W_Q^{h^T} W_K^h`` as the slides write it: head h, transposed (issue 27), as the reader
    reads it; it printed a superscript inside the superscript, W_{Q}^{h^{\\top}}."""
    f = formula(source)
    assert f.latex == r"W_{Q}^{h\top}" and f.text == "W_Q^hᵀ"


def test_a_superscript_neither_a_head_nor_a_transpose_is_refused():
    with pytest.raises(ParseError, match="'Th' is neither a head nor a transpose"):
        formula("W_QK^{Th}")
