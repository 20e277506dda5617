"""OpenAI's own API: the reference every other profile translates towards.

Usage arrives as ``usage.prompt_tokens`` / ``completion_tokens`` (some OpenAI-compatible
servers say ``input_tokens`` / ``output_tokens``), the prompt tokens read from the prompt
cache as ``usage.prompt_tokens_details.cached_tokens`` (``input_tokens_details`` in the
Responses API's naming; Venice reports them the same way); errors are already in OpenAI's shape
when they come from OpenAI, and anything else (an HTML page from a load balancer, an
empty body) becomes a message that quotes what arrived.
"""

from __future__ import annotations

import json
import math

from llm_gateway.errors import error_body
from llm_gateway.providers.base import Usage

# The top-level fields of CreateChatCompletionRequest (with CreateModelResponseProperties) in
# openapi.yaml of github.com/openai/openai-openapi, version 2.3.0, the source of
# platform.openai.com/docs/api-reference/chat/create. The schema does not say it, but the API
# refuses any other field: 400 "Unrecognized request argument supplied: top_k" (reported e.g. in
# github.com/xlinx/sd-webui-decadetw-auto-prompt-llm/issues/29, coroot/coroot/issues/698).
OPENAI_CHAT_FIELDS = frozenset({
    "model", "messages",
    "stream", "stream_options",
    "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "frequency_penalty", "presence_penalty", "logit_bias",
    "n", "seed", "stop",
    "logprobs", "top_logprobs",
    "tools", "tool_choice", "parallel_tool_calls", "response_format",
    "functions", "function_call",
    "reasoning_effort", "verbosity", "modalities", "audio", "prediction", "web_search_options",
    "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options",
    "service_tier", "store", "metadata", "moderation", "safety_identifier", "user",
})
# Fields only other providers take: refused before the call rather than spent on a 400.
NOT_OPENAI_FIELDS = frozenset({
    "venice_parameters", "top_k", "min_p", "min_temp", "max_temp", "repetition_penalty",
    "stop_token_ids",
})

# OpenAI's error type for a status, for errors that arrive without one.
_TYPE_BY_STATUS = {
    401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    429: "rate_limit_error",
}


def error_type_for_status(status: int) -> str:
    if status >= 500:
        return "upstream_error"
    return _TYPE_BY_STATUS.get(status, "invalid_request_error")


class UnsupportedParameter(ValueError):
    """The provider cannot take the request as it is; str() says why, for a 400."""


class OpenAIProfile:
    name = "openai"
    # OpenAI sends a usage chunk only when stream_options.include_usage asks for one.
    sends_stream_usage = False
    reports_cost = False
    protocols = frozenset({"chat", "embeddings", "responses"})
    auth_header = "authorization"
    default_headers: tuple[tuple[str, str], ...] = ()

    def prepare(self, payload: dict, *, stream: bool) -> dict:
        """The chat body for OpenAI: ``max_tokens`` spelt ``max_completion_tokens`` (the
        o-series refuse the old name), stream usage asked for (the gateway meters it
        whatever the client asked), and fields of other providers refused."""
        if foreign := sorted(NOT_OPENAI_FIELDS.intersection(payload)):
            raise UnsupportedParameter(f"'{foreign[0]}' is not a parameter this provider takes.")
        prepared = payload
        if "max_tokens" in payload and "max_completion_tokens" not in payload:
            prepared = {k: v for k, v in payload.items() if k != "max_tokens"}
            prepared["max_completion_tokens"] = payload["max_tokens"]
        return ask_for_stream_usage(prepared) if stream else prepared

    def usage(self, payload: object) -> Usage | None:
        """Anything missing or malformed counts as 0 (tokens) or unknown (cost) instead of
        failing: metering must never break the relayed response."""
        if not isinstance(payload, dict):
            return None
        usage = payload.get("usage")
        if not isinstance(usage, dict):
            return None
        prompt = token_count(usage.get("prompt_tokens", usage.get("input_tokens")))
        completion = token_count(usage.get("completion_tokens", usage.get("output_tokens")))
        reported_total = usage.get("total_tokens")
        total = token_count(reported_total) if _is_int(reported_total) else prompt + completion
        details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
        cached = token_count(details.get("cached_tokens")) if isinstance(details, dict) else 0
        output = usage.get("completion_tokens_details", usage.get("output_tokens_details"))
        reasoning = token_count(output.get("reasoning_tokens")) if isinstance(output, dict) else 0
        return Usage(prompt, completion, total, cache_read_tokens=min(cached, prompt),
                     reasoning_tokens=min(reasoning, completion))

    def error_in(self, payload: dict) -> dict[str, str | None] | None:
        error = payload.get("error")
        if not isinstance(error, dict):
            return None  # e.g. "error": null on an otherwise normal frame
        message = error.get("message")
        return {
            "message": message if isinstance(message, str) else json.dumps(error),
            "type": _optional_str(error.get("type")),
            "code": _optional_str(error.get("code")),
        }

    def error_body(self, body: bytes, status: int) -> bytes:
        payload = json_object(body)
        if payload is not None:
            inner = payload.get("error")
            if isinstance(inner, dict) and isinstance(inner.get("message"), str):
                return body  # OpenAI's shape already
            if isinstance(payload.get("message"), str):
                return error_body(payload["message"], error_type_for_status(status), None)
        return quoted_error(body, status)


def quoted_error(body: bytes, status: int) -> bytes:
    text = body.decode("utf-8", "replace").strip()[:500] or f"upstream answered HTTP {status}"
    return error_body(text, error_type_for_status(status), None)


def json_object(body: bytes) -> dict | None:
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def _is_int(value: object) -> bool:
    # bool is an int subclass, but `true` is never a token count.
    return isinstance(value, int) and not isinstance(value, bool)


def token_count(value: object) -> int:
    # A negative count would credit the caller; treat it like any other garbage.
    return value if _is_int(value) and value > 0 else 0  # type: ignore[return-value]


def finite_number(*candidates: object) -> float | None:
    for value in candidates:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def _optional_str(value: object) -> str | None:
    # Some upstreams send numeric codes (429); keep them, as text, but drop nested junk.
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def ask_for_stream_usage(payload: dict) -> dict:
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return payload
    merged = dict(options) if isinstance(options, dict) else {}
    merged["include_usage"] = True
    return {**payload, "stream_options": merged}
