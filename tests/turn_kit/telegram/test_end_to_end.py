"""End to end over real loopback HTTP: FakeBotApi, BotApiTransport, polling and webhook."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agency_runtime import MemoryStore
from turn_kit import TurnArgs, UnconfirmedTurnDeliveryError
from turn_kit.telegram import (
    BotApiTransport,
    FakeBotApi,
    TelegramPoller,
    create_telegram_turn_adapter,
    webhook_app,
)

pytestmark = pytest.mark.anyio

TOKEN = "4242:secret-token"
OWNER = "8587"


class Ctx:
    def __init__(self) -> None:
        from agency_runtime import ConversationMemory

        self.memory = ConversationMemory(MemoryStore())


def reply(turn: TurnArgs) -> str:
    return f"you said: {turn.input}"


async def test_polling_end_to_end_through_the_fake_bot_api() -> None:
    with FakeBotApi(token=TOKEN) as api:
        api.push_message(int(OWNER), "hello")
        api.push_message(int(OWNER), "again", message_thread_id=7, is_topic_message=True)
        api.push_message(999, "not the owner")
        async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
            store = MemoryStore()
            adapter = create_telegram_turn_adapter(
                namespace="bot", owner_chat=OWNER, transport=transport, store=store, typing=True
            )
            poller = TelegramPoller(
                adapter, ctx=Ctx(), respond=reply, token=TOKEN, base_url=api.base_url,
                poll_timeout=0,
            )  # fmt: skip
            assert await poller.poll_once() == 3
            assert await poller.poll_once() == 0  # the offset is stored: nothing repeats
        sent = [(s["chat_id"], s["text"], s.get("message_thread_id")) for s in api.sent]
    assert sent == [
        (int(OWNER), "you said: hello", None),
        (int(OWNER), "you said: again", 7),
    ]
    assert [a["action"] for a in api.actions] == ["typing", "typing"]


async def test_webhook_end_to_end_through_the_fake_bot_api() -> None:
    with FakeBotApi(token=TOKEN) as api:
        update = api.push_message(int(OWNER), "ping")
        async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
            adapter = create_telegram_turn_adapter(
                namespace="bot", owner_chat=OWNER, transport=transport, store=MemoryStore()
            )
            app = webhook_app(adapter, ctx=Ctx(), respond=reply, secret_token="hook")
            headers = {"X-Telegram-Bot-Api-Secret-Token": "hook"}
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://bot"
            ) as client:
                for _ in range(2):  # Telegram redelivers: still one reply
                    response = await client.post("/", json=update, headers=headers)
                    assert response.status_code == 200
        assert [s["text"] for s in api.sent] == ["you said: ping"]


async def test_a_send_that_timed_out_is_not_resent_and_the_turn_is_unconfirmed() -> None:
    with FakeBotApi(token=TOKEN) as api:
        update = api.push_message(int(OWNER), "hello")
        api.fail_next("sendMessage", "timeout_after_store", hang=3.0)
        async with BotApiTransport(TOKEN, base_url=api.base_url, timeout=0.5) as transport:
            adapter = create_telegram_turn_adapter(
                namespace="bot", owner_chat=OWNER, transport=transport, store=MemoryStore()
            )
            for _ in range(2):  # the redelivery does not send it blindly a second time
                with pytest.raises(UnconfirmedTurnDeliveryError):
                    await adapter.handle(Ctx(), payload=update, respond=reply)
        assert [s["text"] for s in api.sent] == ["you said: hello"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(
        st.sampled_from(
            ["message", "edited_message", "channel_post", "business_message", "telegram",
             "data", "chat", "id", "message_id", "messageId", "chatId", "text", "caption",
             "from", "is_bot", "message_thread_id", "is_topic_message", "reply_to_message",
             "edit_date", "update_id", "x"]
        ),
        inner,
        max_size=5,
    ),
    max_leaves=20,
)  # fmt: skip


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def send_message(self, chat_id: str, text: str, **options: Any) -> dict[str, Any]:
        self.sent.append((chat_id, text))
        return {"ok": True, "chat_id": chat_id, "message_id": str(len(self.sent))}


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(payload=JSON)
def test_handle_never_fails_on_arbitrary_json(payload: Any) -> None:
    import anyio

    transport = Recorder()
    responded: list[str] = []
    adapter = create_telegram_turn_adapter(
        namespace="fuzz", owner_chat="0", transport=transport, store=MemoryStore()
    )

    def respond(turn: TurnArgs) -> str:
        responded.append(turn.message.chat_id)
        return "ok"

    outcome = anyio.run(lambda: adapter.handle(Ctx(), payload=payload, respond=respond))
    assert outcome.status in ("handled", "skipped")
    if outcome.status == "skipped":
        assert outcome.reason
        assert responded == []
    else:
        # only the owner chat ever reaches respond
        assert [chat.split("__")[0].strip() for chat in responded] == ["0"]
