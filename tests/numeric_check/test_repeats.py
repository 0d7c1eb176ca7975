"""Tests for numeric_check.circuits.repeats: induction on arbitrary tokens, with the controls that must fail it."""

from __future__ import annotations

import pytest
import torch

from numeric_check.circuits.repeats import repeat_losses
from numeric_check.errors import AnalysisError
from numeric_check.model.checkpoint import load_checkpoint
from numeric_check.training.toy import shipped_checkpoint


def _shipped(n_layers: int):
    return load_checkpoint(shipped_checkpoint(n_layers), dtype=torch.float64)


def test_the_planted_induction_model_predicts_the_second_copy_and_its_controls_do_not():
    """The detector finds what was planted: the 2-layer model's loss falls by over 3 nats on the second copy of
    uniform random tokens; the 1-layer control (which cannot do induction) by under 1; the 0-layer model (a
    bigram table) not at all, since both copies hold the same pairs of tokens."""
    two, one, zero = (repeat_losses(_shipped(n), batch=32) for n in (2, 1, 0))
    assert two.drop - two.interval >= 3.0, two.describe()
    assert one.drop + one.interval < 1.0, one.describe()
    assert zero.drop == pytest.approx(0.0, abs=1e-12)
    assert two.second < 1.0 < two.first


def test_frequent_tokens_come_from_the_counts_given():
    model = _shipped(2)
    counts = torch.zeros(model.cfg.d_vocab, dtype=torch.long)
    counts[[3, 5, 7]] = torch.tensor([10, 20, 30])
    few = repeat_losses(model, kind="frequent", counts=counts, frequent=3, batch=8, seg_len=6)
    uniform = repeat_losses(model, batch=8, seg_len=6)
    assert (few.kind, few.seg_len, few.batch) == ("frequent", 6, 8)
    assert few.first != uniform.first  # other tokens
    assert "8 sequences of 6 frequent random tokens repeated once" in few.describe()
    # a vocabulary larger than the text (a byte-level BPE's unused bytes): only tokens that occur are drawn
    assert repeat_losses(model, kind="frequent", counts=counts, frequent=50, batch=8, seg_len=6) == few
    counts[[3, 5]] = 0
    with pytest.raises(AnalysisError, match="the text holds 1 of the model's 128 tokens; frequent random tokens need"):
        repeat_losses(model, kind="frequent", counts=counts, batch=8, seg_len=6)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(kind="rare"), "unknown kind of random tokens 'rare'; expected one of 'uniform', 'frequent'"),
    (dict(kind="frequent"), "frequent random tokens need counts of the model's 128 tokens in a text"),
    (dict(seg_len=33), "seg_len must be an int from 2 to half the context (32), got 33"),
    (dict(batch=1), "batch must be an int >= 2 (the interval needs two sequences), got 1"),
])
def test_bad_arguments_are_refused_with_what_was_expected(kwargs, message):
    with pytest.raises(AnalysisError) as info:
        repeat_losses(_shipped(2), **kwargs)
    assert str(info.value) == message
