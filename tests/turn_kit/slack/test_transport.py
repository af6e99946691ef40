"""SlackApiTransport against the loopback FakeSlackApi (real HTTP; slack_sdk's async client on
asyncio, its sync client in a thread on trio)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from agency_runtime import InvalidArgumentError
from tests.support import asyncio_only
from turn_kit._errors import SlackError, SlackRateLimitedError
from turn_kit.slack import _transport
from turn_kit.slack._fake import FakeSlackApi
from turn_kit.slack._transport import (
    DELIVERY_EVENT_TYPE,
    TOKEN_ENV,
    SlackApiTransport,
    SlackIdentity,
    SlackSendResult,
    scrub_slack_text,
)

pytestmark = pytest.mark.anyio

TOKEN = "xoxb-1111-2222-SecretPart"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def api() -> Iterator[FakeSlackApi]:
    with FakeSlackApi(token=TOKEN) as fake:
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


def calls_of(api: FakeSlackApi, method: str) -> list[dict[str, object]]:
    return [c for c in api.calls if c["method"] == method]


def chain_text(exc: BaseException) -> str:
    """The messages and reprs of ``exc`` and everything chained to it."""
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(parts) < 40:
        parts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


# -- each method -----------------------------------------------------------------------------


async def test_auth_test_returns_the_identity_each_time(api: FakeSlackApi) -> None:
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        first = await transport.auth_test()
        second = await transport.auth_test()
    assert first == second == SlackIdentity(user_id="UBOT", bot_id="BBOT", team_id="T0001")
    assert len(calls_of(api, "auth.test")) == 2  # nothing cached


async def test_post_message_in_a_thread_with_a_key(api: FakeSlackApi) -> None:
    root = api.add_user_message("C1", "hi bot")
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        result = await transport.post_message("C1", "a &lt;reply&gt;", thread_ts=root, key="k-1")
    assert result.ok
    assert result.channel == "C1"
    assert result.ts is not None
    assert not result.unknown
    assert result.error is None
    metadata = {"event_type": DELIVERY_EVENT_TYPE, "event_payload": {"key": "k-1"}}
    assert api.posts == [
        {
            "channel": "C1",
            "ts": result.ts,
            "thread_ts": root,
            "text": "a &lt;reply&gt;",  # sent as given: the caller escapes
            "metadata": metadata,
        }
    ]
    [call] = calls_of(api, "chat.postMessage")
    assert call["params"] == {
        "channel": "C1",
        "text": "a &lt;reply&gt;",
        "thread_ts": root,
        "metadata": metadata,
        "unfurl_links": False,
        "unfurl_media": False,
    }
    assert api.replies("C1", root)[0]["ts"] == result.ts


async def test_post_message_top_level_without_key_has_no_metadata(api: FakeSlackApi) -> None:
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        result = await transport.post_message("C1", "hello")
    [message] = api.messages
    assert message == {
        "channel": "C1",
        "ts": result.ts,
        "thread_ts": None,
        "text": "hello",
        "user": "UBOT",
        "bot_id": "BBOT",
        "metadata": None,
    }
    [call] = calls_of(api, "chat.postMessage")
    params = call["params"]
    assert isinstance(params, dict)
    assert "metadata" not in params
    assert "thread_ts" not in params


async def test_update_message_edits_the_bots_message(api: FakeSlackApi) -> None:
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        posted = await transport.post_message("C1", "draft")
        assert posted.ts is not None
        result = await transport.update_message("C1", posted.ts, "final")
    assert result == SlackSendResult(ok=True, channel="C1", ts=posted.ts)
    assert [(u["ts"], u["text"]) for u in api.updates] == [(posted.ts, "final")]
    assert api.messages[0]["text"] == "final"


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("unknown", "message_not_found"),
        ("deleted", "message_not_found"),
        ("someone_else", "cant_update_message"),
        ("too_old", "edit_window_closed"),
    ],
)
async def test_an_edit_slack_cannot_make_is_not_ok_with_its_code(
    api: FakeSlackApi, case: str, code: str
) -> None:
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        if case == "someone_else":
            ts = api.add_user_message("C1", "mine")
        else:
            posted = await transport.post_message("C1", "draft")
            assert posted.ts is not None
            ts = posted.ts if case != "unknown" else "1.000001"
        if case == "deleted":
            api.delete_message("C1", ts)
        if case == "too_old":
            api.fail_next("chat.update", "error", error="edit_window_closed")
        result = await transport.update_message("C1", ts, "edited")
    assert result == SlackSendResult(ok=False, channel="C1", ts=ts, error=code)
    assert api.updates == []


async def test_add_reaction_already_reacted_counts_as_done(api: FakeSlackApi) -> None:
    ts = api.add_user_message("C1", "hi")
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        assert await transport.add_reaction("C1", ts, "eyes") is True
        assert await transport.add_reaction("C1", ts, ":eyes:") is True  # already_reacted
        with pytest.raises(SlackError) as caught:
            await transport.add_reaction("C1", "1.000001", "eyes")
    assert caught.value.code == "message_not_found"
    assert api.reactions == [{"channel": "C1", "ts": ts, "name": "eyes", "user": "UBOT"}]
    assert [c["error"] for c in calls_of(api, "reactions.add")] == [
        None,
        "already_reacted",
        "message_not_found",
    ]


async def test_add_reaction_without_an_answer_is_false(api: FakeSlackApi) -> None:
    ts = api.add_user_message("C1", "hi")
    api.fail_next("reactions.add", "timeout_after_store", hang=0.05)
    async with SlackApiTransport(TOKEN, base_url=api.base_url, timeout=2) as transport:
        assert await transport.add_reaction("C1", ts, "eyes") is False
    assert len(api.reactions) == 1  # it did arrive; an acknowledgement is best effort


# -- find_message ------------------------------------------------------------------------------


async def test_find_message_reads_the_key_back_across_pages(api: FakeSlackApi) -> None:
    root = api.add_user_message("C1", "question")
    for n in range(250):  # the keyed message lands on the second page of 200
        api.add_user_message("C1", f"chatter {n}", user="U2", thread_ts=root)
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        other = await transport.post_message("C2", "elsewhere", key="k-1")
        posted = await transport.post_message("C1", "answer", thread_ts=root, key="k-1")
        before = len(calls_of(api, "conversations.replies"))
        found = await transport.find_message("C1", root, key="k-1")
        pages = calls_of(api, "conversations.replies")[before:]
        missing = await transport.find_message("C1", root, key="k-2")
    assert found == posted.ts
    assert found != other.ts
    assert missing is None
    assert len(pages) == 2
    first, second = (p["params"] for p in pages)
    assert isinstance(first, dict)
    assert isinstance(second, dict)
    assert first["ts"] == root
    assert first["limit"] in (200, "200")
    assert first["include_all_metadata"] in (True, "1", "true")
    assert "cursor" not in first
    assert second["cursor"]


async def test_find_message_in_a_thread_slack_does_not_know_is_none(api: FakeSlackApi) -> None:
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        assert await transport.find_message("C1", "1.000001", key="k") is None
    assert [c["error"] for c in api.calls] == ["thread_not_found"]


async def test_find_message_ignores_a_message_without_the_delivery_type(
    api: FakeSlackApi,
) -> None:
    root = api.add_user_message("C1", "question")
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        await transport.post_message("C1", "answer", thread_ts=root)
        assert await transport.find_message("C1", root, key="k") is None


# -- 429s ------------------------------------------------------------------------------------------


async def test_a_429_is_waited_out_for_retry_after(api: FakeSlackApi, sleeps: list[float]) -> None:
    api.fail_next("chat.postMessage", "rate_limit", times=2, retry_after=1.5)
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        result = await transport.post_message("C1", "hello")
    assert result.ok
    assert sleeps == [2.0, 2.0]  # Retry-After is whole seconds, rounded up
    assert [c["status"] for c in calls_of(api, "chat.postMessage")] == [429, 429, 200]
    assert len(api.posts) == 1


async def test_max_retries_zero_raises_at_the_first_429(
    api: FakeSlackApi, sleeps: list[float]
) -> None:
    posted = api.add_user_message("C1", "x")
    api.fail_next("chat.update", "rate_limit", retry_after=3)
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        with pytest.raises(SlackRateLimitedError) as caught:
            await transport.update_message("C1", posted, "y", max_retries=0)
    assert caught.value.retry_after == 3.0
    assert caught.value.code == "ratelimited"
    assert isinstance(caught.value, SlackError)
    assert caught.value.__cause__ is not None  # slack_sdk's error, chained
    assert sleeps == []
    assert len(calls_of(api, "chat.update")) == 1


async def test_429_retries_are_bounded_by_the_transport(
    api: FakeSlackApi, sleeps: list[float]
) -> None:
    api.fail_next("chat.postMessage", "rate_limit", times=5, retry_after=1)
    async with SlackApiTransport(TOKEN, base_url=api.base_url, max_retries=2) as transport:
        with pytest.raises(SlackRateLimitedError) as caught:
            await transport.post_message("C1", "hello")
        assert caught.value.retry_after == 1.0
        assert sleeps == [1.0, 1.0]
        # a call's own max_retries overrides the transport's
        result = await transport.post_message("C1", "hello", max_retries=5)
    assert result.ok
    assert sleeps == [1.0, 1.0, 1.0, 1.0]
    assert len(api.posts) == 1


async def test_a_429_on_reads_is_waited_out_too(api: FakeSlackApi, sleeps: list[float]) -> None:
    root = api.add_user_message("C1", "q")
    api.fail_next("conversations.replies", "rate_limit", retry_after=2)
    api.fail_next("auth.test", "rate_limit", retry_after=1)
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        assert await transport.find_message("C1", root, key="k") is None
        assert (await transport.auth_test()).user_id == "UBOT"
    assert sleeps == [2.0, 1.0]


# -- no answer ---------------------------------------------------------------------------------


async def test_a_post_that_times_out_is_unknown_and_never_resent(api: FakeSlackApi) -> None:
    root = api.add_user_message("C1", "q")
    api.fail_next("chat.postMessage", "timeout_after_store", hang=2.0)
    async with SlackApiTransport(TOKEN, base_url=api.base_url, timeout=0.3) as transport:
        result = await transport.post_message("C1", "answer", thread_ts=root, key="k-1")
        assert result == SlackSendResult(ok=False, channel="C1", unknown=True)
        # the message did arrive: its key finds it
        assert await transport.find_message("C1", root, key="k-1") == api.posts[0]["ts"]
    assert len(api.posts) == 1
    assert len(calls_of(api, "chat.postMessage")) == 1


async def test_a_post_whose_connection_drops_is_unknown(api: FakeSlackApi) -> None:
    api.fail_next("chat.postMessage", "timeout_after_store", hang=0.02)
    async with SlackApiTransport(TOKEN, base_url=api.base_url, timeout=5) as transport:
        result = await transport.post_message("C1", "answer")
    assert result.unknown
    assert not result.ok
    assert result.ts is None
    assert len(api.posts) == 1
    assert len(calls_of(api, "chat.postMessage")) == 1  # slack_sdk's retry handlers are off


async def test_an_edit_that_times_out_is_unknown(api: FakeSlackApi) -> None:
    async with SlackApiTransport(TOKEN, base_url=api.base_url, timeout=0.3) as transport:
        posted = await transport.post_message("C1", "draft")
        assert posted.ts is not None
        api.fail_next("chat.update", "timeout_after_store", hang=2.0)
        result = await transport.update_message("C1", posted.ts, "final")
    assert result == SlackSendResult(ok=False, channel="C1", ts=posted.ts, unknown=True)
    assert len(calls_of(api, "chat.update")) == 1
    assert api.messages[0]["text"] == "final"  # it did take effect


async def test_a_read_without_an_answer_raises(api: FakeSlackApi) -> None:
    api.fail_next("auth.test", "timeout_after_store", hang=0.02)
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        with pytest.raises(SlackError, match=r"Slack auth\.test failed: no answer"):
            await transport.auth_test()


async def test_nothing_listening_raises_instead_of_unknown() -> None:
    with FakeSlackApi(token=TOKEN) as gone:
        base_url = gone.base_url  # a port nobody listens on once it stops
    async with SlackApiTransport(TOKEN, base_url=base_url, timeout=2) as transport:
        with pytest.raises(SlackError, match="could not reach") as caught:
            await transport.post_message("C1", "hello")
    assert caught.value.code is None
    assert caught.value.__cause__ is not None


# -- errors and tokens -----------------------------------------------------------------------


async def test_other_errors_raise_slack_error_with_the_code(api: FakeSlackApi) -> None:
    api.fail_next("chat.postMessage", "error", error="channel_not_found", channel="C9")
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        assert (await transport.post_message("C1", "fine")).ok  # another channel
        with pytest.raises(SlackError) as caught:
            await transport.post_message("C9", "hello")
        with pytest.raises(SlackError) as too_long:
            await transport.post_message("C1", "x" * 40_001)
    assert str(caught.value) == "Slack chat.postMessage failed: channel_not_found"
    assert caught.value.code == "channel_not_found"
    assert type(caught.value).__name__ == "SlackError"
    assert caught.value.__cause__ is not None
    assert too_long.value.code == "msg_too_long"
    assert len(api.posts) == 1


async def test_a_wrong_token_raises_invalid_auth_without_the_token(api: FakeSlackApi) -> None:
    wrong = "xoxb-9999-8888-WrongSecret"
    async with SlackApiTransport(wrong, base_url=api.base_url) as transport:
        assert wrong not in repr(transport)
        with pytest.raises(SlackError) as caught:
            await transport.auth_test()
    assert caught.value.code == "invalid_auth"
    assert wrong not in chain_text(caught.value)
    assert "WrongSecret" not in chain_text(caught.value)


async def test_tokens_are_scrubbed_from_errors(api: FakeSlackApi) -> None:
    api.fail_next("chat.postMessage", "error", error=f"weird_{TOKEN}")
    api.fail_next("chat.update", "error", error="leak xoxp-123-456-abcdef")
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        with pytest.raises(SlackError) as first:
            await transport.post_message("C1", "hello")
        with pytest.raises(SlackError) as second:
            await transport.update_message("C1", "1.000001", "x")
    assert "SecretPart" not in chain_text(first.value)
    assert "<token>" in str(first.value)
    assert first.value.code is not None
    assert "SecretPart" not in first.value.code
    assert "abcdef" not in chain_text(second.value)


def test_scrub_slack_text() -> None:
    text = "a xoxb-1-2-AbC and XOXP-3-4 and xoxe.xoxp-1-zz and xapp-1-A-b, my-own-secret!"
    assert scrub_slack_text(text, "MY-OWN-secret", None, "") == (
        "a <token> and <token> and <token> and <token>, <token>!"
    )
    assert scrub_slack_text("short ab", "ab") == "short ab"  # too short to scrub literally
    assert scrub_slack_text("") == ""


# -- construction ---------------------------------------------------------------------------


async def test_the_token_comes_from_the_environment(
    api: FakeSlackApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(InvalidArgumentError, match=TOKEN_ENV):
        SlackApiTransport(base_url=api.base_url)
    monkeypatch.setenv(TOKEN_ENV, "   ")
    with pytest.raises(InvalidArgumentError, match=TOKEN_ENV):
        SlackApiTransport(base_url=api.base_url)
    with pytest.raises(InvalidArgumentError, match=TOKEN_ENV):
        SlackApiTransport("", base_url=api.base_url)
    monkeypatch.setenv(TOKEN_ENV, f" {TOKEN} ")
    async with SlackApiTransport(base_url=api.base_url) as transport:
        assert (await transport.auth_test()).user_id == "UBOT"
        assert TOKEN not in repr(transport)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1.0}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"base_url": " "}, "base_url"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        SlackApiTransport(TOKEN, **kwargs)  # type: ignore[arg-type]


async def test_bad_call_arguments_are_refused(api: FakeSlackApi) -> None:
    async with SlackApiTransport(TOKEN, base_url=api.base_url) as transport:
        with pytest.raises(InvalidArgumentError, match="max_retries"):
            await transport.post_message("C1", "x", max_retries=-1)
        with pytest.raises(InvalidArgumentError, match="channel"):
            await transport.post_message(" ", "x")
        with pytest.raises(InvalidArgumentError, match="ts"):
            await transport.update_message("C1", "", "x")
    assert api.calls == []


def test_base_url_defaults_to_slack_and_ends_with_a_slash() -> None:
    assert SlackApiTransport(TOKEN).base_url == "https://slack.com/api/"
    assert SlackApiTransport(TOKEN, base_url="http://h:1/api").base_url == "http://h:1/api/"
    assert repr(SlackApiTransport(TOKEN, timeout=2)) == (
        "SlackApiTransport(base_url='https://slack.com/api/', timeout=2.0)"
    )


def test_without_slack_sdk_it_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "slack_sdk", None)  # import slack_sdk -> ImportError
    with pytest.raises(InvalidArgumentError, match=r"pip install 'agency-runtime\[slack\]'"):
        SlackApiTransport(TOKEN)


def test_importing_the_module_imports_no_slack_sdk() -> None:
    code = (
        "import sys, turn_kit.slack._transport, turn_kit.slack._fake; "
        "print(sorted(m for m in ('slack_sdk', 'aiohttp') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


# -- sessions ----------------------------------------------------------------------------------


async def test_aclose_is_idempotent_and_the_transport_reopens(api: FakeSlackApi) -> None:
    transport = SlackApiTransport(TOKEN, base_url=api.base_url)
    await transport.aclose()  # nothing made yet
    assert (await transport.auth_test()).user_id == "UBOT"
    await transport.aclose()
    await transport.aclose()
    assert (await transport.auth_test()).user_id == "UBOT"  # a new session
    await transport.aclose()


@asyncio_only("an aiohttp session belongs to one asyncio event loop")
async def test_one_session_per_event_loop(api: FakeSlackApi) -> None:
    transport = SlackApiTransport(TOKEN, base_url=api.base_url)

    def in_another_loop() -> str:
        return asyncio.run(transport.auth_test()).user_id  # leaves its session behind

    assert await anyio.to_thread.run_sync(in_another_loop) == "UBOT"
    abandoned = transport._aio_session
    assert (await transport.auth_test()).user_id == "UBOT"  # a session of this loop
    assert abandoned.closed
    assert transport._aio_session is not abandoned
    session = transport._aio_session
    assert (await transport.auth_test()).user_id == "UBOT"
    assert transport._aio_session is session  # kept within a loop
    await transport.aclose()
    assert session.closed
