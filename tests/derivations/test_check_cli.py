"""``tcircuits check`` (exit 0 / 1 / 2, every output format) and the slides' forms typed into
``tcircuits expand``: read, or refused with what to type."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli


def test_check_a_true_identity_prints_both_sides_meeting_and_exits_0(capsys):
    code, out, err = run_cli(capsys, "check", "(A ⊗ B)(C ⊗ D) = (AC) ⊗ (BD)")
    assert code == 0 and err == ""
    assert "The identity holds" in out and "LHS = (A ⊗ B) (C ⊗ D)" in out and "= A C ⊗ B D" in out
    assert "AC is read as the product A C" in out  # the reading is said, not silent


def test_check_a_false_identity_shows_the_difference_and_a_counterexample_and_exits_1(capsys):
    code, out, _ = run_cli(capsys, "check", "(XY)^T = X^T Y^T")
    assert code == 1
    assert "does not hold" in out and "LHS - RHS = -Xᵀ Yᵀ + Yᵀ Xᵀ" in out
    assert "counterexample, every dimension 2: X = [[" in out


@pytest.mark.parametrize("fmt, marker", [("markdown", "$$"), ("latex", r"\begin{align*}"), ("html", "<math"),
                                         ("json", '"name": "check"')])
def test_check_writes_every_format_of_expand(capsys, fmt, marker):
    code, out, _ = run_cli(capsys, "check", "W_QK^h = W_Q^{hT} W_K^h", "--format", fmt)
    assert code == 0 and marker in out
    if fmt == "json":
        assert json.loads(out)["params"]["holds"] is True


@pytest.mark.parametrize("identity, fragment", [
    ("A ⊗ B", "one '='"),
    ("A ⊗ B = C", "different numbers of tensor slots"),
    ("softmax(A) = A", "write the attention pattern as A^h"),
])
def test_check_bad_input_is_one_line_and_exit_2(capsys, identity, fragment):
    code, out, err = run_cli(capsys, "check", identity)
    assert code == 2 and out == "" and err.startswith("tcircuits check: error:") and fragment in err


# -- the slides' and the paper's forms, typed into expand ---------------------------------------

READ = [
    (r"W_{OV}^h \otimes A^h", "W_OV^{h} ⊗ A^{h}"),
    (r"\sum_{h \in H_1} A^h \otimes W_{OV}^h", "Σ_{h1∈H_1} A^{h1} ⊗ W_OV^{h1}"),
    (r"\left(\mathrm{Id} + A^{h} \otimes W_{OV}^{h}\right) \cdot (\mathrm{Id} \otimes W_E)", "A^{h} ⊗ W_OV^{h} W_E"),
    ("x^\\top W_Q^{h\\top} W_K^h x", "xᵀ W_Q^{h}ᵀ W_K^{h} x"),
    ("W_Q^{hT} W_K^h", "W_Q^{h}ᵀ W_K^{h}"),
    ("A^{1T} ⊗ Id", "A^{1}ᵀ ⊗ Id"),
    ("Σ_{h_2∈H_2} A^{h_2} ⊗ W_OV^{h_2}", "Σ_{h2∈H_2} A^{h2} ⊗ W_OV^{h2}"),
    ("(A ⊗ B)(C ⊗ D) - (AC) ⊗ (BD)", "AC is read as the product A C"),
]


@pytest.mark.parametrize("text, fragment", READ)
def test_the_papers_forms_are_read(capsys, text, fragment):
    code, out, err = run_cli(capsys, "expand", text)
    assert code == 0 and fragment in out, out


REFUSED = [
    ("softmax(x^T W_Q^T W_K x)", "write the attention pattern as A^h"),
    ("W_Q^T^h W_K^h", "write W_Q^{h}ᵀ"),
    ("h(x) = (A ⊗ W_OV) x", "tcircuits check"),
    (r"\frac{1}{\sqrt{d_{head}}} A", "write a/b, as in 1/sqrt(d_head)"),
    ("A^{h} 1 ⊗ W_OV^{h}", "write the coefficient first"),
]


@pytest.mark.parametrize("text, fragment", REFUSED)
def test_the_papers_forms_that_mean_something_else_are_refused_with_what_to_type(capsys, text, fragment):
    code, out, err = run_cli(capsys, "expand", text)
    assert code == 2 and fragment in err, err


def test_opaque_reads_a_nonlinear_function_as_a_matrix_and_says_so(capsys):
    code, out, _ = run_cli(capsys, "expand", "softmax(x^T W_Q^T W_K x) x W_V^T", "--opaque")
    assert code == 0 and "softmax^{1} x W_Vᵀ" in out and "read as the opaque matrix softmax^{1}" in " ".join(out.split())
