"""Child runs: ``agency.run`` inside a run (DESIGN §11.2), on every store backend.

A child lives in its parent's store with its own journal and record (``parent_id``,
``root_id``, ``depth``); the call is one journaled unit of the parent, so a replay returns
the child's outcome without touching it, and a parent that stopped while its child ran
continues that child instead of starting another. The ``std::run`` gate, the depth limit,
spend, bubbling interrupts, answers routed to the run that asked, and cancelling a tree are
each tested here; ``test_a_parent_killed_mid_child_*`` kills a real process with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agency_runtime import (
    ChildRunRejectedError,
    InvalidArgumentError,
    ResumableScope,
    RunRecord,
    SqliteStore,
    Store,
    Worker,
    agency,
    approve,
    reject,
)
from agency_runtime._boundary._runtime import RUNTIME
from agency_runtime._store import Claim
from tests.forked import ForkServer
from tests.support import serving

pytestmark = pytest.mark.anyio

CALLS: list[str] = []
"""What the entries below executed, in order (reset by each test)."""


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


async def researcher(topic: str) -> str:
    CALLS.append(f"research {topic}")
    assert agency.ctx().subprocess_depth == 1
    return f"notes on {topic}"


async def coordinator(topic: str) -> str:
    notes = await agency.run(researcher, topic)
    CALLS.append("coordinate")
    return f"report from {notes.value}"


async def test_a_run_inside_a_run_is_a_child_in_the_parents_store(store: Store) -> None:
    result = await agency.run(coordinator, "tea", run_id="boss", store=store)
    assert result.status == "completed"
    assert result.value == "report from notes on tea"
    child = await store.get_run("boss/run#0")
    assert child is not None
    assert (child.status, child.parent_id, child.root_id, child.depth) == (
        "completed",
        "boss",
        "boss",
        1,
    )
    assert [r.run_id for r in await store.list_runs(parent="boss")] == ["boss/run#0"]
    parent = await store.get_run("boss")
    assert parent is not None
    assert (parent.parent_id, parent.depth) == (None, 0)
    assert CALLS == ["research tea", "coordinate"]


async def deep(level: int) -> int:
    CALLS.append(f"level {level} at depth {agency.ctx().subprocess_depth}")
    if level == 0:
        return 0
    below = await agency.run(deep, level - 1)
    if below.status != "completed":
        raise RuntimeError(str(below.error))
    return int(below.value) + 1


async def test_grandchildren_name_the_root_and_count_their_depth(store: Store) -> None:
    result = await agency.run(deep, 2, run_id="top", store=store)
    assert (result.status, result.value) == ("completed", 2)
    grandchild = await store.get_run("top/run#0/run#0")
    assert grandchild is not None
    assert (grandchild.parent_id, grandchild.root_id, grandchild.depth) == (
        "top/run#0",
        "top",
        2,
    )
    assert CALLS == ["level 2 at depth 0", "level 1 at depth 1", "level 0 at depth 2"]


async def asks(topic: str) -> str:
    CALLS.append(f"ask {topic}")
    answer = await agency.interrupt("std::approve", f"publish {topic}?")
    CALLS.append(f"asked {topic}: {answer.type}")
    return f"{topic}: {answer.type}"


async def waits_for_its_child() -> str:
    async def body(s: ResumableScope) -> str:
        await s.step(lambda: CALLS.append("before") or 1, name="before")
        child = await agency.run(asks, "essay")
        await s.step(lambda: CALLS.append("after") or 1, name="after")
        return str(child.value)

    return await agency.with_resumable_scope("job", body)


async def test_an_undecided_child_interrupt_pauses_the_parent_and_its_answer_goes_down(
    store: Store,
) -> None:
    paused = await agency.run(waits_for_its_child, run_id="p", store=store)
    assert paused.status == "paused"
    [asked] = paused.interrupts
    assert asked.run_id == "p/job/run#0"  # the child asked it
    child = await store.get_run(asked.run_id)
    assert child is not None
    assert child.status == "paused"
    done = await agency.respond_to_interrupts(paused, [approve()])
    assert (done.run_id, done.status, done.value) == ("p", "completed", "essay: approve")
    child = await store.get_run(asked.run_id)
    assert child is not None
    assert child.status == "completed"
    # Each step ran once: the parent's "before" and the child's ask are not run again.
    assert CALLS == ["before", "ask essay", "ask essay", "asked essay: approve", "after"]


async def test_answering_the_child_directly_continues_its_parent(store: Store) -> None:
    paused = await agency.run(waits_for_its_child, run_id="p", store=store)
    [asked] = paused.interrupts
    child = await agency.respond_to_interrupts(str(asked.run_id), [reject("no")], store=store)
    assert (child.status, child.value) == ("completed", "essay: reject")
    parent = await store.get_run("p")
    assert parent is not None
    assert parent.status == "completed"
    assert json.loads(parent.value or "null") == "essay: reject"


async def test_the_parents_handlers_decide_a_childs_interrupt(store: Store) -> None:
    async def parent() -> str:
        with agency.handler(lambda asked: approve() if asked.effect == "std::approve" else None):
            child = await agency.run(asks, "memo")
        return str(child.value)

    result = await agency.run(parent, run_id="h", store=store)
    assert (result.status, result.value) == ("completed", "memo: approve")


async def test_the_gate_asks_std_run_and_a_rejection_is_recorded(store: Store) -> None:
    seen: list[Any] = []

    def gatekeeper(asked: Any) -> Any:
        if asked.effect == "std::run":
            seen.append(asked.data)
            return reject("not today")
        return None

    async def parent() -> str:
        with agency.handler(gatekeeper):
            try:
                await agency.run(researcher, "x")
            except ChildRunRejectedError as exc:
                CALLS.append(f"refused at depth {exc.depth}")
        await agency.interrupt("std::approve", "finish?")
        return "done"

    paused = await agency.run(parent, run_id="g", store=store)
    assert paused.status == "paused"
    assert seen == [{"entry": seen[0]["entry"], "run_id": "g/run#0", "depth": 1}]
    assert seen[0]["entry"].endswith("researcher")
    assert await store.get_run("g/run#0") is None  # never created
    done = await agency.respond_to_interrupts(paused, [approve()])
    assert done.status == "completed"
    assert seen == [seen[0]]  # the replay raised the recorded refusal: no second gate
    assert CALLS == ["refused at depth 1", "refused at depth 1"]


async def test_undecided_children_nest_up_to_max_run_depth(store: Store) -> None:
    before = RUNTIME.max_run_depth
    agency.configure(max_run_depth=1)
    try:
        result = await agency.run(deep, 2, run_id="d", store=store)
    finally:
        agency.configure(max_run_depth=before)
    assert result.status == "failed"
    assert result.error is not None
    assert "max_run_depth=1" in result.error.message
    with pytest.raises(InvalidArgumentError, match="max_run_depth"):
        agency.configure(max_run_depth=-1)


async def spends() -> str:
    agency.add_cost(0.25)
    return "spent"


async def test_a_parents_cost_includes_its_childrens(store: Store) -> None:
    async def parent() -> str:
        agency.add_cost(0.5)
        child = await agency.run(spends)
        return str(child.value)

    result = await agency.run(parent, run_id="c", store=store)
    assert (result.status, result.cost) == ("completed", 0.75)
    parent_record = await store.get_run("c")
    assert parent_record is not None
    assert (parent_record.cost, parent_record.own_cost) == (0.75, 0.5)
    child = await store.get_run("c/run#0")
    assert child is not None
    assert (child.cost, child.own_cost) == (0.25, 0.25)


async def test_a_cost_guard_around_the_call_sees_the_childs_spend(store: Store) -> None:
    async def parent() -> str:
        async with agency.cost_guard(0.1):
            await agency.run(spends)
        return "under budget"

    result = await agency.run(parent, run_id="b", store=store)
    assert result.status == "paused"
    assert [i.effect for i in result.interrupts] == ["std::guard"]


async def test_a_child_must_live_in_its_parents_store(store: Store, tmp_path: Path) -> None:
    other = SqliteStore(tmp_path / "other.db")

    async def parent() -> None:
        await agency.run(researcher, "x", store=other)

    try:
        result = await agency.run(parent, run_id="s", store=store)
    finally:
        other.close()
    assert result.status == "failed"
    assert result.error is not None
    assert "parent's store" in result.error.message


async def test_cancelling_a_parent_cancels_its_unfinished_children(store: Store) -> None:
    paused = await agency.run(waits_for_its_child, run_id="p", store=store)
    assert paused.status == "paused"
    cancelled = await agency.runs.cancel("p", store=store)
    assert cancelled.status == "cancelled"
    child = await store.get_run("p/job/run#0")
    assert child is not None
    assert child.status == "cancelled"


CRASH_WORKER = r"""
import os
import signal
import sys

from agency_runtime import agency

LEDGER = os.environ["LEDGER"]


def note(line):
    with open(LEDGER, "a") as ledger:
        ledger.write(line + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


def make_step(i):
    def step():
        note(f"child step {i}")
        if i == 2 and os.environ.get("KILL") == "1":
            os.kill(os.getpid(), signal.SIGKILL)  # the child's third step never commits
        return i

    return step


async def child_body(s):
    total = 0
    for i in range(5):
        total += await s.step(make_step(i), name=f"c{i}")
    return total


async def child():
    return await agency.with_resumable_scope("child", child_body)


async def parent():
    result = await agency.run(child)
    note("parent after child")
    return result.value


if __name__ == "__main__":
    result = agency.run_sync(parent, run_id="crash-parent", store="sqlite:///" + os.environ["DB"])
    print(result.status, result.value)
    sys.exit(0 if result.status == "completed" else 3)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_a_parent_killed_mid_child_continues_that_child_once(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    script = tmp_path / "crash_children.py"
    script.write_text(CRASH_WORKER)
    ledger = tmp_path / "ledger.txt"
    env = {**os.environ, "LEDGER": str(ledger), "DB": str(tmp_path / "runs.db")}
    killed = fork_server.start("script", script, env={**env, "KILL": "1"}, cwd=tmp_path)
    try:
        killed.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        killed.kill()
        pytest.fail("the parent did not kill itself")
    assert killed.returncode == -signal.SIGKILL
    done = fork_server.run("script", script, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["completed", "10"]
    lines = ledger.read_text().splitlines()
    # Steps 0 and 1 committed before the kill and never ran again; step 2 was in flight.
    assert lines == [f"child step {i}" for i in (0, 1, 2, 2, 3, 4)] + ["parent after child"]
    store = SqliteStore(tmp_path / "runs.db")
    try:
        children = anyio.run(_children_of, store, "crash-parent")
    finally:
        store.close()
    assert children == ["crash-parent/run#0"]  # one child, continued: never a second one


async def _children_of(store: Store, run_id: str) -> list[str]:
    return [r.run_id for r in await store.list_runs(parent=run_id)]


async def holds_the_lock(name: str) -> str:
    async with agency.lock("shared"):
        CALLS.append(f"{name} in")
        await anyio.lowlevel.checkpoint()  # let the others try the lock meanwhile
        await anyio.lowlevel.checkpoint()
        CALLS.append(f"{name} out")
    return name


async def test_children_share_their_parents_run_locks(store: Store) -> None:
    async def parent() -> list[str]:
        results: list[Any] = []

        async def child(name: str) -> None:
            results.append(await agency.run(holds_the_lock, name))

        async with anyio.create_task_group() as group:
            group.start_soon(child, "a")
            group.start_soon(child, "b")
            group.start_soon(holds_the_lock, "parent")
        return sorted(r.value for r in results)

    result = await agency.run(parent, run_id="locks", store=store)
    assert (result.status, result.value) == ("completed", ["a", "b"])
    # One holder at a time across the parent and both children: never two "in" in a row.
    assert len(CALLS) == 6
    for index in range(0, 6, 2):
        assert CALLS[index].endswith(" in")
        assert CALLS[index + 1] == CALLS[index].replace(" in", " out")


async def fans_out(n: int) -> list[str]:
    results: list[Any] = []

    async def one(i: int) -> None:
        results.append((i, await agency.run(researcher, f"topic {i}")))

    async with anyio.create_task_group() as group:
        for i in range(n):
            group.start_soon(one, i)
    return [str(r.run_id) for _, r in sorted(results, key=lambda pair: pair[0])]


async def test_children_in_a_task_group_have_ids_independent_of_interleaving(
    store: Store,
) -> None:
    first = await agency.run(fans_out, 4, run_id="fan", store=store)
    assert first.status == "completed"
    ids = first.value
    assert len(set(ids)) == 4
    assert all(i.startswith("fan/") and i.endswith("run#0") for i in ids)
    children = await store.list_runs(parent="fan")
    assert sorted(r.run_id for r in children) == sorted(ids)
    # The same tasks, the same ids, in any order: a second run of the same code agrees.
    again = await agency.run(fans_out, 4, run_id="fan-2", store=store)
    assert [i.replace("fan-2/", "fan/", 1) for i in again.value] == ids


# -- queue=: children on workers, the parent waiting durably --------------------------------


@agency.entry
async def summarize(part: int) -> str:
    CALLS.append(f"summarize {part} at depth {agency.ctx().subprocess_depth}")
    return f"part {part}"


@agency.entry
async def approve_publish(part: int) -> str:
    answer = await agency.interrupt("std::approve", f"publish part {part}?")
    CALLS.append(f"publish {part}: {answer.type}")
    return f"part {part}: {answer.type}"


@agency.entry
async def fan_out_on_workers(n: int, entry: str) -> list[str]:
    child = {"summarize": summarize, "approve": approve_publish}[entry]
    results: dict[int, Any] = {}

    async def one(i: int) -> None:
        results[i] = await agency.run(child, i, queue="agents")

    async with anyio.create_task_group() as group:
        for i in range(n):
            group.start_soon(one, i)
    return [str(results[i].value) for i in range(n)]


async def test_queued_children_run_on_workers_while_the_parent_waits(store: Store) -> None:
    workers = [Worker(store, queues=["agents"], concurrency=2, poll=0.05) for _ in range(3)]
    async with serving(*workers):
        result = await agency.run(fan_out_on_workers, 10, "summarize", run_id="f", store=store)
    assert (result.status, result.value) == ("completed", [f"part {i}" for i in range(10)])
    children = await store.list_runs(parent="f", limit=-1)
    assert len(children) == 10
    assert {(c.status, c.queue, c.depth, c.attempts) for c in children} == {
        ("completed", "agents", 1, 1)
    }
    assert sorted(CALLS) == sorted(f"summarize {i} at depth 1" for i in range(10))
    # The parent's journal holds each call once: a replay returns them without the workers.
    again = await agency.resume("f", store=store)
    assert again.value == result.value
    assert len(CALLS) == 10


async def test_a_queued_childs_question_pauses_its_parent_and_the_answer_goes_to_workers(
    store: Store,
) -> None:
    async with serving(Worker(store, queues=["agents"], concurrency=2, poll=0.05)):
        paused = await agency.run(fan_out_on_workers, 1, "approve", run_id="q", store=store)
        assert paused.status == "paused"
        [asked] = paused.interrupts
        assert asked.run_id == "q/run#0" or str(asked.run_id).startswith("q/")
        done = await agency.respond_to_interrupts(paused, [approve()])
    assert (done.status, done.value) == ("completed", ["part 0: approve"])
    assert CALLS == ["publish 0: approve"]


async def test_a_queued_child_cancelled_alone_returns_cancelled_to_its_parent(
    store: Store,
) -> None:
    async def parent() -> str:
        child = await agency.run(summarize, 1, queue="nobody-serves-this")
        return child.status

    results: list[Any] = []
    enqueued = anyio.Event()
    enqueue = store.enqueue_run

    async def seen(record: RunRecord) -> Claim:
        claim = await enqueue(record)
        enqueued.set()
        return claim

    async def start() -> None:
        results.append(await agency.run(parent, run_id="c", store=store))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "enqueue_run", seen)
        async with anyio.create_task_group() as group:
            group.start_soon(start)
            with anyio.fail_after(30):
                await enqueued.wait()
            [child] = await store.list_runs(parent="c")
            await agency.runs.cancel(child.run_id, store=store)
    assert (results[0].status, results[0].value) == ("completed", "cancelled")


async def test_queue_is_for_child_runs_only() -> None:
    with pytest.raises(InvalidArgumentError, match=r"agency\.enqueue"):
        await agency.run(summarize, 1, queue="agents")


async def test_a_parent_on_a_worker_parks_while_its_children_run_elsewhere(
    store: Store,
) -> None:
    """The parent's worker parks it (park_after=0) while it waits for its queued children;
    each child's end wakes it (an event to the parent), and it finishes with their values."""
    await agency.enqueue(
        fan_out_on_workers, 3, "summarize", run_id="parked", queue="parents", store=store
    )
    parents = Worker(store, queues=["parents"], concurrency=1, poll=0.05, park_after=0)
    agents = Worker(store, queues=["agents"], concurrency=3, poll=0.05)
    async with serving(parents, agents):
        done = await agency.runs.wait("parked", store=store, timeout=60)
    assert (done.status, done.value) == ("completed", ["part 0", "part 1", "part 2"])
    record = await store.get_run("parked")
    assert record is not None
    assert record.attempts > 1  # it parked and was claimed again when a child ended
    assert sorted(CALLS) == [f"summarize {i} at depth 1" for i in range(3)]


def test_a_long_child_ids_event_name_stays_within_bounds() -> None:
    from agency_runtime._boundary._run import child_event

    assert child_event("p/run#0") == "agency.child:p/run#0"
    long_id = "p/" + "x" * 300
    assert len(child_event(long_id)) <= 200
    assert child_event(long_id) == child_event(long_id) != child_event(long_id + "y")
