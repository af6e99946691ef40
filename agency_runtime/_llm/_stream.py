"""``agency.llm_stream``: ``agency.llm`` as an async iterator of the answer's text deltas.

::

    async with agency.llm_stream("Tell me a story", model=...) as stream:
        async for delta in stream:
            print(delta, end="")
    stream.result            # what agency.llm returned (the text, or the schema's value)

    async for delta in agency.llm_stream("Tell me a story"):   # the short form
        ...

It is one ``agency.llm`` call (the same options, tools included) whose ``on_token`` feeds the
iterator: the answer is journaled when it ends, at the address ``agency.llm`` would give it
(the call is counted where the stream is entered, before the task that makes it starts), so
code may switch between the two forms under an in-flight run; a replay yields the recorded
text as one delta without calling anything. The ``async with`` form owns the call's task for
its block, so leaving the loop early (``break``, an exception) cancels the call cleanly. The
short form keeps that task inside the async generator, which Python does not close on
``break``: read it to the end, or use the ``async with`` form to stop early.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from .._core._frame import current_frame
from .._errors import InvalidArgumentError
from ._chat import ask, begin

if TYPE_CHECKING:  # anyio loads its streams with the first stream (~10 ms otherwise)
    import anyio.abc
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

    from ._call import _Call

__all__ = ["LLMStream", "llm_stream"]

_UNSET = object()


class LLMStream:
    """One streamed ``agency.llm`` call: iterate it for the text deltas; ``result`` after."""

    def __init__(self, prompt: Any, options: dict[str, Any]) -> None:
        if "on_token" in options:
            raise InvalidArgumentError(
                "agency.llm_stream streams through its iterator; on_token is for agency.llm"
            )
        current_frame("llm_stream()")  # fail here, outside a frame, not in a task later
        self._prompt = prompt
        self._options = options
        self._result: Any = _UNSET
        self._group: anyio.abc.TaskGroup | None = None
        self._receive: MemoryObjectReceiveStream[str] | None = None
        self._iterated = False
        self._failure: BaseException | None = None

    @property
    def result(self) -> Any:
        """What the call returned (the answer's text, or the ``schema`` value)."""
        if self._result is _UNSET:
            raise InvalidArgumentError(
                "the stream's result is there once its iteration ended (read it to the end)"
            )
        return self._result

    async def _produce(self, call: _Call, send: MemoryObjectSendStream[str]) -> None:
        async with send:
            try:
                self._result = await ask(call)
            except anyio.get_cancelled_exc_class():
                raise
            except BaseException as exc:  # raised where the deltas are read, as it is
                self._failure = exc

    async def __aenter__(self) -> LLMStream:
        if self._group is not None:
            raise InvalidArgumentError("an agency.llm_stream(...) can be entered once")
        send, self._receive = anyio.create_memory_object_stream[str](math.inf)
        try:
            # Counted here, in the caller's task, as agency.llm counts: a call made in the
            # task started below would be numbered in that task's branch (``0.0:llm#0``).
            call = begin(self._prompt, on_token=send.send, **self._options)
        except BaseException:
            send.close()
            self._receive.close()
            raise
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        if call is None:  # an empty prompt: agency.llm returns "" and does nothing else
            self._result = ""
            send.close()
        else:
            self._group.start_soon(self._produce, call, send)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._group is not None
        assert self._receive is not None
        if exc is not None or (self._result is _UNSET and self._failure is None):
            self._group.cancel_scope.cancel()  # left early: stop the call
        self._receive.close()
        await self._group.__aexit__(None, None, None)
        if exc is None and self._failure is not None and not self._iterated:
            raise self._failure  # the block read nothing: the call's failure surfaces here
        return None

    def _deltas(self) -> AsyncIterator[str]:
        assert self._receive is not None
        return _Deltas(self, self._receive)

    def __aiter__(self) -> AsyncIterator[str]:
        if self._iterated:
            raise InvalidArgumentError("an agency.llm_stream(...) can be iterated once")
        self._iterated = True
        if self._group is None:
            return self._whole()
        return self._deltas()

    async def _whole(self) -> AsyncIterator[str]:
        """The short form: the call runs in a task of this generator; read it to the end
        (to leave early, use the ``async with`` form, which owns the task)."""
        async with self:
            async for delta in self._deltas():
                yield delta


class _Deltas:
    """The ``async with`` form's iterator: the deltas, then the call's failure if it failed
    (a plain iterator, not a generator, so leaving the loop early leaves nothing to close)."""

    __slots__ = ("_receive", "_stream")

    def __init__(self, stream: LLMStream, receive: MemoryObjectReceiveStream[str]) -> None:
        self._stream = stream
        self._receive = receive

    def __aiter__(self) -> _Deltas:
        return self

    async def __anext__(self) -> str:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            failure = self._stream._failure
            if failure is not None:
                raise failure from None
            raise StopAsyncIteration from None


def llm_stream(prompt: Any, **options: Any) -> LLMStream:
    """``agency.llm(prompt, **options)`` as a stream of the answer's text deltas.

    Use ``async with agency.llm_stream(...) as stream: async for delta in stream:`` (the
    deltas arrive as the model writes them; ``stream.result`` is the call's value after the
    loop), or ``async for delta in agency.llm_stream(...)``. The answer is journaled when it
    ends; a replayed call yields the recorded text as one delta and calls nothing.
    """
    return LLMStream(prompt, options)
