"""A chat target's whole answer (``chat.completion``) into the hub form, and the form's
answer written back for a chat caller, as the openai SDK parses it; with what the stream
reader and writer (``chat_stream``) share: finish reasons, usage, reasoning fields, the
unwrapping of custom tools' input. The requests are ``chat``'s (writing) and
``chat_reader``'s (reading).
"""

from __future__ import annotations

import json

from llm_gateway.translate.form import (
    CUSTOM_INPUT,
    Part,
    Refusal,
    Reply,
    Request,
    Stop,
    Text,
    Thinking,
    ToolCall,
    Usage,
)

_STOP_FROM_FINISH: dict[str, Stop] = {
    "stop": "end", "length": "length", "tool_calls": "tool", "function_call": "tool",
    "content_filter": "filter",
}
FINISH_FROM_STOP: dict[str, str] = {
    "end": "stop", "stop_sequence": "stop", "pause": "stop", "length": "length",
    "tool": "tool_calls", "filter": "content_filter", "refusal": "content_filter",
}


# ---- a chat target's answer ---------------------------------------------------------------------


def read_reply(body: dict) -> Reply:
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") or {}
    reply_id = str(body.get("id", ""))
    parts: list[Part] = []
    reasoning = reasoning_text(message)
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
    stop, stop_sequence = read_finish(choice.get("finish_reason"), choice.get("stop_reason"),
                                      any(isinstance(part, ToolCall) for part in parts))
    return Reply(id=reply_id, model=str(body.get("model", "")), parts=parts, stop=stop,
                 stop_sequence=stop_sequence, usage=read_usage(body.get("usage")),
                 created=int_of(body.get("created")))


def reasoning_text(message: dict) -> str:
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


def read_finish(finish: object, stop_reason: object, called: bool) -> tuple[Stop, str | None]:
    stop = _STOP_FROM_FINISH.get(finish, "end") if isinstance(finish, str) else "end"
    if stop == "end" and called:
        # Some OpenAI-compatible servers say "stop" after tool calls: the caller's agent
        # must still see that it is to run them.
        return "tool", None
    if stop == "end" and isinstance(stop_reason, str):
        return "stop_sequence", stop_reason  # vLLM names the stop string that matched
    return stop, None


def read_usage(usage: object) -> Usage | None:
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


# ---- the answer a chat caller gets ---------------------------------------------------------------


def custom_names(request: Request) -> frozenset[str]:
    return frozenset(tool.name for tool in request.tools if tool.kind == "custom")


def unwrap(arguments: str) -> str:
    """A custom tool's input from the one-string function a target was given instead."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(CUSTOM_INPUT), str):
        return parsed[CUSTOM_INPUT]
    return arguments


def write_reply(reply: Reply, request: Request) -> dict:
    custom = custom_names(request)
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
                     "finish_reason": FINISH_FROM_STOP.get(reply.stop, "stop")}],
    }
    if reply.usage is not None:
        body["usage"] = write_usage(reply.usage)
    return body


def _reply_call(call: ToolCall, custom: frozenset[str]) -> dict:
    if call.kind == "custom":
        return {"id": call.id, "type": "custom",
                "custom": {"name": call.name, "input": call.arguments}}
    if call.name in custom:
        return {"id": call.id, "type": "custom",
                "custom": {"name": call.name, "input": unwrap(call.arguments)}}
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def write_usage(usage: Usage) -> dict:
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


# ---- small readers of loosely typed JSON ------------------------------------------------------


def int_of(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count(value: object) -> int:
    # A negative or malformed count is no count: metering must not credit the caller.
    number = int_of(value)
    return number if number is not None and number > 0 else 0
