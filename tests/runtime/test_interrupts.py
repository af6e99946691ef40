"""Interrupts and handlers: the handler chain, pausing a run, and answering its interrupts.

Covers DESIGN.md §4 "Pause, interrupts and handlers", §7 (handler and
``respond_to_interrupts`` signatures), §8 "Interrupts, guards and money", and the
"agencyInterrupt" / "ts-helpers" cases of the spec's §6.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel

from agency_runtime import (
    AgencyCancelledError,
    AgencyError,
    HandlerDecision,
    HandlerRecursionError,
    Interrupt,
    InterruptAnswerError,
    InterruptResponse,
    InvalidArgumentError,
    MemoryStore,
    ResumableScope,
    RunNotFoundError,
    RunPaused,
    RunPausedError,
    RunResult,
    Store,
    agency,
    approve,
    pass_,
    propagate,
    reject,
)

pytestmark = pytest.mark.anyio

NO_RUN = "belongs to no run"
"""Part of the error agency.interrupt raises in a test frame when nobody answers."""

# Module-level state the run entries below read and write (entries re-run on resume).
side: list[str] = []
counts: dict[str, int] = {}
flags: dict[str, bool] = {}
spy_calls: list[str] = []


@pytest.fixture(autouse=True)
def _reset_state() -> None:
    side.clear()
    counts.clear()
    flags.clear()
    spy_calls.clear()


def bump(name: str) -> int:
    counts[name] = counts.get(name, 0) + 1
    return counts[name]


async def status_of(run_id: str, store: Any) -> str:
    return (await agency.runs.get(run_id, store=store)).status


async def pending_answers(run_id: str, store: Store) -> dict[str, InterruptResponse | None]:
    journal = await store.load_journal(run_id)
    return {a.interrupt.interrupt_id: a.response for a in journal.answers}


# -- run entries ------------------------------------------------------------------------------


async def ask_once() -> str:
    """Pause on one interrupt outside any scope; record what runs before and after it."""
    side.append("before")
    answer = await agency.interrupt(
        "send_email",
        message="Send the email?",
        data={"to": ["ada@example.com"], "n": 2},
        expects_value=True,
    )
    side.append("after")
    return f"{answer.type}:{answer.value}"


async def ask_in_steps() -> dict[str, Any]:
    """Three steps in a resumable scope; the middle one asks a question."""

    async def body(s: ResumableScope) -> dict[str, Any]:
        first = await s.step(lambda: bump("prepare"), name="prepare")

        async def ask() -> Any:
            bump("ask")
            answer = await agency.interrupt("confirm", message="go on?")
            return answer.value

        asked = await s.step(ask, name="ask")
        last = await s.step(lambda: bump("finish"), name="finish")
        return {"first": first, "asked": asked, "last": last}

    return await agency.with_resumable_scope("flow", body)


async def spy(intr: Interrupt) -> InterruptResponse:
    spy_calls.append(intr.effect)
    return reject("the spy answered")


async def ask_with_handler_on_second_execution() -> Any:
    """Install a handler around the interrupt only when ``flags['second']`` is set."""

    async def body(s: ResumableScope) -> Any:
        async def ask() -> Any:
            if flags.get("second"):
                with agency.handler(spy):
                    answer = await agency.interrupt("confirm")
            else:
                answer = await agency.interrupt("confirm")
            return {"type": answer.type, "value": answer.value}

        return await s.step(ask, name="ask")

    return await agency.with_resumable_scope("flow", body)


async def ask_twice_in_one_step() -> list[Any]:
    async def body(s: ResumableScope) -> list[Any]:
        async def ask_both() -> list[Any]:
            bump("both")
            first = await agency.interrupt("first", message="one")
            side.append("between")
            second = await agency.interrupt("second", message="two")
            side.append("end")
            return [first.value, second.value]

        return await s.step(ask_both, name="both")

    return await agency.with_resumable_scope("seq", body)


async def ask_in_parallel() -> dict[str, Any]:
    async def body(s: ResumableScope) -> dict[str, Any]:
        async def both() -> dict[str, Any]:
            got: dict[str, Any] = {}

            async def ask(who: str) -> None:
                got[who] = (await agency.interrupt("ask", message=who, data={"who": who})).value

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, "a")
                tg.start_soon(ask, "b")
            side.append("joined")
            return got

        return await s.step(both, name="both")

    return await agency.with_resumable_scope("par", body)


async def paused_run(store: Store, entry: Any = ask_once, run_id: str = "r1") -> RunResult:
    result = await agency.run(entry, run_id=run_id, store=store)
    assert result.status == "paused", result
    return result


# -- handlers answer interrupts --------------------------------------------------------------


async def test_a_sync_handlers_approval_is_returned() -> None:
    seen: list[Interrupt] = []

    def handler(intr: Interrupt) -> InterruptResponse:
        seen.append(intr)
        return approve("yes")

    with agency.test_context(), agency.handler(handler):
        answer = await agency.interrupt(
            "deploy", message="Deploy now?", data={"env": "prod"}, expects_value=True
        )
    assert answer == InterruptResponse(type="approve", value="yes")
    assert answer.approved
    assert len(seen) == 1
    assert seen[0].effect == "deploy"
    assert seen[0].message == "Deploy now?"
    assert seen[0].data == {"env": "prod"}
    assert seen[0].expects_value is True


async def test_an_async_handlers_rejection_is_returned_through_with_handler() -> None:
    async def handler(intr: Interrupt) -> InterruptResponse:
        await anyio.lowlevel.checkpoint()
        return reject({"why": intr.message})

    async def body() -> InterruptResponse:
        return await agency.interrupt("delete", message="Delete it all?")

    with agency.test_context():
        answer = await agency.with_handler(handler, body)
    assert answer.type == "reject"
    assert answer.value == {"why": "Delete it all?"}
    assert not answer.approved


async def test_effect_defaults_to_unknown_and_the_rest_to_empty() -> None:
    seen: list[Interrupt] = []

    def handler(intr: Interrupt) -> InterruptResponse:
        seen.append(intr)
        return approve()

    with agency.test_context(), agency.handler(handler):
        answer = await agency.interrupt()
    assert answer == approve()
    assert answer.value is None
    assert seen[0].effect == "unknown"
    assert seen[0].message == ""
    assert seen[0].data is None
    assert seen[0].expects_value is False


async def test_a_handler_may_answer_with_a_handler_decision_approve() -> None:
    with agency.test_context(), agency.handler(lambda i: HandlerDecision(type="approve", value=3)):
        answer = await agency.interrupt("x")
    assert answer.type == "approve"
    assert answer.value == 3


# -- the chain --------------------------------------------------------------------------------


def recording(name: str, visits: list[str], decision: Any) -> Any:
    def handler(intr: Interrupt) -> Any:
        visits.append(name)
        return decision

    return handler


async def test_every_handler_is_visited_innermost_first_and_the_outermost_approval_wins() -> None:
    visits: list[str] = []
    with (
        agency.test_context(),
        agency.handler(recording("outer", visits, approve("outer"))),
        agency.handler(recording("middle", visits, approve("middle"))),
        agency.handler(recording("inner", visits, approve("inner"))),
    ):
        answer = await agency.interrupt("x")
    assert visits == ["inner", "middle", "outer"]
    assert answer == approve("outer")


async def test_a_rejection_stops_the_walk() -> None:
    visits: list[str] = []
    with (
        agency.test_context(),
        agency.handler(recording("outer", visits, approve("outer"))),
        agency.handler(recording("middle", visits, reject("no"))),
        agency.handler(recording("inner", visits, approve("inner"))),
    ):
        answer = await agency.interrupt("x")
    assert visits == ["inner", "middle"]
    assert answer == reject("no")


async def test_propagate_beats_approvals_in_a_test_frame() -> None:
    visits: list[str] = []
    with (
        agency.test_context(),
        agency.handler(recording("outer", visits, approve("outer"))),
        agency.handler(recording("inner", visits, propagate())),
        pytest.raises(AgencyError, match=NO_RUN),
    ):
        await agency.interrupt("x")
    assert visits == ["inner", "outer"]


async def test_propagate_beats_approvals_in_a_run(store: Store) -> None:
    visits: list[str] = []

    async def entry() -> str:
        with (
            agency.handler(recording("outer", visits, approve("outer"))),
            agency.handler(recording("inner", visits, propagate())),
        ):
            await agency.interrupt("x", message="escalate")
        side.append("after")
        return "done"

    result = await agency.run(entry, store=store)
    assert result.status == "paused"
    assert [i.message for i in result.interrupts] == ["escalate"]
    assert visits == ["inner", "outer"]
    assert side == []


@pytest.mark.parametrize("no_opinion", [pass_(), None], ids=["pass_", "None"])
async def test_pass_and_none_are_no_opinion(no_opinion: Any) -> None:
    visits: list[str] = []
    with agency.test_context():
        with (
            agency.handler(recording("outer", visits, reject("outer says no"))),
            agency.handler(recording("inner", visits, no_opinion)),
        ):
            answer = await agency.interrupt("x")
        assert answer == reject("outer says no")
        assert visits == ["inner", "outer"]

        # Alone, a handler with no opinion leaves the question unanswered.
        with (
            agency.handler(recording("alone", visits, no_opinion)),
            pytest.raises(AgencyError, match=NO_RUN),
        ):
            await agency.interrupt("x")
    assert visits == ["inner", "outer", "alone"]


@pytest.mark.parametrize("bad", ["yes", True, {"type": "approve"}, 1], ids=repr)
async def test_an_invalid_handler_result_raises(bad: Any) -> None:
    with (
        agency.test_context(),
        agency.handler(lambda i: bad),
        pytest.raises(InvalidArgumentError, match="Handler returned invalid result type"),
    ):
        await agency.interrupt("x")


async def test_with_handler_returns_fns_value_and_pops_the_handler_afterwards() -> None:
    calls: list[str] = []

    def handler(intr: Interrupt) -> InterruptResponse:
        calls.append(intr.effect)
        return approve()

    with agency.test_context():
        assert await agency.with_handler(handler, lambda: 42) == 42
        with pytest.raises(AgencyError, match=NO_RUN):
            await agency.interrupt("after-with-handler")
        with agency.handler(handler):
            pass
        with pytest.raises(AgencyError, match=NO_RUN):
            await agency.interrupt("after-handler-block")
    assert calls == []


async def test_handlers_are_popped_when_fn_raises() -> None:
    calls: list[str] = []

    def handler(intr: Interrupt) -> InterruptResponse:
        calls.append(intr.effect)
        return approve()

    async def boom() -> None:
        assert (await agency.interrupt("inside")).approved
        raise KeyError("boom")

    with agency.test_context():
        with pytest.raises(KeyError, match="boom"):
            await agency.with_handler(handler, boom)
        with pytest.raises(AgencyError, match=NO_RUN):
            await agency.interrupt("after-with-handler")
        with pytest.raises(KeyError, match="boom"), agency.handler(handler):
            await boom()
        with pytest.raises(AgencyError, match=NO_RUN):
            await agency.interrupt("after-handler-block")
    assert calls == ["inside", "inside"]


async def test_handler_arguments_are_checked() -> None:
    with agency.test_context():
        with pytest.raises(InvalidArgumentError):
            await agency.with_handler("not callable", lambda: None)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await agency.with_handler(lambda i: None, "not callable")  # type: ignore[arg-type]


# -- a handler never hears its own raise ------------------------------------------------------


async def test_a_handlers_own_interrupt_is_answered_by_the_other_handlers() -> None:
    heard: dict[str, list[str]] = {"inner": [], "outer": []}

    def outer(intr: Interrupt) -> InterruptResponse | None:
        heard["outer"].append(intr.effect)
        if intr.effect == "second-opinion":
            return approve("from-outer")
        return None

    async def inner(intr: Interrupt) -> InterruptResponse:
        heard["inner"].append(intr.effect)
        opinion = await agency.interrupt("second-opinion")
        return approve(f"inner, after {opinion.value}")

    with agency.test_context(), agency.handler(outer), agency.handler(inner):
        answer = await agency.interrupt("main")
    assert answer == approve("inner, after from-outer")
    assert heard["inner"] == ["main"]  # never its own "second-opinion"
    assert heard["outer"] == ["second-opinion", "main"]


async def test_a_handlers_own_interrupt_with_nobody_to_answer_is_a_rejection() -> None:
    nested: list[InterruptResponse] = []

    async def handler(intr: Interrupt) -> InterruptResponse:
        nested.append(await agency.interrupt("ask-a-human"))
        return approve("handled")

    with agency.test_context(), agency.handler(handler):
        answer = await agency.interrupt("main")
    assert answer == approve("handled")
    assert len(nested) == 1
    assert nested[0].type == "reject"
    assert "from inside a handler function" in nested[0].value
    assert "ask-a-human" in nested[0].value


async def test_a_handlers_own_interrupt_does_not_pause_a_run(store: Store) -> None:
    nested: list[InterruptResponse] = []

    async def handler(intr: Interrupt) -> InterruptResponse:
        nested.append(await agency.interrupt("ask-a-human"))
        return approve("handled")

    async def entry() -> Any:
        with agency.handler(handler):
            return (await agency.interrupt("main")).value

    result = await agency.run(entry, store=store)
    assert result.status == "completed"
    assert result.value == "handled"
    assert nested[0].type == "reject"
    assert "from inside a handler function" in nested[0].value


async def test_handlers_raising_interrupts_too_deep_raise_handler_recursion_error() -> None:
    depth = 0

    async def recursive(intr: Interrupt) -> InterruptResponse:
        nonlocal depth
        depth += 1
        with agency.handler(recursive):
            await agency.interrupt("deeper")
        return approve()

    with (
        agency.test_context(),
        agency.handler(recursive),
        pytest.raises(HandlerRecursionError),
    ):
        await agency.interrupt("top")
    assert 10 <= depth <= 11


async def test_handlers_nested_a_few_deep_are_fine() -> None:
    depth = 0

    async def recursive(intr: Interrupt) -> InterruptResponse:
        nonlocal depth
        depth += 1
        if depth < 5:
            with agency.handler(recursive):
                inner = await agency.interrupt("deeper")
            return approve(inner.value + 1)
        return approve(0)

    with agency.test_context(), agency.handler(recursive):
        answer = await agency.interrupt("top")
    assert answer == approve(4)
    assert depth == 5


# -- pausing a run ----------------------------------------------------------------------------


async def test_with_no_handler_the_run_pauses_and_nothing_after_the_interrupt_runs(
    store: Store,
) -> None:
    result = await agency.run(ask_once, run_id="pause-1", store=store)
    assert result.status == "paused"
    assert side == ["before"]
    assert len(result.interrupts) == 1
    intr = result.interrupts[0]
    assert isinstance(intr, Interrupt)
    assert intr.effect == "send_email"
    assert intr.message == "Send the email?"
    assert intr.data == {"to": ["ada@example.com"], "n": 2}
    assert intr.expects_value is True
    assert intr.run_id == result.run_id == "pause-1"
    assert intr.interrupt_id
    with pytest.raises(RunPausedError, match="respond_to_interrupts") as info:
        result.unwrap()
    assert info.value.result is result
    stored = await agency.runs.get("pause-1", store=store)
    assert stored.status == "paused"
    assert [i.interrupt_id for i in stored.interrupts] == [intr.interrupt_id]


async def test_an_interrupt_round_trips_through_json(store: Store) -> None:
    intr = (await paused_run(store)).interrupts[0]
    again = Interrupt.model_validate_json(intr.model_dump_json())
    assert again == intr
    assert again.interrupt_id == intr.interrupt_id
    assert again.data == {"to": ["ada@example.com"], "n": 2}
    result = await paused_run(MemoryStore(), run_id="r2")
    assert RunResult.model_validate_json(result.model_dump_json()).interrupts == result.interrupts


async def test_interrupt_ids_are_deterministic() -> None:
    first = await paused_run(MemoryStore(), ask_in_steps, run_id="same-id")
    second = await paused_run(MemoryStore(), ask_in_steps, run_id="same-id")
    other = await paused_run(MemoryStore(), ask_in_steps, run_id="other-id")
    assert first.interrupts[0].interrupt_id == second.interrupts[0].interrupt_id
    assert first.interrupts[0].interrupt_id != other.interrupts[0].interrupt_id
    # Outside a scope too.
    a = await paused_run(MemoryStore(), ask_once, run_id="same-id")
    b = await paused_run(MemoryStore(), ask_once, run_id="same-id")
    assert a.interrupts[0].interrupt_id == b.interrupts[0].interrupt_id
    assert a.interrupts[0].interrupt_id != first.interrupts[0].interrupt_id


async def test_except_exception_in_the_entry_does_not_swallow_the_pause(
    store: Store,
) -> None:
    assert issubclass(RunPaused, BaseException)
    assert not issubclass(RunPaused, Exception)

    async def entry() -> str:
        try:
            await agency.interrupt("confirm")
        except Exception:
            side.append("swallowed")
            return "swallowed"
        side.append("after")
        return "answered"

    result = await agency.run(entry, store=store)
    assert result.status == "paused"
    assert side == []
    done = await agency.respond_to_interrupts(result, [approve()], store=store)
    assert done.status == "completed"
    assert done.value == "answered"
    assert side == ["after"]


# -- answering --------------------------------------------------------------------------------


async def test_answering_with_a_list_completes_the_run(store: Store) -> None:
    result = await paused_run(store)
    done = await agency.respond_to_interrupts(result.interrupts, [approve("ok")], store=store)
    assert done.status == "completed"
    assert done.run_id == "r1"
    assert done.value == "approve:ok"
    assert done.unwrap() == "approve:ok"
    assert side == ["before", "before", "after"]
    assert await status_of("r1", store) == "completed"


async def test_answering_with_a_dict_keyed_by_interrupt_id(store: Store) -> None:
    result = await paused_run(store)
    key = result.interrupts[0].interrupt_id
    done = await agency.respond_to_interrupts(
        result.interrupts, {key: reject({"reason": "no"})}, store=store
    )
    assert done.status == "completed"
    assert done.value == "reject:{'reason': 'no'}"


async def test_answering_with_the_paused_run_result(store: Store) -> None:
    result = await paused_run(store)
    done = await agency.respond_to_interrupts(result, [approve(7)], store=store)
    assert done.status == "completed"
    assert done.value == "approve:7"


async def test_answering_with_interrupts_as_json_dicts(store: Store) -> None:
    result = await paused_run(store)
    as_json = [i.model_dump(mode="json") for i in result.interrupts]
    done = await agency.respond_to_interrupts(as_json, [approve("json")], store=store)
    assert done.value == "approve:json"


async def test_completed_steps_are_not_rerun_and_the_answer_reaches_the_code(
    store: Store,
) -> None:
    result = await paused_run(store, ask_in_steps)
    assert counts == {"prepare": 1, "ask": 1}
    done = await agency.respond_to_interrupts(result, [approve("go")], store=store)
    assert done.status == "completed"
    assert done.value == {"first": 1, "asked": "go", "last": 1}
    # Only the step that was in flight ran again.
    assert counts == {"prepare": 1, "ask": 2, "finish": 1}


async def test_on_resume_the_recorded_answer_is_returned_without_running_handlers(
    store: Store,
) -> None:
    result = await paused_run(store, ask_with_handler_on_second_execution)
    flags["second"] = True
    done = await agency.respond_to_interrupts(result, [approve("human")], store=store)
    assert done.status == "completed"
    assert done.value == {"type": "approve", "value": "human"}
    assert spy_calls == []


async def test_a_run_is_idempotent_after_answers(store: Store) -> None:
    result = await paused_run(store, ask_in_steps)
    done = await agency.respond_to_interrupts(result, [approve("go")], store=store)
    again = await agency.run(ask_in_steps, run_id="r1", store=store)
    assert again.status == "completed"
    assert again.value == done.value
    assert counts == {"prepare": 1, "ask": 2, "finish": 1}


# -- several interrupts -----------------------------------------------------------------------


async def test_two_interrupts_in_sequence_in_one_step(store: Store) -> None:
    result = await paused_run(store, ask_twice_in_one_step)
    assert [i.effect for i in result.interrupts] == ["first"]
    assert side == []
    first = result.interrupts[0]

    result2 = await agency.respond_to_interrupts(result, [approve(1)], store=store)
    assert result2.status == "paused"
    assert [i.effect for i in result2.interrupts] == ["second"]
    second = result2.interrupts[0]
    assert second.interrupt_id != first.interrupt_id
    assert side == ["between"]

    done = await agency.respond_to_interrupts(result2, [approve(2)], store=store)
    assert done.status == "completed"
    assert done.value == [1, 2]
    assert side == ["between", "between", "end"]
    assert counts == {"both": 3}


async def test_two_interrupts_in_parallel_children_of_a_task_group(store: Store) -> None:
    result = await paused_run(store, ask_in_parallel)
    assert sorted(i.message for i in result.interrupts) == ["a", "b"]
    assert len({i.interrupt_id for i in result.interrupts}) == 2
    assert side == []
    stored = await agency.runs.get("r1", store=store)
    assert len(stored.interrupts) == 2

    answers = {i.interrupt_id: approve(f"answer-{i.message}") for i in result.interrupts}
    done = await agency.respond_to_interrupts(result, answers, store=store)
    assert done.status == "completed"
    assert done.value == {"a": "answer-a", "b": "answer-b"}
    assert side == ["joined"]


async def test_parallel_interrupts_answered_with_a_list(store: Store) -> None:
    result = await paused_run(store, ask_in_parallel)
    answers = [reject(i.data["who"]) for i in result.interrupts]
    done = await agency.respond_to_interrupts(result, answers, store=store)
    assert done.status == "completed"
    assert done.value == {"a": "a", "b": "b"}


# -- bad answers ------------------------------------------------------------------------------


async def assert_still_answerable(result: RunResult, store: Store) -> None:
    """A refused call stored nothing: the run is paused, its answers empty, and answerable."""
    assert await status_of(result.run_id, store) == "paused"
    answers = await pending_answers(result.run_id, store)
    assert set(answers) == {i.interrupt_id for i in result.interrupts}
    assert all(response is None for response in answers.values())
    done = await agency.respond_to_interrupts(
        result,
        {i.interrupt_id: approve(f"answer-{i.message}") for i in result.interrupts},
        store=store,
    )
    assert done.status == "completed"


async def test_the_wrong_number_of_answers_is_refused(store: Store) -> None:
    result = await paused_run(store, ask_in_parallel)
    with pytest.raises(InterruptAnswerError, match="2 interrupt") as info:
        await agency.respond_to_interrupts(result, [approve()], store=store)
    assert isinstance(info.value, ValueError)
    with pytest.raises(InterruptAnswerError):
        await agency.respond_to_interrupts(result, [approve()] * 3, store=store)
    with pytest.raises(InterruptAnswerError):
        await agency.respond_to_interrupts(result, [], store=store)
    await assert_still_answerable(result, store)


async def test_a_dict_with_an_unknown_or_a_missing_id_is_refused(store: Store) -> None:
    result = await paused_run(store, ask_in_parallel)
    a, b = result.interrupts
    with pytest.raises(InterruptAnswerError, match="intr_bogus"):
        await agency.respond_to_interrupts(
            result,
            {a.interrupt_id: approve(), b.interrupt_id: approve(), "intr_bogus": approve()},
            store=store,
        )
    with pytest.raises(InterruptAnswerError, match=b.interrupt_id):
        await agency.respond_to_interrupts(result, {a.interrupt_id: approve()}, store=store)
    await assert_still_answerable(result, store)


@pytest.mark.parametrize(
    "bad",
    [propagate(), pass_(), "yes", None, {"type": "maybe"}],
    ids=["propagate", "pass_", "str", "None", "bad-dict"],
)
async def test_an_answer_that_is_not_approve_or_reject_is_refused(store: Store, bad: Any) -> None:
    result = await paused_run(store, ask_in_parallel)
    with pytest.raises(InterruptAnswerError, match="approve"):
        await agency.respond_to_interrupts(result, [approve(), bad], store=store)
    a, b = result.interrupts
    with pytest.raises(InterruptAnswerError):
        await agency.respond_to_interrupts(
            result, {a.interrupt_id: bad, b.interrupt_id: approve()}, store=store
        )
    await assert_still_answerable(result, store)


async def test_answering_a_completed_run_is_refused(store: Store) -> None:
    result = await paused_run(store)
    done = await agency.respond_to_interrupts(result, [approve("ok")], store=store)
    assert done.status == "completed"
    with pytest.raises(InterruptAnswerError, match="not paused"):
        await agency.respond_to_interrupts(result, [approve("again")], store=store)
    assert side == ["before", "before", "after"]
    stored = await agency.runs.get("r1", store=store)
    assert stored.status == "completed"
    assert (await agency.run(ask_once, run_id="r1", store=store)).value == "approve:ok"


async def test_answering_an_interrupt_twice_is_refused(store: Store) -> None:
    result = await paused_run(store, ask_twice_in_one_step)
    result2 = await agency.respond_to_interrupts(result, [approve(1)], store=store)
    assert result2.status == "paused"
    with pytest.raises(InterruptAnswerError, match="not pending"):
        await agency.respond_to_interrupts(result, [approve("again")], store=store)
    # A mix of an answered and a pending interrupt stores neither.
    with pytest.raises(InterruptAnswerError, match="not pending"):
        await agency.respond_to_interrupts(
            [*result.interrupts, *result2.interrupts], [approve("x"), approve("y")], store=store
        )
    answers = await pending_answers("r1", store)
    assert answers[result.interrupts[0].interrupt_id] == approve(1)
    assert answers[result2.interrupts[0].interrupt_id] is None
    done = await agency.respond_to_interrupts(result2, [approve(2)], store=store)
    assert done.status == "completed"
    assert done.value == [1, 2]


async def test_an_unknown_interrupt_id_of_a_paused_run_stores_nothing(
    store: Store,
) -> None:
    result = await paused_run(store, ask_in_parallel)
    bogus = result.interrupts[0].model_copy(update={"interrupt_id": "intr_bogus"})
    with pytest.raises(InterruptAnswerError, match="not pending"):
        await agency.respond_to_interrupts(
            [result.interrupts[1], bogus], [approve(), approve()], store=store
        )
    await assert_still_answerable(result, store)


async def test_answering_an_unknown_run_raises_run_not_found(store: Store) -> None:
    ghost = Interrupt(interrupt_id="intr_ghost", run_id="no-such-run")
    with pytest.raises(RunNotFoundError, match="no-such-run"):
        await agency.respond_to_interrupts([ghost], [approve()], store=store)


async def test_answering_nothing_or_interrupts_of_two_runs_is_refused(store: Store) -> None:
    one = await paused_run(store, run_id="one")
    two = await paused_run(store, run_id="two")
    with pytest.raises(InterruptAnswerError):
        await agency.respond_to_interrupts([], [], store=store)
    with pytest.raises(InterruptAnswerError, match="one run"):
        await agency.respond_to_interrupts(
            [*one.interrupts, *two.interrupts], [approve(), approve()], store=store
        )
    assert await status_of("one", store) == "paused"
    assert await status_of("two", store) == "paused"


# -- bad questions ----------------------------------------------------------------------------


async def test_non_json_data_is_refused() -> None:
    called: list[Interrupt] = []
    with (
        agency.test_context(),
        agency.handler(lambda i: called.append(i) or approve()),
        pytest.raises(InvalidArgumentError, match="JSON"),
    ):
        await agency.interrupt("x", data={"handle": object()})
    assert called == []


@pytest.mark.parametrize("effect", ["", "   "], ids=["empty", "blank"])
async def test_an_empty_effect_is_refused(effect: str) -> None:
    with (
        agency.test_context(),
        agency.handler(lambda i: approve()),
        pytest.raises(InvalidArgumentError, match="effect"),
    ):
        await agency.interrupt(effect)


async def test_non_json_data_inside_a_run_fails_the_run(store: Store) -> None:
    async def entry() -> None:
        await agency.interrupt("x", data=object())

    result = await agency.run(entry, store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "InvalidArgumentError"


async def test_in_a_test_frame_with_no_handler_interrupt_explains_it_needs_a_run() -> None:
    with agency.test_context(), pytest.raises(AgencyError, match=NO_RUN) as info:
        await agency.interrupt("confirm")
    assert "agency.run" in str(info.value)
    assert "with_handler" in str(info.value)


async def test_outside_any_frame_interrupt_raises() -> None:
    with pytest.raises(AgencyError, match="interrupt"):
        await agency.interrupt("confirm")


# -- more of the chain in a run ---------------------------------------------------------------


async def test_in_a_run_the_handler_sees_the_run_id_and_the_origin(store: Store) -> None:
    seen: list[Interrupt] = []

    def handler(intr: Interrupt) -> InterruptResponse:
        seen.append(intr)
        return approve(intr.effect)

    async def entry() -> list[Any]:
        with agency.handler(handler):
            root = (await agency.interrupt("at-root")).value

            async def body(s: ResumableScope) -> Any:
                async def ask() -> Any:
                    return (await agency.interrupt("in-step")).value

                return await s.step(ask, name="ask")

            in_step = await agency.with_resumable_scope("flow", body)
        return [root, in_step]

    result = await agency.run(entry, run_id="seen", store=store)
    assert result.status == "completed"
    assert result.value == ["at-root", "in-step"]
    assert [i.run_id for i in seen] == ["seen", "seen"]
    assert seen[1].origin == "<py-helper>"  # the scope's module id
    assert seen[0].interrupt_id != seen[1].interrupt_id


async def test_cancellation_is_checked_before_each_handler(store: Store) -> None:
    visits: list[str] = []

    def inner(intr: Interrupt) -> InterruptResponse:
        visits.append("inner")
        agency.ctx().cancel("stop asking")
        return approve()

    async def entry() -> str:
        with agency.handler(recording("outer", visits, approve())), agency.handler(inner):
            await agency.interrupt("x")
        side.append("after")
        return "done"

    result = await agency.run(entry, store=store)
    assert result.status == "cancelled"
    assert isinstance(result.exception, AgencyCancelledError)
    assert visits == ["inner"]
    assert side == []


async def test_a_handler_that_answered_in_a_completed_step_runs_once(store: Store) -> None:
    calls: list[str] = []

    def handler(intr: Interrupt) -> InterruptResponse:
        calls.append(intr.effect)
        return approve("from-handler")

    async def entry() -> list[Any]:
        async def body(s: ResumableScope) -> list[Any]:
            async def handled() -> Any:
                with agency.handler(handler):
                    return (await agency.interrupt("handled")).value

            async def human() -> Any:
                return (await agency.interrupt("human")).value

            return [await s.step(handled, name="handled"), await s.step(human, name="human")]

        return await agency.with_resumable_scope("ts-helpers", body)

    result = await agency.run(entry, store=store)
    assert [i.effect for i in result.interrupts] == ["human"]
    done = await agency.respond_to_interrupts(result, [approve("from-human")], store=store)
    assert done.value == ["from-handler", "from-human"]
    assert calls == ["handled"]


# -- more pausing and answering ---------------------------------------------------------------


async def test_interrupts_in_parallel_steps_all_reach_the_result(store: Store) -> None:
    async def entry() -> dict[str, Any]:
        async def body(s: ResumableScope) -> dict[str, Any]:
            out: dict[str, Any] = {}

            async def step(key: str) -> None:
                async def ask() -> Any:
                    return (await agency.interrupt("ask", message=key)).value

                out[key] = await s.step(ask, name=f"ask-{key}")

            async with anyio.create_task_group() as tg:
                tg.start_soon(step, "a")
                tg.start_soon(step, "b")
            return out

        return await agency.with_resumable_scope("parallel-steps", body)

    result = await agency.run(entry, store=store)
    assert result.status == "paused"
    assert sorted(i.message for i in result.interrupts) == ["a", "b"]
    done = await agency.respond_to_interrupts(
        result, {i.interrupt_id: approve(i.message * 2) for i in result.interrupts}, store=store
    )
    assert done.status == "completed"
    assert done.value == {"a": "aa", "b": "bb"}
    assert done.interrupts == []


async def test_answering_some_of_the_interrupts_pauses_on_the_rest(store: Store) -> None:
    result = await paused_run(store, ask_in_parallel)
    a, b = sorted(result.interrupts, key=lambda i: i.message)
    partial = await agency.respond_to_interrupts([a], [approve("A")], store=store)
    assert partial.status == "paused"
    assert [i.interrupt_id for i in partial.interrupts] == [b.interrupt_id]
    done = await agency.respond_to_interrupts(partial, [approve("B")], store=store)
    assert done.status == "completed"
    assert done.value == {"a": "A", "b": "B"}


async def test_running_a_paused_run_again_pauses_on_the_same_interrupt(store: Store) -> None:
    first = await paused_run(store)
    again = await agency.run(ask_once, run_id="r1", store=store)
    assert again.status == "paused"
    assert again.interrupts == first.interrupts
    done = await agency.respond_to_interrupts(first, [approve("late")], store=store)
    assert done.value == "approve:late"


async def test_answering_through_a_memory_url_in_the_same_process() -> None:
    url = f"memory://test-interrupts-{uuid.uuid4().hex}"
    result = await agency.run(ask_once, run_id="by-url", store=url)
    assert result.status == "paused"
    done = await agency.respond_to_interrupts(result, [approve("url")], store=url)
    assert done.status == "completed"
    assert done.value == "approve:url"


async def test_answering_a_completed_run_result_is_refused(store: Store) -> None:
    result = await paused_run(store)
    done = await agency.respond_to_interrupts(result, [approve()], store=store)
    with pytest.raises(InterruptAnswerError, match="interrupts"):
        await agency.respond_to_interrupts(done, [], store=store)


# -- stored data is what everyone sees ---------------------------------------------------------


class Ticket(BaseModel):
    id: int
    title: str


async def test_pydantic_model_data_round_trips_like_json_data(store: Store) -> None:
    async def entry() -> str:
        await agency.interrupt("ticket", data=Ticket(id=1, title="printer"))
        return "done"

    result = await agency.run(entry, store=store)
    assert result.status == "paused"
    intr = result.interrupts[0]
    assert Interrupt.model_validate_json(intr.model_dump_json()) == intr
    assert intr.data == {"id": 1, "title": "printer"}


async def test_an_answer_value_that_is_not_json_is_refused(store: Any) -> None:
    async def entry() -> str:
        return type((await agency.interrupt("q")).value).__name__

    result = await agency.run(entry, run_id="non-json", store=store)
    assert result.status == "paused"
    with pytest.raises(InterruptAnswerError):
        await agency.respond_to_interrupts(result, [approve(object())], store=store)
    # Nothing was stored: the run is still paused and a JSON answer still works.
    assert await status_of("non-json", store) == "paused"
    done = await agency.respond_to_interrupts(result, [approve("ok")], store=store)
    assert done.value == "str"
