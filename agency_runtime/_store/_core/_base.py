"""The store core's base: how an operation runs, and the pieces every operation shares.

A backend (:class:`~agency_runtime._store._sqlite.SqliteStore`,
:class:`~agency_runtime._store._postgres.PostgresStore`) is the core's operations, its
:class:`~._dialect.Dialect`, and :meth:`CoreBase._run`: the executor that runs a program on
its connections. The operations live beside this module, one concern each (runs, journal,
queues, events, schedules, memory, locks), each written once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, TypeVar

from pydantic_core import to_json

from ..._clock import Clock
from ..._types import RunRecord
from .._rows import record_from, run_from
from .._wakeups import Wakeups
from ._dialect import Dialect
from ._program import Op, Result, Sql

__all__ = [
    "COLS",
    "COLUMNS",
    "VALUES",
    "Check",
    "CoreBase",
    "Refused",
    "json_rows",
    "listed",
    "record",
]

T = TypeVar("T")

COLUMNS = (
    "run_id", "status", "entry", "arguments", "model", "overrides", "value", "error",
    "interrupts", "cost_pico", "tokens", "unjournaled_pico", "unjournaled_tokens", "attempts",
    "version", "queue", "priority", "lease_owner", "lease_expires_at", "created_at",
    "started_at", "finished_at", "updated_at", "wake_at", "waiting_for", "parent_id", "root_id",
    "depth", "descendants_pico",
)  # fmt: skip
"""A run row's columns, in the order the core selects them."""
COLS = ", ".join(COLUMNS)
VALUES = ", ".join(f"%({c})s" for c in COLUMNS)

Check: TypeAlias = Literal["always", "throttled"] | None
"""Whether an operation first makes sure the store is still the one opened (the SQLite
file was not deleted or replaced): ``"always"`` for claims, pauses and outcomes,
``"throttled"`` for step commits; backends where it cannot happen ignore it."""


class Refused(Exception):
    """Internal: aborts a transaction that must leave nothing behind."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys


def json_rows(rows: Sequence[dict[str, Any]]) -> str:
    """``rows`` as the parameter :meth:`Dialect.rows_of` reads: a JSON array of objects."""
    return to_json(list(rows)).decode()


class CoreBase(ABC):
    """What every operation of the core uses: the dialect, the clock, the executor."""

    _d: Dialect
    _clock: Clock | None
    """The clock that stamps times, ``None`` for the server's (PostgreSQL only)."""
    _wakeups: Wakeups

    @property
    @abstractmethod
    def url(self) -> str:
        """The URL this store was opened from (its secrets redacted)."""

    @abstractmethod
    async def _run(
        self,
        what: str,
        work: Callable[[], Op[T]],
        *,
        tx: bool = False,
        several: bool = False,
        check: Check = None,
    ) -> T:
        """Run the program ``work()`` (``tx``: in one transaction; ``several``: it always
        sends more than one statement), its errors mapped to the store's naming ``what``."""

    def _write_now(
        self, what: Callable[[], str], query: str, params: Mapping[str, Any], *, check: Check
    ) -> int | None:
        """Run the one statement ``query``, which returns no rows, synchronously, if the
        executor runs statements inline on the calling thread (SQLite's does): how many rows
        it changed. ``None``: it does not (the caller awaits :meth:`_one`). A step's commit,
        on every step: no coroutine, :class:`Sql` or :class:`Result` around it. ``what()``
        names a failure."""
        return None

    async def _one(self, what: Callable[[], str], sql: Sql, *, check: Check = None) -> Result:
        """Run the one statement ``sql`` (a one-statement program; an executor may run it
        more directly: a step's commit is one, on every step). ``what()`` names it in errors:
        an executor that runs it inline builds that text only when it raises one."""

        def work() -> Op[Result]:
            return (yield sql)

        return await self._run(what(), work, check=check)

    def _session(self) -> int | None:
        """The liveness session this store holds for the runs it claims (``%(session)s``):
        another claimer may take them at once when the session is gone. ``None``: no session
        (their leases alone tell)."""
        return None

    def _holder_gone(self, run_id: str) -> Op[bool]:
        """Whether ``run_id`` is running under a liveness session that is gone (one
        statement where holders have sessions, none elsewhere)."""
        d = self._d
        if not d.session_set:
            return False
        row = (
            yield Sql(
                f"SELECT 1 FROM {d.t}runs WHERE run_id = %(run)s AND status = 'running' "
                f"AND {d.session_gone}",
                {"run": run_id},
            )
        ).one()
        return row is not None

    def _record_session(self, run_id: str) -> Op[None]:
        """Write this store's liveness session on the run it just inserted as running."""
        session = self._session()
        if self._d.session_set and session is not None:
            yield Sql(
                f"UPDATE {self._d.t}runs SET lease_session = %(session)s WHERE run_id = %(run)s",
                {"run": run_id, "session": session},
            )

    # -- time -----------------------------------------------------------------------------

    def _now_param(self) -> float | None:
        """The ``%(now)s`` parameter: the clock's time, ``None`` for the server's."""
        return None if self._clock is None else self._clock.time()

    def _now(self) -> Op[float]:
        """The time now: the clock's, else the server's (one statement)."""
        if self._clock is not None:
            return self._clock.time()
        assert self._d.server_now is not None
        row = (yield Sql(self._d.server_now)).one()
        assert row is not None
        return float(row[0])

    # -- runs -----------------------------------------------------------------------------

    def _fetch(self, run_id: str, *, lock: bool = False) -> Op[RunRecord | None]:
        """The run ``run_id`` (``lock``: its row locked for this transaction)."""
        d = self._d
        row = (
            yield Sql(
                f"SELECT {COLS} FROM {d.t}runs WHERE run_id = %(run)s"
                + (d.for_update if lock else ""),
                {"run": run_id},
            )
        ).one()
        return None if row is None else record(row)

    def _holds(self, lock: str) -> str:
        """A ``SELECT`` with a row when ``%(owner)s`` holds ``%(run)s``'s lease, the row
        locked by ``lock`` against a takeover until this statement or transaction ends."""
        return (
            f"SELECT 1 FROM {self._d.t}runs WHERE run_id = %(run)s AND lease_owner = %(owner)s "
            f"AND status = 'running'{lock}"
        )

    def _drop_steps(self, run_id: str, where: str, params: dict[str, Any]) -> Op[tuple[int, int]]:
        """Delete the run's steps matching ``where``; the spend they held.

        The spend stays the run's (money spent is never given back): callers add it to the
        run's unjournaled spend in the same transaction.
        """
        gone = yield Sql(
            f"DELETE FROM {self._d.t}steps WHERE run_id = %(run)s AND {where} "
            "RETURNING cost_pico, tokens",
            {**params, "run": run_id},
        )
        return sum(int(row[0]) for row in gone.rows), sum(int(row[1]) for row in gone.rows)


def record(row: Sequence[Any]) -> RunRecord:
    """The run a row of :data:`COLUMNS` holds (a damaged row raises ``StoreError``)."""
    return record_from(dict(zip(COLUMNS, row[: len(COLUMNS)], strict=True)))


def listed(row: Sequence[Any]) -> RunRecord:
    """A listed run: a damaged row is listed marked damaged (``_rows.run_from``)."""
    return run_from(dict(zip(COLUMNS, row[: len(COLUMNS)], strict=True)))
