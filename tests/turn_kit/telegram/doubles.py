"""Test doubles shared by the Telegram tests: a recording transport, a memory, a ctx."""

from __future__ import annotations

from typing import Any

from turn_kit import TurnArgs


class Transport:
    """A transport that records what it was asked to send and always succeeds."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send_message(self, chat_id: str, text: str, **options: Any) -> dict[str, Any]:
        self.sent.append(text)
        return {"ok": True, "chat_id": chat_id, "message_id": str(len(self.sent))}


class Memory:
    """A memory that remembers nothing and confirms every save."""

    async def recall(self, query: str, **options: Any) -> list[str]:
        return []

    async def save(self, content: str, **options: Any) -> dict[str, str]:
        return {"id": "m"}


class Ctx:
    """A ctx with :class:`Memory` as its memory."""

    memory = Memory()


def echo(turn: TurnArgs) -> str:
    """A respond that answers ``re <input>``."""
    return f"re {turn.input}"
