"""The batch every training run draws: tokens, where their repeats lie, and which tokens induction predicts.

Apart from :mod:`numeric_check.training.toy` (planted data) and :mod:`numeric_check.training.text` (real text),
which both draw it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class RepeatBatch(NamedTuple):
    """A batch of sequences with repeated segments.

    ``tokens`` ``[batch, n_ctx]``; ``copies`` ``[batch, max_repeats, 3]`` one row per
    repeat, ``(source start, copy start, length)``, in order of the copy start, rows of
    ``-1`` where no further repeat fitted; ``repeat_mask`` ``[batch, n_ctx]`` is True on the
    tokens an induction head can predict: every copy without its first token.
    """

    tokens: torch.Tensor
    copies: torch.Tensor
    repeat_mask: torch.Tensor
