"""LLM access through one provider seam.

``_provider``  the seam: ``ChatProvider`` (complete, stream, embed, supports_schema), the
               request/response shapes and ``ProviderError`` (transient or not)
``_registry``  model string → provider by prefix: ``fake/`` → ``_fake``, else litellm
``_litellm``   the default provider; litellm imported lazily, in a worker thread
``_fake``      the offline fake provider (``fake/echo``, ``FakeModel``), no litellm
``_fake_litellm``  the same fake models as a litellm custom provider, once litellm loads
``_chat``      ``agency.llm``: threads, transient retries, structured output, billing,
               journaling, guards
``_embed``     ``embed(model, texts)``: embeddings through the seam, same retries
"""
