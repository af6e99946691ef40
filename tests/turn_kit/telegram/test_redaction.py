"""The bot token never reaches a log line or an error message (DESIGN §5 Telegram, §7).

Every test first strips the redacting filter from every logger, as in a fresh process where
no Telegram component was built yet, so each component is checked for installing it itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
import telegram

from agency_runtime import MemoryStore
from tests.turn_kit.telegram.doubles import Ctx, Transport, echo
from turn_kit import TurnKitError
from turn_kit.telegram import (
    BotApiTransport,
    CloudTelegramTransport,
    FakeBotApi,
    TelegramPoller,
    create_telegram_turn_adapter,
    webhook_app,
)

pytestmark = pytest.mark.anyio

TOKEN = "4242:Very-SECRET_token-xyz"
SECRET = TOKEN.partition(":")[2]
OWNER = "8587"


def strip_redactors() -> None:
    """Remove the token filter from every logger (a process that built nothing yet)."""
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        if isinstance(logger, logging.Logger):
            for f in list(logger.filters):
                if type(f).__name__ == "_TokenRedactor":
                    logger.removeFilter(f)


def leaks(text: str) -> bool:
    lowered = text.lower()
    return TOKEN.lower() in lowered or SECRET.lower() in lowered


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="httpx")  # litellm, when loaded, quiets httpx
    strip_redactors()
    return caplog


@pytest.mark.parametrize("setup", ["token", "env", "client"])
async def test_no_poller_setup_logs_the_token(
    setup: str, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeBotApi(token=TOKEN) as api:
        api.push_message(int(OWNER), "hello")
        recorder = Transport()
        adapter = create_telegram_turn_adapter(
            namespace="bot", owner_chat=OWNER, transport=recorder, store=MemoryStore()
        )
        strip_redactors()  # only what the poller installs counts
        options: dict[str, Any] = {"base_url": api.base_url, "poll_timeout": 0}
        client: httpx.AsyncClient | None = None
        if setup == "token":
            options["token"] = TOKEN
        elif setup == "env":
            monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
        else:
            client = options["client"] = httpx.AsyncClient()
            options["token"] = TOKEN
        poller = TelegramPoller(adapter, ctx=Ctx(), respond=echo, **options)
        try:
            assert await poller.poll_once() == 1
        finally:
            if client is not None:
                await client.aclose()
    assert recorder.sent == ["re hello"]
    assert "bot<token>/getUpdates" in logs.text  # httpx logged the URL, redacted
    assert not leaks(logs.text)
    assert not leaks(repr(poller))


async def test_a_getupdates_error_quoting_the_url_is_scrubbed(
    logs: pytest.LogCaptureFixture,
) -> None:
    stop = anyio.Event()
    calls: list[str] = []

    def unreachable(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        if len(calls) == 2:  # the second call is run()'s: it stops after that one
            stop.set()
        raise httpx.ConnectError(f"cannot reach {request.url}", request=request)

    adapter = create_telegram_turn_adapter(namespace="bot", owner_chat=OWNER,
                                           transport=Transport(), store=MemoryStore())  # fmt: skip
    strip_redactors()
    async with httpx.AsyncClient(transport=httpx.MockTransport(unreachable)) as client:
        poller = TelegramPoller(adapter, ctx=Ctx(), respond=echo, token=TOKEN, client=client,
                                poll_timeout=0)  # fmt: skip
        with pytest.raises(TurnKitError, match="ConnectError") as info:
            await poller.poll_once()
        with anyio.fail_after(10):
            await poller.run(stop=stop, error_backoff=0)
    assert not leaks(str(info.value))
    assert info.value.__cause__ is not None
    assert not leaks(str(info.value.__cause__))
    assert "Telegram polling: getUpdates failed" in logs.text
    assert not leaks(logs.text)


async def test_the_transport_never_logs_the_token(logs: pytest.LogCaptureFixture) -> None:
    with FakeBotApi(token=TOKEN) as api:
        async with BotApiTransport("1:warm-up-token", base_url=api.base_url):
            pass  # python-telegram-bot is loaded: nothing is left to first-use set-up
        strip_redactors()
        async with BotApiTransport(TOKEN, base_url=api.base_url) as transport:
            assert (await transport.send_message(OWNER, "hi")).ok
    assert "bot<token>/sendMessage" in logs.text
    assert not leaks(logs.text)


class RaisingBot:
    """Stands in for ``telegram.Bot``: every send fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def send_message(self, **kwargs: Any) -> Any:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        # PTB strips "Error: " and capitalizes the rest, lower-casing the token on the way
        lambda: telegram.error.NetworkError(f"Error: bot{TOKEN} is unreachable"),
        lambda: telegram.error.BadRequest(f"Bad Request: no such url /bot{TOKEN}/sendMessage"),
        lambda: telegram.error.TelegramError(f"refused bot{TOKEN.upper()}"),
    ],
)
async def test_a_capitalized_token_in_an_error_text_is_scrubbed(
    error: Callable[[], Exception], logs: pytest.LogCaptureFixture
) -> None:
    raised = error()
    assert leaks(str(raised))  # the premise: PTB's own text carries it, in some case
    async with BotApiTransport(TOKEN, base_url="http://127.0.0.1:9") as transport:
        transport._bot = RaisingBot(raised)
        with pytest.raises(TurnKitError) as info:
            await transport.send_message(OWNER, "hi")
        logging.getLogger("turn_kit.telegram").error("send failed", exc_info=info.value)
    assert not leaks(str(info.value))
    assert not leaks(repr(info.value))
    assert info.value.__cause__ is raised
    assert not leaks(str(raised))
    assert not leaks(logs.text)


async def test_the_filter_scrubs_any_case_and_the_literal_token(
    logs: pytest.LogCaptureFixture,
) -> None:
    FakeBotApi(token=TOKEN)  # constructing one installs the filter (and knows the token)
    log = logging.getLogger("turn_kit.telegram")
    log.warning("url %s", f"https://api.telegram.org/Bot{TOKEN}/getMe")
    log.warning("upper %s", f"BOT{TOKEN.upper()}")
    log.warning("bare token %s here", TOKEN)
    log.warning("lower-cased bare token %s here", TOKEN.lower())
    try:
        raise RuntimeError(f"boom at /bot{TOKEN}/x")
    except RuntimeError:
        log.exception("with a traceback")
    assert "bot<token>" in logs.text
    assert logs.text.count("<token>") >= 5
    assert not leaks(logs.text)


def build_poller() -> Any:
    adapter = create_telegram_turn_adapter(namespace="bot", owner_chat=OWNER,
                                           transport=Transport(), store=MemoryStore())  # fmt: skip
    strip_redactors()
    return TelegramPoller(adapter, ctx=Ctx(), respond=echo, token=TOKEN)


def build_webhook() -> Any:
    adapter = create_telegram_turn_adapter(namespace="bot", owner_chat=OWNER,
                                           transport=Transport(), store=MemoryStore())  # fmt: skip
    strip_redactors()
    return webhook_app(adapter, ctx=Ctx(), respond=echo, secret_token="s")


@pytest.mark.parametrize(
    "build",
    [
        lambda: FakeBotApi(token=TOKEN),
        lambda: BotApiTransport(TOKEN, base_url="http://127.0.0.1:9"),
        lambda: CloudTelegramTransport("https://cloud.example.test", "cloud-secret-token"),
        lambda: create_telegram_turn_adapter(namespace="bot", owner_chat=OWNER),
        build_poller,
        build_webhook,
    ],
    ids=["fake", "bot-api", "cloud", "adapter", "poller", "webhook"],
)
def test_every_telegram_component_installs_the_filter(
    build: Callable[[], Any], logs: pytest.LogCaptureFixture
) -> None:
    build()
    for name in ("httpx", "httpcore.http11", "telegram.Bot", "turn_kit.telegram"):
        logging.getLogger(name).info("POST http://127.0.0.1/bot%s/sendMessage", TOKEN)
    assert logs.text.count("bot<token>/sendMessage") == 4
    assert not leaks(logs.text)
