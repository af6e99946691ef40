"""A fake Telegram Bot API served over real HTTP on loopback, for tests and the demo.

:class:`FakeBotApi` runs a stdlib :class:`http.server.ThreadingHTTPServer` in a daemon thread on
``127.0.0.1`` with an ephemeral port, so sync and async code (any event loop) can talk to it
exactly as they talk to ``api.telegram.org``::

    with FakeBotApi(token="123:abc") as api:
        transport = BotApiTransport("123:abc", base_url=api.base_url)
        bot = telegram.Bot("123:abc", base_url=f"{api.base_url}/bot")

Methods are served under ``/bot<token>/<method>`` for ``GET`` (query string) and ``POST``
(JSON, form-encoded as python-telegram-bot sends them, or query string): ``getMe``,
``getUpdates``, ``sendMessage``, ``editMessageText``, ``sendChatAction``, ``setWebhook``,
``deleteWebhook`` and ``getWebhookInfo``. A wrong token gets 401 ``Unauthorized``; an unknown
method 404. ``editMessageText`` edits a message the bot sent, as Telegram does: 400 "message
to edit not found" for another one, 400 "message is not modified" for its current text;
:attr:`FakeBotApi.edits` records the edits and :attr:`FakeBotApi.messages` shows the
messages as they read now. As on
Telegram, ``getUpdates`` answers 409 Conflict while a webhook is set, and a ``getUpdates``
still waiting when another one arrives is ended with 409 "terminated by other getUpdates
request" (two pollers of one bot show up as 409s in :attr:`FakeBotApi.calls`).

Failures are injected with :meth:`FakeBotApi.fail_next`: ``"rate_limit"`` (429 with
``parameters.retry_after``), ``"timeout_after_store"`` (the message is stored, then the response
never comes: the handler waits ``hang`` seconds and drops the connection) and
``"thread_not_found"`` (400 "Bad Request: message thread not found", only for a request that
carries a ``message_thread_id``).

Constructing one installs the token-redacting log filter (its clients log URLs that carry the
token), as every Telegram component does.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal
from urllib.parse import urlsplit

from .._loopback import Failure, FailureQueues, Hang, LoopbackHandler, LoopbackServer
from ._redact import install_token_redaction

__all__ = ["FailureKind", "FakeBotApi"]

FailureKind = Literal["rate_limit", "timeout_after_store", "thread_not_found"]
_KINDS = ("rate_limit", "timeout_after_store", "thread_not_found")

_TEXT_LIMIT = 4096
_TERMINATED = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance "
    "is running"
)
_INT_FIELDS = frozenset(
    {
        "message_thread_id",
        "reply_to_message_id",
        "message_id",
        "offset",
        "limit",
        "max_connections",
    }
)
_NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup "
    "are exactly the same as a current content and reply markup of the message"
)
_JSON_FIELDS = frozenset(
    {"reply_parameters", "reply_markup", "allowed_updates", "link_preview_options", "entities"}
)
_BOOL_FIELDS = frozenset(
    {"drop_pending_updates", "disable_notification", "protect_content", "allow_paid_broadcast"}
)


class _ApiError(Exception):
    def __init__(
        self, status: int, description: str, parameters: dict[str, Any] | None = None
    ) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": False,
            "error_code": self.status,
            "description": self.description,
        }
        if self.parameters:
            out["parameters"] = self.parameters
        return out


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _chat_value(value: Any) -> int | str:
    text = str(value).strip()
    try:
        return int(text)
    except ValueError:
        return text


def _chat_type(chat_id: int | str) -> str:
    if isinstance(chat_id, str):
        return "channel"
    return "private" if chat_id > 0 else "supergroup"


def _coerce(params: Mapping[str, Any]) -> dict[str, Any]:
    """Form values arrive as strings (objects JSON-encoded); make them look like JSON input."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, str):
            stripped = value.strip()
            try:
                if key in _INT_FIELDS:
                    out[key] = int(stripped)
                    continue
                if key in _JSON_FIELDS:
                    out[key] = json.loads(stripped)
                    continue
                if key in _BOOL_FIELDS and stripped in ("true", "false"):
                    out[key] = stripped == "true"
                    continue
                if key == "timeout":
                    out[key] = float(stripped)
                    continue
            except ValueError:
                pass
        out[key] = value
    return out


class FakeBotApi(LoopbackServer):
    """A fake Telegram Bot API over real loopback HTTP (see the module docstring).

    Thread-safe: the server answers on its own threads, and the inspection helpers
    (:attr:`sent`, :attr:`actions`, :attr:`calls`, :attr:`webhook`) return snapshots.
    """

    _name = "FakeBotApi"

    def __init__(
        self,
        token: str = "123:abc",
        *,
        host: str = "127.0.0.1",
        username: str = "fake_bot",
        long_poll_cap: float = 5.0,
    ) -> None:
        install_token_redaction(token)
        super().__init__(host=host)
        self.token = token
        self.username = username
        self.long_poll_cap = long_poll_cap
        head = token.split(":", 1)[0]
        self.bot_id = int(head) if head.isdigit() else 1
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._updates: list[dict[str, Any]] = []
        self._next_update_id = 1
        self._polls = 0  # getUpdates calls so far: a newer one ends a waiting one
        self._message_ids: dict[int | str, int] = {}
        self._sent: list[dict[str, Any]] = []
        self._by_id: dict[tuple[int | str, int], dict[str, Any]] = {}  # (chat, id) -> sent
        self._shown: dict[tuple[int | str, int], str] = {}  # (chat, id) -> edited text
        self._edits: list[dict[str, Any]] = []
        self._actions: list[dict[str, Any]] = []
        self._calls: list[dict[str, Any]] = []
        self._webhook: dict[str, Any] | None = None
        self._failures = FailureQueues()

    # -- lifecycle (start, __enter__/__exit__ and port from LoopbackServer) ------------------

    def stop(self) -> None:
        """Stop serving; wakes long polls and hung responses."""
        super().stop()

    def _on_stop(self) -> None:
        with self._cond:
            self._cond.notify_all()  # long polls see _stopping and answer now

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        return _make_handler(self)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` (python-telegram-bot wants ``f"{base_url}/bot"``)."""
        return super().base_url

    # -- inspection --------------------------------------------------------------------------

    @property
    def sent(self) -> list[dict[str, Any]]:
        """Messages stored by ``sendMessage``: chat_id, text, reply_to_message_id,
        message_thread_id, message_id (a snapshot)."""
        with self._lock:
            return [dict(m) for m in self._sent]

    @property
    def edits(self) -> list[dict[str, Any]]:
        """Successful ``editMessageText`` calls: chat_id, message_id, text and ``at`` (the
        ``time.time()`` it was applied at, the clock of :attr:`calls`), in order (a
        snapshot)."""
        with self._lock:
            return [dict(e) for e in self._edits]

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The bot's messages as they read now: :attr:`sent`'s entries with the text of their
        last edit, plus ``edits`` (how many times each was edited), in send order."""
        with self._lock:
            out = []
            for sent in self._sent:
                key = (sent["chat_id"], sent["message_id"])
                edits = sum(1 for e in self._edits if (e["chat_id"], e["message_id"]) == key)
                out.append({**sent, "text": self._shown.get(key, sent["text"]), "edits": edits})
            return out

    @property
    def actions(self) -> list[dict[str, Any]]:
        """``sendChatAction`` calls: chat_id, action, message_thread_id (a snapshot)."""
        with self._lock:
            return [dict(a) for a in self._actions]

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Every request with a valid token: method, params, status and ``at`` (the
        ``time.time()`` it was answered at, the clock of :attr:`edits`) (a snapshot)."""
        with self._lock:
            return [dict(c) for c in self._calls]

    @property
    def webhook(self) -> dict[str, Any] | None:
        """The ``setWebhook`` parameters, or ``None`` (never set or deleted)."""
        with self._lock:
            return dict(self._webhook) if self._webhook is not None else None

    def pending_updates(self) -> list[dict[str, Any]]:
        """Updates not yet confirmed by a ``getUpdates`` offset."""
        with self._lock:
            return [dict(u) for u in self._updates]

    # -- test input --------------------------------------------------------------------------

    def push_update(self, update: Mapping[str, Any]) -> int:
        """Queue an update for ``getUpdates``; assigns and returns its ``update_id``."""
        with self._cond:
            update_id = self._next_update_id
            self._next_update_id += 1
            self._updates.append({**dict(update), "update_id": update_id})
            self._cond.notify_all()
            return update_id

    def push_message(
        self,
        chat_id: int | str,
        text: str,
        *,
        message_thread_id: int | None = None,
        is_topic_message: bool | None = None,
        from_is_bot: bool = False,
        reply_to: Mapping[str, Any] | str | None = None,
        chat_type: str | None = None,
        from_id: int | None = None,
    ) -> dict[str, Any]:
        """Queue a realistic ``message`` update from a user and return the whole update."""
        chat = _chat_value(chat_id)
        with self._lock:
            message_id = self._next_message_id(chat)
        kind = chat_type or _chat_type(chat)
        sender_id = from_id if from_id is not None else (chat if isinstance(chat, int) else 42)
        if not isinstance(sender_id, int) or sender_id <= 0:
            sender_id = 42
        chat_obj: dict[str, Any] = {"id": chat, "type": kind}
        if kind == "private":
            chat_obj["first_name"] = "Test"
        else:
            chat_obj["title"] = "Test chat"
            if is_topic_message:
                chat_obj["is_forum"] = True
        message: dict[str, Any] = {
            "message_id": message_id,
            "date": int(time.time()),
            "chat": chat_obj,
            "from": {
                "id": sender_id,
                "is_bot": from_is_bot,
                "first_name": "Bot" if from_is_bot else "Test",
            },
            "text": text,
        }
        if message_thread_id is not None:
            message["message_thread_id"] = message_thread_id
        if is_topic_message is not None:
            message["is_topic_message"] = is_topic_message
        if reply_to is not None:
            if isinstance(reply_to, str):
                with self._lock:
                    reply_id = self._next_message_id(chat)
                replied: dict[str, Any] = {
                    "message_id": reply_id,
                    "date": int(time.time()),
                    "chat": dict(chat_obj),
                    "text": reply_to,
                }
            else:
                replied = dict(reply_to)
            message["reply_to_message"] = replied
        update: dict[str, Any] = {"message": message}
        update_id = self.push_update(update)
        return {"update_id": update_id, **update}

    def fail_next(
        self,
        method: str,
        kind: FailureKind,
        *,
        retry_after: float = 1,
        times: int = 1,
        chat_id: int | str | None = None,
        hang: float = 30.0,
    ) -> None:
        """Make the next ``times`` calls of ``method`` (optionally only to ``chat_id``) fail.

        ``hang`` bounds how long a ``"timeout_after_store"`` response is withheld before the
        connection is dropped; stopping the server ends it at once.
        """
        if kind not in _KINDS:
            raise ValueError(f"unknown failure kind {kind!r}; expected one of {_KINDS}")
        if times < 1:
            raise ValueError("times must be >= 1")
        chat = None if chat_id is None else str(_chat_value(chat_id))
        failure = Failure(kind, times=times, retry_after=retry_after, hang=hang, target=chat)
        with self._lock:
            self._failures.add(method, failure)

    # -- serving -----------------------------------------------------------------------------

    def _next_message_id(self, chat: int | str) -> int:
        # caller holds self._lock
        value = self._message_ids.get(chat, 0) + 1
        self._message_ids[chat] = value
        return value

    def _take_failure(self, method: str, params: Mapping[str, Any]) -> Failure | None:
        # caller holds self._lock; "thread_not_found" fails only a call in a topic
        return self._failures.take(
            method,
            str(_chat_value(params.get("chat_id", ""))),
            applies=lambda f: f.kind != "thread_not_found" or bool(params.get("message_thread_id")),
        )

    def _dispatch(self, method: str, params: dict[str, Any]) -> Any:
        handler = _METHODS.get(method)
        if handler is None:
            raise _ApiError(404, "Not Found")
        with self._lock:
            failure = self._take_failure(method, params)
        if failure is not None and failure.kind == "rate_limit":
            seconds = failure.retry_after
            shown = int(seconds) if float(seconds).is_integer() else seconds
            raise _ApiError(429, f"Too Many Requests: retry after {shown}", {"retry_after": shown})
        if failure is not None and failure.kind == "thread_not_found":
            raise _ApiError(400, "Bad Request: message thread not found")
        result = handler(self, params)
        if failure is not None and failure.kind == "timeout_after_store":
            raise Hang(failure.hang)
        return result

    def _get_me(self, params: dict[str, Any]) -> Any:
        return {
            "id": self.bot_id,
            "is_bot": True,
            "first_name": "Fake Bot",
            "username": self.username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    def _get_updates(self, params: dict[str, Any]) -> Any:
        offset = params.get("offset")
        limit = int(params.get("limit") or 100)
        limit = max(1, min(limit, 100))
        try:
            wait = float(params.get("timeout") or 0)
        except (TypeError, ValueError):
            wait = 0.0
        wait = max(0.0, min(wait, self.long_poll_cap))
        deadline = time.monotonic() + wait
        with self._cond:
            if self._webhook is not None:
                raise _ApiError(
                    409,
                    "Conflict: can't use getUpdates method while webhook is active; "
                    "use deleteWebhook to delete the webhook first",
                )
            # As Telegram does, a new getUpdates ends the one still waiting (it gets a 409).
            self._polls += 1
            mine = self._polls
            self._cond.notify_all()
            if offset is not None:
                offset = int(offset)
                if offset < 0:
                    self._updates = self._updates[offset:]
                else:
                    self._updates = [u for u in self._updates if u["update_id"] >= offset]
            while not self._updates and not self._stopping.is_set():
                if self._polls != mine:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if self._polls != mine:
                raise _ApiError(409, _TERMINATED)
            return [dict(u) for u in self._updates[:limit]]

    def _send_message(self, params: dict[str, Any]) -> Any:
        raw_chat = params.get("chat_id")
        if raw_chat is None or str(raw_chat).strip() == "":
            raise _ApiError(400, "Bad Request: chat_id is empty")
        text = params.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _ApiError(400, "Bad Request: message text is empty")
        if _utf16_len(text) > _TEXT_LIMIT:
            raise _ApiError(400, "Bad Request: message is too long")
        chat = _chat_value(raw_chat)
        thread = params.get("message_thread_id")
        reply_to = params.get("reply_to_message_id")
        reply_parameters = params.get("reply_parameters")
        if reply_to is None and isinstance(reply_parameters, Mapping):
            reply_to = reply_parameters.get("message_id")
        with self._lock:
            message_id = self._next_message_id(chat)
            entry = {
                "chat_id": chat,
                "text": text,
                "reply_to_message_id": reply_to,
                "message_thread_id": thread,
                "message_id": message_id,
            }
            self._sent.append(entry)
            self._by_id[(chat, message_id)] = entry
        message = self._bot_message(chat, message_id, text, thread)
        if reply_to is not None:
            message["reply_to_message"] = {
                "message_id": reply_to,
                "date": int(time.time()),
                "chat": dict(message["chat"]),
            }
        return message

    def _edit_message_text(self, params: dict[str, Any]) -> Any:
        raw_chat = params.get("chat_id")
        if raw_chat is None or str(raw_chat).strip() == "":
            raise _ApiError(400, "Bad Request: chat_id is empty")
        text = params.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _ApiError(400, "Bad Request: message text is empty")
        if _utf16_len(text) > _TEXT_LIMIT:
            raise _ApiError(400, "Bad Request: MESSAGE_TOO_LONG")
        chat = _chat_value(raw_chat)
        raw_id: Any = params.get("message_id")
        try:
            message_id = int(raw_id)
        except (TypeError, ValueError):
            raise _ApiError(400, "Bad Request: message identifier is not specified") from None
        key = (chat, message_id)
        with self._lock:
            sent = self._by_id.get(key)
            if sent is None:
                raise _ApiError(400, "Bad Request: message to edit not found")
            if self._shown.get(key, sent["text"]) == text:
                raise _ApiError(400, _NOT_MODIFIED)
            self._shown[key] = text
            self._edits.append(
                {"chat_id": chat, "message_id": message_id, "text": text, "at": time.time()}
            )
            thread = sent["message_thread_id"]
        message = self._bot_message(chat, message_id, text, thread)
        message["edit_date"] = message["date"]
        return message

    def _bot_message(
        self, chat: int | str, message_id: int, text: str, thread: int | None
    ) -> dict[str, Any]:
        """A message of this bot, as the Bot API returns it (in its topic, if any)."""
        message: dict[str, Any] = {
            "message_id": message_id,
            "date": int(time.time()),
            "chat": {"id": chat, "type": _chat_type(chat)},
            "from": {
                "id": self.bot_id,
                "is_bot": True,
                "first_name": "Fake Bot",
                "username": self.username,
            },
            "text": text,
        }
        if thread is not None:
            message["message_thread_id"] = thread
            message["is_topic_message"] = True
        return message

    def _send_chat_action(self, params: dict[str, Any]) -> Any:
        raw_chat = params.get("chat_id")
        if raw_chat is None or str(raw_chat).strip() == "":
            raise _ApiError(400, "Bad Request: chat_id is empty")
        action = params.get("action")
        if not action:
            raise _ApiError(400, "Bad Request: action is empty")
        with self._lock:
            self._actions.append(
                {
                    "chat_id": _chat_value(raw_chat),
                    "action": action,
                    "message_thread_id": params.get("message_thread_id"),
                }
            )
        return True

    def _set_webhook(self, params: dict[str, Any]) -> Any:
        url = params.get("url")
        with self._lock:
            self._webhook = dict(params) if url else None
        return True

    def _delete_webhook(self, params: dict[str, Any]) -> Any:
        with self._lock:
            self._webhook = None
            if params.get("drop_pending_updates"):
                self._updates.clear()
        return True

    def _get_webhook_info(self, params: dict[str, Any]) -> Any:
        with self._lock:
            hook = self._webhook
            return {
                "url": (hook or {}).get("url", ""),
                "has_custom_certificate": False,
                "pending_update_count": len(self._updates),
            }

    def _record(self, method: str, params: dict[str, Any], status: int) -> None:
        with self._lock:
            self._calls.append(
                {"method": method, "params": dict(params), "status": status, "at": time.time()}
            )


_METHODS: dict[str, Any] = {
    "getMe": FakeBotApi._get_me,
    "getUpdates": FakeBotApi._get_updates,
    "sendMessage": FakeBotApi._send_message,
    "editMessageText": FakeBotApi._edit_message_text,
    "sendChatAction": FakeBotApi._send_chat_action,
    "setWebhook": FakeBotApi._set_webhook,
    "deleteWebhook": FakeBotApi._delete_webhook,
    "getWebhookInfo": FakeBotApi._get_webhook_info,
}


def _make_handler(api: FakeBotApi) -> type[BaseHTTPRequestHandler]:
    class Handler(LoopbackHandler):
        server_version = "FakeBotApi/1.0"

        def _handle(self, *, body: bytes) -> None:
            parts = urlsplit(self.path)
            segments = parts.path.strip("/").split("/")
            if len(segments) != 2 or not segments[0].startswith("bot"):
                self._reply(404, {"ok": False, "error_code": 404, "description": "Not Found"})
                return
            token, method = segments[0][3:], segments[1]
            if token != api.token:
                self._reply(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
                return
            try:
                params = self._params(parts.query, body)
            except ValueError:
                api._record(method, {}, 400)
                self._reply(
                    400,
                    {
                        "ok": False,
                        "error_code": 400,
                        "description": "Bad Request: can't parse request body",
                    },
                )
                return
            try:
                result = api._dispatch(method, params)
            except _ApiError as exc:
                api._record(method, params, exc.status)
                self._reply(exc.status, exc.body())
                return
            except Hang as hang:
                api._record(method, params, 0)
                self._withhold(api._stopping, hang.seconds)
                return
            api._record(method, params, 200)
            self._reply(200, {"ok": True, "result": result})

        def _params(self, query: str, body: bytes) -> dict[str, Any]:
            return _coerce(super()._params(query, body))  # a bad body: BadBody, a ValueError

    return Handler
