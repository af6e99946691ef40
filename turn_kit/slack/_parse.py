"""Slack's inbound side: reading events, who may be answered, signatures and message text.

* :func:`read_slack_event` accepts an Events API ``event_callback`` envelope or the bare
  ``event`` inside it (a ``message`` or an ``app_mention``) and never raises: anything
  unusable gives ``None``. Lone surrogates in its strings become U+FFFD.
* :func:`slack_skip_reason` says why a message gets no turn (``None``: it gets one), in this
  order: a bot's message (its own included: Slack sends the bot's posts back as events with
  its ``bot_id``), an edit or deletion, another subtype (joins, topic changes, …), a channel
  not allowed, a channel message not addressed to the bot, an empty text.
* :func:`verify_slack_signature` checks ``X-Slack-Signature`` (v0: HMAC-SHA256 of
  ``v0:{timestamp}:{raw body}`` with the signing secret), in constant time, within a
  5-minute window of ``X-Slack-Request-Timestamp``.
* :func:`slack_input_text` is the text a turn gets (the bot's own mentions removed, Slack's
  ``&amp;``/``&lt;``/``&gt;`` unescaped); :func:`escape_slack_text` escapes what the bot sends,
  so a reply shows ``<``, ``>`` and ``&`` as written and can never ping ``<!channel>``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Collection
from typing import Any, Literal

from pydantic import ConfigDict

from agency_runtime import DeferredModel

from .._identity import js_trim

__all__ = [
    "SIGNATURE_WINDOW_SECONDS",
    "SlackMessage",
    "escape_slack_text",
    "read_slack_event",
    "slack_input_text",
    "slack_signature",
    "slack_skip_reason",
    "ts_order",
    "verify_slack_signature",
]

SIGNATURE_WINDOW_SECONDS = 300
"""How far ``X-Slack-Request-Timestamp`` may be from now (Slack's advice: 5 minutes)."""

_USER_SUBTYPES = frozenset({"thread_broadcast", "file_share", "me_message"})
"""Subtypes that are still a person writing to the bot."""
_EDIT_SUBTYPES = frozenset({"message_changed", "message_deleted"})
_DIRECT = frozenset({"im"})
_MAX_FIELD = 256
_TS = re.compile(r"[0-9]{1,12}\.[0-9]{1,12}")


class SlackMessage(DeferredModel):
    """One inbound Slack message, as the adapter sees it.

    ``ts`` is the message's timestamp (its id in the channel); ``thread_ts`` the root of the
    thread it was posted in (``None`` for a top-level message, which starts its own thread:
    :attr:`root_ts`). ``text`` is the raw text as Slack sent it (escaped, mentions as
    ``<@U…>``); ``kind`` is the event type; ``channel_type`` is ``"im"`` for a direct message.
    """

    model_config = ConfigDict(frozen=True)

    channel: str
    ts: str
    text: str
    thread_ts: str | None = None
    user: str | None = None
    bot_id: str | None = None
    subtype: str | None = None
    channel_type: str | None = None
    kind: Literal["message", "app_mention"] = "message"
    edited: bool = False
    event_id: str | None = None
    team_id: str | None = None

    @property
    def root_ts(self) -> str:
        """The thread's root: where replies go and what names the conversation."""
        return self.thread_ts or self.ts

    @property
    def direct(self) -> bool:
        """Whether this is a direct message to the bot (no mention needed)."""
        return self.channel_type in _DIRECT or self.channel.startswith("D")


def _clean(value: Any) -> str | None:
    """A string field as the adapter keeps it: lone surrogates replaced, ``None`` if not a
    non-empty string."""
    if not isinstance(value, str) or not value:
        return None
    return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _short(value: Any) -> str | None:
    text = _clean(value)
    return text if text is not None and len(text) <= _MAX_FIELD else None


def read_slack_event(payload: Any) -> SlackMessage | None:
    """The message in an Events API payload, or ``None`` when there is none to read.

    ``payload`` is an ``event_callback`` envelope (``{"type": "event_callback", "event":
    {...}, "event_id": ..., "team_id": ...}``) or the bare event. Only ``message`` and
    ``app_mention`` events with a channel and a well-formed ``ts`` are read; an edit
    (``message_changed``) is read as an edited message, so it can be skipped by name.
    """
    if not isinstance(payload, dict):
        return None
    event = payload.get("event") if payload.get("type") == "event_callback" else payload
    if not isinstance(event, dict):
        return None
    kind = event.get("type")
    if kind not in ("message", "app_mention"):
        return None
    channel = _short(event.get("channel"))
    subtype = _short(event.get("subtype"))
    inner = event.get("message") if subtype == "message_changed" else event
    if not isinstance(inner, dict):
        inner = event
    ts = _short(event.get("ts"))
    if channel is None or ts is None or not _TS.fullmatch(ts):
        return None
    thread_ts = _short(inner.get("thread_ts"))
    if thread_ts is not None and not _TS.fullmatch(thread_ts):
        thread_ts = None
    return SlackMessage(
        channel=channel,
        ts=ts,
        text=_clean(inner.get("text")) or "",
        thread_ts=thread_ts,
        user=_short(inner.get("user")),
        bot_id=_short(inner.get("bot_id")) or _short(event.get("bot_id")),
        subtype=subtype,
        channel_type=_short(event.get("channel_type")),
        kind=kind,
        edited=subtype in _EDIT_SUBTYPES or isinstance(inner.get("edited"), dict),
        event_id=_short(payload.get("event_id")),
        team_id=_short(payload.get("team_id")),
    )


def _mention(user_id: str) -> re.Pattern[str]:
    return re.compile(rf"<@{re.escape(user_id)}(?:\|[^>]*)?>")


def slack_input_text(message: SlackMessage, bot_user_id: str | None = None) -> str:
    """The text a turn gets: the bot's own mentions removed, Slack's escapes undone, trimmed."""
    text = message.text
    if bot_user_id:
        text = _mention(bot_user_id).sub(" ", text)
    text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return js_trim(re.sub(r"[ \t]{2,}", " ", text))


def escape_slack_text(text: str) -> str:
    """``text`` escaped for Slack's ``text`` field (``&``, ``<``, ``>``), as Slack asks."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_skip_reason(
    message: SlackMessage,
    *,
    bot_user_id: str | None,
    bot_id: str | None = None,
    allowed_channels: Collection[str] | None = None,
    require_mention: bool = True,
) -> str | None:
    """Why ``message`` gets no turn, or ``None`` when it gets one (see the module docstring).

    ``allowed_channels``: the channel ids the bot answers in (``None``: every channel whose
    events reach the app). ``require_mention``: in channels (not direct messages), only a
    message that mentions the bot (an ``app_mention``, or a ``message`` holding
    ``<@bot_user_id>``) gets a turn.
    """
    if message.bot_id is not None or message.subtype == "bot_message":
        if bot_id is not None and message.bot_id == bot_id:
            return "own message"
        return "bot message"
    if bot_user_id is not None and message.user == bot_user_id:
        return "own message"
    if message.edited:
        return "edited message"
    if message.subtype is not None and message.subtype not in _USER_SUBTYPES:
        return f"not a user message ({message.subtype})"
    if message.user is None:
        return "no author"
    if allowed_channels is not None and message.channel not in allowed_channels:
        return "channel not allowed"
    addressed = (
        message.direct
        or message.kind == "app_mention"
        or (bot_user_id is not None and _mention(bot_user_id).search(message.text) is not None)
    )
    if require_mention and not addressed:
        return "not addressed to the bot"
    if not slack_input_text(message, bot_user_id):
        return "empty message"
    return None


def slack_signature(signing_secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Slack-Signature`` Slack sends for ``body`` at ``timestamp`` (``v0=<hex>``)."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()


def verify_slack_signature(
    signing_secret: str,
    *,
    timestamp: str | bytes | None,
    signature: str | bytes | None,
    body: bytes,
    now: float,
) -> str | None:
    """Why a request's signature is not Slack's, or ``None`` when it is.

    Compared in constant time; a timestamp more than :data:`SIGNATURE_WINDOW_SECONDS` away
    from ``now`` (a replayed request) is refused before the signature is looked at.
    """
    if isinstance(timestamp, bytes):
        timestamp = timestamp.decode("latin-1")
    if isinstance(signature, bytes):
        signature = signature.decode("latin-1")
    if not timestamp or not signature:
        return "missing signature"
    if not timestamp.isdigit() or len(timestamp) > 12:
        return "malformed timestamp"
    if abs(now - int(timestamp)) > SIGNATURE_WINDOW_SECONDS:
        return "stale timestamp"
    expected = slack_signature(signing_secret, timestamp, body)
    if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
        return "wrong signature"
    return None


def ts_order(ts: str) -> tuple[int, int] | None:
    """A Slack ``ts`` (``"1712345678.000100"``) as a sortable (seconds, micros) pair;
    ``None`` when it is not one."""
    seconds, _, micros = ts.partition(".")
    try:
        return int(seconds), int(micros or 0)
    except ValueError:
        return None
