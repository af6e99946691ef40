"""The core's global locks: a queue of tickets per name, each held by a lease."""

from __future__ import annotations

from ._base import CoreBase
from ._program import Op, Sql

__all__ = ["LocksCore"]


class LocksCore(CoreBase):
    """:class:`~agency_runtime._store.LockTable`'s operations."""

    async def enqueue_lock(self, name: str, owner: str, lease_seconds: float) -> int:
        t = self._d.t

        def work() -> Op[int]:
            # Tickets of one name are handed out one transaction at a time, so a ticket is
            # visible before any later one is (ticket order is arrival order).
            yield from self._d.serialized(name)
            now = yield from self._now()
            params = {"name": name, "owner": owner, "now": now, "until": now + lease_seconds}
            yield Sql(f"DELETE FROM {t}locks WHERE name = %(name)s AND expires_at <= %(now)s",
                      params)  # fmt: skip
            row = (
                yield Sql(
                    f"INSERT INTO {t}locks (name, owner, expires_at) "
                    "VALUES (%(name)s, %(owner)s, %(until)s) RETURNING ticket",
                    params,
                )
            ).one()
            assert row is not None
            return int(row[0])

        return await self._run(f"queue for lock {name!r}", work, tx=True)

    async def lock_holder(self, name: str) -> tuple[int, str] | None:
        d = self._d
        query = (
            f"SELECT ticket, owner FROM {d.t}locks WHERE name = %(name)s "
            f"AND expires_at > {d.now} ORDER BY ticket LIMIT 1"
        )

        def work() -> Op[tuple[int, str] | None]:
            row = (yield Sql(query, {"name": name, "now": self._now_param()})).one()
            return None if row is None else (int(row[0]), str(row[1]))

        return await self._run(f"read the holder of lock {name!r}", work)

    async def lock_turn(self, name: str, ticket: int, owner: str, lease_seconds: float) -> bool:
        t = self._d.t

        def work() -> Op[bool]:
            now = yield from self._now()
            params = {"name": name, "ticket": ticket, "owner": owner, "now": now,
                      "until": now + lease_seconds}  # fmt: skip
            renewed = yield Sql(
                f"UPDATE {t}locks SET expires_at = %(until)s WHERE ticket = %(ticket)s "
                "AND name = %(name)s AND owner = %(owner)s",
                params,
            )
            yield Sql(f"DELETE FROM {t}locks WHERE name = %(name)s AND expires_at <= %(now)s",
                      params)  # fmt: skip
            first = (
                yield Sql(f"SELECT min(ticket) FROM {t}locks WHERE name = %(name)s", params)
            ).one()
            return renewed.rowcount == 1 and first is not None and first[0] == ticket

        return await self._run(f"take a turn at lock {name!r}", work, tx=True)

    async def release_lock(self, name: str, ticket: int) -> None:
        query = f"DELETE FROM {self._d.t}locks WHERE ticket = %(ticket)s AND name = %(name)s"

        def work() -> Op[None]:
            yield Sql(query, {"ticket": ticket, "name": name})

        await self._run(f"release lock {name!r}", work)
