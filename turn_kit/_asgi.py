"""The bits of ASGI the adapters' HTTP endpoints share: the types, a JSON answer, a bounded body.

The Telegram webhook and the Slack events app are plain ASGI callables (no framework), so
any ASGI server serves them; what they answer and read is written here once.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["MAX_BODY", "ASGIApp", "Receive", "Scope", "Send", "read_body", "reply_json"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY = 1 << 20
"""The largest request body an endpoint reads (1 MiB; Slack's and Telegram's are far smaller)."""


async def reply_json(send: Send, status: int, body: dict[str, Any]) -> None:
    """Answer the request with ``status`` and ``body`` as JSON."""
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def read_body(receive: Receive, limit: int = MAX_BODY) -> bytes | None:
    """The request's whole body, or ``None`` when it is over ``limit`` bytes or the client
    went away first."""
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await receive()
        if event["type"] != "http.request":
            return None
        chunk = event.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not event.get("more_body", False):
            return b"".join(chunks)
