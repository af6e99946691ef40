"""A Telegram assistant: durable turns, conversation memory and an "open tasks" context.

Offline, against a fake Bot API on loopback and an offline fake model (no token, no
network)::

    python3 examples/telegram_bot.py --offline

It pushes a short scripted conversation (then a ``/remind`` due in a second), polls it like
the real bot would and prints the transcript. Against the real Bot API (long polling until Ctrl-C)::

    TELEGRAM_BOT_TOKEN=123:abc TELEGRAM_CHAT=8587 python3 examples/telegram_bot.py
    # or: python3 examples/telegram_bot.py 8587

The bot answers one chat only (``TELEGRAM_CHAT`` or the argument; every other chat is
skipped). Each message is a durable turn on the store (``AGENCY_STORE`` or
``sqlite:///./.agency/agency.db``): recall, context, respond, deliver and save are journaled
steps, so a redelivered update gets no second reply. Replies stream (``stream=True``): one
message, sent with the first words and edited as the answer grows (about once a second),
ending as exactly the reply. The model is ``AGENCY_MODEL`` when set
(any litellm model, with its provider's key), else an offline fake assistant. The open tasks
come from the file ``OPEN_TASKS_FILE`` names (one task a line) or a built-in list.

``/remind <when> <text>`` (``/remind 2h call mom``, ``/remind 30m stretch``, ``/remind 90s
tea``) sets a reminder: the turn enqueues a durable run (the declared entry :func:`remind`)
that ``agency.sleep``s until then and sends "⏰ <text>" into the chat with
``turn_kit.send_proactive``. The bot process runs a ``Worker`` for the reminders' queue next to
its poller, so a reminder survives a restart of the bot in between: the sleep's wake-up time is
in the store, the parked run is continued when due, and the message is sent exactly once (and
remembered: the next turn recalls it). A worker of its own may serve the reminders instead:
``agency worker --queue telegram-reminders --import examples.telegram_bot`` with
``TELEGRAM_BOT_TOKEN`` set.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from agency_runtime import DEFAULT_STORE_URL, ResumableScope, Store, Worker, agency
from agency_runtime.testing import FakeModel, FakeRequest
from turn_kit import (
    TurnArgs,
    TurnConversation,
    agency_ctx,
    conversation_key,
    define_turn_context,
    send_proactive,
)
from turn_kit.demo import offline_assistant_reply
from turn_kit.telegram import (
    BotApiTransport,
    FakeBotApi,
    TelegramPoller,
    TelegramTurnAdapter,
    create_telegram_turn_adapter,
)

NAMESPACE = "telegram-assistant"
REMINDER_QUEUE = "telegram-reminders"
"""The queue of reminder runs; the bot's :class:`Worker` serves it."""
DEFAULT_TASKS = ["call Mom", "renew passport", "book the dentist"]
SCRIPT = [
    "Hi! My name is Ada.",
    "What are my open tasks?",
    "And what's my name again?",
]


def open_tasks() -> list[str]:
    """The open tasks: lines of the ``OPEN_TASKS_FILE`` file, else a built-in list."""
    path = os.environ.get("OPEN_TASKS_FILE")
    if path and Path(path).is_file():
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        return [line.strip() for line in lines if line.strip()]
    return list(DEFAULT_TASKS)


TASKS_CONTEXT = define_turn_context(
    name="open-tasks",
    collect=lambda args: {
        "id": "open-tasks",
        "label": "Open tasks",
        "content": "; ".join(open_tasks()) or "none",
    },
)


def _offline_model(request: FakeRequest) -> str:
    return offline_assistant_reply(str(request.messages[-1]["content"]))


OFFLINE_MODEL = FakeModel("telegram-assistant", function=_offline_model)


def build_prompt(turn: TurnArgs) -> str:
    """The prompt of one turn: instructions, recalled history, context blocks, the message."""
    history = "\n".join(entry.content for entry in turn.history) or "(nothing yet)"
    context = "\n".join(f"{block.label}: {block.content}" for block in turn.context)
    return (
        "You are a concise, helpful personal assistant on Telegram.\n"
        f"Earlier in this conversation:\n{history}\n{context}\nMessage: {turn.input}"
    )


async def respond(turn: TurnArgs) -> str:
    """Answer one turn with ``agency.llm`` (journaled, billed to the turn's run), streaming
    the answer into the chat as it is generated (``on_token=turn.on_token``)."""
    return str(await agency.llm(build_prompt(turn), on_token=turn.on_token))


# -- /remind <when> <text> ---------------------------------------------------------------------

REMIND_USAGE = (
    "Usage: /remind <when> <text> — <when> is a duration such as 90s, 30m, 2h, 1d or 1h30m. "
    "For example: /remind 2h call mom"
)
MAX_REMINDER_SECONDS = 366 * 86400
_COMMAND = re.compile(r"^/remind(?:@\w+)?(?=\s|$)", re.IGNORECASE)
_WHEN = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$", re.IGNORECASE)
_UNITS = (86400, 3600, 60, 1)


@dataclass(frozen=True)
class ReminderRequest:
    """A parsed ``/remind``: in how many seconds, and what to say."""

    seconds: int
    text: str


def parse_remind(message: str) -> ReminderRequest | None:
    """``/remind <when> <text>`` as a :class:`ReminderRequest`; ``None`` for any other message.

    Raises:
        ValueError: a ``/remind`` without a usable duration or text (the reply is
            :data:`REMIND_USAGE`).
    """
    command = _COMMAND.match(message.strip())
    if command is None:
        return None
    when, text = [*message.strip()[command.end() :].split(maxsplit=1), "", ""][:2]
    parts = _WHEN.match(when)
    if not when or parts is None:
        raise ValueError(f"not a duration: {when!r}")
    seconds = sum(
        int(part) * unit for part, unit in zip(parts.groups(), _UNITS, strict=True) if part
    )
    if not 0 < seconds <= MAX_REMINDER_SECONDS:
        raise ValueError(f"a reminder is due within 1 second to 366 days, not {when!r}")
    if not text.strip():
        raise ValueError("a reminder needs a text")
    return ReminderRequest(seconds=seconds, text=text.strip())


def _clock_text(at: float, now: float) -> str:
    """``HH:MM UTC``, with the date when it is not today (UTC)."""
    due, today = datetime.fromtimestamp(at, UTC), datetime.fromtimestamp(now, UTC)
    shown = due.strftime("%H:%M UTC")
    return shown if due.date() == today.date() else f"{shown} on {due:%Y-%m-%d}"


_transports: list[Any] = []


def set_reminder_transport(transport: Any) -> None:
    """The Telegram transport this process's reminder runs send with (the bot's own)."""
    _transports[:] = [transport]


def reminder_transport() -> Any:
    """The transport set with :func:`set_reminder_transport`, else the Bot API with
    ``TELEGRAM_BOT_TOKEN`` (a worker process of its own: ``agency worker --import ...``)."""
    if not _transports:
        _transports.append(BotApiTransport())
    return _transports[0]


@agency.entry(name="telegram-bot.remind")
async def remind(namespace: str, conversation: TurnConversation, text: str, due_at: float) -> str:
    """The reminder run: sleep until ``due_at`` (durably), then send "⏰ <text>" once."""
    await agency.sleep(max(0.0, due_at - agency.ctx().clock.time()))
    sent = await send_proactive(
        agency_ctx(),  # the conversations' memory, on the run's store
        namespace=namespace,
        conversation=conversation,
        text=f"⏰ {text}",
        transport=reminder_transport(),
    )
    return sent.text


def reminder_run_id(turn_run_id: str) -> str:
    """The run id of the reminder a ``/remind`` turn sets (one per turn: idempotent)."""
    return f"remind:{turn_run_id}"


async def schedule_reminder(
    turn: TurnArgs,
    request: ReminderRequest,
    *,
    namespace: str,
    store: str | Store,
    queue: str = REMINDER_QUEUE,
) -> str:
    """Enqueue the reminder run of this turn; the acknowledgement to send.

    The due time and the enqueue are steps of the turn's run: a turn retried after a crash
    finds the same due time, and the reminder's run id (from the turn's) enqueues it once.
    """
    run_id = reminder_run_id(agency.ctx().run_id or uuid.uuid4().hex)

    async def body(s: ResumableScope) -> str:
        now: float = await s.step(lambda: agency.ctx().clock.time(), name="now", returns=float)
        due_at = now + request.seconds

        async def enqueue() -> str:
            return await agency.enqueue(
                remind, namespace, turn.conversation, request.text, due_at,
                run_id=run_id, queue=queue, store=store,
            )  # fmt: skip

        queued: str = await s.step(enqueue, name="enqueue", returns=str)
        assert queued == run_id
        return f"I'll remind you at {_clock_text(due_at, now)}: {request.text}"

    return await agency.with_resumable_scope("remind", body)


def make_respond(
    namespace: str, store: str | Store, *, queue: str = REMINDER_QUEUE
) -> Callable[[TurnArgs], Awaitable[str]]:
    """The bot's ``respond``: ``/remind`` sets a reminder (a run on ``queue``), anything else
    goes to the model."""

    async def answer(turn: TurnArgs) -> str:
        try:
            request = parse_remind(turn.input)
        except ValueError:
            return REMIND_USAGE
        if request is None:
            return await respond(turn)
        return await schedule_reminder(turn, request, namespace=namespace, store=store, queue=queue)

    return answer


# -- the bot: a poller for the chat, a worker for the reminders -------------------------------


@dataclass
class TelegramBot:
    """The parts of one bot process, made by :func:`build_bot`; run them with :func:`serve`."""

    adapter: TelegramTurnAdapter
    poller: TelegramPoller
    worker: Worker


def build_bot(
    *,
    store: str | Store,
    chat: str,
    transport: Any,
    namespace: str = NAMESPACE,
    queue: str = REMINDER_QUEUE,
    model: str | None = None,
    token: str | None = None,
    base_url: str = "https://api.telegram.org",
    poll_timeout: float = 30.0,
    offset_key: str | None = None,
    worker_poll: float = 1.0,
) -> TelegramBot:
    """The adapter, poller and reminder worker of a bot answering ``chat`` on ``store``.

    ``transport`` sends the replies and, through :func:`set_reminder_transport`, this
    process's reminders; the worker serves the reminder runs of ``queue``.
    """
    set_reminder_transport(transport)
    adapter = create_telegram_turn_adapter(
        namespace=namespace,
        owner_chat=chat,
        transport=transport,
        store=store,
        model=model,
        context=[TASKS_CONTEXT],
        typing=True,
        stream=True,
    )
    poller = TelegramPoller(
        adapter,
        ctx=agency_ctx(store),
        respond=make_respond(namespace, store, queue=queue),
        token=token,
        base_url=base_url,
        poll_timeout=poll_timeout,
        offset_key=offset_key,
    )
    worker = Worker(store, queues=[queue], poll=worker_poll)
    return TelegramBot(adapter=adapter, poller=poller, worker=worker)


async def serve(bot: TelegramBot, *, stop: anyio.Event | None = None) -> None:
    """Poll the chat and run due reminders until ``stop`` is set (or forever)."""
    stop = stop if stop is not None else anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(bot.worker.run)
        await bot.poller.run(stop=stop)
        await bot.worker.drain()


def _model() -> str:
    chosen = os.environ.get("AGENCY_MODEL")
    if chosen:
        return chosen
    OFFLINE_MODEL.register()
    return OFFLINE_MODEL.model


async def run_offline(store: str, chat: str | None) -> int:
    """Talk to the bot through a fake Bot API on loopback; print the transcript."""
    session = uuid.uuid4().hex[:8]
    token = "4242:offline-token"
    owner = int(chat) if chat and chat.lstrip("-").isdigit() else 8587
    model = _model()
    print(f"telegram assistant (offline) — store {store}, model {model}, chat {owner}\n")
    with FakeBotApi(token=token) as api:
        async with BotApiTransport(token, base_url=api.base_url) as transport:
            bot = build_bot(
                store=store,
                chat=str(owner),
                transport=transport,
                # A fresh fake Bot API numbers messages from 1 again: a namespace (and a
                # reminder queue) per session keeps this session apart from earlier ones.
                namespace=f"{NAMESPACE}-offline-{session}",
                queue=f"{REMINDER_QUEUE}-offline-{session}",
                model=model,
                token=token,
                base_url=api.base_url,
                poll_timeout=0,
                offset_key=f"offline-{session}",
                worker_poll=0.1,
            )
            update: dict[str, Any] = {}
            for text in SCRIPT:
                update = api.push_message(owner, text)
                print(f"  you ▸ {text}")
                await bot.poller.poll_once()
                print(f"  bot ◂ {api.messages[-1]['text']}")  # as it reads now
            api.push_message(owner + 1, "I'm not the owner")  # another chat: skipped
            api.push_update(update)  # Telegram delivers the last update again: no new reply
            await bot.poller.poll_once()
            replies = len(api.sent)
            reminded = await _offline_reminder(bot, api, owner)
    print(f"\n{replies} replies for {len(SCRIPT)} messages (a stranger and a redelivery ignored)")
    print(f"{reminded} reminder sent (by its own durable run, after its sleep)")
    return 0 if replies == len(SCRIPT) and reminded == 1 else 1


async def _offline_reminder(bot: TelegramBot, api: FakeBotApi, owner: int) -> int:
    """``/remind`` offline: a malformed one, then one due in a second; how many arrived."""
    reminder = "⏰ stretch"
    async with anyio.create_task_group() as group:
        group.start_soon(bot.worker.run)
        update: dict[str, Any] = {}
        for text in ("/remind soon stretch", "/remind 1s stretch"):
            update = api.push_message(owner, text)
            print(f"  you ▸ {text}")
            await bot.poller.poll_once()
            print(f"  bot ◂ {api.messages[-1]['text']}")  # as it reads now
        chat = {"transport": "telegram", "id": conversation_key(str(owner))}
        turn = bot.adapter.runner.run_id_for(chat, update["message"]["message_id"])
        await agency.runs.wait(reminder_run_id(turn), store=bot.adapter.runner.store, timeout=30)
        await bot.worker.drain()
    count = sum(1 for sent in api.sent if sent["text"] == reminder)
    if count:
        print(f"  bot ◂ {reminder}    (a second later, sent by the reminder's run)")
    return count


async def run_online(store: str, chat: str) -> int:
    """Long-poll the real Bot API (``TELEGRAM_BOT_TOKEN``) and run reminders until interrupted."""
    model = _model()
    async with BotApiTransport() as transport:
        bot = build_bot(store=store, chat=chat, transport=transport, model=model)
        print(
            f"telegram assistant — store {store}, model {model}, answering chat {chat} "
            "(and /remind); Ctrl-C stops"
        )
        await serve(bot)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the bot; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="telegram_bot.py", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("chat", nargs="?", default=os.environ.get("TELEGRAM_CHAT"))
    parser.add_argument("--offline", action="store_true", help="fake Bot API, scripted chat")
    parser.add_argument("--store", default=os.environ.get("AGENCY_STORE") or DEFAULT_STORE_URL)
    options = parser.parse_args(argv)
    if options.offline:
        return anyio.run(run_offline, options.store, options.chat)
    if not os.environ.get("TELEGRAM_BOT_TOKEN"):
        parser.error("set TELEGRAM_BOT_TOKEN to run against the Bot API (or use --offline)")
    if not options.chat:
        parser.error("give the chat to answer: TELEGRAM_CHAT=... or an argument")
    try:
        return anyio.run(run_online, options.store, str(options.chat))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
