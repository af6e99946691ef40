"""``send_proactive``: an assistant message the user did not ask for, sent exactly once.

A reminder, a digest, a "your order shipped" — output that starts on the agent's side, not
in answer to a message. :func:`send_proactive` delivers it into a conversation and remembers
it (:func:`~turn_kit.remember_assistant_message`: an assistant line, no fabricated user turn),
both as journaled steps of the calling run:

* the send is a step: a replayed or resumed run gets the recorded delivery back and sends
  nothing again (a run killed after delivery resumes straight to the save);
* each call is its own step (its own resumable scope, ``proactive``, ``proactive~1``, …), so
  two calls in one run are two messages, each sent once;
* the memory save comes after the delivery, and only after a confirmed one — as a turn's
  post-delivery persistence.

With ``agency.sleep`` in a worker's run that makes reminders that survive restarts: the
wake-up time is journaled, the parked run is continued when due, and the send is journaled
once it happened.

It does not queue for the conversation's turn lock (:meth:`TurnRunner.hold
<turn_kit.TurnRunner.hold>`), so it may be called from anywhere, a turn of the same
conversation included; a message sent while a turn is in flight is recalled by the next turn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict
from pydantic_core import from_json, to_json

from agency_runtime import DeferredModel, InvalidArgumentError, ResumableScope, Store, agency

from ._ctx import log_event
from ._errors import UnconfirmedTurnDeliveryError
from ._history import TurnMemoryOptions, memory_options, remember_assistant_message
from ._identity import TurnConversation, as_conversation, conversation_tag, js_trim
from ._util import maybe_await

if TYPE_CHECKING:
    from .slack import SlackApiTransport
    from .telegram import TelegramTransport

__all__ = ["ProactiveResult", "send_proactive"]

_SCOPE = "proactive"


class ProactiveResult(DeferredModel):
    """What :func:`send_proactive` returns (the same on a replay as on the first run).

    ``receipt`` is the delivery's journaled receipt: a
    :class:`~turn_kit.telegram.TelegramDelivery` for a Telegram transport, a
    :class:`~turn_kit.slack.SlackDelivery` for a Slack transport, else the JSON
    projection of what the deliver callable returned. ``memory_saved`` is whether the message
    was remembered in the conversation (confirmed by the memory's receipt).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    text: str
    receipt: Any = None
    memory_saved: bool


class _Delivered(DeferredModel):
    """The deliver step's journaled outcome: the receipt and whether it was confirmed."""

    receipt: Any = None
    confirmed: bool = True


def _project(receipt: Any) -> Any:
    """The JSON projection of a receipt (live objects become their ``repr``)."""
    return from_json(to_json(receipt, fallback=repr))


def _parts(conversation: TurnConversation, surface: str) -> tuple[str, str | None]:
    """The root and thread of a conversation of ``surface`` (``conversation_key(root,
    thread)``), refusing a conversation of another transport."""
    label = surface.capitalize()
    if js_trim(conversation.transport) != surface:
        raise InvalidArgumentError(
            f"send_proactive: a {label} transport sends to {label} conversations only, got a "
            f"conversation of transport {conversation.transport!r}; pass a deliver callable "
            "for other transports"
        )
    root, _, thread = js_trim(conversation.id).partition(":")
    where = js_trim(unquote(root))
    if not where:
        raise InvalidArgumentError(
            f"send_proactive: the {label} conversation id {conversation.id!r} names no "
            f"{'channel' if surface == 'slack' else 'chat'}"
        )
    topic = js_trim(unquote(thread))
    return where, topic or None


@dataclass(frozen=True)
class _Surface:
    """A first-party transport's durable, chunked send and the receipt type it journals."""

    send: Callable[[str], Awaitable[BaseModel]]
    receipt: type[BaseModel]

    @staticmethod
    def confirmed(delivery: Any) -> bool:
        """Whether every chunk arrived with an id (Telegram's or Slack's receipt)."""
        ids = getattr(delivery, "message_ids", None) or getattr(delivery, "message_ts", None)
        return bool(delivery.ok and ids)


def _surface(transport: object, conversation: TurnConversation) -> _Surface | None:
    """The first-party surface ``transport`` sends to (``None``: a deliver callable)."""
    if callable(getattr(transport, "post_message", None)):
        from .slack import SlackDelivery, send_slack_durably  # lazily: turn_kit stays cheap

        channel, thread = _parts(conversation, "slack")
        if thread is None:
            raise InvalidArgumentError(
                "send_proactive: a Slack conversation is a thread, conversation_key(channel, "
                f"thread_ts), as the Slack adapter makes it; {conversation.id!r} has no thread"
            )
        slack_thread = thread

        async def post(text: str) -> BaseModel:
            return await send_slack_durably(transport, channel, text, thread_ts=slack_thread)

        return _Surface(post, SlackDelivery)
    if callable(getattr(transport, "send_message", None)):
        from .telegram import TelegramDelivery, send_durably

        chat_id, thread_id = _parts(conversation, "telegram")

        async def send(text: str) -> BaseModel:
            return await send_durably(transport, chat_id, text, thread_id=thread_id)

        return _Surface(send, TelegramDelivery)
    if callable(transport):
        return None
    raise InvalidArgumentError(
        "send_proactive needs transport=: a Telegram transport (an object with async "
        "send_message(chat_id, text, *, reply_to_message_id=None, thread_id=None), such as "
        "BotApiTransport or the adapter's transport), a Slack transport (async "
        "post_message(channel, text, *, thread_ts=None, key=None), such as SlackApiTransport) "
        "or a deliver callable taking the text and returning a receipt, got "
        f"{type(transport).__name__}"
    )


def _check_text(text: object) -> str:
    if not isinstance(text, str):
        raise InvalidArgumentError(
            f"send_proactive: text must be a string, got {type(text).__name__}"
        )
    trimmed = js_trim(text)
    if not trimmed:
        raise InvalidArgumentError("send_proactive: text cannot be empty")
    return trimmed


async def send_proactive(
    ctx: Any,
    *,
    namespace: str,
    conversation: TurnConversation | dict[str, str],
    text: str,
    transport: TelegramTransport | SlackApiTransport | Callable[[str], Any],
    store: str | Store | None = None,
    memory: TurnMemoryOptions | Mapping[str, Any] | Literal[False] | None = None,
    confirm_delivery: Callable[[Any], Any] | None = None,
) -> ProactiveResult:
    """Send ``text`` into ``conversation`` as the assistant, exactly once, and remember it.

    Args:
        ctx: The turn ctx (:func:`~turn_kit.agency_ctx`, or any object with a ``memory``
            and optionally ``log``), as :meth:`TurnRunner.run <turn_kit.TurnRunner.run>`
            takes it.
        namespace: The turns' namespace (the one of the runner or Telegram adapter that
            talks in this conversation), so the message lands in the same memory.
        conversation: A :class:`~turn_kit.TurnConversation` (or a dict with ``transport``
            and ``id``) — for Telegram ``{"transport": "telegram", "id":
            conversation_key(chat_id, thread_id)}``, as the Telegram adapter makes it.
        text: The message (trimmed; it may not be blank).
        transport: A Telegram transport (an object with async ``send_message``, e.g.
            :class:`~turn_kit.telegram.BotApiTransport` or the adapter's ``transport``): the
            text goes to the conversation's chat (and topic) in chunks, each chunk a journaled
            step, and a chunk whose send timed out is never resent. Or a Slack transport (an
            object with async ``post_message``, e.g. :class:`~turn_kit.slack.SlackApiTransport`
            or the Slack adapter's ``transport``): the text goes into the conversation's
            thread (``conversation_key(channel, thread_ts)``) the same way, each chunk posted
            once (:func:`~turn_kit.slack.send_slack_durably`). Or a deliver callable
            ``deliver(text) -> receipt`` (sync or async), as ``TurnRunner.run`` takes it.
        store: Where the run lives when ``send_proactive`` is called outside a run: it then
            runs as a durable run of its own (as a turn does). Inside a run (an entry, a
            worker's run, a turn) the steps belong to that run and ``store`` is not used.
        memory: Memory options as for :func:`~turn_kit.create_turn_runner` (``scope``,
            ``ttl_seconds``, ``assistant_label``, ``required``); ``False`` sends without
            remembering; ``None`` uses the defaults.
        confirm_delivery: ``confirm_delivery(receipt)`` (sync or async) must be truthy for
            the delivery to count. It is called once, on the live receipt (a
            :class:`~turn_kit.telegram.TelegramDelivery` or
            :class:`~turn_kit.slack.SlackDelivery` for a first-party transport, which must
            also have every chunk's message id); its verdict is journaled with the delivery.

    Exactly once per calling step: the send is a journaled step, so a run replayed or resumed
    after a crash gets the recorded delivery back without sending again; each call is a step
    of its own (two calls in one run are two messages). The memory save follows the delivery,
    and only a confirmed one.

    Raises:
        InvalidArgumentError: ``text`` is not a string or is blank, the namespace or the
            conversation is invalid, ``transport`` is neither a Telegram transport nor a
            callable, a Telegram transport is given a conversation of another transport, or
            memory is on and ``ctx`` has no ``memory.save`` — all before anything is sent.
        UnconfirmedTurnDeliveryError: the delivery was not confirmed (nothing is
            remembered; a replay raises again and never resends).
        TurnMemoryError: a ``required`` memory save returned no receipt.
    """
    message = _check_text(text)
    chat = as_conversation(conversation)
    tag = conversation_tag(namespace, chat)
    surface = _surface(transport, chat)
    options = None if memory is False else memory_options(memory)
    if confirm_delivery is not None and not callable(confirm_delivery):
        raise InvalidArgumentError(
            "send_proactive: confirm_delivery must be callable or None, got "
            f"{type(confirm_delivery).__name__}"
        )
    if options is not None and not callable(getattr(getattr(ctx, "memory", None), "save", None)):
        raise InvalidArgumentError(
            "send_proactive remembers the message: give it a ctx with a memory "
            "(turn_kit.agency_ctx() builds one), or pass memory=False"
        )
    slug = js_trim(namespace)

    async def confirmed(receipt: Any) -> bool:
        return confirm_delivery is None or bool(await maybe_await(confirm_delivery(receipt)))

    async def deliver() -> _Delivered:
        if surface is not None:
            delivery = await surface.send(message)
            ok = surface.confirmed(delivery) and await confirmed(delivery)
            return _Delivered(receipt=delivery.model_dump(), confirmed=ok)
        receipt = await maybe_await(cast("Callable[[str], Any]", transport)(message))
        return _Delivered(receipt=_project(receipt), confirmed=await confirmed(receipt))

    async def body(s: ResumableScope) -> ProactiveResult:
        delivered: _Delivered = await s.step(deliver, name="deliver", returns=_Delivered)
        receipt = delivered.receipt
        if surface is not None:
            receipt = surface.receipt.model_validate(receipt)
        if not delivered.confirmed:
            log_event(ctx, "error", "proactive-unconfirmed", namespace=slug)
            raise UnconfirmedTurnDeliveryError(
                f"{slug} proactive delivery returned an unconfirmed receipt"
            )
        log_event(ctx, "info", "proactive-delivered", namespace=slug, transport=chat.transport)

        async def save() -> bool:
            if options is None:
                return False
            return await remember_assistant_message(
                ctx,
                tag,
                message,
                label=options.assistant_label,
                scope=options.scope,
                ttl_seconds=options.ttl_seconds,
                required=options.required,
            )

        saved: bool = await s.step(save, name="save", returns=bool)
        return ProactiveResult(text=message, receipt=receipt, memory_saved=saved)

    async def proactive() -> ProactiveResult:
        return await agency.with_resumable_scope(_SCOPE, body)

    if agency.ctx_maybe() is not None:  # inside a run (or a test frame): its steps
        return await proactive()
    result = await agency.run(proactive, store=store)
    if result.status == "completed":
        value = result.value
        assert isinstance(value, ProactiveResult)
        if surface is not None and not isinstance(value.receipt, BaseModel):
            value.receipt = surface.receipt.model_validate(value.receipt)  # stored as JSON
        return value
    if result.exception is not None:
        raise result.exception
    return result.unwrap()  # raises RunFailedError
