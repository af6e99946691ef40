"""The one journaled-effect primitive: run once, commit with everything it changed, replay.

A step of a resumable scope, an ``agency.llm`` call and an ``agency.memory`` operation are
*units* of a run, each at its own path. The first time a unit runs, :func:`perform` records
what it changes (``_threads.Recorder``: thread changes, spend, guard grants) and commits its
outcome with those changes and **the spend it made itself** as one journal entry. When the
entry exists, :func:`replay` applies the recorded changes again (threads, guards' spend and
grants are as if it had run) and returns the recorded outcome without running anything: no
provider is called and nothing is paid twice.

A unit may also record a *failure* of a kind its feature registered
(:mod:`._failures`: an LLM call that failed after its retries, a wait that timed out):
replaying it raises the same error again, so code that caught it takes the same path on
every replay. A recorded failure that ends the run is
forgotten when the run stops, so a retry of the failed run runs the call again.

Every recorded item is checked against the call that claims it: a unit replayed under
another name raises :class:`NondeterminismError` naming both sides.

With an observer installed (:mod:`agency_runtime._core._observe`), each unit performed or
replayed is an observed step, its function running inside it; a caller that reports a unit
its own way (an LLM request, a tool) passes ``observed=False``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic_core import from_json, to_json

from .._core import _observe
from .._core._branches import close_base, current_recorder, open_base, report_change
from .._core._changes import SAME, UNIT, Change, Recorder
from .._core._frame import _FRAME, Frame
from .._errors import JournalCorruptError, NondeterminismError
from .._types import JournalEntry, note_failing_step
from ._failures import decode_failure, encode_failure
from ._journal import RunJournal, journal_of
from ._replay import expand, last_push, pushed_text, replay_changes

__all__ = [
    "journaled",
    "perform",
    "record",
    "recorded",
    "replay",
    "replay_changes",
    "same_name",
    "will_replay",
]

T = TypeVar("T")
V = TypeVar("V")

_PLAIN = frozenset({str, int, float, bool, type(None), dict, list, tuple})
"""Result types that are never awaitable (no ``inspect.isawaitable`` for them)."""


def same_name(recorded_name: str, name: str) -> bool:
    """Whether a unit called ``name`` may claim an entry recorded as ``recorded_name``.

    Before lambdas were named after what they call, an unnamed lambda step was recorded as
    ``…<lambda>``; such an entry is claimed by the same lambda under its new name.
    """
    if recorded_name == name:
        return True
    return recorded_name.endswith("<lambda>") and name.startswith(recorded_name[:-1] + ":")


def will_replay(journal: RunJournal, path: str) -> bool:
    """Whether the unit at ``path`` has a recorded entry, so claiming it replays (nothing
    runs): the one question a feature asks the journal before it calls the primitive (an
    observer marks the unit replayed; ``agency.patched`` finds its marker)."""
    return path in journal.entries


def recorded(journal: RunJournal, path: str, name: str, callsite: str) -> JournalEntry | None:
    """The entry recorded at ``path``, checked against the unit that claims it now."""
    entry = journal.entries.get(path)
    if entry is None:
        return None
    if not same_name(entry.name, name):
        raise NondeterminismError(
            f"run {journal.run_id!r} replayed {path!r} as {name!r} (called at "
            f"{callsite or 'an unknown place'}), but the journal recorded {entry.name!r} "
            f"there (called at {entry.callsite or 'an unknown place'}). The code changed "
            "under an in-flight run: restore the old code to finish it, guard the change "
            "with `if agency.patched('change-id'):` so runs that passed here keep the old "
            "path, or start a new run."
        )
    journal.claimed.add(path)
    return entry


def replay(
    frame: Frame,
    journal: RunJournal,
    entry: JournalEntry,
    decode: Callable[[str], T],
    *,
    observed: bool = True,
) -> T:
    """Apply ``entry``'s changes and return its decoded result (or raise its failure).

    ``observed=False``: the caller reports the unit to the observer itself.
    """
    if (obs := _observe.OBSERVER) is not None and observed:
        with obs.step(entry.name, entry.path, True):
            return replay(frame, journal, entry, decode, observed=False)
    try:
        result = entry.result
        if entry.deltas:
            changes = from_json(entry.deltas)
            if entry.error is None:
                # The enclosing running unit records one marker for all of these changes.
                replay_changes(frame, changes, journal.entries, report=False)
                report_change([UNIT, entry.path])
                if changes and changes[-1][0] == SAME:
                    result = _same_text(changes, journal)
            else:  # a recorded failure is never marked: its changes are passed on as they are
                replay_changes(frame, changes, journal.entries)
        if entry.error is None:
            return decode(result)
        failure = decode_failure(entry.error)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise JournalCorruptError(
            f"the journal of run {journal.run_id!r} is damaged at {entry.path!r} "
            f"({entry.name}): {exc}. Fork the run before it with agency.runs.fork(...) or "
            "start a new run."
        ) from exc
    journal.failed(entry.path, failure)
    raise failure


async def perform(
    frame: Frame,
    journal: RunJournal,
    path: str,
    name: str,
    callsite: str,
    fn: Callable[[], Any],
    *,
    encode: Callable[[Any], tuple[str, V]],
    run_frame: Frame | None = None,
    fields: Callable[[], dict[str, Any]] | None = None,
    failures: tuple[type[Exception], ...] = (),
    observed: bool = True,
) -> V:
    """Run ``fn`` (sync or async) as the unit at ``path`` and commit it; return its value.

    The unit runs at its own base (:func:`open_base`), which carries the unit's recorder:
    what ``fn`` and the tasks it starts change is reported there.
    ``run_frame``, when given, is the frame ``fn`` runs in (a step's own frame).
    ``encode(result)`` gives the JSON text to journal and the value to return (it may
    raise, e.g. ``StepResultError``: then nothing is committed); it runs in the caller's
    frame while the unit is still open (its recorder current), so it may look at what the
    unit changed. ``fields()`` adds columns
    of the entry (a scope step's locals and scope chain). An exception in ``failures`` is
    committed as the unit's outcome before it propagates. With an observer installed the
    unit (``fn`` and its commit) runs inside the observer's step, unless ``observed=False``
    (the caller reports it itself).
    """
    if (obs := _observe.OBSERVER) is not None and observed:
        with obs.step(name, path, False):
            return await perform(
                frame, journal, path, name, callsite, fn,
                encode=encode, run_frame=run_frame, fields=fields, failures=failures,
                observed=False,
            )  # fmt: skip
    recorder = Recorder()
    base = open_base(path, recorder)
    try:
        try:
            installed = None if run_frame is None else _FRAME.set(run_frame)
            try:
                result = fn()
                if type(result) not in _PLAIN and inspect.isawaitable(result):
                    result = await result
            finally:
                if installed is not None:
                    _FRAME.reset(installed)
            text, value = encode(result)
        finally:
            close_base(base)
    # The unit's base is closed: current_recorder() is the enclosing unit's again, asked
    # for only when there is something to hand it (a step that changed nothing asks nothing).
    except failures as exc:
        note_failing_step(exc, name, path)
        await journal.commit_step(
            _entry(frame, journal, path, name, callsite, recorder, "null", None, exc)
        )
        if recorder.changes and (outer := current_recorder()) is not None:
            outer.absorb(recorder, spend=False)
        journal.failed(path, exc)
        raise
    except BaseException as exc:
        note_failing_step(exc, name, path)
        if (outer := current_recorder()) is not None:
            outer.absorb(recorder, spend=True)  # uncommitted: the spend stays with the outer
        raise
    await journal.commit_step(
        _entry(frame, journal, path, name, callsite, recorder, text, fields, None)
    )
    if recorder.changes and (outer := current_recorder()) is not None:
        outer.absorb(recorder, spend=False, unit=path)  # its entry holds them: one marker
    return value


async def record(
    frame: Frame,
    journal: RunJournal,
    path: str,
    name: str,
    result: str,
    failure: Exception | None = None,
) -> None:
    """Commit an entry at ``path`` for an outcome that ran no work of its own under it (a
    step's failed attempt, the failure it ends with): no changes, no spend."""
    await journal.commit_step(
        _entry(frame, journal, path, name, "", Recorder(), result, None, failure)
    )


def _entry(
    frame: Frame,
    journal: RunJournal,
    path: str,
    name: str,
    callsite: str,
    recorder: Recorder,
    result: str,
    fields: Callable[[], dict[str, Any]] | None,
    failure: Exception | None,
) -> JournalEntry:
    """The entry that commits a unit's outcome (taking the journal's next position)."""
    changes = recorder.changes
    if changes and failure is None and len(result) >= _SAME_MIN and result[0] == '"':
        same = _same_as(from_json(result), changes, journal)
        if same is not None:  # the result is a message the changes hold: store it once
            changes, result = [*changes, [SAME, same]], "null"
    values: dict[str, Any] = {
        "run_id": journal.run_id or "",
        "seq": journal.next_seq(),
        "path": path,
        "name": name,
        "callsite": callsite,
        "result": result,
        "locals": None,
        "scopes": None,
        "deltas": to_json(changes).decode() if changes else None,
        "error": None if failure is None else encode_failure(failure),
        "cost_pico": recorder.pico,
        "tokens": recorder.tokens,
        "created_at": frame.ctx.clock.time(),
    }
    if fields is not None:
        values.update(fields())
    return JournalEntry.from_row(values)


_SAME_MIN = 66
"""A result shorter than this JSON text (a 64-character string) is stored as it is."""


def _same_as(value: Any, changes: list[Change], journal: RunJournal) -> int | None:
    """The index, among ``changes`` expanded, of the last message whose text is ``value``
    (a step returning the answer of the ``agency.llm`` call it made), or ``None``."""
    if not any(change[0] == UNIT or change[0] == "push" for change in changes):
        return None
    return last_push(expand(changes, journal.entries), value) if isinstance(value, str) else None


def _same_text(changes: list[Change], journal: RunJournal) -> str:
    """A ``["same", index]`` result undone: the JSON text of the message it points at."""
    return to_json(pushed_text(expand(changes, journal.entries), int(changes[-1][1]))).decode()


async def journaled(
    frame: Frame,
    path: str,
    name: str,
    operation: Callable[[], Awaitable[T]],
    *,
    encode: Callable[[T], Any],
    decode: Callable[[Any], T],
    callsite: str = "",
    failures: tuple[type[Exception], ...] = (),
    observed: bool = True,
    refer: Callable[[Any, list[Change]], Any] | None = None,
    resolve: Callable[[Any, list[Change]], Any] | None = None,
) -> T:
    """Run ``operation`` once per run at ``path``: later executions replay its outcome.

    ``encode(result)`` is the JSON data journaled; ``decode(data)`` rebuilds the result on
    replay. ``failures``: exceptions journaled as the outcome (and raised again on replay).
    ``observed=False``: the caller reports the unit to the observer itself.

    ``refer(data, changes)`` may replace parts of the data by references into the changes
    the unit committed with it (an answer that is also a message it put on a thread), so a
    text is stored once; ``resolve(data, changes)`` puts them back before ``decode``.
    """
    journal = journal_of(frame.ctx)
    entry = recorded(journal, path, name, callsite)
    if entry is not None:

        def decoded(text: str) -> T:
            data = from_json(text)
            if resolve is not None:
                changes = from_json(entry.deltas) if entry.deltas else []
                data = resolve(data, expand(changes, journal.entries))
            return decode(data)

        return replay(frame, journal, entry, decoded, observed=observed)

    def encoded(result: T) -> tuple[str, T]:
        data = encode(result)
        if refer is not None:  # perform encodes while the unit's recorder is current
            recorder = current_recorder()
            if recorder is not None and recorder.changes:
                data = refer(data, expand(recorder.changes, journal.entries))
        return to_json(data).decode(), result

    return await perform(
        frame, journal, path, name, callsite, operation,
        encode=encoded, failures=failures, observed=observed,
    )  # fmt: skip
