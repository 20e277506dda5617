"""A Gemini caller's ``generateContent`` body into the hub form (the caller's role of the
``gemini`` codec; ``gemini`` writes it back).

What the body does not say: the model and whether it streams are in the path
(``/models/{model}:streamGenerateContent``): ``Request.model`` is the body's ``model`` when it
names one (the SDK's batch requests do), else "", and ``stream`` False, for the one who reads
the path to set. Field names are read in proto JSON's two spellings (``systemInstruction``,
``system_instruction``), as Google's API takes both.

Kept: the system instruction, every turn (thoughts and their signatures, function calls and
responses, inline images and Gemini's own files), function declarations (``parameters``,
Gemini's OpenAPI subset, turned into JSON Schema: lower-case types, ``nullable`` as a
``null`` type), the calling mode, the generation settings the form has. Dropped and named:
``safetySettings``, ``labels``, ``serviceTier``, built-in tools (``tools[googleSearch]``),
generation settings the form lacks (``generationConfig.topK``, ...). Refused: ``cachedContent``
(a conversation Gemini stored), ``candidateCount`` over 1, and parts no other protocol can
hold (audio, video, documents, code execution's parts).
"""

from __future__ import annotations

import json

from llm_gateway.translate.form import (
    Image,
    OutputFormat,
    Part,
    Reasoning,
    Request,
    Text,
    Tool,
    ToolCall,
    ToolChoice,
    ToolResult,
    Turn,
    Untranslatable,
)
from llm_gateway.translate.gemini_reply import read_model_parts

_MODES = {"AUTO": "auto", "VALIDATED": "auto", "NONE": "none", "ANY": "required"}
_LEVELS = {"MINIMAL": "minimal", "LOW": "low", "MEDIUM": "medium", "HIGH": "high"}
# generationConfig fields the form holds (the others are dropped by name).
_CONFIG_READ = frozenset({"maxOutputTokens", "temperature", "topP", "stopSequences",
                          "responseMimeType", "responseJsonSchema", "responseSchema",
                          "thinkingConfig", "candidateCount"})
_TOP_READ = frozenset({"model", "contents", "systemInstruction", "tools", "toolConfig",
                       "generationConfig"})


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def field(payload: dict, name: str) -> object:
    """``name`` (lowerCamel) in either of proto JSON's spellings."""
    value = payload.get(name)
    return payload.get(_snake(name)) if value is None else value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def read_request(payload: dict) -> Request:
    model = payload.get("model")
    request = Request(model=model.removeprefix("models/") if isinstance(model, str) else "")
    for name in payload:
        if _camel(name) not in _TOP_READ:
            if _camel(name) == "cachedContent":
                raise Untranslatable("cachedContent", "continues content Gemini stored: no "
                                     "other protocol can name it")
            _drop(request, _camel(name))
    system = field(payload, "systemInstruction")
    if isinstance(system, dict):
        request.system = [Text(part["text"]) for part in _list(system.get("parts"))
                          if isinstance(part.get("text"), str)]
    elif isinstance(system, str):
        request.system = [Text(system)]
    request.turns = _turns(_list(payload.get("contents")))
    _read_tools(request, payload)
    config = field(payload, "generationConfig")
    if isinstance(config, dict):
        _read_config(request, config)
    return request


def _list(value: object) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _drop(request: Request, name: str) -> None:
    if name not in request.dropped:
        request.dropped.append(name)


def _turns(contents: list[dict]) -> list[Turn]:
    turns: list[Turn] = []
    unanswered: list[ToolCall] = []  # the calls so far no response answered, oldest first
    for position, content in enumerate(contents):
        parts = _list(content.get("parts"))
        if content.get("role") == "model":
            read = read_model_parts(parts, str(position))
            unanswered.extend(part for part in read if isinstance(part, ToolCall))
            turns.append(Turn("assistant", read))
            continue
        for part in parts:
            read_part = _user_part(part, unanswered)
            role = "tool" if isinstance(read_part, ToolResult) else "user"
            if turns and turns[-1].role == role:
                turns[-1].parts.append(read_part)
            else:
                turns.append(Turn(role, [read_part]))
    return turns


def _user_part(part: dict, unanswered: list[ToolCall]) -> Part:
    if isinstance(part.get("text"), str):
        return Text(part["text"])
    inline = field(part, "inlineData")
    if isinstance(inline, dict):
        return _image(inline, "data")
    file_data = field(part, "fileData")
    if isinstance(file_data, dict):
        return _image(file_data, "fileUri")
    response = field(part, "functionResponse")
    if isinstance(response, dict):
        return _tool_result(response, unanswered)
    kind = next(iter(part), "part")
    raise Untranslatable(f"contents.parts.{kind}", "is content no other protocol can hold")


def _image(data: dict, key: str) -> Image:
    media_type = field(data, "mimeType")
    media_type = media_type if isinstance(media_type, str) else None
    if media_type is not None and not media_type.startswith("image/"):
        raise Untranslatable("contents.parts.inlineData",
                             f"is {media_type}: only images cross to other protocols")
    value = field(data, key)
    if not isinstance(value, str):
        raise Untranslatable(f"contents.parts.{key}", "is missing")
    if key == "data":
        return Image(data=value, media_type=media_type)
    return Image(url=value, media_type=media_type)


def _tool_result(response: dict, unanswered: list[ToolCall]) -> ToolResult:
    given, name = response.get("id"), response.get("name")
    call = next((call for call in unanswered
                 if (call.id == given if isinstance(given, str) and given
                     else call.name == name)), None)
    if call is None:
        raise Untranslatable("contents.parts.functionResponse",
                             f"answers no call of {name!r} in the conversation")
    unanswered.remove(call)
    text, is_error = result_text(response.get("response"))
    content: list[Text | Image] = [Text(text)]
    for item in _list(response.get("parts")):
        inline = field(item, "inlineData")
        if isinstance(inline, dict):
            content.append(_image(inline, "data"))
    return ToolResult(call.id, content, is_error=is_error)


def result_text(response: object) -> tuple[str, bool]:
    """``functionResponse.response`` as (text, is_error): the documented ``output`` or
    ``error`` alone as its text, any other object as its JSON."""
    if isinstance(response, dict) and len(response) == 1:
        value = next(iter(response.values()))
        if "output" in response and isinstance(value, str):
            return value, False
        if "error" in response and isinstance(value, str | dict):
            return (value if isinstance(value, str) else json.dumps(value)), True
    return json.dumps(response if response is not None else {}), False


def _read_tools(request: Request, payload: dict) -> None:
    for tool in _list(payload.get("tools")):
        for name, value in tool.items():
            if _camel(name) != "functionDeclarations":
                _drop(request, f"tools[{_camel(name)}]")
                continue
            for declaration in _list(value):
                request.tools.append(_tool(declaration))
    tool_config = field(payload, "toolConfig")
    calling = field(tool_config, "functionCallingConfig") if isinstance(tool_config, dict) \
        else None
    if isinstance(calling, dict):
        mode = _MODES.get(str(calling.get("mode") or "AUTO").upper(), "auto")
        names = field(calling, "allowedFunctionNames")
        names = [name for name in names if isinstance(name, str)] \
            if isinstance(names, list) else []
        if mode == "required" and len(names) == 1:
            request.tool_choice = ToolChoice("tool", names[0])
        else:
            request.tool_choice = ToolChoice(mode)  # type: ignore[arg-type]
            if names and mode == "required":
                _drop(request, "toolConfig.functionCallingConfig.allowedFunctionNames")


def _tool(declaration: dict) -> Tool:
    schema = field(declaration, "parametersJsonSchema")
    if not isinstance(schema, dict):
        openapi = declaration.get("parameters")
        schema = json_schema(openapi) if isinstance(openapi, dict) else None
    description = declaration.get("description")
    return Tool(str(declaration.get("name") or ""),
                description if isinstance(description, str) else None, schema)


def json_schema(schema: object) -> object:
    """Gemini's OpenAPI-subset Schema (``type: OBJECT``, ``nullable``) as JSON Schema."""
    if isinstance(schema, list):
        return [json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted: dict = {}
    for key, value in schema.items():
        if key in ("nullable", "propertyOrdering"):
            continue
        if key == "type" and isinstance(value, str):
            converted[key] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            converted[key] = {name: json_schema(item) for name, item in value.items()}
        else:
            converted[key] = json_schema(value) if key in ("items", "anyOf") else value
    if schema.get("nullable") is True and isinstance(converted.get("type"), str):
        converted["type"] = [converted["type"], "null"]
    return converted


def _read_config(request: Request, config: dict) -> None:
    for name in config:
        if _camel(name) not in _CONFIG_READ:
            _drop(request, f"generationConfig.{_camel(name)}")
    count = field(config, "candidateCount")
    if isinstance(count, int) and count > 1:
        raise Untranslatable("generationConfig.candidateCount",
                             "asks for several answers: the form holds one")
    cap = field(config, "maxOutputTokens")
    request.max_output_tokens = cap if isinstance(cap, int) else None
    for name, attribute in (("temperature", "temperature"), ("topP", "top_p")):
        value = field(config, name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            setattr(request, attribute, float(value))
    stop = field(config, "stopSequences")
    request.stop = [item for item in stop if isinstance(item, str)] \
        if isinstance(stop, list) else []
    if field(config, "responseMimeType") == "application/json":
        schema = field(config, "responseJsonSchema")
        if not isinstance(schema, dict) and isinstance(field(config, "responseSchema"), dict):
            schema = json_schema(field(config, "responseSchema"))
        request.output_format = OutputFormat("json_schema", schema) \
            if isinstance(schema, dict) else OutputFormat("json_object")
    thinking = field(config, "thinkingConfig")
    if isinstance(thinking, dict):
        request.reasoning = _reasoning(thinking)


def _reasoning(thinking: dict) -> Reasoning:
    budget = field(thinking, "thinkingBudget")
    level = field(thinking, "thinkingLevel")
    effort = _LEVELS.get(level.upper()) if isinstance(level, str) else None
    if budget == 0:
        return Reasoning(enabled=False)
    if isinstance(budget, int) and budget > 0:
        return Reasoning(effort=effort, budget_tokens=budget)  # type: ignore[arg-type]
    return Reasoning(effort=effort)  # type: ignore[arg-type]
