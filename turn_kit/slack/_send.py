"""Sending into a Slack thread exactly once: chunks as journaled steps, each findable again.

:func:`send_slack_durably` posts ``text`` into a thread in chunks (at most ``chunk_limit``
UTF-16 units each, escaped for Slack), **each chunk a journaled step** of the calling run.
Telegram has no idempotency key, so a crash between a send and its journal entry can only
be reported there; Slack lets a message carry metadata, so every chunk is posted with a
key naming it — ``{run id}|{scope}|{chunk}`` — and a chunk whose step runs again after its
send may have happened is first looked for in the thread (``conversations.replies``):

* the scope's first step, ``begin``, is journaled before any chunk is posted. When it is
  replayed (the run resumed after a crash, or the turn is retried), the first chunk that
  has no journal entry may have been posted by the attempt that died: it is looked for
  by its key, and posted only if it is not there. Chunks after it were never attempted;
* a post that timed out (``unknown``) is looked for at once; if it is not there it is
  journaled as unknown and never posted again blindly (the delivery is then not ``ok``).

A lookup that fails (the app lacks the ``*:history`` scope) logs a WARNING and posts:
at least once rather than never. A streamed preview becomes the first chunk by an edit
(``chat.update``, which may safely be repeated: :func:`edit_or_post`); when it cannot be
edited any more (deleted), the chunk is posted.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ConfigDict, Field

from agency_runtime import DeferredModel, ResumableScope, agency

from .._chunks import chunk_text
from .._errors import SlackError, TurnKitError
from .._util import field
from ._parse import escape_slack_text

__all__ = ["SLACK_CHUNK_LIMIT", "SlackDelivery", "send_slack_durably"]

logger = logging.getLogger("turn_kit.slack")

SLACK_CHUNK_LIMIT = 4000
"""Slack's advice for one message's ``text`` (it truncates at 40,000 characters)."""
_EDIT_ATTEMPTS = 3


class SlackDelivery(DeferredModel):
    """The receipt of :func:`send_slack_durably`: the chunks' message timestamps, in order.

    ``ok`` is false when a chunk's post timed out and it was not found afterwards
    (``unknown_chunks``, counted from 1): it may or may not have arrived, and it is never
    posted twice.
    """

    model_config = ConfigDict(frozen=True)

    ok: bool
    channel: str
    thread_ts: str
    message_ts: list[str]
    unknown_chunks: list[int] = Field(default_factory=list)


def _run_id() -> str:
    run = agency.ctx_maybe()
    return "" if run is None or run.run_id is None else str(run.run_id)


async def _find(transport: Any, channel: str, thread_ts: str, key: str) -> str | None:
    """The ts of the message posted with ``key`` in the thread, or ``None``."""
    try:
        found = await transport.find_message(channel, thread_ts, key=key)
    except (SlackError, TurnKitError) as exc:
        logger.warning(
            "Slack: could not look for an earlier post of %s in %s (%s); posting it "
            "(grant the app the history scopes so a resumed turn never posts twice)",
            key, channel, exc,
        )  # fmt: skip
        return None
    return None if found is None else str(found)


async def post_chunk(
    transport: Any, channel: str, thread_ts: str, text: str, key: str, *, look_first: bool
) -> str:
    """Post one chunk (already escaped) with ``key``; its ts, or ``""`` when the post timed
    out and the message is not in the thread (it may still arrive: never posted again)."""
    if look_first:
        found = await _find(transport, channel, thread_ts, key)
        if found is not None:
            return found
    result = await transport.post_message(channel, text, thread_ts=thread_ts, key=key)
    ts = field(result, "ts")
    if field(result, "ok") and ts:
        return str(ts)
    if field(result, "unknown"):
        found = await _find(transport, channel, thread_ts, key)
        return "" if found is None else found
    raise SlackError(
        f"Slack chat.postMessage in {channel} returned no message ts "
        f"({field(result, 'error') or 'not ok'})"
    )


async def edit_or_post(
    transport: Any, channel: str, thread_ts: str, ts: str, text: str, key: str
) -> tuple[str, bool]:
    """Make message ``ts`` show ``text`` (escaped); when it cannot be edited (deleted), post
    ``text`` with ``key``. Returns the message's ts (``""``: a post that timed out) and
    whether it was an edit. An edit that keeps timing out raises (a retry edits again)."""
    result: Any = None
    for _ in range(_EDIT_ATTEMPTS):
        result = await transport.update_message(channel, ts, text)
        if not field(result, "unknown"):
            break
    else:
        raise SlackError(
            f"Slack chat.update in {channel} timed out {_EDIT_ATTEMPTS} times: the reply is "
            "not confirmed (a retry of the turn edits the message again)"
        )
    if field(result, "ok"):
        return ts, True
    return await post_chunk(transport, channel, thread_ts, text, key, look_first=True), False


async def send_slack_durably(
    transport: Any,
    channel: str,
    text: str,
    *,
    thread_ts: str,
    chunk_limit: int = SLACK_CHUNK_LIMIT,
    first: Callable[[str, str], Awaitable[str]] | None = None,
) -> SlackDelivery:
    """Post ``text`` into the thread ``thread_ts`` of ``channel``, inside a run, exactly once
    per chunk (see the module docstring); returns the :class:`SlackDelivery`.

    ``text`` is plain text: it is chunked, then each chunk is escaped. ``first(chunk, key)``,
    when given, delivers chunk 1 instead of a post (the adapter's streamed preview, edited
    to show it); it returns the message's ts.
    """
    chunks = [escape_slack_text(chunk) for chunk in chunk_text(text, chunk_limit)]

    async def body(s: ResumableScope) -> SlackDelivery:
        fresh = False

        def begin() -> bool:
            nonlocal fresh
            fresh = True
            return True

        await s.step(begin, name="begin", returns=bool)
        look_first = not fresh  # a replayed begin: the first unjournaled chunk may exist
        prefix = f"{_run_id()}|{s.address}"
        ts_list: list[str] = []
        unknown: list[int] = []
        for index, chunk in enumerate(chunks):
            key = f"{prefix}|{index}"
            ran = False

            async def deliver(
                chunk: str = chunk, key: str = key, index: int = index, look: bool = look_first
            ) -> str:
                nonlocal ran
                ran = True
                if index == 0 and first is not None:
                    return await first(chunk, key)
                return await post_chunk(transport, channel, thread_ts, chunk, key, look_first=look)

            sent: str = await s.step(deliver, name=f"chunk-{index}", returns=str)
            if ran:
                look_first = False  # this process posted it: the next chunks are new
            if sent:
                ts_list.append(sent)
            else:
                unknown.append(index + 1)
        return SlackDelivery(
            ok=not unknown,
            channel=channel,
            thread_ts=thread_ts,
            message_ts=ts_list,
            unknown_chunks=unknown,
        )

    return await agency.with_resumable_scope("slack-send", body)
