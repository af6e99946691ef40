"""Unit tests of Message, MessageThread and ThreadStore (spec §3)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from agency_runtime import (
    AgencyError,
    InvalidArgumentError,
    Message,
    MessageThread,
    QueuedMessage,
    ThreadStore,
)
from agency_runtime._core._threads import normalize_thread_id

# -- Message -------------------------------------------------------------------------------


def test_message_defaults_and_to_llm() -> None:
    message = Message(role="user", content="hi")
    assert message.label is None
    assert message.to_llm() == {"role": "user", "content": "hi"}


def test_message_to_llm_drops_label_and_keeps_content_parts() -> None:
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]
    message = Message(role="user", content=parts, label="pic")
    assert message.to_llm() == {"role": "user", "content": parts}


def test_message_is_frozen() -> None:
    message = Message(role="user", content="hi")
    with pytest.raises(ValueError, match="frozen"):
        message.content = "changed"  # type: ignore[misc]
    assert message.content == "hi"


def test_message_rejects_unknown_role() -> None:
    with pytest.raises(ValueError, match="role"):
        Message(role="robot", content="hi")  # type: ignore[arg-type]


# -- MessageThread: push / add / get_messages ----------------------------------------------


def test_new_thread_is_empty() -> None:
    thread = MessageThread(id="7")
    assert thread.messages == []
    assert thread.queued_messages == []
    assert thread.parent_id is None
    assert thread.hidden is False
    assert thread.repairs == 0
    assert thread.slug == "t7"


def test_push_appends_in_order() -> None:
    thread = MessageThread(id="0")
    first = Message(role="system", content="be brief")
    second = Message(role="user", content="hello")
    thread.push(first)
    thread.push(second)
    assert thread.messages == [first, second]
    assert thread.to_llm_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]


def test_push_with_label_replaces_label_without_mutating_original() -> None:
    thread = MessageThread(id="0")
    original = Message(role="user", content="hi", label="old")
    thread.push(original, label="new")
    assert thread.messages[0].label == "new"
    assert thread.messages[0].content == "hi"
    assert thread.messages[0].role == "user"
    assert original.label == "old"


def test_push_without_label_keeps_message_label() -> None:
    thread = MessageThread(id="0")
    thread.push(Message(role="assistant", content="ok", label="kept"))
    assert thread.messages[0].label == "kept"


def test_push_rejects_non_message() -> None:
    thread = MessageThread(id="0")
    with pytest.raises(InvalidArgumentError, match="Message"):
        thread.push({"role": "user", "content": "hi"})  # type: ignore[arg-type]
    assert thread.messages == []


def test_add_builds_pushes_and_returns_message() -> None:
    thread = MessageThread(id="0")
    message = thread.add("user", "hi", label="greeting")
    assert message == Message(role="user", content="hi", label="greeting")
    assert thread.messages == [message]


def test_add_goes_through_push(monkeypatch: pytest.MonkeyPatch) -> None:
    """push is the only append: add() must call it."""
    pushed: list[Message] = []
    original_push = MessageThread.push

    def spy(self: MessageThread, message: Message, label: str | None = None) -> None:
        pushed.append(message)
        original_push(self, message, label)

    monkeypatch.setattr(MessageThread, "push", spy)
    thread = MessageThread(id="0")
    thread.add("assistant", "answer")
    assert [m.content for m in pushed] == ["answer"]
    assert thread.messages == pushed


def test_add_accepts_content_parts() -> None:
    thread = MessageThread(id="0")
    parts = [{"type": "text", "text": "hello"}]
    thread.add("user", parts)
    assert thread.messages[0].content == parts


@pytest.mark.parametrize("bad", [42, None, {"type": "text"}, ["not a dict"]])
def test_add_rejects_bad_content(bad: Any) -> None:
    thread = MessageThread(id="0")
    with pytest.raises(InvalidArgumentError, match="content must be a string") as info:
        thread.add("user", bad)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, AgencyError)
    assert thread.messages == []


def test_add_rejects_unknown_role() -> None:
    thread = MessageThread(id="0")
    with pytest.raises(InvalidArgumentError, match="role must be one of"):
        thread.add("robot", "hi")  # type: ignore[arg-type]
    assert thread.messages == []


def test_get_messages_returns_a_copy() -> None:
    thread = MessageThread(id="0")
    thread.add("user", "one")
    copy = thread.get_messages()
    assert copy == thread.messages
    assert copy is not thread.messages
    copy.append(Message(role="user", content="sneaky"))
    copy.clear()
    assert [m.content for m in thread.messages] == ["one"]


# -- MessageThread: queue_message / take_queued --------------------------------------------


def test_queue_message_default_role_is_user() -> None:
    thread = MessageThread(id="0")
    thread.queue_message("later")
    assert thread.queued_messages == [QueuedMessage(role="user", content="later", label=None)]
    assert thread.messages == []


def test_queue_message_is_fifo_and_keeps_roles_and_labels() -> None:
    thread = MessageThread(id="0")
    thread.queue_message("first", label="a")
    thread.queue_message("second", role="assistant")
    thread.queue_message([{"type": "text", "text": "third"}], role="user", label="c")
    queued = thread.take_queued()
    assert [(q.role, q.content, q.label) for q in queued] == [
        ("user", "first", "a"),
        ("assistant", "second", None),
        ("user", [{"type": "text", "text": "third"}], "c"),
    ]


def test_queue_message_assistant_content_must_be_str() -> None:
    thread = MessageThread(id="0")
    with pytest.raises(
        InvalidArgumentError,
        match="queue_message: assistant-role queued messages must have string content",
    ) as info:
        thread.queue_message([{"type": "text", "text": "x"}], role="assistant")
    assert isinstance(info.value, ValueError)
    assert thread.queued_messages == []


def test_queue_message_rejects_system_role_with_spec_message() -> None:
    thread = MessageThread(id="0")
    with pytest.raises(InvalidArgumentError) as info:
        thread.queue_message("x", role="system")  # type: ignore[arg-type]
    assert str(info.value) == 'queue_message: role must be "user" or "assistant" (got \'system\')'
    assert isinstance(info.value, ValueError)
    assert thread.queued_messages == []


@pytest.mark.parametrize("bad", [3, None, ["text"]])
def test_queue_message_rejects_bad_user_content(bad: Any) -> None:
    thread = MessageThread(id="0")
    with pytest.raises(InvalidArgumentError, match="queue_message: content must be"):
        thread.queue_message(bad)
    assert thread.queued_messages == []


def test_take_queued_empties_the_queue() -> None:
    thread = MessageThread(id="0")
    thread.queue_message("a")
    thread.queue_message("b")
    taken = thread.take_queued()
    assert [q.content for q in taken] == ["a", "b"]
    assert thread.queued_messages == []
    assert thread.take_queued() == []
    # Queued messages are not thread messages.
    assert thread.messages == []


# -- ThreadStore: ids, creation, active stack ----------------------------------------------


def test_empty_store_has_no_active_thread() -> None:
    store = ThreadStore()
    assert len(store) == 0
    assert store.active() is None
    assert store.active_id() is None
    assert store.pop_active() is None


def test_create_uses_counter_ids_and_does_not_activate() -> None:
    store = ThreadStore()
    assert store.create() == "0"
    assert store.create() == "1"
    assert store.create(label="x") == "2"
    assert store.ids() == ["0", "1", "2"]
    assert store.active() is None
    assert store.get("2").label == "x"
    assert store.get("0").messages == []


def test_with_default_active_creates_and_activates_thread_zero() -> None:
    store = ThreadStore.with_default_active()
    assert store.ids() == ["0"]
    assert store.active_id() == "0"
    active = store.active()
    assert active is not None
    assert active.id == "0"
    assert active.messages == []
    assert store.create() == "1"


def test_push_and_pop_active() -> None:
    store = ThreadStore.with_default_active()
    one = store.create()
    store.push_active(one)
    assert store.active_id() == "1"
    store.push_active("t0")
    assert store.active_id() == "0"
    assert store.pop_active() == "0"
    assert store.active_id() == "1"
    assert store.pop_active() == "1"
    assert store.active_id() == "0"
    assert store.pop_active() == "0"
    assert store.active() is None
    assert store.pop_active() is None


def test_push_active_normalizes_slug() -> None:
    store = ThreadStore()
    store.create()
    store.create()
    store.push_active("t1")
    assert store.active_id() == "1"
    store.push_active(0)
    assert store.active_id() == "0"


def test_push_active_unknown_id_raises() -> None:
    store = ThreadStore.with_default_active()
    with pytest.raises(InvalidArgumentError, match="no thread '9'"):
        store.push_active("9")
    assert store.active_id() == "0"


def test_get_or_create_active_creates_and_pushes_when_none() -> None:
    store = ThreadStore()
    thread = store.get_or_create_active()
    assert thread.id == "0"
    assert store.active_id() == "0"
    assert store.ids() == ["0"]
    # Second call returns the same thread without creating another.
    assert store.get_or_create_active() is thread
    assert store.ids() == ["0"]


def test_get_or_create_active_returns_existing_active() -> None:
    store = ThreadStore.with_default_active()
    store.create()
    store.push_active("1")
    assert store.get_or_create_active().id == "1"
    assert len(store) == 2


def test_create_subthread_clones_active_messages_and_sets_parent() -> None:
    store = ThreadStore.with_default_active()
    parent = store.get("0")
    parent.add("system", "sys")
    parent.add("user", "hi", label="q")
    sub_id = store.create_subthread(label="side")
    sub = store.get(sub_id)
    assert sub_id == "1"
    assert sub.parent_id == "0"
    assert sub.label == "side"
    assert sub.messages == parent.messages
    assert sub.messages is not parent.messages
    # create_subthread does not activate the new thread.
    assert store.active_id() == "0"


def test_subthread_messages_are_independent_afterwards() -> None:
    store = ThreadStore.with_default_active()
    parent = store.get("0")
    parent.add("user", "shared")
    sub = store.get(store.create_subthread())
    sub.add("assistant", "only in sub")
    parent.add("user", "only in parent")
    assert [m.content for m in parent.messages] == ["shared", "only in parent"]
    assert [m.content for m in sub.messages] == ["shared", "only in sub"]


def test_create_subthread_does_not_copy_queue() -> None:
    store = ThreadStore.with_default_active()
    store.get("0").queue_message("pending")
    sub = store.get(store.create_subthread())
    assert sub.queued_messages == []
    assert [q.content for q in store.get("0").queued_messages] == ["pending"]


def test_create_subthread_without_active_is_empty_root() -> None:
    store = ThreadStore()
    sub = store.get(store.create_subthread())
    assert sub.parent_id is None
    assert sub.messages == []


# -- ThreadStore: lookups ------------------------------------------------------------------


@pytest.mark.parametrize("key", ["t3", "3", 3])
def test_get_accepts_slug_string_and_int(key: str | int) -> None:
    store = ThreadStore()
    for _ in range(4):
        store.create()
    assert store.get(key).id == "3"
    assert store.get_maybe(key) is store.get("3")
    assert key in store


def test_normalize_thread_id() -> None:
    assert normalize_thread_id("t3") == "3"
    assert normalize_thread_id("3") == "3"
    assert normalize_thread_id(3) == "3"
    with pytest.raises(InvalidArgumentError, match="thread id"):
        normalize_thread_id(True)
    with pytest.raises(InvalidArgumentError, match="thread id"):
        normalize_thread_id(3.0)  # type: ignore[arg-type]


def test_get_unknown_lists_known_threads() -> None:
    store = ThreadStore()
    store.create()
    store.create()
    with pytest.raises(InvalidArgumentError) as info:
        store.get("t5")
    message = str(info.value)
    assert "'t5'" in message
    assert "t0, t1" in message
    assert isinstance(info.value, ValueError)


def test_get_unknown_on_empty_store_says_none() -> None:
    with pytest.raises(InvalidArgumentError, match="known threads: none"):
        ThreadStore().get("0")


def test_get_maybe_returns_none_for_unknown() -> None:
    store = ThreadStore.with_default_active()
    assert store.get_maybe("t1") is None
    assert store.get_maybe(42) is None
    assert "t1" not in store
    assert None not in store


# -- ThreadStore: views --------------------------------------------------------------------


def test_view_shares_registry_but_has_own_active_stack() -> None:
    store = ThreadStore.with_default_active()
    store.create()
    view = store.view("1")
    assert view.active_id() == "1"
    assert store.active_id() == "0"

    created = view.create()
    assert created == "2"
    assert "2" in store
    assert store.get("2") is view.get("2")

    view.get("1").add("user", "via view")
    assert [m.content for m in store.get("1").messages] == ["via view"]

    view.pop_active()
    assert view.active_id() == "0"
    view.pop_active()
    assert view.active_id() is None
    assert store.active_id() == "0"

    store.push_active("2")
    assert view.active_id() is None


def test_view_without_active_id_copies_stack() -> None:
    store = ThreadStore.with_default_active()
    view = store.view()
    assert view.active_id() == "0"
    view.push_active(view.create())
    assert view.active_id() == "1"
    assert store.active_id() == "0"
    # Counter is shared too: the next id from either side continues.
    assert store.create() == "2"


def test_view_of_unknown_thread_raises() -> None:
    store = ThreadStore.with_default_active()
    with pytest.raises(InvalidArgumentError):
        store.view("t9")


# -- ThreadStore: list_info ----------------------------------------------------------------


def test_list_info() -> None:
    store = ThreadStore.with_default_active()
    store.get("0").add("user", "hi")
    store.get("0").add("assistant", "hello")
    store.create(hidden=True)  # "1", skipped
    sub_id = store.create_subthread(label="sub")  # "2"
    store.get(sub_id).summary = "a summary"

    infos = store.list_info()
    assert [i.id for i in infos] == ["t0", "t2"]

    root, sub = infos
    assert root.parent_id is None
    assert root.thread_type == "thread"
    assert root.is_active is True
    assert root.message_count == 2
    assert [m.content for m in root.messages] == ["hi", "hello"]
    assert root.label is None

    assert sub.parent_id == "t0"
    assert sub.thread_type == "subthread"
    assert sub.is_active is False
    assert sub.message_count == 2
    assert sub.label == "sub"
    assert sub.summary == "a summary"

    store.push_active(sub_id)
    assert [i.is_active for i in store.list_info()] == [False, True]


def test_list_info_messages_are_a_copy() -> None:
    store = ThreadStore.with_default_active()
    store.get("0").add("user", "hi")
    info = store.list_info()[0]
    info.messages.clear()
    assert len(store.get("0").messages) == 1


# -- ThreadStore: JSON ---------------------------------------------------------------------


def _populated_store() -> ThreadStore:
    store = ThreadStore.with_default_active()
    root = store.get("0")
    root.add("system", "sys")
    root.add("user", "hi", label="greeting")
    root.add("user", [{"type": "text", "text": "parts"}])
    root.queue_message("q1", label="ql")
    root.queue_message("q2", role="assistant")
    store.create(hidden=True, label="hidden one")
    sub_id = store.create_subthread(label="sub")
    store.get(sub_id).add("assistant", "sub only")
    store.get(sub_id).summary = "summary"
    store.get(sub_id).repairs = 2
    store.push_active(sub_id)
    return store


def test_json_round_trip_preserves_everything() -> None:
    store = _populated_store()
    restored = ThreadStore.from_json(store.to_json())

    assert restored.ids() == store.ids()
    assert restored.active_id() == "2"
    assert restored.pop_active() == "2"
    assert restored.active_id() == "0"

    root = restored.get("0")
    assert root.messages == store.get("0").messages
    assert [m.label for m in root.messages] == [None, "greeting", None]
    assert root.messages[2].content == [{"type": "text", "text": "parts"}]
    assert [(q.role, q.content, q.label) for q in root.queued_messages] == [
        ("user", "q1", "ql"),
        ("assistant", "q2", None),
    ]

    hidden = restored.get("1")
    assert hidden.hidden is True
    assert hidden.label == "hidden one"

    sub = restored.get("2")
    assert sub.parent_id == "0"
    assert sub.label == "sub"
    assert sub.summary == "summary"
    assert sub.repairs == 2
    assert sub.messages == store.get("2").messages
    assert [m.role for m in sub.messages] == ["system", "user", "user", "assistant"]
    assert sub.messages[-1].content == "sub only"

    # Same JSON again after the round trip.
    assert json.loads(ThreadStore.from_json(store.to_json()).to_json()) == json.loads(
        store.to_json()
    )


def test_json_round_trip_is_a_deep_copy() -> None:
    store = _populated_store()
    restored = ThreadStore.from_json(store.to_json())
    restored.get("0").add("user", "new")
    restored.get("0").take_queued()
    assert len(store.get("0").messages) == 3
    assert len(store.get("0").queued_messages) == 2


def test_json_round_trip_preserves_counter() -> None:
    store = ThreadStore()
    store.create()
    store.create()
    data = json.loads(store.to_json())
    assert data["counter"] == 2
    restored = ThreadStore.from_json(store.to_json())
    assert restored.create() == "2"


def test_json_omits_empty_queue_zero_repairs_and_null_labels() -> None:
    store = ThreadStore.with_default_active()
    store.get("0").add("user", "hi")
    store.get("0").add("assistant", "yo", label="kept")
    data = json.loads(store.to_json())
    thread = data["threads"]["0"]
    assert "queued_messages" not in thread
    assert "repairs" not in thread
    assert "label" not in thread
    assert "label" not in thread["messages"][0]
    assert thread["messages"][0] == {"role": "user", "content": "hi"}
    assert thread["messages"][1] == {"role": "assistant", "content": "yo", "label": "kept"}
    assert data["active_stack"] == ["0"]


def test_json_keeps_nonzero_repairs_and_queue() -> None:
    store = ThreadStore.with_default_active()
    thread = store.get("0")
    thread.repairs = 1
    thread.queue_message("later", label="x")
    data = json.loads(store.to_json())["threads"]["0"]
    assert data["repairs"] == 1
    assert len(data["queued_messages"]) == 1
    assert data["queued_messages"][0]["content"] == "later"
    assert data["queued_messages"][0]["label"] == "x"


def test_json_unchanged_after_queue_is_emptied() -> None:
    store = ThreadStore.with_default_active()
    store.get("0").add("user", "hi")
    before = store.to_json()
    store.get("0").queue_message("later")
    assert store.to_json() != before
    store.get("0").take_queued()
    assert store.to_json() == before


def test_from_json_rejects_active_stack_naming_missing_thread() -> None:
    text = json.dumps({"threads": {"0": {"id": "0"}}, "counter": 1, "active_stack": ["0", "5"]})
    with pytest.raises(InvalidArgumentError, match="'5'"):
        ThreadStore.from_json(text)


def test_from_json_rejects_mismatched_thread_key() -> None:
    text = json.dumps({"threads": {"0": {"id": "1"}}, "counter": 2, "active_stack": []})
    with pytest.raises(InvalidArgumentError):
        ThreadStore.from_json(text)


def test_from_json_create_continues_counter_without_clobbering() -> None:
    store = _populated_store()
    restored = ThreadStore.from_json(store.to_json())
    new_id = restored.create()
    assert new_id == "3"
    assert [m.content for m in restored.get("0").messages][:2] == ["sys", "hi"]
    assert restored.get("2").label == "sub"


def test_from_json_with_stale_counter_does_not_clobber_ids() -> None:
    kept = {"id": "4", "messages": [{"role": "user", "content": "keep me"}]}
    text = json.dumps(
        {"threads": {"0": {"id": "0"}, "4": kept}, "counter": 1, "active_stack": ["4"]}
    )
    store = ThreadStore.from_json(text)
    ids = {store.create() for _ in range(5)}
    assert "4" not in ids
    assert "0" not in ids
    assert [m.content for m in store.get("4").messages] == ["keep me"]


def test_empty_store_json_round_trip() -> None:
    restored = ThreadStore.from_json(ThreadStore().to_json())
    assert len(restored) == 0
    assert restored.active() is None
    assert restored.create() == "0"


@pytest.mark.parametrize(
    "fields",
    [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "hi", "label": "greeting"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"},
    ],
)
def test_a_trusted_message_is_the_validated_one(fields: dict[str, Any]) -> None:
    trusted = Message.trusted(**fields)
    validated = Message(**fields)
    assert trusted == validated
    assert trusted.model_dump() == validated.model_dump()
    assert trusted.changed() == validated.model_dump(exclude_defaults=True)
    with pytest.raises(ValidationError):
        trusted.content = "changed"  # type: ignore[misc]  # frozen like any other


def test_request_messages_share_the_dicts_and_notice_a_change() -> None:
    thread = MessageThread(id="0")
    thread.add("user", "one")
    first = thread.request_messages()
    again = thread.request_messages()
    assert again is not first  # a fresh list …
    assert again[0] is first[0]  # … of the same dicts
    first[0]["content"] = "mutated by a provider"  # against ChatRequest's contract
    first[0]["name"] = "someone"
    thread.add("assistant", "two")
    expected = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]
    assert thread.request_messages() == expected
    assert thread.to_llm_messages() == expected
    assert first[0] is not thread.request_messages()[0]  # built again


def test_llm_messages_follow_every_change_to_the_thread() -> None:
    thread = MessageThread(id="0")
    thread.add("user", "one")
    first = thread.to_llm_messages()
    first[0]["content"] = "mutated by a provider"  # callers get copies
    thread.add("assistant", "two")
    assert thread.to_llm_messages() == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
    ]
    thread.messages = thread.messages[:1]  # replaced
    assert thread.to_llm_messages() == [{"role": "user", "content": "one"}]
    thread.messages.append(Message(role="user", content="three"))  # appended directly
    thread.messages[-1] = Message(role="user", content="four")  # last one replaced
    assert [m["content"] for m in thread.to_llm_messages()] == ["one", "four"]
    del thread.messages[1:]  # shrunk in place
    assert [m["content"] for m in thread.to_llm_messages()] == ["one"]
