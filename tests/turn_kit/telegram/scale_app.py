"""The child processes of ``test_scale.py``: a Telegram webhook server or a poller, on a store
shared with the other children, replying through :class:`~turn_kit.telegram.FakeBotApi`.

    python scale_app.py webhook STORE_URL API_BASE_URL READY_FILE
    python scale_app.py poll STORE_URL API_BASE_URL READY_FILE

``webhook`` serves :func:`~turn_kit.telegram.webhook_app` over HTTP/1.1 on an ephemeral
loopback port (a minimal server: one request per connection) and writes the port to
READY_FILE; ``poll`` runs :meth:`~turn_kit.telegram.TelegramPoller.run` (a one-second leader
lease) and writes its pid to READY_FILE. Both run until killed.

The reply is ``re <text> (after <n>)``, ``n`` the number of earlier turns the conversation's
memory recalled. A message ``slow …`` takes :data:`SLOW` seconds to answer; a message ``hang``
makes the first process that answers it write its pid to ``HANG_FILE`` (in the directory
above READY_FILE's, shared by the children) and hang there until it is killed — later
processes answer it normally.

Each ticket a conversation's lock queue gives this process is reported as a line of
``TICKETS_FILE`` (beside READY_FILE), so the test sends the next update only once the last
one has taken its place in the queue: "arrival order" is then the order the updates were
sent, however slowly a busy machine runs the servers.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from agency_runtime import Store, open_store
from turn_kit import TurnArgs, agency_ctx
from turn_kit.telegram import (
    BotApiTransport,
    TelegramPoller,
    create_telegram_turn_adapter,
    webhook_app,
)

TOKEN = "4242:scale-secret"
OWNER = "-1001"
"""The owner chat: a forum supergroup; its topics are the test's conversations."""
SECRET = "hook"
SLOW = 0.15
NAMESPACE = "scale"
HANG_FILE = "hang.pid"
TICKETS_FILE = "tickets"


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader never sees half of it."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    part.replace(path)


def make_respond(here: Path) -> Any:
    async def respond(turn: TurnArgs) -> str:
        text = turn.input
        if text.startswith("slow"):
            await anyio.sleep(SLOW)
        hang = here / HANG_FILE
        if text == "hang" and not hang.exists():
            atomic_write(hang, str(os.getpid()))
            await anyio.sleep(3600)  # until SIGKILL
        return f"re {text} (after {len(turn.history)})"

    return respond


async def serve_http(app: Any, ready: Path) -> None:
    """Serve the ASGI ``app`` on 127.0.0.1 (one request per connection)."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def handle(stream: anyio.abc.ByteStream) -> None:
        async with stream:
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    data += await stream.receive()
                head, _, body = data.partition(b"\r\n\r\n")
                request_line, *lines = head.split(b"\r\n")
                method, path, _ = request_line.split(b" ", 2)
                headers = []
                for line in lines:
                    key, _, value = line.partition(b":")
                    headers.append((key.strip().lower(), value.strip()))
                length = int(dict(headers).get(b"content-length", b"0"))
                while len(body) < length:
                    body += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ValueError):
                return
            scope = {
                "type": "http",
                "method": method.decode(),
                "path": path.decode(),
                "headers": headers,
            }
            answer: dict[str, Any] = {"status": 500, "headers": [], "body": b""}

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(event: Any) -> None:
                if event["type"] == "http.response.start":
                    answer["status"], answer["headers"] = event["status"], event["headers"]
                else:
                    answer["body"] += event.get("body", b"")

            await app(scope, receive, send)
            lines_out = [f"HTTP/1.1 {answer['status']} X".encode()]
            lines_out += [k + b": " + v for k, v in answer["headers"]]
            lines_out.append(b"connection: close")
            await stream.send(b"\r\n".join(lines_out) + b"\r\n\r\n" + answer["body"])

    startup = [{"type": "lifespan.startup"}]
    started = anyio.Event()

    async def lifespan_receive() -> dict[str, Any]:
        if startup:
            return startup.pop()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def lifespan_send(event: Any) -> None:
        started.set()

    async with anyio.create_task_group() as group:
        group.start_soon(app, {"type": "lifespan"}, lifespan_receive, lifespan_send)
        await started.wait()  # as an ASGI server does: serve once the app has started
        atomic_write(ready, str(port))
        await listener.serve(handle)


def reporting_tickets(url: str, tickets: Path) -> Store:
    """The store at ``url``, writing a line to ``tickets`` for every lock ticket it gives."""
    store = open_store(url)
    enqueue = store.enqueue_lock

    async def enqueue_lock(name: str, owner: str, lease_seconds: float) -> int:
        ticket = await enqueue(name, owner, lease_seconds)
        with tickets.open("a") as out:
            out.write(f"{name} {ticket}\n")
        return ticket

    store.enqueue_lock = enqueue_lock  # type: ignore[method-assign]
    return store


async def main(mode: str, url: str, api: str, ready: Path) -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"{os.getpid()} %(name)s %(message)s"
    )
    store = reporting_tickets(url, ready.with_name(TICKETS_FILE))
    adapter = create_telegram_turn_adapter(
        namespace=NAMESPACE,
        owner_chat=OWNER,
        transport=BotApiTransport(TOKEN, base_url=api),
        store=store,
        typing=True,
    )
    ctx = agency_ctx(store)
    respond = make_respond(ready.parent.parent)
    if mode == "webhook":
        await serve_http(webhook_app(adapter, ctx=ctx, respond=respond, secret_token=SECRET), ready)
        return
    poller = TelegramPoller(
        adapter, ctx=ctx, respond=respond, token=TOKEN, base_url=api, poll_timeout=1,
        leader_lease=1.0,
    )  # fmt: skip
    atomic_write(ready, str(os.getpid()))
    await poller.run(error_backoff=0.05)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]))
