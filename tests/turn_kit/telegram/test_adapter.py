"""The Telegram adapter, the webhook app and the poller (spec §6 and §9 telegram cases)."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from agency_runtime import MemoryStore, agency, approve
from turn_kit import TurnArgs
from turn_kit.telegram import (
    TelegramPoller,
    create_telegram_turn_adapter,
    webhook_app,
)

pytestmark = pytest.mark.anyio


class Transport:
    """Records sends; can fail a chosen call."""

    def __init__(self, *, fail_call: int | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.fail_call = fail_call

    async def send_message(
        self,
        chat_id: str,
        text: str,
        *,
        reply_to_message_id: str | None = None,
        thread_id: str | None = None,
    ) -> dict[str, Any]:
        call = len(self.sent) + 1
        if call == self.fail_call:
            return {"ok": False, "chat_id": chat_id, "message_id": None}
        self.sent.append(
            {"chat_id": chat_id, "text": text, "reply_to": reply_to_message_id, "thread": thread_id}
        )
        return {"ok": True, "chat_id": chat_id, "message_id": str(100 + call), "ref": "r"}


class Memory:
    def __init__(self) -> None:
        self.saved: list[str] = []

    async def recall(self, query: str, **options: Any) -> list[str]:
        return []

    async def save(self, content: str, **options: Any) -> dict[str, str]:
        self.saved.append(content)
        return {"id": f"m{len(self.saved)}"}


class Ctx:
    def __init__(self) -> None:
        self.memory = Memory()


ENVELOPE = {
    "data": {
        "telegram": {
            "chatId": "8587__KJG Life Bot",
            "messageId": "12",
            "messageThreadId": "3",
            "text": "Done with it",
        },
        "message": {"reply_to_message": {"text": "Call mom"}},
    }
}


def adapter(transport: Transport, **options: Any) -> Any:
    options.setdefault("owner_chat", "8587__KJG Life Bot")
    options.setdefault("store", MemoryStore())
    return create_telegram_turn_adapter(namespace="life-agent", transport=transport, **options)


async def test_a_telegram_envelope_is_answered_in_its_thread() -> None:
    transport = Transport()
    ctx = Ctx()
    seen: dict[str, Any] = {}

    async def respond(turn: TurnArgs) -> str:
        seen["reply_text"] = turn.message.reply_text
        assert await turn.acknowledge("On it")
        return "Done"

    outcome = await adapter(transport).handle(ctx, payload=ENVELOPE, respond=respond)
    assert outcome.status == "handled"
    assert seen["reply_text"] == "Call mom"
    assert transport.sent == [
        {"chat_id": "8587", "text": "On it", "reply_to": "12", "thread": "3"},
        {"chat_id": "8587", "text": "Done", "reply_to": "12", "thread": "3"},
    ]
    assert outcome.result is not None
    assert outcome.result.memory_saved
    assert outcome.result.acknowledgements == 1
    assert ctx.memory.saved == ["User: Done with it\nAssistant: Done"]


async def test_no_owner_chat_skips_and_respond_never_runs() -> None:
    ran: list[str] = []
    outcome = await adapter(Transport(), owner_chat=None).handle(
        Ctx(), payload=ENVELOPE, respond=lambda turn: ran.append("x") or "x"
    )
    assert (outcome.status, outcome.reason) == ("skipped", "no owner chat configured")
    assert ran == []


async def test_other_chats_bots_and_garbage_are_skipped_before_respond() -> None:
    ran: list[str] = []
    make = adapter(Transport(), owner_chat=lambda ctx: "999")
    respond = lambda turn: ran.append("x") or "x"  # noqa: E731
    assert (await make.handle(Ctx(), payload=ENVELOPE, respond=respond)).reason == (
        "not the owner chat"
    )
    bot = {
        "message": {"message_id": 5, "chat": {"id": 999}, "text": "hi", "from": {"is_bot": True}}
    }
    assert (await make.handle(Ctx(), payload=bot, respond=respond)).reason == "bot message"
    garbage = await make.handle(Ctx(), payload=[1, "x"], respond=respond)
    assert (garbage.status, garbage.reason) == ("skipped", "unusable Telegram message")
    assert ran == []


async def test_an_owner_function_that_raises_fails_closed() -> None:
    def owner(ctx: Any) -> str:
        raise KeyError("TELEGRAM_CHAT")

    outcome = await adapter(Transport(), owner_chat=owner).handle(
        Ctx(), payload=ENVELOPE, respond=lambda turn: "x"
    )
    assert outcome.reason == "no owner chat configured"


async def test_a_redelivered_update_gets_the_stored_result_and_no_second_reply() -> None:
    transport = Transport()
    turns = adapter(transport)
    for _ in range(2):
        outcome = await turns.handle(Ctx(), payload=ENVELOPE, respond=lambda turn: "Done")
        assert outcome.status == "handled"
        assert outcome.result is not None
        assert outcome.result.reply == "Done"
    assert [s["text"] for s in transport.sent] == ["Done"]


async def test_an_edited_message_gets_its_own_answer() -> None:
    transport = Transport()
    turns = adapter(transport, owner_chat="42")
    original = {"message": {"message_id": 7, "chat": {"id": 42}, "text": "hello"}}
    edited = {"edited_message": {"message_id": 7, "chat": {"id": 42}, "text": "hello!",
                                 "edit_date": 1700000000}}  # fmt: skip
    await turns.handle(Ctx(), payload=original, respond=lambda turn: f"re {turn.input}")
    await turns.handle(Ctx(), payload=edited, respond=lambda turn: f"re {turn.input}")
    assert [s["text"] for s in transport.sent] == ["re hello", "re hello!"]


async def test_a_long_reply_is_chunked_and_only_the_first_chunk_is_threaded() -> None:
    transport = Transport()
    turns = adapter(transport, chunk_limit=10)
    await turns.handle(Ctx(), payload=ENVELOPE, respond=lambda turn: "line one\nline two\nline 3")
    assert [(s["text"], s["reply_to"], s["thread"]) for s in transport.sent] == [
        ("line one", "12", "3"),
        ("line two", None, None),
        ("line 3", None, None),
    ]


async def test_a_failed_chunk_fails_the_turn_and_a_retry_sends_only_the_rest() -> None:
    transport = Transport(fail_call=2)
    turns = adapter(transport, chunk_limit=10)
    reply = "line one\nline two\nline 3"
    with pytest.raises(Exception, match="chunk 2"):
        await turns.handle(Ctx(), payload=ENVELOPE, respond=lambda turn: reply)
    transport.fail_call = None
    outcome = await turns.handle(Ctx(), payload=ENVELOPE, respond=lambda turn: reply)
    assert outcome.status == "handled"
    # the first chunk was journaled as sent: only the rest goes out on the retry
    assert [s["text"] for s in transport.sent] == ["line one", "line two", "line 3"]


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bot")


async def test_the_webhook_checks_the_secret_and_deduplicates_updates() -> None:
    transport = Transport()
    ran: list[str] = []

    def respond(turn: TurnArgs) -> str:
        ran.append(turn.input)
        return "pong"

    app = webhook_app(adapter(transport, owner_chat="42"), ctx=Ctx(), respond=respond,
                      secret_token="s3cret")  # fmt: skip
    update = {"update_id": 1001, "message": {"message_id": 1, "chat": {"id": 42}, "text": "ping"}}
    async with client_for(app) as client:
        assert (await client.post("/", json=update)).status_code == 401
        wrong = await client.post(
            "/", json=update, headers={"X-Telegram-Bot-Api-Secret-Token": "x"}
        )
        assert wrong.status_code == 403
        assert ran == []
        headers = {"X-Telegram-Bot-Api-Secret-Token": "s3cret"}
        first = await client.post("/", json=update, headers=headers)
        assert first.status_code == 200
        assert first.json()["status"] == "handled"
        again = await client.post("/", json=update, headers=headers)
        assert again.status_code == 200
        assert again.json()["duplicate"] is True
        assert (await client.post("/", content=b"not json", headers=headers)).status_code == 400
        assert (await client.get("/")).status_code == 405
    assert ran == ["ping"]
    assert [s["text"] for s in transport.sent] == ["pong"]


async def test_the_webhook_accepts_a_paused_turn_and_the_answer_finishes_it() -> None:
    transport = Transport()
    turns = adapter(transport, owner_chat="42")

    async def respond(turn: TurnArgs) -> str:
        answer = await agency.interrupt("confirm", "really?")
        return "yes" if answer.approved else "no"

    app = webhook_app(turns, ctx=Ctx(), respond=respond, secret_token="t")
    update = {"update_id": 5, "message": {"message_id": 9, "chat": {"id": 42}, "text": "go"}}
    async with client_for(app) as client:
        response = await client.post(
            "/", json=update, headers={"X-Telegram-Bot-Api-Secret-Token": "t"}
        )
    assert response.status_code == 200
    assert response.json()["status"] == "paused"
    run = await agency.runs.get(response.json()["run_id"], store=turns.runner.store)
    done = await agency.respond_to_interrupts(run.interrupts, [approve()], store=turns.runner.store)
    assert done.status == "completed"
    assert [s["text"] for s in transport.sent] == ["yes"]


async def test_the_poller_keeps_its_offset_in_the_store() -> None:
    updates = [
        {"update_id": 10, "message": {"message_id": 1, "chat": {"id": 42}, "text": "one"}},
        {"update_id": 11, "message": {"message_id": 2, "chat": {"id": 42}, "text": "two"}},
    ]
    asked: list[Any] = []

    def bot_api(request: httpx.Request) -> httpx.Response:
        import json

        body = json.loads(request.content)
        asked.append(body.get("offset"))
        offset = body.get("offset", 0)
        return httpx.Response(
            200, json={"ok": True, "result": [u for u in updates if u["update_id"] >= offset]}
        )

    transport = Transport()
    store = MemoryStore()
    turns = adapter(transport, owner_chat="42", store=store)
    client = httpx.AsyncClient(transport=httpx.MockTransport(bot_api))

    def make() -> TelegramPoller:
        return TelegramPoller(turns, ctx=Ctx(), respond=lambda turn: f"re {turn.input}",
                              token="123:abc", poll_timeout=0, client=client)  # fmt: skip

    assert await make().poll_once() == 2
    assert await make().offset() == 11
    assert await make().poll_once() == 0  # a restarted poller asks from 12: nothing new
    assert asked == [None, 12]
    assert [s["text"] for s in transport.sent] == ["re one", "re two"]
    await client.aclose()


async def test_the_poller_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN", raising=False)
    with pytest.raises(ValueError, match="TELEGRAM_BOT_TOKEN"):
        TelegramPoller(adapter(Transport()), ctx=Ctx(), respond=lambda turn: "x")


async def test_the_pollers_own_clients_share_the_packages_tls_context() -> None:
    """A poller not given a client makes one for each round: on the one TLS context of
    turn_kit.telegram (loading the CA bundle costs ~25 ms a client)."""
    from turn_kit.telegram._transport import tls_context

    poller = TelegramPoller(adapter(Transport()), ctx=Ctx(), respond=lambda t: "x", token="1:a")
    async with poller._client_scope() as client:
        assert client._transport._pool._ssl_context is tls_context()


async def test_turns_of_one_chat_from_parallel_updates_run_in_order() -> None:
    transport = Transport()
    turns = adapter(transport, owner_chat="42")
    timeline: list[str] = []
    first_inside = anyio.Event()
    second_waiting = anyio.Event()

    async def respond(turn: TurnArgs) -> str:
        timeline.append(f"start {turn.input}")
        if turn.input == "m1":
            first_inside.set()
            await second_waiting.wait()  # the second update arrives meanwhile
        timeline.append(f"end {turn.input}")
        return turn.input

    async def one(n: int) -> None:
        update = {"message": {"message_id": n, "chat": {"id": 42}, "text": f"m{n}"}}
        await turns.handle(Ctx(), payload=update, respond=respond)

    async with anyio.create_task_group() as group:
        group.start_soon(one, 1)
        await first_inside.wait()  # the first turn holds the chat's lock
        group.start_soon(one, 2)
        await anyio.wait_all_tasks_blocked()  # the second turn is waiting (or, wrongly, done)
        second_waiting.set()
    assert timeline == ["start m1", "end m1", "start m2", "end m2"]
