"""The follow-up paper's claims about the phase change (Olsson et al., 2022), each a rule that can fail,
judged on a two-layer run's :class:`~numeric_check.training.dynamics.Dynamics` and on a control: a
one-layer run trained alike (same text, tokenizer, width, batches), which cannot form induction heads.

1. **Induction heads form in a window**: the best last-layer prefix-matching score rises by at least
   :data:`RISE` between two snapshots, from under a fifth of its rise to over four fifths (the window).
2. **The in-context learning score improves in that window and little after**: at least half of its
   whole improvement falls inside the window, at most a quarter after it, and the whole improvement is
   at least :data:`ICL_GAIN` nats.
3. **A bump in the loss**: at the window's end the held-out loss lies at least :data:`BUMP` nats below
   the line through the last snapshots before the window (loss against log step), so the loss falls
   faster there than it fell before.
4. **Ablating the induction heads removes most of the in-context learning**: with the heads whose prefix
   matching exceeds :data:`INDUCTION` replaced by their mean output (over positions and windows), the
   final model's score keeps at most half of its value; ablating as many other heads of the same layer
   keeps more than half (the ablation's own control).

The control's window is the two-layer run's (the same steps), so each rule asks the same of both.

>>> window_of([0.0, 0.02, 0.1, 0.5, 0.9, 0.95])
(2, 4)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: The rise of the best prefix-matching score that counts as induction heads forming.
RISE = 0.3
#: The whole in-context learning gain (nats) below which there is none to place in a window.
ICL_GAIN = 0.1
#: How far below the earlier trend the loss must lie at the window's end (nats).
BUMP = 0.02
#: Prefix matching above which a head counts as an induction head for the ablation.
INDUCTION = 0.3


@dataclass(frozen=True)
class Claim:
    """One claim judged on the model and on its control: each a verdict and the figures behind it."""

    name: str
    rule: str
    holds: bool
    detail: str
    control_holds: bool | None
    control_detail: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def window_of(values) -> tuple[int, int] | None:
    """Indices ``(a, b)`` of the snapshots that bound the rise of ``values``: the last below a fifth of the
    way from the first value to the largest, and the first after it above four fifths; None without a rise."""
    values = [v for v in values]
    if not values or any(math.isnan(v) for v in values):
        return None
    low, high = values[0], max(values)
    if high - low <= 0:
        return None
    top = values.index(high)
    fifth, four_fifths = low + 0.2 * (high - low), low + 0.8 * (high - low)
    a = max((i for i in range(top + 1) if values[i] < fifth), default=0)
    b = next((i for i in range(a, top + 1) if values[i] > four_fifths), top)
    return a, b


def phase_window(run) -> tuple[int, int] | None:
    """The window of ``run``'s phase change: :func:`window_of` its best last-layer prefix-matching score, where
    that rises by :data:`RISE` at least (None where no induction head forms, or the model has no layer)."""
    if not run.n_layers:
        return None
    prefix = run.best("prefix_matching", run.n_layers - 1)
    window = window_of(prefix)
    return window if window is not None and prefix[window[1]] - prefix[window[0]] >= RISE else None


def judge(run, control=None, *, ablation: tuple[float, float, float] | None = None) -> list[Claim]:
    """The four claims on ``run`` (a two-layer :class:`Dynamics`), each beside the same rule on ``control``
    (None: not judged), in ``run``'s window (:func:`phase_window`). ``ablation`` is :func:`ablated_icl`'s result
    for the run's final model; its control is as many other heads of the layer ablated."""
    window = phase_window(run)
    claims = [_forms(run, run.best("prefix_matching", run.n_layers - 1), window_of(run.best("prefix_matching", run.n_layers - 1)), control),
              _icl(run, window, control), _bump(run, window, control)]
    if ablation is not None:
        claims.append(_ablation(ablation))
    return claims


def _steps(run, window) -> str:
    return "no window" if window is None else f"steps {run.steps[window[0]]:,}–{run.steps[window[1]]:,}"


def _forms(run, prefix, window, control) -> Claim:
    def verdict(values) -> tuple[bool, str]:
        if window is None or len(values) != len(run.steps):
            return False, f"best prefix matching {values[0]:.2f} → {values[-1]:.2f}: " + (
                "no rise" if window is None else "snapshots at other steps")
        a, b = window
        rise = values[b] - values[a]
        return rise >= RISE, f"best prefix matching {values[a]:.2f} → {values[b]:.2f} over {_steps(run, window)} (rise {rise:+.2f})"

    holds, detail = verdict(prefix)
    c_holds, c_detail = (None, "no control") if control is None else verdict(control.best("prefix_matching", control.n_layers - 1)
                                                                             if control.n_layers else [0.0] * len(control.steps))
    return Claim("induction heads form in a window", f"the best last-layer prefix-matching score rises by ≥ {RISE} "
                 "within the window (a fifth to four fifths of its rise)", holds, detail, c_holds, c_detail)


def _icl_shares(values, window) -> tuple[float, float, float]:
    """The whole gain (first minus last score, positive when the score falls), and the shares in and after the window."""
    total = values[0] - values[-1]
    a, b = window
    inside = values[a] - values[b]
    after = values[b] - values[-1]
    return total, (inside / total if total else math.nan), (after / total if total else math.nan)


def _icl(run, window, control) -> Claim:
    def verdict(d) -> tuple[bool, str]:
        values = [s.icl_score for s in d.snapshots]
        if window is None or len(values) != len(run.steps):
            return False, f"score {values[0]:+.2f} → {values[-1]:+.2f}; " + ("no window" if window is None else "other steps")
        total, inside, after = _icl_shares(values, window)
        holds = total >= ICL_GAIN and inside >= 0.5 and after <= 0.25
        return holds, (f"score {values[0]:+.2f} → {values[-1]:+.2f} nats (gain {total:.2f}); {inside:.0%} of it over "
                       f"{_steps(run, window)}, {after:.0%} after")

    holds, detail = verdict(run)
    c_holds, c_detail = (None, "no control") if control is None else verdict(control)
    return Claim("the in-context learning score improves in the window and little after",
                 f"a gain of ≥ {ICL_GAIN} nats, ≥ 50 % of it in the window, ≤ 25 % after", holds, detail, c_holds, c_detail)


def _bump(run, window, control) -> Claim:
    def verdict(d) -> tuple[bool, str]:
        if window is None or window[0] < 2:
            return False, "no window with two snapshots before it"
        a, b = window
        xs = [math.log(s) for s in d.steps]
        ys = [s.heldout_loss for s in d.snapshots]
        first = max(0, a - 3)
        n = a - first + 1
        mx, my = sum(xs[first:a + 1]) / n, sum(ys[first:a + 1]) / n
        slope = sum((x - mx) * (y - my) for x, y in zip(xs[first:a + 1], ys[first:a + 1])) / \
            sum((x - mx) ** 2 for x in xs[first:a + 1])
        expected = my + slope * (xs[b] - mx)
        below = expected - ys[b]
        return below >= BUMP, (f"held-out loss {ys[b]:.3f} at step {d.steps[b]:,}, {below:+.3f} nats below the trend of "
                               f"steps {d.steps[first]:,}–{d.steps[a]:,} ({expected:.3f})")

    holds, detail = verdict(run)
    c_holds, c_detail = (None, "no control") if control is None else verdict(control)
    return Claim("a bump in the loss", f"at the window's end the loss lies ≥ {BUMP} nats below the trend before it "
                 "(loss against log step, the last four snapshots before)", holds, detail, c_holds, c_detail)


def _ablation(ablation) -> Claim:
    a = ablation if isinstance(ablation, Ablation) else Ablation(*ablation)
    learns = a.intact_interval[1] <= -ICL_GAIN if a.intervals else a.intact <= -ICL_GAIN

    def kept_at_most_half(kept, interval) -> bool:  # the interval's upper end, where there is one
        return learns and (interval[1] if a.intervals else kept) <= 0.5

    detail = (f"score {a.intact:+.3f}{a.span(a.intact_interval, '+.3f')} intact, {a.ablated:+.3f} with the induction "
              f"heads at their mean ({a.kept:.0%}{a.span(a.kept_interval, '.0%')} kept)")
    c_detail = (f"{a.other:+.3f} with as many other heads of the layer at their mean instead "
                f"({a.other_kept:.0%}{a.span(a.other_interval, '.0%')} kept)")
    rule = f"a score ≤ −{ICL_GAIN} nats intact that keeps ≤ 50 % of its value with them mean-ablated"
    if a.intervals:
        rule += " (each bound of a 95 % interval over the windows)"
    return Claim("ablating the induction heads removes most of the in-context learning", rule,
                 kept_at_most_half(a.kept, a.kept_interval), detail, kept_at_most_half(a.other_kept, a.other_interval),
                 c_detail)


#: Bootstrap resamples of the windows for :class:`Ablation`'s intervals, and the seed that draws them.
RESAMPLES, RESAMPLE_SEED = 2000, 0


@dataclass(frozen=True)
class Ablation:
    """In-context learning scores (nats) intact, with the induction heads at their mean output, and with as many
    other heads at theirs; with 95 % intervals (bootstrap over the windows, paired) of the intact score and of the
    share of it each ablation keeps, where the windows were kept (``intervals``). The held-out windows overlap
    where the text is short: the intervals then understate the uncertainty, never overstate it.
    Unpacks as ``intact, ablated, other``."""

    intact: float
    ablated: float
    other: float
    intact_interval: tuple[float, float] = (math.nan, math.nan)
    kept_interval: tuple[float, float] = (math.nan, math.nan)
    other_interval: tuple[float, float] = (math.nan, math.nan)

    def __iter__(self):
        return iter((self.intact, self.ablated, self.other))

    def __getitem__(self, index: int) -> float:
        return (self.intact, self.ablated, self.other)[index]

    @property
    def intervals(self) -> bool:
        return not math.isnan(self.intact_interval[0])

    @property
    def kept(self) -> float:
        return self.ablated / self.intact if self.intact else math.nan

    @property
    def other_kept(self) -> float:
        return self.other / self.intact if self.intact else math.nan

    def span(self, interval, spec: str) -> str:
        """`` [a, b]`` in ``spec``, or nothing where there are no intervals."""
        return f" [{interval[0]:{spec}}, {interval[1]:{spec}}]" if self.intervals else ""

    @classmethod
    def from_windows(cls, intact: torch.Tensor, ablated: torch.Tensor, other: torch.Tensor) -> "Ablation":
        """The scores' means over windows (``[count]`` each, the same windows) and their bootstrap intervals."""
        count = intact.shape[0]
        draws = torch.randint(0, count, (RESAMPLES, count), generator=torch.Generator().manual_seed(RESAMPLE_SEED))
        i, a, o = (t.double().cpu()[draws].mean(1) for t in (intact, ablated, other))  # [RESAMPLES] each

        def bounds(x: torch.Tensor) -> tuple[float, float]:
            q = torch.quantile(x[~x.isnan()], torch.tensor([0.025, 0.975], dtype=torch.float64))
            return float(q[0]), float(q[1])

        return cls(float(intact.double().mean()), float(ablated.double().mean()), float(other.double().mean()),
                   bounds(i), bounds(a / i), bounds(o / i))


def ablation_heads(run) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The heads :func:`ablated_icl` ablates for ``run``'s final model, and its control: the last layer's heads whose
    prefix matching at the last snapshot exceeds :data:`INDUCTION` (else the run's induction head alone), and as
    many of the layer's lowest instead (both empty where the run has no induction head)."""
    if run.induction_head is None:
        return [], []
    layer = run.n_layers - 1
    last = run.snapshots[-1].prefix_matching[layer]
    order = sorted(range(len(last)), key=lambda h: -last[h] if not math.isnan(last[h]) else math.inf)
    heads = [(layer, h) for h in order if last[h] > INDUCTION] or [run.induction_head]
    return heads, [(layer, h) for h in reversed(order) if (layer, h) not in heads][:len(heads)]


@torch.no_grad()
def ablated_icl(model, windows: torch.Tensor, heads: list[tuple[int, int]], others: list[tuple[int, int]]) -> Ablation:
    """The in-context learning score of ``model`` on the held-out ``windows`` intact, with ``heads`` replaced
    by their mean output over positions and windows, and with ``others`` replaced alike, window by window
    (:class:`Ablation`: the means and their intervals)."""
    from numeric_check.model.hooks import block_hook
    from numeric_check.training.dynamics import icl_positions
    from numeric_check.training.history import window_losses

    n_ctx = windows.shape[1] - 1
    (a, b), (c, d) = icl_positions(n_ctx)

    def icl(losses: torch.Tensor) -> torch.Tensor:  # [count, n_ctx] -> [count]
        return losses[:, c:d].mean(1) - losses[:, a:b].mean(1)

    def score(ablate) -> torch.Tensor:
        if not ablate:
            return icl(window_losses(model, windows))
        means = {}
        layers = sorted({layer for layer, _ in ablate})

        def record(z, hook):  # [batch, pos, head, d_head]
            layer = int(hook.name.split(".")[1])
            means[layer] = means.get(layer, 0) + z.sum((0, 1))
            return z

        with model.hooks([(block_hook(layer, "attn.hook_z"), record) for layer in layers]):
            window_losses(model, windows)
        count = windows.shape[0] * n_ctx

        def replace(z, hook):
            layer = int(hook.name.split(".")[1])
            z = z.clone()
            for l, h in ablate:
                if l == layer:
                    z[:, :, h] = means[layer][h] / count
            return z

        with model.hooks([(block_hook(layer, "attn.hook_z"), replace) for layer in layers]):
            return icl(window_losses(model, windows))

    return Ablation.from_windows(score([]), score(heads), score(others))
