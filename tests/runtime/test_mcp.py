"""``agency.mcp``: MCP servers as durable toolsets of ``agency.llm`` — against real servers
written with the ``mcp`` SDK (a stdio subprocess, a streamable-HTTP server on loopback), the
fake model scripting the calls (``FakeToolCall``).

The servers' processes are forks of one that imported the SDK once (``tests/forked.py``):
the runtime starts a launcher that hands its stdin, stdout and stderr to a forked child, which
runs the server script as ``python script`` would, instead of an interpreter that spends
~0.9 s of CPU importing the SDK. The first test starts its server the plain way."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agency_runtime import McpServer, SqliteStore, Store, agency, approve
from agency_runtime._errors import McpError
from agency_runtime._llm import _mcp
from agency_runtime.testing import FakeModel, FakeRequest, FakeToolCall
from tests.forked import ForkServer

SERVER_IMPORTS = (
    "anyio",
    "anyio._backends._asyncio",
    "mcp.server.mcpserver",
    "mcp.server.stdio",
    "uvicorn",  # the streamable-HTTP server's
)
"""What the test servers import, imported once by the fork server that starts them."""

if importlib.util.find_spec("mcp") is None:  # found, not imported: the servers import it
    pytest.skip("the mcp SDK is not installed (extra 'mcp')", allow_module_level=True)
# The tests start real MCP servers (slow). One xdist worker runs them all: spread over three,
# each worker started its own fork server and its own sessions (-n 3: ~17 s of CPU, not ~13.5).
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.xdist_group("mcp")]

SERVER = textwrap.dedent(
    '''
    """An MCP server for the tests: every call appends a line to $MCP_COUNTER."""
    import os
    import sys
    import time

    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("demo")
    version = open(os.environ["MCP_VERSION"]).read().strip()
    time.sleep(float(os.environ.get("MCP_START_DELAY", "0")))  # a server slow to start


    def ran(what):
        with open(os.environ["MCP_COUNTER"], "a") as counter:
            counter.write(what + "\\n")


    if version == "1":
        @server.tool()
        def add(a: int, b: int) -> str:
            """Add two numbers."""
            ran(f"add {a} {b}")
            print(f"adding {a} and {b}", file=sys.stderr, flush=True)
            return str(a + b)


    @server.tool()
    def pay(amount: int, to: str) -> str:
        """Send money."""
        ran(f"pay {amount} {to}")
        return f"paid {amount} to {to}"


    @server.tool()
    def boom(why: str) -> str:
        """Always fails."""
        ran("boom")
        raise ToolError(f"it broke: {why}")


    @server.tool()
    async def slow(seconds: float) -> str:
        """Takes its time: ``seconds``, or until the file $MCP_RELEASE exists."""
        ran("slow")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not os.path.exists(os.environ["MCP_RELEASE"]):
            await anyio.sleep(0.01)  # the server answers other calls meanwhile
        return "late"


    if version == "2":
        @server.tool()
        def extra() -> str:
            """Only in version 2."""
            return "extra"


    if __name__ == "__main__":
        if len(sys.argv) > 1:
            server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
        else:
            server.run("stdio")
    '''
)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return SqliteStore(tmp_path / "runs.db")


class Demo:
    """The test server's script, its execution counter, its version file and the file that
    ends its ``slow`` calls early once it exists; ``servers`` forks its processes."""

    def __init__(self, root: Path, servers: ForkServer) -> None:
        self.servers = servers
        self.script = root / "demo_server.py"
        self.script.write_text(SERVER)
        self.counter = root / "counter.txt"
        self.version = root / "version.txt"
        self.version.write_text("1")
        self.release = root / "release"

    def env(self) -> dict[str, str]:
        return {
            "MCP_COUNTER": str(self.counter),
            "MCP_VERSION": str(self.version),
            "MCP_RELEASE": str(self.release),
        }

    def command(self, *args: str) -> list[str]:
        """The command line that starts the server (``args`` after the script) as a fork."""
        return self.servers.command("script", self.script, *args)

    def stdio(self, *, start_delay: float = 0.0, forked: bool = True, **options: Any) -> McpServer:
        """The server as a stdio toolset; ``forked=False``: started as ``python script``."""
        env = {**self.env(), "MCP_START_DELAY": str(start_delay)} if start_delay else self.env()
        command, *args = self.command() if forked else [sys.executable, str(self.script)]
        return agency.mcp.stdio(command, args, env=env, **options)

    def ran(self) -> list[str]:
        return self.counter.read_text().splitlines() if self.counter.exists() else []


@pytest.fixture(scope="module")
def _servers() -> Iterator[ForkServer]:
    """The fork server of the module's MCP servers (its children end with it)."""
    with ForkServer(preload=SERVER_IMPORTS) as servers:
        yield servers


@pytest.fixture(scope="module")
def _demo_root(tmp_path_factory: pytest.TempPathFactory, _servers: ForkServer) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("mcp-demo")
    _mcp._HUB.close()  # before the fork server ends: the servers end as the sessions close


@pytest.fixture
def demo(_demo_root: Path, _servers: ForkServer) -> Demo:
    """The module's demo server, its stdio session shared by the module's tests as servers of
    one configuration share one in a process (each start of a server costs CPU, even forked).

    Each test starts with an empty counter, version 1 and the script as written; when the
    test before changed the script or the version, its server is closed, so it starts again
    and sees them. A test about starting or sessions closes the hub itself first."""
    script, version = _demo_root / "demo_server.py", _demo_root / "version.txt"
    if script.exists() and (script.read_text() != SERVER or version.read_text() != "1"):
        _mcp._HUB.close()
    demo = Demo(_demo_root, _servers)
    demo.counter.unlink(missing_ok=True)
    demo.release.unlink(missing_ok=True)
    return demo


def _offered(request: FakeRequest) -> list[str]:
    return sorted(t["function"]["name"] for t in request.tools)


def _tool_messages(request: FakeRequest) -> list[str]:
    return [str(m["content"]) for m in request.messages if m.get("role") == "tool"]


def local(a: int) -> int:
    """A function tool beside the server's."""
    return a * 10


async def test_a_stdio_servers_tools_are_offered_called_and_journaled(
    demo: Demo, store: Store
) -> None:
    server = demo.stdio(name="demo", forked=False)  # the one server started as `python script`

    @agency.entry
    async def adds() -> str:
        return str(await agency.llm("add", model="fake/mcp", tools=[server, local]))

    replies = [[FakeToolCall("add", {"a": 2, "b": 3}), FakeToolCall("local", {"a": 1})], "5"]
    with FakeModel("mcp", replies=replies) as fake:
        result = await agency.run(adds, run_id="a", store=store)
    assert (result.status, result.value) == ("completed", "5")
    assert _offered(fake.calls[0]) == ["add", "boom", "local", "pay", "slow"]
    offered = {t["function"]["name"]: t["function"] for t in fake.calls[0].tools}
    assert offered["add"]["description"] == "Add two numbers."
    assert offered["add"]["parameters"]["required"] == ["a", "b"]
    assert _tool_messages(fake.calls[1]) == ["5", "10"]
    names = [e.name for e in await agency.runs.journal("a", store=store)]
    assert "tool:demo.add" in names
    assert "tool:local" in names
    assert demo.ran() == ["add 2 3"]
    # run again: the finished run replays, no server call again
    with FakeModel("mcp", replies=[]):
        again = await agency.run(adds, run_id="a", store=store)
    assert again.value == "5"
    assert demo.ran() == ["add 2 3"]


async def test_a_servers_stderr_goes_to_logging(
    demo: Demo, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    _mcp._HUB.close()  # a session's stderr is logged under the name of the server it opened
    server = demo.stdio(name="demo")

    @agency.entry
    async def adds() -> str:
        return str(await agency.llm("add", model="fake/mcp", tools=[server]))

    caplog.set_level(logging.INFO, logger="agency_runtime.mcp")
    with FakeModel("mcp", replies=[[FakeToolCall("add", {"a": 1, "b": 1})], "2"]):
        await agency.run(adds, run_id="e", store=store)
    for _ in range(50):
        if any("adding 1 and 1" in r.getMessage() for r in caplog.records):
            break
        await anyio.sleep(0.05)
    assert any("[demo] adding 1 and 1" in r.getMessage() for r in caplog.records)


async def test_errors_and_timeouts_go_back_to_the_model(demo: Demo, store: Store) -> None:
    server = demo.stdio(name="demo", timeout=1.5)  # bounds each call, not the server's start

    @agency.entry
    async def fails() -> str:
        return str(await agency.llm("fail", model="fake/mcp", tools=[server]))

    replies = [
        [FakeToolCall("boom", {"why": "on purpose"})],
        [FakeToolCall("slow", {"seconds": 5})],
        [FakeToolCall("add", {"a": "x", "b": 1})],
        "gave up",
    ]
    with FakeModel("mcp", replies=replies) as fake:
        result = await agency.run(fails, run_id="f", store=store)
    assert (result.status, result.value) == ("completed", "gave up")
    (broke,) = _tool_messages(fake.calls[1])
    assert broke.startswith("Error: ")
    assert "it broke: on purpose" in broke
    late = _tool_messages(fake.calls[2])[-1]
    assert late.startswith("Error: ")
    assert "within 1.5 s" in late
    invalid = _tool_messages(fake.calls[3])[-1]
    assert invalid.startswith("Error: ")
    assert demo.ran()[:2] == ["boom", "slow"]
    assert "add x 1" not in demo.ran()


async def test_a_short_call_timeout_does_not_bound_a_slow_start(demo: Demo) -> None:
    # Starting takes over 0.6 s (the script's delay); each call may take 0.5 s.
    _mcp._HUB.close()  # the server starts in this test
    server = demo.stdio(name="demo", timeout=0.5, start_delay=0.6)
    assert "add" in [t["name"] for t in await server.list_tools()]
    assert await server.call("add", {"a": 2, "b": 2}) == "4"


async def test_a_server_that_never_starts_times_out_as_not_started(
    demo: Demo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_mcp, "OPEN_TIMEOUT", 0.5)
    _mcp._HUB.close()  # the server starts in this test
    server = demo.stdio(name="demo", timeout=0.2, start_delay=60.0)
    with pytest.raises(McpError, match=r"the server 'demo' did not start within 0\.5 s"):
        await server.list_tools()


async def test_an_unreachable_server_is_a_tool_error_not_a_crash(store: Store) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = agency.mcp.http(f"http://127.0.0.1:{port}/mcp", name="down", timeout=5)
    missing = agency.mcp.stdio("/nonexistent/mcp-server", name="missing")

    @agency.entry
    async def asks() -> str:
        return str(await agency.llm("go", model="fake/mcp", tools=[down, missing, local]))

    replies = [[FakeToolCall("search", {"q": "x"})], "no luck"]
    with FakeModel("mcp", replies=replies) as fake:
        result = await agency.run(asks, run_id="u", store=store)
    assert (result.status, result.value) == ("completed", "no luck")
    assert _offered(fake.calls[0]) == ["local"]
    (error,) = _tool_messages(fake.calls[1])
    assert error.startswith("Error: there is no tool named 'search'")
    assert "'down' could not list its tools" in error
    assert "'missing' could not list its tools" in error


async def test_a_server_gone_between_listing_and_call_is_a_tool_error(
    demo: Demo, store: Store
) -> None:
    server = demo.stdio(name="demo")

    @agency.entry
    async def asks() -> str:
        return str(await agency.llm("go", model="fake/mcp", tools=[server]))

    def kill_server(request: FakeRequest) -> Any:
        if len(request.messages) > 1:
            return "sorry"
        demo.script.write_text("raise SystemExit(3)\n")  # a restart fails from now on
        _mcp._HUB.close()
        return [FakeToolCall("add", {"a": 1, "b": 2})]

    with FakeModel("mcp", function=kill_server) as fake:
        result = await agency.run(asks, run_id="g", store=store)
    assert result.value == "sorry", result.error
    (error,) = _tool_messages(fake.calls[1])
    assert error.startswith("Error: add raised McpError: could not call 'add' on the server 'demo'")


async def test_an_approval_pauses_and_the_resumed_run_calls_the_server_once(
    demo: Demo, store: Store
) -> None:
    server = demo.stdio(name="demo", needs_approval={"pay"})

    @agency.entry
    async def pays() -> str:
        return str(await agency.llm("pay", model="fake/mcp", tools=[server]))

    replies = [
        [FakeToolCall("add", {"a": 1, "b": 2})],
        [FakeToolCall("pay", {"amount": 5, "to": "Ada"})],
        "paid",
    ]
    with FakeModel("mcp", replies=replies) as fake:
        paused = await agency.run(pays, run_id="p", store=store)
        assert paused.status == "paused"
        (asked,) = paused.interrupts
        assert asked.effect == "std::tool-approval"
        assert asked.data == {"tool": "pay", "arguments": {"amount": 5, "to": "Ada"}}
        assert demo.ran() == ["add 1 2"]
        _mcp._HUB.close()  # as in a new process: sessions open again
        done = await agency.respond_to_interrupts("p", {asked.interrupt_id: approve()}, store=store)
    assert (done.status, done.value) == ("completed", "paid")
    assert demo.ran() == ["add 1 2", "pay 5 Ada"]  # the server's own counter: each call once
    assert len(fake.calls) == 3


async def test_a_replay_offers_the_recorded_tools_whatever_the_server_lists_now(
    demo: Demo, store: Store
) -> None:
    server = demo.stdio(name="demo", needs_approval={"pay"})

    @agency.entry
    async def pays() -> str:
        return str(await agency.llm("pay", model="fake/mcp", tools=[server]))

    replies = [[FakeToolCall("pay", {"amount": 1, "to": "Bo"})], [FakeToolCall("extra", {})], "ok"]
    with FakeModel("mcp", replies=replies) as fake:
        paused = await agency.run(pays, run_id="v", store=store)
        (asked,) = paused.interrupts
        demo.version.write_text("2")  # the server now lists other tools
        _mcp._HUB.close()
        done = await agency.respond_to_interrupts("v", {asked.interrupt_id: approve()}, store=store)
        # the resumed round 0 was replayed with its recorded tools; round 1 lists again
        assert _offered(fake.calls[0]) == ["add", "boom", "pay", "slow"]
        assert _offered(fake.calls[1]) == ["boom", "extra", "pay", "slow"]
        assert (done.status, done.value) == ("completed", "ok")
        assert len(fake.calls) == 3
    journal = await agency.runs.journal("v", store=store)
    rounds = [json.loads(e.result) for e in journal if e.name == "agency.llm:round"]
    assert [sorted(t["name"] for t in r["tools"]) for r in rounds] == [
        ["add", "boom", "pay", "slow"],
        ["boom", "extra", "pay", "slow"],
        ["boom", "extra", "pay", "slow"],
    ]
    assert demo.ran() == ["pay 1 Bo"]


async def test_names_that_collide_are_prefixed_with_the_servers_name(
    demo: Demo, store: Store
) -> None:
    one, two = demo.stdio(name="one"), demo.stdio(name="two")

    def add(a: int, b: int) -> int:
        """A local add."""
        return a - b

    @agency.entry
    async def asks() -> str:
        return str(await agency.llm("go", model="fake/mcp", tools=[one, two, add]))

    replies = [
        [FakeToolCall("two_pay", {"amount": 2, "to": "Cy"}), FakeToolCall("add", {"a": 1, "b": 1})],
        "ok",
    ]
    with FakeModel("mcp", replies=replies) as fake:
        await agency.run(asks, run_id="c", store=store)
    assert _offered(fake.calls[0]) == sorted(
        ["add", *(f"{s}_{t}" for s in ("one", "two") for t in ("add", "boom", "pay", "slow"))]
    )
    assert _tool_messages(fake.calls[1]) == ["paid 2 to Cy", "0"]
    names = [e.name for e in await agency.runs.journal("c", store=store)]
    assert "tool:two.pay" in names
    assert "tool:add" in names


async def test_two_servers_of_one_name_are_refused(demo: Demo) -> None:
    @agency.entry
    async def asks() -> str:
        return str(await agency.llm("go", model="fake/mcp", tools=[demo.stdio(), demo.stdio()]))

    result = await agency.run(asks)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "InvalidArgumentError"
    assert "two MCP servers are named 'demo_server'" in result.error.message


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def http_server(demo: Demo) -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        demo.command(str(port)),
        env={**os.environ, **demo.env()},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_a_streamable_http_server_works_the_same(
    http_server: str, demo: Demo, store: Store
) -> None:
    server = agency.mcp.http(http_server, headers={"X-Test": "1"}, name="web")

    @agency.entry
    async def adds() -> str:
        return str(await agency.llm("add", model="fake/mcp", tools=[server]))

    replies = [[FakeToolCall("add", {"a": 4, "b": 5}), FakeToolCall("boom", {"why": "x"})], "9"]
    with FakeModel("mcp", replies=replies) as fake:
        result = await agency.run(adds, run_id="h", store=store)
    assert result.value == "9"
    assert _offered(fake.calls[0]) == ["add", "boom", "pay", "slow"]
    nine, broke = _tool_messages(fake.calls[1])
    assert nine == "9"
    assert "it broke: x" in broke
    names = [e.name for e in await agency.runs.journal("h", store=store)]
    assert "tool:web.add" in names
    assert "tool:web.boom" in names
    assert demo.ran() == ["add 4 5", "boom"]


async def test_sessions_are_shared_per_configuration(demo: Demo, store: Store) -> None:
    _mcp._HUB.close()

    @agency.entry
    async def adds() -> str:
        # a fresh McpServer each call, one configuration: one session
        return str(await agency.llm("add", model="fake/mcp", tools=[demo.stdio(name="demo")]))

    replies = [[FakeToolCall("add", {"a": 1, "b": 1})], "2"] * 2
    with FakeModel("mcp", replies=replies):
        await agency.run(adds, run_id="s1", store=store)
        await agency.run(adds, run_id="s2", store=store)
    assert len(_mcp._HUB._sessions) == 1


async def test_an_mcp_call_is_an_execute_tool_span_naming_its_server(
    demo: Demo, store: Store
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agency_runtime import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server = demo.stdio(name="demo")

    @agency.entry
    async def adds() -> str:
        return str(await agency.llm("add", model="fake/mcp", tools=[server]))

    otel.instrument(provider)
    try:
        with FakeModel("mcp", replies=[[FakeToolCall("add", {"a": 1, "b": 2})], "3"]):
            result = await agency.run(adds, run_id="spans", store=store)
    finally:
        otel.uninstrument()
        provider.shutdown()
    assert result.value == "3"
    [span] = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
    attributes = dict(span.attributes or {})
    assert attributes["agency.mcp.server"] == "demo"
    assert attributes["gen_ai.tool.type"] == "extension"
    assert span.name == "execute_tool add"


KILLED_DURING_A_CALL = r"""
import json, os
from agency_runtime import agency
from agency_runtime.testing import FakeModel, FakeToolCall

command, *args = json.loads(os.environ["SERVER_COMMAND"])  # a fork of the test's fork server
server = agency.mcp.stdio(command, args, name="demo", env={
    "MCP_COUNTER": os.environ["MCP_COUNTER"], "MCP_VERSION": os.environ["MCP_VERSION"],
    "MCP_RELEASE": os.environ["MCP_RELEASE"],
})


@agency.entry
async def pays() -> str:
    return str(await agency.llm("pay, then wait", model="fake/killed", tools=[server]))


if __name__ == "__main__":
    # The resumed process replays the two recorded rounds: its model is asked once more.
    replies = ["done"] if os.environ.get("RESUMED") else [
        [FakeToolCall("pay", {"amount": 5, "to": "ada"})],
        [FakeToolCall("slow", {"seconds": 120.0})],  # until the test releases it, after the kill
        "done",
    ]
    with FakeModel("killed", replies=replies):
        result = agency.run_sync(pays, run_id="killed", store="sqlite:///" + os.environ["DB"])
    print(result.status, result.value)
"""


def test_a_run_killed_during_an_mcp_call_never_repeats_a_finished_one(
    demo: Demo, tmp_path: Path, fork_server: ForkServer
) -> None:
    """SIGKILL while the second MCP call (``slow``) runs: the resumed run calls ``slow``
    again (it was in flight) but never ``pay``, whose call was committed. ``slow`` lasts until
    the test releases it, after the kill: the kill lands inside it, and the resumed call of it
    ends at once."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED_DURING_A_CALL)
    env = {**os.environ, **demo.env(), "DB": str(tmp_path / "r.db")}
    env["SERVER_COMMAND"] = json.dumps(demo.command())
    first = fork_server.start("script", script, env=env, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while demo.ran() != ["pay 5 ada", "slow"]:  # the kill lands inside the slow call
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, f"no progress: {demo.ran()}"
        time.sleep(0.01)  # a short, bounded poll of another process's file
    first.kill()
    assert first.wait(timeout=60) == -signal.SIGKILL
    demo.release.touch()
    resumed = {**env, "RESUMED": "1"}
    done = fork_server.run("script", script, env=resumed, cwd=tmp_path, timeout=90)
    assert done.stdout.split() == ["completed", "done"], done.stderr
    assert demo.ran() == ["pay 5 ada", "slow", "slow"]


async def test_llm_stream_takes_an_mcp_toolset_too(demo: Demo, store: Store) -> None:
    server = demo.stdio(name="demo")

    @agency.entry
    async def streams() -> str:
        pieces: list[str] = []
        async for delta in agency.llm_stream("add", model="fake/mcp", tools=[server]):
            pieces.append(delta)
        return "".join(pieces)

    replies = [[FakeToolCall("add", {"a": 4, "b": 5})], "nine"]
    with FakeModel("mcp", replies=replies):
        result = await agency.run(streams, run_id="stream", store=store)
    assert (result.status, result.value) == ("completed", "nine")
    assert demo.ran() == ["add 4 5"]
