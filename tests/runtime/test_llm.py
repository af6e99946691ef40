"""``agency.llm`` against the offline fake model.

Covers DESIGN.md §3 (``agency.llm``), §4 "LLM, cost and guards", §7 (default model), §8
"LLM", and the spec's §4 (agency.llm → runPrompt) with its "agencyLlm" and "queue" cases.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

import agency_runtime._llm._chat as llm_module
import agency_runtime._llm._parsing as parsing_module
import agency_runtime._llm._provider as provider_module
import agency_runtime._llm._retries as retries_module
from agency_runtime import (
    AgencyError,
    GuardExceededError,
    LLMCallError,
    OutsideFrameError,
    RuntimeContext,
    Store,
    StructuredOutputError,
    agency,
    approve,
)
from agency_runtime._llm._litellm import litellm_module, load_litellm
from agency_runtime._llm._provider import ProviderError
from agency_runtime.testing import FakeClock, FakeModel, FakeModelExhausted, FakeRequest
from tests.support import LITELLM, SHARES_LITELLM, wait_for

pytestmark = [pytest.mark.anyio, SHARES_LITELLM]  # litellm is imported here

FEEDBACK_MARK = "did not match the required output format"


class Person(BaseModel):
    name: str
    age: int


ADA = '{"name": "Ada", "age": 36}'

# Tests marked PATHS run a fake model on both paths: at the seam (the fake provider, no
# litellm) on asyncio and trio, and through litellm (``via_litellm=True``: litellm's real code
# and exceptions) on asyncio only, since litellm's async code is asyncio code.
PATHS = pytest.mark.parametrize(
    ("via_litellm", "anyio_backend"),
    [
        pytest.param(False, "asyncio", id="seam-asyncio"),
        pytest.param(False, "trio", id="seam-trio"),
        pytest.param(
            True, "asyncio", id="litellm-asyncio", marks=pytest.mark.asyncio_only(reason=LITELLM)
        ),
    ],
)


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retries_module, "BACKOFF_BASE", 0.001)


def words(content: Any) -> int:
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(len(p["text"].split()) for p in content if isinstance(p, dict) and "text" in p)
    return 0


def tokens_of(request: FakeRequest, reply: str) -> tuple[int, int]:
    """The fake model's deterministic (prompt, completion) token counts for one request."""
    prompt = sum(1 + words(m.get("content")) for m in request.messages)
    return prompt, max(1, len(reply.split()))


def cost_of(fake: FakeModel, request: FakeRequest, reply: str) -> float:
    prompt, completion = tokens_of(request, reply)
    return prompt * fake.input_cost_per_token + completion * fake.output_cost_per_token


def contents(request: FakeRequest) -> list[Any]:
    return [m.get("content") for m in request.messages]


def roles_and_contents() -> list[tuple[str, Any]]:
    return [(m.role, m.content) for m in agency.thread.current().get_messages()]


# -- the spec's agencyLlm cases --------------------------------------------------------------------


async def test_thread_is_user_then_assistant_after_one_call() -> None:
    with FakeModel("one", replies=["hello back"]) as fake, agency.test_context():
        answer = await agency.llm("hello", model=fake.model)
        assert answer == "hello back"
        assert roles_and_contents() == [("user", "hello"), ("assistant", "hello back")]
    assert len(fake.calls) == 1
    assert contents(fake.calls[0]) == ["hello"]


async def test_echo_model_answers_with_the_prompt() -> None:
    with agency.test_context():
        assert await agency.llm("say this back", model="fake/echo") == "say this back"


async def test_cost_and_tokens_are_added_to_the_run(store: Store) -> None:
    with FakeModel(
        "priced", replies=["one two three"], input_cost_per_token=0.001, output_cost_per_token=0.002
    ) as fake:

        async def entry() -> dict[str, Any]:
            answer = await agency.llm("hello world", model=fake.model)
            return {"answer": answer, "cost": agency.ctx().cost, "tokens": agency.ctx().tokens}

        result = await agency.run(entry, store=store)
    assert result.status == "completed", result.error
    # prompt: 2 words + 1 per message = 3 tokens; completion: 3 words.
    assert tokens_of(fake.calls[0], "one two three") == (3, 3)
    expected = 3 * 0.001 + 3 * 0.002
    assert result.cost == pytest.approx(expected, abs=1e-12)
    assert result.tokens == 6
    assert result.value == {"answer": "one two three", "cost": result.cost, "tokens": 6}


async def test_cost_accumulates_over_calls_in_a_test_frame() -> None:
    with FakeModel("sum", replies=["a b", "c"]) as fake, agency.test_context():
        await agency.llm("first prompt", model=fake.model)
        await agency.llm("second", model=fake.model)
        expected = cost_of(fake, fake.calls[0], "a b") + cost_of(fake, fake.calls[1], "c")
        tokens = sum(tokens_of(fake.calls[0], "a b")) + sum(tokens_of(fake.calls[1], "c"))
        assert agency.ctx().cost == pytest.approx(expected, abs=1e-12)
        assert agency.ctx().tokens == tokens


async def test_a_schema_returns_the_parsed_object() -> None:
    with FakeModel("schema", replies=[ADA]) as fake, agency.test_context():
        person = await agency.llm("who?", model=fake.model, schema=Person)
        assert person == Person(name="Ada", age=36)
        assert isinstance(person, Person)
        # The raw answer is what lands on the thread.
        assert roles_and_contents()[-1] == ("assistant", ADA)
    assert fake.calls[0].response_format is not None  # a JSON-schema response format was sent


async def test_a_schema_with_the_echo_model_generates_valid_output() -> None:
    with agency.test_context():
        person = await agency.llm("anyone", model="fake/echo", schema=Person)
    assert isinstance(person, Person)


@pytest.mark.parametrize("reply", ["[1, 2, 3]", '{"value": [1, 2, 3]}'])
async def test_a_type_adapter_schema_works(reply: str) -> None:
    with FakeModel("ints", replies=[reply]) as fake, agency.test_context():
        assert await agency.llm("numbers", model=fake.model, schema=list[int]) == [1, 2, 3]


@pytest.mark.parametrize(
    "reply",
    [
        f"```json\n{ADA}\n```",
        f"```\n{ADA}\n```",
        f"Sure! Here is the person: {ADA} Hope that helps.",
        f'{{"data": {ADA}}}',
        f'{{"result": {ADA}}}',
        f'{{"person": {ADA}}}',
        f'```json\n{{"data": {ADA}}}\n```',
    ],
    ids=["fence", "bare-fence", "prose", "data-envelope", "result-envelope", "single-key", "both"],
)
async def test_tolerant_parsing(reply: str) -> None:
    with FakeModel("tolerant", replies=[reply]) as fake, agency.test_context():
        assert await agency.llm("who?", model=fake.model, schema=Person) == Person(
            name="Ada", age=36
        )
    assert len(fake.calls) == 1  # parsed on the first attempt, no retry


async def test_invalid_output_is_fed_back_and_retried() -> None:
    with FakeModel("retry", replies=["not json at all", ADA]) as fake, agency.test_context():
        person = await agency.llm("who?", model=fake.model, schema=Person)
        assert person == Person(name="Ada", age=36)
        thread = roles_and_contents()
    assert len(fake.calls) == 2
    assert not any(FEEDBACK_MARK in str(c) for c in contents(fake.calls[0]))
    second = contents(fake.calls[1])
    assert second[:2] == ["who?", "not json at all"]
    assert FEEDBACK_MARK in second[2]
    assert [role for role, _ in thread] == ["user", "assistant", "user", "assistant"]
    assert FEEDBACK_MARK in thread[2][1]
    assert thread[3] == ("assistant", ADA)


async def test_a_schema_mismatch_is_fed_back_with_the_field_errors() -> None:
    with (
        FakeModel("fields", replies=['{"name": "Ada"}', ADA]) as fake,
        agency.test_context(),
    ):
        assert await agency.llm("who?", model=fake.model, schema=Person) == Person(
            name="Ada", age=36
        )
    assert "age" in contents(fake.calls[1])[2]


async def test_retries_exhausted_raise_structured_output_error() -> None:
    with (
        FakeModel("bad", replies=["nope", '{"name": 1}']) as fake,
        agency.test_context(),
        pytest.raises(StructuredOutputError) as info,
    ):
        await agency.llm("who?", model=fake.model, schema=Person)
    assert len(fake.calls) == 2  # the default is one validation retry
    assert info.value.raw == '{"name": 1}'
    assert isinstance(info.value.errors, list)
    assert info.value.errors
    assert all(isinstance(e, str) for e in info.value.errors)


async def test_retries_zero_means_one_attempt() -> None:
    with (
        FakeModel("once", replies=["nope"]) as fake,
        agency.test_context(),
        pytest.raises(StructuredOutputError) as info,
    ):
        await agency.llm("who?", model=fake.model, schema=Person, retries=0)
    assert len(fake.calls) == 1
    assert info.value.raw == "nope"


async def test_retries_two_allows_three_attempts() -> None:
    with FakeModel("thrice", replies=["a", "b", ADA]) as fake, agency.test_context():
        assert await agency.llm("who?", model=fake.model, schema=Person, retries=2) == Person(
            name="Ada", age=36
        )
    assert len(fake.calls) == 3


async def test_thread_option_is_isolated_from_the_active_thread() -> None:
    with FakeModel("iso", replies=["private answer", "by object"]) as fake, agency.test_context():
        agency.thread.user("on the active thread")
        other = agency.thread.store().create()
        assert await agency.llm("private", model=fake.model, thread=other) == "private answer"
        assert roles_and_contents() == [("user", "on the active thread")]
        isolated = agency.thread.store().get(other)
        assert [(m.role, m.content) for m in isolated.get_messages()] == [
            ("user", "private"),
            ("assistant", "private answer"),
        ]
        # A MessageThread object works too.
        await agency.llm("again", model=fake.model, thread=isolated)
        assert len(isolated.get_messages()) == 4
        assert roles_and_contents() == [("user", "on the active thread")]
    # The isolated thread's history was sent, not the active one's.
    assert contents(fake.calls[0]) == ["private"]


async def test_thread_option_still_charges_the_run() -> None:
    with FakeModel("iso-cost", replies=["x"]) as fake, agency.test_context():
        other = agency.thread.store().create()
        await agency.llm("private", model=fake.model, thread=other)
        assert agency.ctx().cost == pytest.approx(cost_of(fake, fake.calls[0], "x"), abs=1e-12)


async def test_model_override_lasts_one_call(store: Store) -> None:
    with (
        FakeModel("default", replies=["from default"]) as default,
        FakeModel("override", replies=["from override"]) as override,
    ):

        async def entry() -> list[str]:
            return [
                await agency.llm("first", model=override.model),
                await agency.llm("second"),
            ]

        result = await agency.run(entry, store=store, model=default.model)
    assert result.status == "completed", result.error
    assert result.value == ["from override", "from default"]
    assert len(override.calls) == 1
    assert len(default.calls) == 1
    assert contents(default.calls[0])[-1] == "second"


async def _model_answer(store: Store, *, run_model: str | None, call_model: str | None) -> Any:
    async def entry() -> str:
        return await agency.llm("which model?", model=call_model)

    return await agency.run(entry, store=store, model=run_model)


async def test_model_precedence_per_call_beats_run_and_env(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        FakeModel("call", replies=["call"]) as call,
        FakeModel("run", replies=["run"]) as run,
        FakeModel("env", replies=["env"]) as env,
    ):
        monkeypatch.setenv("AGENCY_MODEL", env.model)
        result = await _model_answer(store, run_model=run.model, call_model=call.model)
    assert result.value == "call"
    assert (len(call.calls), len(run.calls), len(env.calls)) == (1, 0, 0)


async def test_model_precedence_run_beats_env(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        FakeModel("run", replies=["run"]) as run,
        FakeModel("env", replies=["env"]) as env,
    ):
        monkeypatch.setenv("AGENCY_MODEL", env.model)
        result = await _model_answer(store, run_model=run.model, call_model=None)
    assert result.value == "run"
    assert (len(run.calls), len(env.calls)) == (1, 0)


async def test_model_precedence_env_is_the_fallback(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeModel("env", replies=["env", "env again"]) as env:
        monkeypatch.setenv("AGENCY_MODEL", env.model)
        result = await _model_answer(store, run_model=None, call_model=None)
        assert result.value == "env"
        with agency.test_context():  # a test frame reads AGENCY_MODEL too
            assert await agency.llm("hi") == "env again"


async def test_no_model_anywhere_is_a_clear_agency_error(store: Store) -> None:
    with agency.test_context(), pytest.raises(AgencyError, match="AGENCY_MODEL") as info:
        await agency.llm("hello")
    assert "model" in str(info.value)
    result = await _model_answer(store, run_model=None, call_model=None)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "NoModelError"
    assert "AGENCY_MODEL" in result.error.message


async def test_llm_outside_a_frame_raises() -> None:
    with pytest.raises(OutsideFrameError, match="llm"):
        await agency.llm("hello", model="fake/echo")


@pytest.mark.parametrize("prompt", ["", "   ", [], [""]], ids=["empty", "blank", "list", "list1"])
@pytest.mark.parametrize("schema", [None, Person], ids=["text", "schema"])
async def test_an_empty_prompt_returns_empty_with_no_side_effects(prompt: Any, schema: Any) -> None:
    with FakeModel("unused", replies=[]) as fake, agency.test_context():
        thread = agency.thread.current()
        thread.queue_message("still queued")
        assert await agency.llm(prompt, model=fake.model, schema=schema) == ""
        assert thread.get_messages() == []
        assert [q.content for q in thread.queued_messages] == ["still queued"]
        assert agency.ctx().cost == 0
        assert agency.ctx().tokens == 0
    assert fake.calls == []


async def test_an_empty_prompt_in_a_run_journals_nothing(store: Store) -> None:
    with FakeModel("unused", replies=[]) as fake:

        async def entry() -> str:
            return await agency.llm("  ", model=fake.model, schema=Person)

        result = await agency.run(entry, run_id="empty-prompt", store=store)
    assert result.status == "completed"
    assert result.value == ""
    assert result.cost == 0
    assert await agency.runs.journal("empty-prompt", store=store) == []
    assert fake.calls == []


# -- queued messages -------------------------------------------------------------------------------


async def test_queued_messages_are_delivered_fifo_with_labels_before_the_prompt() -> None:
    with FakeModel("queue", replies=["answer"]) as fake, agency.test_context():
        thread = agency.thread.current()
        thread.queue_message("first note", label="a")
        thread.queue_message("assistant note", role="assistant", label="b")
        thread.queue_message("third note")
        await agency.llm("the prompt", model=fake.model)
        messages = thread.get_messages()
        assert [(m.role, m.content, m.label) for m in messages] == [
            ("user", "first note", "a"),
            ("assistant", "assistant note", "b"),
            ("user", "third note", None),
            ("user", "the prompt", None),
            ("assistant", "answer", None),
        ]
        assert thread.queued_messages == []
    sent = [(m["role"], m["content"]) for m in fake.calls[0].messages]
    assert sent == [
        ("user", "first note"),
        ("assistant", "assistant note"),
        ("user", "third note"),
        ("user", "the prompt"),
    ]


async def test_queued_messages_are_delivered_only_once() -> None:
    with FakeModel("once", replies=["one", "two"]) as fake, agency.test_context():
        agency.thread.current().queue_message("note")
        await agency.llm("first", model=fake.model)
        await agency.llm("second", model=fake.model)
    assert contents(fake.calls[1]) == ["note", "first", "one", "second"]


async def test_queued_messages_are_not_redelivered_on_a_validation_retry() -> None:
    with FakeModel("vq", replies=["garbage", ADA]) as fake, agency.test_context():
        agency.thread.current().queue_message("queued note")
        assert await agency.llm("who?", model=fake.model, schema=Person) == Person(
            name="Ada", age=36
        )
    assert contents(fake.calls[0]) == ["queued note", "who?"]
    assert contents(fake.calls[1]).count("queued note") == 1
    assert contents(fake.calls[1])[:3] == ["queued note", "who?", "garbage"]


async def test_another_threads_queue_is_never_sent() -> None:
    with FakeModel("other", replies=["ok"]) as fake, agency.test_context():
        other_id = agency.thread.store().create()
        other = agency.thread.store().get(other_id)
        other.queue_message("for the other thread")
        await agency.llm("prompt", model=fake.model)
        assert [q.content for q in other.queued_messages] == ["for the other thread"]
        assert other.get_messages() == []
    assert contents(fake.calls[0]) == ["prompt"]


async def test_queued_messages_are_delivered_exactly_once_across_a_pause(
    store: Store,
) -> None:
    with FakeModel("pause", replies=["first answer", "second answer"]) as fake:

        async def entry() -> list[Any]:
            agency.thread.current().queue_message("queued note", label="q")
            first = await agency.llm("first", model=fake.model)
            answer = await agency.interrupt("confirm", "go on?")
            second = await agency.llm("second", model=fake.model)
            messages = agency.thread.current().get_messages()
            return [first, answer.value, second, [m.content for m in messages]]

        paused = await agency.run(entry, run_id="queue-pause", store=store)
        assert paused.status == "paused"
        assert len(fake.calls) == 1
        done = await agency.respond_to_interrupts(paused, [approve("yes")], store=store)
    assert done.status == "completed", done.error
    assert len(fake.calls) == 2
    assert contents(fake.calls[0]).count("queued note") == 1
    assert contents(fake.calls[1]).count("queued note") == 1
    assert contents(fake.calls[1]) == ["queued note", "first", "first answer", "second"]
    first, value, second, history = done.value
    assert (first, value, second) == ("first answer", "yes", "second answer")
    assert history == ["queued note", "first", "first answer", "second", "second answer"]


# -- the two paths of a fake model: at the seam, and through litellm -------------------------------


@PATHS
async def test_both_paths_bill_the_same_cost_and_tokens(via_litellm: bool) -> None:
    with (
        FakeModel(
            "same",
            replies=["one two three"],
            input_cost_per_token=0.001,
            output_cost_per_token=0.002,
            via_litellm=via_litellm,
        ) as fake,
        agency.test_context(),
    ):
        assert await agency.llm("hello world", model=fake.model) == "one two three"
        assert agency.ctx().cost == pytest.approx(3 * 0.001 + 3 * 0.002, abs=1e-12)
        assert agency.ctx().tokens == 6
    (request,) = fake.calls
    assert request.messages == [{"role": "user", "content": "hello world"}]
    assert request.timeout == provider_module.DEFAULT_TIMEOUT


@PATHS
async def test_both_paths_send_a_json_schema_response_format(via_litellm: bool) -> None:
    with (
        FakeModel("typed-path", replies=[ADA], via_litellm=via_litellm) as fake,
        agency.test_context(),
    ):
        assert await agency.llm("who?", model=fake.model, schema=Person, max_tokens=40) == Person(
            name="Ada", age=36
        )
    (request,) = fake.calls
    assert request.max_tokens == 40
    response_format = request.response_format
    assert isinstance(response_format, dict)
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "Person"
    assert set(response_format["json_schema"]["schema"]["properties"]) == {"name", "age"}


async def test_a_fake_call_at_the_seam_never_loads_litellm_for_its_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fake provider prices its calls itself: nothing on its path asks for litellm."""

    async def refuse() -> Any:
        raise AssertionError("a fake/ call at the seam must not load litellm")

    import agency_runtime._llm._litellm as litellm_loader

    monkeypatch.setattr(litellm_loader, "load_litellm", refuse)
    with FakeModel("local", replies=["x"]) as fake, agency.test_context():
        assert await agency.llm("hi", model=fake.model) == "x"
        assert await agency.llm("hi", model="fake/echo", schema=Person)
        assert agency.ctx().cost > 0


# -- transient and permanent provider failures -----------------------------------------------------


@PATHS
@pytest.mark.parametrize("failure", ["rate_limit", "timeout", "server", "connection"])
async def test_transient_failures_are_retried(failure: Any, via_litellm: bool) -> None:
    with (
        FakeModel(
            "flaky", replies=["finally"], fail_times=2, failure=failure, via_litellm=via_litellm
        ) as fake,
        agency.test_context(),
    ):
        assert await agency.llm("hello", model=fake.model) == "finally"
        # The prompt is pushed once, whatever the number of attempts.
        assert roles_and_contents() == [("user", "hello"), ("assistant", "finally")]
    assert len(fake.calls) == 3


@PATHS
async def test_more_failures_than_attempts_raise_llm_call_error(via_litellm: bool) -> None:
    with (
        FakeModel(
            "down", replies=["never"], fail_times=10, failure="server", via_litellm=via_litellm
        ) as fake,
        agency.test_context(),
    ):
        with pytest.raises(LLMCallError) as info:
            await agency.llm("hello", model=fake.model)
        assert agency.ctx().cost == 0
    assert len(fake.calls) == retries_module.TRANSIENT_ATTEMPTS
    assert info.value.model == fake.model
    assert info.value.attempts == retries_module.TRANSIENT_ATTEMPTS
    assert "scripted server failure 3 of 10" in str(info.value)
    cause = info.value.__cause__
    if via_litellm:  # the original litellm exception is chained
        assert isinstance(cause, (await load_litellm()).InternalServerError)
    else:  # the fake provider's own error, transient
        assert isinstance(cause, ProviderError)
        assert (cause.kind, cause.transient) == ("server", True)


@PATHS
async def test_a_bad_request_is_not_retried(via_litellm: bool) -> None:
    with (
        FakeModel(
            "bad", replies=["never"], fail_times=1, failure="bad_request", via_litellm=via_litellm
        ) as fake,
        agency.test_context(),
        pytest.raises(LLMCallError) as info,
    ):
        await agency.llm("hello", model=fake.model)
    assert len(fake.calls) == 1
    assert info.value.attempts == 1
    cause = info.value.__cause__
    if via_litellm:
        assert isinstance(cause, (await load_litellm()).BadRequestError)
    else:
        assert isinstance(cause, ProviderError)
        assert (cause.kind, cause.transient) == ("bad_request", False)


@PATHS
async def test_an_exhausted_script_surfaces_as_llm_call_error_without_retries(
    via_litellm: bool,
) -> None:
    with (
        FakeModel("empty", replies=[], via_litellm=via_litellm) as fake,
        agency.test_context(),
        pytest.raises(LLMCallError, match="no reply left") as info,
    ):
        await agency.llm("hello", model=fake.model)
    assert len(fake.calls) == 1
    assert isinstance(info.value.__cause__, FakeModelExhausted)


# -- journaling ------------------------------------------------------------------------------------


async def test_a_completed_call_is_not_repeated_on_replay(store: Store) -> None:
    with FakeModel("journal", replies=["alpha", "beta"]) as fake:

        async def entry() -> list[Any]:
            first = await agency.llm("one", model=fake.model)
            second = await agency.llm("two", model=fake.model)
            answer = await agency.interrupt("confirm")
            return [first, second, answer.value, agency.thread.current().get_messages()]

        paused = await agency.run(entry, run_id="journaled", store=store)
        assert paused.status == "paused"
        assert len(fake.calls) == 2
        spent = paused.cost
        expected = cost_of(fake, fake.calls[0], "alpha") + cost_of(fake, fake.calls[1], "beta")
        assert spent == pytest.approx(expected, abs=1e-12)
        done = await agency.respond_to_interrupts(paused, [approve("ok")], store=store)
    assert done.status == "completed", done.error
    assert len(fake.calls) == 2
    first, second, value, messages = done.value
    assert (first, second, value) == ("alpha", "beta", "ok")
    # The replayed calls restored the thread exactly once.
    assert [m["content"] for m in messages] == ["one", "alpha", "two", "beta"]
    assert done.cost == spent
    assert done.tokens == paused.tokens
    entries = await agency.runs.journal("journaled", store=store)
    assert [e.name for e in entries] == ["agency.llm", "agency.llm"]


async def test_a_long_answer_is_journaled_once_and_replayed_whole(store: Store) -> None:
    reply = "a long answer " * 40  # over the length at which a reference pays off
    with FakeModel("once", replies=[reply, "short"]) as fake:

        async def entry() -> list[Any]:
            long = await agency.llm("tell me at length", model=fake.model)
            short = await agency.llm("and briefly", model=fake.model)
            await agency.interrupt("confirm")
            return [long, short, [m.content for m in agency.thread.current().get_messages()]]

        paused = await agency.run(entry, run_id="once", store=store)
        entries = await agency.runs.journal("once", store=store)
        done = await agency.respond_to_interrupts(paused, [approve()], store=store)
    assert done.status == "completed", done.error
    assert len(fake.calls) == 2  # replayed, not asked again
    assert done.value == [reply, "short", ["tell me at length", reply, "and briefly", "short"]]
    long_entry, short_entry = entries
    # The long answer is stored once, in the assistant message the call journaled...
    assert reply not in long_entry.result
    assert long_entry.deltas is not None
    assert long_entry.deltas.count("a long answer") == 40
    # ...while a short one is kept as it is (a reference would save nothing).
    assert short_entry.result == '{"text":"short"}'


def test_a_reference_that_holds_no_answer_is_refused() -> None:
    push_user = ["push", "0", {"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="not a reply"):
        llm_module._resolve_reply({"text_at": 0}, [push_user])
    with pytest.raises(IndexError):
        llm_module._resolve_reply({"text_at": 3}, [push_user])
    assert llm_module._resolve_reply({"text": "kept"}, []) == {"text": "kept"}


async def test_a_replayed_structured_call_returns_the_model_type(store: Store) -> None:
    with FakeModel("typed", replies=[ADA]) as fake:

        async def entry() -> list[Any]:
            person = await agency.llm("who?", model=fake.model, schema=Person)
            assert isinstance(person, Person)
            await agency.interrupt("confirm")
            return [person.name, person.age]

        paused = await agency.run(entry, run_id="typed", store=store)
        done = await agency.respond_to_interrupts(paused, [approve()], store=store)
    assert done.value == ["Ada", 36]
    assert len(fake.calls) == 1


# -- cancellation and time guards ------------------------------------------------------------------


def late(answered: list[str]) -> Any:
    """A reply function for a model with latency: it runs only if the latency ran out."""

    def reply(request: FakeRequest) -> str:
        answered.append("late")
        return "late"

    return reply


@PATHS
async def test_cancel_stops_an_in_flight_call(store: Store, via_litellm: bool) -> None:
    answered: list[str] = []
    with FakeModel("slow", function=late(answered), latency=5, via_litellm=via_litellm) as fake:

        async def entry() -> str:
            async def cancel_once_in_flight() -> None:
                await wait_for(lambda: len(fake.calls) == 1)  # the model has the request
                agency.ctx().cancel("test")

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_once_in_flight)
                return await agency.llm("hello", model=fake.model)

        result = await agency.run(entry, run_id="cancelled", store=store)
    assert result.status == "cancelled"
    assert answered == []  # stopped during its 5 s latency, not after it
    assert len(fake.calls) == 1
    assert (await agency.runs.get("cancelled", store=store)).status == "cancelled"


@PATHS
async def test_a_time_guard_stops_a_slow_call(via_litellm: bool) -> None:
    clock = FakeClock()  # the guard's time; the model's latency is real and is never waited out
    answered: list[str] = []

    async def trip_once_in_flight() -> None:
        await wait_for(lambda: len(fake.calls) == 1)
        clock.advance(0.05)

    with (
        FakeModel("slow", function=late(answered), latency=5, via_litellm=via_litellm) as fake,
        agency.test_context(ctx=RuntimeContext(clock=clock)),
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(trip_once_in_flight)
            with pytest.raises(GuardExceededError) as info:
                async with agency.time_guard(0.05):
                    await agency.llm("hello", model=fake.model)
    assert info.value.type == "time"
    assert info.value.limit == 0.05
    assert answered == []  # the call was stopped in flight
    assert len(fake.calls) == 1


# -- preload ---------------------------------------------------------------------------------------


def test_preload_wait_leaves_litellm_loaded() -> None:
    agency.preload(wait=True)
    assert litellm_module() is not None
    agency.preload()  # idempotent once loaded
    assert litellm_module() is not None


# -- tolerant parsing: the first complete JSON value ---------------------------------------------


class TestParseStructuredFirstCompleteValue:
    """``parse_structured`` reads the first complete JSON value, whatever follows it."""

    class City(BaseModel):
        city: str

    class Trip(BaseModel):
        class Leg(BaseModel):
            origin: str
            stops: list[str]

        name: str
        legs: list[Leg]

    @pytest.mark.parametrize(
        "reply",
        [
            '{"city": "Paris"}}',
            'Here: {"city": "Paris"} (hope that helps :})',
            'Sure! {"city": "Paris"}]',
            'Use {city} as the key: {"city": "Paris"} — done }',
            '```json\n{"city": "Paris"}}\n```',
            '{"data": {"city": "Paris"}}} trailing',
            '{"answer": {"city": "Paris"}} :)}',
            'See [1]. {"city": "Paris"} and {"city": "Rome"}',
        ],
        ids=[
            "trailing-brace",
            "prose-smiley",
            "trailing-bracket",
            "brace-in-prose-before",
            "fence",
            "envelope",
            "single-key",
            "citation-first",
        ],
    )
    def test_a_model(self, reply: str) -> None:
        assert parsing_module.parse_structured(reply, TypeAdapter(self.City)) == self.City(
            city="Paris"
        )

    def test_nested_objects_and_prose_before(self) -> None:
        reply = (
            "Planned it for you {as asked}: "
            '{"name": "Alps", "legs": [{"origin": "Lyon", "stops": ["Annecy", "Chamonix"]}, '
            '{"origin": "Geneva", "stops": []}]} Enjoy :-}'
        )
        trip = parsing_module.parse_structured(reply, TypeAdapter(self.Trip))
        assert trip == self.Trip(
            name="Alps",
            legs=[
                self.Trip.Leg(origin="Lyon", stops=["Annecy", "Chamonix"]),
                self.Trip.Leg(origin="Geneva", stops=[]),
            ],
        )

    @pytest.mark.parametrize(
        "reply",
        ["[1, 2, 3]]", "The numbers: [1, 2, 3] (all of them :])", '{"value": [1, 2, 3]}}'],
    )
    def test_an_array_answer(self, reply: str) -> None:
        assert parsing_module.parse_structured(reply, TypeAdapter(list[int])) == [1, 2, 3]

    def test_a_plain_text_answer_to_a_str_schema_is_kept(self) -> None:
        adapter = TypeAdapter(str)
        assert parsing_module.parse_structured("  just words  ", adapter) == "just words"
        assert parsing_module.parse_structured('{"value": "hi"}}', adapter) == "hi"

    def test_a_mismatch_reports_the_first_values_field_errors(self) -> None:
        with pytest.raises(ValidationError) as info:
            parsing_module.parse_structured(
                'Here: {"town": "Paris"}} and [2]', TypeAdapter(self.City)
            )
        assert [e["loc"] for e in info.value.errors()] == [("city",)]

    def test_text_without_json_gets_a_clear_error(self) -> None:
        with pytest.raises(ValueError, match="the answer contains no JSON value") as info:
            parsing_module.parse_structured("I cannot answer that.", TypeAdapter(self.City))
        assert "I cannot answer that." in str(info.value)
        assert isinstance(info.value.__cause__, ValidationError)

    @pytest.mark.parametrize(
        "reply",
        [
            "[" * 100_000,
            "[" * 100_000 + "]" * 100_000,
            '{"a": ' * 50_000 + "1" + "}" * 50_000,
            "prose " + "[" * 5_000 + '{"city": "Paris"}',
        ],
        ids=["unclosed", "closed", "objects", "after-many-openers"],
    )
    def test_deep_nesting_is_a_clean_error_not_a_recursion_error(
        self, reply: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        starts: list[int] = []
        decoder = parsing_module._decoder()

        class Counting:
            def raw_decode(self, text: str, index: int = 0) -> tuple[Any, int]:
                starts.append(index)
                return decoder.raw_decode(text, index)

        monkeypatch.setattr(parsing_module, "_DECODER", Counting())
        with pytest.raises((ValueError, ValidationError)) as info:
            parsing_module.parse_structured(reply, TypeAdapter(self.City))
        assert not isinstance(info.value, RecursionError)
        assert len(str(info.value)) < 2_000
        # Bounded work, whatever the depth: a bounded number of starts is tried.
        assert len(starts) <= parsing_module._MAX_STARTS

    def test_a_pathological_text_tries_a_bounded_number_of_starts(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # Each of the 500 openers starts an array that runs to the end of the text before it
        # fails: trying every one would scan the text 500 times; the starts tried are bounded.
        reply = "[" * 500 + "1," * 200_000
        starts: list[int] = []
        decoder = parsing_module._decoder()

        class Counting:
            def raw_decode(self, text: str, index: int = 0) -> tuple[Any, int]:
                starts.append(index)
                return decoder.raw_decode(text, index)

        monkeypatch.setattr(parsing_module, "_DECODER", Counting())
        with pytest.raises(ValueError, match="no JSON value"):
            parsing_module.parse_structured(reply, TypeAdapter(self.City))
        assert 0 < len(starts) <= parsing_module._MAX_STARTS

    async def test_through_agency_llm_a_trailing_brace_parses_first_time(self) -> None:
        reply = 'Here: {"name": "Ada", "age": 36} (hope that helps :})'
        with FakeModel("trailing", replies=[reply]) as fake, agency.test_context():
            assert await agency.llm("who?", model=fake.model, schema=Person) == Person(
                name="Ada", age=36
            )
        assert len(fake.calls) == 1
