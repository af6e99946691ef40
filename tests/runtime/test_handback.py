"""A worker's hand-back and the parking seam: the boundary implements what the durable
layer and the waits consult, and the durable layer never imports the boundary."""

from __future__ import annotations

import grimp
import pytest

from agency_runtime import JournalEntry
from agency_runtime._boundary._handback import HandBack
from agency_runtime._durable._journal import RunJournal
from agency_runtime._durable._parking import Parking
from agency_runtime._errors import RunHandedBack

pytestmark = pytest.mark.anyio


def test_a_request_tells_every_waiter_once_and_a_cancelled_one_not_at_all() -> None:
    handback = HandBack()
    told: list[str] = []
    handback.on_request(lambda: told.append("a"))
    cancel = handback.on_request(lambda: told.append("b"))
    cancel()
    cancel()  # cancelling twice is harmless
    assert not handback.requested
    handback.request()
    handback.request()  # callbacks are told once
    assert handback.requested
    assert told == ["a"]


def test_a_wait_parks_when_longer_than_park_after_or_once_requested() -> None:
    assert not HandBack().parks(1e9)  # no bound: never parks on its own
    bounded = HandBack(park_after=10)
    assert not bounded.parks(10)
    assert bounded.parks(10.5)
    bounded.request()
    assert bounded.parks(0)


async def test_a_journal_stops_the_run_after_the_commit_its_parking_asked_for() -> None:
    journal = RunJournal("r")
    parking: Parking = HandBack()  # the boundary's hand-back is the durable layer's seam
    journal.parking = parking
    entry = JournalEntry(run_id="r", seq=1, path="s#0", name="s", result="1")
    await journal.commit_step(entry)  # not asked: it goes on
    assert isinstance(parking, HandBack)
    parking.request()
    with pytest.raises(RunHandedBack):
        await journal.commit_step(entry.model_copy(update={"seq": 2, "path": "s#1"}))
    assert set(journal.entries) == {"s#0", "s#1"}  # committed before it stopped


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    """The package's import graph, typing-only imports included."""
    return grimp.build_graph("agency_runtime", exclude_type_checking_imports=False)


def test_the_import_graph_sees_the_boundary_import_its_hand_back(graph: grimp.ImportGraph) -> None:
    assert graph.find_shortest_chain(
        importer="agency_runtime._boundary._worker",
        imported="agency_runtime._boundary._handback",
    )


@pytest.mark.parametrize(
    "lower", ["agency_runtime._durable", "agency_runtime._waits", "agency_runtime._core"]
)
def test_the_durable_layer_and_the_waits_never_import_the_boundary(
    graph: grimp.ImportGraph, lower: str
) -> None:
    chain = graph.find_shortest_chain(
        importer=lower, imported="agency_runtime._boundary", as_packages=True
    )
    assert chain is None, " -> ".join(chain or ())
