"""The ``ctx`` a turn runs with: its memory and its log, and the runtime-backed one.

Any object with a ``memory`` (async ``save`` / ``recall``, as
:class:`agency_runtime.ConversationMemory` has them) and, optionally, a
``log(level, message, **attrs)`` method will do. :func:`agency_ctx` builds one backed by the
runtime's store, ``agency.llm`` and stdlib logging, so an agent needs nothing else.

Its ``ctx.llm.complete(...)`` streams by itself: inside a streamed turn's ``respond`` (the
Telegram adapter's ``stream=True``) it hands the answer's pieces to the turn, as
``agency.llm(..., on_token=turn.on_token)`` would.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agency_runtime import Store, agency

if TYPE_CHECKING:
    from agency_runtime import ConversationMemory

__all__ = ["AgencyCtx", "TurnCtx", "TurnMemory", "agency_ctx", "log_event"]

logger = logging.getLogger("turn_kit")

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


@runtime_checkable
class TurnMemory(Protocol):
    """What turn_kit needs from ``ctx.memory``."""

    async def save(
        self,
        content: str,
        *,
        tags: list[str],
        scope: str = "workspace",
        ttl_seconds: float | None = None,
    ) -> Any:
        """Store ``content``; return an object or dict with an ``id`` (or ``None``)."""
        ...

    async def recall(
        self,
        query: str,
        *,
        tags: list[str] | None = None,
        limit: int = 8,
        scope: str | None = None,
        fail_on_error: bool = False,
    ) -> Any:
        """Items with ``content`` (and optionally ``created_at``), newest first."""
        ...


class TurnCtx(Protocol):
    """The context object turns run with (``memory`` required, ``log`` optional)."""

    memory: Any


def _to_logging(log: logging.Logger, level: str, message: str, attrs: dict[str, Any]) -> None:
    log.log(_LEVELS.get(level, logging.INFO), "%s %s", message, attrs if attrs else "")


def log_event(ctx: Any, level: str, event: str, **attrs: Any) -> None:
    """Log ``turn-kit.<event>`` through ``ctx.log`` when it has one, else stdlib logging.

    A failing ``ctx.log`` never breaks a turn.
    """
    name = f"turn-kit.{event}"
    log = getattr(ctx, "log", None)
    if callable(log):
        try:
            result = log(level, name, **attrs)
            if inspect.isawaitable(result):
                close = getattr(result, "close", None)
                if callable(close):
                    close()  # a turn never waits on its logger
        except Exception:  # a broken logger must not break the turn
            logger.exception("ctx.log raised while logging %s", name)
        return
    _to_logging(logger, level, name, attrs)


TokenSink = Callable[[str], Awaitable[None]]
"""``await sink(delta)``: a piece of a streamed reply, as ``agency.llm``'s ``on_token`` gets it."""

_TURN_TOKENS: ContextVar[TokenSink | None] = ContextVar("turn_kit_turn_tokens", default=None)
"""The streamed turn's token sink while its ``respond`` runs (``None``: not streamed)."""


@contextmanager
def streaming_to(sink: TokenSink | None) -> Iterator[None]:
    """Make ``sink`` the current turn's token sink for the block (the runner's respond)."""
    token = _TURN_TOKENS.set(sink)
    try:
        yield
    finally:
        _TURN_TOKENS.reset(token)


def turn_token_sink() -> TokenSink | None:
    """The token sink of the streamed turn whose ``respond`` is running, else ``None``."""
    return _TURN_TOKENS.get()


class _Llm:
    """``ctx.llm.complete(prompt, max_tokens=None, on_token=None)``: one ``agency.llm`` call.

    Inside a streamed turn's ``respond`` the answer streams to the turn unless ``on_token``
    is given (then it streams there instead).
    """

    async def complete(
        self,
        prompt: str,
        *,
        max_tokens: int | None = None,
        on_token: Callable[[str], Any] | None = None,
    ) -> str:
        sink = on_token if on_token is not None else turn_token_sink()
        if sink is None:
            return str(await agency.llm(prompt, max_tokens=max_tokens))
        return str(await agency.llm(prompt, max_tokens=max_tokens, on_token=sink))


class AgencyCtx:
    """A turn ctx backed by the runtime: conversation memory, ``agency.llm``, logging."""

    def __init__(self, memory: ConversationMemory, log: logging.Logger) -> None:
        self.memory = memory
        self.llm = _Llm()
        self._logger = log

    def log(self, level: str, message: str, **attrs: Any) -> None:
        """Write ``message`` (with ``attrs``) to stdlib logging at ``level``."""
        _to_logging(self._logger, level, message, attrs)


def agency_ctx(
    store: str | Store | None = None,
    *,
    namespace: str = "conversations",
    log: logging.Logger | None = None,
) -> AgencyCtx:
    """A ready ``ctx`` whose ``memory`` is :class:`~agency_runtime.ConversationMemory`.

    The memory uses ``store`` when given, else the store of the run it is called in (every
    turn is one), else ``AGENCY_STORE``.
    """
    from agency_runtime import ConversationMemory  # loads conversation memory on first use

    return AgencyCtx(ConversationMemory(store, namespace=namespace), log or logger)
