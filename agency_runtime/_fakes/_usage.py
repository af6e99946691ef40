"""A fake model's numbers: tokens counted from words, and bag-of-words embeddings.

Usage is deterministic: ``prompt_tokens`` is the number of whitespace-separated words over
all message contents plus one per message, ``completion_tokens`` the number of words in the
reply, plus the words of each tool call's name and JSON arguments (at least 1); a model
prices them (``FakeModel.cost``) at ``prompt_tokens * input_cost_per_token +
completion_tokens * output_cost_per_token`` (default prices 1e-6 and 2e-6 USD a token).
Embeddings are bag-of-words hash vectors (:data:`EMBEDDING_DIMENSIONS` wide, unit length),
so texts sharing words are close; they cost ``input_cost_per_token`` for each word of the
texts plus one per text. Both paths (the seam, litellm) count with these functions, so they
agree.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from typing import Any

from .._llm._provider import ToolCall, Usage

__all__ = [
    "EMBEDDING_DIMENSIONS",
    "chat_usage",
    "embed_usage",
    "fake_embedding",
    "last_user_text",
    "prompt_tokens",
]

EMBEDDING_DIMENSIONS = 64
"""The length of a fake embedding vector."""


def _field(message: object, key: str) -> object:
    if isinstance(message, dict):
        return message.get(key)
    return getattr(message, key, None)


def last_user_text(messages: Sequence[dict[str, Any]]) -> str:
    """The text of the last user message (its text parts joined by lines), or ``""``."""
    for message in reversed(messages):
        if _field(message, "role") == "user":
            return "\n".join(_text_parts(_field(message, "content")))
    return ""


def _text_parts(content: object) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return parts
    return []


def _count_words(text: str) -> int:
    return len(text.split())


def prompt_tokens(messages: Sequence[dict[str, Any]]) -> int:
    """The fake ``prompt_tokens`` of ``messages``: their words plus one per message."""
    return sum(
        1 + sum(_count_words(part) for part in _text_parts(_field(message, "content")))
        for message in messages
    )


def chat_usage(
    messages: Sequence[dict[str, Any]], reply: str, tool_calls: Sequence[ToolCall] = ()
) -> Usage:
    """The fake usage of answering ``messages`` with ``reply`` (and ``tool_calls``): the
    completion counts the reply's words, and each call's name and JSON arguments' words."""
    completion = _count_words(reply) + sum(
        _count_words(call.name) + _count_words(call.arguments) for call in tool_calls
    )
    return Usage.of(prompt_tokens(messages), max(1, completion))


def embed_usage(texts: Sequence[str]) -> Usage:
    """The fake usage of embedding ``texts``: their words plus one per text."""
    return Usage.of(sum(1 + _count_words(text) for text in texts))


_WORD = re.compile(r"[^\W_]+")


def fake_embedding(text: str) -> list[float]:
    """A deterministic bag-of-words vector of ``text`` (unit length; all zeros for no words).

    Each word (case-folded) adds ±1 at a position chosen by its hash, so texts that share
    words have a high cosine similarity and unrelated texts one near 0.
    """
    vector = [0.0] * EMBEDDING_DIMENSIONS
    for word in _WORD.findall(text.casefold()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        position = int.from_bytes(digest[:4], "big") % EMBEDDING_DIMENSIONS
        vector[position] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else vector
