"""LLM access through one provider seam.

``_provider``  the seam: ``ChatProvider`` (complete, stream, embed, supports_schema), the
               request/response shapes and ``ProviderError`` (transient or not)
``_registry``  model string → provider by prefix: ``fake/`` → the offline fake provider
               (``agency_runtime._fakes``, beside this package, imported on first use),
               else litellm
``_litellm``   the default provider; litellm imported lazily, in a worker thread
``_chat``      ``agency.llm``: the call (``begin``/``ask``), journaled, guards
``_call``      one call's state (``_Call``) and its ``on_token`` callback
``_toolloop``  the conversation: rounds, tool calls, structured-output feedback
``_request``   one provider request built from a call (streamed to ``on_token``)
``_retries``   transient retries with capped backoff; the api_key scrubbed from errors
``_billing``   a response's cost and tokens; warnings about unpriced models
``_parsing``   tolerant JSON parsing of structured answers
``_embed``     ``embed(model, texts)``: embeddings through the seam, same retries
"""
