"""Group commit (``agency_runtime/_store/_pg_group.py``): the commits of tasks ready in the
same turn of the event loop sent together, a commit alone when no other is, the others
gathered behind one in flight and sent together, each answered for its own item, a
refused group answered item by item, and no commit left half-known by a cancelled caller.

The sends here are fakes that wait for the test to release them; the PostgreSQL store's own
(one statement for the group) is tested in ``test_postgres.py`` and ``test_store.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import pytest

from agency_runtime._store._pg_group import GroupCommit, _has_ready

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the store groups asyncio's commits only (trio's go through threads)


class Server:
    """The two sends, recording what each carried; each waits until :meth:`release`.
    An item named ``bad…`` is refused (``ValueError``) alone and fails a group it is in;
    one named ``no…`` is not written."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[str]]] = []
        self.gate = anyio.Event()

    def release(self) -> None:
        self.gate.set()
        self.gate = anyio.Event()

    async def _wait(self, kind: str, items: list[str]) -> None:
        self.sent.append((kind, items))
        await self.gate.wait()

    async def alone(self, item: str) -> bool:
        await anyio.lowlevel.checkpoint_if_cancelled()  # as the store's: nothing sent then
        await self._wait("alone", [item])
        if item.startswith("bad"):
            raise ValueError(f"refused {item}")
        return not item.startswith("no")

    async def together(self, items: list[str]) -> list[bool]:
        await self._wait("together", list(items))
        if any(item.startswith("bad") for item in items):
            raise ValueError("a bad row")
        return [not item.startswith("no") for item in items]


async def _commit_all(group: GroupCommit[str], items: list[str], out: dict[str, object]) -> None:
    async def one(item: str) -> None:
        try:
            out[item] = await group.commit(item)
        except ValueError as exc:
            out[item] = exc

    async with anyio.create_task_group() as tasks:
        for item in items:
            tasks.start_soon(one, item)


async def test_a_commit_no_other_task_makes_with_it_goes_alone() -> None:
    server = Server()
    server.gate.set()  # no waiting
    group = GroupCommit(server.alone, server.together)
    assert await group.commit("a") is True
    assert await group.commit("no-b") is False
    assert server.sent == [("alone", ["a"]), ("alone", ["no-b"])]


async def test_commits_of_tasks_ready_in_one_turn_go_together_with_none_in_flight() -> None:
    """Runs woken together (one group's return, one claim) reach their commits in the same
    turn of the loop: the first lets the others run before it sends, so they go as one,
    not one alone and the rest behind it. A commit with no other task ready goes at once."""
    server = Server()
    server.gate.set()
    group = GroupCommit(server.alone, server.together)
    out: dict[str, object] = {}
    await _commit_all(group, ["a", "no-b", "c"], out)
    assert await group.commit("d") is True
    assert server.sent == [("together", ["a", "no-b", "c"]), ("alone", ["d"])]
    assert out == {"a": True, "no-b": False, "c": True}


async def test_what_is_ready_in_the_next_turn_of_the_loop() -> None:
    loop = asyncio.get_running_loop()
    assert not _has_ready(loop)
    handle = loop.call_soon(lambda: None)
    assert _has_ready(loop)
    handle.cancel()  # stays queued, but will not run
    assert not _has_ready(loop)
    assert _has_ready(object())  # a loop that does not say (uvloop): its commits wait a turn


def _caller(
    group: GroupCommit[str], item: str, scope: anyio.CancelScope, answers: list[bool]
) -> Callable[[], Awaitable[None]]:
    """A task that commits ``item`` inside ``scope`` (cancelled by the test) and records its
    answer in ``answers``."""

    async def commit() -> None:
        with scope:
            answers.append(await group.commit(item))

    return commit


async def test_a_leader_cancelled_while_it_gathers_still_sends_and_learns_its_answer() -> None:
    server = Server()
    server.gate.set()
    group = GroupCommit(server.alone, server.together)
    answers: list[bool] = []
    caller = anyio.CancelScope()
    leader = _caller(group, "a", caller, answers)

    async def canceller() -> None:
        caller.cancel()  # runs in the leader's gathering turn: "a" may be joined by now

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(leader)
        tasks.start_soon(canceller)
        tasks.start_soon(group.commit, "b")
    assert answers == [True]
    assert server.sent == [("together", ["a", "b"])]


async def test_commits_behind_one_in_flight_go_together_each_with_its_answer() -> None:
    server = Server()
    group = GroupCommit(server.alone, server.together)
    out: dict[str, object] = {}
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_commit_all, group, ["a"], out)
        await anyio.wait_all_tasks_blocked()  # every task waits on the server or its group
        assert len(server.sent) == 1
        tasks.start_soon(_commit_all, group, ["b", "no-c", "d"], out)
        await anyio.wait_all_tasks_blocked()
        assert server.sent == [("alone", ["a"])]  # b, c, d wait for a's round trip
        server.release()  # a returns; b, c and d go as one
        await anyio.wait_all_tasks_blocked()  # every task waits on the server or its group
        assert len(server.sent) == 2
        tasks.start_soon(_commit_all, group, ["e", "f"], out)  # behind the group in flight
        await anyio.wait_all_tasks_blocked()
        server.release()
        await anyio.wait_all_tasks_blocked()  # every task waits on the server or its group
        assert len(server.sent) == 3
        server.release()
    assert server.sent == [
        ("alone", ["a"]),
        ("together", ["b", "no-c", "d"]),
        ("together", ["e", "f"]),
    ]
    assert out == {"a": True, "b": True, "no-c": False, "d": True, "e": True, "f": True}


async def test_a_refused_group_is_sent_again_item_by_item() -> None:
    server = Server()
    server.gate.set()
    out: dict[str, object] = {}
    hold = anyio.Event()

    async def first_in_flight(item: str) -> bool:
        await hold.wait()
        return True

    group = GroupCommit(
        lambda item: first_in_flight(item) if item == "a" else server.alone(item),
        server.together,
    )
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_commit_all, group, ["a"], out)
        await anyio.wait_all_tasks_blocked()
        tasks.start_soon(_commit_all, group, ["b", "bad-c", "no-d"], out)
        await anyio.wait_all_tasks_blocked()
        hold.set()
    assert server.sent[0] == ("together", ["b", "bad-c", "no-d"])
    assert sorted(server.sent[1:]) == [("alone", ["b"]), ("alone", ["bad-c"]), ("alone", ["no-d"])]
    assert out["a"] is True
    assert out["b"] is True
    assert out["no-d"] is False
    assert isinstance(out["bad-c"], ValueError)
    assert str(out["bad-c"]) == "refused bad-c"  # its own error, as alone


async def test_an_error_alone_is_its_callers_only() -> None:
    server = Server()
    server.gate.set()
    group = GroupCommit(server.alone, server.together)
    with pytest.raises(ValueError, match="refused bad"):
        await group.commit("bad")
    assert await group.commit("ok") is True  # nothing left in flight


async def test_a_caller_cancelled_while_its_group_waits_still_learns_its_answer() -> None:
    server = Server()
    group = GroupCommit(server.alone, server.together)
    answers: list[bool] = []
    caller = anyio.CancelScope()
    member = _caller(group, "b", caller, answers)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(group.commit, "a")
        await anyio.wait_all_tasks_blocked()  # every task waits on the server or its group
        assert len(server.sent) == 1
        tasks.start_soon(member)
        await anyio.wait_all_tasks_blocked()
        caller.cancel()  # b is in the group: it may be written, so it waits for its answer
        await anyio.wait_all_tasks_blocked()
        server.release()
        await anyio.wait_all_tasks_blocked()  # every task waits on the server or its group
        assert len(server.sent) == 2
        server.release()
    assert answers == [True]
    assert server.sent[1] == ("alone", ["b"])  # a group of one goes alone


async def test_a_caller_cancelled_before_it_commits_sends_nothing() -> None:
    server = Server()
    server.gate.set()
    group = GroupCommit(server.alone, server.together)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await group.commit("a")
    assert server.sent == []
