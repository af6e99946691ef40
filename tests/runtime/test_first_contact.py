"""First contact, second pass (issue 24): what a new user and a real model tripped on.

``agency.Worker`` on the namespace, answers on the store a run is on, refusing entries no
worker could run, entry values that miss their annotation, step functions that need
arguments, and six-field cron expressions.
"""

from __future__ import annotations

import functools
import os
import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

from agency_runtime import (
    EntryNotAllowedError,
    InvalidArgumentError,
    ResumableScope,
    Retry,
    RunResult,
    StepFailedError,
    Store,
    Worker,
    agency,
    approve,
    open_store,
)
from agency_runtime._boundary._schedules import fire_due
from agency_runtime.testing import FakeClock
from tests.support import serving

pytestmark = pytest.mark.anyio


# -- agency.Worker -------------------------------------------------------------------------


@agency.entry
async def invoice(customer: str) -> str:
    return f"invoiced {customer}"


async def test_the_readme_s_worker_is_on_the_agency_namespace(store: Store) -> None:
    assert agency.Worker is Worker
    run_id = await agency.enqueue(invoice, "ada", queue="billing", store=store)
    async with serving(agency.Worker(store, queues=["billing"], concurrency=8, poll=0.01)):
        result = await agency.runs.wait(run_id, store=store, timeout=30)
    assert (result.status, result.value) == ("completed", "invoiced ada")


# -- answers go to the store the run is on -------------------------------------------------


@agency.entry
async def approval(item: str) -> str:
    answer = await agency.interrupt("approve", f"Buy {item}?")
    return f"bought {item}" if answer.approved else "no"


def _nothing_made_here(workdir: Path) -> None:
    assert not (workdir / ".agency").exists()  # the default store was never opened


@pytest.mark.parametrize("target", ["result", "record", "interrupts"])
async def test_respond_to_interrupts_answers_on_the_store_the_run_is_on(
    store: Store, workdir: Path, target: str
) -> None:
    paused = await agency.run(approval, "tea", run_id="t1", store=store)
    assert paused.status == "paused"
    given: Any = {
        "result": paused,
        "record": await agency.runs.get("t1", store=store),
        "interrupts": paused.interrupts,
    }[target]
    done = await agency.respond_to_interrupts(given, [approve()])  # no store=
    assert (done.status, done.value) == ("completed", "bought tea")
    assert (await agency.runs.get("t1", store=store)).status == "completed"
    _nothing_made_here(workdir)


async def test_a_run_id_still_means_the_default_store_and_store_wins(
    store: Store, workdir: Path
) -> None:
    paused = await agency.run(approval, "tea", run_id="t2", store=store)
    other = open_store(f"memory://other-{uuid.uuid4().hex}")
    with pytest.raises(Exception, match="no run"):  # store= wins over where it was read
        await agency.respond_to_interrupts(paused, [approve()], store=other)
    assert (await agency.runs.get("t2", store=store)).status == "paused"
    _nothing_made_here(workdir)


async def test_an_enqueued_answer_and_a_listed_record_know_their_store(
    store: Store, workdir: Path
) -> None:
    await agency.run(approval, "tea", run_id="t3", store=store)
    [record] = await agency.runs.list(store=store, status="paused")
    queued = await agency.respond_to_interrupts(record, [approve()], enqueue=True)
    assert queued.status == "queued"
    async with serving(Worker(store, poll=0.01)):
        assert (await agency.runs.wait("t3", store=store, timeout=30)).value == "bought tea"
    _nothing_made_here(workdir)


def _postgres_url_with_a_password(schema: str) -> str:
    dsn = os.environ.get("AGENCY_TEST_POSTGRES")
    if not dsn:
        pytest.fail("no PostgreSQL server (AGENCY_TEST_POSTGRES; see tests/conftest.py)")
    parts = urlsplit(dsn)
    user = parts.username or "postgres"
    netloc = f"{user}:s3cret-pw@{parts.hostname}:{parts.port or 5432}"  # trust auth ignores it
    return urlunsplit((parts.scheme, netloc, parts.path, f"schema={schema}", ""))


@pytest.fixture
def url_store(request: pytest.FixtureRequest, workdir: Path) -> Iterator[str]:
    kind = request.param
    schema = f"first{uuid.uuid4().hex[:10]}"
    url = {
        "memory": f"memory://t1-{uuid.uuid4().hex}",
        "sqlite": "sqlite:///runs/first.db",
        "postgres": "" if kind != "postgres" else _postgres_url_with_a_password(schema),
    }[kind]
    if kind == "sqlite":
        (workdir / "runs").mkdir()
    yield url
    open_store(url).close()
    if kind == "postgres":
        import psycopg

        with psycopg.connect(os.environ["AGENCY_TEST_POSTGRES"], autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.parametrize("url_store", ["memory", "sqlite", "postgres"], indirect=True)
async def test_a_run_on_a_store_url_is_answered_there_and_keeps_no_password(
    url_store: str, workdir: Path
) -> None:
    paused = await agency.run(approval, "jam", run_id="t1", store=url_store)
    assert paused.status == "paused"
    record = await agency.runs.get("t1", store=url_store)
    for shape in (paused, record, *paused.interrupts):
        shown = [repr(shape), str(shape), shape.model_dump_json(), str(shape.model_dump())]
        assert not any("s3cret" in text or "postgresql" in text for text in shown)
        revived = pickle.loads(pickle.dumps(shape))
        assert revived == shape  # equal, with no store inside: another process has its own
    done = await agency.respond_to_interrupts(paused, [approve()])
    assert (done.status, done.value) == ("completed", "bought jam")
    assert "s3cret" not in pickle.dumps(done).decode("latin-1")
    _nothing_made_here(workdir)


async def test_a_pickled_result_has_no_store_so_the_default_store_is_asked(
    store: Store, workdir: Path
) -> None:
    paused = await agency.run(approval, "tea", run_id="t4", store=store)
    revived: RunResult = pickle.loads(pickle.dumps(paused))
    with pytest.raises(Exception, match="no run"):
        await agency.respond_to_interrupts(revived, [approve()])
    assert (workdir / ".agency").exists()  # it asked the default store: the old behaviour


# -- entries no worker could run are refused when queued -----------------------------------


def undeclared() -> int:
    return 42


async def test_enqueue_refuses_an_entry_no_worker_could_run(store: Store) -> None:
    def nested() -> int:
        return 1

    declared_nested = agency.register_entry(nested)
    await agency.run(undeclared, run_id="ran-here", store=store)
    for entry, why in [
        (lambda: 42, "lambda"),
        (declared_nested, "inside another function"),
        (undeclared, "not a declared entry"),
        (functools.partial(undeclared), "not a declared entry"),
    ]:
        with pytest.raises(EntryNotAllowedError, match=why) as caught:
            await agency.enqueue(entry, run_id="q1", store=store)
        assert "agency.enqueue" in str(caught.value)
        assert "@agency.entry" in str(caught.value)
    assert [r.run_id for r in await agency.runs.list(store=store)] == ["ran-here"]


async def test_enqueue_takes_declared_and_named_entries(store: Store) -> None:
    @agency.entry(name="first-contact.nested")
    def named() -> int:
        return 7

    assert await agency.enqueue(named, run_id="n", store=store) == "n"
    assert await agency.enqueue(invoice, "bo", run_id="d", store=store) == "d"
    async with serving(Worker(store, poll=0.01)):
        assert (await agency.runs.wait("n", store=store, timeout=30)).value == 7
        assert (await agency.runs.wait("d", store=store, timeout=30)).value == "invoiced bo"


@agency.entry
def tick(label: str = "tick") -> str:
    return label


async def test_schedules_add_refuses_an_entry_no_worker_could_run(store: Store) -> None:
    for entry, why in [(lambda: 42, "lambda"), (undeclared, "not a declared entry")]:
        with pytest.raises(EntryNotAllowedError, match=why) as caught:
            await agency.schedules.add("q1", entry, every=60, store=store)
        assert "agency.schedules.add" in str(caught.value)
    with pytest.raises(EntryNotAllowedError):
        await agency.schedules.add("q1", f"{__name__}:undeclared", every=60, store=store)
    assert await agency.schedules.list(store=store) == []


async def test_removing_a_schedule_cancels_its_queued_occurrences_not_started(
    make_store: Any,
) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    store: Store = make_store(clock=clock)
    previous = agency.configure(clock=clock)
    try:
        await agency.schedules.add("digest", tick, every=60, store=store)
        await agency.schedules.add("digest-2", tick, every=60, store=store)
        clock.advance(61)
        assert await fire_due(store, ["default"], clock.time()) == 2
        await agency.enqueue(tick, "mine", run_id="digest@mine", store=store)  # not one of its
        occurrences = {r.run_id: r for r in await agency.runs.list(store=store)}
        [mine] = [r for r in occurrences if r.startswith("digest@2")]
        await agency.schedules.remove("digest", store=store)
        after = {r.run_id: r.status for r in await agency.runs.list(store=store)}
        assert after[mine] == "cancelled"
        others = {run_id: status for run_id, status in after.items() if run_id != mine}
        assert set(others.values()) == {"queued"}  # another schedule's, and a plain run
        assert len(others) == 2
    finally:
        agency.configure(clock=previous)


# -- a value that misses its annotation, a step function that needs arguments ---------------


def returns_text() -> int:
    return "abc"  # type: ignore[return-value]


async def test_a_value_that_misses_the_return_annotation_names_the_entry_and_annotation(
    store: Store,
) -> None:
    result = await agency.run(returns_text, run_id="shape", store=store)
    assert result.status == "failed"
    assert result.error is not None
    message = result.error.message
    assert result.error.type == "EntryResultError"
    assert f"{__name__}:returns_text" in message
    assert "'abc'" in message
    assert "return annotation int" in message
    assert "valid integer" in message
    assert "1 validation error" not in message


def charge(amount: int) -> int:
    return amount


def raises_type_error() -> int:
    raise TypeError("inside the step")


async def test_a_step_function_that_needs_arguments_is_an_invalid_argument(store: Store) -> None:
    async def entry() -> Any:
        async def body(s: ResumableScope) -> Any:
            with pytest.raises(InvalidArgumentError) as caught:
                await s.step(charge)  # type: ignore[arg-type]
            assert isinstance(caught.value.__cause__, TypeError)
            with pytest.raises(TypeError, match="inside the step"):  # its own TypeError
                await s.step(raises_type_error)
            return [
                str(caught.value),
                await s.step(functools.partial(charge, 5)),
                await s.step(lambda: 6),
            ]

        return await agency.with_resumable_scope("pay", body)

    result = await agency.run(entry, run_id="args", store=store)
    assert result.status == "completed", result.error
    caught, five, six = result.value
    assert (five, six) == (5, 6)
    assert "takes no arguments" in caught
    assert "charge" in caught
    assert "lambda" in caught
    assert "functools.partial" in caught


async def test_an_async_step_function_that_needs_arguments_too(store: Store) -> None:
    async def fetch(url: str) -> str:
        await anyio.lowlevel.checkpoint()
        return url

    async def entry() -> str:
        async def body(s: ResumableScope) -> str:
            return await s.step(fetch)  # type: ignore[arg-type]

        return await agency.with_resumable_scope("fetch", body)

    result = await agency.run(entry, run_id="async-args", store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "InvalidArgumentError"
    assert "takes no arguments" in result.error.message


async def test_a_retried_step_function_that_needs_arguments_fails_each_attempt(
    store: Store,
) -> None:
    async def entry() -> Any:
        async def body(s: ResumableScope) -> Any:
            with pytest.raises(StepFailedError) as caught:
                await s.step(charge, retries=Retry(attempts=2, backoff=0))  # type: ignore[arg-type]
            return [str(caught.value), type(caught.value.__cause__).__name__]

        return await agency.with_resumable_scope("pay", body)

    result = await agency.run(entry, run_id="retried-args", store=store)
    assert result.status == "completed", result.error
    message, cause = result.value
    assert "failed after 2 attempt(s)" in message
    assert "InvalidArgumentError" in message
    assert "takes some" in message
    assert cause == "InvalidArgumentError"


# -- cron: five fields ----------------------------------------------------------------------


async def test_a_six_field_cron_expression_is_refused(store: Store) -> None:
    for cron, fields in [("*/5 * * * * *", 6), ("0 0 9 * * * 2030", 7)]:
        with pytest.raises(InvalidArgumentError, match=f"has {fields} fields; use five"):
            await agency.schedules.add("fast", tick, cron=cron, store=store)
    assert await agency.schedules.list(store=store) == []
    daily = await agency.schedules.add("daily", tick, cron="@daily", store=store)
    assert daily.cron == "@daily"
