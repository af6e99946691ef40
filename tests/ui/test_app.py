"""The run inspector (``agency ui``) through Starlette's TestClient: its pages, its actions,
its guards (token, CSRF, host, headers, escaping) and its bounds (huge values, long
journals), over every store backend where the store matters."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.testclient import TestClient

from agency_runtime import (
    ResumableScope,
    RunRecord,
    SqliteStore,
    Store,
    Worker,
    agency,
)
from agency_runtime._boundary._runtime import RUNTIME
from agency_runtime._durable._entries import EntryRegistry
from agency_runtime._ui import _app, create_app
from agency_runtime.cli import main
from agency_runtime.testing import FakeModel, FakeToolCall
from tests.support import serving

BASE = "http://127.0.0.1:8765"
TOKEN = "test-token-0123456789abcdef"
STEPS: Counter[str] = Counter()


# -- entries -------------------------------------------------------------------------------


def _work(name: str) -> str:
    STEPS[name] += 1
    return name


@agency.entry
async def ordering(item: str) -> dict[str, Any]:
    """Reserve (a step), ask a human, then charge (a step)."""

    async def body(s: ResumableScope) -> dict[str, Any]:
        await s.step(lambda: _work("reserve"), name="reserve")
        answer = await agency.interrupt("approve", f"Buy {item}?", data={"stock": 3})
        if not answer.approved:
            return {"status": "rejected", "why": answer.value}
        await s.step(lambda: _work("charge"), name="charge")
        return {"status": "bought", "note": answer.value}

    return await agency.with_resumable_scope("order", body)


async def undeclared(item: str) -> str:
    """Like ``ordering``, never declared: a new process may not continue it."""
    answer = await agency.interrupt("approve", f"Ship {item}?")
    return f"shipped {item}" if answer.approved else "kept"


@agency.entry
async def three_steps(item: str) -> list[str]:
    async def body(s: ResumableScope) -> list[str]:
        return [
            await s.step(lambda: _work("a"), name="a"),
            await s.step(lambda: _work("b"), name="b"),
            await s.step(lambda: _work("c"), name="c"),
        ]

    return await agency.with_resumable_scope("three", body)


@agency.entry
def adds(a: int, b: int) -> int:
    agency.add_cost(0.0012)
    agency.add_tokens(7)
    return a + b


@agency.entry
def fails(item: str) -> str:
    raise ValueError(f"no stock for {item}")


@agency.entry
async def waits_for_payment(order: str) -> str:
    paid = await agency.wait_for_event("payment.settled", timeout=3600)
    return f"{order} paid {paid['amount']}"


@agency.entry
async def naps(order: str) -> str:
    await agency.sleep(3600)
    return "woke"


def weather(city: str) -> dict[str, Any]:
    """Today's weather.

    Args:
        city: The city.
    """
    return {"city": city, "temp": 21}


@agency.entry
async def assistant(question: str) -> str:
    agency.thread.system("You are terse.")
    answer = await agency.llm(question, tools=[weather])
    await agency.checkpoint("after-llm")
    await agency.sleep(0.001)
    event = await agency.wait_for_event("go")

    async def body(s: ResumableScope) -> str:
        return await s.step(lambda: f"filed {event['ticket']}", name="file_ticket")

    filed = await agency.with_resumable_scope("wrap", body)
    note = await agency.interrupt("approve", "Send the answer?", data={"answer": answer})
    return f"{answer} / {filed} / {note.approved}"


@agency.entry
async def big_value(n: int) -> str:
    return "x" * n


@agency.entry
async def many_steps(n: int) -> int:
    async def body(s: ResumableScope) -> int:
        for index in range(n):
            await s.step(lambda i=index: i, name="tick")  # type: ignore[misc]
        return n

    return await agency.with_resumable_scope("loop", body)


@agency.entry
async def chatty(n: int) -> int:
    def say() -> int:
        for index in range(n):
            agency.thread.user(f"message {index} " + "y" * 3000)
        return n

    async def body(s: ResumableScope) -> int:
        return await s.step(say, name="say")

    return await agency.with_resumable_scope("chat", body)


@agency.entry
async def asks_in_a_step(question: str) -> str:
    async def body(s: ResumableScope) -> str:
        return str(await s.step(lambda: agency.llm(question), name="ask"))

    return await agency.with_resumable_scope("a", body)


HOSTILE = "<script>alert(1)</script>"


@agency.entry
async def hostile(text: str) -> str:
    async def body(s: ResumableScope) -> str:
        await s.step(lambda: agency.thread.user(f"user says {HOSTILE}") or HOSTILE, name=HOSTILE)
        await agency.interrupt("approve", f"question {HOSTILE}", data={"html": HOSTILE})
        raise RuntimeError(f"failed with {HOSTILE}")

    return await agency.with_resumable_scope("h", body)


# -- helpers -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _clear_steps() -> None:
    STEPS.clear()


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(store), base_url=BASE) as http:
        yield http


def _csrf(http: TestClient, run_id: str) -> str:
    """The CSRF token of the forms on the run's page (it has at least one)."""
    page = http.get("/run", params={"id": run_id})
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text)
    assert found is not None, page.text[:2000]
    return found.group(1)


def _post(http: TestClient, url: str, run_id: str, **fields: str) -> Any:
    """POST a form of the run's page (with its CSRF token); the page it lands on."""
    data = {"csrf": _csrf(http, run_id), "id": run_id, **fields}
    return http.post(url, data=data)


def _flash(page: Any) -> str:
    found = re.search(
        r'<div class="flash flash-(\w+)" role="status">\s*<p>(.*?)</p>', page.text, re.S
    )
    assert found is not None, page.text[:3000]
    return f"{found.group(1)}: {found.group(2)}"


def _status(page: Any) -> str:
    found = re.search(r'id="run-status">(\w+)<', page.text)
    assert found is not None
    return found.group(1)


def _get(store: Store, run_id: str) -> RunRecord:
    return anyio.run(lambda: agency.runs.get(run_id, store=store))


def _paused(store: Store, run_id: str = "order-1", entry: Callable[..., Any] = ordering) -> str:
    result = agency.run_sync(entry, "tea", run_id=run_id, store=store)
    assert result.status == "paused"
    return run_id


def _park(store: Store, entry: Callable[..., Any], run_id: str) -> None:
    """Enqueue ``entry`` and let a worker run it until it parks (``waiting``)."""

    async def go() -> None:
        await agency.enqueue(entry, "o-1", run_id=run_id, store=store)
        async with serving(Worker(store, poll=0.01, park_after=0)):
            with anyio.fail_after(30):
                while True:  # the worker parks it (a store write of another task)
                    if (await agency.runs.get(run_id, store=store)).status == "waiting":
                        break
                    await anyio.sleep(0.01)

    anyio.run(go)


# -- the runs list -------------------------------------------------------------------------


def test_runs_list_shows_columns_filters_by_status_and_pages(
    store: Store, client: TestClient
) -> None:
    agency.run_sync(adds, 2, 3, run_id="done-1", store=store)
    agency.run_sync(fails, "tea", run_id="failed-1", store=store)
    _paused(store, "paused-1")
    page = client.get("/runs")
    assert page.status_code == 200
    headers = re.findall(r"<th(?: class=\"num\")?>([^<]+)</th>", page.text)
    assert headers == ["run id", "status", "entry", "attempts", "cost", "tokens", "created"]
    for run_id in ("done-1", "failed-1", "paused-1"):
        assert f'href="/run?id={run_id}"' in page.text
    assert "$0.001200" in page.text  # the cost, exact
    assert ">7<" in page.text  # the tokens
    assert "tests.ui.test_app:adds" in page.text
    assert "1 question" in page.text  # the paused run's pending interrupt

    failed = client.get("/runs", params={"status": "failed"})
    assert "failed-1" in failed.text
    assert "done-1" not in failed.text
    assert "paused-1" not in failed.text
    assert "unknown status" in client.get("/runs", params={"status": "bogus"}).text

    first = client.get("/runs", params={"limit": 2})
    assert first.text.count('<td class="id">') == 2
    assert "paused-1" in first.text
    assert "failed-1" in first.text
    assert 'href="/runs?limit=2&amp;offset=2" rel="next"' in first.text
    second = client.get("/runs", params={"limit": 2, "offset": 2})
    assert second.text.count('<td class="id">') == 1
    assert "done-1" in second.text
    assert 'href="/runs?limit=2" rel="prev"' in second.text
    assert 'rel="next"' not in second.text


def test_search_finds_ids_by_substring_within_a_bounded_scan(
    store: Store, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index in range(5):
        agency.run_sync(adds, index, 1, run_id=f"ticket-{index}", store=store)
    agency.run_sync(adds, 9, 9, run_id="invoice-77", store=store)
    page = client.get("/runs", params={"q": "TICKET"})  # any case
    assert page.text.count('<td class="id">') == 5
    assert "invoice-77" not in page.text
    assert "5 runs with “TICKET” in the id" in page.text
    assert "searched all 6" in page.text
    assert client.get("/runs", params={"q": "voice"}).text.count('<td class="id">') == 1

    monkeypatch.setattr(_app, "SEARCH_SCAN", 2)
    monkeypatch.setattr(_app, "_SCAN_BATCH", 2)
    bounded = client.get("/runs", params={"q": "ticket"})
    assert "among the newest 2" in bounded.text
    assert "older runs are not searched" in bounded.text
    assert bounded.text.count('<td class="id">') == 1  # ticket-4 (invoice-77 is newer)
    exact = client.get("/runs", params={"q": "ticket-0"})  # the oldest: found by its exact id
    assert 'href="/run?id=ticket-0"' in exact.text


def test_a_waiting_run_shows_when_it_wakes(store: Store, client: TestClient) -> None:
    _park(store, naps, "nap-1")
    record = _get(store, "nap-1")
    assert record.status == "waiting"
    assert record.wake_at is not None
    listing = client.get("/runs")
    assert "wakes 20" in listing.text
    page = client.get("/run", params={"id": "nap-1"})
    assert "<dt>wakes</dt>" in page.text
    assert _status(page) == "waiting"


# -- the run page --------------------------------------------------------------------------


def test_the_run_page_shows_inputs_interrupts_and_the_journal_as_a_timeline(
    store: Store, client: TestClient
) -> None:
    replies = [[FakeToolCall("weather", {"city": "Paris"})], "It is 21C in Paris."]

    async def start() -> None:
        with FakeModel("ui-tools", replies=replies) as fake:
            await agency.enqueue(
                assistant, "weather in Paris?", run_id="chat-1", store=store, model=fake.model
            )
            await agency.runs.send("chat-1", "go", {"ticket": "T-9"}, store=store)
            async with serving(Worker(store, poll=0.01)):
                await agency.runs.wait("chat-1", store=store, timeout=30)

    anyio.run(start)
    page = client.get("/run", params={"id": "chat-1"})
    assert page.status_code == 200
    text = page.text
    assert _status(page) == "paused"
    assert "&#34;weather in Paris?&#34;" in text  # the inputs
    assert "Send the answer?" in text
    assert 'value="approve"' in text
    assert "queue <b>default</b>" in text  # answered through a worker of its queue
    for kind in ("LLM call", "LLM round", "tool call", "checkpoint", "sleep", "event", "step"):
        assert f'<span class="kind">{kind}</span>' in text, kind
    assert "fake/ui-tools" in text  # the model of the call
    assert "asks for weather({&#34;city&#34;: &#34;Paris&#34;})" in text  # the round's tool call
    assert "event go" in text
    assert "T-9" in text
    assert "checkpoint after-llm" in text
    assert "file_ticket" in text
    assert "filed T-9" in text
    # the thread messages of the call: prompt, tool call, tool result, answer
    assert '<div class="msg role-user">' in text
    assert "weather in Paris?</pre>" in text
    assert '<div class="msg role-tool">' in text
    assert "&#34;temp&#34;:21" in text
    assert "It is 21C in Paris.</pre>" in text
    # durations, cost and tokens per step; journal positions; a fork button per entry
    assert re.search(r'title="time since the journal event before it">\d+ ms<', text)
    assert re.search(r"<span>\$0\.0000\d\d</span><span>\d+ tok</span>", text)
    assert "Σ $0.0000" in text  # the call's spend with its rounds'
    assert text.count('action="/run/fork"') == 7  # 2 rounds, the tool, the call, sleep, event, step
    assert "pending: waits for an answer" in text


def test_a_step_stored_once_shows_its_answer_and_messages(store: Store, client: TestClient) -> None:
    """The step keeps a marker to its LLM call and its result as a reference (issue 30): the
    page puts both back from the call's entry."""
    answer = "the model's long answer, " * 6

    async def start() -> None:
        with FakeModel("ui-once", replies=[answer]) as fake:
            result = await agency.run(
                asks_in_a_step, "a long question? " * 6, run_id="ask-1", store=store,
                model=fake.model,
            )  # fmt: skip
            assert result.value == answer

    anyio.run(start)
    [_, step] = anyio.run(lambda: agency.runs.journal("ask-1", store=store))
    assert step.result == "null"  # stored as a reference to the call's answer
    text = client.get("/run", params={"id": "ask-1"}).text
    shown = answer.replace("'", "&#39;") + "</pre>"
    # the run's value, the call's message, the step's message and the step's result, put back
    assert text.count(shown) == 4
    assert "are stored with it" not in text


def _family(store: Store) -> None:
    """A run ``boss`` with two child runs (the second with a child of its own)."""

    def run(run_id: str, at: float, parent: RunRecord | None = None, **fields: Any) -> RunRecord:
        tree = {}
        if parent is not None:
            tree = {"parent_id": parent.run_id, "root_id": parent.root_id or parent.run_id,
                    "depth": parent.depth + 1}  # fmt: skip
        return RunRecord.model_validate(
            {"run_id": run_id, "status": "running", "entry": "app:agent", "arguments": "{}",
             "created_at": at, **tree, **fields}
        )  # fmt: skip

    boss = run("boss", 1000.0, cost_pico=9 * 10**9, descendants_pico=5 * 10**9)
    first = run("boss/call#0", 1001.0, boss, entry="app:researcher", cost_pico=2 * 10**9)
    second = run("boss/call#1", 1002.0, boss, entry="app:writer", cost_pico=3 * 10**9,
                 descendants_pico=10**9)  # fmt: skip
    deep = run("boss/call#1/call#0", 1003.0, second, cost_pico=10**9)

    async def store_all() -> None:
        for record in (boss, first, second, deep):
            claim = await store.claim_run(record, owner="o", lease_seconds=30)
            done = claim.record.model_copy(update={"status": "completed"})
            assert await store.finish_run(done, owner="o")

    anyio.run(store_all)


def _children(page: Any) -> list[str]:
    found = re.search(r'<section class="card" id="children">(.*?)</section>', page.text, re.S)
    return [] if found is None else re.findall(r'<td class="id"><a href="([^"]+)"', found.group(1))


def test_a_run_page_links_its_parent_and_lists_its_children(
    store: Store, client: TestClient
) -> None:
    _family(store)
    boss = client.get("/run", params={"id": "boss"})
    assert boss.status_code == 200
    assert 'id="parent-link"' not in boss.text  # a top-level run
    assert "<dt>depth</dt>" not in boss.text
    # Its direct children, in the order they were created (not the grandchild).
    assert _children(boss) == ["/run?id=boss%2Fcall%230", "/run?id=boss%2Fcall%231"]
    assert "2 runs it started, oldest first." in boss.text
    assert "app:researcher" in boss.text
    assert "$0.002000" in boss.text  # a child's cost
    assert re.search(r"<dt>own cost</dt><dd[^>]*>\$0\.004000<", boss.text)

    second = client.get("/run", params={"id": "boss/call#1"})
    assert '<a href="/run?id=boss" id="parent-link">boss</a>' in second.text
    assert "<dt>depth</dt><dd>1</dd>" in second.text
    assert _children(second) == ["/run?id=boss%2Fcall%231%2Fcall%230"]
    assert "1 run it started, oldest first." in second.text

    deep = client.get("/run", params={"id": "boss/call#1/call#0"})
    assert 'id="parent-link">boss/call#1</a>' in deep.text
    assert "<dt>depth</dt><dd>2</dd>" in deep.text
    assert _children(deep) == []
    assert 'id="children"' not in deep.text
    assert "<dt>own cost</dt>" not in deep.text  # nothing below it

    plain = agency.run_sync(adds, 1, 2, run_id="plain", store=store)
    page = client.get("/run", params={"id": plain.run_id})
    for absent in ('id="parent-link"', "<dt>depth</dt>", 'id="children"', "<dt>own cost</dt>"):
        assert absent not in page.text


def test_a_run_page_lists_its_newest_children_up_to_a_bound(
    store: Store, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _family(store)
    monkeypatch.setattr(_app, "CHILDREN_SHOWN", 1)
    page = client.get("/run", params={"id": "boss"})
    assert _children(page) == ["/run?id=boss%2Fcall%231"]  # the newest
    assert "The newest 1 of the runs it started, oldest first" in page.text
    assert "agency runs list --parent boss" in page.text


def test_the_runs_list_shows_child_runs_like_any_other(store: Store, client: TestClient) -> None:
    _family(store)
    page = client.get("/runs")
    assert page.text.count('<td class="id">') == 4
    assert 'href="/run?id=boss%2Fcall%231%2Fcall%230"' in page.text


def test_approve_continues_a_declared_entry_in_process(store: Store, client: TestClient) -> None:
    run_id = _paused(store)
    interrupt = _get(store, run_id).interrupts[0].interrupt_id
    page = _post(
        client, "/run/respond", run_id, interrupt=interrupt, answer="approve", value='"ship it"'
    )
    assert page.status_code == 200
    assert page.url.path == "/run"
    assert _flash(page) == "ok: Approved; the run continued in this process and completed."
    assert _status(page) == "completed"
    record = _get(store, run_id)
    assert json.loads(record.value or "null") == {"status": "bought", "note": "ship it"}
    assert STEPS == {"reserve": 1, "charge": 1}  # reserve was not run again
    assert "answered: approve with ship it" in page.text  # in the timeline


def test_reject_with_a_text_value(store: Store, client: TestClient) -> None:
    run_id = _paused(store)
    interrupt = _get(store, run_id).interrupts[0].interrupt_id
    page = _post(
        client, "/run/respond", run_id, interrupt=interrupt, answer="reject", value="too expensive"
    )
    assert _flash(page).startswith("ok: Rejected; the run continued in this process")
    assert json.loads(_get(store, run_id).value or "null") == {
        "status": "rejected",
        "why": "too expensive",
    }


def test_an_undeclared_entry_is_not_run_in_process_but_can_go_to_a_worker(
    store: Store, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = _paused(store, "ship-1", undeclared)
    interrupt = _get(store, run_id).interrupts[0].interrupt_id
    monkeypatch.setattr(RUNTIME, "entries", EntryRegistry())  # as a new process would be
    refused = _post(client, "/run/respond", run_id, interrupt=interrupt, answer="approve")
    assert _flash(refused).startswith("error: This process cannot continue run ship-1")
    assert "--import MODULE" in refused.text
    assert "hand to a worker" in refused.text
    assert "Nothing was stored" in refused.text
    assert _get(store, run_id).status == "paused"

    queued = _post(
        client, "/run/respond", run_id, interrupt=interrupt, answer="approve", worker="1"
    )
    assert _flash(queued).startswith("ok: Approved; the run is queued in queue &#39;default&#39;")
    record = _get(store, run_id)
    assert record.status == "queued"
    assert record.queue == "default"


def test_a_queued_run_is_always_answered_through_its_queue(
    store: Store, client: TestClient
) -> None:
    async def start() -> None:
        await agency.enqueue(ordering, "tea", run_id="q-1", queue="shop", store=store)
        async with serving(Worker(store, queues=["shop"], poll=0.01)):
            await agency.runs.wait("q-1", store=store, timeout=30)

    anyio.run(start)
    interrupt = _get(store, "q-1").interrupts[0].interrupt_id
    page = _post(client, "/run/respond", "q-1", interrupt=interrupt, answer="approve")
    assert "queue &#39;shop&#39;" in _flash(page)
    assert _get(store, "q-1").status == "queued"

    async def finish() -> None:
        async with serving(Worker(store, queues=["shop"], poll=0.01)):
            await agency.runs.wait("q-1", store=store, timeout=30)

    anyio.run(finish)
    assert _status(client.get("/run", params={"id": "q-1"})) == "completed"


def test_answering_twice_is_refused(store: Store, client: TestClient) -> None:
    run_id = _paused(store)
    interrupt = _get(store, run_id).interrupts[0].interrupt_id
    _post(client, "/run/respond", run_id, interrupt=interrupt, answer="approve")
    again = _post(client, "/run/respond", run_id, interrupt=interrupt, answer="approve")
    assert _flash(again).startswith("error: Run order-1 is completed and has no pending")
    assert STEPS == {"reserve": 1, "charge": 1}


def test_fork_from_a_step_then_resume_the_fork(store: Store, client: TestClient) -> None:
    agency.run_sync(three_steps, "x", run_id="three-1", store=store)
    page = _post(client, "/run/fork", "three-1", path="three/0")
    flash = _flash(page)
    found = re.search(r"as (three-1-fork-[0-9a-f]{8})", flash)
    assert found is not None
    assert flash.startswith("ok: Forked three-1 after step three/0")
    fork = found.group(1)
    assert f'href="/run?id={fork}"' in page.text
    assert _get(store, fork).status == "paused"
    resumed = _post(client, "/run/resume", fork)
    assert _flash(resumed) == "ok: The run continued in this process and completed."
    assert STEPS == {"a": 1, "b": 2, "c": 2}  # the fork ran b and c again, not a
    bad = _post(client, "/run/fork", "three-1", path="three/9")
    assert _flash(bad).startswith("error: run &#39;three-1&#39; has no completed step")


def test_cancel(store: Store, client: TestClient) -> None:
    run_id = _paused(store)
    page = _post(client, "/run/cancel", run_id)
    assert _flash(page) == f"ok: Run {run_id} cancelled."
    assert _status(page) == "cancelled"
    assert _get(store, run_id).status == "cancelled"
    assert 'action="/run/cancel"' not in page.text  # final: no more actions
    again = client.post("/run/cancel", data={"csrf": _csrf(client, run_id), "id": run_id})
    assert _flash(again).startswith("error: Run order-1 is cancelled already")


def test_send_an_event_to_a_waiting_run(store: Store, client: TestClient) -> None:
    _park(store, waits_for_payment, "pay-1")
    page = client.get("/run", params={"id": "pay-1"})
    assert "payment.settled" in page.text
    assert "<details open>" in page.text
    bad = _post(client, "/run/send", "pay-1", name="payment.settled", payload="{nope")
    assert _flash(bad).startswith("error: The payload is not JSON")
    sent = _post(client, "/run/send", "pay-1", name="payment.settled", payload='{"amount": 30}')
    assert _flash(sent).startswith("ok: Event &#39;payment.settled&#39; sent")
    assert "The run waits for it" in sent.text

    async def finish() -> None:
        async with serving(Worker(store, poll=0.01)):
            await agency.runs.wait("pay-1", store=store, timeout=30)

    anyio.run(finish)
    assert json.loads(_get(store, "pay-1").value or "null") == "o-1 paid 30"
    done = _post(client, "/run/send", "pay-1", name="payment.settled", payload="{}")
    assert _flash(done).startswith("error: ")  # a completed run takes no events


def test_downloads_give_the_stored_json_as_a_file(store: Store, client: TestClient) -> None:
    agency.run_sync(adds, 2, 3, run_id="done-1", store=store)
    value = client.get("/run/download", params={"id": "done-1", "what": "value"})
    assert value.status_code == 200
    assert value.text == "5"
    assert value.headers["content-disposition"] == 'attachment; filename="done-1.value.json"'
    assert value.headers["content-type"].startswith("application/json")
    arguments = client.get("/run/download", params={"id": "done-1", "what": "arguments"})
    assert json.loads(arguments.text) == {"args": [2, 3], "kwargs": {}}
    assert client.get("/run/download", params={"id": "done-1", "what": "error"}).status_code == 404
    assert client.get("/run/download", params={"id": "nope", "what": "value"}).status_code == 404


def test_unknown_runs_and_paths_are_404(store: Store, client: TestClient) -> None:
    page = client.get("/run", params={"id": HOSTILE})
    assert page.status_code == 404
    assert "No such run" in page.text
    assert HOSTILE not in page.text
    assert "&lt;script&gt;" in page.text
    assert client.get("/nowhere").status_code == 404
    assert client.get("/static/nothing.css").status_code == 404
    assert client.post("/runs").status_code == 405
    agency.run_sync(three_steps, "x", run_id="three-1", store=store)  # a page with forms
    nameless = client.post("/run/cancel", data={"csrf": _csrf(client, "three-1"), "id": ""})
    assert nameless.status_code == 400


# -- security --------------------------------------------------------------------------------


def test_a_token_guards_every_request(store: Store) -> None:
    agency.run_sync(adds, 2, 3, run_id="done-1", store=store)
    app = create_app(store, token=TOKEN)
    with TestClient(app, base_url="http://192.0.2.7:8765") as http:
        for path in ("/runs", "/run?id=done-1", "/static/app.css", "/run/download?id=done-1"):
            refused = http.get(path)
            assert refused.status_code == 401, path
            assert refused.headers["www-authenticate"] == "Bearer"
            assert "done-1" not in refused.text or path != "/runs"
        assert http.get("/runs", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert http.get("/runs", params={"token": "wrong"}).status_code == 401
        ok = http.get("/runs", headers={"authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        assert "done-1" in ok.text
        http.cookies.clear()
        entered = http.get(
            "/runs", params={"token": TOKEN, "status": "completed"}, follow_redirects=False
        )
        assert entered.status_code == 303
        assert entered.headers["location"] == "/runs?status=completed"  # the token is dropped
        cookie = entered.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=lax" in cookie
        assert TOKEN not in cookie
        page = http.get("/runs?status=completed")  # the cookie now
        assert page.status_code == 200
        assert "done-1" in page.text
        assert http.post("/run/cancel", data={"id": "done-1"}).status_code == 403  # CSRF still


def test_create_app_refuses_a_short_token(store: Store) -> None:
    with pytest.raises(ValueError, match="at least 16 characters"):
        create_app(store, token="short")


def test_without_a_token_only_loopback_host_names_are_served(client: TestClient) -> None:
    rebound = client.get("/runs", headers={"host": "attacker.example:8765"})
    assert rebound.status_code == 400
    assert "DNS rebinding" in rebound.text
    for host in ("localhost:8765", "127.0.0.1", "[::1]:8765", "app.localhost"):
        assert client.get("/runs", headers={"host": host}).status_code == 200, host


def test_posts_need_the_csrf_token_of_their_session(store: Store, client: TestClient) -> None:
    run_id = _paused(store)
    good = _csrf(client, run_id)
    assert client.post("/run/cancel", data={"id": run_id}).status_code == 403
    assert client.post("/run/cancel", data={"id": run_id, "csrf": "0" * 64}).status_code == 403
    with TestClient(create_app(store), base_url=BASE) as other:  # another browser session
        _csrf(other, run_id)
        stolen = other.post("/run/cancel", data={"id": run_id, "csrf": good})
        assert stolen.status_code == 403
        assert "CSRF" in stolen.text
    cross = client.post(
        "/run/cancel", data={"id": run_id, "csrf": good}, headers={"origin": "https://evil.example"}
    )
    assert cross.status_code == 403
    fetched = client.post(
        "/run/cancel", data={"id": run_id, "csrf": good}, headers={"sec-fetch-site": "cross-site"}
    )
    assert fetched.status_code == 403
    as_json = client.post("/run/cancel", json={"id": run_id, "csrf": good})
    assert as_json.status_code == 415
    assert _get(store, run_id).status == "paused"  # nothing got through
    huge = client.post("/run/send", data={"id": run_id, "csrf": good, "payload": "x" * 1_100_000})
    assert huge.status_code == 413
    same = client.post("/run/cancel", data={"id": run_id, "csrf": good}, headers={"origin": BASE})
    assert same.status_code == 200
    assert _get(store, run_id).status == "cancelled"


def test_security_headers_on_every_response(store: Store, client: TestClient) -> None:
    agency.run_sync(adds, 2, 3, run_id="done-1", store=store)
    for path in ("/runs", "/run?id=done-1", "/run/download?id=done-1&what=value", "/nowhere"):
        response = client.get(path)
        assert response.headers["content-security-policy"].startswith("default-src 'self'")
        assert "script-src 'self'" in response.headers["content-security-policy"]
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"
        assert response.headers["cache-control"] == "no-store", path
    asset = client.get("/static/app.css")
    assert asset.status_code == 200
    assert asset.headers["content-type"].startswith("text/css")
    assert asset.headers["cache-control"] == "max-age=3600"
    assert client.get("/static/app.js").headers["x-frame-options"] == "DENY"
    cookie = client.cookies.get("agency_ui_session")
    assert cookie is not None
    fresh = TestClient(create_app(store), base_url=BASE).get("/runs")
    assert "HttpOnly" in fresh.headers["set-cookie"]
    assert "SameSite=strict" in fresh.headers["set-cookie"]


def _refuse(item: str) -> str:
    raise LookupError(f"no stock of {item}")


@agency.entry
async def fails_in_a_step(item: str) -> str:
    async def body(s: ResumableScope) -> str:
        await s.step(lambda: _work("a"), name="reserve")
        return await s.step(lambda: _refuse(item), name="pick")

    return await agency.with_resumable_scope("warehouse", body)


def test_a_failed_run_shows_its_failing_step_and_traceback(
    store: Store, client: TestClient
) -> None:
    agency.run_sync(fails_in_a_step, "tea", run_id="picked", store=store)
    page = client.get("/run", params={"id": "picked"})
    assert page.status_code == 200
    assert "failed in <code>pick at warehouse/1</code>" in page.text
    assert "in _refuse" in page.text  # the traceback, innermost frame last
    assert "LookupError: no stock of tea" in page.text


def test_hostile_strings_are_escaped(store: Store, client: TestClient) -> None:
    run_id = f"run-{HOSTILE}"
    result = agency.run_sync(hostile, HOSTILE, run_id=run_id, store=store)
    assert result.status == "paused"
    for page in (client.get("/runs"), client.get("/run", params={"id": run_id})):
        assert HOSTILE not in page.text
        assert "<script>" not in page.text.replace(
            '<script src="/static/app.js" defer></script>', ""
        )
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    interrupt = _get(store, run_id).interrupts[0].interrupt_id
    failed = _post(
        client, "/run/respond", run_id, interrupt=interrupt, answer="approve", value=HOSTILE
    )
    assert _status(failed) == "failed"
    assert HOSTILE not in failed.text
    assert "failed with &lt;script&gt;" in failed.text
    searched = client.get("/runs", params={"q": HOSTILE})
    assert HOSTILE not in searched.text
    assert "1 run with" in searched.text


# -- bounds ------------------------------------------------------------------------------------


@pytest.fixture
def sqlite_client(tmp_path: Path) -> Iterator[tuple[SqliteStore, TestClient]]:
    store = SqliteStore(tmp_path / "big.db")
    with TestClient(create_app(store), base_url=BASE) as http:
        yield store, http
    store.close()


def test_a_50_mb_value_renders_a_bounded_page(
    sqlite_client: tuple[SqliteStore, TestClient],
) -> None:
    store, http = sqlite_client
    size = 50 * 1024 * 1024
    assert agency.run_sync(big_value, size, run_id="big-1", store=store).status == "completed"
    page = http.get("/run", params={"id": "big-1"})
    assert page.status_code == 200
    assert len(page.content) < 200_000
    assert "truncated: the first 10000 characters of 52.4 MB" in page.text
    assert 'href="/run/download?id=big-1&amp;what=value"' in page.text
    assert len(http.get("/runs").content) < 100_000
    whole = http.get("/run/download", params={"id": "big-1", "what": "value"})
    assert len(whole.content) == size + 2  # the JSON string, quotes included


def test_10000_steps_render_bounded_pages(sqlite_client: tuple[SqliteStore, TestClient]) -> None:
    store, http = sqlite_client
    assert agency.run_sync(many_steps, 10_000, run_id="long-1", store=store).status == "completed"
    page = http.get("/run", params={"id": "long-1"})
    assert page.status_code == 200
    assert len(page.content) < 1_000_000
    assert page.text.count('<li class="item') == 200
    assert "10000 journaled steps" in page.text
    assert "page 1 of 50" in page.text
    assert 'href="/run?id=long-1&amp;page=2" rel="next"' in page.text
    last = http.get("/run", params={"id": "long-1", "page": 50})
    assert "page 50 of 50" in last.text
    assert "loop/9999" in last.text
    assert "loop/9799" not in last.text
    assert "loop/9800" in last.text
    beyond = http.get("/run", params={"id": "long-1", "page": 999})  # clamped to the last
    assert "page 50 of 50" in beyond.text


def test_a_step_with_many_messages_shows_some_and_links_the_rest(
    sqlite_client: tuple[SqliteStore, TestClient],
) -> None:
    store, http = sqlite_client
    assert agency.run_sync(chatty, 80, run_id="chatty-1", store=store).status == "completed"
    page = http.get("/run", params={"id": "chatty-1"})
    assert page.text.count('<div class="msg role-user">') == 50
    assert "… and 30 more change(s)" in page.text
    assert "truncated: 3.0 KB in all" in page.text  # each message cut to 2000 characters
    assert 'href="/run/download?id=chatty-1&amp;what=step-changes&amp;seq=1"' in page.text
    changes = http.get("/run/download", params={"id": "chatty-1", "what": "step-changes", "seq": 1})
    assert len(json.loads(changes.text)) == 80


# -- the command line ----------------------------------------------------------------------


def test_the_cli_refuses_a_non_loopback_host_without_a_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENCY_UI_TOKEN", raising=False)
    served: list[Any] = []
    monkeypatch.setattr("agency_runtime._ui.serve", lambda *a, **k: served.append(k))
    assert main(["ui", "--store", "memory://ui-cli", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--host 0.0.0.0 is not a loopback address" in err
    assert "--token" in err
    assert main(["ui", "--store", "memory://ui-cli", "--host", "::", "--token", "short"]) == 2
    assert "--token must be at least 16 characters" in capsys.readouterr().err
    assert served == []


def test_the_cli_serves_with_uvicorn(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[dict[str, Any]] = []
    monkeypatch.setattr("agency_runtime._ui.serve", lambda app, **k: served.append(k))
    assert main(["ui", "--store", "memory://ui-cli"]) == 0
    assert served == [{"host": "127.0.0.1", "port": 8765}]
    assert "at http://127.0.0.1:8765/ (Ctrl-C stops)" in capsys.readouterr().err
    monkeypatch.setenv("AGENCY_UI_TOKEN", TOKEN)
    assert main(["ui", "--store", "memory://ui-cli", "--host", "0.0.0.0", "--port", "9000"]) == 0
    assert served[-1] == {"host": "0.0.0.0", "port": 9000}
    assert f"at http://0.0.0.0:9000/?token={TOKEN}" in capsys.readouterr().err


def test_the_cli_says_how_to_install_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m.startswith("agency_runtime._ui")]:
        monkeypatch.delitem(sys.modules, name)
    for name in [m for m in sys.modules if m.split(".")[0] in ("starlette", "jinja2")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if they were not installed
    monkeypatch.setitem(sys.modules, "starlette", None)
    assert main(["ui", "--store", "memory://ui-cli"]) == 1
    err = capsys.readouterr().err
    assert "needs the ui extra (jinja2 is not installed)" in err
    assert "pip install 'agency-runtime[ui]'" in err


def test_importing_the_runtime_imports_no_web_framework() -> None:
    code = (
        "import sys, agency_runtime, agency_runtime.cli; "
        "print([m for m in ('starlette', 'jinja2', 'uvicorn', 'agency_runtime._ui') "
        "if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
