"""Conversation history: recall it chronologically, save turns and messages to it.

These are the seed's ``recallTurnHistory``, ``normalizeTurnHistory``, ``rememberTurn``,
``rememberTurnMessage`` and ``rememberAssistantMessage``. They talk to ``ctx.memory``
(``save(content, *, tags, scope, ttl_seconds=None)`` and ``recall(query, *, tags, limit,
scope, fail_on_error)``, sync or async), which :class:`agency_runtime.ConversationMemory`
provides, and log ``turn-kit.*`` events through :func:`turn_kit._ctx.log_event`.

Rules worth knowing (``reference/turn-kit-spec.md`` §3):

* History comes back **oldest first**: sorted by instant when *every* entry has a
  parseable time, else the recalled list reversed (``newest-first``, the default) or kept
  (``oldest-first``).
* A bad ``limit`` raises at recall time even when memory is not ``required``.
* A save that raises or returns no receipt id gives ``False`` (and a log event) unless the
  memory is ``required``: then it raises.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ConfigDict, ValidationError, field_validator, model_validator

from agency_runtime import DeferredModel, InvalidArgumentError

from ._ctx import log_event
from ._errors import TurnKitError, TurnMemoryError
from ._identity import js_trim
from ._util import maybe_await

__all__ = [
    "RecallOrder",
    "TurnHistoryEntry",
    "TurnMemoryOptions",
    "memory_options",
    "normalize_turn_history",
    "recall_turn_history",
    "remember_assistant_message",
    "remember_turn",
    "remember_turn_message",
]

RecallOrder = Literal["newest-first", "oldest-first"]
"""How ``ctx.memory.recall`` orders items that carry no usable time."""

_RECALL_ORDERS: tuple[str, ...] = ("newest-first", "oldest-first")

# The seed's camelCase option keys, accepted in dicts next to the snake_case ones.
_CAMEL_KEYS = {
    "ttlSeconds": "ttl_seconds",
    "recallOrder": "recall_order",
    "userLabel": "user_label",
    "assistantLabel": "assistant_label",
}


class TurnMemoryOptions(DeferredModel):
    """How a turn recalls and saves its conversation memory (the seed's ``TurnMemoryOptions``).

    Dicts may use the seed's camelCase keys (``ttlSeconds``, ``recallOrder``, ``userLabel``,
    ``assistantLabel``); unknown keys are rejected so a typo never silently changes
    behaviour. ``limit`` is checked only when history is recalled (as in the seed).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    query: str = "recent conversation turns"
    """The recall query."""
    limit: Any = 8
    """How many items to recall: a positive ``int`` (checked at recall time)."""
    scope: str = "workspace"
    """The memory scope used for recall and save."""
    ttl_seconds: float | None = None
    """Saved turns expire after this many seconds; ``None`` keeps them (passed only when set)."""
    recall_order: RecallOrder = "newest-first"
    """The order of recalled items that carry no usable time."""
    user_label: str = "User"
    """The label of the user's line in a saved turn."""
    assistant_label: str = "Assistant"
    """The label of the reply's line in a saved turn."""
    serialize: Callable[[str, str], str] | None = None
    """``serialize(input, reply)`` (trimmed values) replaces the default record text."""
    required: bool = False
    """Raise on recall/save failures (and on a save with no receipt) instead of degrading."""

    @model_validator(mode="before")
    @classmethod
    def _accept_camel_case(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        converted: dict[Any, Any] = {}
        for key, value in data.items():
            name = _CAMEL_KEYS.get(key, key) if isinstance(key, str) else key
            if name in converted:
                raise ValueError(f"turn memory option {name!r} was given twice ({key!r})")
            converted[name] = value
        return converted

    @field_validator("ttl_seconds")
    @classmethod
    def _positive_ttl(cls, value: float | None) -> float | None:
        if value is not None and not (value > 0 and value != float("inf")):
            raise ValueError(f"ttl_seconds must be a positive number of seconds, got {value!r}")
        return value


def memory_options(value: TurnMemoryOptions | Mapping[str, Any] | None) -> TurnMemoryOptions:
    """``value`` as :class:`TurnMemoryOptions` (``None`` gives the defaults).

    Raises:
        InvalidArgumentError: ``value`` is not options, a dict of them or ``None``, or a
            field has a bad value or an unknown name.
    """
    if value is None:
        return TurnMemoryOptions()
    if isinstance(value, TurnMemoryOptions):
        return value
    if isinstance(value, Mapping):
        try:
            return TurnMemoryOptions.model_validate(dict(value))
        except ValidationError as exc:
            raise InvalidArgumentError(f"invalid turn memory options: {exc}") from exc
    raise InvalidArgumentError(
        f"turn memory options must be TurnMemoryOptions, a dict or None, got {type(value).__name__}"
    )


class TurnHistoryEntry(DeferredModel):
    """One remembered turn or message, as the responder and context providers see it."""

    model_config = ConfigDict()

    content: str
    """The remembered text (recalled object content is kept untrimmed, as in the seed)."""
    created_at: datetime | None = None
    """When it was saved, timezone-aware UTC; ``None`` when unknown."""

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else _as_utc(value)


# -- time parsing ---------------------------------------------------------------------------


def _as_utc(value: datetime) -> datetime:
    """``value`` in UTC; a time without an offset is taken as UTC (never local time)."""
    if value.tzinfo is None or value.utcoffset() is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _parse_time(value: object) -> datetime | None:
    """A ``datetime`` or an ISO 8601 / RFC 2822 string as an aware UTC time, else ``None``.

    Blank strings and anything unparseable count as absent.
    """
    try:
        if isinstance(value, datetime):
            return _as_utc(value)
        if not isinstance(value, str):
            return None
        text = js_trim(value)
        if not text:
            return None
        try:
            parsed = datetime.fromisoformat(text.upper())
        except ValueError:
            from email.utils import parsedate_to_datetime  # the email package: on first use

            parsed = parsedate_to_datetime(text)
        return _as_utc(parsed)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


# -- normalising recalled items -------------------------------------------------------------


def _field(item: object, *names: str) -> Any:
    """The first of ``names`` that ``item`` (a dict or an object) has and is not ``None``."""
    for name in names:
        value = item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)
        if value is not None and not (isinstance(value, str) and not js_trim(value)):
            return value
    return None


def _entry(item: object) -> TurnHistoryEntry | None:
    if isinstance(item, str):
        text = js_trim(item)
        return TurnHistoryEntry(content=text) if text else None
    if item is None or isinstance(item, list | tuple | bytes):
        return None
    content = item.get("content") if isinstance(item, Mapping) else getattr(item, "content", None)
    if not isinstance(content, str) or not js_trim(content):
        return None
    created = _parse_time(_field(item, "created_at", "createdAt"))
    return TurnHistoryEntry.model_construct(content=content, created_at=created)


def normalize_turn_history(
    recalled: object, recall_order: RecallOrder = "newest-first"
) -> list[TurnHistoryEntry]:
    """Recalled memory items as history entries, oldest first.

    Items may be strings (trimmed; blank ones dropped) or dicts / objects with a non-blank
    string ``content`` (kept untrimmed) and an optional ``created_at`` (or ``createdAt``):
    a ``datetime`` or an ISO 8601 / RFC 2822 string, a time without an offset being UTC.
    Other items are dropped, and anything but a list or tuple gives ``[]``.

    When **every** entry has a usable time, entries are sorted by instant (stable).
    Otherwise ``"newest-first"`` reverses the list and ``"oldest-first"`` keeps it.

    Raises:
        InvalidArgumentError: ``recall_order`` is not ``"newest-first"`` or
            ``"oldest-first"``.
    """
    if recall_order not in _RECALL_ORDERS:
        raise InvalidArgumentError(
            f"recall_order must be 'newest-first' or 'oldest-first', got {recall_order!r}"
        )
    if not isinstance(recalled, list | tuple):
        return []
    entries = [entry for entry in map(_entry, recalled) if entry is not None]
    if entries and all(entry.created_at is not None for entry in entries):
        entries.sort(key=lambda entry: entry.created_at or datetime.min.replace(tzinfo=UTC))
    elif recall_order == "newest-first":
        entries.reverse()
    return entries


# -- recall ---------------------------------------------------------------------------------


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise InvalidArgumentError("turn memory limit must be positive")
    return limit


def _check_tag(tag: object) -> str:
    if not isinstance(tag, str) or not js_trim(tag):
        raise InvalidArgumentError(
            f"turn memory tag must be a non-empty string (see conversation_tag), got {tag!r}"
        )
    return tag


def _memory_method(ctx: Any, name: str) -> Callable[..., Any]:
    memory = getattr(ctx, "memory", None)
    method: Callable[..., Any] | None = getattr(memory, name, None)
    if method is None or not callable(method):
        raise TurnKitError(
            f"ctx.memory has no {name}() method; give the ctx a memory such as "
            "agency_runtime.ConversationMemory (turn_kit.agency_ctx() builds one)"
        )
    return method


async def recall_turn_history(
    ctx: Any,
    tag: str,
    options: TurnMemoryOptions | Mapping[str, Any] | None = None,
) -> list[TurnHistoryEntry]:
    """Recall the history of the conversation tagged ``tag``, oldest first.

    Calls ``ctx.memory.recall(query, tags=[tag], limit=..., scope=...,
    fail_on_error=required)`` and normalises the answer with
    :func:`normalize_turn_history`. A failing recall is logged
    (``turn-kit.memory-recall-failed``) and gives ``[]``, or raises again when the memory
    is ``required``. Logs ``turn-kit.memory-recalled {entries}``.

    Raises:
        InvalidArgumentError: bad options, ``limit`` is not a positive integer (raised
            before recalling, whether or not the memory is required), or ``tag`` is blank.
    """
    opts = memory_options(options)
    limit = _check_limit(opts.limit)
    _check_tag(tag)
    try:
        recall = _memory_method(ctx, "recall")
        recalled = await maybe_await(
            recall(
                opts.query,
                tags=[tag],
                limit=limit,
                scope=opts.scope,
                fail_on_error=opts.required,
            )
        )
    except Exception as exc:
        log_event(ctx, "warn", "memory-recall-failed", error=str(exc))
        if opts.required:
            raise
        return []
    entries = normalize_turn_history(recalled, opts.recall_order)
    log_event(ctx, "info", "memory-recalled", entries=len(entries))
    return entries


# -- save -----------------------------------------------------------------------------------


def _receipt_id(receipt: object) -> Any:
    """The receipt's ``id``, or ``None`` when there is no usable one."""
    if receipt is None:
        return None
    ident = receipt.get("id") if isinstance(receipt, Mapping) else getattr(receipt, "id", None)
    if ident is None or ident is False or (isinstance(ident, str) and not js_trim(ident)):
        return None
    return ident


async def _save(
    ctx: Any,
    tag: str,
    content: str,
    *,
    scope: str,
    ttl_seconds: float | None,
    required: bool,
) -> bool:
    """Save ``content`` under ``tag`` and apply the receipt rules; ``True`` when confirmed."""
    kwargs: dict[str, Any] = {"tags": [tag], "scope": scope}
    if ttl_seconds is not None:
        kwargs["ttl_seconds"] = ttl_seconds
    try:
        save = _memory_method(ctx, "save")
        receipt = await maybe_await(save(content, **kwargs))
    except Exception as exc:
        # The seed logs a failed save at "warn" (memory.ts, 0022e15).
        log_event(ctx, "warn", "memory-save-failed", error=str(exc))
        if required:
            raise
        return False
    ident = _receipt_id(receipt)
    if ident is None:
        log_event(ctx, "warn", "memory-save-unconfirmed")
        if required:
            raise TurnMemoryError("turn-kit memory save returned no receipt")
        return False
    log_event(ctx, "info", "memory-saved", id=ident)
    return True


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a string, got {type(value).__name__}")
    return js_trim(value)


async def remember_turn(
    ctx: Any,
    tag: str,
    input: str,
    reply: str,
    options: TurnMemoryOptions | Mapping[str, Any] | None = None,
    content: str | None = None,
) -> bool:
    """Save one exchange to the conversation tagged ``tag``; ``True`` when confirmed.

    The record is ``content`` when given, else ``options.serialize(input, reply)``, else
    ``"<user_label>: <input>\\n<assistant_label>: <reply>"`` (built from the trimmed values),
    trimmed as a whole. It is saved with ``tags=[tag]``, the options' ``scope`` and, when
    set, ``ttl_seconds``.

    A save that raises is logged (``turn-kit.memory-save-failed``) and gives ``False``; a
    receipt without an id is logged (``turn-kit.memory-save-unconfirmed``) and gives
    ``False``. With ``required`` both raise (the save's error, or :class:`TurnMemoryError`).

    Raises:
        InvalidArgumentError: the record is empty ("turn memory content cannot be empty",
            whatever ``required`` is), bad options, or a blank ``tag``.
        TurnMemoryError: a required save returned no receipt.
    """
    opts = memory_options(options)
    user_text = _text(input, "turn input")
    reply_text = _text(reply, "turn reply")
    record: str | None = None
    if content is not None:
        if not isinstance(content, str):
            raise InvalidArgumentError(
                f"turn memory content must be a string, got {type(content).__name__}"
            )
        record = content
    elif opts.serialize is not None:
        serialized = opts.serialize(user_text, reply_text)
        if serialized is not None and not isinstance(serialized, str):
            raise InvalidArgumentError(
                f"turn memory serialize() must return a string, got {type(serialized).__name__}"
            )
        record = serialized
    if record is None:
        record = f"{opts.user_label}: {user_text}\n{opts.assistant_label}: {reply_text}"
    record = js_trim(record)
    if not record:
        raise InvalidArgumentError("turn memory content cannot be empty")
    _check_tag(tag)
    return await _save(
        ctx,
        tag,
        record,
        scope=opts.scope,
        ttl_seconds=opts.ttl_seconds,
        required=opts.required,
    )


async def remember_turn_message(
    ctx: Any,
    tag: str,
    role: str,
    message: str,
    *,
    label: str | None = None,
    scope: str = "workspace",
    ttl_seconds: float | None = None,
    required: bool = False,
) -> bool:
    """Save a single message (``"<label>: <message>"``) to the conversation tagged ``tag``.

    ``label`` (trimmed) defaults, when ``None`` or blank, to ``"Assistant"`` for the
    ``"assistant"`` role and ``"User"`` for any other role. The receipt rules of
    :func:`remember_turn` apply.

    Raises:
        InvalidArgumentError: ``message`` is blank ("turn memory message cannot be empty")
            or ``tag`` is blank.
        TurnMemoryError: a required save returned no receipt.
    """
    text = _text(message, "turn memory message")
    if not text:
        raise InvalidArgumentError("turn memory message cannot be empty")
    if label is not None and not isinstance(label, str):
        raise InvalidArgumentError(f"label must be a string or None, got {type(label).__name__}")
    name = js_trim(label) if label is not None else ""
    if not name:
        name = "Assistant" if role == "assistant" else "User"
    _check_tag(tag)
    return await _save(
        ctx,
        tag,
        f"{name}: {text}",
        scope=scope,
        ttl_seconds=ttl_seconds,
        required=required,
    )


async def remember_assistant_message(
    ctx: Any,
    tag: str,
    message: str,
    *,
    label: str | None = None,
    scope: str = "workspace",
    ttl_seconds: float | None = None,
    required: bool = False,
) -> bool:
    """Save proactive assistant output (no fabricated user turn) to a conversation.

    ``tag`` is a full conversation tag (:func:`~turn_kit.conversation_tag`). Same as
    :func:`remember_turn_message` with ``role="assistant"``.
    """
    return await remember_turn_message(
        ctx,
        tag,
        "assistant",
        message,
        label=label,
        scope=scope,
        ttl_seconds=ttl_seconds,
        required=required,
    )
