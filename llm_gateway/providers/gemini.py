"""Google's Gemini API (https://generativelanguage.googleapis.com/v1beta): the ``gemini`` wire
protocol natively (``/models/{model}:generateContent``, ``:streamGenerateContent?alt=sse``).

The key goes in ``x-goog-api-key``. Usage is ``usageMetadata`` in a JSON answer and in every
stream chunk (cumulative: the last wins): ``promptTokenCount`` counts every input token,
those served from the context cache (``cachedContentTokenCount``) included, as OpenAI's
does; ``candidatesTokenCount`` leaves the thoughts (``thoughtsTokenCount``) out, so
``completion_tokens`` is their sum. Errors are ``{"error": {"code", "message", "status"}}``,
``status`` a google.rpc code name (RESOURCE_EXHAUSTED with 429, UNAVAILABLE with 503, so the
relay's status rules apply as they are). Beware: a wrong key is a 400 INVALID_ARGUMENT (reason
API_KEY_INVALID), not a 401; a missing one a 403 PERMISSION_DENIED.

``read_gemini`` is what reads a Gemini answer, or chunk, into a response's facts (observe's
``Reader``); it lives here, below ``observe``, and takes any object with the facts' fields.
"""

from __future__ import annotations

import json
from typing import Protocol

from llm_gateway.errors import error_body
from llm_gateway.providers.base import Usage
from llm_gateway.providers.openai import error_type_for_status, json_object, token_count

BASE_URL = "https://generativelanguage.googleapis.com/v1beta"


class GeminiProfile:
    name = "gemini"
    sends_stream_usage = True  # usageMetadata is in every chunk, asked or not
    reports_cost = False
    protocols = frozenset({"gemini"})
    auth_header = "x-goog-api-key"
    default_headers: tuple[tuple[str, str], ...] = ()
    base_url = BASE_URL

    def prepare(self, payload: dict, *, stream: bool) -> dict:
        return payload  # spoken natively: a chat body is translated before, never here

    def usage(self, payload: object) -> Usage | None:
        if not isinstance(payload, dict):
            return None
        metadata = payload.get("usageMetadata")
        return gemini_usage(metadata) if isinstance(metadata, dict) else None

    def error_in(self, payload: dict) -> dict[str, str | None] | None:
        error = payload.get("error")
        if not isinstance(error, dict):
            return None
        message, status = error.get("message"), error.get("status")
        return {"message": message if isinstance(message, str) else json.dumps(error),
                "type": status if isinstance(status, str) else None,
                "code": status if isinstance(status, str) else None}

    def error_body(self, body: bytes, status: int) -> bytes:
        """In OpenAI's shape, the message verbatim and the status name as its code."""
        payload = json_object(body)
        error = payload.get("error") if payload else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            name = error.get("status")
            return error_body(error["message"], error_type_for_status(status),
                              name if isinstance(name, str) else None)
        text = body.decode("utf-8", "replace").strip()[:500] or f"upstream answered HTTP {status}"
        return error_body(text, error_type_for_status(status), None)


def gemini_usage(metadata: dict) -> Usage:
    prompt = token_count(metadata.get("promptTokenCount"))
    # What a server-side tool (Google Search) fed the model is input too, billed as such.
    prompt += token_count(metadata.get("toolUsePromptTokenCount"))
    thoughts = token_count(metadata.get("thoughtsTokenCount"))
    completion = token_count(metadata.get("candidatesTokenCount")) + thoughts
    reported = metadata.get("totalTokenCount")
    total = token_count(reported) if isinstance(reported, int) else prompt + completion
    return Usage(prompt, completion, total or prompt + completion,
                 cache_read_tokens=min(token_count(metadata.get("cachedContentTokenCount")),
                                       prompt),
                 reasoning_tokens=thoughts)


class Facts(Protocol):
    """What ``read_gemini`` sets: observe.ResponseFacts' fields (named here structurally,
    since observe sits above the providers)."""

    response_id: str | None
    model: str | None
    finish_reasons: list[str]
    usage: Usage | None
    error: dict[str, str | None] | None
    text_chars: int
    done: bool


_PROFILE = GeminiProfile()


def read_gemini(facts: Facts, payload: dict) -> None:
    """A GenerateContentResponse (JSON) or one stream chunk: the first id, model and error
    win; usage the last; finish reasons and the text seen from the candidates; done once a
    candidate has a finish reason (a stream's last chunk) or the prompt was blocked."""
    if "error" in payload:
        if facts.error is None:
            facts.error = _PROFILE.error_in(payload)
        return
    if facts.response_id is None and isinstance(payload.get("responseId"), str):
        facts.response_id = payload["responseId"]
    if not facts.model and isinstance(payload.get("modelVersion"), str):
        facts.model = payload["modelVersion"] or None
    usage = _PROFILE.usage(payload)
    if usage is not None:
        facts.usage = usage
    feedback = payload.get("promptFeedback")
    if isinstance(feedback, dict) and isinstance(feedback.get("blockReason"), str):
        facts.finish_reasons.append(feedback["blockReason"])
        facts.done = True
    candidates = payload.get("candidates")
    for candidate in candidates if isinstance(candidates, list) else ():
        if not isinstance(candidate, dict):
            continue
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else ():
            facts.text_chars += _part_chars(part)
        reason = candidate.get("finishReason")
        if isinstance(reason, str):
            facts.finish_reasons.append(reason)
            facts.done = True


def _part_chars(part: object) -> int:
    if not isinstance(part, dict):
        return 0
    if isinstance(part.get("text"), str):
        return len(part["text"])
    call = part.get("functionCall")
    if isinstance(call, dict):
        return len(json.dumps(call.get("args") or {}))
    return 0
