"""The command line's progress bar: tqdm on stderr, for the commands that count steps.

>>> with StepBar(2, quiet=True) as bar:
...     bar.tick("first")
...     bar.tick("second")
"""

from __future__ import annotations

import sys


class StepBar:
    """A tqdm bar of ``total`` steps on stderr, or nothing with ``quiet``; a context manager.

    :meth:`tick` advances it by one step, with an optional description (what the step did) and
    figures to show beside it (``loss=…``).
    """

    def __init__(self, total: int, quiet: bool):
        self.total, self.quiet, self.bar = total, quiet, None

    def __enter__(self) -> "StepBar":
        if not self.quiet:
            from tqdm import tqdm  # imported here: building the parser stays fast

            self.bar = tqdm(total=self.total, file=sys.stderr, unit="step", dynamic_ncols=True)
        return self

    def tick(self, description: str | None = None, **figures: str) -> None:
        if self.bar is None:
            return
        if description is not None:
            self.bar.set_description_str(description[:40])
        if figures:
            self.bar.set_postfix(figures, refresh=False)
        self.bar.update(1)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
