"""Wake-ups for whoever waits on runs: a broadcast any thread can ring, any event loop can await.

A store keeps one :class:`Wakeups`. It rings it when this process queues, answers for a
worker, hands back or finishes a run, and a store with notifications (PostgreSQL's
LISTEN/NOTIFY) rings it from its listener thread when another process did. Waiters are tasks
of any event loop (asyncio or trio, in any thread); :meth:`Wakeups.wait` returns on the next
ring or after its timeout, whichever is first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel

__all__ = ["Wakeups"]


class Wakeups:
    """A broadcast: :meth:`ring` (from any thread) wakes every task in :meth:`wait`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: list[tuple[Callable[[Callable[[], object]], object], anyio.Event]] = []

    def ring(self) -> None:
        """Wake every waiting task (without blocking: each loop sets its event itself)."""
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for soon, event in waiters:
            try:
                soon(event.set)
            except Exception:  # that loop has ended: nobody waits there any more
                pass

    async def wait(self, timeout: float) -> None:
        """Return on the next :meth:`ring`, or after ``timeout`` seconds (real time)."""
        event = anyio.Event()
        native: Any = anyio.lowlevel.current_token().native_token
        # How another thread hands the waiter's loop a call: an asyncio loop's
        # call_soon_threadsafe, a trio token's run_sync_soon (told apart without importing
        # asyncio, which a trio program never needs).
        soon = getattr(native, "call_soon_threadsafe", None) or native.run_sync_soon
        entry = (soon, event)
        with self._lock:
            self._waiters.append(entry)
        try:
            with anyio.move_on_after(timeout):
                await event.wait()
        finally:
            with self._lock:
                if entry in self._waiters:
                    self._waiters.remove(entry)
