"""A run's inputs and outputs as stored: arguments, values, overrides, typed revival.

Arguments and values are stored as JSON text (never pickled) and must be JSON data that
round-trips faithfully (:mod:`agency_runtime._core._jsondata`); they come back validated into
the entry's annotations where it has them.
"""

from __future__ import annotations

import functools
import inspect
import typing
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, from_json, to_json

from .._core._jsondata import json_problem
from .._errors import (
    EntryImportError,
    InvalidArgumentError,
    JournalCorruptError,
    ResultSerializationError,
)

__all__ = [
    "Adapter",
    "ExactAdapter",
    "adapter_for",
    "annotation_text",
    "check_entry",
    "decode_arguments",
    "diff_arguments",
    "encode_arguments",
    "encode_overrides",
    "encode_value",
    "return_adapter",
    "return_annotation",
    "revive_value",
    "stored_globals",
    "validation_problems",
]


def check_entry(entry: object) -> None:
    """Raise :class:`InvalidArgumentError` unless ``entry`` can be called."""
    if not callable(entry):
        raise InvalidArgumentError(
            f"agency.run needs a callable entry (a function or async function), "
            f"got {type(entry).__name__} {entry!r:.80}"
        )


def encode_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The JSON text ``{"args": [...], "kwargs": {...}}`` of a run's arguments."""
    for index, value in enumerate(args):
        _check_json(value, f"positional argument {index}")
    for name, value in kwargs.items():
        _check_json(value, f"keyword argument {name!r}")
    return to_json({"args": list(args), "kwargs": kwargs}).decode()


def encode_overrides(
    args: tuple[Any, ...], kwargs: dict[str, Any], globals: dict[str, dict[str, Any]]
) -> str:
    """What a restore runs the entry with from now on: arguments and module globals."""
    _check_json(globals, "the restored globals")
    return to_json({"args": list(args), "kwargs": kwargs, "globals": globals}).decode()


def stored_globals(text: str) -> dict[str, dict[str, Any]]:
    """The module globals stored with a restore's overrides (``{}`` when none)."""
    try:
        data = from_json(text)
    except ValueError as exc:
        raise JournalCorruptError(f"a run's stored overrides are damaged: {exc}") from exc
    restored = data.get("globals") if isinstance(data, dict) else None
    if not isinstance(restored, dict):
        return {}
    return {
        str(module): dict(values) for module, values in restored.items() if isinstance(values, dict)
    }


def _check_json(value: Any, what: str) -> None:
    problem = json_problem(value)
    if problem is not None:
        raise InvalidArgumentError(
            f"{what} of type {type(value).__name__} cannot be stored as JSON: "
            f"{problem}; a durable run's arguments must be JSON data or pydantic models"
        )
    try:
        to_json(value)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"{what} of type {type(value).__name__} cannot be stored as JSON ({exc}); a durable "
            "run's arguments must be JSON data or pydantic models"
        ) from exc


def _stored_json(text: str, what: str) -> dict[str, Any]:
    try:
        data = from_json(text)
    except ValueError as exc:
        raise JournalCorruptError(f"{what} are damaged (not JSON): {exc}") from exc
    if not isinstance(data, dict):
        raise JournalCorruptError(f"{what} are damaged: expected an object, got {data!r:.80}")
    return data


def diff_arguments(stored: str, given: str) -> list[str]:
    """Human-readable differences between two :func:`encode_arguments` texts."""
    old = _stored_json(stored, "the stored arguments")
    new = from_json(given)
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
    problem = json_problem(value)
    if problem is not None:
        raise ResultSerializationError(
            f"{what} is a {type(value).__name__}, which cannot be stored as JSON: {problem}"
        )
    try:
        return to_json(value).decode()
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise ResultSerializationError(
            f"{what} is a {type(value).__name__}, which cannot be stored as JSON ({exc}); "
            "return JSON data (dicts, lists, strings, numbers) or pydantic models"
        ) from exc


class Adapter(Protocol):
    """What validates a stored value into a type: a pydantic ``TypeAdapter`` or an
    :class:`ExactAdapter` (which builds one only when it needs it)."""

    def validate_json(self, data: str | bytes, /) -> Any: ...

    def validate_python(self, value: Any, /) -> Any: ...


class ExactAdapter:
    """The adapter of a plain ``str`` / ``int`` / ``bool`` / ``float`` annotation.

    A value of exactly the annotated type is returned as it is, which is what pydantic gives;
    anything else (a ``3`` for a ``float``, a wrong type, text that is not JSON) goes to the
    pydantic ``TypeAdapter``, built on that first need. Resuming a run whose entry and steps
    return such types then builds no schema at all.
    """

    __slots__ = ("_full", "annotation")

    def __init__(self, annotation: type) -> None:
        self.annotation = annotation
        self._full: TypeAdapter[Any] | None = None

    def full(self) -> TypeAdapter[Any]:
        """The pydantic adapter of the annotation (built once, on first need)."""
        if self._full is None:
            self._full = TypeAdapter(self.annotation)
        return self._full

    def validate_python(self, value: Any, /) -> Any:
        """``value`` validated into the annotation."""
        if type(value) is self.annotation:
            return value
        return self.full().validate_python(value)

    def validate_json(self, data: str | bytes, /) -> Any:
        """The JSON ``data`` decoded and validated into the annotation."""
        try:
            value = from_json(data)
        except ValueError:
            return self.full().validate_json(data)  # pydantic's own ValidationError
        if type(value) is self.annotation:
            return value
        return self.full().validate_json(data)


_EXACT_ADAPTERS: dict[type, ExactAdapter] = {t: ExactAdapter(t) for t in (str, int, bool, float)}
"""The adapters of annotations a value of exactly that type already fits: pydantic's (lax)
validation of a ``str``, an ``int``, a ``bool`` or a ``float`` into its own type gives it
back unchanged."""


def adapter_for(annotation: Any) -> Adapter:
    """A new adapter of ``annotation``: the (shared) :class:`ExactAdapter` of a plain scalar
    type, else a pydantic ``TypeAdapter`` (callers cache it per function: two annotations
    that compare equal, ``int | str`` and ``str | int``, need not validate alike)."""
    if type(annotation) is type and annotation in _EXACT_ADAPTERS:
        return _EXACT_ADAPTERS[annotation]
    return TypeAdapter(annotation)


_ADAPTERS: dict[object, Adapter | None] = {}


def return_adapter(fn: Callable[..., Any], returns: Any = None) -> Adapter | None:
    """A TypeAdapter for ``returns``, else ``fn``'s return annotation (cached per function).

    ``None`` when there is nothing usable to validate into (no annotation, ``Any``,
    ``None``, or a type pydantic cannot validate). An ``Awaitable[T]`` annotation gives ``T``.
    A ``functools.partial`` returns what its function returns: it is read (and cached) as
    that function, not as the new partial object a loop makes for each step (which kept
    one cache entry per step for as long as the process lived, and its annotation unread).
    """
    while type(fn) is functools.partial:
        fn = fn.func
    key: object = ("returns", returns) if returns is not None else getattr(fn, "__code__", fn)
    try:
        return _ADAPTERS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable or type
        return _build_adapter(fn, returns)
    adapter = _ADAPTERS[key] = _build_adapter(fn, returns)
    return adapter


def return_annotation(fn: Callable[..., Any]) -> Any:
    """``fn``'s return annotation (``T`` for ``Awaitable[T]``), or ``None`` when unreadable."""
    try:
        annotation = typing.get_type_hints(fn).get("return")
    except Exception:  # unresolvable forward references, builtins, callable objects
        return None
    origin = typing.get_origin(annotation)
    awaited = inspect.isclass(origin) and issubclass(origin, Awaitable)
    if origin is not None and (origin in (Awaitable, typing.Coroutine) or awaited):
        annotation = typing.get_args(annotation)[-1]
    return annotation


def annotation_text(annotation: Any) -> str:
    """How an annotation reads in code: ``int``, ``Order``, ``list[int]``."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def validation_problems(exc: ValidationError) -> str:
    """What a pydantic validation error found: ``field: message; …`` (``(value)`` for the
    value itself), without pydantic's header and links."""
    return "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or '(value)'}: {error['msg']}"
        for error in exc.errors()
    )


def _build_adapter(fn: Callable[..., Any], returns: Any) -> Adapter | None:
    annotation = returns if returns is not None else return_annotation(fn)
    if annotation in (None, type(None), Any, object, inspect.Signature.empty):
        return None
    try:
        return adapter_for(annotation)
    except Exception:  # an annotation pydantic cannot validate
        return None


def revive_value(text: str | None, adapter: Adapter | None) -> Any:
    """Decode a stored JSON value, validated into ``adapter``'s type when given."""
    if text is None:
        return None
    if adapter is not None:
        return adapter.validate_json(text)
    try:
        return from_json(text)
    except ValueError as exc:
        raise JournalCorruptError(f"a stored value is damaged (not JSON): {exc}") from exc


def decode_arguments(
    entry: Callable[..., Any], text: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Stored arguments, validated into the entry's parameter annotations where it has them."""
    data = _stored_json(text, "the stored arguments")
    raw_args, raw_kwargs = data.get("args", []), data.get("kwargs", {})
    if not isinstance(raw_args, list) or not isinstance(raw_kwargs, dict):
        raise JournalCorruptError(
            "the stored arguments are damaged: 'args' must be a list and 'kwargs' an object"
        )
    args, kwargs = list(raw_args), dict(raw_kwargs)
    parameters = _parameters(entry)
    if parameters is None:
        return tuple(args), kwargs
    signature = parameters.signature
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise EntryImportError(
            f"the stored arguments no longer fit the entry's signature {signature}: {exc}"
        ) from exc
    for name, value in list(bound.arguments.items()):
        annotation = parameters.hints.get(name)
        if annotation is None:
            continue
        adapter = parameters.adapter(name, annotation)
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            bound.arguments[name] = tuple(adapter.validate_python(v) for v in value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            bound.arguments[name] = {k: adapter.validate_python(v) for k, v in value.items()}
        else:
            bound.arguments[name] = adapter.validate_python(value)
    return bound.args, bound.kwargs


class _Parameters:
    """An entry's signature, type hints and the adapters of its annotated parameters."""

    __slots__ = ("_adapters", "hints", "signature")

    def __init__(self, signature: inspect.Signature, hints: dict[str, Any]) -> None:
        self.signature = signature
        self.hints = hints
        self._adapters: dict[str, Adapter] = {}

    def adapter(self, name: str, annotation: Any) -> Adapter:
        """The adapter of parameter ``name`` (annotated ``annotation``), built once."""
        adapter = self._adapters.get(name)
        if adapter is None:
            adapter = self._adapters[name] = adapter_for(annotation)
        return adapter


_PARAMETERS: weakref.WeakKeyDictionary[Callable[..., Any], _Parameters] = (
    weakref.WeakKeyDictionary()
)


def _parameters(entry: Callable[..., Any]) -> _Parameters | None:
    """``entry``'s parameters (``None`` when unreadable), read once per entry: every resume
    of a run decodes its arguments with them."""
    try:
        return _PARAMETERS[entry]
    except (KeyError, TypeError):  # not read yet, or an entry without weak references
        pass
    try:
        parameters = _Parameters(inspect.signature(entry), typing.get_type_hints(entry))
    except (TypeError, ValueError, NameError):
        return None  # not kept: a forward reference may resolve later
    try:
        _PARAMETERS[entry] = parameters
    except TypeError:
        pass
    return parameters
