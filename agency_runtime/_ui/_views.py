"""What the run inspector's pages show, built from stored records (no HTTP here).

Every text taken from the store is shown through a :class:`Clipper`: a value longer than its
field's limit is cut (with its full size, and a download link for the whole JSON), and one
page shows at most :data:`PAGE_BUDGET` characters of stored values in all, so a run with a
50 MB value or 10 000 steps still renders a page of bounded size. The journal is shown as a
timeline of :data:`JOURNAL_PAGE` items per page.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from agency_runtime import Checkpoint, Interrupt, JournalEntry, RunRecord

__all__ = [
    "JOURNAL_PAGE",
    "PAGE_BUDGET",
    "Clipper",
    "Item",
    "Shown",
    "Timeline",
    "build_timeline",
    "duration",
    "iso",
    "local_time",
    "outer_llm_call",
    "usd",
]

PICO_PER_USD = 10**12
VALUE_PREVIEW = 10_000
"""Characters of a run's arguments, value or error shown on its page."""
STEP_PREVIEW = 2_000
"""Characters of one step's result (or of one thread message) shown in the timeline."""
PAGE_BUDGET = 1_000_000
"""Characters of stored values one page shows in all; past it, values are only linked."""
JOURNAL_PAGE = 200
"""Timeline items per page."""
MAX_CHANGES = 50
"""Thread changes shown per step (the rest are counted, with a link to all of them)."""
CHANGE_COST = 200
"""What one shown change costs of the page's budget besides its text (its markup)."""
MAX_DELTAS = 1_000_000
"""A step's change list longer than this (characters of JSON) is not parsed for display."""

_NESTED_IN_LLM = re.compile(r"(?:^|[/:])llm#\d+/")


# -- formatting ----------------------------------------------------------------------------


def usd(pico: int) -> str:
    """Pico-dollars as ``$0.001200`` (6 decimals, exact)."""
    return f"${Decimal(pico) / PICO_PER_USD:.6f}"


def local_time(ts: float | None) -> str:
    """A POSIX time as a local ``YYYY-MM-DD HH:MM:SS``, or ``-``."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds")


def iso(ts: float | None) -> str:
    """A POSIX time as ISO 8601 UTC (for ``<time datetime=...>``), or ``""``."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def duration(seconds: float | None) -> str:
    """``12 ms``, ``1.24 s``, ``3 min 5 s``, ``2 h 3 min``, ``4 d 2 h`` (``-`` for none)."""
    if seconds is None or seconds < 0:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def size(n: int) -> str:
    """A byte count as ``812 bytes``, ``12.3 KB``, ``50.0 MB``."""
    if n < 1000:
        return f"{n} bytes"
    if n < 1_000_000:
        return f"{n / 1000:.1f} KB"
    return f"{n / 1_000_000:.1f} MB"


def arguments_line(text: str, limit: int = 200) -> str:
    """A run's stored ``{"args": [...], "kwargs": {...}}`` as ``"tea", qty=2`` (cut)."""
    if len(text) > 4 * limit:
        return text[:limit] + "…"
    try:
        data = json.loads(text)
        args = [json.dumps(a, ensure_ascii=False) for a in data.get("args", [])]
        kwargs = [
            f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in data.get("kwargs", {}).items()
        ]
        line = ", ".join(args + kwargs) or "(none)"
    except (ValueError, AttributeError, TypeError, RecursionError):
        line = text
    return line if len(line) <= limit else line[: limit - 1] + "…"


# -- clipping ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shown:
    """A stored text as a page shows it: maybe cut, with the size of the whole."""

    text: str
    bytes: int
    truncated: bool = False
    omitted: bool = False
    """Not shown at all: the page's budget was spent."""

    @property
    def size(self) -> str:
        return size(self.bytes)


class Clipper:
    """Cuts stored texts to their field's limit and to what is left of the page's budget."""

    def __init__(self, budget: int = PAGE_BUDGET) -> None:
        self.left = budget

    def text(self, text: str, limit: int = STEP_PREVIEW) -> Shown:
        """``text`` itself, cut to ``limit`` characters (and to the budget)."""
        room = min(limit, self.left)
        if len(text) <= room:
            self.left -= len(text)
            return Shown(text, _bytes(text))
        self.left -= room
        return Shown(text[:room], _bytes(text), truncated=True, omitted=room == 0)

    def json(self, text: str, limit: int = STEP_PREVIEW) -> Shown:
        """A stored JSON text, indented when it fits, else its first ``limit`` characters."""
        room = min(limit, self.left)
        if len(text) <= room:
            try:
                data = json.loads(text)
                pretty = (
                    data
                    if isinstance(data, str)
                    else json.dumps(data, indent=2, ensure_ascii=False)
                )
            except (ValueError, RecursionError):
                pretty = text
            if len(pretty) <= room:
                self.left -= len(pretty)
                return Shown(pretty, _bytes(text))
        return self.text(text, limit)

    def value(self, value: Any, limit: int = STEP_PREVIEW, *, compact: bool = False) -> Shown:
        """A decoded JSON value (a message's content, say): a string as it is, else JSON
        (indented, or on one line when ``compact``)."""
        if isinstance(value, str):
            return self.text(value, limit)
        try:
            text = json.dumps(value, indent=None if compact else 2, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            text = repr(value)
        return self.text(text, limit)


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


# -- the timeline --------------------------------------------------------------------------


@dataclass(slots=True)
class MessageView:
    """One thread message a step pushed."""

    thread: str
    role: str
    content: Shown | None
    name: str | None = None
    tool_calls: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Item:
    """One line of the timeline: a journal entry, a checkpoint or an interrupt."""

    seq: int
    kind: str
    """``llm``, ``round``, ``tool``, ``step``, ``sleep``, ``event``, ``memory``, ``patch``,
    ``checkpoint`` or ``interrupt``."""
    title: str
    at: float | None
    depth: int = 0
    took: float | None = None
    path: str | None = None
    name: str = ""
    callsite: str = ""
    cost_pico: int = 0
    tokens: int = 0
    total_pico: int | None = None
    """An LLM call's spend with its rounds' (``None``: the item has no nested spend)."""
    total_tokens: int = 0
    detail: list[str] = field(default_factory=list)
    result: Shown | None = None
    error: Shown | None = None
    messages: list[MessageView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    more_changes: int = 0
    answer: str | None = None
    """An interrupt's answer (``approve``/``reject``), ``None`` while pending."""
    interrupt: Interrupt | None = None
    collapse: bool = False
    """Whether the result is folded away (the detail lines say it already)."""
    start_seq: int = 0
    entry: JournalEntry | None = None

    @property
    def label(self) -> str:
        return _KIND_LABELS.get(self.kind, self.kind)


_KIND_LABELS = {
    "llm": "LLM call",
    "round": "LLM round",
    "tool": "tool call",
    "step": "step",
    "sleep": "sleep",
    "event": "event",
    "memory": "memory",
    "patch": "patch",
    "checkpoint": "checkpoint",
    "interrupt": "interrupt",
}


@dataclass(slots=True)
class Timeline:
    """One page of a run's timeline."""

    items: list[Item]
    page: int
    pages: int
    total: int
    entries: int
    first: int
    """The 1-based position of the page's first item (0 when there are none)."""


def _kind(name: str) -> tuple[str, str]:
    """The kind of a journal entry named ``name``, and its title."""
    if name == "agency.llm":
        return "llm", "LLM call"
    if name == "agency.llm:round":
        return "round", "LLM round"
    if name.startswith("tool:"):
        return "tool", name[len("tool:") :]
    if name == "agency.sleep":
        return "sleep", "sleep"
    if name == "agency.wait_for_event:deadline":
        return "event", "event deadline"
    if name.startswith("agency.wait_for_event:"):
        return "event", f"event {name[len('agency.wait_for_event:') :]}"
    if name.startswith("agency.memory."):
        return "memory", name[len("agency.") :]
    if name == "agency.patched":
        return "patch", "patch marker"
    return "step", name


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _tool_call_line(call: Mapping[str, Any]) -> str:
    function = call.get("function") if isinstance(call.get("function"), Mapping) else call
    assert isinstance(function, Mapping)
    name = str(function.get("name", "?"))
    arguments = function.get("arguments", "")
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    if len(text) > 300:
        text = text[:299] + "…"
    return f"{name}({text})"


def _entry_item(
    entry: JournalEntry,
    clip: Clipper,
    tool_calls: dict[str, str],
    units: Mapping[str, JournalEntry] | None = None,
) -> Item:
    """``entry`` as a timeline item; ``units``: the entries at hand by path, where the
    ``["unit", path]`` changes of a unit that ran others inside it are found."""
    kind, title = _kind(entry.name)
    item = Item(
        seq=entry.seq,
        kind=kind,
        title=title,
        at=entry.created_at,
        path=entry.path,
        name=entry.name,
        callsite=entry.callsite,
        cost_pico=entry.cost_pico,
        tokens=entry.tokens,
        entry=entry,
    )
    result = _loads(entry.result) if len(entry.result) <= MAX_DELTAS else None
    if kind == "llm":
        item.title = entry.callsite or "LLM call"
    elif kind == "round":
        number = entry.path.rpartition("round#")[2]
        item.title = f"round {number}" if number.isdigit() else "round"
        if isinstance(result, Mapping):
            calls = result.get("calls") or []
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, list) and len(call) == 3:
                    line = _tool_call_line({"name": call[1], "arguments": call[2]})
                    tool_calls[str(call[0])] = line
                    item.detail.append(f"asks for {line}")
            if not calls:
                item.detail.append("answers")
    elif kind == "tool":
        asked = tool_calls.get(entry.callsite)
        if asked is not None:
            item.detail.append(asked)
    elif kind == "sleep" and isinstance(result, int | float):
        item.detail.append(f"wakes at {local_time(float(result))}")
    elif entry.name == "agency.wait_for_event:deadline" and isinstance(result, int | float):
        item.detail.append(f"gives up at {local_time(float(result))}")
    item.collapse = kind in ("llm", "round", "sleep", "patch") or entry.name.endswith(":deadline")
    changes = _expanded(item, entry.deltas, units or {})
    item.result = clip.json(_result_text(entry.result, changes))
    if entry.error is not None:
        item.error = clip.json(entry.error)
    if kind != "round" and changes:  # a round's messages are in its LLM call's changes
        _changes(item, changes, clip)
    return item


def _expanded(item: Item, deltas: str | None, units: Mapping[str, JournalEntry]) -> list[Any]:
    """An entry's changes, each ``["unit", path]`` replaced by that unit's changes when its
    entry is at hand (a note says where they are when it is not)."""
    if not deltas:
        return []
    if len(deltas) > MAX_DELTAS:
        item.notes.append(f"changes not shown: {size(_bytes(deltas))} of them")
        return []
    changes = _loads(deltas)
    if not isinstance(changes, list):
        return []
    out: list[Any] = []
    for change in changes:
        if isinstance(change, list) and len(change) == 2 and change[0] == "unit":
            inner = units.get(str(change[1]))
            if inner is None or inner.error is not None:
                item.notes.append(f"the changes of {change[1]} are stored with it")
                continue
            out.extend(_expanded(item, inner.deltas, units))
        else:
            out.append(change)
    return out


def _result_text(result: str, changes: list[Any]) -> str:
    """An entry's result as JSON text; a result stored as ``["same", index]`` (the text of a
    message among its changes) is put back when that message is at hand."""
    if not changes or not isinstance(changes[-1], list) or changes[-1][:1] != ["same"]:
        return result
    index = changes[-1][1] if len(changes[-1]) == 2 else None
    plain = [c for c in changes if not (isinstance(c, list) and c[:1] == ["same"])]
    if isinstance(index, int) and 0 <= index < len(plain):
        change = plain[index]
        if isinstance(change, list) and len(change) >= 3 and isinstance(change[2], Mapping):
            content = change[2].get("content")
            if isinstance(content, str):
                return json.dumps(content)
    return result


def _changes(item: Item, changes: list[Any], clip: Clipper) -> None:
    """The thread messages and other changes a step made (its ``deltas``, expanded)."""
    shown = 0
    for change in changes:
        if not isinstance(change, list) or not change:
            continue
        kind = change[0]
        if kind in ("cost", "same"):
            continue
        if shown >= MAX_CHANGES or clip.left <= 0:
            item.more_changes += 1
            continue
        shown += 1
        clip.left -= CHANGE_COST
        if kind == "push" and len(change) >= 3 and isinstance(change[2], Mapping):
            message = change[2]
            content = message.get("content")
            calls = message.get("tool_calls") or []
            item.messages.append(
                MessageView(
                    thread=f"t{change[1]}",
                    role=str(message.get("role", "?")),
                    content=None if content in (None, "") else clip.value(content),
                    name=None if message.get("name") is None else str(message.get("name")),
                    tool_calls=[_tool_call_line(c) for c in calls if isinstance(c, Mapping)],
                )
            )
        elif kind == "new" and len(change) >= 2:
            label = f" ({change[3]})" if len(change) > 3 and change[3] else ""
            item.notes.append(f"opened thread t{change[1]}{label}")
        elif kind == "queue" and len(change) >= 2:
            item.notes.append(f"queued a message on thread t{change[1]}")
        elif kind == "take" and len(change) >= 2:
            item.notes.append(f"delivered the queued messages of thread t{change[1]}")
        elif kind == "grant" and len(change) >= 4:
            more = []
            if change[2]:
                more.append(f"+{usd(int(change[2]))}")
            if change[3]:
                more.append(f"+{duration(float(change[3]))}")
            item.notes.append(f"guard {change[1]} granted {' '.join(more) or 'more'}")
        else:
            item.notes.append(f"change {str(kind)[:40]}")


def build_timeline(
    record: RunRecord,
    entries: Sequence[JournalEntry],
    answers: Iterable[tuple[int, Interrupt, str | None, Any, float | None]],
    checkpoints: Iterable[Checkpoint],
    *,
    page: int = 1,
    clip: Clipper,
    per_page: int = JOURNAL_PAGE,
) -> Timeline:
    """Page ``page`` of the run's timeline, oldest first.

    Journal entries, checkpoints and interrupts (``answers``: ``(seq, interrupt, answer
    type or None, value, answered_at)``) in journal order, except that an LLM call comes
    before the rounds and tool calls it made (which are indented under it). An item's
    ``took`` is the time since the journal event before it (for an LLM call: before its
    first round), from the stored times.
    """
    by_path = {e.path: e for e in entries if e.name == "agency.llm"}
    nodes: list[_Node] = []
    llm_nodes: dict[str, _Node] = {}
    for entry in entries:
        node = _Node(entry.seq, entry.created_at, entry=entry)
        nodes.append(node)
        if entry.path in by_path and by_path[entry.path] is entry:
            llm_nodes[entry.path] = node
    for checkpoint in checkpoints:
        nodes.append(_Node(checkpoint.seq, checkpoint.created_at, checkpoint=checkpoint))
    for seq, interrupt, answer, value, answered_at in answers:
        nodes.append(_Node(seq, answered_at, interrupt=(interrupt, answer, value)))
    nodes.sort(key=lambda n: n.seq)
    # LLM calls adopt what they journaled inside them (their paths extend the call's).
    for node in nodes:
        if node.entry is not None and _NESTED_IN_LLM.search(node.entry.path):
            parent = _llm_parent(node.entry.path, llm_nodes)
            if parent is not None and parent is not node:
                parent.children.append(node)
                node.parent = parent
    for node in nodes:  # in journal order: children come before their parents
        node.start = min([node.seq] + [c.start for c in node.children])
        own = (0, 0) if node.entry is None else (node.entry.cost_pico, node.entry.tokens)
        node.spend = (
            own[0] + sum(c.spend[0] for c in node.children),
            own[1] + sum(c.spend[1] for c in node.children),
        )
    # Checkpoints and interrupts inside an LLM call's span belong to it too.
    spans = sorted((n for n in llm_nodes.values() if n.parent is None), key=lambda n: n.start)
    starts = [n.start for n in spans]
    for node in nodes:
        if node.entry is None:
            at = bisect.bisect_right(starts, node.seq) - 1
            if at >= 0 and spans[at].start <= node.seq < spans[at].seq:
                spans[at].children.append(node)
                node.parent = spans[at]
    # Times: what happened before each item started.
    timed = [(n.seq, n.at) for n in nodes if n.at is not None]
    seqs = [s for s, _ in timed]
    first_at = timed[0][1] if timed else None
    origin = record.created_at
    if record.started_at is not None and (first_at is None or record.started_at <= first_at):
        origin = record.started_at
    flat: list[_Node] = []

    def walk(level: Iterable[_Node], depth: int) -> None:
        for node in sorted(level, key=lambda n: (n.start, n.seq)):
            node.depth = depth
            flat.append(node)
            walk(node.children, depth + 1)

    walk([n for n in nodes if n.parent is None], 0)
    total = len(flat)
    pages = max(1, -(-total // per_page))
    page = min(max(1, page), pages)
    chosen = flat[(page - 1) * per_page : page * per_page]
    tool_calls: dict[str, str] = {}
    for node in flat[: (page - 1) * per_page]:  # rounds before the page name its tool calls
        if node.entry is not None and node.entry.name == "agency.llm:round":
            _entry_item(node.entry, Clipper(0), tool_calls)
    items: list[Item] = []
    units = {e.path: e for e in entries}
    for node in chosen:
        item = node.item(clip, tool_calls, units, waiting=record.status == "paused")
        item.depth = node.depth
        item.start_seq = node.start
        if node.children and node.spend != (item.cost_pico, item.tokens):
            item.total_pico, item.total_tokens = node.spend
        if item.at is not None:
            before = bisect.bisect_left(seqs, node.start) - 1
            since = timed[before][1] if before >= 0 else origin
            assert since is not None
            item.took = item.at - since if item.at >= since else None
        items.append(item)
    return Timeline(
        items=items,
        page=page,
        pages=pages,
        total=total,
        entries=len(entries),
        first=(page - 1) * per_page + 1 if items else 0,
    )


def outer_llm_call(path: str) -> str | None:
    """The path of the outermost LLM call that ``path`` is journaled inside (its rounds and
    tool calls extend the call's path), or ``None``."""
    found = _NESTED_IN_LLM.search(path)
    return None if found is None else path[: found.end() - 1]


def _llm_parent(path: str, llm_nodes: Mapping[str, _Node]) -> _Node | None:
    """The innermost LLM call whose path ``path`` extends."""
    cut = len(path)
    while (cut := path.rfind("/", 0, cut)) > 0:
        node = llm_nodes.get(path[:cut])
        if node is not None:
            return node
    return None


class _Node:
    __slots__ = (
        "at",
        "checkpoint",
        "children",
        "depth",
        "entry",
        "interrupt",
        "parent",
        "seq",
        "spend",
        "start",
    )

    def __init__(
        self,
        seq: int,
        at: float | None,
        *,
        entry: JournalEntry | None = None,
        checkpoint: Checkpoint | None = None,
        interrupt: tuple[Interrupt, str | None, Any] | None = None,
    ) -> None:
        self.seq = seq
        self.at = at
        self.entry = entry
        self.checkpoint = checkpoint
        self.interrupt = interrupt
        self.children: list[_Node] = []
        self.parent: _Node | None = None
        self.start = seq
        self.depth = 0
        self.spend = (0, 0)

    def item(
        self,
        clip: Clipper,
        tool_calls: dict[str, str],
        units: Mapping[str, JournalEntry],
        *,
        waiting: bool,
    ) -> Item:
        if self.entry is not None:
            return _entry_item(self.entry, clip, tool_calls, units)
        if self.checkpoint is not None:
            cp = self.checkpoint
            title = f"checkpoint {cp.label}" if cp.label else "checkpoint"
            item = Item(seq=cp.seq, kind="checkpoint", title=title, at=cp.created_at)
            item.detail.append(f"id {cp.checkpoint_id}")
            if cp.restores:
                item.detail.append(f"restored {cp.restores} time(s)")
            return item
        assert self.interrupt is not None
        interrupt, answer, value = self.interrupt
        item = Item(
            seq=self.seq,
            kind="interrupt",
            title=f"interrupt {interrupt.effect}",
            at=self.at,
            answer=answer,
            interrupt=interrupt,
        )
        item.result = clip.text(interrupt.message, STEP_PREVIEW)
        if interrupt.data is not None:
            item.detail.append("data: " + clip.value(interrupt.data, 300, compact=True).text)
        if answer is None:
            item.notes.append("pending: waits for an answer" if waiting else "not answered")
        else:
            shown = "" if value is None else f" with {clip.value(value, 300, compact=True).text}"
            item.notes.append(f"answered: {answer}{shown}")
        return item
