"""What every test module shares: hypothesis settings and markers.

Hypothesis settings, one of each, imported by the modules that use them
(``from tests.conftest import PROPERTY``):

- :data:`PROPERTY` — the algebra's property tests (cheap examples: parse, expand, print);
- :data:`FAST` — property tests that build and run a torch model per example.

Markers (registered in ``pyproject.toml``):

- :func:`needs_pdflatex` — compiles LaTeX (marker ``latex``); skipped where ``pdflatex`` is not installed;
- ``slow`` — training, analyses and adapters; ``pytest -m "not slow"`` leaves them out.
"""

from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, settings

PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""The algebra's property tests: enough examples to find bugs, fast enough for every run."""

FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Property tests that build and run a model for every example."""


def needs_pdflatex(test):
    """Mark a test that compiles LaTeX with a real ``pdflatex``: marker ``latex``, skipped where
    ``pdflatex`` is not installed."""
    skip = pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
    return pytest.mark.latex(skip(test))
