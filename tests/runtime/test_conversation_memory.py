"""Conversation memory (``ctx.memory`` of turn_kit): save, recall, ranking, expiry, failures."""

from __future__ import annotations

import logging
import sqlite3
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agency_runtime import (
    AgencyError,
    InvalidArgumentError,
    MemoryStore,
    SqliteStore,
    Store,
    StoreError,
    agency,
    open_store,
)
from agency_runtime._memory._conversation import (
    PURGE_INTERVAL_SECONDS,
    ConversationMemory,
    MemoryItem,
    SaveReceipt,
)
from agency_runtime._types import MemoryRecord

pytestmark = pytest.mark.anyio

T0 = 1_700_000_000.0
LOGGER = "agency_runtime.memory"


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def memory(store: Store, clock: FakeClock) -> ConversationMemory:
    return ConversationMemory(store, clock=clock)


async def save_all(
    memory: ConversationMemory, clock: FakeClock, contents: list[str], **kwargs: Any
) -> list[str]:
    """Save each of ``contents`` one second apart; return their ids."""
    ids = []
    for content in contents:
        clock.advance(1)
        receipt = await memory.save(content, **kwargs)
        assert receipt is not None
        ids.append(receipt.id)
    return ids


async def stored(store: Store, *, tags: list[str], now: float) -> list[str]:
    """Ids of the rows physically in ``store`` (live at ``now``), asked of the store itself."""
    records = await store.recall_memory(
        namespace="conversations", query="", tags=tags, scope=None, limit=1000, now=now
    )
    return [r.id for r in records]


# -- save and recall ---------------------------------------------------------------------------


async def test_save_returns_a_receipt_and_recall_finds_the_item(
    memory: ConversationMemory, clock: FakeClock
) -> None:
    receipt = await memory.save("User: hi\nAssistant: hello there", tags=["conv-A"])
    assert isinstance(receipt, SaveReceipt)
    assert receipt.id.startswith("mem_")
    items = await memory.recall("hello", tags=["conv-A"])
    assert items == [
        MemoryItem(
            id=receipt.id,
            content="User: hi\nAssistant: hello there",
            tags=["conv-A"],
            scope="workspace",
            created_at=datetime.fromtimestamp(T0, tz=UTC),
        )
    ]


async def test_ids_are_unique(memory: ConversationMemory) -> None:
    receipts = [await memory.save("same text", tags=["t"]) for _ in range(20)]
    assert len({r.id for r in receipts if r is not None}) == 20


async def test_recall_lists_newest_first(memory: ConversationMemory, clock: FakeClock) -> None:
    ids = await save_all(memory, clock, [f"turn {i}" for i in range(5)], tags=["conv-A"])
    items = await memory.recall("", tags=["conv-A"])
    assert [i.id for i in items] == ids[::-1]
    assert [i.created_at for i in items] == sorted((i.created_at for i in items), reverse=True)
    limited = await memory.recall("", tags=["conv-A"], limit=2)
    assert [i.id for i in limited] == [ids[4], ids[3]]


async def test_saves_in_the_same_clock_tick_still_recall_newest_first(
    memory: ConversationMemory,
) -> None:
    """A clock that does not move (coarse clocks) must not scramble the order of turns."""
    ids = []
    for text in ["User: one", "Assistant: two", "User: three"]:
        receipt = await memory.save(text, tags=["conv-A"])
        assert receipt is not None
        ids.append(receipt.id)
    assert [i.id for i in await memory.recall("", tags=["conv-A"])] == ids[::-1]
    assert [i.id for i in await memory.recall("user assistant", tags=["conv-A"])] == ids[::-1]


async def test_every_tag_must_match_and_conversations_stay_apart(
    memory: ConversationMemory, clock: FakeClock
) -> None:
    a = await save_all(memory, clock, ["A: invoice for March", "A: weather"], tags=["conv-A"])
    b = await save_all(memory, clock, ["B: invoice for April"], tags=["conv-B"])
    vip = await save_all(memory, clock, ["A: invoice, vip"], tags=["conv-A", "vip"])
    for query in ["", "invoice", "A", "weather", "nothing"]:
        got_b = await memory.recall(query, tags=["conv-B"])
        assert [i.id for i in got_b] == b
        assert all("conv-A" not in i.tags for i in got_b)
        got_a = await memory.recall(query, tags=["conv-A"])
        assert {i.id for i in got_a} <= set(a + vip)
        assert got_a
    both = await memory.recall("", tags=["conv-A", "vip"])
    assert [i.id for i in both] == vip
    assert both[0].tags == ["conv-A", "vip"]
    assert await memory.recall("", tags=["conv-B", "vip"]) == []
    everything = await memory.recall("", tags=None, limit=100)
    assert {i.id for i in everything} == set(a + b + vip)


async def test_scope_filter(memory: ConversationMemory, clock: FakeClock) -> None:
    ws = await save_all(memory, clock, ["shared note"], tags=["c"])
    session = await save_all(memory, clock, ["session note"], tags=["c"], scope="session")
    assert [i.id for i in await memory.recall("note", tags=["c"], scope="workspace")] == ws
    got = await memory.recall("note", tags=["c"], scope="session")
    assert [i.id for i in got] == session
    assert got[0].scope == "session"
    assert [i.id for i in await memory.recall("note", tags=["c"])] == session + ws
    assert await memory.recall("note", tags=["c"], scope="other") == []


async def test_namespaces_are_separate(store: Store, clock: FakeClock) -> None:
    one = ConversationMemory(store, namespace="one", clock=clock)
    two = ConversationMemory(store, namespace="two", clock=clock)
    await one.save("in one", tags=["t"])
    assert await two.recall("one", tags=["t"]) == []
    assert [i.content for i in await one.recall("", tags=["t"])] == ["in one"]


async def test_keyword_matches_outrank_newer_items(
    memory: ConversationMemory, clock: FakeClock
) -> None:
    old = await save_all(
        memory,
        clock,
        ["we talked about the invoice", "the invoice is paid", "unrelated chatter"],
        tags=["conv-A"],
    )
    newer = await save_all(
        memory, clock, ["good morning", "what a nice day", "see you later"], tags=["conv-A"]
    )
    got = await memory.recall("Invoice?", tags=["conv-A"], limit=2)
    assert [i.id for i in got] == [old[1], old[0]]  # the two matches, newest first
    recent = await memory.recall("submarine", tags=["conv-A"], limit=2)
    assert [i.id for i in recent] == [newer[2], newer[1]]  # no match: the most recent ones
    blank = await memory.recall("   ", tags=["conv-A"], limit=2)
    assert [i.id for i in blank] == [newer[2], newer[1]]


async def test_created_at_is_timezone_aware_utc(memory: ConversationMemory) -> None:
    await memory.save("stamped", tags=["t"])
    (item,) = await memory.recall("stamped", tags=["t"])
    assert item.created_at.tzinfo is not None
    assert item.created_at.utcoffset() == timedelta(0)
    assert item.created_at == datetime.fromtimestamp(T0, tz=UTC)


async def test_the_real_clock_stamps_now(store: Store) -> None:
    memory = ConversationMemory(store)
    before = datetime.now(UTC)
    await memory.save("now", tags=["t"])
    (item,) = await memory.recall("", tags=["t"])
    assert before - timedelta(seconds=1) <= item.created_at <= datetime.now(UTC)


async def test_unicode_items_round_trip(memory: ConversationMemory, clock: FakeClock) -> None:
    contents = [
        f"{i}: 你好世界 こんにちは 🎉👩‍👩‍👧 naïve café Ω≈ç√ «{chr(0x1F600 + i % 50)}» 한국어"
        for i in range(200)
    ]
    tags = ["chat:😀", "会話:42"]
    ids = await save_all(memory, clock, contents, tags=tags)
    items = await memory.recall("", tags=tags, limit=500)
    assert [i.id for i in items] == ids[::-1]
    assert [i.content for i in items] == contents[::-1]
    assert all(i.tags == tags for i in items)
    cjk = await memory.recall("你好世界", tags=tags, limit=3)
    assert [i.content for i in cjk] == contents[:-4:-1]


async def test_content_is_stored_as_given(memory: ConversationMemory) -> None:
    await memory.save("  padded\n", tags=["t"])
    (item,) = await memory.recall("padded", tags=["t"])
    assert item.content == "  padded\n"


async def test_duplicate_tags_are_saved_once(memory: ConversationMemory) -> None:
    await memory.save("x", tags=("a", "b", "a"))
    (item,) = await memory.recall("", tags=["a"])
    assert item.tags == ["a", "b"]


# -- expiry and forgetting ---------------------------------------------------------------------


async def test_ttl_expiry_and_purge_with_a_fake_clock(store: Store, clock: FakeClock) -> None:
    memory = ConversationMemory(store, clock=clock)
    assert await memory.recall("", tags=["c"]) == []  # first recall: a purge at T0
    short = await memory.save("short lived fact", tags=["c"], ttl_seconds=10)
    long = await memory.save("long lived fact", tags=["c"], ttl_seconds=3600)
    forever = await memory.save("permanent fact", tags=["c"])
    assert short is not None
    assert long is not None
    assert forever is not None
    assert {i.id for i in await memory.recall("fact", tags=["c"])} == {
        short.id,
        long.id,
        forever.id,
    }

    clock.advance(11)  # past the short ttl, but less than a purge interval since T0
    assert [i.id for i in await memory.recall("short", tags=["c"])] == [forever.id, long.id]
    assert short.id in await stored(store, tags=["c"], now=T0)  # still physically there

    clock.advance(PURGE_INTERVAL_SECONDS)  # now the next recall purges
    assert [i.id for i in await memory.recall("", tags=["c"])] == [forever.id, long.id]
    assert short.id not in await stored(store, tags=["c"], now=T0)  # purged
    assert set(await stored(store, tags=["c"], now=T0)) == {long.id, forever.id}

    clock.advance(3600)
    assert [i.id for i in await memory.recall("", tags=["c"])] == [forever.id]
    assert await stored(store, tags=["c"], now=T0) == [forever.id]


async def test_purge_is_physical_in_sqlite(tmp_path: Path, clock: FakeClock) -> None:
    db = tmp_path / "m.db"
    store = SqliteStore(db)
    try:
        memory = ConversationMemory(store, clock=clock)
        await memory.save("gone soon", tags=["c"], ttl_seconds=1)
        await memory.save("stays", tags=["c"])

        def rows() -> tuple[int, int, int]:
            conn = sqlite3.connect(db)
            try:
                counts = [
                    conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                    for table in ("memory_items", "memory_fts", "memory_tags")
                ]
            finally:
                conn.close()
            return counts[0], counts[1], counts[2]

        assert rows() == (2, 2, 2)
        clock.advance(5)
        await memory.recall("", tags=["c"])  # the first recall of this memory purges
        assert rows() == (1, 1, 1)
    finally:
        store.close()


class CountingStore(MemoryStore):
    """A MemoryStore that counts purges."""

    def __init__(self) -> None:
        super().__init__()
        self.purges: list[float] = []

    async def purge_memory(self, *, now: float) -> int:
        self.purges.append(now)
        return await super().purge_memory(now=now)


async def test_purge_runs_at_most_once_per_interval(clock: FakeClock) -> None:
    store = CountingStore()
    memory = ConversationMemory(store, clock=clock)
    for _ in range(10):
        await memory.recall("", tags=["c"])
        clock.advance(1)
    assert store.purges == [T0]
    clock.advance(PURGE_INTERVAL_SECONDS)
    for _ in range(5):
        await memory.recall("x", tags=["c"])
    assert store.purges == [T0, T0 + 10 + PURGE_INTERVAL_SECONDS]
    other = ConversationMemory(store, clock=clock)  # the interval is per ConversationMemory
    await other.recall("", tags=["c"])
    assert len(store.purges) == 3


async def test_forget_soft_expires_items(memory: ConversationMemory, clock: FakeClock) -> None:
    ids = await save_all(memory, clock, ["keep me", "forget me"], tags=["c"])
    assert await memory.forget([ids[1], "mem_unknown"]) == 1
    assert await memory.forget([]) == 0
    assert [i.id for i in await memory.recall("forget", tags=["c"])] == [ids[0]]
    with pytest.raises(InvalidArgumentError):
        await memory.forget(ids[0])


# -- bad arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "kwargs"),
    [
        ("", {"tags": ["t"]}),
        ("  \n\t", {"tags": ["t"]}),
        (None, {"tags": ["t"]}),
        ("ok", {"tags": "conv-A"}),
        ("ok", {"tags": ["t", ""]}),
        ("ok", {"tags": ["t", 3]}),
        ("ok", {"tags": None}),
        ("ok", {"tags": ["t"], "scope": ""}),
        ("ok", {"tags": ["t"], "ttl_seconds": -1}),
        ("ok", {"tags": ["t"], "ttl_seconds": 0}),
        ("ok", {"tags": ["t"], "ttl_seconds": float("inf")}),
        ("ok", {"tags": ["t"], "ttl_seconds": float("nan")}),
        ("ok", {"tags": ["t"], "ttl_seconds": True}),
        ("ok", {"tags": ["t"], "ttl_seconds": "10"}),
    ],
)
async def test_bad_save_arguments_raise(
    memory: ConversationMemory, content: Any, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        await memory.save(content, **kwargs)
    assert isinstance(caught.value, ValueError)
    assert await memory.recall("", limit=10) == []


@pytest.mark.parametrize(
    ("query", "kwargs"),
    [
        ("q", {"limit": 0}),
        ("q", {"limit": -3}),
        ("q", {"limit": 2.5}),
        ("q", {"limit": True}),
        ("q", {"limit": 10**9}),
        ("q", {"tags": "conv-A"}),
        ("q", {"tags": [""]}),
        ("q", {"scope": " "}),
        (None, {}),
    ],
)
async def test_bad_recall_arguments_raise(
    memory: ConversationMemory, query: Any, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        await memory.recall(query, **kwargs)
    assert isinstance(caught.value, ValueError)


def test_bad_constructor_arguments_raise() -> None:
    with pytest.raises(InvalidArgumentError):
        ConversationMemory(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        ConversationMemory(namespace="")
    with pytest.raises(InvalidArgumentError):
        ConversationMemory(clock=3.0)  # type: ignore[arg-type]


def test_a_bare_string_tag_error_says_how_to_fix_it() -> None:
    from agency_runtime._memory._conversation import _check_tags

    with pytest.raises(InvalidArgumentError, match=r"\['conv-A'\]"):
        _check_tags("conv-A", "tags")


# -- store failures ----------------------------------------------------------------------------


class BrokenStore(MemoryStore):
    """A MemoryStore whose memory methods fail with ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def save_memory(self, record: MemoryRecord) -> None:
        raise self.error

    async def recall_memory(self, **kwargs: Any) -> list[MemoryRecord]:
        raise self.error

    async def purge_memory(self, *, now: float) -> int:
        raise self.error


FAILURES = [StoreError("disk on fire"), RuntimeError("driver bug")]


@pytest.mark.parametrize("error", FAILURES, ids=["StoreError", "RuntimeError"])
async def test_a_store_failure_on_save_returns_none_and_logs(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    memory = ConversationMemory(BrokenStore(error))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert await memory.save("lost", tags=["t"]) is None
    (logged,) = [r for r in caplog.records if r.name == LOGGER]
    assert logged.levelno == logging.WARNING
    assert str(error) in logged.getMessage()
    assert "unconfirmed" in logged.getMessage()
    with pytest.raises(InvalidArgumentError):  # bad arguments still raise
        await memory.save("", tags=["t"])


@pytest.mark.parametrize("error", FAILURES, ids=["StoreError", "RuntimeError"])
async def test_a_store_failure_on_recall_returns_nothing_and_logs_or_raises(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    memory = ConversationMemory(BrokenStore(error))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert await memory.recall("anything", tags=["t"]) == []
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert messages
    assert all(str(error) in m for m in messages)
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == LOGGER)
    with pytest.raises(StoreError) as caught:
        await memory.recall("anything", tags=["t"], fail_on_error=True)
    if isinstance(error, AgencyError):
        assert caught.value is error
    else:
        assert caught.value.__cause__ is error
        assert "driver bug" in str(caught.value)


async def test_a_failed_purge_does_not_fail_the_recall(caplog: pytest.LogCaptureFixture) -> None:
    class PurgeFails(MemoryStore):
        async def purge_memory(self, *, now: float) -> int:
            raise StoreError("purge failed")

    memory = ConversationMemory(PurgeFails())
    await memory.save("still here", tags=["t"])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        items = await memory.recall("", tags=["t"], fail_on_error=True)
    assert [i.content for i in items] == ["still here"]
    assert any("purge failed" in r.getMessage() for r in caplog.records)


async def test_an_unopenable_store_counts_as_a_store_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AGENCY_STORE", "postgresql://db.example/agency")
    memory = ConversationMemory()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert await memory.save("x", tags=["t"]) is None
        assert await memory.recall("x", tags=["t"]) == []
    with pytest.raises(StoreError):
        await memory.recall("x", tags=["t"], fail_on_error=True)


# -- which store -------------------------------------------------------------------------------


async def test_inside_a_run_the_runs_store_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENCY_STORE", "memory://conv-test-not-this-one")
    memory = ConversationMemory()  # one object, used inside and outside a run
    run_store = MemoryStore()

    async def entry(text: str) -> str:
        receipt = await memory.save(text, tags=["conv-run"])
        assert receipt is not None
        items = await memory.recall(text, tags=["conv-run"])
        assert [i.id for i in items] == [receipt.id]
        return receipt.id

    result = await agency.run(entry, "remembered in the run", store=run_store)
    assert result.status == "completed"
    in_run = await run_store.recall_memory(
        namespace="conversations", query="", tags=["conv-run"], scope=None, limit=8, now=2e9
    )
    assert [r.id for r in in_run] == [result.value]
    assert await memory.recall("", tags=["conv-run"]) == []  # outside: AGENCY_STORE's store


async def test_outside_a_run_agency_store_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"memory://conv-test-{uuid.uuid4().hex}"  # a named store lives as long as the process
    monkeypatch.setenv("AGENCY_STORE", url)
    memory = ConversationMemory()
    receipt = await memory.save("from the environment", tags=["conv-env-test"])
    assert receipt is not None
    env_store = open_store(url)
    found = await env_store.recall_memory(
        namespace="conversations", query="", tags=["conv-env-test"], scope=None, limit=8, now=2e9
    )
    assert [r.id for r in found] == [receipt.id]


async def test_a_test_frame_without_a_store_falls_back_to_agency_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENCY_STORE", f"memory://conv-test-frame-{uuid.uuid4().hex}")
    memory = ConversationMemory()
    with agency.test_context():
        receipt = await memory.save("in a test frame", tags=["conv-frame"])
    assert receipt is not None
    assert [i.id for i in await memory.recall("", tags=["conv-frame"])] == [receipt.id]


async def test_an_explicit_store_wins_inside_a_run() -> None:
    mine, the_runs = MemoryStore(), MemoryStore()
    memory = ConversationMemory(mine)

    async def entry() -> str | None:
        receipt = await memory.save("explicit", tags=["t"])
        return None if receipt is None else receipt.id

    result = await agency.run(entry, store=the_runs)
    assert result.status == "completed"
    assert [i.id for i in await memory.recall("", tags=["t"])] == [result.value]
    assert await ConversationMemory(the_runs).recall("", tags=["t"]) == []


async def test_a_store_url_is_accepted(tmp_path: Path) -> None:
    memory = ConversationMemory("sqlite:///conv.db")  # relative to the working directory
    receipt = await memory.save("by url", tags=["t"])
    assert receipt is not None
    assert (tmp_path / "conv.db").exists()
    assert memory.store() is open_store(f"sqlite:///{tmp_path}/conv.db")
    memory.store().close()


# -- store behaviour this module relies on --------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        pytest.param("", id="recency"),
        pytest.param("turn", id="keyword"),
    ],
)
async def test_store_lists_equal_timestamps_in_reverse_save_order(store: Store, query: str) -> None:
    """Items stamped with the same time come back newest-saved first, on every path."""
    for name in ["first", "second", "third"]:
        await store.save_memory(
            MemoryRecord(id=name, namespace="ns", content=f"{name} turn", tags=["t"], created_at=5)
        )
    found = await store.recall_memory(
        namespace="ns", query=query, tags=["t"], scope=None, limit=8, now=10.0
    )
    assert [r.id for r in found] == ["third", "second", "first"]
