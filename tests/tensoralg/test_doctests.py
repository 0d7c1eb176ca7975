"""Every ``>>>`` example in the algebra's docstrings runs and prints what it says."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import tensoralg

MODULES = sorted(m.name for m in pkgutil.iter_modules(tensoralg.__path__, "tensoralg."))


@pytest.mark.parametrize("name", ["tensoralg", *MODULES])
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
