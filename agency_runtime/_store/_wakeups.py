"""Wake-ups for whoever waits on runs: a broadcast any thread can ring, any event loop can await.

A store keeps one :class:`Wakeups`. It rings it when this process queues, answers for a
worker, hands back or finishes a run, and a store with notifications (PostgreSQL's
LISTEN/NOTIFY) rings it from its listener thread when another process did. Waiters are tasks
of any event loop (asyncio or trio, in any thread); :meth:`Wakeups.wait` returns on the next
ring or after its timeout, whichever is first — or at once, when a ring came since the same
task's last wait returned or it began to look (:meth:`Wakeups.looking`: a worker's claim): a
waiter looks at the store between two waits (a worker claims, reads when runs fall due), and
a ring while it looked would otherwise wake nobody, leaving the run it announced for the next
poll.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel

__all__ = ["Wakeups"]

_REMEMBERED_TASKS = 256
"""How many tasks' last returns :class:`Wakeups` remembers (the least recent forgotten: such
a task's next wait only waits for the next ring, as its first does)."""


class Wakeups:
    """A broadcast: :meth:`ring` (from any thread) wakes every task in :meth:`wait`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: list[tuple[Callable[[Callable[[], object]], object], anyio.Event]] = []
        self._rung = 0
        """How many times :meth:`ring` was called."""
        self._seen: OrderedDict[int, int] = OrderedDict()
        """A task's id → :attr:`_rung` when its last :meth:`wait` returned."""

    def ring(self) -> None:
        """Wake every waiting task (without blocking: each loop sets its event itself), and
        let each task that is not waiting now return at once from its next wait."""
        with self._lock:
            self._rung += 1
            waiters, self._waiters = self._waiters, []
        for soon, event in waiters:
            try:
                soon(event.set)
            except Exception:  # that loop has ended: nobody waits there any more
                pass

    async def wait(self, timeout: float) -> None:
        """Return on the next :meth:`ring`, or after ``timeout`` seconds (real time); at once
        if a ring came since this task's last wait returned (it may have missed it)."""
        task = anyio.get_current_task().id
        event = anyio.Event()
        native: Any = anyio.lowlevel.current_token().native_token
        # How another thread hands the waiter's loop a call: an asyncio loop's
        # call_soon_threadsafe, a trio token's run_sync_soon (told apart without importing
        # asyncio, which a trio program never needs).
        soon = getattr(native, "call_soon_threadsafe", None) or native.run_sync_soon
        entry = (soon, event)
        with self._lock:  # checked and registered at once: no ring falls in between
            if self._seen.get(task, self._rung) != self._rung:
                self._sees_all(task)
                return
            self._waiters.append(entry)
        try:
            with anyio.move_on_after(timeout):
                await event.wait()
        finally:
            with self._lock:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                self._sees_all(task)

    def looking(self) -> None:
        """The calling task looks at the store now (a worker claims): a ring from now on
        ends its next :meth:`wait` at once, also before its first wait."""
        task = anyio.get_current_task().id
        with self._lock:
            self._sees_all(task)

    def _sees_all(self, task: int) -> None:
        """Note (under the lock) that what ``task`` looks at next includes every ring so far:
        its wait returns now, or it begins to look."""
        self._seen[task] = self._rung
        self._seen.move_to_end(task)
        if len(self._seen) > _REMEMBERED_TASKS:
            self._seen.popitem(last=False)
