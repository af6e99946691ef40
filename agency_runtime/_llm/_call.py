"""The state of one ``agency.llm`` call (:class:`_Call`), shared by its rounds, and the
``on_token`` callback it streams to.

:func:`~._chat.begin` makes it; the tool loop (:mod:`._toolloop`) and the request
(:mod:`._request`) read it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import TypeAdapter

    from .._core._frame import Frame
    from .._core._threads import MessageContent, MessageThread
    from ._mcp import McpServer
    from ._model import Model
    from ._tools import Tool

__all__ = ["MAX_TOOL_ROUNDS", "TokenCallback"]

MAX_TOOL_ROUNDS = 8
"""Rounds of tool calls ``agency.llm`` allows before it gives up (``max_tool_rounds``)."""

TokenCallback = Callable[[str], Awaitable[None] | None]
"""``on_token(delta)``: called with each piece of a streamed answer, in order."""


class _Call:
    """What one ``agency.llm`` call asks, shared by its rounds."""

    __slots__ = (
        "adapter",
        "answer_at_max",
        "frame",
        "functions",
        "max_rounds",
        "max_tokens",
        "model",
        "on_token",
        "path",
        "prompt",
        "retries",
        "schema",
        "thread",
        "timeout",
        "tools",
        "toolsets",
        "unreachable",
    )

    def __init__(
        self,
        frame: Frame,
        path: str,
        thread: MessageThread,
        model: Model,
        schema: Any,
        adapter: TypeAdapter[Any] | None,
        timeout: float | None,
        max_tokens: int | None,
        tools: dict[str, Tool],
        on_token: TokenCallback | None,
        toolsets: tuple[McpServer, ...] = (),
    ) -> None:
        self.frame, self.path, self.thread, self.model = frame, path, thread, model
        self.schema, self.adapter, self.timeout, self.max_tokens = (
            schema,
            adapter,
            timeout,
            max_tokens,
        )
        self.tools, self.on_token = tools, on_token
        self.functions = tools
        """The function tools (``tools`` is what the current round offers)."""
        self.toolsets = toolsets
        """The MCP servers whose tools each round lists (or replays)."""
        self.unreachable: dict[str, str] = {}
        """Why a server could not list its tools in the last live round, by name."""
        self.prompt: MessageContent = ""
        self.retries: int | None = None
        self.max_rounds = MAX_TOOL_ROUNDS
        self.answer_at_max = False
        """``on_max_tool_rounds="answer"``: a last round without tools after the last one."""

    @property
    def has_tools(self) -> bool:
        """Whether the model may call tools (functions, or MCP servers' tools)."""
        return bool(self.functions or self.toolsets)


async def _emit(on_token: TokenCallback, delta: str) -> None:
    result = on_token(delta)
    if inspect.isawaitable(result):
        await result
