"""One layer numbering from input to output: ``--index-from 1`` numbers ``--layer`` as it numbers every
label, title and left side the documents print (the paper's numbering, H_1 the first layer)."""

from __future__ import annotations

import json
import re

import pytest

from derivations import catalogue
from derivations.catalogue import INDEXING
from tests.helpers import run_cli

LABEL = re.compile(r"L(\d+)H(\d+)")


def _labels(derivation, index_from: int) -> list[str]:
    """Every head label in the JSON document (titles, prose, left sides, lines; LaTeX and text), the
    note on numbering left out (it names both numberings on purpose)."""
    doc = json.loads(derivation.to_json(index_from=index_from))
    doc["notes"] = [n for n in doc["notes"] if "numbered from" not in n["text"] and "0-indexed" not in n["text"]]
    return [f"L{m[1]}H{m[2]}" for m in LABEL.finditer(json.dumps(doc, ensure_ascii=False))]


@pytest.mark.parametrize("name, params", [(n, {}) for n in catalogue.names()] + [
    ("qk-expansion", {"concrete": True}), ("qk-expansion", {"layers": 3, "layer": 1, "concrete": True}),
    ("one-layer", {"concrete": True, "positional": "qk_only"}), ("two-layer-qk", {"concrete": True})])
def test_every_head_label_is_shifted_together_from_1(name, params):
    """A label printed from 1 is the label printed from 0 with its layer plus one, everywhere: no title,
    left side or prose keeps the 0-based number while the lines beside it shift (L1H0 on the left of
    L2H0's weights)."""
    d = catalogue.get(name, **params)
    from0, from1 = _labels(d, 0), _labels(d, 1)
    assert from1 == [f"L{int(m[1]) + 1}H{m[2]}" for m in map(LABEL.fullmatch, from0)], name


def test_the_indexing_note_is_what_the_labels_test_leaves_out():
    doc = json.loads(catalogue.get("qk-expansion").to_json(index_from=1))
    texts = [n["text"] for n in doc["notes"]]
    assert sum("numbered from 1" in t for t in texts) == 1 and INDEXING


def test_a_second_layer_heads_title_left_side_and_weights_agree_from_1(capsys):
    code, out, err = run_cli(capsys, "derive", "qk-expansion", "--layer", "2", "--index-from", "1", "--concrete")
    assert code == 0, err
    assert out.startswith("The QK expansion of head L2H0\n")
    assert "S^L2H0 / sqrt(d_head) = 1/sqrt(d_head)·Id ⊗ Id ⊗ W_Eᵀ W_QK^{L2H0} W_E" in out
    assert "L1H0" in out and "W_QK^{L1H0}" not in out  # the first layer's heads compose into it; none is read as it


def test_rotary_left_side_names_the_head_whose_weights_it_uses(capsys):
    code, out, _ = run_cli(capsys, "derive", "rotary", "--index-from", "1")
    assert code == 0
    flat = " ".join(out.split())
    assert "S^L2H0 / sqrt(d_head) = 1/sqrt(d_head)·Id ⊗ Id ⊗ W_Eᵀ W_Q^{L2H0}ᵀ R^{L2H0} W_K^{L2H0} W_E" in flat
    assert "S^L1H0" not in flat and "entering layer 2" in flat


@pytest.mark.parametrize("layer, index_from, title", [("2", "1", "L2H0"), ("1", "1", "L1H0"), ("1", "0", "L1H0"),
                                                       ("0", "0", "L0H0")])
def test_layer_is_typed_in_the_numbering_the_output_uses(capsys, layer, index_from, title):
    code, out, err = run_cli(capsys, "derive", "qk-expansion", "--layer", layer, "--index-from", index_from)
    assert code == 0 and out.startswith(f"The QK expansion of head {title}\n"), err


@pytest.mark.parametrize("argv, message", [
    (["--layer", "0", "--index-from", "1"], "layer 0 does not exist: the model has layers 1..2 (numbered from 1"),
    (["--layer", "3", "--index-from", "1"], "layer 3 does not exist: the model has layers 1..2 (numbered from 1"),
    (["--layer", "2"], "layer 2 does not exist: the model has layers 0..1"),
    (["--layer", "4", "--layers", "3", "--index-from", "1"], "the model has layers 1..3"),
    (["--head", "7", "--index-from", "1"], "head 7 does not exist in layer 2: it has heads 0..1"),
    (["--head", "7"], "head 7 does not exist in layer 1: it has heads 0..1"),
    (["--layer", "2", "--heads", "3,2", "--head", "2", "--index-from", "1"], "head 2 does not exist in layer 2"),
    (["--max-order", "9", "--index-from", "1"], "the scores of a head with 1 layer before it"),
])
def test_a_layer_that_is_not_there_is_named_in_the_numbering_typed(capsys, argv, message):
    code, out, err = run_cli(capsys, "derive", "qk-expansion", *argv)
    assert code == 2 and out == "" and message in err and "Traceback" not in err


def test_the_one_layer_qk_circuit_has_the_models_positional_terms():
    """qk_only positions enter the queries and keys of a one-layer model: the QK circuit has a sum for each
    pair of inputs, the position-position one included; without positions it has one."""
    plain = catalogue.get("one-layer", concrete=True)
    positions = catalogue.get("one-layer", concrete=True, positional="qk_only")
    lhs = [c.lhs.text for c in positions.chains if c.lhs is not None and c.lhs.text.startswith("S^")]
    assert lhs == [f"S^L0H0_({q},{k}) / sqrt(d_head)" for q in ("tok", "pos") for k in ("tok", "pos")]
    assert [c.lhs.text for c in plain.chains if c.lhs is not None and c.lhs.text.startswith("S^")] == ["S^L0H0 / sqrt(d_head)"]
    assert "W_posᵀ W_QK^{L0H0} W_pos" in positions.to_text()
    assert positions.verify().ok and dict(positions.params)["positional"] == "qk_only"


@pytest.mark.parametrize("layer_norm, said", [(False, "added to the residual stream as the queries and keys read it"),
                                              (True, "after the layer norm")])
def test_the_note_on_positions_speaks_of_layer_norm_only_where_the_model_has_one(layer_norm, said):
    text = " ".join(catalogue.get("two-layer-qk", positional="qk_only", layer_norm=layer_norm).to_text().split())
    assert said in text and ("layer norm" in text) == layer_norm
