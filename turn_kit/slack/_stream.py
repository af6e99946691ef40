"""A streamed Slack reply: one message in the thread, edited while the reply is generated.

:class:`SlackPreview` is the turn's :class:`~turn_kit.TurnStream` when the adapter streams
(``stream=True``). The first text is posted at once into the thread — as a one-chunk
:func:`~turn_kit.slack._send.send_slack_durably`, so a resumed turn finds it instead of
posting a second one — then edited (``chat.update``) to the text so far, at most once every
``interval`` seconds per channel, never to the text it already shows. A 429 on an edit holds
the edits back for its ``Retry-After`` (edits are sent with ``max_retries=0``: the preview
paces itself rather than stalling the model). At delivery the preview is edited to show
exactly the reply's first chunk (at once; only a 429's pause is waited out), so the
receipt's first ts is the preview's; further chunks are posted as usual.

The preview's ts is journaled with the respond step (``snapshot``/``restore``), so a turn
resumed after the answer was journaled edits that message. An edit that fails for another
reason stops the edits (the finished reply still replaces the preview, or is posted anew if
the preview is gone).
"""

from __future__ import annotations

import logging
from typing import Any

from .._chunks import chunk_text
from .._errors import SlackRateLimitedError
from .._identity import js_trim
from .._pace import Pace, retry_after
from .._util import field
from ._parse import SlackMessage, escape_slack_text
from ._send import edit_or_post, send_slack_durably

__all__ = ["SlackPreview"]

logger = logging.getLogger("turn_kit.slack")


class SlackPreview:
    """One streamed turn's preview message (see the module docstring)."""

    def __init__(
        self,
        transport: Any,
        message: SlackMessage,
        *,
        chunk_limit: int,
        interval: float,
        pace: Pace,
    ) -> None:
        self.transport = transport
        self.channel = message.channel
        self.thread_ts = message.root_ts
        self.chunk_limit = chunk_limit
        self.interval = interval
        self.pace = pace
        self.text = ""
        self.ts: str | None = None
        self.shown: str | None = None
        """What the preview shows (escaped), when this process knows it."""
        self.opened = False
        self.quiet = False

    def _head(self) -> str:
        chunks = chunk_text(js_trim(self.text), self.chunk_limit)
        return chunks[0] if chunks else ""

    async def token(self, delta: str) -> None:
        """Take the next piece of the reply: post the preview, or edit it when due."""
        if not isinstance(delta, str) or not delta:
            return
        self.text += delta
        head = self._head()
        if not head:
            return
        if not self.opened:
            await self._open(head)
            return
        if self.ts is None or self.quiet or not self.pace.ready(self.channel):
            return
        if escape_slack_text(head) != self.shown:
            await self._edit(escape_slack_text(head))

    async def _open(self, head: str) -> None:
        self.opened = True
        try:
            delivery = await send_slack_durably(
                self.transport, self.channel, head,
                thread_ts=self.thread_ts, chunk_limit=self.chunk_limit,
            )  # fmt: skip
        except Exception as exc:
            logger.warning(
                "Slack preview in %s was not posted (%s): the reply is posted when it is ready",
                self.channel, exc,
            )  # fmt: skip
            return
        if not delivery.message_ts:
            return  # timed out and not found: no edits; the reply is posted anew
        self.ts = delivery.message_ts[0]
        self.shown = None  # a resumed turn's preview may show another text
        self.pace.hold(self.channel, self.interval)

    async def _edit(self, text: str) -> None:
        assert self.ts is not None
        try:
            result = await self.transport.update_message(self.channel, self.ts, text, max_retries=0)
        except Exception as exc:
            wait = retry_after(exc) if isinstance(exc, SlackRateLimitedError) else None
            if wait is not None:  # Slack asked for a pause: no edit before it is over
                self.pace.hold(self.channel, max(wait, self.interval), rate_limited=True)
                return
            self.quiet = True
            logger.warning(
                "Slack preview edit in %s failed (%s): the reply replaces it when ready",
                self.channel, exc,
            )  # fmt: skip
            return
        self.pace.hold(self.channel, self.interval)
        if field(result, "ok"):
            self.shown = text
        elif field(result, "unknown"):
            self.shown = None
        else:
            self.quiet = True  # gone (deleted): the reply is posted anew

    def snapshot(self) -> Any:
        """The preview's ts, journaled with the respond step."""
        return None if self.ts is None else {"ts": self.ts}

    def restore(self, data: Any) -> None:
        """Take the preview's ts back from the respond step's journal entry."""
        if self.ts is None and isinstance(data, dict) and isinstance(data.get("ts"), str):
            self.ts = data["ts"]
            self.opened = True

    async def deliver_first(self, chunk: str, key: str) -> str:
        """The reply's first chunk (escaped), in the preview: edited to show exactly it."""
        assert self.ts is not None
        if chunk == self.shown:
            return self.ts
        await self.pace.wait_out_limit(self.channel)
        sent, edited = await edit_or_post(
            self.transport, self.channel, self.thread_ts, self.ts, chunk, key
        )
        if edited:
            self.shown = chunk
            self.pace.hold(self.channel, self.interval)
        return sent
