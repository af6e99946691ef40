"""turn_kit: the multi-turn chat lifecycle, built on agency_runtime.

Conversation identity, chronological memory, deterministic context, acknowledgements,
confirmed delivery and post-delivery persistence — and every turn is a durable run of
:mod:`agency_runtime` (idempotent per message, crash-safe after delivery, one at a time per
conversation). :mod:`turn_kit.telegram` binds it to Telegram (Bot API, webhook, polling).

As :mod:`agency_runtime` does, the package loads each public name's module the first time the
name is read (PEP 562, :data:`_LAZY`): ``import turn_kit`` costs next to nothing, and the
Telegram names load ``turn_kit.telegram`` (and httpx) only when used.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time, _LAZY below
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
    from .telegram import (
        bare_telegram_chat_id,
        chunk_telegram_text,
        create_telegram_turn_adapter,
        read_telegram_message,
    )

_LAZY = {
    "run_confirmed_turn_action": "._actions",
    **dict.fromkeys(
        (
            "TurnContext",
            "TurnContextArgs",
            "TurnContextProvider",
            "collect_turn_context",
            "define_turn_context",
        ),
        "._context_providers",
    ),
    **dict.fromkeys(
        (
            "AgencyCtx",
            "TurnCtx",
            "TurnMemory",
            "agency_ctx",
        ),
        "._ctx",
    ),
    **dict.fromkeys(
        (
            "TurnKitError",
            "TurnMemoryError",
            "TurnPausedError",
            "UnconfirmedTurnActionError",
            "UnconfirmedTurnDeliveryError",
        ),
        "._errors",
    ),
    **dict.fromkeys(
        (
            "TurnHistoryEntry",
            "TurnMemoryOptions",
            "normalize_turn_history",
            "recall_turn_history",
            "remember_assistant_message",
            "remember_turn",
            "remember_turn_message",
        ),
        "._history",
    ),
    **dict.fromkeys(
        (
            "TurnConversation",
            "conversation_key",
            "conversation_tag",
        ),
        "._identity",
    ),
    "define_turn_persona": "._persona",
    **dict.fromkeys(
        (
            "ProactiveResult",
            "send_proactive",
        ),
        "._proactive",
    ),
    **dict.fromkeys(
        (
            "TurnArgs",
            "TurnResponse",
            "TurnResult",
            "TurnRunner",
            "TurnStream",
            "create_turn_runner",
        ),
        "._runner",
    ),
    "TURN_KIT_VERSION": "._version",
    **dict.fromkeys(
        (
            "bare_telegram_chat_id",
            "chunk_telegram_text",
            "create_telegram_turn_adapter",
            "read_telegram_message",
        ),
        ".telegram",
    ),
}
"""Every public name and the module it lives in, loaded on first read: the names above, each
from the same module (a test holds the two equal)."""


def __getattr__(name: str) -> Any:
    """A public name, its module imported the first time it is read, then kept here."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'turn_kit' has no attribute {name!r}")
    value = globals()[name] = getattr(import_module(module, __name__), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
