"""Recorded failures: the exception kinds a journaled unit may commit as its outcome.

A feature whose unit can end in a failure that code catches (an LLM call that failed after
its retries, a wait for an event that timed out) registers the kind when its module is
imported: :func:`register_failure` with what the kind stores besides its message and how to
rebuild it. The feature replays its own units, so its module (and the registration) is
loaded before any of its recorded failures is decoded. The stored JSON is
``{"type": <class name>, "message": <str(exc)>, <fields>…}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic_core import from_json, to_json

__all__ = ["decode_failure", "encode_failure", "register_failure"]

E = TypeVar("E", bound=Exception)

_FIELDS: dict[type[Exception], Callable[[Any], dict[str, Any]]] = {}
"""What each registered kind stores besides its type and message."""

_DECODERS: dict[str, Callable[[str, dict[str, Any]], Exception]] = {}
"""Recorded type name → the function rebuilding the failure from its message and data."""


def register_failure(
    kind: type[E],
    fields: Callable[[E], dict[str, Any]],
    decode: Callable[[str, dict[str, Any]], E],
) -> None:
    """Let units record ``kind``: ``fields(exc)`` is stored with its message (a subclass not
    registered itself stores the fields of its nearest registered base), and
    ``decode(message, data)`` rebuilds it from the stored data."""
    _FIELDS[kind] = fields
    _DECODERS[kind.__name__] = decode


def encode_failure(exc: Exception) -> str:
    """The JSON text ``exc`` is journaled as."""
    data: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    for cls in type(exc).__mro__:
        fields = _FIELDS.get(cls)
        if fields is not None:
            data.update(fields(exc))
            break
    return to_json(data).decode()


def decode_failure(text: str) -> Exception:
    """The failure journaled as ``text``; ValueError (or KeyError, TypeError) if unreadable."""
    data = from_json(text)
    kind = str(data["type"])
    decode = _DECODERS.get(kind)
    if decode is None:
        raise ValueError(f"unknown recorded failure {kind!r}")
    return decode(str(data["message"]), data)
