"""The rules that judge the paper's findings (:mod:`numeric_check.reports.paper.claims`): each a small pure
function of measured numbers with its bar named here, tested on the model and on a control on which it
must fail (``tests/numeric_check/test_paper.py``).
"""

from __future__ import annotations

import math
from typing import Sequence

from numeric_check.circuits.behaviour import ACROSS_CONTEXT
from numeric_check.reports.findings import COPYING, NEAR_ONE

#: "Much smaller": virtual heads' marginal loss below this fraction of the individual heads'.
MUCH_SMALLER = 0.25
#: A repeat is "learned well" below this loss (nats) on its second copy.
WELL = 1.0
#: A set of terms (or a model) "lowers the loss" when it does so by at least this much (nats).
MATTERS = 0.1
#: A zero-layer model "learned bigrams" when its loss is this far below ln d_vocab (nats).
BIGRAM_GAIN = 0.05
#: A model's next-token table "approximates" the data's bigram table when the mean KL divergence from the data's
#: next-token distributions to the model's is below this (nats): its loss within this of the best bigram model's.
BIGRAM_CLOSE = 0.2
#: A head "chooses" its source when it attends to it this many times more than to the average other token.
PICKS = 2.0
#: A K-composition score is "well above" random at this multiple of the random matrices' score.
WELL_ABOVE = 1.5
#: A first-layer head is a control for the previous-token head (not one, even in part) when its attention to
#: i − 1 stays below this: half the classification bar. A head between the two is partly a previous-token head
#: (it may K-compose with the induction heads too) and is shown, neither claimed nor used as a control.
NOT_PREVIOUS = ACROSS_CONTEXT / 2


def learned_bigrams(loss: float, nothing: float) -> bool:
    """The zero-layer model learned bigram statistics: its loss is at least :data:`BIGRAM_GAIN`
    below ``nothing``, the loss of a model that learned nothing (``ln d_vocab``).

    >>> learned_bigrams(3.0, math.log(128)), learned_bigrams(math.log(128), math.log(128))
    (True, False)
    """
    return loss <= nothing - BIGRAM_GAIN


def approximates(kl: float) -> bool:
    """A next-token table lies within :data:`BIGRAM_CLOSE` nats (mean KL divergence) of the data's bigram table.

    >>> approximates(0.1), approximates(2.3), approximates(math.nan)
    (True, False, False)
    """
    return kl < BIGRAM_CLOSE


def most_copy(positivity: Sequence[float]) -> bool:
    """More than half of the heads have OV positivity at least :data:`~numeric_check.reports.findings.COPYING`.

    >>> most_copy([0.9, 0.8, 0.1]), most_copy([0.3, 0.1, -0.2, 0.6])
    (True, False)
    """
    return sum(v >= COPYING for v in positivity) * 2 > len(positivity)


def lowers(loss: float, baseline: float) -> bool:
    """``loss`` is at least :data:`MATTERS` nats below ``baseline``."""
    return loss <= baseline - MATTERS


def picks_source(ratios: Sequence[float]) -> bool:
    """Every attention ratio (on the source over the average other token) is at least :data:`PICKS`."""
    return len(ratios) > 0 and min(ratios) >= PICKS


def raises_out(rises: Sequence[float], random_rises: Sequence[float]) -> bool:
    """Every rise of the out's logit is at least :data:`MATTERS` and more than twice the mean
    absolute rise of outputs drawn at random."""
    noise = sum(abs(r) for r in random_rises) / max(len(random_rises), 1)
    return len(rises) > 0 and min(rises) >= MATTERS and min(rises) > 2 * noise


def combine(own: float, swapped: float, noise: float) -> bool:
    """A bug: the swapped pair rises at least half as much as the learned one, and above twice the noise."""
    return own > 0 and swapped >= 0.5 * own and swapped > 2 * noise


def attends_everywhere(floor: float) -> bool:
    """The best head's lowest attention over the judged positions reaches :data:`~numeric_check.circuits.behaviour.ACROSS_CONTEXT`."""
    return not math.isnan(floor) and floor >= ACROSS_CONTEXT


def well_above(scores: Sequence[float], baseline: float) -> bool:
    """Every score is at least :data:`WELL_ABOVE` times the random matrices' score."""
    return len(scores) > 0 and min(scores) >= WELL_ABOVE * baseline


def singled_out(erratum: Sequence[float], erratum_median: float, corrected: Sequence[float],
                corrected_median: float) -> bool:
    """The paper's first (mistaken) composition measure singles these pairs out, as its Correction explains:
    each pair's erratum score is at least :data:`WELL_ABOVE` times the median pair's, and further above it
    than the pair's corrected score is above the corrected median.

    >>> singled_out([0.57], 0.18, [0.13], 0.074), singled_out([0.2], 0.18, [0.13], 0.074)
    (True, False)
    """
    return len(erratum) > 0 and len(erratum) == len(corrected) and all(
        e >= WELL_ABOVE * erratum_median and e / erratum_median > c / corrected_median
        for e, c in zip(erratum, corrected))


def not_above(scores: Sequence[float], baseline: float) -> bool:
    """No score exceeds the random matrices' score."""
    return len(scores) > 0 and max(scores) <= baseline


def near_one(positivity: Sequence[float]) -> bool:
    """Every positivity is at least :data:`~numeric_check.reports.findings.NEAR_ONE`."""
    return len(positivity) > 0 and min(positivity) >= NEAR_ONE


def below(values: Sequence[float], bar: float) -> bool:
    """Every value is below ``bar``."""
    return len(values) > 0 and max(values) < bar


def much_smaller(virtual: float, heads: float) -> bool:
    """The individual heads lower the loss (by :data:`MATTERS` at least) and the virtual heads'
    marginal loss is below :data:`MUCH_SMALLER` of theirs."""
    return heads <= -MATTERS and abs(virtual) < MUCH_SMALLER * abs(heads)


def carry_most(orders: Sequence[float]) -> bool:
    """The first-order terms lower the loss (by :data:`MATTERS` at least) more than any other order."""
    others = [abs(o) for i, o in enumerate(orders) if i != 1]
    return len(orders) > 1 and orders[1] <= -MATTERS and all(abs(orders[1]) > o for o in others)
