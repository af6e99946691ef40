"""The semantics every store backend shares, written once.

Who may claim a run (:func:`claim_decision`), which words a memory query searches
(:func:`query_terms`, read like FTS5's tokenizer reads them), and how recall ranks matches
(:func:`bm25_scores`, the ranking SQLite's FTS5 computes, done in Python for stores without
a full-text index).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence

from .._types import RunRecord

__all__ = ["bm25_scores", "claim_decision", "query_terms", "text_tokens"]


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


def bm25_scores(
    terms: Sequence[str], documents: Sequence[Sequence[str]], corpus: Sequence[Sequence[str]]
) -> list[float]:
    """FTS5's ``bm25()`` of each of ``documents`` (token lists) for an OR query of ``terms``.

    ``corpus`` is every document of the full-text index (what FTS5 counts ``N`` and the
    average length over: all namespaces, expired items not yet purged). Lower is better, as
    in SQLite; a document matching no term scores ``0.0``. Stores without a full-text index
    rank recall with it, so every backend picks the same items.
    """
    total = len(corpus)
    if not total or not terms:
        return [0.0 for _ in documents]
    average = sum(len(tokens) for tokens in corpus) / total or 1.0
    holding = {term: sum(1 for tokens in corpus if term in tokens) for term in terms}
    weights = {
        term: max(math.log((total - n + 0.5) / (n + 0.5)), 1e-6) for term, n in holding.items()
    }
    scores: list[float] = []
    for tokens in documents:
        length = len(tokens)
        score = 0.0
        for term in terms:
            count = tokens.count(term)
            if count:
                norm = BM25_K1 * (1 - BM25_B + BM25_B * length / average)
                score -= weights[term] * count * (BM25_K1 + 1) / (count + norm)
        scores.append(score)
    return scores


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
