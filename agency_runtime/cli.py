"""The ``agency`` command line: the demo, and an admin view of the runs in any store.

Commands::

    agency demo [...]                       the guided demo (agency_runtime.demo)
    agency runs list [--status S] [--parent ID] [--limit N] [--offset N]
    agency runs show RUN_ID
    agency runs tree RUN_ID
    agency runs journal RUN_ID [--after SEQ] [--limit N]
    agency runs resume RUN_ID [--import MODULE]...
    agency runs respond RUN_ID (--approve [VALUE] | --reject [VALUE] | --answers JSON)
                                [--interrupt ID]... [--import MODULE]... [--enqueue]
    agency runs wait RUN_ID [--timeout S]
    agency runs cancel RUN_ID
    agency runs fork RUN_ID STEP_PATH [--new-id ID]
    agency runs prune --older-than AGE [--status completed,failed,cancelled]
    agency worker [--queue NAME]... [--concurrency N] [--lease S] [--poll S]
                  [--prune-after AGE] [--import MODULE]...
    agency ui [--host 127.0.0.1] [--port 8765] [--token T] [--import MODULE]...

``agency ui`` serves the run inspector (extra ``ui``): a local web page of the store's runs,
their journals as timelines, and forms that answer, fork, cancel and send events. It binds to
loopback; another ``--host`` needs ``--token`` (or ``AGENCY_UI_TOKEN``).

Every ``runs`` command, ``worker`` and ``ui`` take ``--store URL`` (default: ``AGENCY_STORE``, else
the embedded store in ``./.agency/``) and ``--json`` (machine-readable output), before or
after the command name.

Output: tables fit in 100 columns (a long cell is shortened with ``…``; ``--json`` shows it in
full), except that an id (a run id, a step path, an interrupt id, a schedule's name) is never
cut: the other commands take it. ``--json`` prints plain nested JSON: the JSON the store keeps
as text (arguments, values, step results, locals, …) decoded into JSON values, money as
``cost_usd`` (US dollars) and times as ISO 8601 UTC strings. ``runs list`` pages with
``--limit`` / ``--offset``, newest first; ``--parent ID`` lists the child runs run ``ID``
started. ``runs tree`` shows a run and its descendants, each under its parent, in the order
they were created. ``runs prune`` deletes the runs that ended more than AGE ago (``30d``,
``12h``, ``90m``, ``45s``, or seconds) with their journals, events and child runs, and prints
how many; ``worker --prune-after AGE`` does the same at start and every hour.

Errors print one line, ``agency: error: <message>``, to stderr and exit 1 (with ``--json``:
``{"error": {"type": ..., "message": ...}}`` on stdout); usage errors exit 2; Ctrl-C exits
130; a closed output (``agency runs list | head -1``) ends quietly with status 141.

``resume`` and ``respond`` exit 0 when the run completed, paused or was cancelled, and 1 when
it failed again (the outcome is printed either way). They continue a run only with an entry
the application declared (``@agency.entry`` / ``agency.register_entry``): the store is data,
never code. A recorded module is imported only when it belongs to the application — a file
under the working directory, or a module named with ``--import MODULE`` (repeatable) or
``AGENCY_IMPORTS`` — and a completed or cancelled run imports nothing.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import signal
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, TextIO, cast

import anyio
from pydantic_core import to_json, to_jsonable_python

from ._boundary._admin import MAX_LIST_LIMIT, MAX_TREE_RUNS, prune_statuses
from ._boundary._runtime import RUNTIME
from ._boundary._worker import MAX_CONCURRENCY, Worker
from ._bounds import MAX_INT, check_duration, check_seconds, check_whole
from ._core._money import PICO_PER_USD
from ._errors import (
    AgencyError,
    InterruptAnswerError,
    InvalidArgumentError,
    RunNotFoundError,
    StoreUnavailableError,
)
from ._facade import agency
from ._llm._litellm import add_import_notice
from ._store import RunRecord, Store, resolve_store
from ._store._url import DEFAULT_STORE_URL, _parse
from ._types import (
    PRUNABLE_STATUSES,
    Interrupt,
    InterruptResponse,
    Journal,
    JournalEntry,
    RunResult,
    RunStatus,
    Schedule,
)

__all__ = ["build_parser", "main"]

PROG = "agency"
STATUSES: tuple[RunStatus, ...] = (
    "queued",
    "running",
    "waiting",
    "completed",
    "paused",
    "failed",
    "cancelled",
)
WIDTH = 100
"""The widest a table (or a line of ``runs show``) may be, in characters."""
PREVIEW = 60
"""The widest a value preview may be in a table, in characters."""
MAX_OFFSET = MAX_INT
"""The largest ``--offset`` (SQLite's largest integer)."""
SHOWN_CHILDREN = 100
"""``runs show`` counts a run's child runs up to this many (reading each one's row);
``runs list --parent`` lists them all."""
SIGPIPE_STATUS = 141
"""The exit status when the output was closed early (128 + SIGPIPE, as a shell reports it)."""
UI_TOKEN_ENV = "AGENCY_UI_TOKEN"
"""The environment variable ``agency ui`` reads its token from when ``--token`` is not given
(a token on the command line is visible to other users in ``ps``)."""
UI_EXTRA = "python3 -m pip install 'agency-runtime[ui]'"

_MIN_CELL = 8
_NO_VALUE = object()
"""``--approve`` / ``--reject`` was not given at all (``None``: given without a value)."""

Keep = Literal["start", "end", "both"]
"""Which part of a long cell survives: its start, its end, or both ends (cut in the middle)."""


class UsageError(Exception):
    """A command line that parses but makes no sense; reported like argparse does (exit 2)."""


# -- formatting -------------------------------------------------------------------------------


def _usd(pico: int) -> str:
    """Pico-dollars as ``$0.001200`` (6 decimals, exact)."""
    return f"${Decimal(pico) / PICO_PER_USD:.6f}"


def _usd_float(usd: float) -> str:
    """Dollars as ``$0.001200`` (6 decimals)."""
    return f"${usd:.6f}"


def _usd_number(pico: int) -> float:
    """Pico-dollars as a JSON number of US dollars (``1200000000`` → ``0.0012``)."""
    return float(Decimal(pico) / PICO_PER_USD)


def _when(ts: float | None, timespec: str = "seconds") -> str:
    """A POSIX time as a local ISO timestamp, or ``-``."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).isoformat(sep=" ", timespec=timespec)


def _json(value: Any) -> str:
    """Compact JSON of any value pydantic can serialize (``repr`` for anything else)."""
    try:
        return to_json(value, fallback=repr).decode()
    except (TypeError, ValueError):
        return repr(value)


def _cut(text: str, width: int, keep: Keep = "start") -> str:
    """``text`` on one line, at most ``width`` characters; ``…`` marks what was cut."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    if width < 2:
        return "…"[:width]
    room = width - 1
    if keep == "start":
        return flat[:room] + "…"
    if keep == "end":
        return "…" + flat[len(flat) - room :]
    head = (room + 1) // 2
    return flat[:head] + "…" + flat[len(flat) - (room - head) :]


ENTRY_SHOWN = 40
"""A list's entry column keeps at least this many characters of the entry's name."""


def _entry_name(ref: str) -> str:
    """A run's entry as a list shows it: its name, without the module or script path
    (``runs show`` has the whole reference)."""
    return ref.rpartition(":")[2] or ref


def _answer_text(response: InterruptResponse | None) -> str:
    """An interrupt's answer in a journal row: ``approve``, ``reject: "why"``, ``pending``."""
    if response is None:
        return "pending"
    return response.type if response.value is None else f"{response.type}: {_json(response.value)}"


def _preview(text: str, width: int = PREVIEW) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    return _cut(text, width)


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    out: TextIO,
    *,
    keep: Mapping[int, Keep],
    last: int | None = None,
    width: int = WIDTH,
    floor: Mapping[int, int] | None = None,
) -> bool:
    """Print rows under headers in columns that fit ``width``; return whether a cell was cut.

    Numbers are right-aligned. Only the columns in ``keep`` shrink (the widest first, down to
    ``_MIN_CELL``, its ``floor`` or its header; column ``last`` only once the others cannot),
    each cell keeping the part ``keep`` names. Columns not in ``keep`` (ids) are never cut:
    when they are wide, the table is wider than ``width``.
    """
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    total = sum(widths) + 2 * (len(widths) - 1)
    floors = {i: max(_MIN_CELL, len(headers[i]), (floor or {}).get(i, 0)) for i in keep}
    while total > width:
        shrinkable = [i for i in keep if widths[i] > floors[i]]
        if not shrinkable:
            break
        if len(shrinkable) > 1 and last in shrinkable:
            shrinkable.remove(last)
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
        total -= 1
    right = {
        i
        for i, h in enumerate(headers)
        if h in ("seq", "attempts", "tokens", "cost", "run cost", "own cost")
    }
    cut = False

    def line(cells: Sequence[str]) -> str:
        nonlocal cut
        parts = []
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True)):
            if len(cell) > w:
                cell, cut = _cut(cell, w, keep.get(i, "start")), True
            parts.append(cell.rjust(w) if i in right else cell.ljust(w))
        return "  ".join(parts).rstrip()

    print(line(headers), file=out)
    for row in rows:
        print(line(row), file=out)
    return cut


def _wrapped(label: str, text: str, indent: int, out: TextIO) -> None:
    """``label`` then ``text`` wrapped to :data:`WIDTH`, continuation lines indented."""
    lines = textwrap.wrap(
        text, width=WIDTH, initial_indent=label, subsequent_indent=" " * indent
    ) or [label.rstrip()]
    for item in lines:
        print(item, file=out)


def _dump(value: Any, out: TextIO) -> None:
    """Print ``value`` as indented JSON: characters as they are, unless the output cannot
    take them (a lone surrogate a stored JSON text escaped, ``"\\ud800"``, is no character
    at all): then as JSON escapes, which read back the same."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    try:
        text.encode(getattr(out, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        text = json.dumps(value, indent=2)
    print(text, file=out)


def _arguments(text: str) -> str:
    """A run's stored ``{"args": [...], "kwargs": {...}}`` as ``"tea", qty=2``."""
    try:
        data = json.loads(text)
        args = [json.dumps(a, ensure_ascii=False) for a in data.get("args", [])]
        kwargs = [
            f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in data.get("kwargs", {}).items()
        ]
    except (ValueError, AttributeError, RecursionError):
        return text
    return ", ".join(args + kwargs) or "(none)"


def _print_interrupts(interrupts: Sequence[Interrupt], out: TextIO) -> None:
    """One block per pending interrupt: id, effect, message, data."""
    for item in interrupts:
        _wrapped(f"  {item.interrupt_id}  [{item.effect}]  ", item.message, 6, out)
        if item.data is not None:
            print(f"      data: {_cut(_json(item.data), WIDTH - 12)}", file=out)
        if item.expects_value:
            print("      expects a value", file=out)


def _respond_hint(run_id: str, store_url: str, out: TextIO) -> None:
    print(
        f"answer with: agency runs respond {run_id} --approve [VALUE] | --reject [VALUE] "
        f"--store {store_url}",
        file=out,
    )


# -- JSON output ------------------------------------------------------------------------------

_JSON_TEXTS = frozenset({"arguments", "overrides", "value", "result", "locals", "scopes", "deltas"})
"""Fields the store keeps as JSON text; ``--json`` shows them decoded."""


def _decoded(text: Any) -> Any:
    """The JSON value of a stored JSON text (a damaged text is shown as it is)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _iso(ts: float) -> Any:
    """A POSIX time as an ISO 8601 UTC string, as pydantic writes datetimes."""
    return to_jsonable_python(datetime.fromtimestamp(ts, UTC))


def _plain(data: Mapping[str, Any]) -> dict[str, Any]:
    """A stored record as plain JSON: texts decoded, ``*_pico`` as ``*_usd``, times ISO 8601."""
    plain: dict[str, Any] = {}
    for key, value in data.items():
        if key in _JSON_TEXTS:
            plain[key] = _decoded(value)
        elif key.endswith("_pico") and isinstance(value, int):
            plain[key[: -len("_pico")] + "_usd"] = _usd_number(value)
        elif key.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
            plain[key] = _iso(value)
        else:
            plain[key] = value
    return plain


def _record_json(record: RunRecord) -> dict[str, Any]:
    data = _plain(record.model_dump(mode="json"))
    data["own_cost_usd"] = _usd_number(record.own_cost_pico)  # without its descendants'
    return data


def _schedule_json(schedule: Schedule) -> dict[str, Any]:
    data = _plain(schedule.model_dump())
    data["next_at"] = _iso(schedule.next_at)
    return data


def _entry_json(entry: JournalEntry) -> dict[str, Any]:
    return _plain(entry.model_dump(mode="json"))


def _result_json(result: RunResult) -> dict[str, Any]:
    data = result.model_dump(mode="json")
    return {("cost_usd" if key == "cost" else key): value for key, value in data.items()}


def _error_json(exc: BaseException, kind: str | None = None) -> dict[str, Any]:
    return {"error": {"type": kind or type(exc).__name__, "message": str(exc)}}


# -- the store ----------------------------------------------------------------------------


def _open_store(url: str | None, *, create: bool = False) -> Store:
    """The store named by ``url`` (else ``AGENCY_STORE``, else the default).

    An SQLite file that does not exist is reported instead of created (unless ``create``:
    a command that defines something, like ``schedules add``): an admin command pointed at
    a mistyped path should say so, not show an empty store.
    """
    source = "--store" if url else "AGENCY_STORE" if os.environ.get("AGENCY_STORE") else None
    url = url or os.environ.get("AGENCY_STORE") or DEFAULT_STORE_URL
    scheme, path, _options = _parse(url)
    if scheme == "sqlite" and path != ":memory:" and not create:
        file = Path(path).expanduser().resolve()
        try:
            found = file.exists()
            parent_found = found or file.parent.is_dir()
        except OSError as exc:  # not searchable, say: what sqlite would fail on too
            raise StoreUnavailableError(
                f"cannot look for the store at {file} (from {url!r}): {exc.strerror}"
            ) from exc
        if not found:
            what = "the file" if parent_found else f"the directory {file.parent}"
            how = (
                "pass --store URL or set AGENCY_STORE"
                if source is None
                else "check the path (a store is made by the first run, enqueue or "
                "`schedules add` on it)"
            )
            raise StoreUnavailableError(
                f"no store at {file} (from {f'{source} ' if source else ''}{url!r}): "
                f"{what} does not exist; {how}"
            )
    return resolve_store(url)


async def _record(store: Store, run_id: str) -> RunRecord:
    """The stored run, or a :class:`RunNotFoundError` that names the CLI to list runs."""
    record = await store.get_run(run_id)
    if record is None:
        raise _not_found(run_id, store)
    return record


def _not_found(run_id: str, store: Store) -> RunNotFoundError:
    error = RunNotFoundError(run_id, store.url)
    error.args = (
        f"no run with id {run_id!r} in store {store.url}; "
        f"list the runs with `agency runs list --store {store.url}`",
    )
    return error


def _importable_cwd() -> None:
    """Put the working directory on ``sys.path`` so a run's entry module can be imported."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


# -- commands -------------------------------------------------------------------------------


class _Commands:
    """The ``runs`` subcommands; each returns the exit status."""

    def __init__(self, ns: argparse.Namespace, out: TextIO, err: TextIO) -> None:
        self.ns = ns
        self.out = out
        self.err = err
        self._hinted = False  # the "long cells are shortened" note is said once
        self.as_json: bool = bool(getattr(ns, "json", False))
        self.store = _open_store(
            getattr(ns, "store", None), create=getattr(ns, "action", "") == "schedules_add"
        )

    async def list(self) -> int:
        """``agency runs list``."""
        status = cast("RunStatus | None", self.ns.status)
        parent: str | None = self.ns.parent
        if parent is not None:
            await _record(self.store, parent)  # a mistyped parent is unknown, not childless
        records = await agency.runs.list(
            store=self.store,
            status=status,
            limit=self.ns.limit,
            offset=self.ns.offset,
            parent=parent,
        )
        if self.as_json:
            _dump([_record_json(r) for r in records], self.out)
            return 0
        if not records:
            which = f"{status} runs" if status else "runs"
            more = f" after the first {self.ns.offset}" if self.ns.offset else ""
            if parent is not None:
                print(f"run {parent} has no child {which}{more}", file=self.out)
            else:
                print(f"no {which}{more} in {self.store.url}", file=self.out)
            return 0
        rows = [
            [
                r.run_id,
                r.status,
                _entry_name(r.entry),
                str(r.attempts),
                _usd(r.cost_pico),
                str(r.tokens),
                _when(r.created_at, "minutes"),
            ]
            if r.damaged is None
            else [r.run_id, r.status, _entry_name(r.entry) or "-", "-", "-", "-", "-"]
            for r in records
        ]
        headers = ["run id", "status", "entry", "attempts", "cost", "tokens", "created"]
        # An id is never cut (it is what the other commands take); `runs show` has the
        # entry's whole reference.
        self._cut_hint(_table(headers, rows, self.out, keep={2: "end"}, floor={2: ENTRY_SHOWN}))
        self._damage_notes(r.run_id for r in records if r.damaged is not None)
        if len(records) == self.ns.limit:
            following = self.ns.offset + len(records)
            self._progress(f"(a full page of {len(records)} runs; the next: --offset {following})")
        return 0

    async def show(self) -> int:
        """``agency runs show RUN_ID``."""
        record = await _record(self.store, self.ns.run_id)
        if self.as_json:
            _dump(_record_json(record), self.out)
            return 0
        out = self.out
        fields: list[tuple[str, str]] = [("run", record.run_id), ("status", record.status)]
        if record.parent_id is not None:
            fields.append(("parent", record.parent_id))
        if record.depth:
            fields.append(("depth", str(record.depth)))
        children = await self.store.list_runs(parent=record.run_id, limit=SHOWN_CHILDREN + 1)
        if children:
            count = len(children)
            fields.append(
                ("children", str(count) if count <= SHOWN_CHILDREN else f"over {SHOWN_CHILDREN}")
            )
        fields += [("entry", record.entry), ("arguments", _arguments(record.arguments))]
        if record.overrides:
            fields.append(("overrides", _arguments(record.overrides)))
        if record.model:
            fields.append(("model", record.model))
        if record.value is not None:
            fields.append(("value", record.value))
        if record.error is not None:
            fields.append(("error", f"{record.error.type}: {record.error.message}"))
            if record.error.step:
                fields.append(("failed in", record.error.step))
        fields += [
            ("attempts", str(record.attempts)),
            ("cost", _usd(record.cost_pico)),
        ]
        if record.descendants_pico:
            fields.append(("own cost", _usd(record.own_cost_pico)))  # its descendants' excluded
        fields += [
            ("tokens", str(record.tokens)),
            ("created", _when(record.created_at)),
            ("started", _when(record.started_at)),
            # A paused run stopped, but it has not finished: it goes on once answered.
            ("paused" if record.status == "paused" else "finished", _when(record.finished_at)),
        ]
        if record.is_final and record.started_at is not None and record.finished_at is not None:
            fields.append(("duration", f"{max(0.0, record.finished_at - record.started_at):.3f}s"))
        if record.status == "running" and record.lease_owner:
            fields.append(("lease", f"{record.lease_owner} until {_when(record.lease_expires_at)}"))
        if record.status == "waiting":
            until = "an event" if record.wake_at is None else _when(record.wake_at)
            fields.append(("wakes", until))
            if record.waiting_for:
                fields.append(("waits for", ", ".join(record.waiting_for)))
        width = max(len(name) for name, _ in fields)
        room = WIDTH - width - 2
        cut = False
        for name, value in fields:
            label = f"{name.ljust(width)}  "
            if name == "error":
                _wrapped(label, value, width + 2, out)
                continue
            if name not in ("run", "parent", "entry") and len(value) > room:
                value, cut = _cut(value, room), True
            print(f"{label}{value}", file=out)
        if record.interrupts:
            print(f"pending interrupts ({len(record.interrupts)}):", file=out)
            _print_interrupts(record.interrupts, out)
        self._cut_hint(cut)
        return 0

    async def tree(self) -> int:
        """``agency runs tree RUN_ID``."""
        await _record(self.store, self.ns.run_id)
        try:
            records = await agency.runs.tree(self.ns.run_id, store=self.store)
        except InvalidArgumentError:  # too many runs: say it in the CLI's words
            raise InvalidArgumentError(
                f"run {self.ns.run_id!r} has more than {MAX_TREE_RUNS:,} runs in its tree; list "
                f"them a page at a time with `agency runs list --parent ID --store "
                f"{self.store.url}`"
            ) from None
        if self.as_json:
            _dump([_record_json(r) for r in records], self.out)
            return 0
        # Indented by the level under this run (its parent's + 1), whatever depth it has.
        levels: dict[str | None, int] = {records[0].run_id: 0}
        rows = []
        for r in records:
            level = levels.setdefault(r.run_id, levels.get(r.parent_id, -1) + 1)
            shown = "  " * level + r.run_id
            if r.damaged is None:
                rows.append(
                    [shown, r.status, _entry_name(r.entry), _usd(r.cost_pico),
                     _usd(r.own_cost_pico)]
                )  # fmt: skip
            else:
                rows.append([shown, r.status, _entry_name(r.entry) or "-", "-", "-"])
        headers = ["run id", "status", "entry", "cost", "own cost"]
        self._cut_hint(_table(headers, rows, self.out, keep={2: "end"}, floor={2: ENTRY_SHOWN}))
        self._damage_notes(r.run_id for r in records if r.damaged is not None)
        return 0

    async def journal(self) -> int:
        """``agency runs journal RUN_ID``."""
        await _record(self.store, self.ns.run_id)
        after, limit = self.ns.after, self.ns.limit
        journal: Journal
        next_after: int | None = None
        if after is None and limit is None:
            journal = await self.store.load_journal(self.ns.run_id)  # steps and answers
        else:  # a page: the steps after --after, at most --limit of them
            journal = page = await self.store.load_journal_page(
                self.ns.run_id, after_seq=after, limit=limit or MAX_LIST_LIMIT
            )
            next_after = page.next_after
        entries: list[JournalEntry] = journal.entries
        if next_after is not None:
            self._progress(
                f"(more steps: agency runs journal {self.ns.run_id} --after {next_after}"
                f"{'' if limit is None else f' --limit {limit}'})"
            )
        if self.as_json:
            _dump([_entry_json(e) for e in entries], self.out)
            return 0
        asked = journal.answers
        if not entries and not asked:
            print(f"run {self.ns.run_id!r} has no completed steps", file=self.out)
            return 0
        # Steps and the interrupts the run asked, in journal order (one sequence numbers
        # both); a path and an interrupt id are never cut (`runs fork` and `runs respond`
        # take them).
        steps = [(e.seq, [e.path, e.name, _preview(e.result), _usd(e.cost_pico)]) for e in entries]
        questions = [
            (
                a.seq,
                [
                    a.interrupt.interrupt_id,
                    f"interrupt {a.interrupt.effect}",
                    _preview(_answer_text(a.response)),
                    "",
                ],
            )
            for a in asked
        ]
        rows = sorted(steps + questions, key=lambda row: row[0])
        headers = ["seq", "path", "name", "result", "run cost"]
        cells = [[str(seq), *row] for seq, row in rows]
        cut = _table(headers, cells, self.out, keep={2: "start", 3: "start"})
        self._cut_hint(cut or any(len(e.result) > PREVIEW for e in entries))
        return 0

    async def resume(self) -> int:
        """``agency runs resume RUN_ID``."""
        record = await _record(self.store, self.ns.run_id)
        if not record.is_final:  # a completed or cancelled run imports nothing
            self._app_modules()
            RUNTIME.entries.find(record.run_id, record.entry)  # refuse an undeclared entry up front
        self._progress(f"resuming {record.run_id}…")
        started = time.monotonic()
        result = await agency.resume(record.run_id, store=self.store)
        return self._outcome(result, started)

    async def respond(self) -> int:
        """``agency runs respond RUN_ID ...``."""
        ns = self.ns
        answers: dict[str, Any] = _parse_answers(ns.answers) if ns.answers is not None else {}
        record = await _record(self.store, ns.run_id)
        if record.status != "paused":
            raise InterruptAnswerError(
                f"run {record.run_id!r} is {record.status}, not paused, so it has no "
                "interrupts to answer"
            )
        pending = {i.interrupt_id: i for i in record.interrupts}
        if not pending:
            raise InterruptAnswerError(
                f"run {record.run_id!r} is paused but waits for no answer; continue it with "
                f"`agency runs resume {record.run_id}`"
            )
        chosen: list[str] = list(dict.fromkeys(ns.interrupt or answers or pending))
        unknown = [k for k in [*chosen, *answers] if k not in pending]
        if unknown:
            raise InterruptAnswerError(
                f"run {record.run_id!r} has no pending interrupt {unknown[0]!r}; "
                f"pending: {', '.join(pending)}"
            )
        if ns.answers is None:
            response = (
                InterruptResponse(type="approve", value=ns.approve)
                if ns.approve is not _NO_VALUE
                else InterruptResponse(type="reject", value=ns.reject)
            )
            answers = dict.fromkeys(chosen, response)
        else:
            missing = [k for k in chosen if k not in answers]
            if missing:
                raise InterruptAnswerError(
                    f"--answers gives no answer for interrupt {missing[0]!r} of run "
                    f"{record.run_id!r}"
                )
        started = time.monotonic()
        if ns.enqueue:  # a worker continues it, with the entry its process declares
            self._progress(f"answering {len(chosen)} interrupt(s); queuing {record.run_id}…")
            result = await agency.respond_to_interrupts(
                [pending[k] for k in chosen],
                {k: answers[k] for k in chosen},
                store=self.store,
                enqueue=True,
            )
            return self._outcome(result, started)
        self._app_modules()
        # Find the entry before storing any answer: an entry the application did not declare
        # is refused here (EntryNotAllowedError), and the run stays paused, unanswered.
        RUNTIME.entries.find(record.run_id, record.entry)
        self._progress(f"answering {len(chosen)} interrupt(s); resuming {record.run_id}…")
        result = await agency.respond_to_interrupts(
            [pending[k] for k in chosen], {k: answers[k] for k in chosen}, store=self.store
        )
        return self._outcome(result, started)

    async def wait(self) -> int:
        """``agency runs wait RUN_ID [--timeout S]``."""
        await _record(self.store, self.ns.run_id)
        started = time.monotonic()
        result = await agency.runs.wait(self.ns.run_id, store=self.store, timeout=self.ns.timeout)
        return self._outcome(result, started)

    async def worker(self) -> int:
        """``agency worker [--queue NAME]... [--concurrency N] ...``: serve until SIGTERM."""
        self._app_modules()
        ns = self.ns
        worker = Worker(
            self.store,
            queues=ns.queues or ["default"],
            concurrency=ns.concurrency,
            lease=ns.lease,
            poll=ns.poll,
            park_after=ns.park_after,
            prune_after=ns.prune_after,
        )
        print(
            f"worker {worker.owner}: serving queue(s) {', '.join(worker.queues)} of "
            f"{self.store.url} with {worker.concurrency} slot(s); SIGTERM or Ctrl-C drains",
            file=self.err,
            flush=True,
        )
        if ns.prune_after is not None:
            print(
                f"worker {worker.owner}: pruning runs that ended over {ns.prune_after.text} "
                f"ago, now and every {worker.prune_every:g}s",
                file=self.err,
                flush=True,
            )
        async with anyio.create_task_group() as group:
            group.start_soon(_drain_on_signal, worker, group.cancel_scope, self.err)
            await worker.run()
            group.cancel_scope.cancel()
        print(
            f"worker {worker.owner}: drained after {worker.runs_finished} run(s)",
            file=self.err,
            flush=True,
        )
        return 0

    async def send(self) -> int:
        """``agency runs send RUN_ID NAME [--payload JSON]``."""
        payload = None if self.ns.payload is None else _json_option("--payload", self.ns.payload)
        event = await agency.runs.send(self.ns.run_id, self.ns.name, payload, store=self.store)
        if self.as_json:
            _dump(_plain(event.model_dump()), self.out)
        else:
            print(
                f"sent {event.name!r} to run {event.run_id} (event {event.event_id})", file=self.out
            )
        return 0

    async def schedules_list(self) -> int:
        """``agency schedules list``."""
        schedules = await agency.schedules.list(store=self.store)
        if self.as_json:
            _dump([_schedule_json(s) for s in schedules], self.out)
            return 0
        if not schedules:
            print(f"no schedules in {self.store.url}", file=self.out)
            return 0
        rows = [
            [
                s.name,
                s.cron if s.cron is not None else f"every {s.every:g}s",
                s.entry,
                s.queue,
                _when(s.next_at),
            ]
            if s.damaged is None
            else [s.name, "damaged", s.entry or "-", s.queue, "-"]
            for s in schedules
        ]
        headers = ["name", "when", "entry", "queue", "next"]
        cut = _table(headers, rows, self.out, keep={2: "end"}, floor={2: ENTRY_SHOWN})
        self._cut_hint(cut)  # a schedule's name is never cut
        for s in schedules:
            if s.damaged is not None:
                self._progress(
                    f"(schedule {s.name} is damaged: {_cut(s.damaged, 200)}; remove it with "
                    f"`agency schedules remove {s.name}` and add it again)"
                )
        return 0

    async def schedules_add(self) -> int:
        """``agency schedules add NAME ENTRY (--cron EXPR | --every S) ...``."""
        self._app_modules()
        ns = self.ns
        args = _json_option("--args", ns.args) if ns.args is not None else []
        kwargs = _json_option("--kwargs", ns.kwargs) if ns.kwargs is not None else {}
        schedule = await agency.schedules.add(
            ns.name,
            ns.entry,
            cron=ns.cron,
            every=ns.every,
            args=args,
            kwargs=kwargs,
            queue=ns.queue,
            timezone=ns.timezone,
            store=self.store,
        )
        if self.as_json:
            _dump(_schedule_json(schedule), self.out)
        else:
            print(
                f"schedule {schedule.name}: next run {_when(schedule.next_at)} in queue "
                f"{schedule.queue} (a worker of that queue starts it)",
                file=self.out,
            )
        return 0

    async def schedules_remove(self) -> int:
        """``agency schedules remove NAME``."""
        await agency.schedules.remove(self.ns.name, store=self.store)
        if self.as_json:
            _dump({"removed": self.ns.name}, self.out)
        else:
            print(f"schedule {self.ns.name} removed", file=self.out)
        return 0

    async def cancel(self) -> int:
        """``agency runs cancel RUN_ID``."""
        await _record(self.store, self.ns.run_id)
        record = await agency.runs.cancel(self.ns.run_id, store=self.store)
        if self.as_json:
            _dump(_record_json(record), self.out)
        elif record.status == "cancelled":
            print(f"run {record.run_id} cancelled", file=self.out)
        else:
            print(
                f"run {record.run_id} is {record.status} already; nothing to cancel", file=self.out
            )
        return 0

    async def prune(self) -> int:
        """``agency runs prune --older-than AGE [--status S,S]``."""
        statuses = self.ns.status
        deleted = await agency.runs.prune(
            older_than=self.ns.older_than, status=statuses, store=self.store
        )
        if self.as_json:
            _dump({"deleted": deleted, "older_than_seconds": float(self.ns.older_than),
                   "statuses": list(statuses)}, self.out)  # fmt: skip
        else:
            print(
                f"deleted {deleted} run(s) that ended over {self.ns.older_than.text} ago "
                f"({', '.join(statuses)})",
                file=self.out,
            )
        return 0

    async def fork(self) -> int:
        """``agency runs fork RUN_ID STEP_PATH [--new-id ID]``."""
        await _record(self.store, self.ns.run_id)
        new_id = await agency.runs.fork(
            self.ns.run_id, self.ns.step_path, new_run_id=self.ns.new_id, store=self.store
        )
        if self.as_json:
            _dump({"run_id": new_id, "forked_from": self.ns.run_id}, self.out)
        else:
            print(new_id, file=self.out)
            self._progress(
                f"forked {self.ns.run_id} at {self.ns.step_path}; continue it with "
                f"`agency runs resume {new_id} --store {self.store.url}`"
            )
        return 0

    # -- helpers ----------------------------------------------------------------------------

    def _app_modules(self) -> None:
        """Make the application importable: the working directory, then ``--import``.

        Commands that continue a run call this first; they also say what they wait for when
        the run's first LLM call has to import litellm (seconds, in silence otherwise).
        """
        _importable_cwd()
        RUNTIME.entries.import_app_modules(getattr(self.ns, "imports", None) or [])
        add_import_notice(self._progress)

    def _progress(self, message: str) -> None:
        if not self.as_json:
            self.out.flush()  # what stdout has comes first, whole lines, when both are piped
            print(message, file=self.err, flush=True)

    def _damage_notes(self, run_ids: Iterable[str]) -> None:
        """Say, under a list, which runs are damaged and how to see what is wrong."""
        damaged = list(run_ids)
        if damaged:
            shown = ", ".join(damaged[:5]) + (
                f" and {len(damaged) - 5} more" if len(damaged) > 5 else ""
            )
            self._progress(
                f"({len(damaged)} damaged run(s): {shown}; `agency runs show ID` says what is "
                "wrong with each)"
            )

    def _cut_hint(self, cut: bool) -> None:
        if cut and not self._hinted:
            self._hinted = True
            self._progress("(long cells are shortened; --json shows all)")

    def _outcome(self, result: RunResult, started: float) -> int:
        """Print a run's outcome; exit 1 when it failed."""
        code = 1 if result.status == "failed" else 0
        if self.as_json:
            _dump(_result_json(result), self.out)
            return code
        out = self.out
        self._progress(f"done in {time.monotonic() - started:.2f}s")
        if result.status == "paused":
            print(f"run {result.run_id}: paused on {len(result.interrupts)} interrupt(s)", file=out)
            _print_interrupts(result.interrupts, out)
            _respond_hint(result.run_id, self.store.url, out)
        else:
            print(f"run {result.run_id}: {result.status}", file=out)
        if result.status == "completed":
            print(f"value: {_cut(_json(result.value), WIDTH - len('value: '))}", file=out)
        if result.error is not None:
            _wrapped("error: ", f"{result.error.type}: {result.error.message}", 7, out)
        print(f"cost: {_usd_float(result.cost)}  tokens: {result.tokens}", file=out)
        return code


async def _drain_on_signal(worker: Worker, scope: anyio.CancelScope, err: TextIO) -> None:
    """The first SIGTERM or SIGINT drains the worker; a second one stops it at once (its
    runs go back to their queues)."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for number in signals:
            name = signal.Signals(number).name
            print(
                f"worker {worker.owner}: {name}: draining (again to stop at once)",
                file=err,
                flush=True,
            )
            break
        async with anyio.create_task_group() as group:
            group.start_soon(worker.drain)
            async for _ in signals:
                await worker.drain(timeout=0)
                scope.cancel()
                break


def _parse_value(text: str | None) -> Any:
    """A ``--approve`` / ``--reject`` value: JSON when it parses, else the string itself."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _json_option(option: str, text: str) -> Any:
    """The JSON value of ``option``'s ``text``; a UsageError (one line) when it is not JSON
    or is nested past what the parser can hold."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{option} is not JSON ({exc}): {_preview(text)}") from None
    except RecursionError:
        raise UsageError(f"{option} is nested too deeply to be read: {_preview(text)}") from None


def _parse_answers(text: str) -> dict[str, Any]:
    """``--answers``: a JSON object of interrupt id → ``{"type": ..., "value": ...}``."""
    data = _json_option("--answers", text)
    if not isinstance(data, dict) or not data:
        raise UsageError(
            "--answers must be a JSON object keyed by interrupt id, like "
            '\'{"intr_x": {"type": "approve", "value": 3}}\''
        )
    answers: dict[str, Any] = {}
    for key, value in data.items():
        if value in ("approve", "reject"):
            value = {"type": value}
        if not isinstance(value, dict) or value.get("type") not in ("approve", "reject"):
            raise InterruptAnswerError(
                f"--answers: the answer for {key} is {_json(value)}; write "
                '{"type": "approve" | "reject", "value": ...}'
            )
        extra = sorted(set(value) - {"type", "value"})
        if extra:
            raise InterruptAnswerError(
                f"--answers: the answer for {key} has unknown field(s) {extra}; "
                'write {"type": "approve" | "reject", "value": ...}'
            )
        answers[key] = InterruptResponse.model_validate(value)
    return answers


# -- the parser -----------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    """``--store`` and ``--json``, accepted before or after any command name."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="the store: sqlite:///path.db, sqlite:////abs/path.db, "
        "postgresql://user:pass@host/db, memory://NAME "
        f"(default: $AGENCY_STORE, else {DEFAULT_STORE_URL})",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print machine-readable JSON instead of tables (errors too)",
    )
    return common


def _add_imports(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        metavar="MODULE",
        help="import this application module (or script path) first, so runs whose entry it "
        "declares may continue; repeatable (like the AGENCY_IMPORTS variable)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``agency`` argument parser."""
    common = _common()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Durable agent runs: a demo, and the runs in a store.",
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_parser(
        "demo",
        help="run the guided demo (agency demo --help for its options)",
        add_help=False,
    ).add_argument("rest", nargs=argparse.REMAINDER)

    worker = commands.add_parser(
        "worker",
        help="serve queued runs until SIGTERM (which drains: runs go back to their queue)",
        parents=[common],
        description="Claim queued runs of the store and run them. Entries must be declared "
        "(@agency.entry) in modules named with --import. The first SIGTERM or Ctrl-C drains "
        "(each running run stops after its next step and goes back to its queue); a second "
        "one stops at once.",
    )
    worker.set_defaults(action="worker")
    worker.add_argument(
        "--queue",
        dest="queues",
        action="append",
        metavar="NAME",
        help="serve this queue (repeatable; default: default)",
    )
    worker.add_argument(
        "--concurrency",
        type=_whole("--concurrency", 1, MAX_CONCURRENCY),
        default=8,
        metavar="N",
        help="run at most N runs at once (default 8)",
    )
    worker.add_argument(
        "--lease",
        type=_seconds("--lease"),
        default=30.0,
        metavar="S",
        help="a claim lasts S seconds unless renewed (default 30): a dead worker's runs "
        "move on after that",
    )
    worker.add_argument(
        "--poll",
        type=_seconds("--poll"),
        default=1.0,
        metavar="S",
        help="look for work every S seconds when not woken (default 1)",
    )
    worker.add_argument(
        "--park-after",
        type=_seconds("--park-after", zero=True),
        default=30.0,
        metavar="S",
        help="a run waiting longer than S seconds (agency.sleep, agency.wait_for_event) "
        "parks and frees its slot (default 30)",
    )
    worker.add_argument(
        "--prune-after",
        type=_age("--prune-after"),
        metavar="AGE",
        help="delete runs that ended over AGE ago (30d, 12h, 90m, 45s) with their journals "
        "and child runs, at start and every hour (as `agency runs prune`; default: never)",
    )
    _add_imports(worker)

    schedules = commands.add_parser(
        "schedules", help="list, add and remove schedules", parents=[common]
    )
    plans = schedules.add_subparsers(dest="plan", metavar="ACTION", required=True)
    plans.add_parser("list", help="every schedule and its next run", parents=[common]).set_defaults(
        action="schedules_list"
    )
    adding = plans.add_parser(
        "add",
        help="start an entry at cron or interval occurrences",
        parents=[common],
        description="Add (or replace) a schedule: workers serving its queue start ENTRY at "
        "every occurrence, exactly once, as run 'NAME@ISO-TIME'. ENTRY is a declared entry "
        "(@agency.entry), by name or module:qualname, in a module named with --import.",
    )
    adding.set_defaults(action="schedules_add")
    adding.add_argument("name", metavar="NAME")
    adding.add_argument("entry", metavar="ENTRY")
    timing = adding.add_mutually_exclusive_group(required=True)
    timing.add_argument("--cron", metavar="EXPR", help="a cron expression, e.g. '0 9 * * 1-5'")
    timing.add_argument(
        "--every", type=_seconds("--every", low=1), metavar="S", help="every S seconds (>= 1)"
    )
    adding.add_argument("--args", metavar="JSON", help="positional arguments, a JSON list")
    adding.add_argument("--kwargs", metavar="JSON", help="keyword arguments, a JSON object")
    adding.add_argument("--queue", default="default", metavar="NAME", help="default: default")
    adding.add_argument(
        "--timezone", default="UTC", metavar="ZONE", help="cron's time zone (default UTC)"
    )
    _add_imports(adding)
    removing = plans.add_parser("remove", help="delete a schedule", parents=[common])
    removing.set_defaults(action="schedules_remove")
    removing.add_argument("name", metavar="NAME")

    ui = commands.add_parser(
        "ui",
        help="serve the run inspector: a local web page of the runs (extra ui)",
        parents=[common],
        description="Serve a web page of the store's runs: filter and search them, read each "
        "run's journal as a timeline, answer its interrupts, fork, cancel and send events. "
        "Binds to loopback; a non-loopback --host needs --token (then every request needs "
        "it: open the printed address once, or send 'Authorization: Bearer TOKEN'). Needs "
        "the ui extra: pip install 'agency-runtime[ui]'.",
    )
    ui.set_defaults(action="ui")
    ui.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="HOST",
        help="the address to bind (default 127.0.0.1)",
    )
    ui.add_argument(
        "--port",
        type=_whole("--port", 1, 65535),
        default=8765,
        metavar="PORT",
        help="the port (default 8765)",
    )
    ui.add_argument(
        "--token",
        metavar="TOKEN",
        help="require this token (long and random) on every request "
        f"(default: ${UI_TOKEN_ENV}); needed for a non-loopback --host",
    )
    _add_imports(ui)

    runs = commands.add_parser(
        "runs", help="list, inspect, resume, answer, cancel, fork and prune runs", parents=[common]
    )
    sub = runs.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = sub.add_parser("list", help="the runs in the store, newest first", parents=[common])
    listing.add_argument("--status", choices=STATUSES, help="only runs with this status")
    listing.add_argument(
        "--parent", metavar="ID", help="only the child runs run ID started (not theirs)"
    )
    listing.add_argument(
        "--limit",
        type=_whole("--limit", 1, MAX_LIST_LIMIT),
        default=100,
        metavar="N",
        help=f"at most N runs (1 to {MAX_LIST_LIMIT}; default 100)",
    )
    listing.add_argument(
        "--offset",
        type=_whole("--offset", 0, MAX_OFFSET),
        default=0,
        metavar="N",
        help="skip the N newest runs first (default 0): the next page is --offset N+limit",
    )

    show = sub.add_parser("show", help="one run: inputs, outcome, interrupts", parents=[common])
    show.add_argument("run_id", metavar="RUN_ID")

    tree = sub.add_parser(
        "tree", help="a run and its child runs, theirs, ... (one line each)", parents=[common]
    )
    tree.add_argument("run_id", metavar="RUN_ID")

    journal = sub.add_parser("journal", help="the completed steps of a run", parents=[common])
    journal.add_argument("run_id", metavar="RUN_ID")
    journal.add_argument(
        "--after",
        type=_whole("--after", 0, 2**62),
        metavar="SEQ",
        help="only the steps after journal position SEQ (the next page of a big run)",
    )
    journal.add_argument(
        "--limit",
        type=_whole("--limit", 1, MAX_LIST_LIMIT),
        metavar="N",
        help="at most N steps (default: all); says how to read the next page",
    )

    resume = sub.add_parser(
        "resume",
        help="continue a crashed, failed or paused run",
        parents=[common],
        description="Continue a crashed, failed or paused run from its journal, with its "
        "declared entry (@agency.entry). A completed or cancelled run shows its stored "
        "outcome and imports nothing.",
    )
    resume.add_argument("run_id", metavar="RUN_ID")
    _add_imports(resume)

    respond = sub.add_parser(
        "respond",
        help="answer a paused run's interrupts and continue it",
        parents=[common],
        description="Answer the pending interrupts of a paused run (all of them, or those "
        "named with --interrupt) and continue it with its declared entry (@agency.entry). "
        "VALUE is parsed as JSON when it parses, else kept as a string.",
    )
    respond.add_argument("run_id", metavar="RUN_ID")
    how = respond.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--approve",
        nargs="?",
        metavar="VALUE",
        type=_parse_value,
        const=None,
        default=_NO_VALUE,
        help="approve, optionally with a value",
    )
    how.add_argument(
        "--reject",
        nargs="?",
        metavar="VALUE",
        type=_parse_value,
        const=None,
        default=_NO_VALUE,
        help="reject, optionally with a value",
    )
    how.add_argument(
        "--answers",
        metavar="JSON",
        help='a different answer per interrupt: \'{"intr_x": {"type": "approve", "value": 3}}\'',
    )
    respond.add_argument(
        "--interrupt",
        action="append",
        metavar="ID",
        help="answer only this interrupt (repeatable; default: every pending one)",
    )
    respond.add_argument(
        "--enqueue",
        action="store_true",
        help="store the answers and hand the run to a worker of its queue instead of "
        "continuing it here (no --import needed)",
    )
    _add_imports(respond)

    waiting = sub.add_parser(
        "wait",
        help="wait until a run is completed, failed, cancelled or paused",
        parents=[common],
    )
    waiting.add_argument("run_id", metavar="RUN_ID")
    waiting.add_argument(
        "--timeout", type=_seconds("--timeout"), metavar="S", help="give up after S seconds"
    )

    send = sub.add_parser(
        "send",
        help="send an event to a run (agency.wait_for_event takes it)",
        parents=[common],
    )
    send.add_argument("run_id", metavar="RUN_ID")
    send.add_argument("name", metavar="NAME", help="the event's name")
    send.add_argument("--payload", metavar="JSON", help="the event's payload, as JSON")

    cancel = sub.add_parser("cancel", help="cancel a run (final)", parents=[common])
    cancel.add_argument("run_id", metavar="RUN_ID")

    fork = sub.add_parser(
        "fork", help="copy a run up to a step; print the new run id", parents=[common]
    )
    fork.add_argument("run_id", metavar="RUN_ID")
    fork.add_argument("step_path", metavar="STEP_PATH", help="e.g. order/1 (see runs journal)")
    fork.add_argument("--new-id", metavar="ID", help="the new run's id (default: generated)")

    prune = sub.add_parser(
        "prune",
        help="delete runs that ended long ago, with their journals and child runs",
        parents=[common],
        description="Delete the completed, failed and cancelled runs last updated more than "
        "AGE ago, with their journals, events and child runs (about 500 runs per "
        "transaction), and print how many. A queued, running, waiting or paused run is never "
        "deleted, nor a run above one; a child run goes only with its parent.",
    )
    prune.add_argument(
        "--older-than",
        type=_age("--older-than"),
        required=True,
        metavar="AGE",
        help="how long ago the runs ended: 30d, 12h, 90m, 45s (or seconds)",
    )
    prune.add_argument(
        "--status",
        type=_prune_statuses,
        default=tuple(PRUNABLE_STATUSES),
        metavar="S[,S]",
        help="only runs with these statuses, comma-separated (default: "
        f"{','.join(PRUNABLE_STATUSES)})",
    )
    return parser


class _Age(float):
    """An ``AGE`` option's seconds, which remember how the command line wrote them."""

    text: str

    def __new__(cls, seconds: float, text: str) -> _Age:
        age = super().__new__(cls, seconds)
        age.text = text
        return age


def _age(option: str) -> Callable[[str], float]:
    """An argparse type: an age (``30d``, ``12h``, ``90m``, ``45s``, or seconds)."""

    def parse(text: str) -> float:
        try:
            return _Age(check_duration(text, option), text.strip())
        except InvalidArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _prune_statuses(text: str) -> tuple[RunStatus, ...]:
    """``runs prune --status``: comma-separated statuses of runs that ended."""
    try:
        return prune_statuses([part.strip() for part in text.split(",")])
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(option: str, *, zero: bool = False, low: float = 0.0) -> Callable[[str], float]:
    """An argparse type: a number of seconds > 0 (>= 0 with ``zero``; >= ``low``) within
    :data:`~agency_runtime._bounds.MAX_SECONDS`, checked as the library checks it."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{_cut(text, 24)!r} is not a number of seconds"
            ) from None
        try:
            return check_seconds(value, option, positive=not zero, low=low)
        except InvalidArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _whole(option: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_cut(text, 24)!r} is not a whole number") from None
        try:
            return check_whole(value, option, low, high)
        except InvalidArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


# -- entry point ----------------------------------------------------------------------------


def _demo(argv: list[str]) -> int:
    """``agency demo``: delegate to ``agency_runtime.demo.main``."""
    try:
        module = importlib.import_module("agency_runtime.demo")
    except ModuleNotFoundError as exc:
        if exc.name not in ("agency_runtime.demo", None):
            raise
        print(
            f"{PROG}: error: the demo is not available in this installation "
            "(the module agency_runtime.demo is missing)",
            file=sys.stderr,
        )
        return 2
    demo_main = cast("Callable[[list[str] | None], int | None]", module.main)
    return int(demo_main(argv) or 0)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _silence_stdout() -> None:
    """Point stdout at the null device, so the interpreter's last flush does not fail too."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass  # not a real file (a test's capture): nothing will be flushed to a closed pipe


def _ui(ns: argparse.Namespace) -> int:
    """``agency ui``: serve the run inspector (``agency_runtime._ui``) with uvicorn."""
    host: str = ns.host
    token: str | None = ns.token or os.environ.get(UI_TOKEN_ENV) or None
    try:  # by name: the inspector sits beside the CLI in the top layer
        inspector = importlib.import_module("agency_runtime._ui")
    except ImportError as exc:
        missing = getattr(exc, "name", None) or "a package"
        if missing.startswith("agency_runtime"):
            raise
        print(
            f"{PROG}: error: `agency ui` needs the ui extra ({missing} is not installed): "
            f"{UI_EXTRA}",
            file=sys.stderr,
        )
        return 1
    # The inspector's own rules (the same ones its request guard applies), said in flags.
    if not inspector.is_loopback(host) and token is None:
        raise UsageError(
            f"--host {host} is not a loopback address: anyone who can reach it could read and "
            f"change your runs. Pass --token TOKEN (or set {UI_TOKEN_ENV}), e.g. a token made "
            "with: python3 -c 'import secrets; print(secrets.token_urlsafe(24))' — or keep the "
            "default --host 127.0.0.1"
        )
    try:
        inspector.check_token(token)
    except InvalidArgumentError:
        raise UsageError(
            f"--token must be at least {inspector.MIN_TOKEN_LENGTH} characters without "
            "surrounding spaces; make one with: "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"
        ) from None
    store = _open_store(getattr(ns, "store", None))
    _importable_cwd()
    RUNTIME.entries.import_app_modules(ns.imports or [])
    app = inspector.create_app(store, token=token)
    shown = f"[{host}]" if ":" in host else host
    address = f"http://{shown}:{ns.port}/"
    if token is not None:
        address += "?token=" + urllib.parse.quote(token, safe="")
    print(
        f"agency ui: the runs of {store.url} at {address} (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    inspector.serve(app, host=host, port=ns.port)
    return 0


def _run(args: list[str], parser: argparse.ArgumentParser) -> int:
    as_json = False
    try:
        if args[:1] == ["demo"]:
            return _demo(args[1:])
        ns = parser.parse_args(args)
        if ns.command == "demo":
            return _demo(list(ns.rest))
        as_json = bool(getattr(ns, "json", False))
        if ns.command == "ui":
            return _ui(ns)
        commands = _Commands(ns, sys.stdout, sys.stderr)
        action: Callable[[], Any] = getattr(commands, ns.action)
        return cast(int, anyio.run(action))
    except SystemExit as exc:
        return _exit_code(exc)
    except UsageError as exc:
        if as_json:
            _dump(_error_json(exc, "UsageError"), sys.stdout)
            return 2
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except AgencyError as exc:
        if as_json:
            _dump(_error_json(exc), sys.stdout)
        else:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    """Run the ``agency`` command line with ``argv`` (default: ``sys.argv[1:]``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        code = _run(args, parser)
        sys.stdout.flush()  # a closed pipe is reported here, not at interpreter exit
    except BrokenPipeError:  # `agency runs list | head -1`: the reader has what it wanted
        _silence_stdout()
        return SIGPIPE_STATUS
    return code
