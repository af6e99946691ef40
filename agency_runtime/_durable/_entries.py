"""A run's entry and arguments: how they are named, stored, compared and found again.

Finding an entry again follows the trust model of the store (DESIGN §10.2): the store is data,
never code. A stored run is continued only with an entry the application declared
(``@agency.entry``, ``agency.register_entry``) or one this process already ran, and a recorded
module is imported only when it belongs to the application: a file under the working
directory, a module named by ``--import`` / ``AGENCY_IMPORTS`` (:func:`import_app_modules`), or
``agency_runtime`` / ``turn_kit`` themselves. Never a standard-library or installed module by
the store's say-so.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import site
import sys
import sysconfig
import typing
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from pydantic import TypeAdapter
from pydantic_core import PydanticSerializationError, from_json, to_json

from .._core._jsondata import json_problem
from .._errors import (
    AgencyError,
    EntryImportError,
    EntryNotAllowedError,
    InvalidArgumentError,
    JournalCorruptError,
    ResultSerializationError,
)

__all__ = [
    "declare_entry",
    "diff_arguments",
    "encode_arguments",
    "entry_ref",
    "find_entry",
    "import_app_modules",
    "known_entry",
    "revive_value",
]

_F = TypeVar("_F", bound=Callable[..., Any])


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
    with ``python -m`` and by its script path otherwise. An entry declared with a name
    (``@agency.entry(name="refund")``) is recorded by that name, which never contains ``:``.
    """
    name = _named(entry)
    if name is not None:
        return name
    return location_ref(entry)


def location_ref(entry: Callable[..., Any]) -> str:
    """``module:qualname`` (or script path) of ``entry``, whatever name it was declared with.

    Runs recorded before an entry got its ``name=`` carry this reference; they still match it.
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
    try:
        return from_json(text)
    except ValueError as exc:
        raise JournalCorruptError(f"a stored value is damaged (not JSON): {exc}") from exc


# -- declared entries ------------------------------------------------------------------------
#
# The store is data, never code (DESIGN §10.2). A run recorded in the store is continued only
# with an entry this application declared: decorated with ``@agency.entry`` / registered with
# ``agency.register_entry``, or one this process already ran. A recorded module is imported
# only when it belongs to the application: a file under the working directory, a module
# named by ``--import`` / ``AGENCY_IMPORTS`` (or :func:`import_app_modules`), or our own code.

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,199}")
"""An entry name: letters, digits, ``_ . - /``; no ``:``, so it never looks like a ref."""

_DECLARED: dict[int, Callable[..., Any]] = {}
"""Declared entries by ``id`` (the value keeps the object alive, so the id stays its own)."""
_NAMES: dict[str, Callable[..., Any]] = {}
"""Named entries: the name recorded in the store → the entry."""
_NAME_OF: dict[int, str] = {}
"""The name of a named entry, by ``id``."""
_RAN: OrderedDict[int, Callable[..., Any]] = OrderedDict()
"""Entries this process passed to ``agency.run`` (most recent last, bounded)."""
_APP_MODULES: set[str] = set()
"""Modules named as the application's (with their submodules)."""
_APP_SCRIPTS: set[str] = set()
"""Resolved paths of scripts named as the application's."""

OWN_PACKAGES: tuple[str, ...] = ("agency_runtime", "turn_kit")
"""Our own packages: their entries (e.g. the demo's workflow) may be imported."""

IMPORTS_ENV = "AGENCY_IMPORTS"
"""The environment variable naming application modules (comma-separated), like ``--import``."""

_HOW_TO_DECLARE = (
    "decorate it with @agency.entry (or @agency.entry(name=...)), or call "
    "agency.register_entry(fn); if its module is not under the working directory, name the "
    f"module with `--import MODULE` (agency runs resume/respond) or {IMPORTS_ENV}=MODULE"
)


def declare_entry(fn: _F, *, name: str | None = None) -> _F:
    """Declare ``fn`` as an entry a stored run may be continued with; return ``fn`` unchanged.

    With ``name``, the run records that name instead of ``module:qualname``, so the entry
    keeps its identity when the function moves; a new process must then import the module
    that declares it (``--import MODULE`` / ``AGENCY_IMPORTS``) before continuing its runs.
    """
    if not callable(fn):
        raise InvalidArgumentError(
            "agency.entry / agency.register_entry declare a function: write @agency.entry, "
            f"@agency.entry(name='...') or agency.register_entry(fn), got {type(fn).__name__} "
            f"{fn!r:.80}"
        )
    if name is not None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidArgumentError(
                f"an entry name must be 1-200 letters, digits, '_', '.', '-' or '/' (starting "
                f"with a letter, digit or '_'; no ':'), got {name!r:.80}"
            )
        taken = _NAMES.get(name)
        if taken is not None and taken is not fn and _identity(taken) != _identity(fn):
            raise InvalidArgumentError(
                f"the entry name {name!r} is declared already, for {_describe(taken)}; "
                f"give {_describe(fn)} another name"
            )
        current = _NAME_OF.get(id(fn))
        if current is not None and current != name and _NAMES.get(current) is fn:
            raise InvalidArgumentError(
                f"{_describe(fn)} is declared already as the entry {current!r}; "
                "an entry has one name"
            )
        if taken is not None and taken is not fn:  # the same code again (a re-import)
            _NAME_OF.pop(id(taken), None)
        _NAMES[name] = fn
        _NAME_OF[id(fn)] = name
    _DECLARED[id(fn)] = fn
    return fn


def _identity(fn: object) -> tuple[str, str]:
    """Where ``fn``'s code lives: (file, qualname); the same for a re-imported module."""
    target = inspect.unwrap(fn) if inspect.isfunction(fn) else fn
    code = getattr(target, "__code__", None)
    return (
        str(getattr(code, "co_filename", "")),
        str(getattr(target, "__qualname__", type(target).__qualname__)),
    )


def _describe(fn: object) -> str:
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{qualname}"


def _chain(target: object) -> Iterator[object]:
    """``target`` and the functions it wraps (``__wrapped__``), outermost first."""
    seen: set[int] = set()
    while target is not None and id(target) not in seen and len(seen) < 100:
        seen.add(id(target))
        yield target
        target = getattr(target, "__wrapped__", None)


def is_declared(target: object) -> bool:
    """Whether ``target`` (or a function it wraps) is declared, or was run by this process."""
    return any(
        _DECLARED.get(id(item)) is item or _RAN.get(id(item)) is item for item in _chain(target)
    )


def _named(target: object) -> str | None:
    for item in _chain(target):
        name = _NAME_OF.get(id(item))
        if name is not None and _NAMES.get(name) is item:
            return name
    return None


# -- application modules ---------------------------------------------------------------------


def _is_script(module_name: str) -> bool:
    return module_name.endswith(".py") or os.sep in module_name or "/" in module_name


def import_app_modules(names: Iterable[str]) -> list[ModuleType]:
    """Import the application modules ``names`` and mark them as the application's.

    Each name is a module (``myapp.workflows``; its submodules count too) or a script path
    (``examples/order_workflow.py``). Importing runs their ``@agency.entry`` declarations, and
    a run whose recorded entry lives in one of them may then be continued. This is what the
    CLI's ``--import MODULE`` and the ``AGENCY_IMPORTS`` variable do.
    """
    modules: list[ModuleType] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        try:
            if _is_script(name):
                path = os.path.abspath(os.path.expanduser(name))
                if not os.path.isfile(path):
                    raise EntryImportError(f"the application script {name!r} does not exist")
                _APP_SCRIPTS.add(os.path.realpath(path))
                modules.append(_import_script(path))
                continue
            if not all(part.isidentifier() for part in name.split(".")):
                raise InvalidArgumentError(
                    f"{name!r} is not a module name (like 'myapp.workflows') or a script path"
                )
            _APP_MODULES.add(name)
            modules.append(importlib.import_module(name))
        except AgencyError:
            raise
        except Exception as exc:
            raise EntryImportError(
                f"cannot import the application module {name!r} ({type(exc).__name__}: {exc}); "
                "make sure it is importable here (installed, or on sys.path / PYTHONPATH)"
            ) from exc
    return modules


def _env_imports() -> None:
    """Import the modules ``AGENCY_IMPORTS`` names (read now, at resolution time)."""
    names = [n for n in os.environ.get(IMPORTS_ENV, "").split(",") if n.strip()]
    if not names:
        return
    try:
        import_app_modules(names)
    except EntryImportError as exc:
        raise EntryImportError(f"{IMPORTS_ENV}: {exc}") from exc


@functools.lru_cache(maxsize=1)
def _installed_roots() -> tuple[Path, ...]:
    """Where the standard library and installed packages live."""
    roots: set[str] = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            roots.add(paths[key])
    getsitepackages = getattr(site, "getsitepackages", None)
    if getsitepackages is not None:
        roots.update(getsitepackages())
    user_site = getattr(site, "getusersitepackages", None)
    if user_site is not None:
        roots.add(user_site())
    return tuple(Path(r).resolve() for r in sorted(roots))


def _installed(path: Path) -> bool:
    if any(part in ("site-packages", "dist-packages") for part in path.parts):
        return True
    return any(path.is_relative_to(root) for root in _installed_roots())


def _resolved(path: str) -> Path | None:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError, ValueError):
        return None


def _in_app_dir(path: Path) -> bool:
    """Whether ``path`` is under the working directory and not an installed package."""
    try:
        cwd = Path.cwd().resolve()
    except OSError:
        return False
    return path.is_relative_to(cwd) and not _installed(path)


def _refuse_module(ref: str, module: str, why: str) -> EntryNotAllowedError:
    return EntryNotAllowedError(
        f"not importing {module!r} to run the stored entry {ref!r}: {why}. The store is data, "
        "never code: a run's recorded module is imported only when it belongs to this "
        f"application (a file under the working directory {os.getcwd()}, or a module named "
        f"with `--import MODULE` / {IMPORTS_ENV}=MODULE). If it is your code, name it that "
        "way and declare the entry with @agency.entry or agency.register_entry(fn)"
    )


def _check_module(ref: str, module_name: str) -> None:
    """Raise unless the module ``module_name`` belongs to the application (nothing executes)."""
    top = module_name.partition(".")[0]
    if top in OWN_PACKAGES:
        return
    if any(module_name == m or module_name.startswith(m + ".") for m in _APP_MODULES):
        return
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        raise _refuse_module(ref, module_name, "it is a standard-library module")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: no parent package runs
    except (ImportError, ValueError) as exc:
        raise _refuse_module(ref, module_name, f"it cannot be located ({exc})") from exc
    if spec is None:
        raise EntryImportError(
            f"cannot import the entry {ref!r}: no module {top!r} here; make sure the module "
            "is importable (installed, or on sys.path / PYTHONPATH)"
        )
    locations = list(spec.submodule_search_locations or []) or [spec.origin or ""]
    for location in locations:
        path = _resolved(location) if location and location not in ("built-in", "frozen") else None
        if path is None:
            raise _refuse_module(ref, module_name, f"it is not a file ({location or 'no origin'})")
        if _installed(path):
            raise _refuse_module(ref, module_name, f"it is an installed package ({path})")
        if not _in_app_dir(path):
            why = f"it is not under the working directory ({path})"
            raise _refuse_module(ref, module_name, why)


def _check_script(ref: str, script: str) -> None:
    path = _resolved(script)
    if path is None:
        raise _refuse_module(ref, script, "its path cannot be resolved")
    if str(path) in _APP_SCRIPTS:
        return
    if _installed(path):
        raise _refuse_module(ref, script, "it is inside an installed package")
    if not _in_app_dir(path):
        raise _refuse_module(ref, script, "the script is not under the working directory")


# -- finding an entry again ------------------------------------------------------------------

_REMEMBERED: OrderedDict[str, Callable[..., Any]] = OrderedDict()
_REMEMBER_LIMIT = 4096


def remember_entry(run_id: str, entry: Callable[..., Any]) -> None:
    """Keep ``entry`` for ``run_id`` in this process, so closures and lambdas resume too.

    ``agency.run`` calls it, so every entry this process ran counts as declared here.
    """
    _REMEMBERED[run_id] = entry
    _REMEMBERED.move_to_end(run_id)
    while len(_REMEMBERED) > _REMEMBER_LIMIT:
        _REMEMBERED.popitem(last=False)
    _RAN[id(entry)] = entry
    _RAN.move_to_end(id(entry))
    while len(_RAN) > _REMEMBER_LIMIT:
        _RAN.popitem(last=False)


def remembered_entry(run_id: str) -> Callable[..., Any] | None:
    """The entry this process ran ``run_id`` with, if it still remembers it."""
    return _REMEMBERED.get(run_id)


def known_entry(run_id: str, ref: str) -> Callable[..., Any] | None:
    """The entry for ``run_id`` / ``ref`` this process knows already; never imports anything.

    The entry remembered for ``run_id``, else the entry named ``ref``, else the one declared
    (or run here) entry recorded as ``ref`` — a closure or lambda only by its run id, since
    many closures share one ``module:qualname``.
    """
    remembered = _REMEMBERED.get(run_id)
    if remembered is not None and entry_ref(remembered) == ref:
        return remembered
    if ":" not in ref:
        return _NAMES.get(ref)
    if "<" in ref:
        return None
    found: dict[int, Callable[..., Any]] = {}
    for candidate in [*_DECLARED.values(), *_RAN.values()]:
        try:
            same = entry_ref(candidate) == ref
        except Exception:  # an odd callable (a __wrapped__ cycle, a failing property)
            continue
        if same:
            found[id(candidate)] = candidate
    return next(iter(found.values())) if len(found) == 1 else None


def find_entry(run_id: str, ref: str) -> Callable[..., Any]:
    """The entry to continue ``run_id`` with, whose recorded reference is ``ref``.

    A known entry (:func:`known_entry`), else one found after importing the modules
    ``AGENCY_IMPORTS`` names, else imported by ``ref`` when its module belongs to the
    application and the target is declared. Raises :class:`EntryNotAllowedError` otherwise.
    """
    entry = known_entry(run_id, ref)
    if entry is None:
        _env_imports()
        entry = known_entry(run_id, ref)
    if entry is None:
        entry = import_entry(ref)
    remember_entry(run_id, entry)
    return entry


def import_entry(ref: str) -> Callable[..., Any]:
    """Import the entry ``module:qualname`` (the module part may be a script path).

    Only a module of the application is imported, and only a declared entry is returned
    (see :func:`find_entry`); a ``ref`` without ``:`` is an entry name, which is never
    imported: the module declaring it must be imported already.
    """
    module_name, sep, qualname = ref.rpartition(":")
    if not sep and ref and _NAME.fullmatch(ref):
        raise EntryNotAllowedError(
            f"the stored run's entry is named {ref!r}, and no entry of that name is declared in "
            f"this process; import the module that declares it (@agency.entry(name={ref!r}) or "
            f"agency.register_entry(fn, name={ref!r})) with `--import MODULE` "
            f"(agency runs resume/respond) or {IMPORTS_ENV}=MODULE"
        )
    if not sep or not module_name or not qualname:
        raise EntryImportError(f"{ref!r} is not an entry reference of the form 'module:qualname'")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise EntryImportError(
            f"the entry {ref!r} was defined inside a function (or is a lambda), so a new process "
            "cannot import it; resume the run in the process that started it, or define the "
            "entry at module level"
        )
    script = _is_script(module_name)
    if script:
        _check_script(ref, module_name)
    else:
        _check_module(ref, module_name)
    try:
        module = _import_script(module_name) if script else importlib.import_module(module_name)
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
    if not is_declared(target):
        raise EntryNotAllowedError(
            f"the stored entry {ref!r} is not declared as an entry, so it is not run (the store "
            f"is data, never code). To allow it, {_HOW_TO_DECLARE}"
        )
    return target  # type: ignore[no-any-return]


def _import_script(path: str) -> ModuleType:
    """Load the script ``path`` as a module (its ``if __name__ == "__main__"`` block does not
    run), once per process."""
    path = os.path.abspath(path)
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
    data = _stored_json(text, "the stored arguments")
    raw_args, raw_kwargs = data.get("args", []), data.get("kwargs", {})
    if not isinstance(raw_args, list) or not isinstance(raw_kwargs, dict):
        raise JournalCorruptError(
            "the stored arguments are damaged: 'args' must be a list and 'kwargs' an object"
        )
    args, kwargs = list(raw_args), dict(raw_kwargs)
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
