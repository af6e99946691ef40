"""Recorded failures: features register their kinds, the stored JSON keeps its format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agency_runtime import (
    EventTimeoutError,
    LLMCallError,
    StructuredOutputError,
    ToolRoundsExceededError,
)
from agency_runtime._durable._failures import decode_failure, encode_failure

ROOT = Path(__file__).resolve().parents[2]

STORED = {
    "LLMCallError": '{"type":"LLMCallError","message":"boom","model":"fake/echo","attempts":3}',
    "ToolRoundsExceededError": (
        '{"type":"ToolRoundsExceededError","message":"rounds","model":"m","attempts":2}'
    ),
    "StructuredOutputError": (
        '{"type":"StructuredOutputError","message":"bad","raw":"{}","errors":["e1"]}'
    ),
    "EventTimeoutError": (
        '{"type":"EventTimeoutError","message":"no event","name":"paid","timeout":1.5,'
        '"run_id":"r1"}'
    ),
}


def test_the_stored_format_is_unchanged() -> None:
    failures = [
        LLMCallError("boom", model="fake/echo", attempts=3),
        ToolRoundsExceededError("rounds", model="m", attempts=2),
        StructuredOutputError("bad", raw="{}", errors=["e1"]),
    ]
    for exc in failures:
        assert encode_failure(exc) == STORED[type(exc).__name__]
    timeout = EventTimeoutError("paid", 1.5, "r1")
    assert json.loads(encode_failure(timeout)) | {"message": "no event"} == json.loads(
        STORED["EventTimeoutError"]
    )


def test_a_fresh_process_decodes_every_recorded_kind() -> None:
    code = (
        "import json, sys\n"
        # what a process that resumes a run loads: the runtime, whose units register the
        # failures they record as they load
        "from agency_runtime import agency\n"
        "from agency_runtime._durable._failures import decode_failure\n"
        "for kind, text in json.loads(sys.argv[1]).items():\n"
        "    exc = decode_failure(text)\n"
        "    assert type(exc).__name__ == kind, (kind, exc)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(STORED)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_decoded_failures_keep_their_fields() -> None:
    exc = decode_failure(STORED["EventTimeoutError"])
    assert isinstance(exc, EventTimeoutError)
    assert (exc.name, exc.timeout, exc.run_id) == ("paid", 1.5, "r1")
    llm = decode_failure(STORED["LLMCallError"])
    assert isinstance(llm, LLMCallError)
    assert (str(llm), llm.model, llm.attempts) == ("boom", "fake/echo", 3)
