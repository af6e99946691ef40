"""``slack_events_app``: an ASGI app for Slack's Events API that answers within 3 seconds.

Slack resends an event it did not get a 2xx for within 3 seconds (``X-Slack-Retry-Num``),
so a bot that answers only after its model did sends duplicate replies. This app:

* checks ``X-Slack-Signature`` (v0, constant time, a 5-minute window): missing or wrong →
  401 and nothing runs; a body that is not a JSON object (or over 1 MiB) → 400;
* answers ``url_verification`` with its ``challenge``;
* for an ``event_callback``, reads the message and either skips it (200, ``"status":
  "skipped"`` with the reason: bots, its own messages, edits, channels not allowed, …) or
  **stores its turn as a queued run and answers 200** (``"status": "queued"``) — one store
  write, then the answer. The run id is the turn's (channel, thread, message ts), so Slack's
  retries, and a mention's ``message`` and ``app_mention`` events, find the same run: one
  turn, one reply. If the run cannot be stored (the store is down) it answers 500 and Slack
  retries;
* during its ASGI lifespan it runs a :class:`~agency_runtime.Worker` on the adapter's queue
  (``worker=True``), which runs the turns: a process killed mid-turn leaves the run to the
  worker of the next process (after the run's lease, ``lease`` seconds), which resumes it
  from its journal without posting any chunk twice. With ``worker=False`` run workers
  yourself: ``agency worker --queue turn-kit-slack-<namespace> --import <module>``, the
  module building this app (so the worker knows the adapter and ``respond``).

On shutdown the app's worker drains: running turns stop after their next step and go back
to the queue for the next worker. Other event types (``app_rate_limited``, …) are answered
200 and ignored.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import anyio

from agency_runtime import InvalidArgumentError, Worker, open_store

from .._asgi import ASGIApp, Receive, Scope, Send, read_body, reply_json
from .._ctx import agency_ctx
from .._runner import TurnArgs
from ._adapter import SlackTurnAdapter
from ._parse import verify_slack_signature
from ._queued import Bound, register

__all__ = ["slack_events_app"]

logger = logging.getLogger("turn_kit.slack")


_DRAIN_SECONDS = 10.0


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _seconds(value: object, what: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidArgumentError(f"slack_events_app: {what} must be seconds > 0, got {value!r}")
    return float(value)


def slack_events_app(
    adapter: SlackTurnAdapter,
    *,
    signing_secret: str,
    respond: Callable[[TurnArgs], Any],
    ctx: Any = None,
    worker: bool = True,
    concurrency: int = 8,
    lease: float = 30.0,
    poll: float = 1.0,
) -> ASGIApp:
    """An ASGI app serving Slack's Events API with ``adapter`` (see the module docstring).

    ``signing_secret``: the app's Signing Secret (Basic Information page). ``respond`` and
    ``ctx`` are what each turn runs with (``ctx`` defaults to :func:`~turn_kit.agency_ctx`).
    ``worker``: run a worker for the turns during the app's lifespan, with ``concurrency``
    turns at once, claims lasting ``lease`` seconds and a look at the store every ``poll``
    seconds when no wake-up comes.
    """
    if not isinstance(signing_secret, str) or not signing_secret:
        raise InvalidArgumentError(
            "slack_events_app needs signing_secret: the Signing Secret of your Slack app"
        )
    if not isinstance(adapter, SlackTurnAdapter):
        raise InvalidArgumentError(
            "slack_events_app needs an adapter made with create_slack_turn_adapter(...), got "
            f"{type(adapter).__name__}"
        )
    if not callable(respond):
        raise InvalidArgumentError("slack_events_app needs respond: a callable taking the turn")
    if not isinstance(worker, bool):
        raise InvalidArgumentError(
            f"slack_events_app: worker must be True or False, got {worker!r}"
        )
    lease, poll = _seconds(lease, "lease"), _seconds(poll, "poll")
    register(adapter.namespace, Bound(adapter, agency_ctx() if ctx is None else ctx, respond))
    store = adapter.runner.store
    turns = (
        Worker(store, queues=[adapter.queue], concurrency=concurrency, lease=lease, poll=poll)
        if worker
        else None
    )

    started = False
    warned = False

    def check_started() -> None:
        nonlocal warned
        if turns is None or started or warned:
            return
        warned = True
        logger.warning(
            "Slack events app %r: an event arrived but the app's worker never started (the "
            "ASGI server ran no lifespan): turns stay queued until a worker of queue %r runs; "
            "serve with lifespan on (uvicorn --lifespan on) or pass worker=False and run "
            "workers",
            adapter.namespace, adapter.queue,
        )  # fmt: skip

    async def answer(payload: dict[str, Any], retry: str | None) -> tuple[int, dict[str, Any]]:
        check_started()
        kind = payload.get("type")
        if kind == "url_verification":
            challenge = payload.get("challenge")
            if not isinstance(challenge, str):
                return 400, {"ok": False, "error": "url_verification without a challenge"}
            return 200, {"challenge": challenge}
        if kind != "event_callback":
            return 200, {"ok": True, "status": "ignored"}
        try:
            outcome = await adapter.enqueue(payload)
        except Exception:
            logger.exception("Slack event could not be queued; Slack will send it again")
            return 500, {"ok": False, "error": "the event could not be stored"}
        if outcome.status == "skipped":
            return 200, {"ok": True, "status": "skipped", "reason": outcome.reason}
        if retry is not None:
            logger.info("Slack retry %s of run %s: queued once", retry, outcome.run_id)
        return 200, {"ok": True, "status": "queued", "run_id": outcome.run_id}

    async def warm_up() -> None:
        """Open the store and learn who the bot is before the first event arrives."""
        try:
            await open_store(store).lock_holder("turn-kit:warm-up")
        except Exception as exc:  # the store may come up later; every event retries it
            logger.warning("Slack events app: the store is not reachable yet: %s", exc)
        await adapter.identity()

    async def lifespan(receive: Receive, send: Send) -> None:
        nonlocal started
        event = await receive()
        if event["type"] != "lifespan.startup":
            return
        started = True
        await warm_up()
        async with anyio.create_task_group() as group:
            if turns is not None:
                group.start_soon(turns.run)
            await send({"type": "lifespan.startup.complete"})
            while (await receive())["type"] != "lifespan.shutdown":
                pass
            if turns is not None and turns.serving:
                with anyio.move_on_after(_DRAIN_SECONDS):
                    await turns.drain()
            group.cancel_scope.cancel()
        await send({"type": "lifespan.shutdown.complete"})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope.get("method") != "POST":
            await reply_json(send, 405, {"ok": False, "error": "POST Slack events here"})
            return
        headers = dict(scope.get("headers") or [])
        raw = await read_body(receive)
        if raw is None:
            await reply_json(send, 400, {"ok": False, "error": "the body is over 1 MiB"})
            return
        why = verify_slack_signature(
            signing_secret,
            timestamp=headers.get(b"x-slack-request-timestamp"),
            signature=headers.get(b"x-slack-signature"),
            body=raw,
            now=time.time(),
        )
        if why is not None:
            await reply_json(send, 401, {"ok": False, "error": why})
            return
        payload = _json_object(raw)
        if payload is None:
            await reply_json(send, 400, {"ok": False, "error": "the body is not a JSON object"})
            return
        retry = headers.get(b"x-slack-retry-num")
        status, body = await answer(payload, None if retry is None else retry.decode("latin-1"))
        await reply_json(send, status, body)

    return app
