"""Cancellation: the :class:`AbortSignal` of a run or branch, bridged to anyio.

A run's signal fires on ``ctx.cancel()``; a branch's follows its parent's; a time guard's
fires when its time is up. Code can poll it, await it or subscribe to it, and
:func:`cancelled_by` binds it to an anyio cancel scope, so awaiting code stops when it fires.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

import anyio

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import AgencyCancelledError

__all__ = ["AbortSignal", "abort_reason", "cancelled_by"]


class AbortSignal:
    """A one-shot cancellation flag that code can poll, await or subscribe to.

    A signal made with a ``parent`` fires when the parent fires, so a branch's signal
    follows the run's. Firing is idempotent: the first reason wins.
    """

    __slots__ = (
        "_aborted",
        "_callbacks",
        "_clock",
        "_deadline",
        "_event",
        "_expire",
        "_lock",
        "_parent",
        "_reason",
    )

    def __init__(self, parent: AbortSignal | None = None, *, clock: Clock | None = None) -> None:
        self._aborted = False
        self._reason: BaseException | None = None
        self._callbacks: list[Callable[[BaseException], None]] = []
        self._event: anyio.Event | None = None
        self._lock = threading.Lock()
        self._parent = parent
        self._deadline: float | None = None
        self._expire: Callable[[], BaseException] | None = None
        self._clock: Clock = (
            clock if clock is not None else (parent._clock if parent is not None else SYSTEM_CLOCK)
        )
        if parent is not None:
            parent.add_callback(self.abort)

    def set_deadline(self, deadline: float, expire: Callable[[], BaseException]) -> None:
        """Fire at ``deadline`` (the clock's monotonic seconds) with the reason ``expire()``.

        The signal fires when it is next looked at after the deadline (``aborted``,
        ``reason``, ``raise_if_aborted``, ``wait``): no timer thread is involved.
        """
        self._deadline = deadline
        self._expire = expire

    def _next_deadline(self) -> float | None:
        deadlines = []
        signal: AbortSignal | None = self
        while signal is not None:
            if signal._deadline is not None:
                deadlines.append(signal._deadline)
            signal = signal._parent
        return min(deadlines) if deadlines else None

    @property
    def aborted(self) -> bool:
        """Whether the signal has fired (a passed deadline or a fired parent fires it now)."""
        if self._aborted:
            return True
        if self._deadline is not None and self._clock.monotonic() >= self._deadline:
            self.abort(self._expire() if self._expire is not None else None)
            return True
        parent = self._parent
        if parent is not None and parent.aborted:
            self.abort(parent.reason)
            return True
        return False

    @property
    def reason(self) -> BaseException | None:
        """The exception describing why the signal fired, or ``None`` while it has not."""
        return self._reason if self.aborted else None

    def abort(self, reason: BaseException | None = None) -> None:
        """Fire the signal (idempotent). ``reason`` defaults to ``AgencyCancelledError``."""
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            self._reason = reason if reason is not None else AgencyCancelledError()
            callbacks, self._callbacks = self._callbacks, []
            event = self._event
        if event is not None:
            event.set()
        for callback in callbacks:
            callback(self._reason)

    def add_callback(self, callback: Callable[[BaseException], None]) -> Callable[[], None]:
        """Call ``callback(reason)`` when the signal fires (at once if it already has).

        Returns a function that unsubscribes the callback.
        """
        with self._lock:
            if not self._aborted:
                self._callbacks.append(callback)
                return lambda: self._remove(callback)
        assert self._reason is not None
        callback(self._reason)
        return lambda: None

    def _remove(self, callback: Callable[[BaseException], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def raise_if_aborted(self) -> None:
        """Raise the abort reason if the signal has fired; do nothing otherwise."""
        if self.aborted:
            assert self._reason is not None
            raise self._reason

    async def wait(self) -> BaseException:
        """Wait until the signal fires and return its reason."""
        while not self.aborted:
            with self._lock:
                if self._event is None:
                    self._event = anyio.Event()
                event = self._event
            deadline = self._next_deadline()
            if deadline is None:
                await event.wait()
            else:
                await _first(event.wait(), self._clock.sleep(deadline - self._clock.monotonic()))
        assert self._reason is not None
        return self._reason

    def __repr__(self) -> str:
        state = f"aborted reason={self._reason!r}" if self._aborted else "pending"
        return f"<AbortSignal {state}>"


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    """Wait until the first of ``waits`` is done (the others are cancelled)."""
    async with anyio.create_task_group() as group:

        async def one(wait: Coroutine[Any, Any, Any]) -> None:
            await wait
            group.cancel_scope.cancel()

        for wait in waits:
            group.start_soon(one, wait)


class cancelled_by:  # lower case: it is used like the function it was
    """A cancel scope that is cancelled when ``signal`` fires (also if it fired already).

    A class rather than a generator-based context manager: every LLM request opens one.
    """

    __slots__ = ("_scope", "_signal", "_unsubscribe")

    def __init__(self, signal: AbortSignal) -> None:
        self._signal = signal
        self._scope = anyio.CancelScope()
        self._unsubscribe: Callable[[], None] | None = None

    def __enter__(self) -> anyio.CancelScope:
        scope = self._scope.__enter__()
        self._unsubscribe = self._signal.add_callback(lambda _reason: scope.cancel())
        return scope

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        try:
            if unsubscribe is not None:
                unsubscribe()
        finally:
            suppressed = self._scope.__exit__(kind, error, traceback)
        return bool(suppressed)


def abort_reason(signal: AbortSignal) -> BaseException:
    """Why ``signal`` fired (an :class:`AgencyCancelledError` when it gave no reason)."""
    reason = signal.reason
    return reason if reason is not None else AgencyCancelledError()
