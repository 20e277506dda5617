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
``chat_reply``'s ``write_reply`` and ``chat_stream``'s writer turn a call of a tool the
request defined as custom back into a custom call with the raw input (the other codecs'
writers do the same).

The codec is split by what it reads and writes: this module writes a chat target's requests
and holds the CODEC; ``chat_reader`` reads a chat caller's requests, ``chat_reply`` the whole
answers (both ways), ``chat_stream`` the streams (both ways).
"""

from __future__ import annotations

import json

from llm_gateway.translate.chat_reader import drop, read_request
from llm_gateway.translate.chat_reply import read_reply, write_reply
from llm_gateway.translate.chat_stream import ChatStreamReader, ChatStreamWriter
from llm_gateway.translate.form import (
    CUSTOM_INPUT,
    Image,
    OutputFormat,
    Part,
    Refusal,
    Request,
    Text,
    Thinking,
    Tool,
    ToolCall,
    ToolChoice,
    ToolResult,
    Untranslatable,
    effort_for_budget,
)

# The one string parameter a custom tool becomes on a target that only has functions.
_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {CUSTOM_INPUT: {"type": "string",
                                  "description": "The tool's whole input, as free-form text."}},
    "required": [CUSTOM_INPUT],
}


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
            drop(request.dropped, "is_error")
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
        drop(request.dropped, "thinking")
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


class ChatCodec:
    name = "chat"

    read_request = staticmethod(read_request)
    write_request = staticmethod(write_request)
    path = staticmethod(path)
    read_reply = staticmethod(read_reply)
    write_reply = staticmethod(write_reply)

    @staticmethod
    def stream_reader() -> ChatStreamReader:
        return ChatStreamReader()

    @staticmethod
    def stream_writer(request: Request) -> ChatStreamWriter:
        return ChatStreamWriter(request)


CODEC = ChatCodec()

__all__ = ["CODEC", "ChatCodec", "path", "read_reply", "read_request", "write_reply",
           "write_request"]
