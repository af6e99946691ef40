"""Conversation-memory benchmarks (``ctx.memory`` of turn_kit), SQLite store vs memory store.

    python3 bench/bench_memory.py

* save: ``ConversationMemory.save`` of 10 000 items spread over 100 conversation tags
  (one commit each on a WAL SqliteStore, synchronous=NORMAL), microseconds per item;
* recall, ``limit=8``, one conversation tag per call (cycling over the 100), microseconds
  per call:

  - ``""`` — no query: the 8 most recent items of the conversation;
  - no match — a query no item contains: a keyword search finds nothing, then the 8 most
    recent items;
  - topic match — a word ~10 % of the items contain (10 of the conversation's 100): the FTS5
    (bm25) path, 8 keyword matches;
  - common word — a word every item contains: the keyword path at its worst (every item of
    every conversation matches, then the tag filter applies);
  - new conversation — a tag no item carries yet (the first turn of every conversation),
    query ``"hello"`` (no item contains it);

* the same against a MemoryStore (an in-process dict with its own word index) for comparison;
* a diagnostic row: the topic-match recall straight from ``store.recall_memory``, i.e. what
  ConversationMemory adds on top (validation, purge throttling, MemoryItem building).

Recalls never purge during timing (a warm-up recall purges first; the next is 60 s away).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from agency_runtime import MemoryStore, SqliteStore, Store
from agency_runtime._memory._conversation import ConversationMemory

ITEMS = 10_000
CONVERSATIONS = 100
TOPICS = ["invoice", "weather", "garden", "holiday", "printer", "dentist", "recipe",
          "football", "mortgage", "telescope"]  # fmt: skip
SQLITE_RECALLS = 1000
MEMORY_RECALLS = 100
LIMIT = 8


def tag(i: int) -> str:
    return f"telegram:{i % CONVERSATIONS}"


def content(i: int) -> str:
    topic = TOPICS[(i // CONVERSATIONS) % len(TOPICS)]  # every conversation gets every topic
    return (
        f"User: message {i}, a question about the {topic} and a few more words\n"
        f"Assistant: an answer of some length about the {topic}, turn {i // CONVERSATIONS}"
    )


def expect(ok: bool, what: object) -> None:
    """Stop the benchmark when a measured call did not do what it should (asserts may be off)."""
    if not ok:
        raise RuntimeError(f"unexpected outcome: {what!r}")


async def fill(memory: ConversationMemory) -> float:
    """Seconds per save of ITEMS items."""
    started = time.perf_counter()
    for i in range(ITEMS):
        receipt = await memory.save(content(i), tags=[tag(i)])
        expect(receipt is not None, i)
    return (time.perf_counter() - started) / ITEMS


async def per_call(n: int, call: Callable[[int], Awaitable[int]], want: int) -> float:
    """Seconds per ``call(k)``, each of which must return ``want`` (items found)."""
    await call(0)  # warm-up (and the one purge)
    started = time.perf_counter()
    for k in range(n):
        found = await call(k)
        if found != want:
            raise RuntimeError(f"call {k} found {found} items, expected {want}")
    return (time.perf_counter() - started) / n


async def measure(store: Store, recalls: int) -> dict[str, float]:
    memory = ConversationMemory(store)
    results = {"save": await fill(memory)}

    def recall(query: str) -> Callable[[int], Awaitable[int]]:
        async def call(k: int) -> int:
            items = await memory.recall(query, tags=[tag(k)], limit=LIMIT)
            return len(items)

        return call

    async def topic_check(k: int) -> int:
        items = await memory.recall(TOPICS[k % len(TOPICS)], tags=[tag(k)], limit=LIMIT)
        expect(all(TOPICS[k % len(TOPICS)] in i.content for i in items), items)
        return len(items)

    await topic_check(3)
    results["recent"] = await per_call(recalls, recall(""), LIMIT)
    results["no match"] = await per_call(recalls, recall("submarine zeppelin"), LIMIT)
    results["topic"] = await per_call(recalls, recall("invoice"), LIMIT)
    results["common"] = await per_call(recalls, recall("answer"), LIMIT)

    async def new_conversation(k: int) -> int:
        return len(await memory.recall("hello", tags=[f"telegram:new-{k}"], limit=LIMIT))

    results["new"] = await per_call(recalls, new_conversation, 0)

    async def raw(k: int) -> int:
        records = await store.recall_memory(
            namespace=memory.namespace,
            query="invoice",
            tags=[tag(k)],
            scope=None,
            limit=LIMIT,
            now=time.time(),
        )
        return len(records)

    results["raw topic"] = await per_call(recalls, raw, LIMIT)
    return results


async def main() -> None:
    begun = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        sqlite_store = SqliteStore(Path(tmp_name) / "memory.db")
        try:
            sq = await measure(sqlite_store, SQLITE_RECALLS)
        finally:
            sqlite_store.close()
    mem = await measure(MemoryStore(), MEMORY_RECALLS)

    rows = [
        (f"save ({ITEMS} items, {CONVERSATIONS} tags), per item", "save"),
        (f'recall limit={LIMIT} by tag, query ""', "recent"),
        (f"recall limit={LIMIT} by tag, query matching nothing", "no match"),
        (f"recall limit={LIMIT} by tag, topic query (10% of items match)", "topic"),
        (f"recall limit={LIMIT} by tag, common word (every item matches)", "common"),
        (f"recall limit={LIMIT} for a new conversation (tag without items)", "new"),
        ("  (diagnostic) topic query straight from store.recall_memory", "raw topic"),
    ]
    table = [
        (label, f"{sq[key] * 1e6:,.1f} µs", f"{mem[key] * 1e6:,.1f} µs") for label, key in rows
    ]
    header = ("measure", "SqliteStore", "MemoryStore")
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(3)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in table:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    print(
        f"\n(recalls: {SQLITE_RECALLS} per SQLite row, {MEMORY_RECALLS} per memory row; "
        f"total {time.perf_counter() - begun:.1f} s)"
    )


if __name__ == "__main__":
    anyio.run(main)
