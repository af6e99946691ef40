"""``create_telegram_turn_adapter(stream=True)``: the reply shows while it is generated.

Against the fake Bot API on loopback (through :class:`BotApiTransport`) with
:class:`FakeStream` answers: one preview message, sent with the first text and edited as the
answer streams (paced, never to the text it shows, holding back on a 429), ending as exactly
the reply, which is what the turn delivers, confirms and saves — also across a crash.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from agency_runtime import ConversationMemory, InvalidArgumentError, MemoryStore, Store, agency
from agency_runtime.testing import FakeModel, FakeStream
from tests.forked import ForkServer
from turn_kit import TurnArgs, agency_ctx, create_turn_runner
from turn_kit.telegram import (
    BotApiTransport,
    FakeBotApi,
    TelegramRateLimitedError,
    TelegramTurnAdapter,
    chunk_telegram_text,
    create_telegram_turn_adapter,
    send_durably,
)

pytestmark = pytest.mark.anyio

TOKEN = "4242:stream-token"
OWNER = 8587
OWNER_ID = str(OWNER)
WORDS = ["Hel", "lo ", "there, ", "this ", "is ", "a ", "streamed ", "answer."]
ANSWER = "".join(WORDS)


class Ctx:
    def __init__(self, store: Store) -> None:
        self.memory = ConversationMemory(store)


@pytest.fixture
def api() -> Any:
    with FakeBotApi(token=TOKEN) as fake:
        yield fake


@asynccontextmanager
async def bot(
    api: FakeBotApi, store: Store, model: FakeModel, **options: Any
) -> AsyncIterator[TelegramTurnAdapter]:
    options.setdefault("stream", True)
    options.setdefault("stream_interval", 0.1)
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
        yield create_telegram_turn_adapter(
            namespace="streamer", owner_chat=str(OWNER), transport=transport, store=store,
            model=model.model, **options,
        )  # fmt: skip


async def streamed(turn: TurnArgs) -> str:
    return str(await agency.llm(turn.input, on_token=turn.on_token))


def methods(api: FakeBotApi) -> list[tuple[str, int]]:
    return [(c["method"], c["status"]) for c in api.calls if c["method"] != "getMe"]


async def test_the_preview_is_sent_early_edited_while_streaming_and_ends_as_the_reply(
    api: FakeBotApi, store: Store
) -> None:
    interval = 0.1
    shown: list[list[str]] = []  # what the chat shows after each piece of the answer
    started: list[float] = []

    async def respond(turn: TurnArgs) -> str:
        assert turn.on_token is not None

        async def tap(delta: str) -> None:
            assert turn.on_token is not None
            await turn.on_token(delta)
            started.append(time.time())  # the fake's clock
            shown.append([m["text"] for m in api.messages])

        return str(await agency.llm(turn.input, on_token=tap))

    update = api.push_message(OWNER, "talk to me")
    with FakeModel("streamer", replies=[FakeStream(WORDS, delay=0.04)]) as model:
        async with bot(api, store, model, stream_interval=interval) as turns:
            outcome = await turns.handle(Ctx(store), payload=update, respond=respond)
            ended = time.time()

    assert shown[0] == ["Hel"]  # sent with the first piece, long before the answer ended
    partial = {texts[0] for texts in shown[:-1]}
    assert len(partial) > 1  # edited while streaming
    assert all(ANSWER.startswith(text) for text in partial)
    # One message, now showing exactly the reply: the turn's receipt.
    assert len(api.sent) == 1
    assert [m["text"] for m in api.messages] == [ANSWER]
    assert api.sent[0]["reply_to_message_id"] == update["message"]["message_id"]
    assert outcome.result is not None
    assert outcome.result.reply == ANSWER
    assert outcome.result.receipt.message_ids == [str(api.sent[0]["message_id"])]
    # Paced: never two edits within the interval, so no more than the time allows ...
    edits = api.edits
    times = [started[0], *(e["at"] for e in edits)]
    paced = list(itertools.pairwise(times))[:-1]  # the last may be the reply's: not paced
    assert all(b - a >= interval * 0.95 for a, b in paced)
    assert len(edits) <= (ended - started[0]) / interval + 1
    # ... and never to the text the message already shows.
    texts = [api.sent[0]["text"], *(e["text"] for e in edits)]
    assert all(a != b for a, b in itertools.pairwise(texts))
    assert ("editMessageText", 400) not in methods(api)
    # Memory keeps the final reply.
    assert outcome.result.memory_saved
    items = await Ctx(store).memory.recall("", tags=["turn:streamer:telegram:8587"], limit=8)
    assert [item.content for item in items] == [f"User: talk to me\nAssistant: {ANSWER}"]


async def test_ctx_llm_complete_streams_by_itself_next_to_an_acknowledgement(
    api: FakeBotApi, store: Store
) -> None:
    async def respond(turn: TurnArgs) -> str:
        assert await turn.acknowledge("On it")
        return str(await turn.ctx.llm.complete(turn.input))  # no on_token: it streams anyway

    update = api.push_message(OWNER, "hello")
    with FakeModel("streamer", replies=[FakeStream(WORDS, delay=0.04)]) as model:
        async with bot(api, store, model, stream_interval=0.05) as turns:
            outcome = await turns.handle(agency_ctx(store), payload=update, respond=respond)
    assert outcome.result is not None
    assert outcome.result.acknowledgements == 1
    ack, preview = api.messages
    assert (ack["text"], ack["edits"]) == ("On it", 0)  # the acknowledgement stays as it was
    assert preview["text"] == ANSWER
    assert preview["edits"] >= 1
    assert outcome.result.receipt.message_ids == [str(preview["message_id"])]


async def test_a_long_answer_ends_with_the_preview_as_chunk_one_and_the_rest_sent(
    api: FakeBotApi,
) -> None:
    pieces = ["line one ", "is here\n", "line two ", "is here\n", "line three", " done"]
    answer = "".join(pieces)
    limit = 16
    update = api.push_message(OWNER, "a long one", message_thread_id=9, is_topic_message=True)
    store = MemoryStore()
    with FakeModel("streamer", replies=[FakeStream(pieces, delay=0.03)]) as model:
        async with bot(api, store, model, chunk_limit=limit, stream_interval=0.02) as turns:
            outcome = await turns.handle(Ctx(store), payload=update, respond=streamed)
    expected = chunk_telegram_text(answer, limit)
    assert len(expected) == 3
    messages = api.messages
    assert [m["text"] for m in messages] == expected
    assert messages[0]["edits"] >= 1  # the preview, edited to chunk 1
    assert all(len(e["text"]) <= limit for e in api.edits)  # a preview holds one chunk
    # Only the first (the preview) replies and carries the topic, as without streaming.
    assert [(m["reply_to_message_id"], m["message_thread_id"]) for m in messages] == [
        (update["message"]["message_id"], 9),
        (None, None),
        (None, None),
    ]
    assert outcome.result is not None
    assert outcome.result.receipt.message_ids == [str(m["message_id"]) for m in messages]


async def test_a_429_on_a_preview_edit_holds_the_edits_back_for_its_retry_after(
    api: FakeBotApi,
) -> None:
    retry_after = 0.3
    api.fail_next("editMessageText", "rate_limit", retry_after=retry_after)
    update = api.push_message(OWNER, "go")
    store = MemoryStore()
    words = [f"w{i} " for i in range(14)]
    with FakeModel("streamer", replies=[FakeStream(words, delay=0.04)]) as model:
        async with bot(api, store, model, stream_interval=0.05) as turns:
            outcome = await turns.handle(Ctx(store), payload=update, respond=streamed)
    edits = [c for c in api.calls if c["method"] == "editMessageText"]
    assert edits[0]["status"] == 429
    after = [c for c in edits[1:] if c["status"] == 200]
    assert after  # streaming went on, then the reply replaced the preview
    assert all(c["at"] - edits[0]["at"] >= retry_after * 0.95 for c in edits[1:])
    assert outcome.result is not None
    assert [m["text"] for m in api.messages] == ["".join(words).strip()]


async def test_a_429_on_the_final_edit_is_waited_out(api: FakeBotApi) -> None:
    update = api.push_message(OWNER, "go")
    store = MemoryStore()
    with FakeModel("streamer", replies=[FakeStream(["Hel", "lo"], delay=0.01)]) as model:
        # A long interval: no edit while streaming; the final one goes at once.
        async with bot(api, store, model, stream_interval=30) as turns:
            api.fail_next("editMessageText", "rate_limit", retry_after=0.2)
            outcome = await turns.handle(Ctx(store), payload=update, respond=streamed)
    edits = [c for c in api.calls if c["method"] == "editMessageText"]
    assert [c["status"] for c in edits] == [429, 200]
    assert edits[1]["at"] - edits[0]["at"] >= 0.2 * 0.95
    assert outcome.result is not None
    assert [m["text"] for m in api.messages] == ["Hello"]


async def test_the_preview_is_never_edited_to_the_text_it_shows(api: FakeBotApi) -> None:
    update = api.push_message(OWNER, "go")
    store = MemoryStore()
    pieces = ["Hello", " ", "\n", "  ", "\t"]  # after the first piece the text reads the same
    with FakeModel("streamer", replies=[FakeStream(pieces, delay=0.03)]) as model:
        async with bot(api, store, model, stream_interval=0.01) as turns:
            outcome = await turns.handle(Ctx(store), payload=update, respond=streamed)
    assert outcome.result is not None
    assert outcome.result.reply == "Hello"
    assert methods(api) == [("sendMessage", 200)]  # no edit at all: nothing changed
    assert [m["text"] for m in api.messages] == ["Hello"]


async def test_a_turn_cancelled_mid_stream_resumes_into_the_same_message(
    api: FakeBotApi, store: Store
) -> None:
    second = ["A ", "fresh ", "answer ", "after ", "the ", "crash."]
    replies = [FakeStream(WORDS, delay=0.03), FakeStream(second, delay=0.03)]
    update = api.push_message(OWNER, "hello")
    with FakeModel("streamer", replies=replies) as model:
        async with bot(api, store, model, stream_interval=0.02) as turns:
            with anyio.CancelScope() as crash:

                async def dies_mid_stream(turn: TurnArgs) -> str:
                    pieces = 0

                    async def tap(delta: str) -> None:
                        nonlocal pieces
                        assert turn.on_token is not None
                        await turn.on_token(delta)
                        pieces += 1
                        if pieces == 4:
                            crash.cancel()  # the process "dies" in the middle of the stream

                    return str(await agency.llm(turn.input, on_token=tap))

                await turns.handle(Ctx(store), payload=update, respond=dies_mid_stream)
            assert crash.cancelled_caught
            (preview,) = api.messages  # the preview, showing part of the cut answer
            assert ANSWER.startswith(preview["text"])
            assert preview["text"] != ANSWER

            outcome = await turns.handle(Ctx(store), payload=update, respond=streamed)
        assert len(model.calls) == 2  # the cut answer was never journaled: asked again
    final = "".join(second)
    assert outcome.result is not None
    assert outcome.result.reply == final
    assert len(api.sent) == 1  # no second message: the journaled preview was edited
    assert [m["text"] for m in api.messages] == [final]
    assert outcome.result.receipt.message_ids == [str(api.sent[0]["message_id"])]


async def test_a_turn_cancelled_after_the_answer_replays_it_into_the_preview(
    api: FakeBotApi, store: Store
) -> None:
    update = api.push_message(OWNER, "hello")
    with FakeModel("streamer", replies=[FakeStream(WORDS, delay=0.01)]) as model:
        async with bot(api, store, model, stream_interval=60) as turns:
            with anyio.CancelScope() as crash:

                async def dies_after_the_answer(turn: TurnArgs) -> str:
                    reply = await streamed(turn)  # journaled
                    crash.cancel()
                    await anyio.sleep(5)  # dies before respond returns
                    return reply

                await turns.handle(Ctx(store), payload=update, respond=dies_after_the_answer)
            assert crash.cancelled_caught
            assert [m["text"] for m in api.messages] == ["Hel"]  # paced: never edited yet

            outcome = await turns.handle(Ctx(store), payload=update, respond=streamed)
        assert len(model.calls) == 1  # replayed: the model was not asked again
    assert outcome.result is not None
    assert len(api.sent) == 1
    assert [m["text"] for m in api.messages] == [ANSWER]


async def test_a_turn_that_failed_delivery_edits_the_journaled_preview_on_retry(
    api: FakeBotApi, store: Store
) -> None:
    update = api.push_message(OWNER, "hello")
    with FakeModel("streamer", replies=[FakeStream(WORDS, delay=0.01)]) as model:
        async with bot(api, store, model, stream_interval=60) as turns:
            # The final edit stays rate limited past the transport's retries: the turn
            # fails after its respond step; the retry is a new handle (a new preview object).
            api.fail_next("editMessageText", "rate_limit", retry_after=0, times=4)
            with pytest.raises(TelegramRateLimitedError):
                await turns.handle(Ctx(store), payload=update, respond=streamed)
            respond_calls: list[str] = []

            def never_again(turn: TurnArgs) -> str:
                respond_calls.append(turn.input)
                return "not this"

            outcome = await turns.handle(Ctx(store), payload=update, respond=never_again)
        assert len(model.calls) == 1
    assert respond_calls == []  # the respond step was replayed from the journal
    assert outcome.result is not None
    assert outcome.result.reply == ANSWER
    assert len(api.sent) == 1
    assert [m["text"] for m in api.messages] == [ANSWER]
    assert outcome.result.receipt.message_ids == [str(api.sent[0]["message_id"])]


ROOT = Path(__file__).resolve().parents[3]

KILLED_MID_STREAM = """
import json, os, signal, sys
import anyio
from agency_runtime import ConversationMemory, agency
from agency_runtime.testing import FakeModel, FakeStream
from turn_kit.telegram import BotApiTransport, create_telegram_turn_adapter

STORE, BASE_URL, UPDATE = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
KILL_AFTER = int(os.environ.get("KILL_AFTER") or 0)

class Ctx:
    memory = ConversationMemory(STORE)

async def main():
    model = FakeModel("killed", replies=[FakeStream(json.loads(os.environ["PIECES"]), delay=0.03)])
    with model:
        async with BotApiTransport("4242:stream-token", base_url=BASE_URL) as transport:
            turns = create_telegram_turn_adapter(
                namespace="killed", owner_chat="8587", transport=transport, store=STORE,
                model=model.model, stream=True, stream_interval=0.02,
            )
            pieces = 0

            async def respond(turn):
                async def tap(delta):
                    nonlocal pieces
                    await turn.on_token(delta)
                    pieces += 1
                    if pieces == KILL_AFTER:
                        os.kill(os.getpid(), signal.SIGKILL)

                return await agency.llm(turn.input, on_token=tap)

            outcome = await turns.handle(Ctx(), payload=UPDATE, respond=respond)
            print(json.dumps({"reply": outcome.result.reply,
                              "ids": outcome.result.receipt.message_ids}))

anyio.run(main)
"""


@pytest.mark.slow
def test_a_process_killed_mid_stream_delivers_the_reply_once(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED_MID_STREAM))
    store = f"sqlite:///{tmp_path}/turns.db"
    with FakeBotApi(token=TOKEN) as api:
        update = api.push_message(OWNER, "hello")
        args = (store, api.base_url, json.dumps(update))
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, "PIECES": json.dumps(WORDS), "KILL_AFTER": "4"}
        first = fork_server.run("script", script, *args, env=env, timeout=120)
        assert first.returncode == -signal.SIGKILL, first.stderr
        assert len(api.sent) == 1
        partial = api.messages[0]["text"]
        assert partial != ANSWER
        assert ANSWER.startswith(partial)

        env.update(KILL_AFTER="0", PIECES=json.dumps(["After ", "the ", "kill."]))
        second = fork_server.run("script", script, *args, env=env, timeout=120, check=True)
        done = json.loads(second.stdout.strip().splitlines()[-1])
        messages = api.messages
    assert done == {"reply": "After the kill.", "ids": [str(api.sent[0]["message_id"])]}
    assert len(api.sent) == 1  # exactly one message ...
    assert [m["text"] for m in messages] == ["After the kill."]  # ... showing the final text


async def test_stream_false_changes_nothing(api: FakeBotApi) -> None:
    seen: list[Any] = []

    async def respond(turn: TurnArgs) -> str:
        seen.append(turn.on_token)
        return str(await agency.llm(turn.input, on_token=turn.on_token))

    update = api.push_message(OWNER, "hello")
    store = MemoryStore()
    with FakeModel("streamer", replies=[FakeStream(WORDS, delay=0.01)]) as model:
        async with bot(api, store, model, stream=False) as turns:
            outcome = await turns.handle(Ctx(store), payload=update, respond=respond)
    assert seen == [None]  # nothing to stream to
    assert methods(api) == [("sendMessage", 200)]
    assert [m["text"] for m in api.sent] == [ANSWER]
    assert outcome.result is not None
    assert outcome.result.receipt.message_ids == [str(api.sent[0]["message_id"])]


async def test_a_streamed_turn_whose_respond_streams_nothing_is_sent_as_usual(
    api: FakeBotApi,
) -> None:
    update = api.push_message(OWNER, "hello")
    store = MemoryStore()
    with FakeModel("streamer", replies=[]) as model:
        async with bot(api, store, model) as turns:
            outcome = await turns.handle(Ctx(store), payload=update, respond=lambda t: "plain")
    assert outcome.result is not None
    assert methods(api) == [("sendMessage", 200)]
    assert [m["text"] for m in api.messages] == ["plain"]


class SendsOnly:
    """A transport that sends and cannot edit."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send_message(self, chat_id: str, text: str, **options: Any) -> dict[str, Any]:
        self.sent.append(text)
        return {"ok": True, "chat_id": chat_id, "message_id": str(len(self.sent))}


class EditsGone(SendsOnly):
    """A transport whose messages cannot be edited any more once ``gone`` is set (the user
    deleted the preview): ``edit_message_text`` then answers ``ok=False``."""

    def __init__(self) -> None:
        super().__init__()
        self.edited: list[tuple[str, str]] = []
        self.gone = False

    async def edit_message_text(
        self, chat_id: str, message_id: str, text: str, *, max_retries: int | None = None
    ) -> dict[str, Any]:
        if self.gone:
            return {"ok": False, "chat_id": chat_id}
        self.edited.append((message_id, text))
        return {"ok": True, "chat_id": chat_id, "message_id": message_id}


def adapter_on(transport: Any, model: FakeModel, **options: Any) -> TelegramTurnAdapter:
    return create_telegram_turn_adapter(
        namespace="streamer", owner_chat=str(OWNER), transport=transport, store=MemoryStore(),
        model=model.model, stream=True, stream_interval=0.0, **options,
    )  # fmt: skip


UPDATE = {"message": {"message_id": 5, "chat": {"id": OWNER}, "text": "hello"}}


async def test_a_deleted_preview_gets_the_reply_as_a_new_message() -> None:
    transport = EditsGone()

    async def respond(turn: TurnArgs) -> str:
        reply = await streamed(turn)
        transport.gone = True  # deleted before the reply is delivered
        return f"{reply}!"

    with FakeModel("streamer", replies=[FakeStream(["Hel", "lo"], delay=0.0)]) as model:
        outcome = await adapter_on(transport, model).handle(
            Ctx(MemoryStore()), payload=UPDATE, respond=respond
        )
    assert transport.edited == [("1", "Hello")]  # while streaming
    assert transport.sent == ["Hel", "Hello!"]
    assert outcome.result is not None
    assert outcome.result.receipt.message_ids == ["2"]


async def test_a_transport_that_cannot_edit_streams_nothing_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport = SendsOnly()
    replies = [FakeStream(["Hel", "lo"]), FakeStream(["Hi ", "again"])]
    with FakeModel("streamer", replies=replies) as model:
        turns = adapter_on(transport, model)
        with caplog.at_level(logging.WARNING, logger="turn_kit.telegram"):
            for message_id in (5, 6):
                payload = {"message": {**UPDATE["message"], "message_id": message_id}}
                await turns.handle(Ctx(MemoryStore()), payload=payload, respond=streamed)
    assert transport.sent == ["Hello", "Hi again"]
    warnings = [r for r in caplog.records if "edit_message_text" in r.getMessage()]
    assert len(warnings) == 1


@pytest.mark.parametrize("bad", [-1, "1", True, float("nan")])
def test_stream_options_are_checked(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="stream_interval"):
        create_telegram_turn_adapter(namespace="x", stream=True, stream_interval=bad)


def test_stream_must_be_a_bool() -> None:
    with pytest.raises(InvalidArgumentError, match="stream must be"):
        create_telegram_turn_adapter(namespace="x", stream="yes")  # type: ignore[arg-type]


async def test_the_fake_and_the_transport_edit_messages_as_telegram_does(
    api: FakeBotApi,
) -> None:
    async with BotApiTransport(TOKEN, base_url=api.base_url, max_retries=1) as transport:
        sent = await transport.send_message(str(OWNER), "draft")
        assert sent.message_id is not None
        edited = await transport.edit_message_text(str(OWNER), sent.message_id, "final")
        assert (edited.ok, edited.message_id) == (True, sent.message_id)
        same = await transport.edit_message_text(str(OWNER), sent.message_id, "final")
        assert same.ok  # "message is not modified": it already shows the text
        gone = await transport.edit_message_text(str(OWNER), "999", "final")
        assert (gone.ok, gone.unknown) == (False, False)
        api.fail_next("editMessageText", "rate_limit", retry_after=7)
        with pytest.raises(TelegramRateLimitedError) as raised:
            await transport.edit_message_text(str(OWNER), sent.message_id, "x", max_retries=0)
        assert raised.value.retry_after == 7
    assert api.edits == [
        {"chat_id": OWNER, "message_id": 1, "text": "final", "at": api.edits[0]["at"]}
    ]
    assert api.messages == [{**api.sent[0], "text": "final", "edits": 1}]
    assert api.sent[0]["text"] == "draft"  # sent keeps what was sent
    statuses = [c["status"] for c in api.calls if c["method"] == "editMessageText"]
    assert statuses == [200, 400, 400, 429]


async def test_the_fakes_edits_and_calls_are_timed_on_one_clock(api: FakeBotApi) -> None:
    before = time.time()
    async with BotApiTransport(TOKEN, base_url=api.base_url, max_retries=1) as transport:
        sent = await transport.send_message(str(OWNER), "draft")
        assert sent.message_id is not None
        await transport.edit_message_text(str(OWNER), sent.message_id, "final")
    after = time.time()
    (edit,) = api.edits
    (call,) = [c for c in api.calls if c["method"] == "editMessageText"]
    # The edit is applied while its call is answered: both on time.time(), in that order.
    assert before <= edit["at"] <= call["at"] <= after


async def test_send_durably_can_make_an_existing_message_its_first_chunk() -> None:
    transport = EditsGone()

    async def job(text: str) -> Any:
        return await send_durably(transport, OWNER_ID, text, chunk_limit=4, edit_message_id="7")

    delivery = (await agency.run(job, "one\ntwo", store=MemoryStore())).unwrap()
    assert transport.edited == [("7", "one")]
    assert transport.sent == ["two"]
    assert delivery["message_ids"] == ["7", "1"]  # the run result, as JSON data


async def test_the_runner_checks_what_it_streams_to() -> None:
    runner = create_turn_runner(namespace="streamer", store=MemoryStore(), memory=False)
    with pytest.raises(InvalidArgumentError, match="stream must have"):
        await runner.run(
            Ctx(MemoryStore()), conversation={"transport": "cli", "id": "me"}, input="hi",
            respond=lambda turn: "x", deliver=lambda reply: None, stream=object(),  # type: ignore[arg-type]
        )  # fmt: skip
