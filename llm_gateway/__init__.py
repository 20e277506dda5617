"""llm-gateway: one policy engine for OpenAI-compatible LLM traffic."""
