"""The semantics every store backend shares, written once.

Who may claim a run (:func:`claim_decision`), which words a memory query searches
(:func:`query_terms`, read like FTS5's tokenizer reads them), and how recall ranks matches
(:class:`Bm25`, the ranking SQLite's FTS5 computes, done in Python for the PostgreSQL store,
which has no FTS5 index).
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter
from collections.abc import Iterable

from .._types import RunRecord

__all__ = [
    "DEFAULT_QUEUE",
    "Bm25",
    "claim_decision",
    "pick_claims",
    "query_terms",
    "queued_record",
    "text_tokens",
]


def text_tokens(text: str) -> list[str]:
    """The words of ``text`` as SQLite's FTS5 ``unicode61`` tokenizer reads them.

    Runs of letters, digits and private-use characters, case-folded, with the diacritics of
    Latin letters removed (``Café`` → ``cafe``); everything else separates words.
    """
    folded = unicodedata.normalize("NFKD", text.casefold())
    tokens: list[str] = []
    current: list[str] = []
    for char in folded:
        category = unicodedata.category(char)
        if category[0] in "LN" or category == "Co":
            current.append(char)
        elif category == "Mn":  # a diacritic (decomposed above): dropped, the word goes on
            continue
        elif current:
            tokens.append("".join(current))
            current = []
    if current:
        tokens.append("".join(current))
    return tokens


def query_terms(text: str) -> list[str]:
    """The distinct words of ``text``, in order (what keyword search matches)."""
    return list(dict.fromkeys(text_tokens(text)))


BM25_K1, BM25_B = 1.2, 0.75
"""The constants of FTS5's ``bm25()``."""


class Bm25:
    """FTS5's ``bm25()`` for one OR query: the corpus's figures, then a score per document.

    ``total`` documents of ``length`` words in all; ``holding[term]``: how many documents
    hold the term. Lower is better, as in SQLite; a document with no term scores ``0.0``.
    """

    __slots__ = ("_average", "_weights")

    def __init__(self, total: int, length: int, holding: dict[str, int]) -> None:
        self._average = length / total or 1.0
        self._weights = {
            term: max(math.log((total - n + 0.5) / (n + 0.5)), 1e-6) for term, n in holding.items()
        }

    def score(self, counts: Counter[str]) -> float:
        """The score of a document whose words are counted in ``counts``."""
        norm = BM25_K1 * (1 - BM25_B + BM25_B * counts.total() / self._average)
        score = 0.0
        for term, weight in self._weights.items():
            count = counts[term]
            if count:
                score -= weight * count * (BM25_K1 + 1) / (count + norm)
        return score


def claim_decision(existing: RunRecord | None, now: float, steal_from: str | None = None) -> str:
    """What a claim does to ``existing``: ``"insert"``, ``"take"`` or ``"refuse"``.

    ``steal_from`` names a lease owner known to be dead: its lease is taken even before it
    expires. Shared by every store so their claim semantics cannot drift apart.
    """
    if existing is None:
        return "insert"
    if existing.is_final:
        return "refuse"
    if existing.lease_alive(now) and (steal_from is None or existing.lease_owner != steal_from):
        return "refuse"
    return "take"


DEFAULT_QUEUE = "default"
"""The queue of a run queued without naming one."""


def queued_record(record: RunRecord, now: float) -> RunRecord:
    """``record`` as :meth:`RunQueue.enqueue_run` stores it: queued, unclaimed, version 1."""
    return record.model_copy(
        update={
            "status": "queued",
            "queue": record.queue or DEFAULT_QUEUE,
            "attempts": 0,
            "version": 1,
            "lease_owner": None,
            "lease_expires_at": None,
            "started_at": None,
            "finished_at": None,
            "updated_at": now,
        }
    )


def pick_claims(
    candidates: Iterable[tuple[str, str | None]], room: dict[str, int], limit: int
) -> list[str]:
    """Which runnable runs a claimant takes: at most ``limit`` of ``candidates`` ((run id,
    queue) in claim order), none from a queue with no room left.

    ``room`` holds the free slots of each limited queue (its limit minus its live running
    runs); queues without a limit are absent. Shared by every store so their claims agree.
    """
    chosen: list[str] = []
    for run_id, queue in candidates:
        if len(chosen) == limit:
            break
        if queue in room:
            if room[queue] <= 0:
                continue
            room[queue] -= 1
        chosen.append(run_id)
    return chosen
