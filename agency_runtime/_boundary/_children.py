"""Child runs: ``agency.run`` inside a run starts a durable child run (DESIGN §11.2).

``await agency.run(entry, ...)`` outside a run starts a top-level run (:func:`._run.run`).
Inside one it starts a **child**: a run of its own, in the parent's store, with its own
journal, whose id defaults to ``"{parent_id}/{address}"`` (the call's deterministic position,
``run#N``), and whose record names its ``parent_id``, ``root_id`` and ``depth``. The call is
one journaled unit of the parent (``agency.run`` at its address):

* **Once.** When the child has ended, its final record is committed with the unit; a replay
  returns that outcome without touching the child. A parent that stopped while its child ran
  (killed, paused) runs the unit again: the child continues from its own journal (a live
  holder is waited for, a dead one taken over), so no committed step of the child runs twice.
* **The gate.** Before the child is created, ``std::run`` is asked through the parent's
  handlers with ``{"entry", "run_id", "depth"}``: approve starts it, reject raises
  :class:`~agency_runtime.ChildRunRejectedError` (recorded: a replay raises it again). When no
  handler decides, the child starts unless it would be deeper than
  ``agency.configure(max_run_depth=...)`` (8). The Agency language surfaces an undecided gate
  to the user; a Python agent calls sub-agents in line, as child workflows do.
* **Interrupts bubble up.** A child that pauses has each of its interrupts asked through the
  parent's handlers at the call; decided ones are answered in the child, which goes on.
  Undecided ones pause the parent, which reports them (their ``run_id`` is the child's);
  answering them (:func:`~._resume.respond_to_interrupts` on the parent or on the child)
  stores each answer in the run that asked, then continues the runs up to the parent.
* **Spend.** The child's spend is billed to the parent when the child ends (the parent's
  ``cost`` includes its descendants', ``descendants_pico`` says how much), and a cost guard
  around the call is asked about after it, as after an LLM call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.lowlevel

from .._core import _observe
from .._core._branches import qualify
from .._core._frame import Frame, current_frame_maybe, position_of
from .._durable._effect import journaled, will_replay
from .._durable._entries import location_ref
from .._durable._failures import register_failure
from .._durable._journal import CHILD_UNIT, journal_of
from .._durable._values import check_entry, encode_arguments
from .._errors import ChildRunRejectedError, InvalidArgumentError, RunConflictError, RunPaused
from .._guards import charge, gate
from .._interrupts import dispatch, interrupt_id
from .._llm._model import Model
from .._store import RunRecord, Store
from .._types import Interrupt, InterruptResponse, RunResult, bind_store
from .._waits import wait_for_event
from . import _run
from ._queue import check_queue, check_worker_entry
from ._run import (
    check_model,
    check_run_id,
    check_same_inputs,
    child_event,
    drive,
    note_trace_context,
    result_from_record,
)
from ._runtime import RUNTIME

__all__ = ["CHILD_UNIT", "run"]


async def run(
    entry: Callable[..., Any],
    *args: Any,
    run_id: str | None = None,
    queue: str | None = None,
    store: str | Store | None = None,
    model: str | Model | None = None,
    **kwargs: Any,
) -> RunResult[Any]:
    """``agency.run``: a child run inside a durable run (see the module), else a top-level
    run (:func:`._run.run`). ``queue=`` hands a child to the workers of that queue."""
    frame = current_frame_maybe()
    if frame is None or not journal_of(frame.ctx).durable:
        if queue is not None:
            raise InvalidArgumentError(
                "agency.run(queue=...) hands a child run to workers from inside a run; "
                "outside a run, queue it with agency.enqueue(entry, ..., queue=...)"
            )
        return await _run.run(entry, *args, run_id=run_id, store=store, model=model, **kwargs)
    return await run_child(
        frame, entry, args, kwargs, run_id=run_id, queue=queue, store=store, model=model
    )


async def run_child(
    frame: Frame,
    entry: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    run_id: str | None,
    queue: str | None = None,
    store: str | Store | None,
    model: str | Model | None,
) -> RunResult[Any]:
    """Start (or continue, or replay) the child run of ``entry`` called in ``frame``
    (``queue``: on the workers of that queue, the parent waiting for it durably)."""
    check_entry(entry)
    if queue is not None:
        queue = check_queue(queue)
        check_worker_entry(entry, "run(queue=...)")
    parent = frame.ctx
    journal = journal_of(parent)
    parent_id = journal.run_id or ""
    home = parent.store
    assert home is not None  # a durable run's context has its store
    if store is not None and RUNTIME.stores.resolve(store) is not home:
        raise InvalidArgumentError(
            f"a child run lives in its parent's store ({home.url}); drop store= from the "
            f"agency.run call inside run {parent_id!r}"
        )
    address = position_of(frame).address
    branch, ordinal = journal.count(address, "run")
    segment = qualify(branch, f"run#{ordinal}")
    path = f"{address}/{segment}" if address else segment
    child_id = check_run_id(run_id if run_id is not None else f"{parent_id}/{path}")
    child = _Child(
        frame,
        home,
        entry,
        args,
        kwargs,
        path=path,
        run_id=child_id,
        parent_id=parent_id,
        depth=parent.subprocess_depth + 1,
        model=check_model(model),
        queue=queue,
    )
    replayed = will_replay(journal, path)
    record = await journaled(
        frame,
        path,
        CHILD_UNIT,
        child.finish,
        encode=lambda done: done.model_dump(mode="json"),
        decode=RunRecord.model_validate,
        callsite=child.ref,
        failures=(ChildRunRejectedError,),
    )
    if frame.stack.guards:  # the child's spend, billed with the unit, may trip a guard
        await gate(frame, path)
    result = result_from_record(bind_store(record, home), entry)
    return result if replayed else result.model_copy(update={"replayed": False})


class _Child:
    """One child run called from a parent: what its unit does."""

    __slots__ = (
        "args",
        "arguments",
        "depth",
        "entry",
        "frame",
        "kwargs",
        "model",
        "parent_id",
        "path",
        "queue",
        "ref",
        "run_id",
        "store",
    )

    def __init__(
        self,
        frame: Frame,
        store: Store,
        entry: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        path: str,
        run_id: str,
        parent_id: str,
        depth: int,
        model: str | None,
        queue: str | None,
    ) -> None:
        self.frame, self.store, self.entry = frame, store, entry
        self.queue = queue
        self.args, self.kwargs = args, kwargs
        self.path, self.run_id, self.parent_id, self.depth = path, run_id, parent_id, depth
        self.model = model
        self.ref = RUNTIME.entries.entry_ref(entry)
        self.arguments = encode_arguments(args, kwargs)

    async def finish(self) -> RunRecord:
        """The unit: gate a new child, run it to its end (answering what the parent's
        handlers decide), bill its spend here; pause the parent on what nobody decided."""
        template = await self._template()
        RUNTIME.entries.remember(self.run_id, self.entry)
        if self.queue is not None:
            return await self._on_workers(template)
        while True:
            outcome = await drive(
                self.store, template, self.entry, self.args, self.kwargs, parent=self.frame.ctx
            )
            if outcome.status != "paused":
                return await self._ended()
            await self._bubble(outcome.interrupts, enqueue=False)

    async def _on_workers(self, template: RunRecord) -> RunRecord:
        """A queued child: queue it, then wait (durably: a worker's parent parks) for each of
        its ends the child reports (:func:`._run.tell_parent`) until it is final."""
        while True:
            current = await self.store.get_run(self.run_id)
            if current is None:
                queued = template.model_copy(update={"status": "queued", "queue": self.queue})
                claim = await self.store.enqueue_run(queued)
                current = claim.record
                obs = _observe.OBSERVER
                if claim.created and obs is not None:  # the child's first span links here
                    await note_trace_context(self.store, self.run_id, obs.current())
            if current.status in ("completed", "failed", "cancelled"):
                return await self._ended()
            if current.status == "paused":
                await self._bubble(current.interrupts, enqueue=True)
                continue
            await wait_for_event(child_event(self.run_id))

    async def _bubble(self, interrupts: list[Interrupt], *, enqueue: bool) -> None:
        """Answer in the child what the parent's handlers decide of its questions (queued
        again for its workers with ``enqueue``); pause the parent when they decide none."""
        decided = await self._decide(interrupts)
        if not decided:
            journal_of(self.frame.ctx).paused.extend(interrupts)
            # Sibling tasks reach their own interrupts before this one unwinds the group.
            await anyio.lowlevel.checkpoint()
            raise RunPaused(list(interrupts))
        await self.store.answer_interrupts(self.run_id, decided, enqueue=enqueue)

    async def _template(self) -> RunRecord:
        """The child's record to claim: the stored one's inputs checked, or a new one gated."""
        stored = await self.store.get_run(self.run_id)
        if stored is not None:
            check_same_inputs(stored, self.ref, self.arguments, location_ref(self.entry))
            if stored.parent_id != self.parent_id:
                raise RunConflictError(
                    self.run_id,
                    [f"parent: stored {stored.parent_id!r}, given {self.parent_id!r}"],
                )
            return stored.model_copy(update={"status": "running"})
        await self._gate()
        parent = await self.store.get_run(self.parent_id)
        root = self.parent_id if parent is None or parent.root_id is None else parent.root_id
        now = RUNTIME.clock.time()
        return RunRecord(
            run_id=self.run_id,
            status="running",
            entry=self.ref,
            arguments=self.arguments,
            model=self.model or (None if parent is None else parent.model),
            parent_id=self.parent_id,
            root_id=root,
            depth=self.depth,
            created_at=now,
            updated_at=now,
        )

    async def _gate(self) -> None:
        """Ask ``std::run`` through the parent's handlers; refuse a rejected or too deep child."""
        data = {"entry": self.ref, "run_id": self.run_id, "depth": self.depth}
        asked = Interrupt(
            interrupt_id=interrupt_id(self.parent_id, self.path, "run"),
            effect="std::run",
            message=f"start child run {self.run_id!r} of {self.ref} (depth {self.depth})?",
            data=data,
            origin=self.ref,
            run_id=self.parent_id,
        )
        decision = await dispatch(self.frame, asked)
        if decision is not None and decision.type == "reject":
            why = "" if decision.value is None else f": {decision.value}"
            raise ChildRunRejectedError(
                self.run_id, self.depth, f"a std::run handler rejected it{why}"
            )
        limit = RUNTIME.max_run_depth
        if decision is None and self.depth > limit:
            raise ChildRunRejectedError(
                self.run_id,
                self.depth,
                f"it would nest deeper than max_run_depth={limit}; raise it with "
                "agency.configure(max_run_depth=...) or approve it in a std::run handler",
            )

    async def _decide(self, interrupts: list[Interrupt]) -> dict[str, InterruptResponse]:
        """What the parent's handlers decide of the child's interrupts (asked at the call)."""
        decided: dict[str, InterruptResponse] = {}
        for asked in interrupts:
            decision = await dispatch(self.frame, asked)
            if decision is not None:
                decided[asked.interrupt_id] = decision
        return decided

    async def _ended(self) -> RunRecord:
        """The child's final record, its spend billed to the parent's unit."""
        done = await self.store.get_run(self.run_id)
        assert done is not None  # it just ended in this store
        charge(self.frame, pico=done.cost_pico, tokens=done.tokens, enforce=False)
        return done


def _rejected_fields(exc: ChildRunRejectedError) -> dict[str, Any]:
    return {"run_id": exc.run_id, "depth": exc.depth, "reason": exc.reason}


def _rejected_from(message: str, data: dict[str, Any]) -> ChildRunRejectedError:
    return ChildRunRejectedError(str(data["run_id"]), int(data["depth"]), str(data["reason"]))


register_failure(ChildRunRejectedError, _rejected_fields, _rejected_from)
"""A refused child is journaled as the call's outcome (raised again on replay)."""
