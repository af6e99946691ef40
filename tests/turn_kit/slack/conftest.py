"""Fixtures of the Slack tests: a fake Web API on loopback and a transport talking to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from turn_kit.slack import FakeSlackApi, SlackApiTransport

from .support import BOT, TOKEN


@pytest.fixture
def api() -> Iterator[FakeSlackApi]:
    """A :class:`FakeSlackApi` serving on loopback for the test."""
    with FakeSlackApi(token=TOKEN, bot_user_id=BOT) as fake:
        yield fake


@pytest.fixture
async def transport(api: FakeSlackApi) -> AsyncIterator[SlackApiTransport]:
    """A :class:`SlackApiTransport` on :func:`api` (a 5 s timeout: a busy machine is slow)."""
    client = SlackApiTransport(TOKEN, base_url=api.base_url, timeout=5.0)
    try:
        yield client
    finally:
        await client.aclose()
