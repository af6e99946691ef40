"""The turn runner: the seed's lifecycle, as a durable run (idempotent, crash-safe, ordered)."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from agency_runtime import InvalidArgumentError, MemoryStore, agency, approve
from tests.forked import ForkServer
from turn_kit import (
    TurnArgs,
    TurnPausedError,
    TurnResponse,
    UnconfirmedTurnDeliveryError,
    agency_ctx,
    create_turn_runner,
    define_turn_context,
)

pytestmark = pytest.mark.anyio

CONVERSATION = {"transport": "telegram", "id": "8587:42"}
TAG = "turn:life-agent:telegram:8587%3A42"


class Memory:
    """A ctx.memory that records what the runner does with it."""

    def __init__(self, events: list[str], *, receipt: Any = "auto") -> None:
        self.events = events
        self.saved: list[dict[str, Any]] = []
        self.recalls: list[dict[str, Any]] = []
        self.receipt = receipt

    async def recall(self, query: str, **options: Any) -> list[dict[str, Any]]:
        self.events.append("recall")
        self.recalls.append({"query": query, **options})
        return [
            {"content": s["content"], "created_at": f"2026-01-01T00:00:0{i}Z"}
            for i, s in enumerate(self.saved)
        ]

    async def save(self, content: str, **options: Any) -> Any:
        self.events.append("save")
        self.saved.append({"content": content, **options})
        return {"id": f"m{len(self.saved)}"} if self.receipt == "auto" else self.receipt


class Ctx:
    def __init__(self, *, receipt: Any = "auto") -> None:
        self.events: list[str] = []
        self.memory = Memory(self.events, receipt=receipt)
        self.logs: list[tuple[str, str, dict[str, Any]]] = []

    def log(self, level: str, message: str, **attrs: Any) -> None:
        self.logs.append((level, message, attrs))


def runner(**options: Any) -> Any:
    options.setdefault("store", MemoryStore())
    return create_turn_runner(namespace="life-agent", **options)


async def test_the_lifecycle_runs_in_order_and_saves_after_delivery() -> None:
    ctx = Ctx()
    sent: list[str] = []

    def open_tasks(args: Any) -> dict[str, str]:
        ctx.events.append("context")
        return {"id": "open-tasks", "label": "Open tasks", "content": "Call Mom"}

    async def respond(turn: TurnArgs) -> str:
        ctx.events.append("respond")
        assert turn.input == "remind me to call mom"
        assert [c.id for c in turn.context] == ["open-tasks"]
        assert await turn.acknowledge("Checking…")
        return "  Done: reminder set.  "

    async def acknowledge(text: str) -> None:
        ctx.events.append("ack")

    def deliver(reply: str) -> dict[str, Any]:
        ctx.events.append("deliver")
        sent.append(reply)
        return {"ok": True, "message_id": 9}

    turns = runner(
        memory={"assistant_label": "life-agent", "user_label": "Khaliq"},
        context=[define_turn_context(name="open-tasks", collect=open_tasks)],
    )
    result = await turns.run(
        ctx,
        conversation=CONVERSATION,
        input="  remind me to call mom ",
        respond=respond,
        deliver=deliver,
        acknowledge=acknowledge,
        confirm_delivery=lambda receipt: receipt["ok"],
    )
    assert ctx.events == ["recall", "context", "respond", "ack", "deliver", "save"]
    assert result.reply == "Done: reminder set."
    assert sent == ["Done: reminder set."]
    assert result.acknowledgements == 1
    assert result.memory_saved
    assert result.receipt == {"ok": True, "message_id": 9}
    assert set(result.model_dump()) == {
        "reply", "receipt", "context", "acknowledgements", "memory_saved"
    }  # fmt: skip
    [saved] = ctx.memory.saved
    assert saved["content"] == "Khaliq: remind me to call mom\nlife-agent: Done: reminder set."
    assert saved["tags"] == [TAG]
    assert ctx.logs[0][1] == "turn-kit.started"
    assert ("info", "turn-kit.completed") in [(lvl, m) for lvl, m, _ in ctx.logs]


async def test_an_unconfirmed_delivery_raises_and_saves_nothing() -> None:
    ctx = Ctx()
    with pytest.raises(UnconfirmedTurnDeliveryError, match="unconfirmed receipt"):
        await runner().run(
            ctx,
            conversation=CONVERSATION,
            input="hi",
            respond=lambda turn: "hello",
            deliver=lambda reply: {"ok": False},
            confirm_delivery=lambda receipt: receipt["ok"],
        )
    assert ctx.memory.saved == []
    assert ("error", "turn-kit.delivery-unconfirmed") in [(lvl, m) for lvl, m, _ in ctx.logs]


async def test_an_async_confirmation_is_awaited() -> None:
    async def confirm(receipt: Any) -> bool:
        return False

    with pytest.raises(UnconfirmedTurnDeliveryError):
        await runner().run(
            Ctx(), conversation=CONVERSATION, input="hi", respond=lambda t: "hello",
            deliver=lambda reply: {"ok": True}, confirm_delivery=confirm,
        )  # fmt: skip


async def test_a_failing_acknowledgement_returns_false_and_the_turn_goes_on() -> None:
    ctx = Ctx()
    seen: list[bool] = []

    async def respond(turn: TurnArgs) -> str:
        seen.append(await turn.acknowledge("working"))
        seen.append(await turn.acknowledge("   "))
        return "done"

    def acknowledge(text: str) -> None:
        raise ConnectionError("telegram is down")

    result = await runner().run(
        ctx, conversation=CONVERSATION, input="hi", respond=respond,
        deliver=lambda reply: {"ok": True}, acknowledge=acknowledge,
    )  # fmt: skip
    assert seen == [False, False]
    assert result.acknowledgements == 0
    assert result.reply == "done"
    assert ("warn", "turn-kit.acknowledgement-failed") in [(lvl, m) for lvl, m, _ in ctx.logs]


async def test_a_required_provider_failure_aborts_before_delivery() -> None:
    delivered: list[str] = []

    def broken(args: Any) -> None:
        raise LookupError("no open tasks file")

    with pytest.raises(LookupError, match="no open tasks file"):
        await runner(context=[define_turn_context(name="tasks", collect=broken)]).run(
            Ctx(), conversation=CONVERSATION, input="hi", respond=lambda t: "x",
            deliver=delivered.append,
        )  # fmt: skip
    assert delivered == []


async def test_an_optional_provider_failure_is_empty_and_remember_false_skips_saving() -> None:
    ctx = Ctx()

    def broken(args: Any) -> None:
        raise LookupError("flaky")

    result = await runner(
        context=[define_turn_context(name="tasks", collect=broken, optional=True)]
    ).run(
        ctx, conversation=CONVERSATION, input="hi",
        respond=lambda t: TurnResponse(reply="ok", remember=False), deliver=lambda r: "sent",
    )  # fmt: skip
    assert result.context == []
    assert result.receipt == "sent"
    assert not result.memory_saved
    assert ctx.memory.saved == []


async def test_a_save_without_receipt_is_unconfirmed() -> None:
    ctx = Ctx(receipt=None)
    result = await runner().run(
        ctx, conversation=CONVERSATION, input="hi", respond=lambda t: "ok",
        deliver=lambda r: "sent",
    )  # fmt: skip
    assert not result.memory_saved
    assert ("warn", "turn-kit.memory-save-unconfirmed") in [(lvl, m) for lvl, m, _ in ctx.logs]


async def test_required_memory_recalls_with_fail_on_error() -> None:
    ctx = Ctx()
    await runner(memory={"required": True}).run(
        ctx, conversation=CONVERSATION, input="hi", respond=lambda t: "ok",
        deliver=lambda r: "sent",
    )  # fmt: skip
    assert ctx.memory.recalls[0]["fail_on_error"] is True


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"input": "   "}, "turn input cannot be empty"),
        ({"respond": lambda t: "  "}, "turn response cannot be empty"),
        ({"respond": lambda t: TurnResponse(reply="x", remember=" ")}, "explicit turn memory"),
    ],
)
async def test_bad_turns_are_clear_errors_and_deliver_nothing(
    inputs: dict[str, Any], message: str
) -> None:
    delivered: list[str] = []
    call: dict[str, Any] = {"input": "hi", "respond": lambda t: "ok", **inputs}
    with pytest.raises(InvalidArgumentError, match=message):
        await runner().run(Ctx(), conversation=CONVERSATION, deliver=delivered.append, **call)
    assert delivered == []


def test_a_bad_namespace_is_refused_when_the_runner_is_made() -> None:
    with pytest.raises(InvalidArgumentError, match="lowercase slug"):
        create_turn_runner(namespace="Not Valid")


async def test_a_redelivered_message_gets_the_stored_result_and_no_second_reply() -> None:
    ctx = Ctx()
    sent: list[str] = []
    turns = runner()

    def deliver(reply: str) -> dict[str, Any]:
        sent.append(reply)
        return {"ok": True, "n": len(sent)}

    for _ in range(3):
        result = await turns.run(
            ctx, conversation=CONVERSATION, input="hi", respond=lambda t: "hello",
            deliver=deliver, message_id=12,
        )  # fmt: skip
        assert result.reply == "hello"
        assert result.receipt == {"ok": True, "n": 1}
    assert sent == ["hello"]
    assert len(ctx.memory.saved) == 1


async def test_turns_of_one_conversation_run_one_at_a_time_in_arrival_order() -> None:
    ctx = Ctx()
    store = MemoryStore()
    turns = runner(store=store)
    timeline: list[str] = []
    first_inside = anyio.Event()
    second_waiting = anyio.Event()

    async def respond(turn: TurnArgs) -> str:
        timeline.append(f"start {turn.input} (history {len(turn.history)})")
        if turn.input == "first":
            first_inside.set()
            await second_waiting.wait()  # the second turn arrives meanwhile and must wait
        timeline.append(f"end {turn.input}")
        return f"re: {turn.input}"

    async def one(text: str, message_id: int) -> None:
        await turns.run(
            ctx, conversation=CONVERSATION, input=text, respond=respond,
            deliver=lambda reply: "ok", message_id=message_id,
        )  # fmt: skip

    async with anyio.create_task_group() as group:
        group.start_soon(one, "first", 1)
        await first_inside.wait()  # the first turn holds the conversation's lock
        group.start_soon(one, "second", 2)
        await anyio.wait_all_tasks_blocked()  # the second turn is waiting (or, wrongly, done)
        second_waiting.set()
    assert timeline == [
        "start first (history 0)",
        "end first",
        "start second (history 1)",  # it recalled what the first turn saved
        "end second",
    ]


async def researcher(question: str) -> str:
    """A sub-agent a turn's respond calls: a child run of the turn's run."""
    assert agency.ctx().subprocess_depth == 1
    return f"found: {question}"


async def test_a_turns_respond_may_call_sub_agents() -> None:
    ctx = Ctx()
    store = MemoryStore()
    turns = runner(store=store)

    async def respond(turn: TurnArgs) -> str:
        found = await agency.run(researcher, turn.input)
        return str(found.value)

    result = await turns.run(
        ctx, conversation=CONVERSATION, input="tea prices", respond=respond,
        deliver=lambda reply: "ok", message_id=77,
    )  # fmt: skip
    assert result.reply == "found: tea prices"
    [turn_run] = [r for r in await store.list_runs() if r.parent_id is None]
    [child] = await store.list_runs(parent=turn_run.run_id)
    assert (child.status, child.depth, child.root_id) == ("completed", 1, turn_run.run_id)


async def test_a_paused_turn_raises_and_completes_when_answered() -> None:
    ctx = Ctx()
    sent: list[str] = []

    async def respond(turn: TurnArgs) -> str:
        answer = await agency.interrupt("approve", "send the refund?")
        return "refunded" if answer.approved else "not refunded"

    turns = runner()
    with pytest.raises(TurnPausedError) as caught:
        await turns.run(
            ctx, conversation=CONVERSATION, input="refund me", respond=respond,
            deliver=sent.append, message_id="m-1",
        )  # fmt: skip
    assert sent == []
    done = await agency.respond_to_interrupts(caught.value.result, [approve()], store=turns.store)
    assert done.status == "completed"
    assert done.value.reply == "refunded"
    assert sent == ["refunded"]
    assert len(ctx.memory.saved) == 1


async def test_agency_ctx_runs_a_turn_on_the_runtime(tmp_path: Path) -> None:
    from agency_runtime.testing import FakeModel

    store = f"sqlite:///{tmp_path}/turns.db"
    ctx = agency_ctx(store)
    turns = create_turn_runner(namespace="helper", store=store)

    async def respond(turn: TurnArgs) -> str:
        return await turn.ctx.llm.complete(f"Answer: {turn.input}")

    with FakeModel("turn", replies=["first answer", "second answer"]) as fake:
        for text, message_id in (("hello", 1), ("again", 2)):
            await create_turn_runner(namespace="helper", store=store, model=fake.model).run(
                ctx, conversation={"transport": "cli", "id": "me"}, input=text,
                respond=respond, deliver=lambda reply: {"ok": True}, message_id=message_id,
            )  # fmt: skip
    items = await ctx.memory.recall("", tags=["turn:helper:cli:me"], limit=8)
    assert [i.content for i in items] == [
        "User: again\nAssistant: second answer",
        "User: hello\nAssistant: first answer",
    ]
    assert turns.namespace == "helper"


CRASHING_TURN = """
import os, signal, sys, json
from pathlib import Path
import anyio
from turn_kit import agency_ctx, create_turn_runner

STORE = sys.argv[1]
LEDGER = Path(sys.argv[2])

def deliver(reply):
    with LEDGER.open("a") as ledger:
        ledger.write("delivered " + reply + "\\n")
    return {"ok": True}

async def main():
    ctx = agency_ctx(STORE)

    class DiesBeforeSaving:
        # The deliver step has committed when the save starts: dying here is "right
        # after delivery".
        def __init__(self, inner):
            self.inner = inner

        async def recall(self, *args, **kwargs):
            return await self.inner.recall(*args, **kwargs)

        async def save(self, *args, **kwargs):
            if os.environ.get("KILL_AFTER_DELIVERY"):
                os.kill(os.getpid(), signal.SIGKILL)
            return await self.inner.save(*args, **kwargs)

    ctx.memory = DiesBeforeSaving(ctx.memory)
    turns = create_turn_runner(namespace="crashy", store=STORE)
    result = await turns.run(
        ctx, conversation={"transport": "telegram", "id": "1"}, input="hello",
        respond=lambda turn: "hi there", deliver=deliver,
        confirm_delivery=lambda r: r["ok"], message_id=77,
    )
    items = await ctx.memory.recall("", tags=["turn:crashy:telegram:1"], limit=8)
    print(json.dumps({"saved": result.memory_saved, "items": [i.content for i in items]}))

anyio.run(main)
"""


def test_a_turn_killed_after_delivery_resumes_to_the_save_without_sending_again(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    script = tmp_path / "turn.py"
    script.write_text(textwrap.dedent(CRASHING_TURN))
    store = f"sqlite:///{tmp_path}/turns.db"
    ledger = tmp_path / "ledger.txt"
    env = {**os.environ, "KILL_AFTER_DELIVERY": "1"}
    # Two new processes (forked by the fork server: tests/forked.py).
    first = fork_server.run("script", script, store, str(ledger), env=env, timeout=120)
    assert first.returncode == -signal.SIGKILL
    assert ledger.read_text() == "delivered hi there\n"
    env.pop("KILL_AFTER_DELIVERY")
    second = fork_server.run("script", script, store, str(ledger), env=env, timeout=120, check=True)
    assert ledger.read_text() == "delivered hi there\n"  # exactly one delivery
    assert '"items": ["User: hello\\nAssistant: hi there"]' in second.stdout  # one record
    assert '"saved": true' in second.stdout
