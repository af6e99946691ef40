"""The run inspector's web app: Starlette routes over any store, through the public API.

Pages (GET): ``/runs`` (filter, search, paging), ``/run?id=ID`` (inputs, outcome, pending
interrupts, its parent and child runs, the journal as a timeline),
``/run/download?id=ID&what=...`` (a stored JSON text as a file). Actions (POST forms, each
with a CSRF token; each redirects back to the run's page with a message): ``/run/respond``,
``/run/fork``, ``/run/cancel``, ``/run/send``, ``/run/resume``. The guards are
:mod:`._security`'s.
"""

from __future__ import annotations

import json
import re
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast, get_args
from urllib.parse import parse_qsl, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from agency_runtime import (
    AgencyError,
    Checkpoint,
    EntryImportError,
    Interrupt,
    InterruptResponse,
    InvalidArgumentError,
    JournalEntry,
    RunNotFoundError,
    RunRecord,
    RunResult,
    RunStatus,
    Store,
    StoreError,
    StoreUnavailableError,
    __version__,
    agency,
    open_store,
)
from agency_runtime._boundary._runtime import RUNTIME

from . import _views as views
from ._security import SESSION_COOKIE, Csrf, Guard, check_token, same_origin

__all__ = ["SEARCH_SCAN", "create_app"]

STATUSES: tuple[str, ...] = get_args(RunStatus)
SEARCH_SCAN = 5_000
"""How many of the newest runs (of the chosen status) an id search looks through."""
_SCAN_BATCH = 250
DAMAGED_STATUS = 422
"""The HTTP status of a page about a run whose stored row cannot be read (the request was
understood; what it names cannot be processed). The other runs are served as usual."""
PAGE_SIZES = (25, 50, 100, 200)
CHILDREN_SHOWN = 100
"""How many child runs a run's page lists (the newest, in the order they were created)."""
MAX_FORM_BYTES = 1_000_000
"""The largest POST body accepted (an event's payload, an answer's value)."""
_FLASHES = 256
_STATIC = {
    "app.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Flash:
    """A message shown once an action redirected back to a page."""

    kind: str  # "ok" or "error"
    text: str
    link: str | None = None
    link_text: str | None = None


class _Form:
    """A POST's fields (``application/x-www-form-urlencoded``, bounded)."""

    def __init__(self, fields: Sequence[tuple[str, str]]) -> None:
        self._fields = dict(fields)

    def get(self, name: str, default: str = "") -> str:
        return self._fields.get(name, default)


class _Refused(Exception):
    """A request refused with a status and a plain message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def create_app(
    store: str | Store,
    *,
    token: str | None = None,
    debug: bool = False,
) -> Starlette:
    """The run inspector over ``store`` (a URL or a :class:`Store`), as a Starlette app.

    Without ``token`` it serves only requests addressed to a loopback name (bind it to a
    loopback address); with one, every request needs it (``Authorization: Bearer T``, or
    open any page with ``?token=T`` once: a cookie keeps it). Serve it with any ASGI server
    (``agency ui`` uses uvicorn).
    """
    if not isinstance(store, str | Store):
        raise InvalidArgumentError(
            f"create_app needs a store URL or a Store, got {type(store).__name__}"
        )
    check_token(token)
    inspector = _Inspector(open_store(store))
    routes = [
        Route("/", inspector.home, methods=["GET", "HEAD"]),
        Route("/runs", inspector.runs, methods=["GET", "HEAD"]),
        Route("/run", inspector.run, methods=["GET", "HEAD"]),
        Route("/run/download", inspector.download, methods=["GET", "HEAD"]),
        Route("/run/respond", inspector.action(inspector.respond), methods=["POST"]),
        Route("/run/fork", inspector.action(inspector.fork), methods=["POST"]),
        Route("/run/cancel", inspector.action(inspector.cancel), methods=["POST"]),
        Route("/run/send", inspector.action(inspector.send), methods=["POST"]),
        Route("/run/resume", inspector.action(inspector.resume), methods=["POST"]),
        Route("/static/{name}", inspector.static, methods=["GET", "HEAD"]),
    ]
    app = Starlette(
        debug=debug,
        routes=routes,
        middleware=[Middleware(Guard, token=token)],
        exception_handlers={404: inspector.not_found, 405: inspector.not_allowed},
    )
    app.state.store = inspector.store
    return app


def _href(path: str, **params: Any) -> str:
    """``path`` with the query ``params`` (``None`` values left out)."""
    kept = {k: str(v) for k, v in params.items() if v is not None and v != ""}
    return f"{path}?{urlencode(kept)}" if kept else path


def run_href(run_id: str, **params: Any) -> str:
    return _href("/run", id=run_id, **params)


def _int(text: str | None, default: int, low: int, high: int) -> int:
    try:
        value = int(text) if text is not None else default
    except ValueError:
        return default
    return min(max(value, low), high)


def _parse_value(text: str) -> Any:
    """An answer's value: JSON when it parses, else the text itself (empty: none)."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _filename(run_id: str, what: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)[:80] or "run"
    return f"{safe}.{what}.json"


class _Inspector:
    """The routes' shared state: the store, the templates, CSRF and pending messages."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.csrf = Csrf()
        self.flashes: OrderedDict[str, Flash] = OrderedDict()
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("agency_runtime._ui", "templates"),
            autoescape=True,  # every page: nothing from the store is ever rendered unescaped
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals.update(
            href=_href,
            run_href=run_href,
            usd=views.usd,
            local_time=views.local_time,
            iso=views.iso,
            duration=views.duration,
            size=views.size,
            statuses=STATUSES,
            version=__version__,
            store_url=store.url,
        )
        self._static: dict[str, bytes] = {}

    # -- rendering -------------------------------------------------------------------------

    def page(
        self, request: Request, template: str, context: Mapping[str, Any], status: int = 200
    ) -> Response:
        """Render ``template``; the browser gets a session cookie (for CSRF) if it has none."""
        session = self.csrf.session_of(request)
        fresh = session is None
        if session is None:
            session = self.csrf.new_session()
        flash = self.flashes.get(request.query_params.get("flash", ""))
        body = self.env.get_template(template).render(
            {**context, "csrf": self.csrf.token(session), "flash": flash}
        )
        response = HTMLResponse(body, status_code=status)
        if fresh:
            response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict", path="/")
        return response

    def problem(self, request: Request, status: int, title: str, text: str) -> Response:
        return self.page(request, "problem.html", {"title": title, "text": text}, status)

    async def not_found(self, request: Request, exc: Exception) -> Response:
        return self.problem(request, 404, "Not found", f"Nothing is served at {request.url.path}.")

    async def not_allowed(self, request: Request, exc: Exception) -> Response:
        return self.problem(request, 405, "Method not allowed", f"{request.method} is not served.")

    def _flash(self, flash: Flash) -> str:
        key = secrets.token_urlsafe(12)
        self.flashes[key] = flash
        while len(self.flashes) > _FLASHES:
            self.flashes.popitem(last=False)
        return key

    # -- pages -----------------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/runs", status_code=303)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        media = _STATIC.get(name)
        if media is None:
            return self.problem(request, 404, "Not found", "No such asset.")
        body = self._static.get(name)
        if body is None:
            body = self._static[name] = (
                resources.files("agency_runtime._ui").joinpath("static", name).read_bytes()
            )
        return Response(body, media_type=media, headers={"cache-control": "max-age=3600"})

    async def runs(self, request: Request) -> Response:
        params = request.query_params
        status = params.get("status") or None
        notice = None
        if status is not None and status not in STATUSES:
            notice = f"unknown status {status[:40]!r}: showing every status"
            status = None
        query = params.get("q", "").strip()[:200]
        limit = _int(params.get("limit"), 50, 1, PAGE_SIZES[-1])
        offset = _int(params.get("offset"), 0, 0, 2**62)
        try:
            if query:
                records, more, search = await self._search(query, status, offset, limit)
            else:
                found = await agency.runs.list(
                    store=self.store,
                    status=cast("RunStatus | None", status),  # one of STATUSES
                    limit=limit + 1,
                    offset=offset,
                )
                records, more, search = found[:limit], len(found) > limit, None
        except StoreUnavailableError as exc:
            return self.problem(request, 503, "The store is unavailable", str(exc))
        rows = [_row(r) for r in records]

        def link(**change: Any) -> str:
            now = {"status": status, "q": query, "limit": limit, "offset": offset}
            now.update(change)
            if now["limit"] == 50:
                now["limit"] = None
            if now["offset"] == 0:
                now["offset"] = None
            return _href("/runs", **now)

        context = {
            "rows": rows,
            "status": status,
            "query": query,
            "limit": limit,
            "offset": offset,
            "page_sizes": PAGE_SIZES,
            "previous": link(offset=max(0, offset - limit)) if offset > 0 else None,
            "next": link(offset=offset + limit) if more else None,
            "status_link": lambda s: link(status=s, offset=0),
            "search": search,
            "notice": notice,
        }
        return self.page(request, "runs.html", context)

    async def _search(
        self, query: str, status: str | None, offset: int, limit: int
    ) -> tuple[list[RunRecord], bool, dict[str, Any]]:
        """Runs whose id contains ``query`` (any case) among the newest :data:`SEARCH_SCAN`
        (of ``status``), newest first; a run with exactly that id is always found."""
        needle = query.lower()
        matches: list[RunRecord] = []
        count = 0
        scanned = 0
        complete = False
        exact: RunRecord | None = None
        while scanned < SEARCH_SCAN:
            batch = await agency.runs.list(
                store=self.store,
                status=cast("RunStatus | None", status),  # one of STATUSES
                limit=min(_SCAN_BATCH, SEARCH_SCAN - scanned),
                offset=scanned,
            )
            scanned += len(batch)
            for record in batch:
                if needle in record.run_id.lower():
                    if offset <= count < offset + limit + 1:
                        matches.append(record)
                    count += 1
                    if record.run_id == query:
                        exact = record
            if len(batch) < _SCAN_BATCH or not batch:
                complete = True
                break
        if exact is None and not complete:
            try:
                found = await agency.runs.get(query, store=self.store)
            except RunNotFoundError:
                found = None
            if found is not None and (status is None or found.status == status):
                exact = found
                if offset == 0:
                    matches.insert(0, found)
                count += 1
        return (
            matches[:limit],
            len(matches) > limit,
            {"scanned": scanned, "complete": complete, "count": count, "limit": SEARCH_SCAN},
        )

    async def run(self, request: Request) -> Response:
        run_id = request.query_params.get("id", "")
        if not run_id:
            return RedirectResponse("/runs", status_code=303)
        page = _int(request.query_params.get("page"), 1, 1, 2**31)
        try:
            record = await agency.runs.get(run_id, store=self.store)
            window = await self._window(run_id, page)
        except RunNotFoundError:
            return self.problem(
                request, 404, "No such run", f"There is no run {run_id!r} in {self.store.url}."
            )
        except StoreUnavailableError as exc:
            return self.problem(request, 503, "The store is unavailable", str(exc))
        except StoreError as exc:  # its row (or journal) cannot be read: the others can
            return self.problem(
                request, DAMAGED_STATUS, "This run's stored row is damaged", str(exc)
            )
        clip = views.Clipper()
        answers = [
            (
                a.seq,
                a.interrupt,
                None if a.response is None else a.response.type,
                None if a.response is None else a.response.value,
                a.answered_at,
            )
            for a in window.answers
        ]
        try:
            newest = await agency.runs.list(
                store=self.store, parent=record.run_id, limit=CHILDREN_SHOWN + 1
            )
        except StoreUnavailableError as exc:
            return self.problem(request, 503, "The store is unavailable", str(exc))
        children = [_row(child) for child in reversed(newest[:CHILDREN_SHOWN])]
        timeline = views.build_timeline(
            record, window.entries, answers, window.checkpoints, page=1, clip=clip,
            per_page=2**31,
        )  # fmt: skip
        shown = [item for item in timeline.items if window.cut is None or item.seq > window.cut]
        timeline = views.Timeline(
            items=shown,
            page=window.page,
            pages=window.pages,
            total=window.size,
            entries=window.size,
            first=(window.page - 1) * views.JOURNAL_PAGE + 1 if shown else 0,
        )
        asked = record.interrupts if record.status == "paused" else []  # else: answered
        pending = [(i, None if i.data is None else clip.value(i.data, 2_000)) for i in asked]
        context = {
            "record": record,
            "run_id": record.run_id,
            "arguments_line": views.arguments_line(record.arguments),
            "arguments": clip.json(record.arguments, views.VALUE_PREVIEW),
            "overrides": None
            if record.overrides is None
            else clip.json(record.overrides, views.VALUE_PREVIEW),
            "value": None if record.value is None else clip.json(record.value, views.VALUE_PREVIEW),
            "error_message": None
            if record.error is None
            else clip.text(record.error.message, views.VALUE_PREVIEW),
            "error_traceback": None
            if record.error is None or not record.error.traceback
            else clip.text(record.error.traceback, views.VALUE_PREVIEW),
            "pending": pending,
            "children": children,
            "more_children": len(newest) > CHILDREN_SHOWN,
            "timeline": timeline,
            "page_link": lambda n: run_href(record.run_id, page=n if n != 1 else None),
            "took": (
                record.finished_at - record.started_at
                if record.finished_at is not None and record.started_at is not None
                else None
            ),
            "refresh": record.status in ("running", "queued"),
            "can_resume": record.status == "failed"
            or (record.status == "paused" and not record.interrupts),
        }
        return self.page(request, "run.html", context)

    async def _window(self, run_id: str, page: int) -> _Window:
        """The part of the journal page ``page`` shows, read a page at a time (never the
        whole journal): its :data:`~._views.JOURNAL_PAGE` steps with the interrupts and
        checkpoints among them, extended to the end of an LLM call open at its end (the call
        is journaled after its rounds and tools, which it gathers), with the step before it
        (the first item's "took"), and ``cut``: the items up to it were shown before."""
        per = views.JOURNAL_PAGE
        store = self.store
        after = None if page == 1 else await store.journal_position(run_id, (page - 1) * per - 2)
        read = await store.load_journal_page(
            run_id, after_seq=after, limit=per if page == 1 else per + 1
        )
        size, more = read.size, read.next_after
        last_page = max(1, -(-size // per))
        if page > last_page:  # past the end (the journal is shorter): its last page
            return await self._window(run_id, last_page)
        entries, answers = list(read.entries), list(read.answers)
        checkpoints = list(read.checkpoints)
        cut: int | None = None
        if page > 1 and entries:
            before = entries[0]  # the previous page's last step: shown there
            cut = before.seq
            open_call = views.outer_llm_call(before.path)
            if open_call is not None:  # an LLM call open across the boundary: shown there
                closing = next((e for e in entries if e.path == open_call), None)
                if closing is not None:
                    cut = closing.seq
        for _ in range(_EXTEND_PAGES):  # close an LLM call open at the page's end
            if more is None or not entries:
                break
            open_call = views.outer_llm_call(entries[-1].path)
            if open_call is None:
                break
            extra = await store.load_journal_page(run_id, after_seq=more, limit=per)
            end = next((i for i, e in enumerate(extra.entries) if e.path == open_call), None)
            taken = extra.entries if end is None else extra.entries[: end + 1]
            entries += taken
            if taken:
                last = taken[-1].seq
                answers += [a for a in extra.answers if a.seq <= last]
                checkpoints += [c for c in extra.checkpoints if c.seq <= last]
            if end is not None:
                break
            more = extra.next_after
        return _Window(
            entries=entries,
            answers=answers,
            checkpoints=checkpoints,
            cut=cut,
            page=page,
            pages=last_page,
            size=size,
        )

    async def download(self, request: Request) -> Response:
        """A stored JSON text of a run, as a file."""
        params = request.query_params
        run_id, what = params.get("id", ""), params.get("what", "")
        try:
            record = await agency.runs.get(run_id, store=self.store)
            text: str | None = None
            if what == "value":
                text = record.value
            elif what == "arguments":
                text = record.arguments
            elif what == "overrides":
                text = record.overrides
            elif what == "error" and record.error is not None:
                text = record.error.model_dump_json()
            elif what in ("step", "step-changes", "step-error", "step-locals"):
                seq = _int(params.get("seq"), -1, -1, 2**62)
                # The one step, not the whole journal (a big run's is big).
                around = await self.store.load_journal_page(run_id, after_seq=seq - 1, limit=1)
                entry = next((e for e in around.entries if e.seq == seq), None)
                if entry is not None:
                    text = {
                        "step": entry.result,
                        "step-changes": entry.deltas,
                        "step-error": entry.error,
                        "step-locals": entry.locals,
                    }[what]
        except RunNotFoundError:
            return self.problem(request, 404, "No such run", f"There is no run {run_id!r}.")
        except StoreUnavailableError as exc:
            return self.problem(request, 503, "The store is unavailable", str(exc))
        except StoreError as exc:
            return self.problem(
                request, DAMAGED_STATUS, "This run's stored row is damaged", str(exc)
            )
        if text is None:
            return self.problem(request, 404, "Nothing to download", "The run holds no such text.")
        name = _filename(run_id, what if "seq" not in params else f"{what}-{params['seq']}")
        return Response(
            text,
            media_type="application/json",
            headers={"content-disposition": f'attachment; filename="{name}"'},
        )

    # -- actions ---------------------------------------------------------------------------

    def action(self, handler: Callable[[RunRecord, _Form], Awaitable[Flash]]) -> Handler:
        """A POST route: checked (origin, size, CSRF), then ``handler``, then back to the
        run's page with the message it returns."""

        async def endpoint(request: Request) -> Response:
            try:
                form = await self._form(request)
            except _Refused as exc:
                return self.problem(request, exc.status, "Refused", str(exc))
            run_id = form.get("id")
            try:
                record = await agency.runs.get(run_id, store=self.store)
            except RunNotFoundError:
                return self.problem(request, 404, "No such run", f"There is no run {run_id!r}.")
            except AgencyError as exc:  # no id, or the store is down
                return self.problem(request, 400, "Refused", str(exc))
            try:
                flash = await handler(record, form)
            except AgencyError as exc:
                flash = Flash("error", str(exc))
            return RedirectResponse(
                run_href(record.run_id, flash=self._flash(flash)), status_code=303
            )

        return endpoint

    async def _form(self, request: Request) -> _Form:
        if not same_origin(request):
            raise _Refused(403, "This form was sent from another site.")
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            raise _Refused(415, "Forms are sent as application/x-www-form-urlencoded.")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                raise _Refused(413, f"A form may hold at most {MAX_FORM_BYTES} bytes.")
        try:
            fields = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
        except (UnicodeDecodeError, ValueError) as exc:
            raise _Refused(400, f"The form could not be read ({exc}).") from None
        form = _Form(fields)
        if not self.csrf.valid(self.csrf.session_of(request), form.get("csrf")):
            raise _Refused(
                403,
                "The form's CSRF token is missing or wrong (the page may be from before the "
                "inspector restarted): reload the page and try again.",
            )
        return form

    async def respond(self, record: RunRecord, form: _Form) -> Flash:
        """Approve or reject one pending interrupt, then continue the run (or queue it)."""
        answer = form.get("answer")
        if answer not in ("approve", "reject"):
            return Flash("error", "Choose approve or reject.")
        interrupt: Interrupt | None = next(
            (i for i in record.interrupts if i.interrupt_id == form.get("interrupt")), None
        )
        if record.status != "paused" or interrupt is None:
            return Flash(
                "error",
                f"Run {record.run_id} is {record.status} and has no pending interrupt "
                f"{form.get('interrupt')!r} (answered already?); nothing was stored.",
            )
        enqueue = record.queue is not None or form.get("worker") == "1"
        if not enqueue:
            refusal = self._cannot_run_here(record)
            if refusal is not None:
                return refusal
        response = InterruptResponse.model_validate(
            {"type": answer, "value": _parse_value(form.get("value"))}
        )
        result = await agency.respond_to_interrupts(
            [interrupt], {interrupt.interrupt_id: response}, store=self.store, enqueue=enqueue
        )
        verb = "Approved" if answer == "approve" else "Rejected"
        if enqueue:
            queue = record.queue or "default"
            return Flash(
                "ok",
                f"{verb}; the run is {result.status} in queue {queue!r}: a worker of that "
                f"queue continues it (agency worker --store {self.store.url} --queue {queue} "
                "--import YOUR_MODULE).",
            )
        return _outcome(f"{verb}; the run continued in this process", result)

    async def resume(self, record: RunRecord, form: _Form) -> Flash:
        """Continue a failed run, or a paused one that waits for no answer (a fork)."""
        if record.status not in ("failed", "paused") or record.interrupts:
            return Flash("error", f"Run {record.run_id} is {record.status}: nothing to resume.")
        refusal = self._cannot_run_here(record)
        if refusal is not None:
            return refusal
        result = await agency.resume(record.run_id, store=self.store)
        return _outcome("The run continued in this process", result)

    def _cannot_run_here(self, record: RunRecord) -> Flash | None:
        """Why this process may not continue ``record`` (its entry is not declared here)."""
        try:
            RUNTIME.entries.find(record.run_id, record.entry)
        except EntryImportError as exc:
            worker = (
                " or tick “hand to a worker” and serve the store with "
                f"`agency worker --store {self.store.url} --import MODULE`"
                if record.interrupts
                else ""
            )
            return Flash(
                "error",
                f"This process cannot continue run {record.run_id}: its entry "
                f"{record.entry!r} is not declared here ({exc}). Start `agency ui` with "
                f"--import MODULE (the module that declares it){worker}. Nothing was stored.",
            )
        return None

    async def fork(self, record: RunRecord, form: _Form) -> Flash:
        path = form.get("path")
        new_id = await agency.runs.fork(record.run_id, path, store=self.store)
        return Flash(
            "ok",
            f"Forked {record.run_id} after step {path} as {new_id} (paused: resume it to run "
            "the steps after it again).",
            link=run_href(new_id),
            link_text=new_id,
        )

    async def cancel(self, record: RunRecord, form: _Form) -> Flash:
        after = await agency.runs.cancel(record.run_id, store=self.store)
        if after.status == "cancelled" and record.status != "cancelled":
            return Flash("ok", f"Run {record.run_id} cancelled.")
        return Flash("error", f"Run {record.run_id} is {after.status} already: nothing to cancel.")

    async def send(self, record: RunRecord, form: _Form) -> Flash:
        name = form.get("name").strip()
        text = form.get("payload")
        try:
            payload = json.loads(text) if text.strip() else None
        except (ValueError, RecursionError) as exc:
            return Flash("error", f"The payload is not JSON ({exc}); nothing was sent.")
        event = await agency.runs.send(record.run_id, name, payload, store=self.store)
        waiting = (
            " The run waits for it: a worker of its queue continues it."
            if record.status == "waiting" and name in record.waiting_for
            else " It waits until the run asks for it (agency.wait_for_event)."
        )
        return Flash("ok", f"Event {event.name!r} sent (#{event.event_id}).{waiting}")


_EXTEND_PAGES = 20
"""How many more pages a page reads at most to show an LLM call open at its end whole."""


@dataclass
class _Window:
    """What one page of a run's timeline is built from (see :meth:`_Inspector._window`)."""

    entries: list[JournalEntry]
    answers: list[Any]
    """The interrupts asked among them (the store's InterruptAnswer records)."""
    checkpoints: list[Checkpoint]
    cut: int | None
    """Items at or before this journal position were shown on the page before."""
    page: int
    pages: int
    size: int
    """How many steps the whole journal holds."""


def _outcome(prefix: str, result: RunResult) -> Flash:
    if result.status == "completed":
        return Flash("ok", f"{prefix} and completed.")
    if result.status == "paused":
        return Flash("ok", f"{prefix} and paused again ({len(result.interrupts)} interrupt(s)).")
    if result.status == "failed" and result.error is not None:
        return Flash(
            "error", f"{prefix} and failed: {result.error.type}: {result.error.message[:2000]}"
        )
    return Flash("ok", f"{prefix}; it is {result.status}.")


def _row(record: RunRecord) -> dict[str, Any]:
    if record.damaged is not None:  # what could not be read is not shown as if it were
        return {
            "run_id": record.run_id,
            "shown_id": record.run_id if len(record.run_id) <= 120 else record.run_id[:119] + "…",
            "status": "damaged",
            "damaged": record.damaged if len(record.damaged) <= 200 else record.damaged[:199] + "…",
            "wake": None,
            "entry": record.entry if len(record.entry) <= 80 else "…" + record.entry[-79:],
            "interrupts": 0,
            "queue": None,
        }
    wake = None
    if record.status == "waiting":
        wake = (
            f"wakes {views.local_time(record.wake_at)}"
            if record.wake_at is not None
            else "waits for an event"
        )
        if record.waiting_for:
            names = ", ".join(record.waiting_for)
            wake += f" or {names[:80]}" if record.wake_at is not None else f": {names[:80]}"
    return {
        "run_id": record.run_id,
        "shown_id": record.run_id if len(record.run_id) <= 120 else record.run_id[:119] + "…",
        "status": record.status,
        "wake": wake,
        "entry": record.entry if len(record.entry) <= 80 else "…" + record.entry[-79:],
        "attempts": record.attempts,
        "cost": views.usd(record.cost_pico),
        "tokens": record.tokens,
        "created": record.created_at,
        "interrupts": len(record.interrupts) if record.status == "paused" else 0,
        "queue": record.queue,
        "damaged": None,
    }
