"""Long polling: ``getUpdates`` in a loop, the offset kept in the store.

The offset (the last update handled) is stored after each update, so a restarted poller
neither loses nor repeats an update; and since each update's turn is idempotent by message
id, the one update that might be fetched twice (killed between handling and storing the
offset) gets its stored result, not a second reply.

An update whose turn keeps failing (a poison update) is retried until its turn's run has
failed :data:`MAX_ATTEMPTS` times — counted in the store, from the run's record, so a
restarted poller keeps counting — then logged and moved past. (A failure before the turn's
run exists, such as a transport that cannot be built, is counted in memory.)

The poller keeps running through a bad answer: a transport error, a ``getUpdates`` body that
is not a JSON object, ``ok`` not true, a ``result`` that is not a list, updates without an
integer ``update_id`` (each is skipped with a warning) — :meth:`TelegramPoller.poll_once`
raises :class:`~turn_kit.TurnKitError` saying what was wrong, and :meth:`TelegramPoller.run`
logs a warning and backs off. A stored offset that is not an integer is ignored with a
warning (the next handled update overwrites it). The bot token never appears in a log line
or an error (see :mod:`turn_kit.telegram._redact`).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from typing import Any

import anyio
import httpx

from agency_runtime import InvalidArgumentError, Store, open_store

from .._errors import TurnKitError, TurnPausedError
from .._runner import TurnArgs
from ._adapter import MAX_ATTEMPTS, TelegramTurnAdapter, given_up
from ._redact import install_token_redaction, scrub_exception, scrub_text

__all__ = ["MAX_ATTEMPTS", "TelegramPoller"]

logger = logging.getLogger("turn_kit.telegram")

_NAMESPACE = "telegram-polling"
_OFFSET = re.compile(r"^\s*-?\d{1,30}\s*$")
_DETAIL_CAP = 240


class TelegramPoller:
    """Fetches updates with ``getUpdates`` and hands each to the adapter.

    ``token`` defaults to ``TELEGRAM_BOT_TOKEN``; ``base_url`` may point at a local Bot API
    server or :class:`~turn_kit.telegram.FakeBotApi`. The offset lives in ``store`` (default:
    the adapter's store) under ``offset_key`` (default: the bot's id, the part of the token
    before ``:`` — never the secret part). Constructing a poller installs the token-redacting
    log filter (httpx logs every request URL, which carries the token).
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
        token = (token or os.environ.get("TELEGRAM_BOT_TOKEN") or "").strip()
        if not token:
            raise InvalidArgumentError(
                "the Telegram poller needs a bot token: pass token=... or set TELEGRAM_BOT_TOKEN"
            )
        if poll_timeout < 0:
            raise InvalidArgumentError(f"poll_timeout must be 0 or more, got {poll_timeout!r}")
        install_token_redaction(token)
        self.adapter = adapter
        self.ctx = ctx
        self.respond = respond
        self.__token = token
        self._url = f"{base_url.rstrip('/')}/bot{token}/getUpdates"
        self.poll_timeout = poll_timeout
        self._store_choice = store if store is not None else adapter.runner.store
        self.offset_key = offset_key or token.partition(":")[0] or "bot"
        self._client = client
        self._failures: dict[int, int] = {}  # only for failures before a turn's run exists

    def __repr__(self) -> str:
        return f"TelegramPoller(offset_key={self.offset_key!r})"

    def _error(self, message: str, cause: BaseException | None = None) -> TurnKitError:
        """A :class:`TurnKitError` with ``message`` (and ``cause``) scrubbed of the token."""
        if cause is not None:
            scrub_exception(cause, self.__token)
        return TurnKitError(scrub_text(message, self.__token))

    async def offset(self) -> int | None:
        """The id of the last update handled, or ``None`` before the first (or when the
        stored offset is not an integer: that is logged as a warning)."""
        stored = await open_store(self._store_choice).get_document(_NAMESPACE, self.offset_key)
        if stored is None:
            return None
        if isinstance(stored, str) and _OFFSET.match(stored):
            return int(stored)
        logger.warning(
            "Telegram polling: the stored offset %s/%s is not an integer (%s); ignoring it "
            "(the next handled update replaces it)",
            _NAMESPACE, self.offset_key, ascii(stored)[:40],
        )  # fmt: skip
        return None

    async def _fetch(self, client: httpx.AsyncClient, offset: int | None) -> list[object]:
        params: dict[str, Any] = {"timeout": int(self.poll_timeout)}
        if offset is not None:
            params["offset"] = offset + 1
        try:
            response = await client.post(self._url, json=params, timeout=self.poll_timeout + 10)
        except httpx.HTTPError as exc:
            raise self._error(f"getUpdates failed: {type(exc).__name__}: {exc}", exc) from exc
        status = response.status_code
        if status == 409:
            raise TurnKitError(
                "getUpdates conflicts with a webhook or another poller (409): delete the "
                "webhook (deleteWebhook) or stop the other poller"
            )
        try:
            body: object = response.json()
        except (ValueError, RecursionError):  # not JSON (or nested too deep to parse)
            body = None
        if not isinstance(body, dict):
            what = "invalid JSON" if body is None else f"a JSON {type(body).__name__}"
            detail = scrub_text(response.text, self.__token)[:_DETAIL_CAP]
            raise self._error(
                f"getUpdates answered {status} with {what}, not a JSON object: {detail!r}"
            )
        if status != 200 or body.get("ok") is not True:
            description = scrub_text(str(body.get("description", response.text)), self.__token)
            raise self._error(f"getUpdates answered {status}: {description[:_DETAIL_CAP]}")
        result = body.get("result")
        if not isinstance(result, list):
            raise self._error(
                f"getUpdates answered ok, but its result is a {type(result).__name__}, not a list"
            )
        return result

    async def poll_once(self) -> int:
        """Fetch one batch of updates and handle them in order; return how many were handled
        (an update given up counts as handled: the offset moved past it).

        Stops at an update whose turn failed but may still be retried (the next call fetches
        it again). Raises :class:`~turn_kit.TurnKitError` for a bad ``getUpdates`` answer.
        """
        handled, _ = await self._poll()
        return handled

    async def _poll(self) -> tuple[int, bool]:
        """:meth:`poll_once`, and whether it stopped at an update to retry."""
        store = open_store(self._store_choice)
        handled = 0
        async with self._client_scope() as client:
            batch = await self._fetch(client, await self.offset())
            usable = 0
            for update in batch:
                update_id = update.get("update_id") if isinstance(update, dict) else None
                if not isinstance(update, dict) or not _is_update_id(update_id):
                    logger.warning(
                        "Telegram polling: skipping an update without an integer update_id "
                        "(%s)", _describe(update, update_id),
                    )  # fmt: skip
                    continue
                assert isinstance(update_id, int)
                usable += 1
                if not await self._handle(update, update_id):
                    return handled, True
                await store.put_document(_NAMESPACE, self.offset_key, str(update_id))
                handled += 1
            if batch and not usable:
                raise TurnKitError(
                    f"getUpdates returned {len(batch)} update(s), none with an integer update_id"
                )
        return handled, False

    async def _handle(self, update: dict[str, Any], update_id: int) -> bool:
        """Handle one update; ``False`` when it failed and is to be retried."""
        run_id: str | None = None
        try:
            run_id = await self.adapter.run_id_for(self.ctx, payload=update)
            record = None if run_id is None else await self.adapter.turn_record(run_id)
            if given_up(record):
                assert record is not None
                logger.warning(
                    "Telegram update %s: its turn (run %s) is %s after %d attempt(s); "
                    "skipping it", update_id, run_id, record.status, record.attempts,
                )  # fmt: skip
                return True
            await self.adapter.handle(self.ctx, payload=update, respond=self.respond)
        except TurnPausedError:
            logger.info("Telegram update %s paused on an interrupt", update_id)
        except Exception:
            attempts = await self._attempts(run_id, update_id)
            if attempts < MAX_ATTEMPTS:
                logger.exception(
                    "Telegram update %s failed (attempt %d of %d); it is retried",
                    update_id, attempts, MAX_ATTEMPTS,
                )  # fmt: skip
                return False
            logger.exception("Telegram update %s failed %d times; skipping it", update_id, attempts)
        self._failures.pop(update_id, None)
        return True

    async def _attempts(self, run_id: str | None, update_id: int) -> int:
        """How many times the update's turn failed: its stored run's attempts, else (no run
        yet, or the store cannot say) this poller's own count."""
        record = None
        if run_id is not None:
            try:
                record = await self.adapter.turn_record(run_id)
            except Exception:
                record = None
        if record is not None and record.status == "failed":
            self._failures.pop(update_id, None)
            return record.attempts
        attempts = self._failures.get(update_id, 0) + 1
        self._failures[update_id] = attempts
        return attempts

    def _client_scope(self) -> Any:
        if self._client is not None:
            return _Borrowed(self._client)
        return httpx.AsyncClient()

    async def run(self, *, stop: anyio.Event | None = None, error_backoff: float = 1.0) -> None:
        """Poll until ``stop`` is set (or forever).

        A bad ``getUpdates`` answer, a transport or store error, or an update that failed and
        is to be retried logs a warning and backs off (``error_backoff`` seconds, doubling up
        to 60 s); the next success resets the delay.
        """
        delay = error_backoff
        while stop is None or not stop.is_set():
            try:
                _, retry = await self._poll()
            except TurnKitError as exc:
                logger.warning("Telegram polling: %s (retrying in %.1fs)", exc, delay)
            except Exception as exc:
                logger.warning(
                    "Telegram polling failed: %s: %s (retrying in %.1fs)",
                    type(exc).__name__, scrub_text(str(exc), self.__token), delay,
                    exc_info=True,
                )  # fmt: skip
            else:
                if not retry:
                    delay = error_backoff
                    continue
            await anyio.sleep(delay)
            delay = min(delay * 2, 60.0)


def _is_update_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(update: object, update_id: object) -> str:
    if not isinstance(update, dict):
        return f"the update is a {type(update).__name__}"
    if update_id is None:
        return "no update_id"
    return f"update_id is a {type(update_id).__name__}"


class _Borrowed:
    """An async context manager that lends a client without closing it."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def __aenter__(self) -> httpx.AsyncClient:
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        return None
