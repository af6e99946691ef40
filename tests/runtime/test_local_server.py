"""Through litellm to a tiny OpenAI-compatible server on loopback: what a local server gets.

The server (a thread serving ``/v1/chat/completions``) records each request's JSON body and
answers from a script, as a llama.cpp or vLLM server would:

* tools go with ``tool_choice="auto"`` unless the model's options choose (llama-cpp-python's
  server leaves the tools out of the prompt otherwise), and never without tools;
* ``agency.Model(..., json_schema=True)`` sends a schema as a JSON-schema ``response_format``
  (litellm does not know a local model, so by default the schema goes in the prompt), and the
  constrained answer is parsed;
* ``on_max_tool_rounds="answer"`` asks its last round with ``tool_choice="none"``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import BaseModel

from agency_runtime import Model, agency
from tests.support import LITELLM, SHARES_LITELLM, asyncio_only

pytestmark = [pytest.mark.anyio, SHARES_LITELLM, asyncio_only(LITELLM)]


class City(BaseModel):
    city: str
    population: int


def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"sunny in {city}"


class LocalServer:
    """An OpenAI-compatible chat server: records each body, answers from ``replies``.

    A reply is a text, or a list of ``(name, arguments)`` tool calls.
    """

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.replies: list[str | list[tuple[str, dict[str, Any]]]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                data = json.dumps(server.answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.http.server_port}/v1"

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.bodies.append(body)
            reply = self.replies.pop(0)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if isinstance(reply, str):
            message["content"] = reply
        else:
            message["tool_calls"] = [
                {
                    "id": f"call_{n}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for n, (name, arguments) in enumerate(reply)
            ]
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop" if isinstance(reply, str) else "tool_calls",
                    "message": message,
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        }


@pytest.fixture
def server() -> Iterator[LocalServer]:
    local = LocalServer()
    local.thread.start()
    yield local
    local.http.shutdown()
    local.http.server_close()


def local(server: LocalServer, **fields: Any) -> Model:
    return Model(
        "openai/local-model",
        api_base=server.api_base,
        api_key="none",
        input_cost_per_token=0.0,
        output_cost_per_token=0.0,
        **fields,
    )


async def test_tools_go_with_tool_choice_auto_unless_the_model_chooses(
    server: LocalServer,
) -> None:
    server.replies = [[("weather", {"city": "Oslo"})], "Sunny.", "Hi.", "Forced."]
    with agency.test_context():
        assert await agency.llm("weather?", model=local(server), tools=[weather]) == "Sunny."
        chooses = local(server, options={"tool_choice": "required"})
        assert await agency.llm("hi", model=chooses) == "Hi."  # no tools: no tool_choice
        assert await agency.llm("go", model=chooses, tools=[weather]) == "Forced."
    assert [body.get("tool_choice") for body in server.bodies] == [
        "auto",
        "auto",
        None,
        "required",
    ]
    assert "tool_choice" not in server.bodies[2]
    assert "tools" not in server.bodies[2]
    assert server.bodies[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_0",
        "name": "weather",
        "content": "sunny in Oslo",
    }


async def test_a_json_schema_model_sends_the_schema_and_parses_the_constrained_answer(
    server: LocalServer,
) -> None:
    server.replies = ['{"city": "Oslo", "population": 709000}']
    with agency.test_context():
        model = local(server, json_schema=True)
        answer = await agency.llm("the capital?", model=model, schema=City)
    assert answer == City(city="Oslo", population=709000)
    (body,) = server.bodies
    assert body["response_format"]["type"] == "json_schema"
    sent = body["response_format"]["json_schema"]
    assert (sent["name"], sent["strict"]) == ("City", True)
    assert sent["schema"]["required"] == ["city", "population"]
    assert sent["schema"]["properties"]["population"]["type"] == "integer"
    # The server constrains the output: no schema instruction in the prompt.
    assert [m["role"] for m in body["messages"]] == ["user"]


@pytest.mark.parametrize("json_schema", [None, False])
async def test_by_default_a_local_models_schema_goes_in_the_prompt(
    server: LocalServer, json_schema: bool | None
) -> None:
    server.replies = ['```json\n{"city": "Oslo", "population": 709000}\n```']
    with agency.test_context():
        model = local(server, json_schema=json_schema)
        answer = await agency.llm("the capital?", model=model, schema=City)
    assert answer == City(city="Oslo", population=709000)
    (body,) = server.bodies
    assert "response_format" not in body  # litellm does not know the local model
    assert "JSON schema" in body["messages"][-1]["content"]


async def test_the_last_round_asks_for_an_answer_with_tool_choice_none(
    server: LocalServer,
) -> None:
    server.replies = [[("weather", {"city": "Oslo"})], "Sunny, as far as I know."]
    with agency.test_context():
        answer = await agency.llm(
            "weather?",
            model=local(server),
            tools=[weather],
            max_tool_rounds=1,
            on_max_tool_rounds="answer",
        )
    assert answer == "Sunny, as far as I know."
    assert [body["tool_choice"] for body in server.bodies] == ["auto", "none"]
