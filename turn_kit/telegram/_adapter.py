"""``create_telegram_turn_adapter``: Telegram updates in, durable turns out.

``handle(ctx, payload=..., respond=...)`` reads the update, skips what it must (bots, other
chats, empty text — in the seed's order, failing closed without an owner chat) and runs the
turn on the turn runner. Acknowledgements and the reply go through the same chunked,
threaded (first chunk only), receipt-checked send, where **each chunk is a journaled step**:
a crash in the middle of a long reply re-sends at most the chunk that was in flight.

The turn's run id comes from the chat, the topic and the message id (plus ``@<edit_date>``
for an edited message), so a redelivered update gets the stored result, never a second
reply. :meth:`TelegramTurnAdapter.queued` takes the update's place in its conversation's
store-wide queue first thing (the webhook and the poller handle every update inside it), so
turns of a conversation run one at a time in the order they were received, across processes.
:meth:`TelegramTurnAdapter.run_id_for` gives that id for a payload (``None`` when it
would be skipped) and :meth:`TelegramTurnAdapter.turn_record` the stored run: the webhook and
the poller count a failing update's attempts there (durably), and stop retrying one after
:data:`MAX_ATTEMPTS` (see :func:`given_up`).

An adapter without an owner chat skips every update; it says so once, as a WARNING on the
``turn_kit.telegram`` logger. Constructing an adapter installs the token-redacting log filter.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agency_runtime import (
    InvalidArgumentError,
    ResumableScope,
    RunNotFoundError,
    RunRecord,
    Store,
    agency,
)

from .._context_providers import TurnContextProvider
from .._history import TurnMemoryOptions
from .._identity import conversation_key
from .._runner import TurnArgs, TurnResult, create_turn_runner
from .._util import maybe_await
from ._parse import (
    TelegramMessage,
    bare_telegram_chat_id,
    chunk_telegram_text,
    read_telegram_message,
    telegram_skip_reason,
)
from ._redact import install_token_redaction
from ._transport import (
    BotApiTransport,
    TelegramDelivery,
    cloud_telegram_transport_from_env,
    send_chunk,
)

__all__ = [
    "MAX_ATTEMPTS",
    "TelegramHandleResult",
    "TelegramTurnAdapter",
    "create_telegram_turn_adapter",
    "given_up",
]

logger = logging.getLogger("turn_kit.telegram")

MAX_ATTEMPTS = 3
"""A turn that failed this many times is given up: the webhook answers 200 (so Telegram stops
redelivering the update) and the poller moves past it. Counted from the turn's stored run
(``RunRecord.attempts``), so a restarted process keeps counting."""

_NO_OWNER = "no owner chat configured"


def given_up(record: RunRecord | None) -> bool:
    """Whether a turn's stored run is over for good: cancelled, or failed
    :data:`MAX_ATTEMPTS` times (a poison update). ``None`` (never started) is not."""
    if record is None:
        return False
    if record.status == "cancelled":
        return True
    return record.status == "failed" and record.attempts >= MAX_ATTEMPTS


class TelegramHandleResult(BaseModel):
    """The outcome of ``handle``: handled (with the turn's result) or skipped (with why)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    status: Literal["handled", "skipped"]
    reason: str | None = None
    message: TelegramMessage | None = None
    result: TurnResult | None = None


async def send_durably(
    transport: Any,
    chat_id: str,
    text: str,
    *,
    reply_to_message_id: str | None = None,
    thread_id: str | None = None,
    chunk_limit: int = 4096,
) -> TelegramDelivery:
    """Send ``text`` in chunks, each chunk a journaled step (inside a run).

    Only the first chunk replies to the message and carries the topic. A chunk whose result
    is not ok or has no message id raises; chunks sent before it stay sent. A chunk whose send
    timed out (``unknown``) is journaled as such and never resent blindly: the delivery is
    then not ok, so the turn reports it as unconfirmed instead of sending twice.
    """
    bare = bare_telegram_chat_id(chat_id)
    chunks = chunk_telegram_text(text, chunk_limit)

    def sender(index: int, chunk: str) -> Callable[[], Awaitable[str]]:
        async def send() -> str:
            sent = await send_chunk(
                transport, bare, chunk, index,
                reply_to_message_id=reply_to_message_id, thread_id=thread_id,
            )  # fmt: skip
            return "" if sent is None else sent  # "" journals "may have arrived": never resend

        return send

    async def body(s: ResumableScope) -> TelegramDelivery:
        ids: list[str] = []
        unknown: list[int] = []
        for index, chunk in enumerate(chunks):
            sent: str = await s.step(sender(index, chunk), name=f"chunk-{index}")
            if sent:
                ids.append(sent)
            else:
                unknown.append(index + 1)
        return TelegramDelivery(
            ok=not unknown, chat_id=bare, message_ids=ids, unknown_chunks=unknown
        )

    return await agency.with_resumable_scope("telegram-send", body)


class TelegramTurnAdapter:
    """Handles Telegram updates as turns; make it with :func:`create_telegram_turn_adapter`."""

    def __init__(
        self,
        *,
        namespace: str,
        owner_chat: str | Callable[[Any], Any] | None,
        transport: Any,
        memory: TurnMemoryOptions | dict[str, Any] | Literal[False] | None,
        context: Sequence[TurnContextProvider],
        store: str | Store | None,
        model: str | None,
        chunk_limit: int,
        typing: bool,
    ) -> None:
        self.runner = create_turn_runner(
            namespace=namespace, memory=memory, context=context, store=store, model=model
        )
        self.owner_chat = owner_chat
        self.transport = transport
        self.chunk_limit = chunk_limit
        self.typing = typing
        self._warned_no_owner = False
        install_token_redaction()
        if owner_chat is None or (isinstance(owner_chat, str) and not owner_chat.strip()):
            self._warn_no_owner()

    def _warn_no_owner(self) -> None:
        """Say, once per adapter, that without an owner chat every update is skipped."""
        if self._warned_no_owner:
            return
        self._warned_no_owner = True
        if callable(self.owner_chat):
            why = "its owner_chat= function returned no chat id (or raised)"
        else:
            why = "owner_chat= is not set"
        logger.warning(
            "Telegram adapter %r has no owner chat (%s): every update is skipped (%r) until "
            "it has one; pass owner_chat=<chat id>, or a function of ctx returning it, to "
            "create_telegram_turn_adapter",
            self.runner.namespace, why, _NO_OWNER,
        )  # fmt: skip

    async def _owner(self, ctx: Any) -> str | None:
        owner = self.owner_chat
        if callable(owner):
            try:
                owner = await maybe_await(owner(ctx))
            except Exception:  # no owner means no turn: fail closed
                return None
        if owner is None:
            return None
        return str(owner)

    async def _transport_for(self, ctx: Any) -> Any:
        transport = self.transport
        if callable(transport) and not hasattr(transport, "send_message"):
            transport = await maybe_await(transport(ctx))
        if transport is None:
            transport = cloud_telegram_transport_from_env() or BotApiTransport()
            self.transport = transport  # one client for every later update
        if not hasattr(transport, "send_message"):
            raise InvalidArgumentError(
                "a Telegram transport needs an async send_message(chat_id, text, *, "
                f"reply_to_message_id=None, thread_id=None), got {type(transport).__name__}"
            )
        return transport

    async def _read(self, ctx: Any, payload: Any) -> tuple[TelegramMessage | None, str | None]:
        """The update's message and why it is skipped (``None``: it gets a turn)."""
        message = read_telegram_message(payload)
        if message is None:
            return None, "unusable Telegram message"
        reason = telegram_skip_reason(message, await self._owner(ctx))
        if reason == _NO_OWNER:
            self._warn_no_owner()
        return message, reason

    @staticmethod
    def _conversation(message: TelegramMessage) -> dict[str, str]:
        key = conversation_key(bare_telegram_chat_id(message.chat_id), message.thread_id)
        return {"transport": "telegram", "id": key}

    @staticmethod
    def _turn_id(message: TelegramMessage) -> str:
        if message.edit_date:
            return f"{message.message_id}@{message.edit_date}"  # an edit gets its own answer
        return message.message_id

    async def run_id_for(self, ctx: Any, *, payload: Any) -> str | None:
        """The run id :meth:`handle` gives the turn of ``payload``, or ``None`` when the update
        would be skipped (it gets no run). Calls an ``owner_chat`` function, as ``handle``
        does."""
        message, reason = await self._read(ctx, payload)
        if message is None or reason is not None:
            return None
        return self.runner.run_id_for(self._conversation(message), self._turn_id(message))

    @asynccontextmanager
    async def queued(self, ctx: Any, *, payload: Any) -> AsyncIterator[str | None]:
        """``async with adapter.queued(ctx, payload=update) as run_id:`` — take the update's
        place in its conversation's store-wide queue at once, wait for its turn and hold it
        for the block (see :meth:`~turn_kit.TurnRunner.hold`): :meth:`handle` inside runs
        the turn without queueing again. ``run_id`` is :meth:`run_id_for`'s (``None``, and no
        queueing, for an update that would be skipped). The webhook and the poller enter it
        before any other store round trip, so turns of a conversation run in the order their
        updates were received, whichever process received them."""
        message, reason = await self._read(ctx, payload)
        if message is None or reason is not None:
            yield None
            return
        conversation = self._conversation(message)
        async with self.runner.hold(conversation):
            yield self.runner.run_id_for(conversation, self._turn_id(message))

    async def turn_record(self, run_id: str) -> RunRecord | None:
        """The stored run of a turn (``status``, ``attempts``, ``error``, …), or ``None`` when
        it never started."""
        try:
            return await agency.runs.get(run_id, store=self.runner.store)
        except RunNotFoundError:
            return None

    async def handle(
        self, ctx: Any, *, payload: Any, respond: Callable[[TurnArgs], Any]
    ) -> TelegramHandleResult:
        """Run the turn for one update (``payload``: the update as JSON data)."""
        message, reason = await self._read(ctx, payload)
        if message is None:
            return TelegramHandleResult(status="skipped", reason=reason)
        if reason is not None:
            return TelegramHandleResult(status="skipped", reason=reason, message=message)
        transport = await self._transport_for(ctx)
        if self.typing and hasattr(transport, "send_chat_action"):
            try:  # best effort: the indicator is a courtesy, never a reason to fail
                await maybe_await(
                    transport.send_chat_action(
                        bare_telegram_chat_id(message.chat_id),
                        "typing",
                        thread_id=message.thread_id or None,
                    )
                )
            except Exception:
                pass

        async def deliver(text: str) -> TelegramDelivery:
            return await send_durably(
                transport,
                message.chat_id,
                text,
                reply_to_message_id=message.message_id,
                thread_id=message.thread_id or None,
                chunk_limit=self.chunk_limit,
            )

        result = await self.runner.run(
            ctx,
            conversation=self._conversation(message),
            input=message.text,
            respond=respond,
            deliver=deliver,
            acknowledge=deliver,
            confirm_delivery=lambda receipt: bool(receipt.ok and receipt.message_ids),
            message_id=self._turn_id(message),
            message=message,
        )
        return TelegramHandleResult(status="handled", message=message, result=result)


def create_telegram_turn_adapter(
    *,
    namespace: str,
    owner_chat: str | Callable[[Any], Any] | None = None,
    transport: Any = None,
    memory: TurnMemoryOptions | dict[str, Any] | Literal[False] | None = None,
    context: Sequence[TurnContextProvider] = (),
    store: str | Store | None = None,
    model: str | None = None,
    chunk_limit: int = 4096,
    typing: bool = False,
) -> TelegramTurnAdapter:
    """A Telegram adapter for the turns of ``namespace``.

    ``owner_chat``: the one chat allowed to talk to the agent (a chat id, possibly with its
    ``__title`` suffix, or a function of ``ctx`` returning it); without one every update is
    skipped, and the adapter logs a WARNING saying so (once). ``transport``: an object with
    ``send_message`` (or a function of ``ctx`` returning one); the default is the Bot API with
    ``TELEGRAM_BOT_TOKEN``. ``typing``: show the typing indicator (``sendChatAction``) when a
    turn starts.
    """
    if isinstance(chunk_limit, bool) or not isinstance(chunk_limit, int) or chunk_limit < 1:
        raise InvalidArgumentError(f"chunk_limit must be a positive integer, got {chunk_limit!r}")
    return TelegramTurnAdapter(
        namespace=namespace,
        owner_chat=owner_chat,
        transport=transport,
        memory=memory,
        context=context,
        store=store,
        model=model,
        chunk_limit=chunk_limit,
        typing=typing,
    )
