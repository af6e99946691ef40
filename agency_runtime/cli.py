"""The ``agency`` command line: the demo, and an admin view of the runs in any store.

Commands::

    agency demo [...]                       the guided demo (agency_runtime.demo)
    agency runs list [--status S] [--limit N]
    agency runs show RUN_ID
    agency runs journal RUN_ID
    agency runs resume RUN_ID
    agency runs respond RUN_ID (--approve [VALUE] | --reject [VALUE] | --answers JSON)
                                [--interrupt ID]...
    agency runs cancel RUN_ID
    agency runs fork RUN_ID STEP_PATH [--new-id ID]

Every ``runs`` command takes ``--store URL`` (default: ``AGENCY_STORE``, else the embedded
store in ``./.agency/``) and ``--json`` (machine-readable output), before or after the
command name. Errors print one line, ``agency: error: <message>``, to stderr and exit 1;
usage errors exit 2; Ctrl-C exits 130.

``resume`` and ``respond`` exit 0 when the run completed, paused or was cancelled, and 1 when
it failed again (the outcome is printed either way).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO, cast

import anyio
from pydantic_core import to_json

from ._errors import (
    AgencyError,
    InterruptAnswerError,
    RunNotFoundError,
    StoreUnavailableError,
)
from ._facade import agency
from ._money import PICO_PER_USD
from ._records import InterruptResponse, JournalEntry
from ._results import Interrupt, RunResult, RunStatus
from ._store import RunRecord, Store, resolve_store
from ._store._url import DEFAULT_STORE_URL, _parse

__all__ = ["build_parser", "main"]

PROG = "agency"
STATUSES: tuple[RunStatus, ...] = ("running", "completed", "paused", "failed", "cancelled")
PREVIEW = 60
"""The widest a value preview may be in a table, in characters."""

_NO_VALUE = object()
"""``--approve`` / ``--reject`` was not given at all (``None``: given without a value)."""


class UsageError(Exception):
    """A command line that parses but makes no sense; reported like argparse does (exit 2)."""


# -- formatting -------------------------------------------------------------------------------


def _usd(pico: int) -> str:
    """Pico-dollars as ``$0.001200`` (6 decimals, exact)."""
    return f"${Decimal(pico) / PICO_PER_USD:.6f}"


def _usd_float(usd: float) -> str:
    """Dollars as ``$0.001200`` (6 decimals)."""
    return f"${usd:.6f}"


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


def _preview(text: str, width: int = PREVIEW) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Print rows under headers in left-aligned columns (numbers right-aligned)."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    right = {
        i for i, h in enumerate(headers) if h in ("seq", "attempts", "tokens", "cost", "run cost")
    }

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    print(line(headers), file=out)
    for row in rows:
        print(line(row), file=out)


def _dump(value: Any, out: TextIO) -> None:
    """Print ``value`` as indented JSON."""
    print(json.dumps(value, indent=2, ensure_ascii=False), file=out)


def _arguments(text: str) -> str:
    """A run's stored ``{"args": [...], "kwargs": {...}}`` as ``"tea", qty=2``."""
    try:
        data = json.loads(text)
        args = [json.dumps(a, ensure_ascii=False) for a in data.get("args", [])]
        kwargs = [
            f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in data.get("kwargs", {}).items()
        ]
    except (ValueError, AttributeError):
        return text
    return ", ".join(args + kwargs) or "(none)"


def _print_interrupts(interrupts: Sequence[Interrupt], out: TextIO) -> None:
    """One block per pending interrupt: id, effect, message, data."""
    for item in interrupts:
        print(f"  {item.interrupt_id}  [{item.effect}]  {item.message}", file=out)
        if item.data is not None:
            print(f"      data: {_json(item.data)}", file=out)
        if item.expects_value:
            print("      expects a value", file=out)


def _respond_hint(run_id: str, store_url: str, out: TextIO) -> None:
    print(
        f"answer with: agency runs respond {run_id} --approve [VALUE] | --reject [VALUE] "
        f"--store {store_url}",
        file=out,
    )


# -- the store ----------------------------------------------------------------------------


def _open_store(url: str | None) -> Store:
    """The store named by ``url`` (else ``AGENCY_STORE``, else the default).

    An SQLite file that does not exist is reported instead of created: an admin command
    pointed at a mistyped path should say so, not show an empty store.
    """
    url = url or os.environ.get("AGENCY_STORE") or DEFAULT_STORE_URL
    scheme, path, _options = _parse(url)
    if scheme == "sqlite" and path != ":memory:":
        file = Path(path).expanduser().resolve()
        if not file.exists():
            raise StoreUnavailableError(
                f"no store at {file} (from {url!r}): the file does not exist; "
                "pass --store URL or set AGENCY_STORE"
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
        self.as_json: bool = bool(getattr(ns, "json", False))
        self.store = _open_store(getattr(ns, "store", None))

    async def list(self) -> int:
        """``agency runs list``."""
        status = cast("RunStatus | None", self.ns.status)
        records = await agency.runs.list(store=self.store, status=status, limit=self.ns.limit)
        if self.as_json:
            _dump([r.model_dump(mode="json") for r in records], self.out)
            return 0
        if not records:
            which = f"{status} runs" if status else "runs"
            print(f"no {which} in {self.store.url}", file=self.out)
            return 0
        rows = [
            [
                r.run_id,
                r.status,
                r.entry,
                str(r.attempts),
                _usd(r.cost_pico),
                str(r.tokens),
                _when(r.created_at, "minutes"),
            ]
            for r in records
        ]
        headers = ["run id", "status", "entry", "attempts", "cost", "tokens", "created"]
        _table(headers, rows, self.out)
        return 0

    async def show(self) -> int:
        """``agency runs show RUN_ID``."""
        record = await _record(self.store, self.ns.run_id)
        if self.as_json:
            _dump(record.model_dump(mode="json"), self.out)
            return 0
        out = self.out
        fields: list[tuple[str, str]] = [
            ("run", record.run_id),
            ("status", record.status),
            ("entry", record.entry),
            ("arguments", _arguments(record.arguments)),
        ]
        if record.overrides:
            fields.append(("overrides", _arguments(record.overrides)))
        if record.model:
            fields.append(("model", record.model))
        if record.value is not None:
            fields.append(("value", record.value))
        if record.error is not None:
            fields.append(("error", f"{record.error.type}: {record.error.message}"))
        fields += [
            ("attempts", str(record.attempts)),
            ("cost", _usd(record.cost_pico)),
            ("tokens", str(record.tokens)),
            ("created", _when(record.created_at)),
            ("started", _when(record.started_at)),
            ("finished", _when(record.finished_at)),
        ]
        if record.started_at is not None and record.finished_at is not None:
            fields.append(("duration", f"{max(0.0, record.finished_at - record.started_at):.3f}s"))
        if record.status == "running" and record.lease_owner:
            fields.append(("lease", f"{record.lease_owner} until {_when(record.lease_expires_at)}"))
        width = max(len(name) for name, _ in fields)
        for name, value in fields:
            print(f"{name.ljust(width)}  {value}", file=out)
        if record.interrupts:
            print(f"pending interrupts ({len(record.interrupts)}):", file=out)
            _print_interrupts(record.interrupts, out)
        return 0

    async def journal(self) -> int:
        """``agency runs journal RUN_ID``."""
        await _record(self.store, self.ns.run_id)
        entries: list[JournalEntry] = await agency.runs.journal(self.ns.run_id, store=self.store)
        if self.as_json:
            _dump([e.model_dump(mode="json") for e in entries], self.out)
            return 0
        if not entries:
            print(f"run {self.ns.run_id!r} has no completed steps", file=self.out)
            return 0
        rows = [
            [str(e.seq), e.path, e.name, _preview(e.result), _usd(e.cost_pico)] for e in entries
        ]
        _table(["seq", "path", "name", "result", "run cost"], rows, self.out)
        return 0

    async def resume(self) -> int:
        """``agency runs resume RUN_ID``."""
        record = await _record(self.store, self.ns.run_id)
        _importable_cwd()
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
        _importable_cwd()
        self._progress(f"answering {len(chosen)} interrupt(s); resuming {record.run_id}…")
        started = time.monotonic()
        result = await agency.respond_to_interrupts(
            [pending[k] for k in chosen], {k: answers[k] for k in chosen}, store=self.store
        )
        return self._outcome(result, started)

    async def cancel(self) -> int:
        """``agency runs cancel RUN_ID``."""
        await _record(self.store, self.ns.run_id)
        record = await agency.runs.cancel(self.ns.run_id, store=self.store)
        if self.as_json:
            _dump(record.model_dump(mode="json"), self.out)
        elif record.status == "cancelled":
            print(f"run {record.run_id} cancelled", file=self.out)
        else:
            print(
                f"run {record.run_id} is {record.status} already; nothing to cancel", file=self.out
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

    def _progress(self, message: str) -> None:
        if not self.as_json:
            print(message, file=self.err, flush=True)

    def _outcome(self, result: RunResult, started: float) -> int:
        """Print a run's outcome; exit 1 when it failed."""
        code = 1 if result.status == "failed" else 0
        if self.as_json:
            _dump(result.model_dump(mode="json"), self.out)
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
            print(f"value: {_json(result.value)}", file=out)
        if result.error is not None:
            print(f"error: {result.error.type}: {result.error.message}", file=out)
        print(f"cost: {_usd_float(result.cost)}  tokens: {result.tokens}", file=out)
        return code


def _parse_value(text: str | None) -> Any:
    """A ``--approve`` / ``--reject`` value: JSON when it parses, else the string itself."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parse_answers(text: str) -> dict[str, Any]:
    """``--answers``: a JSON object of interrupt id → ``{"type": ..., "value": ...}``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--answers is not valid JSON ({exc}): {_preview(text)}") from None
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
        help="the store: sqlite:///path.db, sqlite:////abs/path.db, memory://NAME "
        f"(default: $AGENCY_STORE, else {DEFAULT_STORE_URL})",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print machine-readable JSON instead of tables",
    )
    return common


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

    runs = commands.add_parser(
        "runs", help="list, inspect, resume, answer, cancel and fork runs", parents=[common]
    )
    sub = runs.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = sub.add_parser("list", help="the runs in the store, newest first", parents=[common])
    listing.add_argument("--status", choices=STATUSES, help="only runs with this status")
    listing.add_argument(
        "--limit", type=_positive, default=100, help="at most N runs (default 100)"
    )

    show = sub.add_parser("show", help="one run: inputs, outcome, interrupts", parents=[common])
    show.add_argument("run_id", metavar="RUN_ID")

    journal = sub.add_parser("journal", help="the completed steps of a run", parents=[common])
    journal.add_argument("run_id", metavar="RUN_ID")

    resume = sub.add_parser(
        "resume", help="continue a crashed, failed or paused run", parents=[common]
    )
    resume.add_argument("run_id", metavar="RUN_ID")

    respond = sub.add_parser(
        "respond",
        help="answer a paused run's interrupts and continue it",
        parents=[common],
        description="Answer the pending interrupts of a paused run (all of them, or those "
        "named with --interrupt) and continue it. VALUE is parsed as JSON when it parses, "
        "else kept as a string.",
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

    cancel = sub.add_parser("cancel", help="cancel a run (final)", parents=[common])
    cancel.add_argument("run_id", metavar="RUN_ID")

    fork = sub.add_parser(
        "fork", help="copy a run up to a step; print the new run id", parents=[common]
    )
    fork.add_argument("run_id", metavar="RUN_ID")
    fork.add_argument("step_path", metavar="STEP_PATH", help="e.g. order/1 (see runs journal)")
    fork.add_argument("--new-id", metavar="ID", help="the new run's id (default: generated)")
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


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


def main(argv: list[str] | None = None) -> int:
    """Run the ``agency`` command line with ``argv`` (default: ``sys.argv[1:]``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        if args[:1] == ["demo"]:
            return _demo(args[1:])
        ns = parser.parse_args(args)
        if ns.command == "demo":
            return _demo(list(ns.rest))
        commands = _Commands(ns, sys.stdout, sys.stderr)
        action: Callable[[], Any] = getattr(commands, ns.action)
        return cast(int, anyio.run(action))
    except SystemExit as exc:
        return _exit_code(exc)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except AgencyError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
