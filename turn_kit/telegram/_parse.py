"""Telegram parsing and delivery helpers: reading updates, bare chat ids, chunking, guards.

``read_telegram_message`` accepts a Bot API update (``message``, ``edited_message``,
``business_message`` or ``channel_post``), the seed's normalised ``telegram`` envelope, or a
``data`` wrapper around either, and never raises: anything unusable gives ``None``. It is the
parsing boundary for text: lone surrogates in its fields become U+FFFD.

``chunk_telegram_text`` counts lengths in UTF-16 code units, as Telegram does, never splits a
surrogate pair and never yields a whitespace-only chunk (Telegram rejects those with 400
"message text is empty").
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict

from agency_runtime import DeferredModel

from .._chunks import chunk_text
from .._identity import js_trim

__all__ = [
    "TelegramKind",
    "TelegramMessage",
    "bare_telegram_chat_id",
    "chunk_telegram_text",
    "read_telegram_message",
    "telegram_skip_reason",
]

TelegramKind = Literal["message", "edited_message", "business_message", "channel_post"]

_RAW_KINDS: tuple[TelegramKind, ...] = (
    "message",
    "edited_message",
    "business_message",
    "channel_post",
)


class TelegramMessage(DeferredModel):
    """One inbound Telegram message, as the adapter sees it.

    ``chat_id`` keeps any ``__title`` suffix of the normalised envelope (compare chats with
    :func:`bare_telegram_chat_id`). ``thread_id`` is a forum topic id, never the General
    topic's. ``edit_date`` is set for an ``edited_message`` (so an edit gets its own run id);
    ``kind`` names the raw update field the message came from and ``update_id`` is the
    update's id, when present.
    """

    model_config = ConfigDict(frozen=True)

    chat_id: str
    message_id: str
    text: str
    thread_id: str | None = None
    reply_text: str | None = None
    from_is_bot: bool = False
    edit_date: str | None = None
    kind: TelegramKind | None = None
    update_id: str | None = None


# -- reading ------------------------------------------------------------------------------


def _obj(value: object) -> dict[object, object] | None:
    """``value`` if it is a dict (a JSON object), else ``None``."""
    return value if isinstance(value, dict) else None


def _get(record: dict[object, object] | None, key: str) -> object:
    """``record[key]``, or ``None`` when the record or the key is missing."""
    if record is None:
        return None
    return record.get(key)


def _well_formed(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (a surrogate pair spelled as two
    code points is joined into its character). JSON may carry lone surrogates (``"\\ud800"``),
    which no UTF-8 encoder accepts: left in, they would fail deep inside the turn (its run
    id, its stored arguments) instead of here."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _scalar(value: object) -> str | None:
    """A non-empty string (untrimmed, lone surrogates → U+FFFD) or an int (not a bool) as a
    string; else ``None``."""
    if isinstance(value, str):
        return _well_formed(value) or None
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return str(value)
        except ValueError:  # beyond sys.get_int_max_str_digits: not a usable id
            return None
    return None


def _first(*values: object) -> str | None:
    """The first of ``values`` that reads as a scalar (see :func:`_scalar`)."""
    for value in values:
        found = _scalar(value)
        if found is not None:
            return found
    return None


def _js_truthy(value: object) -> bool:
    """JavaScript's ``Boolean(value)`` for JSON-like values (``[]`` and ``{}`` are true)."""
    if value is None or value is False:
        return False
    if isinstance(value, int | float):
        return bool(value) and value == value  # 0 and NaN are false
    if isinstance(value, str):
        return value != ""
    return True


def read_telegram_message(payload: object) -> TelegramMessage | None:
    """The message in a Telegram payload, or ``None`` when it is unusable.

    * The envelope is ``payload["data"]`` if that is an object, else the payload; the
      normalised record is ``envelope["telegram"]``, else ``payload["telegram"]``; the raw
      message is the first object among ``message``, ``edited_message``,
      ``business_message`` and ``channel_post`` (``callback_query`` is not supported).
      Fields are read from the normalised record, else the raw message, else the envelope.
    * ``chat_id`` is ``chatId`` / ``chat_id``, else ``chat.id`` (a ``__title`` suffix is
      kept); ``message_id`` is ``messageId`` / ``message_id`` with no other fallback. Either
      missing gives ``None``.
    * ``text`` is the record's ``text``, the raw ``text``, the record's ``caption``, the raw
      ``caption``, else ``''``; ``reply_text`` is the raw ``reply_to_message``'s text or
      caption; ``from_is_bot`` is JavaScript ``Boolean(from.is_bot ?? fromIsBot)``.
    * ``thread_id`` (**deviation** from the seed, following Telegram's topic rules) is
      ``messageThreadId``, else the normalised record's ``message_thread_id``, else a raw
      ``message_thread_id`` only when that message's ``is_topic_message`` is true, so the
      General topic (or a reply thread of a non-forum group) is never echoed.
    * Scalars: a non-empty string is kept untrimmed, an int becomes a string, anything else
      is absent. A lone surrogate in a string (JSON can spell one, ``"\\ud800"``) becomes
      U+FFFD, so every field can be encoded as UTF-8: such a message is answered (or skipped)
      like any other, never failing later inside its turn.

    Never raises for JSON-like input.
    """
    try:
        return _read(payload)
    except (ValueError, TypeError, RecursionError):  # pragma: no cover - defensive
        return None


def _read(payload: object) -> TelegramMessage | None:
    root = _obj(payload)
    if root is None:
        return None
    envelope = _obj(root.get("data"))
    if envelope is None:
        envelope = root
    record = _obj(envelope.get("telegram"))
    if record is None:
        record = _obj(root.get("telegram"))

    kind: TelegramKind | None = None
    raw: dict[object, object] | None = None
    holders = (envelope, root) if envelope is not root else (root,)
    for holder in holders:
        for name in _RAW_KINDS:
            candidate = _obj(holder.get(name))
            if candidate is not None:
                kind, raw = name, candidate
                break
        if raw is not None:
            break

    data = record if record is not None else raw if raw is not None else envelope

    chat = _obj(data.get("chat"))
    if chat is None:
        chat = _obj(_get(raw, "chat"))
    chat_id = _first(data.get("chatId"), data.get("chat_id"), _get(chat, "id"))
    message_id = _first(data.get("messageId"), data.get("message_id"))
    if chat_id is None or message_id is None:
        return None

    text = _first(data.get("text"), _get(raw, "text"), data.get("caption"), _get(raw, "caption"))

    reply = _obj(_get(raw, "reply_to_message"))
    reply_text = _first(_get(reply, "text"), _get(reply, "caption"))

    sender = _obj(_get(raw, "from"))
    if sender is None:
        sender = _obj(data.get("from"))
    is_bot = _get(sender, "is_bot")
    from_is_bot = _js_truthy(is_bot if is_bot is not None else data.get("fromIsBot"))

    thread_id = _first(data.get("messageThreadId"))
    if thread_id is None and record is not None:
        thread_id = _first(record.get("message_thread_id"))
    if thread_id is None:
        # A raw message (or a raw-looking envelope): only a real forum topic counts.
        topical = raw if raw is not None else data if record is None else None
        if topical is not None and _get(topical, "is_topic_message") is True:
            thread_id = _first(topical.get("message_thread_id"))

    edit_date = _first(_get(raw, "edit_date")) if kind == "edited_message" else None
    update_id = _first(root.get("update_id"), envelope.get("update_id"))

    return TelegramMessage(
        chat_id=chat_id,
        message_id=message_id,
        text=text or "",
        thread_id=thread_id,
        reply_text=reply_text,
        from_is_bot=from_is_bot,
        edit_date=edit_date,
        kind=kind,
        update_id=update_id,
    )


# -- delivery helpers ---------------------------------------------------------------------


def bare_telegram_chat_id(value: object) -> str:
    """The chat id without a ``__title`` suffix, JavaScript-trimmed: ``'8587__Bot' → '8587'``."""
    return js_trim(str(value).split("__")[0])


def chunk_telegram_text(text: str, limit: int = 4096) -> list[str]:
    """Split ``text`` into Telegram-sized chunks of at most ``limit`` UTF-16 code units
    (:func:`turn_kit._chunks.chunk_text`, with Telegram's 4,096 as the default limit)."""
    return chunk_text(text, limit)


# -- guard --------------------------------------------------------------------------------


def telegram_skip_reason(message: TelegramMessage, owner_chat: str | None) -> str | None:
    """Why the adapter skips ``message``, or ``None`` to answer it.

    Checked in order: ``'bot message'`` (the only loop guard), ``'no owner chat configured'``
    (a missing or blank owner fails closed), ``'not the owner chat'`` (bare chat ids differ;
    the chat type is never checked), ``'empty message text'``.
    """
    if message.from_is_bot:
        return "bot message"
    if owner_chat is None or not js_trim(str(owner_chat)):
        return "no owner chat configured"
    if bare_telegram_chat_id(message.chat_id) != bare_telegram_chat_id(owner_chat):
        return "not the owner chat"
    if not js_trim(message.text):
        return "empty message text"
    return None
