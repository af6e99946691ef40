"""What may be stored: values JSON holds faithfully, checked before anything is written.

Everything a run stores (arguments, step results, locals, values, interrupt data and
answers) goes through JSON. Some Python values would come back as something else without a
word: a set as a list, bytes as text, ``NaN`` as a non-standard token, ``{1: "a"}`` as
``{"1": "a"}``. Those are refused at the moment they are stored, naming where the value sits.

Accepted, and documented as round trips: ``None``, booleans, integers, finite floats,
strings, lists, dicts with string keys, pydantic models and dataclasses (their own
serialization; revived when the step or entry is annotated), tuples (come back as lists),
``datetime``/``date``/``time``/``timedelta``/``UUID``/``Decimal``/``Enum`` values (come back
as strings or their value; revived when annotated).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import math
import uuid
from typing import Any

from pydantic import BaseModel

__all__ = ["MAX_DEPTH", "check_text", "is_plain", "json_problem"]

MAX_DEPTH = 200
"""The deepest nesting of lists and dicts a stored value may have."""

_TRUSTED = (
    BaseModel,
    enum.Enum,
    dt.datetime,
    dt.date,
    dt.time,
    dt.timedelta,
    uuid.UUID,
    decimal.Decimal,
)


def _where(path: list[str | int]) -> str:
    if not path:
        return ""
    return " at " + "".join(f"[{p!r}]" for p in path)


_LEAVES = frozenset({str, int, bool, type(None)})
"""Types whose values are always stored faithfully (exactly these: not subclasses)."""

# The isinstance checks' types, as tuples made once: ``isinstance(x, int | str)`` builds
# a union on every evaluation, and a step's result is checked on every step.
_SCALARS = (bool, int, str)
_SEQUENCES = (list, tuple)
_SETS = (set, frozenset)
_BINARIES = (bytes, bytearray, memoryview)


def is_plain(value: Any) -> bool:
    """Whether ``value`` is a str, int, bool or None, or a flat dict of them with string keys
    (exactly these types: no subclasses): JSON data whose JSON round trip gives back an equal
    value of the same types. The common results, checked in one pass."""
    kind = type(value)
    if kind in _LEAVES:
        return True
    if kind is not dict:
        return False
    for key, inner in value.items():
        if type(key) is not str or type(inner) not in _LEAVES:
            return False
    return True


def json_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored faithfully as JSON, or ``None`` when it can."""
    if is_plain(value):  # without the walk's stack and paths (anything else takes the walk)
        return None
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        item, path = stack.pop()
        if item is None or isinstance(item, _SCALARS):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"the float {item!r}{_where(path)} is not a JSON number"
            continue
        if len(path) >= MAX_DEPTH:
            return f"it is nested more than {MAX_DEPTH} levels deep{_where(path[:3])}…"
        # A plain string, integer, boolean or None inside is fine at any depth: it is not
        # pushed (nor its path built), which is most of what a step's result holds.
        if isinstance(item, _SEQUENCES):
            stack.extend((v, [*path, i]) for i, v in enumerate(item) if type(v) not in _LEAVES)
            continue
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    return (
                        f"the dict{_where(path)} has a {type(key).__name__} key {key!r}; JSON "
                        "keys are strings (it would come back as a string)"
                    )
                if type(inner) not in _LEAVES:
                    stack.append((inner, [*path, key]))
            continue
        if isinstance(item, _TRUSTED):
            continue
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            continue
        kind = type(item).__name__
        if isinstance(item, _SETS):
            return f"the {kind}{_where(path)} would come back as a list; store a list"
        if isinstance(item, _BINARIES):
            return f"the {kind}{_where(path)} is not JSON; store text (e.g. base64) instead"
        return f"the {kind} object{_where(path)} is not JSON data"
    return None


def check_text(text: str, what: str) -> None:
    """Raise ``InvalidArgumentError`` when ``text`` cannot be stored (not valid UTF-8).

    A lone surrogate (``"\\ud800"``, e.g. from a JSON escape) is the one way a Python string
    is not: it would fail deep inside the store instead of here.
    """
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        from .._errors import InvalidArgumentError

        bad = text[exc.start : exc.end]
        raise InvalidArgumentError(
            f"{what} holds a lone surrogate ({bad!r} at position {exc.start}), which is not "
            "valid UTF-8 and cannot be stored; replace it (e.g. text.encode('utf-8', "
            "'replace').decode())"
        ) from None


def check_name(
    value: object, what: str, example: str, *, limit: int = 200, without: str = ""
) -> str:
    """``value`` when it is a usable name (a queue, an event, a schedule, a change id); else
    an ``InvalidArgumentError`` saying what ``what`` must be, with ``example``.

    Usable: a non-empty string of at most ``limit`` printable characters (no control
    characters), storable as UTF-8, holding none of the characters in ``without``.
    """
    if (
        not isinstance(value, str)
        or not value.strip()
        or len(value) > limit
        or any(ord(c) < 32 for c in value)
        or any(c in value for c in without)
    ):
        from .._errors import InvalidArgumentError

        extra = f" without {', '.join(repr(c) for c in without)}" if without else ""
        raise InvalidArgumentError(
            f"{what} must be a non-empty string of at most {limit} printable characters"
            f"{extra}, like {example!r}, got {value!r:.80}"
        )
    check_text(value, what)
    return value
