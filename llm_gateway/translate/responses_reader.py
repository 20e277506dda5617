"""A Responses caller's request (``input``, ``instructions``, tools, ``text``, ``reasoning``)
into the hub form (the caller's role of the ``responses`` codec; ``responses`` writes a
Responses target's request). What only tunes OpenAI's own service is named in ``dropped``;
what OpenAI stores (a conversation, a prompt, an item reference, a file) is Untranslatable.
"""

from __future__ import annotations

from llm_gateway.translate.form import (
    Image,
    OutputFormat,
    Part,
    Reasoning,
    Refusal,
    Request,
    Text,
    Tool,
    ToolCall,
    ToolChoice,
    ToolResult,
    Turn,
    Untranslatable,
)
from llm_gateway.translate.responses_reply import int_of, read_reasoning_item

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


# ---- reading a caller's request ---------------------------------------------------------


class Dropped:
    """Names of what the form does not carry, each once, in the order met."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def add(self, name: str) -> None:
        if name not in self.names:
            self.names.append(name)


def read_request(payload: dict) -> Request:
    dropped = Dropped([])
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
    request.max_output_tokens = int_of(payload.get("max_output_tokens"))
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


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _read_items(items: list, request: Request, dropped: Dropped) -> None:
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
            _append(turns, "assistant", [read_reasoning_item(item)])
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


def _read_content(content: object, dropped: Dropped) -> list[Part]:
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


def _read_image(part: dict, dropped: Dropped) -> Image:
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


def _read_output(output: object, dropped: Dropped) -> list[Text | Image]:
    if isinstance(output, str):
        return [Text(output)]
    parts = _read_content(output, dropped)
    return [part for part in parts if isinstance(part, Text | Image)]


def _read_tools(tools: object, dropped: Dropped) -> list[Tool]:
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


def _read_tool_choice(choice: object, request: Request, dropped: Dropped) -> ToolChoice | None:
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


def _read_text(text: object, dropped: Dropped) -> OutputFormat | None:
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
