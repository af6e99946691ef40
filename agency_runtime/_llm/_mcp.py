"""Tools from MCP servers: ``agency.mcp.stdio(...)`` / ``agency.mcp.http(...)`` toolsets.

An :class:`McpServer` is a toolset for ``agency.llm(..., tools=[server, fn])``. Each round of
the call lists the server's tools (:func:`offer`) and records what it offered in the round's
journal entry, so a replayed round offers exactly those (:func:`revive`), whatever the server
lists now. Each offered tool is an :class:`McpTool`: a :class:`~._tools.Tool` whose function
calls the server, so the tool loop journals each call as a unit of its own
(``tool:<server>.<tool>``) and never runs a finished one again.

The official ``mcp`` SDK (extra ``mcp``) is imported by the first listing or call. Sessions
are opened lazily and shared per process and configuration: they live on one event loop in a
daemon thread (``agency-mcp``), whose tasks enter and leave each client's anyio scopes, and are
closed at exit; a run, on any event loop, waits for its requests from a worker thread. A
stdio server's stderr goes to the ``agency_runtime.mcp`` logger.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, create_model
from pydantic_core import from_json

from .._core._jsondata import json_problem
from .._errors import InvalidArgumentError, McpError
from ._tools import Tool

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures

    from mcp import Client

__all__ = ["McpServer", "McpTool", "http", "offer", "revive", "stdio"]

LOG = logging.getLogger("agency_runtime.mcp")
"""Where a stdio server's stderr and the toolsets' warnings go."""

DEFAULT_TIMEOUT = 60.0
"""Seconds one listing or call may take by default; then the model reads a timeout."""

OPEN_TIMEOUT = 60.0
"""Seconds opening a session may take (starting a stdio server, the MCP handshake) when the
server's own ``timeout`` is shorter: a short call timeout must not fail a server that is
merely slow to start on a busy machine."""

_NAME = re.compile(r"[^A-Za-z0-9_-]")
_T = TypeVar("_T")


def _clean(name: str) -> str:
    """A name providers accept (letters, digits, ``_``, ``-``; at most 64)."""
    return _NAME.sub("_", name)[:64] or "mcp"


class McpServer:
    """The tools of one MCP server, for ``agency.llm(..., tools=[server, ...])``.

    Make one with ``agency.mcp.stdio(command, args)`` (a subprocess speaking MCP on its
    stdin/stdout) or ``agency.mcp.http(url)`` (streamable HTTP). ``name`` names its calls
    in the journal (``tool:<name>.<tool>``) and prefixes its tools where two toolsets'
    names collide; ``needs_approval`` (``True`` or a set of the server's tool names) asks
    ``std::tool-approval`` before a call; ``timeout`` bounds each listing and call (seconds),
    and opening the session is bounded by the larger of it and :data:`OPEN_TIMEOUT`.
    Nothing connects until a call first lists its tools; servers of one configuration share
    one session per process.
    """

    __slots__ = ("_approve", "_key", "kind", "name", "timeout")

    def __init__(
        self,
        kind: Literal["stdio", "http"],
        key: tuple[Any, ...],
        name: str,
        needs_approval: bool | Iterable[str],
        timeout: float,
    ) -> None:
        self.kind, self._key, self.timeout = kind, key, timeout
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", name):
            raise InvalidArgumentError(
                f"an MCP server's name must be 1 to 40 letters, digits, '_' or '-', got {name!r}"
            )
        self.name = name
        if isinstance(needs_approval, bool):
            self._approve: bool | frozenset[str] = needs_approval
        elif isinstance(needs_approval, str) or not isinstance(needs_approval, Iterable):
            raise InvalidArgumentError(
                f"needs_approval must be a bool or a set of tool names, got {needs_approval!r}"
            )
        else:
            self._approve = frozenset(str(n) for n in needs_approval)

    def __repr__(self) -> str:
        return f"<McpServer {self.name!r} ({self.kind})>"

    def approves(self, tool: str) -> bool:
        """Whether a call of the server's tool ``tool`` asks a human first."""
        return self._approve if isinstance(self._approve, bool) else tool in self._approve

    async def list_tools(self) -> list[dict[str, Any]]:
        """The server's tools now: ``{"name", "description", "parameters"}`` each."""

        async def listed(client: Client) -> list[dict[str, Any]]:
            tools, cursor = [], None
            for _ in range(100):
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            return [
                {
                    "name": t.name,
                    "description": t.description or "",
                    "parameters": dict(t.input_schema or {"type": "object"}),
                }
                for t in tools
            ]

        return await _HUB.request(self, listed, "list its tools")

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """Call the server's tool: its text (or structured content); raises :class:`McpError`
        for an ``isError`` result, a timeout or a server that cannot be reached."""

        async def called(client: Client) -> Any:
            return await client.call_tool(tool, arguments)

        result = await _HUB.request(self, called, f"call {tool!r}")
        text = "\n".join(
            str(getattr(part, "text", None) or part.model_dump_json(exclude_none=True))
            for part in result.content
        )
        if result.is_error:
            raise McpError(f"the server {self.name!r} answered with an error: {text}")
        if result.structured_content is not None and not text:
            return result.structured_content
        return text


@dataclass(frozen=True, slots=True)
class McpTool(Tool):
    """A tool of an MCP server as the model sees it (its name maybe prefixed ``<server>_``)."""

    server: str = ""
    """The server's name."""
    remote: str = ""
    """The tool's name on its server."""

    @property
    def step_name(self) -> str:
        """The journal's name of a call: ``<server>.<tool>``."""
        return f"{self.server}.{self.remote}"

    def parse(self, text: str) -> dict[str, Any]:
        """The model's arguments: a JSON object (the server validates them)."""
        data = from_json(text or "{}")
        if not isinstance(data, dict):
            raise ValueError(f"the arguments must be a JSON object, got {text!r:.80}")
        problem = json_problem(data)
        if problem is not None:
            raise ValueError(f"{problem}; send finite numbers")
        return data


@functools.cache
def _any_arguments() -> type[BaseModel]:
    return create_model("mcp_arguments", __config__=ConfigDict(extra="allow"))


def _tool(
    server: McpServer | None, server_name: str, spec: Mapping[str, Any], shown: str
) -> McpTool:
    from ._provider import ToolSpec

    remote = str(spec["name"])
    description = str(spec.get("description") or "")
    parameters = dict(spec.get("parameters") or {"type": "object"})

    async def call(**arguments: Any) -> Any:
        if server is None:
            raise McpError(f"the MCP server {server_name!r} is not among this call's tools now")
        return await server.call(remote, arguments)

    return McpTool(
        fn=call,
        name=shown,
        description=description,
        needs_approval=False if server is None else server.approves(remote),
        arguments=_any_arguments(),
        spec=ToolSpec(name=shown, description=description, parameters=parameters),
        server=server_name,
        remote=remote,
    )


def recorded(tools: Iterable[Tool]) -> list[dict[str, Any]]:
    """What a round journals of the MCP tools it offered."""
    return [
        {
            "server": t.server,
            "tool": t.remote,
            "name": t.name,
            "description": t.description,
            "parameters": t.spec.parameters,
        }
        for t in tools
        if isinstance(t, McpTool)
    ]


def _merged(
    functions: dict[str, Tool], listed: list[tuple[McpServer | None, str, Mapping[str, Any]]]
) -> dict[str, Tool]:
    counts: dict[str, int] = {}
    for _, _, spec in listed:
        counts[_clean(str(spec["name"]))] = counts.get(_clean(str(spec["name"])), 0) + 1
    tools = dict(functions)
    for server, server_name, spec in listed:
        shown = _clean(str(spec["name"]))
        if shown in functions or counts[shown] > 1:
            shown = _clean(f"{server_name}_{spec['name']}")
        if shown not in tools:
            tools[shown] = _tool(server, server_name, spec, shown)
    return tools


async def offer(
    functions: dict[str, Tool], toolsets: tuple[McpServer, ...], previous: dict[str, Tool]
) -> tuple[dict[str, Tool], dict[str, str]]:
    """A live round's tools: the functions and every server's tools now (prefixed where
    names collide); a server that cannot list them offers the tools it offered in the
    previous round (``previous``), and why it could not is returned by server name."""
    listed: list[tuple[McpServer | None, str, Mapping[str, Any]]] = []
    unreachable: dict[str, str] = {}
    for server in toolsets:
        try:
            specs: list[Mapping[str, Any]] = list(await server.list_tools())
        except McpError as exc:
            LOG.warning("MCP server %r: %s", server.name, exc)
            unreachable[server.name] = str(exc)
            specs = [
                {"name": t.remote, "description": t.description, "parameters": t.spec.parameters}
                for t in previous.values()
                if isinstance(t, McpTool) and t.server == server.name
            ]
        listed.extend((server, server.name, spec) for spec in specs)
    return _merged(functions, listed), unreachable


def revive(
    functions: dict[str, Tool], toolsets: tuple[McpServer, ...], data: list[Any]
) -> dict[str, Tool]:
    """A replayed round's tools: the functions and the MCP tools it journaled, bound to the
    call's servers by name (none asked: a server not passed any more fails its calls)."""
    by_name = {server.name: server for server in toolsets}
    tools = dict(functions)
    for item in data:
        server_name = str(item["server"])
        spec = {
            "name": item["tool"],
            "description": item.get("description", ""),
            "parameters": item.get("parameters") or {"type": "object"},
        }
        shown = str(item["name"])
        tools[shown] = _tool(by_name.get(server_name), server_name, spec, shown)
    return tools


def split(items: Iterable[Any]) -> tuple[list[Any], tuple[McpServer, ...]]:
    """``tools=`` as its functions and its MCP toolsets (two toolsets of one name refused);
    a value that is no list is left for :func:`~._tools.as_tools` to refuse."""
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        return items, ()  # type: ignore[return-value]
    functions: list[Any] = []
    toolsets: list[McpServer] = []
    for item in items:
        if isinstance(item, McpServer):
            if any(s.name == item.name for s in toolsets):
                raise InvalidArgumentError(
                    f"two MCP servers are named {item.name!r}; pass name= to tell them apart"
                )
            toolsets.append(item)
        else:
            functions.append(item)
    return functions, tuple(toolsets)


# -- sessions ------------------------------------------------------------------------------


class _Session:
    """One open client, held by a task of the hub's loop (which enters and leaves it)."""

    def __init__(self, server: McpServer) -> None:
        import asyncio

        self.kind, self.key, self.name = server.kind, server._key, server.name
        self.client: Client | None = None
        self.closing = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def open(self) -> Client:
        import asyncio

        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self.task = asyncio.get_running_loop().create_task(self._hold(ready))
        return await ready

    async def _hold(self, ready: asyncio.Future[Client]) -> None:
        from contextlib import AsyncExitStack

        from mcp import Client

        errlog: Any = None
        try:
            async with AsyncExitStack() as stack:
                if self.kind == "stdio":
                    from mcp import StdioServerParameters
                    from mcp.client.stdio import stdio_client

                    command, args, env, cwd = self.key[1:]
                    errlog = _stderr_to_log(self.name)
                    params = StdioServerParameters(
                        command=command, args=list(args), env=dict(env) if env else None, cwd=cwd
                    )
                    transport: Any = stdio_client(params, errlog=errlog)
                else:
                    import httpx2
                    from mcp.client.streamable_http import streamable_http_client

                    url, headers = self.key[1:]
                    http_client = await stack.enter_async_context(
                        httpx2.AsyncClient(
                            headers=dict(headers), timeout=httpx2.Timeout(30.0, read=300.0)
                        )
                    )
                    transport = streamable_http_client(url, http_client=http_client)
                client = await stack.enter_async_context(Client(transport))
                self.client = client
                ready.set_result(client)
                await self.closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else McpError(repr(exc)))
            elif not isinstance(exc, Exception):
                raise
            else:
                LOG.warning("MCP server %r: its session ended: %s", self.name, _why(exc))
        finally:
            self.client = None
            if errlog is not None:
                errlog.close()


def _stderr_to_log(name: str) -> Any:
    """A file for a server's stderr whose lines a daemon thread logs."""
    read, write = os.pipe()

    def pump() -> None:
        with os.fdopen(read, "r", errors="replace") as lines:
            for line in lines:
                if line.strip():
                    LOG.info("[%s] %s", name, line.rstrip())

    threading.Thread(target=pump, name=f"agency-mcp-stderr-{name}", daemon=True).start()
    return os.fdopen(write, "w")


def _why(exc: BaseException) -> str:
    """The innermost message of an error (the SDK raises exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class _Hub:
    """The process's sessions by configuration, on one event loop in a daemon thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._sessions: dict[tuple[Any, ...], _Session] = {}
        self._opening: dict[tuple[Any, ...], asyncio.Lock] = {}

    def _start(self) -> asyncio.AbstractEventLoop:
        import asyncio

        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="agency-mcp", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                atexit.register(self.close)
            return self._loop

    async def _client(self, server: McpServer) -> Client:
        import asyncio

        opening = self._opening.setdefault(server._key, asyncio.Lock())
        async with opening:
            session = self._sessions.get(server._key)
            if session is not None and session.client is not None:
                return session.client
            session = _Session(server)
            client = await session.open()
            self._sessions[server._key] = session
            return client

    async def _drop(self, key: tuple[Any, ...]) -> None:
        session = self._sessions.pop(key, None)
        if session is not None:
            session.closing.set()

    def _submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        import asyncio
        import contextvars

        # In an empty context: the hub's task must not inherit the caller's (its event
        # loop library as sniffio sees it, trio's say, or the run's frame).
        return contextvars.Context().run(asyncio.run_coroutine_threadsafe, coro, self._start())

    async def request(
        self, server: McpServer, ask: Callable[[Client], Coroutine[Any, Any, _T]], what: str
    ) -> _T:
        """``ask(client)`` on the server's shared session, from any event loop; a failure
        (the session is then dropped, to be opened again) raises :class:`McpError`."""
        import anyio

        async def run() -> _T:
            import asyncio

            opens = max(server.timeout, OPEN_TIMEOUT)
            client: Client | None = None
            try:
                async with asyncio.timeout(opens):
                    client = await self._client(server)
                async with asyncio.timeout(server.timeout):
                    return await ask(client)
            except TimeoutError:
                await self._drop(server._key)
                late = what if client is not None else "start"
                bound = server.timeout if client is not None else opens
                raise McpError(
                    f"the server {server.name!r} did not {late} within {bound:g} s"
                ) from None
            except Exception as exc:
                await self._drop(server._key)
                raise McpError(
                    f"could not {what} on the server {server.name!r}: {_why(exc)}"
                ) from None

        future = self._submit(run())
        try:
            return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        finally:
            future.cancel()  # a cancelled run's request ends too (a done one: nothing)

    def close(self) -> None:
        """Close every session and stop the loop (at exit)."""
        import asyncio

        loop = self._loop
        if loop is None:
            return

        async def closed() -> None:
            sessions = list(self._sessions.values())
            self._sessions.clear()
            for session in sessions:
                session.closing.set()
            tasks = [s.task for s in sessions if s.task is not None]
            if tasks:
                await asyncio.wait(tasks, timeout=5.0)

        try:
            asyncio.run_coroutine_threadsafe(closed(), loop).result(timeout=6.0)
        except Exception:  # closing at exit is best effort
            LOG.debug("closing MCP sessions failed", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            if not self._thread.is_alive():
                loop.close()
        with self._lock:
            self._loop, self._thread = None, None


_HUB = _Hub()


# -- the public constructors ---------------------------------------------------------------


def _default_name(*words: str) -> str:
    for word in reversed(words):
        if word and not word.startswith("-"):
            stem = os.path.splitext(os.path.basename(word.rstrip("/")))[0]
            if stem:
                return _clean(stem)[:40]
    return "mcp"


def _check_timeout(timeout: float) -> float:
    from .._bounds import check_seconds

    return float(check_seconds(timeout, "mcp: timeout", positive=True))


def stdio(
    command: str,
    args: Iterable[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    name: str | None = None,
    needs_approval: bool | Iterable[str] = False,
    timeout: float = DEFAULT_TIMEOUT,
) -> McpServer:
    """The tools of an MCP server run as ``command args...`` (stdio transport).

    ``env`` adds to the SDK's default environment (``PATH``, ``HOME``, …, not the whole of
    this process's); ``name`` defaults to the script's or command's stem.
    """
    if not isinstance(command, str) or not command:
        raise InvalidArgumentError(f"command must be a non-empty string, got {command!r}")
    if isinstance(args, str):
        raise InvalidArgumentError("args must be a list of strings, not one string")
    words = tuple(str(a) for a in args)
    key = (
        "stdio",
        command,
        words,
        tuple(sorted((str(k), str(v)) for k, v in (env or {}).items())),
        None if cwd is None else os.fspath(cwd),
    )
    chosen = name if name is not None else _default_name(command, *words)
    return McpServer("stdio", key, chosen, needs_approval, _check_timeout(timeout))


def http(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    name: str | None = None,
    needs_approval: bool | Iterable[str] = False,
    timeout: float = DEFAULT_TIMEOUT,
) -> McpServer:
    """The tools of an MCP server at ``url`` (streamable HTTP, e.g. ``http://host:8000/mcp``).

    ``headers`` go with every request (an ``Authorization``, say); ``name`` defaults to the
    URL's host.
    """
    from urllib.parse import urlsplit

    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
        raise InvalidArgumentError(f"url must be an http(s) URL, got {url!r}")
    key = ("http", url, tuple(sorted((str(k), str(v)) for k, v in (headers or {}).items())))
    host = urlsplit(url).hostname or "mcp"
    chosen = name if name is not None else _clean(host.split(".")[0])[:40]
    return McpServer("http", key, chosen, needs_approval, _check_timeout(timeout))
