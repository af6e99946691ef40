"""``define_turn_persona``: a pass-through persona factory that insists on enabled memory."""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import Any, TypeVar

from agency_runtime import InvalidArgumentError

__all__ = ["define_turn_persona"]

P = TypeVar("P")

_MESSAGE = "turn persona requires enabled memory with at least one scope"
_MISSING = object()


def _get(value: object, key: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(key, _MISSING)
    return getattr(value, key, _MISSING)


def define_turn_persona(persona: P) -> P:
    """Return ``persona`` itself after checking that its memory is enabled.

    ``persona`` is a dict or an object with a ``memory`` key or attribute: ``True``, or a
    dict / object with optional ``enabled`` and ``scopes``. Every other persona choice is
    left to the application. As in the seed, only ``enabled=False`` and an empty
    ``scopes`` are rejected (``memory=False`` passes, as it does at runtime in the seed).

    Raises:
        InvalidArgumentError: ``memory`` is missing or ``None``, has ``enabled`` false, or
            has an empty ``scopes``.
    """
    memory = _get(persona, "memory")
    if memory is _MISSING or memory is None:
        raise InvalidArgumentError(f"{_MESSAGE}; the persona has no memory")
    if memory is True:
        return persona
    enabled = _get(memory, "enabled")
    scopes = _get(memory, "scopes")
    empty_scopes = isinstance(scopes, Sized) and not isinstance(scopes, str) and len(scopes) == 0
    if enabled is False or empty_scopes:
        raise InvalidArgumentError(_MESSAGE)
    return persona
