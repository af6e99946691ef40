"""Step policies: durable retries with backoff and a timeout per attempt (DESIGN §11.3).

On every store backend, with the runtime's ``FakeClock`` for the backoff arithmetic; a real
process killed with SIGKILL between attempts continues the count (``test_a_kill_between_*``);
a worker parks a run whose backoff is longer than ``park_after``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from agency_runtime import (
    InvalidArgumentError,
    ResumableScope,
    Retry,
    RunRecord,
    StepFailedError,
    Store,
    Worker,
    agency,
    approve,
)
from agency_runtime.testing import FakeClock, FakeModel, FakeToolCall
from tests.forked import ForkServer
from tests.support import serving

pytestmark = pytest.mark.anyio

TRIES: list[float] = []
"""When each attempt of the flaky steps below started (the run's clock)."""


@pytest.fixture(autouse=True)
def _fresh() -> None:
    TRIES.clear()


@pytest.fixture
def clocked(fake_clock: FakeClock, make_store: Callable[..., Store]) -> tuple[FakeClock, Store]:
    return fake_clock, make_store(clock=fake_clock)


def _flaky(fails: int, error: type[Exception] = ConnectionError) -> Callable[[], str]:
    def charge() -> str:
        TRIES.append(agency.ctx().clock.time())
        if len(TRIES) <= fails:
            raise error(f"down ({len(TRIES)})")
        return "charged"

    return charge


def _in_scope(fails: int, policy: Retry | int, error: type[Exception] = ConnectionError) -> Any:
    async def entry() -> str:
        async def body(s: ResumableScope) -> str:
            return await s.step(_flaky(fails, error), name="charge", retries=policy)

        return await agency.with_resumable_scope("pay", body)

    return entry


async def _run_advancing(clock: FakeClock, store: Store, entry: Any, run_id: str) -> Any:
    """Run ``entry``, moving the fake clock on whenever the run sleeps (its backoffs)."""
    results: list[Any] = []
    async with anyio.create_task_group() as group:

        async def go() -> None:
            results.append(await agency.run(entry, run_id=run_id, store=store))

        group.start_soon(go)
        while not results:
            await anyio.wait_all_tasks_blocked()
            if not results:
                clock.advance(0.5)
    return results[0]


async def test_a_failing_step_is_retried_after_its_backoff(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    policy = Retry(attempts=3, backoff=1.0, multiplier=2.0, jitter=0)
    result = await _run_advancing(clock, store, _in_scope(2, policy), "pay")
    assert (result.status, result.value) == ("completed", "charged")
    assert [round(t - TRIES[0], 6) for t in TRIES] == [0.0, 1.0, 3.0]  # 1 s, then 2 s
    journal = await agency.runs.journal("pay", store=store)
    attempts = [e for e in journal if e.name == "agency.step.attempt"]
    assert [e.path for e in attempts] == ["pay/0/attempt#1", "pay/0/attempt#2"]
    assert [e.name for e in journal][-1] == "charge"


async def test_the_last_failure_raises_step_failed_and_a_replay_raises_it_again(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    caught: list[StepFailedError] = []

    async def entry() -> str:
        async def body(s: ResumableScope) -> str:
            try:
                await s.step(_flaky(9), name="charge", retries=Retry(attempts=2, jitter=0))
            except StepFailedError as exc:
                caught.append(exc)
                await agency.interrupt("std::approve", "give up?")  # pause: a replay follows
            return "gave up"

        return await agency.with_resumable_scope("pay", body)

    paused = await _run_advancing(clock, store, entry, "fail")
    assert paused.status == "paused"
    [first] = caught
    assert (first.attempts, [e["type"] for e in first.errors]) == (2, ["ConnectionError"] * 2)
    assert isinstance(first.__cause__, ConnectionError)  # the first execution chains it
    done = await agency.respond_to_interrupts(paused, [approve()])
    assert (done.status, done.value) == ("completed", "gave up")
    assert len(TRIES) == 2  # the replay raised the recorded failure: no third call
    assert caught[1].errors == first.errors


async def test_an_exception_outside_on_fails_at_once(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    policy = Retry(attempts=5, on=(ConnectionError,), jitter=0)
    result = await _run_advancing(clock, store, _in_scope(3, policy, KeyError), "keys")
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "KeyError"
    assert len(TRIES) == 1


async def test_retries_n_means_n_retries(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    result = await _run_advancing(clock, store, _in_scope(3, 3), "three")
    assert (result.status, result.value, len(TRIES)) == ("completed", "charged", 4)


async def test_a_timeout_bounds_one_attempt(store: Store) -> None:
    slow = anyio.Event()

    async def entry() -> str:
        async def body(s: ResumableScope) -> str:
            async def attempt() -> str:
                TRIES.append(0.0)
                if len(TRIES) == 1:
                    await slow.wait()  # never set: this attempt times out
                return "fast"

            return await s.step(attempt, retries=Retry(attempts=2, backoff=0), timeout=0.05)

        return await agency.with_resumable_scope("t", body)

    result = await agency.run(entry, run_id="timeout", store=store)
    assert (result.status, result.value, len(TRIES)) == ("completed", "fast", 2)
    [failed] = [e for e in await agency.runs.journal("timeout", store=store) if "attempt" in e.path]
    assert '"TimeoutError"' in failed.result


async def test_bad_policies_are_refused() -> None:
    for options, message in [
        ({"attempts": 0}, "attempts"),
        ({"backoff": -1}, "backoff"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"jitter": 2}, "jitter"),
        ({"on": (int,)}, "exception classes"),
    ]:
        with pytest.raises((InvalidArgumentError, ValueError), match=message):
            Retry(**options)


@agency.entry
async def slow_retry() -> str:
    async def body(s: ResumableScope) -> str:
        policy = Retry(attempts=2, backoff=3600, max_backoff=3600, jitter=0)
        return await s.step(_flaky(1), name="charge", retries=policy)

    return await agency.with_resumable_scope("slow", body)


async def test_a_worker_parks_a_run_during_a_long_backoff(
    clocked: tuple[FakeClock, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, store = clocked
    parked = anyio.Event()
    finish = store.finish_run

    async def seen(record: RunRecord, **options: Any) -> bool:
        stored = await finish(record, **options)
        if record.status == "waiting":
            parked.set()
        return stored

    monkeypatch.setattr(store, "finish_run", seen)
    await agency.enqueue(slow_retry, run_id="parked", store=store)
    async with serving(Worker(store, poll=0.05, park_after=1)):
        with anyio.fail_after(30):
            await parked.wait()
        record = await store.get_run("parked")
        assert record is not None
        assert record.status == "waiting"
        assert record.wake_at == pytest.approx(TRIES[0] + 3600)
        clock.advance(3600)
        done = await agency.runs.wait("parked", store=store, timeout=30)
    assert (done.status, done.value, len(TRIES)) == ("completed", "charged", 2)


KILLED = r"""
import os, signal, sys
from agency_runtime import agency

LEDGER = os.environ["LEDGER"]


def charge():
    with open(LEDGER, "a") as ledger:
        ledger.write(f"attempt {os.getpid()}\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    count = len(open(LEDGER).read().splitlines())
    if count == 2 and os.environ.get("KILL") == "1":
        os.kill(os.getpid(), signal.SIGKILL)  # dies inside the second attempt
    if count < 4:
        raise ConnectionError(f"down {count}")
    return count


async def body(s):
    return await s.step(charge, retries=agency.Retry(attempts=5, backoff=0.01, jitter=0))


async def pay():
    return await agency.with_resumable_scope("pay", body)


if __name__ == "__main__":
    result = agency.run_sync(pay, run_id="pay", store="sqlite:///" + os.environ["DB"])
    print(result.status, result.value)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_a_kill_between_attempts_never_resets_the_count(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    script = tmp_path / "pay.py"
    script.write_text(KILLED)
    ledger = tmp_path / "ledger.txt"
    env = {**os.environ, "LEDGER": str(ledger), "DB": str(tmp_path / "runs.db")}
    killed = fork_server.start("script", script, env={**env, "KILL": "1"}, cwd=tmp_path)
    try:
        killed.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        killed.kill()
        pytest.fail("the process did not kill itself")
    assert killed.returncode == -signal.SIGKILL
    done = fork_server.run("script", script, env=env, cwd=tmp_path, timeout=60)
    assert done.stdout.split() == ["completed", "4"], done.stderr
    # Attempt 1 failed and was journaled before the kill; attempt 2 was in flight and runs
    # again as attempt 2 (not 1): four calls in all, the fourth succeeds.
    assert len(ledger.read_text().splitlines()) == 4

    async def attempts() -> list[str]:
        from agency_runtime import SqliteStore

        store = SqliteStore(tmp_path / "runs.db")
        try:
            journal = await store.load_journal("pay")
            return [e.path for e in journal.entries if "attempt#" in e.path]
        finally:
            store.close()

    assert anyio.run(attempts) == ["pay/0/attempt#1", "pay/0/attempt#2"]


# -- agency.tool(fn, retries=, timeout=) -------------------------------------------------------

LOOKUPS: list[str] = []


def _lookup(fails: int) -> Any:
    def lookup(city: str) -> str:
        """Look a city's weather up (a flaky service)."""
        LOOKUPS.append(city)
        if len(LOOKUPS) <= fails:
            raise ConnectionError(f"weather service down ({len(LOOKUPS)})")
        return f"sunny in {city}"

    return lookup


def _asks_with(tool: Any) -> Any:
    async def entry() -> str:
        return str(await agency.llm("weather?", model="fake/retrying", tools=[tool]))

    return entry


async def test_a_tool_with_retries_is_retried_durably(store: Store) -> None:
    LOOKUPS.clear()
    tool = agency.tool(_lookup(2), name="lookup", retries=Retry(attempts=3, backoff=0))
    replies = [[FakeToolCall("lookup", {"city": "Oslo"})], "It is sunny."]
    with FakeModel("retrying", replies=replies) as fake:
        result = await agency.run(_asks_with(tool), run_id="tool", store=store)
    assert (result.status, result.value) == ("completed", "It is sunny.")
    assert LOOKUPS == ["Oslo"] * 3
    [told] = [m["content"] for m in fake.calls[-1].messages if m.get("role") == "tool"]
    assert told == "sunny in Oslo"
    journal = await agency.runs.journal("tool", store=store)
    assert [e.path for e in journal if e.name == "agency.step.attempt"] == [
        "llm#0/tool#0/attempt#1",
        "llm#0/tool#0/attempt#2",
    ]


async def test_a_tools_last_failure_is_what_the_model_reads(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    LOOKUPS.clear()
    tool = agency.tool(_lookup(9), name="lookup", retries=1)  # the default backoff, on the clock
    replies = [[FakeToolCall("lookup", {"city": "Oslo"})], "The service is down."]
    with FakeModel("retrying", replies=replies) as fake:
        result = await _run_advancing(clock, store, _asks_with(tool), "down")
    assert result.value == "The service is down."
    assert LOOKUPS == ["Oslo"] * 2
    [told] = [m["content"] for m in fake.calls[-1].messages if m.get("role") == "tool"]
    assert told.startswith("Error: lookup step 'llm#0/tool#0' failed after 2 attempt(s)")
    assert "ConnectionError: weather service down (2)" in told
