"""Sending to Slack: the Web API transport the Slack adapter posts, edits and looks up with.

:class:`SlackApiTransport` calls Slack's Web API through ``slack_sdk`` (the ``slack`` extra):
its ``AsyncWebClient`` on asyncio (one aiohttp session per transport and event loop), its sync
``WebClient`` in a worker thread on any other backend (trio). It adds only what the SDK lacks
for a bot that must never reply twice:

* a 429's ``Retry-After`` is waited out, at most ``max_retries`` times per call, then
  :class:`~turn_kit.SlackRateLimitedError` is raised (``max_retries=0``: at the first 429,
  which the adapter's streamed edits use to pace themselves);
* the SDK's retry handlers are off (``retry_handlers=[]``): its default one resends a request
  whose connection dropped, and for ``chat.postMessage``, which has no idempotency key, that
  is a second reply;
* a post or an edit that timed out, or whose connection dropped after it was sent, comes back
  ``unknown=True`` (the message may or may not exist) and is never resent; a post carries its
  delivery ``key`` in the message metadata (``event_type`` :data:`DELIVERY_EVENT_TYPE`), so
  :meth:`SlackApiTransport.find_message` can tell afterwards whether it arrived;
* an edit Slack cannot make (the message is gone, is not the bot's, is too old) comes back
  ``ok=False`` with Slack's code, for the caller to post anew; any other ``ok: false`` raises
  :class:`~turn_kit.SlackError` with the code, the SDK's error chained.

``slack_sdk`` is imported when a transport is constructed (aiohttp on the first call on
asyncio), never when this module is: importing ``turn_kit.slack`` needs no extra.

Tokens are never repr'd or put in an error message: every error raised here, and the errors
chained to it, is scrubbed of anything shaped like a Slack token (``xoxb-…``, ``xoxp-…``,
``xapp-…``) and of the transport's own token by :func:`scrub_slack_text` (the token travels in
the ``Authorization`` header, which the SDK's debug logs redact).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import os
import re
import urllib.error
from collections.abc import Mapping
from types import TracebackType
from typing import Any, NoReturn

import anyio
import anyio.to_thread
from pydantic import ConfigDict

from agency_runtime import DeferredModel, InvalidArgumentError

from .._errors import SlackError, SlackRateLimitedError

try:
    from sniffio import current_async_library as _current_async_library
except ImportError:  # then trio is not installed either (it needs sniffio): asyncio it is

    def _current_async_library() -> str:
        """The running async library: asyncio, the only one there can be without sniffio."""
        return "asyncio"


__all__ = [
    "DEFAULT_BASE_URL",
    "DELIVERY_EVENT_TYPE",
    "TOKEN_ENV",
    "SlackApiTransport",
    "SlackIdentity",
    "SlackSendResult",
    "scrub_slack_text",
]

TOKEN_ENV = "SLACK_BOT_TOKEN"
"""The environment variable :class:`SlackApiTransport` reads the bot token from."""

DELIVERY_EVENT_TYPE = "turn_kit_delivery"
"""The message-metadata ``event_type`` a post with a ``key`` is stamped with."""

DEFAULT_BASE_URL = "https://slack.com/api/"
"""Slack's Web API (``slack_sdk``'s default ``base_url``)."""

_EXTRA_HINT = "install the slack extra: pip install 'agency-runtime[slack]'"
_NOT_EDITABLE = frozenset({"message_not_found", "cant_update_message", "edit_window_closed"})
_REPLIES_PAGE = 200
_MAX_PAGES = 1000
_DEFAULT_RETRY_AFTER = 1.0
_DETAIL_CAP = 240
_CODE_RE = re.compile(r"[A-Za-z0-9_.-]{1,100}")
"""What an ``error`` code looks like (``channel_not_found``), as opposed to prose."""
_MIN_LITERAL = 6
"""Shorter secrets are not scrubbed literally (that would garble ordinary words)."""

_TOKEN_RE = re.compile(
    r"(?<![A-Za-z0-9])(?:xox[a-z](?:\.xox[a-z])?|xapp)-[A-Za-z0-9-]+", re.IGNORECASE
)

# The sleep used for 429 back-off; tests monkeypatch it to run fast.
_sleep = anyio.sleep


class SlackIdentity(DeferredModel):
    """Who the token is (``auth.test``): the bot's user id, its bot id and the workspace."""

    model_config = ConfigDict(frozen=True)

    user_id: str
    bot_id: str | None = None
    team_id: str | None = None


class SlackSendResult(DeferredModel):
    """One ``chat.postMessage``'s or ``chat.update``'s receipt.

    * ``ok`` with ``ts``: the message exists and shows the text;
    * ``unknown``: the request went out and no answer came (a timeout, or the connection
      dropped after sending): the message may or may not exist (``ok`` is false);
    * ``ok=False`` with ``error``: Slack refused an edit it cannot make
      (``message_not_found``, ``cant_update_message``, ``edit_window_closed``).
    """

    model_config = ConfigDict(frozen=True)

    ok: bool
    channel: str
    ts: str | None = None
    unknown: bool = False
    error: str | None = None


def scrub_slack_text(text: str, *secrets: str | None) -> str:
    """``text`` with every Slack token replaced by ``<token>``: anything shaped like one
    (``xoxb-…``, ``xoxp-…``, ``xoxe.xoxp-…``, ``xapp-…``) and each of ``secrets`` literally,
    ignoring case (secrets shorter than 6 characters are left to the pattern)."""
    if not text:
        return text
    for secret in secrets:
        literal = (secret or "").strip()
        if len(literal) >= _MIN_LITERAL:
            text = re.sub(re.escape(literal), "<token>", text, flags=re.IGNORECASE)
    return _TOKEN_RE.sub("<token>", text)


def _scrub_chain(exc: BaseException, *secrets: str | None) -> None:
    """Scrub the string ``args`` of ``exc`` and of the exceptions chained to it, in place
    (a stored run error carries them). Never raises."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 32:
        seen.add(id(current))
        try:
            args = tuple(
                scrub_slack_text(a, *secrets) if isinstance(a, str) else a for a in current.args
            )
            if args != current.args:
                current.args = args
        except Exception:  # an exotic exception is left as it is
            pass
        current = current.__cause__ or current.__context__


class _Sdk:
    """The pieces of ``slack_sdk`` this module uses, imported when a transport is made."""

    def __init__(self) -> None:
        try:
            import slack_sdk
            from slack_sdk import errors
        except ImportError as exc:
            raise InvalidArgumentError(f"SlackApiTransport needs slack_sdk: {_EXTRA_HINT}") from exc
        self.WebClient: Any = slack_sdk.WebClient
        self.SlackApiError: type[Exception] = errors.SlackApiError


def _async_pieces() -> tuple[Any, Any]:
    """aiohttp and ``slack_sdk``'s ``AsyncWebClient``, imported on the first call on asyncio."""
    try:
        import aiohttp
        from slack_sdk.web.async_client import AsyncWebClient
    except ImportError as exc:
        raise InvalidArgumentError(
            f"SlackApiTransport on asyncio needs slack_sdk and aiohttp: {_EXTRA_HINT}"
        ) from exc
    return aiohttp, AsyncWebClient


def _abandon_session(session: Any) -> None:
    """Let go of an aiohttp session of another (usually finished) event loop, which cannot be
    awaited from here: mark it closed (``detach``) and close its connector's connections, so
    neither warns as unclosed when it is collected."""
    connector = getattr(session, "connector", None)
    with contextlib.suppress(Exception):
        session.detach()
    if connector is not None:
        with contextlib.suppress(Exception):
            connector._close()  # the synchronous half of close(); nothing to await elsewhere


class _Unanswered(Exception):
    """The request went out and no answer came; it may have taken effect (internal)."""


def _sent_unanswered_aiohttp(aiohttp: Any, exc: BaseException) -> bool | None:
    """For an aiohttp failure: ``True`` when the request went out and no answer came (a
    timeout, a dropped connection), ``False`` when it was never sent (refused, DNS, a
    connect timeout), ``None`` when it is no connection failure at all."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        return False
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return True
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return True
    if isinstance(exc, aiohttp.ClientOSError):  # reset while reading the answer
        return True
    return None


def _sent_unanswered_urllib(exc: BaseException) -> bool | None:
    """For a urllib failure (the sync client): ``URLError`` wraps what failed while connecting
    or sending (``False``: not sent); a timeout, a dropped connection or a broken answer while
    reading it is ``True``; anything else ``None``."""
    if isinstance(exc, urllib.error.URLError):
        return False
    if isinstance(exc, OSError | http.client.HTTPException):  # timeouts, resets included
        return True
    return None


def _header(headers: Any, name: str) -> Any:
    """A response header by name, ignoring case (aiohttp's multidict or a plain dict)."""
    if headers is None:
        return None
    with contextlib.suppress(Exception):
        value = headers.get(name)
        if value is not None:
            return value
    with contextlib.suppress(Exception):
        for key, value in headers.items():
            if str(key).lower() == name.lower():
                return value
    return None


def _retry_after(headers: Any) -> float:
    """Seconds from a ``Retry-After`` header (1 s when it is missing or unreadable)."""
    value = _header(headers, "Retry-After")
    if isinstance(value, list | tuple):
        value = value[0] if value else None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return _DEFAULT_RETRY_AFTER
    if seconds != seconds or seconds < 0 or seconds == float("inf"):  # NaN, negative, inf
        return _DEFAULT_RETRY_AFTER
    return seconds


def _data(value: Any) -> dict[str, Any]:
    """A response's data as a dict (``{}`` when Slack sent something else)."""
    return dict(value) if isinstance(value, Mapping) else {}


def _text_field(data: Mapping[str, Any], key: str) -> str | None:
    """A non-empty string field of a response, else ``None``."""
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def _non_negative_int(value: object, what: str) -> int:
    """``value`` as a retry count, or :class:`InvalidArgumentError` saying what is wrong."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{what} must be a non-negative int, got {value!r}")
    return value


def _required(what: str, value: object) -> str:
    """A channel or ts argument, stripped; blank raises :class:`InvalidArgumentError`."""
    text = str(value).strip() if value is not None else ""
    if not text:
        raise InvalidArgumentError(f"SlackApiTransport needs a {what}, got {value!r}")
    return text


class SlackApiTransport:
    """Slack's Web API through ``slack_sdk``; see the module docstring.

    ``SlackApiTransport(token=None, *, base_url=None, timeout=10.0, max_retries=3)``:
    ``token`` defaults to ``SLACK_BOT_TOKEN``; ``base_url`` is ``slack_sdk``'s (default
    ``https://slack.com/api/``; it may name :class:`~turn_kit.slack.FakeSlackApi` on
    loopback); ``timeout`` bounds each request, in seconds; ``max_retries`` is how many 429s a
    call waits out (a call's own ``max_retries`` overrides it).

    Use ``async with SlackApiTransport(...) as t:`` or call :meth:`aclose` to close the HTTP
    session. On trio a call runs the sync client in a worker thread; cancelling it waits for
    the request to finish (at most ``timeout``) rather than abandon it half sent.
    """

    def __init__(
        self,
        token: str | None = None,
        *,
        base_url: str | None = None,
        timeout: float = 10.0,
        max_retries: int = 3,
    ) -> None:
        resolved = token if token is not None else os.environ.get(TOKEN_ENV)
        if resolved is None or not str(resolved).strip():
            raise InvalidArgumentError(
                f"SlackApiTransport needs a bot token: pass token=... or set {TOKEN_ENV}"
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < float("inf")  # NaN fails too
        ):
            raise InvalidArgumentError(f"timeout must be a positive number, got {timeout!r}")
        self.max_retries = _non_negative_int(max_retries, "max_retries")
        url = DEFAULT_BASE_URL if base_url is None else str(base_url).strip()
        if not url:
            raise InvalidArgumentError("base_url must not be blank (None means Slack's)")
        self.base_url = url if url.endswith("/") else f"{url}/"
        self.timeout = float(timeout)
        self.__token = str(resolved).strip()
        self._sdk = _Sdk()
        self._sync: Any = None
        self._aio: Any = None
        self._aio_session: Any = None
        self._aiohttp: Any = None
        self._aio_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"SlackApiTransport(base_url={self.base_url!r}, timeout={self.timeout!r})"

    # -- lifecycle ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the aiohttp session if one was made (idempotent; a later call makes a new
        one)."""
        session, loop = self._aio_session, self._aio_loop
        self._aio = self._aio_session = self._aio_loop = None
        if session is None or session.closed:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # not on asyncio (trio): the session's loop is elsewhere
            running = None
        if running is loop:
            await session.close()
        else:
            _abandon_session(session)

    async def __aenter__(self) -> SlackApiTransport:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- clients -----------------------------------------------------------------------------

    def _async_client(self) -> Any:
        """The ``AsyncWebClient`` of the running event loop, made on first use there (an
        aiohttp session belongs to the loop it was made in)."""
        loop = asyncio.get_running_loop()
        session = self._aio_session
        if self._aio is not None and self._aio_loop is loop and not session.closed:
            return self._aio
        aiohttp, async_web_client = _async_pieces()
        if session is not None and not session.closed:
            _abandon_session(session)
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        self._aio = async_web_client(
            token=self.__token,
            base_url=self.base_url,
            timeout=self.timeout,
            session=session,
            retry_handlers=[],
        )
        self._aio_session = session
        self._aiohttp = aiohttp
        self._aio_loop = loop
        return self._aio

    def _sync_client(self) -> Any:
        """The sync ``WebClient`` (urllib: no session to close), made on first use."""
        if self._sync is None:
            self._sync = self._sdk.WebClient(
                token=self.__token,
                base_url=self.base_url,
                timeout=self.timeout,
                retry_handlers=[],
            )
        return self._sync

    # -- calls -------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        return scrub_slack_text(text, self.__token)

    def _failure(self, method: str, code: str | None, detail: str | None = None) -> SlackError:
        """``SlackError("Slack <method> failed: <code>")`` (``<detail>`` when there is no
        code), scrubbed; the detail is capped at 240 characters."""
        code = self._scrub(code) if code else None
        shown = code or (self._scrub(detail)[:_DETAIL_CAP] if detail else "unexpected answer")
        return SlackError(f"Slack {method} failed: {shown}", code=code)

    async def _attempt(self, method: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """One request: the response's data. Raises the SDK's ``SlackApiError`` (Slack
        answered ``ok: false`` or 429), :class:`_Unanswered` (sent, no answer) or
        :class:`SlackError` (never sent, or the SDK broke)."""
        attr = method.replace(".", "_")  # chat.postMessage -> chat_postMessage
        sdk_error = self._sdk.SlackApiError
        if _current_async_library() == "asyncio":
            client = self._async_client()
            aiohttp = self._aiohttp
            try:
                response = await getattr(client, attr)(**kwargs)
            except sdk_error:
                raise
            except Exception as exc:
                self._raise_connection_failure(method, exc, _sent_unanswered_aiohttp(aiohttp, exc))
        else:
            call = functools.partial(getattr(self._sync_client(), attr), **kwargs)
            try:
                response = await anyio.to_thread.run_sync(call)
            except sdk_error:
                raise
            except Exception as exc:
                self._raise_connection_failure(method, exc, _sent_unanswered_urllib(exc))
        return _data(getattr(response, "data", None))

    def _raise_connection_failure(self, method: str, exc: Exception, sent: bool | None) -> NoReturn:
        """Raise what a failed request becomes: :class:`_Unanswered` when it was sent and no
        answer came, else :class:`SlackError` (nothing was sent, or the SDK broke)."""
        _scrub_chain(exc, self.__token)
        if sent:
            raise _Unanswered(type(exc).__name__) from exc
        detail = str(exc) or type(exc).__name__
        if sent is False:
            detail = f"could not reach {self.base_url} ({detail})"
        raise self._failure(method, None, f"{type(exc).__name__}: {detail}") from exc

    async def _call(
        self,
        method: str,
        kwargs: dict[str, Any],
        *,
        retries: int,
        accept: frozenset[str] = frozenset(),
        may_be_unknown: bool = False,
    ) -> dict[str, Any]:
        """Call ``method``, waiting out at most ``retries`` 429s; the response's data.

        An ``ok: false`` whose code is in ``accept`` is returned as data; any other raises
        :class:`SlackError` (:class:`SlackRateLimitedError` for a 429 not waited out). A
        request that went out without an answer raises :class:`_Unanswered` when
        ``may_be_unknown`` (the caller reports ``unknown``), else :class:`SlackError`.
        """
        waited = 0
        while True:
            try:
                return await self._attempt(method, kwargs)
            except _Unanswered as exc:
                if may_be_unknown:
                    raise
                raise self._failure(
                    method,
                    None,
                    f"no answer (timed out after {self.timeout:g}s or the connection dropped: "
                    f"{exc})",
                ) from exc.__cause__
            except self._sdk.SlackApiError as exc:
                _scrub_chain(exc, self.__token)
                response: Any = getattr(exc, "response", None)
                status = getattr(response, "status_code", None)
                data = _data(getattr(response, "data", None))
                code = _text_field(data, "error")
                if status == 429 or code == "ratelimited":
                    wait = _retry_after(getattr(response, "headers", None))
                    if waited >= retries:
                        raise SlackRateLimitedError(
                            f"Slack {method} is rate limited (Retry-After {wait:g}s; "
                            f"{waited} waited out, max_retries={retries})",
                            retry_after=wait,
                        ) from exc
                    waited += 1
                    await _sleep(wait)
                    continue
                if code is not None and code in accept:
                    return data
                detail = None
                if code is not None and not _CODE_RE.fullmatch(code):
                    detail, code = code, None  # the SDK's text for a body that was not JSON
                if code is None and status is not None and status != 200:
                    code = f"http_{status}"
                raise self._failure(method, code, detail or str(exc)) from exc

    # -- the Web API -------------------------------------------------------------------------

    async def auth_test(self) -> SlackIdentity:
        """``auth.test``: the bot's user id, bot id and team id (asked each time, not
        cached)."""
        data = await self._call("auth.test", {}, retries=self.max_retries)
        user_id = _text_field(data, "user_id")
        if user_id is None:
            raise SlackError("Slack auth.test returned no user_id")
        return SlackIdentity(
            user_id=user_id,
            bot_id=_text_field(data, "bot_id"),
            team_id=_text_field(data, "team_id"),
        )

    async def post_message(
        self,
        channel: str,
        text: str,
        *,
        thread_ts: str | None = None,
        key: str | None = None,
        max_retries: int | None = None,
    ) -> SlackSendResult:
        """``chat.postMessage``: post ``text`` as given (the caller escapes it) to ``channel``,
        in the thread ``thread_ts`` if given, links and media not unfurled.

        With ``key``, the message carries ``metadata={"event_type": DELIVERY_EVENT_TYPE,
        "event_payload": {"key": key}}`` for :meth:`find_message`. A timeout or a connection
        dropped after sending returns ``unknown=True`` (never resent).
        """
        target = _required("channel", channel)
        retries = self._retries(max_retries)
        kwargs: dict[str, Any] = {
            "channel": target,
            "text": text,
            "unfurl_links": False,
            "unfurl_media": False,
        }
        if thread_ts is not None and str(thread_ts).strip():
            kwargs["thread_ts"] = str(thread_ts).strip()
        if key is not None:
            kwargs["metadata"] = {"event_type": DELIVERY_EVENT_TYPE, "event_payload": {"key": key}}
        try:
            data = await self._call(
                "chat.postMessage", kwargs, retries=retries, may_be_unknown=True
            )
        except _Unanswered:
            return SlackSendResult(ok=False, channel=target, unknown=True)
        ts = _text_field(data, "ts")
        if ts is None:
            raise SlackError("Slack chat.postMessage answered ok without a message ts")
        return SlackSendResult(ok=True, channel=_text_field(data, "channel") or target, ts=ts)

    async def update_message(
        self, channel: str, ts: str, text: str, *, max_retries: int | None = None
    ) -> SlackSendResult:
        """``chat.update``: make message ``ts`` show ``text``.

        A message Slack cannot edit (``message_not_found``, ``cant_update_message``,
        ``edit_window_closed``) returns ``ok=False`` with that ``error`` (the caller posts
        anew); a timeout returns ``unknown=True``. The receipt's ``ts`` is the message's.
        """
        target = _required("channel", channel)
        message = _required("message ts", ts)
        retries = self._retries(max_retries)
        kwargs = {"channel": target, "ts": message, "text": text}
        try:
            data = await self._call(
                "chat.update", kwargs, retries=retries, accept=_NOT_EDITABLE, may_be_unknown=True
            )
        except _Unanswered:
            return SlackSendResult(ok=False, channel=target, ts=message, unknown=True)
        code = _text_field(data, "error")
        if data.get("ok") is not True and code is not None:
            return SlackSendResult(ok=False, channel=target, ts=message, error=code)
        return SlackSendResult(
            ok=True,
            channel=_text_field(data, "channel") or target,
            ts=_text_field(data, "ts") or message,
        )

    async def add_reaction(self, channel: str, ts: str, name: str) -> bool:
        """``reactions.add``: react to message ``ts`` with emoji ``name`` (colons optional).

        ``True`` when the reaction is there (``already_reacted`` counts); ``False`` when the
        request went unanswered (an acknowledgement is best effort). 429s are waited out as
        for any call; other errors raise :class:`SlackError`.
        """
        target = _required("channel", channel)
        message = _required("message ts", ts)
        emoji = _required("reaction name", str(name).strip().strip(":"))
        kwargs = {"channel": target, "timestamp": message, "name": emoji}
        try:
            await self._call(
                "reactions.add",
                kwargs,
                retries=self.max_retries,
                accept=frozenset({"already_reacted"}),
                may_be_unknown=True,
            )
        except _Unanswered:
            return False
        return True

    async def find_message(self, channel: str, thread_ts: str, *, key: str) -> str | None:
        """The ts of the first message in thread ``thread_ts`` posted with ``key`` (its
        metadata's ``event_type`` is :data:`DELIVERY_EVENT_TYPE` and ``event_payload.key`` is
        ``key``), else ``None``; a thread Slack does not know is ``None`` too.

        Reads ``conversations.replies`` with ``include_all_metadata``, 200 messages a page,
        following ``response_metadata.next_cursor``.
        """
        target = _required("channel", channel)
        root = _required("thread ts", thread_ts)
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(_MAX_PAGES):
            kwargs: dict[str, Any] = {
                "channel": target,
                "ts": root,
                "include_all_metadata": True,
                "limit": _REPLIES_PAGE,
            }
            if cursor:
                kwargs["cursor"] = cursor
            data = await self._call(
                "conversations.replies",
                kwargs,
                retries=self.max_retries,
                accept=frozenset({"thread_not_found"}),
            )
            if data.get("ok") is not True:
                return None  # thread_not_found
            for message in data.get("messages") or ():
                if _carries_key(message, key):
                    found = _text_field(message, "ts")
                    if found is not None:
                        return found
            meta = data.get("response_metadata")
            cursor = meta.get("next_cursor") if isinstance(meta, Mapping) else None
            if not isinstance(cursor, str) or not cursor or cursor in seen:
                return None
            seen.add(cursor)
        return None

    def _retries(self, value: int | None) -> int:
        """A call's ``max_retries`` (``None``: the transport's), checked."""
        return self.max_retries if value is None else _non_negative_int(value, "max_retries")


def _carries_key(message: object, key: str) -> bool:
    """Whether a ``conversations.replies`` message carries this delivery ``key``."""
    if not isinstance(message, Mapping):
        return False
    metadata = message.get("metadata")
    if not isinstance(metadata, Mapping) or metadata.get("event_type") != DELIVERY_EVENT_TYPE:
        return False
    payload = metadata.get("event_payload")
    return isinstance(payload, Mapping) and payload.get("key") == key
