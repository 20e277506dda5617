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

Here: a target's body (``write_request``) and the ``CODEC``; a caller's body is read in
``messages_reader``, whole answers both ways in ``messages_reply``, streams both ways in
``messages_stream``.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.translate.form import (
    CUSTOM_INPUT,
    MIN_BUDGET,
    Image,
    Refusal,
    Reply,
    Request,
    Text,
    Thinking,
    Tool,
    ToolCall,
    ToolResult,
    Turn,
    Untranslatable,
    budget_for_effort,
)
from llm_gateway.translate.messages_reader import read_request
from llm_gateway.translate.messages_reply import (
    drop,
    image_url,
    input_of,
    read_reply,
    write_reply,
)
from llm_gateway.translate.messages_stream import MessagesStreamReader, MessagesStreamWriter

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

# ---- the target's side: writing a body -------------------------------------------------------


def _image_block(image: Image) -> dict[str, Any]:
    if image.url is not None and image.data is None:
        parsed = image_url(image.url)
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
                 else input_of(call.arguments))
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
                drop(request, "thinking")
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
        drop(request, "reasoning")
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
            drop(request, "format")
        choice = _tool_choice_of(request)
        if choice is not None:
            body["tool_choice"] = choice
    thinking = _thinking(request, max_tokens)
    if thinking is not None and _unsigned_tool_loop(body["messages"]):
        # Anthropic refuses thinking in a tool loop whose assistant message does not start
        # with its signed thinking (one another target answered): this turn goes without.
        drop(request, "reasoning")
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
            drop(request, "response_format")
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
            drop(request, "temperature")
            temperature = None
        if top_p is not None and top_p < 0.95:
            drop(request, "top_p")
            top_p = None
    if temperature is not None and top_p is not None:
        # The current models refuse both at once; temperature is the usual knob.
        drop(request, "top_p")
        top_p = None
    if temperature is not None:
        body["temperature"] = min(temperature, 1.0)  # Anthropic's range is 0-1, OpenAI's 0-2
    if top_p is not None:
        body["top_p"] = top_p


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

    def stream_reader(self) -> MessagesStreamReader:
        return MessagesStreamReader()

    def stream_writer(self, request: Request) -> MessagesStreamWriter:
        return MessagesStreamWriter(request)


CODEC = _Messages()

__all__ = ["CODEC", "DEFAULT_MAX_TOKENS", "read_reply", "read_request", "write_reply",
           "write_request"]
