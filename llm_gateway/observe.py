"""The observe step: what a response says about itself, from a JSON body or an SSE stream.

``ResponseFacts`` collects the response id, the model that answered, finish reasons, usage
and the first error, from decoded payloads (a whole JSON body once, or every chunk of a
stream), as the caller's protocol reads them (a ``Reader``; OpenAI's, ``read_openai``, asks
the provider's profile for usage). ``StreamObserver`` feeds it from SSE bytes as they
are relayed, with the stream's timings. Both only observe: garbage is counted, never
raised, because a broken upstream frame must not break the relay.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from llm_gateway import jsonio
from llm_gateway.providers import Profile, Usage
from llm_gateway.sse import SSEEvent, SSEParser


class ResponseFacts:
    """What a response says of itself, as ``read`` (the caller's protocol's reader) finds
    it in each decoded body or event."""

    __slots__ = ("_profile", "_read", "done", "error", "finish_reasons", "model", "response_id",
                 "state", "text_chars", "usage")

    def __init__(self, profile: Profile, read: Reader | None = None) -> None:
        self._profile = profile
        self._read = read or read_openai
        self.response_id: str | None = None
        self.model: str | None = None
        self.finish_reasons: list[str] = []
        self.usage: Usage | None = None
        self.error: dict[str, str | None] | None = None
        # Characters of generated text seen: what usage is estimated from when the
        # provider reports none (a cut stream), and what a stream has spent so far.
        self.text_chars = 0
        self.done = False  # a stream reached the end its protocol defines
        # What a protocol's reader keeps between events (Anthropic's usage so far, the
        # last sequence number of a Responses stream).
        self.state: dict[str, object] = {}

    @property
    def profile(self) -> Profile:
        return self._profile

    def observe(self, payload: dict) -> None:
        """One decoded body or stream chunk."""
        self._read(self, payload)


Reader = Callable[[ResponseFacts, dict], None]


def read_openai(facts: ResponseFacts, payload: dict) -> None:
    """An OpenAI-style body or chunk: the first id, model and error win; finish reasons
    and text from ``choices``; usage as the provider's profile reads it (the last wins)."""
    if "error" in payload and facts.error is None:
        # The first error is the cause; anything after it is usually fallout.
        facts.error = facts.profile.error_in(payload)
    if facts.response_id is None and isinstance(payload.get("id"), str):
        facts.response_id = payload["id"]
    if not facts.model:
        model = payload.get("model")
        if isinstance(model, str) and model:
            facts.model = model
    choices = payload.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict):
                finish_reason = choice.get("finish_reason")
                if isinstance(finish_reason, str):
                    facts.finish_reasons.append(finish_reason)
                facts.text_chars += _said_chars(choice.get("delta") or choice.get("message"))
    usage = facts.profile.usage(payload)
    if usage is not None:
        facts.usage = usage


# What a chat message or delta says that is billed as output: its text, its reasoning
# (Venice's and DeepSeek's reasoning_content, OpenRouter's reasoning) and a refusal.
_SAID_TEXT = ("content", "reasoning_content", "reasoning", "refusal")


def _said_chars(said: object) -> int:
    """Characters of output in one chat message or delta: its texts and its tool calls'
    arguments (a streamed call comes as argument fragments), so that an estimate counts
    every output token that was relayed, not only the visible text."""
    if not isinstance(said, dict):
        return 0
    total = sum(len(said[name]) for name in _SAID_TEXT if isinstance(said.get(name), str))
    calls = said.get("tool_calls")
    for call in calls if isinstance(calls, list) else ((said.get("function_call"),)):
        function = call.get("function", call) if isinstance(call, dict) else None
        if isinstance(function, dict):
            total += sum(len(function[name]) for name in ("name", "arguments")
                         if isinstance(function.get(name), str))
    return total


def _one_data_line(frame: bytes) -> bytes | None:
    """The data of a whole frame that is ``data: X`` or ``event: E`` then ``data: X`` (and
    the blank line, no CR); None for any other frame (the parser reads those)."""
    if not frame.endswith(b"\n\n") or b"\r" in frame:
        return None
    lines = frame.count(b"\n")
    if lines == 2 and frame.startswith(b"data: "):
        return frame[6:-2]
    if lines == 3 and frame.startswith(b"event: "):
        start = frame.index(b"\n") + 1
        if frame.startswith(b"data: ", start):
            return frame[start + 6:-2]
    return None


# The fast path's answer for bytes the SSE parser must read instead.
_NOT_JSON = object()


class StreamObserver(ResponseFacts):
    """Watches an SSE stream being relayed, each event's payload read as its protocol
    reads it; the caller relays the original bytes untouched. ``data: [DONE]`` (OpenAI's
    end) is known here; a protocol whose stream ends with an event of its own says so in
    its reader (``done``)."""

    __slots__ = (
        "_parser", "event_count", "first_event_at", "last_event_at", "malformed_count",
        "max_gap",
    )

    def __init__(self, profile: Profile, read: Reader | None = None) -> None:
        super().__init__(profile, read)
        self._parser = SSEParser()
        self.event_count = 0
        self.malformed_count = 0
        self.first_event_at: float | None = None
        self.last_event_at: float | None = None
        self.max_gap = 0.0

    def feed(self, chunk: bytes, now: float) -> list[dict]:
        """Observe ``chunk``; ``now`` is the caller's time.monotonic() when it arrived.
        Returns the payloads of the events it completed."""
        data = _one_data_line(chunk) if self._parser.between_events() else None
        if data is not None:
            # Nearly every frame a provider sends: one data line (after an event line, in
            # Anthropic's and Responses' streams: the payload's type says the same) and
            # the blank line. Its JSON is read straight from the bytes; the parser would
            # find the same event.
            payload = self._data_frame(data, now)
            if payload is not _NOT_JSON:
                return [] if payload is None else [payload]
        payloads = []
        for event in self._parser.feed(chunk):
            payload = self._event(event, now)
            if payload is not None:
                payloads.append(payload)
        return payloads

    def _data_frame(self, data: bytes, now: float) -> dict | object | None:
        """The payload of a one-line data event, None when there is none to give, or
        _NOT_JSON when the bytes need the parser's reading (not UTF-8, not JSON)."""
        if data == b"[DONE]":
            self._timing(now)
            self.event_count += 1
            self.done = True
            return None
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return _NOT_JSON
        self._timing(now)
        self.event_count += 1
        if not isinstance(payload, dict):
            self.malformed_count += 1
            return None
        self.observe(payload)
        return payload

    def _timing(self, now: float | None) -> None:
        if now is not None:
            if self.last_event_at is None:
                self.first_event_at = now
            else:
                self.max_gap = max(self.max_gap, now - self.last_event_at)
            self.last_event_at = now

    def close(self) -> None:
        for event in self._parser.close():
            self._event(event, None)

    def _event(self, event: SSEEvent, now: float | None) -> dict | None:
        self.event_count += 1
        self._timing(now)
        if event.data == "[DONE]":
            self.done = True
            return None
        try:
            payload = jsonio.loads(event.data)
        except (ValueError, RecursionError):
            self.malformed_count += 1
            return None
        if not isinstance(payload, dict):
            # Valid JSON, but no OpenAI-compatible frame is anything other than an object.
            self.malformed_count += 1
            return None
        self.observe(payload)
        return payload
