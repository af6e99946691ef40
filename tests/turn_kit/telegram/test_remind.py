"""The Telegram example's ``/remind <when> <text>``, against the fake Bot API: the turn
acknowledges and enqueues a durable reminder run; the bot dies and is started again on the
same store; once the (fake) clock reaches the due time, the new bot's worker sends
"⏰ <text>" into the chat, exactly once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from agency_runtime import MemoryStore, Store, agency
from agency_runtime.testing import FakeClock
from examples.telegram_bot import (
    REMIND_USAGE,
    REMINDER_QUEUE,
    ReminderRequest,
    TelegramBot,
    build_bot,
    parse_remind,
    reminder_run_id,
    serve,
)
from tests.support import wait_for, wait_for_status
from turn_kit import agency_ctx, conversation_key, conversation_tag, recall_turn_history
from turn_kit.telegram import BotApiTransport, FakeBotApi

pytestmark = pytest.mark.anyio

TOKEN = "4242:remind-token"
OWNER = 8587
NAMESPACE = "remind-bot"
CHAT = {"transport": "telegram", "id": conversation_key(str(OWNER))}


def texts(api: FakeBotApi) -> list[str]:
    """What the bot sent to the owner's chat, in order (and nothing to any other chat)."""
    sent = api.sent
    assert {message["chat_id"] for message in sent} <= {OWNER}
    return [message["text"] for message in sent]


@asynccontextmanager
async def running(
    api: FakeBotApi, store: Store, *, kill: bool = False
) -> AsyncIterator[TelegramBot]:
    """One bot process — its poller and its reminder worker — until the block ends; then it
    stops (``serve``'s stop event), or with ``kill`` dies on the spot (cancelled: no drain,
    no lock released)."""
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
        bot = build_bot(
            store=store, chat=str(OWNER), transport=transport, namespace=NAMESPACE,
            token=TOKEN, base_url=api.base_url, worker_poll=0.05,
        )  # fmt: skip
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: serve(bot, stop=stop))
            try:
                yield bot
            finally:
                if kill:
                    group.cancel_scope.cancel()
                stop.set()


async def test_a_reminder_survives_a_restart_and_arrives_once(
    fake_clock: FakeClock, make_store: Callable[..., Store]
) -> None:
    store = make_store(clock=fake_clock)
    ack = "I'll remind you at 02:00 UTC: call mom"  # the fake clock starts at 00:00 UTC
    # The fake Bot API answers a long poll within 50 ms: stopping a poller is quick.
    with FakeBotApi(token=TOKEN, long_poll_cap=0.05) as api:
        async with running(api, store, kill=True) as bot:
            update = api.push_message(OWNER, "/remind 2h call mom")
            await wait_for(lambda: len(api.sent) == 1)
            turn = bot.adapter.runner.run_id_for(CHAT, update["message"]["message_id"])
            reminder = reminder_run_id(turn)
            await wait_for_status(store, reminder, "waiting")  # parked in its sleep: no slot held
            assert (await agency.runs.get(reminder, store=store)).wake_at == (
                fake_clock.time() + 7200
            )
            api.push_update(update)  # Telegram redelivers the command: no second reminder
            await wait_for(lambda: not api.pending_updates())  # both handled, offset stored
        # ... and the bot process dies.
        assert texts(api) == [ack]
        fake_clock.advance(3600)  # the bot is down for an hour
        async with running(api, store):  # the restarted bot: a new poller and worker
            await anyio.wait_all_tasks_blocked()  # the worker looked: an hour early
            assert texts(api) == [ack]
            fake_clock.advance(3600)
            result = await agency.runs.wait(reminder, store=store, timeout=20)
            assert (result.status, result.value) == ("completed", "⏰ call mom")
            await anyio.wait_all_tasks_blocked()  # and nothing more comes
        [first, second] = api.sent
    assert texts(api) == [ack, "⏰ call mom"]
    assert second["reply_to_message_id"] is None  # proactive: not a reply to anything
    assert first["reply_to_message_id"] == update["message"]["message_id"]
    runs = await agency.runs.list(store=store)
    assert [run.run_id for run in runs if run.queue == REMINDER_QUEUE] == [reminder]  # once
    history = await recall_turn_history(agency_ctx(store), conversation_tag(NAMESPACE, CHAT))
    assert [entry.content for entry in history] == [
        f"User: /remind 2h call mom\nAssistant: {ack}",
        "Assistant: ⏰ call mom",  # remembered, with no made-up user turn
    ]


@pytest.mark.parametrize(
    "command",
    ["/remind", "/remind 2h", "/remind soon call mom", "/remind 0s tea", "/remind 2x tea"],
)
async def test_a_malformed_remind_gets_the_usage_and_sets_nothing(command: str) -> None:
    store = MemoryStore()
    with FakeBotApi(token=TOKEN) as api:
        async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
            bot = build_bot(
                store=store, chat=str(OWNER), transport=transport, namespace=NAMESPACE,
                token=TOKEN, base_url=api.base_url, poll_timeout=0,
            )  # fmt: skip
            api.push_message(OWNER, command)
            assert await bot.poller.poll_once() == 1
    assert texts(api) == [REMIND_USAGE]
    [turn] = await agency.runs.list(store=store)  # the turn's run, and no reminder
    assert turn.queue != REMINDER_QUEUE
    assert turn.status == "completed"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("/remind 2h call mom", ReminderRequest(7200, "call mom")),
        ("/remind 30m stretch", ReminderRequest(1800, "stretch")),
        ("/remind 90s tea", ReminderRequest(90, "tea")),
        ("/remind 1h30m  pick up   the kids ", ReminderRequest(5400, "pick up   the kids")),
        ("/remind@fake_bot 1d\nrenew passport", ReminderRequest(86400, "renew passport")),
        ("/REMIND 2H Tea", ReminderRequest(7200, "Tea")),
        ("remind me in 2h", None),
        ("/reminders", None),
    ],
)
def test_parse_remind(message: str, expected: ReminderRequest | None) -> None:
    assert parse_remind(message) == expected


@pytest.mark.parametrize(
    "message", ["/remind", "/remind 2h", "/remind h tea", "/remind 0m x", "/remind 367d x"]
)
def test_parse_remind_refuses_malformed_commands(message: str) -> None:
    with pytest.raises(ValueError, match=r"duration|due within|needs a text"):
        parse_remind(message)
