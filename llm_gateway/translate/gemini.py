"""Google Gemini's own API (``generateContent``, ``streamGenerateContent?alt=sse`` under
``https://generativelanguage.googleapis.com/v1beta``): its requests into the hub form and
out of it. The answers and streams are ``gemini_reply``'s.

How the form is spelt in a request (ai.google.dev/api/generate-content, ai.google.dev/api/caching
for Content and Tool, and the google-genai SDK's wire names):

- The model is in the path (``/models/{model}:generateContent``), never in the body.
- ``systemInstruction {parts: [{text}]}`` holds the system prompt and any system message
  from the middle of the conversation (Gemini has no system role in ``contents``).
- ``contents``: turns of role ``user`` or ``model``; consecutive turns of one role merge
  (tool results are a user turn). Images are ``inlineData {mimeType, data}`` (base64) or
  ``fileData {mimeType, fileUri}`` for a file Gemini holds (its Files API, ``gs://``); an
  image by any other URL cannot be read by Gemini: Untranslatable, never silently dropped.
- A tool result is ``functionResponse {name, response, id?}``: Gemini matches it by the
  function's NAME (taken from the conversation's call of that id; a result for no call is
  Untranslatable), and ``response`` is an object: the result's text when it is a JSON
  object, else ``{"output": text}``, or ``{"error": ...}`` for a failed call (the keys
  FunctionResponse.response documents); its images go in ``functionResponse.parts``.
- Tools are ``functionDeclarations`` with ``parametersJsonSchema``: full JSON Schema, as
  every other protocol's tools are written (``parameters`` takes only an OpenAPI subset that
  refuses e.g. ``additionalProperties`` and ``$ref``, so a translation would lose or break
  schemas). A custom tool is a function of one string argument (CUSTOM_INPUT).
- ``toolConfig.functionCallingConfig``: mode AUTO, NONE, ANY (required), ANY with
  ``allowedFunctionNames`` (one tool).
- ``generationConfig``: maxOutputTokens, temperature, topP, stopSequences,
  responseMimeType ``application/json`` and ``responseJsonSchema`` (full JSON Schema again),
  thinkingConfig {thinkingBudget (0: off, -1: the model decides), includeThoughts: true so
  the caller sees the thoughts its protocol shows}.
- No end-user field (``user`` is dropped), no stored conversations (a
  ``previous_response_id`` is Untranslatable), no parallel-calls switch.
"""

from __future__ import annotations

import json

from llm_gateway.translate import gemini_reply
from llm_gateway.translate.form import (
    CUSTOM_INPUT,
    Image,
    Part,
    Reasoning,
    Reply,
    Request,
    Text,
    Tool,
    ToolCall,
    ToolChoice,
    ToolResult,
    Untranslatable,
    budget_for_effort,
)
from llm_gateway.translate.gemini_reader import read_request
from llm_gateway.translate.gemini_reply import GENERATED_ID, GeminiStreamReader, GeminiStreamWriter

# URLs Gemini reads images from itself: its Files API and Cloud Storage.
FILE_URL_PREFIXES = ("https://generativelanguage.googleapis.com/", "gs://")
_MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY", "tool": "ANY"}
# The base64 openings of the image formats Gemini takes, for an image whose type is unknown.
_SNIFFED = (("iVBOR", "image/png"), ("/9j/", "image/jpeg"), ("UklGR", "image/webp"),
            ("R0lGOD", "image/gif"))


def custom_schema() -> dict:
    return {"type": "object", "properties": {CUSTOM_INPUT: {"type": "string"}},
            "required": [CUSTOM_INPUT]}


def drop(request: Request, name: str) -> None:
    if name not in request.dropped:
        request.dropped.append(name)


def write_request(request: Request, *, model: str) -> dict:
    if request.previous_response_id is not None:
        raise Untranslatable("previous_response_id",
                             "continues a stored conversation: Gemini keeps none")
    system = [part.text for part in request.system]
    contents = _contents(request, system)
    body: dict = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": [{"text": text} for text in system]}
    if request.tools:
        body["tools"] = [{"functionDeclarations": [_declaration(tool)
                                                   for tool in request.tools]}]
        if request.tool_choice is not None:
            body["toolConfig"] = {"functionCallingConfig": _calling(request.tool_choice)}
    config = _generation_config(request)
    if config:
        body["generationConfig"] = config
    if request.user is not None:
        drop(request, "user")
    if request.parallel_tool_calls is False:
        drop(request, "parallel_tool_calls")
    return body


def _contents(request: Request, system: list[str]) -> list[dict]:
    names: dict[str, str] = {}  # call id -> function name, from the conversation's calls
    contents: list[dict] = []
    for turn in request.turns:
        if turn.role == "system":
            system.extend(part.text for part in turn.parts if isinstance(part, Text))
            continue
        if turn.role == "assistant":
            for part in turn.parts:
                if isinstance(part, ToolCall):
                    names[part.id] = part.name
            role, parts = "model", gemini_reply.model_parts(turn.parts)
        else:
            role, parts = "user", [_user_part(part, names) for part in turn.parts]
        if not parts:
            continue
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    return contents


def _user_part(part: Part, names: dict[str, str]) -> dict:
    if isinstance(part, Text):
        return {"text": part.text}
    if isinstance(part, Image):
        return image_part(part)
    if isinstance(part, ToolResult):
        return _function_response(part, names)
    # A user turn holds no model parts in any protocol's reading; its text stands.
    return {"text": getattr(part, "text", "")}


def image_part(image: Image) -> dict:
    if image.data is not None:
        return {"inlineData": {"mimeType": image.media_type or _sniffed(image.data),
                               "data": image.data}}
    url = image.url or ""
    if url.startswith(FILE_URL_PREFIXES):
        file_data = {"fileUri": url}
        if image.media_type:
            file_data = {"mimeType": image.media_type, **file_data}
        return {"fileData": file_data}
    raise Untranslatable("image_url", "is a URL: Gemini reads images inline (base64) or from "
                         "its own files only")


def _sniffed(data: str) -> str:
    return next((kind for opening, kind in _SNIFFED if data.startswith(opening)), "image/png")


def _function_response(result: ToolResult, names: dict[str, str]) -> dict:
    name = names.get(result.call_id)
    if name is None:
        raise Untranslatable("tool_result", f"answers the call {result.call_id!r}, which the "
                             "conversation does not hold: Gemini matches a result by the "
                             "function's name")
    # One text, as chat's tool message: its blocks a blank line apart, not run together.
    text = "\n\n".join(part.text for part in result.content if isinstance(part, Text))
    written: dict = {"name": name, "response": response_object(text, result.is_error)}
    if not result.call_id.startswith(GENERATED_ID):
        written["id"] = result.call_id
    images = [image_part(part)["inlineData"] for part in result.content
              if isinstance(part, Image) and part.data is not None]
    if any(isinstance(part, Image) and part.data is None for part in result.content):
        raise Untranslatable("tool_result", "holds an image by URL: Gemini takes a function "
                             "response's images inline only")
    if images:
        written["parts"] = [{"inlineData": image} for image in images]
    return {"functionResponse": written}


def response_object(text: str, is_error: bool) -> dict:
    """A tool's text as ``functionResponse.response``: an object, as Gemini requires."""
    try:
        parsed = json.loads(text) if text.lstrip().startswith("{") else None
    except ValueError:
        parsed = None
    if is_error:
        return {"error": parsed if isinstance(parsed, dict) else text}
    # A success that would read back as an error (or as one output) goes under "output".
    if isinstance(parsed, dict) and set(parsed) not in ({"error"}, {"output"}):
        return parsed
    return {"output": text}


def _declaration(tool: Tool) -> dict:
    declaration: dict = {"name": tool.name}
    if tool.description:
        declaration["description"] = tool.description
    schema = custom_schema() if tool.kind == "custom" else tool.parameters
    if schema is not None:
        declaration["parametersJsonSchema"] = schema
    return declaration


def _calling(choice: ToolChoice) -> dict:
    config: dict = {"mode": _MODES[choice.mode]}
    if choice.mode == "tool" and choice.name:
        config["allowedFunctionNames"] = [choice.name]
    return config


def _generation_config(request: Request) -> dict:
    config: dict = {}
    if request.max_output_tokens is not None:
        config["maxOutputTokens"] = request.max_output_tokens
    if request.temperature is not None:
        config["temperature"] = request.temperature
    if request.top_p is not None:
        config["topP"] = request.top_p
    if request.stop:
        config["stopSequences"] = list(request.stop)
    if request.output_format is not None:
        config["responseMimeType"] = "application/json"
        if request.output_format.kind == "json_schema" and request.output_format.schema:
            config["responseJsonSchema"] = request.output_format.schema
    if request.reasoning is not None:
        config["thinkingConfig"] = _thinking(request.reasoning, request.max_output_tokens)
    return config


def _thinking(reasoning: Reasoning, cap: int | None) -> dict:
    if not reasoning.enabled:
        return {"thinkingBudget": 0}
    if reasoning.budget_tokens is not None:
        budget = reasoning.budget_tokens
    elif reasoning.effort is not None:
        budget = budget_for_effort(reasoning.effort, cap)
    else:
        budget = -1  # thinking on, its length the model's choice (Anthropic's adaptive)
    return {"thinkingBudget": budget, "includeThoughts": True}


def path(model: str, stream: bool) -> tuple[str, str]:
    if stream:
        return f"/models/{model}:streamGenerateContent", "alt=sse"
    return f"/models/{model}:generateContent", ""


class GeminiCodec:
    name = "gemini"

    def read_request(self, payload: dict) -> Request:
        return read_request(payload)

    def write_request(self, request: Request, *, model: str) -> dict:
        return write_request(request, model=model)

    def path(self, model: str, stream: bool) -> tuple[str, str]:
        return path(model, stream)

    def read_reply(self, body: dict) -> Reply:
        return gemini_reply.read_reply(body)

    def write_reply(self, reply: Reply, request: Request) -> dict:
        return gemini_reply.write_reply(reply, request)

    def stream_reader(self) -> GeminiStreamReader:
        return GeminiStreamReader()

    def stream_writer(self, request: Request) -> GeminiStreamWriter:
        return GeminiStreamWriter(request)


CODEC = GeminiCodec()

__all__ = ["CODEC", "FILE_URL_PREFIXES", "GeminiCodec", "custom_schema", "image_part", "path",
           "read_request", "response_object", "write_request"]
