"""``agency.memory``: the :class:`MemoryNamespace` facade over one run's memory."""

from __future__ import annotations

from typing import Any

from .._core._frame import current_frame
from .._errors import InvalidArgumentError
from ._config import MemoryConfig, _check_memory_id, _config_of
from ._operations import _forget, _journaled, _recall, _remember
from ._persistence import _place
from ._state import _frame_for, _state

__all__ = ["MemoryNamespace"]


def _check_text(value: object, member: str, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(
            f"agency.memory.{member}: {what} must be a string, got {type(value).__name__}"
        )
    return value


class MemoryNamespace:
    """``agency.memory``: remember facts, recall them, forget them.

    ``enable`` / ``disable`` / ``set_id`` / ``enabled`` are synchronous and change or read
    the current run's memory state; ``remember`` / ``recall`` / ``forget`` are
    asynchronous. All of them raise :class:`OutsideFrameError` outside an execution frame.
    While memory is off, ``remember`` and ``forget`` do nothing and ``recall`` returns ``""``.
    """

    def enable(self, config: MemoryConfig | dict[str, Any] | None = None) -> None:
        """Turn memory on with ``config`` (pushed as a frame; the top frame applies).

        Enabling the memory already on top of the stack (the same ``dir`` real path, or the
        run's store again) does nothing.
        """
        frame = current_frame("memory.enable()")
        memory_frame = _frame_for(_config_of(config))
        state = _state(frame.ctx)
        if state.frames and state.frames[-1].identity == memory_frame.identity:
            return
        state.frames.append(memory_frame)

    def disable(self) -> None:
        """Pop the top memory frame (nothing happens when memory is off)."""
        state = _state(current_frame("memory.disable()").ctx)
        if state.frames:
            state.frames.pop()

    def enabled(self) -> bool:
        """Whether memory is on (some frame is enabled)."""
        return _state(current_frame("memory.enabled()").ctx).enabled

    def set_id(self, memory_id: str) -> None:
        """Use the memory ``memory_id`` (``^[A-Za-z0-9._-]+$``) from now on.

        Ignored while memory is off (as in agency-lang); a malformed id always raises
        :class:`InvalidArgumentError`.
        """
        frame = current_frame("memory.set_id()")
        checked = _check_memory_id(memory_id)
        state = _state(frame.ctx)
        if state.frames:
            state.memory_id = checked

    async def remember(self, content: str) -> None:
        """Extract facts from ``content`` with one model call and merge them into memory.

        Entities with the same name and type are reused, duplicate facts skipped, and facts
        the content contradicts soft-expired. An answer that does not match the extraction
        schema is logged and changes nothing.
        """
        frame = current_frame("memory.remember()")
        _check_text(content, "remember()", "content")
        place = _place(frame)
        if place is None or not content.strip():
            return
        await _journaled(frame, "remember", lambda inner: _remember(inner, place, content))

    async def recall(self, query: str) -> str:
        """What memory knows about ``query``, rendered for a prompt (``""`` when nothing).

        Up to ten entities, each as ``"Name (type):"`` followed by ``"  - fact"`` lines
        (live observations, then live relations), separated by blank lines.
        """
        frame = current_frame("memory.recall()")
        _check_text(query, "recall()", "query")
        place = _place(frame)
        if place is None or not query.strip():
            return ""
        found = await _journaled(frame, "recall", lambda inner: _recall(inner, place, query))
        return str(found or "")

    async def forget(self, query: str) -> None:
        """Soft-expire what ``query`` asks to forget, as planned by one model call.

        The model sees the candidate entities' live facts and names the ones to expire;
        they are matched by text (exact, else substring) and stop being recalled.
        """
        frame = current_frame("memory.forget()")
        _check_text(query, "forget()", "query")
        place = _place(frame)
        if place is None or not query.strip():
            return
        await _journaled(frame, "forget", lambda inner: _forget(inner, place, query))
