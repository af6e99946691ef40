"""FakeSlackApi on its own, through plain httpx: auth, the methods, paging and the faults."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import loopback_tls
from turn_kit.slack._fake import FakeSlackApi

TOKEN = "xoxb-fake-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def api() -> Iterator[FakeSlackApi]:
    with FakeSlackApi() as fake:
        yield fake


@pytest.fixture
def http(api: FakeSlackApi) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=api.base_url, headers=AUTH, timeout=5, verify=loopback_tls()
    ) as client:
        yield client


def call(http: httpx.Client, method: str, **params: Any) -> dict[str, Any]:
    """POST ``params`` as JSON; the answer's body (HTTP 200 expected)."""
    response = http.post(method, json=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


# -- lifecycle and auth --------------------------------------------------------------------


def test_lifecycle_port_and_base_url() -> None:
    api = FakeSlackApi()
    assert repr(api) == "FakeSlackApi(stopped)"
    with pytest.raises(RuntimeError, match="not running"):
        _ = api.port
    assert api.start() is api.start()  # idempotent
    assert api.base_url == f"http://127.0.0.1:{api.port}/api/"
    assert TOKEN not in repr(api)
    api.stop()
    api.stop()
    with pytest.raises(RuntimeError):
        _ = api.base_url


def test_the_token_is_checked_as_slack_does(api: FakeSlackApi) -> None:
    with httpx.Client(base_url=api.base_url, timeout=5, verify=loopback_tls()) as anonymous:
        missing = anonymous.post("auth.test")
        wrong = anonymous.post("auth.test", headers={"Authorization": "Bearer xoxb-wrong"})
        as_form = anonymous.post("auth.test", data={"token": TOKEN})
        as_query = anonymous.get("auth.test", params={"token": TOKEN})
        unknown = anonymous.post("chat.nope", headers=AUTH)
        elsewhere = anonymous.get(f"http://127.0.0.1:{api.port}/other")
    assert (missing.status_code, missing.json()) == (200, {"ok": False, "error": "not_authed"})
    assert (wrong.status_code, wrong.json()) == (200, {"ok": False, "error": "invalid_auth"})
    assert as_form.json()["ok"] is True
    assert as_query.json()["ok"] is True
    assert unknown.status_code == 404
    assert unknown.json() == {"ok": False, "error": "unknown_method", "req_method": "chat.nope"}
    assert elsewhere.status_code == 404
    assert [c["error"] for c in api.calls] == [
        "not_authed",
        "invalid_auth",
        None,
        None,
        "unknown_method",
    ]
    assert all("token" not in c["params"] for c in api.calls)


def test_auth_test_names_the_bot() -> None:
    with (
        FakeSlackApi(token="xoxb-t-1", bot_user_id="U9", bot_id="B9", team_id="T9") as api,
        httpx.Client(base_url=api.base_url, timeout=5, verify=loopback_tls()) as http,
    ):
        body = http.post("auth.test", headers={"Authorization": "Bearer xoxb-t-1"}).json()
    assert body["ok"] is True
    assert (body["user_id"], body["bot_id"], body["team_id"]) == ("U9", "B9", "T9")
    assert body["user"] == "bot"


# -- chat.postMessage ---------------------------------------------------------------------------


def test_post_accepts_json_form_and_query_and_ts_strictly_increase(
    api: FakeSlackApi, http: httpx.Client
) -> None:
    meta = {"event_type": "turn_kit_delivery", "event_payload": {"key": "k"}}
    as_json = call(http, "chat.postMessage", channel="C1", text="one", metadata=meta)
    as_form = http.post(
        "chat.postMessage", data={"channel": "C1", "text": "two", "metadata": json.dumps(meta)}
    ).json()
    as_query = http.get("chat.postMessage", params={"channel": "C1", "text": "three"}).json()
    stamps = [b["ts"] for b in (as_json, as_form, as_query)]
    assert all(b["ok"] and b["channel"] == "C1" for b in (as_json, as_form, as_query))
    assert stamps == sorted(stamps, key=lambda ts: tuple(map(int, ts.split("."))))
    assert len(set(stamps)) == 3
    for ts in stamps:
        seconds, micros = ts.split(".")
        assert seconds.isdigit()
        assert len(micros) == 6
    assert as_json["message"]["metadata"] == meta
    assert as_json["message"]["user"] == "UBOT"
    assert as_json["message"]["bot_id"] == "BBOT"
    assert [p["metadata"] for p in api.posts] == [meta, meta, None]
    assert [m["text"] for m in api.messages] == ["one", "two", "three"]


def test_post_refusals(api: FakeSlackApi, http: httpx.Client) -> None:
    assert call(http, "chat.postMessage", channel="C1")["error"] == "no_text"
    assert call(http, "chat.postMessage", channel="C1", text="")["error"] == "no_text"
    long = call(http, "chat.postMessage", channel="C1", text="x" * 40_001)
    assert long["error"] == "msg_too_long"
    assert call(http, "chat.postMessage", channel="C1", text="x" * 40_000)["ok"] is True
    assert call(http, "chat.postMessage", text="x")["error"] == "channel_not_found"
    bad = call(http, "chat.postMessage", channel="C1", text="x", metadata="{nope")
    assert bad["error"] == "invalid_metadata_format"
    odd = call(http, "chat.postMessage", channel="C1", text="x", metadata={"event_type": "t"})
    assert odd["error"] == "invalid_metadata_schema"
    assert len(api.posts) == 1


def test_a_reply_to_a_reply_lands_in_the_root_thread(api: FakeSlackApi, http: httpx.Client) -> None:
    root = api.add_user_message("C1", "question")
    reply = api.add_user_message("C1", "more", user="U2", thread_ts=root)
    body = call(http, "chat.postMessage", channel="C1", text="answer", thread_ts=reply)
    assert body["message"]["thread_ts"] == root
    assert [m["text"] for m in api.replies("C1", root)] == ["answer"]  # the bot's only
    elsewhere = call(http, "chat.postMessage", channel="C1", text="x", thread_ts="5.000001")
    assert elsewhere["ok"] is True  # a thread the fake does not know is accepted


# -- chat.update and reactions.add ------------------------------------------------------------


def test_update_edits_only_the_bots_messages(api: FakeSlackApi, http: httpx.Client) -> None:
    ts = call(http, "chat.postMessage", channel="C1", text="draft")["ts"]
    theirs = api.add_user_message("C1", "mine")
    edited = call(http, "chat.update", channel="C1", ts=ts, text="final")
    assert edited["ok"] is True
    assert (edited["ts"], edited["text"]) == (ts, "final")
    assert call(http, "chat.update", channel="C1", ts="1.000001", text="x")["error"] == (
        "message_not_found"
    )
    assert call(http, "chat.update", channel="C2", ts=ts, text="x")["error"] == "message_not_found"
    assert call(http, "chat.update", channel="C1", ts=theirs, text="x")["error"] == (
        "cant_update_message"
    )
    assert call(http, "chat.update", channel="C1", ts=ts)["error"] == "no_text"
    [update] = api.updates
    assert (update["channel"], update["ts"], update["text"]) == ("C1", ts, "final")
    assert isinstance(update["at"], float)
    assert api.messages[0]["text"] == "final"
    api.delete_message("C1", ts)
    assert call(http, "chat.update", channel="C1", ts=ts, text="x")["error"] == (
        "message_not_found"
    )
    with pytest.raises(KeyError):
        api.delete_message("C1", ts)


def test_reactions_add_records_once(api: FakeSlackApi, http: httpx.Client) -> None:
    ts = api.add_user_message("C1", "hi")
    form = {"channel": "C1", "timestamp": ts, "name": "eyes"}
    assert http.post("reactions.add", data=form).json() == {"ok": True}
    assert http.post("reactions.add", data=form).json()["error"] == "already_reacted"
    assert http.post("reactions.add", data={**form, "name": "tada"}).json()["ok"] is True
    missing = http.post("reactions.add", data={**form, "timestamp": "1.000001"}).json()
    assert missing["error"] == "message_not_found"
    assert api.reactions == [
        {"channel": "C1", "ts": ts, "name": "eyes", "user": "UBOT"},
        {"channel": "C1", "ts": ts, "name": "tada", "user": "UBOT"},
    ]


# -- conversations.replies --------------------------------------------------------------------


def test_replies_returns_the_thread_oldest_first_metadata_on_request(
    api: FakeSlackApi, http: httpx.Client
) -> None:
    root = api.add_user_message("C1", "question")
    meta = {"event_type": "turn_kit_delivery", "event_payload": {"key": "k"}}
    call(http, "chat.postMessage", channel="C1", text="answer", thread_ts=root, metadata=meta)
    api.add_user_message("C1", "thanks", thread_ts=root)
    api.add_user_message("C1", "unrelated")
    plain = http.get("conversations.replies", params={"channel": "C1", "ts": root}).json()
    assert [m["text"] for m in plain["messages"]] == ["question", "answer", "thanks"]
    assert all("metadata" not in m for m in plain["messages"])
    assert plain["messages"][0]["reply_count"] == 2
    assert plain["messages"][0]["thread_ts"] == root
    assert plain["messages"][1]["parent_user_id"] == "U1"
    assert plain["has_more"] is False
    assert plain["response_metadata"]["next_cursor"] == ""
    with_meta = http.get(
        "conversations.replies",
        params={"channel": "C1", "ts": root, "include_all_metadata": "1"},
    ).json()
    assert [m.get("metadata") for m in with_meta["messages"]] == [None, meta, None]
    by_reply = http.get(
        "conversations.replies", params={"channel": "C1", "ts": plain["messages"][2]["ts"]}
    ).json()
    assert [m["text"] for m in by_reply["messages"]] == ["question", "answer", "thanks"]


def test_replies_pages_with_cursors(api: FakeSlackApi, http: httpx.Client) -> None:
    root = api.add_user_message("C1", "r")
    for n in range(4):
        api.add_user_message("C1", str(n), thread_ts=root)
    seen: list[str] = []
    cursor = ""
    pages = 0
    while True:
        params = {"channel": "C1", "ts": root, "limit": "2", "cursor": cursor}
        body = http.post("conversations.replies", data=params).json()
        assert body["ok"] is True
        seen += [m["text"] for m in body["messages"]]
        pages += 1
        cursor = body["response_metadata"]["next_cursor"]
        assert body["has_more"] is bool(cursor)
        if not cursor:
            break
    assert (seen, pages) == (["r", "0", "1", "2", "3"], 3)


def test_replies_refusals(api: FakeSlackApi, http: httpx.Client) -> None:
    root = api.add_user_message("C1", "r")
    assert call(http, "conversations.replies", channel="C1", ts="1.000001")["error"] == (
        "thread_not_found"
    )
    assert call(http, "conversations.replies", channel="C2", ts=root)["error"] == (
        "thread_not_found"
    )
    assert call(http, "conversations.replies", channel="C1", ts=root, cursor="zz!")["error"] == (
        "invalid_cursor"
    )


# -- faults ------------------------------------------------------------------------------------


def test_rate_limit_is_a_429_with_whole_seconds(api: FakeSlackApi, http: httpx.Client) -> None:
    api.fail_next("chat.postMessage", "rate_limit", times=2, retry_after=1.2)
    for _ in range(2):
        limited = http.post("chat.postMessage", json={"channel": "C1", "text": "x"})
        assert limited.status_code == 429
        assert limited.headers["Retry-After"] == "2"
        assert limited.json() == {"ok": False, "error": "ratelimited"}
    assert call(http, "chat.postMessage", channel="C1", text="x")["ok"] is True
    assert [c["status"] for c in api.calls] == [429, 429, 200]
    assert len(api.posts) == 1


def test_error_fault_only_for_its_channel(api: FakeSlackApi, http: httpx.Client) -> None:
    api.fail_next("chat.postMessage", "error", error="not_in_channel", channel="C2")
    assert call(http, "chat.postMessage", channel="C1", text="x")["ok"] is True
    assert call(http, "chat.postMessage", channel="C2", text="x")["error"] == "not_in_channel"
    assert call(http, "chat.postMessage", channel="C2", text="x")["ok"] is True
    assert [p["channel"] for p in api.posts] == ["C1", "C2"]


def test_timeout_after_store_stores_then_drops_the_connection(
    api: FakeSlackApi, http: httpx.Client
) -> None:
    api.fail_next("chat.postMessage", "timeout_after_store", hang=0.05)
    started = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        http.post("chat.postMessage", json={"channel": "C1", "text": "x"})
    assert time.monotonic() - started >= 0.04
    assert len(api.posts) == 1
    assert [c["status"] for c in api.calls] == [0]


def test_stop_ends_a_withheld_answer() -> None:
    api = FakeSlackApi().start()
    api.fail_next("auth.test", "timeout_after_store", hang=30)
    with (
        httpx.Client(
            base_url=api.base_url, headers=AUTH, timeout=0.2, verify=loopback_tls()
        ) as http,
        pytest.raises(httpx.ReadTimeout),
    ):
        http.post("auth.test")
    started = time.monotonic()
    api.stop()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("kind", "kwargs", "message"),
    [
        ("explode", {}, "unknown failure kind"),
        ("rate_limit", {"times": 0}, "times"),
        ("rate_limit", {"retry_after": -1}, "retry_after"),
        ("timeout_after_store", {"hang": -1}, "hang"),
        ("error", {}, "error="),
    ],
)
def test_fail_next_checks_its_arguments(kind: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FakeSlackApi().fail_next("auth.test", kind, **kwargs)  # type: ignore[arg-type]


def test_inspection_helpers_return_copies(api: FakeSlackApi, http: httpx.Client) -> None:
    meta = {"event_type": "t", "event_payload": {"key": "k"}}
    call(http, "chat.postMessage", channel="C1", text="x", metadata=meta)
    api.messages[0]["metadata"]["event_payload"]["key"] = "changed"
    api.posts[0]["text"] = "changed"
    api.calls[0]["params"]["text"] = "changed"
    assert api.messages[0]["metadata"] == meta
    assert api.posts[0]["text"] == "x"
    assert api.calls[0]["params"]["text"] == "x"
