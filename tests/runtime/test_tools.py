"""``agency.llm(..., tools=[...])``: schemas from signatures, the journaled tool loop, errors
fed back, approvals, guards, ``max_tool_rounds`` — on every store backend, with the offline
fake model scripting the tool calls (``FakeToolCall``)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

from agency_runtime import (
    GuardExceededError,
    InvalidArgumentError,
    StepResultError,
    Store,
    Tool,
    ToolRoundsExceededError,
    agency,
    approve,
    reject,
)
from agency_runtime.testing import FakeModel, FakeRequest, FakeToolCall

pytestmark = pytest.mark.anyio

RAN: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RAN.clear()


def weather(city: str, unit: str = "C") -> dict[str, Any]:
    """Today's weather in a city.

    Args:
        city: The city's name.
        unit: "C" or "F".
    """
    RAN[f"weather {city}"] += 1
    return {"city": city, "temp": 21, "unit": unit}


async def pay(amount: int, to: str) -> str:
    """Send money."""
    RAN[f"pay {amount} {to}"] += 1
    return f"paid {amount} to {to}"


def broken(why: str) -> str:
    """Always fails."""
    RAN["broken"] += 1
    raise RuntimeError(why)


def _tool_messages(request: FakeRequest) -> list[dict[str, Any]]:
    return [m for m in request.messages if m.get("role") == "tool"]


# -- schemas ---------------------------------------------------------------------------------


def test_a_tool_schema_comes_from_the_signature_and_docstring() -> None:
    made = agency.tool(weather)
    assert isinstance(made, Tool)
    assert (made.name, made.description) == ("weather", "Today's weather in a city.")
    assert made.spec.parameters == {
        "additionalProperties": False,
        "properties": {
            "city": {"description": "The city's name.", "title": "City", "type": "string"},
            "unit": {
                "default": "C",
                "description": '"C" or "F".',
                "title": "Unit",
                "type": "string",
            },
        },
        "required": ["city"],
        "type": "object",
    }
    renamed = agency.tool(weather, name="forecast", description="Tomorrow's.", needs_approval=True)
    assert (renamed.name, renamed.description, renamed.needs_approval) == (
        "forecast",
        "Tomorrow's.",
        True,
    )


class Address(BaseModel):
    street: str
    zip: int


def ship(to: Address, express: bool = False) -> str:
    """Ship it."""
    return "ok"


def test_a_pydantic_model_parameter_is_described_in_full() -> None:
    schema = agency.tool(ship).spec.parameters
    assert schema["required"] == ["to"]
    assert "Address" in json.dumps(schema)


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda *items: None, "not supported"),
        (lambda x: None, "needs a type annotation"),
        (len, "positional-only|signature"),
    ],
)
def test_tools_refuse_what_a_schema_cannot_describe(fn: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        agency.tool(fn, name="bad")


class Opaque:
    """A class pydantic cannot validate or describe."""


def takes_an_opaque(thing: Opaque) -> None:
    """An unsupported parameter type."""


def test_tool_names_and_duplicates_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="1 to 64 letters"):
        agency.tool(weather, name="has space")

    with pytest.raises(InvalidArgumentError, match="argument type is not supported"):
        agency.tool(takes_an_opaque)


# -- the loop ---------------------------------------------------------------------------------


@agency.entry
async def asks_the_weather() -> str:
    return str(
        await agency.llm(
            "What's the weather in Paris and Oslo?",
            model="fake/tools",
            tools=[weather],
        )
    )


async def test_the_model_calls_tools_then_answers(store: Store) -> None:
    replies = [
        [FakeToolCall("weather", {"city": "Paris"}), FakeToolCall("weather", {"city": "Oslo"})],
        "Paris 21 C, Oslo 21 C.",
    ]
    with FakeModel("tools", replies=replies) as fake:
        result = await agency.run(asks_the_weather, store=store)
    assert (result.status, result.value) == ("completed", "Paris 21 C, Oslo 21 C.")
    assert RAN == {"weather Paris": 1, "weather Oslo": 1}
    first, second = fake.calls
    assert [t["function"]["name"] for t in first.tools] == ["weather"]
    results = _tool_messages(second)
    assert [m["name"] for m in results] == ["weather", "weather"]
    assert json.loads(results[0]["content"]) == {"city": "Paris", "temp": 21, "unit": "C"}
    # provider order: the assistant's calls, then one result per call, by id
    roles = [m["role"] for m in second.messages]
    assert roles == ["user", "assistant", "tool", "tool"]
    calls = second.messages[1]["tool_calls"]
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in calls]
    names = [e.name for e in await agency.runs.journal(result.run_id, store=store)]
    assert names == [
        "agency.llm:round",
        "tool:weather",
        "tool:weather",
        "agency.llm:round",
        "agency.llm",
    ]
    assert result.cost > 0


async def test_a_replay_runs_no_tool_and_asks_no_model_again(store: Store) -> None:
    replies = [[FakeToolCall("weather", {"city": "Paris"})], "Sunny."]
    with FakeModel("tools", replies=replies) as fake:
        first = await agency.run(asks_the_weather, run_id="w", store=store)
        again = await agency.run(asks_the_weather, run_id="w", store=store)
    assert again.value == first.value == "Sunny."
    assert RAN == {"weather Paris": 1}
    assert len(fake.calls) == 2


@agency.entry
async def pays_after_asking() -> str:
    return str(
        await agency.llm(
            "Pay Ada 5 and check the weather",
            model="fake/tools",
            tools=[weather, agency.tool(pay, needs_approval=True)],
        )
    )


async def test_an_approval_pauses_and_the_resumed_loop_reruns_no_finished_tool(
    store: Store,
) -> None:
    replies = [
        [FakeToolCall("weather", {"city": "Paris"})],
        [FakeToolCall("pay", {"amount": 5, "to": "Ada"})],
        "Done: paid.",
    ]
    with FakeModel("tools", replies=replies) as fake:
        paused = await agency.run(pays_after_asking, run_id="p", store=store)
        assert paused.status == "paused"
        (asked,) = paused.interrupts
        assert asked.effect == "std::tool-approval"
        assert asked.data == {"tool": "pay", "arguments": {"amount": 5, "to": "Ada"}}
        assert RAN == {"weather Paris": 1}
        done = await agency.respond_to_interrupts("p", {asked.interrupt_id: approve()}, store=store)
    assert (done.status, done.value) == ("completed", "Done: paid.")
    assert RAN == {"weather Paris": 1, "pay 5 Ada": 1}
    assert len(fake.calls) == 3  # the two rounds before the pause were replayed


async def test_a_rejected_call_tells_the_model_it_was_refused(store: Store) -> None:
    replies = [[FakeToolCall("pay", {"amount": 5, "to": "Ada"})], "Understood, not paid."]
    with FakeModel("tools", replies=replies) as fake:
        paused = await agency.run(pays_after_asking, run_id="r", store=store)
        (asked,) = paused.interrupts
        done = await agency.respond_to_interrupts(
            "r", {asked.interrupt_id: reject("too much")}, store=store
        )
    assert done.value == "Understood, not paid."
    assert RAN == {}
    (refused,) = _tool_messages(fake.calls[-1])
    assert refused["content"] == "The call of 'pay' was refused by a human: too much"


@agency.entry
async def with_broken() -> str:
    return str(await agency.llm("try", model="fake/tools", tools=[broken, weather]))


async def test_errors_unknown_tools_and_bad_arguments_are_fed_back(store: Store) -> None:
    replies = [
        [
            FakeToolCall("broken", {"why": "disk full"}),
            FakeToolCall("teleport", {}),
            FakeToolCall("weather", {"town": "Paris"}),
            FakeToolCall("weather", "{not json"),
        ],
        "I could not do it.",
    ]
    with FakeModel("tools", replies=replies) as fake:
        result = await agency.run(with_broken, store=store)
    assert result.value == "I could not do it."
    contents = [m["content"] for m in _tool_messages(fake.calls[-1])]
    assert contents[0] == "Error: broken raised RuntimeError: disk full"
    assert contents[1].startswith("Error: there is no tool named 'teleport' (tools: broken")
    assert contents[2].startswith("Error: the arguments of 'weather' are not valid:")
    assert "city" in contents[2]
    assert contents[3].startswith("Error: the arguments of 'weather' are not valid:")
    assert RAN == {"broken": 1}


@agency.entry
async def loops_forever() -> str:
    return str(await agency.llm("go", model="fake/tools", tools=[weather], max_tool_rounds=2))


async def test_too_many_rounds_end_with_a_clear_error(store: Store) -> None:
    replies = [[FakeToolCall("weather", {"city": str(n)})] for n in range(5)]
    with FakeModel("tools", replies=replies):
        result = await agency.run(loops_forever, store=store)
    assert result.status == "failed"
    assert isinstance(result.exception, ToolRoundsExceededError)
    assert "after 2 round(s)" in str(result.exception)
    assert "on_max_tool_rounds='answer'" in str(result.exception)
    assert RAN == {"weather 0": 1, "weather 1": 1}


def never_stops(request: FakeRequest) -> Any:
    """A model that calls a tool whenever it may (it answers only under tool_choice="none")."""
    if request.tool_choice == "none":
        return "Paris is sunny (from what I found)."
    return [FakeToolCall("weather", {"city": f"Paris {len(_tool_messages(request))}"})]


@agency.entry
async def answers_at_the_last_round() -> str:
    answer = await agency.llm(
        "go", model="fake/tools", tools=[weather], max_tool_rounds=2, on_max_tool_rounds="answer"
    )
    await agency.interrupt("go", "go on?")  # the run pauses: its resumption replays the call
    return str(answer)


async def test_on_max_tool_rounds_answer_asks_a_last_round_without_tools(store: Store) -> None:
    with FakeModel("tools", function=never_stops) as fake:
        paused = await agency.run(answers_at_the_last_round, run_id="last", store=store)
        assert [request.tool_choice for request in fake.calls] == ["auto", "auto", "none"]
        assert all(request.tools for request in fake.calls)  # the last round still names them
        (asked,) = paused.interrupts
        answers = {asked.interrupt_id: approve()}
        done = await agency.respond_to_interrupts("last", answers, store=store)
    assert done.value == "Paris is sunny (from what I found)."
    assert RAN == {"weather Paris 0": 1, "weather Paris 1": 1}
    assert len(fake.calls) == 3  # the resumed run replayed every round: no model call again
    journal = await agency.runs.journal("last", store=store)
    rounds = [entry.path for entry in journal if entry.name == "agency.llm:round"]
    assert rounds == ["llm#0/round#0", "llm#0/round#1", "llm#0/round#2"]


async def test_a_model_calling_tools_in_the_last_round_still_fails_clearly(store: Store) -> None:
    async def entry() -> str:
        return str(
            await agency.llm(
                "go", model="fake/tools", tools=[weather], max_tool_rounds=1,
                on_max_tool_rounds="answer",
            )
        )  # fmt: skip

    replies = [[FakeToolCall("weather", {"city": str(n)})] for n in range(3)]
    with FakeModel("tools", replies=replies) as fake:  # it ignores tool_choice="none"
        result = await agency.run(entry, store=store)
    assert isinstance(result.exception, ToolRoundsExceededError)
    assert "tool_choice='none'" in str(result.exception)
    assert [request.tool_choice for request in fake.calls] == ["auto", "none"]
    assert RAN == {"weather 0": 1}


class Report(BaseModel):
    city: str
    temp: int


@agency.entry
async def structured_after_tools() -> dict[str, Any]:
    answer = await agency.llm(
        "report", model="fake/tools", tools=[weather], schema=Report, retries=1
    )
    return answer.model_dump()  # type: ignore[no-any-return]


async def test_schema_validates_the_final_answer_after_the_tools(store: Store) -> None:
    replies = [
        [FakeToolCall("weather", {"city": "Paris"})],
        "not json at all",
        {"city": "Paris", "temp": 21},
    ]
    with FakeModel("tools", replies=replies):
        result = await agency.run(structured_after_tools, store=store)
    assert result.value == {"city": "Paris", "temp": 21}
    assert RAN == {"weather Paris": 1}


def returns_a_set() -> Any:
    """Returns what JSON cannot hold."""
    return {1, 2}


@agency.entry
async def non_json_tool() -> str:
    return str(await agency.llm("go", model="fake/tools", tools=[returns_a_set]))


async def test_a_tool_returning_non_json_fails_the_run(store: Store) -> None:
    with FakeModel("tools", replies=[[FakeToolCall("returns_a_set")], "never"]):
        result = await agency.run(non_json_tool, store=store)
    assert result.status == "failed"
    assert isinstance(result.exception, StepResultError)
    assert "returns_a_set" in str(result.exception)


@agency.entry
async def guarded_loop() -> str:
    async def ask() -> str:
        return str(await agency.llm("go", model="fake/tools", tools=[weather]))

    return await agency.with_cost_guard(0.000001, ask)


async def test_a_cost_guard_is_asked_between_rounds(store: Store) -> None:
    replies = [[FakeToolCall("weather", {"city": "Paris"})], "answer"]
    with FakeModel("tools", replies=replies, input_cost_per_token=1.0):
        paused = await agency.run(guarded_loop, run_id="g", store=store)
    assert paused.status == "paused"
    (asked,) = paused.interrupts
    assert asked.effect == "std::guard"
    assert RAN == {}  # stopped before the round's tools ran
    with FakeModel("tools", replies=replies, input_cost_per_token=1.0):
        stopped = await agency.respond_to_interrupts(
            "g", {asked.interrupt_id: reject()}, store=store
        )
    assert stopped.status == "failed"
    assert isinstance(stopped.exception, GuardExceededError)


@agency.entry
async def in_a_scope() -> list[str]:
    async def body(s: Any) -> list[str]:
        before = await s.step(lambda: "before", name="before")
        answer = await agency.llm("go", model="fake/tools", tools=[weather])
        after = await s.step(lambda: "after", name="after")
        return [before, str(answer), after]

    return await agency.with_resumable_scope("flow", body)  # type: ignore[no-any-return]


async def test_tools_work_inside_a_resumable_scope(store: Store) -> None:
    with FakeModel("tools", replies=[[FakeToolCall("weather", {"city": "Rome"})], "ok"]):
        result = await agency.run(in_a_scope, store=store)
    assert result.value == ["before", "ok", "after"]
    assert RAN == {"weather Rome": 1}


async def test_bad_tool_options_are_refused(store: Store) -> None:
    async def entry(options: dict[str, Any]) -> Any:
        return await agency.llm("go", model="fake/echo", **options)

    for options, message in [
        ({"tools": "weather"}, "tools must be a list"),
        ({"tools": [weather, weather]}, "two tools are named"),
        ({"tools": [weather], "max_tool_rounds": 0}, "max_tool_rounds"),
        ({"tools": [weather], "on_max_tool_rounds": "stop"}, "on_max_tool_rounds"),
        ({"on_token": "print"}, "on_token"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            await agency.with_test_context(lambda o=options: entry(o))  # type: ignore[misc]


def queues_a_note(text: str) -> str:
    """Queue a note for the model's next request."""
    agency.thread.current().queue_message(f"note: {text}")
    return "queued"


@agency.entry
async def queues_during_a_round() -> str:
    return str(await agency.llm("go", model="fake/tools", tools=[queues_a_note]))


async def test_messages_queued_by_a_tool_follow_the_rounds_results(store: Store) -> None:
    replies = [[FakeToolCall("queues_a_note", {"text": "hello"})], "ok"]
    with FakeModel("tools", replies=replies) as fake:
        result = await agency.run(queues_during_a_round, store=store)
    assert result.value == "ok"
    second = fake.calls[1].messages
    assert [m["role"] for m in second] == ["user", "assistant", "tool", "user"]
    assert second[-1]["content"] == "note: hello"
