"""Deterministic addresses for concurrent branches: each task's causal position.

Everything a run counts — nested scope entries, step ids, interrupts and LLM calls made
outside steps, checkpoints, guards, memory operations — is addressed by where it happens.
When one task does these things in sequence, a counter per address is enough (``inner``,
``inner~1``, ``llm#0``, step ``order/3``). Concurrent tasks reach them in an order that
depends on timing, and on replay (where completed steps return at once) that order changes:
counted by arrival, two branches would swap each other's journals and answers.

So every task carries a :class:`Cursor` in a ``ContextVar`` (asyncio and trio give each task
its own copy of the context). A cursor is relative to a *base*, the address a scope body, a
step or a journaled call runs at, and names the task's *branch* there: ``""`` for the task
that opened the base, else the path of task spawns that led to it, each written
``<events>.<n>`` — "the n-th task its parent started after its e-th counted event" — joined
with ``+``. Both numbers are facts of the parent's own deterministic history, so a branch
gets the same name on every replay, however the scheduler interleaves. A branch other than
the base's own task qualifies what it counts with its name (``2.0:inner``, step
``order/2.0:0``, ``order/2.0:llm#0``); the base's own task counts exactly as before.

Spawn order has to be seen when a task is created, before it runs: on asyncio by a task
factory installed on the running loop (chained to any factory already there), on trio by an
instrument. A task created some other way (a worker thread, a factory installed after ours)
is noticed at its first counted event and named by arrival instead (``?``-marked), which is
no worse than counting by arrival; the journal's checks (step and scope names, interrupt
effects and messages) still refuse to hand it a wrong result.

A cursor also names the journaled unit its task runs in: the unit's
:class:`~agency_runtime._core._changes.Recorder`, which the durable layer gives the base it
opens for the unit and which the tasks started inside share (a spawned cursor keeps it).
Code that changes the run's state reports into it (:func:`report_change`,
:func:`report_spend`); one ``ContextVar`` holds both, so a unit sets one per run, not two.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ._changes import Change, Recorder

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "Cursor",
    "at_base",
    "close_base",
    "current_recorder",
    "install_spawn_hook",
    "open_base",
    "qualify",
    "recording",
    "report_change",
    "report_spend",
    "run_root",
    "tick",
]

logger = logging.getLogger("agency_runtime.branches")


class Cursor:
    """One task's causal position relative to a base address (see the module docstring)."""

    __slots__ = ("base", "branch", "events", "owner", "parent", "recorder", "spawned", "where")

    def __init__(
        self,
        base: str,
        branch: str,
        parent: Cursor | None,
        owner: int | None,
        recorder: Recorder | None = None,
    ) -> None:
        self.base = base
        self.branch = branch
        self.parent = parent
        self.owner = owner
        self.recorder = recorder
        """The recorder of the journaled unit the task runs in (``None``: nobody listens)."""
        self.where: tuple[int, Any] | None = None
        """The thread and the asyncio loop the owner was last seen running on as the loop's
        current task (``None`` when not seen so, e.g. on trio): :func:`tick`'s quick test."""
        self.events = 0
        """Counted events this task made at this base so far."""
        self.spawned = 0
        """Tasks this task started since its last counted event."""

    def spawn(self, *, marker: str = "") -> Cursor:
        """The cursor of a task started now by the task holding this cursor."""
        key = f"{marker}{self.events}.{self.spawned}"
        self.spawned += 1
        branch = f"{self.branch}+{key}" if self.branch else key
        return Cursor(self.base, branch, self.parent, None, self.recorder)

    def __repr__(self) -> str:
        return f"<Cursor base={self.base!r} branch={self.branch!r} events={self.events}>"


_CURSOR: contextvars.ContextVar[Cursor | None] = contextvars.ContextVar(
    "agency_cursor", default=None
)


_asyncio: Any = None
"""The asyncio module, once something imported it: looked up, never imported here (trio runs
need none, and no asyncio loop can run before asyncio is imported)."""
_asyncio_tasks: Any = None
"""asyncio's dict of each loop's current task (3.11-3.13), read directly: the fast path."""


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop, or ``None`` (also while asyncio is not imported at all)."""
    global _asyncio, _asyncio_tasks
    if _asyncio is None:
        module = sys.modules.get("asyncio")
        if module is None:
            return None
        _asyncio_tasks = getattr(module.tasks, "_current_tasks", None)
        _asyncio = module
    loop: asyncio.AbstractEventLoop | None = _asyncio._get_running_loop()
    return loop


def _current_task() -> int:
    """An identity for the running task (a thread's id outside any task)."""
    return _running_task()[0]


def _running_task() -> tuple[int, tuple[int, Any] | None]:
    """:func:`_current_task`, and the thread and loop when it is an asyncio loop's current
    task as read from ``_asyncio_tasks`` (what :attr:`Cursor.where` keeps)."""
    loop = _running_loop()
    if loop is not None:
        if _asyncio_tasks is not None:
            task = _asyncio_tasks.get(loop)
            if task is not None:
                return id(task), (threading.get_ident(), loop)
        else:
            task = _asyncio.current_task(loop)
            if task is not None:
                return id(task), None
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            return id(trio.lowlevel.current_task()), None
        except RuntimeError:
            pass
    return threading.get_ident(), None


_get_ident = threading.get_ident

_warned_unhooked = False


def _mine() -> Cursor | None:
    """The current task's cursor, branching off when it was inherited without the hook."""
    cursor = _CURSOR.get()
    if cursor is None:
        return None
    task, where = _running_task()
    if cursor.owner == task:
        cursor.where = where
        return cursor
    if cursor.owner is None:
        cursor.owner, cursor.where = task, where
        return cursor
    global _warned_unhooked
    if not _warned_unhooked:
        _warned_unhooked = True
        logger.debug(
            "a task started without agency's spawn hook counts inside a run; its addresses "
            "follow arrival order (journal checks still apply)"
        )
    child = cursor.spawn(marker="?")
    child.owner, child.where = task, where
    _CURSOR.set(child)
    return child


def tick(address: str) -> str:
    """Count one event of the current task at ``address``; return its branch there.

    ``""`` when the task is the one that opened ``address`` (or outside any run).
    """
    cursor = _CURSOR.get()
    if cursor is None:
        return ""
    # Every step ticks. The common case, an asyncio task counting on its own cursor, is
    # tested without asking asyncio for the running loop (on 3.11 that is a getpid() system
    # call): the owner is the current task of the loop it was last seen on, in the same
    # thread (a thread runs one loop at a time). Anything else takes :func:`_mine`'s look.
    where = cursor.where
    if (
        where is None
        or where[0] != _get_ident()
        or id(_asyncio_tasks.get(where[1])) != cursor.owner
    ):
        cursor = _mine()
        assert cursor is not None
    cursor.events += 1
    cursor.spawned = 0
    if cursor.base == address:
        return cursor.branch
    return _relative(cursor, address)


def _relative(cursor: Cursor, address: str) -> str:
    """The branch of ``cursor``'s task relative to ``address`` (an enclosing base)."""
    suffix = ""
    current: Cursor | None = cursor
    while current is not None:
        if current.base == address:
            return current.branch + suffix
        if current.branch:
            # A task spawned inside a nested base: name that base too (without '/').
            import hashlib  # on first use: it loads OpenSSL, which the import needs not

            marker = hashlib.blake2b(current.base.encode(), digest_size=3).hexdigest()
            suffix = f"[{marker}]{current.branch}{suffix}"
        current = current.parent
    return suffix


def qualify(branch: str, text: str) -> str:
    """``text`` as counted by ``branch`` (unchanged for the base's own task)."""
    return f"{branch}:{text}" if branch else text


def open_base(base: str, recorder: Recorder | None = None) -> contextvars.Token[Cursor | None]:
    """Open ``base`` (a scope body, a step, a journaled call) for the current task.

    ``recorder``: the recorder of the journaled unit opened at ``base`` (without one, the
    enclosing unit's stays current). Returns the token :func:`close_base` takes back (a
    plain pair of calls, not a context manager: it runs once per step).
    """
    # Every caller counted an event at the enclosing base just before (tick), which made
    # sure the current cursor is this task's own: no second look at the running task.
    parent = _CURSOR.get()
    if parent is None:
        return _CURSOR.set(Cursor(base, "", None, _current_task(), recorder))
    if recorder is None:
        recorder = parent.recorder
    cursor = Cursor(base, "", parent, parent.owner, recorder)
    cursor.where = parent.where
    return _CURSOR.set(cursor)


def close_base(token: contextvars.Token[Cursor | None]) -> None:
    """Close what :func:`open_base` opened."""
    _CURSOR.reset(token)


@contextmanager
def at_base(base: str) -> Iterator[None]:
    """:func:`open_base` / :func:`close_base` as a context manager."""
    token = open_base(base)
    try:
        yield
    finally:
        _CURSOR.reset(token)


@contextmanager
def run_root(recorder: Recorder | None = None) -> Iterator[Cursor]:
    """The cursor of a run's entry (its base is the run root, ``""``).

    ``recorder`` collects what the entry changes outside journaled units (a run's root);
    without one, the current unit's (if any) stays current.
    """
    install_spawn_hook()
    owner, where = _running_task()
    if recorder is None:
        recorder = current_recorder()
    cursor = Cursor("", "", None, owner, recorder)
    cursor.where = where
    token = _CURSOR.set(cursor)
    try:
        yield cursor
    finally:
        _CURSOR.reset(token)


# -- reporting to the running unit ------------------------------------------------------------


def current_recorder() -> Recorder | None:
    """The recorder of the journaled unit the current task runs in (``None``: nobody listens)."""
    cursor = _CURSOR.get()
    return None if cursor is None else cursor.recorder


def recording() -> bool:
    """Whether a running journaled unit keeps the changes reported now."""
    recorder = current_recorder()
    return recorder is not None and recorder.changes is not None


def report_change(change: Change) -> None:
    """Report a change to the journaled unit that is running, if any."""
    recorder = current_recorder()
    if recorder is not None and recorder.changes is not None:
        recorder.changes.append(change)


def report_spend(pico: int, tokens: int) -> None:
    """Count spend as made by the journaled unit that is running (or the run's root)."""
    recorder = current_recorder()
    if recorder is not None:
        recorder.pico += pico
        recorder.tokens += tokens


# -- seeing tasks being spawned -----------------------------------------------------------------


class _TaskFactory:
    """An asyncio task factory that gives each task started inside a run its own cursor."""

    __slots__ = ("inner",)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        context: contextvars.Context | None = kwargs.pop("context", None)
        parent = (context.get(_CURSOR) if context is not None else _CURSOR.get()) is not None
        if parent:
            own = _mine() if context is None else context.get(_CURSOR)
            context = context.copy() if context is not None else contextvars.copy_context()
            if own is not None:
                context.run(_CURSOR.set, own.spawn())
        if self.inner is None:
            return _asyncio.Task(coro, loop=loop, context=context, **kwargs)
        if context is None:
            return self.inner(loop, coro, **kwargs)
        return self.inner(loop, coro, context=context, **kwargs)


_trio_runs: weakref.WeakSet[Any] = weakref.WeakSet()


def _trio_instrument() -> Any:
    import trio

    class _TrioSpawns(trio.abc.Instrument):
        """Gives each trio task started inside a run its own cursor."""

        def task_spawned(self, task: Any) -> None:
            if _CURSOR.get() is None:
                return
            own = _mine()
            if own is None:
                return
            child = own.spawn()
            child.owner = id(task)
            task.context.run(_CURSOR.set, child)

    return _TrioSpawns()


def install_spawn_hook() -> None:
    """Make sure tasks started from now on in this event loop get their own cursors."""
    loop = _running_loop()
    if loop is not None:
        if not isinstance(loop.get_task_factory(), _TaskFactory):
            loop.set_task_factory(_TaskFactory(loop.get_task_factory()))
        return
    trio = sys.modules.get("trio")
    if trio is None:
        return
    try:
        token = trio.lowlevel.current_trio_token()
    except RuntimeError:
        return
    if token not in _trio_runs:
        trio.lowlevel.add_instrument(_trio_instrument())
        _trio_runs.add(token)
