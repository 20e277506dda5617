"""A Responses target's whole answer (a Response object) into the hub form, and the form's
answer written back as the Response a Responses caller reads, as the openai SDK's model parses
it; with what the request writer (``responses``), the request reader (``responses_reader``)
and the streams (``responses_stream``) share: the marks a thinking block's proof travels
behind, the reasoning item, the request's echo in the envelope, tools, usage, ids.
"""

from __future__ import annotations

from llm_gateway.translate.chat_reply import unwrap
from llm_gateway.translate.form import (
    OutputFormat,
    Part,
    Refusal,
    Reply,
    Request,
    Stop,
    Text,
    Thinking,
    Tool,
    ToolCall,
    Usage,
)

# A thinking block's proof from another protocol, carried in encrypted_content: OpenAI's own
# encrypted content is an opaque token with no colon, so the marks cannot be mistaken for it.
SIGNATURE_MARK = "signature:"
REDACTED_MARK = "redacted:"


def int_of(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_reasoning_item(item: dict) -> Thinking:
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


# ---- writing the caller's answer ---------------------------------------------------------


def response_id(reply_id: str) -> str:
    return reply_id if reply_id.startswith("resp_") else f"resp_{reply_id}"


def custom_tools(request: Request) -> set[str]:
    return {tool.name for tool in request.tools if tool.kind == "custom"}


def status_of(stop: Stop) -> tuple[str, dict | None]:
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


def tool_json(tool: Tool) -> dict:
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


def tool_choice_json(request: Request) -> str | dict:
    choice = request.tool_choice
    if choice is None:
        return "auto"
    if choice.mode == "tool":
        kind = "custom" if choice.name in custom_tools(request) else "function"
        return {"type": kind, "name": choice.name}
    return choice.mode


def envelope(request: Request, rid: str, created: int, status: str) -> dict:
    """The response's fields that echo the request (the SDK's model requires most)."""
    reasoning = request.reasoning
    text_format: dict = {"type": "text"}
    if request.output_format is not None:
        text_format = format_json(request.output_format)
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
        "tool_choice": tool_choice_json(request),
        "tools": [tool_json(tool) for tool in request.tools],
        "top_p": request.top_p if request.top_p is not None else 1.0,
        "truncation": "disabled", "usage": None, "user": request.user, "metadata": {},
    }


def format_json(output_format: OutputFormat) -> dict:
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
    encrypted = encrypted_content(thinking.encrypted, thinking.signature, thinking.redacted)
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def encrypted_content(encrypted: str | None, signature: str | None, redacted: bool) -> str | None:
    if encrypted is not None:
        return encrypted
    if signature:
        return (REDACTED_MARK if redacted else SIGNATURE_MARK) + signature
    return None


def _call_json(item_id: str, call: ToolCall, custom: set[str]) -> dict:
    if call.kind == "custom" or call.name in custom:
        given = call.arguments if call.kind == "custom" else unwrap(call.arguments)
        return {"id": item_id.replace("fc_", "ctc_", 1), "type": "custom_tool_call",
                "call_id": call.id, "name": call.name, "input": given}
    return {"id": item_id, "type": "function_call", "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": "completed"}


def base_of(rid: str) -> str:
    return rid[len("resp_"):] if rid.startswith("resp_") else rid


def write_reply(reply: Reply, request: Request) -> dict:
    rid = response_id(reply.id)
    base = base_of(rid)
    status, incomplete = status_of(reply.stop)
    created = reply.created if reply.created is not None else request.now
    answer = envelope(request, rid, created, status)
    answer["incomplete_details"] = incomplete
    custom = custom_tools(request)
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


# ---- reading a Responses target's answer -------------------------------------------------


def read_usage(usage: object) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    given = usage.get("input_tokens_details")
    inputs = given if isinstance(given, dict) else {}
    given = usage.get("output_tokens_details")
    outputs = given if isinstance(given, dict) else {}
    return Usage(input_tokens=int_of(usage.get("input_tokens")) or 0,
                 output_tokens=int_of(usage.get("output_tokens")) or 0,
                 cache_read_tokens=int_of(inputs.get("cached_tokens")) or 0,
                 cache_write_tokens=int_of(inputs.get("cache_write_tokens")) or 0,
                 reasoning_tokens=int_of(outputs.get("reasoning_tokens")) or 0)


def stop_of(body: dict, calls: bool) -> Stop:
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
            parts.append(read_reasoning_item(item))
        elif kind == "function_call":
            parts.append(ToolCall(str(item.get("call_id") or ""), str(item.get("name") or ""),
                                  str(item.get("arguments") or "")))
        elif kind == "custom_tool_call":
            parts.append(ToolCall(str(item.get("call_id") or ""), str(item.get("name") or ""),
                                  str(item.get("input") or ""), kind="custom"))
    created = body.get("created_at")
    return Reply(id=str(body.get("id") or ""), model=str(body.get("model") or ""),
                 parts=parts, stop=stop_of(body, any(isinstance(part, ToolCall)
                                                   for part in parts)),
                 usage=read_usage(body.get("usage")),
                 created=int(created) if isinstance(created, int | float)
                 and not isinstance(created, bool) else None)
