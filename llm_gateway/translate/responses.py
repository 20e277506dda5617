"""OpenAI's Responses API (``POST /responses``) as a codec of the hub form, both roles.

As the caller's protocol (Codex, the Agents SDK) it reads ``input`` and ``instructions``
into turns, writes a target's answer as a Response object and a target's stream as the
Responses events (each with its ``sequence_number``, counting from 0). As a target's
protocol it writes the body a Responses target takes and reads its answer and events
back (the round trips' other half).

What a chat or Anthropic target cannot say comes back in the caller's spelling: a custom
tool travels as a function of one string argument (``form.CUSTOM_INPUT``) and its call is
a ``custom_tool_call`` again; a thinking block's proof (Anthropic's ``signature``) travels
in the reasoning item's ``encrypted_content`` behind a mark (``signature:``), so that a
stateless caller (``store: false``) sends it back and the proof reaches its target again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from llm_gateway.translate.form import (
    CUSTOM_INPUT,
    Begin,
    Event,
    Failure,
    Finish,
    Image,
    OutputFormat,
    Part,
    Reasoning,
    Refusal,
    RefusalDelta,
    Reply,
    Request,
    Stop,
    Text,
    TextDelta,
    Thinking,
    ThinkingDelta,
    Tool,
    ToolArgumentsDelta,
    ToolCall,
    ToolCallBegin,
    ToolChoice,
    ToolResult,
    Turn,
    Untranslatable,
    Usage,
    effort_for_budget,
)
from llm_gateway.translate.frames import event_frame

# A thinking block's proof from another protocol, carried in encrypted_content: OpenAI's own
# encrypted content is an opaque token with no colon, so the marks cannot be mistaken for it.
SIGNATURE_MARK = "signature:"
REDACTED_MARK = "redacted:"

# Tools the provider runs itself: a target of another protocol has none of them.
_BUILTIN_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
    "file_search", "code_interpreter", "image_generation", "computer_use_preview", "computer",
    "computer_use", "local_shell", "shell", "mcp", "tool_search", "namespace", "apply_patch",
    "programmatic_tool_calling"})

# Input items of a built-in tool's run: what the provider did, which another model cannot
# be shown as its own (dropped, their kind named).
_BUILTIN_ITEMS = frozenset({
    "web_search_call", "file_search_call", "tool_search_call", "tool_search_output",
    "computer_call", "computer_call_output", "code_interpreter_call", "image_generation_call",
    "local_shell_call", "local_shell_call_output", "shell_call", "shell_call_output",
    "apply_patch_call", "apply_patch_call_output", "mcp_list_tools", "mcp_approval_request",
    "mcp_approval_response", "mcp_call", "additional_tools"})

# Top-level fields that only tune how the provider works, with the value that is no loss.
_TUNING = {"prompt_cache_key": None, "prompt_cache_retention": None, "metadata": None,
           "service_tier": "auto", "truncation": "disabled", "max_tool_calls": None,
           "top_logprobs": 0, "client_metadata": None, "stream_options": None,
           "include": None, "store": False, "context_management": None}

# What the form reads from the top level itself (anything else is named in dropped).
_READ = frozenset({"model", "input", "instructions", "tools", "tool_choice",
                   "parallel_tool_calls", "max_output_tokens", "temperature", "top_p", "stream",
                   "reasoning", "text", "previous_response_id", "conversation", "user",
                   "safety_identifier", "background", "prompt"})

_EFFORTS = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high",
            "xhigh": "high", "max": "high"}

# What ends a Responses stream with the response in its final state.
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})

# The codes a Response's ``error`` may carry (the SDK's ResponseError): a gateway's own
# failure is written as the nearest of them.
_RESPONSE_ERROR_CODES = {429: "rate_limit_exceeded"}


# ---- reading a caller's request ---------------------------------------------------------


class _Dropped:
    """Names of what the form does not carry, each once, in the order met."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def add(self, name: str) -> None:
        if name not in self.names:
            self.names.append(name)


def read_request(payload: dict) -> Request:
    dropped = _Dropped([])
    request = Request(model=str(payload.get("model") or ""), dropped=dropped.names)
    if payload.get("conversation") is not None:
        raise Untranslatable("conversation", "is a conversation stored by OpenAI: the target "
                                             "keeps none")
    if payload.get("background") is True:
        raise Untranslatable("background", "runs a stored response in the background: the "
                                           "target keeps none")
    if payload.get("prompt") is not None:
        raise Untranslatable("prompt", "names a prompt template stored by OpenAI")
    instructions = payload.get("instructions")
    if isinstance(instructions, str) and instructions:
        request.system.append(Text(instructions))
    given = payload.get("input")
    if isinstance(given, str):
        request.turns.append(Turn("user", [Text(given)]))
    elif isinstance(given, list):
        _read_items(given, request, dropped)
    request.tools = _read_tools(payload.get("tools"), dropped)
    request.tool_choice = _read_tool_choice(payload.get("tool_choice"), request, dropped)
    if isinstance(payload.get("parallel_tool_calls"), bool):
        request.parallel_tool_calls = payload["parallel_tool_calls"]
    request.max_output_tokens = _int(payload.get("max_output_tokens"))
    request.temperature = _number(payload.get("temperature"))
    request.top_p = _number(payload.get("top_p"))
    request.stream = payload.get("stream") is True
    request.reasoning = _read_reasoning(payload.get("reasoning"))
    request.output_format = _read_text(payload.get("text"), dropped)
    previous = payload.get("previous_response_id")
    request.previous_response_id = previous if isinstance(previous, str) else None
    for name in ("user", "safety_identifier"):
        if isinstance(payload.get(name), str) and request.user is None:
            request.user = payload[name]
    for name, value in payload.items():
        if name in _READ:
            continue
        if name in _TUNING:
            if value is not None and value != _TUNING[name] and value != [] and value != {}:
                dropped.add(name)
        else:
            dropped.add(name)
    return request


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _read_items(items: list, request: Request, dropped: _Dropped) -> None:
    """Input items into turns: consecutive assistant items (reasoning, message, calls) are one
    assistant turn, consecutive tool outputs one tool turn (as Anthropic and chat group
    them); leading system and developer messages are the request's system."""
    turns = request.turns
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if kind == "message":
            role = item.get("role")
            parts = _read_content(item.get("content"), dropped)
            if role in ("system", "developer"):
                texts = [part for part in parts if isinstance(part, Text)]
                if len(texts) != len(parts):
                    raise Untranslatable("input[].content", "of a system message holds more "
                                                            "than text")
                if not turns:
                    request.system.extend(texts)
                else:
                    turns.append(Turn("system", list(texts)))
            elif role == "assistant":
                _append(turns, "assistant", parts)
            else:
                turns.append(Turn("user", parts))
        elif kind == "function_call":
            _append(turns, "assistant", [ToolCall(str(item.get("call_id") or ""),
                                                  str(item.get("name") or ""),
                                                  str(item.get("arguments") or ""))])
        elif kind == "custom_tool_call":
            _append(turns, "assistant", [ToolCall(str(item.get("call_id") or ""),
                                                  str(item.get("name") or ""),
                                                  str(item.get("input") or ""), kind="custom")])
        elif kind in ("function_call_output", "custom_tool_call_output"):
            result = ToolResult(str(item.get("call_id") or ""),
                                _read_output(item.get("output"), dropped),
                                kind="custom" if kind == "custom_tool_call_output"
                                else "function")
            _append(turns, "tool", [result])
        elif kind == "reasoning":
            _append(turns, "assistant", [_read_reasoning_item(item)])
        elif kind == "item_reference":
            raise Untranslatable("input[].item_reference", "names an item stored by OpenAI: "
                                                           "the target keeps none")
        elif kind in _BUILTIN_ITEMS:
            dropped.add(f"input[{kind}]")
        else:
            raise Untranslatable(f"input[{kind}]", "is an input item the target cannot read")


def _append(turns: list[Turn], role: str, parts: list[Part]) -> None:
    if turns and turns[-1].role == role and role in ("assistant", "tool"):
        turns[-1].parts.extend(parts)
    else:
        turns.append(Turn(role, parts))  # type: ignore[arg-type]


def _read_content(content: object, dropped: _Dropped) -> list[Part]:
    if isinstance(content, str):
        return [Text(content)]
    parts: list[Part] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text"):
            parts.append(Text(str(part.get("text") or "")))
        elif kind == "refusal":
            parts.append(Refusal(str(part.get("refusal") or "")))
        elif kind == "input_image":
            parts.append(_read_image(part, dropped))
        elif kind == "input_file":
            raise Untranslatable("input[].content[].input_file",
                                 "is a file the target cannot read")
        else:
            raise Untranslatable(f"input[].content[].{kind}",
                                 "is content the target cannot read")
    return parts


def _read_image(part: dict, dropped: _Dropped) -> Image:
    if part.get("file_id") is not None:
        raise Untranslatable("input[].content[].file_id", "names a file stored by OpenAI")
    if part.get("detail") not in (None, "auto"):
        dropped.add("detail")
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise Untranslatable("input[].content[].image_url", "is missing")
    return image_from_url(url)


def image_from_url(url: str) -> Image:
    """An http(s) URL stays one; a ``data:`` URL is read into its base64 and media type."""
    if url.startswith("data:"):
        head, _, data = url[5:].partition(",")
        media_type, _, encoding = head.partition(";")
        if encoding == "base64" and data:
            return Image(data=data, media_type=media_type or None)
        raise Untranslatable("input[].content[].image_url", "is a data URL that is not base64")
    return Image(url=url)


def _read_output(output: object, dropped: _Dropped) -> list[Text | Image]:
    if isinstance(output, str):
        return [Text(output)]
    parts = _read_content(output, dropped)
    return [part for part in parts if isinstance(part, Text | Image)]


def _read_reasoning_item(item: dict) -> Thinking:
    """A reasoning item: its text (the full reasoning where given, else the summary), and its
    encrypted content, or a proof another protocol gave, behind its mark."""
    content = [part.get("text") for part in item.get("content") or ()
               if isinstance(part, dict) and isinstance(part.get("text"), str)]
    summary = [part.get("text") for part in item.get("summary") or ()
               if isinstance(part, dict) and isinstance(part.get("text"), str)]
    text = "\n\n".join(content or summary)
    encrypted = item.get("encrypted_content")
    if isinstance(encrypted, str) and encrypted.startswith(SIGNATURE_MARK):
        return Thinking(text, signature=encrypted[len(SIGNATURE_MARK):])
    if isinstance(encrypted, str) and encrypted.startswith(REDACTED_MARK):
        return Thinking(text, signature=encrypted[len(REDACTED_MARK):], redacted=True)
    return Thinking(text, encrypted=encrypted if isinstance(encrypted, str) else None)


def _read_tools(tools: object, dropped: _Dropped) -> list[Tool]:
    read: list[Tool] = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        description = tool.get("description") if isinstance(tool.get("description"), str) \
            else None
        if kind == "function":
            parameters = tool.get("parameters")
            read.append(Tool(str(tool.get("name") or ""), description,
                             parameters if isinstance(parameters, dict) else None,
                             strict=tool.get("strict") if isinstance(tool.get("strict"), bool)
                             else None))
        elif kind == "custom":
            grammar = tool.get("format")
            read.append(Tool(str(tool.get("name") or ""), description, kind="custom",
                             grammar=grammar if isinstance(grammar, dict)
                             and grammar.get("type") != "text" else None))
        else:
            dropped.add(f"tools[{kind}]")
    return read


def _read_tool_choice(choice: object, request: Request, dropped: _Dropped) -> ToolChoice | None:
    if choice in ("auto", "none", "required"):
        return ToolChoice(choice)  # type: ignore[arg-type]
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind in ("function", "custom") and isinstance(choice.get("name"), str):
        return ToolChoice("tool", choice["name"])
    if kind == "allowed_tools":
        # The tools it allows are the only ones the target is shown: the choice is kept
        # exactly (the prompt cache it spares is the provider's, not the target's).
        allowed = {tool.get("name") for tool in choice.get("tools") or ()
                   if isinstance(tool, dict)}
        request.tools = [tool for tool in request.tools if tool.name in allowed]
        mode = choice.get("mode")
        if mode == "required" and len(request.tools) == 1:
            return ToolChoice("tool", request.tools[0].name)
        return ToolChoice("required" if mode == "required" else "auto")
    # A built-in forced (web_search_preview, file_search, mcp...): the tool is dropped, so
    # is the wish.
    dropped.add("tool_choice")
    return None


def _read_reasoning(reasoning: object) -> Reasoning | None:
    if not isinstance(reasoning, dict):
        return None
    effort = reasoning.get("effort")
    summary = reasoning.get("summary") or reasoning.get("generate_summary")
    summary = summary if isinstance(summary, str) else None
    if effort == "none":
        return Reasoning(enabled=False, summary=summary)
    mapped = _EFFORTS.get(effort) if isinstance(effort, str) else None
    if mapped is None and summary is None:
        return None
    return Reasoning(effort=mapped, summary=summary)  # type: ignore[arg-type]


def _read_text(text: object, dropped: _Dropped) -> OutputFormat | None:
    if not isinstance(text, dict):
        return None
    if text.get("verbosity") not in (None, "medium"):
        dropped.add("text.verbosity")
    given = text.get("format")
    if not isinstance(given, dict):
        return None
    if given.get("type") == "json_object":
        return OutputFormat("json_object")
    if given.get("type") == "json_schema":
        schema = given.get("schema")
        return OutputFormat("json_schema", schema if isinstance(schema, dict) else None,
                            given.get("name") if isinstance(given.get("name"), str) else None,
                            given.get("strict") if isinstance(given.get("strict"), bool)
                            else None)
    return None


# ---- writing the caller's answer ---------------------------------------------------------


def response_id(reply_id: str) -> str:
    return reply_id if reply_id.startswith("resp_") else f"resp_{reply_id}"


def _custom_tools(request: Request) -> set[str]:
    return {tool.name for tool in request.tools if tool.kind == "custom"}


def custom_input(arguments: str) -> str:
    """A custom tool's input from the arguments a function-only target called it with
    ({"input": ...}); arguments that are no such object are the input as they came."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(CUSTOM_INPUT), str):
        return parsed[CUSTOM_INPUT]
    return arguments


def _status(stop: Stop) -> tuple[str, dict | None]:
    if stop == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if stop == "filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def write_usage(usage: Usage | None) -> dict | None:
    if usage is None:
        return None
    return {"input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cache_read_tokens,
                                     "cache_write_tokens": usage.cache_write_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.input_tokens + usage.output_tokens}


def _tool_json(tool: Tool) -> dict:
    if tool.kind == "custom":
        written: dict = {"type": "custom", "name": tool.name}
        if tool.description is not None:
            written["description"] = tool.description
        if tool.grammar is not None:
            written["format"] = tool.grammar
        return written
    written = {"type": "function", "name": tool.name,
               "parameters": tool.parameters if tool.parameters is not None
               else {"type": "object", "properties": {}},
               # Responses' functions are strict unless told: a tool of another protocol's
               # caller never asked for it.
               "strict": bool(tool.strict)}
    if tool.description is not None:
        written["description"] = tool.description
    return written


def _tool_choice_json(request: Request) -> str | dict:
    choice = request.tool_choice
    if choice is None:
        return "auto"
    if choice.mode == "tool":
        kind = "custom" if choice.name in _custom_tools(request) else "function"
        return {"type": kind, "name": choice.name}
    return choice.mode


def _envelope(request: Request, rid: str, created: int, status: str) -> dict:
    """The response's fields that echo the request (the SDK's model requires most)."""
    reasoning = request.reasoning
    text_format: dict = {"type": "text"}
    if request.output_format is not None:
        text_format = _format_json(request.output_format)
    system = "\n\n".join(part.text for part in request.system)
    return {
        "id": rid, "object": "response", "created_at": created, "status": status,
        "error": None, "incomplete_details": None,
        "instructions": system or None,
        "max_output_tokens": request.max_output_tokens,
        "model": request.model, "output": [],
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": reasoning.effort if reasoning and reasoning.enabled else None,
                      "summary": reasoning.summary if reasoning else None},
        "store": False,
        "temperature": request.temperature if request.temperature is not None else 1.0,
        "text": {"format": text_format},
        "tool_choice": _tool_choice_json(request),
        "tools": [_tool_json(tool) for tool in request.tools],
        "top_p": request.top_p if request.top_p is not None else 1.0,
        "truncation": "disabled", "usage": None, "user": request.user, "metadata": {},
    }


def _format_json(output_format: OutputFormat) -> dict:
    if output_format.kind == "json_object":
        return {"type": "json_object"}
    written: dict = {"type": "json_schema", "name": output_format.name or "response",
                     "schema": output_format.schema or {}}
    if output_format.strict is not None:
        written["strict"] = output_format.strict
    return written


def _reasoning_json(item_id: str, thinking: Thinking) -> dict:
    item: dict = {"id": item_id, "type": "reasoning",
                  "summary": [{"type": "summary_text", "text": thinking.text}]
                  if thinking.text else []}
    encrypted = _encrypted(thinking.encrypted, thinking.signature, thinking.redacted)
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def _encrypted(encrypted: str | None, signature: str | None, redacted: bool) -> str | None:
    if encrypted is not None:
        return encrypted
    if signature:
        return (REDACTED_MARK if redacted else SIGNATURE_MARK) + signature
    return None


def _call_json(item_id: str, call: ToolCall, custom: set[str]) -> dict:
    if call.kind == "custom" or call.name in custom:
        given = call.arguments if call.kind == "custom" else custom_input(call.arguments)
        return {"id": item_id.replace("fc_", "ctc_", 1), "type": "custom_tool_call",
                "call_id": call.id, "name": call.name, "input": given}
    return {"id": item_id, "type": "function_call", "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": "completed"}


def _base(rid: str) -> str:
    return rid[len("resp_"):] if rid.startswith("resp_") else rid


def write_reply(reply: Reply, request: Request) -> dict:
    rid = response_id(reply.id)
    base = _base(rid)
    status, incomplete = _status(reply.stop)
    created = reply.created if reply.created is not None else request.now
    answer = _envelope(request, rid, created, status)
    answer["incomplete_details"] = incomplete
    custom = _custom_tools(request)
    output: list[dict] = []
    message: dict | None = None
    for part in reply.parts:
        if isinstance(part, Text | Refusal):
            if message is None:
                message = {"id": f"msg_{base}_{len(output)}", "type": "message",
                           "status": "completed", "role": "assistant", "content": []}
                output.append(message)
            content = message["content"]
            if isinstance(part, Text):
                content.append({"type": "output_text", "text": part.text, "annotations": []})
            elif content and content[-1]["type"] == "refusal":
                # One refusal, as a stream says it (refusal deltas have no index).
                content[-1]["refusal"] += part.text
            else:
                content.append({"type": "refusal", "refusal": part.text})
            continue
        message = None
        if isinstance(part, Thinking):
            output.append(_reasoning_json(f"rs_{base}_{len(output)}", part))
        elif isinstance(part, ToolCall):
            output.append(_call_json(f"fc_{base}_{len(output)}", part, custom))
    if status != "completed" and output and output[-1]["type"] == "message":
        output[-1]["status"] = "incomplete"  # the item the cut fell on; those before are done
    answer["output"] = output
    answer["usage"] = write_usage(reply.usage)
    return answer


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
        self.custom = _custom_tools(request)
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
        return _envelope(self.request, self.rid, self.created, status)

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
        return f"{prefix}_{_base(self.rid)}_{len(self.output)}"

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
            encrypted = _encrypted(self.encrypted, "".join(self.signature) or None, False)
            if encrypted is not None:
                item["encrypted_content"] = encrypted
        elif item["type"] == "function_call":
            arguments = "".join(self.texts)
            item["arguments"], item["status"] = arguments, "completed"
            out += self._event("response.function_call_arguments.done",
                               {**where, "name": item["name"], "arguments": arguments})
        else:
            raw = "".join(self.texts)
            given = raw if self.open_custom else custom_input(raw)
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
        status, incomplete = _status(event.stop)
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


# ---- writing a Responses target's request --------------------------------------------------


def write_request(request: Request, *, model: str) -> dict:
    dropped = _Dropped(request.dropped)
    body: dict = {"model": model, "input": _write_turns(request.turns, dropped)}
    system = "\n\n".join(part.text for part in request.system)
    if system:
        body["instructions"] = system
    if request.tools:
        body["tools"] = [_tool_json(tool) for tool in request.tools]
        if request.tool_choice is not None:
            body["tool_choice"] = _tool_choice_json(request)
    elif request.tool_choice is not None and request.tool_choice.mode == "none":
        body["tool_choice"] = "none"
    if request.parallel_tool_calls is not None and request.tools:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.max_output_tokens is not None:
        body["max_output_tokens"] = request.max_output_tokens
    for name in ("temperature", "top_p"):
        if getattr(request, name) is not None:
            body[name] = getattr(request, name)
    if request.stop:
        dropped.add("stop")  # Responses has no stop sequences
    if request.stream:
        body["stream"] = True
    reasoning = request.reasoning
    if reasoning is not None and reasoning.enabled:
        written: dict = {}
        if reasoning.effort is not None:
            written["effort"] = reasoning.effort
        elif reasoning.budget_tokens is not None:
            written["effort"] = effort_for_budget(reasoning.budget_tokens)
        if reasoning.summary is not None:
            written["summary"] = reasoning.summary
        if written:
            body["reasoning"] = written
        # Nothing is stored: the reasoning comes back encrypted so the next turn can send it.
        body["include"] = ["reasoning.encrypted_content"]
    if request.output_format is not None:
        body["text"] = {"format": _format_json(request.output_format)}
    body["store"] = False
    if request.previous_response_id is not None:
        body["previous_response_id"] = request.previous_response_id
    if request.user is not None:
        body["user"] = request.user
    return body


def _write_turns(turns: list[Turn], dropped: _Dropped) -> list[dict]:
    items: list[dict] = []
    for turn in turns:
        if turn.role == "assistant":
            _write_assistant(turn.parts, items, dropped)
            continue
        content: list[dict] = []
        for part in turn.parts:
            if isinstance(part, ToolResult):
                items.append(_write_result(part, dropped))
            elif isinstance(part, Text):
                content.append({"type": "input_text", "text": part.text})
            elif isinstance(part, Image):
                content.append(_write_image(part))
            elif isinstance(part, Refusal):
                content.append({"type": "input_text", "text": part.text})
        if content:
            role = "developer" if turn.role == "system" else "user"
            items.append({"type": "message", "role": role, "content": content})
    return items


def _write_image(image: Image) -> dict:
    url = image.url if image.url is not None \
        else f"data:{image.media_type or 'image/png'};base64,{image.data}"
    return {"type": "input_image", "image_url": url, "detail": "auto"}


def _write_result(result: ToolResult, dropped: _Dropped) -> dict:
    if result.is_error:
        dropped.add("is_error")
    kind = "custom_tool_call_output" if result.kind == "custom" else "function_call_output"
    if all(isinstance(part, Text) for part in result.content):
        output: str | list = "".join(part.text for part in result.content
                                     if isinstance(part, Text))
    else:
        output = [{"type": "input_text", "text": part.text} if isinstance(part, Text)
                  else _write_image(part) for part in result.content]
    return {"type": kind, "call_id": result.call_id, "output": output}


def _write_assistant(parts: list[Part], items: list[dict], dropped: _Dropped) -> None:
    content: list[dict] = []

    def flush() -> None:
        if content:
            items.append({"type": "message", "role": "assistant", "content": list(content)})
            content.clear()

    for part in parts:
        if isinstance(part, Text):
            content.append({"type": "output_text", "text": part.text, "annotations": []})
            continue
        if isinstance(part, Refusal):
            content.append({"type": "refusal", "refusal": part.text})
            continue
        flush()
        if isinstance(part, Thinking):
            encrypted = _encrypted(part.encrypted, part.signature, part.redacted)
            if encrypted is None:
                # A reasoning item OpenAI cannot verify is refused: another model's thoughts
                # in plain text are left out.
                dropped.add("thinking")
                continue
            items.append({"type": "reasoning",
                          "summary": [{"type": "summary_text", "text": part.text}]
                          if part.text else [],
                          "encrypted_content": encrypted})
        elif isinstance(part, ToolCall):
            if part.kind == "custom":
                items.append({"type": "custom_tool_call", "call_id": part.id,
                              "name": part.name, "input": part.arguments})
            else:
                items.append({"type": "function_call", "call_id": part.id, "name": part.name,
                              "arguments": part.arguments})
        elif isinstance(part, ToolResult):
            items.append(_write_result(part, dropped))
    flush()


def path(model: str, stream: bool) -> tuple[str, str]:
    return "/responses", ""


# ---- reading a Responses target's answer -------------------------------------------------


def read_usage(usage: object) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    given = usage.get("input_tokens_details")
    inputs = given if isinstance(given, dict) else {}
    given = usage.get("output_tokens_details")
    outputs = given if isinstance(given, dict) else {}
    return Usage(input_tokens=_int(usage.get("input_tokens")) or 0,
                 output_tokens=_int(usage.get("output_tokens")) or 0,
                 cache_read_tokens=_int(inputs.get("cached_tokens")) or 0,
                 cache_write_tokens=_int(inputs.get("cache_write_tokens")) or 0,
                 reasoning_tokens=_int(outputs.get("reasoning_tokens")) or 0)


def _stop(body: dict, calls: bool) -> Stop:
    if body.get("status") == "incomplete":
        details = body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return "filter" if reason == "content_filter" else "length"
    return "tool" if calls else "end"


def read_reply(body: dict) -> Reply:
    parts: list[Part] = []
    for item in body.get("output") or ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text":
                    parts.append(Text(str(part.get("text") or "")))
                elif isinstance(part, dict) and part.get("type") == "refusal":
                    parts.append(Refusal(str(part.get("refusal") or "")))
        elif kind == "reasoning":
            parts.append(_read_reasoning_item(item))
        elif kind == "function_call":
            parts.append(ToolCall(str(item.get("call_id") or ""), str(item.get("name") or ""),
                                  str(item.get("arguments") or "")))
        elif kind == "custom_tool_call":
            parts.append(ToolCall(str(item.get("call_id") or ""), str(item.get("name") or ""),
                                  str(item.get("input") or ""), kind="custom"))
    created = body.get("created_at")
    return Reply(id=str(body.get("id") or ""), model=str(body.get("model") or ""),
                 parts=parts, stop=_stop(body, any(isinstance(part, ToolCall)
                                                   for part in parts)),
                 usage=read_usage(body.get("usage")),
                 created=int(created) if isinstance(created, int | float)
                 and not isinstance(created, bool) else None)


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
        at = _int(payload.get("output_index"))
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
            key = (at, _int(payload.get("content_index")) or 0)
            return [TextDelta(delta, self.texts.setdefault(key, len(self.texts)))]
        if kind == "response.refusal.delta":
            return [RefusalDelta(delta)]
        if kind in ("response.function_call_arguments.delta",
                    "response.custom_tool_call_input.delta"):
            return [ToolArgumentsDelta(self.calls.get(at, 0), delta)] if delta else []
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return self._thinking(at, _int(payload.get("summary_index")) or 0, delta)
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
        return [Finish(_stop(body, self.has_calls), read_usage(body.get("usage")))]

    def end(self) -> list[Event]:
        if self.finished:
            return []
        self.finished = True
        return [Failure("The target's stream ended before its response was done.",
                        "server_error", 502)]


# ---- the codec ---------------------------------------------------------------------------


class ResponsesCodec:
    name = "responses"

    def read_request(self, payload: dict) -> Request:
        return read_request(payload)

    def write_request(self, request: Request, *, model: str) -> dict:
        return write_request(request, model=model)

    def path(self, model: str, stream: bool) -> tuple[str, str]:
        return path(model, stream)

    def read_reply(self, body: dict) -> Reply:
        return read_reply(body)

    def write_reply(self, reply: Reply, request: Request) -> dict:
        return write_reply(reply, request)

    def stream_reader(self) -> StreamReader:
        return StreamReader()

    def stream_writer(self, request: Request) -> StreamWriter:
        return StreamWriter(request)


CODEC = ResponsesCodec()

__all__ = ["CODEC", "REDACTED_MARK", "SIGNATURE_MARK", "ResponsesCodec", "StreamReader",
           "StreamWriter", "custom_input", "image_from_url", "read_reply", "read_request",
           "read_usage", "response_id", "write_reply", "write_request", "write_usage"]
