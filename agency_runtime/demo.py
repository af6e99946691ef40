"""``agency demo``: the main job, offline in one command.

1. A Telegram assistant (turn_kit + ``agency.llm`` + conversation memory + a context
   provider) answers a scripted conversation through a Bot API served on loopback; a
   redelivered update gets no second reply.
2. A refund workflow of journaled steps pauses for a human's approval, is answered, and
   completes without running its completed steps again.
3. A summary: cost, tokens, timings, the store — and a second refund run left paused, with
   the exact command that answers it from a shell.

It can run any number of times in one directory: each session has its own conversation
namespace, so the runs of an earlier session are kept, never replayed.

The model is ``AGENCY_MODEL`` when set (with its provider's key), else an offline fake model;
the store is ``--store`` / ``AGENCY_STORE``, else ``sqlite:///./.agency/agency.db``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import time
import uuid
from typing import Any

import anyio

from ._facade import agency
from ._interrupts import approve
from ._llm._litellm import add_import_notice
from ._scope import ResumableScope
from ._store import DEFAULT_STORE_URL

__all__ = ["main", "offline_assistant_reply"]

STEP_RUNS: dict[str, int] = {}


def offline_assistant_reply(prompt: str) -> str:
    """The offline stand-in for a model: answers a chat prompt from its history and context.

    It reads the text after ``Message:`` and answers introductions, "what's my name" (from
    the history in the prompt) and open tasks (from an ``Open tasks:`` context line).
    """
    message = prompt.rsplit("Message:", 1)[-1].strip()
    lowered = message.lower()
    if match := re.search(r"my name is (\w+)", message, re.IGNORECASE):
        return f"Nice to meet you, {match.group(1)}! I'll remember that."
    if "my name" in lowered:
        names = re.findall(r"my name is (\w+)", prompt, re.IGNORECASE)
        return f"You're {names[-1]}." if names else "You haven't told me your name yet."
    if "task" in lowered:
        tasks = re.search(r"Open tasks: (.*)", prompt)
        return f"Your open tasks: {tasks.group(1) if tasks else 'none'}."
    return f"Noted: {message}"


async def _telegram_part(store: str, model: str | None, session: str) -> int:
    from turn_kit import TurnArgs, agency_ctx, define_turn_context
    from turn_kit.telegram import (
        BotApiTransport,
        FakeBotApi,
        TelegramPoller,
        create_telegram_turn_adapter,
    )

    from ._llm._fake import FakeModel, FakeRequest

    def offline(request: FakeRequest) -> str:
        return offline_assistant_reply(str(request.messages[-1]["content"]))

    fake = FakeModel("demo-assistant", function=offline).register()
    chosen = model or fake.model
    token = "4242:demo-token"
    owner = 8587

    async def respond(turn: TurnArgs) -> str:
        history = "\n".join(entry.content for entry in turn.history)
        context = "\n".join(f"{block.label}: {block.content}" for block in turn.context)
        return str(
            await agency.llm(
                f"You are a helpful assistant on Telegram.\nHistory:\n{history}\n"
                f"{context}\nMessage: {turn.input}"
            )
        )

    tasks = define_turn_context(
        name="open-tasks",
        collect=lambda args: {
            "id": "open-tasks",
            "label": "Open tasks",
            "content": "call Mom; renew passport",
        },
    )
    try:
        with FakeBotApi(token=token) as api:
            async with BotApiTransport(token, base_url=api.base_url) as transport:
                bot = create_telegram_turn_adapter(
                    namespace=f"demo-assistant-{session}",
                    owner_chat=str(owner),
                    transport=transport,
                    store=store,
                    model=chosen,
                    context=[tasks],
                )
                poller = TelegramPoller(
                    bot, ctx=agency_ctx(store), respond=respond, token=token,
                    base_url=api.base_url, poll_timeout=0, offset_key=f"demo-{session}",
                )  # fmt: skip
                script = [
                    "Hi! My name is Ada.",
                    "What are my open tasks?",
                    "And what's my name again?",
                ]
                for text in script:
                    update = api.push_message(owner, text)
                    print(f"  you  ▸ {text}")
                    await poller.poll_once()
                    print(f"  bot  ◂ {api.sent[-1]['text']}")
                api.push_update(update)  # Telegram redelivers the last update
                await poller.poll_once()
                again = len(api.sent)
                print(f"  (the last update delivered again: {again} replies in all, not 4)")
                return again
    finally:
        fake.unregister()


@agency.entry
async def _refund_workflow(customer: str, amount: float) -> dict[str, Any]:
    async def body(s: ResumableScope) -> dict[str, Any]:
        def check() -> dict[str, Any]:
            STEP_RUNS["check"] = STEP_RUNS.get("check", 0) + 1
            return {"eligible": amount <= 100}

        verdict = await s.step(check, name="check")
        answer = await agency.interrupt(
            "approve_refund", f"Refund ${amount:.2f} to {customer}?", data=verdict
        )

        def pay() -> dict[str, Any]:
            STEP_RUNS["pay"] = STEP_RUNS.get("pay", 0) + 1
            agency.add_cost(0.0008)
            return {"refunded": amount if answer.approved else 0.0, "by": answer.value}

        return await s.step(pay, name="pay")

    return await agency.with_resumable_scope("refund", body)


async def _workflow_part(store: str, session: str) -> float:
    run_id = f"demo-refund-{session}"
    paused = await agency.run(_refund_workflow, "ada", 42.0, run_id=run_id, store=store)
    print(f"  {run_id}: {paused.status}, asks “{paused.interrupts[0].message}”")
    done = await agency.respond_to_interrupts(run_id, [approve("Sam")], store=store)
    print(f"  answered by a human (agency.respond_to_interrupts) → {done.status}: {done.value}")
    journal = await agency.runs.journal(run_id, store=store)
    print(f"  journal: {' → '.join(entry.name for entry in journal)}; step runs: {STEP_RUNS}")
    return done.cost


async def _leave_one_paused(store: str, session: str) -> str:
    """A second refund run, left paused: the reader answers it from a shell."""
    run_id = f"demo-refund-{session}-yours"
    await agency.run(_refund_workflow, "grace", 17.5, run_id=run_id, store=store)
    return run_id


async def _main(store: str) -> int:
    agency.preload()
    model = os.environ.get("AGENCY_MODEL") or None
    session = uuid.uuid4().hex[:6]
    started = time.perf_counter()
    print(f"agency demo — store {store}, model {model or 'offline fake model'}\n")
    add_import_notice(lambda notice: print(f"  ({notice})", flush=True))
    print("1. A Telegram assistant (fake Bot API on loopback, durable turns, memory):")
    replies = await _telegram_part(store, model, session)
    print("\n2. A refund workflow that pauses for a human:")
    cost = await _workflow_part(store, session)
    yours = await _leave_one_paused(store, session)
    runs = await agency.runs.list(store=store, limit=1000)
    spent = sum(r.cost_pico for r in runs) / 10**12
    tokens = sum(r.tokens for r in runs)
    elapsed = time.perf_counter() - started
    print(
        f"\n3. Summary: {len(runs)} runs in the store, ${spent:.6f} and {tokens} tokens spent "
        f"(the workflow: ${cost:.6f}), {elapsed:.1f} s."
    )
    where = "" if store == DEFAULT_STORE_URL else f" --store {shlex.quote(store)}"
    print(f"   Look at them: python3 -m agency_runtime runs list{where}")
    print(f"   One refund waits for you ({yours}); answer it from a shell:")
    print(f"     python3 -m agency_runtime runs respond {yours} --approve{where}")
    ok = replies == 3 and STEP_RUNS == {"check": 2, "pay": 1}
    print("\nDone." if ok else "\nSomething went wrong.")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="agency demo", description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=os.environ.get("AGENCY_STORE") or DEFAULT_STORE_URL)
    options = parser.parse_args(argv)
    return anyio.run(_main, options.store)
