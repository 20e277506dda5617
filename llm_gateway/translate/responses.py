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

The codec is split by what it reads and writes: this module writes a Responses target's
requests and holds the CODEC; ``responses_reader`` reads a Responses caller's requests,
``responses_reply`` the whole answers (both ways), ``responses_stream`` the streams (both
ways).
"""

from __future__ import annotations

from llm_gateway.translate.chat_reply import unwrap as custom_input
from llm_gateway.translate.form import (
    Image,
    Part,
    Refusal,
    Reply,
    Request,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    Turn,
    effort_for_budget,
)
from llm_gateway.translate.responses_reader import Dropped, image_from_url, read_request
from llm_gateway.translate.responses_reply import (
    REDACTED_MARK,
    SIGNATURE_MARK,
    encrypted_content,
    format_json,
    read_reply,
    read_usage,
    response_id,
    tool_choice_json,
    tool_json,
    write_reply,
    write_usage,
)
from llm_gateway.translate.responses_stream import StreamReader, StreamWriter

# ---- writing a Responses target's request --------------------------------------------------


def write_request(request: Request, *, model: str) -> dict:
    dropped = Dropped(request.dropped)
    body: dict = {"model": model, "input": _write_turns(request.turns, dropped)}
    system = "\n\n".join(part.text for part in request.system)
    if system:
        body["instructions"] = system
    if request.tools:
        body["tools"] = [tool_json(tool) for tool in request.tools]
        if request.tool_choice is not None:
            body["tool_choice"] = tool_choice_json(request)
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
        body["text"] = {"format": format_json(request.output_format)}
    body["store"] = False
    if request.previous_response_id is not None:
        body["previous_response_id"] = request.previous_response_id
    if request.user is not None:
        body["user"] = request.user
    return body


def _write_turns(turns: list[Turn], dropped: Dropped) -> list[dict]:
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


def _write_result(result: ToolResult, dropped: Dropped) -> dict:
    if result.is_error:
        dropped.add("is_error")
    kind = "custom_tool_call_output" if result.kind == "custom" else "function_call_output"
    if all(isinstance(part, Text) for part in result.content):
        output: str | list = "\n\n".join(part.text for part in result.content
                                     if isinstance(part, Text))
    else:
        output = [{"type": "input_text", "text": part.text} if isinstance(part, Text)
                  else _write_image(part) for part in result.content]
    return {"type": kind, "call_id": result.call_id, "output": output}


def _write_assistant(parts: list[Part], items: list[dict], dropped: Dropped) -> None:
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
            encrypted = encrypted_content(part.encrypted, part.signature, part.redacted)
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
