"""What differs between the SQL backends, said once per backend: the :class:`Dialect`.

The store core (:mod:`._base` and the modules beside it) writes each operation once, in SQL
both SQLite (3.35 or later) and PostgreSQL read alike, with a dialect's fragments where they
part: table names (PostgreSQL's live in a schema), the insertion-order column, row locks,
lists as parameters, sets of rows as parameters, the time a statement stamps, notifications
sent with a commit, and memory search (FTS5 on SQLite, word arrays ranked in Python on
PostgreSQL). A dialect holds no connection and no state but its names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ..._types import MemoryRecord
from ._program import Op

__all__ = ["Dialect", "RecallQuery"]


class RecallQuery:
    """What :meth:`Dialect.recall_memory` searches for (the store protocol's arguments)."""

    __slots__ = ("limit", "namespace", "now", "scope", "tags", "terms")

    def __init__(
        self,
        *,
        namespace: str,
        terms: list[str],
        tags: list[str],
        scope: str | None,
        limit: int,
        now: float,
    ) -> None:
        self.namespace, self.terms, self.tags = namespace, terms, tags
        self.scope, self.limit, self.now = scope, limit, now


class Dialect(ABC):
    """The SQL fragments and the programs one backend writes its own way."""

    t: str
    """The prefix of every table name: ``""`` on SQLite, the quoted schema and a dot on
    PostgreSQL (``"agency".``)."""
    seq: str
    """The column of ``runs`` and ``memory_items`` that orders rows by insertion."""
    for_update: str
    """A row lock taken by a ``SELECT`` in a transaction (``""`` where a transaction holds the
    whole database, as SQLite's ``BEGIN IMMEDIATE`` does)."""
    for_share: str
    """A shared row lock (``""`` on SQLite)."""
    skip_locked: str
    """An exclusive row lock that passes over rows another transaction holds."""
    bytewise: str
    """The collation that orders text by its bytes (SQLite's default)."""
    unindexed: str
    """A prefix of a column that keeps the planner from reading it through an index (SQLite's
    unary ``+``; ``""`` on PostgreSQL, whose planner weighs the index by its statistics)."""
    no_limit: int | None
    """The ``LIMIT`` that means none."""
    now: str
    """The time a statement stamps: the ``%(now)s`` parameter (the store's clock), else the
    server's clock where there is one."""
    server_now: str | None
    """A ``SELECT`` of the server's time, or ``None`` when the store always has a clock."""
    session_gone: str = "(1 = 0)"
    """A condition on a ``runs`` row: its holder's liveness session is known to be gone (the
    process died), so its lease need not be waited out. Never true where holders have no
    sessions (SQLite: a lease, and the same-machine dead-process check, tell)."""
    session_set: str = ""
    """The ``SET`` fragment a claim writes the claimer's session with (``%(session)s``)."""
    folds: bool = False
    """Whether each statement is a round trip to a server worth folding away: then the
    core's hot programs send one statement where they would send several (a claim as one
    data-modifying ``WITH``, a journal as one ``UNION ALL`` read), written in SQL only that
    server reads. ``False`` where a statement is a function call in the process (SQLite):
    there the plain statements are as fast, and read straight from their indexes."""

    @property
    def memory_columns(self) -> str:
        """A recalled row's columns (on ``memory_items m``), in the order the core reads them."""
        return (
            "m.id, m.namespace, m.content, m.tags, m.scope, m.created_at, m.expires_at, "
            f"m.{self.seq}"
        )

    @abstractmethod
    def among(self, param: str, *, negated: bool = False) -> str:
        """The fragment after a column that tests it against the list ``%(param)s``
        (``IN`` the list; ``negated``: not in it)."""

    @abstractmethod
    def array(self, values: Sequence[str]) -> Any:
        """``values`` as the parameter :meth:`among` reads."""

    @abstractmethod
    def rows_of(self, param: str, columns: Sequence[tuple[str, str]]) -> str:
        """A table expression ``x`` whose rows are the JSON array of objects in
        ``%(param)s`` (see :func:`~._base.json_rows`), with ``columns`` ((name, SQL type)
        pairs) as its columns."""

    @abstractmethod
    def notifying(self, statement: str, returning: str) -> str:
        """``statement`` (an ``INSERT``, ``UPDATE`` or ``DELETE``) returning ``returning``,
        and telling every process that waits on runs to look again once it commits (with the
        first returned column). Its rows are the returned columns and one more to ignore."""

    @abstractmethod
    def serialized(self, *keys: str) -> Op[None]:
        """Statements that make the rest of this transaction the only one for ``keys`` at a
        time (none where a write transaction is the only one anyway)."""

    # -- memory search: the tables differ (an FTS5 index; word arrays) -----------------------

    @abstractmethod
    def save_memory(self, record: MemoryRecord) -> Op[bool]:
        """Save ``record`` and index its words; ``False`` when its id was saved before."""

    @abstractmethod
    def memory_filter(self, query: RecallQuery) -> tuple[str, dict[str, Any]]:
        """The ``WHERE`` condition on ``memory_items m`` that picks the items ``query`` may
        return (namespace, not expired, scope, every tag), and its parameters."""

    @abstractmethod
    def search_memory(
        self, query: RecallQuery, where: str, params: dict[str, Any]
    ) -> Op[list[tuple[Any, ...]]]:
        """The items of ``where`` holding any of ``query.terms``, best first by bm25 (newest
        first on ties), at most ``query.limit`` (none when negative): rows of
        :attr:`memory_columns`, perhaps with more columns after them."""

    @abstractmethod
    def purge_memory(self, now: float) -> Op[int]:
        """Delete the items expired by ``now`` with their index entries; how many."""
