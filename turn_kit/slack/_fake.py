"""A fake Slack Web API served over real HTTP on loopback, for tests and demos.

:class:`FakeSlackApi` runs a stdlib :class:`http.server.ThreadingHTTPServer` in a daemon thread on
``127.0.0.1`` with an ephemeral port, so sync and async code (any event loop) can talk to it
exactly as they talk to ``slack.com``::

    with FakeSlackApi() as api:
        transport = SlackApiTransport("xoxb-fake-token", base_url=api.base_url)
        client = slack_sdk.WebClient(token="xoxb-fake-token", base_url=api.base_url)

Methods are served under ``/api/<method>``, their arguments taken from the query string and
the body, JSON or form-encoded (``slack_sdk``'s sync client POSTs JSON for
``chat.postMessage``/``chat.update`` and a form for the others; its async client POSTs JSON or
puts the arguments in the query string, and GETs ``conversations.replies``):
``auth.test``, ``chat.postMessage``, ``chat.update``, ``reactions.add`` and
``conversations.replies``. As on Slack, the token comes from ``Authorization: Bearer …`` (or
a ``token`` argument); a missing one gets HTTP 200 ``{"ok": false, "error": "not_authed"}``,
a wrong one ``invalid_auth``; a method the fake does not serve gets HTTP 404
``{"ok": false, "error": "unknown_method"}`` whatever the token (Slack's answer to a method it
does not have).

Messages get unique, strictly increasing ``ts`` strings (``"1700000000.000100"``-style, from
the wall clock). The bot posts as ``bot_user_id``/``bot_id``; people's messages are added with
:meth:`FakeSlackApi.add_user_message`. ``chat.update`` edits only the bot's messages
(``message_not_found`` for an unknown ts, ``cant_update_message`` for someone else's);
``conversations.replies`` returns a thread (root and replies, oldest first), the messages'
metadata only with ``include_all_metadata``, a page at a time (``limit``,
``response_metadata.next_cursor``). A ``thread_ts`` the fake does not know is accepted by
``chat.postMessage`` (as if the root were posted elsewhere); :meth:`delete_message` removes a
message as a person deleting it would.

Failures are injected with :meth:`FakeSlackApi.fail_next`: ``"rate_limit"`` (HTTP 429 with an
integer ``Retry-After`` header and ``{"ok": false, "error": "ratelimited"}``),
``"timeout_after_store"`` (the call takes effect, then no answer comes: the handler waits
``hang`` seconds and drops the connection) and ``"error"`` (HTTP 200 with ``{"ok": false,
"error": error}``, nothing done).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import math
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal
from urllib.parse import urlsplit

from .._loopback import (
    BadBody,
    Failure,
    FailureQueues,
    Hang,
    LoopbackHandler,
    LoopbackServer,
)
from ._parse import ts_order

__all__ = ["FailureKind", "FakeSlackApi"]

FailureKind = Literal["rate_limit", "timeout_after_store", "error"]
_KINDS = ("rate_limit", "timeout_after_store", "error")

_TEXT_LIMIT = 40_000
_REPLIES_DEFAULT_LIMIT = 1000
_CURSOR_PREFIX = "next_ts:"
_TRUE = frozenset({"1", "true", "yes", "on"})
_BAD_BODY = {
    "charset": "invalid_charset",
    "json": "invalid_json",
    "content_type": "invalid_post_type",
}


class _ApiError(Exception):
    """An ``{"ok": false, "error": code}`` answer (HTTP ``status``, 200 as Slack sends most)."""

    def __init__(self, code: str, *, status: int = 200, headers: Mapping[str, str] | None = None):
        super().__init__(code)
        self.code = code
        self.status = status
        self.headers = dict(headers or {})


def _flag(value: object) -> bool:
    """A boolean argument: JSON ``true`` or a form's ``"1"``/``"true"``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    return isinstance(value, str) and value.strip().lower() in _TRUE


def _string(value: object) -> str | None:
    """A string argument (a JSON number as its text), stripped; blank is ``None``."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    return text or None


def _cursor(ts: str) -> str:
    """An opaque cursor naming the first message of the next page (base64, as Slack's)."""
    return base64.b64encode(f"{_CURSOR_PREFIX}{ts}".encode()).decode("ascii")


def _cursor_ts(cursor: str) -> str:
    """The ts a cursor names; ``invalid_cursor`` when it is not one of ours."""
    try:
        text = base64.b64decode(cursor.encode("ascii"), validate=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeError):
        raise _ApiError("invalid_cursor") from None
    if not text.startswith(_CURSOR_PREFIX):
        raise _ApiError("invalid_cursor")
    return text[len(_CURSOR_PREFIX) :]


def _metadata(value: object) -> dict[str, Any] | None:
    """``chat.postMessage``'s ``metadata`` (an object, or its JSON text in a form)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _ApiError("invalid_metadata_format") from None
    if not isinstance(value, Mapping):
        raise _ApiError("invalid_metadata_format")
    event_type = value.get("event_type")
    payload = value.get("event_payload")
    if not isinstance(event_type, str) or not event_type or not isinstance(payload, Mapping):
        raise _ApiError("invalid_metadata_schema")
    return {"event_type": event_type, "event_payload": copy.deepcopy(dict(payload))}


class FakeSlackApi(LoopbackServer):
    """A fake Slack Web API over real loopback HTTP (see the module docstring).

    Thread-safe: the server answers on its own threads, one lock guards the state, and the
    inspection helpers (:attr:`messages`, :attr:`posts`, :attr:`updates`, :attr:`reactions`,
    :attr:`calls`, :meth:`replies`) return copies.
    """

    _name = "FakeSlackApi"

    def __init__(
        self,
        *,
        token: str = "xoxb-fake-token",
        bot_user_id: str = "UBOT",
        bot_id: str = "BBOT",
        team_id: str = "T0001",
        host: str = "127.0.0.1",
    ) -> None:
        self.token = token
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.team_id = team_id
        super().__init__(host=host)
        self._lock = threading.Lock()
        self._last_ts = 0  # microseconds of the newest ts handed out
        self._messages: list[dict[str, Any]] = []  # in ts order
        self._by_ts: dict[tuple[str, str], dict[str, Any]] = {}
        self._posts: list[dict[str, Any]] = []
        self._updates: list[dict[str, Any]] = []
        self._reactions: list[dict[str, Any]] = []
        self._calls: list[dict[str, Any]] = []
        self._failures = FailureQueues()

    # -- lifecycle (start, __enter__/__exit__ and port from LoopbackServer) ------------------

    def stop(self) -> None:
        """Stop serving (idempotent); ends withheld (``timeout_after_store``) answers."""
        super().stop()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        return _make_handler(self)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/api/``: a ``base_url`` for :class:`SlackApiTransport` and
        ``slack_sdk``'s clients."""
        return f"{super().base_url}/api/"

    # -- inspection --------------------------------------------------------------------------

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Every message as it reads now (edits applied, deleted ones gone), in ts order:
        channel, ts, thread_ts (``None`` for a top-level message), text, user, bot_id
        (``None`` for a person's), metadata (``None`` when it has none)."""
        with self._lock:
            return [_view(m) for m in self._messages]

    @property
    def posts(self) -> list[dict[str, Any]]:
        """The accepted ``chat.postMessage`` requests, in order: channel, ts, thread_ts, text,
        metadata."""
        with self._lock:
            return copy.deepcopy(self._posts)

    @property
    def updates(self) -> list[dict[str, Any]]:
        """The applied ``chat.update`` requests, in order: channel, ts, text and ``at`` (the
        ``time.time()`` it was applied at, the clock of :attr:`calls`)."""
        with self._lock:
            return copy.deepcopy(self._updates)

    @property
    def reactions(self) -> list[dict[str, Any]]:
        """The added reactions, in order: channel, ts, name, user."""
        with self._lock:
            return copy.deepcopy(self._reactions)

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Every request to ``/api/<method>``, in order: method, params (without the token;
        ``{}`` for a method the fake does not serve), status (the HTTP status; 0 for a
        withheld answer), error (the ``error`` code, ``None`` when ok) and ``at``
        (``time.time()``)."""
        with self._lock:
            return copy.deepcopy(self._calls)

    def replies(self, channel: str, thread_ts: str) -> list[dict[str, Any]]:
        """The bot's replies in thread ``thread_ts`` of ``channel`` (as :attr:`messages`)."""
        with self._lock:
            return [
                _view(m)
                for m in self._messages
                if m["channel"] == channel
                and m["thread_ts"] == thread_ts
                and m["ts"] != thread_ts
                and m["user"] == self.bot_user_id
            ]

    # -- test input --------------------------------------------------------------------------

    def add_user_message(
        self, channel: str, text: str, *, user: str = "U1", thread_ts: str | None = None
    ) -> str:
        """Add a person's message (in thread ``thread_ts`` if given, a reply's ts standing for
        its thread's root) and return its ts."""
        with self._lock:
            message = self._store(channel, text, user=user, bot_id=None, thread_ts=thread_ts)
        return str(message["ts"])

    def delete_message(self, channel: str, ts: str) -> None:
        """Remove a message, as a person deleting it would (``KeyError`` if there is none)."""
        with self._lock:
            message = self._by_ts.pop((channel, ts))
            self._messages.remove(message)

    def fail_next(
        self,
        method: str,
        kind: FailureKind,
        *,
        times: int = 1,
        retry_after: float = 1.0,
        channel: str | None = None,
        hang: float = 2.0,
        error: str | None = None,
    ) -> None:
        """Make the next ``times`` calls of ``method`` (optionally only those for ``channel``)
        fail with ``kind`` (see the module docstring).

        ``retry_after`` is sent as an integer ``Retry-After`` header, rounded up (as Slack
        sends it); ``hang`` bounds how long a ``"timeout_after_store"`` answer is withheld
        before the connection is dropped (stopping the server ends it at once); ``error`` is
        the code of an ``"error"``.
        """
        if kind not in _KINDS:
            raise ValueError(f"unknown failure kind {kind!r}; expected one of {_KINDS}")
        if isinstance(times, bool) or not isinstance(times, int) or times < 1:
            raise ValueError(f"times must be an int >= 1, got {times!r}")
        if not retry_after >= 0:
            raise ValueError(f"retry_after must be >= 0, got {retry_after!r}")
        if not hang >= 0:
            raise ValueError(f"hang must be >= 0, got {hang!r}")
        if kind == "error" and not error:
            raise ValueError('fail_next(..., "error") needs error="<slack error code>"')
        failure = Failure(
            kind, times=times, retry_after=retry_after, hang=hang, target=channel, error=error
        )
        with self._lock:
            self._failures.add(method, failure)

    # -- state (the caller holds self._lock) -------------------------------------------------

    def _next_ts(self) -> str:
        now = time.time_ns() // 1000
        self._last_ts = max(now, self._last_ts + 1)
        return f"{self._last_ts // 1_000_000}.{self._last_ts % 1_000_000:06d}"

    def _store(
        self,
        channel: str,
        text: str,
        *,
        user: str,
        bot_id: str | None,
        thread_ts: str | None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if thread_ts is not None:
            parent = self._by_ts.get((channel, thread_ts))
            if parent is not None and parent["thread_ts"] is not None:
                thread_ts = parent["thread_ts"]  # a reply's ts stands for its thread
        message: dict[str, Any] = {
            "channel": channel,
            "ts": self._next_ts(),
            "thread_ts": thread_ts,
            "text": text,
            "user": user,
            "bot_id": bot_id,
            "metadata": metadata,
            "edited": None,
        }
        self._messages.append(message)
        self._by_ts[(channel, message["ts"])] = message
        return message

    def _take_failure(self, method: str, params: Mapping[str, Any]) -> Failure | None:
        return self._failures.take(method, _string(params.get("channel")))

    def _public(self, message: Mapping[str, Any], *, with_metadata: bool) -> dict[str, Any]:
        """A message as the Web API shows it."""
        out: dict[str, Any] = {
            "type": "message",
            "user": message["user"],
            "text": message["text"],
            "ts": message["ts"],
            "team": self.team_id,
        }
        if message["bot_id"] is not None:
            out["bot_id"] = message["bot_id"]
        thread_ts = message["thread_ts"]
        if thread_ts is not None:
            out["thread_ts"] = thread_ts
            root = self._by_ts.get((message["channel"], thread_ts))
            if root is not None:
                out["parent_user_id"] = root["user"]
        else:
            count = sum(
                1
                for m in self._messages
                if m["channel"] == message["channel"] and m["thread_ts"] == message["ts"]
            )
            if count:
                out["thread_ts"] = message["ts"]
                out["reply_count"] = count
        if message["edited"] is not None:
            out["edited"] = dict(message["edited"])
        if with_metadata and message["metadata"] is not None:
            out["metadata"] = copy.deepcopy(message["metadata"])
        return out

    # -- serving -----------------------------------------------------------------------------

    def _dispatch(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        handler = _METHODS[method]
        with self._lock:
            failure = self._take_failure(method, params)
        if failure is not None and failure.kind == "rate_limit":
            seconds = max(0, math.ceil(failure.retry_after))
            raise _ApiError("ratelimited", status=429, headers={"Retry-After": str(seconds)})
        if failure is not None and failure.kind == "error":
            raise _ApiError(str(failure.error))
        result: dict[str, Any] = handler(self, params)
        if failure is not None and failure.kind == "timeout_after_store":
            raise Hang(failure.hang)
        return result

    def _auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": "https://fake-workspace.slack.com/",
            "team": "Fake Workspace",
            "user": "bot",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = _string(params.get("channel"))
        if channel is None:
            raise _ApiError("channel_not_found")
        text = params.get("text")
        if not isinstance(text, str) or not text:
            raise _ApiError("no_text")
        if len(text) > _TEXT_LIMIT:
            raise _ApiError("msg_too_long")
        metadata = _metadata(params.get("metadata"))
        thread_ts = _string(params.get("thread_ts"))
        with self._lock:
            message = self._store(
                channel,
                text,
                user=self.bot_user_id,
                bot_id=self.bot_id,
                thread_ts=thread_ts,
                metadata=metadata,
            )
            self._posts.append(
                {
                    "channel": channel,
                    "ts": message["ts"],
                    "thread_ts": message["thread_ts"],
                    "text": text,
                    "metadata": copy.deepcopy(metadata),
                }
            )
            public = self._public(message, with_metadata=True)
        return {"channel": channel, "ts": message["ts"], "message": public}

    def _update(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = _string(params.get("channel"))
        if channel is None:
            raise _ApiError("channel_not_found")
        ts = _string(params.get("ts"))
        text = params.get("text")
        with self._lock:
            message = self._by_ts.get((channel, ts or ""))
            if message is None:
                raise _ApiError("message_not_found")
            if message["user"] != self.bot_user_id:
                raise _ApiError("cant_update_message")
            if not isinstance(text, str) or not text:
                raise _ApiError("no_text")
            if len(text) > _TEXT_LIMIT:
                raise _ApiError("msg_too_long")
            message["text"] = text
            message["edited"] = {"user": self.bot_user_id, "ts": self._next_ts()}
            self._updates.append({"channel": channel, "ts": ts, "text": text, "at": time.time()})
            public = self._public(message, with_metadata=False)
        return {"channel": channel, "ts": ts, "text": text, "message": public}

    def _reactions_add(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = _string(params.get("channel"))
        if channel is None:
            raise _ApiError("channel_not_found")
        ts = _string(params.get("timestamp"))
        name = _string(params.get("name"))
        if name is None:
            raise _ApiError("invalid_name")
        with self._lock:
            if (channel, ts or "") not in self._by_ts:
                raise _ApiError("message_not_found")
            entry = {"channel": channel, "ts": ts, "name": name, "user": self.bot_user_id}
            if entry in self._reactions:
                raise _ApiError("already_reacted")
            self._reactions.append(entry)
        return {}

    def _replies(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = _string(params.get("channel"))
        if channel is None:
            raise _ApiError("channel_not_found")
        ts = _string(params.get("ts"))
        if ts is None:
            raise _ApiError("thread_not_found")
        try:
            limit = int(params.get("limit") or _REPLIES_DEFAULT_LIMIT)
        except (TypeError, ValueError):
            raise _ApiError("invalid_limit") from None
        limit = max(1, min(limit, _REPLIES_DEFAULT_LIMIT))
        raw_cursor = _string(params.get("cursor"))
        start = _cursor_ts(raw_cursor) if raw_cursor else None
        with_metadata = _flag(params.get("include_all_metadata"))
        with self._lock:
            message = self._by_ts.get((channel, ts))
            root_ts = ts if message is None else (message["thread_ts"] or message["ts"])
            thread = [
                m
                for m in self._messages
                if m["channel"] == channel and (m["ts"] == root_ts or m["thread_ts"] == root_ts)
            ]
            if not thread:
                raise _ApiError("thread_not_found")
            if start is not None:
                first = ts_order(start) or (0, 0)
                thread = [m for m in thread if (ts_order(m["ts"]) or (0, 0)) >= first]
            page, rest = thread[:limit], thread[limit:]
            messages = [self._public(m, with_metadata=with_metadata) for m in page]
        return {
            "messages": messages,
            "has_more": bool(rest),
            "response_metadata": {"next_cursor": _cursor(rest[0]["ts"]) if rest else ""},
        }

    def _record(
        self, method: str, params: Mapping[str, Any], status: int, error: str | None
    ) -> None:
        shown = {k: v for k, v in params.items() if k != "token"}
        with self._lock:
            self._calls.append(
                {
                    "method": method,
                    "params": copy.deepcopy(shown),
                    "status": status,
                    "error": error,
                    "at": time.time(),
                }
            )


def _view(message: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message as :attr:`FakeSlackApi.messages` shows it (a copy)."""
    return {
        "channel": message["channel"],
        "ts": message["ts"],
        "thread_ts": message["thread_ts"],
        "text": message["text"],
        "user": message["user"],
        "bot_id": message["bot_id"],
        "metadata": copy.deepcopy(message["metadata"]),
    }


_METHODS: dict[str, Any] = {
    "auth.test": FakeSlackApi._auth_test,
    "chat.postMessage": FakeSlackApi._post_message,
    "chat.update": FakeSlackApi._update,
    "reactions.add": FakeSlackApi._reactions_add,
    "conversations.replies": FakeSlackApi._replies,
}


def _make_handler(api: FakeSlackApi) -> type[BaseHTTPRequestHandler]:
    """The request handler class serving ``api``."""

    class Handler(LoopbackHandler):
        """Answers ``/api/<method>`` as Slack's Web API does."""

        server_version = "FakeSlackApi/1.0"
        json_content_type = "application/json; charset=utf-8"

        def _handle(self, *, body: bytes) -> None:
            path = urlsplit(self.path)
            segments = path.path.strip("/").split("/")
            method = segments[1] if len(segments) == 2 and segments[0] == "api" else ""
            if method not in _METHODS:
                if method:
                    api._record(method, {}, 404, "unknown_method")
                self._reply(404, {"ok": False, "error": "unknown_method", "req_method": method})
                return
            try:
                params = self._params(path.query, body)
            except _ApiError as exc:
                api._record(method, {}, exc.status, exc.code)
                self._reply(exc.status, {"ok": False, "error": exc.code})
                return
            error = self._auth_error(params)
            if error is not None:
                api._record(method, params, 200, error)
                self._reply(200, {"ok": False, "error": error})
                return
            try:
                result = api._dispatch(method, params)
            except _ApiError as exc:
                api._record(method, params, exc.status, exc.code)
                self._reply(exc.status, {"ok": False, "error": exc.code}, exc.headers)
                return
            except Hang as hang:
                api._record(method, params, 0, None)
                self._withhold(api._stopping, hang.seconds)
                return
            api._record(method, params, 200, None)
            self._reply(200, {"ok": True, **result})

        def _auth_error(self, params: Mapping[str, Any]) -> str | None:
            """``not_authed`` / ``invalid_auth`` / ``None`` (the token is right)."""
            header = (self.headers.get("Authorization") or "").strip()
            token = header[7:].strip() if header.lower().startswith("bearer ") else ""
            if not token:
                token = _string(params.get("token")) or ""
            if not token:
                return "not_authed"
            return None if token == api.token else "invalid_auth"

        def _params(self, query: str, body: bytes) -> dict[str, Any]:
            try:
                return super()._params(query, body)
            except BadBody as exc:
                raise _ApiError(_BAD_BODY[exc.reason]) from None

    return Handler
