"""Streaming: ``agency.llm(..., on_token=...)`` and ``agency.llm_stream(...)`` — deltas as the
model writes them, the whole answer journaled, replays that call nothing, time guards that
cut a stream, and streams cut by the provider."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from agency_runtime import (
    AgencyCancelledError,
    GuardExceededError,
    LLMCallError,
    ProviderError,
    Store,
    agency,
    approve,
    register_provider,
    unregister_provider,
)
from agency_runtime._llm import _retries as retries_module
from agency_runtime._llm._provider import (
    ChatRequest,
    ChatResponse,
    EmbedRequest,
    EmbedResponse,
    StreamEnd,
    StreamEvent,
    TextDelta,
    Usage,
)
from agency_runtime.testing import FakeModel, FakeStream, FakeToolCall

pytestmark = pytest.mark.anyio

CHUNKS = ["Once ", "upon ", "a ", "time."]
SEEN: list[tuple[str, float]] = []


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    SEEN.clear()
    monkeypatch.setattr(retries_module, "BACKOFF_BASE", 0.001)  # retries without real waits


@agency.entry
async def tells_a_story() -> str:
    def token(delta: str) -> None:
        SEEN.append((delta, anyio.current_time()))

    return str(await agency.llm("a story", model="fake/story", on_token=token))


async def test_on_token_gets_each_piece_as_it_arrives(store: Store) -> None:
    with FakeModel("story", replies=[FakeStream(CHUNKS, delay=0.02)]) as fake:
        started = anyio.current_time()
        result = await agency.run(tells_a_story, store=store)
        ended = anyio.current_time()
    assert result.value == "Once upon a time."
    assert [delta for delta, _ in SEEN] == CHUNKS
    first_at = SEEN[0][1]
    assert first_at - started < ended - started - 0.04  # the first piece came well before the end
    assert result.cost == pytest.approx(fake.cost(Usage.of(3, 4)), rel=0.5)
    assert result.tokens > 0


async def test_a_completed_run_called_again_streams_nothing(store: Store) -> None:
    with FakeModel("story", replies=[FakeStream(CHUNKS)]) as fake:
        await agency.run(tells_a_story, run_id="s", store=store)
        SEEN.clear()
    with FakeModel("story", replies=[]) as silent:
        again = await agency.run(tells_a_story, run_id="s", store=store)
    assert again.value == "Once upon a time."
    assert silent.calls == []
    assert len(fake.calls) == 1
    assert SEEN == []  # a completed run returns its stored result: nothing runs at all


@agency.entry
async def streams_then_fails() -> str:
    """Streams, then pauses on an interrupt: the replay of the call streams once more."""
    text = await agency.llm("a story", model="fake/story", on_token=lambda d: SEEN.append((d, 0.0)))
    await agency.interrupt("go", "go on?")
    return str(text)


async def test_a_resumed_run_replays_the_stream_as_one_delta(store: Store) -> None:
    with FakeModel("story", replies=[FakeStream(CHUNKS)]) as fake:
        paused = await agency.run(streams_then_fails, run_id="p", store=store)
        assert [d for d, _ in SEEN] == CHUNKS
        SEEN.clear()
        (asked,) = paused.interrupts
        done = await agency.respond_to_interrupts("p", {asked.interrupt_id: approve()}, store=store)
    assert done.value == "Once upon a time."
    assert [d for d, _ in SEEN] == ["Once upon a time."]
    assert len(fake.calls) == 1


@agency.entry
async def iterates(form: str) -> dict[str, Any]:
    deltas: list[str] = []
    if form == "with":
        async with agency.llm_stream("a story", model="fake/story") as stream:
            async for delta in stream:
                deltas.append(delta)
        return {"deltas": deltas, "result": stream.result}
    async for delta in agency.llm_stream("a story", model="fake/story"):
        deltas.append(delta)
    return {"deltas": deltas, "result": "".join(deltas)}


@pytest.mark.parametrize("form", ["with", "short"])
async def test_llm_stream_yields_the_deltas(store: Store, form: str) -> None:
    with FakeModel("story", replies=[FakeStream(CHUNKS, delay=0.005)]):
        result = await agency.run(iterates, form, store=store)
    assert result.value == {"deltas": CHUNKS, "result": "Once upon a time."}
    names = [e.name for e in await agency.runs.journal(result.run_id, store=store)]
    assert names == ["agency.llm"]


FORM = {"now": "stream"}
"""How ``switches_forms`` asks: the code of a run may change while it is paused."""


@agency.entry
async def switches_forms() -> str:
    deltas: list[str] = []
    if FORM["now"] == "stream":
        async with agency.llm_stream("a story", model="fake/story") as stream:
            async for delta in stream:
                deltas.append(delta)
        text = str(stream.result)
    else:
        text = str(await agency.llm("a story", model="fake/story", on_token=deltas.append))
    SEEN.append(("".join(deltas), 0.0))
    await agency.interrupt("go", "go on?")
    return text


@pytest.mark.parametrize(("first", "then"), [("stream", "on_token"), ("on_token", "stream")])
async def test_llm_stream_and_on_token_journal_the_call_at_one_address(
    store: Store, first: str, then: str
) -> None:
    with FakeModel("story", replies=[FakeStream(CHUNKS)]) as fake:
        FORM["now"] = first
        paused = await agency.run(switches_forms, run_id="forms", store=store)
        (entry,) = await agency.runs.journal("forms", store=store)
        assert (entry.name, entry.path) == ("agency.llm", "llm#0")
        FORM["now"] = then  # the code changed under the paused run
        (asked,) = paused.interrupts
        done = await agency.respond_to_interrupts(
            "forms", {asked.interrupt_id: approve()}, store=store
        )
    assert done.value == "Once upon a time."
    assert len(fake.calls) == 1  # the resumed run replayed the recorded answer
    assert [text for text, _ in SEEN] == ["Once upon a time."] * 2  # streamed, then replayed
    assert [e.path for e in await agency.runs.journal("forms", store=store)] == ["llm#0"]


@agency.entry
async def breaks_early() -> list[str]:
    seen: list[str] = []
    async with agency.llm_stream("a story", model="fake/story") as stream:
        async for delta in stream:
            seen.append(delta)
            break
    return seen


async def test_leaving_a_stream_early_cancels_the_call(store: Store) -> None:
    with FakeModel("story", replies=[FakeStream(CHUNKS, delay=0.01)]):
        result = await agency.run(breaks_early, store=store)
    assert result.value == ["Once "]
    assert await agency.runs.journal(result.run_id, store=store) == []  # nothing journaled


@agency.entry
async def guarded_story() -> str:
    async def ask() -> str:
        return str(await agency.llm("a story", model="fake/story", on_token=lambda d: None))

    return await agency.with_time_guard(0.05, ask)


async def test_a_time_guard_cuts_a_stream(store: Store) -> None:
    with FakeModel("story", replies=[FakeStream(["a "] * 50, delay=0.02)]):
        result = await agency.run(guarded_story, store=store)
    assert result.status in ("failed", "cancelled")
    assert isinstance(result.exception, GuardExceededError | AgencyCancelledError)


class CutStream:
    """A provider whose streams break after one piece (a dropped connection)."""

    name = "cut"

    def __init__(self, breaks_at: int) -> None:
        self.breaks_at = breaks_at
        self.streams = 0

    async def complete(self, request: ChatRequest) -> ChatResponse:
        raise AssertionError("not used")

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        self.streams += 1
        pieces = ["Hello ", "world"]
        for index, piece in enumerate(pieces):
            if index == self.breaks_at:
                raise ProviderError("connection reset", kind="connection", model=request.model)
            yield TextDelta(piece)
        yield StreamEnd(text="".join(pieces), usage=Usage.of(1, 2), cost=0.0)

    async def embed(self, request: EmbedRequest) -> EmbedResponse:
        raise AssertionError("not used")

    async def supports_schema(self, model: str) -> bool:
        return False


@agency.entry
async def cut_story() -> str:
    return str(await agency.llm("hi", model="cut/m", on_token=lambda d: SEEN.append((d, 0))))


async def test_a_stream_cut_before_any_text_is_retried(store: Store) -> None:
    provider = CutStream(breaks_at=0)
    register_provider("cut", provider)
    try:
        result = await agency.run(cut_story, store=store)
    finally:
        unregister_provider("cut")
    assert result.status == "failed"  # it breaks every time: retried, then failed
    assert provider.streams == 3
    assert isinstance(result.exception, LLMCallError)


async def test_a_stream_cut_after_text_fails_clearly(store: Store) -> None:
    provider = CutStream(breaks_at=1)
    register_provider("cut", provider)
    try:
        result = await agency.run(cut_story, store=store)
    finally:
        unregister_provider("cut")
    assert result.status == "failed"
    assert isinstance(result.exception, LLMCallError)
    assert "cut after 6 characters" in str(result.exception)
    assert [d for d, _ in SEEN] == ["Hello "]  # never repeated


@agency.entry
async def streams_after_tools() -> str:
    def lookup(key: str) -> str:
        """Look something up."""
        return f"value of {key}"

    return str(
        await agency.llm(
            "go",
            model="fake/story",
            tools=[agency.tool(lookup)],
            on_token=lambda d: SEEN.append((d, 0)),
        )
    )


async def test_tools_and_streaming_together(store: Store) -> None:
    replies = [[FakeToolCall("lookup", {"key": "k"})], FakeStream(["The ", "value."])]
    with FakeModel("story", replies=replies):
        result = await agency.run(streams_after_tools, store=store)
    assert result.value == "The value."
    assert [d for d, _ in SEEN] == ["The ", "value."]
