"""A run's entry and arguments: how they are named, stored and compared."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import typing
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

from pydantic import TypeAdapter
from pydantic_core import PydanticSerializationError, from_json, to_json

from ._errors import EntryImportError, InvalidArgumentError, ResultSerializationError

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


_ADAPTERS: dict[object, TypeAdapter[Any] | None] = {}


def return_adapter(fn: Callable[..., Any], returns: Any = None) -> TypeAdapter[Any] | None:
    """A TypeAdapter for ``returns``, else ``fn``'s return annotation (cached per function).

    ``None`` when there is nothing usable to validate into (no annotation, ``Any``,
    ``None``, or a type pydantic cannot validate). An ``Awaitable[T]`` annotation gives ``T``.
    """
    key: object = ("returns", returns) if returns is not None else getattr(fn, "__code__", fn)
    try:
        return _ADAPTERS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable or type
        return _build_adapter(fn, returns)
    adapter = _ADAPTERS[key] = _build_adapter(fn, returns)
    return adapter


def _build_adapter(fn: Callable[..., Any], returns: Any) -> TypeAdapter[Any] | None:
    annotation = returns
    if annotation is None:
        try:
            annotation = typing.get_type_hints(fn).get("return")
        except Exception:  # unresolvable forward references, builtins, callable objects
            return None
        origin = typing.get_origin(annotation)
        awaited = inspect.isclass(origin) and issubclass(origin, Awaitable)
        if origin is not None and (origin in (Awaitable, typing.Coroutine) or awaited):
            annotation = typing.get_args(annotation)[-1]
    if annotation in (None, type(None), Any, object, inspect.Signature.empty):
        return None
    try:
        return TypeAdapter(annotation)
    except Exception:  # an annotation pydantic cannot validate
        return None


def revive_value(text: str | None, adapter: TypeAdapter[Any] | None) -> Any:
    """Decode a stored JSON value, validated into ``adapter``'s type when given."""
    if text is None:
        return None
    if adapter is not None:
        return adapter.validate_json(text)
    return from_json(text)


# -- finding an entry again ------------------------------------------------------------------

_REMEMBERED: OrderedDict[str, Callable[..., Any]] = OrderedDict()
_REMEMBER_LIMIT = 4096


def remember_entry(run_id: str, entry: Callable[..., Any]) -> None:
    """Keep ``entry`` for ``run_id`` in this process, so closures and lambdas resume too."""
    _REMEMBERED[run_id] = entry
    _REMEMBERED.move_to_end(run_id)
    while len(_REMEMBERED) > _REMEMBER_LIMIT:
        _REMEMBERED.popitem(last=False)


def remembered_entry(run_id: str) -> Callable[..., Any] | None:
    """The entry this process ran ``run_id`` with, if it still remembers it."""
    return _REMEMBERED.get(run_id)


def find_entry(run_id: str, ref: str) -> Callable[..., Any]:
    """The entry of ``run_id``: the one this process remembers, else imported by ``ref``."""
    remembered = _REMEMBERED.get(run_id)
    if remembered is not None and entry_ref(remembered) == ref:
        return remembered
    entry = import_entry(ref)
    remember_entry(run_id, entry)
    return entry


def import_entry(ref: str) -> Callable[..., Any]:
    """Import ``module:qualname`` (the module part may be a script path)."""
    module_name, sep, qualname = ref.rpartition(":")
    if not sep or not module_name or not qualname:
        raise EntryImportError(f"{ref!r} is not an entry reference of the form 'module:qualname'")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise EntryImportError(
            f"the entry {ref!r} was defined inside a function (or is a lambda), so a new process "
            "cannot import it; resume the run in the process that started it, or define the "
            "entry at module level"
        )
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            module = _import_script(module_name)
        else:
            module = importlib.import_module(module_name)
        target: Any = module
        for part in qualname.split("."):
            target = getattr(target, part)
    except EntryImportError:
        raise
    except Exception as exc:
        raise EntryImportError(
            f"cannot import the entry {ref!r} ({type(exc).__name__}: {exc}); make sure the module "
            "is importable here (installed, or on sys.path / PYTHONPATH)"
        ) from exc
    if not callable(target):
        raise EntryImportError(f"the entry {ref!r} is a {type(target).__name__}, not a callable")
    return target  # type: ignore[no-any-return]


def _import_script(path: str) -> ModuleType:
    name = "_agency_entry_" + hashlib.blake2b(path.encode(), digest_size=8).hexdigest()
    existing = sys.modules.get(name)
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise EntryImportError(f"cannot load the script {path!r} that defined the run's entry")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def decode_arguments(
    entry: Callable[..., Any], text: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Stored arguments, validated into the entry's parameter annotations where it has them."""
    data = from_json(text)
    args, kwargs = list(data.get("args", [])), dict(data.get("kwargs", {}))
    try:
        signature = inspect.signature(entry)
        hints = typing.get_type_hints(entry)
    except (TypeError, ValueError, NameError):
        return tuple(args), kwargs
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise EntryImportError(
            f"the stored arguments no longer fit the entry's signature {signature}: {exc}"
        ) from exc
    for name, value in list(bound.arguments.items()):
        annotation = hints.get(name)
        if annotation is None:
            continue
        kind = signature.parameters[name].kind
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        if kind is inspect.Parameter.VAR_POSITIONAL:
            bound.arguments[name] = tuple(adapter.validate_python(v) for v in value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            bound.arguments[name] = {k: adapter.validate_python(v) for k, v in value.items()}
        else:
            bound.arguments[name] = adapter.validate_python(value)
    return bound.args, bound.kwargs
