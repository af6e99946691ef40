"""Group commit for the PostgreSQL store's steps: what tasks of one event loop commit while
another commit of theirs is on its way to the server goes next, all in one statement.

A step's commit waits for its round trip, and on a busy worker (eight runs at once) most of
a step's cost is that statement's: psycopg's work on the client, the server's parse, lock,
insert and transaction. A commit that finds none in flight is sent at once, alone, as
before (no wait is added to a lone run's step). One that finds a commit in flight joins the
group gathering behind it; when the one in flight returns, the group goes as one statement,
and each member learns whether its own row was written (its lease is checked row by row,
as alone). A group the server refuses as a whole (one bad row: a duplicate step, a value
PostgreSQL cannot store) is sent again row by row, so each member gets its own answer or
its own error, exactly as alone.

Once begun, a commit runs to its end, as the store's statements do: a member waiting for
its group cannot be cancelled out of a commit that may already be written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel

__all__ = ["GroupCommit"]

T = TypeVar("T")


class _Group(Generic[T]):
    """Items sent together, and what became of each (``None``: the group failed)."""

    __slots__ = ("done", "items", "outcome")

    def __init__(self, item: T) -> None:
        self.items = [item]
        self.done = asyncio.Event()
        self.outcome: list[bool] | None = None


class GroupCommit(Generic[T]):
    """One event loop's commits: ``alone(item)`` sends one, ``together(items)`` several in
    one statement (whether each was written, in order). Used by that loop's tasks only.
    ``alone`` must do what the store's statements do: refuse a caller cancelled before it
    sends, and run to its end once it has."""

    __slots__ = ("_alone", "_gathering", "_in_flight", "_together")

    def __init__(
        self,
        alone: Callable[[T], Awaitable[bool]],
        together: Callable[[list[T]], Awaitable[list[bool]]],
    ) -> None:
        self._alone = alone
        self._together = together
        self._gathering: _Group[T] | None = None
        self._in_flight: _Group[T] | None = None

    async def commit(self, item: T) -> bool:
        """Whether ``item`` was written: sent alone at once when nothing is in flight, else
        with the group gathering behind the commit in flight."""
        if self._in_flight is None and self._gathering is None:  # alone, at once (``alone``
            group = self._in_flight = _Group(item)  # refuses a cancelled caller itself)
            try:
                written = await self._alone(item)
                group.outcome = [written]
                return written
            finally:
                self._in_flight = None
                group.done.set()
        await anyio.lowlevel.checkpoint_if_cancelled()
        with anyio.CancelScope(shield=True):
            written = await self._commit(item)
        return written

    async def _commit(self, item: T) -> bool:
        group = self._gathering
        if group is not None:  # a member: the group's leader sends it
            index = len(group.items)
            group.items.append(item)
            await group.done.wait()
            if group.outcome is None:
                return await self._alone(item)
            return group.outcome[index]
        group = _Group(item)
        if self._in_flight is not None:  # a leader: gather until the one in flight ends
            self._gathering = group
            while self._in_flight is not None:
                await self._in_flight.done.wait()
            self._gathering = None
        self._in_flight = group
        try:
            if len(group.items) == 1:
                group.outcome = [await self._alone(item)]
                return group.outcome[0]
            try:
                group.outcome = await self._together(group.items)
            except Exception:  # each member tries again alone, for its own answer
                return await self._alone(item)
            return group.outcome[0]
        finally:
            self._in_flight = None
            group.done.set()
