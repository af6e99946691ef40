"""Conversation memory: the ``ctx.memory`` surface turn_kit saves turns to and recalls from.

:class:`ConversationMemory` keeps short items of text (a turn, a remembered message) tagged
by conversation, in the same :class:`~agency_runtime.Store` the runs use::

    memory = ConversationMemory()
    receipt = await memory.save("User: hi\\nAssistant: hello", tags=["telegram:42"])
    items = await memory.recall("hello", tags=["telegram:42"], limit=8)

Which store: the one given to the constructor (a URL or a :class:`Store`); else, when called
inside a run, that run's store; else ``AGENCY_STORE`` (or the default store). The choice is
made on every call, so one object serves code inside and outside runs alike.

Failure rules follow the turn-kit ``WorkforceCtx`` memory: :meth:`~ConversationMemory.save`
never raises for a store failure (it logs a warning on the ``agency_runtime.memory`` logger
and returns ``None``, an unconfirmed save), and :meth:`~ConversationMemory.recall` logs and
returns ``[]`` unless ``fail_on_error=True``. Bad arguments always raise
:class:`~agency_runtime.InvalidArgumentError`.

Recall ranks by keywords (SQLite FTS5 ``bm25``) when any live item matches the query, else
returns the most recent items; either way the answer is newest first. Items past their
``ttl_seconds`` never come back and are deleted by a purge that runs at most once a minute
(of the memory's clock) per :class:`ConversationMemory`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from pydantic import AwareDatetime, ConfigDict, Field

from .._bounds import check_seconds
from .._clock import SYSTEM_CLOCK, Clock
from .._core._frame import current_frame_maybe, position_of
from .._durable._journal import journal_of
from .._errors import AgencyError, InvalidArgumentError, StoreError
from .._store import MemoryIndex, Store
from .._store._url import resolve_store
from .._types import DeferredModel, MemoryRecord

__all__ = ["ConversationMemory", "MemoryItem", "SaveReceipt"]

logger = logging.getLogger("agency_runtime.memory")

PURGE_INTERVAL_SECONDS = 60.0
"""Expired items are purged at most this often (clock seconds) per ConversationMemory."""

MAX_RECALL_LIMIT = 100_000
"""The largest ``limit`` :meth:`ConversationMemory.recall` accepts."""

_MAX_PURGE_ENTRIES = 64  # stores remembered for purge throttling before forgetting them all


class SaveReceipt(DeferredModel):
    """The confirmation of a saved item: its id (what turn_kit calls the receipt)."""

    model_config = ConfigDict()

    id: str = Field(description="The id of the stored item, e.g. 'mem_3f2a…'.")


class MemoryItem(DeferredModel):
    """One recalled item of conversation memory."""

    model_config = ConfigDict()

    id: str
    content: str
    tags: list[str]
    scope: str
    created_at: AwareDatetime = Field(description="When the item was saved (UTC).")


class ConversationMemory:
    """Tagged, expiring, keyword-ranked memory of conversations, kept in a run store.

    Args:
        store: A store URL or :class:`Store`. ``None`` (the default) means the current run's
            store inside a run, else ``AGENCY_STORE`` or the default store; it is looked up
            on each call.
        namespace: Partitions items within a store; two memories with different namespaces
            never see each other's items.
        clock: Where time comes from (a :class:`~agency_runtime.Clock`, or a callable
            returning seconds since the epoch); stamps items, computes expiry and paces
            purges. Default: the run's clock inside a run, else the system clock.

    Items saved through one object get strictly increasing timestamps (a clock reading
    that does not move forward is bumped by the smallest float step), so items saved in
    quick succession are recalled newest first even on coarse clocks.
    """

    __slots__ = ("_clock", "_explicit", "_last_created", "_namespace", "_purged_at", "_store")

    def __init__(
        self,
        store: str | Store | None = None,
        *,
        namespace: str = "conversations",
        clock: Callable[[], float] | Clock | None = None,
    ) -> None:
        if store is not None and not isinstance(store, str) and not isinstance(store, Store):
            raise InvalidArgumentError(
                "store must be a store URL string, a Store instance or None, "
                f"got {type(store).__name__}"
            )
        if isinstance(store, str) and not store.strip():
            raise InvalidArgumentError("store must be a non-empty store URL when given")
        if not isinstance(namespace, str) or not namespace.strip():
            raise InvalidArgumentError(f"namespace must be a non-empty string, got {namespace!r}")
        if clock is not None and not callable(clock) and not isinstance(clock, Clock):
            raise InvalidArgumentError(
                "clock must be a Clock or a callable returning seconds since the epoch, "
                f"got {type(clock).__name__}"
            )
        self._explicit = store
        self._store: Store | None = None  # the explicit store, once resolved
        self._namespace = namespace
        self._clock = clock.time if isinstance(clock, Clock) else clock
        self._last_created = -math.inf
        self._purged_at: dict[str, float] = {}

    @property
    def namespace(self) -> str:
        """The namespace this memory's items live in."""
        return self._namespace

    def store(self) -> Store:
        """The store a call made now would use (see the class docstring)."""
        if self._explicit is not None:
            if self._store is None:
                self._store = resolve_store(self._explicit)
            return self._store
        frame = current_frame_maybe()
        if frame is not None and frame.ctx.store is not None:
            return frame.ctx.store
        return resolve_store(None)

    # -- saving ----------------------------------------------------------------------------

    async def save(
        self,
        content: str,
        *,
        tags: Sequence[str],
        scope: str = "workspace",
        ttl_seconds: float | None = None,
    ) -> SaveReceipt | None:
        """Store ``content`` under ``tags`` and ``scope``; return its receipt.

        ``ttl_seconds`` (a positive number) makes the item expire that long after now.
        Returns ``None`` when the store failed (logged as a warning): the save is then
        unconfirmed, which turn_kit reports or, for a required save, raises.

        Raises:
            InvalidArgumentError: ``content`` is blank, ``tags`` is not a list of non-empty
                strings, ``scope`` is blank, or ``ttl_seconds`` is not a positive number.
        """
        if not isinstance(content, str):
            raise InvalidArgumentError(
                f"memory content must be a string, got {type(content).__name__}"
            )
        if not content.strip():
            raise InvalidArgumentError("memory content cannot be empty")
        tag_list = _check_tags(tags, "tags")
        _check_scope(scope)
        if ttl_seconds is not None:
            check_seconds(ttl_seconds, "ttl_seconds (None: kept until forgotten)", positive=True)
        store: MemoryIndex | None = None
        try:
            created_at = self._stamp()
            record = MemoryRecord(
                id=self._item_id(content, tag_list, scope),
                namespace=self._namespace,
                content=content,
                tags=tag_list,
                scope=scope,
                created_at=created_at,
                expires_at=None if ttl_seconds is None else created_at + float(ttl_seconds),
            )
            store = self.store()
            await store.save_memory(record)
        except Exception as exc:
            _warn(
                f"conversation memory could not save an item (namespace {self._namespace!r}"
                f"{_where(store)}); the save is unconfirmed",
                exc,
            )
            return None
        return SaveReceipt(id=record.id)

    # -- recalling -------------------------------------------------------------------------

    async def recall(
        self,
        query: str,
        *,
        tags: Sequence[str] | None = None,
        limit: int = 8,
        scope: str | None = None,
        fail_on_error: bool = False,
    ) -> list[MemoryItem]:
        """Up to ``limit`` live items carrying every one of ``tags`` (and ``scope``).

        The best keyword matches of ``query`` when any item matches, else the most recent
        items; newest first either way. A store failure is logged as a warning and gives
        ``[]``, unless ``fail_on_error`` is true: then it raises.

        Raises:
            InvalidArgumentError: ``limit`` is not a positive integer, ``tags`` is not a
                list of non-empty strings, ``scope`` is blank, or ``query`` is not a string.
            StoreError: with ``fail_on_error=True``, when the store failed (a failure that
                is not an :class:`~agency_runtime.AgencyError` is chained as the cause).
        """
        if not isinstance(query, str):
            raise InvalidArgumentError(f"query must be a string, got {type(query).__name__}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise InvalidArgumentError(f"limit must be a positive integer, got {limit!r}")
        if limit > MAX_RECALL_LIMIT:
            raise InvalidArgumentError(f"limit must be at most {MAX_RECALL_LIMIT}, got {limit}")
        tag_list = [] if tags is None else _check_tags(tags, "tags")
        if scope is not None:
            _check_scope(scope)
        store: MemoryIndex | None = None
        try:
            store = self.store()
            now = self._now()
            await self._maybe_purge(store, now)
            records = await store.recall_memory(
                namespace=self._namespace,
                query=query,
                tags=tag_list,
                scope=scope,
                limit=limit,
                now=now,
            )
            records = sorted(records, key=lambda r: -r.created_at)[:limit]
            return [
                MemoryItem(
                    id=r.id,
                    content=r.content,
                    tags=list(r.tags),
                    scope=r.scope,
                    created_at=datetime.fromtimestamp(r.created_at, tz=UTC),
                )
                for r in records
            ]
        except Exception as exc:
            message = (
                f"conversation memory could not recall (namespace {self._namespace!r}"
                f"{_where(store)})"
            )
            if fail_on_error:
                if isinstance(exc, AgencyError):
                    raise
                raise StoreError(f"{message}: {type(exc).__name__}: {exc}") from exc
            _warn(f"{message}; returning no items", exc)
            return []

    # -- forgetting ------------------------------------------------------------------------

    async def forget(self, ids: Sequence[str]) -> int:
        """Make the items with ``ids`` expire now (they never return); return how many.

        Unknown ids (and ids of another namespace) are ignored. The rows are deleted by the
        next purge.

        Raises:
            InvalidArgumentError: ``ids`` is not a list of non-empty strings.
            StoreError: the store failed.
        """
        id_list = _check_tags(ids, "ids")
        if not id_list:
            return 0
        try:
            return await self.store().expire_memory(self._namespace, id_list, at=self._now())
        except AgencyError:
            raise
        except Exception as exc:
            raise StoreError(
                f"conversation memory could not forget items (namespace {self._namespace!r}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    # -- internals -------------------------------------------------------------------------

    def _now(self) -> float:
        """Seconds since the epoch: the given clock, else the run's clock, else the system's."""
        if self._clock is not None:
            return float(self._clock())
        frame = current_frame_maybe()
        return (frame.ctx.clock if frame is not None else SYSTEM_CLOCK).time()

    def _item_id(self, content: str, tags: list[str], scope: str) -> str:
        """The id of an item saved now: derived from where it is saved inside a run.

        Inside a run the id is a digest of the run id, the saving step's path, the save's
        ordinal there and the item itself, so a step that runs again after a crash (its
        save stored, its commit lost) saves the same item under the same id: once. Outside a
        run it is random.
        """
        frame = current_frame_maybe()
        if frame is None or frame.ctx.run_id is None:
            return f"mem_{uuid.uuid4().hex}"
        journal = journal_of(frame.ctx)
        address = position_of(frame).address
        token = journal.next_token(address, "memory-save")
        key = "\x00".join([frame.ctx.run_id, address, token, self._namespace, scope, content,
                           *tags])  # fmt: skip
        return f"mem_{hashlib.blake2b(key.encode(), digest_size=16).hexdigest()}"

    def _stamp(self) -> float:
        """The clock's reading, strictly after the previous stamp of this memory."""
        now = self._now()
        if not math.isfinite(now):
            raise InvalidArgumentError(f"the memory clock returned {now!r}, not a time")
        if now <= self._last_created:
            now = math.nextafter(self._last_created, math.inf)
        self._last_created = now
        return now

    async def _maybe_purge(self, store: MemoryIndex, now: float) -> None:
        """Delete expired items of ``store`` unless that was done in the last minute.

        A failed purge is logged and not retried before the interval passes; it never fails
        the recall (expired items are filtered out by the recall itself).
        """
        key = _store_key(store)
        last = self._purged_at.get(key)
        if last is not None and abs(now - last) < PURGE_INTERVAL_SECONDS:
            return
        if len(self._purged_at) >= _MAX_PURGE_ENTRIES:
            self._purged_at.clear()
        self._purged_at[key] = now
        try:
            await store.purge_memory(now=now)
        except Exception as exc:
            _warn(f"conversation memory could not purge expired items{_where(store)}", exc)

    def __repr__(self) -> str:
        store = "<run store or AGENCY_STORE>" if self._explicit is None else self._explicit
        return f"<ConversationMemory namespace={self._namespace!r} store={store!r}>"


def _check_tags(tags: object, what: str) -> list[str]:
    """``tags`` as a list of distinct non-empty strings, in order; else InvalidArgumentError."""
    if isinstance(tags, str | bytes) or not isinstance(tags, Sequence):
        raise InvalidArgumentError(
            f"{what} must be a list of strings, got {type(tags).__name__} "
            f"{tags!r:.80}" + (f" (write [{tags!r}] for one)" if isinstance(tags, str) else "")
        )
    for tag in tags:
        if not isinstance(tag, str) or not tag.strip():
            raise InvalidArgumentError(f"each of {what} must be a non-empty string, got {tag!r}")
    return list(dict.fromkeys(tags))


def _check_scope(scope: object) -> None:
    if not isinstance(scope, str) or not scope.strip():
        raise InvalidArgumentError(f"scope must be a non-empty string, got {scope!r}")


def _store_key(store: MemoryIndex) -> str:
    try:
        return f"{store.url}#{id(store)}"
    except Exception:
        return f"#{id(store)}"


def _where(store: MemoryIndex | None) -> str:
    if store is None:
        return ""
    try:
        return f", store {store.url}"
    except Exception:
        return f", store {type(store).__name__}"


def _warn(message: str, exc: Exception) -> None:
    """Log a store failure at WARNING (with the traceback when it is not an AgencyError)."""
    logger.warning(
        "%s: %s: %s",
        message,
        type(exc).__name__,
        exc,
        exc_info=None if isinstance(exc, AgencyError) else exc,
    )
