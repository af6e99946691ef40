"""turn_kit: the multi-turn chat lifecycle, built on agency_runtime.

Conversation identity, chronological memory, deterministic context, acknowledgements,
confirmed delivery and post-delivery persistence — and every turn is a durable run of
:mod:`agency_runtime` (idempotent per message, crash-safe after delivery, one at a time per
conversation). :mod:`turn_kit.telegram` binds it to Telegram (Bot API, webhook, polling).
"""

from typing import TYPE_CHECKING, Any

from ._actions import run_confirmed_turn_action
from ._context_providers import (
    TurnContext,
    TurnContextArgs,
    TurnContextProvider,
    collect_turn_context,
    define_turn_context,
)
from ._ctx import AgencyCtx, TurnCtx, TurnMemory, agency_ctx
from ._errors import (
    TurnKitError,
    TurnMemoryError,
    TurnPausedError,
    UnconfirmedTurnActionError,
    UnconfirmedTurnDeliveryError,
)
from ._history import (
    TurnHistoryEntry,
    TurnMemoryOptions,
    normalize_turn_history,
    recall_turn_history,
    remember_assistant_message,
    remember_turn,
    remember_turn_message,
)
from ._identity import TurnConversation, conversation_key, conversation_tag
from ._persona import define_turn_persona
from ._proactive import ProactiveResult, send_proactive
from ._runner import (
    TurnArgs,
    TurnResponse,
    TurnResult,
    TurnRunner,
    TurnStream,
    create_turn_runner,
)
from ._version import TURN_KIT_VERSION

if TYPE_CHECKING:
    from .telegram import (
        bare_telegram_chat_id,
        chunk_telegram_text,
        create_telegram_turn_adapter,
        read_telegram_message,
    )

_TELEGRAM = frozenset(
    {
        "bare_telegram_chat_id",
        "chunk_telegram_text",
        "create_telegram_turn_adapter",
        "read_telegram_message",
    }
)


def __getattr__(name: str) -> Any:
    """The Telegram names load ``turn_kit.telegram`` (and httpx) on first use only."""
    if name in _TELEGRAM:
        from . import telegram

        return getattr(telegram, name)
    raise AttributeError(f"module 'turn_kit' has no attribute {name!r}")


__all__ = [
    "TURN_KIT_VERSION",
    "AgencyCtx",
    "ProactiveResult",
    "TurnArgs",
    "TurnContext",
    "TurnContextArgs",
    "TurnContextProvider",
    "TurnConversation",
    "TurnCtx",
    "TurnHistoryEntry",
    "TurnKitError",
    "TurnMemory",
    "TurnMemoryError",
    "TurnMemoryOptions",
    "TurnPausedError",
    "TurnResponse",
    "TurnResult",
    "TurnRunner",
    "TurnStream",
    "UnconfirmedTurnActionError",
    "UnconfirmedTurnDeliveryError",
    "agency_ctx",
    "bare_telegram_chat_id",
    "chunk_telegram_text",
    "collect_turn_context",
    "conversation_key",
    "conversation_tag",
    "create_telegram_turn_adapter",
    "create_turn_runner",
    "define_turn_context",
    "define_turn_persona",
    "normalize_turn_history",
    "read_telegram_message",
    "recall_turn_history",
    "remember_assistant_message",
    "remember_turn",
    "remember_turn_message",
    "run_confirmed_turn_action",
    "send_proactive",
]
