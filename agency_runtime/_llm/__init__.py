"""LLM access."""
