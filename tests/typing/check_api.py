"""Static checks of the typed API: mypy (strict) and pyright read it in CI as a user would.

Never executed: both read it through the installed package, from outside the repo (.ci/run).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, assert_type

from pydantic import BaseModel

from agency_runtime import RunResult, agency


class Reply(BaseModel):
    text: str


async def async_entry() -> int:
    return 1


def sync_entry(name: str) -> str:
    return name


def awaitable_entry() -> Awaitable[float]:
    """A plain def returning an awaitable: the run awaits it, so its value is a float."""
    return async_half()


async def async_half() -> float:
    return 0.5


async def async_awaitable_entry() -> Awaitable[int]:
    """Awaited once, this gives an awaitable, not an int: the run's value is that."""
    return async_entry()


async def check() -> None:
    result = await agency.run(async_entry)
    assert_type(result, RunResult[int])
    assert_type(result.unwrap(), int)
    assert_type(result.value, int | None)
    assert_type(await agency.run(sync_entry, "ada", run_id="r1"), RunResult[str])
    assert_type(agency.run_sync(async_entry), RunResult[int])
    assert_type(await agency.run(awaitable_entry), RunResult[float])
    assert_type(agency.run_sync(awaitable_entry, run_id="r2", store="memory://"), RunResult[float])
    assert_type(agency.run_sync(sync_entry, "ada"), RunResult[str])
    assert_type(await agency.run(async_awaitable_entry), RunResult[Awaitable[int]])
    assert_type(await agency.run(lambda: 3), RunResult[int])
    assert_type(await agency.resume("r1"), RunResult[Any])
    assert_type(await agency.respond_to_interrupts(result, {}), RunResult[Any])
    assert_type(await agency.runs.wait("r1"), RunResult[Any])
    assert_type(await agency.llm("x"), str)
    assert_type(await agency.llm("x", schema=Reply), Reply)
    assert_type(await agency.llm("x", schema={"type": "object"}), Any)
