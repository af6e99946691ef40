"""Replay is faithful under concurrency: addresses never depend on how branches interleave.

Each case runs a run whose concurrent branches reach the same kind of counted thing (a
same-named scope, an interrupt outside any step, an LLM call, a checkpoint) in one order,
then resumes it with the order reversed. Events force the orders, so nothing depends on
timing. Before branches were named by their causal position (the n-th task a parent started
after its e-th counted event), the second execution handed each branch the other's journal
or answer; these tests pin that each branch gets its own, on asyncio and trio alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from agency_runtime import (
    NondeterminismError,
    ResumableScope,
    agency,
    approve,
)
from agency_runtime.testing import FakeModel

# Every async test runs on asyncio and trio, and ``store`` is every backend (tests/conftest.py).
pytestmark = pytest.mark.anyio


class Ordered:
    """Lets two branches reach a point in a chosen order: ``first`` goes, then the other."""

    def __init__(self, first: str) -> None:
        self.first = first
        self.reached = {"a": anyio.Event(), "b": anyio.Event()}

    async def turn(self, name: str) -> None:
        if name != self.first:
            await self.reached[self.first].wait()

    def arrived(self, name: str) -> None:
        self.reached[name].set()


async def both(branch: Callable[[str], Awaitable[None]]) -> None:
    async with anyio.create_task_group() as group:
        group.start_soon(branch, "a")
        group.start_soon(branch, "b")


async def test_branches_entering_same_named_scopes_keep_their_own_journals(store: Any) -> None:
    calls: dict[str, int] = {"a": 0, "b": 0}
    attempt = {"n": 0}

    def work(name: str) -> str:
        calls[name] += 1
        return name.upper()

    async def entry() -> dict[str, str]:
        attempt["n"] += 1
        order = Ordered("b" if attempt["n"] == 1 else "a")
        results: dict[str, str] = {}

        async def body(s: ResumableScope) -> dict[str, str]:
            async def branch(name: str) -> None:
                await order.turn(name)

                async def inner(si: ResumableScope) -> str:
                    order.arrived(name)
                    return str(await si.step(lambda: work(name), name="work"))

                results[name] = await agency.with_resumable_scope("inner", inner)

            await both(branch)
            if attempt["n"] == 1:
                raise RuntimeError("fail once, after both branches committed their steps")
            return results

        return await agency.with_resumable_scope("outer", body)

    first = await agency.run(entry, run_id="scopes", store=store)
    assert first.status == "failed"
    second = await agency.run(entry, run_id="scopes", store=store)
    assert second.status == "completed", second.error
    assert second.value == {"a": "A", "b": "B"}
    assert calls == {"a": 1, "b": 1}  # nothing committed ran again
    paths = sorted(e.path for e in await agency.runs.journal("scopes", store=store))
    assert paths == ["outer/0.0:inner/0", "outer/0.1:inner/0"]


async def test_branches_asking_outside_steps_get_their_own_answers(store: Any) -> None:
    attempt = {"n": 0}

    async def entry() -> dict[str, Any]:
        attempt["n"] += 1
        order = Ordered("b" if attempt["n"] == 1 else "a")
        answers: dict[str, Any] = {}

        async def branch(name: str) -> None:
            await order.turn(name)
            order.arrived(name)
            answer = await agency.interrupt("approve", f"may {name} go on?")
            answers[name] = answer.value

        await both(branch)
        return answers

    result = await agency.run(entry, run_id="asks", store=store)
    for _ in range(4):  # trio may cancel the second asker before it asks: answer until done
        if result.status != "paused":
            break
        own = {i.interrupt_id: approve(i.message.split()[1].upper()) for i in result.interrupts}
        result = await agency.respond_to_interrupts(result, own, store=store)
    assert result.status == "completed", result.error
    assert result.value == {"a": "A", "b": "B"}


async def test_a_recorded_answer_is_never_handed_to_another_question(store: Any) -> None:
    """The journal's check: an answer recorded for one question refuses another one asked at
    the same address (here the code changed between pause and answer)."""
    question = {"text": "ship order 7?"}

    async def entry() -> Any:
        answer = await agency.interrupt("approve", question["text"])
        return answer.value

    paused = await agency.run(entry, run_id="changed", store=store)
    question["text"] = "refund order 7?"
    done = await agency.respond_to_interrupts(paused, [approve("yes")], store=store)
    assert done.status == "failed"
    assert isinstance(done.exception, NondeterminismError)
    assert "'ship order 7?'" in str(done.exception)
    assert "'refund order 7?'" in str(done.exception)


async def test_branch_checkpoints_and_guards_get_branch_ids() -> None:
    ids: dict[str, list[str]] = {}

    async def branch(name: str) -> None:
        async with agency.cost_guard(1.0) as guard:
            ids[name] = [guard.guard_id, await agency.checkpoint()]

    with agency.test_context():
        await both(branch)
    assert ids == {
        "a": ["cost-guard:/#0.0:0", "cp:/#0.0:0"],
        "b": ["cost-guard:/#0.1:0", "cp:/#0.1:0"],
    }


async def test_the_task_that_opened_a_scope_keeps_plain_step_ids(store: Any) -> None:
    async def entry() -> list[str]:
        async def body(s: ResumableScope) -> list[str]:
            first = await s.step(lambda: "x", name="one")
            results = await _gather(
                s.step(lambda: "y", name="two"), s.step(lambda: "z", name="three")
            )
            return [first, *results]

        return await agency.with_resumable_scope("plain", body)

    result = await agency.run(entry, run_id="plain", store=store)
    assert result.value == ["x", "y", "z"]
    assert sorted(e.path for e in await agency.runs.journal("plain", store=store)) == [
        "plain/0",
        "plain/1",
        "plain/2",
    ]


async def _gather(*awaitables: Awaitable[str]) -> list[str]:
    results: list[str] = [""] * len(awaitables)

    async def one(index: int, awaitable: Awaitable[str]) -> None:
        results[index] = await awaitable

    async with anyio.create_task_group() as group:
        for index, awaitable in enumerate(awaitables):
            group.start_soon(one, index, awaitable)
    return results


class TestLLMCallsInBranches:
    """LLM calls in branches (a fake model at the seam: no litellm, so trio too)."""

    async def test_branch_llm_calls_replay_their_own_answers(self, store: Any) -> None:
        """Each branch talks on a thread of its own: thread ids are counted per branch too."""
        attempt = {"n": 0}

        async def entry() -> dict[str, str]:
            attempt["n"] += 1
            order = Ordered("b" if attempt["n"] == 1 else "a")
            replies: dict[str, str] = {}

            async def branch(name: str) -> None:
                await order.turn(name)
                order.arrived(name)
                with agency.thread.use(agency.thread.store().create(label=name)):
                    replies[name] = str(await agency.llm(f"say {name}"))

            await both(branch)
            if attempt["n"] == 1:
                raise RuntimeError("fail once after both calls were journaled")
            return replies

        def echo(request: Any) -> str:
            return str(request.messages[-1]["content"])

        with FakeModel("branches", function=echo) as fake:
            first = await agency.run(entry, run_id="llm", store=store, model=fake.model)
            assert first.status == "failed"
            second = await agency.run(entry, run_id="llm", store=store, model=fake.model)
        assert second.status == "completed", second.error
        assert second.value == {"a": "say a", "b": "say b"}
        assert len(fake.calls) == 2  # replayed, not asked again
        assert all(len(call.messages) == 1 for call in fake.calls)  # each on its own thread
