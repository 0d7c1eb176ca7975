"""Hypothesis strategies for verification tests: the public ones, plus small helpers.

The strategies themselves live in :mod:`numeric_check.strategies` (public, so that users
can test their own models); this module re-exports them for the test suite and adds
the few that only tests need.
"""

from __future__ import annotations

from hypothesis import strategies as st

from numeric_check.strategies import architectures, circuit_models, model_configs, models_and_tokens, token_batches

__all__ = ["architectures", "circuit_models", "model_configs", "models_and_tokens", "token_batches", "max_orders"]


@st.composite
def max_orders(draw, depth: int):
    """``None`` or a truncation order in ``0..depth`` (the deepest term's order)."""
    return draw(st.none() | st.integers(0, depth))
