"""Anthropic's own API (https://api.anthropic.com/v1): the Messages protocol natively.

The key goes in ``x-api-key``; ``anthropic-version`` is the caller's, ``2023-06-01`` (the
version every Anthropic SDK and Claude Code understand) when it sent none;
``anthropic-beta`` goes as the caller sent it. Usage is split across a stream
(``message_start.message.usage``, then ``message_delta.usage``, cumulative) and its
``input_tokens`` excludes the tokens read from and written to the prompt cache, which are
added back so that ``prompt_tokens`` counts every input token as OpenAI's does. Errors
are ``{"type": "error", "error": {"type", "message"}}``; a 529 is ``overloaded_error``.
"""

from __future__ import annotations

import json

from llm_gateway.errors import error_body
from llm_gateway.providers.base import Usage
from llm_gateway.providers.openai import error_type_for_status, json_object, token_count

DEFAULT_VERSION = "2023-06-01"


class AnthropicProfile:
    name = "anthropic"
    sends_stream_usage = True  # message_start and message_delta carry it, always
    reports_cost = False
    protocols = frozenset({"messages"})
    auth_header = "x-api-key"
    default_headers = (("anthropic-version", DEFAULT_VERSION),)

    def prepare(self, payload: dict, *, stream: bool) -> dict:
        return payload  # spoken natively: no chat body is ever sent to it

    def usage(self, payload: object) -> Usage | None:
        """A message's ``usage`` (a JSON answer's, ``message_start.message``'s or
        ``message_delta``'s), normalised; None when it has none."""
        if not isinstance(payload, dict):
            return None
        usage = payload.get("usage")
        if not isinstance(usage, dict):
            message = payload.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
        return anthropic_usage(usage) if isinstance(usage, dict) else None

    def error_in(self, payload: dict) -> dict[str, str | None] | None:
        error = payload.get("error")
        if not isinstance(error, dict):
            return None
        message = error.get("message")
        kind = error.get("type")
        return {"message": message if isinstance(message, str) else json.dumps(error),
                "type": kind if isinstance(kind, str) else None,
                "code": kind if isinstance(kind, str) else None}

    def error_body(self, body: bytes, status: int) -> bytes:
        """In OpenAI's shape (for a caller of another protocol), the message kept."""
        payload = json_object(body)
        error = payload.get("error") if payload else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error_body(error["message"], error_type_for_status(status),
                              error.get("type") if isinstance(error.get("type"), str) else None)
        text = body.decode("utf-8", "replace").strip()[:500] or f"upstream answered HTTP {status}"
        return error_body(text, error_type_for_status(status), None)


def anthropic_usage(usage: dict) -> Usage:
    """Anthropic's usage object, with every input token in ``prompt_tokens``."""
    uncached = token_count(usage.get("input_tokens"))
    read = token_count(usage.get("cache_read_input_tokens"))
    written = token_count(usage.get("cache_creation_input_tokens"))
    split = usage.get("cache_creation")
    hour = (token_count(split.get("ephemeral_1h_input_tokens"))
            if isinstance(split, dict) else 0)
    output = token_count(usage.get("output_tokens"))
    prompt = uncached + read + written
    return Usage(prompt, output, prompt + output, cache_read_tokens=read,
                 cache_write_tokens=written, cache_write_1h_tokens=min(hour, written))
