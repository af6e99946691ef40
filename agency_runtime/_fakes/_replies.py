"""What a fake model is asked and what it may answer: the shapes of one fake exchange.

A :class:`FakeRequest` records a request as a fake model received it (at the seam, or
through litellm). A scripted reply (or a reply function's result, :data:`Reply`) is a text,
a dict (sent as JSON text), a :class:`FakeToolCall` or a list of them (the model calls those
tools instead of answering), or a :class:`FakeStream` (a text streamed as exactly its
chunks); an exception is raised. :class:`FakeAnswer` is a reply made ready to send, the
same for both paths.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from .._llm._provider import ToolCall

__all__ = ["FakeAnswer", "FakeRequest", "FakeStream", "FakeToolCall", "Reply", "ReplyFunction"]


@dataclass(frozen=True, slots=True, init=False)
class FakeToolCall:
    """A scripted tool call: the fake model calls tool ``name`` with ``arguments``.

    ``arguments`` is a dict (sent as its JSON text) or the JSON text itself (sent as it is,
    so a test can script invalid JSON too). ``id`` is the call's id; by default it is
    ``f"call_{index}_{n}"``: the model's 0-based call index, then the call's position in
    the response, so ids are deterministic and unique across one model's responses.

    A reply of one ``FakeToolCall``, or a list of them (several calls in one response),
    makes the response carry those ``tool_calls`` with the text ``""``.
    """

    name: str
    arguments: dict[str, Any] | str
    id: str | None

    def __init__(
        self, name: str, arguments: dict[str, Any] | str | None = None, id: str | None = None
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"FakeToolCall name must be a str, got {type(name).__name__}")
        if not name.strip():
            raise ValueError("FakeToolCall name must be a non-empty string, e.g. 'get_weather'")
        if arguments is None:
            arguments = {}
        if isinstance(arguments, dict):
            try:
                json.dumps(arguments)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"FakeToolCall {name!r}: arguments must be JSON-serializable: {exc}"
                ) from None
            arguments = dict(arguments)
        elif not isinstance(arguments, str):
            raise TypeError(
                f"FakeToolCall {name!r}: arguments must be a dict or a JSON str, "
                f"got {type(arguments).__name__}"
            )
        if id is not None and (not isinstance(id, str) or not id):
            raise ValueError(f"FakeToolCall {name!r}: id must be a non-empty str or None")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "arguments", arguments)
        object.__setattr__(self, "id", id)

    @property
    def arguments_json(self) -> str:
        """The arguments as the model sends them: JSON text."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)

    def to_tool_call(self, default_id: str) -> ToolCall:
        """The seam's :class:`~._provider.ToolCall` (``default_id`` when :attr:`id` is unset)."""
        return ToolCall(id=self.id or default_id, name=self.name, arguments=self.arguments_json)


@dataclass(frozen=True, slots=True, init=False)
class FakeStream:
    """A scripted text answer streamed as exactly ``chunks``, ``delay`` seconds apart.

    A stream yields one text delta per chunk, in order, sleeping ``delay`` seconds
    (``anyio.sleep``: cancellable) between two chunks; an empty chunk sends no delta. A
    non-streaming call answers the joined text at once (only ``latency`` is waited).
    """

    chunks: tuple[str, ...]
    delay: float

    def __init__(self, chunks: Sequence[str], delay: float = 0.0) -> None:
        if isinstance(chunks, str | bytes) or not isinstance(chunks, Sequence):
            raise TypeError("FakeStream chunks must be a sequence of str, e.g. ['Hel', 'lo']")
        if not all(isinstance(chunk, str) for chunk in chunks):
            raise TypeError("FakeStream chunks must all be str")
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise ValueError(f"FakeStream delay must be a number >= 0, got {delay!r}")
        object.__setattr__(self, "chunks", tuple(chunks))
        object.__setattr__(self, "delay", float(delay))

    @property
    def text(self) -> str:
        """The whole answer: the chunks joined."""
        return "".join(self.chunks)


Reply = str | dict[str, Any] | FakeToolCall | Sequence[FakeToolCall] | FakeStream
"""What a scripted reply (or a reply function's result) may be; an exception is raised."""
ReplyFunction = Callable[["FakeRequest"], "Reply | BaseException | Awaitable[Reply]"]
"""A reply function: gets the :class:`FakeRequest`, returns (or awaits to) a reply."""


@dataclass(frozen=True, slots=True)
class FakeAnswer:
    """A fake model's answer, as both paths (the seam, litellm) send it."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    chunks: tuple[str, ...] | None = None
    """The stream's chunks (:class:`FakeStream`), or ``None``: the text word by word."""
    delay: float = 0.0
    """Seconds between two streamed chunks."""

    def pieces(self) -> list[str]:
        """The stream's text deltas, in order (no empty ones)."""
        if self.chunks is not None:
            return [chunk for chunk in self.chunks if chunk]
        return _pieces(self.text)


@dataclass
class FakeRequest:
    """One request a fake model received (at the seam, or through litellm)."""

    model: str
    """The model as the caller named it: ``"fake/<name>"``."""
    messages: list[dict[str, Any]]
    """The chat messages, as the provider received them."""
    response_format: Any | None
    """The response format the provider received (a pydantic class arrives as
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``)."""
    max_tokens: int | None
    """``max_tokens`` if the caller set it."""
    timeout: float | None
    """The request timeout in seconds, if any."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Every other optional parameter the provider received through litellm (temperature,
    seed, ...)."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """The tools the request offered, in the OpenAI shape (``{"type": "function",
    "function": {"name", "description", "parameters"}}``); ``[]`` when none."""
    tool_choice: str | dict[str, Any] | None = None
    """The ``tool_choice`` the request carried: ``"auto"`` with tools unless the model's
    options chose, ``"none"`` on a last round that must answer, ``None`` without tools."""
    params: dict[str, Any] = field(default_factory=dict)
    """The request's provider keyword arguments at the seam: an ``agency.Model``'s
    ``temperature``, ``seed``, ``top_p`` and ``options`` (``{}`` when none)."""
    api_base: str | None = None
    """The endpoint the request was sent to (a model's ``api_base``), if any."""
    api_key: SecretStr | None = field(default=None, repr=False)
    """The key the request carried (a ``SecretStr``: shown as ``'**********'``), if any."""

    @property
    def has_api_key(self) -> bool:
        """Whether the request carried an api_key."""
        return self.api_key is not None


def _pieces(text: str) -> list[str]:
    """``text`` in stream-sized pieces (words with their trailing space), in order."""
    return re.findall(r"\s*\S+\s*|\s+", text) or ([text] if text else [])
