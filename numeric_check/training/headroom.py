"""What an induction head could still give a model on its held-out text: the *induction headroom*.

An induction head predicts, at each token, the token that followed that token's last earlier occurrence in
the context (the follow-up paper's token-level induction). Given a model's loss at every held-out position,
the headroom is the most the held-out loss falls when that guess is mixed into the model's prediction,
``(1 - λ) p + λ [guess]``, with one weight ``λ`` fitted to the windows (nats a token; positions without an
earlier occurrence keep ``p``). It is what a head that copies perfectly, trusted as much as it deserves on
average, would add to the model as it is: where it is small the gradient has little reason to build one.
A head that trusts its guess more where it is likelier right could gain more; this is the constant-trust
figure, a floor on what the guess is worth to the model, not a ceiling.

>>> w = torch.tensor([[5, 7, 5, 7, 5]])
>>> induction_guesses(w).tolist()   # position p guesses token p + 1
[[-1, -1, 7, 5]]
>>> h = induction_headroom(torch.full((1, 4), math.log(4)), w)   # a model that gives every token 1/4
>>> round(h.right, 2), round(h.weight, 3), round(h.gain, 3)   # both guesses right: trust them fully
(0.5, 1.0, 0.693)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

#: Bisection steps for the weight (its derivative changes sign once: the gain is concave in it).
_STEPS = 60


@dataclass(frozen=True)
class Headroom:
    """The induction headroom of a model on some windows (see the module docstring)."""

    gain: float  #: nats a token the fitted mixture takes off the mean loss (0 where no guess is right)
    weight: float  #: the fitted trust λ in the guess
    guessed: float  #: share of positions whose token occurred earlier in the window
    right: float  #: share of positions whose guess is the next token
    loss_right: float  #: the model's mean loss where the guess is right (NaN where none is)


def induction_guesses(windows: Tensor) -> Tensor:
    """``[count, n_ctx]`` long: at position ``p`` of each window (``[count, n_ctx + 1]`` token ids), the token that
    followed the last earlier occurrence of the token at ``p``, or -1 where it has none."""
    tokens = windows[:, :-1].long()
    count, n = tokens.shape
    positions = torch.arange(n, device=tokens.device).expand(count, n)
    order = torch.argsort(tokens * n + positions, dim=1)  # by token, then position: each occurrence after the last
    ranked = tokens.gather(1, order)
    same = torch.zeros_like(ranked, dtype=torch.bool)
    same[:, 1:] = ranked[:, 1:] == ranked[:, :-1]
    earlier = torch.full_like(order, -1)
    earlier[:, 1:] = torch.where(same[:, 1:], order[:, :-1], -1)
    last = torch.empty_like(order).scatter_(1, order, earlier)  # [count, n]: the last earlier position, or -1
    follows = windows.long().gather(1, (last + 1).clamp(min=0))
    return torch.where(last >= 0, follows, -1)


def induction_headroom(window_loss: Tensor, windows: Tensor, guesses: Tensor | None = None) -> Headroom:
    """The headroom of a model whose next-token loss at each position of ``windows`` is ``window_loss``
    (``[count, n_ctx]`` nats, as :func:`~numeric_check.training.history.window_losses` gives); ``guesses``:
    :func:`induction_guesses` of ``windows``, when already made."""
    guesses = induction_guesses(windows) if guesses is None else guesses
    loss = window_loss.double().cpu()
    guesses = guesses.cpu()
    if loss.shape != guesses.shape:
        raise ValueError(f"losses of shape {tuple(loss.shape)} for windows of {tuple(guesses.shape)} positions")
    right = guesses == windows[:, 1:].long().cpu()
    n_wrong = int(((guesses >= 0) & ~right).sum())
    p = torch.exp(-loss[right])  # the model's probability of the guessed token where the guess is right
    total = loss.numel()
    guessed, share = float((guesses >= 0).double().mean()), float(right.double().mean())
    loss_right = float(loss[right].mean()) if p.numel() else math.nan

    def slope(lam: float) -> float:  # d/dλ of the summed gain: decreasing in λ
        return float(((1 / p - 1) / (1 - lam + lam / p)).sum()) - n_wrong / (1 - lam)

    def gain(lam: float) -> float:
        return (float(torch.log1p(lam * (1 / p - 1)).sum()) + (n_wrong * math.log1p(-lam) if n_wrong else 0.0)) / total

    if not p.numel() or slope(0.0) <= 0:
        return Headroom(0.0, 0.0, guessed, share, loss_right)
    if n_wrong == 0:
        return Headroom(gain(1.0), 1.0, guessed, share, loss_right)
    low, high = 0.0, 1.0
    for _ in range(_STEPS):
        mid = (low + high) / 2
        low, high = (mid, high) if slope(mid) > 0 else (low, mid)
    return Headroom(gain(low), low, guessed, share, loss_right)
