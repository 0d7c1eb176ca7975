"""What derivations, their verifications and path expansions show in a notebook."""

from __future__ import annotations

from derivations import Architecture, expand_logits, expand_qk
from derivations.catalogue import get
from tensoralg.display import REPR_MAX_TERMS


def test_a_verification_shows_its_verdict_worst_error_and_each_line():
    v = get("one-layer").verify()
    shown = v._repr_markdown_()
    assert "every line agrees" in shown and f"tolerance {v.tol:.3g}" in shown
    rows = [line for line in shown.splitlines() if line.endswith(" | ok |")]
    assert rows[0] == "| chain | line | relative error | ok |" and len(rows) - 1 == len(v.errors)


def test_a_failed_verification_says_so():
    from derivations.derivation import Verification
    shown = Verification(((0, 0, 0.0), (0, 1, 0.5)), 1e-9)._repr_markdown_()
    assert "**some lines disagree**" in shown and "**FAIL**" in shown and "worst relative error 0.5" in shown


def test_an_expansion_of_thousands_of_terms_shows_head_tail_and_count():
    logits = expand_logits(Architecture(12, 12), max_order=2)
    shown = logits._repr_markdown_()
    assert len(shown) < 4_000
    assert f"{logits.n_terms:,} terms" in shown and rf"{logits.n_terms - REPR_MAX_TERMS}\ \mathrm{{terms}}" in shown


def test_a_qk_expansion_shows_one_sum_per_pair_of_inputs():
    scores = expand_qk(Architecture(2, 2, positional="standard"), 1, 0)
    shown = scores._repr_markdown_()
    for q, k in scores.to_tensor_sums():
        assert f"query input {q}, key input {k}" in shown
    assert shown.count("$$") == 2 * len(scores.to_tensor_sums())
