"""Slack for turn_kit: Events API in, durable turns out, replies in the thread.

* :func:`create_slack_turn_adapter` — reads ``message`` and ``app_mention`` events, skips
  bots (itself included), edits and channels not allowed, and runs each message as a
  durable turn in its thread's conversation (``conversation_key(channel, thread_ts or
  ts)``); acknowledgements and replies go into the thread in chunks, each posted once —
  also across crashes (:mod:`turn_kit.slack._send`); ``stream=True`` edits one message.
* :func:`slack_events_app` (ASGI) — verifies Slack's signature, answers
  ``url_verification``, and stores each turn as a queued run before answering (well within
  Slack's 3 s), so Slack's retries and crashes never give a second reply; its lifespan runs
  the worker that runs the turns.
* :class:`SlackApiTransport` — the Web API through ``slack_sdk`` (the ``slack`` extra), with
  ``Retry-After`` honoured and an honest *unknown* for a post that timed out.
* :class:`FakeSlackApi` — a Slack Web API on loopback, for tests and offline demos.
"""

from .._errors import SlackError, SlackRateLimitedError
from ._adapter import SlackHandleResult, SlackTurnAdapter, create_slack_turn_adapter
from ._events import slack_events_app
from ._fake import FakeSlackApi
from ._parse import (
    SlackMessage,
    escape_slack_text,
    read_slack_event,
    slack_input_text,
    slack_signature,
    slack_skip_reason,
    verify_slack_signature,
)
from ._send import SlackDelivery, send_slack_durably
from ._transport import SlackApiTransport, SlackIdentity, SlackSendResult

__all__ = [
    "FakeSlackApi",
    "SlackApiTransport",
    "SlackDelivery",
    "SlackError",
    "SlackHandleResult",
    "SlackIdentity",
    "SlackMessage",
    "SlackRateLimitedError",
    "SlackSendResult",
    "SlackTurnAdapter",
    "create_slack_turn_adapter",
    "escape_slack_text",
    "read_slack_event",
    "send_slack_durably",
    "slack_events_app",
    "slack_input_text",
    "slack_signature",
    "slack_skip_reason",
    "verify_slack_signature",
]
