"""The store core: every store operation written once, as a program, over a dialect.

* :mod:`._program` — programs (generators of :class:`Sql` statements) and how one is driven;
* :mod:`._dialect` — :class:`Dialect`, what differs between SQLite and PostgreSQL;
* :mod:`._base` — :class:`CoreBase`: the executor seam (``_run``), time, and shared pieces;
* one module per concern: :mod:`._runs`, :mod:`._journal`, :mod:`._retention` (pruning),
  :mod:`._queues`, :mod:`._events`, :mod:`._schedules`, :mod:`._memory`, :mod:`._locks`;

and :class:`StoreCore`, all of them: a backend is a ``StoreCore`` with a dialect and an
executor (``agency_runtime._store._sqlite``, ``agency_runtime._store._postgres``).
"""

from ._base import Check, CoreBase, Refused, json_rows
from ._dialect import Dialect, RecallQuery
from ._events import EventsCore
from ._journal import JournalCore
from ._locks import LocksCore
from ._memory import MemoryCore
from ._program import Op, Result, Sql, changed_one, drive
from ._queues import QueuesCore
from ._retention import PRUNE_BATCH, RetentionCore
from ._runs import RunsCore, parks_for_events
from ._schedules import SchedulesCore

__all__ = [
    "PRUNE_BATCH",
    "Check",
    "CoreBase",
    "Dialect",
    "Op",
    "RecallQuery",
    "Refused",
    "Result",
    "Sql",
    "StoreCore",
    "changed_one",
    "drive",
    "json_rows",
    "parks_for_events",
]


class StoreCore(
    RunsCore,
    JournalCore,
    RetentionCore,
    QueuesCore,
    EventsCore,
    SchedulesCore,
    MemoryCore,
    LocksCore,
):
    """Every operation of the :class:`~agency_runtime._store.Store` protocol, written once;
    a backend adds its :class:`Dialect` (``_d``) and its executor (``_run``)."""
