"""The Slack adapter: turns in threads, memory per thread, chunks posted once, streaming.

Every test talks to :class:`FakeSlackApi` over real HTTP through :class:`SlackApiTransport`.
"""

from __future__ import annotations

from typing import Any

import pytest

from agency_runtime import MemoryStore, RunFailedError, Store, agency
from agency_runtime.testing import FakeModel
from turn_kit import (
    ProactiveResult,
    TurnArgs,
    _pace,
    agency_ctx,
    conversation_key,
    send_proactive,
)
from turn_kit.slack import (
    FakeSlackApi,
    SlackApiTransport,
    SlackDelivery,
    SlackTurnAdapter,
    create_slack_turn_adapter,
)
from turn_kit.slack import _transport as transport_module

from .support import BOT, CHANNEL, TOKEN, echo, message_event, next_ts

pytestmark = pytest.mark.anyio


@pytest.fixture
def turn_store() -> Store:
    return MemoryStore()


def make(transport: SlackApiTransport, store: Store, **options: Any) -> SlackTurnAdapter:
    options.setdefault("namespace", "helper")
    return create_slack_turn_adapter(transport=transport, store=store, **options)


def texts(api: FakeSlackApi, thread_ts: str, channel: str = CHANNEL) -> list[str]:
    return [m["text"] for m in api.replies(channel, thread_ts)]


async def test_a_mention_is_answered_in_its_thread_with_memory_per_thread(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = make(transport, turn_store)
    ctx = agency_ctx(turn_store)
    first = message_event(f"<@{BOT}> hello")
    root = first["event"]["ts"]
    outcome = await adapter.handle(ctx, payload=first, respond=echo)
    assert outcome.status == "handled"
    assert outcome.result is not None
    assert outcome.result.memory_saved
    assert texts(api, root) == ["re hello (after 0)"]
    # A reply in the thread continues the conversation (and needs the mention: it is a channel).
    follow = message_event(f"<@{BOT}> again", thread_ts=root)
    await adapter.handle(ctx, payload=follow, respond=echo)
    assert texts(api, root) == ["re hello (after 0)", "re again (after 1)"]
    # Another top-level message is another conversation.
    other = message_event(f"<@{BOT}> fresh")
    await adapter.handle(ctx, payload=other, respond=echo)
    assert texts(api, other["event"]["ts"]) == ["re fresh (after 0)"]
    assert adapter.conversation(outcome.message) == {  # type: ignore[arg-type]
        "transport": "slack",
        "id": conversation_key(CHANNEL, root),
    }


async def test_a_redelivered_message_gets_the_stored_result_not_a_second_reply(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = make(transport, turn_store)
    event = message_event("hi", channel="D1")
    calls: list[str] = []

    def respond(turn: TurnArgs) -> str:
        calls.append(turn.input)
        return "hello"

    ctx = agency_ctx(turn_store)
    for _ in range(3):
        outcome = await adapter.handle(ctx, payload=event, respond=respond)
        assert outcome.status == "handled"
    assert calls == ["hi"]
    assert len(api.posts) == 1


async def test_skipped_events_get_no_turn_and_no_post(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = make(transport, turn_store, allowed_channels=["C1", "D1"])
    ctx = agency_ctx(turn_store)
    cases = {
        "bot message": message_event(f"<@{BOT}> x", bot_id="B2"),
        "own message": message_event("x", user=BOT, channel="D1"),
        "edited message": message_event(
            "x", subtype="message_changed", message={"text": f"<@{BOT}> y", "user": "U1"}
        ),
        "channel not allowed": message_event(f"<@{BOT}> x", channel="C9"),
        "not addressed to the bot": message_event("just chatting"),
        "not a Slack message event": {"type": "event_callback", "event": {"type": "team_join"}},
    }
    for reason, payload in cases.items():
        outcome = await adapter.handle(ctx, payload=payload, respond=echo)
        assert (outcome.status, outcome.reason) == ("skipped", reason)
    assert api.posts == []


async def test_the_bots_identity_comes_from_auth_test_once(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = make(transport, turn_store)
    ctx = agency_ctx(turn_store)
    await adapter.handle(ctx, payload=message_event(f"<@{BOT}> a"), respond=echo)
    await adapter.handle(ctx, payload=message_event(f"<@{BOT}> b"), respond=echo)
    assert [c["method"] for c in api.calls].count("auth.test") == 1
    identity = await adapter.identity()
    assert identity is not None
    assert identity.user_id == BOT


async def test_acknowledgements_long_replies_and_escaping_go_into_the_thread(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = make(transport, turn_store, chunk_limit=20, reaction="eyes")
    root = api.add_user_message("D1", "hi")
    event = message_event("hi", channel="D1", ts=root)

    async def respond(turn: TurnArgs) -> str:
        await turn.acknowledge("On it <3")
        return "line one is long\nline two <!channel> & more"

    outcome = await adapter.handle(agency_ctx(turn_store), payload=event, respond=respond)
    assert outcome.result is not None
    assert outcome.result.acknowledgements == 1
    assert texts(api, root, "D1") == [
        "On it &lt;3",
        "line one is long",
        "line two &lt;!channel&gt;",
        "&amp; more",
    ]
    receipt = outcome.result.receipt
    assert isinstance(receipt, SlackDelivery)
    assert receipt.ok
    assert len(receipt.message_ts) == 3
    posted = api.replies("D1", root)
    assert all(m["thread_ts"] == root for m in posted)
    assert all(m["metadata"]["event_type"] == "turn_kit_delivery" for m in posted)
    assert [(r["channel"], r["ts"], r["name"]) for r in api.reactions] == [("D1", root, "eyes")]


async def test_a_chunk_posted_before_a_crash_is_found_not_posted_again(
    api: FakeSlackApi,
    transport: SlackApiTransport,
    turn_store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The post reached Slack but its journal entry was never written (the process died
    between the two): the retried turn finds the chunk by its key and posts only the rest."""
    adapter = make(transport, turn_store, chunk_limit=10)
    event = message_event("hi", channel="D1")
    root = event["event"]["ts"]
    real = SlackApiTransport.post_message
    posts = 0

    async def dying(self: SlackApiTransport, *args: Any, **kwargs: Any) -> Any:
        nonlocal posts
        result = await real(self, *args, **kwargs)
        posts += 1
        if posts == 2:
            raise RuntimeError("killed after the second chunk reached Slack")
        return result

    monkeypatch.setattr(SlackApiTransport, "post_message", dying)
    ctx = agency_ctx(turn_store)
    with pytest.raises(RuntimeError, match="killed"):
        await adapter.handle(ctx, payload=event, respond=lambda turn: "aaaa bbbb cccc dddd")
    assert texts(api, root, "D1") == ["aaaa bbbb", "cccc dddd"]
    monkeypatch.setattr(SlackApiTransport, "post_message", real)
    outcome = await adapter.handle(ctx, payload=event, respond=lambda turn: "never asked")
    assert outcome.result is not None
    assert outcome.result.reply == "aaaa bbbb cccc dddd"
    assert texts(api, root, "D1") == ["aaaa bbbb", "cccc dddd"]  # nothing posted twice
    assert len(api.posts) == 2
    assert [c["method"] for c in api.calls].count("conversations.replies") == 1


async def test_a_post_that_timed_out_is_looked_for_and_never_resent(
    api: FakeSlackApi, turn_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = SlackApiTransport(TOKEN, base_url=api.base_url, timeout=0.5)
    try:
        adapter = make(transport, turn_store)
        api.fail_next("chat.postMessage", "timeout_after_store", hang=1.5)
        event = message_event("hi", channel="D1")
        outcome = await adapter.handle(agency_ctx(turn_store), payload=event, respond=echo)
        assert outcome.result is not None
        receipt = outcome.result.receipt
        assert receipt.ok  # found by its key after the timeout
        assert texts(api, event["event"]["ts"], "D1") == ["re hi (after 0)"]
        assert len(api.posts) == 1
    finally:
        await transport.aclose()


async def test_a_rate_limited_post_waits_for_retry_after(
    api: FakeSlackApi,
    transport: SlackApiTransport,
    turn_store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []

    async def no_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(transport_module, "_sleep", no_sleep)
    api.fail_next("chat.postMessage", "rate_limit", retry_after=7)
    adapter = make(transport, turn_store)
    event = message_event("hi", channel="D1")
    await adapter.handle(agency_ctx(turn_store), payload=event, respond=echo)
    assert waits == [7]
    assert texts(api, event["event"]["ts"], "D1") == ["re hi (after 0)"]


class Clock:
    """The preview's pacing clock, moving only when told."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def test_a_streamed_reply_is_one_message_edited_at_a_pace(
    api: FakeSlackApi,
    transport: SlackApiTransport,
    turn_store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(_pace, "_now", clock)
    monkeypatch.setattr(_pace, "_sleep", clock.sleep)
    adapter = make(transport, turn_store, stream=True, stream_interval=1.0)
    event = message_event("hi", channel="D1")
    root = event["event"]["ts"]

    async def respond(turn: TurnArgs) -> str:
        assert turn.on_token is not None
        await turn.on_token("Hello")  # posted at once
        await turn.on_token(" there")  # within the interval: not edited
        clock.now += 1.5
        await turn.on_token(", friend")  # due: edited
        clock.now += 1.5
        api.fail_next("chat.update", "rate_limit", retry_after=30)
        await turn.on_token(" <3")  # a 429: the edits pause for 30 s
        clock.now += 2
        await turn.on_token(".")  # inside the 429's pause: not edited
        return "Hello there, friend <3. Done."

    outcome = await adapter.handle(agency_ctx(turn_store), payload=event, respond=respond)
    assert outcome.result is not None
    assert texts(api, root, "D1") == ["Hello there, friend &lt;3. Done."]
    assert len(api.posts) == 1
    assert [u["text"] for u in api.updates] == [
        "Hello there, friend",
        "Hello there, friend &lt;3. Done.",  # delivery: the preview shows the reply
    ]
    assert outcome.result.receipt.message_ts == [api.posts[0]["ts"]]
    assert clock.slept == [28.0]  # the final edit waited out the rest of the 429's pause


async def test_send_proactive_posts_into_a_slack_thread_once(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    root = api.add_user_message("C1", "earlier")
    conversation = {"transport": "slack", "id": conversation_key("C1", root)}

    @agency.entry
    async def remind() -> ProactiveResult:
        sent = await send_proactive(
            agency_ctx(),
            namespace="helper",
            conversation=conversation,
            text="Your report is due <today>",
            transport=transport,
        )
        assert isinstance(sent.receipt, SlackDelivery)  # the live receipt, inside the run
        return sent

    result = await agency.run(remind, run_id="remind-1", store=turn_store)
    again = await agency.run(remind, run_id="remind-1", store=turn_store)
    assert result.value.memory_saved
    assert again.value.receipt == result.value.receipt
    assert result.value.receipt["message_ts"] == [api.replies("C1", root)[0]["ts"]]
    assert texts(api, root) == ["Your report is due &lt;today&gt;"]
    with pytest.raises(Exception, match="has no thread"):
        await send_proactive(
            agency_ctx(turn_store),
            namespace="helper",
            conversation={"transport": "slack", "id": "C1"},
            text="x",
            transport=transport,
            store=turn_store,
        )


async def test_run_turn_outside_a_run_is_refused(
    transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = make(transport, turn_store)
    message = (await adapter.read(message_event("hi", channel="D1")))[0]
    assert message is not None
    with pytest.raises(Exception, match="inside a run"):
        await adapter.run_turn(agency_ctx(turn_store), message, echo)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"chunk_limit": 0}, "chunk_limit"),
        ({"stream": "yes"}, "stream"),
        ({"require_mention": 1}, "require_mention"),
        ({"stream_interval": -1}, "stream_interval"),
        ({"bot_user_id": " "}, "bot_user_id"),
        ({"reaction": ":"}, "reaction"),
        ({"allowed_channels": []}, "allowed_channels"),
        ({"transport": object()}, "post_message"),
        ({"namespace": "Not Valid"}, "lowercase slug"),
        ({"model": FakeModel("slack-fake")}, r"FakeModel's \.model \(this one's name is"),
    ],
)
def test_bad_options_are_refused_with_what_to_do(options: dict[str, Any], match: str) -> None:
    options.setdefault("namespace", "helper")
    with pytest.raises(Exception, match=match):
        create_slack_turn_adapter(**options)


async def test_a_failed_turn_raises_its_error(
    transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = make(transport, turn_store)

    def broken(turn: TurnArgs) -> str:
        raise ValueError("model down")

    with pytest.raises((ValueError, RunFailedError), match="model down"):
        await adapter.handle(
            agency_ctx(turn_store), payload=message_event("x", channel="D1"), respond=broken
        )
    _ = next_ts
