"""Every number a user gives the library is bounded and checked before anything is stored
(DESIGN §11.1): out of range is an InvalidArgumentError naming what and the allowed range,
on every store backend where a store is involved. And inputs that used to surface as raw
OSError / ValueError / UnicodeEncodeError are AgencyErrors said where they arise."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from agency_runtime import (
    AgencyError,
    InvalidArgumentError,
    Store,
    StoreError,
    Worker,
    agency,
    open_store,
)
from agency_runtime._llm._embed import embed
from agency_runtime._memory._persistence import _read_file, _write_file

pytestmark = pytest.mark.anyio

HUGE = [1e308, math.inf, math.nan, -1.0, timedelta(days=365 * 200)]


@agency.entry
def adds(a: int, b: int) -> int:
    return a + b


@pytest.mark.parametrize("every", [*HUGE, 0.5])
async def test_schedules_add_refuses_an_every_out_of_range(store: Store, every: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"every must be a number of seconds >= 1"):
        await agency.schedules.add("s", adds, every=every, args=[1, 2], store=store)
    assert await agency.schedules.list(store=store) == []  # nothing was stored
    longest = await agency.schedules.add("s", adds, every=3_155_760_000, store=store)
    assert longest.next_time.year < 2200  # still a date: every later read can show it


@pytest.mark.parametrize("timeout", HUGE)
async def test_runs_wait_refuses_a_timeout_out_of_range(store: Store, timeout: Any) -> None:
    done = await agency.run(adds, 1, 2, store=store)
    with pytest.raises(InvalidArgumentError, match=r"agency\.runs\.wait: timeout .*100 years"):
        await agency.runs.wait(done.run_id, store=store, timeout=timeout)


@pytest.mark.parametrize("seconds", HUGE)
async def test_sleeps_and_event_waits_refuse_seconds_out_of_range(seconds: Any) -> None:
    with anyio.fail_after(10):  # the old check let 1e308 through: a sleep that never ends
        with pytest.raises(InvalidArgumentError, match=r"agency\.sleep: seconds .*<= 3155760000"):
            await agency.with_test_context(lambda: agency.sleep(seconds))
        with pytest.raises(InvalidArgumentError, match="wait_for_event: timeout"):
            await agency.with_test_context(lambda: agency.wait_for_event("x", timeout=seconds))


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"lease": 1e308}, "Worker: lease"),
        ({"lease": 0}, "Worker: lease"),
        ({"poll": math.nan}, "Worker: poll"),
        ({"park_after": 1e300}, "Worker: park_after"),
        ({"concurrency": 10**6}, "Worker: concurrency must be a whole number from 1 to 10000"),
        ({"concurrency": 2**70}, "Worker: concurrency"),
    ],
)
async def test_worker_numbers_are_bounded(store: Store, options: dict[str, Any], what: str) -> None:
    with pytest.raises(InvalidArgumentError, match=what):
        Worker(store, **options)


async def test_guard_and_lock_numbers_are_bounded() -> None:
    async def body() -> None:
        with pytest.raises(InvalidArgumentError, match=r"time_guard\(\): seconds .*100 years"):
            async with agency.time_guard(1e308):
                pass
        with pytest.raises(InvalidArgumentError, match="US dollars, at most 9,223,372"):
            async with agency.cost_guard(1e300):
                pass
        with pytest.raises(InvalidArgumentError, match=r"timeout \(None: wait forever\)"):
            async with agency.lock("l", timeout=1e308):
                pass

    with anyio.fail_after(10):
        await agency.with_test_context(body)


@pytest.mark.parametrize(("limit", "offset"), [(2**70, 0), (1, 2**64), (1, -1)])
async def test_runs_list_pages_are_bounded(store: Store, limit: int, offset: int) -> None:
    with pytest.raises(InvalidArgumentError, match="must be a whole number from"):
        await agency.runs.list(store=store, limit=limit, offset=offset)


# -- inputs that raised raw errors ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://u:p@[::1/agency", r"malformed store URL \(Invalid IPv6 URL\)"),
        ("sqlite:///\ud800.db", "lone surrogate"),
        ("sqlite:///" + "a" * 5000, "is too long"),
        ("memory://\ud800", "lone surrogate"),
    ],
)
def test_unusable_store_urls_are_invalid_arguments(url: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        open_store(url)
    assert "p@" not in str(caught.value)


def test_a_memory_id_past_200_characters_is_refused_up_front() -> None:
    def body() -> None:
        agency.memory.enable({"dir": "mem"})
        agency.memory.set_id("a" * 200)  # the longest accepted
        with pytest.raises(InvalidArgumentError, match=r"1 to 200 letters.*\(300 characters\)"):
            agency.memory.set_id("a" * 300)

    with agency.test_context():
        body()


def test_memory_file_errors_are_store_errors(tmp_path: Path) -> None:
    too_long = tmp_path / ("a" * 300) / "graph.json"
    with pytest.raises(StoreError, match=r"cannot read the memory file .*File name too long"):
        _read_file(too_long)
    with pytest.raises(StoreError, match=r"cannot write the memory file .*File name too long"):
        _write_file(too_long, "{}")
    assert issubclass(StoreError, AgencyError)


@pytest.mark.parametrize("timeout", [1e308, float("inf"), 0, -1, True, "10"])
async def test_an_llm_or_embedding_timeout_out_of_range_is_an_invalid_argument(
    timeout: Any,
) -> None:
    with (
        agency.test_context(),
        pytest.raises(InvalidArgumentError, match="timeout must be a number of seconds"),
    ):
        await agency.llm("hi", model="fake/echo", timeout=timeout)
    with pytest.raises(InvalidArgumentError, match="timeout must be a number of seconds"):
        await embed("fake/echo", ["hi"], timeout=timeout)  # (agent memory's embeddings)
