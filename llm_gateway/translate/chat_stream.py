"""A chat stream both ways: a chat target's ``chat.completion.chunk`` frames into the hub
form's events, and the form's events as the chunks (then ``[DONE]``) a chat caller reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from llm_gateway.errors import error_body
from llm_gateway.translate.chat_reply import (
    FINISH_FROM_STOP,
    custom_names,
    int_of,
    read_finish,
    read_usage,
    reasoning_text,
    unwrap,
    write_usage,
)
from llm_gateway.translate.form import (
    Begin,
    Event,
    Failure,
    Finish,
    RefusalDelta,
    Request,
    TextDelta,
    ThinkingDelta,
    ToolArgumentsDelta,
    ToolCallBegin,
    Usage,
)
from llm_gateway.translate.frames import DONE, data_frame


class ChatStreamReader:
    """A chat target's chunks into the form's events. The finish reason is held until the
    stream's end, since the usage chunk comes after it."""

    def __init__(self) -> None:
        self._begun = False
        self._failed = False
        self._id = ""
        self._finish: object = None
        self._stop_reason: object = None
        self._usage: Usage | None = None
        self._last: str | None = None  # the kind of the last delta: text, thinking, tool
        self._blocks = {"text": -1, "thinking": -1}
        self._slots: dict[int, _Slot] = {}  # chat's tool call index -> the call
        self._calls = 0

    def feed(self, payload: dict) -> list[Event]:
        if self._failed:
            return []
        error = payload.get("error")
        if error:
            self._failed = True
            return [_failure(error)]
        events: list[Event] = []
        if not self._begun:
            self._begun = True
            self._id = str(payload.get("id", ""))
            events.append(Begin(self._id, str(payload.get("model", "")),
                                created=int_of(payload.get("created"))))
        if payload.get("usage") is not None:
            self._usage = read_usage(payload["usage"]) or self._usage
        choices = payload.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            return events
        delta = choice.get("delta") or {}
        reasoning = reasoning_text(delta)
        if reasoning:
            events.append(ThinkingDelta(reasoning, index=self._block("thinking")))
        if isinstance(delta.get("content"), str) and delta["content"]:
            events.append(TextDelta(delta["content"], index=self._block("text")))
        if isinstance(delta.get("refusal"), str) and delta["refusal"]:
            events.append(RefusalDelta(delta["refusal"]))
        for position, call in enumerate(delta.get("tool_calls") or []):
            if isinstance(call, dict):
                events.extend(self._tool_call(call, position))
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
            self._stop_reason = choice.get("stop_reason")
        return events

    def end(self) -> list[Event]:
        if self._failed:
            return []
        events: list[Event] = []
        if not self._begun:
            self._begun = True
            events.append(Begin("", ""))
        for slot in self._slots.values():  # calls whose name never came
            if not slot.begun:
                events.extend(self._begin_call(slot))
        stop, stop_sequence = read_finish(self._finish, self._stop_reason, self._calls > 0)
        events.append(Finish(stop, self._usage, stop_sequence))
        return events

    def _block(self, kind: str) -> int:
        # A new block of text or thinking where that kind resumes after another kind.
        if self._last != kind:
            self._blocks[kind] += 1
            self._last = kind
        return max(self._blocks[kind], 0)

    def _tool_call(self, call: dict, position: int) -> list[Event]:
        index = call.get("index")
        index = index if isinstance(index, int) else position
        custom = call.get("type") == "custom" or "custom" in call
        inner = call.get("custom" if custom else "function")
        inner = inner if isinstance(inner, dict) else {}
        call_id, name = call.get("id"), inner.get("name")
        fragment = inner.get("input" if custom else "arguments")
        slot = self._slots.get(index)
        # Ollama numbers every call of a parallel batch 0, telling them apart by id only.
        if slot is None or (isinstance(call_id, str) and call_id and slot.id
                            and call_id != slot.id):
            slot = self._slots[index] = _Slot(kind="custom" if custom else "function")
        if isinstance(call_id, str) and call_id and not slot.id:
            slot.id = call_id
        if isinstance(name, str) and name and not slot.name:
            slot.name = name
        self._last = "tool"
        events: list[Event] = []
        if isinstance(fragment, str) and fragment:
            slot.pending.append(fragment)
        if not slot.begun and slot.name:
            events.extend(self._begin_call(slot))
        elif slot.begun and slot.pending:
            events.extend(ToolArgumentsDelta(slot.ordinal, text) for text in slot.pending)
            slot.pending.clear()
        return events

    def _begin_call(self, slot: _Slot) -> list[Event]:
        slot.begun = True
        slot.ordinal = self._calls
        self._calls += 1
        call_id = slot.id or f"call_{self._id}_{slot.ordinal}"
        events: list[Event] = [ToolCallBegin(slot.ordinal, call_id, slot.name, slot.kind)]
        events.extend(ToolArgumentsDelta(slot.ordinal, text) for text in slot.pending)
        slot.pending.clear()
        return events


@dataclass(slots=True)
class _Slot:
    kind: Literal["function", "custom"] = "function"
    id: str = ""
    name: str = ""
    begun: bool = False
    ordinal: int = 0
    pending: list[str] = field(default_factory=list)  # arguments before the name came


def _failure(error: object) -> Failure:
    # Venice's errors are {"error": "text"}; OpenAI's {"error": {"message", "type", "code"}}.
    if isinstance(error, dict):
        message = error.get("message")
        kind = error.get("type")
        code = error.get("code")
        status = code if isinstance(code, int) and 400 <= code < 600 else 500
        return Failure(message if isinstance(message, str) else json.dumps(error),
                       kind if isinstance(kind, str) else "api_error", status)
    return Failure(str(error))


class ChatStreamWriter:
    """The form's events as chat.completion.chunk frames, ending with ``[DONE]``."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self._custom = custom_names(request)
        self._id: str | None = None
        self._created = request.now
        self._usage: Usage | None = None  # what Begin said of the prompt
        self._calls: dict[int, int] = {}  # the form's call index -> the chunk's index
        # Calls of custom tools that travelled as one-string functions: their arguments
        # are JSON around the input, given to the caller unwrapped once whole.
        self._wrapped: dict[int, list[str]] = {}
        self._custom_calls: set[int] = set()  # chunk indices of custom calls
        self._ended = False

    def write(self, event: Event) -> bytes:
        if self._ended:
            return b""
        if isinstance(event, Begin):
            return self._begin(event) if self._id is None else b""
        if isinstance(event, Failure):
            return self._error(event.type, None, event.message)
        out = self._begin(Begin("chatcmpl-gateway", "")) if self._id is None else b""
        if isinstance(event, TextDelta):
            return out + self._chunk({"content": event.text})
        if isinstance(event, ThinkingDelta):
            return out + (self._chunk({"reasoning_content": event.text}) if event.text else b"")
        if isinstance(event, RefusalDelta):
            return out + self._chunk({"refusal": event.text})
        if isinstance(event, ToolCallBegin):
            return out + self._call_begin(event)
        if isinstance(event, ToolArgumentsDelta):
            return out + self._arguments(event)
        if isinstance(event, Finish):
            return out + self._finish(event)
        return out

    def fail(self, status: int, type: str, code: str, message: str) -> bytes:
        if self._ended:
            return b""
        return self._error(type, code, message)

    def _begin(self, begin: Begin) -> bytes:
        self._id = begin.id or "chatcmpl-gateway"
        if begin.created is not None:
            self._created = begin.created
        self._usage = begin.usage
        return self._chunk({"role": "assistant", "content": ""})

    def _call_begin(self, begin: ToolCallBegin) -> bytes:
        index = self._calls.setdefault(begin.index, len(self._calls))
        if begin.kind == "custom" or begin.name in self._custom:
            self._custom_calls.add(index)
            if begin.kind != "custom":
                self._wrapped[index] = []
            call = {"index": index, "id": begin.id, "type": "custom",
                    "custom": {"name": begin.name, "input": ""}}
        else:
            call = {"index": index, "id": begin.id, "type": "function",
                    "function": {"name": begin.name, "arguments": ""}}
        return self._chunk({"tool_calls": [call]})

    def _arguments(self, delta: ToolArgumentsDelta) -> bytes:
        index = self._calls.setdefault(delta.index, len(self._calls))
        if index in self._wrapped:
            self._wrapped[index].append(delta.fragment)
            return b""
        if index in self._custom_calls:
            return self._chunk({"tool_calls": [{"index": index,
                                                "custom": {"input": delta.fragment}}]})
        return self._chunk({"tool_calls": [{"index": index,
                                            "function": {"arguments": delta.fragment}}]})

    def _finish(self, finish: Finish) -> bytes:
        self._ended = True
        out = [self._chunk({"tool_calls": [{"index": index,
                                            "custom": {"input": unwrap("".join(parts))}}]})
               for index, parts in self._wrapped.items()]
        out.append(self._chunk({}, FINISH_FROM_STOP.get(finish.stop, "stop")))
        if self._request.stream_usage:
            usage = finish.usage or self._usage or Usage()
            out.append(data_frame({**self._head(), "choices": [],
                                   "usage": write_usage(usage)}))
        out.append(DONE)
        return b"".join(out)

    def _error(self, type_: str, code: str | None, message: str) -> bytes:
        # As protocols/base.py's OpenAICompatible.stream_error ends a failed chat stream.
        self._ended = True
        return b"data: " + error_body(message, type_, code) + b"\n\n" + DONE

    def _head(self) -> dict:
        return {"id": self._id, "object": "chat.completion.chunk", "created": self._created,
                "model": self._request.model}

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> bytes:
        return data_frame({**self._head(), "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]})
