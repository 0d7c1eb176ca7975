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
    # issue 56: the README's example said "they differ by 0.0e+00" and then "Not checked numerically: no numeric
    # value for rows_B": a fresh shape now gets a small size in the line-by-line check too, as in the identity's
    assert "on random bindings they differ by 0.0e+00" in out and "Not checked numerically" not in out
    assert "Checked numerically on random bindings: every line equals the first" in out
    code, out, _ = run_cli(capsys, "expand", "(A ⊗ B)(C ⊗ D)")
    assert code == 0 and "Checked numerically on random bindings: every line equals the first" in out


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
    (r"\frac{1}{\sqrt{d_{head}}} A", "1/sqrt(d_head)·A"),       # sympy's LaTeX of a coefficient
    ("A^{h} 1 ⊗ W_OV^{h}", "A^{h} 1 ⊗ W_OV^{h}"),                 # the column of ones of the folding entries
    ("A^{h} 1 ⊗ W_OV^{h}", "read as a column of ones (n × 1)"),
    (r"W_{\mathrm{OV}}^h", "W_OV^{h}"),
]


@pytest.mark.parametrize("text, fragment", READ)
def test_the_papers_forms_are_read(capsys, text, fragment):
    code, out, err = run_cli(capsys, "expand", text)
    assert code == 0 and fragment in " ".join(out.split()), out


REFUSED = [
    ("softmax(x^T W_Q^T W_K x)", "write the attention pattern as A^h"),
    ("W_Q^T^h W_K^h", "write W_Q^{h}ᵀ"),
    ("h(x) = (A ⊗ W_OV) x", "tcircuits check"),
    (r"\dfrac{1}{2 A", "unclosed '{' of a LaTeX fraction"),
    ("A^{h} 2 ⊗ W_OV^{h}", "write the coefficient first"),
]


@pytest.mark.parametrize("text, fragment", REFUSED)
def test_the_papers_forms_that_mean_something_else_are_refused_with_what_to_type(capsys, text, fragment):
    code, out, err = run_cli(capsys, "expand", text)
    assert code == 2 and fragment in err, err


def test_opaque_reads_a_nonlinear_function_as_a_matrix_and_says_so(capsys):
    code, out, _ = run_cli(capsys, "expand", "softmax(x^T W_Q^T W_K x) x W_V^T", "--opaque")
    out = " ".join(out.split())
    assert code == 0 and "softmax(xᵀ W_QK x) x W_Vᵀ" in out  # named by the function and its argument
    assert "softmax(x^T W_Q^T W_K x) is read as the opaque matrix softmax(xᵀ W_QK x)" in out


# -- issue 27: decided right, or refused saying what was read and how to write it --------------

@pytest.mark.parametrize("identity", [
    "softmax(A) = softmax(B)",                                   # two functions numbered 1 on each side
    "exp(A) = exp(-A)",
    "LN(A) = LN(B)",
    "softmax(x W_QK^{h1} x^T) = softmax(x W_QK^{h2} x^T)",         # the patterns of two heads
    "softmax(A+B) = softmax(A) + softmax(B)",
])
def test_opaque_functions_of_different_arguments_are_different_unknowns(capsys, identity):
    code, out, _ = run_cli(capsys, "check", identity, "--opaque")
    assert code == 1 and "The identity does not hold" in out, out


@pytest.mark.parametrize("identity", [
    "softmax(A+B) = softmax(B+A)",                                # the same argument, written two ways
    "softmax(x W_QK^h x^T) = softmax(x W_Q^{hT} W_K^h x^T)",      # W_QK unfolded inside the argument
    "2·exp(A) = exp(A) + exp(A)",
    "LN(x) W = LN(x) W",                                          # (x) after a function is its argument
])
def test_the_same_application_is_the_same_unknown(capsys, identity):
    code, out, _ = run_cli(capsys, "check", identity, "--opaque")
    assert code == 0 and "The identity holds" in out, out


def test_the_note_names_an_opaque_matrix_as_the_expression_prints_it(capsys):
    code, out, _ = run_cli(capsys, "check", "softmax(A+B) = softmax(A) + softmax(B)", "--opaque")
    flat = " ".join(out.split())
    for typed, name in (("softmax(A+B)", "softmax(A + B)"), ("softmax(A)", "softmax(A)"), ("softmax(B)", "softmax(B)")):
        assert f"{typed} is read as the opaque matrix {name}," in flat
    assert "RHS = softmax(A) + softmax(B)" in out and "LHS = softmax(A + B)" in out
    assert "softmax^{" not in out


@pytest.mark.parametrize("identity", [
    "(A ⊗ W)x = AxW^T",                      # the slides' formula: ^T binds to W, not to A x W
    "(A ⊗ W)·x = A x W^T",
    "W_QK^h = W_Q^{h^T} W_K^h",              # h^T in a superscript: head h, transposed
    "W_QK^h = W_Q^{hT} W_K^h",
    "W_QK^h = W_Q^{h^\\top} W_K^h",
    r"W_{\mathrm{OV}}^h = W_O^h W_V^h",
    "0.1 A + 0.2 A = 0.3 A",                 # decimals typed are exact
    "0.5·A = 1/2·A",
    "1e-3·A ⊗ B = 1/1000·A ⊗ B",
])
def test_the_slides_forms_hold(capsys, identity):
    code, out, err = run_cli(capsys, "check", identity)
    assert code == 0 and "The identity holds" in out, out + err


@pytest.mark.parametrize("identity, fragments", [
    ("W_QK^{Th} = W_Q^{h}ᵀ W_K^h", ["'Th' is neither a head nor a transpose", "^{hT}"]),
    ("h(x) = (A ⊗ W_OV) x", ["'(x)' is the ASCII spelling of ⊗", "'h(x)' reads as 'h ⊗'", "(A^h ⊗ W_OV^h) x"]),
    ("LN(x) = x", ["LN is not linear", "'(x)' alone is the ASCII spelling of ⊗", "(A^h ⊗ W_OV^h) x", "--opaque"]),
    ("Σ_{h∈H_1∪J} A^h ⊗ W_OV^h = Id", ["a sum over a union runs over layers' heads", "'J' is not a layer's heads"]),
    ("Σ_{h∈H_1∪H_1} A^h ⊗ W_OV^h = Id", ["a layer appears twice in the union"]),
    ("Id ⊗ Id = Id", ["different numbers of tensor slots", "'Id ⊗ Id' has 2", "'Id' has 1",
                      "the identity on 2 slots is Id ⊗ Id"]),
    ("A = A", None),
])
def test_refusals_say_what_was_read_and_how_to_write_it(capsys, identity, fragments):
    code, out, err = run_cli(capsys, "check", identity)
    if fragments is None:  # the control: the same command reads a well-formed identity
        assert code == 0
        return
    assert code == 2 and out == "" and err.startswith("tcircuits check: error:") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


# -- issue 29: bounded, exact, and no traceback -------------------------------------------------

@pytest.mark.parametrize("identity", ["W_E = 0", "X = 0", "A ⊗ B = 0", "(A ⊗ B) x = 0", "0 = W_U W_E",
                                      "W_E - W_E = 0"])
def test_a_side_of_zero_against_any_shape_gives_a_verdict(capsys, identity):
    code, out, err = run_cli(capsys, "check", identity)
    holds = identity.startswith("W_E - W_E")
    assert code == (0 if holds else 1) and err == "", err
    assert ("The identity holds" if holds else "The identity does not hold") in out


@pytest.mark.parametrize("seed", ["-1", "4294967296", "x", "1.5"])
def test_a_bad_seed_is_refused_cleanly(capsys, seed):
    code, out, err = run_cli(capsys, "check", "A = A", "--seed", seed)
    assert code == 2 and "argument --seed: expected an integer from 0 to 4294967295" in err and "Traceback" not in err


def test_a_product_of_many_sums_is_counted_before_it_is_expanded(capsys):
    import time
    product = "".join(f"(A^{{a{i}}}+A^{{b{i}}})" for i in range(30))
    start = time.perf_counter()
    code, out, err = run_cli(capsys, "check", f"{product} = A^{{a0}}")
    assert time.perf_counter() - start < 20  # 2**30 terms: refused from the count, not from memory
    assert code == 2 and "the left side expands to 1,073,741,824 terms, more than the 5,000" in err


def test_a_sum_of_thousands_of_names_is_decided_in_bounded_time(capsys):
    import time
    start = time.perf_counter()
    code, out, err = run_cli(capsys, "check", " + ".join(f"B{i}" for i in range(2000)) + " = B0")
    assert code == 1 and "does not hold" in out and time.perf_counter() - start < 30  # took minutes


# -- what the tool prints, check reads ---------------------------------------------------------

@pytest.mark.parametrize("identity", [
    "A^{h} N ⊗ W_OV'^{h} = A^{h} N ⊗ W_OV'^{h}",   # layer-norm-folding's last line
    "1 ⊗ b_O' = 1 ⊗ b_O'",                         # bias-folding's last line
    "A^{h} N ⊗ W_OV'^{h} = (A^{h} ⊗ W_OV'^{h})(N ⊗ Id)",
])
def test_primed_names_the_tool_prints_are_read_by_check(capsys, identity):
    code, out, err = run_cli(capsys, "check", identity)
    assert code == 0 and "The identity holds" in out, out + err


def test_a_primed_name_is_another_matrix_than_the_unprimed_one(capsys):
    code, out, _ = run_cli(capsys, "check", "A^{h} N ⊗ W_OV'^{h} = A^{h} N ⊗ W_OV^{h}")
    assert code == 1 and "does not hold" in out


def _last_lines():
    """``(entry, index_from, text)``: the last line of every chain of every catalogue entry, as printed."""
    from derivations import catalogue
    for name in catalogue.names():
        for index_from in (0, 1):
            document = json.loads(catalogue.get(name).to_json(index_from=index_from))
            for chain in document["chains"]:
                yield name, index_from, chain["steps"][-1]["expr"]["text"]


def test_every_last_line_derive_prints_is_read_by_check(capsys):
    """``X = X`` holds for the last line X of every chain of every derivation, numbered from 0 and from 1."""
    failed = []
    for name, index_from, text in _last_lines():
        if text == "0":  # check refuses 0 = 0 (no atom to decide on)
            continue
        code, out, err = run_cli(capsys, "check", f"{text} = {text}", "--index-from", str(index_from))
        if code != 0:
            failed.append((name, index_from, text[:80], err.strip()[:200]))
    assert not failed, failed


@pytest.mark.parametrize("expression", [
    "(A^h ⊗ W_OV^h)(N ⊗ G C)",
    "(A^h ⊗ W_O^h)(1 ⊗ b_V'^h)",
    "(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id ⊗ W_E)",
])
def test_the_last_line_expand_prints_is_read_by_check(capsys, expression):
    code, out, _ = run_cli(capsys, "expand", expression, "--max-terms", "0")
    assert code == 0
    last = out.rstrip().splitlines()[-1].strip().removeprefix("= ")
    code, out, err = run_cli(capsys, "check", f"{last} = {expression}")
    assert code == 0 and "The identity holds" in out, (last, out + err)


PAPER_TWO_LAYERS = ("(Id ⊗ W_U)(Id + Σ_{h∈H_2} A^h ⊗ W_OV^h)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id ⊗ W_E) = Id ⊗ W_U W_E"
                    " + UNION A^h ⊗ W_U W_OV^h W_E + Σ_{h2∈H_2} Σ_{h1∈H_1} A^{h2} A^{h1} ⊗ W_U W_OV^{h2} W_OV^{h1} W_E")


@pytest.mark.parametrize("union", ["Σ_{h∈H_1∪H_2}", "sum_{h in H_1 cup H_2}", r"\sum_{h \in H_1 \cup H_2}",
                                   "Σ_{h∈H_2∪H_1}"])
def test_the_papers_two_layer_logits_with_a_sum_over_both_layers_hold(capsys, union):
    """The paper's T = Id ⊗ W_U W_E + Σ_{h∈H_1∪H_2} A^h ⊗ (W_U W_OV^h W_E) + Σ_{h2∈H_2, h1∈H_1} …, in its numbering."""
    code, out, err = run_cli(capsys, "check", PAPER_TWO_LAYERS.replace("UNION", union), "--index-from", "1")
    assert code == 0 and "The identity holds" in out, out + err


def test_a_sum_over_both_layers_is_not_a_sum_over_one(capsys):
    code, out, _ = run_cli(capsys, "check", "Σ_{h∈H_1∪H_2} A^h ⊗ W_OV^h = Σ_{h∈H_1} A^h ⊗ W_OV^h", "--index-from", "1")
    assert code == 1 and "LHS - RHS = Σ_{h2∈H_2} A^{h2} ⊗ W_OV^{h2}" in out
