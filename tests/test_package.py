"""The package surface: cheap import, public names, typed, one exception tree."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import agency_runtime
import turn_kit


def test_importing_the_packages_does_not_import_litellm() -> None:
    code = (
        "import sys, agency_runtime, turn_kit; "
        "heavy = [m for m in ('litellm', 'openai', 'telegram') if m in sys.modules]; "
        "print(heavy)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def _documented_names() -> set[str]:
    """The names the README lists under *Public names*."""
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Public names", 1)[1]
    block = section.split("```text", 1)[1].split("```", 1)[0]
    names: set[str] = set()
    for line in block.splitlines():
        words = line.split(":", 1)[1] if ":" in line else line
        names.update(words.split())
    return names


def test_the_public_surface_is_exactly_the_documented_names() -> None:
    exported = set(agency_runtime.__all__)
    documented = _documented_names()
    assert exported - documented == set(), "exported but not documented in the README"
    assert documented - exported == set(), "documented in the README but not exported"
    assert len(agency_runtime.__all__) == len(exported), "__all__ lists a name twice"


def test_every_public_name_is_importable() -> None:
    for package in (agency_runtime, turn_kit):
        for name in package.__all__:
            assert hasattr(package, name), f"{package.__name__}.{name} is listed but missing"


@pytest.mark.parametrize(
    "name",
    [
        "agency",
        "CallsiteLocation",
        "Interrupt",
        "RunResult",
        "RuntimeContext",
        "ThreadStore",
        "MessageThread",
        "Message",
        "Store",
        "AgencyError",
        "OutsideFrameError",
        "RunNotFoundError",
        "GuardExceededError",
        "GuardApproveError",
        "CheckpointError",
        "LockReentryError",
        "LockTimeoutError",
        "HandlerRecursionError",
        "StepResultError",
        "NondeterminismError",
        "StructuredOutputError",
        "RunPaused",
        "RestoreSignal",
        "InvalidArgumentError",
        "RunConflictError",
        "RunFailedError",
        "RunPausedError",
    ],
)
def test_the_names_fixed_by_the_design_are_exported(name: str) -> None:
    assert name in agency_runtime.__all__


def test_the_packages_ship_py_typed() -> None:
    for package in (agency_runtime, turn_kit):
        assert (Path(package.__file__).parent / "py.typed").exists()


def _exported_exceptions() -> list[type[BaseException]]:
    return [
        value
        for value in vars(agency_runtime).values()
        if inspect.isclass(value) and issubclass(value, BaseException)
    ]


def test_errors_form_one_tree_and_signals_escape_except_exception() -> None:
    signals = {agency_runtime.RunPaused, agency_runtime.RestoreSignal}
    for error in _exported_exceptions():
        if error in signals:
            assert not issubclass(error, Exception), error
        else:
            assert issubclass(error, agency_runtime.AgencyError), error
        assert error.__module__ == "agency_runtime._errors"
        assert error.__doc__, f"{error} has no docstring"
        assert "\n" not in error.__doc__.strip(), f"{error}: one-line docstring"


def test_invalid_argument_error_is_also_a_value_error() -> None:
    assert issubclass(agency_runtime.InvalidArgumentError, ValueError)
