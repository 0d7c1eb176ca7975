"""Induction on arbitrary tokens: the loss on a sequence of random tokens repeated once, copy by copy.

A model that has only learnt its text's n-grams predicts the second copy of random tokens no better than
the first; an induction head predicts it from the first, whatever the tokens are. :func:`repeat_losses`
measures both copies' mean next-token loss on sequences of tokens drawn uniformly from the vocabulary
(``kind="uniform"``), or from the ``frequent`` most frequent tokens of a text (``kind="frequent"``: tokens
the model has seen often, so an n-gram model is not at a loss on them), with a 95 % interval of the drop
over the sequences (a normal interval of their mean: the sequences are independent draws).

>>> from derivations import Architecture
>>> from numeric_check.model.circuit_model import CircuitModel
>>> model = CircuitModel.random(Architecture(2, 2), d_model=8, d_head=4, d_vocab=20, n_ctx=16)
>>> r = repeat_losses(model, batch=8)
>>> r.kind, r.seg_len, round(r.first - r.second, 9) == round(r.drop, 9)
('uniform', 8, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from numeric_check.errors import AnalysisError

#: The kinds of random tokens :func:`repeat_losses` draws, and how many of a text's most frequent tokens "frequent" are.
KINDS, FREQUENT = ("uniform", "frequent"), 400


@dataclass(frozen=True)
class RepeatLoss:
    """Mean next-token losses (nats) on the first and the second copy of ``batch`` random sequences of
    ``seg_len`` tokens, and the half-width of a 95 % interval of the drop (first minus second)."""

    kind: str
    seg_len: int
    batch: int
    first: float
    second: float
    drop: float
    interval: float

    def describe(self) -> str:
        """One line: the tokens, both copies' losses and the drop with its interval."""
        return (f"{self.batch} sequences of {self.seg_len} {self.kind} random tokens repeated once: "
                f"{self.first:.2f} nats on the first copy, {self.second:.2f} on the second "
                f"(a drop of {self.drop:.2f} ± {self.interval:.2f})")


@torch.no_grad()
def repeat_losses(model, *, kind: str = "uniform", seg_len: int | None = None, batch: int = 64, seed: int = 0,
                  counts: torch.Tensor | None = None, frequent: int = FREQUENT) -> RepeatLoss:
    """:class:`RepeatLoss` of ``model`` on ``batch`` sequences of ``seg_len`` random tokens (default: half the
    context, at most 256) followed by the same tokens again. ``kind="frequent"`` draws them from the ``frequent``
    most frequent tokens by ``counts`` (``[d_vocab]``, how often each occurs in a text) that occur at all. The first copy's loss
    leaves out its first token (nothing precedes it); the second's covers every token of the copy but the
    first, which the first copy's last token cannot predict either."""
    if kind not in KINDS:
        raise AnalysisError(f"unknown kind of random tokens {kind!r}; expected one of " + ", ".join(map(repr, KINDS)))
    n_ctx, d_vocab = model.cfg.n_ctx, model.cfg.d_vocab
    seg_len = min(n_ctx // 2, 256) if seg_len is None else seg_len
    if isinstance(seg_len, bool) or not isinstance(seg_len, int) or not 2 <= seg_len <= n_ctx // 2:
        raise AnalysisError(f"seg_len must be an int from 2 to half the context ({n_ctx // 2}), got {seg_len!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 2:
        raise AnalysisError(f"batch must be an int >= 2 (the interval needs two sequences), got {batch!r}")
    generator = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        first = torch.randint(0, d_vocab, (batch, seg_len), generator=generator)
    else:
        if counts is None or counts.shape != (d_vocab,):
            raise AnalysisError(f"frequent random tokens need counts of the model's {d_vocab:,} tokens in a text")
        top = counts.cpu().topk(min(frequent, d_vocab))
        pool = top.indices[top.values > 0]  # a small vocabulary's bytes the text never holds are not "frequent"
        if len(pool) < 2:
            raise AnalysisError(f"the text holds {len(pool)} of the model's {d_vocab:,} tokens; frequent random tokens "
                                "need at least 2 that occur")
        first = pool[torch.randint(0, len(pool), (batch, seg_len), generator=generator)]
    tokens = torch.cat([first, first], dim=1).to(model.device)
    logits = model(tokens)  # [batch, 2 · seg_len, d_vocab]
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).double(), tokens[:, 1:].flatten(), reduction="none")
    loss = loss.view(batch, -1).cpu()  # position p predicts token p + 1
    first_copy, second_copy = loss[:, :seg_len - 1].mean(1), loss[:, seg_len:].mean(1)
    drops = first_copy - second_copy
    interval = 1.96 * float(drops.std()) / math.sqrt(batch)
    return RepeatLoss(kind, seg_len, batch, float(first_copy.mean()), float(second_copy.mean()), float(drops.mean()),
                      interval)
