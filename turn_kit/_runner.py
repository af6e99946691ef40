"""``create_turn_runner``: one chat turn, run as a durable run of agency_runtime.

A turn recalls the conversation's history, collects context, asks ``respond`` for the reply
(which may send acknowledgements), delivers it, confirms the delivery and saves the turn to
memory, in that order. Each of those is a journaled step, so:

* with ``message_id`` the turn's run id is derived from the conversation and the message,
  and a redelivered message gets the stored result instead of a second reply;
* a process killed after delivery resumes straight to the save: the reply is not sent again;
* turns of one conversation hold a store-wide lock, so they run one at a time, in arrival
  order, each recalling what the one before it saved.

**Order across processes.** The conversation's lock is a FIFO queue of tickets in the store
(``LockTable``), shared by every process on it: several webhook servers behind a load
balancer, pollers, workers. What is guaranteed:

* one turn of a conversation at a time, store-wide — also for a redelivered update handled
  by two processes at once: the second waits, then finds the completed run (no second reply);
* turns run in ticket order, and the ticket is taken as the very first store round trip:
  :meth:`TurnRunner.run` queues before the run is claimed, and the Telegram webhook and
  poller queue (:meth:`TurnRunner.hold`) before anything else — before the duplicate check,
  the typing indicator and the run. So a turn whose process received its message earlier
  than another process received the next message of the conversation runs first, unless the
  two arrived within the time it takes to parse the update and write one ticket (about a
  millisecond on SQLite, a round trip on PostgreSQL): receipts that close together have no
  order any process could observe, and either may go first;
* a holder that dies stops blocking the others at once when it was a process of this
  machine, else when its ticket's lease (:data:`TURN_LOCK_LEASE_SECONDS`) runs out;
* a turn that fails, or pauses on an interrupt, gives up its place; its retry (a redelivery,
  the answer to the interrupt) queues anew, after the turns that queued meanwhile.

Failures surface as the seed raises them (the original exception objects), never as a
``RunResult``; a turn that pauses on an interrupt raises :class:`TurnPausedError`.

**Streaming.** ``run(..., stream=sink)`` (a :class:`TurnStream`, e.g. the Telegram adapter's
live preview) gets the reply's pieces as ``respond`` generates them: ``respond`` passes
``on_token=turn.on_token`` to ``agency.llm`` (``ctx.llm.complete`` of :func:`agency_ctx`
does it by itself). What the sink reports when ``respond`` returns is journaled with the
respond step and handed back to it before delivery, also in a resumed process. Only the
reply ``respond`` returns is delivered, confirmed and saved.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import anyio
from pydantic import ConfigDict, SerializerFunctionWrapHandler, model_serializer
from pydantic_core import from_json, to_json

from agency_runtime import (
    DeferredModel,
    InvalidArgumentError,
    Model,
    ResumableScope,
    Store,
    agency,
    open_store,
)

from ._context_providers import (
    TurnContext,
    TurnContextArgs,
    TurnContextProvider,
    collect_turn_context,
)
from ._ctx import log_event, streaming_to
from ._errors import TurnPausedError, UnconfirmedTurnDeliveryError
from ._history import (
    TurnHistoryEntry,
    TurnMemoryOptions,
    memory_options,
    recall_turn_history,
    remember_turn,
)
from ._identity import TurnConversation, as_conversation, conversation_tag, js_encode, js_trim
from ._util import maybe_await
from ._version import TURN_KIT_VERSION

__all__ = [
    "TURN_LOCK_LEASE_SECONDS",
    "TurnArgs",
    "TurnResponse",
    "TurnResult",
    "TurnRunner",
    "TurnStream",
    "create_turn_runner",
]

logger = logging.getLogger("turn_kit")

TURN_LOCK_LEASE_SECONDS = 30.0
"""How long a conversation's lock ticket stays valid without renewal (renewed every third of
it while held, at every poll while waiting): a holder on another machine that dies blocks its
conversation at most this long. Read at each :meth:`TurnRunner.hold`, so tests may shorten it."""


class TurnResponse(DeferredModel):
    """What ``respond`` may return instead of a plain string.

    ``remember``: ``False`` skips saving this turn; a string replaces the saved record.
    """

    model_config = ConfigDict()

    reply: str
    remember: str | Literal[False] | None = None


class TurnResult(DeferredModel):
    """The outcome of a turn: exactly the seed's five fields."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    reply: str
    receipt: Any = None
    context: list[TurnContext]
    acknowledgements: int
    memory_saved: bool


@dataclass(frozen=True)
class TurnArgs:
    """What ``respond(turn)`` gets, as attributes.

    ``on_token``: where a streamed turn's reply streams to — pass it on,
    ``await agency.llm(prompt, on_token=turn.on_token)``; ``None`` when the turn is not
    streamed (so passing it on always is fine). The reply is still what ``respond`` returns.
    """

    ctx: Any
    conversation: TurnConversation
    input: str
    history: list[TurnHistoryEntry]
    context: list[TurnContext]
    acknowledge: Callable[[str], Awaitable[bool]]
    message: Any = None
    on_token: Callable[[str], Awaitable[None]] | None = None


@runtime_checkable
class TurnStream(Protocol):
    """Where :meth:`TurnRunner.run` streams a reply to (``stream=``).

    ``token(delta)`` gets each piece of the reply while ``respond`` runs (it should not
    raise: a failing preview must not fail the turn). ``snapshot()`` is called when
    ``respond`` returns: JSON data journaled with the respond step. ``restore(data)`` gets
    that data back after the respond step (run now or replayed after a crash), before the
    reply is delivered.
    """

    async def token(self, delta: str) -> None: ...

    def snapshot(self) -> Any: ...

    def restore(self, data: Any) -> None: ...


class _Responded(DeferredModel):
    """The respond step's journaled outcome."""

    reply: str
    remember: str | Literal[False] | None = None
    acknowledgements: int = 0
    stream: Any = None
    """A streamed turn's :meth:`TurnStream.snapshot` (left out of the journal when ``None``)."""

    @model_serializer(mode="wrap")
    def _without_stream(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("stream") is None:
            data.pop("stream", None)  # an unstreamed turn journals what it always did
        return data


@dataclass
class _Live:
    """What only this process has: the live delivery receipt."""

    receipt: Any = None
    delivered: bool = False
    locked: bool = False  # the caller holds the conversation's lock for this run


def _project(receipt: Any) -> Any:
    """The JSON projection of a receipt journaled with the turn (live objects stay here)."""
    return from_json(to_json(receipt, fallback=repr))


def _response(value: Any) -> _Responded:
    if isinstance(value, str):
        response = TurnResponse(reply=value)
    elif isinstance(value, TurnResponse):
        response = value
    elif isinstance(value, dict):
        response = TurnResponse.model_validate(value)
    else:
        raise InvalidArgumentError(
            f"respond must return a string or a TurnResponse, got {type(value).__name__}"
        )
    reply = js_trim(response.reply)
    if not reply:
        raise InvalidArgumentError("turn response cannot be empty")
    remember = response.remember
    if isinstance(remember, str) and not js_trim(remember):
        raise InvalidArgumentError("explicit turn memory cannot be empty")
    return _Responded(reply=reply, remember=remember)


# -- the conversation's store-wide lock -------------------------------------------------------

_HELD: ContextVar[tuple[tuple[str, int], ...]] = ContextVar("turn_kit_held", default=())
"""(lock name, holding task id) of the conversation locks the callers of this task hold."""


def _lock_name(tag: str) -> str:
    return f"turn-kit:{tag}"


class TurnRunner:
    """Runs turns for one namespace; make it with :func:`create_turn_runner`."""

    def __init__(
        self,
        *,
        namespace: str,
        memory: TurnMemoryOptions | None,
        context: Sequence[TurnContextProvider],
        store: str | Store | None,
        model: str | Model | None,
    ) -> None:
        self.namespace = js_trim(namespace)
        self.memory = memory
        self.providers = list(context)
        self.store = store
        self.model = model

    def run_id_for(
        self, conversation: TurnConversation | dict[str, str], message_id: str | int
    ) -> str:
        """The run id :meth:`run` gives the turn of ``message_id`` in ``conversation``
        (the conversation tag, ``#``, the encoded message id): look the turn's run up with
        ``agency.runs.get(run_id, store=runner.store)``."""
        tag = conversation_tag(self.namespace, as_conversation(conversation))
        return f"{tag}#{js_encode(str(message_id))}"

    def hold(
        self, conversation: TurnConversation | dict[str, str]
    ) -> AbstractAsyncContextManager[None]:
        """``async with runner.hold(conversation):`` — take the conversation's place in its
        store-wide queue at once (the first store round trip), wait for its turn, and hold
        it for the block (its lease renewed). :meth:`run` called inside the block, in the
        same task, runs the turn without queueing again. Call it as soon as a message is
        received, before any other store round trip, so turns run in the order the messages
        were received (see the module docstring). Reentrant in the task that holds it."""
        return self._hold(conversation_tag(self.namespace, as_conversation(conversation)))

    @asynccontextmanager
    async def _hold(self, tag: str) -> AsyncIterator[None]:
        name = _lock_name(tag)
        task = anyio.get_current_task().id
        held = _HELD.get()
        if (name, task) in held:
            yield
            return
        store = open_store(self.store)
        async with agency.lock(
            name, scope="global", store=store, lease=TURN_LOCK_LEASE_SECONDS, warn_after=0
        ):
            token = _HELD.set((*held, (name, task)))
            try:
                yield
            finally:
                _HELD.reset(token)

    async def run(
        self,
        ctx: Any,
        *,
        conversation: TurnConversation | dict[str, str],
        input: str,
        respond: Callable[[TurnArgs], Any],
        deliver: Callable[[str], Any],
        acknowledge: Callable[[str], Any] | None = None,
        confirm_delivery: Callable[[Any], Any] | None = None,
        message_id: str | int | None = None,
        message: Any = None,
        stream: TurnStream | None = None,
    ) -> TurnResult:
        """Run one turn (see the module docstring) and return its :class:`TurnResult`.

        ``respond``, ``deliver``, ``acknowledge`` and ``confirm_delivery`` may be sync or
        async; awaitables they return are awaited. ``message_id`` makes the turn idempotent.
        ``message`` is handed to ``respond`` as ``turn.message`` (the Telegram adapter's
        parsed message). ``stream``: a :class:`TurnStream` the reply streams to while
        ``respond`` runs (``turn.on_token``); without it nothing is streamed.
        """
        text, chat, tag = self._check(conversation, input, respond, deliver, stream)
        run_id = None if message_id is None else f"{tag}#{js_encode(str(message_id))}"
        live = _Live()

        async def turn(turn_input: str) -> TurnResult:
            return await self._turn(
                ctx, chat, tag, turn_input, respond, deliver, acknowledge,
                confirm_delivery, message, live, stream,
            )  # fmt: skip

        async with self._hold(tag):  # queue first: before the run is claimed
            live.locked = True
            try:
                result = await agency.run(
                    turn, text, run_id=run_id, store=self.store, model=self.model
                )
            finally:
                live.locked = False
        if result.status == "completed":
            value = result.value
            assert isinstance(value, TurnResult)
            if live.delivered:
                value.receipt = live.receipt  # the live object, not its projection
            return value
        if result.status == "paused":
            raise TurnPausedError(result)
        if result.exception is not None:
            raise result.exception
        return result.unwrap()  # raises RunFailedError

    def _check(
        self,
        conversation: TurnConversation | dict[str, str],
        input: str,
        respond: Callable[[TurnArgs], Any],
        deliver: Callable[[str], Any],
        stream: TurnStream | None,
    ) -> tuple[str, TurnConversation, str]:
        """The turn's trimmed input, conversation and tag; raises for unusable arguments."""
        if not isinstance(input, str):
            raise InvalidArgumentError(f"turn input must be a string, got {type(input).__name__}")
        text = js_trim(input)
        if not text:
            raise InvalidArgumentError("turn input cannot be empty")
        for what, fn in (("respond", respond), ("deliver", deliver)):
            if not callable(fn):
                raise InvalidArgumentError(f"run() needs {what}: a callable")
        if stream is not None and not isinstance(stream, TurnStream):
            raise InvalidArgumentError(
                "stream must have async token(delta), snapshot() and restore(data), "
                f"got {type(stream).__name__}"
            )
        chat = as_conversation(conversation)
        return text, chat, conversation_tag(self.namespace, chat)

    async def run_steps(
        self,
        ctx: Any,
        *,
        conversation: TurnConversation | dict[str, str],
        input: str,
        respond: Callable[[TurnArgs], Any],
        deliver: Callable[[str], Any],
        acknowledge: Callable[[str], Any] | None = None,
        confirm_delivery: Callable[[Any], Any] | None = None,
        message: Any = None,
        stream: TurnStream | None = None,
    ) -> TurnResult:
        """The turn's steps in the calling run, for an entry that *is* the turn — a turn
        queued with ``agency.enqueue`` and run by a worker (the Slack events app's turns).

        The same steps as :meth:`run` (recall, context, respond, deliver, save; the
        conversation's lock taken inside the run), without starting a run of its own: the
        run's id is the caller's (:meth:`run_id_for` gives the one :meth:`run` would use).
        Raises :class:`InvalidArgumentError` outside a run.
        """
        text, chat, tag = self._check(conversation, input, respond, deliver, stream)
        if agency.ctx_maybe() is None:
            raise InvalidArgumentError(
                "run_steps() runs a turn's steps inside a run (an entry a worker runs); "
                "outside one, use run()"
            )
        return await self._turn(
            ctx, chat, tag, text, respond, deliver, acknowledge,
            confirm_delivery, message, _Live(), stream,
        )  # fmt: skip

    async def _turn(self, *args: Any) -> TurnResult:
        """The turn's resumable scope ``turn`` around :meth:`_steps` (``args`` are its own)."""

        async def body(s: ResumableScope) -> TurnResult:
            return await self._steps(s, *args)

        return await agency.with_resumable_scope("turn", body)

    async def _steps(
        self,
        s: ResumableScope,
        ctx: Any,
        conversation: TurnConversation,
        tag: str,
        text: str,
        respond: Callable[[TurnArgs], Any],
        deliver: Callable[[str], Any],
        acknowledge: Callable[[str], Any] | None,
        confirm_delivery: Callable[[Any], Any] | None,
        message: Any,
        live: _Live,
        stream: TurnStream | None = None,
    ) -> TurnResult:
        namespace, memory = self.namespace, self.memory
        log_event(
            ctx, "info", "started",
            version=TURN_KIT_VERSION, namespace=namespace, transport=conversation.transport,
        )  # fmt: skip
        # The caller holds the conversation's lock (run() queued before claiming the run);
        # a run resumed without it (an interrupt answered later) takes it here.
        locked = live.locked
        guard: AbstractAsyncContextManager[Any] = (
            nullcontext() if locked else agency.lock(_lock_name(tag), scope="global")
        )
        async with guard:

            async def recall() -> list[TurnHistoryEntry]:
                if memory is None:
                    return []
                return await recall_turn_history(ctx, tag, memory)

            history: list[TurnHistoryEntry] = await s.step(
                recall, name="recall", returns=list[TurnHistoryEntry]
            )

            async def collect() -> list[TurnContext]:
                args = TurnContextArgs(
                    ctx=ctx, conversation=conversation, input=text, history=history
                )
                return await collect_turn_context(self.providers, args)

            context: list[TurnContext] = await s.step(
                collect, name="context", returns=list[TurnContext]
            )

            async def answer() -> _Responded:
                acknowledgements = 0

                async def acknowledged(note: str) -> bool:
                    nonlocal acknowledgements
                    note = js_trim(note) if isinstance(note, str) else ""
                    if not note or acknowledge is None:
                        return False
                    try:
                        await maybe_await(acknowledge(note))
                    except Exception as exc:
                        log_event(
                            ctx, "warn", "acknowledgement-failed",
                            namespace=namespace, error=str(exc),
                        )  # fmt: skip
                        return False
                    acknowledgements += 1
                    log_event(ctx, "info", "acknowledged", namespace=namespace)
                    return True

                on_token = None if stream is None else stream.token
                args = TurnArgs(
                    ctx=ctx, conversation=conversation, input=text, history=history,
                    context=context, acknowledge=acknowledged, message=message,
                    on_token=on_token,
                )  # fmt: skip
                with streaming_to(on_token):  # ctx.llm.complete streams to the turn too
                    responded = _response(await maybe_await(respond(args)))
                responded.acknowledgements = acknowledgements
                if stream is not None:
                    responded.stream = stream.snapshot()
                return responded

            responded: _Responded = await s.step(answer, name="respond", returns=_Responded)
            if stream is not None:
                stream.restore(responded.stream)

            async def send() -> Any:
                receipt = await maybe_await(deliver(responded.reply))
                live.receipt, live.delivered = receipt, True
                if confirm_delivery is not None and not await maybe_await(
                    confirm_delivery(receipt)
                ):
                    log_event(ctx, "error", "delivery-unconfirmed", namespace=namespace)
                    raise UnconfirmedTurnDeliveryError(
                        f"{namespace} final turn delivery returned an unconfirmed receipt"
                    )
                return _project(receipt)

            receipt = await s.step(send, name="deliver")

            async def save() -> bool:
                if memory is None or responded.remember is False:
                    return False
                content = responded.remember if isinstance(responded.remember, str) else None
                return await remember_turn(ctx, tag, text, responded.reply, memory, content)

            memory_saved: bool = await s.step(save, name="save", returns=bool)
        log_event(
            ctx, "info", "completed",
            namespace=namespace, acknowledgements=responded.acknowledgements,
            context=len(context), memory_saved=memory_saved,
        )  # fmt: skip
        return TurnResult(
            reply=responded.reply,
            receipt=receipt,
            context=context,
            acknowledgements=responded.acknowledgements,
            memory_saved=memory_saved,
        )


def create_turn_runner(
    *,
    namespace: str,
    memory: TurnMemoryOptions | dict[str, Any] | Literal[False] | None = None,
    context: Sequence[TurnContextProvider] = (),
    store: str | Store | None = None,
    model: str | Model | None = None,
) -> TurnRunner:
    """A runner for the turns of ``namespace`` (a lowercase slug).

    ``memory``: ``False`` turns memory off; ``None`` (the default) means on with default
    options. ``context``: providers made with ``define_turn_context``. ``store``: where the
    turns' runs live (as in ``agency.run``). ``model``: the turns' default model for
    ``agency.llm``.
    """
    conversation_tag(namespace, TurnConversation(transport="check", id="check"))
    providers = list(context)
    for provider in providers:
        if not isinstance(provider, TurnContextProvider):
            raise InvalidArgumentError(
                "context must be a list of providers made with define_turn_context(...), "
                f"got {type(provider).__name__}"
            )
    options = None if memory is False else memory_options(memory)
    return TurnRunner(
        namespace=namespace, memory=options, context=providers, store=store, model=model
    )
