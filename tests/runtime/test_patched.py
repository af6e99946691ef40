"""``agency.patched``: code that changes under in-flight runs, with Temporal's semantics.

Each test runs a run with the "old" code up to a pause, swaps in the "new" code (the entry
reads a module flag), and continues the run: runs that passed the patch point before the
change keep the old path; runs that reach it for the first time, or recorded the marker,
take the new one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from agency_runtime import (
    InvalidArgumentError,
    NondeterminismError,
    OutsideFrameError,
    Store,
    agency,
    approve,
)

pytestmark = pytest.mark.anyio

CALLS: Counter[str] = Counter()
NEW_CODE = {"on": False}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CALLS.clear()
    NEW_CODE["on"] = False


def _count(name: str) -> Any:
    def body() -> str:
        CALLS[name] += 1
        return name

    return body


GUARDED = {"on": True}


@agency.entry
async def order() -> list[str]:
    """Old code: charge, ship, ask, done. New code: charge, receipt, ship, ask, done."""

    async def body(s: Any) -> list[str]:
        done = [await s.step(_count("charge"), name="charge")]
        if NEW_CODE["on"] and (not GUARDED["on"] or agency.patched("send-receipt")):
            done.append(await s.step(_count("receipt"), name="receipt"))
        done.append(await s.step(_count("ship"), name="ship"))
        await agency.interrupt("close", "close the order?")
        done.append(await s.step(_count("done"), name="done"))
        return done

    return await agency.with_resumable_scope("order", body)


@pytest.fixture(autouse=True)
def _guarded() -> None:
    GUARDED["on"] = True


async def _pause(store: Store, run_id: str) -> None:
    paused = await agency.run(order, run_id=run_id, store=store)
    assert paused.status == "paused"


async def _answer(store: Store, run_id: str) -> Any:
    record = await agency.runs.get(run_id, store=store)
    (asked,) = record.interrupts
    return await agency.respond_to_interrupts(run_id, {asked.interrupt_id: approve()}, store=store)


async def test_a_run_that_passed_the_change_keeps_the_old_code(store: Store) -> None:
    await _pause(store, "old")  # old code: charge, ship, then the interrupt
    NEW_CODE["on"] = True
    result = await _answer(store, "old")
    assert result.value == ["charge", "ship", "done"]
    assert CALLS["receipt"] == 0
    assert CALLS["ship"] == 1
    names = [e.name for e in await agency.runs.journal("old", store=store)]
    assert names == ["charge", "ship", "done"]  # no marker: it never took the new path


async def test_without_patched_the_same_change_breaks_the_old_run(store: Store) -> None:
    await _pause(store, "unguarded")
    NEW_CODE["on"], GUARDED["on"] = True, False
    result = await _answer(store, "unguarded")
    assert result.status == "failed"
    assert isinstance(result.exception, NondeterminismError)
    assert "'receipt'" in str(result.exception)
    assert "'ship'" in str(result.exception)
    assert "agency.patched" in str(result.exception)  # the fix, named


async def test_a_new_run_takes_the_new_code_and_records_it(store: Store) -> None:
    NEW_CODE["on"] = True
    await _pause(store, "new")
    names = [e.name for e in await agency.runs.journal("new", store=store)]
    assert names == ["charge", "agency.patched", "receipt", "ship"]
    result = await _answer(store, "new")  # the marker is found: True although events are ahead
    assert result.value == ["charge", "receipt", "ship", "done"]
    assert CALLS["receipt"] == 1  # replayed, not run again


async def test_a_marker_is_written_only_with_the_next_event(store: Store) -> None:
    @agency.entry
    async def quick() -> bool:
        return agency.patched("nothing-after")

    result = await agency.run(quick, run_id="quick", store=store)
    assert result.value is True
    assert await agency.runs.journal("quick", store=store) == []  # nothing followed it


async def test_patched_is_fixed_for_the_rest_of_an_execution(store: Store) -> None:
    @agency.entry
    async def twice() -> list[bool]:
        first = agency.patched("x")
        second = agency.patched("x")
        return [first, second]

    result = await agency.run(twice, store=store)
    assert result.value == [True, True]


async def test_patched_outside_a_run_and_with_bad_ids() -> None:
    with pytest.raises(OutsideFrameError, match="patched"):
        agency.patched("x")
    for bad in ("", "a\nb", 3):
        with pytest.raises(InvalidArgumentError, match="change id"):
            await agency.with_test_context(lambda b=bad: agency.patched(b))  # type: ignore[misc]
    assert await agency.with_test_context(lambda: agency.patched("fine")) is True


FAIL_ONCE = {"left": 1}


async def nested_then_patch() -> str:
    async def body(s: Any) -> str:
        async def outer() -> str:
            async def inner(t: Any) -> str:
                return str(await t.step(_count("inner"), name="inner"))

            return await agency.with_resumable_scope("inner", inner)

        await s.step(outer, name="outer")  # a step whose own steps are journaled inside it
        if NEW_CODE["on"] and agency.patched("after-outer"):
            return "new"
        if FAIL_ONCE["left"]:
            FAIL_ONCE["left"] -= 1
            raise RuntimeError("crash after the outer step")
        return "old"

    return str(await agency.with_resumable_scope("main", body))


async def test_entries_inside_a_replayed_step_are_not_events_still_ahead(store: Store) -> None:
    """A run that stopped right after a step with steps of its own never passed the patch
    point after it: on resume the outer step replays whole (its inner step with it), nothing
    recorded is ahead, so the run takes the new code."""
    FAIL_ONCE["left"] = 1
    failed = await agency.run(nested_then_patch, run_id="nested", store=store)
    assert failed.status == "failed"
    NEW_CODE["on"] = True
    done = await agency.resume("nested", store=store)
    assert (done.status, done.value) == ("completed", "new")
    assert CALLS == {"inner": 1}
