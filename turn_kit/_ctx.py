"""The ``ctx`` a turn runs with: its memory and its log, and the runtime-backed one.

Any object with a ``memory`` (async ``save`` / ``recall``, as
:class:`agency_runtime.ConversationMemory` has them) and, optionally, a
``log(level, message, **attrs)`` method will do. :func:`agency_ctx` builds one backed by the
runtime's store, ``agency.llm`` and stdlib logging, so an agent needs nothing else.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Protocol, runtime_checkable

from agency_runtime import ConversationMemory, Store, agency

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


class _Llm:
    """``ctx.llm.complete(prompt, max_tokens=None)``: one ``agency.llm`` call."""

    async def complete(self, prompt: str, *, max_tokens: int | None = None) -> str:
        return str(await agency.llm(prompt, max_tokens=max_tokens))


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
    return AgencyCtx(ConversationMemory(store, namespace=namespace), log or logger)
