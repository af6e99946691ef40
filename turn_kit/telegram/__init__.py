"""Telegram for turn_kit: parse updates, run turns, send replies, receive by webhook or polling.

* :func:`create_telegram_turn_adapter` — ``handle(ctx, payload=..., respond=...)`` runs one
  update as a durable turn (skipping bots, other chats and empty messages; each reply chunk
  a journaled step); with ``stream=True`` the reply shows in one message while it is
  generated.
* :class:`BotApiTransport` (python-telegram-bot, the ``telegram`` extra) and
  :class:`CloudTelegramTransport` send; :func:`send_telegram_text` chunks and threads.
* :func:`webhook_app` (ASGI) and :class:`TelegramPoller` (``getUpdates``) receive.
* :class:`FakeBotApi` is a Bot API served on loopback, for tests and offline demos.

Constructing any of them installs a logging filter that scrubs bot tokens (httpx logs every
request URL, which carries the token) from the ``httpx``, ``httpcore``, python-telegram-bot
and ``turn_kit.telegram`` loggers; the errors they raise are scrubbed too.
"""

from ._adapter import (
    TelegramHandleResult,
    TelegramTurnAdapter,
    create_telegram_turn_adapter,
    send_durably,
)
from ._fake import FakeBotApi
from ._parse import (
    TelegramMessage,
    bare_telegram_chat_id,
    chunk_telegram_text,
    read_telegram_message,
    telegram_skip_reason,
)
from ._polling import TelegramPoller
from ._transport import (
    BotApiTransport,
    CloudTelegramTransport,
    TelegramDelivery,
    TelegramRateLimitedError,
    TelegramSendResult,
    TelegramTransport,
    cloud_telegram_transport_from_env,
    send_telegram_text,
)
from ._webhook import webhook_app

__all__ = [
    "BotApiTransport",
    "CloudTelegramTransport",
    "FakeBotApi",
    "TelegramDelivery",
    "TelegramHandleResult",
    "TelegramMessage",
    "TelegramPoller",
    "TelegramRateLimitedError",
    "TelegramSendResult",
    "TelegramTransport",
    "TelegramTurnAdapter",
    "bare_telegram_chat_id",
    "chunk_telegram_text",
    "cloud_telegram_transport_from_env",
    "create_telegram_turn_adapter",
    "read_telegram_message",
    "send_durably",
    "send_telegram_text",
    "telegram_skip_reason",
    "webhook_app",
]
