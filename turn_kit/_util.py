"""Small helpers shared by turn_kit's modules: sync-or-async callbacks and duck-typed fields."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

__all__ = ["check_reply_options", "field", "maybe_await"]


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


def check_reply_options(*, chunk_limit: object, stream: object, stream_interval: object) -> None:
    """Refuse an adapter's reply options that are not what they must be, saying why
    (``chunk_limit`` a positive integer, ``stream`` a bool, ``stream_interval`` seconds)."""
    from agency_runtime import InvalidArgumentError

    if isinstance(chunk_limit, bool) or not isinstance(chunk_limit, int) or chunk_limit < 1:
        raise InvalidArgumentError(f"chunk_limit must be a positive integer, got {chunk_limit!r}")
    if not isinstance(stream, bool):
        raise InvalidArgumentError(f"stream must be True or False, got {stream!r}")
    if (
        isinstance(stream_interval, bool)
        or not isinstance(stream_interval, int | float)
        or not stream_interval >= 0
    ):
        raise InvalidArgumentError(
            f"stream_interval must be a number of seconds >= 0, got {stream_interval!r}"
        )
