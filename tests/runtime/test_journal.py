"""The run journal: what one step commits, the paused-run cache, and store-level rules."""

from __future__ import annotations

import json
import sys

import anyio
import pytest

from agency_runtime import JournalEntry, MemoryStore, Store, agency, approve

pytestmark = pytest.mark.anyio


class CountingStore(MemoryStore):
    """A memory store that counts journal loads."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    async def load_journal(self, run_id: str):  # type: ignore[no-untyped-def]
        self.loads += 1
        return await super().load_journal(run_id)


async def approval_flow() -> str:
    async def body(s):  # type: ignore[no-untyped-def]
        for i in range(5):
            await s.step(lambda i=i: i, name=f"work-{i}")
        answer = await agency.interrupt("approve", "ship it?")
        return await s.step(lambda: f"shipped={answer.approved}", name="ship")

    return await agency.with_resumable_scope("flow", body)


async def test_answering_in_the_same_process_reuses_the_paused_journal() -> None:
    store = CountingStore()
    paused = await agency.run(approval_flow, run_id="p", store=store)
    assert paused.status == "paused"
    assert store.loads == 0  # a run created by its claim has nothing to load
    done = await agency.respond_to_interrupts(paused, [approve()], store=store)
    assert done.value == "shipped=True"
    assert store.loads == 0  # answered from the cached journal


async def test_a_change_by_someone_else_invalidates_the_cached_journal() -> None:
    store = CountingStore()
    paused = await agency.run(approval_flow, run_id="p", store=store)
    # Another process answers: the store's version moves without this process knowing.
    key = paused.interrupts[0].interrupt_id
    assert await store.answer_interrupts("p", {key: approve("elsewhere")}) == []
    done = await agency.resume("p", store=store)
    assert done.value == "shipped=True"
    assert store.loads == 1  # re-read, so the answer given elsewhere was seen


async def test_a_step_commits_its_result_locals_thread_deltas_and_spend(store: Store) -> None:
    async def entry() -> None:
        async def body(s):  # type: ignore[no-untyped-def]
            s.set_local("seen", 1)

            def work() -> dict[str, int]:
                agency.thread.user("hello from the step")
                agency.add_cost(0.25)
                agency.add_tokens(3)
                return {"n": 1}

            await s.step(work)

        await agency.with_resumable_scope("j", body)

    result = await agency.run(entry, run_id="commit", store=store)
    assert result.status == "completed"
    [step] = await agency.runs.journal("commit", store=store)
    assert isinstance(step, JournalEntry)
    assert step.path == "j/0"
    assert step.name.endswith("work")
    assert json.loads(step.result) == {"n": 1}
    assert json.loads(step.locals or "null") == {"seen": 1}
    assert json.loads(step.deltas or "[]") == [
        ["push", "0", {"role": "user", "content": "hello from the step"}],
        ["cost", 250_000_000_000, 0],
        ["cost", 0, 3],
    ]
    assert step.cost_pico == 250_000_000_000
    assert step.tokens == 3
    where, line = step.callsite.rsplit(":", 1)
    assert where == __file__
    assert int(line) > 0


async def test_each_step_records_the_line_it_was_called_from(store: Store) -> None:
    lines: list[int] = []

    async def entry() -> None:
        async def body(s):  # type: ignore[no-untyped-def]
            for _ in range(2):  # the same call twice: the same line (callsites are cached)
                lines.append(sys._getframe().f_lineno + 1)
                await s.step(lambda: 1, name="looped")
            lines.append(sys._getframe().f_lineno + 1)
            await s.step(lambda: 2, name="after")

        await agency.with_resumable_scope("w", body)

    assert (await agency.run(entry, run_id="where", store=store)).status == "completed"
    steps = await agency.runs.journal("where", store=store)
    assert [step.callsite for step in steps] == [f"{__file__}:{line}" for line in lines]
    assert lines[0] == lines[1] != lines[2]


async def test_a_step_of_a_run_that_lost_its_lease_is_not_committed(store: Store) -> None:
    async def entry() -> None:
        async def body(s):  # type: ignore[no-untyped-def]
            await s.step(lambda: 1, name="before")
            await agency.runs.cancel("lost", store=store)
            await s.step(lambda: 2, name="after")

        await agency.with_resumable_scope("l", body)

    result = await agency.run(entry, run_id="lost", store=store)
    assert result.status == "cancelled"
    assert [e.name for e in await agency.runs.journal("lost", store=store)] == ["before"]
    assert (await agency.runs.get("lost", store=store)).status == "cancelled"


async def test_a_run_started_inside_a_step_keeps_its_thread_changes_to_itself() -> None:
    store = MemoryStore()

    def child() -> int:
        agency.thread.user("child message")
        return len(agency.thread.current().get_messages())

    async def parent() -> int:
        async def body(s):  # type: ignore[no-untyped-def]
            async def work() -> int:
                agency.thread.user("parent message")
                inner = await agency.run(child, run_id="child", store=store)
                return int(inner.value)

            return await s.step(work, name="work")

        return await agency.with_resumable_scope("p", body)

    result = await agency.run(parent, run_id="parent", store=store)
    assert result.value == 1  # the child saw only its own thread
    # The child's call is journaled in the parent too (its own unit, inside the step).
    journal = await agency.runs.journal("parent", store=store)
    assert [e.name for e in journal] == ["agency.run", "work"]
    step = journal[1]
    assert json.loads(step.deltas or "[]") == [
        ["push", "0", {"role": "user", "content": "parent message"}]
    ]


async def test_tasks_a_step_starts_report_into_the_step_and_a_nested_scope_body_too() -> None:
    store = MemoryStore()

    async def parent() -> str:
        async def body(s):  # type: ignore[no-untyped-def]
            async def work() -> str:
                async def say(text: str) -> None:
                    agency.thread.user(text)

                async with anyio.create_task_group() as group:
                    group.start_soon(say, "from a task")
                agency.thread.user("from the step")

                async def inner(t):  # type: ignore[no-untyped-def]
                    agency.thread.user("from the inner body")
                    return await t.step(lambda: agency.thread.user("inner step") and "ok")

                return str(await agency.with_resumable_scope("inner", inner))

            done = await s.step(work, name="work")
            agency.thread.user("after the step")  # the root's: kept by no entry
            return str(done)

        return await agency.with_resumable_scope("p", body)

    result = await agency.run(parent, run_id="parent", store=store)
    assert result.status == "completed", result
    journal = {e.name: e for e in await agency.runs.journal("parent", store=store)}
    assert json.loads(journal["work"].deltas or "[]") == [
        ["push", "0", {"role": "user", "content": "from a task"}],
        ["push", "0", {"role": "user", "content": "from the step"}],
        ["push", "0", {"role": "user", "content": "from the inner body"}],
        ["unit", "p/0/inner/0"],
    ]


async def test_a_failed_inner_step_leaves_its_spend_and_changes_to_the_step_around_it() -> None:
    store = MemoryStore()

    def fails() -> None:
        agency.add_cost(0.5)
        agency.thread.user("tried")
        raise ValueError("no")

    async def parent() -> str:
        async def body(s):  # type: ignore[no-untyped-def]
            async def outer() -> str:
                async def inner(t):  # type: ignore[no-untyped-def]
                    try:
                        await t.step(fails, name="fails")
                    except ValueError:
                        return "caught"
                    return "not raised"

                return str(await agency.with_resumable_scope("inner", inner))

            return str(await s.step(outer, name="outer"))

        return await agency.with_resumable_scope("p", body)

    result = await agency.run(parent, run_id="parent", store=store)
    assert (result.status, result.value, result.cost) == ("completed", "caught", 0.5)
    (entry,) = await agency.runs.journal("parent", store=store)  # nothing of the failed step
    assert entry.name == "outer"
    assert entry.cost_pico == 500_000_000_000
    assert ["push", "0", {"role": "user", "content": "tried"}] in json.loads(entry.deltas or "[]")


def test_entries_built_from_rows_equal_validated_entries() -> None:
    values = {
        "run_id": "r", "seq": 3, "path": "s/0", "name": "work", "callsite": "f.py:1",
        "result": "1", "locals": None, "scopes": '[["",0,"s"]]', "deltas": None,
        "error": None, "cost_pico": 5, "tokens": 2, "created_at": 1.5,
    }  # fmt: skip
    fast = JournalEntry.from_row(dict(values))
    assert fast == JournalEntry(**values)
    assert fast.model_dump() == values
    assert fast.model_fields_set == set(values)
    assert JournalEntry.model_validate_json(fast.model_dump_json()) == fast
