"""Small helpers shared by turn_kit's modules: sync-or-async callbacks and duck-typed fields."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

__all__ = ["field", "maybe_await"]


async def maybe_await(value: Any) -> Any:
    """``value``, awaited first when it is awaitable (callbacks may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value


def field(value: object, name: str) -> Any:
    """``value[name]`` for a mapping, else ``value.name`` (``None`` when absent)."""
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)
