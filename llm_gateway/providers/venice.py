"""Venice AI: OpenAI-compatible, with its own error shape and a cost in every usage.

- Errors are ``{"error": "<text>"}`` (validation failures add ``issues`` or
  ``details``), which OpenAI SDKs cannot read: wrapped into OpenAI's shape, the message
  verbatim.
- Usage carries the request's cost, ``{"usd": .., "diem": ..}``, inside ``usage`` or
  beside it depending on the endpoint; streams always end with a usage chunk. Cached
  prompt tokens come as OpenAI's ``prompt_tokens_details.cached_tokens`` (read by the
  OpenAI profile); ``cache_creation_input_tokens`` (cache writes) is not priced.
"""

from __future__ import annotations

from llm_gateway.errors import error_body
from llm_gateway.providers.base import Usage
from llm_gateway.providers.openai import (
    OpenAIProfile,
    UnsupportedParameter,
    error_type_for_status,
    finite_number,
    json_object,
)

# The top-level fields of ChatCompletionRequest in Venice's OpenAPI document (swagger.yaml in
# github.com/veniceai/api-docs, version 20260821.193530), which is what
# docs.venice.ai/api-reference/endpoint/chat/completions renders. The schema says
# `additionalProperties: false` (in every version since 2025-05 at least) and Venice validates
# with zod: any other field is a 400 "Unrecognized key(s) in object: '...'".
VENICE_CHAT_FIELDS = frozenset({
    "model", "messages", "venice_parameters",
    "stream", "stream_options",
    "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "top_k", "min_p", "min_temp", "max_temp",
    "frequency_penalty", "presence_penalty", "repetition_penalty",
    "n", "seed", "stop", "stop_token_ids",
    "logprobs", "top_logprobs",
    "tools", "tool_choice", "parallel_tool_calls", "response_format",
    "reasoning", "reasoning_effort", "verbosity", "text",
    "prompt_cache_key", "prompt_cache_retention",
    "user", "store", "metadata", "include", "fallbacks",
})


class VeniceProfile(OpenAIProfile):
    name = "venice"
    sends_stream_usage = True  # always, asked or not
    reports_cost = True  # usage.cost.usd, in every answer
    protocols = frozenset({"chat", "embeddings"})

    def prepare(self, payload: dict, *, stream: bool) -> dict:
        """Venice refuses any field it does not know (and counts the 400 against the
        account, which locks a model after a few): refused here, before the call."""
        if unknown := sorted(set(payload) - VENICE_CHAT_FIELDS):
            raise UnsupportedParameter(
                f"'{unknown[0]}' is not a parameter this provider takes "
                f"(it accepts: {', '.join(sorted(VENICE_CHAT_FIELDS))})."
            )
        return payload

    def usage(self, payload: object) -> Usage | None:
        usage = super().usage(payload)
        if usage is None:
            return None
        assert isinstance(payload, dict)
        inner = _as_dict(_as_dict(payload.get("usage")).get("cost"))
        beside = _as_dict(payload.get("cost"))
        usage.cost_usd = finite_number(inner.get("usd"), beside.get("usd"))
        usage.cost_diem = finite_number(inner.get("diem"), beside.get("diem"))
        return usage

    def error_in(self, payload: dict) -> dict[str, str | None] | None:
        error = payload.get("error")
        if isinstance(error, str):
            return {"message": error, "type": None, "code": None}
        return super().error_in(payload)

    def error_body(self, body: bytes, status: int) -> bytes:
        payload = json_object(body)
        if payload is not None and isinstance(payload.get("error"), str):
            code = payload.get("code")
            return error_body(payload["error"], error_type_for_status(status),
                              code if isinstance(code, str) else None)
        return super().error_body(body, status)


def _as_dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}
