"""An order workflow in a resumable scope that pauses for a human's approval.

Start an order (it reserves stock, prices it, then pauses to ask for approval)::

    python3 examples/order_workflow.py start order-7 --item tea --quantity 2

Answer it from the CLI, in any process on the same store (the run continues from its
journal: ``reserve`` and ``price`` do not run again, ``charge`` runs once)::

    python3 -m agency_runtime runs respond order-7 --approve      # or --reject

Look at the stored outcome::

    python3 examples/order_workflow.py status order-7

The store is ``AGENCY_STORE`` when set, else ``sqlite:///./.agency/agency.db``. Every step
that runs appends ``ran <step> (<order-id>)`` to ``order-ledger.txt`` next to the store (for
the default store: ``./.agency/order-ledger.txt``), so you can check that nothing ran twice.

``place_order`` is defined at module level and declared with ``@agency.entry``: the runtime
records this script's path as the run's entry, and the process that answers the interrupt
imports it from there (without running the ``__main__`` block below). The store is data,
never code: only a declared entry is run, and only from a script under the working
directory (answer from the directory you started the order in), or one named with
``--import examples/order_workflow.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio

from agency_runtime import DEFAULT_STORE_URL, ResumableScope, RunResult, agency

PRICES = {"tea": 4.5, "coffee": 6.0, "cocoa": 5.25}


def store_url() -> str:
    """The store this example uses: ``AGENCY_STORE`` or the runtime's default."""
    return os.environ.get("AGENCY_STORE") or DEFAULT_STORE_URL


def ledger_path(url: str | None = None) -> Path:
    """``order-ledger.txt`` next to a SQLite store (else in ``./.agency/``)."""
    url = url or store_url()
    if url.startswith("sqlite:///"):
        database = url[len("sqlite:///") :].split("?", 1)[0]
        return Path(database).parent / "order-ledger.txt"
    return Path(".agency") / "order-ledger.txt"


def _log(ledger: str, line: str) -> None:
    path = Path(ledger)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")


@agency.entry
async def place_order(item: str, quantity: int) -> dict[str, Any]:
    """Reserve, price, ask a human, then charge: each step runs once, even across the pause."""
    order_id = agency.ctx().run_id or "order"

    async def body(s: ResumableScope) -> dict[str, Any]:
        def reserve() -> dict[str, Any]:
            # The ledger's path is journaled with the step's result, so the process that
            # resumes the run writes to the same file whatever its working directory.
            ledger = str(ledger_path().resolve())
            _log(ledger, f"ran reserve ({order_id})")
            return {"item": item, "reserved": quantity, "ledger": ledger}

        reservation = await s.step(reserve, name="reserve")
        ledger = str(reservation["ledger"])

        def price() -> dict[str, Any]:
            _log(ledger, f"ran price ({order_id})")
            unit = PRICES.get(item, 3.0)
            return {"unit": unit, "total": round(unit * quantity, 2)}

        quote = await s.step(price, name="price")
        answer = await agency.interrupt(
            "approve_order",
            f"Charge ${quote['total']:.2f} for {quantity} x {item}?",
            data={"item": item, "quantity": quantity, **quote},
        )
        if not answer.approved:
            s.halt({"order": order_id, "status": "rejected", "reason": answer.value})
            return {}

        def charge() -> dict[str, Any]:
            _log(ledger, f"ran charge ({order_id})")
            return {
                "order": order_id,
                "status": "charged",
                "item": item,
                "quantity": quantity,
                "total": quote["total"],
                "approved_by": answer.value,
            }

        return await s.step(charge, name="charge")

    return await agency.with_resumable_scope("order", body)


def respond_command(order_id: str) -> str:
    """The shell command that approves ``order_id`` (on the store ``AGENCY_STORE`` names)."""
    return f"python3 -m agency_runtime runs respond {order_id} --approve"


def _show(result: RunResult) -> int:
    run_id = result.run_id
    if result.status == "paused":
        question = result.interrupts[0]
        print(f"order {run_id}: paused, asks: {question.message}")
        print(f"  data: {json.dumps(question.data)}")
        print("answer it with:")
        print(f"  {respond_command(run_id)}")
        print(f"  (or --reject; then: python3 examples/order_workflow.py status {run_id})")
        return 0
    if result.ok:
        print(f"order {run_id}: {result.status}: {json.dumps(result.value)}")
        return 0
    error = result.error
    print(f"order {run_id}: {result.status}: {error.type + ': ' + error.message if error else ''}")
    return 1


async def start(order_id: str, item: str, quantity: int) -> int:
    """Run (or continue) the order ``order_id`` and say where it stopped."""
    url = store_url()
    result = await agency.run(place_order, item, quantity, run_id=order_id, store=url)
    return _show(result)


async def status(order_id: str) -> int:
    """Print the stored status and value of ``order_id``."""
    record = await agency.runs.get(order_id, store=store_url())
    value = json.loads(record.value) if record.value is not None else None
    print(f"order {order_id}: {record.status}")
    if value is not None:
        print(f"  value: {json.dumps(value)}")
    for question in record.interrupts:
        print(f"  waiting for an answer: {question.message}")
    if record.error is not None:
        print(f"  error: {record.error.type}: {record.error.message}")
    ledger = ledger_path()
    if ledger.exists():
        lines = [
            line for line in ledger.read_text(encoding="utf-8").splitlines() if order_id in line
        ]
        print(f"  ledger ({ledger}): {'; '.join(lines)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line: ``start ORDER_ID [--item I --quantity N]`` or ``status ORDER_ID``."""
    parser = argparse.ArgumentParser(
        prog="order_workflow.py", description=(__doc__ or "").splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    begin = commands.add_parser("start", help="place an order; it pauses for approval")
    begin.add_argument("order_id")
    begin.add_argument("--item", default="tea")
    begin.add_argument("--quantity", type=int, default=2)
    show = commands.add_parser("status", help="show an order's stored status")
    show.add_argument("order_id")
    options = parser.parse_args(argv)
    if options.command == "start":
        return anyio.run(start, options.order_id, options.item, options.quantity)
    return anyio.run(status, options.order_id)


if __name__ == "__main__":
    sys.exit(main())
