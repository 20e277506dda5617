"""Anthropic's whole answer (a ``message``) into the hub form, and the form's answer written
back for a Messages caller as the anthropic SDK parses it; with what the request and stream
modules share: stop reasons, usage (Anthropic's ``input_tokens`` excludes the prompt cache's
tokens; the form's counts them), error types, a tool call's input. The requests are
``messages`` (writing) and ``messages_reader`` (reading); the streams ``messages_stream``.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from llm_gateway.translate.form import (
    Image,
    Part,
    Refusal,
    Reply,
    Request,
    Stop,
    Text,
    Thinking,
    ToolCall,
    Usage,
)

# form.Stop <-> Anthropic's stop_reason.
STOP_REASON: dict[str, str] = {"end": "end_turn", "length": "max_tokens", "tool": "tool_use",
                                "stop_sequence": "stop_sequence", "refusal": "refusal",
                                "filter": "refusal", "pause": "pause_turn"}
STOP_OF: dict[str, Stop] = {"end_turn": "end", "max_tokens": "length",
                             "model_context_window_exceeded": "length", "tool_use": "tool",
                             "stop_sequence": "stop_sequence", "refusal": "refusal",
                             "pause_turn": "pause"}

# Anthropic's error type for a status, as protocols/messages.py's anthropic_error writes it
# (the translators sit below the protocols and cannot import it; a test holds them equal).
_TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                   413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                   529: "overloaded_error"}
_ERROR_TYPES = frozenset(_TYPE_BY_STATUS.values()) | {"api_error", "billing_error"}
# The status of an in-band error, by its type (Anthropic's errors page).
STATUS_OF_TYPE = {"invalid_request_error": 400, "authentication_error": 401,
                   "billing_error": 402, "permission_error": 403, "not_found_error": 404,
                   "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
                   "timeout_error": 504, "overloaded_error": 529}


def error_type(status: int, type_: str = "") -> str:
    if type_ in _ERROR_TYPES:
        return type_
    return _TYPE_BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")


def drop(request: Request, name: str) -> None:
    if name not in request.dropped:
        request.dropped.append(name)


def json_text(value: object) -> str:
    """A tool's input as JSON text; the standard library where orjson refuses (an integer
    beyond 64 bits, a lone surrogate)."""
    try:
        return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, UnicodeDecodeError):
        return json.dumps(value, separators=(",", ":"))


def input_of(arguments: str) -> dict:
    """A tool call's arguments as the ``input`` object Anthropic's blocks hold. No
    arguments is ``{}``; arguments that are no JSON object (a chat target's malformed
    call) become ``{"input": <the text>}`` rather than ``{}``: the tool then refuses an
    argument it does not know, with an error the model reads and corrects, and the text the
    model wrote stays in the conversation, where ``{}`` would pass for a call without
    arguments."""
    if not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"input": arguments}
    return value if isinstance(value, dict) else {"input": arguments}


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# ---- the caller's side: writing an answer ----------------------------------------------------


def write_usage(usage: Usage | None) -> dict[str, Any]:
    usage = usage or Usage()
    written = {
        # Anthropic's input_tokens excludes what the cache read and wrote.
        "input_tokens": max(0, usage.input_tokens - usage.cache_read_tokens
                            - usage.cache_write_tokens),
        "output_tokens": usage.output_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
    }
    if usage.reasoning_tokens:
        written["output_tokens_details"] = {"thinking_tokens": usage.reasoning_tokens}
    return written


def _thinking_block(part: Thinking) -> dict[str, Any]:
    if part.redacted:
        return {"type": "redacted_thinking", "data": part.signature or ""}
    # The SDK's ThinkingBlock requires a signature; a chat target's reasoning has none.
    # "" says so (it verifies nothing, and a reader takes it for none, so it is never sent
    # back to Anthropic as if signed).
    return {"type": "thinking", "thinking": part.text, "signature": part.signature or ""}


def write_reply(reply: Reply, request: Request) -> dict:
    content: list[dict[str, Any]] = []
    for part in reply.parts:
        if isinstance(part, Thinking):
            content.append(_thinking_block(part))
        elif isinstance(part, Text | Refusal):
            content.append({"type": "text", "text": part.text})
        elif isinstance(part, ToolCall):
            content.append({"type": "tool_use", "id": part.id, "name": part.name,
                            "input": input_of(part.arguments)})
    return {
        # The target's own id, kept: it is what the usage record and the target's logs
        # know the answer by, and the SDK reads it as opaque (no msg_ prefix required).
        "id": reply.id,
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": STOP_REASON[reply.stop],
        "stop_sequence": reply.stop_sequence if reply.stop == "stop_sequence" else None,
        "usage": write_usage(reply.usage),
    }


# ---- the target's side: reading an answer ----------------------------------------------------


def read_usage(usage: object) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    read = _int(usage.get("cache_read_input_tokens"))
    written = _int(usage.get("cache_creation_input_tokens"))
    details = usage.get("output_tokens_details")
    return Usage(input_tokens=_int(usage.get("input_tokens")) + read + written,
                 output_tokens=_int(usage.get("output_tokens")),
                 cache_read_tokens=read, cache_write_tokens=written,
                 reasoning_tokens=_int(details.get("thinking_tokens"))
                 if isinstance(details, dict) else 0)


def _reply_part(block: object) -> Part | None:
    if not isinstance(block, dict):
        return None
    kind = block.get("type")
    if kind == "text":
        return Text(str(block.get("text", "")))
    if kind == "thinking":
        signature = block.get("signature")
        return Thinking(str(block.get("thinking", "")),
                        signature=signature if isinstance(signature, str) and signature
                        else None)
    if kind == "redacted_thinking":
        return Thinking("", signature=str(block.get("data", "")), redacted=True)
    if kind == "tool_use":
        return ToolCall(str(block.get("id", "")), str(block.get("name", "")),
                        json_text(block.get("input") or {}))
    return None  # a server tool's blocks: never asked for by the writer above


def read_reply(body: dict) -> Reply:
    parts = [part for part in map(_reply_part, body.get("content") or ()) if part is not None]
    stop_sequence = body.get("stop_sequence")
    return Reply(id=str(body.get("id", "")), model=str(body.get("model", "")), parts=parts,
                 stop=STOP_OF.get(str(body.get("stop_reason")), "end"),
                 stop_sequence=stop_sequence if isinstance(stop_sequence, str) else None,
                 usage=read_usage(body.get("usage")))


def image_url(url: str) -> Image:
    """A URL, or a data: URL read into its media type and base64 data."""
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media, _, encoding = head[5:].partition(";")
        if encoding == "base64" and data:
            return Image(data=data, media_type=media or None)
    return Image(url=url)
