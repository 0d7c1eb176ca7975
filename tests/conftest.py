"""What every test module shares: hypothesis profiles and settings, and markers.

Hypothesis profiles, registered here once and chosen with ``--hypothesis-profile NAME``
(or ``TCIRCUITS_HYPOTHESIS=NAME``):

- ``default`` — every run: no per-example deadline (hostile-input tests bound their own
  time with :class:`tests.helpers.quickly`), the example counts below;
- ``quick`` — a quarter of the examples, for a first look while working;
- ``thorough`` — ten times the examples, before a release or after touching a parser;
- ``ci`` — the default counts, derandomized (the same examples on every run).

Named settings, one per kind of test, imported by the modules that use them
(``from tests.conftest import PROPERTY``); their example counts scale with the profile:

- :data:`HEAVY` — one example builds a large model or converts one (``from_hf``, checkpoints);
- :data:`FAST` — property tests that build and run a torch model per example;
- :data:`PROPERTY` — the algebra's property tests (cheap examples: parse, expand, print);
- :data:`THOROUGH` — cheap properties that need many examples to reach their corners;
- :data:`FUZZ` — hostile input: random text, bytes and flags given to parsers and commands.

Markers (registered in ``pyproject.toml``):

- :func:`needs_pdflatex` — compiles LaTeX (marker ``latex``); skipped where ``pdflatex`` is not installed;
- ``slow`` — training, analyses and adapters; ``pytest -m "not slow"`` leaves them out.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest
from hypothesis import HealthCheck, settings

_BASE = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("default", **_BASE)
settings.register_profile("quick", **_BASE)
settings.register_profile("thorough", **_BASE)
settings.register_profile("ci", derandomize=True, **_BASE)
SCALE = {"default": 1, "quick": 0.25, "thorough": 10, "ci": 1}
"""How each profile scales the example counts of the named settings."""


def _profile() -> str:
    """The profile asked for: ``--hypothesis-profile NAME`` on the command line, else
    ``TCIRCUITS_HYPOTHESIS``, else ``ci`` where the ``CI`` variable is set (a continuous
    integration run: the same examples every time, so a red run is the change's, not the draw's)
    and ``default`` elsewhere (read here, since the named settings below are built when this
    module is imported, before hypothesis' own plugin loads a profile)."""
    asked = os.environ.get("TCIRCUITS_HYPOTHESIS", "ci" if os.environ.get("CI") else "default")
    for i, arg in enumerate(sys.argv):
        if arg == "--hypothesis-profile" and i + 1 < len(sys.argv):
            asked = sys.argv[i + 1]
        elif arg.startswith("--hypothesis-profile="):
            asked = arg.partition("=")[2]
    return asked if asked in SCALE else "default"


PROFILE = _profile()
settings.load_profile(PROFILE)


def _examples(count: int) -> settings:
    return settings(settings.get_profile(PROFILE), max_examples=max(1, round(count * SCALE[PROFILE])))


HEAVY = _examples(10)
"""One example builds a large model or converts one."""

FAST = _examples(20)
"""Property tests that build and run a model for every example."""

PROPERTY = _examples(40)
"""The algebra's property tests: enough examples to find bugs, fast enough for every run."""

THOROUGH = _examples(80)
"""Cheap properties with corners that take many examples to reach."""

FUZZ = _examples(200)
"""Hostile input: random text, bytes and flags."""


def needs_pdflatex(test):
    """Mark a test that compiles LaTeX with a real ``pdflatex``: marker ``latex``, skipped where
    ``pdflatex`` is not installed."""
    skip = pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
    return pytest.mark.latex(skip(test))


def _skip_where_transformer_lens_removed_it(error: Exception) -> None:
    """Skip the test when ``error`` is TransformerLens 4's refusal of a name it removed (``HookedTransformer``), or
    tcircuits' own (``tl_class``: to_transformer_lens, --tl)."""
    if any(words in str(error) for words in ("was removed in TransformerLens 4.0", "the installed TransformerLens 4 has no")):
        pytest.skip("TransformerLens 4 removed HookedTransformer (tests/numeric_check/test_tl4.py)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """A test (or fixture) built on TransformerLens 2-3's ``HookedTransformer`` is skipped under TransformerLens 4,
    which removed it (``.ci/run``'s newest releases); its ``TransformerBridge`` has tests of its own (test_tl4.py)."""
    try:
        return (yield)
    except Exception as error:  # noqa: BLE001 - re-raised unless it is TransformerLens 4's
        _skip_where_transformer_lens_removed_it(error)
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """As :func:`pytest_runtest_setup`, for the test's own body."""
    try:
        return (yield)
    except Exception as error:  # noqa: BLE001 - re-raised unless it is TransformerLens 4's
        _skip_where_transformer_lens_removed_it(error)
        raise


def pytest_runtest_logreport(report):
    """With ``TCIRCUITS_INSTAFAIL=1`` (``make gpu-check``), each failure is printed the moment it happens,
    so a run cut at its time limit still says what failed."""
    if report.failed and os.environ.get("TCIRCUITS_INSTAFAIL"):
        last = str(report.longrepr).strip().splitlines()[-1:] or [""]
        sys.__stdout__.write(f"\nFAILED {report.nodeid} ({report.when}): {last[0][:300]}\n")
        sys.__stdout__.flush()


@pytest.fixture(autouse=True)
def _rehearse_on_cuda():
    """With ``TCIRCUITS_FAKE_CUDA=1`` every test runs as on a GPU machine: ``auto`` is a fake ``cuda:0``
    whose tensors raise torch's own error when they meet the CPU (:mod:`tests.fake_cuda`). A rehearsal
    of ``make gpu-check`` on a CPU: what fails here assumes the default device or mixes devices.
    (Gradients are off inside, so training tests are not rehearsed.)"""
    if not os.environ.get("TCIRCUITS_FAKE_CUDA"):
        yield
        return
    from tests.fake_cuda import fake_cuda

    with fake_cuda():
        yield
