"""The LLM provider seam (DESIGN.md §10.5): registry, error mapping, retries, embeddings.

* a ``fake/`` model never imports litellm (checked in a fresh interpreter);
* the registry routes a model string by its prefix, and a custom provider plugs in;
* provider errors are mapped at the seam: transient ones are retried with backoff for every
  provider, permanent ones become ``LLMCallError`` with the original chained;
* the litellm provider maps litellm's exceptions, cost and usage (litellm's functions are
  replaced here, so no network is involved);
* embeddings go through the seam with the same retries, and the fake provider answers them;
* the fake provider runs on asyncio and trio alike.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel

import agency_runtime._llm._billing as billing_module
import agency_runtime._llm._retries as retries_module
from agency_runtime import (
    GuardExceededError,
    InvalidArgumentError,
    LLMCallError,
    MemoryStore,
    RuntimeContext,
    agency,
    approve,
)
from agency_runtime._fakes import PROVIDER as FAKE
from agency_runtime._fakes import fake_embedding
from agency_runtime._llm import _registry
from agency_runtime._llm._embed import embed
from agency_runtime._llm._litellm import LITELLM_PROVIDER, litellm_error, load_litellm
from agency_runtime._llm._provider import (
    ChatProvider,
    ChatRequest,
    ChatResponse,
    EmbedRequest,
    EmbedResponse,
    ProviderError,
    StreamEnd,
    StreamEvent,
    TextDelta,
    Usage,
)
from agency_runtime.testing import FakeClock, FakeModel, reset
from tests.support import LITELLM, SHARES_LITELLM, advance_when_blocked, asyncio_only, wait_for

pytestmark = [pytest.mark.anyio, SHARES_LITELLM]  # litellm is imported here


class City(BaseModel):
    city: str


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(retries_module, "BACKOFF_BASE", 0.001)
    yield
    reset()


class Scripted:
    """A custom provider: answers (or raises) from a script, records every request."""

    def __init__(self, *outcomes: str | BaseException, schema: bool = True) -> None:
        self.outcomes = list(outcomes)
        self.schema = schema
        self.requests: list[ChatRequest | EmbedRequest] = []

    @property
    def name(self) -> str:
        return "scripted"

    def _next(self) -> str:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        text = self._next()
        return ChatResponse(text=text, usage=Usage.of(4, 1), cost=0.5)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        text = self._next()
        yield TextDelta(text)
        yield StreamEnd(text=text, usage=Usage.of(4, 1), cost=0.5)

    async def embed(self, request: EmbedRequest) -> EmbedResponse:
        self.requests.append(request)
        self._next()
        return EmbedResponse(
            vectors=[[1.0, 0.0] for _ in request.texts], usage=Usage.of(2), cost=0.25
        )

    async def supports_schema(self, model: str) -> bool:
        return self.schema


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    provider = Scripted()
    _registry.register_provider("scripted", provider)
    yield provider
    _registry.unregister_provider("scripted")


# -- a fake model never imports litellm ----------------------------------------------------------


@pytest.mark.slow
def test_a_fake_model_run_does_not_import_litellm(tmp_path: Any) -> None:
    code = textwrap.dedent(
        """
        import sys
        import anyio
        from pydantic import BaseModel
        from agency_runtime import SqliteStore, agency
        from agency_runtime._llm._embed import embed
        from agency_runtime.testing import FakeModel

        class City(BaseModel):
            city: str

        async def entry() -> list:
            echoed = await agency.llm("hello there")
            city = await agency.llm("where?", schema=City)
            scripted = await agency.llm("and now?", model="fake/scripted")
            vectors = await embed("fake/echo", ["a cat", "a dog"])
            return [echoed, city.city, scripted, len(vectors)]

        async def main() -> None:
            store = SqliteStore("runs.db")
            with FakeModel("scripted", replies=["scripted answer"], fail_times=1):
                result = await agency.run(entry, store=store, model="fake/echo")
            store.close()
            assert result.status == "completed", result.error
            assert result.value == ["hello there", "text", "scripted answer", 2], result.value
            assert result.cost > 0 and result.tokens > 0, result
            print("ok")

        anyio.run(main)
        heavy = [m for m in ("litellm", "openai", "tiktoken") if m in sys.modules]
        assert not heavy, f"a fake-model run imported {heavy}"
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# -- the registry ----------------------------------------------------------------------------------


def test_models_are_routed_by_prefix(scripted: Scripted) -> None:
    assert _registry.provider_for("fake/echo") is FAKE
    assert _registry.provider_for("fake/anything/with/slashes") is FAKE
    assert _registry.provider_for("scripted/model") is scripted
    assert _registry.provider_for("openai/gpt-4o-mini") is LITELLM_PROVIDER
    assert _registry.provider_for("gpt-4o-mini") is LITELLM_PROVIDER  # no prefix: litellm
    assert _registry.default_provider() is LITELLM_PROVIDER
    for provider in (FAKE, LITELLM_PROVIDER, scripted):
        assert isinstance(provider, ChatProvider)


def test_a_registered_prefix_can_replace_the_fake_provider_until_unregistered() -> None:
    replacement = Scripted()
    assert _registry.register_provider("fake", replacement) is FAKE
    try:
        assert _registry.provider_for("fake/echo") is replacement
    finally:
        _registry.unregister_provider("fake")
    assert _registry.provider_for("fake/echo") is FAKE


@pytest.mark.parametrize("prefix", ["", "a/b", " fake", 3])
def test_a_bad_prefix_is_refused(prefix: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="prefix"):
        _registry.register_provider(prefix, Scripted())


def test_a_provider_must_implement_the_protocol() -> None:
    with pytest.raises(InvalidArgumentError, match="ChatProvider"):
        _registry.register_provider("nothing", object())  # type: ignore[arg-type]


# -- a custom provider behind agency.llm ---------------------------------------------------------


async def test_agency_llm_calls_a_custom_provider_and_bills_its_cost(scripted: Scripted) -> None:
    scripted.outcomes = ["an answer"]
    with agency.test_context():
        assert await agency.llm("question", model="scripted/one", timeout=3) == "an answer"
        assert agency.ctx().cost == pytest.approx(0.5)
        assert agency.ctx().tokens == 5
    (request,) = scripted.requests
    assert isinstance(request, ChatRequest)
    assert request.model == "scripted/one"
    assert request.messages == [{"role": "user", "content": "question"}]
    assert request.timeout == 3.0
    assert request.response_format is None


async def test_a_provider_that_changes_the_messages_it_got_never_changes_a_later_request() -> None:
    class Meddling(Scripted):
        seen: list[list[dict[str, Any]]]

        async def complete(self, request: ChatRequest) -> ChatResponse:
            answer = await super().complete(request)
            self.seen.append([dict(message) for message in request.messages])
            for message in request.messages:  # against the contract: it must not
                message["content"] = "changed by the provider"
                message["extra"] = True
            return answer

    meddling = Meddling("one", "two")
    meddling.seen = []
    _registry.register_provider("meddling", meddling)
    try:
        with agency.test_context():
            assert await agency.llm("first", model="meddling/m") == "one"
            assert await agency.llm("second", model="meddling/m") == "two"
    finally:
        _registry.unregister_provider("meddling")
    assert meddling.seen[1] == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second"},
    ]


async def test_a_schema_goes_as_a_response_format_when_supported(scripted: Scripted) -> None:
    scripted.outcomes = ['{"city": "Paris"}']
    with agency.test_context():
        assert await agency.llm("where?", model="scripted/x", schema=City) == City(city="Paris")
    (request,) = scripted.requests
    assert isinstance(request, ChatRequest)
    assert request.response_format is City
    assert len(request.messages) == 1


async def test_a_schema_goes_in_the_prompt_when_not_supported(scripted: Scripted) -> None:
    scripted.schema = False
    scripted.outcomes = ['{"value": [1, 2]}']
    with agency.test_context():
        assert await agency.llm("numbers", model="scripted/x", schema=list[int]) == [1, 2]
        # the instruction is sent, never pushed on the thread
        assert [m.role for m in agency.thread.current().get_messages()] == ["user", "assistant"]
    (request,) = scripted.requests
    assert isinstance(request, ChatRequest)
    assert request.response_format is None
    system = request.messages[-1]
    assert system["role"] == "system"
    assert system["content"].startswith("Respond with only a JSON document matching")
    assert '"value"' in system["content"]


async def test_transient_provider_errors_are_retried_with_backoff(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    delays: list[float] = []

    async def sleep(seconds: float) -> None:  # the backoff's sleeps: recorded, not waited
        delays.append(seconds)
        await anyio.lowlevel.checkpoint()

    monkeypatch.setattr(anyio, "sleep", sleep)
    monkeypatch.setattr(retries_module, "BACKOFF_BASE", 0.5)
    scripted.outcomes = [
        ProviderError("busy", kind="rate_limit"),
        ProviderError("blip", kind="connection"),
        "finally",
    ]
    with agency.test_context():
        assert await agency.llm("hello", model="scripted/x") == "finally"
    assert len(scripted.requests) == 3
    assert delays == [0.5, 1.0]


async def test_transient_errors_that_persist_chain_the_original(scripted: Scripted) -> None:
    class Upstream(Exception):
        pass

    errors: list[str | BaseException] = []
    for attempt in range(retries_module.TRANSIENT_ATTEMPTS):
        try:
            raise ProviderError("HTTP 503", kind="server") from Upstream(f"503 #{attempt}")
        except ProviderError as exc:
            errors.append(exc)
    scripted.outcomes = errors
    with agency.test_context(), pytest.raises(LLMCallError, match="failed 3 times") as info:
        await agency.llm("hello", model="scripted/x")
    assert isinstance(info.value.__cause__, Upstream)
    assert info.value.attempts == retries_module.TRANSIENT_ATTEMPTS
    assert "Upstream: 503 #2" in str(info.value)


@pytest.mark.parametrize(
    "error",
    [
        ProviderError("bad key", kind="auth"),
        ProviderError("flaky but marked permanent", kind="server", transient=False),
        ValueError("a provider bug"),
    ],
    ids=["auth", "explicitly-permanent", "unmapped"],
)
async def test_permanent_errors_are_not_retried(scripted: Scripted, error: Exception) -> None:
    scripted.outcomes = [error, "never"]
    with agency.test_context(), pytest.raises(LLMCallError) as info:
        await agency.llm("hello", model="scripted/x")
    assert len(scripted.requests) == 1
    assert info.value.attempts == 1
    assert info.value.__cause__ is error


async def test_a_failed_call_is_journaled_like_an_answer(scripted: Scripted) -> None:
    store = MemoryStore()
    scripted.outcomes = [ProviderError("bad request", kind="bad_request")]

    async def entry() -> str:
        try:
            await agency.llm("hello", model="scripted/x")
        except LLMCallError as exc:
            outcome = f"{type(exc).__name__}: {exc.attempts}"
        await agency.interrupt("confirm")
        return outcome

    paused = await agency.run(entry, run_id="failing-call", store=store)
    assert paused.status == "paused", paused.error
    (entry_row,) = await agency.runs.journal("failing-call", store=store)
    assert entry_row.name == "agency.llm"
    assert entry_row.error is not None
    assert "LLMCallError" in entry_row.error
    # On replay the recorded failure is raised again; the provider is not asked again.
    done = await agency.respond_to_interrupts(paused, [approve()], store=store)
    assert done.status == "completed", done.error
    assert done.value == "LLMCallError: 1"
    assert len(scripted.requests) == 1


async def test_a_time_guard_cancels_a_call_in_any_provider(scripted: Scripted) -> None:
    clock = FakeClock()

    class Hanging(Scripted):
        async def complete(self, request: ChatRequest) -> ChatResponse:
            self.requests.append(request)
            await clock.sleep(30)  # a call that takes 30 s of the run's clock
            raise AssertionError("not cancelled")

    hanging = Hanging()
    _registry.register_provider("scripted", hanging)
    with agency.test_context(ctx=RuntimeContext(clock=clock)):
        async with anyio.create_task_group() as group:
            group.start_soon(advance_when_blocked, clock, 0.05, 30)
            with pytest.raises(GuardExceededError):
                async with agency.time_guard(0.05):
                    await agency.llm("hello", model="scripted/x")
    assert len(hanging.requests) == 1


# -- the litellm provider (litellm's functions replaced: no network) -----------------------------


class _Response:
    """Just enough of a litellm ``ModelResponse``."""

    def __init__(self, text: str, *, cost: float | None = None) -> None:
        message = type("Message", (), {"content": text})()
        self.choices = [type("Choice", (), {"message": message})()]
        self.usage = type(
            "Usage", (), {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        )()
        self._hidden_params = {} if cost is None else {"response_cost": cost}
        self.model = "some/model"


async def test_litellm_provider_passes_timeout_and_no_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    litellm = await load_litellm()
    seen: list[dict[str, Any]] = []

    async def acompletion(**kwargs: Any) -> _Response:
        seen.append(kwargs)
        return _Response("hi", cost=0.125)

    monkeypatch.setattr(litellm, "acompletion", acompletion)
    response = await LITELLM_PROVIDER.complete(
        ChatRequest(model="some/model", messages=[{"role": "user", "content": "x"}], timeout=9)
    )
    assert (response.text, response.cost, response.usage) == ("hi", 0.125, Usage(5, 2, 7))
    assert seen == [
        {
            "model": "some/model",
            "messages": [{"role": "user", "content": "x"}],
            "timeout": 9,
            "num_retries": 0,
        }
    ]


async def test_litellm_provider_treats_a_failing_price_lookup_as_unknown(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    litellm = await load_litellm()

    async def acompletion(**kwargs: Any) -> _Response:
        return _Response("priceless")

    def completion_cost(**kwargs: Any) -> float:
        raise ValueError("This model isn't mapped yet")

    monkeypatch.setattr(litellm, "acompletion", acompletion)
    monkeypatch.setattr(litellm, "completion_cost", completion_cost)
    monkeypatch.setattr(litellm, "supports_response_schema", lambda **kwargs: False)
    monkeypatch.setattr(billing_module, "_unpriced", set())  # the warning is once per process
    response = await LITELLM_PROVIDER.complete(ChatRequest(model="unmapped/model", messages=[]))
    assert response.cost is None
    assert not await LITELLM_PROVIDER.supports_schema("unmapped/model")
    with agency.test_context(), caplog.at_level(logging.WARNING, logger="agency_runtime.llm"):
        assert await agency.llm("hi", model="unmapped/model") == "priceless"
        assert agency.ctx().cost == 0
        assert agency.ctx().tokens == 7
    assert "no price is known for model 'unmapped/model'" in caplog.text


async def test_litellm_errors_are_mapped_with_their_kind() -> None:
    litellm = await load_litellm()
    common = {"message": "m", "model": "x/y", "llm_provider": "openai"}
    cases = {
        litellm.Timeout(**common): ("timeout", True),
        litellm.RateLimitError(**common): ("rate_limit", True),
        litellm.InternalServerError(**common): ("server", True),
        litellm.ServiceUnavailableError(**common): ("server", True),
        litellm.APIConnectionError(**common): ("connection", True),
        litellm.BadRequestError(**common): ("bad_request", False),
        litellm.AuthenticationError(**common): ("auth", False),
        litellm.NotFoundError(**common): ("not_found", False),
    }
    for exc, (kind, transient) in cases.items():
        mapped = litellm_error(exc, "x/y")
        assert mapped is not None, exc
        assert (type(exc).__name__, mapped.kind, mapped.transient) == (
            type(exc).__name__,
            kind,
            transient,
        )
    assert litellm_error(ValueError("not litellm's"), "x/y") is None


async def test_litellm_provider_transient_errors_are_retried_by_the_seam(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    litellm = await load_litellm()
    calls: list[int] = []

    async def acompletion(**kwargs: Any) -> _Response:
        calls.append(1)
        if len(calls) < 3:
            raise litellm.RateLimitError(message="429", model="x/y", llm_provider="openai")
        return _Response("third time", cost=0.0)

    monkeypatch.setattr(litellm, "acompletion", acompletion)
    with agency.test_context():
        assert await agency.llm("hi", model="x/y") == "third time"
    assert len(calls) == 3


@asyncio_only(LITELLM)  # via_litellm=True: litellm.acompletion streams the fake's answer
async def test_litellm_provider_streams_deltas_then_usage() -> None:
    with FakeModel("lite-stream", replies=["a streamed answer"], via_litellm=True) as fake:
        events = [
            event
            async for event in FAKE.stream(
                ChatRequest(model=fake.model, messages=[{"role": "user", "content": "go"}])
            )
        ]
    *deltas, end = events
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == "a streamed answer"
    assert isinstance(end, StreamEnd)
    assert end.text == "a streamed answer"
    assert (end.usage.prompt_tokens, end.usage.completion_tokens) == (2, 3)
    assert end.cost == pytest.approx(2e-6 + 6e-6)


# -- embeddings through the seam -----------------------------------------------------------------


async def test_embed_with_a_fake_model_bills_the_run() -> None:
    with FakeModel("vectors", input_cost_per_token=0.001) as fake, agency.test_context():
        vectors = await embed(fake.model, ["a cat", "a dog"])
        assert vectors == [fake_embedding("a cat"), fake_embedding("a dog")]
        assert agency.ctx().tokens == 6
        assert agency.ctx().cost == pytest.approx(0.006, abs=1e-12)
    assert fake.embed_calls == [["a cat", "a dog"]]


async def test_embed_outside_a_frame_bills_nothing_and_works() -> None:
    assert await embed("fake/echo", ["x"]) == [fake_embedding("x")]
    assert await embed("fake/echo", []) == []


async def test_embed_retries_transient_errors(scripted: Scripted) -> None:
    scripted.outcomes = [ProviderError("busy", kind="rate_limit"), "ok"]
    with agency.test_context():
        assert await embed("scripted/e", ["one", "two"], timeout=4) == [[1.0, 0.0], [1.0, 0.0]]
        assert agency.ctx().cost == pytest.approx(0.25)
        assert agency.ctx().tokens == 2
    assert len(scripted.requests) == 2
    request = scripted.requests[-1]
    assert isinstance(request, EmbedRequest)
    assert (request.texts, request.timeout) == (["one", "two"], 4.0)


async def test_embed_failures_raise_llm_call_error() -> None:
    with FakeModel("down", fail_times=10, failure="timeout") as fake:
        with pytest.raises(LLMCallError, match="embedding call to 'fake/down' failed 3 times"):
            await embed(fake.model, ["x"])
        assert len(fake.embed_calls) == retries_module.TRANSIENT_ATTEMPTS
    with FakeModel("refused", fail_times=1, failure="bad_request") as fake:
        with pytest.raises(LLMCallError) as info:
            await embed(fake.model, ["x"])
        assert info.value.attempts == 1


async def test_embed_through_litellm_calls_aembedding(monkeypatch: pytest.MonkeyPatch) -> None:
    litellm = await load_litellm()
    seen: list[dict[str, Any]] = []

    class Response:
        def __init__(self) -> None:
            self.data = [{"index": 1, "embedding": [0, 1]}, {"index": 0, "embedding": [1, 0]}]
            self.usage = type("Usage", (), {"total_tokens": 7})()
            self._hidden_params = {"response_cost": 0.25}

    async def aembedding(**kwargs: Any) -> Response:
        seen.append(kwargs)
        return Response()

    monkeypatch.setattr(litellm, "aembedding", aembedding)
    with agency.test_context():
        assert await embed("some/embedder", ["a", "b"]) == [[1.0, 0.0], [0.0, 1.0]]
        assert agency.ctx().cost == pytest.approx(0.25)
        assert agency.ctx().tokens == 7
    assert seen == [
        {"model": "some/embedder", "input": ["a", "b"], "timeout": 120.0, "num_retries": 0}
    ]


async def test_agent_memory_embeds_through_the_seam_with_a_fake_model() -> None:
    """``embeddings_model="fake/..."``: recall's embedding search runs offline, billed."""
    facts = {
        "entities": [
            {"name": "Tom", "type": "animal", "observations": ["is a cat"]},
            {"name": "Acme", "type": "company", "observations": ["sells an anvil"]},
        ],
        "relations": [],
        "expirations": [],
    }

    def brain(request: Any) -> Any:
        name = request.response_format["json_schema"]["name"]
        assert name == "Extraction", name
        return facts

    with (
        FakeModel("memory-brain", function=brain) as model,
        FakeModel("memory-vectors") as vectors,
        agency.test_context() as frame,
    ):
        agency.memory.enable(
            {"model": model.model, "embeddings_model": vectors.model, "llm_filter": False}
        )
        await agency.memory.remember("animals and companies")
        spent = frame.ctx.cost
        assert await agency.memory.recall("cat") == "Tom (animal):\n  - is a cat"
        assert frame.ctx.cost > spent  # the embeddings were billed
    assert vectors.embed_calls == [
        ["cat", "Tom (animal): is a cat", "Acme (company): sells an anvil"]
    ]
    assert vectors.calls == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", ["x"]), "model"),
        (("fake/echo", "x"), "texts"),
        (("fake/echo", [1]), "texts"),
    ],
)
async def test_embed_checks_its_arguments(args: tuple[Any, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        await embed(*args)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        await embed("fake/echo", ["x"], timeout=0)


# -- asyncio and trio ------------------------------------------------------------------------------


class TestOnEveryBackend:
    """Without litellm in the way, the fake provider is plain anyio: trio works too.

    (Every async test runs on both backends; these run a fake model through all of it.)
    """

    async def test_a_run_with_fake_calls_retries_and_replay(self) -> None:
        store = MemoryStore()
        with FakeModel("both", replies=["first", '{"city": "Oslo"}'], fail_times=1) as fake:

            async def entry() -> list[Any]:
                first = await agency.llm("one", model=fake.model)
                city = await agency.llm("two", model=fake.model, schema=City)
                vectors = await embed("fake/echo", ["x y"])
                answer = await agency.interrupt("confirm")
                return [first, city.city, len(vectors[0]), answer.value]

            paused = await agency.run(entry, run_id="backends", store=store)
            assert paused.status == "paused", paused.error
            done = await agency.respond_to_interrupts(paused, [approve("yes")], store=store)
        assert done.status == "completed", done.error
        assert done.value == ["first", "Oslo", 64, "yes"]
        assert len(fake.calls) == 3  # one transient failure, two answers; nothing on replay

    async def test_latency_is_cancelled_by_a_time_guard(self) -> None:
        clock = FakeClock()  # the guard's; the model's 30 s latency is never waited out
        answered: list[str] = []

        async def trip_once_in_flight() -> None:
            await wait_for(lambda: len(fake.calls) == 1)
            clock.advance(0.05)

        with (
            FakeModel(
                "slow", function=lambda r: answered.append("late") or "late", latency=30
            ) as fake,
            agency.test_context(ctx=RuntimeContext(clock=clock)),
        ):
            async with anyio.create_task_group() as group:
                group.start_soon(trip_once_in_flight)
                with pytest.raises(GuardExceededError):
                    async with agency.time_guard(0.05):
                        await agency.llm("hello", model=fake.model)
        assert answered == []

    async def test_streaming_at_the_seam(self) -> None:
        request = ChatRequest(model="fake/echo", messages=[{"role": "user", "content": "a b c"}])
        texts = [e.text async for e in FAKE.stream(request) if isinstance(e, TextDelta)]
        assert texts == ["a ", "b ", "c"]
