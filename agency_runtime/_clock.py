"""Time, from one injectable clock.

Everything that reads or waits for time — leases and their renewal, waiting for another
holder, guards, conversation-memory TTLs, retry backoff — asks a :class:`Clock`: the
runtime's (:data:`SYSTEM_CLOCK` unless configured otherwise), carried by each run's context
and given to the stores. Tests pass :class:`agency_runtime.testing.FakeClock` instead and
move time by hand, so a test of a 30-second lease or a 2-hour wait runs in milliseconds
without sleeping.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import anyio
import anyio.lowlevel

__all__ = ["SYSTEM_CLOCK", "Clock", "FakeClock", "SystemClock"]


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
        """Wait ``seconds`` of this clock's time (cancellable); ``seconds <= 0`` only yields."""
        ...


class SystemClock:
    """The machine's clocks: ``time.time``, ``time.monotonic`` and ``anyio.sleep``."""

    __slots__ = ()

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(0.0, seconds))  # a time already past: no wait (as FakeClock)

    def __repr__(self) -> str:
        return "<SystemClock>"


SYSTEM_CLOCK = SystemClock()
"""The clock used unless one is configured."""


class FakeClock:
    """A clock that moves only when told: :meth:`advance` (for tests).

    ``time()`` starts at ``start`` (seconds since the epoch), ``monotonic()`` at 0. A task
    that sleeps waits until enough fake time has been advanced; timers set with
    :meth:`call_at` (time guards use them) fire during :meth:`advance`, in time order. So a
    test of a 30-second lease, a 10-second time guard or a 2-hour wait runs at once:
    ``clock.advance(7200)``.
    """

    __slots__ = ("_monotonic", "_offset", "_sequence", "_waiting")

    def __init__(self, start: float = 1_767_225_600.0) -> None:
        self._offset = float(start)
        self._monotonic = 0.0
        self._sequence = 0
        self._waiting: list[tuple[float, int, Callable[[], None]]] = []

    def time(self) -> float:
        return self._offset + self._monotonic

    def monotonic(self) -> float:
        return self._monotonic

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        cancel = self.call_at(self._monotonic + seconds, event.set)
        try:
            await event.wait()
        finally:
            cancel()

    def call_at(self, when: float, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` once the monotonic time reaches ``when``; return a canceller."""
        self._sequence += 1
        item = (float(when), self._sequence, callback)
        heapq.heappush(self._waiting, item)

        def cancel() -> None:
            try:
                self._waiting.remove(item)
                heapq.heapify(self._waiting)
            except ValueError:
                pass  # fired already

        return cancel

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking every sleeper and timer now due."""
        if seconds < 0 or math.isnan(seconds):
            raise ValueError(f"a clock only moves forward, got {seconds!r}")
        target = self._monotonic + seconds
        while self._waiting and self._waiting[0][0] <= target:
            when, _, callback = heapq.heappop(self._waiting)
            self._monotonic = max(self._monotonic, when)
            callback()
        self._monotonic = target

    @property
    def sleepers(self) -> int:
        """How many sleeps and timers wait for time to move."""
        return len(self._waiting)

    def __repr__(self) -> str:
        return f"<FakeClock monotonic={self._monotonic} waiting={len(self._waiting)}>"
