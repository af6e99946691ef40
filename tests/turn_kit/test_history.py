"""Conversation history: normalising, recalling and remembering turns (spec §2, §3, §9, §11)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from agency_runtime import ConversationMemory, InvalidArgumentError, SaveReceipt, Store
from agency_runtime._memory._conversation import MemoryItem
from turn_kit._errors import TurnKitError, TurnMemoryError
from turn_kit._history import (
    TurnHistoryEntry,
    TurnMemoryOptions,
    memory_options,
    normalize_turn_history,
    recall_turn_history,
    remember_assistant_message,
    remember_turn,
    remember_turn_message,
)
from turn_kit._identity import conversation_key, conversation_tag

pytestmark = pytest.mark.anyio

TAG = "turn:life-agent:telegram:8587%3A42"
_UNSET: Any = object()


class FakeMemory:
    """A ``ctx.memory`` that records calls and answers (or raises) as configured."""

    def __init__(
        self,
        *,
        recalled: Any = None,
        recall_error: BaseException | None = None,
        receipt: Any = _UNSET,
        save_error: BaseException | None = None,
    ) -> None:
        self.recalled = [] if recalled is None else recalled
        self.recall_error = recall_error
        self.receipt = {"id": "mem-1"} if receipt is _UNSET else receipt
        self.save_error = save_error
        self.recalls: list[tuple[str, dict[str, Any]]] = []
        self.saves: list[tuple[str, dict[str, Any]]] = []

    async def recall(self, query: str, **options: Any) -> Any:
        self.recalls.append((query, options))
        if self.recall_error is not None:
            raise self.recall_error
        return self.recalled

    async def save(self, content: str, **options: Any) -> Any:
        self.saves.append((content, options))
        if self.save_error is not None:
            raise self.save_error
        return self.receipt


class SyncMemory(FakeMemory):
    """The same, with plain (non-async) methods."""

    def recall(self, query: str, **options: Any) -> Any:  # type: ignore[override]
        self.recalls.append((query, options))
        if self.recall_error is not None:
            raise self.recall_error
        return self.recalled

    def save(self, content: str, **options: Any) -> Any:  # type: ignore[override]
        self.saves.append((content, options))
        if self.save_error is not None:
            raise self.save_error
        return self.receipt


class FakeCtx:
    """A ctx with a memory and a log that records ``(level, message, attrs)``."""

    def __init__(self, memory: Any = None) -> None:
        self.memory = FakeMemory() if memory is None else memory
        self.logs: list[tuple[str, str, dict[str, Any]]] = []

    def log(self, level: str, message: str, **attrs: Any) -> None:
        self.logs.append((level, message, attrs))

    def events(self) -> list[str]:
        return [message for _, message, _ in self.logs]

    def event(self, message: str) -> tuple[str, dict[str, Any]]:
        found = [(level, attrs) for level, name, attrs in self.logs if name == message]
        assert len(found) == 1, (message, self.logs)
        return found[0]


def item(content: str, created_at: Any = None, *, key: str = "createdAt") -> dict[str, Any]:
    """A memory item shaped like the seed's cloud ``MemoryItem`` (camelCase ``createdAt``)."""
    record: dict[str, Any] = {"id": f"mem-{content}", "content": content, "tags": []}
    if created_at is not None:
        record[key] = created_at
    return record


def contents(entries: list[TurnHistoryEntry]) -> list[str]:
    return [entry.content for entry in entries]


# -- turn-kit.test.ts cases 3-5: ordering ---------------------------------------------------


def test_conformance_timestamped_memory_is_always_returned_oldest_first() -> None:
    history = normalize_turn_history(
        [
            item("third", "2026-07-24T12:03:00.000Z"),
            item("first", "2026-07-24T12:01:00.000Z"),
            item("second", "2026-07-24T12:02:00.000Z"),
        ]
    )
    assert contents(history) == ["first", "second", "third"]


def test_conformance_timestamped_memory_sorts_by_instant_when_offsets_differ() -> None:
    history = normalize_turn_history(
        [
            item("later", "2026-07-24T10:30:00Z"),
            item("earlier", "2026-07-24T12:00:00+02:00"),
        ]
    )
    assert contents(history) == ["earlier", "later"]
    assert history[0].created_at == datetime(2026, 7, 24, 10, 0, tzinfo=UTC)


def test_conformance_timestamp_less_recall_is_reversed_or_kept() -> None:
    assert contents(normalize_turn_history(["newest", "middle", "oldest"])) == [
        "oldest",
        "middle",
        "newest",
    ]
    assert contents(normalize_turn_history(["oldest", "newest"], "oldest-first")) == [
        "oldest",
        "newest",
    ]


# -- normalize_turn_history -----------------------------------------------------------------


@pytest.mark.parametrize("recalled", [None, "text", 5, {"content": "x"}, iter(["x"]), b"x"])
def test_normalize_non_lists_give_nothing(recalled: object) -> None:
    assert normalize_turn_history(recalled) == []


def test_normalize_accepts_a_tuple() -> None:
    assert contents(normalize_turn_history(("b", "a"))) == ["a", "b"]


def test_normalize_trims_strings_and_drops_blank_ones() -> None:
    history = normalize_turn_history(["  newest  ", "", "   ", "\ufeff", "\n old \n"])
    assert contents(history) == ["old", "newest"]
    assert all(entry.created_at is None for entry in history)


def test_normalize_uses_js_trim_for_strings() -> None:
    # \x1c is not JS white space: the item is kept, untrimmed; \x85 likewise.
    assert contents(normalize_turn_history(["\x1c", "\x85hi\x85"], "oldest-first")) == [
        "\x1c",
        "\x85hi\x85",
    ]


def test_normalize_keeps_object_content_untrimmed() -> None:
    history = normalize_turn_history([item("  spaced out \n"), {"content": "\tTab"}])
    assert contents(history) == ["\tTab", "  spaced out \n"]


@pytest.mark.parametrize(
    "bad",
    [
        None,
        5,
        ["list"],
        ("tuple",),
        {"content": ""},
        {"content": "  \n "},
        {"content": 5},
        {"content": None},
        {"text": "no content key"},
        SimpleNamespace(text="no content attribute"),
        SimpleNamespace(content="   "),
    ],
)
def test_normalize_drops_items_without_usable_content(bad: object) -> None:
    assert contents(normalize_turn_history([bad, "kept"])) == ["kept"]


def test_normalize_reads_object_attributes_and_both_time_spellings() -> None:
    history = normalize_turn_history(
        [
            SimpleNamespace(content="c", created_at="2026-07-24T12:03:00Z"),
            SimpleNamespace(content="a", createdAt="2026-07-24T12:01:00Z"),
            item("b", "2026-07-24T12:02:00Z", key="created_at"),
        ]
    )
    assert contents(history) == ["a", "b", "c"]


def test_normalize_reads_runtime_memory_items() -> None:
    base = datetime(2026, 7, 24, 12, tzinfo=UTC)
    items = [
        MemoryItem(id=f"m{i}", content=f"turn {i}", tags=[TAG], scope="w", created_at=at)
        for i, at in ((2, base + timedelta(minutes=2)), (1, base + timedelta(minutes=1)))
    ]
    history = normalize_turn_history(items)
    assert contents(history) == ["turn 1", "turn 2"]
    assert history[0].created_at == base + timedelta(minutes=1)


def test_normalize_sorts_only_when_every_entry_has_a_time() -> None:
    recalled = [
        item("newest", "2026-07-24T12:03:00Z"),
        item("no time"),
        item("oldest", "2026-07-24T12:01:00Z"),
    ]
    # One entry has no time: the whole newest-first list is reversed, not sorted.
    assert contents(normalize_turn_history(recalled)) == ["oldest", "no time", "newest"]
    assert contents(normalize_turn_history(recalled, "oldest-first")) == [
        "newest",
        "no time",
        "oldest",
    ]
    # A string item never has a time either.
    mixed = [item("b", "2026-07-24T12:02:00Z"), "plain", item("a", "2026-07-24T12:01:00Z")]
    assert contents(normalize_turn_history(mixed)) == ["a", "plain", "b"]


@pytest.mark.parametrize("missing", ["", "   ", "not a date", "2026-13-45T99:00:00Z", 1234, None])
def test_normalize_blank_or_unparseable_times_count_as_absent(missing: object) -> None:
    recalled = [item("second", "2026-07-24T12:02:00Z"), {"content": "first", "createdAt": missing}]
    history = normalize_turn_history(recalled)
    assert contents(history) == ["first", "second"]  # reversed, not sorted
    assert history[0].created_at is None


def test_normalize_cloud_blank_created_at_with_snake_case_fallback() -> None:
    # A blank ``created_at`` does not hide a usable ``createdAt``.
    history = normalize_turn_history(
        [
            {"content": "b", "created_at": "", "createdAt": "2026-07-24T12:02:00Z"},
            {"content": "a", "created_at": "2026-07-24T12:01:00Z"},
        ]
    )
    assert contents(history) == ["a", "b"]


def test_normalize_sort_is_stable_for_equal_instants() -> None:
    same = "2026-07-24T12:00:00Z"
    history = normalize_turn_history(
        [item("x", same), item("y", "2026-07-24T14:00:00+02:00"), item("z", same)]
    )
    assert contents(history) == ["x", "y", "z"]


def test_normalize_parses_rfc_2822_dates() -> None:
    history = normalize_turn_history(
        [
            item("iso", "2026-07-24T10:30:00Z"),
            item("rfc", "Fri, 24 Jul 2026 12:00:00 +0200"),
            item("gmt", "24 Jul 2026 09:00:00 GMT"),
        ]
    )
    assert contents(history) == ["gmt", "rfc", "iso"]
    assert history[1].created_at == datetime(2026, 7, 24, 10, 0, tzinfo=UTC)


def test_normalize_treats_times_without_an_offset_as_utc() -> None:
    # Deviation: Date.parse would read the naive time as local time.
    history = normalize_turn_history(
        [
            item("naive", "2026-07-24T12:00:00"),
            item("after", "2026-07-24T12:30:00+00:00"),
            item("before", "2026-07-24T11:30:00Z"),
            item("rfc naive", "Fri, 24 Jul 2026 11:45:00 -0000"),
        ]
    )
    assert contents(history) == ["before", "rfc naive", "naive", "after"]
    assert history[2].created_at == datetime(2026, 7, 24, 12, 0, tzinfo=UTC)


def test_normalize_accepts_datetimes_and_makes_them_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    history = normalize_turn_history(
        [
            {"content": "naive", "created_at": datetime(2026, 7, 24, 11, 0)},
            {"content": "aware", "created_at": datetime(2026, 7, 24, 12, 0, tzinfo=plus_two)},
        ]
    )
    assert contents(history) == ["aware", "naive"]
    assert [entry.created_at for entry in history] == [
        datetime(2026, 7, 24, 10, 0, tzinfo=UTC),
        datetime(2026, 7, 24, 11, 0, tzinfo=UTC),
    ]
    assert all(entry.created_at is not None and entry.created_at.tzinfo is UTC for entry in history)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-07-24", datetime(2026, 7, 24, tzinfo=UTC)),
        ("2026-07-24 12:00", datetime(2026, 7, 24, 12, tzinfo=UTC)),
        ("2026-07-24t12:00:00z", datetime(2026, 7, 24, 12, tzinfo=UTC)),
        ("20260724T120000Z", datetime(2026, 7, 24, 12, tzinfo=UTC)),
        ("  2026-07-24T12:00:00.250Z  ", datetime(2026, 7, 24, 12, 0, 0, 250000, tzinfo=UTC)),
        ("2026-07-24T12:00:00-05:30", datetime(2026, 7, 24, 17, 30, tzinfo=UTC)),
        ("Fri, 24 Jul 2026 12:00:00 EST", datetime(2026, 7, 24, 17, tzinfo=UTC)),
    ],
)
def test_normalize_time_formats(text: str, expected: datetime) -> None:
    (entry,) = normalize_turn_history([item("x", text)])
    assert entry.created_at == expected


def test_normalize_empty_list_and_bad_order() -> None:
    assert normalize_turn_history([]) == []
    with pytest.raises(InvalidArgumentError, match="recall_order"):
        normalize_turn_history(["x"], "newest")  # type: ignore[arg-type]


def test_history_entry_model_makes_times_utc() -> None:
    entry = TurnHistoryEntry(content="x", created_at=datetime(2026, 7, 24, 12))
    assert entry.created_at == datetime(2026, 7, 24, 12, tzinfo=UTC)
    assert TurnHistoryEntry(content="y").created_at is None
    assert TurnHistoryEntry.model_validate_json(entry.model_dump_json()) == entry


# -- options --------------------------------------------------------------------------------


def test_memory_options_defaults() -> None:
    options = memory_options(None)
    assert options == TurnMemoryOptions()
    assert (options.query, options.limit, options.scope) == (
        "recent conversation turns",
        8,
        "workspace",
    )
    assert (options.ttl_seconds, options.recall_order, options.required) == (
        None,
        "newest-first",
        False,
    )
    assert (options.user_label, options.assistant_label, options.serialize) == (
        "User",
        "Assistant",
        None,
    )


def test_memory_options_accept_seed_camel_case_and_snake_case() -> None:
    camel = memory_options(
        {
            "query": "recent life-agent conversation",
            "limit": 6,
            "ttlSeconds": 3600,
            "recallOrder": "oldest-first",
            "userLabel": "Khaliq",
            "assistantLabel": "life-agent",
            "required": True,
        }
    )
    snake = memory_options(
        {
            "query": "recent life-agent conversation",
            "limit": 6,
            "ttl_seconds": 3600,
            "recall_order": "oldest-first",
            "user_label": "Khaliq",
            "assistant_label": "life-agent",
            "required": True,
        }
    )
    assert camel == snake
    assert camel.ttl_seconds == 3600
    options = TurnMemoryOptions(ttl_seconds=60)
    assert memory_options(options) is options


@pytest.mark.parametrize(
    "bad",
    [
        {"ttl": 60},  # a typo must not silently drop the expiry
        {"ttlSeconds": 60, "ttl_seconds": 60},
        {"recallOrder": "sideways"},
        {"ttl_seconds": 0},
        {"ttl_seconds": -5},
        {"ttl_seconds": float("nan")},
        {"serialize": "not callable"},
        {"query": 5},
    ],
)
def test_memory_options_reject_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError, match="invalid turn memory options"):
        memory_options(bad)


def test_memory_options_reject_other_types() -> None:
    with pytest.raises(InvalidArgumentError, match="TurnMemoryOptions, a dict or None"):
        memory_options(5)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        TurnMemoryOptions(recall_order="sideways")  # type: ignore[arg-type]


def test_memory_options_do_not_validate_limit_up_front() -> None:
    assert memory_options({"limit": 0}).limit == 0


# -- recall_turn_history --------------------------------------------------------------------


async def test_recall_passes_defaults_and_normalises() -> None:
    ctx = FakeCtx(FakeMemory(recalled=["newest", "oldest"]))
    history = await recall_turn_history(ctx, TAG)
    assert contents(history) == ["oldest", "newest"]
    assert ctx.memory.recalls == [
        (
            "recent conversation turns",
            {"tags": [TAG], "limit": 8, "scope": "workspace", "fail_on_error": False},
        )
    ]
    assert ctx.event("turn-kit.memory-recalled") == ("info", {"entries": 2})


async def test_recall_uses_the_options() -> None:
    ctx = FakeCtx(FakeMemory(recalled=["oldest", "newest"]))
    history = await recall_turn_history(
        ctx,
        TAG,
        {
            "query": "recent life-agent conversation",
            "limit": 6,
            "scope": "user",
            "recallOrder": "oldest-first",
        },
    )
    assert contents(history) == ["oldest", "newest"]
    assert ctx.memory.recalls == [
        (
            "recent life-agent conversation",
            {"tags": [TAG], "limit": 6, "scope": "user", "fail_on_error": False},
        )
    ]


async def test_conformance_required_recall_asks_the_memory_to_fail_on_errors() -> None:
    ctx = FakeCtx()
    assert await recall_turn_history(ctx, TAG, TurnMemoryOptions(required=True)) == []
    assert ctx.memory.recalls[0][1]["fail_on_error"] is True


@pytest.mark.parametrize("limit", [0, -1, 1.5, 8.0, True, "8", None])
@pytest.mark.parametrize("required", [False, True])
async def test_recall_validates_limit_first_even_when_not_required(
    limit: Any, required: bool
) -> None:
    ctx = FakeCtx(FakeMemory(recall_error=RuntimeError("backend down")))
    with pytest.raises(InvalidArgumentError, match=r"^turn memory limit must be positive$"):
        await recall_turn_history(ctx, TAG, {"limit": limit, "required": required})
    assert ctx.memory.recalls == []
    assert ctx.logs == []


async def test_recall_validates_limit_before_the_memory_is_touched() -> None:
    ctx = SimpleNamespace()  # no memory at all
    with pytest.raises(InvalidArgumentError, match="limit must be positive"):
        await recall_turn_history(ctx, TAG, {"limit": 0})


async def test_recall_failure_degrades_to_no_history() -> None:
    ctx = FakeCtx(FakeMemory(recall_error=RuntimeError("backend down")))
    assert await recall_turn_history(ctx, TAG) == []
    assert ctx.event("turn-kit.memory-recall-failed") == ("warn", {"error": "backend down"})
    assert "turn-kit.memory-recalled" not in ctx.events()


async def test_required_recall_failure_raises_the_original_error() -> None:
    error = RuntimeError("backend down")
    ctx = FakeCtx(FakeMemory(recall_error=error))
    with pytest.raises(RuntimeError) as caught:
        await recall_turn_history(ctx, TAG, {"required": True})
    assert caught.value is error
    assert ctx.event("turn-kit.memory-recall-failed") == ("warn", {"error": "backend down"})


async def test_recall_works_with_a_sync_memory() -> None:
    ctx = FakeCtx(
        SyncMemory(recalled=[item("b", "2026-07-24T12:02:00Z"), item("a", "2026-07-24T12:01:00Z")])
    )
    assert contents(await recall_turn_history(ctx, TAG)) == ["a", "b"]


async def test_recall_non_list_answer_gives_nothing() -> None:
    ctx = FakeCtx(FakeMemory(recalled={"items": []}))
    assert await recall_turn_history(ctx, TAG) == []
    assert ctx.event("turn-kit.memory-recalled") == ("info", {"entries": 0})


async def test_recall_without_a_memory_is_a_recall_failure() -> None:
    ctx = FakeCtx(memory=SimpleNamespace())
    assert await recall_turn_history(ctx, TAG) == []
    level, attrs = ctx.event("turn-kit.memory-recall-failed")
    assert level == "warn"
    assert "recall()" in attrs["error"]
    with pytest.raises(TurnKitError, match=r"ctx\.memory has no recall"):
        await recall_turn_history(ctx, TAG, {"required": True})


@pytest.mark.parametrize("tag", ["", "  ", None])
async def test_recall_rejects_a_blank_tag(tag: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="tag"):
        await recall_turn_history(FakeCtx(), tag)


async def test_logs_go_to_stdlib_logging_when_ctx_has_no_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = SimpleNamespace(memory=FakeMemory(recalled=["x"]))
    with caplog.at_level(logging.INFO, logger="turn_kit"):
        assert contents(await recall_turn_history(ctx, TAG)) == ["x"]
        assert await remember_turn(ctx, TAG, "hi", "hello")
    assert "turn-kit.memory-recalled" in caplog.text
    assert "turn-kit.memory-saved" in caplog.text


# -- remember_turn --------------------------------------------------------------------------


async def test_conformance_runner_record_with_labels_and_ttl() -> None:
    ctx = FakeCtx(FakeMemory(receipt={"id": "mem-2"}))
    saved = await remember_turn(
        ctx,
        conversation_tag(
            "life-agent", {"transport": "telegram", "id": conversation_key("8587", 42)}
        ),
        "remind me what is open",
        "You have one task: call Mom.",
        {
            "query": "recent life-agent conversation",
            "limit": 6,
            "ttlSeconds": 3600,
            "userLabel": "Khaliq",
            "assistantLabel": "life-agent",
        },
    )
    assert saved is True
    assert ctx.memory.saves == [
        (
            "Khaliq: remind me what is open\nlife-agent: You have one task: call Mom.",
            {
                "tags": ["turn:life-agent:telegram:8587%3A42"],
                "scope": "workspace",
                "ttl_seconds": 3600,
            },
        )
    ]
    assert ctx.event("turn-kit.memory-saved") == ("info", {"id": "mem-2"})


async def test_remember_turn_default_record_from_trimmed_values() -> None:
    ctx = FakeCtx()
    assert await remember_turn(ctx, TAG, "  hi there \n", "\n hello \t")
    content, options = ctx.memory.saves[0]
    assert content == "User: hi there\nAssistant: hello"
    assert options == {"tags": [TAG], "scope": "workspace"}  # no ttl_seconds when unset


async def test_remember_turn_passes_scope() -> None:
    ctx = FakeCtx()
    assert await remember_turn(ctx, TAG, "a", "b", TurnMemoryOptions(scope="user"))
    assert ctx.memory.saves[0][1] == {"tags": [TAG], "scope": "user"}


async def test_remember_turn_content_beats_serialize_beats_default() -> None:
    calls: list[tuple[str, str]] = []

    def serialize(user: str, reply: str) -> str:
        calls.append((user, reply))
        return f"  Q={user} A={reply}  "

    ctx = FakeCtx()
    options = TurnMemoryOptions(serialize=serialize)
    assert await remember_turn(ctx, TAG, " q ", " a ", options)
    assert await remember_turn(ctx, TAG, " q ", " a ", options, "  explicit record \n")
    assert [content for content, _ in ctx.memory.saves] == ["Q=q A=a", "explicit record"]
    assert calls == [("q", "a")]  # serialize gets trimmed values; not called when content given


async def test_remember_turn_serialize_returning_none_falls_back_to_default() -> None:
    ctx = FakeCtx()
    options = TurnMemoryOptions(serialize=lambda user, reply: None)  # type: ignore[arg-type,return-value]
    assert await remember_turn(ctx, TAG, "q", "a", options)
    assert ctx.memory.saves[0][0] == "User: q\nAssistant: a"


@pytest.mark.parametrize("required", [False, True])
async def test_remember_turn_empty_content_raises_whatever_required_is(required: bool) -> None:
    ctx = FakeCtx()
    options = TurnMemoryOptions(required=required)
    with pytest.raises(InvalidArgumentError, match=r"^turn memory content cannot be empty$"):
        await remember_turn(ctx, TAG, "q", "a", options, "")
    with pytest.raises(InvalidArgumentError, match=r"^turn memory content cannot be empty$"):
        await remember_turn(ctx, TAG, "q", "a", options, " \ufeff\n ")
    blank = TurnMemoryOptions(required=required, serialize=lambda user, reply: "   ")
    with pytest.raises(InvalidArgumentError, match=r"^turn memory content cannot be empty$"):
        await remember_turn(ctx, TAG, "q", "a", blank)
    assert ctx.memory.saves == []


async def test_remember_turn_rejects_non_string_arguments() -> None:
    ctx = FakeCtx()
    with pytest.raises(InvalidArgumentError, match="turn memory content must be a string"):
        await remember_turn(ctx, TAG, "q", "a", None, 5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="turn input must be a string"):
        await remember_turn(ctx, TAG, None, "a")  # type: ignore[arg-type]
    bad = TurnMemoryOptions(serialize=lambda user, reply: 5)  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidArgumentError, match="serialize"):
        await remember_turn(ctx, TAG, "q", "a", bad)
    with pytest.raises(InvalidArgumentError, match="tag"):
        await remember_turn(ctx, " ", "q", "a")
    assert ctx.memory.saves == []


async def test_conformance_missing_receipt_is_visible_but_does_not_fail() -> None:
    ctx = FakeCtx(FakeMemory(receipt=None))
    assert await remember_turn(ctx, TAG, "hello", "Hi") is False
    assert ctx.event("turn-kit.memory-save-unconfirmed") == ("warn", {})
    assert "turn-kit.memory-saved" not in ctx.events()


@pytest.mark.parametrize(
    "receipt",
    [
        None,
        {},
        {"id": None},
        {"id": ""},
        {"id": "   "},
        SimpleNamespace(),
        SimpleNamespace(id=None),
        SimpleNamespace(id=""),
        "mem-1",  # a bare string is not a receipt with an id
    ],
)
async def test_receipts_without_an_id_are_unconfirmed(receipt: Any) -> None:
    ctx = FakeCtx(FakeMemory(receipt=receipt))
    assert await remember_turn(ctx, TAG, "q", "a") is False
    assert ctx.events() == ["turn-kit.memory-save-unconfirmed"]
    required = FakeCtx(FakeMemory(receipt=receipt))
    with pytest.raises(TurnMemoryError, match=r"^turn-kit memory save returned no receipt$"):
        await remember_turn(required, TAG, "q", "a", {"required": True})
    assert required.events() == ["turn-kit.memory-save-unconfirmed"]


@pytest.mark.parametrize(
    "receipt",
    [{"id": "mem-9"}, SimpleNamespace(id="mem-9"), SaveReceipt(id="mem-9")],
)
async def test_receipts_with_an_id_confirm_the_save(receipt: Any) -> None:
    ctx = FakeCtx(FakeMemory(receipt=receipt))
    assert await remember_turn(ctx, TAG, "q", "a") is True
    assert ctx.event("turn-kit.memory-saved") == ("info", {"id": "mem-9"})


async def test_save_failure_degrades_to_false() -> None:
    ctx = FakeCtx(FakeMemory(save_error=RuntimeError("disk full")))
    assert await remember_turn(ctx, TAG, "q", "a") is False
    # The seed logs a failed save at "warn" (memory.ts at 0022e15).
    assert ctx.event("turn-kit.memory-save-failed") == ("warn", {"error": "disk full"})


async def test_required_save_failure_raises_the_original_error() -> None:
    error = RuntimeError("disk full")
    ctx = FakeCtx(FakeMemory(save_error=error))
    with pytest.raises(RuntimeError) as caught:
        await remember_turn(ctx, TAG, "q", "a", {"required": True})
    assert caught.value is error
    assert ctx.events() == ["turn-kit.memory-save-failed"]


async def test_remember_turn_works_with_a_sync_memory() -> None:
    ctx = FakeCtx(SyncMemory(receipt={"id": "sync-1"}))
    assert await remember_turn(ctx, TAG, "q", "a", {"ttl_seconds": 5}) is True
    assert ctx.memory.saves == [
        ("User: q\nAssistant: a", {"tags": [TAG], "scope": "workspace", "ttl_seconds": 5})
    ]


async def test_remember_turn_without_a_memory_is_a_save_failure() -> None:
    ctx = FakeCtx(memory=SimpleNamespace())
    assert await remember_turn(ctx, TAG, "q", "a") is False
    assert ctx.events() == ["turn-kit.memory-save-failed"]
    with pytest.raises(TurnKitError, match=r"ctx\.memory has no save"):
        await remember_turn(ctx, TAG, "q", "a", {"required": True})


# -- remember_turn_message / remember_assistant_message (case 6) ----------------------------


async def test_conformance_remember_assistant_message_saves_proactive_output() -> None:
    ctx = FakeCtx()
    tag = conversation_tag("life-agent", {"transport": "telegram", "id": conversation_key("8587")})
    assert (
        await remember_assistant_message(
            ctx, tag, "Your reminder is due tomorrow.", label="life-agent"
        )
        is True
    )
    assert ctx.memory.saves == [
        (
            "life-agent: Your reminder is due tomorrow.",
            {"tags": ["turn:life-agent:telegram:8587"], "scope": "workspace"},
        )
    ]
    assert ctx.event("turn-kit.memory-saved") == ("info", {"id": "mem-1"})


@pytest.mark.parametrize(
    ("role", "label", "expected"),
    [
        ("assistant", None, "Assistant: hi"),
        ("user", None, "User: hi"),
        ("system", None, "User: hi"),
        ("assistant", "  life-agent \n", "life-agent: hi"),
        ("user", "Khaliq", "Khaliq: hi"),
        ("assistant", "   ", "Assistant: hi"),
        ("user", "", "User: hi"),
    ],
)
async def test_remember_turn_message_labels(role: str, label: str | None, expected: str) -> None:
    ctx = FakeCtx()
    assert await remember_turn_message(ctx, TAG, role, "  hi \n", label=label)
    assert ctx.memory.saves[0][0] == expected


async def test_remember_turn_message_passes_scope_ttl_and_required() -> None:
    ctx = FakeCtx()
    assert await remember_turn_message(ctx, TAG, "user", "x", scope="user", ttl_seconds=60)
    assert ctx.memory.saves[0][1] == {"tags": [TAG], "scope": "user", "ttl_seconds": 60}
    unconfirmed = FakeCtx(FakeMemory(receipt={}))
    assert await remember_assistant_message(unconfirmed, TAG, "x") is False
    with pytest.raises(TurnMemoryError):
        await remember_assistant_message(unconfirmed, TAG, "x", required=True)


@pytest.mark.parametrize("message", ["", "   ", "\n\ufeff\t"])
async def test_remember_turn_message_rejects_blank_messages(message: str) -> None:
    ctx = FakeCtx()
    with pytest.raises(InvalidArgumentError, match=r"^turn memory message cannot be empty$"):
        await remember_assistant_message(ctx, TAG, message)
    with pytest.raises(InvalidArgumentError, match=r"^turn memory message cannot be empty$"):
        await remember_turn_message(ctx, TAG, "user", message, required=True)
    assert ctx.memory.saves == []


# -- against the real runtime memory (``store``: every backend) -----------------------------


async def test_round_trip_through_conversation_memory(store: Store) -> None:
    ctx = FakeCtx(ConversationMemory(store))
    other = conversation_tag("life-agent", {"transport": "telegram", "id": "other"})
    options = {
        "ttlSeconds": 3600,
        "userLabel": "Khaliq",
        "assistantLabel": "life-agent",
        "required": True,
    }
    assert await remember_turn(ctx, TAG, "first question", "first answer", options) is True
    assert await remember_assistant_message(
        ctx, TAG, "Your reminder is due tomorrow.", label="life-agent"
    )
    assert await remember_turn(ctx, other, "elsewhere", "not here") is True
    assert await remember_turn(ctx, TAG, "second question", "second answer", options) is True

    history = await recall_turn_history(ctx, TAG, {"required": True})
    assert contents(history) == [
        "Khaliq: first question\nlife-agent: first answer",
        "life-agent: Your reminder is due tomorrow.",
        "Khaliq: second question\nlife-agent: second answer",
    ]
    assert all(entry.created_at is not None and entry.created_at.tzinfo is UTC for entry in history)
    assert ctx.event("turn-kit.memory-recalled") == ("info", {"entries": 3})
    saved_ids = [attrs["id"] for _, name, attrs in ctx.logs if name == "turn-kit.memory-saved"]
    assert len(saved_ids) == 4
    assert all(isinstance(ident, str) and ident for ident in saved_ids)

    limited = await recall_turn_history(ctx, TAG, {"limit": 2})
    assert contents(limited) == [
        "life-agent: Your reminder is due tomorrow.",
        "Khaliq: second question\nlife-agent: second answer",
    ]
