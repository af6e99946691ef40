"""A Slack assistant: the Events API over HTTP, a durable turn per message, replies in threads.

Offline, against a fake Slack Web API on loopback and an offline fake model (no token, no
network)::

    python3 examples/slack_bot.py --offline

It serves the events app with uvicorn on a loopback port, then plays Slack: it posts signed
events to it — a mention in a channel, a follow-up in its thread, a direct message — and,
for the first one, Slack's retry (``X-Slack-Retry-Num: 1``) and the ``app_mention`` event
of the same message, as Slack sends them. It prints each answer the app gave and the
thread as the bot left it: one reply per message, the retries answered by the turn already
queued.

Against Slack (create the app from the manifest in the README, install it, and point its
Event Subscriptions at this server, e.g. through a tunnel)::

    SLACK_BOT_TOKEN=xoxb-... SLACK_SIGNING_SECRET=... python3 examples/slack_bot.py --port 3000

Each message is a durable turn on the store (``AGENCY_STORE`` or
``sqlite:///./.agency/agency.db``): the app answers Slack once the turn is stored as a queued
run, and its worker runs it — recall, context, respond, deliver and save are journaled
steps, so neither Slack's retries nor a crash gives a second reply. The model is
``AGENCY_MODEL`` when set (any litellm model, with its provider's key), else an offline fake
assistant.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from agency_runtime import DEFAULT_STORE_URL, agency
from agency_runtime.testing import FakeModel, FakeRequest
from turn_kit import TurnArgs, agency_ctx
from turn_kit.demo import offline_assistant_reply
from turn_kit.slack import (
    FakeSlackApi,
    SlackApiTransport,
    SlackTurnAdapter,
    create_slack_turn_adapter,
    slack_events_app,
    slack_signature,
)

NAMESPACE = "slack-assistant"
OFFLINE_TOKEN = "xoxb-offline-demo"
OFFLINE_SECRET = "offline-signing-secret"
BOT_USER = "UASSIST"
CHANNEL = "C0GENERAL"


def _offline_model(request: FakeRequest) -> str:
    return offline_assistant_reply(str(request.messages[-1]["content"]))


OFFLINE_MODEL = FakeModel("slack-assistant", function=_offline_model)


def build_prompt(turn: TurnArgs) -> str:
    """The prompt of one turn: instructions, recalled history, the message."""
    history = "\n".join(entry.content for entry in turn.history) or "(nothing yet)"
    return (
        "You are a concise, helpful assistant in a Slack workspace.\n"
        f"Earlier in this thread:\n{history}\nMessage: {turn.input}"
    )


async def respond(turn: TurnArgs) -> str:
    """Answer one turn with ``agency.llm`` (journaled, billed to the turn's run)."""
    return str(await agency.llm(build_prompt(turn), on_token=turn.on_token))


def build_adapter(transport: SlackApiTransport, store: str, model: Any) -> SlackTurnAdapter:
    """The assistant's adapter: replies stream into one message, 👀 marks a message seen."""
    return create_slack_turn_adapter(
        namespace=NAMESPACE,
        transport=transport,
        store=store,
        model=model,
        stream=True,
        reaction="eyes",
    )


async def serve(app: Any, host: str, port: int) -> tuple[Any, asyncio.Task[None], int]:
    """Serve ``app`` with uvicorn (lifespan on: the app's worker runs the turns)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(
        uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False)
    )
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    return server, task, int(sock.getsockname()[1])


def envelope(text: str, *, ts: str, thread_ts: str | None = None, channel: str = CHANNEL,
             kind: str = "message") -> dict[str, Any]:  # fmt: skip
    """An ``event_callback`` as Slack sends it for a user's message."""
    event: dict[str, Any] = {"type": kind, "channel": channel, "user": "U0ADA", "text": text,
                             "ts": ts}  # fmt: skip
    if thread_ts:
        event["thread_ts"] = thread_ts
    if kind == "message":
        event["channel_type"] = "im" if channel.startswith("D") else "channel"
    return {"type": "event_callback", "team_id": "T0DEMO", "event": event,
            "event_id": f"Ev{uuid.uuid4().hex[:10]}", "event_time": int(time.time())}  # fmt: skip


async def play_slack(client: httpx.AsyncClient, url: str, payload: dict[str, Any],
                     retry: int | None = None) -> dict[str, Any]:  # fmt: skip
    """POST one signed event, as Slack does; the app's JSON answer."""
    body = json.dumps(payload).encode()
    stamp = str(int(time.time()))
    headers = {"content-type": "application/json", "x-slack-request-timestamp": stamp,
               "x-slack-signature": slack_signature(OFFLINE_SECRET, stamp, body)}  # fmt: skip
    if retry is not None:
        headers["x-slack-retry-num"] = str(retry)
        headers["x-slack-retry-reason"] = "http_timeout"
    response = await client.post(url, content=body, headers=headers)
    if response.status_code != 200:
        sys.exit(f"the events app answered {response.status_code}: {response.text}")
    answer: dict[str, Any] = response.json()
    return answer


async def offline(store: str) -> None:
    """The scripted conversation against the fake Web API (see the module docstring)."""
    with FakeSlackApi(token=OFFLINE_TOKEN, bot_user_id=BOT_USER) as api:
        transport = SlackApiTransport(OFFLINE_TOKEN, base_url=api.base_url)
        model = os.environ.get("AGENCY_MODEL")
        if not model:
            OFFLINE_MODEL.register()  # queued runs name their model: register it by its name
            model = OFFLINE_MODEL.model
        adapter = build_adapter(transport, store, model)
        app = slack_events_app(adapter, signing_secret=OFFLINE_SECRET, respond=respond,
                               ctx=agency_ctx(), poll=0.2)  # fmt: skip
        server, task, port = await serve(app, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/slack/events"
        # The people's messages, as Slack holds them (the bot reacts to and replies on them).
        hello = f"<@{BOT_USER}> Hi! My name is Ada."
        root = api.add_user_message(CHANNEL, hello, user="U0ADA")
        question = f"<@{BOT_USER}> What's my name?"
        follow_up = api.add_user_message(CHANNEL, question, user="U0ADA", thread_ts=root)
        beep = api.add_user_message(CHANNEL, "beep", user="U0OTHERBOT")
        thanks = api.add_user_message("D0ADA", "Thanks!", user="U0ADA")
        bots = envelope("beep", ts=beep)
        bots["event"]["bot_id"] = "B0OTHER"
        script = [
            ("mention", envelope(hello, ts=root), None),
            ("Slack's retry", envelope(hello, ts=root), 1),
            ("its app_mention", envelope(hello, ts=root, kind="app_mention"), None),
            ("in the thread", envelope(question, ts=follow_up, thread_ts=root), None),
            ("a bot's message", bots, None),
            ("a direct message", envelope("Thanks!", ts=thanks, channel="D0ADA"), None),
        ]
        run_ids: list[str] = []
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                for label, payload, retry in script:
                    answer = await play_slack(client, url, payload, retry)
                    shown = answer.get("run_id") or answer.get("reason")
                    print(f"Slack → app ({label}): {answer.get('status')} {shown}")
                    if answer.get("status") == "queued":
                        run_ids.append(answer["run_id"])
                        done = await agency.runs.wait(answer["run_id"], store=store, timeout=60)
                        if done.status != "completed":
                            sys.exit(f"the turn {done.status}: {done.error}")
            print(f"\n{len(set(run_ids))} turns for {len(run_ids)} accepted events.\n")
            for channel, thread in ((CHANNEL, root), ("D0ADA", thanks)):
                print(f"Thread {channel}/{thread}:")
                for message in api.replies(channel, thread):
                    print(f"  bot: {message['text']}")
            reactions = sorted({r["ts"] for r in api.reactions})
            print(f"\n👀 on {len(reactions)} messages; {len(api.posts)} posts, "
                  f"{len(api.updates)} edits.")  # fmt: skip
            print("Done.")
        finally:
            server.should_exit = True
            await task
            await transport.aclose()


async def online(store: str, host: str, port: int) -> None:
    """Serve the events app until Ctrl-C (``SLACK_BOT_TOKEN``, ``SLACK_SIGNING_SECRET``)."""
    secret = os.environ.get("SLACK_SIGNING_SECRET", "")
    if not secret or not os.environ.get("SLACK_BOT_TOKEN"):
        sys.exit("Set SLACK_BOT_TOKEN (xoxb-...) and SLACK_SIGNING_SECRET, or run with --offline")
    adapter = build_adapter(SlackApiTransport(), store, os.environ.get("AGENCY_MODEL"))
    app = slack_events_app(adapter, signing_secret=secret, respond=respond)
    _server, task, bound = await serve(app, host, port)
    print(f"Serving Slack events on http://{host}:{bound}/ (Ctrl-C stops)")
    await task


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--offline", action="store_true", help="fake Slack and model, loopback")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3000)
    args = parser.parse_args()
    store = os.environ.get("AGENCY_STORE") or DEFAULT_STORE_URL
    if store.startswith("sqlite:///./"):
        Path(store.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    if args.offline:
        asyncio.run(offline(store))
    else:
        asyncio.run(online(store, args.host, args.port))


if __name__ == "__main__":
    main()
