"""The ``derive`` and ``expand`` subcommands (see :mod:`derivations.cli`)."""

from __future__ import annotations


def register(subparsers) -> None:
    """Add ``derive`` and ``expand`` to the ``tcircuits`` parser."""
