"""derivations.expansion: the steps of ``tcircuits expand`` in the slides' notation."""

from __future__ import annotations

import pytest

from derivations.errors import DerivationError
from derivations.expansion import expansion, sum_indices, typed
from tensoralg import parse
from tensoralg.parse import read


def rules(d):
    return [[s.rule.key for s in c.steps] for c in d.chains]


def test_one_layer_gives_the_direct_path_and_one_indexed_head_term():
    d = expansion("(Id ⊗ W_U)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id ⊗ W_E)")
    assert d.chains[0].last == parse("Id ⊗ W_U W_E + A^{h1} ⊗ W_U W_OV^{h1} W_E")
    assert [s.text() for s in d.chains[0].sums] == ["Σ_{h1∈H_1}"]


def test_two_layers_give_the_virtual_head_double_sum_outer_layer_first():
    d = expansion("(Id ⊗ W_U)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id + Σ_{h∈H_0} A^h ⊗ W_OV^h)(Id ⊗ W_E)")
    assert len(d.chains[0].last) == 4
    assert parse("A^{h1} A^{h0} ⊗ W_U W_OV^{h1} W_OV^{h0} W_E").terms[0] in d.chains[0].last.terms
    assert [s.index for s in d.chains[0].sums] == ["h1", "h0"]


def test_sum_indices_name_their_sets():
    bound = read("(Σ_{j∈J} A^j ⊗ W_OV^j)(Σ_{h∈H_{0}} A^h ⊗ W_OV^h)").bound
    assert [(s.index, s.over.text) for s in sum_indices(bound)] == [("h0", "H_0"), ("j", "J")]


def test_the_action_step_follows_the_expansion_of_the_operator():
    d = expansion("(Id + A^1 ⊗ W_OV^1)(Id + A^0 ⊗ W_OV^0) x", max_order=1)
    assert rules(d) == [["given", "truncation", "mixed-product"], ["action"]]
    assert d.chains[0].lhs.text == "T" and d.chains[1].lhs.text == "T·x"  # the operator named, never shown unsummed
    assert d.chains[1].last == parse("x + A^0 x W_OV^0ᵀ + A^1 x W_OV^1ᵀ", atoms={"x": ("n_ctx", "d_model")})


def test_typed_transposes_head_the_chain_as_typed():
    d = expansion("(W_O W_V)^T ⊗ A")
    assert rules(d) == [["transpose"]] and d.chains[0].lhs.text == "(W_O W_V)ᵀ ⊗ A"
    assert "W_Vᵀ W_Oᵀ" in "".join(getattr(p, "text", str(p)) for p in d.chains[0].steps[0].detail)


def test_typed_input_is_shown_only_when_it_reads_back_the_same():
    assert typed("W_OV^Tᵀ ⊗ A").text == "(W_OVᵀ)ᵀ ⊗ A"  # a double transpose stays two
    assert typed("d_head**2·A") is None
    assert typed("2*A ⊗ W_E").text == "2·A ⊗ W_E"


def test_fold_errors_name_the_flag_and_the_definitions():
    with pytest.raises(DerivationError, match="--fold W_QK: W_Qᵀ W_K does not occur"):
        expansion("A ⊗ W_O W_V", fold=["W_QK"])
    with pytest.raises(DerivationError, match="cannot fold 'W_XY'; the definitions are W_OV := W_O W_V"):
        expansion("A", fold=["W_XY"])


def test_index_from_one_reads_h_1_as_the_first_layer():
    d = expansion("(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id ⊗ W_E)", index_from=1)
    assert d.chains[0].last == parse("Id ⊗ W_E + A^{h0} ⊗ W_OV^{h0} W_E")
    assert dict(d.params)["index_from"] == 1


def test_an_applied_sum_keeps_its_sigma():
    d = expansion("(Id ⊗ W_U)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h) t")
    assert [s.index for s in d.chains[1].sums] == ["h1"] and d.chains[1].lhs.text == "T·t"
    straight = expansion("(Σ_{h∈H_1} A^h ⊗ W_OV^h) x")
    assert rules(straight) == [["action"]] and straight.chains[0].lhs.text.startswith("(Σ_{h∈H_1} A^h")


def test_like_terms_typed_inside_a_factor_are_collected_as_a_step():
    d = expansion("(Id + A ⊗ W_OV + A ⊗ W_OV)(Id ⊗ W_E)")
    assert rules(d) == [["collect", "distributivity", "mixed-product"]]
    assert d.chains[0].lhs.text == "(Id + A ⊗ W_OV + A ⊗ W_OV)(Id ⊗ W_E)"
    assert d.chains[0].last == parse("Id ⊗ W_E + 2·A ⊗ W_OV W_E")
