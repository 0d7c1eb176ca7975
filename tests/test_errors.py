"""One error tree: every exception class the three packages define derives from the project's
root, :class:`~tensoralg.errors.TCircuitsError`, through exactly one package root — a checkpoint
that will not load is not an algebra error — and each class lives in its package's errors.py."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import derivations
import numeric_check
import tensoralg
from derivations.errors import DerivationError
from numeric_check.errors import NumericCheckError
from tensoralg.errors import TCircuitsError, TensorAlgError

ROOTS = {"tensoralg": TensorAlgError, "derivations": DerivationError, "numeric_check": NumericCheckError}

# Exceptions used as signals, not errors: raised and caught inside one package (a hook ends a
# forward pass once the wanted activation is read), never reported. They stay out of the tree
# so that ``except TCircuitsError`` can never swallow one.
SIGNALS = {"StopForward"}


def modules(package):
    """Every module of ``package`` (its ``__main__`` aside: importing it would run the CLI)."""
    yield package
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith("__main__"):
            yield importlib.import_module(info.name)


def public_exceptions(package) -> dict[str, type]:
    """``{qualified name: class}`` of the public exception classes defined in ``package``."""
    found = {}
    for module in modules(package):
        for name, cls in vars(module).items():
            if (inspect.isclass(cls) and issubclass(cls, Exception) and not name.startswith("_")
                    and cls.__module__.split(".")[0] == package.__name__
                    and cls is not TCircuitsError and cls.__name__ not in SIGNALS):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


PACKAGES = [tensoralg, derivations, numeric_check]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_public_exception_has_the_project_root_and_exactly_one_package_root(package):
    classes = public_exceptions(package)
    assert ROOTS[package.__name__] in classes.values()
    for name, cls in classes.items():
        assert issubclass(cls, TCircuitsError), f"{name} is not a TCircuitsError"
        roots = [root for root in ROOTS.values() if issubclass(cls, root)]
        assert roots == [ROOTS[package.__name__]], f"{name} derives from {[r.__name__ for r in roots]}"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_exception_classes_live_in_their_packages_errors_module(package):
    misplaced = [name for name, cls in public_exceptions(package).items()
                 if cls.__module__ != f"{package.__name__}.errors"]
    assert misplaced == []


def test_signals_are_not_errors():
    signals = [cls for package in PACKAGES for module in modules(package) for cls in vars(module).values()
               if inspect.isclass(cls) and cls.__name__ in SIGNALS]
    assert signals and all(not issubclass(cls, TCircuitsError) for cls in signals)


def test_the_package_roots_do_not_derive_from_one_another():
    for root in ROOTS.values():
        assert root.__bases__ == (TCircuitsError,)
    assert TCircuitsError.__bases__ == (Exception,)


def test_the_project_root_is_exported_and_catches_every_package():
    assert tensoralg.TCircuitsError is TCircuitsError
    from derivations.catalogue import get

    for failing in (lambda: tensoralg.parse("A ⊗"), lambda: get("virtual-weights", layers=2, heads=-1)):
        with pytest.raises(TCircuitsError):
            failing()


def test_the_cli_reports_each_packages_errors_in_one_line(tmp_path, capsys):
    from derivations.cli import main

    missing = tmp_path / "missing.safetensors"
    for argv, message in (
        (["expand", "(Id ⊗ W_U)(Id ⊗ W_E)", "--max-order", "-1"], "error: max_order must be None"),  # tensoralg
        (["derive", "no-such-derivation"], "error: "),  # derivations
        (["verify", "--checkpoint", str(missing)], f"error: checkpoint {missing} does not exist"),  # numeric_check
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tcircuits {argv[0]}: error: ") and message in err
        assert err.count("\n") == 1 and "Traceback" not in err
