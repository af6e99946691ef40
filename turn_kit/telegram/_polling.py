"""Long polling: ``getUpdates`` in a loop, the offset kept in the store.

The offset (the last update handled) is stored after each update, so a restarted poller
neither loses nor repeats an update; and since each update's turn is idempotent by message
id, the one update that might be fetched twice (killed between handling and storing the
offset) gets its stored result, not a second reply.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import anyio
import httpx

from agency_runtime import InvalidArgumentError, Store
from agency_runtime._store import resolve_store

from .._errors import TurnKitError, TurnPausedError
from .._runner import TurnArgs
from ._adapter import TelegramTurnAdapter

__all__ = ["TelegramPoller"]

logger = logging.getLogger("turn_kit.telegram")

_NAMESPACE = "telegram-polling"
MAX_ATTEMPTS = 3
"""An update that fails this many times in a row is logged and skipped (a poison update)."""


class TelegramPoller:
    """Fetches updates with ``getUpdates`` and hands each to the adapter.

    ``token`` defaults to ``TELEGRAM_BOT_TOKEN``; ``base_url`` may point at a local Bot API
    server or :class:`~turn_kit.telegram.FakeBotApi`. The offset lives in ``store`` (default:
    the adapter's store) under ``offset_key`` (default: the bot's id, the part of the token
    before ``:`` — never the secret part).
    """

    def __init__(
        self,
        adapter: TelegramTurnAdapter,
        *,
        ctx: Any,
        respond: Callable[[TurnArgs], Any],
        token: str | None = None,
        base_url: str = "https://api.telegram.org",
        poll_timeout: float = 30.0,
        store: str | Store | None = None,
        offset_key: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        token = token or os.environ.get("TELEGRAM_BOT_TOKEN") or ""
        if not token:
            raise InvalidArgumentError(
                "the Telegram poller needs a bot token: pass token=... or set TELEGRAM_BOT_TOKEN"
            )
        if poll_timeout < 0:
            raise InvalidArgumentError(f"poll_timeout must be 0 or more, got {poll_timeout!r}")
        self.adapter = adapter
        self.ctx = ctx
        self.respond = respond
        self._url = f"{base_url.rstrip('/')}/bot{token}/getUpdates"
        self.poll_timeout = poll_timeout
        self._store_choice = store if store is not None else adapter.runner.store
        self.offset_key = offset_key or token.partition(":")[0] or "bot"
        self._client = client
        self._failures: dict[int, int] = {}

    async def offset(self) -> int | None:
        """The id of the last update handled, or ``None`` before the first."""
        stored = await resolve_store(self._store_choice).get_document(_NAMESPACE, self.offset_key)
        return None if stored is None else int(stored)

    async def _fetch(self, client: httpx.AsyncClient, offset: int | None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"timeout": int(self.poll_timeout)}
        if offset is not None:
            params["offset"] = offset + 1
        try:
            response = await client.post(self._url, json=params, timeout=self.poll_timeout + 10)
        except httpx.HTTPError as exc:
            raise TurnKitError(f"getUpdates failed: {type(exc).__name__}: {exc}") from exc
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code == 409:
            raise TurnKitError(
                "getUpdates conflicts with a webhook or another poller (409): delete the "
                "webhook (deleteWebhook) or stop the other poller"
            )
        if response.status_code != 200 or not body.get("ok"):
            description = str(body.get("description", response.text))[:240]
            raise TurnKitError(f"getUpdates answered {response.status_code}: {description}")
        result = body.get("result")
        return [u for u in result if isinstance(u, dict)] if isinstance(result, list) else []

    async def poll_once(self) -> int:
        """Fetch one batch of updates and handle them in order; return how many were handled."""
        store = resolve_store(self._store_choice)
        handled = 0
        async with self._client_scope() as client:
            for update in await self._fetch(client, await self.offset()):
                update_id = update.get("update_id")
                if not isinstance(update_id, int) or isinstance(update_id, bool):
                    continue
                try:
                    await self.adapter.handle(self.ctx, payload=update, respond=self.respond)
                except TurnPausedError:
                    logger.info("Telegram update %s paused on an interrupt", update_id)
                except Exception:
                    attempts = self._failures.get(update_id, 0) + 1
                    self._failures[update_id] = attempts
                    if attempts < MAX_ATTEMPTS:
                        logger.exception(
                            "Telegram update %s failed (attempt %d); it is retried", update_id,
                            attempts,
                        )  # fmt: skip
                        return handled
                    logger.exception(
                        "Telegram update %s failed %d times; skipping it", update_id, attempts
                    )
                self._failures.pop(update_id, None)
                await store.put_document(_NAMESPACE, self.offset_key, str(update_id))
                handled += 1
        return handled

    def _client_scope(self) -> Any:
        if self._client is not None:
            return _Borrowed(self._client)
        return httpx.AsyncClient()

    async def run(self, *, stop: anyio.Event | None = None, error_backoff: float = 1.0) -> None:
        """Poll until ``stop`` is set (or forever); transient errors back off and retry."""
        delay = error_backoff
        while stop is None or not stop.is_set():
            try:
                await self.poll_once()
                delay = error_backoff
            except TurnKitError as exc:
                logger.warning("Telegram polling: %s (retrying in %.1fs)", exc, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, 60.0)


class _Borrowed:
    """An async context manager that lends a client without closing it."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def __aenter__(self) -> httpx.AsyncClient:
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        return None
