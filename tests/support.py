"""Helpers shared by the tests: asyncio-only tests, and waiting without sleeping."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

from agency_runtime.testing import FakeClock

LITELLM = "litellm's async code runs on asyncio only"
"""Why a test that goes through litellm (``via_litellm=True``, ``litellm.acompletion``) is
asyncio-only."""


SHARES_LITELLM = pytest.mark.xdist_group("litellm")
"""For the tests that import litellm into the test process: under pytest-xdist (``--dist
loadgroup``) they all run in one worker, so only that one pays for litellm's slow import."""


def asyncio_only(reason: str) -> pytest.MarkDecorator:
    """Run this async test on asyncio only, not on trio, for ``reason`` (said, not skipped).

    The test gets the id ``[asyncio]`` and the marker ``asyncio_only(reason=...)``, so
    ``pytest -m asyncio_only`` lists every such test.
    """
    return pytest.mark.parametrize(
        "anyio_backend",
        [pytest.param("asyncio", id="asyncio", marks=pytest.mark.asyncio_only(reason=reason))],
    )


async def wait_for(predicate: Callable[[], bool], *, timeout: float = 60.0) -> None:
    """Let the other tasks run until ``predicate()`` holds (a bounded poll, never a sleep).

    For what the test cannot be told by an event: state of the runtime changed by other
    tasks, or by real time inside the runtime. Fails with ``TimeoutError`` after
    ``timeout`` seconds instead of hanging.
    """
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.lowlevel.checkpoint()


async def advance_when_blocked(clock: FakeClock, *steps: float) -> None:
    """Once every other task waits, move ``clock`` on by each step in turn.

    Run it beside the code under test (``group.start_soon(advance_when_blocked, clock, 10)``):
    timers and sleeps of that clock that fall due fire in time order, so a guard's timer due
    before a sleep's end cancels the sleep before it ends.
    """
    for seconds in steps:
        await anyio.wait_all_tasks_blocked()
        clock.advance(seconds)
