"""Webhook dedup by run id, poison updates, malformed input, and the missing-owner warning."""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import httpx
import pytest

from agency_runtime import MemoryStore, agency
from tests.turn_kit.telegram.doubles import Ctx, Transport, echo
from turn_kit import TurnArgs, TurnKitError
from turn_kit.telegram import (
    TelegramPoller,
    create_telegram_turn_adapter,
    read_telegram_message,
    webhook_app,
)
from turn_kit.telegram._polling import MAX_ATTEMPTS

pytestmark = pytest.mark.anyio

HOOK = {"X-Telegram-Bot-Api-Secret-Token": "s", "content-type": "application/json"}


def update(update_id: int, message_id: int | str, chat: int | str, text: str) -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {"message_id": message_id, "chat": {"id": chat}, "text": text},
    }


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bot")


# -- 2. the webhook dedups by the turn's run id, not by update_id ----------------------------


async def test_two_bots_on_one_store_both_handle_the_same_update_id() -> None:
    store = MemoryStore()
    sent_a, sent_b = Transport(), Transport()
    bot_a = create_telegram_turn_adapter(namespace="bot-a", owner_chat="42", transport=sent_a,
                                         store=store)  # fmt: skip
    bot_b = create_telegram_turn_adapter(namespace="bot-b", owner_chat="43", transport=sent_b,
                                         store=store)  # fmt: skip
    app_a = webhook_app(bot_a, ctx=Ctx(), respond=echo, secret_token="s")
    app_b = webhook_app(bot_b, ctx=Ctx(), respond=echo, secret_token="s")
    async with client_for(app_a) as a, client_for(app_b) as b:
        first = await a.post("/", json=update(7, 1, 42, "to a"), headers=HOOK)
        second = await b.post("/", json=update(7, 1, 43, "to b"), headers=HOOK)
        again = await a.post("/", json=update(7, 1, 42, "to a"), headers=HOOK)
    assert (first.status_code, first.json()["status"]) == (200, "handled")
    assert (second.status_code, second.json()["status"]) == (200, "handled")
    assert again.status_code == 200
    assert again.json()["duplicate"] is True
    assert (sent_a.sent, sent_b.sent) == (["re to a"], ["re to b"])  # no second reply


async def test_telegram_restarting_its_update_ids_drops_no_message() -> None:
    transport = Transport()
    turns = create_telegram_turn_adapter(namespace="bot", owner_chat="42", transport=transport,
                                         store=MemoryStore())  # fmt: skip
    app = webhook_app(turns, ctx=Ctx(), respond=echo, secret_token="s")
    async with client_for(app) as client:
        for message_id, text in ((1, "one"), (2, "two")):
            response = await client.post("/", json=update(1, message_id, 42, text), headers=HOOK)
            assert response.json()["status"] == "handled"
    assert transport.sent == ["re one", "re two"]


async def test_run_id_for_names_the_turns_run_and_none_for_a_skipped_update() -> None:
    store = MemoryStore()
    turns = create_telegram_turn_adapter(namespace="bot", owner_chat="42", transport=Transport(),
                                         store=store)  # fmt: skip
    payload = update(3, 9, 42, "hi")
    run_id = await turns.run_id_for(Ctx(), payload=payload)
    assert run_id is not None
    assert await turns.turn_record(run_id) is None  # not started yet
    await turns.handle(Ctx(), payload=payload, respond=echo)
    record = await agency.runs.get(run_id, store=store)
    assert (record.status, record.attempts) == ("completed", 1)
    assert await turns.run_id_for(Ctx(), payload=update(4, 9, 999, "other chat")) is None
    assert await turns.run_id_for(Ctx(), payload=[1, 2]) is None
    edited = {"update_id": 5, "edited_message": {"message_id": 9, "chat": {"id": 42},
                                                 "text": "hi!", "edit_date": 17}}  # fmt: skip
    assert await turns.run_id_for(Ctx(), payload=edited) == turns.runner.run_id_for(
        {"transport": "telegram", "id": "42"}, "9@17"
    )


# -- 3. poison updates stop after MAX_ATTEMPTS, counted in the store ----------------------------


def always_fails(calls: list[str]) -> Any:
    def respond(turn: TurnArgs) -> str:
        calls.append(turn.input)
        raise RuntimeError("this update always fails")

    return respond


async def test_the_webhook_gives_up_a_poison_update_and_answers_200(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    calls: list[str] = []
    turns = create_telegram_turn_adapter(namespace="bot", owner_chat="42", transport=Transport(),
                                         store=store)  # fmt: skip
    app = webhook_app(turns, ctx=Ctx(), respond=always_fails(calls), secret_token="s")
    poison = update(11, 5, 42, "poison")
    async with client_for(app) as client:
        answers = [
            await client.post("/", json=poison, headers=HOOK) for _ in range(MAX_ATTEMPTS + 2)
        ]
    assert [a.status_code for a in answers] == [500] * (MAX_ATTEMPTS - 1) + [200] * 3
    assert answers[MAX_ATTEMPTS - 1].json()["status"] == "failed"
    assert len(calls) == MAX_ATTEMPTS  # Telegram's later redeliveries start no turn
    run_id = await turns.run_id_for(Ctx(), payload=poison)
    assert run_id is not None
    record = await agency.runs.get(run_id, store=store)
    assert (record.status, record.attempts) == ("failed", MAX_ATTEMPTS)
    assert record.error is not None
    assert "always fails" in record.error.message
    assert "giving it up" in caplog.text


class FakeGetUpdates:
    """A ``getUpdates`` endpoint for an httpx MockTransport, honouring ``offset``."""

    def __init__(self, updates: list[dict[str, Any]]) -> None:
        self.updates = updates
        self.offsets: list[int | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        offset = json.loads(request.content).get("offset")
        self.offsets.append(offset)
        fresh = [u for u in self.updates if offset is None or u["update_id"] >= offset]
        return httpx.Response(200, json={"ok": True, "result": fresh})


async def test_a_restarted_poller_still_gives_up_after_max_attempts() -> None:
    store = MemoryStore()
    calls: list[str] = []
    api = FakeGetUpdates([update(20, 1, 42, "poison")])
    turns = create_telegram_turn_adapter(namespace="bot", owner_chat="42", transport=Transport(),
                                         store=store)  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.MockTransport(api)) as client:

        def poller() -> TelegramPoller:
            return TelegramPoller(turns, ctx=Ctx(), respond=always_fails(calls), token="1:abc",
                                  client=client, poll_timeout=0)  # fmt: skip

        first = poller()
        for _ in range(MAX_ATTEMPTS - 1):
            assert await first.poll_once() == 0  # failed: retried on the next poll
        restarted = poller()  # a new process: nothing in memory
        assert await restarted.poll_once() == 1  # the last attempt fails: given up, moved past
        assert await restarted.offset() == 20
        assert await restarted.poll_once() == 0
    assert len(calls) == MAX_ATTEMPTS
    assert api.offsets[-1] == 21


# -- 4. malformed input ------------------------------------------------------------------------


async def test_the_webhook_answers_400_to_a_body_nested_too_deeply() -> None:
    ran: list[str] = []
    turns = create_telegram_turn_adapter(namespace="bot", owner_chat="42", transport=Transport(),
                                         store=MemoryStore())  # fmt: skip
    app = webhook_app(turns, ctx=Ctx(), respond=lambda t: ran.append(t.input) or "x",
                      secret_token="s")  # fmt: skip
    async with client_for(app) as client:
        for body in (b"[" * 100_000, b'{"a":' * 100_000, b"[]", b'"text"', b"1", b"\xff\xfe"):
            response = await client.post("/", content=body, headers=HOOK)
            assert response.status_code == 400, body[:10]
    assert ran == []


async def test_lone_surrogates_in_a_webhook_update_never_give_a_500() -> None:
    transport = Transport()
    turns = create_telegram_turn_adapter(namespace="bot", owner_chat="42", transport=transport,
                                         store=MemoryStore())  # fmt: skip
    app = webhook_app(turns, ctx=Ctx(), respond=echo, secret_token="s")
    bodies = [  # JSON escapes: json.loads gives str with lone surrogates
        (b'{"update_id":1,"message":{"message_id":1,"chat":{"id":42},"text":"a\\ud800b"}}',
         "handled"),
        (b'{"update_id":2,"message":{"message_id":"\\udc00","chat":{"id":42},"text":"hi"}}',
         "handled"),
        (b'{"update_id":3,"message":{"message_id":3,"chat":{"id":"4\\ud8002"},"text":"hi"}}',
         "skipped"),
        (b'{"update_id":"\\ud800","message":{"message_id":4,"chat":{"id":42},"text":"ok"}}',
         "handled"),
    ]  # fmt: skip
    async with client_for(app) as client:
        for body, status in bodies:
            response = await client.post("/", content=body, headers=HOOK)
            assert (response.status_code, response.json()["status"]) == (200, status)
    assert transport.sent == ["re a\ufffdb", "re hi", "re ok"]


def test_read_telegram_message_replaces_lone_surrogates() -> None:
    message = read_telegram_message(
        {
            "update_id": 1,
            "message": {
                "message_id": "7\ud800",
                "chat": {"id": "42\udfff"},
                "text": "x\ud83d\ude00\udc00y",  # a pair spelled as two code points is kept
                "reply_to_message": {"text": "\ud800"},
                "message_thread_id": "3\udc00",
                "is_topic_message": True,
            },
        }
    )
    assert message is not None
    assert message.message_id == "7\ufffd"
    assert message.chat_id == "42\ufffd"
    assert message.text == "x\U0001f600\ufffdy"
    assert message.reply_text == "\ufffd"
    assert message.thread_id == "3\ufffd"
    for value in message.model_dump().values():
        if isinstance(value, str):
            value.encode("utf-8")  # every field is valid text now


async def test_the_poller_keeps_running_through_bad_getupdates_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = update(5, 1, 42, "finally")
    answers = [
        httpx.Response(200, json=[1, 2]),
        httpx.Response(200, json="not an object"),
        httpx.Response(200, json={"ok": True, "result": {"not": "a list"}}),
        httpx.Response(200, json={"ok": True, "result": [{"update_id": "x"}, {"update_id": 1.5},
                                                         {"update_id": True}, "junk"]}),
        httpx.Response(200, content=b"{not json"),
        httpx.Response(200, content=b"[" * 100_000),
        httpx.Response(502, content=b"<html>bad gateway</html>"),
        httpx.Response(200, json={"ok": True, "result": [good]}),
    ]  # fmt: skip
    stop = anyio.Event()
    asked: list[int | None] = []

    def bot_api(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content).get("offset"))
        if len(asked) > len(answers):
            stop.set()
            return httpx.Response(200, json={"ok": True, "result": []})
        return answers[len(asked) - 1]

    transport = Transport()
    turns = create_telegram_turn_adapter(namespace="bot", owner_chat="42", transport=transport,
                                         store=MemoryStore())  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.MockTransport(bot_api)) as client:
        poller = TelegramPoller(turns, ctx=Ctx(), respond=echo, token="1:abc", client=client,
                                poll_timeout=0)  # fmt: skip
        with anyio.fail_after(10):
            await poller.run(stop=stop, error_backoff=0)
    assert transport.sent == ["re finally"]
    assert await poller.offset() == 5
    assert asked[-1] == 6
    retried = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retried) == len(answers) - 1  # each bad answer: one warning, then a back-off
    assert all(r.levelno == logging.WARNING for r in retried)
    skipped = [r for r in caplog.records if "without an integer update_id" in r.getMessage()]
    assert len(skipped) == 4


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, json=["a", "list"]),
        httpx.Response(200, json="a string"),
        httpx.Response(200, json={"ok": True, "result": "nope"}),
        httpx.Response(200, json={"ok": True, "result": [{"update_id": "1"}]}),
        httpx.Response(200, content=b"<html>"),
    ],
)
async def test_poll_once_raises_a_clear_error_for_a_bad_answer(answer: httpx.Response) -> None:
    turns = create_telegram_turn_adapter(namespace="bot", owner_chat="42", transport=Transport(),
                                         store=MemoryStore())  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: answer)) as client:
        poller = TelegramPoller(turns, ctx=Ctx(), respond=echo, token="1:abc", client=client,
                                poll_timeout=0)  # fmt: skip
        with pytest.raises(TurnKitError, match="getUpdates"):
            await poller.poll_once()


async def test_a_non_numeric_stored_offset_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    await store.put_document("telegram-polling", "1", "not a number")
    api = FakeGetUpdates([update(8, 1, 42, "hello")])
    transport = Transport()
    turns = create_telegram_turn_adapter(namespace="bot", owner_chat="42", transport=transport,
                                         store=store)  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.MockTransport(api)) as client:
        poller = TelegramPoller(turns, ctx=Ctx(), respond=echo, token="1:abc", client=client,
                                poll_timeout=0)  # fmt: skip
        assert await poller.offset() is None
        assert await poller.poll_once() == 1
        assert await poller.offset() == 8  # replaced by the update handled
    assert api.offsets == [None]
    assert transport.sent == ["re hello"]
    assert any(
        r.levelno == logging.WARNING and "not an integer" in r.getMessage() for r in caplog.records
    )


# -- 5. no owner chat: one warning per adapter ---------------------------------------------------


def owner_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "turn_kit.telegram"
        and r.levelno == logging.WARNING
        and "owner_chat=" in r.getMessage()
    ]


@pytest.mark.parametrize("owner", [None, "", lambda ctx: None], ids=["none", "blank", "function"])
async def test_an_adapter_without_an_owner_chat_warns_once(
    owner: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="turn_kit.telegram")
    turns = create_telegram_turn_adapter(namespace="bot", owner_chat=owner, transport=Transport(),
                                         store=MemoryStore())  # fmt: skip
    for n in range(3):
        outcome = await turns.handle(Ctx(), payload=update(n, n, 42, "hi"), respond=echo)
        assert outcome.reason == "no owner chat configured"
    warned = owner_warnings(caplog)
    assert len(warned) == 1
    text = warned[0].getMessage()
    assert "every update is skipped" in text
    assert "'bot'" in text  # names the adapter's namespace


async def test_an_adapter_with_an_owner_chat_does_not_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="turn_kit.telegram")
    turns = create_telegram_turn_adapter(namespace="bot", owner_chat="42", transport=Transport(),
                                         store=MemoryStore())  # fmt: skip
    await turns.handle(Ctx(), payload=update(1, 1, 42, "hi"), respond=echo)
    await turns.handle(Ctx(), payload=update(2, 2, 999, "other chat"), respond=echo)
    assert owner_warnings(caplog) == []
