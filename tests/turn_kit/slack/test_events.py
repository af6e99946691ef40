"""The Slack events app through ASGI with signed requests, against the fake Web API.

The app's lifespan runs (as a server runs it), so its worker runs the queued turns on the
test's event loop, asyncio or trio.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agency_runtime import MemoryStore, SqliteStore, Store, Worker, agency
from turn_kit import TurnArgs, agency_ctx
from turn_kit.slack import (
    FakeSlackApi,
    SlackApiTransport,
    SlackTurnAdapter,
    create_slack_turn_adapter,
    slack_events_app,
)

from .support import (
    BOT,
    SECRET,
    echo,
    eventually,
    lifespan,
    message_event,
    post_event,
    signed_headers,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def turn_store(tmp_path: Any) -> Store:
    return SqliteStore(tmp_path / "turns.db")


def adapter_for(transport: SlackApiTransport, store: Store, **options: Any) -> SlackTurnAdapter:
    options.setdefault("namespace", "events")
    return create_slack_turn_adapter(transport=transport, store=store, **options)


async def raw_post(app: Any, body: bytes) -> int:
    """POST ``body`` in 64 KiB pieces straight through ASGI; the status the app answers (it
    may stop reading early, as a server lets it)."""
    pieces = [body[i : i + 65536] for i in range(0, len(body), 65536)]
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        piece = pieces.pop(0)
        return {"type": "http.request", "body": piece, "more_body": bool(pieces)}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    await app(scope, receive, send)
    return status[0]


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://slack.test")


def replies(api: FakeSlackApi, payload: dict[str, Any]) -> list[str]:
    event = payload["event"]
    return [m["text"] for m in api.replies(event["channel"], event.get("thread_ts") or event["ts"])]


async def test_url_verification_is_answered_with_its_challenge(
    transport: SlackApiTransport, turn_store: Store
) -> None:
    app = slack_events_app(
        adapter_for(transport, turn_store), signing_secret=SECRET, respond=echo, worker=False
    )
    async with client_for(app) as client:
        payload = {"type": "url_verification", "challenge": "3eZbrw1aB", "token": "t"}
        response = await post_event(client, payload)
    assert response.status_code == 200
    assert response.json() == {"challenge": "3eZbrw1aB"}


async def test_unsigned_wrong_and_stale_requests_are_refused_and_run_nothing(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = adapter_for(transport, turn_store)
    app = slack_events_app(adapter, signing_secret=SECRET, respond=echo, worker=False)
    payload = message_event("hi", channel="D1")
    body = json.dumps(payload).encode()
    async with client_for(app) as client:
        missing = await client.post("/", content=body)
        wrong = await client.post("/", content=body, headers=signed_headers(body, secret="nope"))
        stale = await client.post("/", content=body, headers=signed_headers(body, at=1_000_000_000))
        tampered_headers = signed_headers(body)
        tampered = await client.post("/", content=body + b" ", headers=tampered_headers)
        get = await client.get("/")
        not_json = await client.post("/", content=b"[1]", headers=signed_headers(b"[1]"))
    assert [r.status_code for r in (missing, wrong, stale, tampered)] == [401] * 4
    assert [r.json()["error"] for r in (missing, wrong, stale, tampered)] == [
        "missing signature",
        "wrong signature",
        "stale timestamp",
        "wrong signature",
    ]
    assert (get.status_code, not_json.status_code) == (405, 400)
    assert await raw_post(app, b"x" * ((1 << 20) + 1)) == 400
    assert await adapter.turn_record(adapter.run_id_of((await adapter.read(payload))[0])) is None  # type: ignore[arg-type]
    assert api.posts == []


async def test_an_event_is_acked_before_its_turn_runs_and_answered_once_despite_retries(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = adapter_for(transport, turn_store)
    release = anyio.Event()
    started: list[str] = []

    async def slow(turn: TurnArgs) -> str:
        started.append(turn.input)
        await release.wait()  # the model takes longer than Slack waits
        return echo(turn)

    app = slack_events_app(adapter, signing_secret=SECRET, respond=slow, ctx=agency_ctx())
    payload = message_event(f"<@{BOT}> hello")
    mention = message_event(f"<@{BOT}> hello", ts=payload["event"]["ts"], kind="app_mention")
    async with lifespan(app), client_for(app) as client:
        first = await post_event(client, payload)
        assert first.status_code == 200
        assert first.json()["status"] == "queued"
        run_id = first.json()["run_id"]
        # Slack gave up waiting: it retries, and the app_mention of the same message arrives.
        again = await post_event(client, payload, retry=1)
        other = await post_event(client, mention)
        assert [r.json()["run_id"] for r in (again, other)] == [run_id, run_id]
        await eventually(lambda: started, "the worker starts the turn")
        assert api.posts == []  # every answer above came while the turn was still running
        release.set()
        result = await agency.runs.wait(run_id, store=turn_store, timeout=20)
        assert result.status == "completed"
        late = await post_event(client, payload, retry=2)  # a retry after the turn ended
        assert late.json()["run_id"] == run_id
        await anyio.lowlevel.checkpoint()
    assert replies(api, payload) == ["re hello (after 0)"]
    assert started == ["hello"]


async def test_turns_of_a_thread_recall_the_ones_before(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = adapter_for(transport, turn_store)
    app = slack_events_app(adapter, signing_secret=SECRET, respond=echo)
    root = message_event("one", channel="D1")
    thread_ts = root["event"]["ts"]
    async with lifespan(app), client_for(app) as client:
        for payload in (
            root,
            message_event("two", channel="D1", thread_ts=thread_ts),
            message_event("three", channel="D1", thread_ts=thread_ts),
        ):
            run_id = (await post_event(client, payload)).json()["run_id"]
            await agency.runs.wait(run_id, store=turn_store, timeout=20)
    assert replies(api, root) == ["re one (after 0)", "re two (after 1)", "re three (after 2)"]


async def test_skips_and_other_events_are_answered_200(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    app = slack_events_app(
        adapter_for(transport, turn_store), signing_secret=SECRET, respond=echo, worker=False
    )
    async with client_for(app) as client:
        bot = await post_event(client, message_event(f"<@{BOT}> x", bot_id="B1"))
        rate = await post_event(client, {"type": "app_rate_limited", "minute_rate_limited": 1})
    assert bot.json() == {"ok": True, "status": "skipped", "reason": "bot message"}
    assert rate.json() == {"ok": True, "status": "ignored"}


async def test_a_store_that_fails_gets_a_500_so_slack_retries(
    transport: SlackApiTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore()
    adapter = adapter_for(transport, store)

    async def down(record: Any) -> Any:
        raise OSError("disk gone")

    monkeypatch.setattr(store, "enqueue_run", down)
    app = slack_events_app(adapter, signing_secret=SECRET, respond=echo, worker=False)
    async with client_for(app) as client:
        response = await post_event(client, message_event("hi", channel="D1"))
    assert response.status_code == 500


async def test_without_the_apps_worker_a_worker_elsewhere_runs_the_turns(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = adapter_for(transport, turn_store)
    app = slack_events_app(adapter, signing_secret=SECRET, respond=echo, worker=False)
    payload = message_event("hi", channel="D1")
    async with client_for(app) as client:
        run_id = (await post_event(client, payload)).json()["run_id"]
    record = await adapter.turn_record(run_id)
    assert record is not None
    assert record.status == "queued"
    assert record.queue == "turn-kit-slack-events"
    worker = Worker(turn_store, queues=[adapter.queue], poll=0.05)
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run)
        result = await agency.runs.wait(run_id, store=turn_store, timeout=20)
        group.cancel_scope.cancel()
    assert result.status == "completed"
    assert replies(api, payload) == ["re hi (after 0)"]


async def test_turns_of_a_thread_claimed_together_run_in_message_order(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    # Queued while no worker runs, then claimed in one poll by a worker with room for all:
    # each turn waits for the earlier ones of its thread and recalls what they saved.
    adapter = adapter_for(transport, turn_store)
    app = slack_events_app(adapter, signing_secret=SECRET, respond=echo, worker=False)
    root = message_event("one", channel="D1")
    thread_ts = root["event"]["ts"]
    payloads = [root] + [
        message_event(word, channel="D1", thread_ts=thread_ts) for word in ("two", "three", "four")
    ]
    async with client_for(app) as client:
        run_ids = [(await post_event(client, p)).json()["run_id"] for p in reversed(payloads)]
    worker = Worker(turn_store, queues=[adapter.queue], poll=0.05, concurrency=8)
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run)
        for run_id in run_ids:
            assert (await agency.runs.wait(run_id, store=turn_store, timeout=20)).ok
        group.cancel_scope.cancel()
    assert replies(api, root) == [
        "re one (after 0)", "re two (after 1)", "re three (after 2)", "re four (after 3)"
    ]  # fmt: skip


async def test_an_earlier_turn_that_was_cancelled_does_not_hold_its_thread_up(
    api: FakeSlackApi, transport: SlackApiTransport, turn_store: Store
) -> None:
    adapter = adapter_for(transport, turn_store)
    root = message_event("one", channel="D1")
    later = message_event("two", channel="D1", thread_ts=root["event"]["ts"])
    first = await adapter.enqueue(root)
    assert first.run_id is not None
    second, _ = await adapter.read(later)
    assert second is not None
    with anyio.fail_after(20):
        await agency.runs.cancel(first.run_id, store=turn_store)
        await adapter.after_earlier_turns(second)  # the earlier turn is final: no wait


def test_bad_app_options_are_refused(tmp_path: Any) -> None:
    adapter = create_slack_turn_adapter(namespace="events", store=MemoryStore())
    with pytest.raises(Exception, match="signing_secret"):
        slack_events_app(adapter, signing_secret="", respond=echo)
    with pytest.raises(Exception, match="create_slack_turn_adapter"):
        slack_events_app(object(), signing_secret="s", respond=echo)  # type: ignore[arg-type]
    with pytest.raises(Exception, match="respond"):
        slack_events_app(adapter, signing_secret="s", respond=None)  # type: ignore[arg-type]
    with pytest.raises(Exception, match="lease"):
        slack_events_app(adapter, signing_secret="s", respond=echo, lease=0)


# -- fuzz: arbitrary signed envelopes never make the app fail -------------------------------

_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=12)
_json = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_event = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "app_mention"]) | _json},
    optional={
        "channel": st.sampled_from(["C1", "D1"]) | _json,
        "user": st.sampled_from(["U1", BOT]) | _json,
        "text": st.text(max_size=20) | _json,
        "ts": st.sampled_from(["1800000001.000001", "1800000001.000002"]) | _json,
        "thread_ts": st.sampled_from(["1800000001.000001"]) | _json,
        "subtype": st.sampled_from(["bot_message", "file_share"]) | _json,
        "bot_id": _json,
        "channel_type": st.sampled_from(["im", "channel"]) | _json,
    },
)
_envelope = st.one_of(
    st.fixed_dictionaries({"type": st.just("event_callback"), "event": _event | _json}),
    st.fixed_dictionaries({"type": st.just("url_verification"), "challenge": _json}),
    st.dictionaries(st.text(max_size=8), _json, max_size=4),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(payloads=st.lists(_envelope, min_size=1, max_size=4))
def test_fuzzed_envelopes_get_no_unhandled_error(payloads: list[Any]) -> None:
    async def main() -> None:
        store = MemoryStore()
        adapter = create_slack_turn_adapter(
            namespace="fuzz", transport=Recorder(), bot_user_id=BOT, store=store
        )
        app = slack_events_app(adapter, signing_secret=SECRET, respond=echo, worker=False)
        async with client_for(app) as client:
            for payload in payloads:
                response = await post_event(client, payload)
                assert response.status_code in (200, 400), response.text
                body = response.json()
                if body.get("status") == "queued":
                    record = await adapter.turn_record(body["run_id"])
                    assert record is not None
                    assert record.status == "queued"

    anyio.run(main)


class Recorder:
    """A transport that is never reached (nothing runs without a worker)."""

    async def post_message(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no turn runs in the fuzz")
