"""A pool of psycopg ``AsyncConnection`` objects for the PostgreSQL store's asyncio path.

psycopg_pool's ``AsyncConnectionPool`` belongs to the event loop that opened it (its workers
are tasks of that loop, and closing it needs that loop running), while a store outlives event
loops: one process may ``anyio.run`` several in turn, or run loops in several threads, on one
cached store. An ``AsyncConnection`` belongs to no loop (each wait asks for the running one),
so this pool keeps its idle connections under a thread lock, for any asyncio loop to take,
and has no task of its own: a connection is opened when one is needed and none is idle (up
to ``max_size``), checked with a round trip before reuse when it was idle longer than
``check_after`` seconds (a server restart, a pooler or a firewall that dropped it), and
closed instead of kept when it comes back broken, closed or not idle (a statement cut off
mid-way). A caller finding ``max_size`` connections in use waits, up to ``timeout``
seconds, for one to come back; then psycopg_pool's ``PoolTimeout`` (an ``OperationalError``,
as the thread path's pool raises) says so.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    AConn = psycopg.AsyncConnection[tuple[Any, ...]]

__all__ = ["AsyncPool"]

_RETRY_WAIT = 0.1
"""A waiter looks again at least this often (seconds), should a wake-up have gone astray."""


class AsyncPool:
    """Connections made by ``connect``, shared by every asyncio loop of the process."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[AConn]],
        *,
        max_size: int,
        timeout: float,
        check_after: float,
        name: str,
    ) -> None:
        self._connect = connect
        self._max_size = max(1, max_size)
        self._timeout = timeout
        self._check_after = check_after
        self.name = name
        self._lock = threading.Lock()
        self._idle: list[tuple[AConn, float]] = []  # (connection, when it came back); LIFO
        self._size = 0  # connections open, or being opened, by this pool
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self._closed = False

    async def get(self) -> AConn:
        """A connection for the calling task alone, until it is :meth:`put` back."""
        from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

        deadline: float | None = None
        woken = False
        while True:
            idle: tuple[AConn, float] | None = None
            waiter: asyncio.Future[None] | None = None
            with self._lock:
                if self._closed:
                    raise PoolClosed(f"the pool {self.name!r} is closed")
                if self._idle:
                    idle = self._idle.pop()
                elif self._size < self._max_size:
                    self._size += 1
                else:
                    loop = asyncio.get_running_loop()
                    waiter = loop.create_future()
                    entry = (loop, waiter)
                    # Woken before and beaten to it: first in line again.
                    (self._waiters.appendleft if woken else self._waiters.append)(entry)
            if idle is not None:
                conn, since = idle
                if time.monotonic() - since > self._check_after:
                    try:
                        await AsyncConnectionPool.check_connection(conn)
                    except Exception:
                        self._drop(conn)
                        continue
                    except BaseException:
                        self._drop(conn)
                        raise
                return conn
            if waiter is None:  # room for one more connection
                try:
                    return await self._connect()
                except BaseException:
                    self._drop(None)
                    raise
            now = time.monotonic()
            deadline = now + self._timeout if deadline is None else deadline
            if now >= deadline:
                self._unwait(entry)
                raise PoolTimeout(f"couldn't get a connection after {self._timeout:.2f} sec")
            timer = loop.call_later(min(deadline - now, _RETRY_WAIT), _resolve, waiter)
            try:
                await waiter
            except BaseException:
                if self._unwait(entry) is False and waiter.done() and not waiter.cancelled():
                    self._wake_one()  # it was woken for a connection it will not take
                raise
            finally:
                timer.cancel()
            self._unwait(entry)
            woken = True

    def put(self, conn: AConn) -> None:
        """Give ``conn`` back: kept for the next caller when it is sound, else closed."""
        from psycopg.pq import ConnStatus, TransactionStatus

        pgconn = conn.pgconn
        sound = (
            not conn.broken
            and pgconn.status == ConnStatus.OK
            and pgconn.transaction_status == TransactionStatus.IDLE
        )
        with self._lock:
            keep = sound and not self._closed
            if keep:
                self._idle.append((conn, time.monotonic()))
            else:
                self._size -= 1
        if not keep:
            _close(conn)
        self._wake_one()

    def close(self) -> None:
        """Close the idle connections; those in use are closed as they come back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            waiters, self._waiters = list(self._waiters), deque()
        for conn, _ in idle:
            _close(conn)
        for loop, waiter in waiters:
            _wake(loop, waiter)

    def _drop(self, conn: AConn | None) -> None:
        """A connection that will not come back (or was never made): make room for another."""
        with self._lock:
            self._size -= 1
        if conn is not None:
            _close(conn)
        self._wake_one()

    def _unwait(self, entry: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]) -> bool:
        """Take ``entry`` out of the line; whether it was still there."""
        with self._lock:
            try:
                self._waiters.remove(entry)
            except ValueError:
                return False
            return True

    def _wake_one(self) -> None:
        """Wake the first waiter (it looks again: the pool changed)."""
        while True:
            with self._lock:
                if not self._waiters:
                    return
                loop, waiter = self._waiters.popleft()
            if _wake(loop, waiter):
                return


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _wake(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None]) -> bool:
    """Resolve ``waiter`` in its own loop's thread; False when that loop has ended."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    try:
        if running is loop:
            loop.call_soon(_resolve, waiter)
        else:
            loop.call_soon_threadsafe(_resolve, waiter)
    except RuntimeError:  # that loop is closed: nobody waits there any more
        return False
    return True


def _close(conn: psycopg.AsyncConnection[Any]) -> None:
    """Close ``conn`` without awaiting (``AsyncConnection.close`` only ends the libpq
    connection, which needs no event loop)."""
    conn.pgconn.finish()
