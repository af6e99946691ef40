"""A Telegram assistant: durable turns, conversation memory and an "open tasks" context.

Offline, against a fake Bot API on loopback and an offline fake model (no token, no
network)::

    python3 examples/telegram_bot.py --offline

It pushes a short scripted conversation, polls it like the real bot would and prints the
transcript. Against the real Bot API (long polling until Ctrl-C)::

    TELEGRAM_BOT_TOKEN=123:abc TELEGRAM_CHAT=8587 python3 examples/telegram_bot.py
    # or: python3 examples/telegram_bot.py 8587

The bot answers one chat only (``TELEGRAM_CHAT`` or the argument; every other chat is
skipped). Each message is a durable turn on the store (``AGENCY_STORE`` or
``sqlite:///./.agency/agency.db``): recall, context, respond, deliver and save are journaled
steps, so a redelivered update gets no second reply. The model is ``AGENCY_MODEL`` when set
(any litellm model, with its provider's key), else an offline fake assistant. The open tasks
come from the file ``OPEN_TASKS_FILE`` names (one task a line) or a built-in list.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio

from agency_runtime import DEFAULT_STORE_URL, agency
from agency_runtime.testing import FakeModel, FakeRequest
from turn_kit import TurnArgs, agency_ctx, define_turn_context
from turn_kit.demo import offline_assistant_reply
from turn_kit.telegram import (
    BotApiTransport,
    FakeBotApi,
    TelegramPoller,
    create_telegram_turn_adapter,
)

NAMESPACE = "telegram-assistant"
DEFAULT_TASKS = ["call Mom", "renew passport", "book the dentist"]
SCRIPT = [
    "Hi! My name is Ada.",
    "What are my open tasks?",
    "And what's my name again?",
]


def open_tasks() -> list[str]:
    """The open tasks: lines of the ``OPEN_TASKS_FILE`` file, else a built-in list."""
    path = os.environ.get("OPEN_TASKS_FILE")
    if path and Path(path).is_file():
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        return [line.strip() for line in lines if line.strip()]
    return list(DEFAULT_TASKS)


TASKS_CONTEXT = define_turn_context(
    name="open-tasks",
    collect=lambda args: {
        "id": "open-tasks",
        "label": "Open tasks",
        "content": "; ".join(open_tasks()) or "none",
    },
)


def _offline_model(request: FakeRequest) -> str:
    return offline_assistant_reply(str(request.messages[-1]["content"]))


OFFLINE_MODEL = FakeModel("telegram-assistant", function=_offline_model)


def build_prompt(turn: TurnArgs) -> str:
    """The prompt of one turn: instructions, recalled history, context blocks, the message."""
    history = "\n".join(entry.content for entry in turn.history) or "(nothing yet)"
    context = "\n".join(f"{block.label}: {block.content}" for block in turn.context)
    return (
        "You are a concise, helpful personal assistant on Telegram.\n"
        f"Earlier in this conversation:\n{history}\n{context}\nMessage: {turn.input}"
    )


async def respond(turn: TurnArgs) -> str:
    """Answer one turn with ``agency.llm`` (journaled, billed to the turn's run)."""
    return str(await agency.llm(build_prompt(turn)))


def _model() -> str:
    chosen = os.environ.get("AGENCY_MODEL")
    if chosen:
        return chosen
    OFFLINE_MODEL.register()
    return OFFLINE_MODEL.model


async def run_offline(store: str, chat: str | None) -> int:
    """Talk to the bot through a fake Bot API on loopback; print the transcript."""
    session = uuid.uuid4().hex[:8]
    token = "4242:offline-token"
    owner = int(chat) if chat and chat.lstrip("-").isdigit() else 8587
    model = _model()
    print(f"telegram assistant (offline) — store {store}, model {model}, chat {owner}\n")
    with FakeBotApi(token=token) as api:
        async with BotApiTransport(token, base_url=api.base_url) as transport:
            bot = create_telegram_turn_adapter(
                # A fresh fake Bot API numbers messages from 1 again: a namespace per session
                # keeps this session's turns apart from an earlier session's on the same store.
                namespace=f"{NAMESPACE}-offline-{session}",
                owner_chat=str(owner),
                transport=transport,
                store=store,
                model=model,
                context=[TASKS_CONTEXT],
                typing=True,
            )
            poller = TelegramPoller(
                bot,
                ctx=agency_ctx(store),
                respond=respond,
                token=token,
                base_url=api.base_url,
                poll_timeout=0,
                offset_key=f"offline-{session}",
            )
            update: dict[str, Any] = {}
            for text in SCRIPT:
                update = api.push_message(owner, text)
                print(f"  you ▸ {text}")
                await poller.poll_once()
                print(f"  bot ◂ {api.sent[-1]['text']}")
            api.push_message(owner + 1, "I'm not the owner")  # another chat: skipped
            api.push_update(update)  # Telegram delivers the last update again: no new reply
            await poller.poll_once()
            replies = len(api.sent)
    print(f"\n{replies} replies for {len(SCRIPT)} messages (a stranger and a redelivery ignored)")
    return 0 if replies == len(SCRIPT) else 1


async def run_online(store: str, chat: str) -> int:
    """Long-poll the real Bot API (``TELEGRAM_BOT_TOKEN``) until interrupted."""
    model = _model()
    bot = create_telegram_turn_adapter(
        namespace=NAMESPACE,
        owner_chat=chat,
        transport=BotApiTransport(),
        store=store,
        model=model,
        context=[TASKS_CONTEXT],
        typing=True,
    )
    print(f"telegram assistant — store {store}, model {model}, answering chat {chat}; Ctrl-C stops")
    await TelegramPoller(bot, ctx=agency_ctx(store), respond=respond).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the bot; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="telegram_bot.py", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("chat", nargs="?", default=os.environ.get("TELEGRAM_CHAT"))
    parser.add_argument("--offline", action="store_true", help="fake Bot API, scripted chat")
    parser.add_argument("--store", default=os.environ.get("AGENCY_STORE") or DEFAULT_STORE_URL)
    options = parser.parse_args(argv)
    if options.offline:
        return anyio.run(run_offline, options.store, options.chat)
    if not os.environ.get("TELEGRAM_BOT_TOKEN"):
        parser.error("set TELEGRAM_BOT_TOKEN to run against the Bot API (or use --offline)")
    if not options.chat:
        parser.error("give the chat to answer: TELEGRAM_CHAT=... or an argument")
    try:
        return anyio.run(run_online, options.store, str(options.chat))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
