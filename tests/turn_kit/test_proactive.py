"""``send_proactive``: an assistant message sent exactly once per calling step, remembered
without a user turn — and, with ``agency.sleep`` under a worker, a reminder that survives a
restart (a 2-hour wait on a fake clock)."""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from agency_runtime import InvalidArgumentError, MemoryStore, Store, Worker, agency
from agency_runtime.testing import FakeClock
from tests.forked import ForkServer
from tests.support import serving, wait_for_status
from turn_kit import (
    ProactiveResult,
    TurnConversation,
    TurnKitError,
    TurnMemoryError,
    UnconfirmedTurnDeliveryError,
    agency_ctx,
    conversation_key,
    conversation_tag,
    recall_turn_history,
    send_proactive,
)
from turn_kit.telegram import TelegramDelivery

pytestmark = pytest.mark.anyio

NAMESPACE = "life-agent"
CONVERSATION = TurnConversation(transport="telegram", id=conversation_key("8587"))
TAG = conversation_tag(NAMESPACE, CONVERSATION)


class Outbox:
    """A deliver callable that records what it sent (and can be told to fail)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, text: str) -> dict[str, Any]:
        self.sent.append(text)
        return {"ok": True, "message_id": len(self.sent)}


class TelegramDouble:
    """A Telegram transport (``send_message``) that records chat, text and topic."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str | None]] = []

    async def send_message(
        self,
        chat_id: str,
        text: str,
        *,
        reply_to_message_id: str | None = None,
        thread_id: str | None = None,
    ) -> dict[str, Any]:
        self.sent.append((chat_id, text, thread_id))
        return {"ok": True, "chat_id": chat_id, "message_id": str(100 + len(self.sent))}


class TimedOutTelegram(TelegramDouble):
    """A Telegram transport whose sends time out after going out (they may have arrived)."""

    async def send_message(self, chat_id: str, text: str, **options: Any) -> dict[str, Any]:
        await super().send_message(chat_id, text, **options)
        return {"ok": False, "chat_id": chat_id, "unknown": True}


class FlakyMemory:
    """Wraps a memory; its first ``failures`` saves raise (a process dying after delivery)."""

    def __init__(self, inner: Any, failures: int = 1) -> None:
        self.inner = inner
        self.failures = failures

    async def recall(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.recall(*args, **kwargs)

    async def save(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("the process died before the save")
        return await self.inner.save(*args, **kwargs)


async def history(store: Store | str) -> list[str]:
    """What a turn of the conversation would recall, oldest first."""
    entries = await recall_turn_history(agency_ctx(store), TAG)
    return [entry.content for entry in entries]


def proactive(ctx: Any, transport: Any, text: str = "⏰ call mom", **options: Any) -> Any:
    return send_proactive(
        ctx, namespace=NAMESPACE, conversation=CONVERSATION, text=text, transport=transport,
        **options,
    )  # fmt: skip


# -- sending once, remembering it ------------------------------------------------------------


async def test_it_sends_once_and_remembers_an_assistant_line_without_a_user_turn(
    store: Store,
) -> None:
    outbox = Outbox()
    ctx = agency_ctx(store)

    async def notify() -> ProactiveResult:
        return await proactive(ctx, outbox, "  ⏰ call mom \n")

    result = await agency.run(notify, run_id="notify", store=store)
    assert result.status == "completed"
    assert outbox.sent == ["⏰ call mom"]  # trimmed, sent once
    assert result.value == ProactiveResult(
        text="⏰ call mom", receipt={"ok": True, "message_id": 1}, memory_saved=True
    )
    assert await history(store) == ["Assistant: ⏰ call mom"]  # no "User:" line anywhere
    again = await agency.run(notify, run_id="notify", store=store)  # a redelivered trigger
    assert again.value == result.value
    assert outbox.sent == ["⏰ call mom"]
    assert await history(store) == ["Assistant: ⏰ call mom"]


async def test_a_run_resumed_after_delivery_saves_without_sending_again(store: Store) -> None:
    outbox = Outbox()
    ctx = agency_ctx(store)
    ctx.memory = FlakyMemory(ctx.memory)  # type: ignore[assignment]

    async def notify() -> ProactiveResult:
        return await proactive(ctx, outbox, memory={"required": True})

    first = await agency.run(notify, run_id="dies-after-delivery", store=store)
    assert first.status == "failed"
    assert outbox.sent == ["⏰ call mom"]
    assert await history(store) == []
    resumed = await agency.run(notify, run_id="dies-after-delivery", store=store)
    assert resumed.status == "completed"
    assert outbox.sent == ["⏰ call mom"]  # the recorded delivery, not a second send
    assert resumed.value.receipt == {"ok": True, "message_id": 1}
    assert resumed.value.memory_saved
    assert await history(store) == ["Assistant: ⏰ call mom"]


async def test_two_calls_in_one_run_are_two_messages_each_sent_once(store: Store) -> None:
    outbox = Outbox()
    ctx = agency_ctx(store)
    fail = [True]

    async def digest() -> list[int]:
        first = await proactive(ctx, outbox, "first")
        second = await proactive(ctx, outbox, "second")
        if fail.pop():
            raise RuntimeError("crashed after both sends")
        return [first.receipt["message_id"], second.receipt["message_id"]]

    assert (await agency.run(digest, run_id="digest", store=store)).status == "failed"
    fail.append(False)
    result = await agency.run(digest, run_id="digest", store=store)
    assert result.value == [1, 2]
    assert outbox.sent == ["first", "second"]
    assert await history(store) == ["Assistant: first", "Assistant: second"]


async def test_a_telegram_transport_sends_to_the_conversations_chat_and_topic() -> None:
    store = MemoryStore()
    telegram = TelegramDouble()
    topic = TurnConversation(transport="telegram", id=conversation_key("-100777", 42))

    receipts: list[Any] = []

    async def notify() -> bool:
        result = await send_proactive(
            agency_ctx(store), namespace=NAMESPACE, conversation=topic, text="due now",
            transport=telegram,
        )  # fmt: skip
        receipts.append(result.receipt)
        return result.memory_saved

    assert (await agency.run(notify, run_id="topic", store=store)).value is True
    assert telegram.sent == [("-100777", "due now", "42")]
    [receipt] = receipts
    assert isinstance(receipt, TelegramDelivery)
    assert (receipt.ok, receipt.chat_id, receipt.message_ids) == (True, "-100777", ["101"])
    items = await recall_turn_history(agency_ctx(store), conversation_tag(NAMESPACE, topic))
    assert [item.content for item in items] == ["Assistant: due now"]
    # Outside a run it is a run of its own; the receipt is a TelegramDelivery there too.
    alone = await send_proactive(
        agency_ctx(store), namespace=NAMESPACE, conversation=topic, text="again",
        transport=telegram, store=store,
    )  # fmt: skip
    assert isinstance(alone.receipt, TelegramDelivery)
    assert alone.receipt.message_ids == ["102"]
    assert [text for _, text, _ in telegram.sent] == ["due now", "again"]


async def test_memory_options_label_the_line_and_false_skips_it() -> None:
    store = MemoryStore()
    outbox = Outbox()

    async def both() -> list[bool]:
        ctx = agency_ctx(store)
        labelled = await proactive(ctx, outbox, "labelled", memory={"assistantLabel": "life-agent"})
        silent = await proactive(None, outbox, "not remembered", memory=False)
        return [labelled.memory_saved, silent.memory_saved]

    assert (await agency.run(both, store=store)).value == [True, False]
    assert outbox.sent == ["labelled", "not remembered"]
    assert await history(store) == ["life-agent: labelled"]


async def test_outside_a_run_it_is_a_durable_run_of_its_own(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/proactive.db"
    outbox = Outbox()
    result = await proactive(agency_ctx(store), outbox, store=store)
    assert result.text == "⏰ call mom"
    assert result.memory_saved
    assert outbox.sent == ["⏰ call mom"]
    assert await history(store) == ["Assistant: ⏰ call mom"]
    [run] = await agency.runs.list(store=store)
    assert run.status == "completed"


# -- confirmation and bad input -----------------------------------------------------------------


async def test_an_unconfirmed_delivery_raises_remembers_nothing_and_is_never_resent() -> None:
    store = MemoryStore()
    outbox = Outbox()
    ctx = agency_ctx(store)
    verdicts: list[Any] = []

    async def refuse(receipt: Any) -> bool:
        verdicts.append(receipt)
        return False

    async def notify() -> ProactiveResult:
        return await proactive(ctx, outbox, confirm_delivery=refuse)

    for _ in range(2):
        result = await agency.run(notify, run_id="unconfirmed", store=store)
        assert result.status == "failed"
        assert isinstance(result.exception, UnconfirmedTurnDeliveryError)
    assert outbox.sent == ["⏰ call mom"]  # the replay re-raises without sending again
    assert verdicts == [{"ok": True, "message_id": 1}]  # asked once, on the live receipt
    assert await history(store) == []


async def test_a_telegram_send_that_timed_out_is_unconfirmed_and_never_resent() -> None:
    store = MemoryStore()
    telegram = TimedOutTelegram()

    async def notify() -> ProactiveResult:
        return await proactive(agency_ctx(store), telegram)

    for _ in range(2):
        result = await agency.run(notify, run_id="timed-out", store=store)
        assert isinstance(result.exception, UnconfirmedTurnDeliveryError)
    assert telegram.sent == [("8587", "⏰ call mom", None)]  # may have arrived: not resent
    assert await history(store) == []


async def test_a_required_save_without_a_receipt_raises() -> None:
    class NoReceipt:
        async def save(self, *args: Any, **kwargs: Any) -> None:
            return None

    ctx = agency_ctx(MemoryStore())
    ctx.memory = NoReceipt()  # type: ignore[assignment]
    with pytest.raises(TurnMemoryError):
        await agency.with_test_context(lambda: proactive(ctx, Outbox(), memory={"required": True}))


class _Ctx:
    memory = None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"text": ""}, r"^send_proactive: text cannot be empty$"),
        ({"text": " \n\ufeff\t"}, r"^send_proactive: text cannot be empty$"),
        ({"text": 42}, r"text must be a string, got int"),
        ({"namespace": "Not A Slug"}, r"turn namespace must be a lowercase slug"),
        ({"conversation": {"id": "8587"}}, r"a conversation needs string 'transport' and 'id'"),
        ({"conversation": "8587"}, r"a conversation is a TurnConversation"),
        ({"conversation": {"transport": "telegram", "id": " "}}, r"conversation id cannot be"),
        ({"transport": None}, r"send_proactive needs transport=.*got NoneType"),
        ({"transport": "8587"}, r"send_proactive needs transport=.*got str"),
        (
            {"transport": TelegramDouble(), "conversation": {"transport": "slack", "id": "C1"}},
            r"sends to Telegram conversations only.*'slack'",
        ),
        ({"ctx": _Ctx()}, r"give it a ctx with a memory .*or pass memory=False"),
        ({"ctx": None}, r"give it a ctx with a memory"),
        ({"memory": {"ttlSeconds": -1}}, r"ttl_seconds must be a positive number"),
        ({"memory": {"labl": "x"}}, r"invalid turn memory options"),
        ({"confirm_delivery": "yes"}, r"confirm_delivery must be callable or None, got str"),
    ],
)
async def test_bad_input_is_a_clear_error_and_sends_nothing(
    change: dict[str, Any], message: str
) -> None:
    outbox = Outbox()
    arguments: dict[str, Any] = {
        "namespace": NAMESPACE, "conversation": CONVERSATION, "text": "hello",
        "transport": outbox,
    }  # fmt: skip
    change = dict(change)  # shared by the asyncio and trio runs of the case
    ctx = change.pop("ctx", agency_ctx(MemoryStore()))
    arguments.update(change)
    with pytest.raises(InvalidArgumentError, match=message):
        await agency.with_test_context(lambda: send_proactive(ctx, **arguments))
    assert outbox.sent == []


async def test_a_failing_transport_propagates_and_remembers_nothing() -> None:
    store = MemoryStore()

    def broken(text: str) -> Any:
        raise TurnKitError("the channel is down")

    async def notify() -> ProactiveResult:
        return await proactive(agency_ctx(store), broken)

    result = await agency.run(notify, store=store)
    assert result.status == "failed"
    assert isinstance(result.exception, TurnKitError)
    assert await history(store) == []


# -- a reminder: agency.sleep, then send_proactive, under a worker ------------------------------

REMINDERS: list[str] = []


def _deliver_reminder(text: str) -> dict[str, Any]:
    REMINDERS.append(text)
    return {"ok": True, "message_id": len(REMINDERS)}


@agency.entry(name="tests.turn_kit.remind")
async def remind(text: str, seconds: float) -> int:
    """Sleep ``seconds`` durably, then send ``⏰ <text>`` into the conversation."""
    await agency.sleep(seconds)
    result = await send_proactive(
        agency_ctx(),  # the memory of the run's store
        namespace=NAMESPACE, conversation=CONVERSATION, text=f"⏰ {text}",
        transport=_deliver_reminder,
    )  # fmt: skip
    return int(result.receipt["message_id"])


@pytest.fixture(autouse=True)
def _no_reminders() -> None:
    REMINDERS.clear()


async def test_a_two_hour_reminder_parks_survives_a_restart_and_is_sent_once(
    fake_clock: FakeClock, make_store: Callable[..., Store]
) -> None:
    clock, store = fake_clock, make_store(clock=fake_clock)
    start = clock.time()
    async with serving(Worker(store, park_after=60, poll=0.05)) as worker:
        await agency.enqueue(remind, "call mom", 7200, run_id="remind-1", store=store)
        await wait_for_status(store, "remind-1", "waiting")
        record = await agency.runs.get("remind-1", store=store)
        assert record.wake_at == start + 7200
        assert worker.running == frozenset()  # parked: the slot is free
    assert REMINDERS == []
    # The bot restarts: a new worker on the same store picks the parked run up when due.
    clock.advance(3600)
    async with serving(Worker(store, park_after=60, poll=0.05)):
        await anyio.wait_all_tasks_blocked()  # the worker looked: an hour early, nothing is due
        assert REMINDERS == []
        assert (await agency.runs.get("remind-1", store=store)).status == "waiting"
        clock.advance(3600)
        result = await agency.runs.wait("remind-1", store=store, timeout=20)
    assert (result.status, result.value) == ("completed", 1)
    assert REMINDERS == ["⏰ call mom"]
    assert await history(store) == ["Assistant: ⏰ call mom"]
    async with serving(Worker(store, park_after=60, poll=0.05)):  # yet another restart
        clock.advance(7200)
        await anyio.wait_all_tasks_blocked()  # the worker looked: the reminder is done
    assert REMINDERS == ["⏰ call mom"]
    assert (await agency.runs.get("remind-1", store=store)).attempts == 2  # parked once


# -- a real crash: SIGKILL right after delivery --------------------------------------------------

CRASHING_REMINDER = """
import json, os, signal, sys
from pathlib import Path
import anyio
from agency_runtime import agency
from turn_kit import agency_ctx, send_proactive

STORE, LEDGER = sys.argv[1], Path(sys.argv[2])

def deliver(text):
    with LEDGER.open("a") as ledger:
        ledger.write("sent " + text + "\\n")
    return {"ok": True}

class DiesBeforeSaving:
    def __init__(self, inner):
        self.inner = inner

    async def recall(self, *args, **kwargs):
        return await self.inner.recall(*args, **kwargs)

    async def save(self, *args, **kwargs):
        if os.environ.get("KILL_AFTER_DELIVERY"):
            os.kill(os.getpid(), signal.SIGKILL)  # the deliver step has committed
        return await self.inner.save(*args, **kwargs)

async def main():
    ctx = agency_ctx(STORE)
    ctx.memory = DiesBeforeSaving(ctx.memory)

    async def notify():
        result = await send_proactive(
            ctx, namespace="crashy", conversation={"transport": "telegram", "id": "1"},
            text="wake up", transport=deliver,
        )
        return result.memory_saved

    result = await agency.run(notify, run_id="wake-up", store=STORE)
    items = await ctx.memory.recall("", tags=["turn:crashy:telegram:1"], limit=8)
    print(json.dumps({"saved": result.value, "items": [i.content for i in items]}))

anyio.run(main)
"""


def test_a_reminder_killed_after_delivery_resumes_without_sending_again(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    script = tmp_path / "remind.py"
    script.write_text(textwrap.dedent(CRASHING_REMINDER))
    store = f"sqlite:///{tmp_path}/reminders.db"
    ledger = tmp_path / "ledger.txt"
    env = {**os.environ, "KILL_AFTER_DELIVERY": "1"}
    first = fork_server.run("script", script, store, str(ledger), env=env, timeout=120)
    assert first.returncode == -signal.SIGKILL
    assert ledger.read_text() == "sent wake up\n"
    env.pop("KILL_AFTER_DELIVERY")
    second = fork_server.run("script", script, store, str(ledger), env=env, timeout=120, check=True)
    assert ledger.read_text() == "sent wake up\n"  # exactly one delivery
    assert '"saved": true' in second.stdout
    assert '"items": ["Assistant: wake up"]' in second.stdout
