"""Anthropic's Messages API (``POST /messages``, ``POST /messages/count_tokens``), spoken
natively: Claude Code and the Anthropic SDKs.

The body: a non-empty ``messages`` list, the output cap in ``max_tokens`` (per answer: no
``n``), the prompt in ``system`` (a string or text blocks) and the messages' blocks (text,
tool use and results). The end user is ``metadata.user_id``. Usage is split across a
stream: ``message_start.message.usage``, then ``message_delta.usage``, cumulative (the
latest value of each field wins); a stream ends with ``message_stop``. Errors are
Anthropic's ``{"type": "error", "error": {"type", "message"}}``, with the status the SDK
maps to the same exception as the API's (a spent budget is a 429, ``rate_limit_error``);
in a stream, an ``event: error``.
"""

from __future__ import annotations

import json

from llm_gateway import errors, jsonio
from llm_gateway.errors import Rejection
from llm_gateway.observe import ResponseFacts, StreamObserver
from llm_gateway.protocols.base import (
    OpenAICompatible,
    check_messages,
    check_stream_and_caps,
    check_user,
    event_frame,
)
from llm_gateway.providers import Profile
from llm_gateway.providers.anthropic import anthropic_usage
from llm_gateway.tokens import TOKENS_PER_MESSAGE, estimate_text

# Anthropic's error type for each status the gateway answers.
_TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                   413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}
# The usage fields a stream reports, merged as they come (the latest wins).
_USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens",
                 "cache_creation_input_tokens", "cache_creation")


def anthropic_error(status: int, type_: str, code: str, message: str) -> bytes:
    kind = _TYPE_BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")
    if status == 503:
        kind = "overloaded_error"
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


class Messages(OpenAICompatible):
    name = "messages"
    wire = "messages"
    cap_fields = ("max_tokens",)
    error_shape = staticmethod(anthropic_error)  # type: ignore[assignment]

    def check(self, payload: dict) -> Rejection | None:
        metadata = payload.get("metadata")
        return (check_messages(payload) or check_stream_and_caps(payload, self.cap_fields)
                or check_user("metadata.user_id",
                              metadata.get("user_id") if isinstance(metadata, dict) else None))

    def end_user(self, payload: dict) -> str | None:
        metadata = payload.get("metadata")
        user = metadata.get("user_id") if isinstance(metadata, dict) else None
        return user if isinstance(user, str) and user else None

    def choices(self, payload: dict) -> int:
        return 1

    def prompt_tokens(self, payload: dict) -> int:
        return _text_tokens(payload.get("system")) + sum(
            TOKENS_PER_MESSAGE + _text_tokens(message.get("content"))
            for message in payload["messages"])

    def wants_stream_usage(self, payload: dict) -> bool:
        return True  # every event is the client's

    def relays(self, payload: dict, wants_usage: bool) -> bool:
        return True

    def upstream_payload(self, profile: Profile, payload: dict, *, stream: bool) -> dict:
        return payload

    def response_facts(self, profile: Profile) -> ResponseFacts:
        return ResponseFacts(profile, read_message)

    def stream_observer(self, profile: Profile) -> StreamObserver:
        return StreamObserver(profile, read_message)

    def upstream_error(self, profile: Profile, body: bytes, status: int) -> bytes:
        """Anthropic's error as it came (key scrubbed already); anything else (a load
        balancer's page) in Anthropic's shape, quoting what arrived."""
        payload = jsonio.object_of(body)
        error = payload.get("error") if payload else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return body
        text = body.decode("utf-8", "replace").strip()[:500] or f"upstream answered HTTP {status}"
        return anthropic_error(status, "", "", text)

    def cap_end(self, facts: ResponseFacts, prompt_tokens: int, output_tokens: int,
                choices: int, now: float) -> list[bytes]:
        """The open content block's stop, ``message_delta`` (``max_tokens``, the output
        counted; the input too unless ``message_start`` said it), ``message_stop``."""
        frames = []
        if isinstance(block := facts.state.get("open_block"), int):
            frames.append(event_frame("content_block_stop",
                                      {"type": "content_block_stop", "index": block}))
        usage = {"output_tokens": output_tokens}
        merged = facts.state.get("usage")
        if not (isinstance(merged, dict) and "input_tokens" in merged):
            usage["input_tokens"] = prompt_tokens
        frames.append(event_frame("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
            "usage": usage}))
        frames.append(event_frame("message_stop", {"type": "message_stop"}))
        return frames

    def stream_error(self, code: str, message: str, facts: ResponseFacts | None = None) -> bytes:
        kind = errors.CATALOGUE[code]
        return b"event: error\ndata: " + anthropic_error(kind.status, kind.type, code,
                                                        message) + b"\n\n"


MESSAGES = Messages()


def _text_tokens(content: object) -> int:
    """A system prompt's or a message's content: a string, or blocks (text, tool input
    and results) counted by their text."""
    if isinstance(content, str):
        return estimate_text(content)
    if not isinstance(content, list):
        return 0
    total = 0
    for block in content:
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            total += estimate_text(block["text"])
        elif block.get("type") == "tool_use":
            total += estimate_text(json.dumps(block.get("input")))
        elif block.get("type") == "tool_result":
            total += _text_tokens(block.get("content"))
    return total


def read_message(facts: ResponseFacts, payload: dict) -> None:
    """A message (JSON) or one stream event: ids, model, stop reason, usage (merged field
    by field), text seen, the first error, the end."""
    kind = payload.get("type")
    if kind == "error" and facts.error is None:
        facts.error = _error_of(payload)
        return
    message = payload if kind == "message" else payload.get("message")
    if isinstance(message, dict):
        if facts.response_id is None and isinstance(message.get("id"), str):
            facts.response_id = message["id"]
        if not facts.model and isinstance(message.get("model"), str):
            facts.model = message["model"]
        _stop(facts, message.get("stop_reason"))
        _merge_usage(facts, message.get("usage"))
        if kind == "message":
            for block in message.get("content") or ():
                facts.text_chars += _block_chars(block)
    elif kind == "content_block_delta":
        delta = payload.get("delta")
        if isinstance(delta, dict):
            facts.text_chars += sum(len(delta[name]) for name in ("text", "partial_json",
                                                                 "thinking")
                                    if isinstance(delta.get(name), str))
    elif kind == "message_delta":
        delta = payload.get("delta")
        _stop(facts, delta.get("stop_reason") if isinstance(delta, dict) else None)
        _merge_usage(facts, payload.get("usage"))
    elif kind == "content_block_start" and isinstance(payload.get("index"), int):
        facts.state["open_block"] = payload["index"]  # what an end at the cap must close
    elif kind == "content_block_stop":
        facts.state.pop("open_block", None)
    elif kind == "message_stop":
        facts.done = True


def _stop(facts: ResponseFacts, reason: object) -> None:
    if isinstance(reason, str):
        facts.finish_reasons.append(reason)


def _merge_usage(facts: ResponseFacts, usage: object) -> None:
    if not isinstance(usage, dict):
        return
    merged = facts.state.setdefault("usage", {})
    assert isinstance(merged, dict)
    merged.update((name, usage[name]) for name in _USAGE_FIELDS if usage.get(name) is not None)
    facts.usage = anthropic_usage(merged)


def _block_chars(block: object) -> int:
    if not isinstance(block, dict):
        return 0
    if isinstance(block.get("text"), str):
        return len(block["text"])
    if isinstance(block.get("thinking"), str):
        return len(block["thinking"])
    if block.get("type") == "tool_use":
        return len(json.dumps(block.get("input")))
    return 0


def _error_of(payload: dict) -> dict[str, str | None]:
    error = payload.get("error")
    error = error if isinstance(error, dict) else {}
    message, kind = error.get("message"), error.get("type")
    return {"message": message if isinstance(message, str) else json.dumps(error),
            "type": kind if isinstance(kind, str) else None,
            "code": kind if isinstance(kind, str) else None}
