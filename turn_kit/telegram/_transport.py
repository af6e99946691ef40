"""Sending to Telegram: the transport protocol, two transports and the chunked send.

* :class:`BotApiTransport` — the Bot API through python-telegram-bot's ``Bot`` (the
  ``telegram`` extra). It adds only what PTB lacks: per-chat handling of 429 ``retry_after``
  with bounded retries (one chat's flood wait never stalls another chat), one resend without
  the thread id on "message thread not found", and an honest *unknown* result when a send
  timed out (Telegram has no idempotency key, so it is never resent blindly). It also edits
  a message (``editMessageText``), which the adapter's ``stream=True`` preview uses.
* :class:`CloudTelegramTransport` — the seed's Cloud provider proxy over httpx
  (``POST <api_url>/api/v1/proxy/telegram``); :func:`cloud_telegram_transport_from_env` builds
  one from ``AGENT_CLOUD_API_URL`` and ``AGENT_CLOUD_API_TOKEN``.
* :func:`send_telegram_text` — the seed's ``sendTelegramText``: bare chat id, UTF-16 chunks,
  only the first chunk threaded, every chunk must come back with a message id.

Tokens are never logged, repr'd or put in an error message: constructing a transport installs
the redacting log filter of :mod:`turn_kit.telegram._redact` (httpx logs every request URL,
which carries the bot token), and every error it raises, with the errors chained to it, is
scrubbed case-insensitively before it leaves (it may end up in a stored run error).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import re
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import anyio
import httpx
from pydantic import ConfigDict, Field

from agency_runtime import DeferredModel, InvalidArgumentError

from .._errors import TurnKitError
from .._util import field, maybe_await
from ._parse import bare_telegram_chat_id, chunk_telegram_text
from ._redact import install_token_redaction, scrub_exception, scrub_text

__all__ = [
    "CLOUD_API_TOKEN_ENV",
    "CLOUD_API_URL_ENV",
    "TOKEN_ENV",
    "BotApiTransport",
    "CloudTelegramTransport",
    "TelegramDelivery",
    "TelegramRateLimitedError",
    "TelegramSendResult",
    "TelegramTransport",
    "cloud_telegram_transport_from_env",
    "send_telegram_text",
]

TOKEN_ENV = "TELEGRAM_BOT_TOKEN"
CLOUD_API_URL_ENV = "AGENT_CLOUD_API_URL"
CLOUD_API_TOKEN_ENV = "AGENT_CLOUD_API_TOKEN"

_THREAD_NOT_FOUND = "message thread not found"
_NOT_MODIFIED = "message is not modified"
_NOT_EDITABLE = ("message to edit not found", "message can't be edited")
_MAX_SAFE_INTEGER = 2**53 - 1
_DETAIL_CAP = 240

# The sleep used for 429 back-off; tests monkeypatch it to run fast.
_sleep = anyio.sleep


class TelegramSendResult(DeferredModel):
    """One ``sendMessage``'s receipt.

    ``unknown`` is true when the send timed out after the request went out: the message may
    or may not have arrived (``ok`` is false and there is no message id).
    """

    model_config = ConfigDict(frozen=True)

    ok: bool
    chat_id: str
    message_id: str | None = None
    ref: str | None = None
    unknown: bool = False


class TelegramRateLimitedError(TurnKitError):
    """Telegram answered 429 more often than the call was allowed to wait it out.

    ``retry_after`` is the wait Telegram asked for, in seconds.
    """

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@runtime_checkable
class TelegramTransport(Protocol):
    """What the adapter sends with: an object or dict with ``ok``, ``chat_id``,
    ``message_id`` and ``ref`` comes back. A transport may also offer
    ``async send_chat_action(chat_id, action="typing", *, thread_id=None)``, and, for the
    adapter's ``stream=True``, ``async edit_message_text(chat_id, message_id, text, *,
    max_retries=None)``: ``ok`` when the message shows ``text`` (also when it already did),
    ``ok=False`` when the message cannot be edited (gone), ``unknown=True`` when the edit
    timed out; a 429 it does not wait out (``max_retries=0``: none) raises an error with a
    ``retry_after`` attribute (:class:`TelegramRateLimitedError`)."""

    async def send_message(
        self,
        chat_id: str,
        text: str,
        *,
        reply_to_message_id: str | None = None,
        thread_id: str | None = None,
    ) -> Any: ...


# -- id conversion -----------------------------------------------------------------------

_INT_RE = re.compile(r"^[+-]?\d+$")
_DIGITS_RE = re.compile(r"^\d+$")


def _chat_target(chat_id: str) -> int | str:
    """A numeric chat id as an int (a safe integer); ``@channel`` and the like stay strings."""
    if _INT_RE.match(chat_id):
        number = int(chat_id)
        if abs(number) <= _MAX_SAFE_INTEGER:
            return number
    return chat_id


def _positive_id(value: object) -> int | None:
    """A message/thread id as an int when it is a positive safe integer, else ``None``."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if not value.is_integer():
            return None
        number = int(value)
    else:
        text = str(value).strip()
        if not _DIGITS_RE.match(text):
            return None
        number = int(text)
    return number if 0 < number <= _MAX_SAFE_INTEGER else None


def _js_number_chat_id(chat_id: str) -> int | str:
    """The seed's ``numericChatId``: ``Number(bare)`` when a safe integer (so ``''`` is 0)."""
    text = chat_id.strip()
    if text == "":
        return 0
    return _chat_target(text)


# -- python-telegram-bot ---------------------------------------------------------------------


class _Ptb:
    """The pieces of python-telegram-bot this module uses, imported on first need."""

    def __init__(self) -> None:
        try:
            import telegram
            from telegram import error
            from telegram.request import HTTPXRequest
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise TurnKitError(
                "BotApiTransport needs python-telegram-bot: pip install 'agency-runtime[telegram]'"
            ) from exc
        self.Bot: Any = telegram.Bot
        self.ReplyParameters: Any = telegram.ReplyParameters
        self.TelegramError: type[Exception] = error.TelegramError
        self.BadRequest: type[Exception] = error.BadRequest
        self.TimedOut: type[Exception] = error.TimedOut
        self.NetworkError: type[Exception] = error.NetworkError
        self.RetryAfter: type[Exception] = error.RetryAfter
        self.ChatMigrated: type[Exception] = error.ChatMigrated
        base_error: Any = error.TelegramError
        base_request: Any = HTTPXRequest

        class FloodWait(base_error):  # type: ignore[misc]
            """A 429 with its (possibly fractional) ``retry_after``.

            Raised by :class:`Request` before PTB builds its own ``RetryAfter``, whose
            ``retry_after`` property emits a deprecation warning on every access in PTB 22.
            """

            def __init__(self, retry_after: float, description: str) -> None:
                super().__init__(description)
                self.retry_after_seconds = retry_after

        class Request(base_request):  # type: ignore[misc]
            async def do_request(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
                code, payload = await super().do_request(*args, **kwargs)
                if code == 429:
                    retry_after = _retry_after_from(payload)
                    if retry_after is not None:
                        raise FloodWait(retry_after, _description_from(payload))
                return int(code), bytes(payload)

        self.FloodWait: type[Exception] = FloodWait
        self.Request: Any = Request


@functools.cache
def _ptb() -> _Ptb:
    ptb = _Ptb()
    install_token_redaction(loggers=(ptb.Bot._LOGGER.name,))
    return ptb


def _retry_after_from(payload: bytes) -> float | None:
    try:
        body = json.loads(payload.decode("utf-8"))
        value = body["parameters"]["retry_after"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(0.0, float(value))


def _description_from(payload: bytes) -> str:
    try:
        body = json.loads(payload.decode("utf-8"))
        return str(body.get("description") or "Too Many Requests")
    except (ValueError, AttributeError):
        return "Too Many Requests"


def _retry_after_seconds(exc: BaseException) -> float:
    own = getattr(exc, "retry_after_seconds", None)
    if isinstance(own, int | float):
        return float(own)
    # PTB's RetryAfter keeps a timedelta; its public property warns (PTB 22.2+).
    value = getattr(exc, "_retry_after", None)
    if isinstance(value, dt.timedelta):
        return max(0.0, value.total_seconds())
    return 1.0


def tls_context() -> ssl.SSLContext:
    """The TLS context every HTTP client of this package shares: httpx's default one.

    httpx builds a context for each client it makes, loading the whole CA bundle each time
    (~25 ms of CPU): a :class:`BotApiTransport` makes two clients, and the poller one for each
    round of ``getUpdates`` when it is not given one. A context may serve any number of
    connections, clients and threads. It is built again when ``SSL_CERT_FILE`` or
    ``SSL_CERT_DIR`` (which httpx reads) have changed.
    """
    return _tls_context_for(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls_context_for(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    return httpx.create_ssl_context()


class _ChatLocks:
    """One anyio lock per chat, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[anyio.Lock, list[int]]] = {}

    @asynccontextmanager
    async def hold(self, chat: str) -> AsyncIterator[None]:
        entry = self._entries.get(chat)
        if entry is None:
            entry = self._entries[chat] = (anyio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0 and self._entries.get(chat) is entry:
                del self._entries[chat]


class BotApiTransport:
    """The Telegram Bot API through python-telegram-bot's ``Bot``.

    ``BotApiTransport(token=None, *, base_url="https://api.telegram.org", timeout=20.0,
    max_retries=3)`` sends to ``{base_url}/bot{token}/{method}``; ``token`` defaults to
    ``TELEGRAM_BOT_TOKEN``. ``base_url`` may name a local Bot API server or
    :class:`~turn_kit.telegram.FakeBotApi`.

    ``send_message`` sends one message (the chat's sends run one at a time):

    * a 429 sleeps ``retry_after`` and retries, at most ``max_retries`` times, then raises
      :class:`TurnKitError`; only that chat waits;
    * "message thread not found" is resent once without the thread id (the reply is kept);
    * a timeout returns ``TelegramSendResult(ok=False, unknown=True)`` — the message may have
      arrived, so it is not resent;
    * any other failure raises :class:`TurnKitError` with PTB's error chained.

    Use ``async with BotApiTransport(...) as t:`` or call :meth:`aclose` to close the HTTP
    connections.
    """

    def __init__(
        self,
        token: str | None = None,
        *,
        base_url: str = "https://api.telegram.org",
        timeout: float = 20.0,
        max_retries: int = 3,
    ) -> None:
        resolved = token if token is not None else os.environ.get(TOKEN_ENV)
        if resolved is None or not resolved.strip():
            raise InvalidArgumentError(
                f"BotApiTransport needs a bot token: pass token=... or set {TOKEN_ENV}"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise InvalidArgumentError(f"timeout must be a positive number, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidArgumentError(
                f"max_retries must be a non-negative int, got {max_retries!r}"
            )
        self.__token = resolved.strip()
        install_token_redaction(self.__token)
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.max_retries = max_retries
        ptb = _ptb()
        self._ptb = ptb
        self._requests = (self._new_request(), self._new_request())
        self._bot: Any = ptb.Bot(
            self.__token,
            base_url=f"{self.base_url}/bot",
            request=self._requests[0],
            get_updates_request=self._requests[1],
        )
        self._locks = _ChatLocks()
        self._closed = False

    def _new_request(self) -> Any:
        t = self.timeout
        return self._ptb.Request(
            connection_pool_size=64,
            read_timeout=t,
            write_timeout=t,
            connect_timeout=t,
            pool_timeout=t,
            httpx_kwargs={"verify": tls_context()},
        )

    def __repr__(self) -> str:
        return f"BotApiTransport(base_url={self.base_url!r}, timeout={self.timeout!r})"

    @property
    def bot(self) -> Any:
        """The underlying ``telegram.Bot`` (for calls this transport does not wrap)."""
        return self._bot

    async def aclose(self) -> None:
        """Close the HTTP connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for request in self._requests:
            await request.shutdown()

    async def __aenter__(self) -> BotApiTransport:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _scrub(self, text: str) -> str:
        return scrub_text(text, self.__token)

    def _failure(self, what: str, chat: str, exc: BaseException) -> TurnKitError:
        """The error to raise for ``exc``; ``exc`` (chained as its cause) is scrubbed in place,
        so neither message carries the token, whatever its case."""
        scrub_exception(exc, self.__token)
        detail = self._scrub(str(exc)) or type(exc).__name__
        return TurnKitError(f"Telegram {what} to {chat} failed: {detail}")

    async def _ensure_open(self) -> None:
        if self._closed:
            self._closed = False
            for request in self._requests:
                await request.initialize()

    async def send_message(
        self,
        chat_id: str,
        text: str,
        *,
        reply_to_message_id: str | None = None,
        thread_id: str | None = None,
    ) -> TelegramSendResult:
        """Send one message; see the class docstring for retries and timeouts."""
        ptb = self._ptb
        chat = str(chat_id).strip()
        if not chat:
            raise InvalidArgumentError("send_message needs a chat id")
        target = _chat_target(chat)
        reply = _positive_id(reply_to_message_id)
        thread = _positive_id(thread_id)
        reply_parameters = (
            ptb.ReplyParameters(message_id=reply, allow_sending_without_reply=True)
            if reply is not None
            else None
        )
        await self._ensure_open()
        rate_limited = 0
        async with self._locks.hold(chat):
            while True:
                try:
                    message = await self._bot.send_message(
                        chat_id=target,
                        text=text,
                        message_thread_id=thread,
                        reply_parameters=reply_parameters,
                    )
                except (ptb.FloodWait, ptb.RetryAfter) as exc:
                    wait = _retry_after_seconds(exc)
                    if rate_limited >= self.max_retries:
                        raise TelegramRateLimitedError(
                            f"Telegram sendMessage to {chat} is still rate limited after "
                            f"{rate_limited} retries (retry_after={wait:g}s)",
                            retry_after=wait,
                        ) from exc
                    rate_limited += 1
                    await _sleep(wait)
                    continue
                except ptb.BadRequest as exc:
                    if thread is not None and _THREAD_NOT_FOUND in str(exc).lower():
                        thread = None  # once: the next failure is raised
                        continue
                    raise self._failure("sendMessage", chat, exc) from exc
                except ptb.TimedOut as exc:
                    if "pool timeout" in str(exc).lower():  # never left this process
                        raise self._failure("sendMessage", chat, exc) from exc
                    return TelegramSendResult(ok=False, chat_id=chat, unknown=True)
                except ptb.NetworkError as exc:
                    if _maybe_delivered(exc):
                        return TelegramSendResult(ok=False, chat_id=chat, unknown=True)
                    raise self._failure("sendMessage", chat, exc) from exc
                except ptb.TelegramError as exc:
                    raise self._failure("sendMessage", chat, exc) from exc
                message_id = str(message.message_id)
                return TelegramSendResult(
                    ok=True,
                    chat_id=chat,
                    message_id=message_id,
                    ref=f"telegram:{chat}:{message_id}",
                )

    async def edit_message_text(
        self,
        chat_id: str,
        message_id: str | int,
        text: str,
        *,
        max_retries: int | None = None,
    ) -> TelegramSendResult:
        """Make message ``message_id`` of the chat show ``text`` (``editMessageText``).

        * ``ok`` with the message id when it shows ``text`` now — also when it already did
          (Telegram's "message is not modified");
        * ``ok=False`` when the message cannot be edited ("message to edit not found",
          "message can't be edited");
        * ``unknown=True`` when the request timed out (an edit may be repeated safely);
        * a 429 sleeps ``retry_after`` and retries, at most ``max_retries`` times (default:
          the transport's), then raises :class:`TelegramRateLimitedError`;
        * any other failure raises :class:`TurnKitError`.
        """
        ptb = self._ptb
        chat = str(chat_id).strip()
        if not chat:
            raise InvalidArgumentError("edit_message_text needs a chat id")
        message = _positive_id(message_id)
        if message is None:
            raise InvalidArgumentError(
                f"edit_message_text needs a positive message id, got {message_id!r}"
            )
        retries = self.max_retries if max_retries is None else max_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidArgumentError(
                f"max_retries must be a non-negative int, got {max_retries!r}"
            )
        target = _chat_target(chat)
        await self._ensure_open()
        rate_limited = 0
        async with self._locks.hold(chat):
            while True:
                try:
                    await self._bot.edit_message_text(text=text, chat_id=target, message_id=message)
                except (ptb.FloodWait, ptb.RetryAfter) as exc:
                    wait = _retry_after_seconds(exc)
                    if rate_limited >= retries:
                        raise TelegramRateLimitedError(
                            f"Telegram editMessageText in {chat} is still rate limited after "
                            f"{rate_limited} retries (retry_after={wait:g}s)",
                            retry_after=wait,
                        ) from exc
                    rate_limited += 1
                    await _sleep(wait)
                    continue
                except ptb.BadRequest as exc:
                    detail = str(exc).lower()
                    if _NOT_MODIFIED in detail:
                        break  # it already shows the text
                    if any(reason in detail for reason in _NOT_EDITABLE):
                        return TelegramSendResult(ok=False, chat_id=chat)
                    raise self._failure("editMessageText", chat, exc) from exc
                except ptb.TimedOut as exc:
                    if "pool timeout" in str(exc).lower():
                        raise self._failure("editMessageText", chat, exc) from exc
                    return TelegramSendResult(ok=False, chat_id=chat, unknown=True)
                except ptb.NetworkError as exc:
                    if _maybe_delivered(exc):
                        return TelegramSendResult(ok=False, chat_id=chat, unknown=True)
                    raise self._failure("editMessageText", chat, exc) from exc
                except ptb.TelegramError as exc:
                    raise self._failure("editMessageText", chat, exc) from exc
                break
        return TelegramSendResult(
            ok=True, chat_id=chat, message_id=str(message), ref=f"telegram:{chat}:{message}"
        )

    async def send_chat_action(
        self, chat_id: str, action: str = "typing", *, thread_id: str | None = None
    ) -> bool:
        """Show ``action`` (``"typing"``) in the chat — an optional acknowledgement.

        Best effort by design: a 429 or a timeout returns ``False`` instead of waiting or
        raising (the indicator lasts about 5 s anyway); other errors raise
        :class:`TurnKitError`. A thread the chat does not have is retried without it.
        """
        ptb = self._ptb
        chat = str(chat_id).strip()
        if not chat:
            raise InvalidArgumentError("send_chat_action needs a chat id")
        target = _chat_target(chat)
        thread = _positive_id(thread_id)
        await self._ensure_open()
        while True:
            try:
                return bool(
                    await self._bot.send_chat_action(
                        chat_id=target, action=action, message_thread_id=thread
                    )
                )
            except (ptb.FloodWait, ptb.RetryAfter, ptb.TimedOut):
                return False
            except ptb.BadRequest as exc:
                if thread is not None and _THREAD_NOT_FOUND in str(exc).lower():
                    thread = None
                    continue
                raise self._failure("sendChatAction", chat, exc) from exc
            except ptb.TelegramError as exc:
                raise self._failure("sendChatAction", chat, exc) from exc


def _maybe_delivered(exc: BaseException) -> bool:
    """A network error after the request was written (the connection dropped mid-response)."""
    cause = exc.__cause__
    return isinstance(cause, httpx.RemoteProtocolError | httpx.ReadError)


# -- Cloud proxy ---------------------------------------------------------------------------


def _record(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _scalar(value: object) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    return None


class CloudTelegramTransport:
    """The seed's direct Cloud delivery: the Bot API's ``sendMessage`` through the Cloud
    provider proxy, ``POST <api_url>/api/v1/proxy/telegram`` with Bearer auth.

    The body is ``{"endpoint": "/sendMessage", "method": "POST", "data": {chat_id, text,
    reply_to_message_id?, message_thread_id?}}``: ``chat_id`` is a number when the bare id is a
    safe integer (as in the seed, a blank id becomes ``0``); reply and thread ids are sent only
    when they are positive integers. A timeout, a non-2xx status, ``ok: false`` (the detail is
    capped at 240 characters) or a missing ``message_id`` raises :class:`TurnKitError`. The
    receipt's ref is ``cloud:telegram:<chat>:<message_id>``.
    """

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        timeout: float = 20.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not api_url or not api_url.strip():
            raise InvalidArgumentError("CloudTelegramTransport needs the Cloud API url")
        if not token or not token.strip():
            raise InvalidArgumentError("CloudTelegramTransport needs the Cloud API token")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise InvalidArgumentError(f"timeout must be a positive number, got {timeout!r}")
        self.endpoint = f"{api_url.strip().rstrip('/')}/api/v1/proxy/telegram"
        self.__token = token.strip()
        install_token_redaction(self.__token)
        self.timeout = float(timeout)
        self._client = client
        self._owns_client = client is None

    def __repr__(self) -> str:
        return f"CloudTelegramTransport(endpoint={self.endpoint!r}, timeout={self.timeout!r})"

    def _http(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient(verify=tls_context())
            self._owns_client = True
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client if this transport created it."""
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> CloudTelegramTransport:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def send_message(
        self,
        chat_id: str,
        text: str,
        *,
        reply_to_message_id: str | None = None,
        thread_id: str | None = None,
    ) -> TelegramSendResult:
        """Send one message through the proxy and return its receipt."""
        target = _js_number_chat_id(bare_telegram_chat_id(chat_id))
        data: dict[str, Any] = {"chat_id": target, "text": text}
        reply = _positive_id(reply_to_message_id)
        if reply is not None:
            data["reply_to_message_id"] = reply
        thread = _positive_id(thread_id)
        if thread is not None:
            data["message_thread_id"] = thread
        body = {"endpoint": "/sendMessage", "method": "POST", "data": data}
        try:
            response = await self._http().post(
                self.endpoint,
                json=body,
                headers={"authorization": f"Bearer {self.__token}"},
                timeout=self.timeout,
            )
        except httpx.TimeoutException as exc:
            scrub_exception(exc, self.__token)
            raise TurnKitError(f"Telegram Cloud proxy timed out after {self.timeout:g}s") from exc
        except httpx.HTTPError as exc:
            scrub_exception(exc, self.__token)
            raise TurnKitError(
                f"Telegram Cloud proxy request failed: {type(exc).__name__}"
            ) from exc
        try:
            payload: object = response.json()
        except (ValueError, RecursionError):
            payload = None
        parsed = _record(payload)
        if not response.is_success or (parsed is not None and parsed.get("ok") is False):
            detail: object = None
            if parsed is not None:
                for key in ("error", "description", "code"):
                    if parsed.get(key) is not None:
                        detail = parsed[key]
                        break
            if detail is None:
                detail = f"HTTP {response.status_code}"
            text_detail = scrub_text(  # scrubbed before the cap, which could halve a token
                detail if isinstance(detail, str) else json.dumps(detail, default=str),
                self.__token,
            )[:_DETAIL_CAP]
            raise TurnKitError(
                f"Telegram Cloud proxy failed ({response.status_code}): {text_detail}"
            )
        result: Mapping[str, Any] = {}
        if parsed is not None:
            found = _record(parsed.get("result"))
            if found is None:
                # The proxy may wrap the Bot API's answer: {"ok": true, "data": {"result": ..}}
                wrapped = _record(parsed.get("data"))
                found = (_record(wrapped.get("result")) or wrapped) if wrapped else None
            result = found if found is not None else parsed
        raw_id = result.get("message_id")
        message_id = _scalar(raw_id if raw_id is not None else result.get("messageId"))
        if not message_id:
            raise TurnKitError("Telegram Cloud proxy returned no delivered message id")
        chat_record = _record(result.get("chat")) or {}
        delivered = (
            _scalar(chat_record.get("id"))
            or _scalar(result.get("chat_id"))
            or bare_telegram_chat_id(chat_id)
        )
        return TelegramSendResult(
            ok=True,
            chat_id=delivered,
            message_id=message_id,
            ref=f"cloud:telegram:{delivered}:{message_id}",
        )


def cloud_telegram_transport_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    timeout: float = 20.0,
    client: httpx.AsyncClient | None = None,
) -> CloudTelegramTransport | None:
    """A :class:`CloudTelegramTransport` from ``AGENT_CLOUD_API_URL`` and
    ``AGENT_CLOUD_API_TOKEN``, or ``None`` when either is blank (the seed's
    ``createCloudTelegramTransport`` returning ``undefined``)."""
    env = os.environ if environ is None else environ
    url = (env.get(CLOUD_API_URL_ENV) or "").strip()
    token = (env.get(CLOUD_API_TOKEN_ENV) or "").strip()
    if not url or not token:
        return None
    return CloudTelegramTransport(url, token, timeout=timeout, client=client)


# -- chunked send ------------------------------------------------------------------------------


class TelegramDelivery(DeferredModel):
    """What a chunked send returns: the chat and every chunk's message id."""

    model_config = ConfigDict()

    ok: bool
    chat_id: str
    message_ids: list[str]
    unknown_chunks: list[int] = Field(
        default_factory=list,
        description="Chunks (from 1) whose send timed out: they may or may not have arrived.",
    )


async def send_chunk(
    transport: Any,
    chat_id: str,
    chunk: str,
    index: int,
    *,
    reply_to_message_id: str | int | None = None,
    thread_id: str | int | None = None,
) -> str | None:
    """Send chunk ``index`` (from 0) of a reply; return its message id.

    Only the first chunk replies to the message and carries the topic. ``None`` means the
    send timed out and may have arrived. An error the transport raises is scrubbed of bot
    tokens (in place) before it propagates. A result that is not ok or has no message id
    raises ``TurnKitError("Telegram delivery to <id> returned no receipt for chunk <n>")``.
    """
    first = index == 0
    try:
        result = await maybe_await(
            transport.send_message(
                chat_id,
                chunk,
                reply_to_message_id=(
                    None if not first or reply_to_message_id is None else str(reply_to_message_id)
                ),
                thread_id=None if not first or thread_id is None else str(thread_id),
            )
        )
    except Exception as exc:  # any transport's error: no token in what a run stores
        scrub_exception(exc)
        raise
    if field(result, "unknown"):
        return None
    message_id = field(result, "message_id")
    if not field(result, "ok") or message_id is None or str(message_id) == "":
        raise TurnKitError(
            f"Telegram delivery to {chat_id} returned no receipt for chunk {index + 1}"
        )
    return str(message_id)


async def send_telegram_text(
    transport: Any,
    chat_id: str | int,
    text: str,
    *,
    reply_to_message_id: str | int | None = None,
    thread_id: str | int | None = None,
    chunk_limit: int = 4096,
) -> TelegramDelivery:
    """The seed's ``sendTelegramText``: send ``text`` to the bare chat id, chunk by chunk.

    Chunks are counted in UTF-16 code units (:func:`chunk_telegram_text`). Only the first
    chunk carries ``reply_to_message_id`` and ``thread_id``. A result that is not ok or has no
    message id raises ``TurnKitError("Telegram delivery to <id> returned no receipt for chunk
    <n>")`` (``n`` counts from 1); chunks sent before it stay sent. Not journaled: inside a
    turn, the adapter's ``send_durably`` makes each chunk a step.
    """
    target = bare_telegram_chat_id(chat_id)
    chunks = chunk_telegram_text(text, chunk_limit)
    if not chunks:
        raise TurnKitError(f"Telegram delivery to {target}: the text is blank; nothing to send")
    message_ids: list[str] = []
    for index, chunk in enumerate(chunks):
        sent = await send_chunk(
            transport, target, chunk, index,
            reply_to_message_id=reply_to_message_id, thread_id=thread_id,
        )  # fmt: skip
        if sent is None:
            raise TurnKitError(
                f"Telegram delivery to {target} returned no receipt for chunk {index + 1} "
                "(the send timed out; it may still have arrived)"
            )
        message_ids.append(sent)
    return TelegramDelivery(ok=True, chat_id=target, message_ids=message_ids)
