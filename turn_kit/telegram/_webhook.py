"""``webhook_app``: an ASGI app Telegram can POST updates to.

* The ``X-Telegram-Bot-Api-Secret-Token`` header must equal ``secret_token`` (compared in
  constant time): missing → 401, wrong → 403, and nothing runs.
* A body that is not a JSON object (invalid JSON, nested too deeply to parse, larger than
  1 MiB, a list, …) → 400, and nothing runs. Lone surrogates in its strings are read as
  U+FFFD (see :func:`~turn_kit.telegram.read_telegram_message`), so they never fail a turn.
* No state of its own: deduplication is the turn's run id (chat + topic + message id), so a
  redelivered update whose turn completed is answered 200 (``"duplicate": true``) without a
  second turn, and two bots, or Telegram restarting its ``update_id`` counter, never shadow
  each other's messages. A turn paused on an interrupt answers 200 (``"status": "paused"``).
* Several server processes may share one store (behind a load balancer): each update takes
  its place in its conversation's store-wide queue before anything else
  (:meth:`~turn_kit.telegram.TelegramTurnAdapter.queued`), so turns of a conversation run
  one at a time in the order the processes received them, and an update delivered to two
  processes is answered once (the second waits for the first, then answers ``duplicate``).
  See :mod:`turn_kit._runner` for exactly what is guaranteed. On ``lifespan.startup`` the
  app opens the store, so the first update does not pay for connecting before it queues.
* The app answers 200 only once the update was handled (its turn is durable by then); if
  handling fails it answers 500, so Telegram delivers the update again and the turn resumes
  from its journal — until the turn's run has failed
  :data:`~turn_kit.telegram._adapter.MAX_ATTEMPTS` times (counted in the store): then it
  answers 200 (``"status": "failed"``) and logs the update as given up, so a poison update
  stops being redelivered.
"""

from __future__ import annotations

import hmac
import json
import logging
import warnings
from collections.abc import Callable
from typing import Any

from agency_runtime import InvalidArgumentError, Store, open_store

from .._asgi import ASGIApp, Receive, Scope, Send, read_body, reply_json
from .._errors import TurnPausedError
from .._runner import TurnArgs
from ._adapter import MAX_ATTEMPTS, TelegramTurnAdapter, given_up
from ._redact import install_token_redaction

__all__ = ["webhook_app"]

logger = logging.getLogger("turn_kit.telegram")


def _update(raw: bytes | None) -> dict[str, Any] | None:
    """The update in a request body, or ``None`` when it is not a JSON object."""
    if raw is None:
        return None
    try:
        update = json.loads(raw)
    except (ValueError, RecursionError):  # invalid (or non-UTF-8) JSON, or nested too deep
        return None
    return update if isinstance(update, dict) else None


def _label(update: dict[str, Any]) -> str:
    """The update's id for a log line (never more than a short, printable text)."""
    update_id = update.get("update_id")
    if isinstance(update_id, bool) or update_id is None:
        return ascii(update_id)
    if isinstance(update_id, int):
        return str(update_id) if abs(update_id) < 10**30 else "<huge>"
    if isinstance(update_id, str):
        return ascii(update_id[:40])
    return f"<{type(update_id).__name__}>"


def webhook_app(
    adapter: TelegramTurnAdapter,
    *,
    ctx: Any,
    respond: Callable[[TurnArgs], Any],
    secret_token: str,
    store: str | Store | None = None,
) -> ASGIApp:
    """An ASGI app that handles Telegram webhook updates with ``adapter`` (see the module
    docstring for the answers it gives).

    ``store`` is deprecated and ignored: the app keeps no state of its own; a turn's run (in
    the adapter's store) is what makes a redelivered update a duplicate.
    """
    if not isinstance(secret_token, str) or not secret_token:
        raise InvalidArgumentError("webhook_app needs secret_token: the secret set on setWebhook")
    if store is not None:
        warnings.warn(
            "webhook_app(store=...) is ignored: updates are deduplicated by their turn's run "
            "in the adapter's store",
            DeprecationWarning,
            stacklevel=2,
        )
    install_token_redaction()
    expected = secret_token.encode()

    async def answer(update: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Handle one update: the HTTP status and JSON body to answer Telegram with."""
        label = _label(update)
        run_id: str | None = None
        try:
            # Queue first (before the duplicate check, the typing indicator and the run), so
            # the conversation's turns run in the order the updates were received, whichever
            # server process received them; a duplicate waits for the original, then finds it.
            async with adapter.queued(ctx, payload=update) as queued_id:
                run_id = queued_id
                record = None if run_id is None else await adapter.turn_record(run_id)
                if record is not None and (record.status == "paused" or given_up(record)):
                    # a redelivery of a turn waiting for a human, or of one given up
                    return 200, {"ok": True, "duplicate": True, "status": record.status,
                                 "run_id": run_id}  # fmt: skip
                if record is not None and record.status == "completed":
                    return 200, {"ok": True, "duplicate": True, "status": "handled",
                                 "run_id": run_id}  # fmt: skip
                outcome = await adapter.handle(ctx, payload=update, respond=respond)
        except TurnPausedError as paused:
            # Accepted and waiting for a human: answering the interrupts finishes the turn.
            return 200, {"ok": True, "status": "paused", "run_id": paused.result.run_id}
        except Exception:
            record = None
            if run_id is not None:
                try:
                    record = await adapter.turn_record(run_id)
                except Exception:  # the store is failing too: let Telegram retry
                    record = None
            if record is not None and given_up(record):
                logger.exception(
                    "Telegram update %s failed %d times; giving it up (run %s is %s)",
                    label, record.attempts, run_id, record.status,
                )  # fmt: skip
                return 200, {"ok": True, "status": record.status, "run_id": run_id,
                             "attempts": record.attempts}  # fmt: skip
            attempts = "?" if record is None else str(record.attempts)
            logger.exception(
                "Telegram update %s failed (attempt %s of %d); Telegram will deliver it again",
                label, attempts, MAX_ATTEMPTS,
            )  # fmt: skip
            return 500, {"ok": False, "description": "the update failed"}
        return 200, {"ok": True, "status": outcome.status, "reason": outcome.reason}

    async def warm_up() -> None:
        """Open the store (and its connections) before the first update arrives, so that
        update's ticket is not taken later than its arrival by a connect."""
        try:
            await open_store(adapter.runner.store).lock_holder("turn-kit:warm-up")
        except Exception as exc:  # the store may come up later; every update retries it
            logger.warning("Telegram webhook: the store is not reachable yet: %s", exc)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                if event["type"] == "lifespan.startup":
                    await warm_up()
                    await send({"type": "lifespan.startup.complete"})
                elif event["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope.get("method") != "POST":
            await reply_json(send, 405, {"ok": False, "description": "POST an update"})
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-telegram-bot-api-secret-token")
        if given is None:
            await reply_json(send, 401, {"ok": False, "description": "missing secret token"})
            return
        if not hmac.compare_digest(given, expected):
            await reply_json(send, 403, {"ok": False, "description": "wrong secret token"})
            return
        update = _update(await read_body(receive))
        if update is None:
            await reply_json(
                send, 400, {"ok": False, "description": "the body is not a JSON update"}
            )
            return
        status, body = await answer(update)
        await reply_json(send, status, body)

    return app
