"""``webhook_app``: an ASGI app Telegram can POST updates to.

* The ``X-Telegram-Bot-Api-Secret-Token`` header must equal ``secret_token`` (compared in
  constant time): missing → 401, wrong → 403, and nothing runs.
* Each update is recorded in the store before it is handled, and marked done after; a
  repeated ``update_id`` that is done is answered 200 at once, without a second turn.
* The app answers 200 only once the update was handled (its turn is durable by then); if
  handling fails it answers 500, so Telegram delivers the update again and the turn resumes
  from its journal.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from agency_runtime import InvalidArgumentError, Store
from agency_runtime._store import resolve_store

from .._errors import TurnPausedError
from .._runner import TurnArgs
from ._adapter import TelegramTurnAdapter

__all__ = ["webhook_app"]

logger = logging.getLogger("turn_kit.telegram")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_MAX_BODY = 1 << 20
_NAMESPACE = "telegram-webhook"


async def _reply(send: Send, status: int, body: dict[str, Any]) -> None:
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


async def _body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await receive()
        if event["type"] != "http.request":
            return None
        chunk = event.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY:
            return None
        chunks.append(chunk)
        if not event.get("more_body", False):
            return b"".join(chunks)


def webhook_app(
    adapter: TelegramTurnAdapter,
    *,
    ctx: Any,
    respond: Callable[[TurnArgs], Any],
    secret_token: str,
    store: str | Store | None = None,
) -> ASGIApp:
    """An ASGI app that handles Telegram webhook updates with ``adapter``.

    ``store`` keeps the update ids seen (default: the adapter's store).
    """
    if not isinstance(secret_token, str) or not secret_token:
        raise InvalidArgumentError("webhook_app needs secret_token: the secret set on setWebhook")
    expected = secret_token.encode()
    chosen = store if store is not None else adapter.runner.store

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                if event["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif event["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope.get("method") != "POST":
            await _reply(send, 405, {"ok": False, "description": "POST an update"})
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-telegram-bot-api-secret-token")
        if given is None:
            await _reply(send, 401, {"ok": False, "description": "missing secret token"})
            return
        if not hmac.compare_digest(given, expected):
            await _reply(send, 403, {"ok": False, "description": "wrong secret token"})
            return
        raw = await _body(receive)
        try:
            update = json.loads(raw) if raw is not None else None
        except ValueError:
            update = None
        if not isinstance(update, dict):
            await _reply(send, 400, {"ok": False, "description": "the body is not a JSON update"})
            return
        store_ = resolve_store(chosen)
        update_id = update.get("update_id")
        key = str(update_id) if isinstance(update_id, int | str) else None
        if key is not None and await store_.get_document(_NAMESPACE, key) in ("done", "paused"):
            await _reply(send, 200, {"ok": True, "duplicate": True})
            return
        if key is not None:
            await store_.put_document(_NAMESPACE, key, "accepted")
        try:
            outcome = await adapter.handle(ctx, payload=update, respond=respond)
        except TurnPausedError as paused:
            # Accepted and waiting for a human: answering the interrupts finishes the turn.
            if key is not None:
                await store_.put_document(_NAMESPACE, key, "paused")
            await _reply(
                send, 200, {"ok": True, "status": "paused", "run_id": paused.result.run_id}
            )
            return
        except Exception:
            logger.exception("Telegram update %s failed; Telegram will deliver it again", key)
            await _reply(send, 500, {"ok": False, "description": "the update failed"})
            return
        if key is not None:
            await store_.put_document(_NAMESPACE, key, "done")
        await _reply(send, 200, {"ok": True, "status": outcome.status, "reason": outcome.reason})

    return app
