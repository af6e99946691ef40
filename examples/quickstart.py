"""Quickstart: a small support agent run as durable runs on the embedded SQLite store.

Run it with ``python3 examples/quickstart.py``. It shows:

* an agent entry running inside a frame: it asks the model for a structured answer with
  ``agency.llm`` (the prompt and the answer land on the run's thread, the call's cost is
  billed to the run);
* run ids as idempotency keys: the same ticket run twice executes once;
* a failure kept in the store, then retried under the same run id until it completes;
* a workflow of journaled steps that pauses for a human's approval and then completes
  without running its completed steps again;
* the store's admin view of what happened.

The store is ``AGENCY_STORE`` when set, else ``sqlite:///./.agency/agency.db``. The model is
``AGENCY_MODEL`` when set (any litellm model name, with its provider's API key in the
environment), else an offline fake support model from ``agency_runtime.testing``, so the
example runs anywhere with no keys and no network.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Literal

import anyio
from pydantic import BaseModel

from agency_runtime import ResumableScope, RunResult, agency, approve
from agency_runtime.testing import FakeModel, FakeRequest

FLAKY_ATTEMPTS: dict[str, int] = {}


class Ticket(BaseModel):
    """What a customer wrote."""

    customer: str
    text: str


class Answer(BaseModel):
    """What the agent decided."""

    category: str
    reply: str
    messages_in_thread: int


class Reply(BaseModel):
    """The structured answer the model is asked for."""

    category: Literal["refund", "password", "invoice", "other"]
    reply: str


RULES = {
    "refund": "I've opened a refund request; you'll hear from billing within two days.",
    "password": "Use 'Forgot password' on the sign-in page; the link is valid for an hour.",
    "invoice": "Your invoices are under Settings → Billing → History.",
}


def offline_support_model(request: FakeRequest) -> dict[str, str]:
    """The offline stand-in for a real model: answers a support ticket by keywords."""
    text = str(request.messages[-1]["content"]).lower()
    category = next((word for word in RULES if word in text), "other")
    return {
        "category": category,
        "reply": RULES.get(category, "Thanks! A human colleague will get back to you today."),
    }


SUPPORT_MODEL = FakeModel("support", function=offline_support_model).register()
MODEL = os.environ.get("AGENCY_MODEL") or SUPPORT_MODEL.model


async def support_agent(ticket: Ticket, flaky: bool = False) -> Answer:
    """Classify a ticket, answer it, and keep the conversation in the run's thread."""
    run_id = agency.ctx().run_id or ""
    if flaky:
        # Simulate a transient outage on the first attempt of this run id.
        FLAKY_ATTEMPTS[run_id] = FLAKY_ATTEMPTS.get(run_id, 0) + 1
        if FLAKY_ATTEMPTS[run_id] == 1:
            agency.add_cost(0.0004)  # the failed attempt still cost money
            raise ConnectionError("the ticket system timed out (simulated)")
    agency.thread.system(
        "You are a concise, friendly support agent. Classify the customer's ticket as "
        "refund, password, invoice or other, and write a one-sentence reply."
    )
    answer = await agency.llm(f"{ticket.customer} writes: {ticket.text}", schema=Reply)
    messages = len(agency.thread.current().get_messages())
    return Answer(category=answer.category, reply=answer.reply, messages_in_thread=messages)


STEP_RUNS: dict[str, int] = {}


def _count(step: str) -> None:
    STEP_RUNS[step] = STEP_RUNS.get(step, 0) + 1


async def refund_workflow(customer: str, amount: float) -> Answer:
    """Check, ask a human, then pay: each step runs once, even across the pause."""

    async def body(s: ResumableScope) -> Answer:
        def check() -> dict[str, object]:
            _count("check")
            agency.thread.user(f"{customer} asks for a refund of ${amount:.2f}")
            return {"eligible": amount <= 100, "order": 42}

        verdict = await s.step(check, name="check")
        answer = await agency.interrupt(
            "approve_refund", f"Refund ${amount:.2f} to {customer}?", data=verdict
        )
        if not answer.approved:
            s.halt(Answer(category="refund", reply="Refund declined.", messages_in_thread=1))
            return Answer(category="refund", reply="", messages_in_thread=0)

        def pay() -> Answer:
            _count("pay")
            agency.add_cost(0.0008)
            reply = f"Refunded ${amount:.2f} ({answer.value})."
            agency.thread.assistant(reply)
            messages = len(agency.thread.current().get_messages())
            return Answer(category="refund", reply=reply, messages_in_thread=messages)

        return await s.step(pay, name="pay")

    return await agency.with_resumable_scope("refund", body)


def show(label: str, result: RunResult[Answer]) -> None:
    """Print one run's outcome on a line or two."""
    origin = "from the store" if result.replayed else "executed"
    print(f"  {label:<26} {result.status:<9} ({origin}, ${result.cost:.6f}, {result.tokens} tok)")
    if result.ok:
        answer = result.unwrap()
        print(f"      → [{answer.category}] {answer.reply}")
    elif result.error is not None:
        print(f"      → {result.error.type}: {result.error.message}")


async def main() -> int:
    store = os.environ.get("AGENCY_STORE", "sqlite:///./.agency/agency.db")
    session = uuid.uuid4().hex[:8]
    print(f"agency-runtime quickstart — store: {store}, model: {MODEL}\n")

    print("1. Two tickets, each a durable run:")
    tickets = {
        f"ticket-{session}-1": Ticket(customer="ada", text="I'd like a refund for order 42"),
        f"ticket-{session}-2": Ticket(customer="bob", text="I forgot my password"),
    }
    for run_id, ticket in tickets.items():
        show(
            run_id, await agency.run(support_agent, ticket, run_id=run_id, store=store, model=MODEL)
        )

    print("\n2. The same ticket again (a redelivered webhook, say): nothing re-runs:")
    run_id, ticket = next(iter(tickets.items()))
    show(run_id, await agency.run(support_agent, ticket, run_id=run_id, store=store, model=MODEL))

    print("\n3. A run that fails, then is retried under the same run id:")
    flaky_id = f"ticket-{session}-3"
    flaky_ticket = Ticket(customer="cy", text="Where is my invoice?")
    for _ in range(2):
        result = await agency.run(
            support_agent, flaky_ticket, flaky=True, run_id=flaky_id, store=store, model=MODEL
        )
        show(flaky_id, result)

    print("\n4. A refund workflow: durable steps, paused for a human's approval:")
    refund_id = f"refund-{session}"
    paused = await agency.run(refund_workflow, "ada", 42.0, run_id=refund_id, store=store)
    print(f"  {refund_id:<26} {paused.status:<9} asks: {paused.interrupts[0].message}")
    print("  (a human approves)")
    result = await agency.respond_to_interrupts(paused, [approve("ok by Sam")], store=store)
    show(refund_id, result)
    steps = [entry.name for entry in await agency.runs.journal(refund_id, store=store)]
    print(f"      journal: {' → '.join(steps)}  (each step ran once: {STEP_RUNS})")

    print("\n5. What the store holds for this session:")
    records = [r for r in await agency.runs.list(store=store) if session in r.run_id]
    for record in sorted(records, key=lambda r: r.run_id):
        print(f"  {record.run_id:<26} {record.status:<9} attempts={record.attempts}")
    ok = result.ok and all(record.status == "completed" for record in records)
    print("\nDone." if ok else "\nSomething went wrong.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))
