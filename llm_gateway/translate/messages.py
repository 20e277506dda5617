"""Anthropic's Messages API as a translator's protocol, both roles: a caller's body, answer
and event stream (Claude Code, the anthropic SDKs), and a target's.

Read into the hub form (``form``) and written from it:

- the system prompt (a string or text blocks) and a ``system``-role message inside
  ``messages`` (Claude Code sends one), which a target writer folds into the next user
  message as ``<system>…</system>``: Anthropic has no such role, and the tag keeps it an
  instruction at its place in the conversation rather than the user's words or a rule
  for the whole conversation;
- text, images (base64 and URL sources), tool use and tool results (ids kept), thinking
  and redacted thinking with their signatures;
- client tools, ``tool_choice`` and ``disable_parallel_tool_use``; server tools (web search,
  bash, code execution, ...) are Anthropic's to run and dropped, named ``tools[<type>]``;
- ``thinking`` (enabled with a budget, adaptive, disabled) and ``output_config.effort``;
  structured outputs (``output_config.format``, and the beta's top-level
  ``output_format``);
- ``max_tokens``, ``temperature``, ``top_p``, ``stop_sequences``, ``metadata.user_id``.

Usage: Anthropic's ``input_tokens`` excludes the tokens read from and written to the
prompt cache; the form's counts them (``form.Usage``), so a reader adds them and a writer
takes them out. Pure: no I/O, no clock; ids come from the answer.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from llm_gateway.translate.form import (
    CUSTOM_INPUT,
    MIN_BUDGET,
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
    budget_for_effort,
)
from llm_gateway.translate.frames import event_frame

# Anthropic requires max_tokens. 4 096 is the cap every Claude model takes (Claude 3 Haiku's
# maximum, the smallest of any model still served), so a request the caller left uncapped
# is never refused for it; with a budget, the engine's clamp has set the cap already.
DEFAULT_MAX_TOKENS = 4096

# The image types Anthropic reads (a base64 source names one of them).
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
# The first bytes of each, base64-encoded: the media type of an inline image that came
# without one (Anthropic refuses a base64 source without its media_type).
_IMAGE_MAGIC = (("/9j/", "image/jpeg"), ("iVBORw0KGgo", "image/png"), ("R0lGOD", "image/gif"),
                ("UklGR", "image/webp"))

# Top-level fields that only tune how Anthropic serves the request: dropped, named.
_TUNING_FIELDS = ("top_k", "context_management", "service_tier", "container", "mcp_servers",
                  "cache_control", "speed", "inference_geo", "diagnostics")
# What read_request reads itself.
_READ_FIELDS = frozenset({
    "model", "messages", "system", "max_tokens", "temperature", "top_p", "stop_sequences",
    "stream", "metadata", "tools", "tool_choice", "thinking", "output_config",
    "output_format"})

# form.Stop <-> Anthropic's stop_reason.
_STOP_REASON: dict[str, str] = {"end": "end_turn", "length": "max_tokens", "tool": "tool_use",
                                "stop_sequence": "stop_sequence", "refusal": "refusal",
                                "filter": "refusal", "pause": "pause_turn"}
_STOP_OF: dict[str, Stop] = {"end_turn": "end", "max_tokens": "length",
                             "model_context_window_exceeded": "length", "tool_use": "tool",
                             "stop_sequence": "stop_sequence", "refusal": "refusal",
                             "pause_turn": "pause"}

# Anthropic's output_config.effort has two steps above the form's highest.
_EFFORT_OF = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high",
              "xhigh": "high", "max": "high"}

# Anthropic's error type for a status, as protocols/messages.py's anthropic_error writes it
# (the translators sit below the protocols and cannot import it; a test holds them equal).
_TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                   413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                   529: "overloaded_error"}
_ERROR_TYPES = frozenset(_TYPE_BY_STATUS.values()) | {"api_error", "billing_error"}
# The status of an in-band error, by its type (Anthropic's errors page).
_STATUS_OF_TYPE = {"invalid_request_error": 400, "authentication_error": 401,
                   "billing_error": 402, "permission_error": 403, "not_found_error": 404,
                   "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
                   "timeout_error": 504, "overloaded_error": 529}


def _error_type(status: int, type_: str = "") -> str:
    if type_ in _ERROR_TYPES:
        return type_
    return _TYPE_BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")


def _drop(request: Request, name: str) -> None:
    if name not in request.dropped:
        request.dropped.append(name)


def _json_text(value: object) -> str:
    """A tool's input as JSON text; the standard library where orjson refuses (an integer
    beyond 64 bits, a lone surrogate)."""
    try:
        return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, UnicodeDecodeError):
        return json.dumps(value, separators=(",", ":"))


def _input_of(arguments: str) -> dict:
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


# ---- the caller's side: reading a body ------------------------------------------------------


def _cache_hint(request: Request, block: dict) -> None:
    if "cache_control" in block:
        _drop(request, "cache_control")


def _image(source: object, where: str) -> Image:
    if not isinstance(source, dict):
        raise Untranslatable(where, "is an image without a source")
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type")
        return Image(data=source["data"], media_type=media if isinstance(media, str) else None)
    if kind == "url" and isinstance(source.get("url"), str):
        return _image_url(source["url"])
    # A file_id (the Files API) names content only Anthropic holds.
    raise Untranslatable(where, f"is an image by a {kind!r} source, which only Anthropic reads")


def _image_url(url: str) -> Image:
    """A URL, or a data: URL read into its media type and base64 data."""
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media, _, encoding = head[5:].partition(";")
        if encoding == "base64" and data:
            return Image(data=data, media_type=media or None)
    return Image(url=url)


def _result_content(request: Request, content: object, where: str) -> list[Text | Image]:
    if content is None:
        return []
    if isinstance(content, str):
        return [Text(content)]
    if not isinstance(content, list):
        raise Untranslatable(where, "is a tool result of no known shape")
    parts: list[Text | Image] = []
    for k, block in enumerate(content):
        inner = f"{where}.content[{k}]"
        if not isinstance(block, dict):
            raise Untranslatable(inner, "is no content block")
        _cache_hint(request, block)
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(Text(block["text"]))
        elif block.get("type") == "image":
            parts.append(_image(block.get("source"), inner))
        else:
            raise Untranslatable(inner, f"is a {block.get('type')!r} block, which only "
                                        "Anthropic reads")
    return parts


def _block(request: Request, block: object, role: str, where: str) -> Part:
    if not isinstance(block, dict):
        raise Untranslatable(where, "is no content block")
    _cache_hint(request, block)
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        if block.get("citations"):
            _drop(request, "citations")
        return Text(block["text"])
    if kind == "image":
        return _image(block.get("source"), where)
    if kind == "tool_use" and role == "assistant":
        return ToolCall(str(block.get("id", "")), str(block.get("name", "")),
                        _json_text(block.get("input") or {}))
    if kind == "tool_result" and role == "user":
        return ToolResult(str(block.get("tool_use_id", "")),
                          _result_content(request, block.get("content"), where),
                          is_error=block.get("is_error") is True)
    if kind == "thinking" and role == "assistant":
        signature = block.get("signature")
        return Thinking(str(block.get("thinking", "")),
                        signature=signature if isinstance(signature, str) and signature
                        else None)
    if kind == "redacted_thinking" and role == "assistant":
        return Thinking("", signature=str(block.get("data", "")), redacted=True)
    # document, search_result, container_upload, server tool use and its results: content
    # another protocol cannot hold, whose loss would change what the model is answering.
    raise Untranslatable(where, f"is a {kind!r} block, which only Anthropic reads")


def _turns(request: Request, index: int, message: object) -> list[Turn]:
    """One message as turns: a user message's tool results are a ``tool`` turn of their
    own (runs of them, in their order, around its other content)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise Untranslatable(where, "is no message")
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise Untranslatable(f"{where}.role", f"is {role!r}")
    content = message.get("content")
    if isinstance(content, str):
        parts: list[Part] = [Text(content)]
    elif isinstance(content, list):
        parts = [_block(request, block, "user" if role == "system" else role,
                        f"{where}.content[{j}]") for j, block in enumerate(content)]
    else:
        raise Untranslatable(f"{where}.content", "is neither text nor blocks")
    if role == "system" and not all(isinstance(part, Text) for part in parts):
        raise Untranslatable(f"{where}.content", "is a system message with more than text")
    if role != "user":
        return [Turn(role, parts)]
    turns: list[Turn] = []
    for part in parts:
        run_role = "tool" if isinstance(part, ToolResult) else "user"
        if turns and turns[-1].role == run_role:
            turns[-1].parts.append(part)
        else:
            turns.append(Turn(run_role, [part]))
    return turns or [Turn("user", [])]


def _system(request: Request, system: object) -> list[Text]:
    if system is None:
        return []
    if isinstance(system, str):
        return [Text(system)] if system else []
    if not isinstance(system, list):
        raise Untranslatable("system", "is neither text nor blocks")
    texts = []
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text" \
                or not isinstance(block.get("text"), str):
            raise Untranslatable(f"system[{i}]", "is no text block")
        _cache_hint(request, block)
        texts.append(Text(block["text"]))
    return texts


def _tools(request: Request, tools: object) -> list[Tool]:
    read = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind not in (None, "custom"):
            # A server tool (web_search_20250305, bash_20250124, code_execution_...):
            # Anthropic runs it; no other target can.
            _drop(request, f"tools[{kind}]")
            continue
        _cache_hint(request, tool)
        for name in ("defer_loading", "input_examples", "eager_input_streaming",
                     "allowed_callers"):
            if name in tool:
                _drop(request, name)
        schema = tool.get("input_schema")
        description = tool.get("description")
        strict = tool.get("strict")
        read.append(Tool(str(tool.get("name", "")),
                         description if isinstance(description, str) else None,
                         schema if isinstance(schema, dict) else None,
                         strict=strict if isinstance(strict, bool) else None))
    return read


def _tool_choice(request: Request, choice: object) -> None:
    if not isinstance(choice, dict):
        return
    mode = {"auto": "auto", "any": "required", "tool": "tool", "none": "none"}.get(
        str(choice.get("type")))
    if mode is None:
        raise Untranslatable("tool_choice.type", f"is {choice.get('type')!r}")
    name = choice.get("name")
    request.tool_choice = ToolChoice(mode, name if mode == "tool" and isinstance(name, str)
                                     else None)  # type: ignore[arg-type]
    if choice.get("disable_parallel_tool_use") is True:
        request.parallel_tool_calls = False


def _reasoning(request: Request, thinking: object, effort: str | None) -> Reasoning | None:
    if not isinstance(thinking, dict):
        return Reasoning(effort=effort) if effort else None  # type: ignore[arg-type]
    if thinking.get("display") is not None:
        _drop(request, "thinking.display")
    kind = thinking.get("type")
    if kind == "disabled":
        return Reasoning(enabled=False)
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        return Reasoning(effort=effort,  # type: ignore[arg-type]
                         budget_tokens=budget if isinstance(budget, int) else None)
    # adaptive (and between_tools): Claude decides how much; an effort says how hard.
    return Reasoning(effort=effort)  # type: ignore[arg-type]


def _output_format(value: object) -> OutputFormat | None:
    if isinstance(value, dict) and value.get("type") == "json_schema" \
            and isinstance(value.get("schema"), dict):
        return OutputFormat("json_schema", value["schema"])
    return None


def read_request(payload: dict) -> Request:
    request = Request(model=str(payload.get("model", "")))
    request.system = _system(request, payload.get("system"))
    for index, message in enumerate(payload.get("messages") or ()):
        request.turns.extend(_turns(request, index, message))
    request.tools = _tools(request, payload.get("tools"))
    _tool_choice(request, payload.get("tool_choice"))
    config = payload.get("output_config")
    config = config if isinstance(config, dict) else {}
    effort = _EFFORT_OF.get(str(config.get("effort")))
    request.reasoning = _reasoning(request, payload.get("thinking"), effort)
    request.output_format = (_output_format(config.get("format"))
                             or _output_format(payload.get("output_format")))
    max_tokens = payload.get("max_tokens")
    request.max_output_tokens = max_tokens if isinstance(max_tokens, int) else None
    for name in ("temperature", "top_p"):
        value = payload.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            setattr(request, name, float(value))
    stops = payload.get("stop_sequences")
    request.stop = [stop for stop in stops if isinstance(stop, str)] \
        if isinstance(stops, list) else []
    request.stream = payload.get("stream") is True
    metadata = payload.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        request.user = metadata["user_id"]
    for name in _TUNING_FIELDS:
        if name in payload:
            _drop(request, name)
    for name in payload:
        if name not in _READ_FIELDS and name not in _TUNING_FIELDS:
            _drop(request, name)  # what a newer API version or a beta added
    return request


# ---- the caller's side: writing an answer ----------------------------------------------------


def _usage(usage: Usage | None) -> dict[str, Any]:
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
                            "input": _input_of(part.arguments)})
    return {
        # The target's own id, kept: it is what the usage record and the target's logs
        # know the answer by, and the SDK reads it as opaque (no msg_ prefix required).
        "id": reply.id,
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": _STOP_REASON[reply.stop],
        "stop_sequence": reply.stop_sequence if reply.stop == "stop_sequence" else None,
        "usage": _usage(reply.usage),
    }


class _StreamWriter:
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
            out.append(self._error(_error_type(event.status, event.type), event.message))
            self.ended = True
        return b"".join(out)

    def fail(self, status: int, type: str, code: str, message: str) -> bytes:
        if self.ended:
            return b""
        self.ended = True
        # As protocols/messages.py's stream_error: Anthropic's error event, and no more.
        return self._error(_error_type(status), message)

    # -- frames --

    def _begin(self, begin: Begin) -> bytes:
        self._begun = True
        usage = _usage(begin.usage)
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
        usage = _usage(finish.usage or self._usage)
        delta = {"stop_reason": _STOP_REASON[finish.stop],
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


# ---- the target's side: writing a body -------------------------------------------------------


def _image_block(image: Image) -> dict[str, Any]:
    if image.url is not None and image.data is None:
        parsed = _image_url(image.url)
        if parsed.data is None:
            return {"type": "image", "source": {"type": "url", "url": image.url}}
        image = parsed
    data = image.data or ""
    media = image.media_type or next(
        (kind for magic, kind in _IMAGE_MAGIC if data.startswith(magic)), None)
    if media not in _IMAGE_TYPES:
        raise Untranslatable("image", f"is of type {media!r}; Anthropic reads JPEG, PNG, GIF "
                                      "and WebP")
    return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}


def _content_blocks(parts: list[Text | Image]) -> list[dict[str, Any]]:
    # Anthropic refuses an empty text block.
    return [{"type": "text", "text": part.text} if isinstance(part, Text)
            else _image_block(part) for part in parts
            if not isinstance(part, Text) or part.text]


def _result_block(result: ToolResult) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": result.call_id}
    if len(result.content) == 1 and isinstance(result.content[0], Text):
        block["content"] = result.content[0].text
    elif _content_blocks(result.content):
        block["content"] = _content_blocks(result.content)
    if result.is_error:
        block["is_error"] = True
    return block


def _call_block(call: ToolCall) -> dict[str, Any]:
    # A custom tool's free-form input travels as its one string argument.
    arguments = ({CUSTOM_INPUT: call.arguments} if call.kind == "custom"
                 else _input_of(call.arguments))
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


def _turn_blocks(request: Request, turn: Turn) -> tuple[str, list[dict[str, Any]]]:
    blocks: list[dict[str, Any]] = []
    if turn.role == "system":
        text = "\n\n".join(part.text for part in turn.parts if isinstance(part, Text))
        return "user", [{"type": "text", "text": f"<system>\n{text}\n</system>"}]
    for part in turn.parts:
        if isinstance(part, Text | Refusal):
            if part.text:  # Anthropic refuses an empty text block
                blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, Image):
            blocks.append(_image_block(part))
        elif isinstance(part, ToolResult):
            blocks.append(_result_block(part))
        elif isinstance(part, ToolCall):
            blocks.append(_call_block(part))
        elif isinstance(part, Thinking):
            if part.redacted and part.signature:
                blocks.append({"type": "redacted_thinking", "data": part.signature})
            elif part.signature and turn.role == "assistant":
                blocks.append({"type": "thinking", "thinking": part.text,
                               "signature": part.signature})
            else:
                # Anthropic takes back only the thinking it signed.
                _drop(request, "thinking")
    return ("assistant" if turn.role == "assistant" else "user"), blocks


def _messages(request: Request) -> list[dict[str, Any]]:
    """The turns as alternating user and assistant messages: a tool turn is a user
    message, and consecutive messages of one role are one (tool results first, as
    Anthropic requires of the message after a tool use)."""
    messages: list[dict[str, Any]] = []
    for turn in request.turns:
        role, blocks = _turn_blocks(request, turn)
        if not blocks:
            continue  # Anthropic refuses a message without content
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    for message in messages:
        if message["role"] == "user":
            message["content"].sort(key=lambda block: block["type"] != "tool_result")
    return messages


def _unsigned_tool_loop(messages: list[dict[str, Any]]) -> bool:
    """The conversation ends in tool results for an assistant message that does not start
    with a thinking block."""
    if len(messages) < 2 or messages[-1]["role"] != "user" \
            or messages[-1]["content"][0]["type"] != "tool_result":
        return False
    first = messages[-2]["content"][0]["type"]
    return first not in ("thinking", "redacted_thinking")


def _tool_definition(tool: Tool) -> dict[str, Any]:
    if tool.kind == "custom":
        schema: dict[str, Any] = {"type": "object",
                                  "properties": {CUSTOM_INPUT: {"type": "string"}},
                                  "required": [CUSTOM_INPUT]}
    else:
        # Anthropic requires an object schema, a function without parameters too.
        schema = {"type": "object", "properties": {}, **(tool.parameters or {})}
    definition: dict[str, Any] = {"name": tool.name}
    if tool.description:
        definition["description"] = tool.description
    definition["input_schema"] = schema
    if tool.strict and tool.kind == "function":
        definition["strict"] = True
    return definition


def _thinking(request: Request, max_tokens: int) -> dict[str, Any] | None:
    reasoning = request.reasoning
    if reasoning is None or not reasoning.enabled:
        return None
    forced = request.tool_choice is not None and request.tool_choice.mode in ("required",
                                                                              "tool")
    budget = reasoning.budget_tokens or budget_for_effort(reasoning.effort, max_tokens)
    budget = min(max(budget, MIN_BUDGET), max_tokens - 1)
    if forced or budget < MIN_BUDGET:
        # Anthropic refuses thinking with a forced tool, and a budget under 1 024 or not
        # below max_tokens: the forced call and the cap are the caller's contract, the
        # thinking only how it gets there.
        _drop(request, "reasoning")
        return None
    return {"type": "enabled", "budget_tokens": budget}


def write_request(request: Request, *, model: str) -> dict:
    if request.previous_response_id is not None:
        raise Untranslatable("previous_response_id", "continues a stored conversation; "
                                                     "Anthropic keeps none")
    max_tokens = request.max_output_tokens if request.max_output_tokens is not None \
        else DEFAULT_MAX_TOKENS
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    system = [text.text for text in request.system if text.text]
    if len(system) == 1:
        body["system"] = system[0]
    elif system:
        body["system"] = [{"type": "text", "text": text} for text in system]
    body["messages"] = _messages(request)
    if request.tools:
        body["tools"] = [_tool_definition(tool) for tool in request.tools]
        if any(tool.grammar is not None for tool in request.tools):
            # Anthropic's tools take a JSON schema only; a grammar just narrows what the
            # model may write into the one string argument.
            _drop(request, "format")
        choice = _tool_choice_of(request)
        if choice is not None:
            body["tool_choice"] = choice
    thinking = _thinking(request, max_tokens)
    if thinking is not None and _unsigned_tool_loop(body["messages"]):
        # Anthropic refuses thinking in a tool loop whose assistant message does not start
        # with its signed thinking (one another target answered): this turn goes without.
        _drop(request, "reasoning")
        thinking = None
    if thinking is not None:
        body["thinking"] = thinking
    _sampling(request, body, thinking=thinking is not None)
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    if request.stream:
        body["stream"] = True
    if request.user:
        body["metadata"] = {"user_id": request.user}
    output = request.output_format
    if output is not None:
        if output.kind == "json_schema" and output.schema is not None:
            body["output_config"] = {"format": {"type": "json_schema",
                                                "schema": output.schema}}
        else:
            # Anthropic's structured outputs take a schema; it has no "any JSON" mode.
            _drop(request, "response_format")
    return body


def _tool_choice_of(request: Request) -> dict[str, Any] | None:
    choice = request.tool_choice
    written: dict[str, Any] | None = None
    if choice is not None:
        if choice.mode == "tool" and choice.name:
            written = {"type": "tool", "name": choice.name}
        else:
            written = {"type": {"auto": "auto", "none": "none", "required": "any",
                                "tool": "any"}[choice.mode]}
    if request.parallel_tool_calls is False and (written is None
                                                 or written["type"] != "none"):
        written = {**(written or {"type": "auto"}), "disable_parallel_tool_use": True}
    return written


def _sampling(request: Request, body: dict[str, Any], *, thinking: bool) -> None:
    temperature, top_p = request.temperature, request.top_p
    if thinking:
        # Anthropic refuses a temperature other than 1 with thinking, and a top_p under 0.95.
        if temperature is not None:
            _drop(request, "temperature")
            temperature = None
        if top_p is not None and top_p < 0.95:
            _drop(request, "top_p")
            top_p = None
    if temperature is not None and top_p is not None:
        # The current models refuse both at once; temperature is the usual knob.
        _drop(request, "top_p")
        top_p = None
    if temperature is not None:
        body["temperature"] = min(temperature, 1.0)  # Anthropic's range is 0-1, OpenAI's 0-2
    if top_p is not None:
        body["top_p"] = top_p


# ---- the target's side: reading an answer ----------------------------------------------------


def _read_usage(usage: object) -> Usage | None:
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
                        _json_text(block.get("input") or {}))
    return None  # a server tool's blocks: never asked for by the writer above


def read_reply(body: dict) -> Reply:
    parts = [part for part in map(_reply_part, body.get("content") or ()) if part is not None]
    stop_sequence = body.get("stop_sequence")
    return Reply(id=str(body.get("id", "")), model=str(body.get("model", "")), parts=parts,
                 stop=_STOP_OF.get(str(body.get("stop_reason")), "end"),
                 stop_sequence=stop_sequence if isinstance(stop_sequence, str) else None,
                 usage=_read_usage(body.get("usage")))


class _StreamReader:
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
            prompt = _read_usage(message.get("usage"))
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
                    self._stop = _STOP_OF.get(delta["stop_reason"], "end")
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
                            type=type_, status=_STATUS_OF_TYPE.get(type_, 500))]
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
                events.append(ToolArgumentsDelta(ordinal, _json_text(block["input"])))
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
        return [Finish(self._stop, usage=_read_usage(self._usage) if self._usage else None,
                       stop_sequence=self._stop_sequence if self._stop == "stop_sequence"
                       else None)]


class _Messages:
    name = "messages"

    def read_request(self, payload: dict) -> Request:
        return read_request(payload)

    def write_request(self, request: Request, *, model: str) -> dict:
        return write_request(request, model=model)

    def path(self, model: str, stream: bool) -> tuple[str, str]:
        return "/messages", ""

    def read_reply(self, body: dict) -> Reply:
        return read_reply(body)

    def write_reply(self, reply: Reply, request: Request) -> dict:
        return write_reply(reply, request)

    def stream_reader(self) -> _StreamReader:
        return _StreamReader()

    def stream_writer(self, request: Request) -> _StreamWriter:
        return _StreamWriter(request)


CODEC = _Messages()

__all__ = ["CODEC", "DEFAULT_MAX_TOKENS", "read_reply", "read_request", "write_reply",
           "write_request"]
