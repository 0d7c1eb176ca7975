"""Skip-trigram tables: top-k against the dense circuits, labels, Markdown, bad input."""

from __future__ import annotations

import pytest
import torch

from derivations.architecture import Architecture
from derivations.errors import ArchitectureError
from numeric_check.circuits.ov_qk import head_weights
from numeric_check.errors import AnalysisError
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.circuits.skip_trigrams import SkipTrigramTable, skip_trigram_table

torch.set_num_threads(1)

VOCAB = [f"tok{i}" for i in range(30)]


@pytest.fixture(scope="module")
def model():
    return CircuitModel.random(Architecture(2, 3, positional="qk_only"), d_model=16, d_head=4, d_vocab=30, n_ctx=8, seed=4, dtype=torch.float64, device="cpu")


def test_top_tokens_are_the_dense_columns(model):
    W_E, W_U = model.W_E.detach(), model.W_U.detach()
    for layer, head in [(0, 0), (1, 2)]:
        w = head_weights(model, layer, head)
        qk = W_E.T @ w["W_Q"].T @ w["W_K"] @ W_E / model.cfg.scale  # [query, key]
        ov = W_U @ w["W_O"] @ w["W_V"] @ W_E  # [out, source]
        for source in (0, 7, 29):
            table = skip_trigram_table(model, layer, head, source, k=4)
            assert isinstance(table, SkipTrigramTable) and table.source_token == source
            top_qk, top_ov = torch.topk(qk[:, source], 4), torch.topk(ov[:, source], 4)
            assert [d.token for d in table.destinations] == top_qk.indices.tolist()
            assert [o.token for o in table.outputs] == top_ov.indices.tolist()
            torch.testing.assert_close(torch.tensor([d.score for d in table.destinations], dtype=torch.float64), top_qk.values)
            torch.testing.assert_close(torch.tensor([o.score for o in table.outputs], dtype=torch.float64), top_ov.values)


def test_vocabulary_labels_and_markdown(model):
    table = skip_trigram_table(model, 1, 0, "tok7", k=3, vocab=VOCAB)
    assert table.source_token == 7 and table.source_text == "tok7"
    assert all(d.text == VOCAB[d.token] for d in table.destinations + table.outputs)
    md = table.to_markdown()
    lines = md.splitlines()
    assert lines[0] == '**L1H0**, source token "tok7" (7)'
    assert lines[2] == "| rank | destination (QK) | score | out (OV) | logit |"
    assert len(lines) == 4 + 3
    assert lines[4].startswith(f'| 1 | "{table.destinations[0].text}" ({table.destinations[0].token}) | ')
    assert table.trigrams()[0] == ('"tok7" (7)', table.destinations[0].label(), table.outputs[0].label())


def test_markdown_escapes_awkward_token_text(model):
    vocab = list(VOCAB)
    vocab[3] = "a|b\n"
    md = skip_trigram_table(model, 0, 1, 3, k=2, vocab=vocab).to_markdown()
    assert md.splitlines()[0] == '**L0H1**, source token "a\\|b\\\\n" (3)'  # JSON's \\n, its backslash escaped


def test_bad_input_is_a_clear_error(model):
    with pytest.raises(AnalysisError, match="vocab has 29 entries but the model's d_vocab is 30"):
        skip_trigram_table(model, 0, 0, 1, vocab=VOCAB[:-1])
    with pytest.raises(AnalysisError, match="vocab must be a list"):
        skip_trigram_table(model, 0, 0, 1, vocab="abc")
    with pytest.raises(AnalysisError, match="entry 2 is 5"):
        skip_trigram_table(model, 0, 0, 1, vocab=VOCAB[:2] + [5] + VOCAB[3:])
    with pytest.raises(AnalysisError, match=r"source token 30 is not a token id in \[0, 30\)"):
        skip_trigram_table(model, 0, 0, 30)
    with pytest.raises(AnalysisError, match="no vocab was given"):
        skip_trigram_table(model, 0, 0, "tok1")
    with pytest.raises(AnalysisError, match="'nope' is not in the vocabulary"):
        skip_trigram_table(model, 0, 0, "nope", vocab=VOCAB)
    with pytest.raises(AnalysisError, match=r"k must be an int in 1..30"):
        skip_trigram_table(model, 0, 0, 1, k=0)
    with pytest.raises(ArchitectureError, match="head 3 does not exist in layer 0"):
        skip_trigram_table(model, 0, 3, 1)
