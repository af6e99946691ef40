"""Telegram parsing, bare chat ids, chunking and skip reasons (spec §6, §9, §11; DESIGN §8)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agency_runtime import InvalidArgumentError
from turn_kit import _chunks
from turn_kit._identity import _JS_WHITESPACE
from turn_kit.telegram._parse import (
    TelegramMessage,
    bare_telegram_chat_id,
    chunk_telegram_text,
    read_telegram_message,
    telegram_skip_reason,
)


def units(text: str) -> int:
    """Length in UTF-16 code units."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def strip_ws(text: str) -> str:
    return "".join(ch for ch in text if ch not in _JS_WHITESPACE)


def msg(**fields: Any) -> TelegramMessage:
    base: dict[str, Any] = {"chat_id": "8587", "message_id": "1", "text": "hello"}
    base.update(fields)
    return TelegramMessage(**base)


# -- delivery telegram.test.ts case 5: the data.telegram envelope and the skip reasons -------


def test_conformance_data_telegram_envelope_is_parsed() -> None:
    payload = {
        "data": {
            "telegram": {
                "chatId": "8587__KJG Life Bot",
                "messageId": "12",
                "messageThreadId": "3",
                "text": "Remind me tomorrow",
            },
            "message": {"reply_to_message": {"text": "Call mom"}},
        }
    }
    message = read_telegram_message(payload)
    assert message == TelegramMessage(
        chat_id="8587__KJG Life Bot",
        message_id="12",
        text="Remind me tomorrow",
        thread_id="3",
        reply_text="Call mom",
        from_is_bot=False,
        kind="message",
    )
    assert telegram_skip_reason(message, "8587") is None


def test_conformance_root_telegram_record_and_snake_case_fields() -> None:
    message = read_telegram_message(
        {"telegram": {"chat_id": 8587, "message_id": 12, "message_thread_id": 9, "text": "x"}}
    )
    assert message is not None
    assert (message.chat_id, message.message_id, message.thread_id) == ("8587", "12", "9")


def test_conformance_skip_reasons() -> None:
    assert telegram_skip_reason(msg(from_is_bot=True), "8587") == "bot message"
    assert telegram_skip_reason(msg(), None) == "no owner chat configured"
    assert telegram_skip_reason(msg(), "  ") == "no owner chat configured"
    assert telegram_skip_reason(msg(), "") == "no owner chat configured"
    assert telegram_skip_reason(msg(), "9999") == "not the owner chat"
    assert telegram_skip_reason(msg(text=" \n\ufeff "), "8587") == "empty message text"
    assert telegram_skip_reason(msg(chat_id="8587__KJG Life Bot"), " 8587__Other ") is None


def test_skip_reasons_are_checked_in_order() -> None:
    everything_wrong = msg(from_is_bot=True, chat_id="1", text="")
    assert telegram_skip_reason(everything_wrong, None) == "bot message"
    assert telegram_skip_reason(msg(chat_id="1", text=""), None) == "no owner chat configured"
    assert telegram_skip_reason(msg(chat_id="1", text=""), "2") == "not the owner chat"
    assert telegram_skip_reason(msg(chat_id="2", text=""), "2") == "empty message text"


def test_from_is_bot_uses_from_then_from_is_bot_with_js_truthiness() -> None:
    base = {"chat": {"id": 1}, "message_id": 2, "text": "t"}
    bot = read_telegram_message({"message": {**base, "from": {"is_bot": True}}})
    assert bot is not None
    assert bot.from_is_bot
    human = read_telegram_message({"message": {**base, "from": {"is_bot": False}}})
    assert human is not None
    assert not human.from_is_bot
    flagged = read_telegram_message({"telegram": {"chatId": "1", "messageId": "2", "fromIsBot": 1}})
    assert flagged is not None
    assert flagged.from_is_bot
    listy = read_telegram_message({"telegram": {"chatId": "1", "messageId": "2", "fromIsBot": []}})
    assert listy is not None
    assert listy.from_is_bot
    zero = read_telegram_message({"telegram": {"chatId": "1", "messageId": "2", "fromIsBot": 0}})
    assert zero is not None
    assert not zero.from_is_bot


# -- delivery telegram.test.ts case 6: bare ids, newline chunking, limit 0 --------------------


def test_conformance_bare_chat_id_strips_the_title() -> None:
    assert bare_telegram_chat_id("8587__KJG Life Bot") == "8587"
    assert bare_telegram_chat_id(" 8587 __x") == "8587"
    assert bare_telegram_chat_id(8587) == "8587"
    assert bare_telegram_chat_id("-100123") == "-100123"
    assert bare_telegram_chat_id("\ufeff42\u00a0") == "42"


def test_conformance_chunking_examples() -> None:
    assert chunk_telegram_text("12345\n67890", 7) == ["12345", "67890"]
    assert chunk_telegram_text("ab\ncdefgh", 4) == ["ab", "cdef", "gh"]
    assert chunk_telegram_text("abcd  \n\nxyz", 6) == ["abcd", "\nxyz"]
    assert chunk_telegram_text("") == [""]
    assert chunk_telegram_text("short") == ["short"]
    assert chunk_telegram_text("x" * 4096) == ["x" * 4096]
    assert chunk_telegram_text("x" * 4097) == ["x" * 4096, "x"]


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "4096", None])
def test_conformance_chunk_limit_must_be_a_positive_int(limit: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        chunk_telegram_text("text", limit)


def test_newline_below_half_the_limit_means_a_hard_split() -> None:
    assert chunk_telegram_text("a\nbcdefghij", 8) == ["a\nbcdefg", "hij"]


# -- raw Bot API updates ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["message", "edited_message", "business_message", "channel_post"])
def test_raw_update_kinds(kind: str) -> None:
    raw: dict[str, Any] = {
        "message_id": 77,
        "chat": {"id": -100555, "type": "supergroup"},
        "from": {"id": 9, "is_bot": False},
        "text": "  hi there  ",
        "date": 1700000000,
    }
    if kind == "edited_message":
        raw["edit_date"] = 1700000100
    message = read_telegram_message({"update_id": 1234, kind: raw})
    assert message is not None
    assert message.chat_id == "-100555"
    assert message.message_id == "77"
    assert message.text == "  hi there  "  # untrimmed
    assert message.kind == kind
    assert message.update_id == "1234"
    assert message.edit_date == ("1700000100" if kind == "edited_message" else None)
    assert message.thread_id is None


def test_first_present_raw_kind_wins_and_callback_query_is_unusable() -> None:
    both = {
        "message": {"message_id": 1, "chat": {"id": 5}, "text": "a"},
        "channel_post": {"message_id": 2, "chat": {"id": 6}, "text": "b"},
    }
    message = read_telegram_message(both)
    assert message is not None
    assert message.message_id == "1"
    assert read_telegram_message({"callback_query": {"message": {"message_id": 1}}}) is None


def test_missing_ids_drop_the_message() -> None:
    assert read_telegram_message({"message": {"chat": {"id": 5}, "text": "a"}}) is None
    assert read_telegram_message({"message": {"message_id": 5, "text": "a"}}) is None
    # A normalised record has no raw fallback for its message id.
    record_without_id = {"telegram": {"chatId": "5"}, "message": {"message_id": 9}}
    assert read_telegram_message(record_without_id) is None
    assert read_telegram_message({"message": {"message_id": True, "chat": {"id": 5}}}) is None
    assert read_telegram_message({"message": {"message_id": "", "chat": {"id": 5}}}) is None


def test_captions_and_reply_captions() -> None:
    raw = {
        "message_id": 3,
        "chat": {"id": 5},
        "caption": "a photo",
        "reply_to_message": {"message_id": 2, "caption": "earlier photo"},
    }
    message = read_telegram_message({"message": raw})
    assert message is not None
    assert (message.text, message.reply_text) == ("a photo", "earlier photo")
    no_text = read_telegram_message({"message": {"message_id": 3, "chat": {"id": 5}}})
    assert no_text is not None
    assert no_text.text == ""
    assert no_text.reply_text is None
    record_text_first = read_telegram_message(
        {"telegram": {"chatId": "5", "messageId": "3", "caption": "c"}, "message": {"text": "t"}}
    )
    assert record_text_first is not None
    assert record_text_first.text == "t"


# -- topic identity (DESIGN §5/§8 deviation) ----------------------------------------------------


def test_raw_thread_id_needs_is_topic_message() -> None:
    base = {"message_id": 3, "chat": {"id": -1001, "is_forum": True}, "text": "x"}
    topic = read_telegram_message(
        {"message": {**base, "message_thread_id": 42, "is_topic_message": True}}
    )
    assert topic is not None
    assert topic.thread_id == "42"
    # A reply thread in a non-forum group: not a topic.
    reply_thread = read_telegram_message({"message": {**base, "message_thread_id": 42}})
    assert reply_thread is not None
    assert reply_thread.thread_id is None
    # The General topic of a forum: is_topic_message false, never echoed.
    general = read_telegram_message(
        {"message": {**base, "message_thread_id": 1, "is_topic_message": False}}
    )
    assert general is not None
    assert general.thread_id is None
    truthy_not_true = read_telegram_message(
        {"message": {**base, "message_thread_id": 42, "is_topic_message": 1}}
    )
    assert truthy_not_true is not None
    assert truthy_not_true.thread_id is None


def test_normalised_thread_ids_are_honoured_first() -> None:
    raw = {"message_id": 3, "chat": {"id": 5}, "message_thread_id": 8, "is_topic_message": True}
    camel = read_telegram_message(
        {"telegram": {"chatId": "5", "messageId": "3", "messageThreadId": "3"}, "message": raw}
    )
    assert camel is not None
    assert camel.thread_id == "3"
    snake = read_telegram_message(
        {"telegram": {"chatId": "5", "messageId": "3", "message_thread_id": 4}, "message": raw}
    )
    assert snake is not None
    assert snake.thread_id == "4"
    fallback = read_telegram_message(
        {"telegram": {"chatId": "5", "messageId": "3"}, "message": raw}
    )
    assert fallback is not None
    assert fallback.thread_id == "8"


# -- robustness ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        None,
        True,
        0,
        1.5,
        "message",
        [],
        [{"message": {}}],
        {},
        {"data": None},
        {"data": [1, 2]},
        {"telegram": "x"},
        {"message": "x"},
        {"message": {"chat": [], "message_id": {}}},
        {"message": {"chat": {"id": 10**5000}, "message_id": 1}},
        {"message": {"chat": {"id": 1.0}, "message_id": 1}},
        {"message": {"chat": {"id": False}, "message_id": 1}},
        {1: 2, None: 3},
    ],
)
def test_garbage_gives_none(payload: object) -> None:
    assert read_telegram_message(payload) is None


def test_message_is_frozen() -> None:
    message = msg()
    with pytest.raises(ValidationError):
        message.text = "changed"  # type: ignore[misc]


# -- UTF-16 counting and surrogate safety ---------------------------------------------------


def test_astral_characters_count_as_two_units_and_are_never_split() -> None:
    assert chunk_telegram_text("😀" * 3, 4) == ["😀😀", "😀"]
    assert chunk_telegram_text("😀" * 3, 3) == ["😀", "😀", "😀"]
    assert chunk_telegram_text("a😀b", 2) == ["a", "😀", "b"]
    assert chunk_telegram_text("é" * 5, 5) == ["é" * 5]  # BMP: one unit each
    assert chunk_telegram_text("👍🏽x", 4) == ["👍🏽", "x"]


def test_limit_one_keeps_an_astral_character_whole() -> None:
    assert chunk_telegram_text("😀a", 1) == ["😀", "a"]


def test_whitespace_only_chunks_are_dropped() -> None:
    assert chunk_telegram_text("ab" + " " * 10 + "c", 4) == ["ab", "c"]
    assert chunk_telegram_text("a\n\n\n\n\n\nb", 2) == ["a", "\nb"]
    assert chunk_telegram_text("   ", 2) == []
    assert chunk_telegram_text("hi  \n ", 10) == ["hi"]


class _Scanned(str):
    """The chunker's code units, counting how many of them it reads (slices and searches)."""

    read = 0

    def rfind(self, sub: str, start: Any = None, end: Any = None) -> int:  # type: ignore[override]
        _Scanned.read += (len(self) if end is None else end) - (start or 0)
        return str.rfind(self, sub, start, end)

    def __getitem__(self, key: Any) -> str:  # type: ignore[override]
        if isinstance(key, slice):
            _Scanned.read += len(range(*key.indices(len(self))))
        else:
            _Scanned.read += 1
        return str.__getitem__(self, key)


def test_a_megabyte_is_chunked_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    text = ("Hello 😀 world, line of text\n" * 40000)[:1_000_000]
    real = _chunks._code_units

    def counted(text: str) -> tuple[str, bool]:
        code_units, astral = real(text)
        return _Scanned(code_units), astral

    monkeypatch.setattr(_chunks, "_code_units", counted)
    _Scanned.read = 0
    chunks = chunk_telegram_text(text)
    assert all(units(chunk) <= 4096 for chunk in chunks)
    assert strip_ws("".join(chunks)) == strip_ws(text)
    # Quick means linear: each code unit is read a bounded number of times, not once per chunk.
    assert 0 < _Scanned.read <= 3 * units(text)


# -- hypothesis fuzzing ---------------------------------------------------------------------------

_FIELD_NAMES = [
    "data",
    "telegram",
    "message",
    "edited_message",
    "business_message",
    "channel_post",
    "callback_query",
    "chat",
    "id",
    "chatId",
    "chat_id",
    "messageId",
    "message_id",
    "messageThreadId",
    "message_thread_id",
    "is_topic_message",
    "text",
    "caption",
    "reply_to_message",
    "from",
    "is_bot",
    "fromIsBot",
    "edit_date",
    "update_id",
]

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-1, max_value=1).map(lambda k: k * 10**5000 + 2**64)
    | st.floats()
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(_FIELD_NAMES) | st.text(max_size=8), children, max_size=6)
    ),
    max_leaves=30,
)


# 150 examples each for the two readers' fuzzers: generating a 30-leaf JSON value is most of
# their cost (~9 ms an example), and the readers only check each field's type and shape.
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json)
def test_fuzz_read_never_raises(payload: object) -> None:
    message = read_telegram_message(payload)
    assert message is None or isinstance(message, TelegramMessage)
    if message is not None:
        assert message.chat_id
        assert message.message_id
        assert isinstance(message.text, str)


_update_fields = st.fixed_dictionaries(
    {},
    optional={
        "message_id": st.integers() | st.text(max_size=5) | st.none(),
        "chat": st.fixed_dictionaries({}, optional={"id": st.integers() | st.text(max_size=5)}),
        "text": st.text(max_size=10) | st.integers() | st.none(),
        "caption": st.text(max_size=10),
        "message_thread_id": st.integers(),
        "is_topic_message": st.booleans(),
        "from": st.fixed_dictionaries({}, optional={"is_bot": _json}),
        "reply_to_message": _json,
        "edit_date": _json,
    },
)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["message", "edited_message", "business_message", "channel_post"]),
    _update_fields,
)
def test_fuzz_raw_updates(kind: str, raw: dict[str, Any]) -> None:
    message = read_telegram_message({kind: raw})
    if message is None:
        return
    assert message.kind == kind
    if message.thread_id is not None:
        assert raw.get("is_topic_message") is True


@settings(max_examples=300, deadline=None)
@given(st.text(), st.integers(min_value=1, max_value=50))
def test_fuzz_chunking(text: str, limit: int) -> None:
    chunks = chunk_telegram_text(text, limit)
    if text == "":
        assert chunks == [""]
        return
    for chunk in chunks:
        width = units(chunk)
        assert width <= limit or (limit == 1 and len(chunk) == 1 and width == 2)
        assert strip_ws(chunk), "whitespace-only chunk"
        assert not any("\ud800" <= ch <= "\udfff" for ch in chunk), "lone surrogate"
    assert strip_ws("".join(chunks)) == strip_ws(text)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", " ", "\n", "😀", "é", "\u3000", "\ufeff"]), max_size=80),
    st.integers(min_value=1, max_value=12),
)
def test_fuzz_chunking_dense_alphabet(parts: list[str], limit: int) -> None:
    text = "".join(parts)
    chunks = chunk_telegram_text(text, limit)
    if text == "":
        assert chunks == [""]
        return
    for chunk in chunks:
        assert units(chunk) <= max(limit, 2)
        assert strip_ws(chunk)
        assert chunk == chunk.rstrip(_JS_WHITESPACE)
    assert strip_ws("".join(chunks)) == strip_ws(text)
