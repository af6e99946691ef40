"""Conversation identity: keys, tags, JavaScript trim and encodeURIComponent (spec §1, §11)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agency_runtime import AgencyError, InvalidArgumentError
from turn_kit._identity import (
    TurnConversation,
    conversation_key,
    conversation_tag,
    js_encode,
    js_trim,
)

# -- turn-kit.test.ts case 2 ----------------------------------------------------------------


def test_conformance_conversation_identity_keeps_transports_and_threads_isolated() -> None:
    assert conversation_key("C123") == "C123"
    assert conversation_key("C123", "171.2") == "C123:171.2"
    assert (
        conversation_tag("joke-bot", {"transport": "telegram", "id": "8587:42"})
        == "turn:joke-bot:telegram:8587%3A42"
    )
    assert conversation_tag(
        "joke-bot", {"transport": "telegram", "id": "8587"}
    ) != conversation_tag("joke-bot", {"transport": "slack", "id": "8587"})
    assert conversation_key("room:topic") == "room%3Atopic"
    assert conversation_key("room", "topic") == "room:topic"
    assert conversation_key("room:topic") != conversation_key("room", "topic")
    with pytest.raises(InvalidArgumentError, match="lowercase slug"):
        conversation_tag("Not Valid", {"transport": "telegram", "id": "1"})


# -- conversation_key -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("root", "thread", "expected"),
    [
        ("C123", None, "C123"),
        ("C123", "171.2", "C123:171.2"),
        ("8587", 42, "8587:42"),
        ("x", 0, "x:0"),  # a thread of 0 is a thread, not "no thread"
        ("x", "0", "x:0"),
        ("x", -1, "x:-1"),
        ("  C123 \n", " 171.2\t", "C123:171.2"),
        ("x", "", "x"),
        ("x", "   ", "x"),
        ("x", "\ufeff\u3000", "x"),  # JS trim strips BOM and ideographic space
        ("room:topic", None, "room%3Atopic"),
        ("room", "a:b", "room:a%3Ab"),
        ("a/b", "c?d", "a%2Fb:c%3Fd"),
    ],
)
def test_conversation_key(root: str, thread: str | int | None, expected: str) -> None:
    assert conversation_key(root, thread) == expected


def test_conversation_key_default_thread_is_none() -> None:
    assert conversation_key("8587") == conversation_key("8587", None) == "8587"


@pytest.mark.parametrize("root", ["", "   ", "\n\t", "\ufeff", "\u00a0\u2028"])
def test_conversation_key_blank_root_raises(root: str) -> None:
    with pytest.raises(InvalidArgumentError, match="conversation root cannot be empty"):
        conversation_key(root, "1")


def test_conversation_key_non_string_root_raises() -> None:
    with pytest.raises(InvalidArgumentError, match="must be a string"):
        conversation_key(123)  # type: ignore[arg-type]


def test_invalid_argument_error_is_a_value_error_and_an_agency_error() -> None:
    with pytest.raises(ValueError, match="cannot be empty") as caught:
        conversation_key(" ")
    assert isinstance(caught.value, AgencyError)


def test_conversation_key_keeps_control_separators_js_trim_does_not_strip() -> None:
    # Python's str.strip would remove \x1c-\x1f and make this root blank; JavaScript's
    # trim keeps them, so this is a real (encoded) key.
    assert conversation_key("\x1c") == "%1C"
    assert conversation_key("\x1fC1\x1e", "\x1d") == "%1FC1%1E:%1D"


def test_conversation_key_encodes_unicode_as_utf8_upper_hex() -> None:
    assert conversation_key("café", "ü") == "caf%C3%A9:%C3%BC"
    assert conversation_key("😀") == "%F0%9F%98%80"
    assert conversation_key("chat", "话题") == "chat:%E8%AF%9D%E9%A2%98"


def test_conversation_key_keeps_the_encode_uri_component_unreserved_set() -> None:
    assert conversation_key("a-b_c.d!e~f*g'h(i)j") == "a-b_c.d!e~f*g'h(i)j"
    assert conversation_key("a b", "c+d") == "a%20b:c%2Bd"


# -- js_encode / js_trim --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("!~*'()", "!~*'()"),
        ("-_.", "-_."),
        ("AZaz09", "AZaz09"),
        ("/", "%2F"),  # Python's quote() keeps '/' by default; encodeURIComponent does not
        (":", "%3A"),
        ("%", "%25"),
        ("%3A", "%253A"),
        (" ", "%20"),
        ("?&=#+,;$@[]", "%3F%26%3D%23%2B%2C%3B%24%40%5B%5D"),
        ('"<>\\^`{|}', "%22%3C%3E%5C%5E%60%7B%7C%7D"),
        ("é", "%C3%A9"),
        ("€", "%E2%82%AC"),
        ("𝄞", "%F0%9D%84%9E"),
        ("\x00\x7f", "%00%7F"),
        ("", ""),
    ],
)
def test_js_encode_matches_encode_uri_component(text: str, expected: str) -> None:
    assert js_encode(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  hi  ", "hi"),
        ("\t\n\v\f\r hi \r\n", "hi"),
        ("\ufeffhi\ufeff", "hi"),  # BOM is JS white space
        ("\u00a0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000hi", "hi"),
        ("\x1chi\x1f", "\x1chi\x1f"),  # str.strip() would strip these
        ("\x1d\x1e", "\x1d\x1e"),
        ("\x85hi\x85", "\x85hi\x85"),  # NEL: str.strip() strips it, JS trim does not
        ("\u200bhi\u200b", "\u200bhi\u200b"),  # zero-width space is not white space
        ("a  b", "a  b"),
        ("", ""),
    ],
)
def test_js_trim_uses_the_ecmascript_white_space_set(text: str, expected: str) -> None:
    assert js_trim(text) == expected


def test_js_trim_differs_from_str_strip_exactly_where_expected() -> None:
    assert "\x1chi".strip() == "hi"
    assert js_trim("\x1chi") == "\x1chi"


# -- conversation_tag -----------------------------------------------------------------------


def test_conversation_tag_double_encodes_keys() -> None:
    key = conversation_key("room:topic")
    assert key == "room%3Atopic"
    assert (
        conversation_tag("joke-bot", TurnConversation(transport="telegram", id=key))
        == "turn:joke-bot:telegram:room%253Atopic"
    )
    assert (
        conversation_tag(
            "life-agent", {"transport": "telegram", "id": conversation_key("8587", 42)}
        )
        == "turn:life-agent:telegram:8587%3A42"
    )


def test_conversation_tag_accepts_a_model_or_a_dict() -> None:
    model = TurnConversation(transport="slack", id="C1:T1")
    assert conversation_tag("bot", model) == conversation_tag(
        "bot", {"transport": "slack", "id": "C1:T1"}
    )
    assert conversation_tag("bot", model) == "turn:bot:slack:C1%3AT1"


def test_conversation_tag_trims_and_encodes_every_part() -> None:
    assert (
        conversation_tag("  joke-bot\n", {"transport": " tele gram ", "id": " a/b "})
        == "turn:joke-bot:tele%20gram:a%2Fb"
    )
    assert conversation_tag("x", {"transport": "t", "id": "é!"}) == "turn:x:t:%C3%A9!"


@pytest.mark.parametrize(
    "namespace",
    ["a", "0", "joke-bot", "a-", "a1-2-3", "a" * 63, "9lives", " padded "],
)
def test_conversation_tag_accepts_lowercase_slugs(namespace: str) -> None:
    tag = conversation_tag(namespace, {"transport": "t", "id": "1"})
    assert tag == f"turn:{namespace.strip()}:t:1"


@pytest.mark.parametrize(
    "namespace",
    [
        "",
        "   ",
        "Not Valid",
        "Joke",
        "-joke",
        "joke_bot",
        "joke bot",
        "joke.bot",
        "a" * 64,
        "jöke",
        "joke\nbot",
        "\x1cjoke",  # JS trim keeps \x1c, so this is not a slug
    ],
)
def test_conversation_tag_rejects_bad_namespaces(namespace: str) -> None:
    with pytest.raises(InvalidArgumentError, match="lowercase slug"):
        conversation_tag(namespace, {"transport": "t", "id": "1"})


def test_conversation_tag_rejects_a_non_string_namespace() -> None:
    with pytest.raises(InvalidArgumentError, match="lowercase slug"):
        conversation_tag(None, {"transport": "t", "id": "1"})  # type: ignore[arg-type]


def test_conversation_tag_checks_the_namespace_before_the_conversation() -> None:
    with pytest.raises(InvalidArgumentError, match="lowercase slug"):
        conversation_tag("Bad", {"transport": "", "id": ""})


@pytest.mark.parametrize(
    ("conversation", "message"),
    [
        ({"transport": "", "id": "1"}, "conversation transport cannot be empty"),
        ({"transport": " \ufeff ", "id": "1"}, "conversation transport cannot be empty"),
        ({"transport": "t", "id": ""}, "conversation id cannot be empty"),
        ({"transport": "t", "id": "\u3000"}, "conversation id cannot be empty"),
    ],
)
def test_conversation_tag_rejects_blank_parts(conversation: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        conversation_tag("bot", conversation)


def test_conversation_tag_keeps_control_characters_js_trim_keeps() -> None:
    assert conversation_tag("bot", {"transport": "t", "id": "\x1c"}) == "turn:bot:t:%1C"


# -- TurnConversation -----------------------------------------------------------------------


def test_turn_conversation_is_frozen_and_hashable() -> None:
    conversation = TurnConversation(transport="telegram", id="8587:42")
    assert conversation == TurnConversation(transport="telegram", id="8587:42")
    assert len({conversation, TurnConversation(transport="telegram", id="8587:42")}) == 1
    with pytest.raises(ValidationError):
        conversation.id = "other"  # type: ignore[misc]
    assert TurnConversation.model_validate_json(conversation.model_dump_json()) == conversation


def test_turn_conversation_has_no_session_id() -> None:
    assert set(TurnConversation.model_fields) == {"transport", "id"}


# -- found while testing: bad conversation arguments escape as other exception types --------


def test_conversation_tag_dict_missing_id_raises_invalid_argument_error() -> None:
    with pytest.raises(InvalidArgumentError):
        conversation_tag("bot", {"transport": "telegram"})


def test_conversation_tag_none_conversation_raises_invalid_argument_error() -> None:
    conversation: Any = None
    with pytest.raises(InvalidArgumentError):
        conversation_tag("bot", conversation)
