"""Wake-ups (``_store/_wakeups``): a ring wakes every waiting task, and a task that was
looking at the store when it rang returns at once from its next wait instead of missing it.

Nothing here waits for time to pass: a wait that must not return is checked with
``anyio.wait_all_tasks_blocked()``, one that must is bounded by ``fail_after``.
"""

from __future__ import annotations

import anyio
import pytest

from agency_runtime._store._wakeups import _REMEMBERED_TASKS, Wakeups

pytestmark = pytest.mark.anyio

FOREVER = 3600.0


async def _waiting(wakeups: Wakeups, returned: list[int], n: int) -> None:
    for i in range(n):
        await wakeups.wait(FOREVER)
        returned.append(i)


async def test_a_ring_wakes_every_waiting_task() -> None:
    wakeups, returned = Wakeups(), []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            for _ in range(3):
                tasks.start_soon(_waiting, wakeups, returned, 1)
            await anyio.wait_all_tasks_blocked()
            assert returned == []
            wakeups.ring()
    assert returned == [0, 0, 0]


async def test_a_ring_while_a_task_looks_elsewhere_ends_its_next_wait_at_once() -> None:
    wakeups = Wakeups()
    with anyio.fail_after(10):
        await wakeups.wait(0)  # a look at the store follows...
        wakeups.ring()  # ...and something rings meanwhile, with nobody waiting
        await wakeups.wait(FOREVER)  # returns at once: that ring is not lost
        returned: list[int] = []
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_waiting, wakeups, returned, 1)
            await anyio.wait_all_tasks_blocked()
            assert returned == []  # another task's first wait waits for the next ring
            wakeups.ring()


async def test_after_returning_at_once_a_task_waits_again() -> None:
    wakeups, returned = Wakeups(), []
    looking, resume = anyio.Event(), anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:

            async def loop() -> None:
                await wakeups.wait(FOREVER)  # woken by the first ring
                looking.set()
                await resume.wait()  # looking elsewhere while the second ring comes
                await _waiting(wakeups, returned, 2)

            tasks.start_soon(loop)
            await anyio.wait_all_tasks_blocked()
            wakeups.ring()
            await looking.wait()
            wakeups.ring()
            resume.set()
            await anyio.wait_all_tasks_blocked()
            assert returned == [0]  # the missed ring ended one wait; the next one waits
            wakeups.ring()
    assert returned == [0, 1]


async def test_it_remembers_a_bounded_number_of_tasks() -> None:
    wakeups = Wakeups()
    async with anyio.create_task_group() as tasks:
        for _ in range(_REMEMBERED_TASKS + 50):
            tasks.start_soon(wakeups.wait, 0)
    assert len(wakeups._seen) == _REMEMBERED_TASKS


async def test_a_ring_after_a_task_began_to_look_ends_even_its_first_wait() -> None:
    wakeups = Wakeups()
    with anyio.fail_after(10):
        wakeups.looking()  # a worker's first claim...
        wakeups.ring()  # ...while which a run is queued
        await wakeups.wait(FOREVER)  # returns at once
