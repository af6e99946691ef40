"""Named locks: ``agency.with_lock(name, fn)`` and ``async with agency.lock(name):``.

Two scopes:

* ``scope="run"`` (default) — a FIFO mutex per name, private to one run (it lives on the
  run's :class:`~agency_runtime.RuntimeContext`). The default owner is the current task, so
  concurrent tasks contend and a task that locks a name it already holds is caught
  (:class:`LockReentryError`) instead of deadlocking.
* ``scope="global"`` — a lock shared by every process that uses the same store (the run's
  store, or ``store=``). Waiters take a ticket from the store and poll until theirs is the
  lowest live one; the holder renews its ticket's lease in the background, so a holder that
  dies stops blocking others once its lease (:data:`GLOBAL_LOCK_LEASE_SECONDS`) runs out.

Both release in ``finally`` (idempotently); a waiter that times out or is cancelled gives
up its place in the queue at once, so it never blocks the waiters behind it. Locks have no
cycle detection: a task that waits for a lock held by the task that spawned it deadlocks
(use ``timeout=``).
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

import anyio
from anyio.lowlevel import RunVar

from ._bounds import check_seconds
from ._clock import SYSTEM_CLOCK, Clock
from ._core._context import RuntimeContext, Slot
from ._core._frame import Frame, call_in_frame, current_frame, current_frame_maybe
from ._durable._leases import holder_is_dead, owner_id
from ._errors import InvalidArgumentError, LockReentryError, LockTimeoutError, NotInRunError
from ._store import LockTable, Store, resolve_store

__all__ = [
    "GLOBAL_LOCK_LEASE_SECONDS",
    "HeldLock",
    "LockScope",
    "lock",
    "share_run_locks",
    "with_lock",
]

T = TypeVar("T")

LockScope = Literal["run", "global"]

logger = logging.getLogger("agency_runtime.locks")

RUN_LOCKS: Slot[dict[str, _RunLock]] = Slot("locks")


def share_run_locks(parent: RuntimeContext, child: RuntimeContext) -> None:
    """Give the child run ``child`` the run-scoped locks of ``parent`` (and so of the root
    run): a parent and its children exclude each other on one name, as the Agency language's
    child delegates acquisition to its parent."""
    child.put(RUN_LOCKS, parent.ensure(RUN_LOCKS, dict))


"""The run's named locks, by name (made on the first lock the run takes)."""

GLOBAL_LOCK_LEASE_SECONDS = 30.0
"""How long a global lock's ticket stays valid without renewal (renewed every third of it).

A holder (or waiter) that dies blocks the others at most this long. Read at each
acquisition, so tests may shorten it.
"""

_POLL_MIN = 0.005
_POLL_MAX = 0.2


@dataclass(frozen=True, slots=True)
class HeldLock:
    """What ``async with agency.lock(name) as held:`` gives: the lock and who holds it.

    ``lost`` is set when a global lock's lease ran out before it was renewed (the event loop
    stalled for most of a lease): another owner may hold the lock now, so work that must
    never run twice at once (a Telegram poller's ``getUpdates``) should stop when it is set.
    """

    name: str
    owner: str
    scope: LockScope
    lost: anyio.Event = field(default_factory=anyio.Event, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class _Request:
    name: str
    owner_id: str | None
    timeout: float | None
    warn_after: float
    scope: LockScope
    frame: Frame | None
    store: LockTable | None
    lease: float | None = None


def _seconds(value: object, what: str, member: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise InvalidArgumentError(
            f"agency.{member}: {what} must be a number of seconds, got {value!r}"
        )
    return float(value)


def _request(
    member: str,
    name: str,
    owner_id: str | None,
    timeout: float | None,
    warn_after: float | None,
    scope: str,
    store: str | Store | None,
    lease: float | None = None,
) -> _Request:
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(
            f"agency.{member} needs a lock name: a non-empty string, got {name!r}"
        )
    if owner_id is not None and (not isinstance(owner_id, str) or not owner_id):
        raise InvalidArgumentError(
            f"agency.{member}: owner_id must be a non-empty string or None, got {owner_id!r}"
        )
    limit: float | None = None
    if timeout is not None:
        limit = check_seconds(timeout, f"agency.{member}: timeout (None: wait forever)")
    warn = 0.0 if warn_after is None else _seconds(warn_after, "warn_after", member)
    if scope not in ("run", "global"):
        raise InvalidArgumentError(
            f"agency.{member}: scope must be 'run' (a lock private to the run) or 'global' "
            f"(shared by every process using the store), got {scope!r}"
        )
    if store is not None and scope != "global":
        raise InvalidArgumentError(
            f"agency.{member}: store= is only used by scope='global' locks; "
            "drop it or pass scope='global'"
        )
    if lease is not None:
        lease = check_seconds(lease, f"agency.{member}: lease", positive=True)
        if scope != "global":
            raise InvalidArgumentError(
                f"agency.{member}: lease is a number of seconds > 0 for scope='global' locks, "
                f"got {lease!r} with scope={scope!r}"
            )
    checked: LockScope = "run" if scope == "run" else "global"
    # A global lock on an explicit store needs no run: a server process may hold one.
    frame = current_frame_maybe()
    if frame is None and not (checked == "global" and store is not None):
        frame = current_frame(member)  # raises OutsideFrameError, saying how to fix it
    resolved: LockTable | None = None
    if checked == "global":
        resolved = resolve_store(store) if store is not None else None
        if resolved is None and frame is not None:
            resolved = frame.ctx.store
        if resolved is None:
            raise NotInRunError(
                f"agency.{member}: lock {name!r} with scope='global' needs a run with a store "
                "(call it inside `agency.run(...)`) or an explicit store= "
                "(a URL such as 'sqlite:///agency.db', or a Store)"
            )
    return _Request(name, owner_id, limit, warn, checked, frame, resolved, lease)


@overload
def with_lock(
    name: str,
    fn: Callable[[], Awaitable[T]],
    *,
    owner_id: str | None = None,
    timeout: float | None = None,
    warn_after: float = 30.0,
    scope: LockScope = "run",
    store: str | Store | None = None,
    lease: float | None = None,
) -> Coroutine[Any, Any, T]: ...


@overload
def with_lock(
    name: str,
    fn: Callable[[], T],
    *,
    owner_id: str | None = None,
    timeout: float | None = None,
    warn_after: float = 30.0,
    scope: LockScope = "run",
    store: str | Store | None = None,
    lease: float | None = None,
) -> Coroutine[Any, Any, T]: ...


def with_lock(
    name: str,
    fn: Callable[[], T | Awaitable[T]],
    *,
    owner_id: str | None = None,
    timeout: float | None = None,
    warn_after: float = 30.0,
    scope: LockScope = "run",
    store: str | Store | None = None,
    lease: float | None = None,
) -> Coroutine[Any, Any, T]:
    """Run ``fn`` (sync or async, no arguments) while holding the lock ``name``.

    Waiters acquire in arrival order. ``owner_id`` defaults to the current task;
    re-acquiring a lock its owner already holds raises :class:`LockReentryError`.
    ``timeout`` (seconds) bounds the wait (:class:`LockTimeoutError`); after ``warn_after``
    seconds of waiting a warning names the waiter and the holder (``<= 0`` disables it).
    ``scope="global"`` shares the lock with every process using the run's store (or
    ``store=``, which also works outside a run); its ticket's lease lasts ``lease`` seconds
    (default :data:`GLOBAL_LOCK_LEASE_SECONDS`) and is renewed every third of it. The lock is
    released when ``fn`` returns or raises.
    """
    if not callable(fn):
        raise InvalidArgumentError(
            f"agency.with_lock() needs fn: a callable taking no arguments (sync or async), "
            f"got {type(fn).__name__}"
        )
    request = _request("with_lock()", name, owner_id, timeout, warn_after, scope, store, lease)
    return _run_locked(request, fn)


def lock(
    name: str,
    *,
    owner_id: str | None = None,
    timeout: float | None = None,
    warn_after: float = 30.0,
    scope: LockScope = "run",
    store: str | Store | None = None,
    lease: float | None = None,
) -> AbstractAsyncContextManager[HeldLock]:
    """``async with agency.lock(name) as held:`` — the context-manager form of
    :func:`with_lock` (same arguments); ``held`` is a :class:`HeldLock`."""
    return _hold(_request("lock()", name, owner_id, timeout, warn_after, scope, store, lease))


async def _run_locked(request: _Request, fn: Callable[[], T | Awaitable[T]]) -> T:
    async with _hold(request):
        if request.frame is not None:
            return await call_in_frame(request.frame, fn)
        value = fn()
        if inspect.isawaitable(value):
            return await value
        return value


@asynccontextmanager
async def _hold(request: _Request) -> AsyncIterator[HeldLock]:
    task = anyio.get_current_task().id
    if request.scope == "run":
        owner = request.owner_id or f"task:{task}"
        assert request.frame is not None
        run_lock = await _acquire_run(request.frame.ctx, request, owner)
        try:
            yield HeldLock(request.name, owner, "run")
        finally:
            run_lock.release(owner)
        return
    store = request.store
    assert store is not None
    owner = request.owner_id or owner_id(str(task))
    ticket, lease = await _acquire_global(store, request, owner)
    clock = SYSTEM_CLOCK if request.frame is None else request.frame.ctx.clock
    held = HeldLock(request.name, owner, "global")
    outcome: BaseException | None = None
    try:
        # The task group renews the lease while the body runs. Its body must not raise
        # (anyio would wrap the error in an ExceptionGroup): the outcome is re-raised below.
        async with anyio.create_task_group() as renewals:
            renewals.start_soon(_renew, store, request.name, ticket, owner, lease, clock, held.lost)
            try:
                yield held
            except BaseException as exc:
                outcome = exc
            finally:
                renewals.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await _release_global(store, request.name, ticket, owner)
    if outcome is not None:
        raise outcome


def _format(seconds: float) -> str:
    return f"{seconds:g}"


def _timed_out(name: str, timeout: float) -> LockTimeoutError:
    return LockTimeoutError(f"Timed out waiting for lock '{name}' after {_format(timeout)}s")


def _warn(name: str, warn_after: float, waiter: str, holder: str | None) -> None:
    logger.warning(
        "Still waiting for lock '%s' after %ss (waiter %s, current owner %s)",
        name,
        _format(warn_after),
        waiter,
        holder if holder is not None else "<none>",
    )


# -- scope="run": a FIFO mutex per name on the run's context ------------------------------


class _Waiter:
    __slots__ = ("event", "granted", "owner")

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.granted = False
        self.event = anyio.Event()


class _RunLock:
    """One name's mutex. Release hands the lock straight to the first waiter (FIFO)."""

    __slots__ = ("holder", "name", "registry", "waiters")

    def __init__(self, name: str, registry: dict[str, _RunLock]) -> None:
        self.name = name
        self.registry = registry
        self.holder: str | None = None
        self.waiters: deque[_Waiter] = deque()

    def release(self, owner: str) -> None:
        """Release (or pass on) the lock if ``owner`` holds it; otherwise do nothing."""
        if self.holder != owner:
            return
        if self.waiters:
            waiter = self.waiters.popleft()
            waiter.granted = True
            self.holder = waiter.owner
            waiter.event.set()
            return
        self.holder = None
        if self.registry.get(self.name) is self:
            del self.registry[self.name]

    def withdraw(self, waiter: _Waiter) -> None:
        """Take a waiter that gave up out of the queue (or pass the lock on if granted)."""
        if waiter.granted:
            self.release(waiter.owner)
            return
        self.waiters.remove(waiter)
        if self.holder is None and not self.waiters and self.registry.get(self.name) is self:
            del self.registry[self.name]


async def _acquire_run(ctx: RuntimeContext, request: _Request, owner: str) -> _RunLock:
    registry = ctx.ensure(RUN_LOCKS, dict)
    run_lock = registry.get(request.name)
    if run_lock is None:
        run_lock = registry[request.name] = _RunLock(request.name, registry)
    if run_lock.holder == owner:
        raise LockReentryError(f"Owner '{owner}' already holds lock '{request.name}'")
    if run_lock.holder is None:
        run_lock.holder = owner
        return run_lock
    waiter = _Waiter(owner)
    run_lock.waiters.append(waiter)
    try:
        await _await_grant(waiter, run_lock, request)
    except BaseException:
        run_lock.withdraw(waiter)
        raise
    return run_lock


async def _await_grant(waiter: _Waiter, run_lock: _RunLock, request: _Request) -> None:
    start = anyio.current_time()
    deadline = math.inf if request.timeout is None else start + request.timeout
    warn_at = start + request.warn_after if request.warn_after > 0 else math.inf
    while not waiter.granted:
        now = anyio.current_time()
        # The warning first: a wait past both (a stalled loop) still says it was long.
        if now >= warn_at:
            _warn(request.name, request.warn_after, waiter.owner, run_lock.holder)
            warn_at = math.inf
        if now >= deadline:
            assert request.timeout is not None
            raise _timed_out(request.name, request.timeout)
        until = min(deadline, warn_at)
        if until == math.inf:
            await waiter.event.wait()
        else:
            with anyio.move_on_after(until - now):
                await waiter.event.wait()


# -- scope="global": tickets in the store ----------------------------------------------------


class HeldLocks:
    """The global locks this process holds: (store url, name) → (owner, ticket).

    One per process (:data:`HELD`, referred to by the composition root), so a task that asks
    again for a global lock its owner holds is caught, whichever run it is in.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: dict[tuple[str, str], tuple[str, int]] = {}

    def get(self, key: tuple[str, str]) -> tuple[str, int] | None:
        """Who holds the lock ``key`` here, with which ticket."""
        with self._guard:
            return self._held.get(key)

    def hold(self, key: tuple[str, str], owner: str, ticket: int) -> None:
        """Note that ``owner`` holds ``key`` with ``ticket``."""
        with self._guard:
            self._held[key] = (owner, ticket)

    def drop(self, key: tuple[str, str], owner: str, ticket: int) -> None:
        """Forget ``key`` if ``owner``'s ``ticket`` is what holds it."""
        with self._guard:
            if self._held.get(key) == (owner, ticket):
                del self._held[key]


HELD = HeldLocks()
"""The process's held global locks."""

_wakeups: RunVar[dict[tuple[str, str], anyio.Event]] = RunVar("agency_lock_wakeups")
"""Per event loop: (store url, name) -> an event set when a task of this loop releases that
lock, so waiters on the same loop poll again at once instead of after their backoff."""


def _wakeup_table() -> dict[tuple[str, str], anyio.Event]:
    table = _wakeups.get(None)
    if table is None:
        table = {}
        _wakeups.set(table)
    return table


async def _acquire_global(store: LockTable, request: _Request, owner: str) -> tuple[int, float]:
    name = request.name
    key = (store.url, name)
    held = HELD.get(key)
    if held is not None and held[0] == owner:
        raise LockReentryError(f"Owner '{owner}' already holds lock '{name}'")
    lease = GLOBAL_LOCK_LEASE_SECONDS if request.lease is None else request.lease
    start = anyio.current_time()
    deadline = math.inf if request.timeout is None else start + request.timeout
    warn_at = start + request.warn_after if request.warn_after > 0 else math.inf
    ticket = await store.enqueue_lock(name, owner, lease)
    renewed = anyio.current_time()
    try:
        delay = _POLL_MIN
        while True:
            polled = anyio.current_time()
            if polled - renewed > lease * 0.8:
                # The loop stalled for most of a lease: our ticket may have been dropped as
                # dead. Queue again rather than poll a ticket that can never win.
                await store.release_lock(name, ticket)
                ticket = await store.enqueue_lock(name, owner, lease)
                polled = anyio.current_time()
            if await store.lock_turn(name, ticket, owner, lease):
                break
            renewed = polled
            holder = await store.lock_holder(name)
            if holder is not None and holder[0] != ticket and holder_is_dead(holder[1]):
                # The holder was a process of this machine that died: free its ticket now
                # instead of waiting for its lease to run out.
                await store.release_lock(name, holder[0])
                continue
            now = anyio.current_time()
            # The warning first: a wait past both (a stalled loop) still says it was long.
            if now >= warn_at:
                _warn(name, request.warn_after, owner, holder[1] if holder else None)
                warn_at = math.inf
            if now >= deadline:
                assert request.timeout is not None
                raise _timed_out(name, request.timeout)
            wakeups = _wakeup_table()
            wakeup = wakeups.get(key)
            if wakeup is None:
                wakeup = wakeups[key] = anyio.Event()
            with anyio.move_on_after(min(delay, deadline - now)):
                await wakeup.wait()
            delay = _POLL_MIN if wakeup.is_set() else min(delay * 2, _POLL_MAX)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await _release_global(store, name, ticket, owner)
        raise
    HELD.hold(key, owner, ticket)
    return ticket, lease


async def _renew(
    store: LockTable,
    name: str,
    ticket: int,
    owner: str,
    lease: float,
    clock: Clock,
    lost: anyio.Event,
) -> None:
    """Keep a held global lock's lease alive until cancelled (on the clock of its leases);
    set ``lost`` when it was lost."""
    while True:
        await clock.sleep(lease / 3)
        try:
            still_held = await store.lock_turn(name, ticket, owner, lease)
        except Exception as exc:
            logger.warning(
                "Could not renew the lease of lock '%s' (owner %s): %s", name, owner, exc
            )
            continue
        if not still_held:
            logger.error(
                "Lost lock '%s' (owner %s): its lease of %ss expired before it was renewed "
                "(was the event loop blocked?); another owner may hold it now",
                name,
                owner,
                _format(lease),
            )
            lost.set()
            return


async def _release_global(store: LockTable, name: str, ticket: int, owner: str) -> None:
    key = (store.url, name)
    HELD.drop(key, owner, ticket)
    try:
        await store.release_lock(name, ticket)
    except Exception as exc:  # never mask the body's outcome; the lease frees the ticket
        logger.warning(
            "Could not release lock '%s' (owner %s): %s; it frees itself when its lease "
            "expires (within %ss)",
            name,
            owner,
            exc,
            _format(GLOBAL_LOCK_LEASE_SECONDS),
        )
    finally:
        wakeup = _wakeup_table().pop(key, None)
        if wakeup is not None:
            wakeup.set()
