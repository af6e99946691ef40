"""``create_slack_turn_adapter``: Slack messages in, durable turns out, replies in the thread.

One conversation per thread: ``{"transport": "slack", "id": conversation_key(channel,
thread_ts or ts)}`` (the seed's "channel id plus root thread timestamp"), so a top-level
message starts a conversation and its thread continues it, with memory, history and
context exactly as for Telegram. The turn's run id is the conversation's tag plus the
message's ``ts``: a message Slack delivers twice gets one turn.

Acknowledgements and the reply are posted into the thread in chunks, each a journaled step
that a resumed turn finds again instead of posting twice (:mod:`turn_kit.slack._send`).
With ``stream=True`` the reply shows in one message edited while it is generated
(:mod:`turn_kit.slack._stream`). ``reaction="eyes"`` adds that reaction to the user's message
when its turn starts (best effort: Slack answers ``already_reacted`` to a repeat).

Two ways to run turns:

* :func:`~turn_kit.slack.slack_events_app` (the Events API over HTTP) queues each message as
  a durable run and answers Slack at once; a worker runs it (:meth:`SlackTurnAdapter.enqueue`,
  :meth:`SlackTurnAdapter.run_turn`);
* :meth:`SlackTurnAdapter.handle` runs one event's turn in the caller (a Socket Mode client,
  or your own receiver), as the Telegram adapter's ``handle`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal
from urllib.parse import unquote

import anyio
from pydantic import ConfigDict

from agency_runtime import (
    DeferredModel,
    InvalidArgumentError,
    Model,
    RunConflictError,
    RunNotFoundError,
    RunRecord,
    Store,
    agency,
)

from .. import _runner
from .._context_providers import TurnContextProvider
from .._history import TurnMemoryOptions
from .._identity import conversation_key
from .._pace import Pace
from .._runner import TurnArgs, TurnResult, create_turn_runner
from .._util import check_reply_options
from ._parse import (
    SlackMessage,
    read_slack_event,
    slack_input_text,
    slack_skip_reason,
    ts_order,
)
from ._queued import slack_turn
from ._send import SLACK_CHUNK_LIMIT, SlackDelivery, send_slack_durably
from ._stream import SlackPreview
from ._transport import SlackApiTransport, SlackIdentity

__all__ = ["SlackHandleResult", "SlackTurnAdapter", "create_slack_turn_adapter"]

logger = logging.getLogger("turn_kit.slack")

_EARLIER_SCAN = 10_000
"""How many queued (and running) runs of the store a turn looks through for its thread's."""

_LAST = (2**63, 0)
"""Where an unreadable ``ts`` sorts: after every message."""

_IDENTITY_RETRY_SECONDS = 30.0
"""How long after a failed ``auth.test`` the adapter asks again (it answers meanwhile)."""


class SlackHandleResult(DeferredModel):
    """The outcome of :meth:`SlackTurnAdapter.handle`: handled (with the turn's result),
    queued (with its run id) or skipped (with why)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    status: Literal["handled", "queued", "skipped"]
    reason: str | None = None
    message: SlackMessage | None = None
    run_id: str | None = None
    result: TurnResult | None = None


class SlackTurnAdapter:
    """Handles Slack messages as turns; make it with :func:`create_slack_turn_adapter`."""

    def __init__(
        self,
        *,
        namespace: str,
        transport: Any,
        bot_user_id: str | None,
        allowed_channels: frozenset[str] | None,
        require_mention: bool,
        memory: TurnMemoryOptions | dict[str, Any] | Literal[False] | None,
        context: Sequence[TurnContextProvider],
        store: str | Store | None,
        model: str | Model | None,
        chunk_limit: int,
        stream: bool,
        stream_interval: float,
        reaction: str | None,
    ) -> None:
        self.runner = create_turn_runner(
            namespace=namespace, memory=memory, context=context, store=store, model=model
        )
        self.namespace = self.runner.namespace
        self.queue = f"turn-kit-slack-{self.namespace}"
        """The queue the events app's turns wait in for a worker."""
        self._transport = transport
        self.allowed_channels = allowed_channels
        self.require_mention = require_mention
        self.chunk_limit = chunk_limit
        self.stream = stream
        self.stream_interval = stream_interval
        self.reaction = reaction
        self._identity = None if bot_user_id is None else SlackIdentity(user_id=bot_user_id)
        self._identity_failed_at: float | None = None
        self._pace = Pace()

    @property
    def transport(self) -> Any:
        """The Web API transport (``SlackApiTransport()`` from ``SLACK_BOT_TOKEN`` unless one
        was given), made on first use."""
        if self._transport is None:
            self._transport = SlackApiTransport()
        return self._transport

    async def identity(self) -> SlackIdentity | None:
        """Who the bot is (``bot_user_id=``, else ``auth.test``, asked once and remembered);
        ``None`` while Slack cannot be asked (then asked again after 30 s). Without it the
        adapter still skips every bot's messages (its own carry its ``bot_id``) and answers
        direct messages and ``app_mention`` events."""
        if self._identity is not None:
            return self._identity
        now = anyio.current_time()
        failed = self._identity_failed_at
        if failed is not None and 0 <= now - failed < _IDENTITY_RETRY_SECONDS:
            return None
        try:
            self._identity = await self.transport.auth_test()
        except Exception as exc:
            self._identity_failed_at = now
            logger.warning("Slack auth.test failed (%s): who the bot is stays unknown", exc)
            return None
        return self._identity

    # -- reading ------------------------------------------------------------------------------

    async def read(self, payload: Any) -> tuple[SlackMessage | None, str | None]:
        """The payload's message and why it gets no turn (``None``: it gets one)."""
        message = read_slack_event(payload)
        if message is None:
            return None, "not a Slack message event"
        me = await self.identity()
        reason = slack_skip_reason(
            message,
            bot_user_id=None if me is None else me.user_id,
            bot_id=None if me is None else me.bot_id,
            allowed_channels=self.allowed_channels,
            require_mention=self.require_mention,
        )
        return message, reason

    @staticmethod
    def conversation(message: SlackMessage) -> dict[str, str]:
        """The turn's conversation: the channel and the thread's root."""
        return {"transport": "slack", "id": conversation_key(message.channel, message.root_ts)}

    def run_id_of(self, message: SlackMessage) -> str:
        """The run id of ``message``'s turn."""
        return self.runner.run_id_for(self.conversation(message), message.ts)

    async def run_id_for(self, payload: Any) -> str | None:
        """The run id of the payload's turn, or ``None`` when it would be skipped."""
        message, reason = await self.read(payload)
        if message is None or reason is not None:
            return None
        return self.run_id_of(message)

    async def turn_record(self, run_id: str) -> RunRecord | None:
        """The stored run of a turn, or ``None`` when it never started."""
        try:
            return await agency.runs.get(run_id, store=self.runner.store)
        except RunNotFoundError:
            return None

    # -- running --------------------------------------------------------------------------------

    async def enqueue(self, payload: Any) -> SlackHandleResult:
        """Store the payload's turn as a queued run on :attr:`queue` (``queued``, with its run
        id; a message queued before gets the same id and is not queued again) or say why it
        is skipped. Returns once the run is durable."""
        message, reason = await self.read(payload)
        if message is None or reason is not None:
            return SlackHandleResult(status="skipped", reason=reason, message=message)
        run_id = self.run_id_of(message)
        try:
            await agency.enqueue(
                slack_turn, self.namespace, message, run_id=run_id, queue=self.queue,
                store=self.runner.store, model=self.runner.model,
            )  # fmt: skip
        except RunConflictError:
            # The same message through another event (its app_mention beside its message
            # event): one turn, already queued.
            logger.debug("Slack message %s of %s is queued already", message.ts, message.channel)
        return SlackHandleResult(status="queued", message=message, run_id=run_id)

    async def handle(
        self, ctx: Any, *, payload: Any, respond: Callable[[TurnArgs], Any]
    ) -> SlackHandleResult:
        """Run the payload's turn here, as a durable run of its own (Socket Mode, or your own
        receiver); a redelivered message gets the stored result, never a second reply."""
        message, reason = await self.read(payload)
        if message is None or reason is not None:
            return SlackHandleResult(status="skipped", reason=reason, message=message)
        result = await self._turn(ctx, message, respond, inline=True)
        return SlackHandleResult(
            status="handled", message=message, run_id=self.run_id_of(message), result=result
        )

    async def run_turn(
        self, ctx: Any, message: SlackMessage, respond: Callable[[TurnArgs], Any]
    ) -> TurnResult:
        """Run ``message``'s turn in the calling run (the queued run a worker claimed), once
        the earlier turns of its thread are done (:meth:`after_earlier_turns`)."""
        await self.after_earlier_turns(message)
        return await self._turn(ctx, message, respond, inline=False)

    async def after_earlier_turns(self, message: SlackMessage) -> None:
        """Wait until no earlier message of ``message``'s thread has a turn queued or running.

        The conversation's lock runs one turn at a time, in the order they take their tickets,
        but a queued turn takes its ticket only when a worker runs it: two messages claimed
        in one poll could go in either order, and a turn whose worker died (its reply sent,
        its memory not yet saved) holds no ticket until it is taken over. So a queued turn
        first waits for the queued and running turns of its thread with an earlier ``ts``,
        and recalls what they saved. A paused, waiting or failed turn does not hold the
        thread up (as with the lock, it gives up its place). The wait is bounded by twice
        :data:`~turn_kit.TURN_LOCK_LEASE_SECONDS` (a worker that cannot take the earlier
        turn over, e.g. all its slots busy, delays the thread, never stops it).
        """
        prefix = self.runner.run_id_for(self.conversation(message), "")
        mine = ts_order(message.ts) or _LAST
        deadline = anyio.current_time() + 2 * _runner.TURN_LOCK_LEASE_SECONDS
        delay = 0.02
        while True:
            earlier = [
                record.run_id
                for status in ("running", "queued")
                for record in await agency.runs.list(
                    store=self.runner.store, status=status, limit=_EARLIER_SCAN
                )
                if record.run_id.startswith(prefix)
                and (ts_order(unquote(record.run_id[len(prefix) :])) or _LAST) < mine
            ]
            if not earlier:
                return
            if anyio.current_time() >= deadline:
                logger.warning(
                    "Slack turn of %s in %s runs before earlier turns still in flight (%s)",
                    message.ts, message.channel, ", ".join(earlier),
                )  # fmt: skip
                return
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _turn(
        self,
        ctx: Any,
        message: SlackMessage,
        respond: Callable[[TurnArgs], Any],
        *,
        inline: bool,
    ) -> TurnResult:
        transport = self.transport
        me = await self.identity()
        if self.reaction:
            try:  # a courtesy, never a reason to fail
                await transport.add_reaction(message.channel, message.ts, self.reaction)
            except Exception as exc:
                logger.debug("Slack reaction on %s failed: %s", message.ts, exc)
        preview = self._preview(transport, message)
        channel, thread_ts, limit = message.channel, message.root_ts, self.chunk_limit

        async def send(text: str) -> SlackDelivery:
            return await send_slack_durably(
                transport, channel, text, thread_ts=thread_ts, chunk_limit=limit
            )

        async def deliver(text: str) -> SlackDelivery:
            if preview is None or preview.ts is None:
                return await send(text)
            return await send_slack_durably(
                transport, channel, text, thread_ts=thread_ts, chunk_limit=limit,
                first=preview.deliver_first,
            )  # fmt: skip

        arguments: dict[str, Any] = {
            "conversation": self.conversation(message),
            "input": slack_input_text(message, None if me is None else me.user_id),
            "respond": respond,
            "deliver": deliver,
            "acknowledge": send,
            "confirm_delivery": lambda receipt: bool(receipt.ok and receipt.message_ts),
            "message": message,
            "stream": preview,
        }
        if inline:
            return await self.runner.run(ctx, message_id=message.ts, **arguments)
        return await self.runner.run_steps(ctx, **arguments)

    def _preview(self, transport: Any, message: SlackMessage) -> SlackPreview | None:
        if not self.stream:
            return None
        return SlackPreview(
            transport,
            message,
            chunk_limit=self.chunk_limit,
            interval=self.stream_interval,
            pace=self._pace,
        )


def _channels(value: Collection[str] | str | None) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    channels = frozenset(value)
    if not channels or not all(isinstance(c, str) and c.strip() for c in channels):
        raise InvalidArgumentError(
            "allowed_channels must be channel ids like 'C0123ABCD' (or None for every "
            f"channel the app gets events from), got {value!r}"
        )
    return channels


def create_slack_turn_adapter(
    *,
    namespace: str,
    transport: Any = None,
    bot_user_id: str | None = None,
    allowed_channels: Collection[str] | None = None,
    require_mention: bool = True,
    memory: TurnMemoryOptions | dict[str, Any] | Literal[False] | None = None,
    context: Sequence[TurnContextProvider] = (),
    store: str | Store | None = None,
    model: str | Model | None = None,
    chunk_limit: int = SLACK_CHUNK_LIMIT,
    stream: bool = False,
    stream_interval: float = 1.0,
    reaction: str | None = None,
) -> SlackTurnAdapter:
    """A Slack adapter for the turns of ``namespace``.

    ``transport``: a :class:`~turn_kit.slack.SlackApiTransport` (the default reads
    ``SLACK_BOT_TOKEN``) or any object with its methods. ``bot_user_id``: the bot's user id
    (``U…``); without it the adapter asks ``auth.test`` once. ``allowed_channels``: the
    channel ids it answers in (``None``: every channel whose events reach the app; direct
    messages are channels ``D…``). ``require_mention``: in channels, answer only messages
    that mention the bot (direct messages always get a turn). ``chunk_limit``: the longest
    message posted (UTF-16 units, default 4,000 as Slack advises). ``stream``: show the
    reply while it is generated in one message, edited at most once every
    ``stream_interval`` seconds per channel. ``reaction``: an emoji name (``"eyes"``) added
    to the user's message when its turn starts. ``memory``, ``context``, ``store`` and
    ``model`` are :func:`~turn_kit.create_turn_runner`'s.
    """
    check_reply_options(chunk_limit=chunk_limit, stream=stream, stream_interval=stream_interval)
    if not isinstance(require_mention, bool):
        raise InvalidArgumentError(
            f"require_mention must be True or False, got {require_mention!r}"
        )
    if bot_user_id is not None and (not isinstance(bot_user_id, str) or not bot_user_id.strip()):
        raise InvalidArgumentError(
            f"bot_user_id must be a user id like 'U0123ABCD', got {bot_user_id!r}"
        )
    if reaction is not None and (not isinstance(reaction, str) or not reaction.strip(": ")):
        raise InvalidArgumentError(f"reaction must be an emoji name like 'eyes', got {reaction!r}")
    if model is not None and not isinstance(model, str | Model):
        name = getattr(model, "model", None)
        hint = f" (this one's name is {name!r})" if isinstance(name, str) else ""
        raise InvalidArgumentError(
            "model must be a model name or an agency.Model: a queued Slack turn stores its "
            f"model by name, so pass a FakeModel's .model{hint}, got {type(model).__name__}"
        )
    if transport is not None and not callable(getattr(transport, "post_message", None)):
        raise InvalidArgumentError(
            "a Slack transport needs async post_message(channel, text, *, thread_ts=None, "
            f"key=None) (SlackApiTransport has it), got {type(transport).__name__}"
        )
    return SlackTurnAdapter(
        namespace=namespace,
        transport=transport,
        bot_user_id=bot_user_id,
        allowed_channels=_channels(allowed_channels),
        require_mention=require_mention,
        memory=memory,
        context=context,
        store=store,
        model=model,
        chunk_limit=chunk_limit,
        stream=stream,
        stream_interval=float(stream_interval),
        reaction=None if reaction is None else reaction.strip(": "),
    )
