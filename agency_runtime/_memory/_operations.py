"""``remember``, ``recall`` and ``forget`` themselves, each journaled as one unit.

Every model call goes through ``agency.llm`` on a hidden thread of its own, so it is billed
to the run and its guards and never adds messages to the conversation. Each operation runs
at ``memory#N`` (its model calls under it) and is journaled when it completes: a resumed run
gets the recorded outcome back without reading the graph or calling the model again. Graph
updates hold the place's write lock, so concurrent runs sharing a memory do not lose each
other's facts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel

from .._core._branches import qualify
from .._core._frame import Frame, Position, position_of, use_frame
from .._durable._effect import journaled
from .._durable._journal import journal_of
from .._errors import StructuredOutputError
from .._llm._chat import llm
from ._config import FILTER_LIMIT, THREAD_LABEL, _fails_open
from ._graph import Entity, Graph, _fold, _iso, _render
from ._merge import _apply_extraction, _expire_facts, _expire_relations
from ._persistence import _Place
from ._prompts import (
    Extraction,
    ForgetPlan,
    RecallFilter,
    _extraction_prompt,
    _filter_prompt,
    _forget_prompt,
)
from ._ranking import _candidates, _context_entities

logger = logging.getLogger("agency_runtime.memory")

T = TypeVar("T", bound=BaseModel)


async def _ask(frame: Frame, place: _Place, prompt: str, schema: type[T]) -> T:
    """One model call on a fresh hidden thread (billed, journaled, guarded)."""
    threads = frame.threads
    thread = threads.get(threads.create(label=THREAD_LABEL, hidden=True))
    answer = await llm(prompt, model=place.config.model, schema=schema, thread=thread)
    if not isinstance(answer, schema):
        raise StructuredOutputError(
            f"the memory call expected {schema.__name__}, got {type(answer).__name__}",
            raw=str(answer),
            errors=[],
        )
    return answer


async def _journaled(
    frame: Frame, kind: str, operation: Callable[[Frame], Awaitable[str | None]]
) -> str | None:
    """Run one memory operation once per run, like a journaled step.

    The operation runs at its own address (``memory#N`` under the caller's), so the model
    calls inside it are numbered apart from the caller's. When it completes, its result and
    what it did to the threads and guards are journaled; a resumed run replays them instead
    of running it again, so it neither reads a graph that later calls changed nor pays
    twice.
    """
    journal = journal_of(frame.ctx)
    position = position_of(frame)
    branch, ordinal = journal.count(position.address, "memory")
    segment = qualify(branch, f"memory#{ordinal}")
    path = f"{position.address}/{segment}" if position.address else segment
    inner = frame.evolve(position=Position(position.scope, path))

    async def run() -> str | None:
        with use_frame(inner):
            return await operation(inner)

    return await journaled(
        frame,
        path,
        f"agency.memory.{kind}",
        run,
        encode=lambda result: result,
        decode=lambda recorded: None if recorded is None else str(recorded),
    )


async def _remember(frame: Frame, place: _Place, content: str) -> None:
    graph = await place.load_graph()
    prompt = _extraction_prompt(graph, _context_entities(graph, content), content)
    try:
        extraction = await _ask(frame, place, prompt, Extraction)
    except StructuredOutputError as exc:
        logger.warning("agency.memory.remember: unusable extraction, nothing saved: %s", exc)
        return
    async with place.writing():
        graph = await place.load_graph()  # fresh: the model call may have taken a while
        now = time.time()
        outcome = _apply_extraction(graph, extraction, frame.ctx.run_id or "local", now)
        if not outcome.changed:
            return
        await place.save_graph(graph)
        await place.index(outcome.added, now)
        await place.unindex(outcome.expired, now)


async def _recall(frame: Frame, place: _Place, query: str) -> str:
    graph = await place.load_graph()
    if not graph.entities:
        return ""
    candidates = await _candidates(place, graph, query)
    if not candidates:
        return ""
    ids = [e.id for e in candidates]
    if place.config.llm_filter:
        ids = await _filter(frame, place, graph, candidates[:FILTER_LIMIT], query)
    return _render(graph, ids)


async def _filter(
    frame: Frame, place: _Place, graph: Graph, candidates: list[Entity], query: str
) -> list[str]:
    """The candidates the model calls relevant, in its order (all of them if it fails)."""
    offered = [e.id for e in candidates]
    try:
        answer = await _ask(frame, place, _filter_prompt(graph, candidates, query), RecallFilter)
    except Exception as exc:
        if not _fails_open(exc):
            raise
        logger.warning("agency.memory.recall: the LLM filter failed, kept candidates: %s", exc)
        return offered
    by_name = {_fold(e.name): e.id for e in reversed(candidates)}
    chosen: list[str] = []
    for item in answer.ids:
        key = item.strip() if item.strip() in offered else by_name.get(_fold(item))
        if key is not None and key not in chosen:
            chosen.append(key)
    return chosen


async def _forget(frame: Frame, place: _Place, query: str) -> None:
    graph = await place.load_graph()
    if not graph.entities:
        return
    candidates = (await _candidates(place, graph, query))[:FILTER_LIMIT]
    if not candidates:
        return
    try:
        plan = await _ask(frame, place, _forget_prompt(graph, candidates, query), ForgetPlan)
    except StructuredOutputError as exc:
        logger.warning("agency.memory.forget: unusable plan, nothing forgotten: %s", exc)
        return
    async with place.writing():
        graph = await place.load_graph()
        now = time.time()
        when = _iso(now)
        expired: list[str] = []
        for item in plan.expirations:
            expired += _expire_facts(graph, item.entity, item.observation, when)
        dropped = _expire_relations(graph, plan.relations, when)
        if not expired and not dropped:
            return
        await place.save_graph(graph)
        await place.unindex(expired, now)
