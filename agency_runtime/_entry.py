"""A run's entry and arguments: how they are named, stored and compared."""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter
from pydantic_core import PydanticSerializationError, from_json, to_json

from ._errors import InvalidArgumentError, ResultSerializationError

__all__ = [
    "diff_arguments",
    "encode_arguments",
    "entry_ref",
    "revive_value",
]


def check_entry(entry: object) -> None:
    """Raise :class:`InvalidArgumentError` unless ``entry`` can be called."""
    if not callable(entry):
        raise InvalidArgumentError(
            f"agency.run needs a callable entry (a function or async function), "
            f"got {type(entry).__name__} {entry!r:.80}"
        )


def entry_ref(entry: Callable[..., Any]) -> str:
    """Where ``entry`` lives, as ``module:qualname``, so another process can import it.

    An entry defined in ``__main__`` is recorded by its module name when the script was run
    with ``python -m`` and by its script path otherwise.
    """
    target = (
        inspect.unwrap(entry) if inspect.isfunction(entry) or inspect.ismethod(entry) else entry
    )
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    if module == "__main__":
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and getattr(spec, "name", None):
            module = spec.name
        elif getattr(main, "__file__", None):
            module = str(getattr(main, "__file__", ""))
    return f"{module}:{qualname}"


def encode_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The JSON text ``{"args": [...], "kwargs": {...}}`` of a run's arguments."""
    for index, value in enumerate(args):
        _check_json(value, f"positional argument {index}")
    for name, value in kwargs.items():
        _check_json(value, f"keyword argument {name!r}")
    return to_json({"args": list(args), "kwargs": kwargs}).decode()


def _check_json(value: Any, what: str) -> None:
    try:
        to_json(value)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"{what} of type {type(value).__name__} cannot be stored as JSON ({exc}); a durable "
            "run's arguments must be JSON data or pydantic models"
        ) from exc


def diff_arguments(stored: str, given: str) -> list[str]:
    """Human-readable differences between two :func:`encode_arguments` texts."""
    old, new = from_json(stored), from_json(given)
    differences: list[str] = []
    old_args, new_args = old.get("args", []), new.get("args", [])
    if len(old_args) != len(new_args):
        differences.append(f"stored {len(old_args)} positional argument(s), given {len(new_args)}")
    for index, (a, b) in enumerate(zip(old_args, new_args, strict=False)):
        if a != b:
            differences.append(f"positional argument {index}: stored {_show(a)}, given {_show(b)}")
    old_kw, new_kw = old.get("kwargs", {}), new.get("kwargs", {})
    for name in sorted(set(old_kw) | set(new_kw)):
        if name not in new_kw:
            differences.append(
                f"keyword argument {name!r}: stored {_show(old_kw[name])}, not given"
            )
        elif name not in old_kw:
            differences.append(
                f"keyword argument {name!r}: not stored, given {_show(new_kw[name])}"
            )
        elif old_kw[name] != new_kw[name]:
            differences.append(
                f"keyword argument {name!r}: stored {_show(old_kw[name])}, "
                f"given {_show(new_kw[name])}"
            )
    return differences


def _show(value: Any) -> str:
    text = to_json(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def encode_value(value: Any, *, what: str) -> str:
    """The JSON text of a value that must be stored; raises ResultSerializationError."""
    try:
        return to_json(value).decode()
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise ResultSerializationError(
            f"{what} is a {type(value).__name__}, which cannot be stored as JSON ({exc}); "
            "return JSON data (dicts, lists, strings, numbers) or pydantic models"
        ) from exc


def return_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any] | None:
    """A TypeAdapter for ``fn``'s return annotation, or ``None`` when it has none usable."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolved forward references, builtins, callable objects
        return None
    annotation = hints.get("return", inspect.Signature.empty)
    if annotation in (inspect.Signature.empty, Any, None, type(None), object):
        return None
    try:
        return TypeAdapter(annotation)
    except Exception:  # an annotation pydantic cannot build a validator for
        return None


def revive_value(text: str | None, adapter: TypeAdapter[Any] | None) -> Any:
    """Decode a stored JSON value, validated into ``adapter``'s type when given."""
    if text is None:
        return None
    if adapter is not None:
        return adapter.validate_json(text)
    return from_json(text)
