"""``agency.Model``: per-model endpoints, keys, options and prices (issue 15).

* a Model's ``api_base``, ``api_key``, ``temperature``, ``seed``, ``top_p`` and ``options``
  reach the provider: per call, as a run's default, through a registered name and through
  ``AGENCY_MODEL``; two endpoints in one process stay apart;
* runs record the model's name only: a resumed run (here, after a pause, or in another
  process that registered the name at import) and a worker's run use the registered model;
* the api_key never shows: not in a repr, a dump, the journal, a stored record, a log line
  or an error message (even when the provider's error quotes it);
* a Model's prices win over the provider's and make cost guards trip; an unpriced model is
  billed $0 with a WARNING once per model, and once per model and cost guard;
* bad input raises a clear ``InvalidArgumentError``.
"""

from __future__ import annotations

import json
import logging
import math
import textwrap
import traceback
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr, ValidationError

import agency_runtime._llm._billing as billing_module
import agency_runtime._llm._retries as retries_module
from agency_runtime import (
    ChatRequest,
    ChatResponse,
    EmbedRequest,
    EmbedResponse,
    InvalidArgumentError,
    LLMCallError,
    Model,
    RunResult,
    RuntimeContext,
    Store,
    StreamEnd,
    TextDelta,
    Usage,
    Worker,
    agency,
    approve,
    register_provider,
    unregister_provider,
)
from agency_runtime._llm._embed import embed
from agency_runtime._llm._model import MODELS, resolve_model
from agency_runtime._llm._provider import StreamEvent
from agency_runtime.testing import FakeModel, FakeRequest, reset
from tests.forked import ForkServer
from tests.support import LITELLM, SHARES_LITELLM, asyncio_only, serving

pytestmark = pytest.mark.anyio

SECRET = "sk-test-5ecret-9f8e7d"
OTHER_SECRET = "sk-other-0ther-1a2b3c"


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No registered models, fresh once-per-process warnings, fast backoff, no fakes after."""
    MODELS.clear()
    monkeypatch.setattr(billing_module, "_unpriced", set())
    monkeypatch.setattr(billing_module, "_unpriced_in_guard", set())
    monkeypatch.setattr(retries_module, "BACKOFF_BASE", 0.001)
    yield
    MODELS.clear()
    reset()


def params_echo(request: FakeRequest) -> str:
    """A reply function: the request's provider keyword arguments, as JSON."""
    return json.dumps(request.params, sort_keys=True)


def tuned(model: str = "fake/opts", **fields: Any) -> Model:
    return Model(
        model,
        **{
            "api_base": "http://gpu-1.internal:8000/v1",
            "api_key": SECRET,
            "temperature": 0.25,
            "seed": 7,
            "top_p": 0.5,
            "options": {"presence_penalty": 0.1, "logit_bias": {"50256": -100}},
            **fields,
        },
    )


TUNED_PARAMS = {
    "temperature": 0.25,
    "seed": 7,
    "top_p": 0.5,
    "presence_penalty": 0.1,
    "logit_bias": {"50256": -100},
}


def assert_arrived(request: FakeRequest, api_base: str = "http://gpu-1.internal:8000/v1") -> None:
    assert request.params == TUNED_PARAMS
    assert request.api_base == api_base
    assert request.has_api_key
    assert request.api_key is not None
    assert request.api_key.get_secret_value() == SECRET
    assert SECRET not in repr(request)


class Unpriced:
    """A custom provider that never knows a price (cost ``None``); records its requests."""

    def __init__(self) -> None:
        self.requests: list[ChatRequest | EmbedRequest] = []

    @property
    def name(self) -> str:
        return "unpriced"

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        return ChatResponse(text="free?", usage=Usage.of(10, 5), cost=None)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(request)
        yield TextDelta("free?")
        yield StreamEnd(text="free?", usage=Usage.of(10, 5), cost=None)

    async def embed(self, request: EmbedRequest) -> EmbedResponse:
        self.requests.append(request)
        return EmbedResponse(vectors=[[1.0] for _ in request.texts], usage=Usage.of(4))

    async def supports_schema(self, model: str) -> bool:
        return True


@pytest.fixture
def unpriced() -> Iterator[Unpriced]:
    provider = Unpriced()
    register_provider("unpriced", provider)
    yield provider
    unregister_provider("unpriced")


# -- the Model value -----------------------------------------------------------------------------


def test_a_model_defaults_its_name_to_the_model_string_and_is_frozen() -> None:
    model = Model("openai/llama-3")
    assert (model.model, model.name, model.params, model.priced) == (
        "openai/llama-3",
        "openai/llama-3",
        {},
        False,
    )
    assert Model("openai/llama-3", name="llama").name == "llama"
    assert agency.Model is Model
    with pytest.raises(ValidationError):
        model.name = "other"  # type: ignore[misc]
    assert Model("fake/x", temperature=1).temperature == 1.0
    assert Model("fake/x", api_key=SecretStr(SECRET)) == Model("fake/x", api_key=SECRET)
    assert Model("fake/x", api_key=SECRET) != Model("fake/x", api_key=OTHER_SECRET)
    assert tuned().params == TUNED_PARAMS


def test_the_api_key_never_shows_in_a_repr_a_str_or_a_dump() -> None:
    model = tuned(name="gpu")
    shown = [
        repr(model),
        str(model),
        f"{model}",
        repr(model.model_dump()),
        model.model_dump_json(),
        json.dumps(model.model_dump(mode="json")),
        repr(ChatRequest(model="fake/x", messages=[], api_key=model.api_key)),
        repr(EmbedRequest(model="fake/x", texts=[], api_key=model.api_key)),
    ]
    for text in shown:
        assert SECRET not in text, text
    assert "**********" in repr(model)
    assert repr(Model("fake/echo")) == "Model(model='fake/echo')"
    assert "name='gpu'" in repr(model)
    assert "temperature=0.25" in repr(model)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": ""}, "the provider's model string"),
        ({"model": "   "}, "the provider's model string"),
        ({"model": 3}, "the provider's model string"),
        ({"model": "fake/x", "name": ""}, "name must be a non-empty string"),
        ({"model": "fake/x", "name": "a\nb"}, "name must be a non-empty string"),
        ({"model": "fake/x", "temperature": -0.1}, "temperature must be a finite number >= 0"),
        ({"model": "fake/x", "temperature": math.nan}, "temperature must be a finite number"),
        ({"model": "fake/x", "temperature": math.inf}, "temperature must be a finite number"),
        ({"model": "fake/x", "temperature": "hot"}, "temperature must be a finite number"),
        ({"model": "fake/x", "top_p": 1.5}, r"top_p must be a number in \[0.0, 1.0\]"),
        ({"model": "fake/x", "seed": 1.5}, "seed must be a whole number"),
        ({"model": "fake/x", "seed": "7"}, "seed must be a whole number"),
        ({"model": "fake/x", "seed": True}, "seed must be a whole number"),
        ({"model": "fake/x", "json_schema": "yes"}, "json_schema must be True"),
        ({"model": "fake/x", "json_schema": 1}, "json_schema must be True"),
        ({"model": "fake/x", "options": {"response_format": {}}}, "json_schema=True"),
        ({"model": "fake/x", "input_cost_per_token": -1e-6}, "input_cost_per_token must be"),
        ({"model": "fake/x", "output_cost_per_token": math.nan}, "output_cost_per_token must"),
        ({"model": "fake/x", "output_cost_per_token": math.inf}, "output_cost_per_token must"),
        ({"model": "fake/x", "api_base": "localhost:8000"}, "api_base must be an http"),
        ({"model": "fake/x", "api_base": "ftp://host/v1"}, "api_base must be an http"),
        ({"model": "fake/x", "api_base": "http://"}, "api_base must be an http"),
        ({"model": "fake/x", "api_base": "http://a b/v1"}, "api_base must be an http"),
        ({"model": "fake/x", "api_base": "http://u:p@host/v1"}, "must not hold credentials"),
        ({"model": "fake/x", "api_key": ""}, "api_key must be a non-empty string"),
        ({"model": "fake/x", "api_key": 42}, "api_key must be a str or a SecretStr"),
        ({"model": "fake/x", "options": ["temperature"]}, "options must be a dict"),
        ({"model": "fake/x", "options": {"temperature": 1}}, "Model field temperature="),
        ({"model": "fake/x", "options": {"api_key": "k"}}, "Model field api_key="),
        ({"model": "fake/x", "options": {"model": "m"}}, "Model field model="),
        ({"model": "fake/x", "options": {"messages": []}}, "may not set 'messages'"),
        ({"model": "fake/x", "options": {"tools": []}}, "may not set 'tools'"),
        ({"model": "fake/x", "options": {"stream": True}}, "may not set 'stream'"),
        ({"model": "fake/x", "options": {"timeout": 5}}, "pass timeout="),
        ({"model": "fake/x", "options": {"num_retries": 5}}, "retries transient errors"),
        ({"model": "fake/x", "options": {"not a name": 1}}, "keyword-argument names"),
        ({"model": "fake/x", "options": {"stop": {"a", "b"}}}, "options must be JSON data"),
        ({"model": "fake/x", "options": {"x": object()}}, "options must be JSON data"),
    ],
)
def test_bad_fields_raise_a_clear_invalid_argument_error(
    fields: dict[str, Any], message: str
) -> None:
    model = fields.pop("model")
    with pytest.raises(InvalidArgumentError, match=message):
        Model(model, **fields)


def test_validating_data_checks_the_same_and_never_quotes_the_key() -> None:
    assert Model.model_validate({"model": "fake/x", "seed": 3}) == Model("fake/x", seed=3)
    with pytest.raises(ValidationError, match="seed must be a whole number") as caught:
        Model.model_validate({"model": "fake/x", "api_key": SECRET, "seed": "x"})
    assert SECRET not in str(caught.value)
    with pytest.raises(InvalidArgumentError) as bad:
        Model("fake/x", api_key=SECRET, temperature=-1)
    assert SECRET not in str(bad.value)


def test_options_are_copied_so_the_caller_cannot_change_a_model() -> None:
    options: dict[str, Any] = {"stop": ["\n"]}
    model = Model("fake/x", options=options)
    options["stop"].append("END")
    assert model.options == {"stop": ["\n"]}
    params = model.params
    params["stop"].append("X")
    assert model.options == {"stop": ["\n"]}


def test_a_plain_model_string_resolves_to_one_model_and_a_registered_name_wins() -> None:
    plain = resolve_model("fake/plain")
    assert plain == Model("fake/plain")
    assert resolve_model("fake/plain") is plain  # built (and checked) once per string
    assert Model("fake/plain").params == {}
    named = Model("fake/echo", name="fake/plain", temperature=0.5)
    agency.register_model(named)
    assert resolve_model("fake/plain") is named
    agency.unregister_model("fake/plain")
    assert resolve_model("fake/plain") is plain


async def test_a_model_or_a_string_is_accepted_and_anything_else_refused(store: Store) -> None:
    async def entry() -> str:
        return "x"

    with pytest.raises(InvalidArgumentError, match=r"agency\.Model"):
        await agency.run(entry, model=42, store=store)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"agency\.Model"):
        await agency.enqueue(entry, model="  ", store=store)
    with agency.test_context(), pytest.raises(InvalidArgumentError, match=r"agency\.Model"):
        await agency.llm("hi", model=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"register_model needs an agency\.Model"):
        agency.register_model("fake/echo")  # type: ignore[arg-type]


# -- options reach the provider ----------------------------------------------------------------


async def test_options_reach_the_fake_provider_per_call_streamed_or_not() -> None:
    with FakeModel("opts", function=params_echo) as fake, agency.test_context():
        answer = await agency.llm("hi", model=tuned())
        assert json.loads(answer) == TUNED_PARAMS
        deltas: list[str] = []
        await agency.llm("hi", model=tuned(), on_token=deltas.append)
        plain = await agency.llm("hi", model="fake/opts")  # a plain string: nothing extra
    assert json.loads("".join(deltas)) == TUNED_PARAMS
    assert json.loads(plain) == {}
    assert_arrived(fake.calls[0])
    assert_arrived(fake.calls[1])
    assert (fake.calls[2].params, fake.calls[2].api_base, fake.calls[2].has_api_key) == (
        {},
        None,
        False,
    )
    assert MODELS.names() == []  # a per-call Model is used, not registered


class Pet(BaseModel):
    name: str


async def test_a_model_that_says_json_schema_false_gets_the_schema_in_the_prompt() -> None:
    pets = FakeModel("pets", replies=[{"name": "Rex"}, {"name": "Rex"}])
    with pets as fake, agency.test_context():  # the fake provider supports a response format
        await agency.llm("a pet", model=Model("fake/pets", json_schema=False), schema=Pet)
        await agency.llm("a pet", model=Model("fake/pets"), schema=Pet)
    prompted, constrained = fake.calls
    assert prompted.response_format is None
    assert "JSON schema" in prompted.messages[-1]["content"]
    assert constrained.response_format["json_schema"]["name"] == "Pet"
    assert Model("fake/pets", json_schema=True) != Model("fake/pets")
    assert "json_schema=True" in repr(Model("fake/pets", json_schema=True))


async def test_a_per_call_model_wins_over_the_run_default() -> None:
    with FakeModel("opts", function=params_echo) as fake:
        ctx = RuntimeContext(model=Model("fake/opts", temperature=0.9))
        with agency.test_context(ctx):
            assert agency.ctx().model_name == "fake/opts"
            await agency.llm("default")
            await agency.llm("chosen", model=tuned())
    assert fake.calls[0].params == {"temperature": 0.9}
    assert_arrived(fake.calls[1])


async def test_a_run_default_model_reaches_every_call_and_the_run_records_its_name(
    store: Store,
) -> None:
    model = tuned(name="gpu-opts")
    seen: list[object] = []

    async def entry() -> list[str]:
        seen.append(agency.ctx().model)
        return [await agency.llm("one"), await agency.llm("two")]

    with FakeModel("opts", function=params_echo) as fake:
        result = await agency.run(entry, run_id="default", model=model, store=store)
    assert result.status == "completed", result.error
    assert [json.loads(v) for v in result.value] == [TUNED_PARAMS, TUNED_PARAMS]
    assert_arrived(fake.calls[0])
    assert_arrived(fake.calls[1])
    assert seen == [model]
    assert (await agency.runs.get("default", store=store)).model == "gpu-opts"
    assert MODELS.get("gpu-opts") == model  # a Model given to a run registers itself


async def test_a_registered_name_resolves_in_llm_and_run(store: Store) -> None:
    assert agency.register_model(tuned(name="gpu")) is None

    async def entry() -> str:
        return str(await agency.llm("hi"))

    with FakeModel("opts", function=params_echo) as fake:
        result = await agency.run(entry, model="gpu", store=store)
        with agency.test_context():
            await agency.llm("hi", model="gpu")
    assert json.loads(result.value) == TUNED_PARAMS
    assert (await agency.runs.get(result.run_id, store=store)).model == "gpu"
    assert len(fake.calls) == 2
    for request in fake.calls:
        assert_arrived(request)


async def test_agency_model_may_name_a_registered_model(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    agency.register_model(tuned(name="from-env"))
    monkeypatch.setenv("AGENCY_MODEL", "from-env")

    async def entry() -> str:
        assert agency.ctx().model_name == "from-env"
        return str(await agency.llm("hi"))

    with FakeModel("opts", function=params_echo) as fake:
        result = await agency.run(entry, store=store)
        with agency.test_context():
            await agency.llm("no run model")
    assert result.status == "completed", result.error
    assert (await agency.runs.get(result.run_id, store=store)).model == "from-env"
    assert len(fake.calls) == 2
    for request in fake.calls:
        assert_arrived(request)


async def test_two_api_bases_in_one_process_reach_the_provider_apart(store: Store) -> None:
    one = tuned(name="gpu-1")
    two = tuned(name="gpu-2", api_base="https://gpu-2.internal/v1", api_key=OTHER_SECRET)
    agency.register_model(two)  # the first run asks for it by name

    async def entry(other: str) -> list[str]:
        return [await agency.llm("default"), await agency.llm("other", model=other)]

    with FakeModel("opts", function=params_echo) as fake:
        first = await agency.run(entry, "gpu-2", model=one, store=store)
        second = await agency.run(entry, "gpu-1", model=two, store=store)
        with agency.test_context():  # per call, both with the default name "fake/opts"
            await agency.llm("a", model=tuned())
            await agency.llm("b", model=tuned(api_base="http://b.internal/v1"))
    assert (first.status, second.status) == ("completed", "completed")
    bases = [(r.api_base, r.api_key.get_secret_value() if r.api_key else None) for r in fake.calls]
    assert bases == [
        ("http://gpu-1.internal:8000/v1", SECRET),
        ("https://gpu-2.internal/v1", OTHER_SECRET),
        ("https://gpu-2.internal/v1", OTHER_SECRET),
        ("http://gpu-1.internal:8000/v1", SECRET),
        ("http://gpu-1.internal:8000/v1", SECRET),
        ("http://b.internal/v1", SECRET),
    ]


async def test_a_different_model_under_a_taken_name_is_refused_by_run_and_enqueue(
    store: Store,
) -> None:
    async def entry() -> str:
        return "x"

    await agency.run(entry, model=tuned(name="shared"), store=store)
    await agency.run(entry, model=tuned(name="shared"), store=store)  # an equal one: fine
    other = tuned(name="shared", temperature=0.9, api_key=OTHER_SECRET)
    for start in (agency.run, agency.enqueue):
        with pytest.raises(InvalidArgumentError, match="name 'shared'") as refused:
            await start(entry, model=other, store=store)
        assert "differs in api_key, temperature" in str(refused.value)
        assert SECRET not in str(refused.value)
        assert OTHER_SECRET not in str(refused.value)
    assert agency.register_model(other) == tuned(name="shared")  # explicit: replaces
    assert MODELS.get("shared") is other
    assert agency.unregister_model("shared") is other
    assert agency.unregister_model("shared") is None


async def test_embeddings_take_a_model_and_send_its_endpoint_and_options(
    unpriced: Unpriced,
) -> None:
    model = Model(
        "unpriced/embedder",
        api_base="http://embed.internal/v1",
        api_key=SECRET,
        temperature=0.5,  # not an embedding parameter: not sent
        options={"dimensions": 256},
        input_cost_per_token=0.001,
    )
    agency.register_model(Model("unpriced/embedder", name="embedder", options={"user": "u"}))
    with agency.test_context():
        assert await embed(model, ["a", "b"]) == [[1.0], [1.0]]
        assert agency.ctx().cost == pytest.approx(0.004)  # 4 prompt tokens at its price
        await embed("embedder", ["c"])
    first, second = unpriced.requests
    assert isinstance(first, EmbedRequest)
    assert isinstance(second, EmbedRequest)
    assert (first.model, first.api_base, dict(first.params)) == (
        "unpriced/embedder",
        "http://embed.internal/v1",
        {"dimensions": 256},
    )
    assert first.api_key is not None
    assert first.api_key.get_secret_value() == SECRET
    assert (second.api_base, second.api_key, dict(second.params)) == (None, None, {"user": "u"})


# -- persistence: pause and resume, workers, another process -------------------------------------


async def paused_then_asked(store: Store, run_id: str) -> RunResult:
    async def entry() -> list[str]:
        first = await agency.llm("one")
        await agency.interrupt("confirm", "go on?")
        return [first, await agency.llm("two")]

    paused = await agency.run(entry, run_id=run_id, model=tuned(name="gpu"), store=store)
    assert paused.status == "paused", paused.error
    return paused


async def test_a_paused_run_resumes_with_its_registered_model(store: Store) -> None:
    with FakeModel("opts", function=params_echo) as fake:
        paused = await paused_then_asked(store, "resume-me")
        done = await agency.respond_to_interrupts(paused, [approve()], store=store)
    assert done.status == "completed", done.error
    assert [json.loads(v) for v in done.value] == [TUNED_PARAMS, TUNED_PARAMS]
    assert len(fake.calls) == 2
    for request in fake.calls:
        assert_arrived(request)


async def test_a_resume_after_registering_the_name_anew_uses_that_model(store: Store) -> None:
    """What another process does: it registers the name at import, then resumes."""
    with FakeModel("opts", function=params_echo) as fake:
        paused = await paused_then_asked(store, "re-registered")
        MODELS.clear()
        agency.register_model(Model("fake/opts", name="gpu", temperature=1.5))
        done = await agency.respond_to_interrupts(paused, [approve()], store=store)
    assert done.status == "completed", done.error
    assert [json.loads(v) for v in done.value] == [TUNED_PARAMS, {"temperature": 1.5}]
    assert len(fake.calls) == 2  # the first answer was replayed from the journal


async def test_a_resume_without_the_name_registered_uses_it_as_a_plain_model_string(
    store: Store,
) -> None:
    async def entry() -> list[str]:
        first = await agency.llm("one")
        await agency.interrupt("confirm", "go on?")
        return [first, await agency.llm("two")]

    with FakeModel("opts", function=params_echo) as fake:
        model = Model("fake/opts", temperature=0.3)  # named "fake/opts"
        paused = await agency.run(entry, run_id="plain", model=model, store=store)
        MODELS.clear()
        done = await agency.respond_to_interrupts(paused, [approve()], store=store)
    assert done.status == "completed", done.error
    assert [json.loads(v) for v in done.value] == [{"temperature": 0.3}, {}]
    assert len(fake.calls) == 2


@agency.entry(name="test-models-queued")
async def queued_entry() -> str:
    return str(await agency.llm("from the queue"))


async def test_an_enqueued_run_is_worked_with_its_model(store: Store) -> None:
    with FakeModel("opts", function=params_echo) as fake:
        run_id = await agency.enqueue(queued_entry, model=tuned(name="queued"), store=store)
        assert (await agency.runs.get(run_id, store=store)).model == "queued"
        async with serving(Worker(store, poll=0.05)):
            result = await agency.runs.wait(run_id, store=store, timeout=20)
    assert result.status == "completed", result.error
    assert json.loads(result.value) == TUNED_PARAMS
    assert len(fake.calls) == 1
    assert_arrived(fake.calls[0])


@agency.entry(name="test-models-across")
async def across_entry() -> list[str]:
    first = await agency.llm("one")
    await agency.interrupt("confirm", "go on?")
    return [first, await agency.llm("two")]


def test_another_process_resumes_with_the_model_it_registered_at_import(
    tmp_path: Path, fork_server: ForkServer, store_url: tuple[str, Store]
) -> None:
    url, store = store_url
    app = tmp_path / "models_app.py"
    app.write_text(
        textwrap.dedent(
            """
            import json
            from agency_runtime import Model, agency
            from agency_runtime.testing import FakeModel

            FAKE = FakeModel("opts", function=lambda r: json.dumps(r.params)).register()
            agency.register_model(Model("fake/opts", name="gpu", seed=99, api_key="sk-child"))

            @agency.entry(name="test-models-across")
            async def across_entry():
                first = await agency.llm("one")
                await agency.interrupt("confirm", "go on?")
                return [first, await agency.llm("two")]
            """
        )
    )
    with FakeModel("opts", function=params_echo):
        paused = agency.run_sync(
            across_entry, run_id="across", model=tuned(name="gpu"), store=store
        )
    assert paused.status == "paused", paused.error
    script = (
        f"import sys, json, anyio; sys.path.insert(0, {str(tmp_path)!r}); import models_app; "
        "from agency_runtime import agency, approve; "
        "r = anyio.run(lambda: agency.respond_to_interrupts("
        f"'across', [approve()], store={url!r})); "
        "calls = models_app.FAKE.calls; "
        "print(json.dumps([r.status, r.value, [c.params for c in calls], "
        "[c.api_key.get_secret_value() for c in calls]]))"
    )
    done = fork_server.run("code", script, check=True, timeout=60)
    status, value, params, keys = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == "completed"
    assert [json.loads(v) for v in value] == [TUNED_PARAMS, {"seed": 99}]
    assert (params, keys) == ([{"seed": 99}], ["sk-child"])  # only the second call ran there


# -- secrets never stored, logged or shown --------------------------------------------------------


def leaks(text: str) -> bool:
    return SECRET in text


async def test_the_key_is_never_stored_logged_or_shown_even_when_the_provider_quotes_it(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(request: FakeRequest) -> str:
        assert request.api_key is not None
        raise PermissionError(f"401: invalid key {request.api_key.get_secret_value()!r}")

    async def entry() -> str:
        answer = str(await agency.llm("hi"))
        try:
            await agency.llm("again", model=tuned("fake/refuses", name="refuser"))
        except LLMCallError as exc:
            return f"{answer} / {exc}"
        raise AssertionError("the call should have failed")

    async def failing() -> str:
        return str(await agency.llm("hi", model=tuned("fake/refuses")))

    caplog.set_level(logging.DEBUG)
    with FakeModel("opts", function=params_echo), FakeModel("refuses", function=refuse):
        result = await agency.run(entry, run_id="secret", model=tuned(name="gpu"), store=store)
        failed = await agency.run(failing, run_id="secret-failed", store=store)
    assert result.status == "completed", result.error
    assert "invalid key '**********'" in result.value
    assert failed.status == "failed"
    assert failed.error is not None
    assert "invalid key '**********'" in failed.error.message
    for run_id in ("secret", "secret-failed"):
        record = await agency.runs.get(run_id, store=store)
        journal = await store.load_journal(run_id)
        for text in (record.model_dump_json(), repr(record), journal.model_dump_json()):
            assert not leaks(text), text
    assert not leaks(repr(result))
    assert not leaks(repr(failed))
    assert not leaks(caplog.text)


async def test_a_provider_error_that_quotes_the_key_is_chained_without_it() -> None:
    def refuse(request: FakeRequest) -> str:
        raise PermissionError(f"denied for {SECRET}")

    with (
        FakeModel("refuses", function=refuse),
        agency.test_context(),
        pytest.raises(LLMCallError) as caught,
    ):
        await agency.llm("hi", model=tuned("fake/refuses"))
    error = caught.value
    assert not leaks(str(error))
    assert error.__cause__ is not None
    assert not leaks(str(error.__cause__))
    assert "denied for **********" in str(error.__cause__)
    assert not leaks("".join(traceback.format_exception(error)))


# -- prices ---------------------------------------------------------------------------------------


def priced(model: str = "fake/priced", **fields: Any) -> Model:
    return Model(model, input_cost_per_token=0.01, output_cost_per_token=0.02, **fields)


async def test_a_models_prices_win_over_the_providers(store: Store) -> None:
    async def entry() -> str:
        return str(await agency.llm("hi"))  # 2 prompt tokens, 1 completion token

    with FakeModel("priced", replies=["ok"]) as fake:  # its own price: 4e-6 a call
        result = await agency.run(entry, model=priced(), store=store)
    assert result.status == "completed", result.error
    assert result.cost == pytest.approx(2 * 0.01 + 1 * 0.02)
    assert result.cost == 0.04  # exact: billed in integer pico-dollars
    assert result.tokens == 3
    assert len(fake.calls) == 1


async def test_only_an_input_price_bills_the_prompt_tokens(unpriced: Unpriced) -> None:
    with agency.test_context():
        await agency.llm("hi", model=Model("unpriced/m", input_cost_per_token=0.001))
        assert agency.ctx().cost == pytest.approx(10 * 0.001)


async def test_a_models_price_makes_a_cost_guard_trip_on_an_unpriced_provider(
    store: Store, unpriced: Unpriced, caplog: pytest.LogCaptureFixture
) -> None:
    async def entry(model: str) -> str:
        async with agency.cost_guard(0.05, label="budget"):
            return str(await agency.llm("hi", model=model))

    agency.register_model(priced("unpriced/m", name="priced-m"))
    with caplog.at_level(logging.WARNING, logger="agency_runtime.llm"):
        free = await agency.run(entry, "unpriced/m", store=store)
        paused = await agency.run(entry, "priced-m", store=store)
    assert free.status == "completed"  # billed $0: the guard cannot stop it
    assert free.cost == 0
    assert paused.status == "paused"  # 10 * 0.01 + 5 * 0.02 = 0.2 > 0.05
    assert paused.cost == pytest.approx(0.2)
    assert [i.effect for i in paused.interrupts] == ["std::guard"]
    assert paused.interrupts[0].data["label"] == "budget"
    assert "'priced-m'" not in caplog.text  # a priced model is never warned about


async def test_an_unpriced_model_is_warned_about_once_and_once_per_cost_guard(
    unpriced: Unpriced, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agency_runtime.llm"), agency.test_context():
        await agency.llm("one", model="unpriced/m")
        await agency.llm("two", model="unpriced/m")
        async with agency.cost_guard(1.0, label="budget") as guard:
            await agency.llm("three", model="unpriced/m")
            await agency.llm("four", model="unpriced/m")
        async with agency.cost_guard(1.0):
            await agency.llm("five", model="unpriced/m")
        assert agency.ctx().cost == 0
        assert guard.spent == 0
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 3, messages
    first, in_budget, in_other = messages
    assert "no price is known for model 'unpriced/m'" in first
    assert "billed $0" in first
    assert "cost guards cannot stop them" in first
    assert (
        "agency.Model('unpriced/m', input_cost_per_token=..., output_cost_per_token=...)" in first
    )
    assert "inside the cost guard 'budget' (cost-guard:" in in_budget
    assert "billed $0" in in_budget
    assert "the guard cannot stop it" in in_budget
    assert "agency.Model('unpriced/m', input_cost_per_token=" in in_budget
    assert "inside the cost guard cost-guard:" in in_other


async def test_an_unpriced_call_inside_a_guard_warns_on_its_first_call_too(
    unpriced: Unpriced, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agency_runtime.llm"), agency.test_context():
        async with agency.cost_guard(1.0, label="budget"):
            await agency.llm("one", model="unpriced/m", on_token=lambda delta: None)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [m.split(":")[0] for m in messages] == [
        "no price is known for model 'unpriced/m'",
        "a call of the unpriced model 'unpriced/m' inside the cost guard 'budget' (cost-guard",
    ]


async def test_the_warning_about_a_named_unpriced_model_says_how_to_price_it(
    unpriced: Unpriced, caplog: pytest.LogCaptureFixture
) -> None:
    agency.register_model(Model("unpriced/m", name="cheap", api_key=SECRET))
    with caplog.at_level(logging.WARNING, logger="agency_runtime.llm"), agency.test_context():
        await agency.llm("one", model="cheap")
        await embed("cheap", ["a text"])  # the same model: warned about once
    (message,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "no price is known for model 'cheap'" in message
    assert "agency.Model('unpriced/m', name='cheap', input_cost_per_token=..." in message
    assert not leaks(caplog.text)


# -- through litellm -------------------------------------------------------------------------------


@SHARES_LITELLM
@asyncio_only(LITELLM)  # via_litellm=True: litellm.acompletion answers the fake
async def test_options_reach_litellm_acompletion_and_aembedding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agency_runtime._llm._litellm import load_litellm

    litellm = await load_litellm()
    completions: list[dict[str, Any]] = []
    embeddings: list[dict[str, Any]] = []
    acompletion, aembedding = litellm.acompletion, litellm.aembedding

    async def spy_completion(**kwargs: Any) -> Any:
        completions.append(kwargs)
        return await acompletion(**kwargs)

    async def spy_embedding(**kwargs: Any) -> Any:
        embeddings.append(kwargs)
        return await aembedding(**kwargs)

    monkeypatch.setattr(litellm, "acompletion", spy_completion)
    monkeypatch.setattr(litellm, "aembedding", spy_embedding)
    model = tuned("fake/lit", input_cost_per_token=0.5, output_cost_per_token=0.5)
    with (
        FakeModel("lit", replies=["ok", "streamed"], via_litellm=True) as fake,
        agency.test_context(),
    ):
        assert await agency.llm("hi", model=model) == "ok"
        # 2 prompt tokens ("hi"), 1 completion token, at 0.5 $ a token (the fake's: 1e-6)
        assert agency.ctx().cost == 2 * 0.5 + 1 * 0.5
        assert await agency.llm("hi", model=model, on_token=lambda d: None) == "streamed"
        await embed(Model("fake/lit", api_base="http://e.internal/v1", api_key=SECRET), ["x"])
    for kwargs in completions:
        assert kwargs["api_base"] == "http://gpu-1.internal:8000/v1"
        assert kwargs["api_key"] == SECRET
        assert {k: kwargs[k] for k in TUNED_PARAMS} == TUNED_PARAMS
        assert (kwargs["num_retries"], kwargs["model"]) == (0, "fake/lit")
    assert completions[1]["stream"] is True
    for request in fake.calls:  # what litellm handed the fake custom provider
        assert {k: request.extra[k] for k in ("temperature", "seed", "top_p")} == {
            "temperature": 0.25,
            "seed": 7,
            "top_p": 0.5,
        }
    assert (embeddings[0]["api_base"], embeddings[0]["api_key"]) == (
        "http://e.internal/v1",
        SECRET,
    )
