"""turn_kit: the multi-turn chat lifecycle, built on agency_runtime.

Conversation identity, chronological memory, deterministic context, acknowledgements,
confirmed delivery and post-delivery persistence — and every turn is a durable run of
:mod:`agency_runtime` (idempotent per message, crash-safe after delivery, one at a time per
conversation). The Telegram adapter arrives in a later release.
"""

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
from ._runner import TurnArgs, TurnResponse, TurnResult, TurnRunner, create_turn_runner
from ._version import TURN_KIT_VERSION

__all__ = [
    "TURN_KIT_VERSION",
    "AgencyCtx",
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
    "UnconfirmedTurnActionError",
    "UnconfirmedTurnDeliveryError",
    "agency_ctx",
    "collect_turn_context",
    "conversation_key",
    "conversation_tag",
    "create_turn_runner",
    "define_turn_context",
    "define_turn_persona",
    "normalize_turn_history",
    "recall_turn_history",
    "remember_assistant_message",
    "remember_turn",
    "remember_turn_message",
    "run_confirmed_turn_action",
]
