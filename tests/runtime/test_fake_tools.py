"""Tool calls and scripted streams of the fake models, and the litellm provider's tool calls.

* a :class:`FakeToolCall` reply (or a list of them) answers ``tool_calls`` with the text
  ``""``, with deterministic ids, usage and cost; ``FakeRequest`` shows the tools offered and
  the tool messages sent; the built-in ``fake/echo`` never calls tools on its own;
* a :class:`FakeStream` streams exactly its chunks, ``delay`` seconds apart;
* a reply function may answer tool calls and streams too;
* the litellm provider sends ``tools``, reads ``message.tool_calls`` (arguments as text or
  as a dict) and assembles streamed ``delta.tool_calls`` pieces; a ``via_litellm=True``
  fake model answers the same tool calls through litellm's real code.

The seam tests (no litellm) run on asyncio and trio; the litellm ones on asyncio only.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agency_runtime import _fakes, testing
from agency_runtime._fakes import PROVIDER, _models
from agency_runtime._llm import _litellm
from agency_runtime._llm._litellm import LITELLM_PROVIDER, load_litellm
from agency_runtime._llm._provider import (
    ChatRequest,
    ChatResponse,
    ProviderError,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from agency_runtime.testing import (
    FakeModel,
    FakeModelExhausted,
    FakeRequest,
    FakeStream,
    FakeToolCall,
    reset,
)
from tests.support import LITELLM, SHARES_LITELLM, asyncio_only

pytestmark = pytest.mark.anyio

WEATHER = ToolSpec(
    name="get_weather",
    description="The weather in a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
TIME = ToolSpec(name="get_time", description="The time now.", parameters={"type": "object"})
USER = {"role": "user", "content": "weather in Paris?"}


@pytest.fixture(autouse=True)
def _reset_fakes() -> Iterator[None]:
    yield
    reset()


def chat(model: str, *messages: dict[str, Any], tools: tuple[ToolSpec, ...] = ()) -> ChatRequest:
    return ChatRequest(model=model, messages=list(messages or [USER]), tools=tools)


def tool_turn(calls: tuple[ToolCall, ...], *results: str) -> list[dict[str, Any]]:
    """The assistant message that made ``calls`` and one tool message per result."""
    return [
        {"role": "assistant", "content": None, "tool_calls": [c.to_openai() for c in calls]},
        *(
            {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result}
            for call, result in zip(calls, results, strict=True)
        ),
    ]


async def collect(stream: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    return [event async for event in stream]


async def timed(stream: AsyncIterator[StreamEvent]) -> list[tuple[float, StreamEvent]]:
    """Each event with the time (``anyio.current_time()``) it arrived."""
    return [(anyio.current_time(), event) async for event in stream]


# -- FakeToolCall and FakeStream ------------------------------------------------------------------


def test_fake_tool_call_arguments_and_validation() -> None:
    assert FakeToolCall("get_time").arguments == {}
    assert FakeToolCall("get_time").arguments_json == "{}"
    call = FakeToolCall("get_weather", {"city": "Paris"}, id="call-1")
    assert (call.name, call.arguments_json, call.id) == (
        "get_weather",
        '{"city": "Paris"}',
        "call-1",
    )
    assert FakeToolCall("raw", '{"not json').arguments_json == '{"not json'  # sent as it is
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        FakeToolCall("")
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        FakeToolCall("  ")
    with pytest.raises(TypeError, match="name must be a str"):
        FakeToolCall(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="arguments must be a dict or a JSON str, got list"):
        FakeToolCall("get_weather", ["Paris"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="JSON-serializable"):
        FakeToolCall("get_weather", {"when": object()})
    with pytest.raises(ValueError, match="id must be a non-empty str"):
        FakeToolCall("get_weather", id="")


def test_fake_stream_validation() -> None:
    stream = FakeStream(["Hel", "lo"], delay=0.5)
    assert (stream.chunks, stream.delay, stream.text) == (("Hel", "lo"), 0.5, "Hello")
    with pytest.raises(TypeError, match="sequence of str"):
        FakeStream("Hello")
    with pytest.raises(TypeError, match="all be str"):
        FakeStream(["a", 1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="delay must be a number >= 0"):
        FakeStream(["a"], delay=-1)


def test_list_replies_must_be_tool_calls() -> None:
    with pytest.raises(TypeError, match="FakeToolCall items only; got str"):
        FakeModel("bad", replies=[[FakeToolCall("a"), "text"]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="this one is empty"):
        FakeModel("bad", replies=[[]])


def test_testing_reexports_the_new_names() -> None:
    assert testing.FakeToolCall is _fakes.FakeToolCall
    assert testing.FakeStream is _fakes.FakeStream
    assert {"FakeToolCall", "FakeStream"} <= set(testing.__all__)


# -- tool calls at the seam -----------------------------------------------------------------------


async def test_scripted_tool_calls_then_the_answer_to_their_results() -> None:
    replies: list[Any] = [
        [FakeToolCall("get_weather", {"city": "Paris"}), FakeToolCall("get_time")],
        "Sunny, at noon.",
    ]
    with FakeModel("tools", replies=replies) as fake:
        first = await PROVIDER.complete(chat(fake.model, tools=(WEATHER, TIME)))
        assert first.text == ""
        assert first.tool_calls == (
            ToolCall(id="call_0_0", name="get_weather", arguments='{"city": "Paris"}'),
            ToolCall(id="call_0_1", name="get_time", arguments="{}"),
        )
        # prompt: 3 words + 1 message; completion: names (2) + argument words (2 + 1)
        assert first.usage == Usage.of(4, 5)
        assert first.cost == pytest.approx(4 * 1e-6 + 5 * 2e-6)
        assert first.model == fake.model

        messages = [USER, *tool_turn(first.tool_calls, "sunny", "12:00")]
        second = await PROVIDER.complete(chat(fake.model, *messages, tools=(WEATHER, TIME)))
        assert (second.text, second.tool_calls) == ("Sunny, at noon.", ())

    first_seen, second_seen = fake.calls
    assert first_seen.tools == [WEATHER.to_openai(), TIME.to_openai()]
    assert first_seen.messages == [USER]
    assert second_seen.messages == messages
    assert second_seen.messages[1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert [m.get("tool_call_id") for m in second_seen.messages[2:]] == ["call_0_0", "call_0_1"]


async def test_one_tool_call_reply_and_explicit_ids() -> None:
    replies: list[Any] = [FakeToolCall("get_time", id="t-1"), FakeToolCall("get_time"), "done"]
    with FakeModel("single", replies=replies, fail_times=1, failure="server") as fake:
        request = chat(fake.model, tools=(TIME,))
        with pytest.raises(ProviderError):
            await PROVIDER.complete(request)  # the scripted failure is call 0
        assert (await PROVIDER.complete(request)).tool_calls == (
            ToolCall(id="t-1", name="get_time", arguments="{}"),
        )
        # the default id names the call index: unique across the model's responses
        assert (await PROVIDER.complete(request)).tool_calls[0].id == "call_2_0"
        assert (await PROVIDER.complete(request)).text == "done"
        with pytest.raises(ProviderError, match="no reply left") as info:
            await PROVIDER.complete(request)
        assert isinstance(info.value.__cause__, FakeModelExhausted)


async def test_a_request_without_tools_records_none() -> None:
    with FakeModel("plain", replies=["hi"]) as fake:
        await PROVIDER.complete(chat(fake.model))
    assert fake.calls[0].tools == []
    assert fake.calls[0] == FakeRequest(
        model=fake.model, messages=[USER], response_format=None, max_tokens=None, timeout=120.0
    )


async def test_echo_answers_text_even_when_offered_tools() -> None:
    response = await PROVIDER.complete(chat("fake/echo", tools=(WEATHER,)))
    assert (response.text, response.tool_calls) == ("weather in Paris?", ())
    assert _models._builtins["echo"].calls[-1].tools == [WEATHER.to_openai()]
    *_, end = await collect(PROVIDER.stream(chat("fake/echo", tools=(WEATHER,))))
    assert isinstance(end, StreamEnd)
    assert (end.text, end.tool_calls) == ("weather in Paris?", ())


async def test_streamed_tool_calls_end_the_stream_without_text() -> None:
    with FakeModel("stream-tools", replies=[FakeToolCall("get_weather", {"city": "Oslo"})]) as fake:
        events = await collect(PROVIDER.stream(chat(fake.model, tools=(WEATHER,))))
    (end,) = events  # no text deltas at all
    assert isinstance(end, StreamEnd)
    assert end.text == ""
    assert end.tool_calls == (
        ToolCall(id="call_0_0", name="get_weather", arguments='{"city": "Oslo"}'),
    )
    assert end.usage == Usage.of(4, 3)
    assert end.cost == pytest.approx(4 * 1e-6 + 3 * 2e-6)


async def test_a_reply_function_sees_the_tools_and_calls_them() -> None:
    def brain(request: FakeRequest) -> Any:
        if request.messages[-1]["role"] == "tool":
            return f"It is {request.messages[-1]['content']}."
        (tool,) = request.tools
        return [FakeToolCall(tool["function"]["name"], {"city": "Rome"})]

    async def streamer(request: FakeRequest) -> Any:
        await anyio.lowlevel.checkpoint()
        return FakeStream(["a", "b"])

    with FakeModel("brain", function=brain) as fake:
        first = await PROVIDER.complete(chat(fake.model, tools=(WEATHER,)))
        assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [
            ("get_weather", {"city": "Rome"})
        ]
        messages = [USER, *tool_turn(first.tool_calls, "warm")]
        second = await PROVIDER.complete(chat(fake.model, *messages, tools=(WEATHER,)))
        assert second.text == "It is warm."
    with FakeModel("streamer", function=streamer) as fake:
        *deltas, end = await collect(PROVIDER.stream(chat(fake.model)))
        assert [d.text for d in deltas if isinstance(d, TextDelta)] == ["a", "b"]
        assert isinstance(end, StreamEnd)
        assert end.text == "ab"


async def test_a_bad_function_reply_is_a_permanent_error() -> None:
    with (
        FakeModel("bad-function", function=lambda request: [FakeToolCall("a"), 3]) as fake,  # type: ignore[list-item]
        pytest.raises(ProviderError, match="FakeToolCall items only") as info,
    ):
        await PROVIDER.complete(chat(fake.model))
    assert not info.value.transient


# -- FakeStream at the seam -----------------------------------------------------------------------


async def test_fake_stream_sends_its_chunks_with_the_delays() -> None:
    delay = 0.01
    chunks = ["The ", "answ", "er", "", " is 42"]
    with FakeModel("chunky", replies=[FakeStream(chunks, delay=delay), FakeStream(chunks)]) as fake:
        events = await timed(PROVIDER.stream(chat(fake.model)))
        response = await PROVIDER.complete(chat(fake.model))  # the joined text, at once
    *deltas, (_, end) = events
    assert [event for _, event in deltas] == [TextDelta(c) for c in chunks if c]
    times = [at for at, _ in deltas]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(gaps) == 3
    assert all(gap >= delay * 0.9 for gap in gaps), gaps  # a delay between two chunks
    assert isinstance(end, StreamEnd)
    assert (end.text, end.tool_calls) == ("The answer is 42", ())
    assert end.usage == Usage.of(4, 4)
    assert response.text == "The answer is 42"
    assert response.usage == end.usage


# -- the litellm provider: tools out, tool calls back (litellm's functions replaced) --------------


class _Message:
    def __init__(self, content: str | None, tool_calls: list[Any] | None) -> None:
        self.content = content
        self.tool_calls = tool_calls


class _Response:
    """Just enough of a litellm ``ModelResponse`` whose message called tools."""

    def __init__(self, content: str | None, tool_calls: list[Any] | None) -> None:
        self.choices = [type("Choice", (), {"message": _Message(content, tool_calls)})()]
        self.usage = type(
            "Usage", (), {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        )()
        self._hidden_params = {"response_cost": 0.5}
        self.model = "some/model"


@SHARES_LITELLM
@asyncio_only(LITELLM)
async def test_litellm_provider_sends_tools_and_reads_tool_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    litellm = await load_litellm()
    seen: list[dict[str, Any]] = []
    function = type("Function", (), {"name": "get_time", "arguments": "{}"})()

    async def acompletion(**kwargs: Any) -> _Response:
        seen.append(kwargs)
        return _Response(
            None,
            [
                {"id": "a", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                type("ToolCall", (), {"id": "b", "function": function})(),
                {"id": "c", "type": "custom", "custom": {"name": "x"}},  # no function: skipped
            ],
        )

    monkeypatch.setattr(litellm, "acompletion", acompletion)
    response = await LITELLM_PROVIDER.complete(chat("some/model", tools=(WEATHER, TIME)))
    assert response.text == ""  # None: the model only called tools
    assert response.tool_calls == (
        ToolCall(id="a", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="b", name="get_time", arguments="{}"),
    )
    assert (response.usage, response.cost) == (Usage(5, 2, 7), 0.5)
    assert seen[0]["tools"] == [WEATHER.to_openai(), TIME.to_openai()]
    assert seen[0]["tool_choice"] == "auto"  # explicit: llama-cpp-python ignores tools without

    seen.clear()
    await LITELLM_PROVIDER.complete(chat("some/model"))
    assert "tools" not in seen[0]  # no tools: none sent
    assert "tool_choice" not in seen[0]


@SHARES_LITELLM
@asyncio_only(LITELLM)
async def test_litellm_provider_sends_the_callers_tool_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    litellm = await load_litellm()
    seen: list[dict[str, Any]] = []

    async def acompletion(**kwargs: Any) -> _Response:
        seen.append(kwargs)
        return _Response("ok", None)

    monkeypatch.setattr(litellm, "acompletion", acompletion)
    chosen = {"tool_choice": "required", "temperature": 0.5}  # a Model's options
    forced = {"type": "function", "function": {"name": "get_time"}}
    await LITELLM_PROVIDER.complete(ChatRequest("some/model", [USER], tools=(TIME,), params=chosen))
    await LITELLM_PROVIDER.complete(
        ChatRequest("some/model", [USER], tools=(TIME,), params={"tool_choice": forced})
    )
    await LITELLM_PROVIDER.complete(  # the runtime's own (a last round) wins over the options
        ChatRequest("some/model", [USER], tools=(TIME,), tool_choice="none", params=chosen)
    )
    await LITELLM_PROVIDER.complete(ChatRequest("some/model", [USER], params=chosen))
    assert [kwargs.get("tool_choice") for kwargs in seen] == ["required", forced, "none", None]
    assert "tool_choice" not in seen[3]  # without tools it is never sent: providers refuse it
    assert all(kwargs["temperature"] == 0.5 for kwargs in seen[:1] + seen[2:])


@SHARES_LITELLM
@asyncio_only(LITELLM)
async def test_litellm_provider_assembles_streamed_tool_call_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    litellm = await load_litellm()
    from litellm.types.utils import Delta, ModelResponseStream, StreamingChoices

    # the calls must be assembled from the pieces, not read from litellm's rebuilt response
    monkeypatch.setattr(_litellm, "_tool_calls_of", lambda response: ())

    def chunk(**delta: Any) -> Any:
        return ModelResponseStream(choices=[StreamingChoices(index=0, delta=Delta(**delta))])

    def piece(index: int, **fields: Any) -> dict[str, Any]:
        function = {k: fields.pop(k) for k in ("name", "arguments") if k in fields}
        return {"index": index, "type": "function", "function": function, **fields}

    chunks = [
        chunk(content="Let me "),
        chunk(content="look."),
        chunk(tool_calls=[piece(0, id="w", name="get_weather", arguments="")]),
        chunk(tool_calls=[piece(0, arguments='{"ci')]),
        chunk(tool_calls=[piece(0, arguments='ty": "Paris"}'), piece(1, id="t", name="get_time")]),
        chunk(tool_calls=[piece(1, arguments="{}")]),
    ]

    class Stream:
        def __init__(self) -> None:
            self.items = iter(chunks)

        def __aiter__(self) -> Stream:
            return self

        async def __anext__(self) -> Any:
            try:
                return next(self.items)
            except StopIteration:
                raise StopAsyncIteration from None

    seen: list[dict[str, Any]] = []

    async def acompletion(**kwargs: Any) -> Stream:
        seen.append(kwargs)
        return Stream()

    monkeypatch.setattr(litellm, "acompletion", acompletion)
    *deltas, end = await collect(LITELLM_PROVIDER.stream(chat("some/model", tools=(WEATHER,))))
    assert deltas == [TextDelta("Let me "), TextDelta("look.")]  # only text goes out as deltas
    assert isinstance(end, StreamEnd)
    assert end.text == "Let me look."
    assert end.tool_calls == (
        ToolCall(id="w", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="t", name="get_time", arguments="{}"),
    )
    assert seen[0]["tools"] == [WEATHER.to_openai()]
    assert seen[0]["stream"] is True


# -- a fake model through litellm's real code -----------------------------------------------------


@SHARES_LITELLM
@asyncio_only(LITELLM)
async def test_via_litellm_tool_calls_match_the_seam() -> None:
    replies: list[Any] = [
        [FakeToolCall("get_weather", {"city": "Paris"}), FakeToolCall("get_time", id="mine")],
        "Sunny.",
    ]
    with FakeModel("lite-tools", replies=replies) as fake:
        at_seam = await PROVIDER.complete(chat(fake.model, tools=(WEATHER, TIME)))
    with FakeModel("lite-tools", replies=replies, via_litellm=True) as fake:
        request = chat(fake.model, tools=(WEATHER, TIME))
        direct = await LITELLM_PROVIDER.complete(request)
        routed = await PROVIDER.complete(request)  # via_litellm: the seam hands it to litellm
        assert routed.text == "Sunny."
    assert isinstance(direct, ChatResponse)
    assert direct.tool_calls == at_seam.tool_calls
    assert direct.tool_calls == (
        ToolCall(id="call_0_0", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="mine", name="get_time", arguments="{}"),
    )
    assert direct.text == ""
    assert direct.usage == at_seam.usage
    assert direct.cost == pytest.approx(at_seam.cost)
    assert direct.raw.choices[0].finish_reason == "tool_calls"
    assert direct.finish_reasons == at_seam.finish_reasons == ("tool_calls",)
    assert isinstance(direct.response_id, str)
    assert direct.response_id  # litellm's id of the response (chatcmpl-…)
    assert fake.calls[0].tools == [WEATHER.to_openai(), TIME.to_openai()]
    assert fake.calls[0].extra.get("tools") is None  # tools are their own field


@SHARES_LITELLM
@asyncio_only(LITELLM)
async def test_via_litellm_tool_results_reach_the_model() -> None:
    replies: list[Any] = [FakeToolCall("get_weather", {"city": "Paris"}), "Sunny."]
    with FakeModel("lite-loop", replies=replies, via_litellm=True) as fake:
        first = await LITELLM_PROVIDER.complete(chat(fake.model, tools=(WEATHER,)))
        messages = [USER, *tool_turn(first.tool_calls, "sunny")]
        second = await LITELLM_PROVIDER.complete(chat(fake.model, *messages, tools=(WEATHER,)))
    assert second.text == "Sunny."
    sent = fake.calls[1].messages
    assert sent[1]["tool_calls"] == [first.tool_calls[0].to_openai()]
    assert (sent[2]["role"], sent[2]["tool_call_id"], sent[2]["content"]) == (
        "tool",
        "call_0_0",
        "sunny",
    )


@SHARES_LITELLM
@asyncio_only(LITELLM)
async def test_via_litellm_streams_tool_calls_as_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    # the calls must come from the streamed delta.tool_calls, not the rebuilt response
    monkeypatch.setattr(_litellm, "_tool_calls_of", lambda response: ())
    replies: list[Any] = [[FakeToolCall("get_weather", {"city": "Oslo"}), FakeToolCall("get_time")]]
    with FakeModel("lite-stream-tools", replies=replies) as fake:
        at_seam = await collect(PROVIDER.stream(chat(fake.model, tools=(WEATHER, TIME))))
    with FakeModel("lite-stream-tools", replies=replies, via_litellm=True) as fake:
        events = await collect(LITELLM_PROVIDER.stream(chat(fake.model, tools=(WEATHER, TIME))))
    (end,) = events
    (seam_end,) = at_seam
    assert isinstance(end, StreamEnd)
    assert isinstance(seam_end, StreamEnd)
    assert end.text == ""
    assert end.tool_calls == seam_end.tool_calls
    assert [c.name for c in end.tool_calls] == ["get_weather", "get_time"]
    assert end.usage == seam_end.usage
    assert end.cost == pytest.approx(seam_end.cost)
    assert end.finish_reasons == seam_end.finish_reasons == ("tool_calls",)
    assert end.response_id
    assert end.model


@SHARES_LITELLM
@asyncio_only(LITELLM)
async def test_via_litellm_fake_stream_chunks_and_delays() -> None:
    delay = 0.01
    stream = FakeStream(["Hel", "lo", " there"], delay=delay)
    with FakeModel("lite-chunks", replies=[stream], via_litellm=True) as f:
        events = await timed(PROVIDER.stream(chat(f.model)))
    *deltas, (_, end) = events
    assert [event for _, event in deltas] == [
        TextDelta("Hel"),
        TextDelta("lo"),
        TextDelta(" there"),
    ]
    times = [at for at, _ in deltas]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(gap >= delay * 0.9 for gap in gaps), gaps
    assert isinstance(end, StreamEnd)
    assert (end.text, end.tool_calls) == ("Hello there", ())
    assert end.usage == Usage.of(4, 2)


@SHARES_LITELLM
@asyncio_only(LITELLM)
async def test_sync_litellm_completion_answers_tool_calls() -> None:
    litellm = await load_litellm()
    with FakeModel("lite-sync", replies=[FakeToolCall("get_time"), FakeToolCall("get_time")]) as f:
        response = litellm.completion(model=f.model, messages=[USER], tools=[TIME.to_openai()])
        (call,) = response.choices[0].message.tool_calls
        assert (call.id, call.function.name, call.function.arguments) == (
            "call_0_0",
            "get_time",
            "{}",
        )
        chunks = list(litellm.completion(model=f.model, messages=[USER], stream=True))
        calls = [c for chunk in chunks for c in (chunk.choices[0].delta.tool_calls or [])]
        assert [(c.id, c.function.name) for c in calls] == [("call_1_0", "get_time")]
