"""The child process of ``test_kill.py``: the Slack events app served by uvicorn.

    python events_child.py STORE_URL API_BASE_URL READY_FILE

Serves :func:`~turn_kit.slack.slack_events_app` on an ephemeral loopback port with its
lifespan on (so its worker runs the turns, with a one-second lease: a killed process's runs
move on quickly), and writes the port to READY_FILE once it serves. Runs until killed.

The reply to ``msg N`` is three lines, one chunk of :data:`CHUNK_LIMIT` each, the first
saying how many earlier turns of the thread the turn recalled; an acknowledgement ``ack N``
comes first, with a short pause between, so SIGKILLs land before, during and after the
posts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from pathlib import Path

import anyio
import uvicorn

from turn_kit import TurnArgs, agency_ctx
from turn_kit.slack import SlackApiTransport, create_slack_turn_adapter, slack_events_app

TOKEN = "xoxb-kill-soak-token"
SECRET = "signing-secret"  # support.SECRET: what the soak signs its requests with
BOT = "UBOT"
NAMESPACE = "soak"
CHUNK_LIMIT = 40
PAUSE = 0.05


def reply_for(n: str, after: int) -> str:
    """The reply to ``msg n`` after ``after`` earlier turns: three chunks, one per line."""
    return f"reply {n} (after {after}): alpha beta\ngamma delta epsilon zeta\neta theta iota kappa"


async def respond(turn: TurnArgs) -> str:
    n = turn.input.removeprefix("msg ").strip()
    await turn.acknowledge(f"ack {n}")
    await anyio.sleep(PAUSE)
    return reply_for(n, len(turn.history))


async def main(url: str, api: str, ready: Path) -> None:
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format=f"{os.getpid()} %(name)s %(message)s"
    )
    adapter = create_slack_turn_adapter(
        namespace=NAMESPACE,
        transport=SlackApiTransport(TOKEN, base_url=api, timeout=5.0),
        bot_user_id=BOT,
        store=url,
        chunk_limit=CHUNK_LIMIT,
    )
    app = slack_events_app(
        adapter, signing_secret=SECRET, respond=respond, ctx=agency_ctx(), lease=1.0, poll=0.1
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            serving.result()  # raise why it stopped
        await asyncio.sleep(0.01)
    part = ready.with_name(ready.name + ".part")
    part.write_text(str(sock.getsockname()[1]))
    part.replace(ready)
    await serving


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
