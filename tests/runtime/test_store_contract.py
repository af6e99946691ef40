"""Every store backend keeps the same semantics: a contract run against each of them.

Recall is the subtle one: SQLite (and the memory store, SQLite in memory) ranks keyword
matches with FTS5's ``bm25()``, PostgreSQL with the same formula in Python
(``_store._rules.Bm25``) over the same words (``text_tokens``, read like FTS5's
``unicode61`` tokenizer). Here every backend (the shared ``store`` fixture) is given one
corpus — varied lengths, repeated terms, common and rare words, accents, two namespaces,
expired items — and must pick the same items for every query as the memory store, the
reference.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from agency_runtime import MemoryStore, Store
from agency_runtime._store._rules import Bm25, text_tokens
from agency_runtime._types import MemoryRecord

pytestmark = pytest.mark.anyio

CORPUS = [
    ("a1", "alpha", "the tea order shipped late and the customer asked twice about tea"),
    ("a2", "alpha", "tea"),
    ("a3", "alpha", "a long note about coffee coffee coffee and a little tea at the end of it"),
    ("a4", "alpha", "Café au lait for Ada; she prefers email over phone calls"),
    ("a5", "alpha", "refund approved for order 42 after the delivery failed"),
    ("a6", "alpha", "the order of the day: shipping, billing, refunds and more shipping"),
    ("a7", "alpha", "ada asked about her refund again; the refund is on its way"),
    ("b1", "beta", "tea tea tea tea tea in another namespace entirely"),
    ("b2", "beta", "order order order"),
    ("x1", "alpha", "expired: tea order refund ada cafe"),
]
QUERIES = [
    "tea",
    "order",
    "tea order",
    "refund ada",
    "cafe",
    "CAFÉ",
    "shipping refunds",
    "coffee tea",
    "nothing matches this",
    "the",
]
NOW = 1_000.0


async def _fill(store: Store) -> None:
    for index, (item_id, namespace, content) in enumerate(CORPUS):
        await store.save_memory(
            MemoryRecord(
                id=item_id,
                namespace=namespace,
                content=content,
                tags=["t"],
                created_at=100.0 + index,
                expires_at=NOW - 1 if item_id.startswith("x") else None,
            )
        )


async def _recall_all(store: Store) -> dict[tuple[str, int], list[str]]:
    await _fill(store)
    chosen: dict[tuple[str, int], list[str]] = {}
    for query in QUERIES:
        for limit in (1, 2, 3, 8):
            found = await store.recall_memory(
                namespace="alpha", query=query, tags=["t"], scope=None, limit=limit, now=NOW
            )
            chosen[(query, limit)] = [item.id for item in found]
    return chosen


async def test_every_backend_recalls_the_same_items(store: Store) -> None:
    by_reference = await _recall_all(MemoryStore())
    by_backend = await _recall_all(store)
    assert by_backend == by_reference
    # and the ranking is a real one: the short, tea-only item wins a one-item tea recall
    assert by_backend[("tea", 1)] == ["a2"]
    assert by_backend[("CAFÉ", 8)] == ["a4"]  # accents and case as FTS5 folds them


def test_text_tokens_read_words_as_fts5_does() -> None:
    assert text_tokens("Café au lait, ORDER #42 (snake_case)") == [
        "cafe",
        "au",
        "lait",
        "order",
        "42",
        "snake",
        "case",
    ]


def test_bm25_prefers_rare_terms_and_short_documents() -> None:
    texts = ["tea", "tea order", "coffee " * 5 + "tea", "order"]
    counts = [Counter(text_tokens(text)) for text in texts]
    holding = sum(1 for words in counts if "tea" in words)
    ranking = Bm25(len(texts), sum(words.total() for words in counts), {"tea": holding})
    scores = [ranking.score(words) for words in counts]
    assert scores[0] < scores[1] < scores[2] < 0  # lower is better
    assert scores[3] == 0.0


async def test_a_recall_with_no_match_returns_the_newest(store: Store) -> None:
    await _fill(store)
    found = await store.recall_memory(
        namespace="alpha", query="zzz", tags=["t"], scope=None, limit=2, now=NOW
    )
    assert [item.id for item in found] == ["a7", "a6"]


def test_a_journal_entrys_fields_are_the_step_columns() -> None:
    """The core commits a step from the entry's fields by name (``JournalEntry.__dict__``)."""
    from agency_runtime._store._rows import STEP_COLUMNS
    from agency_runtime._types import JournalEntry

    assert set(JournalEntry.model_fields) == set(STEP_COLUMNS)


async def test_a_step_reads_back_as_committed_whichever_columns_are_empty(store: Store) -> None:
    """The core writes an empty nullable column as a literal NULL (a statement per
    combination): every combination stores what the entry holds, and the lease still
    fences each of them."""
    import itertools

    from agency_runtime._types import JournalEntry, RunRecord

    now = time.time()
    run = RunRecord(run_id="r", status="queued", entry="e", arguments="[]",
                    created_at=now, updated_at=now)  # fmt: skip
    assert await store.claim_run(run, owner="o", lease_seconds=30) is not None
    nullable = {"locals": '{"k": 1}', "scopes": '[["", 0, "s"]]', "deltas": "[]", "error": "{}"}
    committed = []
    for seq, empty in enumerate(itertools.product((False, True), repeat=len(nullable)), 1):
        pairs = zip(nullable.items(), empty, strict=True)
        given = {column: None if gone else text for (column, text), gone in pairs}
        entry = JournalEntry(run_id="r", seq=seq, path=f"s/{seq}", name="n", callsite="x:1",
                             result=str(seq), cost_pico=seq, tokens=2, created_at=1.5,
                             **given)  # fmt: skip
        assert await store.commit_step(entry, owner="o")
        assert not await store.commit_step(entry.model_copy(update={"path": "x"}), owner="other")
        committed.append(entry)
    assert (await store.load_journal("r")).entries == committed
