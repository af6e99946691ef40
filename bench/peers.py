"""agency_runtime beside its peers, on the same four workloads, in one run (issue 17).

    python3 -m pip install -e '.[bench]' && python3 bench/peers.py [--quick] [--repeat N]

The peers are LangGraph with its ``SqliteSaver`` checkpointer and DBOS Transact with a
SQLite system database; agency_runtime runs on a ``SqliteStore``. Every system keeps its own
default SQLite settings (see the footnotes printed under the table). Each system runs in
subprocesses of this script, one per workload and repetition, and the repetitions go
round-robin over the systems (the order rotating each round), so machine noise hits all
alike. The floor, a raw ``sqlite3`` INSERT + COMMIT of a ~100 B row in WAL mode with
``synchronous=NORMAL``, is measured in this process in every round.

1. step: the per-step cost of one workflow of 2,000 durable steps, each returning a 100 B
   string, wall time of the whole call divided by 2,000 (start and finish included), median
   of the repetitions, as a ratio to the median raw commit.
   agency_runtime: ``agency.run`` of one ``agency.with_resumable_scope`` doing
   ``await s.step(...)`` 2,000 times. LangGraph: ``graph.invoke`` of a one-node loop (the
   node sends itself back until 2,000 super-steps are done), with ``durability="sync"`` so
   each super-step's checkpoint is written before the next starts, as the other two do;
   so a "step" is one super-step: a node run, its writes and a checkpoint.
   DBOS: one ``@DBOS.workflow()`` calling a ``@DBOS.step()`` 2,000 times. A second row
   runs the peers again with their connections set to WAL and ``synchronous=NORMAL``, the
   raw commit's and agency_runtime's settings: a diagnostic of what their own defaults cost.
2. resume after 1,000 steps: a run does 1,000 such steps, then waits for a human answer
   (``agency.interrupt``; LangGraph ``interrupt()`` in a node after the loop; DBOS
   ``DBOS.recv`` in the workflow). T is the time until it waits. Then, in a fresh process
   opening the same database, the answer is given and the run finishes; that is timed (the
   interpreter start and the imports are not, opening the database is): agency
   ``agency.respond_to_interrupts``; LangGraph ``graph.invoke(Command(resume=True))`` on a
   new ``SqliteSaver`` (the graph is compiled on it before the clock starts; the saver sets
   its database up on first use, inside the timing); DBOS has no pause
   that ends a run's process, so the process that ran the 1,000 steps is killed while the
   workflow waits in ``recv``, and the fresh process times ``DBOS.launch()`` (which
   recovers the pending workflow, replaying its steps from their recorded outputs),
   ``DBOS.send`` of the answer and ``get_result`` (polling every 10 ms). Reported as a
   fraction of T and in ms. agency_runtime and LangGraph are also answered in the process
   that paused them.
3. storage: one run of 200 LLM-like turns, a 1 KB prompt and a 1 KB reply each (no LLM:
   the text is made up), as each system keeps conversation data. agency_runtime: a step per
   turn that puts both messages on the run's thread (``agency.thread.user`` /
   ``.assistant``). LangGraph: a node per turn appending both, as plain dicts, to a
   ``messages`` list channel (``operator.add``). DBOS: a step per turn returning both as its
   result. The bytes on disk (database plus ``-wal`` and ``-shm``) once the store or
   process has closed, over the 400 KiB of text.
4. import: ``import <system>`` in a fresh interpreter over a bare one (``python -c pass``),
   best of 11 (3 with --quick). LangGraph's is what the bench uses:
   ``langgraph.graph`` and ``langgraph.checkpoint.sqlite``.

Nothing phones home: LangSmith tracing is switched off in every subprocess's environment,
DBOS runs without a Conductor key (its only outbound connection) and without OTLP, and
litellm (agency_runtime imports it lazily, never here) is told to use its local cost map.
``--help`` works without the extras; a run without them says which is missing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import operator
import os
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict

STEPS = 2000
PAUSE_AFTER = 1000
TURNS = 200
TEXT_BYTES = 1024
RESULT_BYTES = 100
WARM_UP_STEPS = 50
REPEAT = 5
QUICK_REPEAT = 1
IMPORT_BEST_OF = 11
QUICK_IMPORT_BEST_OF = 3
WORKER_TIMEOUT = 600.0
ANSWER_TOPIC = "answer"

SYSTEMS = ("agency", "langgraph", "dbos")
LABELS = {
    "agency": "agency_runtime (SqliteStore)",
    "langgraph": "LangGraph (SqliteSaver)",
    "dbos": "DBOS (SQLite)",
}
# what each system needs importable, and the pip extra that brings it
REQUIRES = {
    "agency": ("agency_runtime",),
    "langgraph": ("langgraph.graph", "langgraph.checkpoint.sqlite"),
    "dbos": ("dbos",),
}
IMPORTS = {
    "agency": "from agency_runtime import agency",
    "langgraph": "import langgraph.graph, langgraph.checkpoint.sqlite",
    "dbos": "import dbos",
}
QUIET_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_MODE": "PRODUCTION",
    "LANGSMITH_TRACING": "false",
    "LANGSMITH_TRACING_V2": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGCHAIN_TRACING": "false",
}
DROPPED_ENV = ("DBOS__CONDUCTOR_KEY", "DBOS__CONDUCTOR_URL", "LANGSMITH_API_KEY")


def expect(ok: bool, what: object) -> None:
    """Stop the benchmark when a measured run did not do what it should (asserts may be off)."""
    if not ok:
        raise RuntimeError(f"unexpected outcome: {what!r}")


def result_text(i: int) -> str:
    """The ~100 B result of step ``i``."""
    return f"step {i:06d} " + "r" * (RESULT_BYTES - 12)


def turn_text(i: int, who: str) -> str:
    """A 1 KB prompt or reply of turn ``i``, different in every turn."""
    text = f"turn {i:04d} {who}: " + f"the {who} says something about item {i} once more. " * 30
    return text[:TEXT_BYTES]


def text_bytes() -> int:
    return sum(len(turn_text(i, w).encode()) for i in range(TURNS) for w in ("user", "model"))


def files_bytes(db: Path) -> int:
    """The database file plus its -wal and -shm, where they exist."""
    files = (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"))
    return sum(p.stat().st_size for p in files if p.exists())


def quiet_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(QUIET_ENV)
    return env


# -- the floor: a raw sqlite3 INSERT + COMMIT ------------------------------------------------


def raw_commits(db: Path, n: int, journal: str = "WAL", synchronous: str = "NORMAL") -> float:
    """Seconds per INSERT in autocommit (so one commit each) of a ~100 B result row."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(f"PRAGMA journal_mode = {journal}")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute(
            "CREATE TABLE steps (run_id TEXT NOT NULL, seq INTEGER NOT NULL, "
            "result TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (run_id, seq))"
        )
        started = time.perf_counter()
        for i in range(n):
            conn.execute(
                "INSERT INTO steps VALUES (?, ?, ?, ?)", ("raw-run", i, result_text(i), time.time())
            )
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    return elapsed / n


# -- agency_runtime --------------------------------------------------------------------------


def agency_flows() -> dict[str, Any]:
    from agency_runtime import agency

    async def many_steps(n: int) -> int:
        async def body(s: Any) -> int:
            done = 0
            for i in range(n):
                done += len(await s.step(lambda i=i: result_text(i), name="work")) > 0
            return done

        return await agency.with_resumable_scope("steps", body)

    async def steps_then_interrupt(n: int) -> bool:
        async def body(s: Any) -> bool:
            for i in range(n):
                await s.step(lambda i=i: result_text(i), name="work")
            answer = await agency.interrupt("continue", "go on?")
            return bool(answer.approved)

        return await agency.with_resumable_scope("steps", body)

    def turn(i: int) -> None:
        agency.thread.user(turn_text(i, "user"))
        agency.thread.assistant(turn_text(i, "model"))

    async def conversation(n: int) -> int:
        async def body(s: Any) -> int:
            for i in range(n):
                await s.step(lambda i=i: turn(i), name="turn")
            return n

        return await agency.with_resumable_scope("chat", body)

    # named entries, so the fresh process of workload 2 finds the paused run's entry
    agency.register_entry(steps_then_interrupt, name="peers.steps_then_interrupt")
    return {
        "many_steps": many_steps,
        "steps_then_interrupt": steps_then_interrupt,
        "conversation": conversation,
    }


def agency_steps(tmp: Path) -> dict[str, Any]:
    import anyio

    from agency_runtime import SqliteStore, agency

    flows = agency_flows()

    async def main() -> float:
        store = SqliteStore(tmp / "agency-steps.db")
        try:
            warm = await agency.run(flows["many_steps"], WARM_UP_STEPS, run_id="w", store=store)
            expect(warm.status == "completed", warm)
            started = time.perf_counter()
            result = await agency.run(flows["many_steps"], STEPS, run_id="m", store=store)
            elapsed = time.perf_counter() - started
            expect(result.status == "completed" and result.value == STEPS, result)
        finally:
            store.close()
        return elapsed / STEPS

    return {"step_s": anyio.run(main)}


def agency_storage(tmp: Path) -> dict[str, Any]:
    import anyio

    from agency_runtime import SqliteStore, agency

    flows = agency_flows()
    db = tmp / "agency-chat.db"

    async def main() -> None:
        store = SqliteStore(db)
        try:
            result = await agency.run(flows["conversation"], TURNS, run_id="chat", store=store)
            expect(result.status == "completed", result)
        finally:
            store.close()

    anyio.run(main)
    return {"bytes": files_bytes(db)}


def agency_pause(tmp: Path) -> dict[str, Any]:
    import anyio

    from agency_runtime import SqliteStore, agency, approve

    flows = agency_flows()
    db = tmp / "agency-resume.db"

    async def paused(store: Any, run_id: str) -> tuple[float, Any]:
        started = time.perf_counter()
        result = await agency.run(
            flows["steps_then_interrupt"], PAUSE_AFTER, run_id=run_id, store=store
        )
        elapsed = time.perf_counter() - started
        expect(result.status == "paused" and len(result.interrupts) == 1, result)
        return elapsed, result

    async def main() -> dict[str, Any]:
        store = SqliteStore(db)
        try:
            warm = await agency.run(flows["many_steps"], WARM_UP_STEPS, run_id="w", store=store)
            expect(warm.status == "completed", warm)
            t_here, here = await paused(store, "here")
            started = time.perf_counter()
            answered = await agency.respond_to_interrupts(here, [approve()], store=store)
            here_s = time.perf_counter() - started
            expect(answered.status == "completed" and answered.value is True, answered)
            t_fresh, fresh = await paused(store, "fresh")
        finally:
            store.close()
        interrupts = [i.model_dump(mode="json") for i in fresh.interrupts]
        return {
            "t_s": [t_here, t_fresh],
            "here_s": here_s,
            "here_t_s": t_here,
            "handoff": {"db": str(db), "interrupts": interrupts},
        }

    return anyio.run(main)


def agency_answer(tmp: Path, handoff: dict[str, Any]) -> dict[str, Any]:
    import anyio

    from agency_runtime import agency, approve

    agency_flows()

    async def main() -> float:
        started = time.perf_counter()
        result = await agency.respond_to_interrupts(
            handoff["interrupts"], [approve()], store=f"sqlite:///{handoff['db']}"
        )
        elapsed = time.perf_counter() - started
        expect(result.status == "completed" and result.value is True, result)
        return elapsed

    return {"answer_s": anyio.run(main)}


# -- LangGraph -------------------------------------------------------------------------------


class LoopState(TypedDict):
    i: int
    n: int
    result: str
    answer: bool


class ChatState(TypedDict):
    i: int
    messages: Annotated[list[dict[str, str]], operator.add]


def langgraph_saver(db: Path, synchronous: str | None = None) -> Any:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(db, check_same_thread=False)
    if synchronous is not None:  # SqliteSaver switches the file to WAL on first use
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    return SqliteSaver(conn)


def langgraph_loop(saver: Any, *, then_ask: bool) -> Any:
    """A one-node loop of ``n`` super-steps; with ``then_ask``, a node calling interrupt()."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def work(s: Any) -> dict[str, Any]:
        return {"i": s["i"] + 1, "result": result_text(s["i"])}

    def ask(s: Any) -> dict[str, Any]:
        return {"answer": bool(interrupt("go on?"))}

    after = "ask" if then_ask else END

    def more(s: Any) -> str:
        return "work" if s["i"] < s["n"] else after

    graph: Any = StateGraph(LoopState)
    graph.add_node("work", work)
    graph.add_edge(START, "work")
    graph.add_conditional_edges("work", more, ["work", after])
    if then_ask:
        graph.add_node("ask", ask)
        graph.add_edge("ask", END)
    return graph.compile(checkpointer=saver)


def langgraph_config(thread: str, n: int) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": n + 10}


def langgraph_start(n: int) -> dict[str, Any]:
    return {"i": 0, "n": n, "result": "", "answer": False}


def langgraph_steps(tmp: Path, synchronous: str | None = None) -> dict[str, Any]:
    saver = langgraph_saver(tmp / f"langgraph-steps-{synchronous}.db", synchronous)
    try:
        graph = langgraph_loop(saver, then_ask=False)
        graph.invoke(
            langgraph_start(WARM_UP_STEPS), langgraph_config("w", WARM_UP_STEPS), durability="sync"
        )
        started = time.perf_counter()
        out = graph.invoke(langgraph_start(STEPS), langgraph_config("m", STEPS), durability="sync")
        elapsed = time.perf_counter() - started
        expect(out["i"] == STEPS, out)
    finally:
        saver.conn.close()
    return {"step_s": elapsed / STEPS}


def langgraph_storage(tmp: Path) -> dict[str, Any]:
    from langgraph.graph import END, START, StateGraph

    db = tmp / "langgraph-chat.db"

    def turn(s: Any) -> dict[str, Any]:
        i = s["i"]
        user = {"role": "user", "content": turn_text(i, "user")}
        model = {"role": "assistant", "content": turn_text(i, "model")}
        return {"i": i + 1, "messages": [user, model]}

    def more(s: Any) -> str:
        return "turn" if s["i"] < TURNS else END

    saver = langgraph_saver(db)
    try:
        graph: Any = StateGraph(ChatState)
        graph.add_node("turn", turn)
        graph.add_edge(START, "turn")
        graph.add_conditional_edges("turn", more, ["turn", END])
        app = graph.compile(checkpointer=saver)
        out = app.invoke(
            {"i": 0, "messages": []}, langgraph_config("chat", TURNS), durability="sync"
        )
        expect(len(out["messages"]) == 2 * TURNS, len(out["messages"]))
    finally:
        saver.conn.close()
    return {"bytes": files_bytes(db)}


def langgraph_pause(tmp: Path) -> dict[str, Any]:
    from langgraph.types import Command

    db = tmp / "langgraph-resume.db"
    saver = langgraph_saver(db)
    try:
        graph = langgraph_loop(saver, then_ask=True)
        graph.invoke(
            langgraph_start(WARM_UP_STEPS), langgraph_config("w", WARM_UP_STEPS), durability="sync"
        )

        def paused(thread: str) -> float:
            started = time.perf_counter()
            out = graph.invoke(
                langgraph_start(PAUSE_AFTER),
                langgraph_config(thread, PAUSE_AFTER),
                durability="sync",
            )
            elapsed = time.perf_counter() - started
            expect(out["i"] == PAUSE_AFTER and "__interrupt__" in out, list(out))
            return elapsed

        t_here = paused("here")
        started = time.perf_counter()
        out = graph.invoke(
            Command(resume=True), langgraph_config("here", PAUSE_AFTER), durability="sync"
        )
        here_s = time.perf_counter() - started
        expect(out["answer"] is True, out)
        t_fresh = paused("fresh")
    finally:
        saver.conn.close()
    return {
        "t_s": [t_here, t_fresh],
        "here_s": here_s,
        "here_t_s": t_here,
        "handoff": {"db": str(db), "thread": "fresh"},
    }


def langgraph_answer(tmp: Path, handoff: dict[str, Any]) -> dict[str, Any]:
    from langgraph.types import Command

    # compiled before the clock starts; the saver sets its database up on first use
    saver = langgraph_saver(Path(handoff["db"]))
    graph = langgraph_loop(saver, then_ask=True)
    try:
        started = time.perf_counter()
        out = graph.invoke(
            Command(resume=True),
            langgraph_config(handoff["thread"], PAUSE_AFTER),
            durability="sync",
        )
        elapsed = time.perf_counter() - started
        expect(out["answer"] is True and out["i"] == PAUSE_AFTER, out)
    finally:
        saver.conn.close()
    return {"answer_s": elapsed}


# -- DBOS ------------------------------------------------------------------------------------

DBOS_MARKS: dict[str, float] = {}
DBOS_PAUSED = threading.Event()


def dbos_flows() -> dict[str, Any]:
    """The workflows and steps, registered under fixed names (the same in every process)."""
    from dbos import DBOS

    @DBOS.step(name="peers.work")
    def work(i: int) -> str:
        return result_text(i)

    @DBOS.workflow(name="peers.many_steps")
    def many_steps(n: int) -> int:
        return sum(len(work(i)) > 0 for i in range(n))

    @DBOS.workflow(name="peers.steps_then_wait")
    def steps_then_wait(n: int) -> bool:
        DBOS_MARKS["entered"] = time.perf_counter()
        for i in range(n):
            work(i)
        DBOS_MARKS["replayed"] = time.perf_counter()
        DBOS_PAUSED.set()
        return bool(DBOS.recv(ANSWER_TOPIC, timeout_seconds=WORKER_TIMEOUT))

    @DBOS.step(name="peers.turn")
    def turn(i: int) -> dict[str, str]:
        return {"user": turn_text(i, "user"), "assistant": turn_text(i, "model")}

    @DBOS.workflow(name="peers.conversation")
    def conversation(n: int) -> int:
        return len([turn(i) for i in range(n)])

    return {
        "many_steps": many_steps,
        "steps_then_wait": steps_then_wait,
        "conversation": conversation,
    }


class WalNormalConnection(sqlite3.Connection):
    """A sqlite3 connection in WAL mode with synchronous=NORMAL, agency_runtime's settings."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.execute("PRAGMA journal_mode = WAL")
        self.execute("PRAGMA synchronous = NORMAL")


def dbos_open(db: Path, wal_normal: bool = False) -> Any:
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {
        "name": "peers-bench",
        "system_database_url": f"sqlite:///{db}",
        "log_level": "WARNING",
        "enable_otlp": False,
    }
    if wal_normal:  # the engine's sqlite3.connect makes its connections with this class
        config["db_engine_kwargs"] = {"connect_args": {"factory": WalNormalConnection}}
    return DBOS(config=config)


def dbos_steps(tmp: Path, wal_normal: bool = False) -> dict[str, Any]:
    from dbos import DBOS, SetWorkflowID

    flows = dbos_flows()
    db = tmp / f"dbos-steps-{'wal' if wal_normal else 'default'}.sqlite"
    dbos_open(db, wal_normal)
    DBOS.launch()
    try:
        with SetWorkflowID("w"):
            flows["many_steps"](WARM_UP_STEPS)
        started = time.perf_counter()
        with SetWorkflowID("m"):
            done = flows["many_steps"](STEPS)
        elapsed = time.perf_counter() - started
        expect(done == STEPS, done)
    finally:
        DBOS.destroy()
    if wal_normal:
        conn = sqlite3.connect(db)
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        conn.close()
        expect(mode == "wal", mode)
    return {"step_s": elapsed / STEPS}


def dbos_storage(tmp: Path) -> dict[str, Any]:
    from dbos import DBOS, SetWorkflowID

    flows = dbos_flows()
    db = tmp / "dbos-chat.sqlite"
    dbos_open(db)
    DBOS.launch()
    try:
        with SetWorkflowID("chat"):
            done = flows["conversation"](TURNS)
        expect(done == TURNS, done)
    finally:
        DBOS.destroy()
    return {"bytes": files_bytes(db)}


def dbos_pause(tmp: Path) -> dict[str, Any]:
    """Run to the wait, then die there (os._exit): DBOS's pause is a live, blocked workflow."""
    from dbos import DBOS, SetWorkflowID

    flows = dbos_flows()
    db = tmp / "dbos-resume.sqlite"
    dbos_open(db)
    DBOS.launch()
    with SetWorkflowID("w"):
        flows["many_steps"](WARM_UP_STEPS)
    started = time.perf_counter()
    with SetWorkflowID("fresh"):
        DBOS.start_workflow(flows["steps_then_wait"], PAUSE_AFTER)
    expect(DBOS_PAUSED.wait(WORKER_TIMEOUT), "the workflow never reached recv")
    elapsed = time.perf_counter() - started
    time.sleep(0.5)  # let recv record its wait
    report = {"t_s": [elapsed], "handoff": {"db": str(db), "workflow_id": "fresh"}}
    print(json.dumps(report), flush=True)
    os._exit(0)  # the "crash": no DBOS.destroy(), the workflow stays PENDING


def dbos_answer(tmp: Path, handoff: dict[str, Any]) -> dict[str, Any]:
    from dbos import DBOS, WorkflowHandle

    dbos_flows()
    dbos_open(Path(handoff["db"]))
    started = time.perf_counter()
    DBOS.launch()  # recovers the pending workflow (through DBOS's internal queue)
    try:
        DBOS.send(handoff["workflow_id"], True, topic=ANSWER_TOPIC)
        handle: WorkflowHandle[bool] = DBOS.retrieve_workflow(handoff["workflow_id"])
        value = handle.get_result(polling_interval_sec=0.01)  # the caller's poll: not 1 s
        elapsed = time.perf_counter() - started
        expect(value is True, value)
    finally:
        DBOS.destroy()
    return {
        "answer_s": elapsed,
        "until_entered_s": DBOS_MARKS["entered"] - started,
        "replay_s": DBOS_MARKS["replayed"] - DBOS_MARKS["entered"],
    }


WORKERS: dict[str, dict[str, Callable[..., dict[str, Any]]]] = {
    "agency": {
        "steps": agency_steps,
        "storage": agency_storage,
        "pause": agency_pause,
        "answer": agency_answer,
    },
    "langgraph": {
        "steps": langgraph_steps,
        "steps-wal-normal": lambda tmp: langgraph_steps(tmp, "NORMAL"),
        "storage": langgraph_storage,
        "pause": langgraph_pause,
        "answer": langgraph_answer,
    },
    "dbos": {
        "steps": dbos_steps,
        "steps-wal-normal": lambda tmp: dbos_steps(tmp, wal_normal=True),
        "storage": dbos_storage,
        "pause": dbos_pause,
        "answer": dbos_answer,
    },
}


def worker(system: str, task: str, tmp: Path, handoff: str | None) -> None:
    args: list[Any] = [tmp] if handoff is None else [tmp, json.loads(handoff)]
    report = WORKERS[system][task](*args)
    print(json.dumps(report), flush=True)


def run_worker(system: str, task: str, tmp: Path, handoff: Any = None) -> dict[str, Any]:
    """Run one workload of one system in a fresh interpreter; its last stdout line is JSON."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", system, task, str(tmp)]
    if handoff is not None:
        command.append(json.dumps(handoff))
    done = subprocess.run(
        command,
        env=quiet_env(),
        cwd=tmp,
        capture_output=True,
        text=True,
        check=False,
        timeout=WORKER_TIMEOUT,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{system} {task} failed ({done.returncode}):\n{done.stderr}")
    report: dict[str, Any] = json.loads(lines[-1])
    return report


# -- import ----------------------------------------------------------------------------------


def import_seconds(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=quiet_env(), check=True)
    return time.perf_counter() - started


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Figures:
    raw: list[float] = field(default_factory=list)
    raw_full: list[float] = field(default_factory=list)
    raw_rollback: list[float] = field(default_factory=list)
    step: dict[str, list[float]] = field(default_factory=dict)
    step_wal_normal: dict[str, list[float]] = field(default_factory=dict)
    paused: dict[str, list[float]] = field(default_factory=dict)
    fresh: dict[str, list[float]] = field(default_factory=dict)
    fresh_ratio: dict[str, list[float]] = field(default_factory=dict)
    here: dict[str, list[float]] = field(default_factory=dict)
    here_ratio: dict[str, list[float]] = field(default_factory=dict)
    dbos_replay: list[float] = field(default_factory=list)
    dbos_until_entered: list[float] = field(default_factory=list)
    dbos_rest: list[float] = field(default_factory=list)
    storage: dict[str, int] = field(default_factory=dict)
    imports: dict[str, float] = field(default_factory=dict)


def rotated(items: Sequence[str], k: int) -> list[str]:
    k %= len(items)
    return [*items[k:], *items[:k]]


def measure(
    systems: Sequence[str], repeat: int, best_of: int, log: Callable[[str], None]
) -> Figures:
    fig = Figures()
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp_name:
        tmp = Path(tmp_name)
        for k in range(repeat):
            log(f"round {k + 1}/{repeat}")
            fig.raw.append(raw_commits(tmp / f"raw-{k}.db", STEPS))
            fig.raw_full.append(raw_commits(tmp / f"raw-full-{k}.db", STEPS, "WAL", "FULL"))
            fig.raw_rollback.append(
                raw_commits(tmp / f"raw-rollback-{k}.db", STEPS // 4, "DELETE", "FULL")
            )
            for system in rotated(systems, k):
                where = tmp / f"{system}-{k}"
                where.mkdir()
                log(f"  {system}: steps")
                fig.step.setdefault(system, []).append(run_worker(system, "steps", where)["step_s"])
                if "steps-wal-normal" in WORKERS[system]:
                    log(f"  {system}: steps on WAL/NORMAL")
                    again = run_worker(system, "steps-wal-normal", where)["step_s"]
                    fig.step_wal_normal.setdefault(system, []).append(again)
                log(f"  {system}: resume")
                paused = run_worker(system, "pause", where)
                answered = run_worker(system, "answer", where, paused["handoff"])
                t_fresh = paused["t_s"][-1]
                fig.paused.setdefault(system, []).extend(paused["t_s"])
                fig.fresh.setdefault(system, []).append(answered["answer_s"])
                fig.fresh_ratio.setdefault(system, []).append(answered["answer_s"] / t_fresh)
                if "here_s" in paused:
                    fig.here.setdefault(system, []).append(paused["here_s"])
                    ratio = paused["here_s"] / paused["here_t_s"]
                    fig.here_ratio.setdefault(system, []).append(ratio)
                if "replay_s" in answered:
                    fig.dbos_replay.append(answered["replay_s"])
                    fig.dbos_until_entered.append(answered["until_entered_s"])
                    fig.dbos_rest.append(
                        answered["answer_s"] - answered["until_entered_s"] - answered["replay_s"]
                    )
                if k == 0:
                    log(f"  {system}: storage")
                    fig.storage[system] = run_worker(system, "storage", where)["bytes"]
        log(f"import, best of {best_of}")
        codes = {"bare": "pass", **{s: IMPORTS[s] for s in systems}}
        for code in codes.values():  # untimed: byte-compile and warm the file cache
            import_seconds(code)
        times: dict[str, list[float]] = {name: [] for name in codes}
        for k in range(best_of):
            for name in rotated(list(codes), k):
                times[name].append(import_seconds(codes[name]))
        bare = min(times.pop("bare"))
        fig.imports = {name: min(t) - bare for name, t in times.items()}
        fig.imports["bare"] = bare
    return fig


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"


def table(fig: Figures, systems: Sequence[str], repeat: int, best_of: int) -> list[str]:
    """The markdown table, then its footnotes, numbered in reading order."""
    med = statistics.median
    raw = med(fig.raw)
    notes: list[str] = []

    def note(text: str) -> str:
        if text not in notes:
            notes.append(text)
        return f"[{notes.index(text) + 1}]"

    def step_label() -> str:
        return f"1. durable step, {STEPS:,} steps of {RESULT_BYTES} B (x raw commit) " + note(
            "Each system runs with its own default SQLite settings: agency_runtime WAL with "
            "synchronous=NORMAL (as the raw commit); LangGraph's SqliteSaver WAL with the "
            "sqlite3 default synchronous=FULL (an fsync per commit); DBOS a rollback journal "
            "with synchronous=FULL. Raw commits in this run: WAL/NORMAL "
            f"{us(raw)}, WAL/FULL {us(med(fig.raw_full))}, rollback journal/FULL "
            f"{us(med(fig.raw_rollback))}."
        )

    def step_cell(s: str) -> str:
        cell = f"{med(fig.step[s]) / raw:.1f}x ({us(med(fig.step[s]))})"
        if s == "langgraph":
            cell += " " + note(
                "LangGraph: a step is a super-step of a one-node loop run with "
                '`durability="sync"` (its default, "async", writes the checkpoint while the '
                "next step runs); each writes the node's writes and a checkpoint, two commits."
            )
        return cell

    def wal_normal_cell(s: str) -> str:
        if s not in fig.step_wal_normal:
            return "= above"
        step = med(fig.step_wal_normal[s])
        return f"{step / raw:.1f}x ({us(step)})"

    def fresh_cell(s: str) -> str:
        cell = f"{med(fig.fresh_ratio[s]):.1%} ({ms(med(fig.fresh[s]))})"
        if s == "langgraph":
            cell += " " + note(
                "LangGraph restores the latest checkpoint and re-runs only the node that "
                "called `interrupt()`: none of the 1,000 steps is replayed (agency_runtime "
                "and DBOS replay their journal, returning recorded results)."
            )
        if s == "dbos" and fig.dbos_replay:
            cell += " " + note(
                "DBOS: the process that ran the steps was killed while the workflow waited "
                "in `recv`; in the fresh process `DBOS.launch()` re-enqueues the pending "
                "workflow on DBOS's internal queue, `DBOS.send` delivers the answer, a queue "
                "poller starts the workflow, its 1,000 steps return their recorded outputs, "
                "`recv` finds the answer and `get_result` (told to poll every 10 ms; its "
                "default is 1 s) returns. Of the time shown, "
                f"{ms(med(fig.dbos_until_entered))} pass before the recovered workflow "
                "starts (the launch, then the queue's poll, every second by default), "
                f"replaying the 1,000 steps takes {ms(med(fig.dbos_replay))} and the rest "
                f"takes {ms(med(fig.dbos_rest))}. "
                "The queue's polling interval is DBOS's default."
            )
        return cell

    def here_cell(s: str) -> str:
        if s not in fig.here:
            return "n/a " + note(
                "DBOS: n/a. A DBOS workflow waiting in `DBOS.recv` is a live call blocked in "
                "its process, so answering it there is a wake-up, not a resume; its resume "
                "is the fresh-process row (recovery)."
            )
        return f"{med(fig.here_ratio[s]):.1%} ({ms(med(fig.here[s]))})"

    def storage_label() -> str:
        return f"3. storage, {TURNS} turns x (1 KB prompt + 1 KB reply) (x text) " + note(
            "Storage: agency_runtime keeps the messages on the run's thread (step deltas), "
            "LangGraph as plain dicts in a `messages` channel (`operator.add`; its "
            "SqliteSaver writes a full snapshot of the channel at every super-step, hence "
            "the quadratic growth), DBOS as each step's pickled result. The files once the "
            "store or process closed: SQLite folds the WAL back into the database when the "
            "last connection closes; DBOS's rollback journal leaves none."
        )

    def import_label() -> str:
        return f"4. import over a bare interpreter (best of {best_of}) " + note(
            "Import: `from agency_runtime import agency` (`import agency_runtime` alone "
            "loads each public name on first read); `import langgraph.graph, "
            "langgraph.checkpoint.sqlite` (`import langgraph` alone is an empty namespace "
            "package); `import dbos`. Wall time of `python -c` minus that of `python -c pass`."
        )

    text = text_bytes()
    head = ["workload", "raw SQLite commit", *(LABELS[s] for s in systems)]
    rows = [
        [step_label(), f"1x ({us(raw)})", *(step_cell(s) for s in systems)],
        [
            "   … every system on WAL, synchronous=NORMAL "
            + note(
                "The same step workload with the peers' connections set as agency_runtime's "
                "and the raw commit's: LangGraph's sqlite3 connection gets "
                "`PRAGMA synchronous = NORMAL` (SqliteSaver sets WAL itself); DBOS's engine "
                "opens its connections through a sqlite3.Connection subclass (passed as "
                "`db_engine_kwargs={'connect_args': {'factory': ...}}`) that sets WAL and "
                "NORMAL. A diagnostic, not how either ships."
            ),
            "—",
            *(wal_normal_cell(s) for s in systems),
        ],
        [
            f"2. resume after {PAUSE_AFTER:,} steps, fresh process (% of T, ms)",
            "—",
            *(fresh_cell(s) for s in systems),
        ],
        ["   … in the same process (% of T, ms)", "—", *(here_cell(s) for s in systems)],
        [
            f"   T: the run of {PAUSE_AFTER:,} steps up to the wait",
            "—",
            *(ms(med(fig.paused[s])) for s in systems),
        ],
        [
            storage_label(),
            f"1x ({text / 1024:.0f} KiB)",
            *(f"{fig.storage[s] / text:.1f}x ({fig.storage[s] / 2**20:.2f} MiB)" for s in systems),
        ],
        [
            import_label(),
            f"bare: {ms(fig.imports['bare'])}",
            *(ms(fig.imports[s]) for s in systems),
        ],
    ]
    note(
        f"Medians of {repeat} round(s) (T: of 2 runs per round for agency_runtime and "
        "LangGraph, 1 for DBOS); in each round the systems take turns in a rotating order, "
        "each workload in a fresh interpreter after a warm-up run of "
        f"{WARM_UP_STEPS} steps there. Storage is measured once, in round 1."
    )
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
    return [*lines, "", *(f"[{i}] {n}" for i, n in enumerate(notes, 1))]


def versions(systems: Sequence[str]) -> str:
    from importlib.metadata import PackageNotFoundError, version

    names = {
        "agency": ["agency-runtime"],
        "langgraph": ["langgraph", "langgraph-checkpoint-sqlite"],
        "dbos": ["dbos"],
    }
    out = []
    for s in systems:
        for name in names[s]:
            try:
                out.append(f"{name} {version(name)}")
            except PackageNotFoundError:
                out.append(f"{name} ?")
    return ", ".join(out)


def missing(systems: Sequence[str]) -> list[str]:
    from importlib.util import find_spec

    gaps = []
    for s in systems:
        for module in REQUIRES[s]:
            try:
                found = find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                gaps.append(module)
    return gaps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="agency_runtime beside LangGraph (SqliteSaver) and DBOS (SQLite): durable "
        "step, resume after 1,000 steps, storage of 200 LLM-like turns and import, as ratios "
        "measured in one run. Needs the 'bench' extra: pip install -e '.[bench]'.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a short run: 1 round, import best of 3"
    )
    parser.add_argument("--repeat", type=int, default=None, help=f"rounds (default {REPEAT})")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of {','.join(SYSTEMS)} (default: all)",
    )
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        system, task, tmp, *handoff = args.worker
        worker(system, task, Path(tmp), handoff[0] if handoff else None)
        return 0
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        parser.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    gaps = missing(systems)
    if gaps:
        print(
            f"bench/peers.py needs {', '.join(gaps)}, which this interpreter ({sys.executable}) "
            "cannot import: install the 'bench' extra, python3 -m pip install -e '.[bench]' "
            "(LangGraph: langgraph, langgraph-checkpoint-sqlite; DBOS: dbos), or pick "
            "--systems among the ones installed.",
            file=sys.stderr,
        )
        return 2
    repeat = args.repeat or (QUICK_REPEAT if args.quick else REPEAT)
    best_of = QUICK_IMPORT_BEST_OF if args.quick else IMPORT_BEST_OF
    begun = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - begun:6.1f} s] {text}", file=sys.stderr, flush=True)

    fig = measure(systems, repeat, best_of, log)
    command = shlex.join(
        ["python3", "bench/peers.py", *(argv if argv is not None else sys.argv[1:])]
    )
    today = datetime.date.today().isoformat()
    print(
        f"`{command}` on {today}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
        f"{versions(systems)}\n"
    )
    print("\n".join(table(fig, systems, repeat, best_of)))
    print(f"\n(total {time.perf_counter() - begun:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
