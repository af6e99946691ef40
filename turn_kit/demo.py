"""The Telegram part of ``agency demo``: a turn_kit assistant, offline, in one call.

``agency demo`` (``python3 -m agency_runtime demo``) runs the demo parts other packages
register under the entry-point group ``agency_runtime.demos``; turn_kit registers
:func:`telegram_demo` there (see ``pyproject.toml``), so the runtime's demo shows turn_kit
without the runtime importing it. :func:`offline_assistant_reply` is the offline stand-in for
a model it answers with (the Telegram example bot reuses it).
"""

from __future__ import annotations

import re

from agency_runtime import agency
from agency_runtime.testing import FakeModel, FakeRequest

from ._context_providers import define_turn_context
from ._ctx import agency_ctx
from ._runner import TurnArgs
from .telegram import BotApiTransport, FakeBotApi, TelegramPoller, create_telegram_turn_adapter

__all__ = ["offline_assistant_reply", "telegram_demo"]


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


async def telegram_demo(store: str, model: str | None, session: str) -> bool:
    """A Telegram assistant (fake Bot API on loopback, durable turns, memory):

    turn_kit + ``agency.llm`` + conversation memory + a context provider answer a scripted
    conversation through a Bot API served on loopback, each reply streamed into one message
    (``stream=True``: sent with the first words, edited to the whole reply); the last update
    is delivered again and gets no second reply. Returns whether everything went as it should.
    """

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
                f"{context}\nMessage: {turn.input}",
                on_token=turn.on_token,  # stream=True: the reply shows while it is generated
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
                    stream=True,
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
                    print(f"  bot  ◂ {api.messages[-1]['text']}")  # as it reads now
                api.push_update(update)  # Telegram redelivers the last update
                await poller.poll_once()
                again = len(api.sent)
                print(f"  (the last update delivered again: {again} replies in all, not 4)")
                streamed = sum(1 for sent in api.messages if sent["edits"])
                print(f"  ({streamed} replies streamed: each one message, edited as it grew)")
                return again == 3
    finally:
        fake.unregister()
