"""Screenshots of the run inspector (``agency ui``) for the README.

    python3 docs/screenshots.py [--out docs]        # writes ui-runs.png and ui-run.png

It fills a fresh SQLite store with runs an application might have — support answers with
LLM and tool calls, a refund paused for approval, a checkout parked waiting for a payment
event, a queued digest, a failed sync, a cancelled ticket — all offline (a scripted fake
model priced like a small hosted one), serves the inspector on loopback and photographs
the runs list and the paused refund's page with headless chromium (Debian's ``chromium``
and ``chromium-driver``). Needs the dev extra (selenium).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agency_runtime import ResumableScope, SqliteStore, Worker, agency, approve  # noqa: E402
from agency_runtime.testing import FakeModel, FakeRequest, FakeToolCall  # noqa: E402
from tests.ui.browser import chromium, screenshot, served  # noqa: E402

MODEL = agency.Model(
    "fake/helpdesk",
    name="gpt-4o-mini",
    input_cost_per_token=1.5e-7,
    output_cost_per_token=6e-7,
)

ORDERS = {
    "1043": {"email": "ada@example.com", "item": "Ethiopia Guji, 1 kg", "total": 42.5},
    "1039": {"email": "grace@example.com", "item": "Burr grinder", "total": 129.0},
    "2291": {"email": "linus@example.com", "item": "Espresso sampler", "total": 30.0},
}


# -- tools and steps -------------------------------------------------------------------------


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up.

    Args:
        order_id: The order's number.
    """
    time.sleep(0.09)
    order = ORDERS.get(order_id, {"email": "?", "item": "?", "total": 0})
    return {"order": order_id, **order, "status": "delivered", "delivered": "2026-11-28"}


def shipping_status(order_id: str) -> dict[str, Any]:
    """Where an order's parcel is.

    Args:
        order_id: The order's number.
    """
    time.sleep(0.14)
    return {"order": order_id, "carrier": "DHL", "events": ["picked up", "in transit"]}


def refund_policy(region: str) -> str:
    """The refund policy of a region.

    Args:
        region: "EU" or "US".
    """
    time.sleep(0.06)
    return "Refunds within 30 days of delivery; perishables only when damaged or wrong."


def brain(request: FakeRequest) -> Any:
    """The scripted model: decides from the conversation, as a real one does."""
    last = request.messages[-1]
    text = str(last.get("content") or "")
    tools = {t["function"]["name"] for t in request.tools}
    if last.get("role") == "user":
        if "lookup_order" in tools and "#" in text:
            order = text.split("#", 1)[1].split()[0].strip("?.,")
            calls = [FakeToolCall("lookup_order", {"order_id": order})]
            if "where" in text.lower():
                calls.append(FakeToolCall("shipping_status", {"order_id": order}))
            return calls
        if "refund_policy" in tools:
            return [FakeToolCall("refund_policy", {"region": "EU"})]
    if request.response_format is not None:
        return {"within_policy": True, "reason": "Delivered 4 days ago; the beans arrived damaged."}
    if last.get("role") == "tool":
        found = next(
            (json.loads(m["content"]) for m in request.messages if m.get("name") == "lookup_order"),
            {},
        )
        if "where" in json.dumps(request.messages).lower():
            return (
                f"Your order #{found.get('order')} ({found.get('item')}) was delivered by DHL on "
                "28 November. If it has not reached you, reply here and I will open a trace."
            )
        return (
            f"Order #{found.get('order')} ({found.get('item')}) has shipped already, so the "
            "grind cannot change; I can send a free bag of the right grind instead."
        )
    return "Thanks! I have passed this on to the team; you will hear from us today."


class Verdict(BaseModel):
    within_policy: bool
    reason: str


# -- entries -----------------------------------------------------------------------------------


@agency.entry(name="support.answer")
async def answer_ticket(customer: str, text: str) -> str:
    agency.thread.system("You are Helpdesk, the support agent of Northwind Coffee. Be brief.")
    return await agency.llm(f"{customer}: {text}", tools=[lookup_order, shipping_status])


@agency.entry(name="billing.refund")
async def refund(order_id: str, amount: float) -> dict[str, Any]:
    async def body(s: ResumableScope) -> dict[str, Any]:
        order = await s.step(lambda: lookup_order(order_id), name="load_order")
        agency.thread.system("You check refunds against Northwind's policy.")
        verdict = await agency.llm(
            f"Is a refund of ${amount:.2f} for order #{order_id} within policy? {order}",
            tools=[refund_policy],
            schema=Verdict,
        )
        await agency.checkpoint("before-approval")
        answer = await agency.interrupt(
            "approve",
            f"Refund ${amount:.2f} to {order['email']} for order #{order_id}?",
            data={"order": order_id, "amount": amount, "policy": verdict.reason},
        )
        if not answer.approved:
            return {"status": "rejected", "why": answer.value}
        receipt = await s.step(
            lambda: {"refund": f"re_{order_id}7f", "amount": amount}, name="issue"
        )
        await s.step(lambda: time.sleep(0.05) or "sent", name="email_customer")
        return {"status": "refunded", **receipt}

    return await agency.with_resumable_scope("refund", body)


@agency.entry(name="shop.checkout")
async def checkout(order_id: str) -> str:
    async def body(s: ResumableScope) -> str:
        await s.step(lambda: {"intent": f"pi_{order_id}", "amount": 30.0}, name="charge_card")
        return "reserved"

    await agency.with_resumable_scope("checkout", body)
    paid = await agency.wait_for_event("payment.settled", timeout=3600)
    return f"paid {paid['amount']}"


@agency.entry(name="ops.inventory_sync")
async def inventory_sync(warehouse: str) -> int:
    async def body(s: ResumableScope) -> int:
        await s.step(lambda: time.sleep(0.2) or 1840, name="fetch_stock")
        raise TimeoutError(f"warehouse {warehouse} did not answer within 10 s")

    return await agency.with_resumable_scope("sync", body)


@agency.entry(name="digest.daily")
async def daily_digest(team: str) -> str:
    return f"digest for {team}"


# -- the store ---------------------------------------------------------------------------------


async def fill(store: SqliteStore) -> None:
    """Runs of every status, in the order an afternoon might have made them."""
    await agency.run(
        answer_ticket,
        "ada",
        "Where is my order #1043? It should have arrived by now.",
        run_id="support-ticket-4812",
        store=store,
        model=MODEL,
    )
    done = await agency.run(
        refund, "1039", 129.0, run_id="refund-order-1039", store=store, model=MODEL
    )
    await agency.respond_to_interrupts(done, [approve("ok, defective grinder")], store=store)
    await agency.run(inventory_sync, "berlin-2", run_id="inventory-sync-88", store=store)
    cancelled = await agency.run(
        refund, "1040", 18.0, run_id="refund-order-1040", store=store, model=MODEL
    )
    await agency.runs.cancel(cancelled.run_id, store=store)
    await agency.run(
        answer_ticket,
        "grace",
        "Can I change the grind of order #1039 before it ships?",
        run_id="support-ticket-4815",
        store=store,
        model=MODEL,
    )
    await agency.enqueue(checkout, "2291", run_id="checkout-o-2291", queue="payments", store=store)
    worker = Worker(store, queues=["payments"], poll=0.05, park_after=0)
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run)
        with anyio.fail_after(30):  # until the worker parked it
            while True:
                if (await agency.runs.get("checkout-o-2291", store=store)).status == "waiting":
                    break
                await anyio.sleep(0.05)
        await worker.drain()
    await agency.enqueue(
        daily_digest,
        "support",
        run_id="digest@2026-12-02T08:00:00Z",
        queue="digests",
        store=store,
    )
    await agency.run(
        refund, "1043", 42.5, run_id="refund-order-1043", store=store, model=MODEL
    )  # paused: the page photographed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where the PNGs go")
    ns = parser.parse_args(argv)
    agency.register_model(MODEL)
    with tempfile.TemporaryDirectory(prefix="agency-ui-shots-") as tmp:
        store = SqliteStore(Path(tmp) / "agency.db")
        with FakeModel("helpdesk", function=brain, latency=0.35):
            anyio.run(fill, store)
        with served(store) as base, chromium(Path(tmp) / "profile") as driver:
            driver.get(f"{base}/runs")
            screenshot(driver, ns.out / "ui-runs.png", most=900)
            driver.get(f"{base}/run?id=refund-order-1043")
            screenshot(driver, ns.out / "ui-run.png", most=2400)
        store.close()
    for name in ("ui-runs.png", "ui-run.png"):
        print(ns.out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
