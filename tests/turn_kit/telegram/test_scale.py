"""Turns scale out: several webhook servers, or several pollers, on one store.

The children are real processes (forks of the fork server, ``scale_app.py``) sharing one
store (a SQLite file; also PostgreSQL when ``AGENCY_TEST_POSTGRES`` is set) and replying
through one :class:`FakeBotApi` on loopback. What they prove:

* webhook servers behind a "load balancer": every update answered once (also one delivered
  to both servers), and each conversation's replies in the order the updates were sent, each
  turn recalling every earlier one;
* pollers: one leads at a time (no 409 from the fake, which ends a waiting ``getUpdates``
  when another arrives, as Telegram does); when the leader is SIGKILLed in the middle of a
  turn, the standby takes over and no update is lost or answered twice.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from agency_runtime import MemoryStore, Store, open_store
from tests.forked import ForkedProcess, ForkServer
from tests.support import loopback_tls
from tests.turn_kit.telegram import scale_app
from turn_kit import TurnArgs, agency_ctx
from turn_kit.telegram import (
    BotApiTransport,
    FakeBotApi,
    TelegramPoller,
    create_telegram_turn_adapter,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

APP = Path(scale_app.__file__)
TOKEN, OWNER = scale_app.TOKEN, int(scale_app.OWNER)
A, B = 7, 9  # the two conversations: topics of the owner chat
LEADER = f"turn-kit:telegram-poller:{TOKEN.partition(':')[0]}"
DEADLINE = 20.0  # seconds any wait of these tests may take before it fails


@pytest.fixture
def anyio_backend() -> str:
    # The subject is the child processes; the test's own loop only drives them (once).
    return "asyncio"


def _backends() -> list[Any]:
    backends = [pytest.param("sqlite", id="sqlite")]
    if os.environ.get("AGENCY_TEST_POSTGRES"):
        backends.append(pytest.param("postgres", id="postgres"))
    return backends


@pytest.fixture(params=_backends())
async def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a fresh store the children share (created here first)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/shared.db"
    else:
        dsn = os.environ["AGENCY_TEST_POSTGRES"]
        schema = f"tk_scale_{secrets.token_hex(4)}"
        url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    store = open_store(url)
    await store.lock_holder(LEADER)  # the schema exists before the children start
    try:
        yield url
    finally:
        store.close()


def start(
    fork_server: ForkServer, here: Path, mode: str, url: str, api: FakeBotApi
) -> tuple[ForkedProcess, Path]:
    here.mkdir(exist_ok=True)
    child = fork_server.start(
        "script", APP, mode, url, api.base_url, str(here / "ready"), output=here / "log"
    )
    return child, here


async def until(what: str, check: Callable[[], Any], children: list[ForkedProcess]) -> Any:
    """Poll ``check()`` until truthy; fail after :data:`DEADLINE` or if a child exited."""
    deadline = time.monotonic() + DEADLINE
    while True:
        value = check()
        if value:
            return value
        for child in children:
            if child.poll() is not None:
                _, err = child.communicate(timeout=5)
                pytest.fail(f"a child exited ({child.returncode}) while waiting for {what}:\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await anyio.sleep(0.02)


def ready(here: Path) -> str | None:
    file = here / "ready"
    return file.read_text() if file.exists() else None


def tickets(started: list[tuple[ForkedProcess, Path]]) -> int:
    """How many lock tickets the children took so far (``scale_app.TICKETS_FILE``)."""
    total = 0
    for _, here in started:
        file = here / scale_app.TICKETS_FILE
        if file.exists():
            total += file.read_text().count("\n")
    return total


def replies(api: FakeBotApi) -> dict[int | None, list[str]]:
    out: dict[int | None, list[str]] = {}
    for message in api.sent:
        out.setdefault(message["message_thread_id"], []).append(message["text"])
    return out


def push(api: FakeBotApi, thread: int, text: str) -> dict[str, Any]:
    return api.push_message(OWNER, text, message_thread_id=thread, is_topic_message=True)


def stop(children: list[ForkedProcess]) -> None:
    # One at a time: the fork server reports exits as lines, and ForkServer._next can leave a
    # second line that arrived with the first in its read buffer, unseen by select().
    for child in children:
        child.kill()
        child.wait(timeout=10)


# -- webhook servers -----------------------------------------------------------------------


async def test_webhook_servers_on_one_store_answer_once_in_arrival_order(
    shared_store: str, fork_server: ForkServer, tmp_path: Path
) -> None:
    plan = [  # (conversation, text, servers it is delivered to), in arrival order
        (A, "slow a1", [0]),
        (B, "slow b1", [1]),
        (A, "a2", [1]),
        (B, "b2", [0]),
        (A, "slow a3", [0, 1]),  # delivered to both servers at once
        (B, "b3", [1]),
        (A, "a4", [1]),
        (B, "slow b4", [0]),
        (A, "a5", [0]),
    ]
    with FakeBotApi(token=TOKEN) as api:
        started = [start(fork_server, tmp_path / f"w{i}", "webhook", shared_store, api)
                   for i in range(2)]  # fmt: skip
        children = [child for child, _ in started]
        try:
            ports = [int(await until("a server", partial(ready, h), children))
                     for _, h in started]  # fmt: skip
            updates = [push(api, thread, text) for thread, text, _ in plan]
            answers: list[tuple[str, int, dict[str, Any]]] = []
            headers = {"X-Telegram-Bot-Api-Secret-Token": scale_app.SECRET}
            async with httpx.AsyncClient(timeout=DEADLINE, verify=loopback_tls()) as client:

                async def post(port: int, update: dict[str, Any], text: str) -> None:
                    url = f"http://127.0.0.1:{port}/"
                    response = await client.post(url, json=update, headers=headers)
                    answers.append((text, response.status_code, response.json()))

                with anyio.fail_after(DEADLINE):
                    async with anyio.create_task_group() as group:
                        for (_, text, servers), update in zip(plan, updates, strict=True):
                            queued = tickets(started) + len(servers)
                            for server in servers:
                                group.start_soon(post, ports[server], update, text)
                            # The next update arrives once this one took its place in the
                            # queue (one ticket per server it went to), not after a fixed
                            # time, which a busy machine would outrun.
                            await until(
                                f"the ticket of {text!r}",
                                lambda n=queued: tickets(started) >= n,
                                children,
                            )
        finally:
            stop(children)
        sent = replies(api)
    assert {status for _, status, _ in answers} == {200}, answers
    both = [body for text, _, body in answers if text == "slow a3"]
    assert sorted(bool(body.get("duplicate")) for body in both) == [False, True], both
    assert all(body["status"] == "handled" for _, _, body in answers), answers
    for thread in (A, B):
        texts = [text for conversation, text, _ in plan if conversation == thread]
        expected = [f"re {text} (after {n})" for n, text in enumerate(texts)]
        assert sent[thread] == expected  # one reply each, in arrival order, each after the last


# -- pollers -------------------------------------------------------------------------------


async def holder_pid(store: Store) -> int | None:
    holder = await store.lock_holder(LEADER)
    return None if holder is None else int(holder[1].split(":")[1])


async def test_pollers_on_one_store_take_over_from_a_killed_leader(
    shared_store: str, fork_server: ForkServer, tmp_path: Path
) -> None:
    store = open_store(shared_store)
    with FakeBotApi(token=TOKEN, long_poll_cap=1.0) as api:
        first, first_dir = start(fork_server, tmp_path / "p1", "poll", shared_store, api)
        children = [first]
        try:
            await until("the first poller", lambda: ready(first_dir), children)
            leader_pid = None
            deadline = time.monotonic() + DEADLINE
            while leader_pid != first.pid and time.monotonic() < deadline:
                leader_pid = await holder_pid(store)
                await anyio.sleep(0.02)
            assert leader_pid == first.pid
            second, second_dir = start(fork_server, tmp_path / "p2", "poll", shared_store, api)
            children.append(second)
            await until("the second poller", lambda: ready(second_dir), children)

            for thread, text in ((A, "a1"), (B, "b1"), (A, "a2")):
                push(api, thread, text)
            await until("three replies", lambda: len(api.sent) == 3, children)
            push(api, A, "hang")  # the leader hangs in the middle of this turn
            hang = tmp_path / scale_app.HANG_FILE
            await until("the hang", hang.exists, children)
            assert hang.read_text() == str(first.pid)  # the leader, not the standby
            push(api, B, "b2")
            push(api, A, "a3")
            await anyio.sleep(0.3)
            assert len(api.sent) == 3  # the standby does not poll while the leader lives
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
            children.remove(first)
            await until("every reply", lambda: len(api.sent) >= 6, children)
            await anyio.sleep(0.3)  # nothing more arrives
            assert await holder_pid(store) == second.pid
        finally:
            stop(children)
        sent = replies(api)
        conflicts = [c for c in api.calls if c["method"] == "getUpdates" and c["status"] == 409]
    assert sent == {
        A: ["re a1 (after 0)", "re a2 (after 1)", "re hang (after 2)", "re a3 (after 3)"],
        B: ["re b1 (after 0)", "re b2 (after 1)"],
    }
    assert conflicts == []  # one getUpdates consumer at a time


# -- in one process: handing the lead over, and 409 Conflict ---------------------------------


def reply(turn: TurnArgs) -> str:
    return f"re {turn.input}"


def poller(api: FakeBotApi, store: Store, transport: BotApiTransport) -> TelegramPoller:
    adapter = create_telegram_turn_adapter(
        namespace="scale", owner_chat=str(OWNER), transport=transport, store=store
    )
    return TelegramPoller(
        adapter, ctx=agency_ctx(store), respond=reply, token=TOKEN, base_url=api.base_url,
        poll_timeout=0.2, leader_lease=1.0,
    )  # fmt: skip


async def bot_api(api: FakeBotApi, method: str, **params: Any) -> None:
    async with httpx.AsyncClient(verify=loopback_tls()) as client:
        response = await client.post(f"{api.base_url}/bot{TOKEN}/{method}", json=params)
        assert response.json()["ok"] is True


async def test_a_stopped_leader_hands_over_and_a_409_is_backed_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="turn_kit.telegram")
    store = MemoryStore()
    with FakeBotApi(token=TOKEN, long_poll_cap=0.2) as api:
        async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
            one, two = poller(api, store, transport), poller(api, store, transport)
            stop_one, stop_two = anyio.Event(), anyio.Event()
            with anyio.fail_after(DEADLINE):
                async with anyio.create_task_group() as group:
                    group.start_soon(lambda: one.run(stop=stop_one, error_backoff=0.05))
                    await anyio.wait_all_tasks_blocked()
                    group.start_soon(lambda: two.run(stop=stop_two, error_backoff=0.05))
                    push(api, A, "first")
                    await until("the first reply", lambda: len(api.sent) == 1, [])
                    await bot_api(api, "setWebhook", url="https://example.invalid/hook")
                    await until("a 409", lambda: any(c["status"] == 409 for c in api.calls), [])
                    await bot_api(api, "deleteWebhook")
                    stop_one.set()  # the lead passes to the other poller
                    push(api, B, "second")
                    await until("the second reply", lambda: len(api.sent) == 2, [])
                    stop_two.set()
    assert [m["text"] for m in api.sent] == ["re first", "re second"]
    assert "conflicts with a webhook or another getUpdates consumer (409)" in caplog.text
    assert caplog.text.count("leading the pollers") == 2
