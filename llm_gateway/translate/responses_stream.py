"""A Responses stream both ways: the hub form's events as the Responses events a caller
reads (each with its ``sequence_number``, counting from 0), and a Responses target's events
into the form's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_gateway.translate.chat_reply import unwrap
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
from llm_gateway.translate.frames import event_frame
from llm_gateway.translate.responses_reply import (
    base_of,
    custom_tools,
    encrypted_content,
    envelope,
    int_of,
    read_usage,
    response_id,
    status_of,
    stop_of,
    write_usage,
)

# What ends a Responses stream with the response in its final state.
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})

# The codes a Response's ``error`` may carry (the SDK's ResponseError): a gateway's own
# failure is written as the nearest of them.
_RESPONSE_ERROR_CODES = {429: "rate_limit_exceeded"}


# ---- writing the caller's stream ---------------------------------------------------------


@dataclass(slots=True)
class _Call:
    begin: ToolCallBegin
    arguments: list[str] = field(default_factory=list)


class StreamWriter:
    """The hub form's events as Responses events. One output item is open at a time (its
    events never interleave with another's); a tool call that begins while another is open
    is held, its fragments with it, and written whole once the open one is done (a chat
    target may interleave its calls' fragments by index)."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.custom = custom_tools(request)
        self.sequence = 0
        self.rid = "resp_0"
        self.created = request.now
        self.begun: Usage | None = None
        self.started = False
        self.ended = False
        self.output: list[dict] = []  # the items done, in output_index order
        self.open: dict | None = None  # the item being written
        self.open_call: int | None = None  # the form's index of the call being written
        # Whether the open custom call came as one (its fragments are its input, written as
        # they come) rather than as a function of a function-only target (its arguments
        # wrap the input in {"input": ...}, which only unwraps whole, at the call's end).
        self.open_custom = False
        self.item_status = "completed"  # a message's status once done (incomplete when cut)
        self.calls: dict[int, _Call] = {}  # calls held while another is open
        self.texts: list[str] = []  # the open message part's text, or reasoning's
        self.part_kind = ""  # the open message part's type (output_text / refusal)
        self.part_index = -1  # the form's index of the text in the open part
        self.thinking_index = -1
        self.signature: list[str] = []
        self.encrypted: str | None = None

    # -- frames

    def _event(self, kind: str, payload: dict) -> bytes:
        frame = event_frame(kind, {"type": kind, **payload, "sequence_number": self.sequence})
        self.sequence += 1
        return frame

    def _response(self, status: str) -> dict:
        return envelope(self.request, self.rid, self.created, status)

    def _start(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        start = self._response("in_progress")
        return (self._event("response.created", {"response": start})
                + self._event("response.in_progress", {"response": start}))

    def _where(self) -> dict:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.output)}

    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{base_of(self.rid)}_{len(self.output)}"

    # -- items

    def _open_message(self) -> bytes:
        if self.open is not None and self.open["type"] == "message":
            return b""
        out = self._close()
        self.open = {"id": self._item_id("msg"), "type": "message", "status": "in_progress",
                     "role": "assistant", "content": []}
        return out + self._event("response.output_item.added",
                                 {"output_index": len(self.output), "item": dict(self.open)})

    def _open_part(self, kind: str, index: int) -> bytes:
        out = self._open_message()
        if self.part_kind == kind and self.part_index == index:
            return out
        out += self._close_part()
        self.part_kind, self.part_index, self.texts = kind, index, []
        empty = ({"type": "output_text", "text": "", "annotations": []} if kind == "output_text"
                 else {"type": "refusal", "refusal": ""})
        assert self.open is not None
        return out + self._event("response.content_part.added",
                                 {**self._where(), "content_index": len(self.open["content"]),
                                  "part": empty})

    def _close_part(self) -> bytes:
        if not self.part_kind or self.open is None:
            return b""
        text = "".join(self.texts)
        where = {**self._where(), "content_index": len(self.open["content"])}
        if self.part_kind == "output_text":
            part = {"type": "output_text", "text": text, "annotations": []}
            out = self._event("response.output_text.done", {**where, "text": text,
                                                            "logprobs": []})
        else:
            part = {"type": "refusal", "refusal": text}
            out = self._event("response.refusal.done", {**where, "refusal": text})
        self.open["content"].append(part)
        self.part_kind, self.part_index, self.texts = "", -1, []
        return out + self._event("response.content_part.done", {**where, "part": part})

    def _open_reasoning(self, index: int) -> bytes:
        if self.open is not None and self.open["type"] == "reasoning" \
                and self.thinking_index == index:
            return b""
        out = self._close()
        self.thinking_index, self.texts, self.signature, self.encrypted = index, [], [], None
        self.open = {"id": self._item_id("rs"), "type": "reasoning", "summary": []}
        return out + self._event("response.output_item.added",
                                 {"output_index": len(self.output), "item": dict(self.open)})

    def _open_tool(self, call: _Call) -> bytes:
        # Only what is open is closed: calls are held only while another call is open, and
        # _close writes them in their order, one after the other, through here.
        out = self._close_item()
        begin = call.begin
        custom = begin.kind == "custom" or begin.name in self.custom
        if custom:
            self.open = {"id": self._item_id("ctc"), "type": "custom_tool_call",
                         "call_id": begin.id, "name": begin.name, "input": ""}
        else:
            self.open = {"id": self._item_id("fc"), "type": "function_call",
                         "call_id": begin.id, "name": begin.name, "arguments": "",
                         "status": "in_progress"}
        self.open_call = begin.index
        self.open_custom = begin.kind == "custom"
        self.texts = []
        out += self._event("response.output_item.added",
                           {"output_index": len(self.output), "item": dict(self.open)})
        for fragment in call.arguments:
            out += self._arguments(fragment)
        return out

    def _arguments(self, fragment: str) -> bytes:
        """A fragment of the open call's arguments (or of a custom call's input)."""
        assert self.open is not None
        self.texts.append(fragment)
        if self.open["type"] == "function_call":
            return self._event("response.function_call_arguments.delta",
                               {**self._where(), "delta": fragment})
        if self.open_custom:
            return self._event("response.custom_tool_call_input.delta",
                               {**self._where(), "delta": fragment})
        return b""

    def _close(self) -> bytes:
        """The open item's done events, then any held calls, each whole."""
        out = self._close_item()
        while self.calls:
            index = min(self.calls)
            out += self._open_tool(self.calls.pop(index)) + self._close_item()
        return out

    def _close_item(self) -> bytes:
        item = self.open
        if item is None:
            return b""
        out = b""
        where = self._where()
        if item["type"] == "message":
            out += self._close_part()
            item["status"] = self.item_status
        elif item["type"] == "reasoning":
            text = "".join(self.texts)
            if text:
                part = {"type": "summary_text", "text": text}
                at = {**where, "summary_index": 0}
                out += (self._event("response.reasoning_summary_text.done", {**at, "text": text})
                        + self._event("response.reasoning_summary_part.done",
                                      {**at, "part": part}))
                item["summary"] = [part]
            encrypted = encrypted_content(self.encrypted, "".join(self.signature) or None, False)
            if encrypted is not None:
                item["encrypted_content"] = encrypted
        elif item["type"] == "function_call":
            arguments = "".join(self.texts)
            item["arguments"], item["status"] = arguments, "completed"
            out += self._event("response.function_call_arguments.done",
                               {**where, "name": item["name"], "arguments": arguments})
        else:
            raw = "".join(self.texts)
            given = raw if self.open_custom else unwrap(raw)
            item["input"] = given
            if given and not self.open_custom:
                out += self._event("response.custom_tool_call_input.delta",
                                   {**where, "delta": given})
            out += self._event("response.custom_tool_call_input.done", {**where, "input": given})
        out += self._event("response.output_item.done", {**where, "item": item})
        self.output.append(item)
        self.open, self.open_call, self.open_custom, self.texts = None, None, False, []
        return out

    # -- events

    def write(self, event: Event) -> bytes:
        if self.ended:
            return b""
        if isinstance(event, Begin):
            self.rid = response_id(event.id)
            if event.created is not None:
                self.created = event.created
            self.begun = event.usage
            return self._start()
        out = self._start()
        if isinstance(event, TextDelta):
            out += self._open_part("output_text", event.index)
            self.texts.append(event.text)
            assert self.open is not None
            out += self._event("response.output_text.delta",
                               {**self._where(), "content_index": len(self.open["content"]),
                                "delta": event.text, "logprobs": []})
        elif isinstance(event, RefusalDelta):
            out += self._open_part("refusal", -2)
            self.texts.append(event.text)
            assert self.open is not None
            out += self._event("response.refusal.delta",
                               {**self._where(), "content_index": len(self.open["content"]),
                                "delta": event.text})
        elif isinstance(event, ThinkingDelta):
            out += self._thinking(event)
        elif isinstance(event, ToolCallBegin):
            call = _Call(event)
            if self.open is not None and self.open_call is not None:
                self.calls[event.index] = call
            else:
                out += self._open_tool(call)
        elif isinstance(event, ToolArgumentsDelta):
            if event.index == self.open_call:
                out += self._arguments(event.fragment)
            elif event.index in self.calls:
                self.calls[event.index].arguments.append(event.fragment)
        elif isinstance(event, Finish):
            out += self._finish(event)
        elif isinstance(event, Failure):
            out += self._failed(_RESPONSE_ERROR_CODES.get(event.status, "server_error"),
                                event.message)
        return out

    def _thinking(self, event: ThinkingDelta) -> bytes:
        out = self._open_reasoning(event.index)
        if event.signature:
            self.signature.append(event.signature)
        if event.encrypted:
            self.encrypted = event.encrypted
        if event.text:
            at = {**self._where(), "summary_index": 0}
            if not self.texts:
                out += self._event("response.reasoning_summary_part.added",
                                   {**at, "part": {"type": "summary_text", "text": ""}})
            self.texts.append(event.text)
            out += self._event("response.reasoning_summary_text.delta",
                               {**at, "delta": event.text})
        return out

    def _finish(self, event: Finish) -> bytes:
        status, incomplete = status_of(event.stop)
        self.item_status = "completed" if status == "completed" else "incomplete"
        out = self._close()
        self.ended = True
        final = self._response(status)
        final["incomplete_details"] = incomplete
        final["output"] = list(self.output)
        final["usage"] = write_usage(_merged(self.begun, event.usage))
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(kind, {"response": final})

    def _failed(self, code: str, message: str, error_code: str | None = None) -> bytes:
        """An ``error`` event (as the gateway's own Responses streams end a failure), then
        ``response.failed`` with what was done, as OpenAI ends a failed stream."""
        self.ended = True
        out = self._event("error", {"code": error_code or code, "message": message,
                                    "param": None})
        failed = self._response("failed")
        failed["output"] = list(self.output)
        failed["error"] = {"code": code, "message": message}
        return out + self._event("response.failed", {"response": failed})

    def fail(self, status: int, type: str, code: str, message: str) -> bytes:
        if self.ended:
            return b""
        if not self.started:
            # Nothing was said of a response yet: the error alone, numbered 0, as the
            # gateway's Responses stream_error writes it.
            self.ended = True
            return self._event("error", {"code": code, "message": message, "param": None})
        return self._failed(_RESPONSE_ERROR_CODES.get(status, "server_error"), message,
                            error_code=code)


def _merged(begun: Usage | None, ended: Usage | None) -> Usage | None:
    """The usage a stream ends with, completed by what its start said of the prompt (an
    Anthropic stream says the prompt's tokens in message_start)."""
    if ended is None:
        return begun
    if begun is None or ended.input_tokens:
        return ended
    return Usage(begun.input_tokens, ended.output_tokens,
                 ended.cache_read_tokens or begun.cache_read_tokens,
                 ended.cache_write_tokens or begun.cache_write_tokens, ended.reasoning_tokens)


# ---- reading a Responses target's stream -------------------------------------------------


class StreamReader:
    """A Responses target's events into the form's. Ordinals: texts by (output item,
    content part), reasoning by item, calls by item, as they first show."""

    def __init__(self) -> None:
        self.texts: dict[tuple[int, int], int] = {}
        self.thinking: dict[int, int] = {}
        self.calls: dict[int, int] = {}  # output_index -> the call's ordinal
        self.summaries: dict[int, int] = {}  # output_index -> the last summary_index seen
        self.finished = False
        self.has_calls = False

    def feed(self, payload: dict) -> list[Event]:
        if self.finished:
            return []
        kind = payload.get("type")
        at = int_of(payload.get("output_index"))
        at = at if at is not None else 0
        delta = payload.get("delta")
        delta = delta if isinstance(delta, str) else ""
        if kind == "response.created":
            response = payload.get("response")
            response = response if isinstance(response, dict) else {}
            created = response.get("created_at")
            return [Begin(str(response.get("id") or ""), str(response.get("model") or ""),
                          created=int(created) if isinstance(created, int | float)
                          and not isinstance(created, bool) else None)]
        if kind == "response.output_item.added":
            item = payload.get("item")
            if isinstance(item, dict) and item.get("type") in ("function_call",
                                                               "custom_tool_call"):
                index = self.calls.setdefault(at, len(self.calls))
                self.has_calls = True
                custom = item["type"] == "custom_tool_call"
                events: list[Event] = [ToolCallBegin(index, str(item.get("call_id") or ""),
                                                     str(item.get("name") or ""),
                                                     kind="custom" if custom else "function")]
                given = item.get("input" if custom else "arguments")
                if isinstance(given, str) and given:
                    events.append(ToolArgumentsDelta(index, given))
                return events
            return []
        if kind == "response.output_text.delta":
            key = (at, int_of(payload.get("content_index")) or 0)
            return [TextDelta(delta, self.texts.setdefault(key, len(self.texts)))]
        if kind == "response.refusal.delta":
            return [RefusalDelta(delta)]
        if kind in ("response.function_call_arguments.delta",
                    "response.custom_tool_call_input.delta"):
            return [ToolArgumentsDelta(self.calls.get(at, 0), delta)] if delta else []
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return self._thinking(at, int_of(payload.get("summary_index")) or 0, delta)
        if kind == "response.output_item.done":
            item = payload.get("item")
            if isinstance(item, dict) and item.get("type") == "reasoning" \
                    and isinstance(item.get("encrypted_content"), str):
                index = self.thinking.setdefault(at, len(self.thinking))
                return [ThinkingDelta(index=index, encrypted=item["encrypted_content"])]
            return []
        if kind in _TERMINAL:
            return self._end(payload.get("response"))
        if kind == "error":
            self.finished = True
            limited = payload.get("code") == "rate_limit_exceeded"
            return [Failure(str(payload.get("message") or "The target's stream failed."),
                            "rate_limit_error" if limited else "server_error",
                            429 if limited else 500)]
        return []

    def _thinking(self, at: int, summary: int, delta: str) -> list[Event]:
        index = self.thinking.setdefault(at, len(self.thinking))
        # A new summary part reads as a new paragraph, as read_reply joins them.
        if summary > self.summaries.setdefault(at, summary):
            self.summaries[at] = summary
            delta = "\n\n" + delta
        return [ThinkingDelta(delta, index=index)] if delta else []

    def _end(self, response: object) -> list[Event]:
        self.finished = True
        body = response if isinstance(response, dict) else {}
        if body.get("status") == "failed":
            error = body.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            return [Failure(str(message or "The target's response failed."), "server_error",
                            500)]
        return [Finish(stop_of(body, self.has_calls), read_usage(body.get("usage")))]

    def end(self) -> list[Event]:
        if self.finished:
            return []
        self.finished = True
        return [Failure("The target's stream ended before its response was done.",
                        "server_error", 502)]
