"""Long polling: ``getUpdates`` in a loop, the offset kept in the store.

The offset (the last update handled) is stored after each update, so a restarted poller
neither loses nor repeats an update; and since each update's turn is idempotent by message
id, the one update that might be fetched twice (killed between handling and storing the
offset) gets its stored result, not a second reply.

An update whose turn keeps failing (a poison update) is retried until its turn's run has
failed :data:`MAX_ATTEMPTS` times — counted in the store, from the run's record, so a
restarted poller keeps counting — then logged and moved past. (A failure before the turn's
run exists, such as a transport that cannot be built, is counted in memory.)

Several pollers may run on one store (several processes, several machines), yet Telegram
serves one ``getUpdates`` consumer per bot (a second gets 409 Conflict): :meth:`TelegramPoller.run`
polls only while it leads. The leader is the holder of a store-wide lock (the store's
``LockTable``) named after the offset key; the others stand by, queued for it. The leader
renews its lease every third of ``leader_lease`` while polling; when it stops, its place goes
to the next poller at once; when it dies, as soon as a standby of the same machine sees the
process gone, else when its lease runs out. A leader that finds its lease lost (its loop
stalled) stops fetching at once, finishes nothing more than the update in hand and queues
again. A 409 (another consumer, or a webhook that is set) is logged and backed off, never
fatal. Even two pollers fetching at once answer each update once: each update's turn queues
for its conversation and is idempotent by its run id. :meth:`TelegramPoller.poll_once` does
not elect: it is one fetch, for tests and for callers that schedule polling themselves.

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
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import anyio
import httpx

from agency_runtime import InvalidArgumentError, LockTimeoutError, Store, agency, open_store

from .._errors import TurnKitError, TurnPausedError
from .._runner import TurnArgs
from ._adapter import MAX_ATTEMPTS, TelegramTurnAdapter, given_up
from ._redact import install_token_redaction, scrub_exception, scrub_text
from ._transport import tls_context

__all__ = ["MAX_ATTEMPTS", "STANDBY_SECONDS", "TelegramPoller"]

logger = logging.getLogger("turn_kit.telegram")

T = TypeVar("T")

STANDBY_SECONDS = 0.5
"""How long a standby poller waits for the lead before it looks at its ``stop`` event and
queues again."""

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

    :meth:`run` polls only while this poller leads the pollers of ``offset_key`` on the store
    (see the module docstring); ``leader_lease`` is how long a leader that stopped renewing
    (a process of another machine that died) keeps the others waiting.
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
        leader_lease: float = 30.0,
    ) -> None:
        token = (token or os.environ.get("TELEGRAM_BOT_TOKEN") or "").strip()
        if not token:
            raise InvalidArgumentError(
                "the Telegram poller needs a bot token: pass token=... or set TELEGRAM_BOT_TOKEN"
            )
        if poll_timeout < 0:
            raise InvalidArgumentError(f"poll_timeout must be 0 or more, got {poll_timeout!r}")
        if isinstance(leader_lease, bool) or not isinstance(leader_lease, int | float):
            raise InvalidArgumentError(f"leader_lease must be seconds, got {leader_lease!r}")
        if not 0 < leader_lease < float("inf"):
            raise InvalidArgumentError(f"leader_lease must be above 0, got {leader_lease!r}")
        install_token_redaction(token)
        self.adapter = adapter
        self.leader_lease = float(leader_lease)
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
                "getUpdates conflicts with a webhook or another getUpdates consumer (409): "
                "delete the webhook (deleteWebhook), or make every poller of this bot use one "
                "store (they then take turns leading)"
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

    async def _poll(self, lost: anyio.Event | None = None) -> tuple[int, bool]:
        """:meth:`poll_once`, and whether it stopped at an update to retry. With ``lost``
        (the leadership's): the fetch is cancelled once it is set, and no update is begun."""
        store = open_store(self._store_choice)
        handled = 0
        async with self._client_scope() as client:
            offset = await self.offset()
            if lost is None:
                batch = await self._fetch(client, offset)
            else:
                fetched = await _unless(lost, self._fetch(client, offset))
                if fetched is None:
                    return handled, False
                batch = fetched
            usable = 0
            for update in batch:
                if lost is not None and lost.is_set():
                    return handled, False
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
            async with self.adapter.queued(self.ctx, payload=update) as queued_id:
                run_id = queued_id
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
        return httpx.AsyncClient(verify=tls_context())

    @property
    def leader_lock(self) -> str:
        """The name of the store-wide lock whose holder is the polling leader."""
        return f"turn-kit:telegram-poller:{self.offset_key}"

    async def run(self, *, stop: anyio.Event | None = None, error_backoff: float = 1.0) -> None:
        """Poll until ``stop`` is set (or forever), while this poller leads (see the module
        docstring); standing by, queued for the lead, otherwise.

        A bad ``getUpdates`` answer (a 409 Conflict too), a transport or store error, or an
        update that failed and is to be retried logs a warning and backs off
        (``error_backoff`` seconds, doubling up to 60 s); the next success resets the delay.
        """
        stop = stop if stop is not None else anyio.Event()
        delay = error_backoff
        while not stop.is_set():
            try:
                await self._lead(stop, error_backoff)
                delay = error_backoff
                continue
            except Exception as exc:
                logger.warning(
                    "Telegram polling: could not take the lead: %s: %s (retrying in %.1fs)",
                    type(exc).__name__, scrub_text(str(exc), self.__token), delay,
                    exc_info=True,
                )  # fmt: skip
            with anyio.move_on_after(delay):
                await stop.wait()
            delay = min(delay * 2, 60.0)

    async def _lead(self, stop: anyio.Event, error_backoff: float) -> None:
        """Poll while leading: until ``stop`` is set or the lead is lost (its lease ran out:
        another poller may lead now). A standby gives up its place every
        :data:`STANDBY_SECONDS` (so it notices ``stop``) and queues again."""
        store = open_store(self._store_choice)
        leading = False
        try:
            async with agency.lock(
                self.leader_lock,
                scope="global",
                store=store,
                lease=self.leader_lease,
                timeout=STANDBY_SECONDS,
                warn_after=0,
            ) as held:
                leading = True
                logger.info("Telegram polling: leading the pollers of %s", self.offset_key)
                await self._poll_while(stop, held.lost, error_backoff)
        except LockTimeoutError:
            if leading:
                raise
            return  # another poller leads: stand by
        if held.lost.is_set() and not stop.is_set():
            logger.warning("Telegram polling: lost the lead of %s; queueing again", self.offset_key)

    async def _poll_while(self, stop: anyio.Event, lost: anyio.Event, error_backoff: float) -> None:
        delay = error_backoff
        while not stop.is_set() and not lost.is_set():
            try:
                _, retry = await self._poll(lost)
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
            with anyio.move_on_after(delay):
                await _first(stop, lost)
            delay = min(delay * 2, 60.0)


async def _first(*events: anyio.Event) -> None:
    """Return once any of ``events`` is set."""
    async with anyio.create_task_group() as group:

        async def watch(event: anyio.Event) -> None:
            await event.wait()
            group.cancel_scope.cancel()

        for event in events:
            group.start_soon(watch, event)


async def _unless(lost: anyio.Event, work: Awaitable[T]) -> T | None:
    """``await work``, or ``None`` as soon as ``lost`` is set (the work is cancelled)."""
    if lost.is_set():
        if isinstance(work, Coroutine):
            work.close()
        return None
    result: list[T] = []
    errors: list[Exception] = []
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            await lost.wait()
            group.cancel_scope.cancel()

        async def do() -> None:
            try:
                result.append(await work)
            except Exception as exc:  # raised below as it is, not in an ExceptionGroup
                errors.append(exc)
            group.cancel_scope.cancel()

        group.start_soon(watch)
        group.start_soon(do)
    if errors:
        raise errors[0]
    return result[0] if result else None


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
