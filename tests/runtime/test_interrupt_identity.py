"""An interrupt's identity is its position (DESIGN §11.1): the asking call's address and an
ordinal among the asks at that same position, never its content or the order of asking.

Every case drives the fake model through the real tool loop with real pauses and answers:
a tool approval and a later interrupt, identical tool calls in one round, concurrent
branches tripping one shared guard, model-supplied numbers JSON cannot hold.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

from agency_runtime import GuardExceededError, Interrupt, RunResult, Store, agency, approve, reject
from agency_runtime._durable._journal import RunJournal
from agency_runtime._interrupts import _task_position, interrupt_id
from agency_runtime.testing import FakeModel, FakeToolCall
from tests.forked import ForkServer
from tests.support import app_module

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.anyio

RAN: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RAN.clear()


async def refund(order: str, amount: int) -> str:
    """Refund an order."""
    RAN[f"refund {order} {amount}"] += 1
    return f"refunded {amount} on {order}"


@agency.entry
async def refund_then_confirm() -> str:
    answer = await agency.llm(
        "Refund order 1",
        model="fake/identity",
        tools=[agency.tool(refund, needs_approval=True)],
    )
    confirmed = await agency.interrupt("confirm", "send the receipt?")
    return f"{answer} / receipt {'sent' if confirmed.approved else 'held'}"


async def _answer_all(
    result: RunResult, store: Store, decide: dict[str, Any] | None = None
) -> RunResult:
    """Answer every pending interrupt (approve unless ``decide`` maps its message)."""
    decide = decide or {}
    answers = {i.interrupt_id: decide.get(i.message, approve()) for i in result.interrupts}
    return await agency.respond_to_interrupts(result, answers, store=store)


async def test_a_tool_approval_and_a_later_interrupt_are_two_questions(store: Store) -> None:
    replies = [[FakeToolCall("refund", {"order": "1", "amount": 5})], "Refunded."]
    with FakeModel("identity", replies=replies):
        paused = await agency.run(refund_then_confirm, run_id="hitl", store=store)
        (tool_ask,) = paused.interrupts
        assert tool_ask.effect == "std::tool-approval"
        second = await _answer_all(paused, store)
        assert second.status == "paused"
        (confirm,) = second.interrupts
        assert confirm.effect == "confirm"
        assert confirm.interrupt_id != tool_ask.interrupt_id
        done = await _answer_all(second, store)
    assert (done.status, done.value) == ("completed", "Refunded. / receipt sent")
    assert RAN == {"refund 1 5": 1}


@agency.entry
async def two_refunds() -> str:
    return str(
        await agency.llm(
            "Refund twice",
            model="fake/identity",
            tools=[agency.tool(refund, needs_approval=True)],
        )
    )


def _calls(*amounts: int) -> list[FakeToolCall]:
    return [FakeToolCall("refund", {"order": "1", "amount": a}) for a in amounts]


async def _drive(
    store: Store, run_id: str, verdicts: list[bool], amounts: list[int]
) -> tuple[RunResult, list[Interrupt]]:
    """Run ``two_refunds`` answering the i-th approval asked with ``verdicts[i]``."""
    replies: list[Any] = [_calls(*amounts), "Done."]
    asked: list[Interrupt] = []
    with FakeModel("identity", replies=replies) as fake:
        result = await agency.run(two_refunds, run_id=run_id, store=store)
        while result.status == "paused":
            answers = {}
            for pending in result.interrupts:
                assert pending.interrupt_id not in {a.interrupt_id for a in asked}
                asked.append(pending)
                verdict = verdicts[len(asked) - 1]
                answers[pending.interrupt_id] = approve() if verdict else reject("no")
            result = await agency.respond_to_interrupts(result, answers, store=store)
        tool_results = [m["content"] for m in fake.calls[-1].messages if m["role"] == "tool"]
    assert len(tool_results) == len(amounts)
    for verdict, text in zip(verdicts, tool_results, strict=True):
        assert text.startswith("refunded" if verdict else "The call of 'refund' was refused")
    return result, asked


@pytest.mark.parametrize(
    "verdicts", [[True, False], [False, True], [True, False, False], [False, True, False]]
)
async def test_identical_tool_calls_are_asked_and_answered_one_by_one(
    store: Store, verdicts: list[bool]
) -> None:
    result, asked = await _drive(store, "same", verdicts, [5] * len(verdicts))
    assert result.status == "completed"
    assert len(asked) == len(verdicts)
    assert len({a.interrupt_id for a in asked}) == len(verdicts)
    assert {"refund 1 5": sum(verdicts)} == RAN


async def test_different_arguments_approved_one_by_one_both_run(store: Store) -> None:
    result, asked = await _drive(store, "diff", [True, True], [5, 5000])
    assert result.status == "completed"
    assert [a.data["arguments"]["amount"] for a in asked] == [5, 5000]
    assert RAN == {"refund 1 5": 1, "refund 1 5000": 1}


@agency.entry
async def three_branches_under_a_guard() -> list[str]:
    """The originals' guard-cost-shared-survives-interrupt: three branches call the model
    under one shared cost guard (which a handler keeps rejecting), then each asks."""
    results: dict[int, str] = {}

    def no_more_budget(asked: Interrupt) -> Any:
        return reject("no more budget") if asked.effect == "std::guard" else None

    async def branch(n: int) -> None:
        try:
            await agency.llm(f"branch {n}", model="fake/identity")
        except GuardExceededError as exc:
            results[n] = f"stopped: {type(exc).__name__}"
        else:
            results[n] = "answered"
        confirmed = await agency.interrupt("confirm", f"approve {n}?")
        results[n] += " approved" if confirmed.approved else " rejected"

    async def body() -> None:
        async with agency.cost_guard(0.00001), anyio.create_task_group() as group:
            for n in (1, 2, 3):
                group.start_soon(branch, n)

    await agency.with_handler(no_more_budget, body)
    return [results[n] for n in (1, 2, 3)]


async def test_branches_under_a_shared_guard_resume_after_their_questions(store: Store) -> None:
    with FakeModel("identity", function=lambda request: "x" * 20):
        paused = await agency.run(three_branches_under_a_guard, run_id="par", store=store)
        assert paused.status == "paused"
        asked = sorted(i.message for i in paused.interrupts)
        assert asked == ["approve 1?", "approve 2?", "approve 3?"]
        done = await _answer_all(paused, store)
    assert done.status == "completed", done.error
    assert all(r.endswith(" approved") for r in done.value)


async def refund_cents(order: str, amount: float) -> str:
    """Refund part of an order."""
    RAN[f"refund {order} {amount}"] += 1
    return f"refunded {amount} on {order}"


@agency.entry
async def partial_refund() -> str:
    tools = [agency.tool(refund_cents, needs_approval=True)]
    return str(await agency.llm("Refund", model="fake/identity", tools=tools))


@agency.entry
async def partial_refund_unasked() -> str:
    return str(await agency.llm("Refund", model="fake/identity", tools=[refund_cents]))


@pytest.mark.parametrize("entry", [partial_refund, partial_refund_unasked])
@pytest.mark.parametrize(
    "raw",
    [
        '{"order": "1", "amount": Infinity}',
        '{"order": "1", "amount": NaN}',
        '{"order": "1", "amount": 1e400}',
    ],
)
async def test_numbers_json_cannot_hold_are_invalid_arguments_for_the_model(
    store: Store, raw: str, entry: Any
) -> None:
    replies = [[FakeToolCall("refund_cents", raw)], "I will ask again."]
    with FakeModel("identity", replies=replies) as fake:
        result = await agency.run(entry, run_id="inf", store=store)
        (fed_back,) = [m["content"] for m in fake.calls[-1].messages if m["role"] == "tool"]
    assert (result.status, result.value) == ("completed", "I will ask again.")
    assert fed_back.startswith("Error: the arguments of 'refund_cents' are not valid:")
    assert "JSON" in fed_back
    assert RAN == {}


# -- answered from a second process ---------------------------------------------------------

_APP = '''
import os
from agency_runtime import agency
from agency_runtime.testing import FakeModel, FakeToolCall


def refund(order: str, amount: int) -> str:
    """Refund an order."""
    with open(os.environ["LEDGER"], "a") as ledger:
        ledger.write(f"refund {order} {amount}\\n")
    return f"refunded {amount} on {order}"


def script(request):
    if any(m["role"] == "tool" for m in request.messages):
        return "Done: " + "; ".join(m["content"] for m in request.messages if m["role"] == "tool")
    return [FakeToolCall("refund", {"order": "1", "amount": 5})] * int(os.environ["CALLS"])


FakeModel("identity", function=script).register()


@agency.entry
async def refund_then_confirm() -> str:
    answer = await agency.llm(
        "Refund order 1", model="fake/identity", tools=[agency.tool(refund, needs_approval=True)]
    )
    confirmed = await agency.interrupt("confirm", "send the receipt?")
    return f"{answer} / receipt {'sent' if confirmed.approved else 'held'}"
'''


def _respond(
    fork_server: ForkServer, tmp_path: Path, url: str, run_id: str, verdict: str
) -> dict[str, Any]:
    """``python -m agency_runtime runs respond`` in a new process; its JSON output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    argv = ["runs", "respond", run_id, f"--{verdict}", "--store", url, "--json"]
    done = fork_server.run(
        "module", "agency_runtime", *argv, "--import", "hitl_app",
        cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture
def hitl_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    yield from app_module(tmp_path, monkeypatch, "hitl_app", _APP)


@pytest.mark.parametrize(
    ("calls", "verdicts", "refunds"),
    [(1, ["approve", "approve"], 1), (2, ["approve", "reject", "approve"], 1),
     (3, ["reject", "approve", "reject", "reject"], 1)],
)  # fmt: skip
async def test_answers_from_another_process_answer_exactly_their_call(
    fork_server: ForkServer,
    hitl_app: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    calls: int,
    verdicts: list[str],
    refunds: int,
) -> None:
    monkeypatch.setenv("CALLS", str(calls))
    url = f"sqlite:///{tmp_path / 'hitl.db'}"
    paused = await agency.run(hitl_app.refund_then_confirm, run_id="two", store=url)
    seen = [paused.interrupts[0].interrupt_id]
    for verdict in verdicts[:-1]:
        result = _respond(fork_server, tmp_path, url, "two", verdict)
        assert result["status"] == "paused", result
        (pending,) = result["interrupts"]
        assert pending["interrupt_id"] not in seen
        seen.append(pending["interrupt_id"])
    assert pending["effect"] == "confirm"
    done = _respond(fork_server, tmp_path, url, "two", verdicts[-1])
    assert done["status"] == "completed", done
    ledger = (tmp_path / "ledger.txt").read_text().splitlines()
    assert ledger == ["refund 1 5"] * refunds
    tool_results = done["value"].removeprefix("Done: ").split(" / ")[0].split("; ")
    assert [r.startswith("refunded") for r in tool_results] == [
        v == "approve" for v in verdicts[:-1]
    ]


def test_an_answer_recorded_before_the_upgrade_keeps_its_place() -> None:
    """A run paused before the third release recorded its tool approval at the task's own
    position (``""``, ordinal 0): the task's next interrupt skips it (as the old code
    counted) and is never handed that answer."""
    journal = RunJournal("old")
    legacy = interrupt_id("old", "", 0)
    journal.asked[legacy] = Interrupt(interrupt_id=legacy, effect="std::tool-approval")
    journal.answers[legacy] = approve()
    assert _task_position(journal, "", "confirm") == interrupt_id("old", "", 1)
    assert _task_position(journal, "", "confirm") == interrupt_id("old", "", 2)
    fresh = RunJournal("old")
    assert _task_position(fresh, "", "confirm") == legacy


async def careful_refund(order: str) -> str:
    """Refund an order after asking."""
    asked = await agency.interrupt("refund-ok", f"refund {order}?")
    RAN[f"careful {order} {asked.approved}"] += 1
    return "refunded" if asked.approved else "kept"


@agency.entry
async def tool_asks_then_confirm() -> str:
    answer = await agency.llm("Refund", model="fake/identity", tools=[careful_refund])
    confirmed = await agency.interrupt("confirm", "send the receipt?")
    return f"{answer} / {confirmed.approved}"


async def test_an_interrupt_inside_a_tool_is_asked_at_that_tool_call(store: Store) -> None:
    replies = [[FakeToolCall("careful_refund", {"order": "1"})] * 2, "Refunded."]
    with FakeModel("identity", replies=replies):
        result = await agency.run(tool_asks_then_confirm, run_id="inner", store=store)
        asked: list[str] = []
        while result.status == "paused":
            (pending,) = result.interrupts
            asked.append(pending.message)
            verdict = reject() if len(asked) == 2 else approve()
            result = await agency.respond_to_interrupts(
                result, {pending.interrupt_id: verdict}, store=store
            )
    assert (result.status, result.value) == ("completed", "Refunded. / True"), result.error
    assert asked == ["refund 1?", "refund 1?", "send the receipt?"]
    assert dict(RAN) == {"careful 1 True": 1, "careful 1 False": 1}


async def summarize(text: str) -> str:
    """Summarize a text with another model call."""
    RAN["summarize"] += 1
    return str(await agency.llm(f"Summarize: {text}", model="fake/inner"))


@agency.entry
async def tool_calls_the_model() -> list[str]:
    first = await agency.llm("Go", model="fake/identity", tools=[summarize])
    final = await agency.llm("And now?", model="fake/identity")
    confirmed = await agency.interrupt("confirm", "keep it?")
    return [str(first), str(final), str(confirmed.approved)]


async def test_a_model_call_inside_a_tool_is_numbered_under_that_call(store: Store) -> None:
    """Counted at the caller's address, the inner call took the ordinal the caller's next
    call has on replay (the finished tool does not run then): a silently wrong answer."""
    outer = [[FakeToolCall("summarize", {"text": "long"})], "Summarized.", "The final word."]
    with (
        FakeModel("identity", replies=outer),
        FakeModel("inner", replies=["short"]) as inner,
    ):
        paused = await agency.run(tool_calls_the_model, run_id="nested", store=store)
        done = await _answer_all(paused, store)
    assert done.value == ["Summarized.", "The final word.", "True"]
    assert len(inner.calls) == 1
    assert dict(RAN) == {"summarize": 1}
