"""The induction headroom: the guesses an induction head would make, and what mixing them in would gain."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from numeric_check.training.headroom import induction_guesses, induction_headroom
from tests.strategies import PROPERTY


def _guesses_by_hand(window: list[int]) -> list[int]:
    last, out = {}, []
    for p, token in enumerate(window[:-1]):
        out.append(window[last[token] + 1] if token in last else -1)
        last[token] = p
    return out


@PROPERTY
@given(st.lists(st.lists(st.integers(0, 5), min_size=9, max_size=9), min_size=1, max_size=4))
def test_each_guess_is_the_token_after_the_last_earlier_occurrence(rows):
    windows = torch.tensor(rows)
    assert induction_guesses(windows).tolist() == [_guesses_by_hand(r) for r in rows]


def _gain_on_a_grid(loss: torch.Tensor, windows: torch.Tensor) -> float:
    """The same gain by brute force: every weight of a fine grid, the mixture's loss against the model's."""
    guesses = induction_guesses(windows)
    right = (guesses == windows[:, 1:]).numpy()
    guessed = (guesses >= 0).numpy()
    p = np.exp(-loss.numpy())
    best = 0.0
    for lam in np.linspace(0, 1, 20001)[:-1]:
        mixed = np.where(guessed, (1 - lam) * p + lam * right, p)
        best = max(best, float(np.mean(np.log(mixed) - np.log(p))))
    return best


@pytest.mark.parametrize("seed", range(5))
def test_the_gain_is_the_best_mixtures_found_by_a_grid(seed):
    g = torch.Generator().manual_seed(seed)
    windows = torch.randint(0, 6, (4, 33), generator=g)
    loss = torch.rand(4, 32, generator=g, dtype=torch.float64) * 3
    found = induction_headroom(loss, windows)
    assert found.gain >= 0 and found.gain == pytest.approx(_gain_on_a_grid(loss, windows), abs=1e-6)
    right = induction_guesses(windows) == windows[:, 1:]
    assert found.right == pytest.approx(float(right.double().mean()))
    assert found.loss_right == pytest.approx(float(loss[right].mean()))


def test_a_model_that_already_predicts_every_right_guess_has_no_headroom():
    windows = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2, 9]])
    loss = torch.full((1, 8), 2.0, dtype=torch.float64)
    right = induction_guesses(windows) == windows[:, 1:]
    assert induction_headroom(loss.masked_fill(right, 0.0), windows).gain == 0.0
    # the same model, not yet knowing the repeats: the guesses are right at 4 of 5, worth most of their 2 nats
    room = induction_headroom(loss, windows)
    assert room.right == 4 / 8 and room.guessed == 5 / 8 and 0.5 < room.weight < 1 and room.gain > 0.5


def test_no_earlier_occurrence_no_guess_and_no_headroom():
    windows = torch.arange(10)[None]
    room = induction_headroom(torch.ones(1, 9, dtype=torch.float64), windows)
    assert (room.gain, room.weight, room.guessed, room.right) == (0.0, 0.0, 0.0, 0.0) and math.isnan(room.loss_right)


def test_losses_of_another_shape_are_refused():
    with pytest.raises(ValueError, match=r"losses of shape \(1, 3\) for windows of \(1, 4\) positions"):
        induction_headroom(torch.ones(1, 3), torch.zeros(1, 5, dtype=torch.long))
