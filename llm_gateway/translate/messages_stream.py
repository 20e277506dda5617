"""Anthropic's event stream, both ways: the hub form's events written for a Messages caller
(one block open at a time, as Anthropic's stream has them) and a Messages target's events
read into the form's (usage merged as Anthropic sends it, cumulative).
"""

from __future__ import annotations

import json
from typing import Any

from llm_gateway.translate.form import (
    Begin,
    Event,
    Failure,
    Finish,
    RefusalDelta,
    Request,
    Stop,
    TextDelta,
    ThinkingDelta,
    ToolArgumentsDelta,
    ToolCallBegin,
    Usage,
)
from llm_gateway.translate.frames import event_frame
from llm_gateway.translate.messages_reply import (
    STATUS_OF_TYPE,
    STOP_OF,
    STOP_REASON,
    error_type,
    json_text,
    read_usage,
    write_usage,
)


class MessagesStreamWriter:
    """The hub form's events as Anthropic's event stream. Blocks do not interleave in
    Anthropic's stream: one is open at a time, closed before the next starts. A tool call
    that begins while another is open is held (its argument fragments buffered) until the
    open one is done, since a chat target may still send the open call's fragments; the
    held calls are written whole when the answer goes on to something else or ends."""

    __slots__ = ("_begun", "_early", "_held", "_index", "_open", "_request", "_usage",
                 "ended")

    def __init__(self, request: Request) -> None:
        self._request = request
        self._begun = False
        self._index = 0  # the next block's index
        self._open: tuple[str, int] | None = None  # (text | thinking | tool, form index)
        # Tool calls begun while another was open: form index -> (id, name, fragments).
        self._held: dict[int, tuple[str, str, list[str]]] = {}
        # Fragments of a call not begun yet, written when it begins.
        self._early: dict[int, list[str]] = {}
        self._usage: Usage | None = None
        self.ended = False

    def write(self, event: Event) -> bytes:
        if self.ended:
            return b""
        out: list[bytes] = []
        if not self._begun and not isinstance(event, Failure):
            out.append(self._begin(event if isinstance(event, Begin)
                                   else Begin(id="", model="")))
            if isinstance(event, Begin):
                return b"".join(out)
        if isinstance(event, TextDelta | RefusalDelta):
            if event.text:
                index = event.index if isinstance(event, TextDelta) else -1
                out.append(self._enter(("text", index), {"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": event.text}))
        elif isinstance(event, ThinkingDelta):
            if event.text or event.signature:
                out.append(self._enter(("thinking", event.index),
                                       {"type": "thinking", "thinking": "", "signature": ""}))
            if event.text:
                out.append(self._delta({"type": "thinking_delta", "thinking": event.text}))
            if event.signature:
                out.append(self._delta({"type": "signature_delta",
                                        "signature": event.signature}))
        elif isinstance(event, ToolCallBegin):
            early = self._early.pop(event.index, [])
            if self._open == ("tool", event.index) or event.index in self._held:
                pass  # begun already
            elif self._open is not None and self._open[0] == "tool":
                self._held[event.index] = (event.id, event.name, early)
            else:
                out.append(self._enter(("tool", event.index), self._tool_block(event.id,
                                                                              event.name)))
                if "".join(early):
                    out.append(self._delta({"type": "input_json_delta",
                                            "partial_json": "".join(early)}))
        elif isinstance(event, ToolArgumentsDelta):
            if self._open == ("tool", event.index):
                if event.fragment:
                    out.append(self._delta({"type": "input_json_delta",
                                            "partial_json": event.fragment}))
            elif event.index in self._held:
                self._held[event.index][2].append(event.fragment)
            else:
                # A call not begun yet (or one whose block was closed already by other
                # content: Anthropic's blocks cannot reopen, and such fragments are lost).
                self._early.setdefault(event.index, []).append(event.fragment)
        elif isinstance(event, Finish):
            out.append(self._close())
            out.append(self._flush_held())
            out.append(self._finish(event))
            self.ended = True
        elif isinstance(event, Failure):
            out.append(self._error(error_type(event.status, event.type), event.message))
            self.ended = True
        return b"".join(out)

    def fail(self, status: int, type: str, code: str, message: str) -> bytes:
        if self.ended:
            return b""
        self.ended = True
        # As protocols/messages.py's stream_error: Anthropic's error event, and no more.
        return self._error(error_type(status), message)

    # -- frames --

    def _begin(self, begin: Begin) -> bytes:
        self._begun = True
        usage = write_usage(begin.usage)
        usage["output_tokens"] = 1  # Anthropic's first count is a placeholder; the delta's
        usage.pop("output_tokens_details", None)
        self._usage = begin.usage
        message = {"id": begin.id, "type": "message", "role": "assistant",
                   "model": self._request.model, "content": [], "stop_reason": None,
                   "stop_sequence": None, "usage": usage}
        return (event_frame("message_start", {"type": "message_start", "message": message})
                + event_frame("ping", {"type": "ping"}))

    @staticmethod
    def _tool_block(call_id: str, name: str) -> dict[str, Any]:
        return {"type": "tool_use", "id": call_id, "name": name, "input": {}}

    def _enter(self, key: tuple[str, int], block: dict[str, Any]) -> bytes:
        """``key``'s block open, closing another one (and writing the tool calls held
        behind it) first."""
        if self._open == key:
            return b""
        out = [self._close(), self._flush_held()]
        out.append(self._start(key, block))
        return b"".join(out)

    def _start(self, key: tuple[str, int], block: dict[str, Any]) -> bytes:
        self._open = key
        return event_frame("content_block_start", {"type": "content_block_start",
                                                   "index": self._index,
                                                   "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event_frame("content_block_delta", {"type": "content_block_delta",
                                                   "index": self._index, "delta": delta})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        index, self._index = self._index, self._index + 1
        return event_frame("content_block_stop", {"type": "content_block_stop",
                                                  "index": index})

    def _flush_held(self) -> bytes:
        out = []
        for index, (call_id, name, fragments) in sorted(self._held.items()):
            out.append(self._start(("tool", index), self._tool_block(call_id, name)))
            arguments = "".join(fragments)
            if arguments:
                out.append(self._delta({"type": "input_json_delta",
                                        "partial_json": arguments}))
            out.append(self._close())
        self._held.clear()
        return b"".join(out)

    def _finish(self, finish: Finish) -> bytes:
        usage = write_usage(finish.usage or self._usage)
        delta = {"stop_reason": STOP_REASON[finish.stop],
                 "stop_sequence": finish.stop_sequence if finish.stop == "stop_sequence"
                 else None}
        # The whole usage, input too: a chat target tells its prompt tokens only at the end,
        # and the SDK takes input_tokens from message_delta when it is there.
        return (event_frame("message_delta", {"type": "message_delta", "delta": delta,
                                              "usage": usage})
                + event_frame("message_stop", {"type": "message_stop"}))

    @staticmethod
    def _error(kind: str, message: str) -> bytes:
        return event_frame("error", {"type": "error",
                                     "error": {"type": kind, "message": message}})


class MessagesStreamReader:
    """Anthropic's events into the form's: a block's start says a tool call (its ordinal
    among the answer's calls), deltas say text, thinking and arguments, message_delta
    holds the stop and the usage (cumulative: the latest of each field wins, over
    message_start's), message_stop finishes."""

    __slots__ = ("_calls", "_finished", "_kinds", "_ordinals", "_stop", "_stop_sequence",
                 "_usage")

    def __init__(self) -> None:
        self._usage: dict[str, Any] = {}
        self._stop: Stop = "end"
        self._stop_sequence: str | None = None
        self._calls = 0
        self._ordinals: dict[int, int] = {}  # block index -> ordinal within its kind
        self._kinds: dict[str, int] = {}  # kind -> blocks of it seen
        self._finished = False

    def _merge(self, usage: object) -> None:
        if isinstance(usage, dict):
            self._usage.update((name, value) for name, value in usage.items()
                               if value is not None)

    def feed(self, payload: dict) -> list[Event]:
        if self._finished:
            return []
        kind = payload.get("type")
        if kind == "message_start":
            message = payload.get("message")
            message = message if isinstance(message, dict) else {}
            self._merge(message.get("usage"))
            prompt = read_usage(message.get("usage"))
            if prompt is not None:
                prompt.output_tokens = 0  # message_start's count is a placeholder
                prompt.reasoning_tokens = 0
            return [Begin(id=str(message.get("id", "")), model=str(message.get("model", "")),
                          usage=prompt)]
        if kind == "content_block_start":
            return self._start(payload)
        if kind == "content_block_delta":
            return self._delta(payload)
        if kind == "message_delta":
            delta = payload.get("delta")
            if isinstance(delta, dict):
                if isinstance(delta.get("stop_reason"), str):
                    self._stop = STOP_OF.get(delta["stop_reason"], "end")
                if isinstance(delta.get("stop_sequence"), str):
                    self._stop_sequence = delta["stop_sequence"]
            self._merge(payload.get("usage"))
            return []
        if kind == "message_stop":
            return self.end()
        if kind == "error":
            self._finished = True
            error = payload.get("error")
            error = error if isinstance(error, dict) else {}
            type_ = error.get("type") if isinstance(error.get("type"), str) else "api_error"
            message = error.get("message")
            return [Failure(message if isinstance(message, str) else json.dumps(error),
                            type=type_, status=STATUS_OF_TYPE.get(type_, 500))]
        return []  # ping, and what a newer API version adds

    def _start(self, payload: dict) -> list[Event]:
        block = payload.get("content_block")
        index = payload.get("index")
        if not isinstance(block, dict) or not isinstance(index, int):
            return []
        kind = str(block.get("type"))
        ordinal = self._calls if kind == "tool_use" else self._kinds.get(kind, 0)
        self._ordinals[index] = ordinal
        if kind == "tool_use":
            self._calls += 1
            events: list[Event] = [ToolCallBegin(ordinal, str(block.get("id", "")),
                                                 str(block.get("name", "")))]
            if block.get("input"):  # a server that sends the whole input at the start
                events.append(ToolArgumentsDelta(ordinal, json_text(block["input"])))
            return events
        self._kinds[kind] = ordinal + 1
        if kind == "text" and block.get("text"):
            return [TextDelta(str(block["text"]), ordinal)]
        if kind == "thinking" and (block.get("thinking") or block.get("signature")):
            return [ThinkingDelta(str(block.get("thinking") or ""),
                                  signature=block.get("signature") or None, index=ordinal)]
        return []

    def _delta(self, payload: dict) -> list[Event]:
        delta = payload.get("delta")
        index = payload.get("index")
        if not isinstance(delta, dict) or not isinstance(index, int):
            return []
        ordinal = self._ordinals.get(index, 0)
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            return [TextDelta(str(delta["text"]), ordinal)]
        if kind == "input_json_delta" and delta.get("partial_json"):
            return [ToolArgumentsDelta(ordinal, str(delta["partial_json"]))]
        if kind == "thinking_delta" and delta.get("thinking"):
            return [ThinkingDelta(str(delta["thinking"]), index=ordinal)]
        if kind == "signature_delta" and delta.get("signature"):
            return [ThinkingDelta(signature=str(delta["signature"]), index=ordinal)]
        return []  # citations_delta and what a newer API version adds

    def end(self) -> list[Event]:
        if self._finished:
            return []
        self._finished = True
        return [Finish(self._stop, usage=read_usage(self._usage) if self._usage else None,
                       stop_sequence=self._stop_sequence if self._stop == "stop_sequence"
                       else None)]
