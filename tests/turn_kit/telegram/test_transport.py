"""Transports against the loopback FakeBotApi (real HTTP), the Cloud proxy and the chunked send."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import httpx
import pytest
import telegram

from agency_runtime import InvalidArgumentError
from tests.support import asyncio_only, loopback_tls
from turn_kit import TurnKitError
from turn_kit.telegram import _transport
from turn_kit.telegram._fake import FakeBotApi
from turn_kit.telegram._transport import (
    BotApiTransport,
    CloudTelegramTransport,
    TelegramSendResult,
    TelegramTransport,
    cloud_telegram_transport_from_env,
    send_telegram_text,
)

pytestmark = pytest.mark.anyio

TOKEN = "123:abc"


@pytest.fixture
def api() -> Iterator[FakeBotApi]:
    with FakeBotApi(token=TOKEN) as fake:
        yield fake


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record 429 back-offs instead of sleeping them."""
    waited: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waited.append(seconds)
        await anyio.lowlevel.checkpoint()

    monkeypatch.setattr(_transport, "_sleep", fake_sleep)
    return waited


def sends(api: FakeBotApi) -> list[dict[str, Any]]:
    return [c for c in api.calls if c["method"] == "sendMessage"]


# -- BotApiTransport over loopback ---------------------------------------------------------


async def test_send_records_chat_text_reply_thread_and_returns_receipt(api: FakeBotApi) -> None:
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
        assert isinstance(transport, TelegramTransport)
        result = await transport.send_message(
            "-1001234", "hello", reply_to_message_id="12", thread_id="3"
        )
    assert result == TelegramSendResult(
        ok=True, chat_id="-1001234", message_id="1", ref="telegram:-1001234:1"
    )
    assert api.sent == [
        {
            "chat_id": -1001234,
            "text": "hello",
            "reply_to_message_id": 12,
            "message_thread_id": 3,
            "message_id": 1,
        }
    ]


async def test_ids_are_converted_and_invalid_ones_omitted(api: FakeBotApi) -> None:
    assert _transport._chat_target("-1001234") == -1001234
    assert _transport._chat_target("@channel") == "@channel"
    assert _transport._chat_target(str(2**60)) == str(2**60)
    assert _transport._positive_id("7") == 7
    assert _transport._positive_id(7) == 7
    for bad in ("0", "-3", "abc", "1.5", "", None, True, 0):
        assert _transport._positive_id(bad) is None
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
        await transport.send_message("42", "a", reply_to_message_id="abc", thread_id="0")
        await transport.send_message("@channel", "b")
    params = [c["params"] for c in sends(api)]
    assert "reply_parameters" not in params[0]
    assert "message_thread_id" not in params[0]
    assert [s["chat_id"] for s in api.sent] == [42, "@channel"]


def test_transports_share_one_verifying_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each transport's two HTTP clients, and every transport of the process, use one TLS
    context (loading the CA bundle costs ~25 ms a client): httpx's default, which verifies
    certificates and host names, built anew when the CA settings httpx reads change."""
    import ssl

    def contexts(transport: BotApiTransport) -> list[ssl.SSLContext]:
        return [r._client._transport._pool._ssl_context for r in transport._requests]

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    first, second = BotApiTransport(TOKEN), BotApiTransport(TOKEN)
    shared = contexts(first)[0]
    assert contexts(first) == contexts(second) == [shared, shared]
    cloud_client = CloudTelegramTransport("https://cloud.example.test/", "t")._http()
    assert cloud_client._transport._pool._ssl_context is shared
    assert shared.verify_mode == ssl.CERT_REQUIRED
    assert shared.check_hostname
    assert shared.cert_store_stats()["x509_ca"] > 0  # the CA bundle is loaded
    import certifi

    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())
    other = contexts(BotApiTransport(TOKEN))
    assert other[0] is not shared
    assert other[0] is other[1]


async def test_token_from_env_and_missing_token(
    api: FakeBotApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN", raising=False)
    with pytest.raises(InvalidArgumentError, match="TELEGRAM_BOT_TOKEN"):
        BotApiTransport()
    with pytest.raises(InvalidArgumentError):
        BotApiTransport("   ")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
    async with BotApiTransport(base_url=api.base_url) as transport:
        assert TOKEN not in repr(transport)
        assert (await transport.send_message("5", "env")).ok
    assert api.sent[0]["text"] == "env"


async def test_unauthorized_raises_without_the_token(
    api: FakeBotApi, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "999:very-secret"
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="httpx")  # litellm, when loaded, quiets httpx
    async with BotApiTransport(secret, base_url=api.base_url) as transport:
        with pytest.raises(TurnKitError, match="Unauthorized") as info:
            await transport.send_message("5", "hi")
    assert "bot<token>/sendMessage" in caplog.text  # httpx logs the URL, redacted
    assert secret not in caplog.text
    assert secret not in str(info.value)
    assert secret not in repr(info.value)
    assert isinstance(info.value.__cause__, telegram.error.TelegramError)
    assert api.sent == []


async def test_rate_limit_waits_retry_after_then_succeeds(
    api: FakeBotApi, sleeps: list[float]
) -> None:
    api.fail_next("sendMessage", "rate_limit", retry_after=1)
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
        result = await transport.send_message("5", "after the wait")
    assert result.ok
    assert sleeps == [1.0]
    assert [c["status"] for c in sends(api)] == [429, 200]
    assert [s["text"] for s in api.sent] == ["after the wait"]


async def test_rate_limit_really_sleeps_fractional_retry_after(
    api: FakeBotApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _transport._sleep is anyio.sleep  # the back-off is a real sleep...
    waited: list[float] = []

    async def recorded(seconds: float) -> None:
        waited.append(seconds)
        await anyio.lowlevel.checkpoint()

    monkeypatch.setattr(_transport, "_sleep", recorded)
    api.fail_next("sendMessage", "rate_limit", retry_after=0.2)
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
        assert (await transport.send_message("5", "x")).ok
    assert waited == [0.2]  # ...of the fractional retry_after, not rounded


async def test_rate_limit_retries_are_bounded(api: FakeBotApi, sleeps: list[float]) -> None:
    api.fail_next("sendMessage", "rate_limit", retry_after=2, times=5)
    async with BotApiTransport(TOKEN, base_url=api.base_url, max_retries=2) as transport:
        with pytest.raises(TurnKitError, match="rate limited after 2 retries"):
            await transport.send_message("5", "never")
    assert sleeps == [2.0, 2.0]
    assert len(sends(api)) == 3
    assert api.sent == []


async def test_rate_limit_on_one_chat_does_not_delay_another(
    api: FakeBotApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeping = anyio.Event()
    release = anyio.Event()

    async def held_sleep(seconds: float) -> None:
        sleeping.set()
        await release.wait()

    monkeypatch.setattr(_transport, "_sleep", held_sleep)
    api.fail_next("sendMessage", "rate_limit", retry_after=30, chat_id="111")
    results: dict[str, TelegramSendResult] = {}
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:

        async def send(chat: str) -> None:
            results[chat] = await transport.send_message(chat, f"to {chat}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, "111")
            with anyio.fail_after(5):
                await sleeping.wait()
            with anyio.fail_after(2):  # chat 222 is not held up by chat 111's flood wait
                await send("222")
            assert "111" not in results
            release.set()
    assert results["111"].ok
    assert results["222"].ok
    assert [s["chat_id"] for s in api.sent] == [222, 111]


async def test_thread_not_found_resends_once_without_thread(api: FakeBotApi) -> None:
    api.fail_next("sendMessage", "thread_not_found")
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
        result = await transport.send_message(
            "-100", "general", reply_to_message_id="9", thread_id="1"
        )
    assert result.ok
    assert [c["status"] for c in sends(api)] == [400, 200]
    assert sends(api)[0]["params"]["message_thread_id"] == 1
    assert api.sent == [
        {
            "chat_id": -100,
            "text": "general",
            "reply_to_message_id": 9,
            "message_thread_id": None,
            "message_id": 1,
        }
    ]


async def test_thread_not_found_is_retried_only_once(api: FakeBotApi) -> None:
    api.fail_next("sendMessage", "thread_not_found", times=5)
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
        assert (await transport.send_message("-100", "x", thread_id="4")).ok
    # the resend carries no thread, so the injected failure does not apply to it
    assert [c["status"] for c in sends(api)] == [400, 200]


async def test_timeout_after_store_is_unknown_and_not_resent(api: FakeBotApi) -> None:
    api.fail_next("sendMessage", "timeout_after_store", hang=5)
    async with BotApiTransport(TOKEN, base_url=api.base_url, timeout=0.3) as transport:
        result = await transport.send_message("5", "maybe")
    assert result == TelegramSendResult(ok=False, chat_id="5", unknown=True)
    assert len(sends(api)) == 1
    assert [s["text"] for s in api.sent] == ["maybe"]


async def test_other_bad_requests_raise(api: FakeBotApi) -> None:
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
        with pytest.raises(TurnKitError, match="text is empty") as info:
            await transport.send_message("5", "   ")
        assert isinstance(info.value.__cause__, telegram.error.BadRequest)
        with pytest.raises(TurnKitError, match="too long"):
            await transport.send_message("5", "😀" * 2049)  # 4098 UTF-16 units
        assert (await transport.send_message("5", "😀" * 2048)).ok  # exactly 4096
    assert len(api.sent) == 1


async def test_send_chat_action(api: FakeBotApi) -> None:
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
        assert await transport.send_chat_action("5") is True
        assert await transport.send_chat_action("-100", "upload_document", thread_id="7")
        api.fail_next("sendChatAction", "rate_limit", retry_after=30)
        assert await transport.send_chat_action("5") is False  # best effort, no waiting
    assert api.actions == [
        {"chat_id": 5, "action": "typing", "message_thread_id": None},
        {"chat_id": -100, "action": "upload_document", "message_thread_id": 7},
    ]


async def test_closed_transport_reopens(api: FakeBotApi) -> None:
    transport = BotApiTransport(TOKEN, base_url=api.base_url)
    await transport.aclose()
    await transport.aclose()
    assert (await transport.send_message("5", "again")).ok
    await transport.aclose()


# -- CloudTelegramTransport ----------------------------------------------------------------


def cloud(handler: Any) -> CloudTelegramTransport:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return CloudTelegramTransport(
        "https://cloud.example.test/cloud/", "workspace-token", client=client
    )


async def test_cloud_proxy_url_body_and_receipt() -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(
            200, json={"ok": True, "result": {"message_id": 42, "chat": {"id": 8587455921}}}
        )

    transport = cloud(handler)
    result = await transport.send_message(
        "8587455921__KJG Life Bot", "hello", reply_to_message_id="7", thread_id="9"
    )
    assert str(requests[0].url) == "https://cloud.example.test/cloud/api/v1/proxy/telegram"
    assert requests[0].method == "POST"
    assert requests[0].headers["authorization"] == "Bearer workspace-token"
    assert json.loads(requests[0].content) == {
        "endpoint": "/sendMessage",
        "method": "POST",
        "data": {
            "chat_id": 8587455921,
            "text": "hello",
            "reply_to_message_id": 7,
            "message_thread_id": 9,
        },
    }
    assert result == TelegramSendResult(
        ok=True, chat_id="8587455921", message_id="42", ref="cloud:telegram:8587455921:42"
    )
    assert "workspace-token" not in repr(transport)


async def test_cloud_ids_converted_and_invalid_ones_omitted() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"ok": True, "result": {"message_id": 1}})

    transport = cloud(handler)
    await transport.send_message("-100123", "a", reply_to_message_id="x1", thread_id="0")
    await transport.send_message("@chan", "b", reply_to_message_id="-4", thread_id="1.5")
    await transport.send_message("", "c")
    wrapped = cloud(
        lambda r: httpx.Response(
            200, json={"ok": True, "data": {"ok": True, "result": {"message_id": 5}}}
        )
    )
    assert (await wrapped.send_message("77__Me", "d")).ref == "cloud:telegram:77:5"
    assert [b["data"] for b in bodies] == [
        {"chat_id": -100123, "text": "a"},
        {"chat_id": "@chan", "text": "b"},
        {"chat_id": 0, "text": "c"},  # the seed's Number('') === 0
    ]


async def test_cloud_errors_raise() -> None:
    rejected = cloud(
        lambda r: httpx.Response(400, json={"ok": False, "description": "chat not found"})
    )
    with pytest.raises(TurnKitError, match=r"400.*chat not found"):
        await rejected.send_message("8587455921", "hello")

    long = cloud(lambda r: httpx.Response(200, json={"ok": False, "error": "z" * 1000}))
    with pytest.raises(TurnKitError) as info:
        await long.send_message("1", "hello")
    assert str(info.value).count("z") == 240

    missing = cloud(lambda r: httpx.Response(200, json={"ok": True, "result": {}}))
    with pytest.raises(TurnKitError, match="no delivered message id"):
        await missing.send_message("8587455921", "hello")

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(TurnKitError, match="timed out"):
        await cloud(slow).send_message("1", "hello")


async def test_cloud_transport_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_CLOUD_API_URL", raising=False)
    monkeypatch.delenv("AGENT_CLOUD_API_TOKEN", raising=False)
    assert cloud_telegram_transport_from_env() is None
    assert cloud_telegram_transport_from_env({"AGENT_CLOUD_API_URL": "https://c"}) is None
    assert (
        cloud_telegram_transport_from_env(
            {"AGENT_CLOUD_API_URL": " ", "AGENT_CLOUD_API_TOKEN": "t"}
        )
        is None
    )
    monkeypatch.setenv("AGENT_CLOUD_API_URL", "https://cloud.example.test/")
    monkeypatch.setenv("AGENT_CLOUD_API_TOKEN", "tok")
    built = cloud_telegram_transport_from_env()
    assert built is not None
    assert built.endpoint == "https://cloud.example.test/api/v1/proxy/telegram"
    await built.aclose()


# -- send_telegram_text ------------------------------------------------------------------------


class Recorder:
    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[tuple[str, str, str | None, str | None]] = []
        self.fail_at = fail_at

    async def send_message(
        self,
        chat_id: str,
        text: str,
        *,
        reply_to_message_id: str | None = None,
        thread_id: str | None = None,
    ) -> dict[str, Any]:
        self.calls.append((chat_id, text, reply_to_message_id, thread_id))
        n = len(self.calls)
        if n == self.fail_at:
            return {"ok": False, "chat_id": chat_id, "message_id": None, "ref": None}
        return {"ok": True, "chat_id": chat_id, "message_id": str(100 + n), "ref": f"r{n}"}


async def test_send_telegram_text_bare_id_and_only_first_chunk_threaded() -> None:
    recorder = Recorder()
    delivery = await send_telegram_text(
        recorder,
        "8587__KJG Life Bot",
        "12345\n67890\nabcde",
        reply_to_message_id="12",
        thread_id=3,
        chunk_limit=7,
    )
    assert recorder.calls == [
        ("8587", "12345", "12", "3"),
        ("8587", "67890", None, None),
        ("8587", "abcde", None, None),
    ]
    assert delivery.ok
    assert delivery.chat_id == "8587"
    assert delivery.message_ids == ["101", "102", "103"]


async def test_send_telegram_text_failing_chunk_raises_after_earlier_chunks() -> None:
    recorder = Recorder(fail_at=2)
    with pytest.raises(TurnKitError, match=r"Telegram delivery to 8587 .*chunk 2$"):
        await send_telegram_text(recorder, "8587", "12345\n67890\nabcde", chunk_limit=7)
    assert [c[1] for c in recorder.calls] == ["12345", "67890"]

    first = Recorder(fail_at=1)
    with pytest.raises(TurnKitError, match="chunk 1"):
        await send_telegram_text(first, "8587", "hi")


async def test_send_telegram_text_over_the_fake(api: FakeBotApi) -> None:
    async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
        delivery = await send_telegram_text(
            transport, "-100__Team", "a" * 10 + "\n" + "b" * 5, thread_id="4", chunk_limit=12
        )
        api.fail_next("sendMessage", "timeout_after_store", hang=5)
        slow = BotApiTransport(TOKEN, base_url=api.base_url, timeout=0.3)
        with pytest.raises(TurnKitError, match=r"chunk 1 .*may still have arrived"):
            await send_telegram_text(slow, "-100", "lost?")
        await slow.aclose()
    assert delivery.message_ids == ["1", "2"]
    assert [(s["text"], s["message_thread_id"]) for s in api.sent] == [
        ("a" * 10, 4),
        ("b" * 5, None),
        ("lost?", None),
    ]


# -- FakeBotApi itself ---------------------------------------------------------------------


async def test_fake_get_updates_offset_semantics(api: FakeBotApi) -> None:
    first = api.push_message(5, "one")
    second_id = api.push_update({"message": {"message_id": 99, "chat": {"id": 5}, "text": "x"}})
    third = api.push_message(
        -100, "three", message_thread_id=7, is_topic_message=True, reply_to="earlier"
    )
    assert first["update_id"] == 1
    assert second_id == 2
    assert third["update_id"] == 3
    message = third["message"]
    assert message["chat"]["is_forum"] is True
    assert message["reply_to_message"]["text"] == "earlier"
    assert message["from"]["is_bot"] is False
    url = f"{api.base_url}/bot{TOKEN}/getUpdates"
    async with httpx.AsyncClient(verify=loopback_tls()) as client:
        every = (await client.get(url)).json()["result"]
        assert [u["update_id"] for u in every] == [1, 2, 3]
        limited = (await client.post(url, json={"offset": 2, "limit": 1})).json()["result"]
        assert [u["update_id"] for u in limited] == [2]
        # offset 2 confirmed update 1
        assert [u["update_id"] for u in api.pending_updates()] == [2, 3]
        rest = (await client.post(url, data={"offset": "4"})).json()["result"]
        assert rest == []
        assert api.pending_updates() == []
        bad = await client.get(f"{api.base_url}/bot999:nope/getUpdates")
        assert bad.status_code == 401
        assert bad.json() == {"ok": False, "error_code": 401, "description": "Unauthorized"}
        assert (await client.get(f"{api.base_url}/bot{TOKEN}/nope")).status_code == 404


async def test_fake_long_poll_times_out_and_wakes(api: FakeBotApi) -> None:
    # The fake serves on its own thread and waits in real time. The client gives up after
    # 5 s while the fake's cap is a minute: a poll that ignored its timeout, or that a push
    # did not wake, would fail with a read timeout.
    api.long_poll_cap = 60
    waiting = threading.Event()

    class Watched(threading.Condition):
        """The fake's condition, telling when a long poll starts to wait on it."""

        def wait(self, timeout: float | None = None) -> bool:
            waiting.set()
            return super().wait(timeout)

    api._cond = Watched(api._lock)
    url = f"{api.base_url}/bot{TOKEN}/getUpdates"
    async with httpx.AsyncClient(timeout=5, verify=loopback_tls()) as client:
        empty = (await client.get(url, params={"timeout": "0.05"})).json()
        assert empty == {"ok": True, "result": []}  # its own timeout ended the wait
        assert waiting.is_set()  # it did wait
        waiting.clear()

        woke: list[Any] = []

        async def poll() -> None:
            woke.extend((await client.get(url, params={"timeout": "30"})).json()["result"])

        async with anyio.create_task_group() as group:
            group.start_soon(poll)
            await anyio.to_thread.run_sync(waiting.wait, 5)  # the poll waits on the fake
            assert waiting.is_set()
            api.push_message(5, "late")
        assert [u["message"]["text"] for u in woke] == ["late"]


@asyncio_only("python-telegram-bot is asyncio code (asyncio.gather in telegram.Bot)")
async def test_fake_works_with_ptb_bot_and_webhooks(api: FakeBotApi) -> None:
    api.push_message(5, "hello bot")
    async with telegram.Bot(TOKEN, base_url=f"{api.base_url}/bot") as bot:
        assert bot.username == "fake_bot"
        updates = await bot.get_updates(timeout=1)
        assert updates[0].message is not None
        assert updates[0].message.text == "hello bot"
        sent = await bot.send_message(5, "reply")
        assert sent.message_id == 2
        assert sent.text == "reply"
        assert await bot.set_webhook("https://example.test/hook", secret_token="s3cret")
        assert api.webhook is not None
        assert api.webhook["url"] == "https://example.test/hook"
        assert api.webhook["secret_token"] == "s3cret"
        with pytest.raises(telegram.error.Conflict):
            await bot.get_updates()
        assert await bot.delete_webhook()
        assert api.webhook is None
