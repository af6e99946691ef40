"""The bounds of every number a user can give, checked once, before anything is stored.

A number past these bounds is refused with :class:`InvalidArgumentError` naming what was
wrong and the allowed range: ``every=1e308`` would otherwise be stored and break every later
read of the schedule (its next time is past any date), ``timeout=nan`` would never end, a
``limit`` of ``2**70`` would overflow a SQL integer. The same checks serve the library and
the command line (whose options report the same message as a usage error).
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from ._errors import InvalidArgumentError

__all__ = [
    "EARLIEST_TIME",
    "LATEST_TIME",
    "MAX_INT",
    "MAX_SECONDS",
    "check_duration",
    "check_seconds",
    "check_whole",
    "shown",
]

MAX_SECONDS = 100 * 365.25 * 86_400
"""The longest duration anything may last or wait, in seconds: 100 years (timeouts, sleeps,
schedule intervals, leases, polls, time guards)."""

EARLIEST_TIME = -62_135_510_400.0
"""The earliest stored time (seconds since the epoch) that can be read back: 0001-01-02 UTC,
a day inside what a ``datetime`` can show in any time zone."""

LATEST_TIME = 253_402_214_400.0
"""The latest stored time that can be read back: 9999-12-31 UTC (a day inside ``datetime``'s
range, for any time zone)."""

MAX_INT = 2**63 - 1
"""The largest whole number a store's integer column holds (SQLite's, PostgreSQL's BIGINT)."""


def shown(value: object, width: int = 40) -> str:
    """``repr(value)``, cut to ``width`` characters: a message quotes a value, never a wall."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def check_seconds(
    value: object,
    what: str,
    *,
    positive: bool = False,
    low: float = 0.0,
    high: float = MAX_SECONDS,
) -> float:
    """``value`` (a number of seconds or a ``timedelta``) as a float, when it is finite and
    from ``low`` to ``high`` (above 0 when ``positive``); else an InvalidArgumentError that
    names ``what`` and the range."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not low <= seconds <= high
        or (positive and seconds <= 0)
    ):
        floor = "> 0" if positive and low <= 0 else f">= {_number(low)}"
        years = f" ({high / MAX_SECONDS * 100:g} years)" if high >= 86_400 * 365 else ""
        raise InvalidArgumentError(
            f"{what} must be a number of seconds {floor} and <= {_number(high)}{years}, "
            f"got {shown(value)}"
        )
    return float(seconds)


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*", re.IGNORECASE)


def check_duration(value: object, what: str) -> float:
    """``value`` as seconds (>= 0, at most :data:`MAX_SECONDS`): a number of seconds, a
    ``timedelta``, or a string of a number and a unit, ``s``, ``m``, ``h`` or ``d``
    (``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``; a bare number is seconds); else an
    InvalidArgumentError that names ``what``, what was wrong and what to write."""
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match is None:
            raise InvalidArgumentError(
                f"{what} must be a duration like '30d', '12h', '90m' or '45s' (a number and "
                f"a unit: d days, h hours, m minutes, s seconds), got {shown(value)}"
            )
        number, unit = match.groups()
        seconds = float(number) * _UNITS[unit.lower() or "s"]
        if not seconds <= MAX_SECONDS:
            raise InvalidArgumentError(
                f"{what} must be at most 36525d (100 years), got {shown(value)}"
            )
        return seconds
    if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
        raise InvalidArgumentError(
            f"{what} must be a number of seconds, a datetime.timedelta or a duration like "
            f"'30d', '12h', '90m' or '45s', got {shown(value)}"
        )
    return check_seconds(value, what)


def _number(value: float) -> str:
    """``3155760000`` rather than ``3.15576e+09``: a whole bound in full."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


def check_whole(value: object, what: str, low: int, high: int = MAX_INT) -> int:
    """``value`` when it is a whole number from ``low`` to ``high``; else an
    InvalidArgumentError that names ``what`` and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(
            f"{what} must be a whole number from {low} to {high}, got {shown(value)}"
        )
    return value
