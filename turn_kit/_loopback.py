"""What the loopback fakes of the platform APIs share: a server, handler plumbing, failures.

The fake Telegram Bot API and the fake Slack Web API each run a stdlib
:class:`http.server.ThreadingHTTPServer` in a daemon thread on a loopback host with an
ephemeral port. :class:`LoopbackServer` is that lifecycle (start, stop, ``base_url``, the
context manager); :class:`LoopbackHandler` the request plumbing (reading the body, parsing
its arguments, writing JSON answers, withholding one, no logging); :class:`FailureQueues`
the ``fail_next`` bookkeeping, failures queued per method and taken first queued first.
The platform's methods, errors and answers stay in each fake.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, ClassVar, Literal, Self
from urllib.parse import parse_qsl

__all__ = [
    "BadBody",
    "Failure",
    "FailureQueues",
    "Hang",
    "LoopbackHandler",
    "LoopbackServer",
    "request_params",
]


class LoopbackServer:
    """A fake API served over real HTTP on ``host``, from a daemon thread.

    A subclass names itself in :attr:`_name` (its ``repr`` and its thread's name) and builds
    its request handler class in :meth:`_handler_class`. While it stops, :attr:`_stopping` is
    set, which ends withheld answers (:meth:`LoopbackHandler._withhold`); :meth:`_on_stop`
    wakes anything else that waits.
    """

    _name: ClassVar[str] = "LoopbackServer"

    def __init__(self, *, host: str) -> None:
        self.host = host
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        state = f"base_url={self.base_url!r}" if self._server else "stopped"
        return f"{self._name}({state})"

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class serving this fake."""
        raise NotImplementedError

    def _on_stop(self) -> None:
        """Called while stopping, after :attr:`_stopping` is set and before the server shuts
        down: wake what waits on the fake's own state (nothing here)."""

    def start(self) -> Self:
        """Bind an ephemeral port and serve in a daemon thread (idempotent)."""
        if self._server is not None:
            return self
        self._stopping.clear()
        server = ThreadingHTTPServer((self.host, 0), self._handler_class())
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=self._name,
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (idempotent); ends withheld answers and runs :meth:`_on_stop`."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()
        self._on_stop()
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port it listens on (only while running)."""
        if self._server is None:
            raise RuntimeError(f"{self._name} is not running; use `with {self._name}() as api:`")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://<host>:<port>`` (only while running)."""
        return f"http://{self.host}:{self.port}"


class BadBody(ValueError):
    """A request body that is not arguments: ``reason`` is ``"charset"`` (not UTF-8),
    ``"json"`` (not a JSON object) or ``"content_type"`` (neither JSON nor a form)."""

    def __init__(self, reason: Literal["charset", "json", "content_type"], detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def request_params(query: str, body: bytes, content_type: str | None) -> dict[str, Any]:
    """A request's arguments: the query string's, then the body's (a JSON object, or a form
    when ``content_type`` says so or says nothing); :class:`BadBody` when the body is
    neither."""
    params: dict[str, Any] = dict(parse_qsl(query, keep_blank_values=True))
    if not body:
        return params
    ctype = (content_type or "").split(";")[0].strip().lower()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadBody("charset", str(exc)) from None
    if ctype == "application/json":
        try:
            loaded = json.loads(text)
        except ValueError as exc:
            raise BadBody("json", str(exc)) from None
        if not isinstance(loaded, dict):
            raise BadBody("json", "JSON body must be an object")
        params.update(loaded)
    elif ctype in ("application/x-www-form-urlencoded", ""):
        params.update(parse_qsl(text, keep_blank_values=True))
    else:
        raise BadBody("content_type", f"unsupported content type {ctype!r}")
    return params


class Hang(Exception):
    """Send no answer at all: wait ``seconds`` (or until the fake stops), then drop the
    connection."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


class LoopbackHandler(BaseHTTPRequestHandler):
    """The plumbing of a fake's request handler: a subclass answers in :meth:`_handle`.

    ``GET`` and ``POST`` both come to :meth:`_handle` (with the body read for ``POST``);
    :meth:`_params` parses the arguments, :meth:`_reply` writes a JSON answer and
    :meth:`_withhold` sends none. Nothing is logged: the fakes record their calls, and a
    request line may carry a token.
    """

    json_content_type: ClassVar[str] = "application/json"

    def log_message(self, format: str, *args: Any) -> None:
        """Silent on purpose (see the class docstring)."""
        return

    def do_GET(self) -> None:
        """A method called with GET (arguments in the query string)."""
        self._handle(body=b"")

    def do_POST(self) -> None:
        """A method called with POST (arguments in the body and/or query string)."""
        length = int(self.headers.get("Content-Length") or 0)
        self._handle(body=self.rfile.read(length) if length else b"")

    def _handle(self, *, body: bytes) -> None:
        """Answer the request (``self.path``, ``self.headers``) whose body is ``body``."""
        raise NotImplementedError

    def _params(self, query: str, body: bytes) -> dict[str, Any]:
        """The request's arguments (see :func:`request_params`)."""
        return request_params(query, body, self.headers.get("Content-Type"))

    def _reply(
        self, status: int, payload: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        """Answer HTTP ``status`` with ``payload`` as JSON (a client gone is no error)."""
        data = json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", self.json_content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _withhold(self, stopping: threading.Event, seconds: float) -> None:
        """Answer nothing: wait ``seconds`` or until ``stopping`` is set, then drop the
        connection."""
        stopping.wait(seconds)
        self.close_connection = True


class Failure:
    """One queued injected failure: its ``kind``, how many more calls it fails (``times``),
    the chat or channel it is limited to (``target``, ``None`` for any) and the details a kind
    uses (``retry_after``, ``hang``, ``error``)."""

    __slots__ = ("error", "hang", "kind", "retry_after", "target", "times")

    def __init__(
        self,
        kind: str,
        *,
        times: int,
        retry_after: float,
        hang: float,
        target: str | None = None,
        error: str | None = None,
    ) -> None:
        self.kind = kind
        self.times = times
        self.retry_after = retry_after
        self.hang = hang
        self.target = target
        self.error = error


class FailureQueues:
    """The failures queued per method, taken first queued first (not thread-safe: the fake's
    lock guards it)."""

    def __init__(self) -> None:
        self._queues: dict[str, list[Failure]] = {}

    def add(self, method: str, failure: Failure) -> None:
        """Queue ``failure`` for the next calls of ``method``."""
        self._queues.setdefault(method, []).append(failure)

    def take(
        self,
        method: str,
        target: str | None,
        *,
        applies: Callable[[Failure], bool] | None = None,
    ) -> Failure | None:
        """The first failure queued for a call of ``method`` to ``target`` (one whose target
        is ``None`` or ``target``, and that ``applies`` to the call if given), used up once;
        ``None`` when there is none."""
        queue = self._queues.get(method)
        if not queue:
            return None
        for failure in queue:
            if failure.target is not None and failure.target != target:
                continue
            if applies is not None and not applies(failure):
                continue
            failure.times -= 1
            if failure.times <= 0:
                queue.remove(failure)
            return failure
        return None
