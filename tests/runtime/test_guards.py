"""Cost and time guards, ``add_cost`` and the ``std::guard`` interrupt.

Covers DESIGN.md §3 (guards, ``add_cost``), §4 "LLM, cost and guards", §8 "Interrupts,
guards and money", and the spec's §7 (guards), §9 (addCost) with its "guards",
"agency.test" and "ts-helpers" cases.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from agency_runtime import (
    AbortSignal,
    AgencyError,
    GuardApproveError,
    GuardExceededError,
    Interrupt,
    InterruptResponse,
    InvalidArgumentError,
    ResumableScope,
    RuntimeContext,
    Store,
    agency,
    approve,
    reject,
)
from agency_runtime._core._frame import current_frame
from agency_runtime.testing import FakeClock, FakeModel
from tests.support import advance_when_blocked

pytestmark = pytest.mark.anyio

# A fake model whose call on a one-word prompt costs exactly 0.15 USD:
# prompt tokens = 1 word + 1 per message = 2, completion = 1 word; 3 tokens at 0.05.
CALL_COST = 0.15


def pricey(name: str = "pricey", replies: list[str] | None = None) -> FakeModel:
    return FakeModel(
        name,
        replies=replies if replies is not None else ["ok"],
        input_cost_per_token=0.05,
        output_cost_per_token=0.05,
    )


class Recorder:
    """A handler that records what it hears and gives its answers in order (the last repeats)."""

    def __init__(self, *answers: InterruptResponse | None) -> None:
        self.heard: list[Interrupt] = []
        self.thread_lengths: list[int] = []
        self.answers = list(answers)

    def __call__(self, interrupt: Interrupt) -> InterruptResponse | None:
        self.heard.append(interrupt)
        self.thread_lengths.append(len(agency.thread.current().get_messages()))
        if not self.answers:
            return None
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.fixture
def test_frame() -> Iterator[None]:
    with agency.test_context():
        yield


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def timed_frame(clock: FakeClock) -> Iterator[None]:
    """A test frame whose time guards run on ``clock`` (the test moves time)."""
    with agency.test_context(ctx=RuntimeContext(clock=clock)):
        yield


def guards_in_scope() -> tuple[Any, ...]:
    return current_frame("test").stack.guards


# -- add_cost and strictness -----------------------------------------------------------------------


async def test_add_cost_adds_to_the_run(test_frame: None) -> None:
    agency.add_cost(0.25)
    assert agency.ctx().cost == 0.25


async def test_trips_only_when_strictly_over(test_frame: None) -> None:
    async with agency.cost_guard(0.1) as guard:
        agency.add_cost(0.1)  # exactly at the limit: fine
        assert guard.spent == 0.1
    async with agency.cost_guard(0.1):
        with pytest.raises(GuardExceededError) as info:
            agency.add_cost(0.1000001)
    assert info.value.type == "cost"
    assert info.value.spent == pytest.approx(0.1000001)


async def test_three_tenths_under_point_three_do_not_trip(test_frame: None) -> None:
    async with agency.cost_guard(0.3) as guard:
        for _ in range(3):
            agency.add_cost(0.1)
        assert guard.spent == 0.3
        assert not guard.over()


async def test_ten_tenths_under_one_dollar_do_not_drift(test_frame: None) -> None:
    async with agency.cost_guard(1.0) as guard:
        for _ in range(10):
            agency.add_cost(0.1)
        assert guard.spent == 1.0
        with pytest.raises(GuardExceededError):
            agency.add_cost(1e-9)
    assert agency.ctx().cost == pytest.approx(1.0 + 1e-9)


async def test_add_cost_trip_carries_type_limit_spent_and_guard_id(test_frame: None) -> None:
    async with agency.cost_guard(0.1) as guard:
        agency.add_cost(0.05)
        with pytest.raises(GuardExceededError) as info:
            agency.add_cost(0.1)
    error = info.value
    assert isinstance(error, AgencyError)
    assert error.type == "cost"
    assert error.limit == 0.1
    assert error.spent == 0.15
    assert isinstance(error.guard_id, str)
    assert error.guard_id
    assert error.guard_id == guard.guard_id
    assert "budget of $0.100000 (US dollars): spent $0.150000" in str(error)
    # The spend stays booked: the money was spent.
    assert agency.ctx().cost == 0.15


async def test_labelled_guard_names_itself(test_frame: None) -> None:
    async with agency.cost_guard(0.01, label="research"):
        with pytest.raises(GuardExceededError, match='guard "research" exceeded') as info:
            agency.add_cost(0.05)
    assert info.value.label == "research"
    assert (info.value.limit, info.value.spent) == (0.01, 0.05)


async def test_a_cost_guard_counts_only_spend_after_it_was_installed(test_frame: None) -> None:
    agency.add_cost(0.5)
    async with agency.cost_guard(0.1) as guard:
        assert guard.spent == 0
        agency.add_cost(0.05)
        assert guard.spent == 0.05
    assert agency.ctx().cost == 0.55


async def test_add_tokens_never_trips_a_cost_guard(test_frame: None) -> None:
    async with agency.cost_guard(0.0):
        agency.add_tokens(1000)
    assert agency.ctx().tokens == 1000


# -- nesting ---------------------------------------------------------------------------------------


async def test_nested_guards_are_all_charged_and_the_innermost_trips_first(
    test_frame: None,
) -> None:
    async with agency.cost_guard(0.2) as outer, agency.cost_guard(0.1) as inner:
        with pytest.raises(GuardExceededError) as info:
            agency.add_cost(0.25)  # over both: the inner one is reported
        assert outer.spent == 0.25
        assert inner.spent == 0.25
    assert info.value.guard_id == inner.guard_id
    assert info.value.limit == 0.1
    assert outer.guard_id != inner.guard_id


async def test_a_trip_of_the_outer_guard_alone_is_reported_as_the_outer(test_frame: None) -> None:
    async with agency.cost_guard(0.1) as outer, agency.cost_guard(1.0) as inner:
        with pytest.raises(GuardExceededError) as info:
            agency.add_cost(0.2)
    assert inner.spent == 0.2
    assert info.value.guard_id == outer.guard_id


async def test_extending_the_inner_guard_does_not_widen_the_outer(test_frame: None) -> None:
    handler = Recorder(approve({"max_cost": 1}))
    with pricey() as fake, agency.handler(handler):
        async with agency.cost_guard(0.2) as outer, agency.cost_guard(0.1) as inner:
            assert await agency.llm("hi", model=fake.model) == "ok"  # 0.15: only the inner trips
            assert [i.data["guard_id"] for i in handler.heard] == [inner.guard_id]
            assert inner.limit == pytest.approx(1.1)
            assert outer.limit == 0.2
            with pytest.raises(GuardExceededError) as info:
                agency.add_cost(0.1)  # 0.25: under the inner's 1.1, over the outer's 0.2
    assert info.value.guard_id == outer.guard_id


async def test_a_call_crossing_two_guards_asks_about_each(test_frame: None) -> None:
    handler = Recorder(approve({"max_cost": 1}))
    with pricey() as fake, agency.handler(handler):
        async with agency.cost_guard(0.12) as outer, agency.cost_guard(0.1) as inner:
            await agency.llm("hi", model=fake.model)  # 0.15: over both
            # Both budgets were crossed by this call; each needs its own approval.
            assert [i.data["guard_id"] for i in handler.heard] == [
                inner.guard_id,
                outer.guard_id,
            ]
            assert not outer.over()


# -- popping ---------------------------------------------------------------------------------------


async def test_with_cost_guard_pops_when_fn_returns(test_frame: None) -> None:
    def body() -> str:
        assert len(guards_in_scope()) == 1
        agency.add_cost(0.05)
        return "done"

    assert await agency.with_cost_guard(0.1, body) == "done"
    assert guards_in_scope() == ()
    agency.add_cost(1.0)  # no guard left to trip


async def test_with_cost_guard_pops_when_fn_raises(test_frame: None) -> None:
    async def body() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await agency.with_cost_guard(0.1, body)
    assert guards_in_scope() == ()
    agency.add_cost(1.0)


async def test_with_cost_guard_pops_after_its_own_trip(test_frame: None) -> None:
    with pytest.raises(GuardExceededError):
        await agency.with_cost_guard(0.1, lambda: agency.add_cost(0.2))
    assert guards_in_scope() == ()
    agency.add_cost(1.0)


async def test_cost_guard_block_pops_on_return_and_on_raise(test_frame: None) -> None:
    async with agency.cost_guard(0.1):
        assert len(guards_in_scope()) == 1
    assert guards_in_scope() == ()
    with pytest.raises(KeyError):
        async with agency.cost_guard(0.1):
            raise KeyError("x")
    assert guards_in_scope() == ()
    agency.add_cost(1.0)


async def test_with_time_guard_returns_and_pops(test_frame: None) -> None:
    async def quick() -> int:
        assert len(guards_in_scope()) == 1
        await anyio.lowlevel.checkpoint()
        return 7

    assert await agency.with_time_guard(5, quick) == 7
    assert guards_in_scope() == ()


async def test_time_guards_pop_when_fn_raises(test_frame: None) -> None:
    def boom() -> None:
        raise ValueError("inside")

    # The exception's exact type is checked by the next test; here only the popping counts.
    with pytest.raises(BaseException, match=r"inside|TaskGroup"):
        await agency.with_time_guard(5, boom)
    assert guards_in_scope() == ()
    with pytest.raises(BaseException, match=r"inside|TaskGroup"):
        async with agency.time_guard(5):
            boom()
    assert guards_in_scope() == ()


async def test_an_error_inside_with_time_guard_propagates_as_itself(test_frame: None) -> None:
    def boom() -> None:
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        await agency.with_time_guard(5, boom)


async def test_a_cost_trip_inside_a_time_guard_block_propagates_as_itself(
    test_frame: None,
) -> None:
    async with agency.cost_guard(0.1):
        with pytest.raises(GuardExceededError) as info:
            async with agency.time_guard(5):
                agency.add_cost(0.2)
    assert info.value.type == "cost"


# -- branches --------------------------------------------------------------------------------------


async def test_guards_are_shared_by_task_group_branches(test_frame: None) -> None:
    async def spend() -> None:
        await anyio.lowlevel.checkpoint()
        agency.add_cost(0.04)

    async with agency.cost_guard(0.1) as guard:
        async with anyio.create_task_group() as tg:
            tg.start_soon(spend)
            tg.start_soon(spend)
        assert guard.spent == 0.08
        with pytest.raises(GuardExceededError) as info:
            agency.add_cost(0.03)
    assert info.value.spent == pytest.approx(0.11)
    assert agency.ctx().cost == pytest.approx(0.11)


async def test_three_branches_add_cost_into_the_run(store: Store) -> None:
    async def entry() -> list[float]:
        async def branch(i: int) -> None:
            agency.add_cost(i)

        async with anyio.create_task_group() as tg:
            for i in (1, 2, 3):
                tg.start_soon(branch, i)
        return [agency.ctx().cost]

    result = await agency.run(entry, store=store)
    assert result.value == [6.0]
    assert result.cost == 6.0


async def test_cost_trip_in_a_run_fails_it_with_the_guard_error(store: Store) -> None:
    async def entry() -> None:
        async with agency.cost_guard(0.01):
            agency.add_cost(0.05)

    result = await agency.run(entry, store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "GuardExceededError"
    error = result.exception
    assert isinstance(error, GuardExceededError)
    assert (error.type, error.limit, error.spent) == ("cost", 0.01, 0.05)


# -- the std::guard interrupt of an LLM call -------------------------------------------------------


async def test_an_llm_trip_asks_after_the_call_and_an_approval_adds_budget(
    test_frame: None,
) -> None:
    handler = Recorder(approve({"max_cost": 1}))
    with pricey() as fake, agency.handler(handler):
        async with agency.cost_guard(0.1) as guard:
            assert await agency.llm("hi", model=fake.model) == "ok"
            assert len(handler.heard) == 1
            asked = handler.heard[0]
            assert asked.effect == "std::guard"
            assert asked.data["dimension"] == "cost"
            assert asked.data["limit"] == 0.1
            assert asked.data["spent"] == pytest.approx(CALL_COST)
            assert asked.data["guard_id"] == guard.guard_id
            assert handler.thread_lengths == [2]  # the answer was already on the thread
            assert guard.limit == pytest.approx(1.1)
            agency.add_cost(0.5)  # 0.65 of 1.1: no trip
    assert len(fake.calls) == 1


async def test_handlers_inside_the_tripped_guard_cannot_answer(store: Store) -> None:
    inside = Recorder(approve({"max_cost": 1}))
    with pricey() as fake:

        async def entry() -> str:
            async with agency.cost_guard(0.1):
                with agency.handler(inside):
                    return await agency.llm("hi", model=fake.model)

        result = await agency.run(entry, store=store)
    assert result.status == "paused"
    assert [i.effect for i in result.interrupts] == ["std::guard"]
    assert inside.heard == []


async def test_handlers_inside_the_tripped_guard_cannot_answer_in_a_test_frame(
    test_frame: None,
) -> None:
    inside = Recorder(approve({"max_cost": 1}))
    outside = Recorder(approve({"max_cost": 2}))
    with pricey() as fake, agency.handler(outside):
        async with agency.cost_guard(0.1) as guard:
            with agency.handler(inside):
                await agency.llm("hi", model=fake.model)
    assert inside.heard == []
    assert len(outside.heard) == 1
    assert guard.limit == pytest.approx(2.1)


async def test_a_bare_approve_that_leaves_the_guard_over_is_an_error(test_frame: None) -> None:
    with pricey() as fake, agency.handler(Recorder(approve())):
        async with agency.cost_guard(0.1):
            with pytest.raises(GuardApproveError, match="guard approval error"):
                await agency.llm("hi", model=fake.model)


async def test_a_too_small_grant_is_an_error(test_frame: None) -> None:
    with pricey() as fake, agency.handler(Recorder(approve({"max_cost": 0.01}))):
        async with agency.cost_guard(0.1):
            with pytest.raises(GuardApproveError):
                await agency.llm("hi", model=fake.model)


async def test_reject_raises_the_original_guard_error(test_frame: None) -> None:
    with pricey() as fake, agency.handler(Recorder(reject("too expensive"))):
        async with agency.cost_guard(0.1) as guard:
            with pytest.raises(GuardExceededError) as info:
                await agency.llm("hi", model=fake.model)
            # The call happened: its answer is on the thread and its cost is booked.
            assert [m.role for m in agency.thread.current().get_messages()] == [
                "user",
                "assistant",
            ]
    assert info.value.type == "cost"
    assert info.value.limit == 0.1
    assert info.value.spent == pytest.approx(CALL_COST)
    assert info.value.guard_id == guard.guard_id
    assert agency.ctx().cost == pytest.approx(CALL_COST)


async def test_grants_are_additive(test_frame: None) -> None:
    handler = Recorder(approve({"max_cost": 0.15}), approve({"max_cost": 0.3}))
    with pricey(replies=["one", "two"]) as fake, agency.handler(handler):
        async with agency.cost_guard(0.1) as guard:
            await agency.llm("a", model=fake.model)  # 0.15 > 0.1 → +0.15 → limit 0.25
            assert guard.limit == pytest.approx(0.25)
            # 6 prompt tokens + 1 completion token: 0.35 more, 0.5 in all; the grant of
            # 0.3 brings the limit to 0.55, while a replacing grant (0.1 + 0.3) would
            # leave the guard over and raise GuardApproveError.
            await agency.llm("b", model=fake.model)
            assert guard.spent == pytest.approx(0.5)
            assert guard.limit == pytest.approx(0.55)
            assert not guard.over()
    assert len(handler.heard) == 2


async def test_disarm_disarms_the_guard(test_frame: None) -> None:
    with pricey() as fake, agency.handler(Recorder(approve({"disarm": True}))):
        async with agency.cost_guard(0.1) as guard:
            assert await agency.llm("hi", model=fake.model) == "ok"
            agency.add_cost(5)
            assert not guard.over()


async def test_camel_case_max_cost_is_accepted(test_frame: None) -> None:
    with pricey() as fake, agency.handler(Recorder(approve({"maxCost": 1}))):
        async with agency.cost_guard(0.1) as guard:
            await agency.llm("hi", model=fake.model)
            assert guard.limit == pytest.approx(1.1)


@pytest.mark.parametrize(("label", "expected"), [(None, "guard:cost"), ("budget", "guard:budget")])
async def test_an_approval_message_is_queued_and_delivered_before_the_next_prompt(
    test_frame: None, label: str | None, expected: str
) -> None:
    note = "please keep it short"
    handler = Recorder(approve({"max_cost": 1, "message": note}))
    with pricey(replies=["one", "two"]) as fake, agency.handler(handler):
        async with agency.cost_guard(0.1, label=label):
            await agency.llm("first", model=fake.model)
            queued = agency.thread.current().queued_messages
            assert [(q.role, q.content, q.label) for q in queued] == [("user", note, expected)]
            await agency.llm("second", model=fake.model)
    sent = [m["content"] for m in fake.calls[1].messages]
    assert sent == ["first", "one", note, "second"]
    labels = [m.label for m in agency.thread.current().get_messages()]
    assert labels == [None, None, expected, None, None]


async def test_an_unanswered_trip_pauses_the_run_and_an_approval_completes_it(
    store: Store,
) -> None:
    with pricey() as fake:

        async def entry() -> list[Any]:
            async with agency.cost_guard(0.1, label="llm budget"):
                answer = await agency.llm("hi", model=fake.model)
                agency.add_cost(0.01)  # within the granted budget
                return [answer, len(agency.thread.current().get_messages())]

        paused = await agency.run(entry, run_id="guard-pause", store=store)
        assert paused.status == "paused"
        assert len(paused.interrupts) == 1
        asked = paused.interrupts[0]
        assert asked.effect == "std::guard"
        assert asked.data["dimension"] == "cost"
        assert asked.data["limit"] == 0.1
        assert asked.data["spent"] == pytest.approx(CALL_COST)
        assert asked.data["label"] == "llm budget"
        assert "budget" in asked.message
        assert len(fake.calls) == 1

        done = await agency.respond_to_interrupts(paused, [approve({"max_cost": 1})], store=store)
    assert done.status == "completed", done.error
    assert done.value == ["ok", 2]
    assert len(fake.calls) == 1  # the model was not called again
    assert done.cost == pytest.approx(CALL_COST + 0.01)


async def test_rejecting_a_paused_trip_fails_the_run(store: Store) -> None:
    with pricey() as fake:

        async def entry() -> str:
            async with agency.cost_guard(0.1):
                return await agency.llm("hi", model=fake.model)

        paused = await agency.run(entry, store=store)
        done = await agency.respond_to_interrupts(paused, [reject()], store=store)
    assert done.status == "failed"
    assert done.error is not None
    assert done.error.type == "GuardExceededError"
    assert len(fake.calls) == 1


# -- budgets survive resume ------------------------------------------------------------------------


async def test_replayed_spend_still_counts_toward_the_guard(store: Store) -> None:
    attempts = {"flaky": 0}

    def flaky() -> None:
        attempts["flaky"] += 1
        if attempts["flaky"] == 1:
            raise RuntimeError("transient")

    async def entry() -> float:
        async def body(s: ResumableScope) -> float:
            async with agency.cost_guard(0.1):
                await s.step(lambda: agency.add_cost(0.08), name="spend")
                await s.step(flaky, name="flaky")
                await s.step(lambda: agency.add_cost(0.05), name="more")
            return agency.ctx().cost

        return await agency.with_resumable_scope("budget", body)

    first = await agency.run(entry, run_id="budget", store=store)
    assert first.status == "failed"
    assert first.error is not None
    assert first.error.type == "RuntimeError"
    assert first.cost == pytest.approx(0.08)

    second = await agency.run(entry, run_id="budget", store=store)
    assert attempts["flaky"] == 2
    assert second.status == "failed"
    assert second.error is not None
    assert second.error.type == "GuardExceededError"
    error = second.exception
    assert isinstance(error, GuardExceededError)
    assert error.spent == pytest.approx(0.13)
    assert error.limit == 0.1


async def test_a_grant_made_in_a_completed_step_survives_a_resume(store: Store) -> None:
    handler = Recorder(approve({"max_cost": 0.1}))
    attempts = {"flaky": 0}

    def flaky() -> None:
        attempts["flaky"] += 1
        if attempts["flaky"] == 1:
            raise RuntimeError("transient")

    with pricey() as fake:

        async def entry() -> float:
            async def body(s: ResumableScope) -> float:
                with agency.handler(handler):
                    async with agency.cost_guard(0.1):
                        # 0.15 over 0.1: the handler grants 0.1 more (limit 0.2).
                        await s.step(lambda: agency.llm("hi", model=fake.model), name="ask")
                        await s.step(flaky, name="flaky")
                        await s.step(lambda: agency.add_cost(0.01), name="more")  # 0.16 ≤ 0.2
                return agency.ctx().cost

            return await agency.with_resumable_scope("grant", body)

        first = await agency.run(entry, run_id="grant", store=store)
        assert first.status == "failed"
        assert first.error is not None
        assert first.error.type == "RuntimeError"
        second = await agency.run(entry, run_id="grant", store=store)
    assert second.status == "completed", second.error
    assert second.value == pytest.approx(CALL_COST + 0.01)
    assert len(fake.calls) == 1
    assert len(handler.heard) == 1  # the grant came from the journal, not a second question


async def test_a_human_grant_survives_a_later_failure(store: Store) -> None:
    attempts = {"flaky": 0}

    def flaky() -> None:
        attempts["flaky"] += 1
        if attempts["flaky"] == 1:
            raise RuntimeError("transient")

    with pricey() as fake:

        async def entry() -> str:
            async with agency.cost_guard(0.1):
                answer = await agency.llm("hi", model=fake.model)
                flaky()
                agency.add_cost(0.01)
                return answer

        paused = await agency.run(entry, run_id="human-grant", store=store)
        assert paused.status == "paused"
        failed = await agency.respond_to_interrupts(paused, [approve({"max_cost": 1})], store=store)
        assert failed.status == "failed"
        done = await agency.run(entry, run_id="human-grant", store=store)
    assert done.status == "completed", done.error
    assert done.value == "ok"
    assert len(fake.calls) == 1


# -- time guards -----------------------------------------------------------------------------------


# Time guards run on the frame's clock: a FakeClock here, moved by ``advance_when_blocked``
# once the work is in flight. The work "sleeps" 1 s of that clock; the guard's 0.05 s timer
# falls due first and must cancel it (were it not to, the sleep would end and nothing raise).


async def test_a_time_guard_stops_a_sleep(clock: FakeClock, timed_frame: None) -> None:
    finished: list[bool] = []
    async with anyio.create_task_group() as group:
        group.start_soon(advance_when_blocked, clock, 0.05, 1)
        with pytest.raises(GuardExceededError) as info:  # noqa: PT012 - the block is the subject
            async with agency.time_guard(0.05) as guard:
                await clock.sleep(1)
                finished.append(True)
    assert finished == []  # stopped at 0.05 s, long before the sleep's end
    error = info.value
    assert error.type == "time"
    assert error.limit == 0.05
    assert error.spent == pytest.approx(0.05)
    assert error.guard_id == guard.guard_id


async def test_with_time_guard_stops_slow_work(clock: FakeClock, timed_frame: None) -> None:
    finished: list[bool] = []

    async def slow() -> None:
        await clock.sleep(1)
        finished.append(True)

    async with anyio.create_task_group() as group:
        group.start_soon(advance_when_blocked, clock, 0.05, 1)
        with pytest.raises(GuardExceededError) as info:
            await agency.with_time_guard(0.05, slow)
    assert info.value.type == "time"
    assert info.value.spent == pytest.approx(0.05)
    assert finished == []


async def test_on_the_system_clock_a_time_guard_trips_at_its_deadline(test_frame: None) -> None:
    """The real clock's path (the guard sets its cancel scope's deadline), kept covered."""
    with anyio.fail_after(10):  # a safety net: without the guard the block would never end
        with pytest.raises(GuardExceededError) as info:
            async with agency.time_guard(0.01):
                await anyio.sleep_forever()
    assert info.value.type == "time"
    assert info.value.spent >= 0.01


def cooperative_loop(signal: AbortSignal) -> str:
    """CPU-style work that only stops when ``signal`` fires (or after 10 s, as a safety net).

    Returns why it stopped: ``"signal"``, or ``"safety net"`` when the signal never fired.
    """
    deadline = time.monotonic() + 10
    while not signal.aborted:  # a worker thread cannot await: it polls, with a deadline
        if time.monotonic() > deadline:
            return "safety net"
        time.sleep(0.001)  # one round of work
    return "signal"


async def test_a_time_guard_fires_the_abort_signal_seen_inside(
    clock: FakeClock, timed_frame: None
) -> None:
    outer_signal = agency.abort_signal()
    seen: dict[str, Any] = {}
    async with anyio.create_task_group() as group:
        group.start_soon(advance_when_blocked, clock, 0.05)
        with pytest.raises(GuardExceededError) as info:  # noqa: PT012 - the block is the subject
            async with agency.time_guard(0.05):
                signal = agency.abort_signal()
                seen["signal"] = signal
                # A worker thread cannot be cancelled: only the signal can stop its loop.
                seen["stopped by"] = await anyio.to_thread.run_sync(cooperative_loop, signal)
                seen["stopped at"] = clock.monotonic()
                await anyio.lowlevel.checkpoint()  # the next await in the block is cancelled
                seen["not reached"] = True
    assert info.value.type == "time"
    assert seen["stopped by"] == "signal"
    assert seen["stopped at"] == pytest.approx(0.05)
    assert "not reached" not in seen
    signal = seen["signal"]
    assert signal is not outer_signal
    assert signal.aborted
    assert isinstance(signal.reason, GuardExceededError)
    assert signal.reason.type == "time"
    assert not outer_signal.aborted  # the guard's signal is the block's, not the run's


async def test_a_cooperatively_stopped_block_still_raises_the_time_trip(
    clock: FakeClock, timed_frame: None
) -> None:
    stopped: list[str] = []
    async with anyio.create_task_group() as group:
        group.start_soon(advance_when_blocked, clock, 0.05)
        with pytest.raises(GuardExceededError) as info:  # noqa: PT012 - the block is the subject
            async with agency.time_guard(0.05):
                signal = agency.abort_signal()
                stopped.append(await anyio.to_thread.run_sync(cooperative_loop, signal))
    assert info.value.type == "time"
    assert stopped == ["signal"]  # the block ended by itself, and still raised the trip


async def test_a_cost_guard_never_fires_the_abort_signal(test_frame: None) -> None:
    with pricey() as fake, agency.handler(Recorder(reject())):
        async with agency.cost_guard(0.1):
            signal = agency.abort_signal()
            with pytest.raises(GuardExceededError):
                agency.add_cost(0.2)
            with pytest.raises(GuardExceededError):
                await agency.llm("hi", model=fake.model)
            assert not signal.aborted
    assert not agency.abort_signal().aborted


async def test_a_time_guard_trip_in_a_run_fails_the_run(
    make_store: Callable[..., Store], fake_clock: FakeClock
) -> None:
    store = make_store(clock=fake_clock)
    finished: list[bool] = []

    async def entry() -> None:
        async with agency.time_guard(0.05):
            await agency.ctx().clock.sleep(5)  # the run's clock is the fake one
            finished.append(True)

    async with anyio.create_task_group() as group:
        group.start_soon(advance_when_blocked, fake_clock, 0.05, 5)
        result = await agency.run(entry, store=store)
    assert finished == []
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "GuardExceededError"


# -- bad arguments ---------------------------------------------------------------------------------


@pytest.mark.parametrize("max_usd", [-0.01, math.nan, math.inf, "1"])
async def test_bad_max_usd_is_rejected(test_frame: None, max_usd: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        await agency.with_cost_guard(max_usd, lambda: None)
    with pytest.raises(InvalidArgumentError):
        async with agency.cost_guard(max_usd):
            pass  # pragma: no cover


@pytest.mark.parametrize("seconds", [0, -1, math.nan, math.inf])
async def test_bad_seconds_are_rejected(test_frame: None, seconds: float) -> None:
    with pytest.raises(InvalidArgumentError):
        await agency.with_time_guard(seconds, lambda: None)
    with pytest.raises(InvalidArgumentError):
        async with agency.time_guard(seconds):
            pass  # pragma: no cover


@pytest.mark.parametrize("fn", [None, "not callable", 42])
async def test_non_callable_fn_is_rejected(test_frame: None, fn: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        await agency.with_cost_guard(0.1, fn)
    with pytest.raises(InvalidArgumentError):
        await agency.with_time_guard(1, fn)


@pytest.mark.parametrize("amount", [-0.1, math.nan, math.inf])
async def test_add_cost_rejects_bad_amounts_before_changing_anything(
    test_frame: None, amount: float
) -> None:
    async with agency.cost_guard(0.1) as guard:
        with pytest.raises(InvalidArgumentError):
            agency.add_cost(amount)
        assert guard.spent == 0
    assert agency.ctx().cost == 0


async def test_bad_arguments_are_value_errors(test_frame: None) -> None:
    with pytest.raises(ValueError, match="add_cost"):
        agency.add_cost(-1)
    assert issubclass(InvalidArgumentError, AgencyError)


# -- the GuardExceededError message says which guard, how much, and what to do -------------------


def test_a_cost_trip_message_names_the_guard_in_dollars_and_the_ways_on() -> None:
    error = GuardExceededError("cost", 0.05, 0.06, "cost-guard:/#0", "research")
    message = str(error)
    assert message.startswith(
        'cost guard "research" exceeded its budget of $0.050000 (US dollars): spent $0.060000 '
        "(guard id cost-guard:/#0)."
    )
    assert "agency.cost_guard(...)" in message  # raise the limit
    assert 'approve({"max_cost": <extra US dollars>})' in message  # or grant more
    assert "std::guard" in message
    assert "catch GuardExceededError" in message  # or handle it
    assert "max_time" not in message
    # The attributes and the positional constructor are unchanged.
    assert (error.type, error.limit, error.spent, error.guard_id, error.label) == (
        "cost",
        0.05,
        0.06,
        "cost-guard:/#0",
        "research",
    )


def test_an_unlabelled_trip_is_named_by_its_guard_id_and_keeps_small_amounts() -> None:
    message = str(GuardExceededError("cost", 0.0, 1.5e-10, "cost-guard:a/1#2"))
    assert message.startswith(
        "cost guard cost-guard:a/1#2 exceeded its budget of $0.000000 (US dollars): "
        "spent $0.00000000015."
    )
    assert "(guard id" not in message


def test_a_time_trip_message_is_in_seconds_and_suggests_max_time() -> None:
    message = str(GuardExceededError("time", 30, 30.0421, "time-guard:/#0", "slow"))
    assert message.startswith(
        'time guard "slow" exceeded its budget of 30 seconds: 30.042 seconds passed '
        "(guard id time-guard:/#0)."
    )
    assert "agency.time_guard(...)" in message
    assert 'approve({"max_time": <extra seconds>})' in message
    assert "$" not in message
    assert "max_cost" not in message


async def test_an_add_cost_trip_says_which_guard_and_what_to_do(test_frame: None) -> None:
    async with agency.cost_guard(0.05, label="research") as guard:
        with pytest.raises(GuardExceededError) as info:
            agency.add_cost(0.06)
    message = str(info.value)
    assert 'cost guard "research" exceeded its budget of $0.050000' in message
    assert "spent $0.060000" in message
    assert guard.guard_id in message
    assert "max_cost" in message


async def test_a_time_guard_trip_says_seconds(clock: FakeClock, timed_frame: None) -> None:
    async with anyio.create_task_group() as group:
        group.start_soon(advance_when_blocked, clock, 0.05, 1)
        with pytest.raises(GuardExceededError) as info:
            async with agency.time_guard(0.05):
                await clock.sleep(1)
    message = str(info.value)
    assert message.startswith("time guard time-guard:")
    assert "exceeded its budget of 0.05 seconds" in message
    assert "max_time" in message


async def test_a_rejected_guard_interrupt_raises_the_explained_error(test_frame: None) -> None:
    with pricey() as fake, agency.handler(Recorder(reject())):
        async with agency.cost_guard(0.1, label="llm-budget"):
            with pytest.raises(GuardExceededError) as info:
                await agency.llm("hi", model=fake.model)
    message = str(info.value)
    assert 'cost guard "llm-budget" exceeded its budget of $0.100000' in message
    assert f"spent ${CALL_COST:.6f}" in message
    assert 'approve({"max_cost": <extra US dollars>})' in message
