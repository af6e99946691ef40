"""Helpers shared by the tests: asyncio-only tests, waiting without sleeping, workers."""

from __future__ import annotations

import functools
import importlib
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType

import anyio
import anyio.lowlevel
import pytest

from agency_runtime import RunStatus, Store, Worker
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


@asynccontextmanager
async def serving(worker: Worker, *others: Worker) -> AsyncIterator[Worker]:
    """Run the workers for the duration of the block (``as`` gives the first), then drain
    them (at once when the block failed)."""
    workers = (worker, *others)
    async with anyio.create_task_group() as group:
        for each in workers:
            group.start_soon(each.run)
        try:
            yield worker
        except BaseException:
            for each in workers:
                await each.drain(timeout=0)  # the test failed: stop at once
            raise
        with anyio.fail_after(30):
            for each in workers:
                await each.drain()


async def wait_for_status(store: Store, run_id: str, status: RunStatus) -> None:
    """Look at the store (a bounded poll, 20 s) until run ``run_id`` has ``status``."""
    with anyio.fail_after(20):
        while True:
            record = await store.get_run(run_id)
            if record is not None and record.status == status:
                return
            await anyio.sleep(0.005)  # another task's (or process's) progress, not a timer


def app_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str
) -> Iterator[ModuleType]:
    """For an ``app`` fixture (``yield from``): the application ``source`` written to
    ``tmp_path / f"{name}.py"`` for worker processes to import, imported here too (so this
    process can enqueue its entries), with ``LEDGER`` naming an empty ``ledger.txt`` beside it."""
    (tmp_path / f"{name}.py").write_text(source)
    (tmp_path / "ledger.txt").touch()
    monkeypatch.setenv("LEDGER", str(tmp_path / "ledger.txt"))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    yield importlib.import_module(name)
    sys.modules.pop(name, None)


@functools.cache
def loopback_tls() -> ssl.SSLContext:
    """The ``verify=`` of the tests' own HTTP clients of loopback servers (plain ``http://``).

    Without one, httpx builds a TLS context for each client, loading the whole CA bundle (~25
    ms of CPU), for connections that never use TLS; the Slack kill soak alone made 16."""
    return ssl.create_default_context()
