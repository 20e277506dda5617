"""A chat caller's body (``POST /chat/completions``) into the hub form: the caller's role
of the ``chat`` codec for requests (``chat`` writes them for a chat target).
"""

from __future__ import annotations

from llm_gateway.translate.chat_reply import int_of
from llm_gateway.translate.form import (
    Image,
    OutputFormat,
    Part,
    Reasoning,
    Refusal,
    Request,
    Text,
    Thinking,
    Tool,
    ToolCall,
    ToolChoice,
    ToolResult,
    Turn,
    Untranslatable,
)

# ---- what a chat caller sends ---------------------------------------------------------------

# The fields read into the form; any other top-level field only tunes the answer (sampling,
# logprobs, caching, storage, service tier) and is named in Request.dropped.
_READ_FIELDS = frozenset({
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "functions",
    "function_call", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop",
    "stream", "stream_options", "reasoning_effort", "reasoning", "response_format", "user",
    "safety_identifier", "n",
})

_EFFORTS = ("minimal", "low", "medium", "high")


def drop(dropped: list[str], name: str) -> None:
    if name not in dropped:
        dropped.append(name)


def read_request(payload: dict) -> Request:
    n = payload.get("n")
    if n is not None and n != 1:
        raise Untranslatable("n", "asks for several choices; a translated target answers one")
    dropped: list[str] = []
    system, turns = _read_messages(payload.get("messages") or [], dropped)
    tools = _read_tools(payload.get("tools"), dropped) + _read_functions(payload.get("functions"))
    tool_choice, tools = _read_tool_choice(
        payload.get("tool_choice", payload.get("function_call")), tools)
    request = Request(
        model=str(payload.get("model", "")),
        system=system,
        turns=turns,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=_bool(payload.get("parallel_tool_calls")),
        max_output_tokens=int_of(payload.get("max_completion_tokens", payload.get("max_tokens"))),
        temperature=_number(payload.get("temperature")),
        top_p=_number(payload.get("top_p")),
        stop=_read_stop(payload.get("stop")),
        stream=payload.get("stream") is True,
        reasoning=_read_reasoning(payload.get("reasoning_effort"), payload.get("reasoning")),
        output_format=_read_output_format(payload.get("response_format"), dropped),
        user=_str(payload.get("user", payload.get("safety_identifier"))),
        dropped=dropped,
    )
    options = payload.get("stream_options")
    if isinstance(options, dict):
        request.stream_usage = options.get("include_usage") is True
        for key in options:
            if key != "include_usage":
                drop(dropped, f"stream_options.{key}")
    if "user" in payload and "safety_identifier" in payload:
        drop(dropped, "safety_identifier")
    for key in payload:
        if key not in _READ_FIELDS:
            drop(dropped, key)
    return request


def _read_messages(messages: list, dropped: list[str]) -> tuple[list[Text], list[Turn]]:
    system: list[Text] = []
    turns: list[Turn] = []
    custom_calls: set[str] = set()  # ids of custom calls, so that their results say custom
    leading = True
    for message in messages:
        if not isinstance(message, dict):
            raise Untranslatable("messages", "holds an entry that is not an object")
        role = message.get("role")
        if "name" in message:
            drop(dropped, "messages[].name")
        content = message.get("content")
        if role in ("system", "developer"):
            texts = _texts(content, "messages[].content")
            if leading:
                system.extend(texts)
            else:
                turns.append(Turn("system", list(texts)))
            continue
        leading = False
        if role == "user":
            turns.append(Turn("user", _user_parts(content, dropped)))
        elif role == "assistant":
            turns.append(Turn("assistant", _assistant_parts(message, custom_calls, dropped)))
        elif role == "tool":
            call_id = str(message.get("tool_call_id", ""))
            result = ToolResult(call_id, list(_texts(content, "messages[].content")),
                                kind="custom" if call_id in custom_calls else "function")
            # Parallel calls' results are consecutive tool messages: one tool turn, as the
            # protocols that answer all of them in one message need.
            if turns and turns[-1].role == "tool":
                turns[-1].parts.append(result)
            else:
                turns.append(Turn("tool", [result]))
        else:
            raise Untranslatable("messages[].role",
                                 f"'{role}' messages cannot be translated (use tool messages)")
    return system, turns


def _texts(content: object, where: str) -> list[Text]:
    if content is None:
        return []
    if isinstance(content, str):
        return [Text(content)]
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise Untranslatable(where, f"holds a '{kind}' part where only text is taken")
            texts.append(Text(str(part.get("text", ""))))
        return texts
    raise Untranslatable(where, "is neither text nor a list of parts")


def _user_parts(content: object, dropped: list[str]) -> list[Part]:
    if not isinstance(content, list):
        return list(_texts(content, "messages[].content"))
    parts: list[Part] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append(Text(str(part.get("text", ""))))
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str):
                raise Untranslatable("image_url", "has no url")
            if isinstance(image, dict) and "detail" in image:
                drop(dropped, "image_url.detail")
            parts.append(_image_from_url(url))
        else:
            # Audio and files (documents) change what the model reads: never left out.
            raise Untranslatable(str(kind or "messages[].content"),
                                 "is content the target's protocol cannot carry")
    return parts


def _image_from_url(url: str) -> Image:
    if url.startswith("data:") and ";base64," in url:
        head, data = url[5:].split(";base64,", 1)
        return Image(data=data, media_type=head or None)
    return Image(url=url)


def _assistant_parts(message: dict, custom_calls: set[str], dropped: list[str]) -> list[Part]:
    parts: list[Part] = []
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    if isinstance(reasoning, str) and reasoning:
        parts.append(Thinking(reasoning))
    content = message.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "refusal":
                parts.append(Refusal(str(part.get("refusal", ""))))
            else:
                parts.extend(_texts([part], "messages[].content"))
    else:
        parts.extend(_texts(content, "messages[].content"))
    if isinstance(message.get("refusal"), str):
        parts.append(Refusal(message["refusal"]))
    if message.get("function_call") is not None:
        raise Untranslatable("messages[].function_call",
                             "carries no call id to match its result (use tool_calls)")
    if message.get("audio") is not None:
        drop(dropped, "messages[].audio")
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            raise Untranslatable("tool_calls", "holds an entry that is not an object")
        call_id = str(call.get("id", ""))
        if call.get("type") == "custom":
            custom = call.get("custom") or {}
            custom_calls.add(call_id)
            parts.append(ToolCall(call_id, str(custom.get("name", "")),
                                  str(custom.get("input", "")), kind="custom"))
        else:
            function = call.get("function") or {}
            parts.append(ToolCall(call_id, str(function.get("name", "")),
                                  str(function.get("arguments", ""))))
    return parts


def _read_tools(tools: object, dropped: list[str]) -> list[Tool]:
    read: list[Tool] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind == "function":
            function = tool.get("function") or {}
            read.append(Tool(str(function.get("name", "")), _str(function.get("description")),
                             function.get("parameters"), strict=_bool(function.get("strict"))))
        elif kind == "custom":
            custom = tool.get("custom") or {}
            # A grammar only narrows what the model may write: the form keeps no grammar.
            if isinstance(custom.get("format"), dict) and custom["format"].get("type") != "text":
                drop(dropped, "custom.format")
            read.append(Tool(str(custom.get("name", "")), _str(custom.get("description")),
                             kind="custom"))
        else:
            drop(dropped, f"tools[{kind}]")
    return read


def _read_functions(functions: object) -> list[Tool]:
    """The deprecated ``functions`` (before ``tools``): the same function tools."""
    return [Tool(str(f.get("name", "")), _str(f.get("description")), f.get("parameters"))
            for f in (functions if isinstance(functions, list) else []) if isinstance(f, dict)]


def _read_tool_choice(choice: object, tools: list[Tool]) -> tuple[ToolChoice | None, list[Tool]]:
    if choice in ("auto", "none", "required"):
        return ToolChoice(choice), tools  # type: ignore[arg-type]
    if not isinstance(choice, dict):
        return None, tools
    kind = choice.get("type")
    if kind == "allowed_tools":
        # Only these may be called: the others are left out of the target's tools, which
        # says the same thing in every protocol.
        allowed = choice.get("allowed_tools") or {}
        names = {str((t.get(t.get("type", "function")) or {}).get("name"))
                 for t in allowed.get("tools") or [] if isinstance(t, dict)}
        mode = "required" if allowed.get("mode") == "required" else "auto"
        return ToolChoice(mode), [tool for tool in tools if tool.name in names]
    named = choice.get("custom") if kind == "custom" else choice.get("function", choice)
    name = named.get("name") if isinstance(named, dict) else None
    return (ToolChoice("tool", str(name)) if name else None), tools


def _read_stop(stop: object) -> list[str]:
    if isinstance(stop, str):
        return [stop]
    return [s for s in stop if isinstance(s, str)] if isinstance(stop, list) else []


def _read_reasoning(effort: object, reasoning: object) -> Reasoning | None:
    """``reasoning_effort`` (OpenAI's, Venice's), or the ``reasoning`` object Venice and
    OpenRouter take (``effort``, ``max_tokens``, ``enabled``)."""
    detail = reasoning if isinstance(reasoning, dict) else {}
    effort = effort if effort is not None else detail.get("effort")
    if effort == "none" or detail.get("enabled") is False:
        return Reasoning(enabled=False)
    if effort == "xhigh":
        effort = "high"  # the most the form (and Anthropic's budgets) can say
    budget = int_of(detail.get("max_tokens"))
    if effort not in _EFFORTS and budget is None:
        return None
    return Reasoning(effort=effort if effort in _EFFORTS else None,  # type: ignore[arg-type]
                     budget_tokens=budget)


def _read_output_format(response_format: object, dropped: list[str]) -> OutputFormat | None:
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return OutputFormat("json_object")
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        if "description" in spec:
            drop(dropped, "response_format.json_schema.description")
        return OutputFormat("json_schema", schema=spec.get("schema"), name=_str(spec.get("name")),
                            strict=_bool(spec.get("strict")))
    return None  # "text": the default


# ---- small readers of loosely typed JSON ------------------------------------------------------


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None
