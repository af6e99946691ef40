"""The core's agent memory: the searchable index (its search is the dialect's) and documents."""

from __future__ import annotations

from typing import Any

from pydantic_core import from_json

from ..._types import MemoryRecord
from .._rules import query_terms
from ._base import CoreBase
from ._dialect import RecallQuery
from ._program import Op, Sql

__all__ = ["MemoryCore"]


class MemoryCore(CoreBase):
    """:class:`~agency_runtime._store.MemoryIndex`'s and ``DocumentStore``'s operations."""

    async def save_memory(self, record: MemoryRecord) -> bool:
        return await self._run(
            f"save memory {record.id!r}", lambda: self._d.save_memory(record), tx=True
        )

    async def recall_memory(
        self,
        *,
        namespace: str,
        query: str,
        tags: list[str],
        scope: str | None,
        limit: int,
        now: float,
    ) -> list[MemoryRecord]:
        asked = RecallQuery(
            namespace=namespace, terms=query_terms(query), tags=list(dict.fromkeys(tags)),
            scope=scope, limit=limit, now=now,
        )  # fmt: skip
        d = self._d
        where, params = d.memory_filter(asked)
        newest = {**params, "limit": d.no_limit if limit < 0 else limit}
        latest = (
            f"SELECT {d.memory_columns} FROM {d.t}memory_items m WHERE {where} "
            f"ORDER BY m.created_at DESC, m.{d.seq} DESC LIMIT %(limit)s"
        )

        def work() -> Op[list[tuple[Any, ...]]]:
            if asked.terms:
                matched = yield from d.search_memory(asked, where, params)
                if matched:
                    return matched
            # No keyword matched (or none was given): the latest items.
            return (yield Sql(latest, newest)).rows

        rows = await self._run("recall memory", work)
        rows.sort(key=lambda row: (row[5], row[7]), reverse=True)  # newest first, ties by save
        return [
            MemoryRecord(
                id=row[0], namespace=row[1], content=row[2], tags=from_json(row[3]),
                scope=row[4], created_at=row[5], expires_at=row[6],
            )
            for row in rows
        ]  # fmt: skip

    async def expire_memory(self, namespace: str, ids: list[str], *, at: float) -> int:
        d = self._d
        query = (
            f"UPDATE {d.t}memory_items SET expires_at = %(at)s "
            f"WHERE namespace = %(ns)s AND id{d.among('ids')} RETURNING id"
        )
        params = {"at": at, "ns": namespace, "ids": d.array(list(ids))}

        def work() -> Op[int]:
            hit = {item for (item,) in (yield Sql(query, params)).rows}
            return sum(1 for item in ids if item in hit)  # as many as ids named

        return await self._run("expire memory", work)

    async def purge_memory(self, *, now: float) -> int:
        return await self._run("purge expired memory", lambda: self._d.purge_memory(now), tx=True)

    async def get_document(self, namespace: str, key: str) -> str | None:
        query = f"SELECT body FROM {self._d.t}documents WHERE namespace = %(ns)s AND key = %(key)s"

        def work() -> Op[str | None]:
            row = (yield Sql(query, {"ns": namespace, "key": key})).one()
            return None if row is None else str(row[0])

        return await self._run(f"read document {namespace}/{key}", work)

    async def put_document(self, namespace: str, key: str, body: str) -> None:
        query = (
            f"INSERT INTO {self._d.t}documents (namespace, key, body) "
            "VALUES (%(ns)s, %(key)s, %(body)s) "
            "ON CONFLICT (namespace, key) DO UPDATE SET body = EXCLUDED.body"
        )

        def work() -> Op[None]:
            yield Sql(query, {"ns": namespace, "key": key, "body": body})

        await self._run(f"write document {namespace}/{key}", work)
