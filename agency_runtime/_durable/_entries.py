"""Which entries a stored run may continue with: the trust model of the store.

The store is data, never code (DESIGN §10.2). A run recorded in the store is continued only
with an entry this application declared (``@agency.entry``, ``agency.register_entry``) or one
this process already ran, and a recorded module is imported only when it belongs to the
application: a file under the working directory, a module named by ``--import`` /
``AGENCY_IMPORTS`` (:meth:`EntryRegistry.import_app_modules`, imported up front), or
``agency_runtime`` / ``turn_kit`` themselves — never a standard-library or installed module by
the store's say-so. A module not imported yet (other than ours) is imported only when its
source, read without running it (:mod:`._entry_source`), declares the recorded entry, so a
tampered row cannot make the process run the top-level code of any file under the working
directory. One :class:`EntryRegistry` per process holds what was declared, run and named; the
composition root (:mod:`agency_runtime._boundary._runtime`) owns it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import re
import site
import sys
import sysconfig
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from .._errors import (
    AgencyError,
    EntryImportError,
    EntryNotAllowedError,
    EventLoopRunningError,
    InvalidArgumentError,
)

__all__ = ["IMPORTS_ENV", "OWN_PACKAGES", "EntryRegistry", "location_ref"]

_F = TypeVar("_F", bound=Callable[..., Any])

_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,199}"  # compiled (and cached by re) on first use
"""An entry name: letters, digits, ``_ . - /``; no ``:``, so it never looks like a ref."""

OWN_PACKAGES: tuple[str, ...] = ("agency_runtime", "turn_kit")
"""Our own packages: their entries (e.g. the demo's workflow) may be imported."""

IMPORTS_ENV = "AGENCY_IMPORTS"
"""The environment variable naming application modules (comma-separated), like ``--import``."""

_HOW_TO_DECLARE = (
    "decorate it with @agency.entry (or @agency.entry(name=...)), or call "
    "agency.register_entry(fn) at the top level of its module; if its module is not under the "
    "working directory, or declares its entries some other way, name the module with "
    f"`--import MODULE` (agency runs resume/respond) or {IMPORTS_ENV}=MODULE, which imports it "
    "up front"
)

_REMEMBER_LIMIT = 4096


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


class EntryRegistry:
    """The entries of this process: declared, named, run, and the application's modules."""

    def __init__(self) -> None:
        self._declared: dict[int, Callable[..., Any]] = {}
        """Declared entries by ``id`` (the value keeps the object alive, so the id stays)."""
        self._names: dict[str, Callable[..., Any]] = {}
        """Named entries: the name recorded in the store → the entry."""
        self._name_of: dict[int, str] = {}
        """The name of a named entry, by ``id``."""
        self._ran: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        """Entries this process passed to ``agency.run`` (most recent last, bounded)."""
        self._app_modules: set[str] = set()
        """Modules named as the application's (with their submodules)."""
        self._app_scripts: set[str] = set()
        """Resolved paths of scripts named as the application's."""
        self._remembered: OrderedDict[str, Callable[..., Any]] = OrderedDict()
        """The entry of each run this process ran, by run id (so closures resume too)."""

    def declare(self, fn: _F, *, name: str | None = None) -> _F:
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
            if not isinstance(name, str) or not re.fullmatch(_NAME, name):
                raise InvalidArgumentError(
                    f"an entry name must be 1-200 letters, digits, '_', '.', '-' or '/' (starting "
                    f"with a letter, digit or '_'; no ':'), got {name!r:.80}"
                )
            taken = self._names.get(name)
            if taken is not None and taken is not fn and _identity(taken) != _identity(fn):
                raise InvalidArgumentError(
                    f"the entry name {name!r} is declared already, for {_describe(taken)}; "
                    f"give {_describe(fn)} another name"
                )
            current = self._name_of.get(id(fn))
            if current is not None and current != name and self._names.get(current) is fn:
                raise InvalidArgumentError(
                    f"{_describe(fn)} is declared already as the entry {current!r}; "
                    "an entry has one name"
                )
            if taken is not None and taken is not fn:  # the same code again (a re-import)
                self._name_of.pop(id(taken), None)
            self._names[name] = fn
            self._name_of[id(fn)] = name
        self._declared[id(fn)] = fn
        return fn

    def is_declared(self, target: object) -> bool:
        """Whether ``target`` (or a function it wraps) is declared, or was run by this process."""
        return any(
            self._declared.get(id(item)) is item or self._ran.get(id(item)) is item
            for item in _chain(target)
        )

    def is_entry(self, target: object) -> bool:
        """Whether ``target`` (or a function it wraps) is declared: run here is not enough."""
        return any(self._declared.get(id(item)) is item for item in _chain(target))

    def _named(self, target: object) -> str | None:
        for item in _chain(target):
            name = self._name_of.get(id(item))
            if name is not None and self._names.get(name) is item:
                return name
        return None

    def entry_ref(self, entry: Callable[..., Any]) -> str:
        """Where ``entry`` lives, as ``module:qualname``, so another process can import it.

        An entry defined in ``__main__`` is recorded by its module name when the script was run
        with ``python -m`` and by its script path otherwise. An entry declared with a name
        (``@agency.entry(name="refund")``) is recorded by that name, which never contains ``:``.
        """
        name = self._named(entry)
        if name is not None:
            return name
        return location_ref(entry)

    def import_app_modules(self, names: Iterable[str]) -> list[ModuleType]:
        """Import the application modules ``names`` and mark them as the application's.

        Each name is a module (``myapp.workflows``; its submodules count too, wherever they are
        installed, and one not imported yet is read before it is imported, like a file under
        the working directory) or a script path (``examples/order_workflow.py``). Importing runs
        their ``@agency.entry`` declarations, and a run whose recorded entry lives in one of them
        may then be continued. This is what the CLI's ``--import MODULE`` and the
        ``AGENCY_IMPORTS`` variable do.
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
                    self._app_scripts.add(os.path.realpath(path))
                    modules.append(_import_script(path))
                    continue
                if not all(part.isidentifier() for part in name.split(".")):
                    raise InvalidArgumentError(
                        f"{name!r} is not a module name (like 'myapp.workflows') or a script path"
                    )
                self._app_modules.add(name)
                modules.append(importlib.import_module(name))
            except Exception as exc:
                if _ran_a_loop(exc):
                    raise _own_loop(name, exc) from exc
                if isinstance(exc, AgencyError):
                    raise
                raise EntryImportError(
                    f"cannot import the application module {name!r} ({type(exc).__name__}: {exc}); "
                    "make sure it is importable here (installed, or on sys.path / PYTHONPATH)"
                ) from exc
        return modules

    def _env_imports(self) -> None:
        """Import the modules ``AGENCY_IMPORTS`` names (read now, at resolution time)."""
        names = [n for n in os.environ.get(IMPORTS_ENV, "").split(",") if n.strip()]
        if not names:
            return
        try:
            self.import_app_modules(names)
        except EntryImportError as exc:
            raise EntryImportError(f"{IMPORTS_ENV}: {exc}") from exc

    def _check_module(self, ref: str, module_name: str) -> None:
        """Raise unless the module ``module_name`` belongs to the application (nothing executes)."""
        top = module_name.partition(".")[0]
        if top in OWN_PACKAGES:
            return
        if any(module_name == m or module_name.startswith(m + ".") for m in self._app_modules):
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
            path = (
                _resolved(location) if location and location not in ("built-in", "frozen") else None
            )
            if path is None:
                raise _refuse_module(
                    ref, module_name, f"it is not a file ({location or 'no origin'})"
                )
            if _installed(path):
                raise _refuse_module(ref, module_name, f"it is an installed package ({path})")
            if not _in_app_dir(path):
                why = f"it is not under the working directory ({path})"
                raise _refuse_module(ref, module_name, why)

    def _check_script(self, ref: str, script: str) -> None:
        path = _resolved(script)
        if path is None:
            raise _refuse_module(ref, script, "its path cannot be resolved")
        if str(path) in self._app_scripts:
            return
        if _installed(path):
            raise _refuse_module(ref, script, "it is inside an installed package")
        if not _in_app_dir(path):
            raise _refuse_module(ref, script, "the script is not under the working directory")

    def remember(self, run_id: str, entry: Callable[..., Any]) -> None:
        """Keep ``entry`` for ``run_id`` in this process, so closures and lambdas resume too.

        ``agency.run`` calls it, so every entry this process ran counts as declared here.
        """
        self._remembered[run_id] = entry
        self._remembered.move_to_end(run_id)
        while len(self._remembered) > _REMEMBER_LIMIT:
            self._remembered.popitem(last=False)
        self._ran[id(entry)] = entry
        self._ran.move_to_end(id(entry))
        while len(self._ran) > _REMEMBER_LIMIT:
            self._ran.popitem(last=False)

    def remembered(self, run_id: str) -> Callable[..., Any] | None:
        """The entry this process ran ``run_id`` with, if it still remembers it."""
        return self._remembered.get(run_id)

    def known(self, run_id: str, ref: str) -> Callable[..., Any] | None:
        """The entry for ``run_id`` / ``ref`` this process knows already; never imports anything.

        The entry remembered for ``run_id``, else the entry named ``ref``, else the one declared
        (or run here) entry recorded as ``ref`` — a closure or lambda only by its run id, since
        many closures share one ``module:qualname``.
        """
        remembered = self._remembered.get(run_id)
        if remembered is not None and self.entry_ref(remembered) == ref:
            return remembered
        if ":" not in ref:
            return self._names.get(ref)
        if "<" in ref:
            return None
        found: dict[int, Callable[..., Any]] = {}
        for candidate in [*self._declared.values(), *self._ran.values()]:
            try:
                same = self.entry_ref(candidate) == ref
            except Exception:  # an odd callable (a __wrapped__ cycle, a failing property)
                continue
            if same:
                found[id(candidate)] = candidate
        return next(iter(found.values())) if len(found) == 1 else None

    def find(self, run_id: str, ref: str) -> Callable[..., Any]:
        """The entry to continue ``run_id`` with, whose recorded reference is ``ref``.

        A known entry (:meth:`known`), else one found after importing the modules
        ``AGENCY_IMPORTS`` names, else imported by ``ref`` when its module belongs to the
        application and the target is declared. Raises :class:`EntryNotAllowedError` otherwise.
        """
        entry = self.known(run_id, ref)
        if entry is None:
            self._env_imports()
            entry = self.known(run_id, ref)
        if entry is None:
            entry = self.import_entry(ref)
        self.remember(run_id, entry)
        return entry

    def import_entry(self, ref: str) -> Callable[..., Any]:
        """Import the entry ``module:qualname`` (the module part may be a script path).

        Only a module of the application is imported, and only a declared entry is returned
        (see :meth:`find`); a module not imported yet only when its source declares the entry
        (:func:`_check_source`). A ``ref`` without ``:`` is an entry name, which is never
        imported: the module declaring it must be imported already.
        """
        module_name, sep, qualname = ref.rpartition(":")
        if not sep and ref and re.fullmatch(_NAME, ref):
            raise EntryNotAllowedError(
                f"the stored run's entry is named {ref!r}, and no entry of that name is "
                "declared in this process; import the module that declares it "
                f"(@agency.entry(name={ref!r}) or "
                f"agency.register_entry(fn, name={ref!r})) with `--import MODULE` "
                f"(agency runs resume/respond) or {IMPORTS_ENV}=MODULE"
            )
        if not sep or not module_name or not qualname:
            raise EntryImportError(
                f"{ref!r} is not an entry reference of the form 'module:qualname'"
            )
        if "<locals>" in qualname or "<lambda>" in qualname:
            raise EntryImportError(
                f"the entry {ref!r} was defined inside a function (or is a lambda), so a new "
                "process cannot import it; resume the run in the process that started it, or "
                "define the entry at module level"
            )
        script = _is_script(module_name)
        if script:
            self._check_script(ref, module_name)
        else:
            self._check_module(ref, module_name)
        _check_source(ref, module_name, qualname, script=script)
        try:
            module = _import_script(module_name) if script else importlib.import_module(module_name)
            target: Any = module
            for part in qualname.split("."):
                target = getattr(target, part)
        except EntryImportError:
            raise
        except Exception as exc:
            if _ran_a_loop(exc):
                raise _own_loop(module_name, exc) from exc
            raise EntryImportError(
                f"cannot import the entry {ref!r} ({type(exc).__name__}: {exc}); make sure the "
                "module is importable here (installed, or on sys.path / PYTHONPATH)"
            ) from exc
        if not callable(target):
            raise EntryImportError(
                f"the entry {ref!r} is a {type(target).__name__}, not a callable"
            )
        if not self.is_declared(target):
            raise EntryNotAllowedError(
                f"the stored entry {ref!r} is not declared as an entry, so it is not run (the "
                f"store is data, never code). To allow it, {_HOW_TO_DECLARE}"
            )
        return target  # type: ignore[no-any-return]


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


def _is_script(module_name: str) -> bool:
    return module_name.endswith(".py") or os.sep in module_name or "/" in module_name


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


_LOOP_IN_LOOP = (
    "Already running",  # anyio.run
    "cannot be called from a running event loop",  # asyncio.run
    "event loop is already running",  # loop.run_until_complete
    "from inside a run()",  # trio.run
)


def _ran_a_loop(exc: BaseException) -> bool:
    """Whether ``exc`` is an event loop started inside the running one (by an import)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, EventLoopRunningError) or (
            isinstance(current, RuntimeError) and any(m in str(current) for m in _LOOP_IN_LOOP)
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


def _own_loop(module: str, exc: BaseException) -> EntryImportError:
    return EntryImportError(
        f"importing the application module {module!r} ran its top-level code, which starts "
        "an event loop of its own (asyncio.run, anyio.run or agency.run_sync) inside the "
        f"running one ({type(exc).__name__}: {exc}). Put the code that runs the script under "
        '`if __name__ == "__main__":`, so that importing it only declares its entries'
    )


def _check_source(ref: str, module_name: str, qualname: str, *, script: bool) -> None:
    """Refuse ``ref`` before its module is imported, unless importing it runs no code that has
    not run already, or the module's source declares ``qualname`` as an entry.

    Already imported (a module named with ``--import`` / ``AGENCY_IMPORTS`` is, up front), or
    one of our own packages: nothing new runs. Otherwise the source is read with :mod:`ast`,
    never executed; only a module that declares the entry is then imported.
    """
    if script:
        if _script_module_name(module_name) in sys.modules:
            return
    elif module_name in sys.modules or module_name.partition(".")[0] in OWN_PACKAGES:
        return
    from . import _entry_source  # on first use: it loads ast

    source = _resolved(module_name) if script else _entry_source.module_source(module_name)
    if source is None or source.suffix != ".py":
        why = f"its Python source ({source or 'none found'}) cannot be read without running it"
        raise _refuse_module(ref, module_name, why)
    try:
        declared = _entry_source.declares(source, qualname)
    except (OSError, SyntaxError, ValueError) as exc:
        why = f"its source {source} cannot be read ({type(exc).__name__}: {exc})"
        raise _refuse_module(ref, module_name, why) from exc
    if not declared:
        raise EntryNotAllowedError(
            f"the stored entry {ref!r} is not declared as an entry in {source} (read without "
            "running it), so the module was not imported and nothing ran (the store is data, "
            f"never code). To allow it, {_HOW_TO_DECLARE}"
        )


def _script_module_name(path: str) -> str:
    """The name the script ``path`` is loaded under (in ``sys.modules``) by the runtime."""
    import hashlib  # on first use: it loads OpenSSL, which importing agency_runtime needs not

    path = os.path.abspath(path)
    return "_agency_entry_" + hashlib.blake2b(path.encode(), digest_size=8).hexdigest()


def _import_script(path: str) -> ModuleType:
    """Load the script ``path`` as a module (its ``if __name__ == "__main__"`` block does not
    run), once per process."""
    path = os.path.abspath(path)
    name = _script_module_name(path)
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
