"""Group commit for the PostgreSQL store's steps: what tasks of one event loop commit in the
same turn of the loop, or while another commit of theirs is on its way to the server, goes
in one statement.

A step's commit waits for its round trip, and on a busy worker (eight runs at once) most of
a step's cost is that statement's: psycopg's work on the client, the server's parse, lock,
insert and transaction. A commit that finds another in flight joins the group gathering
behind it; when the one in flight returns, the group goes as one statement. A commit that
finds none in flight, while other tasks are ready to run in the same turn of the event
loop, starts a group and lets them run before it sends: runs woken together (by one
group's return, or started by one claim) reach their next commit together and go as one
statement, not one alone and the rest behind it. A commit with no other task ready (a
lone run's) is sent at once, alone: it waits for nothing. Either way each member learns
whether its own row was written (its lease is checked row by row, as alone), and a group
of one is sent alone. A group the server refuses as a whole (one bad row: a duplicate
step, a value PostgreSQL cannot store) is sent again row by row, so each member gets its
own answer or its own error, exactly as alone.

Measured (``bench/bench_postgres.py``, 4 worker processes x 8 runs of 5 steps): sending
the first commit at once split each wave of eight runs' steps into a statement alone and a
group of seven, and the runs never met again; letting the ready tasks join, each wave's
steps and outcomes go as one statement each, and the claim that follows takes the freed
slots together: 0.9 statements per run instead of 2.9, twice the runs per second.

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
        """Whether ``item`` was written: sent at once when no other commit is about and no
        other task is ready to run, else with the group gathering (for one turn of the
        loop, or until the commit in flight returns). A caller cancelled before it joins a
        group sends nothing."""
        if (
            self._in_flight is None
            and self._gathering is None
            and not _has_ready(asyncio.get_running_loop())
        ):
            group = _Group(item)  # alone, at once (``alone`` refuses a cancelled caller itself)
            await self._send(group)
            return await self._answer(group, 0)
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
            return await self._answer(group, index)
        # The leader: it lets the tasks ready in this turn of the loop join (nothing in
        # flight), or those that come until the commit in flight returns; then sends.
        group = self._gathering = _Group(item)
        if self._in_flight is None:
            await asyncio.sleep(0)
        while self._in_flight is not None:
            await self._in_flight.done.wait()
        self._gathering = None
        await self._send(group)
        return await self._answer(group, 0)

    async def _send(self, group: _Group[T]) -> None:
        """Send ``group`` (in flight until it returns): one item alone, several together; a
        refused group leaves its outcome ``None``, an error alone is its one caller's."""
        self._in_flight = group
        try:
            if len(group.items) == 1:
                group.outcome = [await self._alone(group.items[0])]
            else:
                try:
                    group.outcome = await self._together(group.items)
                except Exception:  # each member tries again alone, for its own answer
                    group.outcome = None
        finally:
            self._in_flight = None
            group.done.set()

    async def _answer(self, group: _Group[T], index: int) -> bool:
        """Whether the ``index``-th item of the sent ``group`` was written (sent again alone
        when the group was refused)."""
        if group.outcome is None:
            return await self._alone(group.items[index])
        return group.outcome[index]


def _has_ready(loop: object) -> bool:
    """Whether ``loop`` has a callback to run in its next turn that is not cancelled (tasks
    woken with the caller, which may commit in this turn). asyncio's loops keep them in
    ``_ready``; a loop without one (uvloop) is taken to have some, so its commits always
    wait their turn."""
    ready = getattr(loop, "_ready", None)
    return ready is None or any(not handle.cancelled() for handle in ready)
