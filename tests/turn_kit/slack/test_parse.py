"""Slack's inbound side: reading events, skip reasons, signatures, text in and out."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turn_kit.slack._parse import (
    SlackMessage,
    escape_slack_text,
    read_slack_event,
    slack_input_text,
    slack_signature,
    slack_skip_reason,
    verify_slack_signature,
)

BOT = "UBOT"


def envelope(**event: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": "message",
        "channel": "C1",
        "user": "U1",
        "text": "hello",
        "ts": "1700000000.000100",
        "channel_type": "channel",
    }
    base.update(event)
    return {
        "type": "event_callback",
        "token": "verification-token",
        "team_id": "T1",
        "event_id": "Ev1",
        "event": {k: v for k, v in base.items() if v is not None},
    }


def skip(payload: dict[str, Any], **options: Any) -> str | None:
    message = read_slack_event(payload)
    assert message is not None
    options.setdefault("bot_user_id", BOT)
    return slack_skip_reason(message, **options)


# -- reading --------------------------------------------------------------------------------


def test_a_channel_message_is_read_with_its_thread_root() -> None:
    message = read_slack_event(envelope(thread_ts="1700000000.000001"))
    assert message == SlackMessage(
        channel="C1",
        ts="1700000000.000100",
        text="hello",
        thread_ts="1700000000.000001",
        user="U1",
        channel_type="channel",
        event_id="Ev1",
        team_id="T1",
    )
    assert message.root_ts == "1700000000.000001"
    top = read_slack_event(envelope())
    assert top is not None
    assert top.root_ts == top.ts
    assert not top.direct


def test_the_bare_event_and_an_app_mention_are_read() -> None:
    bare = read_slack_event(envelope(type="app_mention", text=f"<@{BOT}> hi")["event"])
    assert bare is not None
    assert bare.kind == "app_mention"
    assert bare.event_id is None


@pytest.mark.parametrize(
    "payload",
    [
        None,
        [],
        "text",
        {"type": "event_callback"},
        {"type": "event_callback", "event": "x"},
        envelope(type="reaction_added"),
        envelope(channel=None),
        envelope(ts="not-a-ts"),
        envelope(ts=1700000000.0001),
        envelope(channel=["C1"]),
    ],
)
def test_what_is_not_a_message_reads_as_none(payload: Any) -> None:
    assert read_slack_event(payload) is None


def test_lone_surrogates_become_replacement_characters() -> None:
    message = read_slack_event(envelope(text="a\ud800b"))
    assert message is not None
    assert message.text == "a\ufffdb"


def test_a_bad_thread_ts_is_dropped_not_trusted() -> None:
    message = read_slack_event(envelope(thread_ts="../../etc"))
    assert message is not None
    assert message.thread_ts is None


# -- skipping -------------------------------------------------------------------------------


def test_a_mention_in_a_channel_gets_a_turn() -> None:
    assert skip(envelope(text=f"<@{BOT}> what's up")) is None
    assert skip(envelope(type="app_mention", text=f"<@{BOT}> hi")) is None


def test_skip_reasons_in_order() -> None:
    assert skip(envelope(bot_id="B9", text=f"<@{BOT}> x")) == "bot message"
    assert skip(envelope(subtype="bot_message", text="x")) == "bot message"
    assert skip(envelope(bot_id="BBOT", user=BOT), bot_id="BBOT") == "own message"
    assert skip(envelope(user=BOT)) == "own message"
    changed = envelope(subtype="message_changed", message={"text": f"<@{BOT}> y", "user": "U1"})
    assert skip(changed) == "edited message"
    assert skip(envelope(subtype="message_deleted")) == "edited message"
    assert skip(envelope(edited={"user": "U1", "ts": "1"}, text=f"<@{BOT}> z")) == "edited message"
    assert (
        skip(envelope(subtype="channel_join", text="joined")) == "not a user message (channel_join)"
    )
    assert skip(envelope(user=None, text=f"<@{BOT}> x")) == "no author"
    other = envelope(channel="C2", text=f"<@{BOT}> x")
    assert skip(other, allowed_channels={"C1"}) == "channel not allowed"
    assert skip(envelope(text="no mention")) == "not addressed to the bot"
    assert skip(envelope(text=f"<@{BOT}>   ")) == "empty message"


def test_direct_messages_need_no_mention_and_require_mention_can_be_off() -> None:
    assert skip(envelope(channel="D1", channel_type="im", text="hi")) is None
    assert skip(envelope(text="hi"), require_mention=False) is None
    assert skip(envelope(subtype="thread_broadcast", text="hi"), require_mention=False) is None


def test_without_the_bots_identity_only_app_mentions_address_it_in_channels() -> None:
    assert skip(envelope(text="<@UBOT> hi"), bot_user_id=None) == "not addressed to the bot"
    assert skip(envelope(type="app_mention", text="<@UBOT> hi"), bot_user_id=None) is None


# -- text -----------------------------------------------------------------------------------


def test_input_text_drops_the_bots_mentions_and_unescapes() -> None:
    message = read_slack_event(
        envelope(text=f"<@{BOT}> is 1 &lt; 2 &amp;&amp; <@U2> &gt; 0? <@{BOT}|bot>")
    )
    assert message is not None
    assert slack_input_text(message, BOT) == "is 1 < 2 && <@U2> > 0?"


def test_escape_makes_mentions_and_broadcasts_inert() -> None:
    assert escape_slack_text("<!channel> a & b <@U1>") == "&lt;!channel&gt; a &amp; b &lt;@U1&gt;"


# -- signatures -----------------------------------------------------------------------------

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


def test_slacks_documented_example_signature() -> None:
    # The example of Slack's "Verifying requests from Slack" page.
    body = (
        b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&"
        b"channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&"
        b"command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2F"
        b"commands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&"
        b"trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
    )
    expected = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
    assert slack_signature(SECRET, "1531420618", body) == expected
    ok = verify_slack_signature(
        SECRET, timestamp="1531420618", signature=expected, body=body, now=1531420618 + 299
    )
    assert ok is None


def test_bad_signatures_are_refused_with_a_reason() -> None:
    now = time.time()
    ts = str(int(now))
    body = b'{"type":"event_callback"}'
    good = slack_signature(SECRET, ts, body)

    def check(**kw: Any) -> str | None:
        args: dict[str, Any] = {"timestamp": ts, "signature": good, "body": body, "now": now}
        args.update(kw)
        return verify_slack_signature(SECRET, **args)

    assert check() is None
    assert check(timestamp=ts.encode(), signature=good.encode()) is None
    assert check(signature=None) == "missing signature"
    assert check(timestamp="") == "missing signature"
    assert check(timestamp="12x") == "malformed timestamp"
    assert check(now=now + 301) == "stale timestamp"
    assert check(now=now - 301) == "stale timestamp"
    assert check(body=body + b" ") == "wrong signature"
    assert check(signature=good[:-1] + ("0" if good[-1] != "0" else "1")) == "wrong signature"
    assert check(signature="v0=\u00e9") == "wrong signature"


# -- fuzz -----------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=20,
)
_fields = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "app_mention", "reaction_added"]) | _json,
        "channel": st.sampled_from(["C1", "D1", ""]) | _json,
        "user": st.sampled_from(["U1", BOT]) | _json,
        "text": st.text(max_size=40) | _json,
        "ts": st.sampled_from(["1700000000.000100", "1.2"]) | _json,
        "thread_ts": st.sampled_from(["1700000000.000001"]) | _json,
        "subtype": st.sampled_from(["bot_message", "message_changed", "file_share"]) | _json,
        "bot_id": _json,
        "edited": _json,
        "message": _json,
        "channel_type": st.sampled_from(["im", "channel"]) | _json,
    },
)


# 150 examples: each is a dozen optional fields of up to 20-leaf JSON (~16 ms to generate); the
# reader only asks each field for its type, which 150 draws cover many times over per run.
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(event=_fields, wrap=st.booleans(), extra=_json)
def test_fuzzed_envelopes_never_raise(event: dict[str, Any], wrap: bool, extra: Any) -> None:
    payload: Any = {"type": "event_callback", "event": event, "event_id": extra} if wrap else event
    message = read_slack_event(payload)
    if message is not None:
        for bot in (BOT, None):
            reason = slack_skip_reason(message, bot_user_id=bot, allowed_channels={"C1"})
            assert reason is None or isinstance(reason, str)
            slack_input_text(message, bot)
