"""Shared pieces of the Slack tests: events, signed requests and an ASGI lifespan driver."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx

from turn_kit.slack import slack_signature

TOKEN = "xoxb-test-token-1234567890"
SECRET = "signing-secret"
BOT = "UBOT"
USER = "U1"
CHANNEL = "C1"
DEADLINE = 20.0
"""Seconds any wait for progress may take before the test fails (a busy machine is slow)."""

_TS = itertools.count(1)


def echo(turn: Any) -> str:
    """A ``respond`` that says what it got and how many earlier turns it recalled."""
    return f"re {turn.input} (after {len(turn.history)})"


def next_ts() -> str:
    """A fresh, increasing Slack message timestamp."""
    return f"1800000000.{next(_TS):06d}"


def message_event(
    text: str,
    *,
    ts: str | None = None,
    channel: str = CHANNEL,
    user: str = USER,
    thread_ts: str | None = None,
    kind: str = "message",
    channel_type: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An Events API ``event_callback`` envelope around a user's message."""
    event: dict[str, Any] = {
        "type": kind,
        "channel": channel,
        "user": user,
        "text": text,
        "ts": ts or next_ts(),
    }
    if thread_ts is not None:
        event["thread_ts"] = thread_ts
    if channel_type is None:
        channel_type = "im" if channel.startswith("D") else "channel"
    if kind == "message":
        event["channel_type"] = channel_type
    event.update(extra)
    return {
        "type": "event_callback",
        "token": "deprecated-verification-token",
        "team_id": "T0001",
        "api_app_id": "A1",
        "event": event,
        "event_id": f"Ev{event['ts'].replace('.', '')}{kind}",
        "event_time": int(time.time()),
    }


def signed_headers(
    body: bytes, *, secret: str = SECRET, at: float | None = None, retry: int | None = None
) -> dict[str, str]:
    """The headers Slack sends with ``body``: signature, timestamp, maybe a retry number."""
    stamp = str(int(time.time() if at is None else at))
    headers = {
        "content-type": "application/json",
        "x-slack-request-timestamp": stamp,
        "x-slack-signature": slack_signature(secret, stamp, body),
    }
    if retry is not None:
        headers["x-slack-retry-num"] = str(retry)
        headers["x-slack-retry-reason"] = "http_timeout"
    return headers


async def post_event(
    client: httpx.AsyncClient, payload: Any, *, retry: int | None = None, url: str = "/"
) -> httpx.Response:
    """POST ``payload`` to the events app the way Slack does (signed)."""
    body = json.dumps(payload).encode()
    return await client.post(url, content=body, headers=signed_headers(body, retry=retry))


@asynccontextmanager
async def lifespan(app: Callable[..., Awaitable[None]]) -> AsyncIterator[None]:
    """Run an ASGI app's lifespan (startup now, shutdown on exit), as a server does."""
    to_app, app_in = anyio.create_memory_object_stream[dict[str, Any]](4)
    app_out, from_app = anyio.create_memory_object_stream[dict[str, Any]](4)

    async def receive() -> dict[str, Any]:
        return await app_in.receive()

    async def send(message: Any) -> None:
        await app_out.send(dict(message))

    async with to_app, app_in, app_out, from_app, anyio.create_task_group() as group:
        group.start_soon(app, {"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
        await to_app.send({"type": "lifespan.startup"})
        with anyio.fail_after(DEADLINE):
            assert (await from_app.receive())["type"] == "lifespan.startup.complete"
        try:
            yield
        finally:
            await to_app.send({"type": "lifespan.shutdown"})
            with anyio.fail_after(DEADLINE):
                assert (await from_app.receive())["type"] == "lifespan.shutdown.complete"


async def eventually(check: Callable[[], Any], what: str, *, within: float = DEADLINE) -> Any:
    """Wait until ``check()`` is truthy (polling; progress, not a fixed time) and return it."""
    with anyio.fail_after(within):
        while True:
            value = check()
            if value:
                return value
            await anyio.sleep(0.01)
    raise AssertionError(what)  # pragma: no cover
