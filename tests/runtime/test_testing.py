"""agency_runtime.testing: the offline ``fake/...`` models, at the seam and inside litellm.

Most tests here call ``litellm.acompletion`` directly: they check the fake models as a litellm
custom provider (what ``FakeModel(..., via_litellm=True)`` and direct litellm users get). Those
run on asyncio only (``LITELLM_ONLY``): litellm's async code is asyncio code. The seam section
calls the fake provider itself (what ``agency.llm`` uses by default, no litellm), on asyncio
and trio.
"""

from __future__ import annotations

import enum
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import datetime
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel, Field

from agency_runtime import _fakes, testing
from agency_runtime._fakes import PROVIDER, _litellm_handler, _models, fake_embedding
from agency_runtime._llm._litellm import load_litellm
from agency_runtime._llm._provider import (
    ChatRequest,
    EmbedRequest,
    ProviderError,
    StreamEnd,
    TextDelta,
)
from agency_runtime.testing import (
    FAKE_PROVIDER,
    FakeModel,
    FakeModelExhausted,
    FakeRequest,
    fake_provider_installed,
    reset,
)
from tests.support import LITELLM, SHARES_LITELLM, asyncio_only, wait_for

pytestmark = [pytest.mark.anyio, SHARES_LITELLM]  # litellm is imported here

LITELLM_ONLY = asyncio_only(LITELLM)
"""For the tests that call litellm's own async functions."""

USER = [{"role": "user", "content": "hello there"}]


@pytest.fixture(autouse=True)
def _reset_fakes() -> Iterator[None]:
    yield
    reset()


async def llm() -> Any:
    """litellm, loaded through the runtime's loader (slow once per session)."""
    return await load_litellm()


def text_of(response: Any) -> str:
    content = response.choices[0].message.content
    assert isinstance(content, str)
    return content


# -- import cost and installation -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("fresh-interpreter")  # litellm is imported in a subprocess only
def test_import_is_cheap_and_installs_on_load() -> None:
    code = textwrap.dedent(
        """
        import sys
        import agency_runtime.testing as t
        assert "litellm" not in sys.modules, "importing testing imported litellm"
        assert not t.fake_provider_installed()
        t.FakeModel("early", replies=["one two"], input_cost_per_token=0.5,
                    output_cost_per_token=0.25).register()
        from agency_runtime._llm._litellm import load_litellm_sync
        litellm = load_litellm_sync()
        assert t.fake_provider_installed()
        r = litellm.completion(model="fake/early", messages=[{"role": "user", "content": "a b"}],
                               timeout=5)
        assert r.choices[0].message.content == "one two"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 2)
        assert r._hidden_params["response_cost"] == pytest_approx, r._hidden_params
        print("ok")
        """
    ).replace("pytest_approx", "3 * 0.5 + 2 * 0.25")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


async def test_provider_installed_once_without_clobbering() -> None:
    litellm = await llm()
    assert fake_provider_installed()
    fakes = [e for e in litellm.custom_provider_map if e["provider"] == FAKE_PROVIDER]
    assert len(fakes) == 1
    before = list(litellm.custom_provider_map)
    _litellm_handler.install(litellm)  # idempotent: a second run changes nothing
    assert litellm.custom_provider_map == before


# -- built-in models ---------------------------------------------------------------------------


@LITELLM_ONLY
async def test_echo_replies_with_last_user_message() -> None:
    litellm = await llm()
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "say this back"},
    ]
    response = await litellm.acompletion(model="fake/echo", messages=messages, timeout=5)
    assert text_of(response) == "say this back"
    assert response.model == "fake/echo"


@LITELLM_ONLY
async def test_echo_reads_text_parts_and_json_model_defaults_to_empty_object() -> None:
    litellm = await llm()
    parts = [{"role": "user", "content": [{"type": "text", "text": "from parts"}]}]
    response = await litellm.acompletion(model="fake/echo", messages=parts, timeout=5)
    assert text_of(response) == "from parts"
    response = await litellm.acompletion(model="fake/json", messages=USER, timeout=5)
    assert text_of(response) == "{}"


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    street: str
    number: int
    verified: bool


class Person(BaseModel):
    name: str
    age: int = Field(ge=18, le=99)
    height: float
    color: Color
    home: Address
    previous: list[Address]
    nickname: str | None = None
    tags: list[str]
    born: datetime
    ident: UUID
    kind: str = Field(pattern=r"^[a-z]+$")  # no pattern support, but "text" matches


@LITELLM_ONLY
async def test_echo_with_pydantic_schema_returns_valid_json() -> None:
    litellm = await llm()
    for model in ("fake/echo", "fake/json"):
        response = await litellm.acompletion(
            model=model, messages=USER, response_format=Person, timeout=5
        )
        person = Person.model_validate_json(text_of(response))
        assert person.color is Color.RED
        assert person.age == 18
        assert person.home.number == 1
        assert len(person.previous) == 1
        assert person.nickname == "text"  # first non-null branch of the optional field


@LITELLM_ONLY
async def test_echo_with_dict_json_schema() -> None:
    litellm = await llm()
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "integer", "exclusiveMinimum": 5},
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}]},
            "mode": {"enum": ["fast", "slow"]},
            "when": {"type": ["string", "null"], "format": "date"},
            "node": {"$ref": "#/$defs/Node"},
        },
        "required": ["answer", "pair", "mode", "when", "node"],
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "label": {"type": "string", "minLength": 10},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
            }
        },
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    response = await litellm.acompletion(
        model="fake/echo", messages=USER, response_format=response_format, timeout=5
    )
    data = json.loads(text_of(response))
    assert data["answer"] == 6
    assert data["pair"] == ["text", 1.0]
    assert data["mode"] == "fast"
    assert data["when"] == "2024-01-01"
    assert len(data["node"]["label"]) == 10
    assert isinstance(data["node"]["children"], list)  # recursion stops


# -- scripted replies ---------------------------------------------------------------------------


@LITELLM_ONLY
async def test_scripted_replies_in_order_then_exhausted() -> None:
    litellm = await llm()
    with FakeModel("script", replies=["first", {"n": 1}]) as fake:
        assert fake.model == "fake/script"
        first = await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
        second = await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
        assert text_of(first) == "first"
        assert json.loads(text_of(second)) == {"n": 1}
        with pytest.raises(FakeModelExhausted, match=r"fake/script.*2 replies") as info:
            await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
        # Not transient, and it reaches the caller unwrapped by litellm.
        assert isinstance(info.value, litellm.BadRequestError)
        assert type(info.value).__name__ == "FakeModelExhausted"
    assert len(fake.calls) == 3


@LITELLM_ONLY
async def test_scripted_exceptions_are_raised() -> None:
    litellm = await llm()
    unavailable = litellm.ServiceUnavailableError(
        message="down for a bit", llm_provider="fake", model="fake/flaky"
    )
    with FakeModel("flaky", replies=[unavailable, ValueError("odd"), "finally"]) as fake:
        with pytest.raises(litellm.ServiceUnavailableError, match="down for a bit"):
            await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
        # litellm wraps a provider's non-litellm exception as APIConnectionError.
        with pytest.raises(litellm.APIConnectionError, match="odd") as info:
            await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
        assert isinstance(info.value.__context__, ValueError)
        response = await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
        assert text_of(response) == "finally"


@LITELLM_ONLY
async def test_model_without_script_echoes() -> None:
    litellm = await llm()
    with FakeModel() as fake:
        assert fake.model == "fake/scripted"
        response = await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
        assert text_of(response) == "hello there"


# -- function models ----------------------------------------------------------------------------


@LITELLM_ONLY
async def test_function_model_sees_the_request() -> None:
    litellm = await llm()
    seen: list[FakeRequest] = []

    async def reply(request: FakeRequest) -> dict[str, Any]:
        seen.append(request)
        await anyio.lowlevel.checkpoint()
        return {"count": len(request.messages)}

    with FakeModel("fn", function=reply) as fake:
        response = await litellm.acompletion(
            model=fake.model,
            messages=USER,
            response_format=Address,
            max_tokens=50,
            temperature=0.2,
            timeout=5,
        )
    assert json.loads(text_of(response)) == {"count": 1}
    (request,) = seen
    assert fake.calls == [request]
    assert request.model == "fake/fn"
    assert request.messages == USER
    assert request.max_tokens == 50
    assert request.timeout == 5.0
    assert request.extra == {"temperature": 0.2}
    response_format = request.response_format  # a pydantic class arrives as a JSON schema
    assert isinstance(response_format, dict)
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "Address"
    assert set(response_format["json_schema"]["schema"]["properties"]) == {
        "street",
        "number",
        "verified",
    }


def test_sync_completion_path() -> None:
    litellm = anyio.run(llm)
    with FakeModel("sync", function=lambda request: f"{len(request.messages)} message") as fake:
        response = litellm.completion(model=fake.model, messages=USER, timeout=5)
        assert text_of(response) == "1 message"
        assert response.usage.completion_tokens == 2
        assert response._hidden_params["response_cost"] == pytest.approx(3e-6 + 4e-6)
    with FakeModel("sync-async", function=_async_reply) as fake:
        response = litellm.completion(model=fake.model, messages=USER, timeout=5)
        assert text_of(response) == "async reply"


async def _async_reply(request: FakeRequest) -> str:
    await anyio.lowlevel.checkpoint()
    return "async reply"


@LITELLM_ONLY
async def test_sync_completion_with_async_function_inside_a_running_loop() -> None:
    litellm = await llm()
    with FakeModel("nested", function=_async_reply) as fake:
        response = litellm.completion(model=fake.model, messages=USER, timeout=5)
    assert text_of(response) == "async reply"


# -- failures and latency -----------------------------------------------------------------------

FAILURES = {
    "rate_limit": "RateLimitError",
    "timeout": "Timeout",
    "server": "InternalServerError",
    "connection": "APIConnectionError",
    "bad_request": "BadRequestError",
}


@LITELLM_ONLY
@pytest.mark.parametrize("failure", list(FAILURES))
async def test_fail_times_then_succeed(failure: Any) -> None:
    litellm = await llm()
    error_class = getattr(litellm, FAILURES[failure])
    with FakeModel("failing", replies=["ok"], fail_times=2, failure=failure) as fake:
        for attempt in (1, 2):
            with pytest.raises(error_class, match=f"scripted {failure} failure {attempt} of 2"):
                await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
        response = await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
    assert text_of(response) == "ok"
    assert len(fake.calls) == 3  # failed requests are recorded too, litellm did not retry


def answering(answered: list[str]) -> Any:
    """A reply function for a model with latency: it runs only once the latency is over."""

    def reply(request: FakeRequest) -> str:
        answered.append("late")
        return "late"

    return reply


async def cancel_once_called(fake: FakeModel, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once ``fake`` has received its request (its latency runs then)."""
    await wait_for(lambda: len(fake.calls) == 1)
    scope.cancel()


@LITELLM_ONLY
async def test_latency_is_cancellable() -> None:
    litellm = await llm()
    answered: list[str] = []
    with FakeModel("slow", function=answering(answered), latency=30) as fake:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(cancel_once_called, fake, scope)
                await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
        assert scope.cancelled_caught
    assert answered == []  # cancelled during its 30 s latency, not after it
    assert len(fake.calls) == 1


class _Latency:
    """Stands in for ``time`` and ``anyio`` in the fake model's module: records its waits."""

    def __init__(self) -> None:
        self.waited: list[tuple[str, float]] = []

    def sync(self) -> Any:
        return SimpleNamespace(sleep=lambda seconds: self.waited.append(("sync", seconds)))

    def async_(self) -> Any:
        waited = self.waited

        class Anyio:
            def __getattr__(self, name: str) -> Any:
                return getattr(anyio, name)

            @staticmethod
            async def sleep(seconds: float) -> None:
                waited.append(("async", seconds))
                await anyio.lowlevel.checkpoint()

        return Anyio()


@LITELLM_ONLY
async def test_latency_delays_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    litellm = await llm()
    latency = _Latency()
    monkeypatch.setattr(_models, "time", latency.sync())
    monkeypatch.setattr(_models, "anyio", latency.async_())
    answered: list[str] = []

    def reply(request: FakeRequest) -> str:
        answered.append(f"after {latency.waited}")
        return "late"

    with FakeModel("lagging", function=reply, latency=0.05) as fake:
        await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
        litellm.completion(model=fake.model, messages=USER, timeout=5)
    # Each answer came after its latency was waited (cancellable on the async path).
    assert answered == ["after [('async', 0.05)]", "after [('async', 0.05), ('sync', 0.05)]"]


# -- usage and cost -----------------------------------------------------------------------------


@LITELLM_ONLY
async def test_usage_is_deterministic() -> None:
    litellm = await llm()
    messages = [
        {"role": "system", "content": "you are  a helper"},  # 4 words
        {"role": "user", "content": [{"type": "text", "text": "two words"}, {"type": "image_url"}]},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "three more words"},
    ]
    with FakeModel("usage", replies=["a reply of five words", ""]) as fake:
        response = await litellm.acompletion(model=fake.model, messages=messages, timeout=5)
        assert response.usage.prompt_tokens == (4 + 2 + 0 + 3) + 4
        assert response.usage.completion_tokens == 5
        assert response.usage.total_tokens == 18
        empty = await litellm.acompletion(model=fake.model, messages=messages, timeout=5)
        assert text_of(empty) == ""
        assert empty.usage.completion_tokens == 1  # at least one


@LITELLM_ONLY
async def test_cost_comes_from_the_registered_prices() -> None:
    litellm = await llm()
    with FakeModel("priced", replies=["one two three"], input_cost_per_token=0.01,
                   output_cost_per_token=0.1) as fake:  # fmt: skip
        response = await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
    expected = 3 * 0.01 + 3 * 0.1  # prompt: 2 words + 1 message; completion: 3 words
    assert response._hidden_params["response_cost"] == pytest.approx(expected)
    assert litellm.completion_cost(completion_response=response) == pytest.approx(expected)
    # Re-registering the name with other prices replaces them.
    with FakeModel("priced", replies=["x"], input_cost_per_token=1.0, output_cost_per_token=0.0):
        response = await litellm.acompletion(model=fake.model, messages=USER, timeout=5)
    assert response._hidden_params["response_cost"] == pytest.approx(3.0)


@LITELLM_ONLY
async def test_builtins_are_priced_with_default_rates() -> None:
    litellm = await llm()
    response = await litellm.acompletion(model="fake/echo", messages=USER, timeout=5)
    assert response._hidden_params["response_cost"] == pytest.approx(3 * 1e-6 + 2 * 2e-6)


# -- registry -----------------------------------------------------------------------------------


@LITELLM_ONLY
async def test_unknown_model_is_a_clear_error() -> None:
    litellm = await llm()
    with (
        FakeModel("known"),
        pytest.raises(litellm.NotFoundError, match=r"fake/missing.*fake/echo.*fake/known"),
    ):
        await litellm.acompletion(model="fake/missing", messages=USER, timeout=5)


@LITELLM_ONLY
async def test_with_block_registers_and_unregisters() -> None:
    litellm = await llm()
    with FakeModel("scoped", replies=["inside"]) as fake:
        response = await litellm.acompletion(model="fake/scoped", messages=USER, timeout=5)
        assert text_of(response) == "inside"
    with pytest.raises(litellm.NotFoundError):
        await litellm.acompletion(model="fake/scoped", messages=USER, timeout=5)
    assert len(fake.calls) == 1  # the call after the block never reached it


@LITELLM_ONLY
async def test_register_replaces_and_reset_clears() -> None:
    litellm = await llm()
    old = FakeModel("same", replies=["old"]).register()
    new = FakeModel("same", replies=["new"]).register()
    old.unregister()  # a replaced model's unregister leaves the new one alone
    response = await litellm.acompletion(model="fake/same", messages=USER, timeout=5)
    assert text_of(response) == "new"
    assert (len(old.calls), len(new.calls)) == (0, 1)

    FakeModel("echo", replies=["shadowed"]).register()  # may shadow a built-in
    response = await litellm.acompletion(model="fake/echo", messages=USER, timeout=5)
    assert text_of(response) == "shadowed"
    reset()
    response = await litellm.acompletion(model="fake/echo", messages=USER, timeout=5)
    assert text_of(response) == "hello there"  # the built-in is back
    with pytest.raises(litellm.NotFoundError):
        await litellm.acompletion(model="fake/same", messages=USER, timeout=5)
    assert _models._builtins["echo"].calls  # built-ins record calls too
    reset()
    assert not _models._builtins["echo"].calls


@LITELLM_ONLY
async def test_streaming_sends_the_reply_with_usage() -> None:
    litellm = await llm()
    with FakeModel("stream", replies=["streamed reply here"]) as fake:
        stream = await litellm.acompletion(
            model=fake.model,
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
            timeout=5,
        )
        chunks = [chunk async for chunk in stream]
    rebuilt = litellm.stream_chunk_builder(chunks)
    assert text_of(rebuilt) == "streamed reply here"
    assert (rebuilt.usage.prompt_tokens, rebuilt.usage.completion_tokens) == (3, 3)


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        FakeModel("")
    with pytest.raises(ValueError, match="failure must be one of"):
        FakeModel(failure="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fail_times"):
        FakeModel(fail_times=-1)
    with pytest.raises(TypeError, match="sequence"):
        FakeModel(replies="one string")
    assert FakeModel("fake/prefixed").model == "fake/prefixed"


def test_testing_re_exports_the_fake_provider() -> None:
    assert testing.FakeModel is _fakes.FakeModel
    assert testing.FakeRequest is _fakes.FakeRequest
    assert testing.FakeModelExhausted is _fakes.FakeModelExhausted
    assert testing.FAKE_PROVIDER == "fake"


# -- at the seam: the fake provider agency.llm uses (no litellm) --------------------------------


def chat(model: str, *, text: str = "hello there", **options: Any) -> ChatRequest:
    return ChatRequest(model=model, messages=[{"role": "user", "content": text}], **options)


async def test_seam_answers_and_records_like_litellm_did() -> None:
    with FakeModel("seam", replies=["one two three"], input_cost_per_token=0.01,
                   output_cost_per_token=0.1) as fake:  # fmt: skip
        response = await PROVIDER.complete(chat(fake.model, timeout=7, max_tokens=9))
    assert response.text == "one two three"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (3, 3)
    assert response.usage.total_tokens == 6
    assert response.cost == pytest.approx(3 * 0.01 + 3 * 0.1)
    (request,) = fake.calls
    assert request == FakeRequest(
        model="fake/seam", messages=USER, response_format=None, max_tokens=9, timeout=7.0
    )


async def test_seam_schema_arrives_as_a_json_schema_format_and_echo_fills_it() -> None:
    response = await PROVIDER.complete(chat("fake/echo", response_format=Person))
    person = Person.model_validate_json(response.text)
    assert person.color is Color.RED
    request = _models._builtins["echo"].calls[-1]
    assert isinstance(request.response_format, dict)
    assert request.response_format["json_schema"]["name"] == "Person"
    assert await PROVIDER.supports_schema("fake/anything")


@pytest.mark.parametrize(
    ("failure", "transient"),
    [
        ("rate_limit", True),
        ("timeout", True),
        ("server", True),
        ("connection", True),
        ("bad_request", False),
    ],
)
async def test_seam_failures_are_provider_errors_of_their_kind(
    failure: Any, transient: bool
) -> None:
    with FakeModel("failing", replies=["ok"], fail_times=1, failure=failure) as fake:
        with pytest.raises(ProviderError, match=f"scripted {failure} failure 1 of 1") as info:
            await PROVIDER.complete(chat(fake.model))
        assert (info.value.kind, info.value.transient) == (failure, transient)
        assert info.value.model == "fake/failing"
        assert (await PROVIDER.complete(chat(fake.model))).text == "ok"
    assert len(fake.calls) == 2


async def test_seam_exhausted_and_unknown_models_are_permanent() -> None:
    with FakeModel("short", replies=["only"]) as fake:
        await PROVIDER.complete(chat(fake.model))
        with pytest.raises(ProviderError, match="no reply left") as info:
            await PROVIDER.complete(chat(fake.model))
    assert not info.value.transient
    assert type(info.value.original) is FakeModelExhausted  # the plain class, not litellm's
    with pytest.raises(ProviderError, match=r"no fake model fake/missing.*fake/echo") as missing:
        await PROVIDER.complete(chat("fake/missing"))
    assert (missing.value.kind, missing.value.transient) == ("not_found", False)


async def test_seam_scripted_exceptions_are_classified() -> None:
    mine = ProviderError("slow down", kind="rate_limit")
    with FakeModel(
        "scripted-errors",
        replies=[mine, TimeoutError("late"), ConnectionResetError("reset"), ValueError("odd")],
    ) as fake:
        with pytest.raises(ProviderError) as info:
            await PROVIDER.complete(chat(fake.model))
        assert info.value is mine
        expected = [("timeout", True), ("connection", True), ("other", False)]
        for kind, transient in expected:
            with pytest.raises(ProviderError) as info:
                await PROVIDER.complete(chat(fake.model))
            assert (info.value.kind, info.value.transient) == (kind, transient)
            assert info.value.__cause__ is not None


async def test_seam_classifies_a_scripted_litellm_exception_like_litellm() -> None:
    litellm = await llm()
    limited = litellm.RateLimitError(message="429", llm_provider="fake", model="fake/x")
    with (
        FakeModel("litellm-errors", replies=[limited]) as fake,
        pytest.raises(ProviderError) as info,
    ):
        await PROVIDER.complete(chat(fake.model))
    assert (info.value.kind, info.value.transient) == ("rate_limit", True)
    assert info.value.original is limited


async def test_seam_latency_is_cancellable() -> None:
    answered: list[str] = []
    with FakeModel("slow-seam", function=answering(answered), latency=30) as fake:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(cancel_once_called, fake, scope)
                await PROVIDER.complete(chat(fake.model))
        assert scope.cancelled_caught
    assert answered == []


async def test_seam_stream_yields_words_then_usage() -> None:
    with FakeModel("streamer", replies=["streamed reply  here"]) as fake:
        events = [event async for event in PROVIDER.stream(chat(fake.model))]
    *deltas, end = events
    assert all(isinstance(d, TextDelta) for d in deltas)
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == "streamed reply  here"
    assert len(deltas) == 3
    assert isinstance(end, StreamEnd)
    assert end.text == "streamed reply  here"
    assert (end.usage.prompt_tokens, end.usage.completion_tokens) == (3, 3)
    assert end.cost == pytest.approx(3e-6 + 6e-6)


async def test_seam_embeddings_are_deterministic_bags_of_words() -> None:
    texts = ["the cat sat", "a cat sat down", "stock prices fell", ""]
    with FakeModel("embedder", input_cost_per_token=0.5) as fake:
        response = await PROVIDER.embed(EmbedRequest(model=fake.model, texts=texts))
    assert fake.embed_calls == [texts]
    assert fake.calls == []  # embeddings are not chat calls
    vectors = response.vectors
    assert vectors == [fake_embedding(t) for t in texts]
    assert all(len(v) == _fakes.EMBEDDING_DIMENSIONS for v in vectors)
    assert vectors[3] == [0.0] * _fakes.EMBEDDING_DIMENSIONS

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(vectors[0], vectors[0]) == pytest.approx(1.0)
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
    assert fake_embedding("The CAT") == fake_embedding("cat the")  # case and order do not matter
    assert response.usage.prompt_tokens == (1 + 3) + (1 + 4) + (1 + 3) + 1
    assert response.cost == pytest.approx(response.usage.prompt_tokens * 0.5)


async def test_seam_embedding_failures_count_on_their_own() -> None:
    with FakeModel("flaky-embedder", fail_times=1, failure="server") as fake:
        with pytest.raises(ProviderError) as info:
            await PROVIDER.embed(EmbedRequest(model=fake.model, texts=["x"]))
        assert info.value.transient
        assert len((await PROVIDER.embed(EmbedRequest(model=fake.model, texts=["x"]))).vectors)
        # the chat side has its own count: its first request fails too
        with pytest.raises(ProviderError):
            await PROVIDER.complete(chat(fake.model))


@LITELLM_ONLY
async def test_embeddings_through_litellm_match_the_seam() -> None:
    litellm = await llm()
    with FakeModel("lite-embedder", input_cost_per_token=0.25) as fake:
        response = await litellm.aembedding(model=fake.model, input=["a cat", "a dog"], timeout=5)
    vectors = [item["embedding"] for item in sorted(response.data, key=lambda d: d["index"])]
    assert vectors == [fake_embedding("a cat"), fake_embedding("a dog")]
    assert response.usage.prompt_tokens == 6
    assert fake.embed_calls == [["a cat", "a dog"]]
