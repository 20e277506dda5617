"""Any other OpenAI-compatible server (vLLM, Ollama, LM Studio, DeepSeek, a proxy): tolerant
of both error shapes, reads usage in either naming (cached prompt tokens too: OpenAI's
``prompt_tokens_details.cached_tokens`` or DeepSeek's ``prompt_cache_hit_tokens``), asks for
stream usage, and sends ``max_tokens`` (older servers do not know
``max_completion_tokens``)."""

from __future__ import annotations

from llm_gateway.providers.base import Usage
from llm_gateway.providers.openai import ask_for_stream_usage, token_count
from llm_gateway.providers.venice import VeniceProfile


class GenericProfile(VeniceProfile):
    name = "generic"
    sends_stream_usage = False
    # It reads a cost when one comes (an OpenRouter-like proxy), but a vLLM or Ollama
    # sends none: not to be counted on.
    reports_cost = False

    def prepare(self, payload: dict, *, stream: bool) -> dict:
        prepared = payload
        if "max_completion_tokens" in payload and "max_tokens" not in payload:
            prepared = {k: v for k, v in payload.items() if k != "max_completion_tokens"}
            prepared["max_tokens"] = payload["max_completion_tokens"]
        return ask_for_stream_usage(prepared) if stream else prepared

    def usage(self, payload: object) -> Usage | None:
        usage = super().usage(payload)
        if usage is not None and not usage.cache_read_tokens:
            assert isinstance(payload, dict)  # super() found a usage object in it
            hits = token_count(payload["usage"].get("prompt_cache_hit_tokens"))
            usage.cache_read_tokens = min(hits, usage.prompt_tokens)
        return usage
