"""``agency_runtime.otel``: the spans of runs, steps, model requests, tools, interrupts and
guards, on every store backend, with the offline fake model — their names, nesting and
attributes, replays on resume (spans of no work, no provider call), errors, control
signals, user spans nesting, ``uninstrument``, and that nothing imports OpenTelemetry
unless asked."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agency_runtime import (
    InvalidArgumentError,
    ResumableScope,
    Store,
    Worker,
    agency,
    approve,
    otel,
)
from agency_runtime.testing import FakeModel, FakeToolCall
from tests.support import serving

pytestmark = pytest.mark.anyio

ENTRY = f"{__name__}:"
USER: list[trace.Tracer] = [trace.NoOpTracer()]
"""The tracer of the user's own code in the workflows below: the test's provider's."""


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans of what runs in the test (``agency_runtime.otel`` and the user's code)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(provider)
    USER[0] = provider.get_tracer("user-code")
    try:
        yield exporter
    finally:
        otel.uninstrument()
        USER[0] = trace.NoOpTracer()
        provider.shutdown()


class Spans:
    """The finished spans of an exporter, by name, with their nesting."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.all: Sequence[ReadableSpan] = exporter.get_finished_spans()
        exporter.clear()

    def named(self, name: str) -> list[ReadableSpan]:
        return sorted((s for s in self.all if s.name == name), key=lambda s: s.start_time or 0)

    def one(self, name: str) -> ReadableSpan:
        (found,) = self.named(name)
        return found

    def names(self) -> list[str]:
        return [s.name for s in sorted(self.all, key=lambda s: s.start_time or 0)]

    def parent(self, span: ReadableSpan) -> ReadableSpan | None:
        if span.parent is None:
            return None
        return next(s for s in self.all if s.context.span_id == span.parent.span_id)

    def children(self, span: ReadableSpan) -> list[str]:
        return [
            s.name
            for s in sorted(self.all, key=lambda s: s.start_time or 0)
            if s.parent is not None and s.parent.span_id == span.context.span_id
        ]


def _attrs(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


# -- workflows -------------------------------------------------------------------------------


def one() -> int:
    return 1


def two() -> int:
    return 2


@agency.entry
async def two_steps() -> int:
    async def body(s: ResumableScope) -> int:
        return await s.step(one) + await s.step(two)

    return await agency.with_resumable_scope("main", body)


@agency.entry
async def asks_once() -> str:
    return str(await agency.llm("hello there", model="fake/otel"))


@agency.entry
async def asks_the_run_model() -> str:
    return str(await agency.llm("hello there"))


def weather(city: str) -> str:
    """Today's weather in a city."""
    with USER[0].start_as_current_span("weather lookup"):
        return f"sunny in {city}"


def broken(why: str) -> str:
    """Always fails."""
    raise RuntimeError(why)


@agency.entry
async def uses_tools() -> str:
    return str(await agency.llm("weather?", model="fake/otel", tools=[weather, broken]))


@agency.entry
async def step_llm_interrupt() -> list[object]:
    async def body(s: ResumableScope) -> list[object]:
        number = await s.step(one)
        text = await agency.llm("hello there", model="fake/otel")
        answer = await agency.interrupt("confirm", "go on?")
        return [number, text, answer.approved]

    return await agency.with_resumable_scope("main", body)


def traced() -> str:
    with USER[0].start_as_current_span("mine"):
        return "done"


@agency.entry
async def user_span_in_step() -> str:
    async def body(s: ResumableScope) -> str:
        return await s.step(traced)

    return await agency.with_resumable_scope("main", body)


def traced_as(name: str) -> str:
    with USER[0].start_as_current_span(f"mine {name}"):
        return name


@agency.entry
async def parallel_steps() -> list[str]:
    async def body(s: ResumableScope) -> list[str]:
        done: list[str] = []

        async def branch(name: str) -> None:
            done.append(await s.step(lambda: traced_as(name), name=f"branch {name}"))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(branch, "a")
            tasks.start_soon(branch, "b")
        await agency.sleep(0.001)
        return sorted(done)

    return await agency.with_resumable_scope("main", body)


@agency.entry
async def pays() -> str:
    return str(
        await agency.llm(
            "weather, then pay",
            model="fake/otel",
            tools=[weather, agency.tool(broken, name="pay", needs_approval=True)],
        )
    )


def fails() -> int:
    raise ValueError("no luck")


@agency.entry
async def failing_step() -> int:
    async def body(s: ResumableScope) -> int:
        return await s.step(fails)

    return await agency.with_resumable_scope("main", body)


@agency.entry
async def over_budget() -> str:
    async with agency.cost_guard(0.000001, label="tiny"):
        return str(await agency.llm("a long enough prompt", model="fake/otel"))


@agency.entry
async def adds_too_much() -> None:
    async with agency.cost_guard(0.5, label="half"):
        agency.add_cost(0.75)


# -- runs and steps --------------------------------------------------------------------------


async def test_a_run_is_a_span_around_its_steps(store: Store, spans: InMemorySpanExporter) -> None:
    result = await agency.run(two_steps, run_id="steps", store=store)
    assert result.value == 3
    seen = Spans(spans)
    run = seen.one(f"agency.run {ENTRY}two_steps")
    assert _attrs(run) == {
        "agency.run_id": "steps",
        "agency.entry": f"{ENTRY}two_steps",
        "agency.attempt": 1,
        "agency.run.status": "completed",
        "agency.cost_usd": 0.0,
    }
    assert seen.children(run) == ["agency.step one", "agency.step two"]
    first, second = seen.named("agency.step one") + seen.named("agency.step two")
    assert _attrs(first) == {"agency.step.path": "main/0", "agency.replayed": False}
    assert _attrs(second)["agency.step.path"] == "main/1"
    assert run.status.status_code is StatusCode.UNSET


async def test_a_model_request_is_a_chat_span_with_genai_attributes(
    store: Store, spans: InMemorySpanExporter
) -> None:
    with FakeModel("otel", replies=["hi to you"]) as fake:
        result = await agency.run(asks_once, store=store)
    assert len(fake.calls) == 1
    seen = Spans(spans)
    run = seen.one(f"agency.run {ENTRY}asks_once")
    llm = seen.one("agency.step agency.llm")
    chat = seen.one("chat otel")
    assert seen.parent(llm) == run
    assert seen.parent(chat) == llm
    assert chat.kind is trace.SpanKind.CLIENT
    # fake usage: 2 words + 1 message in, 3 words out; 1e-6 and 2e-6 USD a token
    assert _attrs(chat) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "fake",
        "gen_ai.request.model": "otel",
        "gen_ai.usage.input_tokens": 3,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.response.model": "otel",
        "gen_ai.response.id": "fake-otel-1",
        "gen_ai.response.finish_reasons": ("stop",),
        "agency.cost_usd": pytest.approx(9e-6),
        "agency.step.path": "llm#0",
        "agency.replayed": False,
    }
    assert _attrs(run)["agency.cost_usd"] == pytest.approx(result.cost) == pytest.approx(9e-6)


@agency.entry
async def asks_with_a_key() -> str:
    model = agency.Model("fake/otel", api_key="sk-very-secret-key")
    return str(await agency.llm("my key is sk-very-secret-key, hello", model=model))


@pytest.mark.parametrize("opt_in", ["true", "false"])
async def test_prompts_and_answers_are_on_chat_spans_only_when_opted_in_and_scrubbed(
    store: Store, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch, opt_in: str
) -> None:
    monkeypatch.setenv(otel.CAPTURE_CONTENT_ENV, opt_in)
    with FakeModel("otel", replies=["noted, SK-VERY-SECRET-KEY"]):
        await agency.run(asks_with_a_key, store=store)
    attributes = _attrs(Spans(spans).one("chat otel"))
    if opt_in == "false":
        assert "gen_ai.input.messages" not in attributes
        assert "gen_ai.output.messages" not in attributes
        return
    sent = json.loads(str(attributes["gen_ai.input.messages"]))
    answer = json.loads(str(attributes["gen_ai.output.messages"]))
    assert sent == [{"role": "user", "content": "my key is **********, hello"}]
    assert answer == [{"role": "assistant", "content": "noted, **********"}]


async def test_a_registered_model_names_its_provider_and_model(
    store: Store, spans: InMemorySpanExporter
) -> None:
    agency.register_model(agency.Model("fake/otel", name="planner"))
    try:
        with FakeModel("otel", replies=["ok"]):
            await agency.run(asks_the_run_model, store=store, model="planner")
    finally:
        agency.unregister_model("planner")
    chat = Spans(spans).one("chat otel")
    assert _attrs(chat)["gen_ai.provider.name"] == "fake"
    assert _attrs(chat)["agency.model"] == "planner"


async def test_tools_and_their_requests_nest_under_the_llm_call(
    store: Store, spans: InMemorySpanExporter
) -> None:
    replies: list[str | list[FakeToolCall]] = [
        [FakeToolCall("weather", {"city": "Oslo"}, id="c1"), FakeToolCall("broken", {"why": "x"})],
        "Sunny in Oslo.",
    ]
    with FakeModel("otel", replies=replies):
        result = await agency.run(uses_tools, store=store)
    assert result.value == "Sunny in Oslo."
    seen = Spans(spans)
    llm = seen.one("agency.step agency.llm")
    assert seen.children(llm) == [
        "chat otel",
        "execute_tool weather",
        "execute_tool broken",
        "chat otel",
    ]
    first, second = seen.named("chat otel")
    assert _attrs(first)["agency.step.path"] == "llm#0/round#0"
    assert _attrs(second)["agency.step.path"] == "llm#0/round#1"
    assert all(isinstance(_attrs(c)["gen_ai.usage.input_tokens"], int) for c in (first, second))
    assert _attrs(first)["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert _attrs(second)["gen_ai.response.finish_reasons"] == ("stop",)
    assert "gen_ai.input.messages" not in _attrs(first)  # content only when opted in
    tool = seen.one("execute_tool weather")
    assert _attrs(tool) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "weather",
        "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.type": "function",
        "agency.step.path": "llm#0/tool#0",
        "agency.replayed": False,
    }
    assert tool.status.status_code is StatusCode.UNSET
    assert seen.children(tool) == ["weather lookup"]  # the tool's own span nests
    failed = seen.one("execute_tool broken")
    assert failed.status.status_code is StatusCode.ERROR
    assert _attrs(failed)["error.type"] == "RuntimeError"
    assert [e.name for e in failed.events] == ["exception"]
    assert llm.status.status_code is StatusCode.UNSET  # the model read the error and answered


async def test_a_resumed_run_replays_steps_and_the_llm_call_without_asking_again(
    store: Store, spans: InMemorySpanExporter
) -> None:
    with FakeModel("otel", replies=["hi"]) as fake:
        paused = await agency.run(step_llm_interrupt, run_id="resume", store=store)
        assert paused.status == "paused"
        seen = Spans(spans)
        run = seen.one(f"agency.run {ENTRY}step_llm_interrupt")
        assert _attrs(run)["agency.run.status"] == "paused"
        assert run.status.status_code is StatusCode.UNSET  # a pause is no error
        asked = seen.one("agency.interrupt confirm")
        (interrupt,) = paused.interrupts
        assert _attrs(asked) == {
            "agency.interrupt.id": interrupt.interrupt_id,
            "agency.interrupt.effect": "confirm",
            "agency.replayed": False,
            "agency.interrupt.paused": True,
            "agency.signal": "paused",
        }
        assert asked.status.status_code is StatusCode.UNSET
        assert seen.parent(asked) == run

        done = await agency.respond_to_interrupts(
            "resume", {interrupt.interrupt_id: approve()}, store=store
        )
    assert done.value == [1, "hi", True]
    assert len(fake.calls) == 1  # the replay asked nothing
    seen = Spans(spans)
    run = seen.one(f"agency.run {ENTRY}step_llm_interrupt")
    assert _attrs(run)["agency.attempt"] == 2
    assert _attrs(run)["agency.run.status"] == "completed"
    assert seen.children(run) == [
        "agency.step one",
        "agency.step agency.llm",
        "agency.interrupt confirm",
    ]
    assert _attrs(seen.one("agency.step one"))["agency.replayed"] is True
    llm = seen.one("agency.step agency.llm")
    assert _attrs(llm)["agency.replayed"] is True
    (chat,) = seen.named("chat otel")
    assert seen.parent(chat) == llm
    assert _attrs(chat) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "fake",
        "gen_ai.request.model": "otel",
        "agency.step.path": "main/llm#0",
        "agency.replayed": True,
    }
    answered = _attrs(seen.one("agency.interrupt confirm"))
    assert answered["agency.replayed"] is True
    assert answered["agency.interrupt.decision"] == "approve"
    assert answered["agency.interrupt.paused"] is False


async def test_a_tool_loop_resumed_after_an_approval_replays_its_rounds_and_tools(
    store: Store, spans: InMemorySpanExporter
) -> None:
    replies: list[str | list[FakeToolCall]] = [
        [FakeToolCall("weather", {"city": "Oslo"})],
        [FakeToolCall("pay", {"why": "rent"})],
        "Done.",
    ]
    with FakeModel("otel", replies=replies) as fake:
        paused = await agency.run(pays, run_id="loop", store=store)
        (asked,) = paused.interrupts
        seen = Spans(spans)
        tool = seen.one("execute_tool pay")
        assert _attrs(tool)["agency.signal"] == "paused"
        assert seen.children(tool) == ["agency.interrupt std::tool-approval"]
        await agency.respond_to_interrupts("loop", {asked.interrupt_id: approve()}, store=store)
    assert len(fake.calls) == 3
    seen = Spans(spans)
    chats = seen.named("chat otel")
    assert [_attrs(c)["agency.replayed"] for c in chats] == [True, True, False]
    assert "gen_ai.usage.input_tokens" not in _attrs(chats[0])
    assert _attrs(seen.one("execute_tool weather"))["agency.replayed"] is True
    assert _attrs(seen.one("execute_tool pay"))["agency.replayed"] is False


# -- user spans, errors, guards --------------------------------------------------------------


async def test_a_user_span_inside_a_step_is_the_step_span_s_child(
    store: Store, spans: InMemorySpanExporter
) -> None:
    with USER[0].start_as_current_span("request"):
        await agency.run(user_span_in_step, store=store)
    seen = Spans(spans)
    mine, step = seen.one("mine"), seen.one("agency.step traced")
    assert seen.parent(mine) == step
    run = seen.parent(step)
    assert run is not None
    assert run.name == f"agency.run {ENTRY}user_span_in_step"
    assert seen.parent(run) == seen.one("request")  # a run nests in its caller's span
    assert len({s.context.trace_id for s in seen.all}) == 1


async def test_concurrent_steps_each_get_their_own_span_and_context(
    store: Store, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    result = await agency.run(parallel_steps, store=store)
    assert result.value == ["a", "b"]
    seen = Spans(spans)
    run = seen.one(f"agency.run {ENTRY}parallel_steps")
    for name in ("a", "b"):
        step = seen.one(f"agency.step branch {name}")
        assert seen.parent(step) == run
        assert seen.parent(seen.one(f"mine {name}")) == step
    assert seen.children(run)[-1] == "agency.step agency.sleep"
    assert _attrs(seen.one("agency.step agency.sleep"))["agency.replayed"] is False
    assert [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")] == []


async def test_instrument_again_replaces_the_provider(
    store: Store, spans: InMemorySpanExporter
) -> None:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(provider)
    await agency.run(two_steps, store=store)
    assert Spans(exporter).names() == [
        f"agency.run {ENTRY}two_steps",
        "agency.step one",
        "agency.step two",
    ]
    assert Spans(spans).all == ()


async def test_a_failing_step_records_its_error(store: Store, spans: InMemorySpanExporter) -> None:
    result = await agency.run(failing_step, store=store)
    assert result.status == "failed"
    seen = Spans(spans)
    step = seen.one("agency.step fails")
    assert step.status.status_code is StatusCode.ERROR
    assert step.status.description == "ValueError: no luck"
    (event,) = step.events
    assert event.name == "exception"
    assert dict(event.attributes or {})["exception.type"] == "ValueError"
    run = seen.one(f"agency.run {ENTRY}failing_step")
    assert run.status.status_code is StatusCode.ERROR
    assert _attrs(run)["agency.run.status"] == "failed"


async def test_a_guard_over_budget_is_a_span_around_its_interrupt(
    store: Store, spans: InMemorySpanExporter
) -> None:
    with FakeModel("otel", replies=["far too expensive an answer"]):
        paused = await agency.run(over_budget, store=store)
    assert paused.status == "paused"
    seen = Spans(spans)
    guard = seen.one("agency.guard cost")
    attributes = _attrs(guard)
    assert attributes["agency.guard.label"] == "tiny"
    assert attributes["agency.guard.budget"] == pytest.approx(0.000001)
    assert attributes["agency.guard.spent"] == pytest.approx(paused.cost)
    assert attributes["agency.signal"] == "paused"
    assert seen.children(guard) == ["agency.interrupt std::guard"]


async def test_add_cost_over_a_guard_is_a_failed_guard_span(
    store: Store, spans: InMemorySpanExporter
) -> None:
    result = await agency.run(adds_too_much, store=store)
    assert result.status == "failed"
    guard = Spans(spans).one("agency.guard cost")
    assert guard.status.status_code is StatusCode.ERROR
    assert _attrs(guard)["agency.guard.spent"] == pytest.approx(0.75)
    assert _attrs(guard)["agency.guard.budget"] == pytest.approx(0.5)


# -- turning it off --------------------------------------------------------------------------


async def test_uninstrument_stops_the_spans(store: Store, spans: InMemorySpanExporter) -> None:
    assert otel.instrumented()
    otel.uninstrument()
    assert not otel.instrumented()
    with FakeModel("otel", replies=["hi"]):
        await agency.run(asks_once, store=store)
    await agency.run(two_steps, store=store)
    assert Spans(spans).all == ()


def test_the_provider_is_the_model_string_s_prefix() -> None:
    from agency_runtime.otel import _provider_and_model

    assert _provider_and_model("openai/gpt-4o-mini") == ("openai", "gpt-4o-mini")
    assert _provider_and_model("openrouter/meta/llama-3") == ("openrouter", "meta/llama-3")
    assert _provider_and_model("fake/echo") == ("fake", "echo")


def test_instrument_checks_its_provider() -> None:
    with pytest.raises(InvalidArgumentError, match="TracerProvider"):
        otel.instrument("jaeger")  # type: ignore[arg-type]
    assert not otel.instrumented()


@pytest.mark.slow
def test_the_runtime_never_imports_opentelemetry_unless_instrumented(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys
        import agency_runtime
        from agency_runtime import agency
        from agency_runtime.testing import FakeModel

        async def entry():
            async def body(s):
                return await s.step(lambda: 1)
            await agency.with_resumable_scope("main", body)
            return await agency.llm("hi", model="fake/quiet")

        with FakeModel("quiet", replies=["hello"]):
            result = agency.run_sync(entry, store="memory://")
        assert result.status == "completed", result
        print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=tmp_path,
        env={"PYTHONPATH": str(Path(__file__).parents[2]), "PATH": "/usr/bin:/bin"},
    )
    assert done.stdout.strip() == "[]", done.stderr


async def delegates() -> int:
    child = await agency.run(two_steps)
    return int(child.value) + 1


async def test_a_child_runs_span_is_inside_its_parents_call(
    store: Store, spans: InMemorySpanExporter
) -> None:
    result = await agency.run(delegates, run_id="boss", store=store)
    assert result.value == 4
    seen = Spans(spans)
    parent = seen.one(f"agency.run {ENTRY}delegates")
    child = seen.one(f"agency.run {ENTRY}two_steps")
    call = seen.parent(child)
    assert call is not None  # the parent's journaled call: one trace, parent to child
    assert call.name == "agency.step agency.run"
    assert seen.parent(call) == parent
    assert child.context.trace_id == parent.context.trace_id
    assert seen.children(child) == ["agency.step one", "agency.step two"]


async def test_a_resumed_execution_links_to_the_one_before(
    store: Store, spans: InMemorySpanExporter
) -> None:
    with FakeModel("otel", replies=["hi"]):
        paused = await agency.run(step_llm_interrupt, run_id="linked", store=store)
        first = Spans(spans).one(f"agency.run {ENTRY}step_llm_interrupt")
        assert list(first.links) == []  # a run's first execution follows nothing
        (interrupt,) = paused.interrupts
        await agency.respond_to_interrupts(
            "linked", {interrupt.interrupt_id: approve()}, store=store
        )
    second = Spans(spans).one(f"agency.run {ENTRY}step_llm_interrupt")
    assert second.context.trace_id != first.context.trace_id  # a new trace (new process, too)
    (link,) = second.links
    assert (link.context.trace_id, link.context.span_id) == (
        first.context.trace_id,
        first.context.span_id,
    )


@agency.entry
async def traced_child(n: int) -> int:
    return n * 2


@agency.entry
async def traced_parent() -> int:
    child = await agency.run(traced_child, 21, queue="traced")
    return int(child.value)


async def test_a_queued_childs_span_links_to_its_parents_call(
    store: Store, spans: InMemorySpanExporter
) -> None:
    async with serving(Worker(store, queues=["traced"], poll=0.05)):
        result = await agency.run(traced_parent, run_id="traced", store=store)
    assert result.value == 42
    seen = Spans(spans)
    child = seen.one(f"agency.run {ENTRY}traced_child")
    call = next(s for s in seen.named("agency.step agency.run") if s.end_time is not None)
    assert seen.parent(call) is not None
    (link,) = child.links  # a worker's task: another trace, linked to the call that asked
    assert (link.context.trace_id, link.context.span_id) == (
        call.context.trace_id,
        call.context.span_id,
    )


async def retried_step() -> str:
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("down")
        return "up"

    async def body(s: ResumableScope) -> str:
        return await s.step(flaky, name="flaky", retries=agency.Retry(attempts=2, backoff=0))

    return await agency.with_resumable_scope("r", body)


async def test_a_failed_attempt_is_an_event_on_the_span_around_the_step(
    store: Store, spans: InMemorySpanExporter
) -> None:
    result = await agency.run(retried_step, run_id="retry", store=store)
    assert result.value == "up"
    seen = Spans(spans)
    run = seen.one(f"agency.run {ENTRY}retried_step")
    [event] = [e for e in run.events if e.name == "agency.step.retry"]
    attributes = dict(event.attributes or {})
    assert attributes["agency.step.path"] == "r/0"
    assert attributes["agency.step.attempt"] == 1
    assert attributes["exception.type"] == "ConnectionError"
    assert seen.names().count("agency.step flaky") == 2  # each attempt its own step span
