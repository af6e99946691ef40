"""Message threads: :class:`Message`, :class:`MessageThread` and :class:`ThreadStore`.

A :class:`ThreadStore` is a *view* over a registry of threads shared by every frame of a
run. Each view has its own stack of active thread ids, so switching the active thread in
one branch (``agency.thread.use``) never changes it for another. Thread ids are counter
strings ``"0"``, ``"1"``, …; their public slug is ``"t0"``, ``"t1"``, …, and every lookup
accepts either form.

Everything round-trips through JSON (:meth:`ThreadStore.to_json` /
:meth:`ThreadStore.from_json`).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr

from .._errors import InvalidArgumentError
from .._types import DeferredModel, complete
from ._branches import current_recorder, recording, report_change, tick
from ._changes import Change
from ._jsondata import check_text

__all__ = [
    "Message",
    "MessageContent",
    "MessageThread",
    "QueuedMessage",
    "ThreadInfo",
    "ThreadStore",
    "ThreadStoreData",
]

Role = Literal["system", "user", "assistant", "tool"]
_ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
MessageContent = str | list[dict[str, Any]]
"""Text, or a list of provider content parts (``{"type": "text", ...}``, images, …)."""


THREAD_CHANGE_KINDS = frozenset({"new", "push", "queue", "take"})
"""The changes a thread reports (``apply_change`` replays them)."""


class Message(DeferredModel):
    """One message of a thread. Immutable.

    An assistant message that called tools carries them in ``tool_calls`` (the OpenAI shape
    providers accept back: ``{"id", "type": "function", "function": {"name",
    "arguments"}}``); a ``tool`` message is one call's result, naming it by
    ``tool_call_id``.
    """

    model_config = ConfigDict(frozen=True)

    role: Role
    content: MessageContent
    label: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @classmethod
    def trusted(
        cls,
        role: Role,
        content: MessageContent,
        label: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        tool_call_id: str | None = None,
        name: str | None = None,
    ) -> Message:
        """A message of values this package built or checked itself, without validation.

        What ``model_construct`` does for a complete set of fields, several times faster:
        each LLM call puts two messages on its thread.
        """
        if not cls.__pydantic_complete__:  # no instance of an unbuilt class (DeferredModel)
            complete(cls)
        message = cls.__new__(cls)
        _set(
            message,
            "__dict__",
            {
                "role": role,
                "content": content,
                "label": label,
                "tool_calls": tool_calls,
                "tool_call_id": tool_call_id,
                "name": name,
            },
        )
        _set(message, "__pydantic_fields_set__", set(_MESSAGE_FIELDS))
        _set(message, "__pydantic_extra__", None)
        _set(message, "__pydantic_private__", None)
        return message

    def changed(self) -> dict[str, Any]:
        """The message as a thread's ``push`` change records it: ``model_dump`` without the
        fields left at their default (``None``); a text message's dict is built directly (it
        is on every LLM call)."""
        data = self.__dict__
        if type(data["content"]) is not str or data["tool_calls"] is not None:
            return self.model_dump(exclude_defaults=True)
        change: dict[str, Any] = {"role": data["role"], "content": data["content"]}
        for field in _TEXT_FIELDS:
            value = data[field]
            if value is not None:
                change[field] = value
        return change

    def to_llm(self) -> dict[str, Any]:
        """The ``{"role", "content"}`` dict (with tool fields when set) providers expect."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


_set = object.__setattr__
_MESSAGE_FIELDS: frozenset[str] = frozenset(Message.model_fields)
_TEXT_FIELDS = ("label", "tool_call_id", "name")
"""The optional fields of a message that are strings (or ``None``, their default)."""


class QueuedMessage(DeferredModel):
    """A message waiting on its thread for the thread's next LLM request."""

    model_config = ConfigDict(frozen=True)

    role: Literal["user", "assistant"] = "user"
    content: MessageContent
    label: str | None = None


class MessageThread(DeferredModel):
    """An ordered list of messages, plus messages queued for the next LLM request.

    :meth:`push` is the only way messages are appended, so everything that must observe new
    messages (the journal, for one) has a single place to look.
    """

    model_config = ConfigDict()

    id: str
    messages: list[Message] = Field(default_factory=list)
    parent_id: str | None = None
    hidden: bool = False
    label: str | None = None
    summary: str | None = None
    repairs: int = 0
    queued_messages: list[QueuedMessage] = Field(default_factory=list)

    _llm_source: list[Message] | None = PrivateAttr(default=None)
    _llm_built: list[dict[str, Any]] | None = PrivateAttr(default=None)
    _llm_checked: list[dict[str, Any]] | None = PrivateAttr(default=None)
    _llm_last: Message | None = PrivateAttr(default=None)

    @property
    def slug(self) -> str:
        """The public id of this thread, ``"t<id>"``."""
        return f"t{self.id}"

    def push(self, message: Message, label: str | None = None) -> None:
        """Append ``message`` (with ``label`` replacing its label when given)."""
        if not isinstance(message, Message):
            raise InvalidArgumentError(
                f"MessageThread.push expects a Message, got {type(message).__name__}; "
                'build one with Message(role="user", content="...")'
            )
        if label is not None:
            message = message.model_copy(update={"label": label})
        self.messages.append(message)
        recorder = current_recorder()  # recording() and report_change(), with one look
        if recorder is not None and recorder.changes is not None:
            recorder.changes.append(["push", self.id, message.changed()])

    def add(self, role: Role, content: MessageContent, label: str | None = None) -> Message:
        """Build a message from ``role`` and ``content``, push it and return it."""
        if role not in _ROLES:
            raise InvalidArgumentError(f"role must be one of {', '.join(_ROLES)}, got {role!r}")
        _check_content(content, "content")
        message = Message.trusted(role, content, label)
        self.push(message)
        return message

    def get_messages(self) -> list[Message]:
        """A copy of the thread's messages, oldest first."""
        return list(self.messages)

    def queue_message(
        self,
        content: MessageContent,
        role: Literal["user", "assistant"] = "user",
        label: str | None = None,
    ) -> None:
        """Queue a message for delivery before this thread's next LLM request.

        Queued messages are delivered in FIFO order, once, ahead of the next prompt; they are
        never delivered on validation or guard retries. ``role`` is ``"user"`` or
        ``"assistant"``; assistant content must be a string.
        """
        if role not in ("user", "assistant"):
            raise InvalidArgumentError(
                f'queue_message: role must be "user" or "assistant" (got {role!r})'
            )
        if role == "assistant" and not isinstance(content, str):
            raise InvalidArgumentError(
                "queue_message: assistant-role queued messages must have string content"
            )
        _check_content(content, "queue_message: content")
        queued = QueuedMessage.model_construct(role=role, content=content, label=label)
        self.queued_messages.append(queued)
        if recording():
            report_change(["queue", self.id, queued.model_dump()])

    def take_queued(self) -> list[QueuedMessage]:
        """Remove and return every queued message, oldest first (used by LLM delivery)."""
        queued, self.queued_messages = self.queued_messages, []
        if queued:
            report_change(["take", self.id])
        return queued

    def to_llm_messages(self) -> list[dict[str, Any]]:
        """The thread as the ``messages`` list an LLM provider expects (fresh dicts)."""
        return list(map(dict.copy, self._llm_dicts()))

    def request_messages(self) -> list[dict[str, Any]]:
        """:meth:`to_llm_messages` for a provider request: a fresh list of the thread's own
        provider dicts, not copies of them (a long thread would copy hundreds per call).

        A provider must not change them (:attr:`ChatRequest.messages
        <agency_runtime._llm._provider.ChatRequest.messages>`); should one change one anyway,
        the next call notices and builds them again, so the change never reaches a later
        request.
        """
        return list(self._llm_dicts())

    def _llm_dicts(self) -> list[dict[str, Any]]:
        """The provider dicts of the thread's messages, kept between calls.

        Each message's dict is built once, with a private copy to check it against: the
        cache starts over when the messages were replaced, shrunk or their last one swapped,
        or when a dict no longer equals its copy (someone changed it). The check is one
        comparison of two lists, without building anything.
        """
        messages = self.messages
        # The cache is read from pydantic's dict of private attributes at once: reading
        # them as attributes goes through BaseModel.__getattr__, a few µs each.
        cache = self.__pydantic_private__
        if cache is None:  # pragma: no cover - pydantic sets it up for every instance
            cache = {}
            object.__setattr__(self, "__pydantic_private__", cache)
        built: list[dict[str, Any]] | None = cache.get("_llm_built")
        count = 0 if built is None else len(built)
        if (
            built is None
            or cache.get("_llm_source") is not messages
            or count > len(messages)
            or (count and messages[count - 1] is not cache.get("_llm_last"))
            or built != cache.get("_llm_checked")
        ):
            built, count = [], 0
            cache["_llm_source"], cache["_llm_built"], cache["_llm_checked"] = messages, built, []
        checked: list[dict[str, Any]] = cache["_llm_checked"]
        for message in messages[count:]:
            item = message.to_llm()
            built.append(item)
            checked.append(item.copy())
        if messages:
            cache["_llm_last"] = messages[-1]
        return built


def _check_content(content: object, what: str) -> None:
    if isinstance(content, str):
        check_text(content, what)
        return
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        return
    raise InvalidArgumentError(
        f"{what} must be a string or a list of content-part dicts, got {type(content).__name__}"
    )


class ThreadInfo(DeferredModel):
    """A summary of one thread, as listed by ``agency.threads.list()``."""

    model_config = ConfigDict()

    id: str
    parent_id: str | None
    thread_type: Literal["thread", "subthread"]
    message_count: int
    is_active: bool
    messages: list[Message]
    label: str | None
    summary: str | None


class ThreadStoreData(DeferredModel):
    """The JSON form of a :class:`ThreadStore` (its registry and its active stack)."""

    model_config = ConfigDict()

    threads: dict[str, MessageThread] = Field(default_factory=dict)
    counter: int = 0
    active_stack: list[str] = Field(default_factory=list)


class _Registry:
    """The threads of one run, shared by every :class:`ThreadStore` view over them.

    Thread ids are counted like everything else a run counts (see
    :mod:`agency_runtime._core._branches`): the run's own task numbers its threads ``"0"``,
    ``"1"``, …; a concurrent branch numbers its own, qualified by its name (``"0.1:0"``), so
    a replay hands each branch the threads it had, however the branches interleave.
    """

    __slots__ = ("branch_counters", "counter", "threads")

    def __init__(self, threads: dict[str, MessageThread] | None = None, counter: int = 0):
        self.threads: dict[str, MessageThread] = threads if threads is not None else {}
        self.counter = counter
        self.branch_counters: dict[str, int] = {}
        for thread_id in self.threads:
            self.seen(thread_id)

    def new_id(self) -> str:
        branch = tick("")
        if branch:
            ordinal = self.branch_counters.get(branch, 0)
            self.branch_counters[branch] = ordinal + 1
            return f"{branch}:{ordinal}"
        thread_id = str(self.counter)
        self.counter += 1
        return thread_id

    def seen(self, thread_id: str) -> None:
        """Count ``thread_id`` as used (a thread replayed or restored with that id)."""
        if thread_id.isdigit():
            self.counter = max(self.counter, int(thread_id) + 1)
            return
        branch, _, ordinal = thread_id.rpartition(":")
        if branch and ordinal.isdigit():
            used = self.branch_counters.get(branch, 0)
            self.branch_counters[branch] = max(used, int(ordinal) + 1)


def normalize_thread_id(thread_id: str | int) -> str:
    """Accept ``"t3"``, ``"3"`` or ``3`` and return the canonical id ``"3"``.

    A branch's thread (``"t0.1:0"``) loses its ``t`` the same way.
    """
    if isinstance(thread_id, bool) or not isinstance(thread_id, str | int):
        raise InvalidArgumentError(
            f'a thread id is a string like "t3" or "3", got {type(thread_id).__name__}'
        )
    text = str(thread_id).strip()
    if text.startswith("t") and re.compile(_COUNTED_ID).match(text, 1):
        return text[1:]
    return text


_COUNTED_ID = r"(?:\d+|[\d?\[][^:]*:\d+)\Z"  # compiled (and cached by re) on first use
"""A counted thread id: ``"3"``, or a branch's ``"0.1:0"``."""


class ThreadStore:
    """The message threads of a run, with a stack of active thread ids.

    ``ThreadStore()`` is empty with no active thread; :meth:`with_default_active` creates
    thread ``"0"`` and makes it active (what a run starts with).
    """

    __slots__ = ("_active", "_registry")

    def __init__(self) -> None:
        self._registry = _Registry()
        self._active: list[str] = []

    @classmethod
    def with_default_active(cls) -> ThreadStore:
        """A new store with one empty thread, ``"0"``, active."""
        store = cls()
        store.push_active(store.create())
        return store

    # -- creating and reading threads ------------------------------------------------------

    def create(self, *, label: str | None = None, hidden: bool = False) -> str:
        """Create an empty thread and return its id (it is not made active)."""
        thread_id = self._registry.new_id()
        self._registry.threads[thread_id] = MessageThread(id=thread_id, label=label, hidden=hidden)
        report_change(["new", thread_id, None, label, hidden, None])
        return thread_id

    def create_subthread(self, *, label: str | None = None) -> str:
        """Create a thread holding a copy of the active thread's messages; return its id.

        The new thread's ``parent_id`` is the active thread's id (``None`` when no thread is
        active, in which case the new thread is empty).
        """
        parent = self.active()
        thread_id = self._registry.new_id()
        thread = MessageThread(id=thread_id, label=label)
        if parent is not None:
            thread.messages = list(parent.messages)
            thread.parent_id = parent.id
        self._registry.threads[thread_id] = thread
        if recording():
            copied = [m.model_dump(exclude_defaults=True) for m in thread.messages]
            report_change(["new", thread_id, thread.parent_id, label, False, copied])
        return thread_id

    def ensure(self, thread_id: str | int) -> MessageThread:
        """The thread with this id, created empty under exactly that id when it is new.

        What ``agency.thread.with_(id)`` / ``use(id)`` do with an id not created yet, as the
        original's ``pushActive`` does.
        """
        existing = self.get_maybe(thread_id)
        if existing is not None:
            return existing
        key = normalize_thread_id(thread_id)
        if not key:
            raise InvalidArgumentError("a thread id cannot be empty")
        thread = MessageThread(id=key)
        self._registry.threads[key] = thread
        self._registry.seen(key)
        report_change(["new", key, None, None, False, None])
        return thread

    def get(self, thread_id: str | int) -> MessageThread:
        """The thread with this id (``"t3"`` or ``"3"``); raises if there is none."""
        thread = self.get_maybe(thread_id)
        if thread is None:
            known = ", ".join(f"t{key}" for key in self._registry.threads) or "none"
            raise InvalidArgumentError(
                f"no thread {thread_id!r} in this store (known threads: {known}); "
                "create one with ThreadStore.create()"
            )
        return thread

    def get_maybe(self, thread_id: str | int) -> MessageThread | None:
        """The thread with this id, or ``None``."""
        return self._registry.threads.get(normalize_thread_id(thread_id))

    def __contains__(self, thread_id: object) -> bool:
        if not isinstance(thread_id, str | int) or isinstance(thread_id, bool):
            return False
        return normalize_thread_id(thread_id) in self._registry.threads

    def __len__(self) -> int:
        return len(self._registry.threads)

    def ids(self) -> list[str]:
        """Every thread id, in creation order."""
        return list(self._registry.threads)

    # -- the active stack ------------------------------------------------------------------

    def push_active(self, thread_id: str | int) -> None:
        """Make ``thread_id`` the active thread (it must exist)."""
        self._active.append(self.get(thread_id).id)

    def pop_active(self) -> str | None:
        """Drop the active thread id and return it (``None`` when the stack is empty)."""
        return self._active.pop() if self._active else None

    def active_id(self) -> str | None:
        """The active thread's id, or ``None``."""
        return self._active[-1] if self._active else None

    def active(self) -> MessageThread | None:
        """The active thread, or ``None``."""
        return self._registry.threads[self._active[-1]] if self._active else None

    def get_or_create_active(self) -> MessageThread:
        """The active thread; when none is active, create one and make it active."""
        thread = self.active()
        if thread is None:
            thread_id = self.create()
            self._active.append(thread_id)
            thread = self._registry.threads[thread_id]
        return thread

    def view(self, active_id: str | int | None = None) -> ThreadStore:
        """A new view over the same threads with a copy of this view's active stack.

        When ``active_id`` is given it is pushed on the new view's stack, so a scoped switch
        never disturbs this view.
        """
        view = ThreadStore.__new__(ThreadStore)
        view._registry = self._registry
        view._active = list(self._active)
        if active_id is not None:
            view.push_active(active_id)
        return view

    def view_creating(self, active_id: str | int) -> ThreadStore:
        """:meth:`view` that first creates ``active_id`` (empty) when it does not exist."""
        self.ensure(active_id)
        return self.view(active_id)

    def apply_change(self, change: Change) -> None:
        """Apply one thread change recorded by a journaled step (see :mod:`._changes`).

        Raises ``ValueError``/``KeyError`` for a change this store cannot apply.
        """
        threads = self._registry.threads
        kind, thread_id = change[0], change[1]
        if kind == "new":
            _, _, parent_id, label, hidden, messages = change
            thread = MessageThread(id=thread_id, parent_id=parent_id, label=label, hidden=hidden)
            if messages:
                thread.messages = [Message.model_validate(m) for m in messages]
            threads[thread_id] = thread
            self._registry.seen(thread_id)
        elif kind == "push":
            threads[thread_id].messages.append(Message.model_validate(change[2]))
        elif kind == "queue":
            threads[thread_id].queued_messages.append(QueuedMessage.model_validate(change[2]))
        elif kind == "take":
            threads[thread_id].queued_messages = []
        else:
            raise ValueError(f"unknown thread change {kind!r}")

    # -- listing ---------------------------------------------------------------------------

    def list_info(self) -> list[ThreadInfo]:
        """A summary of every visible (non-hidden) thread, in creation order."""
        active = self.active_id()
        return [
            ThreadInfo(
                id=thread.slug,
                parent_id=None if thread.parent_id is None else f"t{thread.parent_id}",
                thread_type="thread" if thread.parent_id is None else "subthread",
                message_count=len(thread.messages),
                is_active=thread.id == active,
                messages=list(thread.messages),
                label=thread.label,
                summary=thread.summary,
            )
            for thread in self._registry.threads.values()
            if not thread.hidden
        ]

    # -- JSON ------------------------------------------------------------------------------

    def to_data(self) -> ThreadStoreData:
        """A deep copy of the store as a pydantic model."""
        return ThreadStoreData(
            threads={
                key: thread.model_copy(deep=True) for key, thread in self._registry.threads.items()
            },
            counter=self._registry.counter,
            active_stack=list(self._active),
        )

    def to_json(self) -> str:
        """The store as compact JSON (empty queues, zero repairs and null labels omitted)."""
        return self.to_data().model_dump_json(exclude_defaults=True)

    @classmethod
    def from_data(cls, data: ThreadStoreData) -> ThreadStore:
        """Rebuild a store from :meth:`to_data` output (the data is copied)."""
        store = cls()
        threads = {key: thread.model_copy(deep=True) for key, thread in data.threads.items()}
        for key, thread in threads.items():
            if thread.id != key:
                raise InvalidArgumentError(f"thread stored under {key!r} has id {thread.id!r}")
        for thread_id in data.active_stack:
            if thread_id not in threads:
                raise InvalidArgumentError(
                    f"active thread {thread_id!r} is not in the stored threads"
                )
        numeric = [int(key) for key in threads if key.isdigit()]
        counter = max([data.counter, *(n + 1 for n in numeric)])
        store._registry = _Registry(threads, counter)
        store._active = list(data.active_stack)
        return store

    @classmethod
    def from_json(cls, text: str | bytes) -> ThreadStore:
        """Rebuild a store from :meth:`to_json` output."""
        return cls.from_data(ThreadStoreData.model_validate_json(text))

    def __repr__(self) -> str:
        return f"<ThreadStore threads={len(self)} active={self.active_id()!r}>"
