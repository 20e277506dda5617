"""OpenAI's chat completions (``POST /chat/completions``) as a codec, both roles.

As the caller's protocol it reads a chat body into the hub form and writes the target's
answer back as a ``chat.completion`` (or ``chat.completion.chunk`` frames) that the openai
SDK parses. As the target's protocol it writes the standard OpenAI chat body (the
provider's profile adapts it afterwards: ``max_tokens`` or ``max_completion_tokens``,
Venice's refusal of unknown fields) and reads the answer, including what Venice, DeepSeek
and vLLM add to it (``reasoning_content``, ``prompt_cache_hit_tokens``, ``stop_reason``).

Custom (free-form) tools: a target of this protocol gets each as a function of one string
argument (``form.CUSTOM_INPUT``), and its readers, which see no request, give the call back
as a function call whose arguments are ``{"input": ...}``. The caller's writer restores it:
this module's ``write_reply`` and stream writer turn a call of a tool the request defined
as custom back into a custom call with the raw input (the other codecs' writers do the same).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from llm_gateway.errors import error_body
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
from llm_gateway.translate.frames import DONE, data_frame

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

_STOP_FROM_FINISH: dict[str, Stop] = {
    "stop": "end", "length": "length", "tool_calls": "tool", "function_call": "tool",
    "content_filter": "filter",
}
_FINISH_FROM_STOP: dict[str, str] = {
    "end": "stop", "stop_sequence": "stop", "pause": "stop", "length": "length",
    "tool": "tool_calls", "filter": "content_filter", "refusal": "content_filter",
}

# The one string parameter a custom tool becomes on a target that only has functions.
_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {CUSTOM_INPUT: {"type": "string",
                                  "description": "The tool's whole input, as free-form text."}},
    "required": [CUSTOM_INPUT],
}


def _drop(dropped: list[str], name: str) -> None:
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
        max_output_tokens=_int(payload.get("max_completion_tokens", payload.get("max_tokens"))),
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
                _drop(dropped, f"stream_options.{key}")
    if "user" in payload and "safety_identifier" in payload:
        _drop(dropped, "safety_identifier")
    for key in payload:
        if key not in _READ_FIELDS:
            _drop(dropped, key)
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
            _drop(dropped, "messages[].name")
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
                _drop(dropped, "image_url.detail")
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
        _drop(dropped, "messages[].audio")
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
                _drop(dropped, "custom.format")
            read.append(Tool(str(custom.get("name", "")), _str(custom.get("description")),
                             kind="custom"))
        else:
            _drop(dropped, f"tools[{kind}]")
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
    budget = _int(detail.get("max_tokens"))
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
            _drop(dropped, "response_format.json_schema.description")
        return OutputFormat("json_schema", schema=spec.get("schema"), name=_str(spec.get("name")),
                            strict=_bool(spec.get("strict")))
    return None  # "text": the default


# ---- what a chat target is sent -----------------------------------------------------------------


def write_request(request: Request, *, model: str) -> dict:
    if request.previous_response_id is not None:
        raise Untranslatable("previous_response_id",
                             "continues a stored conversation, and a chat completions target "
                             "keeps none: send the whole conversation")
    body: dict = {"model": model, "messages": _write_messages(request)}
    if request.tools:
        body["tools"] = [_write_tool(tool) for tool in request.tools]
        # OpenAI refuses tool_choice and parallel_tool_calls without tools: written only here.
        if request.tool_choice is not None:
            body["tool_choice"] = _write_tool_choice(request.tool_choice)
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
    # The profile spells it max_completion_tokens where the provider wants that (OpenAI).
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    if request.stop:
        body["stop"] = list(request.stop)
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.stream:
        # OpenAI sends a stream's usage only when asked; the gateway meters it whatever the
        # caller asked (whose writer decides from request.stream_usage whether it sees it).
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    reasoning = request.reasoning
    if reasoning is not None and reasoning.enabled:
        # Neither an effort nor a budget (Anthropic's adaptive thinking): the model's own
        # default, rather than an effort a model without reasoning would refuse.
        if reasoning.effort is not None:
            body["reasoning_effort"] = reasoning.effort
        elif reasoning.budget_tokens is not None:
            body["reasoning_effort"] = effort_for_budget(reasoning.budget_tokens)
    if request.output_format is not None:
        body["response_format"] = _write_output_format(request.output_format)
    if request.user is not None:
        body["user"] = request.user
    return body


def _write_messages(request: Request) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": text.text} for text in request.system]
    for turn in request.turns:
        if turn.role == "system":
            messages.extend({"role": "system", "content": _only_text(part, "system").text}
                            for part in turn.parts)
        elif turn.role == "assistant":
            messages.append(_write_assistant(turn.parts, request))
        else:  # user and tool turns: results first, as they must follow the calls
            results = [part for part in turn.parts if isinstance(part, ToolResult)]
            rest = [part for part in turn.parts if not isinstance(part, ToolResult)]
            messages.extend(_write_results(results, request))
            if rest:
                messages.append({"role": "user", "content": _write_user_content(rest)})
    return messages


def _only_text(part: Part, where: str) -> Text:
    if not isinstance(part, Text):
        raise Untranslatable(where, f"holds {type(part).__name__.lower()} content; "
                             "the target's protocol takes only text there")
    return part


def _write_user_content(parts: list[Part]) -> str | list[dict]:
    if len(parts) == 1 and isinstance(parts[0], Text):
        return parts[0].text
    content: list[dict] = []
    for part in parts:
        if isinstance(part, Image):
            content.append({"type": "image_url", "image_url": {"url": _image_url(part)}})
        else:
            content.append({"type": "text", "text": _only_text(part, "user content").text})
    return content


def _image_url(image: Image) -> str:
    if image.data is not None:
        return f"data:{image.media_type or 'image/png'};base64,{image.data}"
    if image.url is not None:
        return image.url
    raise Untranslatable("image", "has neither data nor a url")


def _write_results(results: list[ToolResult], request: Request) -> list[dict]:
    """One tool message per result. A chat tool message holds text only, so a result's
    images follow, after the last tool message (nothing may come between a call's results),
    in one user message: the model still sees them, which dropping would not give."""
    messages: list[dict] = []
    images: list[dict] = []
    for result in results:
        texts = [part.text for part in result.content if isinstance(part, Text)]
        found = [part for part in result.content if isinstance(part, Image)]
        if result.is_error:
            # Chat has no flag for a failed call: its text says so, as the caller wrote it.
            _drop(request.dropped, "is_error")
        messages.append({"role": "tool", "tool_call_id": result.call_id,
                         "content": "\n\n".join(texts)})
        if found:
            images.append({"type": "text", "text": f"Images from tool call {result.call_id}:"})
            images.extend({"type": "image_url", "image_url": {"url": _image_url(image)}}
                          for image in found)
    if images:
        messages.append({"role": "user", "content": images})
    return messages


def _write_assistant(parts: list[Part], request: Request) -> dict:
    message: dict = {"role": "assistant"}
    texts = [part for part in parts if isinstance(part, Text)]
    refusals = [part.text for part in parts if isinstance(part, Refusal)]
    calls = [part for part in parts if isinstance(part, ToolCall)]
    if any(isinstance(part, Thinking) for part in parts):
        # Chat APIs take no reasoning back in the history (DeepSeek refuses it, OpenAI has
        # no field for it): the answer's text and calls carry the conversation on.
        _drop(request.dropped, "thinking")
    for part in parts:
        if not isinstance(part, Text | Refusal | ToolCall | Thinking):
            raise Untranslatable("assistant content", f"holds {type(part).__name__.lower()} "
                                 "content; a chat assistant message takes text and tool calls")
    if len(texts) == 1:
        message["content"] = texts[0].text
    elif texts:
        message["content"] = [{"type": "text", "text": text.text} for text in texts]
    if refusals:
        message["refusal"] = "".join(refusals)
    if calls:
        message["tool_calls"] = [_write_call(call) for call in calls]
    if "content" not in message and "tool_calls" not in message:
        message["content"] = ""  # an assistant message says something or calls something
    return message


def _write_call(call: ToolCall) -> dict:
    arguments = call.arguments
    if call.kind == "custom":
        arguments = json.dumps({CUSTOM_INPUT: call.arguments})
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": arguments}}


def _write_tool(tool: Tool) -> dict:
    function: dict = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.kind == "custom":
        function["parameters"] = _CUSTOM_PARAMETERS
    elif tool.parameters is not None:
        function["parameters"] = tool.parameters
    if tool.strict is not None and tool.kind == "function":
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _write_tool_choice(choice: ToolChoice) -> str | dict:
    if choice.mode == "tool":
        return {"type": "function", "function": {"name": choice.name or ""}}
    return choice.mode


def _write_output_format(output: OutputFormat) -> dict:
    if output.kind == "json_object":
        return {"type": "json_object"}
    spec: dict = {"name": output.name or "response"}  # OpenAI requires a name
    if output.schema is not None:
        spec["schema"] = output.schema
    if output.strict is not None:
        spec["strict"] = output.strict
    return {"type": "json_schema", "json_schema": spec}


def path(model: str, stream: bool) -> tuple[str, str]:
    return "/chat/completions", ""


# ---- a chat target's answer ---------------------------------------------------------------------


def read_reply(body: dict) -> Reply:
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") or {}
    reply_id = str(body.get("id", ""))
    parts: list[Part] = []
    reasoning = _reasoning_text(message)
    if reasoning:
        parts.append(Thinking(reasoning))
    content = message.get("content")
    if isinstance(content, str) and content:
        parts.append(Text(content))
    elif isinstance(content, list):  # some servers answer in parts
        parts.extend(Text(str(p.get("text", ""))) for p in content
                     if isinstance(p, dict) and p.get("type") == "text")
    if isinstance(message.get("refusal"), str) and message["refusal"]:
        parts.append(Refusal(message["refusal"]))
    for position, call in enumerate(message.get("tool_calls") or []):
        if isinstance(call, dict):
            parts.append(_read_call(call, _call_id(call.get("id"), reply_id, position)))
    stop, stop_sequence = _read_finish(choice.get("finish_reason"), choice.get("stop_reason"),
                                       any(isinstance(part, ToolCall) for part in parts))
    return Reply(id=reply_id, model=str(body.get("model", "")), parts=parts, stop=stop,
                 stop_sequence=stop_sequence, usage=_read_usage(body.get("usage")),
                 created=_int(body.get("created")))


def _reasoning_text(message: dict) -> str:
    # Venice and DeepSeek say reasoning_content; vLLM's newer servers and OpenRouter reasoning.
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _read_call(call: dict, call_id: str) -> ToolCall:
    if call.get("type") == "custom":
        custom = call.get("custom") or {}
        return ToolCall(call_id, str(custom.get("name", "")), str(custom.get("input", "")),
                        kind="custom")
    function = call.get("function") or {}
    return ToolCall(call_id, str(function.get("name", "")), str(function.get("arguments") or ""))


def _call_id(call_id: object, reply_id: str, position: int) -> str:
    """The call's id; some servers send none, and a result must name its call: one derived
    from the answer's id (unique per answer) and the call's place in it."""
    return call_id if isinstance(call_id, str) and call_id else f"call_{reply_id}_{position}"


def _read_finish(finish: object, stop_reason: object, called: bool) -> tuple[Stop, str | None]:
    stop = _STOP_FROM_FINISH.get(finish, "end") if isinstance(finish, str) else "end"
    if stop == "end" and called:
        # Some OpenAI-compatible servers say "stop" after tool calls: the caller's agent
        # must still see that it is to run them.
        return "tool", None
    if stop == "end" and isinstance(stop_reason, str):
        return "stop_sequence", stop_reason  # vLLM names the stop string that matched
    return stop, None


def _read_usage(usage: object) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    prompt = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
    completion = _count(usage.get("completion_tokens", usage.get("output_tokens")))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    details = details if isinstance(details, dict) else {}
    cached = _count(details.get("cached_tokens")) or _count(usage.get("prompt_cache_hit_tokens"))
    # Venice reports cache writes beside the cache reads.
    written = (_count(details.get("cache_creation_input_tokens"))
               or _count(usage.get("cache_creation_input_tokens")))
    output = usage.get("completion_tokens_details") or usage.get("output_tokens_details")
    reasoning = _count(output.get("reasoning_tokens")) if isinstance(output, dict) else 0
    return Usage(prompt, completion, min(cached, prompt), min(written, prompt),
                 min(reasoning, completion))


class _Reader:
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
                                created=_int(payload.get("created"))))
        if payload.get("usage") is not None:
            self._usage = _read_usage(payload["usage"]) or self._usage
        choices = payload.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            return events
        delta = choice.get("delta") or {}
        reasoning = _reasoning_text(delta)
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
        stop, stop_sequence = _read_finish(self._finish, self._stop_reason, self._calls > 0)
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


# ---- the answer a chat caller gets ---------------------------------------------------------------


def _custom_names(request: Request) -> frozenset[str]:
    return frozenset(tool.name for tool in request.tools if tool.kind == "custom")


def _unwrap(arguments: str) -> str:
    """A custom tool's input from the one-string function a target was given instead."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(CUSTOM_INPUT), str):
        return parsed[CUSTOM_INPUT]
    return arguments


def write_reply(reply: Reply, request: Request) -> dict:
    custom = _custom_names(request)
    texts = [part.text for part in reply.parts if isinstance(part, Text)]
    thinking = [part.text for part in reply.parts if isinstance(part, Thinking) and part.text]
    refusals = [part.text for part in reply.parts if isinstance(part, Refusal)]
    message: dict = {"role": "assistant", "content": "".join(texts) if texts else None,
                     "refusal": "".join(refusals) if refusals else None}
    calls = [_reply_call(part, custom) for part in reply.parts if isinstance(part, ToolCall)]
    if calls:
        message["tool_calls"] = calls
    if thinking:
        # Not OpenAI's field, but Venice's and DeepSeek's: the clients made for them (and
        # every chat UI that shows reasoning) read it there; the openai SDK keeps it as an
        # extra field.
        message["reasoning_content"] = "".join(thinking)
    body: dict = {
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created if reply.created is not None else request.now,
        "model": request.model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": _FINISH_FROM_STOP.get(reply.stop, "stop")}],
    }
    if reply.usage is not None:
        body["usage"] = _write_usage(reply.usage)
    return body


def _reply_call(call: ToolCall, custom: frozenset[str]) -> dict:
    if call.kind == "custom":
        return {"id": call.id, "type": "custom",
                "custom": {"name": call.name, "input": call.arguments}}
    if call.name in custom:
        return {"id": call.id, "type": "custom",
                "custom": {"name": call.name, "input": _unwrap(call.arguments)}}
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _write_usage(usage: Usage) -> dict:
    details: dict = {"cached_tokens": usage.cache_read_tokens}
    if usage.cache_write_tokens:
        details["cache_creation_input_tokens"] = usage.cache_write_tokens  # Venice's name
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": details,
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


class _Writer:
    """The form's events as chat.completion.chunk frames, ending with ``[DONE]``."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self._custom = _custom_names(request)
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
                                            "custom": {"input": _unwrap("".join(parts))}}]})
               for index, parts in self._wrapped.items()]
        out.append(self._chunk({}, _FINISH_FROM_STOP.get(finish.stop, "stop")))
        if self._request.stream_usage:
            usage = finish.usage or self._usage or Usage()
            out.append(data_frame({**self._head(), "choices": [],
                                   "usage": _write_usage(usage)}))
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


# ---- small readers of loosely typed JSON ------------------------------------------------------


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def _count(value: object) -> int:
    # A negative or malformed count is no count: metering must not credit the caller.
    number = _int(value)
    return number if number is not None and number > 0 else 0


class ChatCodec:
    name = "chat"

    read_request = staticmethod(read_request)
    write_request = staticmethod(write_request)
    path = staticmethod(path)
    read_reply = staticmethod(read_reply)
    write_reply = staticmethod(write_reply)

    @staticmethod
    def stream_reader() -> _Reader:
        return _Reader()

    @staticmethod
    def stream_writer(request: Request) -> _Writer:
        return _Writer(request)


CODEC = ChatCodec()

__all__ = ["CODEC", "ChatCodec", "path", "read_reply", "read_request", "write_reply",
           "write_request"]
