"""Time, from one injectable clock.

Everything that reads or waits for time — leases and their renewal, waiting for another
holder, guards, conversation-memory TTLs, retry backoff — asks a :class:`Clock`: the
runtime's (:data:`SYSTEM_CLOCK` unless configured otherwise), carried by each run's context
and given to the stores. Tests pass :class:`agency_runtime.testing.FakeClock` instead and
move time by hand, so a test of a 30-second lease or a 2-hour wait runs in milliseconds
without sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import anyio

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Where time comes from."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (stored times, leases, TTLs)."""
        ...

    def monotonic(self) -> float:
        """Seconds of a clock that never goes back (elapsed time, guards)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time (cancellable)."""
        ...


class SystemClock:
    """The machine's clocks: ``time.time``, ``time.monotonic`` and ``anyio.sleep``."""

    __slots__ = ()

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)

    def __repr__(self) -> str:
        return "<SystemClock>"


SYSTEM_CLOCK = SystemClock()
"""The clock used unless one is configured."""
