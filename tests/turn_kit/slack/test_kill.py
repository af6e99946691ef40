"""A kill soak of the Slack events app: real SIGKILLs while Slack retries.

The events app runs under uvicorn in a child process (``events_child.py``) on a SQLite store
file, posting through :class:`FakeSlackApi` on loopback. Four users each hold a thread in a
direct message and send their messages one after another, each once its reply arrived, as
people do; Slack's side retries every event that got no 200 (connection refused while the
server is down, or a slow answer), and sometimes retries one that did get its 200, as Slack
does when the answer was slow. Meanwhile the server is SIGKILLed at random moments —
before, while and after the turns post their acknowledgement and their three reply chunks —
and started again.

What must hold: every message got exactly one acknowledgement and exactly one copy of each
reply chunk, in order, in its thread (0 second replies); each turn recalled exactly the turns
before it in its thread; each thread's memory holds exactly one item per turn (0 duplicates).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from agency_runtime import SqliteStore, agency
from tests.forked import RUNTIME_IMPORTS, ForkedProcess, ForkServer
from tests.support import loopback_tls
from turn_kit import agency_ctx, conversation_key, conversation_tag
from turn_kit.slack import FakeSlackApi

from . import events_child
from .support import eventually, message_event, signed_headers

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CHILD = Path(events_child.__file__)
USERS = 4
TURNS = 4  # per user: 16 turns in all
MIN_KILLS = 10
DEADLINE = 90.0


CHILD_IMPORTS = (
    *RUNTIME_IMPORTS,
    "uvicorn",
    "uvicorn.lifespan.on",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.auto",
    "turn_kit",
    "turn_kit.slack",
    "agency_runtime._memory",
    "aiohttp",
    "slack_sdk.web.async_client",
)
"""What the events app's child imports: its server's (``uvicorn.Config.load``; the websockets
protocol's chooser, which takes whichever websockets package is installed, or none), and what
its first turn imports on demand (the memory, and the Slack transport's ``AsyncWebClient`` on
aiohttp). The soak starts ~40 children; forked from the suite's fork server, which holds only
the runtime, each imported these anew: ~0.13 s of CPU from fork to serving, and another
~0.07 s at its first turn (aiohttp), against ~0.07 s in all forked from a server that
imported them once."""


@pytest.fixture(scope="module")
def soak_forks() -> Iterator[ForkServer]:
    """A fork server that has imported the child's modules once (its children end with it)."""
    with ForkServer(preload=CHILD_IMPORTS) as server:
        yield server


@pytest.fixture
def anyio_backend() -> str:
    # The subject is the child process (uvicorn serves on asyncio); the test only drives it.
    return "asyncio"


class Server:
    """The events app's child process, killed and started again by the soak."""

    def __init__(self, fork_server: ForkServer, here: Path, url: str, api: FakeSlackApi) -> None:
        self.fork_server, self.here, self.url, self.api = fork_server, here, url, api
        self.child: ForkedProcess | None = None
        self.port: int | None = None
        self.starts = 0
        self.kills = 0

    async def start(self) -> None:
        self.starts += 1
        ready = self.here / f"ready{self.starts}"
        self.child = self.fork_server.start(
            "script", CHILD, self.url, self.api.base_url, str(ready),
            output=self.here / f"child{self.starts}",
        )  # fmt: skip
        with anyio.fail_after(30):
            while not ready.exists():
                if self.child.poll() is not None:
                    err = (self.here / f"child{self.starts}.err").read_text()
                    pytest.fail(f"the events app exited ({self.child.returncode}):\n{err}")
                await anyio.sleep(0.02)
        self.port = int(ready.read_text())

    def kill(self) -> None:
        assert self.child is not None
        self.port = None
        self.child.kill()
        self.child.wait(timeout=10)
        self.kills += 1

    @property
    def url_now(self) -> str | None:
        return None if self.port is None else f"http://127.0.0.1:{self.port}/slack/events"


async def deliver(server: Server, payload: dict[str, Any], rng: random.Random) -> None:
    """Deliver one event as Slack does: retry (``X-Slack-Retry-Num``) until a 200 comes, and
    now and then once more after it."""
    body = json.dumps(payload).encode()
    retry: int | None = None
    async with httpx.AsyncClient(
        timeout=3.0, verify=loopback_tls()
    ) as client:  # Slack waits 3 s for the answer
        while True:
            url = server.url_now
            if url is not None:
                try:
                    response = await client.post(
                        url, content=body, headers=signed_headers(body, retry=retry)
                    )
                    if response.status_code == 200:
                        break
                    assert response.status_code >= 500, response.text  # refused: a test bug
                except httpx.HTTPError:
                    pass
            retry = 1 if retry is None else retry + 1
            await anyio.sleep(0.05 + 0.1 * rng.random())
        if rng.random() < 0.3:  # Slack retries an event whose 200 it did not see in time
            url = server.url_now
            if url is not None:
                try:
                    await client.post(url, content=body, headers=signed_headers(body, retry=1))
                except httpx.HTTPError:
                    pass


def bot_texts(api: FakeSlackApi, channel: str, root: str) -> list[str]:
    return [m["text"] for m in api.replies(channel, root)]


def expected_for(n: str, after: int) -> list[str]:
    return [f"ack {n}", *events_child.reply_for(n, after).split("\n")]


async def test_sigkills_while_slack_retries_give_one_reply_each(
    soak_forks: ForkServer, tmp_path: Path
) -> None:
    rng = random.Random(29)
    url = f"sqlite:///{tmp_path}/soak.db"
    api = FakeSlackApi(token=events_child.TOKEN, bot_user_id=events_child.BOT).start()
    server = Server(soak_forks, tmp_path, url, api)
    store = SqliteStore(tmp_path / "soak.db")
    sent = anyio.Event()
    kills: list[int] = []  # how many posts the Slack side had seen at each kill
    roots: dict[str, str] = {}

    async def user(index: int) -> None:
        channel = f"D{index}"
        for turn in range(TURNS):
            n = f"{index}.{turn}"
            ts = f"1800000{index:03d}.{turn + 1:06d}"
            root = roots.setdefault(channel, ts)
            payload = message_event(
                f"msg {n}", ts=ts, channel=channel, thread_ts=None if turn == 0 else root
            )
            await deliver(server, payload, rng)
            # A person waits for the reply before writing again.
            await eventually(
                lambda root=root, want=4 * (turn + 1): len(bot_texts(api, channel, root)) >= want,
                f"the reply to msg {n}",
                within=DEADLINE,
            )

    async def killer() -> None:
        while not sent.is_set() or server.kills < MIN_KILLS:
            # Kill just after a post the turn has not journaled yet, or after a while.
            target = len(api.posts) + rng.randint(1, 5)
            with anyio.move_on_after(0.1 + 0.6 * rng.random()):
                while len(api.posts) < target:  # noqa: ASYNC110 - the fake's HTTP thread posts
                    await anyio.sleep(0.002)
            server.kill()
            await server.start()
            kills.append(len(api.posts))

    try:
        await server.start()
        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as group:
                group.start_soon(killer)
                async with anyio.create_task_group() as users:
                    for index in range(1, USERS + 1):
                        users.start_soon(user, index)
                sent.set()
        # Let the last server finish whatever it holds, then look.
        with anyio.fail_after(DEADLINE):
            while True:
                runs = await agency.runs.list(store=store, limit=1000)
                if len(runs) == USERS * TURNS and all(r.status == "completed" for r in runs):
                    break
                await anyio.sleep(0.05)
        assert server.kills >= MIN_KILLS
        assert len(set(kills)) >= MIN_KILLS // 2, kills  # kills landed at different moments
        ctx = agency_ctx(store)
        for index in range(1, USERS + 1):
            channel = f"D{index}"
            root = roots[channel]
            expected = [line for turn in range(TURNS)
                        for line in expected_for(f"{index}.{turn}", turn)]  # fmt: skip
            assert bot_texts(api, channel, root) == expected, f"thread {channel}"
            tag = conversation_tag(
                events_child.NAMESPACE,
                {"transport": "slack", "id": conversation_key(channel, root)},
            )
            items = await ctx.memory.recall("", tags=[tag], limit=100)
            assert len(items) == TURNS, f"memory of {channel}"
    finally:
        if server.child is not None:
            server.kill()
        api.stop()
        store.close()
