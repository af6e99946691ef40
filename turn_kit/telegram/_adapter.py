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

**Streaming** (``stream=True``): the reply shows while it is generated. ``respond`` streams
it by passing ``on_token=turn.on_token`` to ``agency.llm`` (``ctx.llm.complete`` of
:func:`~turn_kit.agency_ctx` does that by itself; ``turn.on_token`` is ``None`` when the turn
is not streamed, so passing it always is fine)::

    async def respond(turn):
        return await agency.llm(prompt_for(turn), on_token=turn.on_token)

The first text is sent at once as a message (replying to the user's, in its topic): the
*preview*. It is then edited to the text so far, at most once every ``stream_interval``
seconds per chat (``anyio.current_time()``), never to the text it already shows; a 429 on an
edit holds the edits back for its ``retry_after``. A preview holds the first
``chunk_limit`` characters (UTF-16 units). The reply ``respond`` returns is what is
delivered, confirmed and saved: at delivery the preview is edited to show exactly its first
chunk (at once; a 429 there is waited out) and any further chunks are sent as usual, so the
receipt's first message id is the preview's. A ``respond`` that streams nothing is delivered
as without ``stream``.

Durability: the preview's send is a journaled step of the respond step, and its message id
is journaled with the respond step's outcome, so a turn resumed after a crash edits that
message instead of sending a second one — also after a crash in the middle of the stream
(then the model is asked again: its answer was not journaled yet; after the answer is
journaled, the resume replays it). As with any send, a crash while the preview's own
``sendMessage`` is in flight may leave that partial message behind; a preview whose send
timed out is not edited, and the reply is sent as a new message. A transport without
``edit_message_text`` streams nothing (a WARNING says so once). Bot API message drafts
(``sendMessageDraft``) are not used.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

from pydantic import ConfigDict

from agency_runtime import (
    DeferredModel,
    InvalidArgumentError,
    Model,
    ResumableScope,
    RunNotFoundError,
    RunRecord,
    Store,
    agency,
)

from .._context_providers import TurnContextProvider
from .._errors import TurnKitError
from .._history import TurnMemoryOptions
from .._identity import conversation_key, js_trim
from .._pace import Pace, retry_after
from .._runner import TurnArgs, TurnResult, create_turn_runner
from .._util import check_reply_options, field, maybe_await
from ._parse import (
    TelegramMessage,
    bare_telegram_chat_id,
    chunk_telegram_text,
    read_telegram_message,
    telegram_skip_reason,
)
from ._redact import install_token_redaction, scrub_exception
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
_EDIT_ATTEMPTS = 3
"""How many times a final edit that timed out is tried before the turn fails (and is retried
later): an edit, unlike a send, may be repeated safely."""


def given_up(record: RunRecord | None) -> bool:
    """Whether a turn's stored run is over for good: cancelled, or failed
    :data:`MAX_ATTEMPTS` times (a poison update). ``None`` (never started) is not."""
    if record is None:
        return False
    if record.status == "cancelled":
        return True
    return record.status == "failed" and record.attempts >= MAX_ATTEMPTS


class TelegramHandleResult(DeferredModel):
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
    edit_message_id: str | None = None,
) -> TelegramDelivery:
    """Send ``text`` in chunks, each chunk a journaled step (inside a run).

    Only the first chunk replies to the message and carries the topic. A chunk whose result
    is not ok or has no message id raises; chunks sent before it stay sent. A chunk whose send
    timed out (``unknown``) is journaled as such and never resent blindly: the delivery is
    then not ok, so the turn reports it as unconfirmed instead of sending twice.

    ``edit_message_id``: a message of the chat (a streamed preview) that becomes the first
    chunk — it is edited to show it (``transport.edit_message_text``) instead of sending a
    new message; when it cannot be edited any more (deleted), the chunk is sent.
    """
    bare = bare_telegram_chat_id(chat_id)
    first: Callable[[str], Awaitable[str]] | None = None
    if edit_message_id is not None:
        edited = str(edit_message_id)

        async def edit(chunk: str) -> str:
            sent, _ = await _edit_or_send(
                transport, bare, edited, chunk,
                reply_to_message_id=reply_to_message_id, thread_id=thread_id,
            )  # fmt: skip
            return sent

        first = edit
    return await _send_chunks(
        transport, bare, text,
        reply_to_message_id=reply_to_message_id, thread_id=thread_id,
        chunk_limit=chunk_limit, first=first,
    )  # fmt: skip


async def _edit_or_send(
    transport: Any,
    chat: str,
    message_id: str,
    chunk: str,
    *,
    reply_to_message_id: str | None,
    thread_id: str | None,
) -> tuple[str, bool]:
    """Make message ``message_id`` show ``chunk`` (the first chunk of a reply); when it cannot
    be edited, send ``chunk`` as chunk 1. Returns the message id (``""``: a send that timed
    out) and whether it was an edit. An edit that keeps timing out raises (a retry of the
    turn edits again: an edit may be repeated safely)."""
    result: Any = None
    for _ in range(_EDIT_ATTEMPTS):
        try:
            result = await maybe_await(transport.edit_message_text(chat, message_id, chunk))
        except Exception as exc:  # any transport's error: no token in what a run stores
            scrub_exception(exc)
            raise
        if not field(result, "unknown"):
            break
    else:
        raise TurnKitError(
            f"Telegram editMessageText in {chat} timed out {_EDIT_ATTEMPTS} times: the reply "
            "is not confirmed (a retry of the turn edits the message again)"
        )
    if field(result, "ok"):
        return message_id, True
    sent = await send_chunk(
        transport, chat, chunk, 0, reply_to_message_id=reply_to_message_id, thread_id=thread_id
    )  # the message is gone (deleted): chunk 1 is sent anew
    return ("" if sent is None else sent), False


async def _send_chunks(
    transport: Any,
    bare: str,
    text: str,
    *,
    reply_to_message_id: str | None,
    thread_id: str | None,
    chunk_limit: int,
    first: Callable[[str], Awaitable[str]] | None,
) -> TelegramDelivery:
    """:func:`send_durably`'s chunks; ``first(chunk)``, when given, delivers chunk 1."""
    chunks = chunk_telegram_text(text, chunk_limit)

    def sender(index: int, chunk: str) -> Callable[[], Awaitable[str]]:
        if index == 0 and first is not None:
            deliver_first = first

            async def edit() -> str:
                return await deliver_first(chunk)

            return edit

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


class _Preview:
    """One streamed turn's preview message (``stream=True``; see the module docstring).

    It is the turn's :class:`~turn_kit.TurnStream`: ``token`` gets the reply's pieces,
    ``snapshot``/``restore`` carry the preview's message id through the respond step's
    journal, and :meth:`deliver_first` makes it the reply's first chunk.
    """

    def __init__(
        self,
        transport: Any,
        message: TelegramMessage,
        *,
        chunk_limit: int,
        interval: float,
        pace: Pace,
    ) -> None:
        self.transport = transport
        self.chat = bare_telegram_chat_id(message.chat_id)
        self.reply_to: str | None = message.message_id
        self.thread: str | None = message.thread_id or None
        self.chunk_limit = chunk_limit
        self.interval = interval
        self.pace = pace
        self.text = ""
        self.message_id: str | None = None
        self.shown: str | None = None
        """What the preview shows, when this process knows it."""
        self.opened = False  # the preview's send step ran (or replayed)
        self.quiet = False  # no more edits while streaming: one failed for good

    def _head(self) -> str:
        chunks = chunk_telegram_text(js_trim(self.text), self.chunk_limit)
        return chunks[0] if chunks else ""

    async def token(self, delta: str) -> None:
        if not isinstance(delta, str) or not delta:
            return
        self.text += delta
        if not self.opened:
            head = self._head()
            if head:
                await self._open(head)
            return
        if self.message_id is None or self.quiet or not self.pace.ready(self.chat):
            return
        head = self._head()
        if head and head != self.shown:
            await self._edit(head)

    async def _open(self, head: str) -> None:
        self.opened = True
        ran = False

        async def send() -> str:
            nonlocal ran
            ran = True
            sent = await send_chunk(
                self.transport, self.chat, head, 0,
                reply_to_message_id=self.reply_to, thread_id=self.thread,
            )  # fmt: skip
            return "" if sent is None else sent  # "" journals "may have arrived"

        async def body(s: ResumableScope) -> str:
            sent: str = await s.step(send, name="preview", returns=str)
            return sent

        try:
            preview_id: str = await agency.with_resumable_scope("telegram-preview", body)
        except Exception as exc:
            logger.warning(
                "Telegram preview in %s was not sent (%s): the reply is sent when it is ready",
                self.chat, exc,
            )  # fmt: skip
            return
        if not preview_id:
            return  # timed out (it may have arrived): no edits; the reply is sent anew
        self.message_id = preview_id
        if ran:
            self.shown = head
            self.pace.hold(self.chat, self.interval)
        elif self.pace.ready(self.chat):
            await self._edit(head)  # a resumed turn: what it shows now is unknown

    async def _edit(self, head: str) -> None:
        assert self.message_id is not None
        try:
            result = await maybe_await(
                self.transport.edit_message_text(self.chat, self.message_id, head, max_retries=0)
            )
        except Exception as exc:
            scrub_exception(exc)
            wait = retry_after(exc)
            if wait is not None:  # Telegram asked for a pause: no edit before it is over
                self.pace.hold(self.chat, max(wait, self.interval), rate_limited=True)
                return
            self.quiet = True
            logger.warning(
                "Telegram preview edit in %s failed (%s): the reply replaces it when ready",
                self.chat, exc,
            )  # fmt: skip
            return
        self.pace.hold(self.chat, self.interval)
        if field(result, "ok"):
            self.shown = head
        elif field(result, "unknown"):
            self.shown = None
        else:
            self.quiet = True  # gone (deleted): the reply is sent anew

    def snapshot(self) -> Any:
        return None if self.message_id is None else {"message_id": self.message_id}

    def restore(self, data: Any) -> None:
        if self.message_id is None and isinstance(data, dict) and data.get("message_id"):
            self.message_id = str(data["message_id"])  # a resumed turn's preview
            self.opened = True

    async def deliver_first(self, chunk: str) -> str:
        """The reply's first chunk, in the preview: edited to show exactly ``chunk``."""
        assert self.message_id is not None
        if chunk == self.shown:
            return self.message_id  # never edited to the text it shows
        # At once (the interval paces the preview only), but never inside a 429's pause.
        await self.pace.wait_out_limit(self.chat)
        sent, edited = await _edit_or_send(
            self.transport, self.chat, self.message_id, chunk,
            reply_to_message_id=self.reply_to, thread_id=self.thread,
        )  # fmt: skip
        if edited:
            self.shown = chunk
            self.pace.hold(self.chat, self.interval)
        return sent


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
        model: str | Model | None,
        chunk_limit: int,
        typing: bool,
        stream: bool = False,
        stream_interval: float = 1.0,
    ) -> None:
        self.runner = create_turn_runner(
            namespace=namespace, memory=memory, context=context, store=store, model=model
        )
        self.owner_chat = owner_chat
        self.transport = transport
        self.chunk_limit = chunk_limit
        self.typing = typing
        self.stream = stream
        self.stream_interval = stream_interval
        self._pace = Pace()
        self._warned_no_edit = False
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

    def _preview(self, transport: Any, message: TelegramMessage) -> _Preview | None:
        """The turn's preview when the adapter streams (and the transport can edit)."""
        if not self.stream:
            return None
        if not callable(getattr(transport, "edit_message_text", None)):
            if not self._warned_no_edit:
                self._warned_no_edit = True
                logger.warning(
                    "Telegram adapter %r streams (stream=True), but its transport %s has no "
                    "edit_message_text: replies are sent when they are ready, not streamed",
                    self.runner.namespace, type(transport).__name__,
                )  # fmt: skip
            return None
        return _Preview(
            transport,
            message,
            chunk_limit=self.chunk_limit,
            interval=self.stream_interval,
            pace=self._pace,
        )

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

        preview = self._preview(transport, message)

        async def send(text: str) -> TelegramDelivery:
            return await send_durably(
                transport,
                message.chat_id,
                text,
                reply_to_message_id=message.message_id,
                thread_id=message.thread_id or None,
                chunk_limit=self.chunk_limit,
            )

        async def deliver(text: str) -> TelegramDelivery:
            if preview is None or preview.message_id is None:
                return await send(text)
            return await _send_chunks(  # the preview becomes chunk 1
                transport,
                bare_telegram_chat_id(message.chat_id),
                text,
                reply_to_message_id=message.message_id,
                thread_id=message.thread_id or None,
                chunk_limit=self.chunk_limit,
                first=preview.deliver_first,
            )

        result = await self.runner.run(
            ctx,
            conversation=self._conversation(message),
            input=message.text,
            respond=respond,
            deliver=deliver,
            acknowledge=send,
            confirm_delivery=lambda receipt: bool(receipt.ok and receipt.message_ids),
            message_id=self._turn_id(message),
            message=message,
            stream=preview,
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
    model: str | Model | None = None,
    chunk_limit: int = 4096,
    typing: bool = False,
    stream: bool = False,
    stream_interval: float = 1.0,
) -> TelegramTurnAdapter:
    """A Telegram adapter for the turns of ``namespace``.

    ``owner_chat``: the one chat allowed to talk to the agent (a chat id, possibly with its
    ``__title`` suffix, or a function of ``ctx`` returning it); without one every update is
    skipped, and the adapter logs a WARNING saying so (once). ``transport``: an object with
    ``send_message`` (or a function of ``ctx`` returning one); the default is the Bot API with
    ``TELEGRAM_BOT_TOKEN``. ``typing``: show the typing indicator (``sendChatAction``) when a
    turn starts.

    ``stream``: show the reply while it is generated — one message, sent with the first text
    and edited as more arrives, at most once every ``stream_interval`` seconds per chat; it
    ends showing exactly the reply. ``respond`` streams with
    ``agency.llm(..., on_token=turn.on_token)`` or ``ctx.llm.complete(...)``; see the module
    docstring for the details and what a crash does.
    """
    check_reply_options(chunk_limit=chunk_limit, stream=stream, stream_interval=stream_interval)
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
        stream=stream,
        stream_interval=float(stream_interval),
    )
