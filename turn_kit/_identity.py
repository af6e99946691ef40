"""Conversation identity: keys, tags and JavaScript-compatible trimming and encoding.

Keys and tags must equal the TypeScript originals byte for byte, so that a Python agent and
a TypeScript one address the same memory: encoding is JavaScript's ``encodeURIComponent``
and trimming is JavaScript's ``String.prototype.trim``.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from pydantic import ConfigDict, ValidationError

from agency_runtime import DeferredModel, InvalidArgumentError

__all__ = [
    "TurnConversation",
    "as_conversation",
    "conversation_key",
    "conversation_tag",
    "js_encode",
    "js_trim",
]

# ECMAScript WhiteSpace + LineTerminator: what String.prototype.trim removes (not \x1c-\x1f,
# which Python's str.strip also removes).
_JS_WHITESPACE = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_SLUG = r"[a-z0-9][a-z0-9-]{0,62}"  # compiled (and cached by re) on first use


def js_trim(text: str) -> str:
    """JavaScript's ``trim()``: strip ECMAScript white space and line terminators."""
    return text.strip(_JS_WHITESPACE)


def js_encode(text: str) -> str:
    """JavaScript's ``encodeURIComponent`` (UTF-8, upper-case hex)."""
    return quote(text, safe="-_.!~*'()")


class TurnConversation(DeferredModel):
    """Which conversation a turn belongs to: a transport and an id within it."""

    model_config = ConfigDict(frozen=True)

    transport: str
    id: str


def as_conversation(value: object) -> TurnConversation:
    """``value`` as a :class:`TurnConversation` (a dict with ``transport`` and ``id`` works)."""
    if isinstance(value, TurnConversation):
        return value
    if isinstance(value, dict):
        try:
            return TurnConversation.model_validate(value)
        except ValidationError as exc:
            raise InvalidArgumentError(
                f"a conversation needs string 'transport' and 'id' fields, got {value!r}"
            ) from exc
    raise InvalidArgumentError(
        "a conversation is a TurnConversation(transport=..., id=...) or a dict with those "
        f"keys, got {type(value).__name__}"
    )


def conversation_key(root: str, thread: str | int | None = None) -> str:
    """The conversation id for a root (a chat, a channel) and an optional thread.

    ``conversation_key("C123", "171.2") == "C123:171.2"``; a thread of ``0`` is kept.
    """
    if not isinstance(root, str):
        raise InvalidArgumentError(f"conversation root must be a string, got {type(root).__name__}")
    trimmed = js_trim(root)
    if not trimmed:
        raise InvalidArgumentError("conversation root cannot be empty")
    if thread is None or isinstance(thread, bool):
        return js_encode(trimmed)
    text = js_trim(str(thread))
    if not text:
        return js_encode(trimmed)
    return f"{js_encode(trimmed)}:{js_encode(text)}"


def conversation_tag(namespace: str, conversation: TurnConversation | dict[str, str]) -> str:
    """The memory tag of a conversation: ``turn:<namespace>:<transport>:<id>`` (encoded)."""
    slug = js_trim(namespace) if isinstance(namespace, str) else ""
    if not re.fullmatch(_SLUG, slug):
        raise InvalidArgumentError(
            f"turn namespace must be a lowercase slug (letters, digits, '-'), got {namespace!r}"
        )
    conversation = as_conversation(conversation)
    transport = js_trim(conversation.transport)
    ident = js_trim(conversation.id)
    if not transport:
        raise InvalidArgumentError("conversation transport cannot be empty")
    if not ident:
        raise InvalidArgumentError("conversation id cannot be empty")
    return f"turn:{slug}:{js_encode(transport)}:{js_encode(ident)}"
