"""Gemini's answers (``GenerateContentResponse``) into the hub form and out of it, whole and
as a stream, and the model's parts as Gemini spells them (shared with the request writer,
whose history holds the same parts).

What Gemini does its own way (ai.google.dev/api/generate-content, the google-genai SDK's
types):

- A function call comes whole (``functionCall {name, args, id?}``; ``args`` an object),
  never in pieces, and usually without an id: a reader makes one from the answer's
  ``responseId`` and the call's ordinal, prefixed ``GENERATED_ID``, which the writers leave
  out again (Gemini matches a ``functionResponse`` by name; sending back an id it never
  gave would say something it did not).
- A thought is a text part with ``thought: true``; a ``thoughtSignature`` (Gemini 3 puts
  one on the first ``functionCall`` part of a step, and requires it back) may sit on any
  part. A signature on a part that is no thought is read as a ``Thinking`` with no text
  just before that part (Anthropic's order: the proof of a model's thinking comes before
  what it did), and written back onto the part that follows it.
- A stream is ``data:`` frames of whole ``GenerateContentResponse`` chunks, each with the
  usage so far (the last wins), the finish reason in the last; no end marker. A failure in
  band is an error object, ``{"error": {code, message, status}}``.
- Usage: ``promptTokenCount`` counts cached tokens too (``cachedContentTokenCount`` is
  part of it); ``candidatesTokenCount`` leaves the thoughts out (``thoughtsTokenCount``):
  output is their sum.
"""

from __future__ import annotations

import base64
import binascii
import json

from llm_gateway.translate.form import (
    CUSTOM_INPUT,
    Begin,
    Event,
    Failure,
    Finish,
    Part,
    Refusal,
    RefusalDelta,
    Reply,
    Request,
    Stop,
    Text,
    TextDelta,
    Thinking,
    ThinkingDelta,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallBegin,
    Usage,
)
from llm_gateway.translate.frames import data_frame

# The prefix of a call id the gateway made for a call Gemini gave none.
GENERATED_ID = "gcall_"

_FILTERED = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII",
                       "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION",
                       "LANGUAGE", "MODEL_ARMOR"})
# What a form stop is in Gemini's words (a caller of Gemini reads these).
_FINISH_REASONS: dict[str, str] = {"end": "STOP", "tool": "STOP", "stop_sequence": "STOP",
                                   "pause": "STOP", "length": "MAX_TOKENS",
                                   "filter": "SAFETY", "refusal": "SAFETY"}
# google.rpc.Code names (what Gemini's errors say in ``status``): the HTTP status each
# answers with, and the error type of the gateway's catalogue (errors.CATALOGUE) it is.
_STATUS_CODES: dict[str, tuple[int, str]] = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "FAILED_PRECONDITION": (400, "invalid_request_error"),
    "OUT_OF_RANGE": (400, "invalid_request_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "NOT_FOUND": (404, "invalid_request_error"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "CANCELLED": (499, "upstream_error"),
    "INTERNAL": (500, "upstream_error"),
    "UNKNOWN": (500, "upstream_error"),
    "UNAVAILABLE": (503, "service_unavailable"),
    "DEADLINE_EXCEEDED": (504, "upstream_error"),
}
_STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
                 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


# ---- reading --------------------------------------------------------------------------------


def stop_of(reason: object, calls: bool) -> Stop:
    """A candidate's ``finishReason`` as the form's stop; STOP with function calls in the
    answer is a tool stop (Gemini has no reason of its own for it)."""
    if reason == "MAX_TOKENS":
        return "length"
    if reason in _FILTERED:
        return "filter"
    # STOP, and MALFORMED_FUNCTION_CALL, OTHER, ...: the model ended; what it said stands.
    return "tool" if calls else "end"


def usage_of(metadata: object) -> Usage | None:
    if not isinstance(metadata, dict):
        return None
    prompt = _count(metadata.get("promptTokenCount"))
    # Tokens of what a server tool (Google Search) fed the model: input too.
    prompt += _count(metadata.get("toolUsePromptTokenCount"))
    thoughts = _count(metadata.get("thoughtsTokenCount"))
    return Usage(input_tokens=prompt,
                 output_tokens=_count(metadata.get("candidatesTokenCount")) + thoughts,
                 cache_read_tokens=min(_count(metadata.get("cachedContentTokenCount")), prompt),
                 reasoning_tokens=thoughts)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def call_id(part_call: dict, response_id: str, ordinal: int) -> str:
    given = part_call.get("id")
    if isinstance(given, str) and given:
        return given
    return f"{GENERATED_ID}{response_id}_{ordinal}" if response_id else f"{GENERATED_ID}{ordinal}"


def arguments_text(args: object) -> str:
    return json.dumps(args if isinstance(args, dict) else {}, ensure_ascii=False)


def read_model_parts(parts: object, response_id: str, first_call: int = 0) -> list[Part]:
    """A model content's parts in the form's (``first_call``: the ordinal of its first
    function call within the answer)."""
    read: list[Part] = []
    calls = first_call
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict):
            continue
        signature = part.get("thoughtSignature")
        signature = signature if isinstance(signature, str) and signature else None
        text = part.get("text")
        if part.get("thought") is True:
            read.append(Thinking(text if isinstance(text, str) else "", signature=signature))
            continue
        if signature is not None:
            read.append(Thinking("", signature=signature))
        function_call = part.get("functionCall")
        if isinstance(function_call, dict):
            read.append(ToolCall(call_id(function_call, response_id, calls),
                                 str(function_call.get("name") or ""),
                                 arguments_text(function_call.get("args"))))
            calls += 1
        elif isinstance(text, str) and (text or signature is None):
            read.append(Text(text))
    return read


def read_reply(body: dict) -> Reply:
    response_id = body.get("responseId") if isinstance(body.get("responseId"), str) else ""
    model = body.get("modelVersion") if isinstance(body.get("modelVersion"), str) else ""
    candidates = body.get("candidates")
    candidate = candidates[0] if isinstance(candidates, list) and candidates \
        and isinstance(candidates[0], dict) else None
    usage = usage_of(body.get("usageMetadata"))
    if candidate is None:
        # No candidate: the prompt itself was blocked (promptFeedback.blockReason).
        return Reply(response_id, model, [], "filter" if _blocked(body) else "end", usage=usage)
    content = candidate.get("content")
    parts = read_model_parts(content.get("parts") if isinstance(content, dict) else None,
                             response_id)
    stop = stop_of(candidate.get("finishReason"),
                   any(isinstance(part, ToolCall) for part in parts))
    return Reply(response_id, model, parts, stop, usage=usage)


def _blocked(body: dict) -> bool:
    feedback = body.get("promptFeedback")
    return isinstance(feedback, dict) and bool(feedback.get("blockReason"))


def failure_of(error: object) -> Failure:
    """Gemini's error object (``{code, message, status}``) as the form's Failure."""
    error = error if isinstance(error, dict) else {}
    name = error.get("status") if isinstance(error.get("status"), str) else ""
    status, kind = _STATUS_CODES.get(name, (0, ""))
    code = error.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        status = code
    status = status or 500
    if not kind:
        kind = "upstream_error" if status >= 500 else "invalid_request_error"
    message = error.get("message")
    return Failure(message if isinstance(message, str) else json.dumps(error), kind, status)


class GeminiStreamReader:
    """A ``streamGenerateContent?alt=sse`` stream, chunk by chunk, into the form's events."""

    __slots__ = ("_begun", "_block", "_blocks", "_calls", "_id", "_reason", "_stop", "_usage")

    def __init__(self) -> None:
        self._begun = False
        self._id = ""
        self._calls = 0
        self._blocks = -1  # the ordinal of the text or thinking block being streamed
        self._block = ""  # its kind: "text", "thinking", or "" after a call
        self._reason: object = None
        self._stop: Stop | None = None  # a blocked prompt's
        self._usage: Usage | None = None

    def feed(self, payload: dict) -> list[Event]:
        if "error" in payload:
            return [failure_of(payload["error"])]
        events: list[Event] = []
        usage = usage_of(payload.get("usageMetadata"))
        if usage is not None:
            self._usage = usage  # cumulative: the last chunk's is the answer's
        if not self._begun:
            self._begun = True
            self._id = payload.get("responseId") if isinstance(payload.get("responseId"),
                                                               str) else ""
            model = payload.get("modelVersion")
            prompt = Usage(input_tokens=usage.input_tokens,
                           cache_read_tokens=usage.cache_read_tokens) if usage else None
            events.append(Begin(self._id, model if isinstance(model, str) else "", prompt))
        if _blocked(payload):
            self._stop = "filter"
        candidates = payload.get("candidates")
        if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
            candidate = candidates[0]
            content = candidate.get("content")
            parts = read_model_parts(content.get("parts") if isinstance(content, dict)
                                     else None, self._id, self._calls)
            for part in parts:
                events.extend(self._events_of(part))
            if candidate.get("finishReason") is not None:
                self._reason = candidate["finishReason"]  # held until the stream's end
        return events

    def _events_of(self, part: Part) -> list[Event]:
        if isinstance(part, ToolCall):
            index = self._calls
            self._calls += 1
            self._block = ""
            return [ToolCallBegin(index, part.id, part.name),
                    ToolArgumentsDelta(index, part.arguments)]
        kind = "thinking" if isinstance(part, Thinking) else "text"
        if kind != self._block:
            self._blocks += 1
            self._block = kind
        if isinstance(part, Thinking):
            return [ThinkingDelta(part.text, part.signature, self._blocks)]
        assert isinstance(part, Text)
        return [TextDelta(part.text, self._blocks)] if part.text else []

    def end(self) -> list[Event]:
        events: list[Event] = [] if self._begun else [Begin(self._id, "")]
        stop = self._stop or stop_of(self._reason, self._calls > 0)
        events.append(Finish(stop, self._usage))
        return events


# ---- writing --------------------------------------------------------------------------------


def args_of(call: ToolCall) -> dict:
    """A call's arguments as the object ``functionCall.args`` is: a custom tool's free-form
    input under CUSTOM_INPUT; text that is no JSON object (a model's broken JSON) too, so
    that nothing of it is lost."""
    if call.kind == "custom":
        return {CUSTOM_INPUT: call.arguments}
    if not call.arguments.strip():
        return {}
    try:
        parsed = json.loads(call.arguments)
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {CUSTOM_INPUT: call.arguments}


def function_call_part(call: ToolCall) -> dict:
    written: dict = {"name": call.name, "args": args_of(call)}
    if not call.id.startswith(GENERATED_ID):
        written["id"] = call.id
    return {"functionCall": written}


def _decodable(signature: str | None) -> str | None:
    """``signature`` if Gemini can take it: ``thoughtSignature`` is bytes, base64 in JSON, and
    anything else is a 400 (a signature from another protocol need not be base64)."""
    if not signature:
        return None
    try:
        base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return None
    return signature


def model_part(part: Part) -> dict | None:
    """One of the model's parts as Gemini writes it; None for what has no part of its own
    (a signature with no text rides on the next part)."""
    if isinstance(part, Text | Refusal):
        return {"text": part.text}
    if isinstance(part, ToolCall):
        return function_call_part(part)
    if isinstance(part, Thinking) and part.text and not part.redacted:
        written: dict = {"text": part.text, "thought": True}
        if _decodable(part.signature):
            written["thoughtSignature"] = part.signature
        return written
    return None


def model_parts(parts: list[Part]) -> list[dict]:
    """The model's parts in Gemini's spelling, each signature on the part it came with."""
    written: list[dict] = []
    pending: str | None = None
    for part in parts:
        if isinstance(part, Thinking) and not part.text and not part.redacted:
            pending = _decodable(part.signature) or pending
            continue
        out = model_part(part)
        if out is None:
            continue
        if pending is not None and "thoughtSignature" not in out:
            out["thoughtSignature"] = pending
        pending = None
        written.append(out)
    if pending is not None:  # a signature at the end of the answer: on an empty part
        written.append({"text": "", "thoughtSignature": pending})
    return written


def usage_metadata(usage: Usage) -> dict:
    reasoning = min(usage.reasoning_tokens, usage.output_tokens)
    written = {"promptTokenCount": usage.input_tokens,
               "candidatesTokenCount": usage.output_tokens - reasoning,
               "totalTokenCount": usage.input_tokens + usage.output_tokens}
    if usage.cache_read_tokens:
        written["cachedContentTokenCount"] = usage.cache_read_tokens
    if reasoning:
        written["thoughtsTokenCount"] = reasoning
    return written


def write_reply(reply: Reply, request: Request) -> dict:
    parts = model_parts(reply.parts)
    candidate: dict = {"content": {"role": "model", "parts": parts or [{"text": ""}]},
                       "finishReason": _FINISH_REASONS.get(reply.stop, "STOP"), "index": 0}
    body: dict = {"candidates": [candidate]}
    if reply.usage is not None:
        body["usageMetadata"] = usage_metadata(reply.usage)
    body["modelVersion"] = reply.model or request.model
    if reply.id:
        body["responseId"] = reply.id
    return body


def error_object(status: int, message: str) -> dict:
    """Gemini's error body: what its stream carries in band too."""
    name = _STATUS_NAMES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    return {"error": {"code": status, "message": message, "status": name}}


class GeminiStreamWriter:
    """The form's events as a Gemini caller's stream: one chunk per delta, a function
    call whole once its arguments are (Gemini never sends one in pieces)."""

    __slots__ = ("_calls", "_id", "_model", "_signature", "_usage")

    def __init__(self, request: Request) -> None:
        self._id = ""
        self._model = request.model
        self._calls: list[ToolCall] = []  # begun, their arguments still coming
        self._signature: str | None = None  # to ride on the next part
        self._usage: Usage | None = None

    def write(self, event: Event) -> bytes:
        if isinstance(event, Begin):
            self._id = event.id
            self._model = event.model or self._model
            self._usage = event.usage
            return b""
        if isinstance(event, ToolCallBegin):
            out = self._flush()
            self._calls.append(ToolCall(event.id, event.name, "", event.kind))
            return out
        if isinstance(event, ToolArgumentsDelta):
            if self._calls:
                self._calls[-1].arguments += event.fragment
            return b""
        if isinstance(event, Failure):
            return self._flush() + data_frame(error_object(event.status, event.message))
        if isinstance(event, Finish):
            return self._finish(event)
        return self._flush() + self._delta(event)

    def _delta(self, event: Event) -> bytes:
        part: Part
        if isinstance(event, TextDelta):
            part = Text(event.text)
        elif isinstance(event, RefusalDelta):
            part = Refusal(event.text)
        elif isinstance(event, ThinkingDelta):
            if not event.text:
                self._signature = _decodable(event.signature) or self._signature
                return b""
            part = Thinking(event.text, event.signature)
        else:
            return b""
        return self._chunk(self._parts([part]))

    def _parts(self, parts: list[Part]) -> list[dict]:
        written = model_parts(parts)
        if self._signature is not None and written and "thoughtSignature" not in written[0]:
            written[0]["thoughtSignature"] = self._signature
            self._signature = None
        return written

    def _flush(self) -> bytes:
        if not self._calls:
            return b""
        calls, self._calls = self._calls, []
        return self._chunk(self._parts(list(calls)))

    def _finish(self, event: Finish) -> bytes:
        parts = self._parts(list(self._calls))
        self._calls = []
        if self._signature is not None:
            parts.append({"text": "", "thoughtSignature": self._signature})
            self._signature = None
        self._usage = event.usage or self._usage
        return self._chunk(parts or [{"text": ""}],
                           _FINISH_REASONS.get(event.stop, "STOP"))

    def _chunk(self, parts: list[dict], reason: str | None = None) -> bytes:
        candidate: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
        if reason is not None:
            candidate["finishReason"] = reason
        chunk: dict = {"candidates": [candidate]}
        if self._usage is not None:
            chunk["usageMetadata"] = usage_metadata(self._usage)
        chunk["modelVersion"] = self._model
        if self._id:
            chunk["responseId"] = self._id
        return data_frame(chunk)

    def fail(self, status: int, type: str, code: str, message: str) -> bytes:
        return self._flush() + data_frame(error_object(status, message))
