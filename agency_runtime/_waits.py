"""Durable waits: ``agency.sleep`` and ``agency.wait_for_event``.

A wait journals *when* it ends, not that it ended: ``agency.sleep(s)`` records its wake-up
time (``sleep#N``), ``wait_for_event(name, timeout=t)`` its deadline, so a run that dies in
the middle resumes with the time that remains, never the whole wait again. The event a wait
receives is journaled as its outcome (``event#N``); taking it from the store is idempotent
per wait (:meth:`EventLog.take_event` with the wait's path), so each event is consumed by
exactly one wait even when a process dies between taking and journaling it.

In a plain ``agency.run`` a wait waits in the process. A worker's run whose wait is longer
than the worker's ``park_after`` *parks*: :class:`RunParked` travels to the run boundary,
which stores the run ``waiting`` (``wake_at``, and the events that wake it) and frees the
worker's slot; a worker continues it when it falls due. A draining worker parks a wait in
progress at once.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import anyio
import anyio.lowlevel
from pydantic_core import PydanticSerializationError, from_json, to_json

from ._bounds import check_seconds
from ._clock import Clock
from ._core._frame import Frame, current_frame, position_of
from ._core._jsondata import check_name, json_problem
from ._durable._effect import journaled
from ._durable._failures import register_failure
from ._durable._journal import RunJournal, journal_of
from ._durable._parking import Parking
from ._errors import EventTimeoutError, InvalidArgumentError, NotInRunError, RunParked
from ._store import RunQueue

__all__ = [
    "EVENT_POLL_SECONDS",
    "check_event_name",
    "encode_payload",
    "sleep",
    "sleep_until",
    "wait_for_event",
]

EVENT_POLL_SECONDS = 0.5
"""How often a wait for an event looks at the store when no wake-up comes (events sent by
another process to a store without notifications)."""


def _timeout_fields(exc: EventTimeoutError) -> dict[str, Any]:
    return {"name": exc.name, "timeout": exc.timeout, "run_id": exc.run_id}


def _timeout_from(message: str, data: dict[str, Any]) -> EventTimeoutError:
    run_id = data.get("run_id")
    return EventTimeoutError(
        str(data["name"]), float(data["timeout"]), None if run_id is None else str(run_id)
    )


register_failure(EventTimeoutError, _timeout_fields, _timeout_from)
"""A wait for an event that timed out is journaled as its outcome (raised again on replay)."""


def check_event_name(name: object) -> str:
    """``name`` when it is a usable event name; else an InvalidArgumentError."""
    return check_name(name, "an event name", "payment.settled")


def encode_payload(payload: Any) -> str:
    """The JSON text an event's payload is stored as; InvalidArgumentError if it is not data."""
    problem = json_problem(payload)
    if problem is not None:
        raise InvalidArgumentError(
            f"an event payload must be JSON data, since it is stored: {problem}"
        )
    try:
        return to_json(payload).decode()
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"an event payload must be JSON data or pydantic models, since it is stored ({exc})"
        ) from exc


def _path(frame: Frame, journal: RunJournal, kind: str) -> str:
    address = position_of(frame).address
    segment = f"{kind}#{journal.next_token(address, kind)}"
    return f"{address}/{segment}" if address else segment


async def _nap(clock: Clock, journal: RunJournal, seconds: float, store: RunQueue | None) -> bool:
    """Wait up to ``seconds`` of the run's clock; with ``store``, return early when it rings
    (or after a poll). Returns whether the worker asked the run to stop meanwhile."""
    parking = journal.parking
    with anyio.CancelScope() as scope:
        cancel = None if parking is None else parking.on_request(scope.cancel)
        try:
            if store is None:
                await clock.sleep(seconds)
            else:
                async with anyio.create_task_group() as group:

                    async def timer() -> None:
                        await clock.sleep(seconds)
                        group.cancel_scope.cancel()

                    group.start_soon(timer)
                    await store.wait_for_runs(min(seconds, EVENT_POLL_SECONDS))
                    group.cancel_scope.cancel()
        finally:
            if cancel is not None:
                cancel()
    return parking is not None and parking.requested


def _parks(parking: Parking | None, seconds: float) -> bool:
    """Whether a wait of ``seconds`` parks the run (only a worker's run can park)."""
    return parking is not None and parking.parks(seconds)


async def _park(wake_at: float | None, events: tuple[str, ...] = ()) -> None:
    """Park the run: let sibling branches reach their own waits first, then unwind."""
    await anyio.lowlevel.checkpoint()
    raise RunParked(wake_at, events)


async def sleep(seconds: float | timedelta) -> None:
    """Wait ``seconds`` durably: a run resumed after a crash waits only what remains.

    The wake-up time is journaled. A worker's run sleeping longer than the worker's
    ``park_after`` parks (``status="waiting"``, ``wake_at``) and frees its slot; a worker
    continues it when due. Elsewhere it waits in the process.
    """
    seconds = check_seconds(seconds, "agency.sleep: seconds")
    frame = current_frame("sleep()")
    journal = journal_of(frame.ctx)
    clock = frame.ctx.clock

    async def wake_time() -> float:
        return clock.time() + seconds

    wake_at = await journaled(
        frame,
        _path(frame, journal, "sleep"),
        "agency.sleep",
        wake_time,
        encode=lambda at: at,
        decode=float,
    )
    await sleep_until(frame, wake_at)


async def sleep_until(frame: Frame, wake_at: float) -> None:
    """Wait until ``wake_at`` on the run's clock, durably for a time the caller journaled
    (a resumed run waits only what remains): a worker's run parks when the wait is longer
    than ``park_after`` (or the worker drains); elsewhere it waits in the process."""
    journal = journal_of(frame.ctx)
    clock = frame.ctx.clock
    while (remaining := wake_at - clock.time()) > 0:
        if _parks(journal.parking, remaining) or await _nap(clock, journal, remaining, None):
            await _park(wake_at)  # long, or the worker drains: another worker continues it
    await anyio.lowlevel.checkpoint()


async def wait_for_event(name: str, *, timeout: float | timedelta | None = None) -> Any:
    """Wait for the next event ``name`` sent to this run; return its payload.

    Events are buffered (one sent before the wait is taken at once) and each is consumed by
    exactly one wait, oldest first per name. With ``timeout`` (seconds, journaled as a
    deadline) it raises :class:`EventTimeoutError`, on every replay too. A worker's run
    parks while it waits (longer than ``park_after``) and wakes when the event comes.
    """
    name = check_event_name(name)
    limit = None if timeout is None else check_seconds(timeout, "wait_for_event: timeout")
    frame = current_frame("wait_for_event()")
    journal = journal_of(frame.ctx)
    # the run's store (the journal's, seen as the events and queue it waits on)
    store, run_id = frame.ctx.store, journal.run_id
    if journal.store is None or store is None or run_id is None:
        raise NotInRunError(
            f"agency.wait_for_event({name!r}) needs a run to send events to: call it inside "
            "agency.run(...) or a worker's run"
        )
    clock = frame.ctx.clock
    path = _path(frame, journal, "event")
    deadline: float | None = None
    if limit is not None:

        async def deadline_time() -> float:
            return clock.time() + limit

        deadline = await journaled(
            frame,
            f"{path}/deadline",
            "agency.wait_for_event:deadline",
            deadline_time,
            encode=lambda at: at,
            decode=float,
        )

    async def receive() -> Any:
        while True:
            event = await store.take_event(run_id, name, path)
            if event is not None:
                return from_json(event.payload)
            remaining = math.inf if deadline is None else deadline - clock.time()
            if remaining <= 0:
                raise EventTimeoutError(name, limit or 0.0, run_id)
            if _parks(journal.parking, remaining) or await _nap(clock, journal, remaining, store):
                await _park(deadline, (name,))

    return await journaled(
        frame,
        path,
        f"agency.wait_for_event:{name}",
        receive,
        encode=lambda payload: payload,
        decode=lambda payload: payload,
        failures=(EventTimeoutError,),
    )
