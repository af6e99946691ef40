"""Whether a module declares an entry, read from its source without running it.

A stored run names its entry ``module:qualname``; before the runtime imports a module for it
that this process has not imported yet (which runs the module's top-level code), it reads the
module's source with :mod:`ast` and imports it only when the source declares ``qualname`` as
an entry (DESIGN §10.2, *Trust model of the store*). Loaded on first use by
:mod:`agency_runtime._durable._entries`, so ``import agency_runtime`` does not load ``ast``.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["declares", "module_source"]

_DECLARERS = frozenset({"entry", "register_entry"})
"""The names that declare an entry: ``agency.entry`` and ``agency.register_entry``."""


def module_source(module_name: str) -> Path | None:
    """The source file of ``module_name``, found without importing it or its parent packages.

    ``None`` when it cannot be found, or has no file of its own (a namespace package, a
    built-in module).
    """
    parts = module_name.split(".")
    name = parts[0]
    try:
        spec = importlib.util.find_spec(name)  # a top-level name: nothing runs
        for part in parts[1:]:
            if spec is None:
                return None
            parent = sys.modules.get(name)
            search = (
                getattr(parent, "__path__", None)
                if parent is not None
                else spec.submodule_search_locations
            )
            if search is None:  # the parent is a module, not a package
                return None
            name = f"{name}.{part}"
            spec = importlib.machinery.PathFinder.find_spec(name, list(search))
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.has_location or not spec.origin:
        return None
    return Path(spec.origin)


def declares(path: Path, qualname: str) -> bool:
    """Whether the Python source ``path`` declares ``qualname`` as an entry when imported.

    It does when a function of that qualname defined by the code that runs on import (the
    module's top level, its classes, ``if``/``try``/``with`` blocks, but not an ``if __name__ ==
    "__main__":`` block) is decorated with ``entry`` or ``register_entry`` (``@agency.entry``,
    ``@agency.entry(name=...)``), or when a top-level statement calls one of them with it
    (``agency.register_entry(fn)``). Raises ``OSError``, ``SyntaxError`` or ``ValueError`` when
    the source cannot be read or parsed.
    """
    tree = ast.parse(importlib.util.decode_source(path.read_bytes()), filename=str(path))
    top = list(_on_import(tree.body))
    for statement in top:
        if isinstance(statement, ast.Expr | ast.Assign | ast.AnnAssign) and statement.value:
            for node in ast.walk(statement.value):
                if (
                    isinstance(node, ast.Call)
                    and node.args
                    and _declarer(node.func)
                    and _dotted(node.args[0]) == qualname
                ):
                    return True
    *owners, name = qualname.split(".")
    body = top
    for owner in owners:
        classes = [s for s in body if isinstance(s, ast.ClassDef) and s.name == owner]
        if not classes:
            return False
        body = list(_on_import(classes[-1].body))
    defined = [
        s for s in body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == name
    ]
    return bool(defined) and any(_declarer(d) for d in defined[-1].decorator_list)


def _on_import(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` that run when it runs, with those of its nested blocks."""
    for statement in body:
        yield statement
        if isinstance(statement, ast.If):
            if not _is_main_check(statement.test):
                yield from _on_import(statement.body)
            yield from _on_import(statement.orelse)
        elif isinstance(statement, ast.Try | ast.TryStar):
            yield from _on_import(statement.body)
            for handler in statement.handlers:
                yield from _on_import(handler.body)
            yield from _on_import(statement.orelse)
            yield from _on_import(statement.finalbody)
        elif isinstance(statement, ast.With | ast.AsyncWith):
            yield from _on_import(statement.body)


def _is_main_check(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round): a block an import never runs."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and len(test.comparators) == 1
    ):
        return False
    sides = {_dotted(test.left), _dotted(test.comparators[0])}
    values = {
        side.value for side in (test.left, test.comparators[0]) if isinstance(side, ast.Constant)
    }
    return "__name__" in sides and "__main__" in values


def _declarer(node: ast.expr) -> bool:
    """Whether ``node`` is ``entry`` / ``register_entry`` (``agency.entry``, ``entry``), or a
    call of one with options only (``agency.entry(name="refund")``)."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id in _DECLARERS
    return isinstance(node, ast.Attribute) and node.attr in _DECLARERS


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a name or an attribute chain of names, else ``None``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None
