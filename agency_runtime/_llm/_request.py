"""One request of an ``agency.llm`` call to its model's provider: :func:`_request`.

Builds the seam's :class:`~._provider.ChatRequest` from a :class:`~._call._Call` (the
thread's messages; a schema as the provider's response format, or as a system instruction
when the model cannot constrain its output), sends it through :func:`~._retries.
with_transient_retries`, and streams the answer's text to ``on_token`` when the call has one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, create_model

from .._errors import LLMCallError, ProviderError
from ._call import _emit
from ._registry import provider_for
from ._retries import with_transient_retries

if TYPE_CHECKING:
    from ._call import _Call
    from ._provider import ChatResponse


def _response_format(schema: Any) -> type[BaseModel]:
    """Providers want an object at the top: other types travel inside ``{"value": ...}``."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema
    return create_model("Output", value=(schema, ...))


async def _request(call: _Call, tool_choice: str | None = None) -> ChatResponse:
    from ._provider import DEFAULT_TIMEOUT, ChatRequest, ChatResponse, StreamEnd, TextDelta

    chosen, schema, timeout, max_tokens = call.model, call.schema, call.timeout, call.max_tokens
    model, secret = chosen.name, chosen.api_key
    provider = provider_for(chosen.model)
    messages = call.thread.request_messages()
    output: type[BaseModel] | None = None
    if schema is not None:
        output = _response_format(schema)
        constrained = chosen.json_schema
        if constrained is None:  # the model does not say: the provider knows (or not)
            constrained = await provider.supports_schema(chosen.model)
        if not constrained:
            import json  # on first use (the json module is not needed to import agency_runtime)

            instruction = (
                "Respond with only a JSON document matching this JSON schema: "
                + json.dumps(output.model_json_schema())
            )
            messages = [*messages, {"role": "system", "content": instruction}]
            output = None
    request = ChatRequest(
        model=chosen.model,
        messages=messages,
        timeout=DEFAULT_TIMEOUT if timeout is None else float(timeout),
        max_tokens=max_tokens,
        response_format=output,
        tools=tuple(tool.spec for tool in call.tools.values()) if call.tools else (),
        tool_choice=tool_choice,
        api_base=chosen.api_base,
        api_key=secret,
        params=chosen.params,
    )
    on_token = call.on_token
    if on_token is None:
        return await with_transient_retries(
            lambda: provider.complete(request),
            model=model,
            signal=call.frame.stack.abort_signal,
            secret=secret,
        )
    streamed: list[str] = []

    async def stream() -> ChatResponse:
        if streamed:  # a stream cut after it gave text cannot be taken back: fail clearly
            raise LLMCallError(
                f"the stream from {model!r} was cut after {len(''.join(streamed))} "
                "characters of its answer",
                model=model,
                attempts=1,
            )
        events = provider.stream(request)
        end: StreamEnd | None = None
        try:
            async for event in events:
                if isinstance(event, TextDelta):
                    if event.text:
                        streamed.append(event.text)
                        await _emit(on_token, event.text)
                elif isinstance(event, StreamEnd):
                    end = event
        finally:
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()  # a provider's generator is closed here, never by the GC
        if end is not None:
            return ChatResponse(
                text=end.text,
                usage=end.usage,
                cost=end.cost,
                model=end.model,
                tool_calls=end.tool_calls,
                response_id=end.response_id,
                finish_reasons=end.finish_reasons,
                raw=end.raw,
            )
        raise ProviderError(
            f"the stream from {model!r} ended without its last event",
            kind="connection",
            model=model,
        )

    return await with_transient_retries(
        stream, model=model, signal=call.frame.stack.abort_signal, what="stream", secret=secret
    )
